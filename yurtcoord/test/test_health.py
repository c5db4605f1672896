"""Health checkers: lease probes, thresholds, delegation annotation, kubelet gating."""

import copy

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord import health
from yurtcoord.health import (
    DELEGATE_HEARTBEAT_ANNOTATION,
    CloudHealthChecker,
    CoordinatorHealthChecker,
    KubeletHealthChecker,
    LeaseProber,
    NodeLeaseWriter,
    ProbeSettings,
)
from yurtcoord.kube.errors import AlreadyExists, Conflict, NotFound, ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.testing.poll import poll_until

NODE = "edge-1"
START = 1_700_000_000.0


class FakeLeaseClient:
    """In-memory apiserver for leases with resourceVersion checks and fault knobs."""

    def __init__(self):
        self.objects = {}
        self.requests = []
        self.rv = 0
        self.conflicts_on_update = 0  # next N updates answer 409 (someone else wrote)
        self.errors = []  # exceptions raised by the next requests, in order
        self.hang = False  # requests never answer

    def _answer(self, op, compute):
        self.requests.append(op)
        if self.hang:
            return defer.Deferred()
        if self.errors:
            return defer.fail(self.errors.pop(0))
        try:
            return defer.succeed(copy.deepcopy(compute()))
        except Exception as error:
            return defer.fail(error)

    def get(self, gvr, name, namespace=None):
        assert gvr == LEASES

        def compute():
            if (namespace, name) not in self.objects:
                raise NotFound(name)
            return self.objects[(namespace, name)]

        return self._answer("get", compute)

    def create(self, gvr, obj, namespace=None):
        def compute():
            key = (namespace, obj["metadata"]["name"])
            if key in self.objects:
                raise AlreadyExists(key[1])
            return self._store(key, obj)

        return self._answer("create", compute)

    def update(self, gvr, obj, namespace=None):
        def compute():
            key = (namespace, obj["metadata"]["name"])
            if key not in self.objects:
                raise NotFound(key[1])
            if self.conflicts_on_update:
                self.conflicts_on_update -= 1
                self._store(key, self.objects[key])  # a concurrent writer bumps the rv
                raise Conflict(key[1])
            if obj["metadata"].get("resourceVersion") != self.objects[key]["metadata"]["resourceVersion"]:
                raise Conflict(key[1])
            return self._store(key, obj)

        return self._answer("update", compute)

    def _store(self, key, obj):
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        return obj

    def lease(self):
        return self.objects.get((health.NODE_LEASE_NAMESPACE, NODE))


class RecordingMetrics:
    def __init__(self):
        self.server_healthy = {}

    def set_server_healthy(self, server, healthy):
        self.server_healthy[server] = healthy


class FakeResponse:
    def __init__(self, code):
        self.code = code

    def content(self):
        return defer.succeed(b"ok" if self.code == 200 else b"fail")


class StaticHealth:
    def __init__(self, healthy):
        self.healthy = healthy


def make_clock():
    clock = Clock()
    clock.advance(START)
    return clock


def make_prober(clock, client, settings=None, **kwargs):
    settings = settings or ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)
    writer = NodeLeaseWriter(clock, client, NODE, settings.failed_retry)
    return LeaseProber(clock, writer, "https://cloud-1", settings, **kwargs)


class MicroTimeTests(unittest.TestCase):
    def test_format_has_microseconds_and_zulu(self):
        self.assertEqual(health.micro_time(START + 0.25), "2023-11-14T22:13:20.250000Z")


class NodeLeaseWriterTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeLeaseClient()

    def test_creates_missing_lease_with_holder_duration_and_renew_time(self):
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3)
        self.successResultOf(writer.renew())
        lease = self.client.lease()
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 40)
        self.assertEqual(lease["spec"]["renewTime"], "2023-11-14T22:13:20.000000Z")
        self.assertEqual(self.client.requests, ["get", "create"])

    def test_next_renewal_updates_directly_with_new_time(self):
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3)
        self.successResultOf(writer.renew())
        self.clock.advance(10)
        self.successResultOf(writer.renew())
        self.assertEqual(self.client.lease()["spec"]["renewTime"], "2023-11-14T22:13:30.000000Z")
        self.assertEqual(self.client.requests, ["get", "create", "update"])

    def test_conflict_is_reread_and_retried(self):
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3)
        self.successResultOf(writer.renew())
        self.client.conflicts_on_update = 2
        self.clock.advance(10)
        self.successResultOf(writer.renew())
        self.assertEqual(self.client.requests,
                         ["get", "create", "update", "get", "update", "get", "update"])
        self.assertEqual(self.client.lease()["spec"]["renewTime"], "2023-11-14T22:13:30.000000Z")

    def test_last_attempt_in_conflict_is_a_failure(self):
        """Fix 10: a write that never got through must not look like a success."""
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3)
        self.successResultOf(writer.renew())
        written = self.client.lease()["spec"]["renewTime"]
        self.client.conflicts_on_update = 3
        self.clock.advance(10)
        self.failureResultOf(writer.renew(), health.LeaseWriteFailed)
        self.assertEqual(self.client.requests.count("update"), 3)  # failed_retry attempts
        self.assertEqual(self.client.lease()["spec"]["renewTime"], written)

    def test_other_errors_fail_without_retry(self):
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3)
        self.client.errors = [ServerError("boom")]
        self.failureResultOf(writer.renew(), ServerError)
        self.assertEqual(self.client.requests, ["get"])

    def test_keeps_other_annotations(self):
        self.client.objects[(health.NODE_LEASE_NAMESPACE, NODE)] = {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE,
                         "resourceVersion": "7", "annotations": {"keep": "me"}},
            "spec": {}}
        writer = NodeLeaseWriter(self.clock, self.client, NODE, failed_retry=3,
                                 annotations=lambda: {"drop": None, "add": "x"})
        self.successResultOf(writer.renew())
        self.assertEqual(self.client.lease()["metadata"]["annotations"], {"keep": "me", "add": "x"})


class LeaseProberTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeLeaseClient()

    def test_first_probe_decides_healthy(self):
        metrics = RecordingMetrics()
        prober = make_prober(self.clock, self.client, metrics=metrics)
        self.assertFalse(prober.healthy)
        prober.start()
        self.assertTrue(prober.healthy)
        self.assertEqual(metrics.server_healthy, {"https://cloud-1": True})
        self.successResultOf(prober.stop())

    def test_first_probe_decides_unhealthy(self):
        self.client.errors = [ServerError("down")]
        prober = make_prober(self.clock, self.client)
        self.assertFalse(self.successResultOf(prober.probe()))
        self.assertEqual(prober.probes, 1)
        self.assertIn("ServerError", prober.last_error)

    def test_unhealthy_on_first_failure_healthy_after_threshold(self):
        prober = make_prober(self.clock, self.client)
        prober.start()
        self.assertTrue(prober.healthy)
        self.client.errors = [ServerError("down")]
        self.clock.advance(10)
        self.assertFalse(prober.healthy)
        self.clock.advance(10)  # one success: below the threshold of 2
        self.assertFalse(prober.healthy)
        self.clock.advance(10)  # second consecutive success
        self.assertTrue(prober.healthy)
        self.assertEqual(prober.probes, 4)
        self.successResultOf(prober.stop())

    def test_failure_resets_the_success_count(self):
        prober = make_prober(self.clock, self.client,
                             ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=3))
        self.client.errors = [ServerError("down")]
        prober.start()
        self.clock.advance(10)
        self.clock.advance(10)
        self.client.errors = [ServerError("down")]
        self.clock.advance(10)
        self.clock.advance(10)
        self.clock.advance(10)
        self.assertFalse(prober.healthy)
        self.clock.advance(10)
        self.assertTrue(prober.healthy)
        self.successResultOf(prober.stop())

    def test_conflicts_until_last_attempt_make_the_server_unhealthy(self):
        """Fix 10 at the prober: nothing written, nothing counted as a success."""
        prober = make_prober(self.clock, self.client)
        prober.start()
        self.assertTrue(prober.healthy)
        self.client.conflicts_on_update = 3
        self.clock.advance(10)
        self.assertFalse(prober.healthy)
        self.assertEqual(prober.successes, 1)
        self.assertIn("LeaseWriteFailed", prober.last_error)
        self.successResultOf(prober.stop())

    def test_slow_server_times_out(self):
        prober = make_prober(self.clock, self.client)
        self.client.hang = True
        prober.start()
        self.assertFalse(prober.healthy)
        self.assertEqual(prober.probes, 0)
        self.clock.advance(2)
        self.assertEqual(prober.probes, 1)
        self.assertEqual(prober.last_error, "probe timed out")
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_cancels_in_flight_probe_and_timers(self):
        prober = make_prober(self.clock, self.client)
        self.client.hang = True
        prober.start()
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(prober.probes, 0)


class CloudHealthCheckerTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.clients = {f"https://cloud-{i}": FakeLeaseClient() for i in range(3)}
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)
        self.checker = CloudHealthChecker.for_servers(self.clock, self.clients, NODE, settings)

    def test_healthy_when_any_server_is(self):
        for client in list(self.clients.values())[:2]:
            client.errors = [ServerError("down")]
        self.checker.start()
        self.assertTrue(self.checker.healthy)
        self.assertEqual(self.checker.servers(), {
            "https://cloud-0": False, "https://cloud-1": False, "https://cloud-2": True})
        self.successResultOf(self.checker.stop())

    def test_unhealthy_when_every_server_is(self):
        for client in self.clients.values():
            client.errors = [ServerError("down")]
        self.checker.start()
        self.assertFalse(self.checker.healthy)
        self.assertIsNone(self.checker.pick_healthy_server())
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_pick_healthy_server_rotates_among_healthy(self):
        self.clients["https://cloud-1"].errors = [ServerError("down")]
        self.checker.start()
        picks = [self.checker.pick_healthy_server() for _ in range(4)]
        self.assertEqual(picks, ["https://cloud-0", "https://cloud-2",
                                 "https://cloud-0", "https://cloud-2"])
        self.successResultOf(self.checker.stop())

    def test_each_server_gets_its_own_heartbeat(self):
        self.checker.start()
        for client in self.clients.values():
            self.assertEqual(client.lease()["spec"]["holderIdentity"], NODE)
        self.successResultOf(self.checker.stop())


class CoordinatorHealthCheckerTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeLeaseClient()
        self.cloud = StaticHealth(True)
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=1)
        self.checker = CoordinatorHealthChecker(
            self.clock, self.client, NODE, "https://coordinator", self.cloud, settings)

    def annotations(self):
        return self.client.lease()["metadata"].get("annotations", {})

    def test_delegate_annotation_follows_cloud_health(self):
        self.checker.start()
        self.assertTrue(self.checker.healthy)
        self.assertNotIn(DELEGATE_HEARTBEAT_ANNOTATION, self.annotations())
        self.cloud.healthy = False
        self.clock.advance(10)
        self.assertEqual(self.annotations().get(DELEGATE_HEARTBEAT_ANNOTATION), "true")
        self.clock.advance(10)
        self.assertEqual(self.annotations().get(DELEGATE_HEARTBEAT_ANNOTATION), "true")
        self.cloud.healthy = True
        self.clock.advance(10)
        self.assertNotIn(DELEGATE_HEARTBEAT_ANNOTATION, self.annotations())
        self.successResultOf(self.checker.stop())

    def test_lease_created_while_cloud_is_down_carries_annotation(self):
        self.cloud.healthy = False
        self.checker.start()
        self.assertEqual(self.annotations(), {DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.successResultOf(self.checker.stop())

    def test_unhealthy_when_coordinator_refuses(self):
        self.client.errors = [ServerError("down")]
        self.checker.start()
        self.assertFalse(self.checker.healthy)
        self.assertIsNone(self.client.lease())
        self.successResultOf(self.checker.stop())


class CloudProberDelegateAnnotationTests(unittest.TestCase):
    """A node heartbeating the cloud directly again drops the delegate annotation
    that the pool leader copied into its cloud lease; other annotations stay."""

    def setUp(self):
        self.clock = make_clock()
        self.client = FakeLeaseClient()
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)
        self.checker = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.client}, NODE, settings)

    def delegated_cloud_lease(self):
        """The cloud lease as the delegating leader wrote it."""
        key = (health.NODE_LEASE_NAMESPACE, NODE)
        lease = copy.deepcopy(self.client.objects[key]) if key in self.client.objects else {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": NODE}}
        lease["metadata"]["annotations"] = {DELEGATE_HEARTBEAT_ANNOTATION: "true",
                                            "example.com/owner": "ops"}
        lease["spec"]["renewTime"] = health.micro_time(self.clock.seconds())
        self.client._store(key, lease)

    def test_direct_write_after_delegation_removes_only_the_delegate_annotation(self):
        self.delegated_cloud_lease()
        self.checker.start()
        annotations = self.client.lease()["metadata"]["annotations"]
        self.assertEqual(annotations, {"example.com/owner": "ops"})
        self.assertEqual(self.client.lease()["spec"]["renewTime"],
                         health.micro_time(START))
        self.successResultOf(self.checker.stop())

    def test_leader_write_between_renewals_is_reread_and_cleaned(self):
        self.checker.start()
        self.clock.advance(5)
        # The leader forwards a delegated pool lease meanwhile: the prober's next
        # update conflicts, it re-reads and still removes the annotation.
        self.delegated_cloud_lease()
        self.clock.advance(5)
        lease = self.client.lease()
        self.assertEqual(lease["metadata"]["annotations"], {"example.com/owner": "ops"})
        self.assertEqual(lease["spec"]["renewTime"], health.micro_time(START + 10))
        self.assertEqual(self.client.requests[-3:], ["update", "get", "update"])
        self.successResultOf(self.checker.stop())

    def test_lease_without_annotations_stays_without(self):
        self.checker.start()
        self.clock.advance(10)
        self.assertNotIn("annotations", self.client.lease()["metadata"])
        self.successResultOf(self.checker.stop())


class RecordingLeaseClient(FakeLeaseClient):
    """Remembers (clock time, renewTime, annotations) of every lease it accepted."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.written = []

    def _store(self, key, obj):
        stored = super()._store(key, obj)
        renew = (obj.get("spec") or {}).get("renewTime")
        if renew:
            self.written.append((self.clock.seconds(), renew, dict(
                obj["metadata"].get("annotations") or {})))
        return stored


class DelegatingCadenceTests(unittest.TestCase):
    """The coordinator prober's cadence while the cloud is unhealthy (module docstring
    of ``health``): W / ceil(W / interval), W = takeover + 1 s."""

    def test_delegating_interval_values(self):
        self.assertAlmostEqual(health.delegating_interval(10), 9.0)
        self.assertAlmostEqual(health.delegating_interval(5), 4.5)
        self.assertAlmostEqual(health.delegating_interval(30), 18.0)
        self.assertAlmostEqual(health.delegating_interval(0.3), 0.3)
        self.assertAlmostEqual(health.delegating_interval(10, takeover=29), 10.0)
        for interval in (0.1, 0.3, 1, 2, 3, 7, 9, 10, 12, 20, 60):
            self.assertLessEqual(health.delegating_interval(interval), interval + 1e-9)
        with self.assertRaises(ValueError):
            health.delegating_interval(0)

    def setUp(self):
        self.clock = make_clock()
        self.cloud_client = FakeLeaseClient()
        self.pool_client = RecordingLeaseClient(self.clock)
        self.settings = ProbeSettings(interval=10, timeout=2, failed_retry=3,
                                      healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.cloud_client}, NODE, self.settings)
        self.checker = CoordinatorHealthChecker(
            self.clock, self.pool_client, NODE, "https://coordinator", self.cloud,
            self.settings)

    def tearDown(self):
        self.successResultOf(self.cloud.stop())
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def writes_since(self, since):
        return [(at - START, delegated.get(DELEGATE_HEARTBEAT_ANNOTATION))
                for at, _renew, delegated in self.pool_client.written if at >= since]

    def test_cloud_loss_writes_at_once_then_every_nine_seconds_and_back(self):
        self.cloud.start()
        self.checker.start()
        self.assertTrue(self.cloud.healthy)
        self.clock.advance(3)
        self.cloud_client.hang = True  # the cloud stops answering
        self.clock.advance(7)  # probe at 10 s, times out at 12 s
        self.assertTrue(self.cloud.healthy)
        self.clock.advance(2)
        self.assertFalse(self.cloud.healthy)
        for _ in range(30):
            self.clock.advance(1)
        self.assertEqual(self.writes_since(START), [
            (0.0, None), (10.0, None),
            # cloud unhealthy at 12 s: written at once, then every 9 s
            (12.0, "true"), (21.0, "true"), (30.0, "true"), (39.0, "true")])
        self.cloud_client.hang = False
        # Cloud probes at 50 s and 60 s succeed: healthy after the second one.
        for _ in range(20):
            self.clock.advance(1)
        self.assertTrue(self.cloud.healthy)
        writes = self.writes_since(START + 40)
        self.assertEqual(writes[:2], [(48.0, "true"), (57.0, "true")])
        self.assertEqual(writes[2], (60.0, None))  # at once when the cloud is back
        for _ in range(20):
            self.clock.advance(1)
        self.assertEqual(self.writes_since(START + 61), [(70.0, None), (80.0, None)])

    def test_health_flip_during_a_probe_in_flight_probes_right_after_it(self):
        self.cloud.start()
        self.checker.start()
        self.pool_client.hang = True
        self.clock.advance(10)  # coordinator probe at 10 s hangs (until 12 s)
        self.cloud_client.errors = [ServerError("down")]
        self.clock.advance(0)
        self.cloud.probers[0].restart()  # cloud fails now, while the pool write hangs
        self.assertFalse(self.cloud.healthy)
        self.pool_client.hang = False
        # One second at a time: Clock.advance runs the due calls at the new time.
        for _ in range(2):
            self.clock.advance(1)  # the hung probe times out at 12 s, then one at once
        self.assertEqual(self.writes_since(START + 1), [(12.0, "true")])
        for _ in range(9):
            self.clock.advance(1)
        self.assertEqual(self.writes_since(START + 1), [(12.0, "true"), (21.0, "true")])


class UnknownCloudHealthTests(unittest.TestCase):
    """An agent that just started does not know its cloud's health yet: its pool lease
    neither claims delegation nor ends one on a guess."""

    def setUp(self):
        self.clock = make_clock()
        self.cloud_client = FakeLeaseClient()
        self.cloud_client.hang = True  # the cloud's first probe is still on its way
        self.pool_client = RecordingLeaseClient(self.clock)
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.cloud_client}, NODE, settings)
        self.checker = CoordinatorHealthChecker(
            self.clock, self.pool_client, NODE, "https://coordinator", self.cloud, settings)

    def tearDown(self):
        self.successResultOf(self.cloud.stop())
        self.successResultOf(self.checker.stop())

    def delegated(self):
        return [delegated.get(DELEGATE_HEARTBEAT_ANNOTATION)
                for _at, _renew, delegated in self.pool_client.written]

    def test_no_annotation_until_the_cloud_answered_then_at_once(self):
        self.cloud.start()
        self.checker.start()
        self.assertFalse(self.cloud.decided)
        self.assertEqual(self.delegated(), [None])  # written, not marked delegated
        self.clock.advance(2)  # the cloud probe times out: the cloud is unreachable
        self.assertTrue(self.cloud.decided)
        self.assertFalse(self.cloud.healthy)
        self.assertEqual(self.delegated(), [None, "true"])  # at once, not 10 s later

    def test_a_stored_delegation_is_kept_until_the_cloud_answered(self):
        key = (health.NODE_LEASE_NAMESPACE, NODE)
        self.pool_client.objects[key] = {
            "metadata": {"name": NODE, "namespace": key[0], "resourceVersion": "7",
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": NODE}}
        self.cloud.start()
        self.checker.start()
        self.assertEqual(self.delegated(), ["true"])
        self.cloud_client.hang = False
        self.cloud.probers[0].restart()  # the in-flight probe still hangs
        self.clock.advance(2)  # it times out: unreachable, delegation goes on
        self.assertEqual(self.delegated(), ["true", "true"])


def cloud_gap_after_leader_death(renewals, death, takeover, latency):
    """Largest gap between successive renewTimes of the cloud lease when the pool
    leader forwards every pool renewal until it dies at ``death`` and the next
    leader, ``takeover`` + ``latency`` later, forwards the newest pool renewal."""
    before = [t for t in renewals if t <= death]
    after = [t for t in renewals if t <= death + takeover + latency]
    return after[-1] - before[-1]


class CloudGapAcrossLeaderDeathTests(unittest.TestCase):
    """The cadence rule bounds the cloud gap across a leader's death at W = 18 s for
    every phase of the death (default timings), where the plain interval and half
    of it reach 20 s. Pool renewals come from the real prober driven by a Clock."""

    def renewals(self, next_interval):
        clock = make_clock()
        client = RecordingLeaseClient(clock)
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=1)
        writer = NodeLeaseWriter(clock, client, NODE, settings.failed_retry)
        prober = LeaseProber(clock, writer, "https://coordinator", settings,
                             next_interval=lambda: next_interval)
        prober.start()
        for _ in range(200):
            clock.advance(0.5)
        self.successResultOf(prober.stop())
        return [at - START for at, _renew, _annotations in client.written]

    def worst_gap(self, cadence):
        renewals = self.renewals(cadence)
        worst = 0.0
        # Deaths every 0.1 s over two of the cadence's periods; takeover anywhere
        # from 13 s (a follower that had just seen the last renewal) to 17 s.
        for death_tenths in range(300, 300 + int(cadence * 20)):
            death = death_tenths / 10
            for takeover_tenths in range(130, 171, 5):
                gap = cloud_gap_after_leader_death(renewals, death, takeover_tenths / 10,
                                                   latency=0.5)
                worst = max(worst, gap)
        return worst

    def test_rule_keeps_the_gap_at_most_eighteen_seconds(self):
        cadence = health.delegating_interval(10, takeover=17)
        self.assertAlmostEqual(cadence, 9.0)
        self.assertLessEqual(self.worst_gap(cadence), 18.0 + 1e-6)

    def test_plain_and_half_interval_reach_twenty_seconds(self):
        self.assertAlmostEqual(self.worst_gap(10.0), 20.0)
        self.assertAlmostEqual(self.worst_gap(5.0), 20.0)


class KubeletGatingTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeLeaseClient()
        self.kubelet_code = 200
        self.kubelet_requests = []

        def http_get(url):
            self.kubelet_requests.append(url)
            return defer.succeed(FakeResponse(self.kubelet_code))

        self.kubelet = KubeletHealthChecker(self.clock, http_get, "http://127.0.0.1:10248/healthz",
                                            grace_period=40, interval=5, timeout=2)
        self.prober = make_prober(self.clock, self.client, kubelet=self.kubelet)

    def test_dead_kubelet_stops_heartbeats_after_grace_period(self):
        self.kubelet.start()
        self.prober.start()
        self.assertTrue(self.prober.healthy)
        self.kubelet_code = 500
        self.clock.advance(40)  # kubelet last healthy at START; 40 s is still within grace
        self.assertTrue(self.prober.healthy)
        writes = len(self.client.requests)
        self.clock.advance(10)  # 50 s without a healthy kubelet
        self.assertFalse(self.prober.healthy)
        self.assertEqual(len(self.client.requests), writes)
        self.assertIn("kubelet", self.prober.last_error)
        renewed = self.client.lease()["spec"]["renewTime"]
        self.clock.advance(30)
        self.assertEqual(self.client.lease()["spec"]["renewTime"], renewed)
        self.kubelet_code = 200
        self.clock.advance(5)  # kubelet answers again
        self.clock.advance(5)  # next heartbeat probe writes
        self.assertNotEqual(self.client.lease()["spec"]["renewTime"], renewed)
        self.successResultOf(self.prober.stop())
        self.successResultOf(self.kubelet.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_never_healthy_kubelet_counts_grace_from_start(self):
        self.kubelet_code = 503
        self.kubelet.start()
        self.assertTrue(self.kubelet.is_alive())
        for _ in range(8):
            self.clock.advance(5)
        self.assertTrue(self.kubelet.is_alive())  # exactly 40 s: still within grace
        self.clock.advance(1)
        self.assertFalse(self.kubelet.is_alive())
        self.assertEqual(len(self.kubelet_requests), 9)
        self.successResultOf(self.kubelet.stop())

    def test_kubelet_that_hangs_is_not_healthy(self):
        pending = []

        def http_get(url):
            d = defer.Deferred()
            pending.append(d)
            return d

        kubelet = KubeletHealthChecker(self.clock, http_get, "http://k/healthz",
                                       grace_period=10, interval=5, timeout=2)
        kubelet.start()
        self.clock.advance(2)
        self.assertIsNone(kubelet.last_healthy)
        self.assertTrue(pending[0].called)  # cancelled by the timeout
        self.successResultOf(kubelet.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])


class LiveHealthCheckerTests(unittest.TestCase):
    """Cloud and coordinator probers over real sockets against the Kubernetes API
    test server, with servers going down and coming back."""

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        from twisted.internet import reactor

        from yurtcoord.kube.client import ClientConfig, KubeClient
        from yurtcoord.testing.apiserver import KubeAPIServer

        self.reactor = reactor
        self.servers = {}
        self.clients = {}
        for name in ("cloud-a", "cloud-b", "coordinator"):
            server = KubeAPIServer(reactor)
            url = yield server.start(port=0)
            self.servers[name] = server
            self.clients[name] = KubeClient(reactor, ClientConfig(server=url, insecure=True,
                                                                  timeout=1.0))
        settings = ProbeSettings(interval=0.05, timeout=1.0, failed_retry=3, healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            reactor, {self.servers[n].url: self.clients[n] for n in ("cloud-a", "cloud-b")},
            NODE, settings)
        self.coordinator = CoordinatorHealthChecker(
            reactor, self.clients["coordinator"], NODE, self.servers["coordinator"].url,
            self.cloud, settings)

    @defer.inlineCallbacks
    def tearDown(self):
        yield self.cloud.stop()
        yield self.coordinator.stop()
        for client in self.clients.values():
            yield client.close()
        for server in self.servers.values():
            yield server.stop()

    def poll_until(self, condition, what, timeout=10.0):
        return poll_until(condition, timeout, 0.005, self.reactor, what=what)

    def lease_on(self, name):
        return self.servers[name].store.get(LEASES, NODE, health.NODE_LEASE_NAMESPACE)

    def delegated(self):
        lease = self.lease_on("coordinator")
        annotations = (lease or {}).get("metadata", {}).get("annotations") or {}
        return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true"

    @defer.inlineCallbacks
    def test_cloud_loss_and_return_drive_health_and_delegation(self):
        url_a, url_b = self.servers["cloud-a"].url, self.servers["cloud-b"].url
        self.cloud.start()
        self.coordinator.start()
        yield self.poll_until(lambda: all(self.cloud.servers().values()) and self.coordinator.healthy,
                              "every server healthy")
        for name in ("cloud-a", "cloud-b", "coordinator"):
            spec = self.lease_on(name)["spec"]
            self.assertEqual(spec["holderIdentity"], NODE)
            self.assertEqual(spec["leaseDurationSeconds"], 40)
        # The very first coordinator probe may have run before the cloud's first
        # answer (cloud not yet healthy, so delegated); the next one clears it.
        yield self.poll_until(lambda: not self.delegated(), "no delegate annotation")

        yield self.servers["cloud-a"].faults.down()
        yield self.poll_until(lambda: not self.cloud.servers()[url_a], "cloud-a unhealthy")
        self.assertTrue(self.cloud.healthy)
        self.assertEqual({self.cloud.pick_healthy_server() for _ in range(3)}, {url_b})

        yield self.servers["cloud-b"].faults.down()
        yield self.poll_until(lambda: not self.cloud.healthy, "cloud unhealthy")
        self.assertIsNone(self.cloud.pick_healthy_server())
        yield self.poll_until(self.delegated, "delegate annotation on the coordinator lease")
        self.assertTrue(self.coordinator.healthy)

        yield self.servers["cloud-a"].faults.up()
        yield self.servers["cloud-b"].faults.up()
        yield self.poll_until(lambda: all(self.cloud.servers().values()), "cloud back")
        yield self.poll_until(lambda: not self.delegated(), "delegate annotation removed")

    @defer.inlineCallbacks
    def test_coordinator_down_is_unhealthy_and_recovers(self):
        self.cloud.start()
        self.coordinator.start()
        yield self.poll_until(lambda: self.coordinator.healthy, "coordinator healthy")
        yield self.servers["coordinator"].faults.down()
        yield self.poll_until(lambda: not self.coordinator.healthy, "coordinator unhealthy")
        yield self.servers["coordinator"].faults.up()
        yield self.poll_until(lambda: self.coordinator.healthy, "coordinator healthy again")
        self.assertGreaterEqual(self.coordinator.prober.successes, 3)
