"""Health checkers on a ``task.Clock`` with in-memory fakes: the node lease writer and
lease probes with their retries and thresholds, the cloud and coordinator checkers,
the servers in use named on the lease, the picked-server client and its failover,
the delegate annotation and the delegating cadence, and the kubelet gate."""

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.metrics import Metrics
from yurtcoord.heartbeat import probes as health
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.heartbeat.probes import (
    DELEGATE_HEARTBEAT_ANNOTATION,
    CloudHealthChecker,
    CoordinatorHealthChecker,
    KubeletHealthChecker,
    LeaseProber,
    NodeLeaseWriter,
    ProbeSettings,
    published_url,
    servers_in_use,
)
from yurtcoord.kube.errors import Conflict, ConnectionFailed, NotFound, ServerError, Timeout
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.heartbeat.interfaces import IKubeletAnswer, IServerHealthMetrics
from yurtcoord.kube.interfaces import IListWatchClient, IObjectClient
from yurtcoord.kube.leasewriter import LeaseWriteFailed
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.names import COORDINATOR_SERVER_ANNOTATION, ETCD_MEMBER_ANNOTATION
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakekube import FakeKube, FakeKubeServer
from yurtcoord.testing.leaseprobes import (
    DEFAULTS, NODE, START, make_clock, make_prober, node_lease,
)
from yurtcoord.testing.clocks import advance


def put_node_lease(client, lease):
    """Store ``lease`` as another writer would (a new resourceVersion)."""
    client.put(LEASES, lease)


def requests(client):
    """The calls ``client`` answered, lease calls by verb (``get``, ``create``,
    ``update``) and reads of the Node as ``get node``."""
    return [request.replace("get nodes", "get node").replace(" leases", "")
            for request in client.requests]


def lease_requests(client):
    """The verbs of the lease calls ``client`` answered."""
    return [request.split()[0] for request in client.requests if request.endswith(" leases")]


def lease_writes(client):
    """(seconds, renewTime, annotations) of every lease ``client`` accepted."""
    return [(at, lease["spec"]["renewTime"], dict(lease["metadata"].get("annotations") or {}))
            for at, lease in client.writes
            if (lease.get("spec") or {}).get("renewTime")]


class UnreadableNodes(FakeKube):
    """A ``FakeKube`` whose Node reads, while ``unreadable``, fail with ``error``, or
    get no answer when ``error`` is None; its leases work throughout."""

    def __init__(self, clock=None, error=None):
        super().__init__(clock)
        self.error = error
        self.unreadable = True

    def get(self, gvr, name, namespace=None):
        if gvr != NODES or not self.unreadable:
            return super().get(gvr, name, namespace)
        self.requests.append("get nodes")
        if self.error is None:
            return defer.Deferred()
        return defer.fail(self.error)


@implementer(IServerHealthMetrics)
class RecordingMetrics:
    def __init__(self):
        self.server_healthy = {}
        self.coordinator_server_healthy = {}
        self.loop_errors = []

    def count_loop_error(self, loop):
        self.loop_errors.append(loop)

    def set_server_healthy(self, server, healthy):
        self.server_healthy[server] = healthy

    def set_coordinator_server_healthy(self, server, healthy):
        self.coordinator_server_healthy[server] = healthy


@implementer(IKubeletAnswer)
class FakeResponse:
    def __init__(self, code):
        self.code = code

    def content(self):
        return defer.succeed(b"ok" if self.code == 200 else b"fail")


class ProbeRetryPolicyTests(unittest.TestCase):
    """The pauses between a probe's attempts fit every attempt in the interval."""

    def test_default_timings_pause_one_then_two_seconds(self):
        policy = health.probe_retry_policy(10, 2, 3)
        self.assertEqual([policy(1), policy(2)], [1.0, 2.0])

    def test_every_attempt_timing_out_still_ends_before_the_next_probe(self):
        for interval, timeout, failed_retry in ((10, 2, 3), (10, 1, 5), (1, 0.2, 3),
                                                (30, 5, 2), (5, 1, 1)):
            policy = health.probe_retry_policy(interval, timeout, failed_retry)
            worst = failed_retry * timeout + sum(policy(n) for n in range(1, failed_retry))
            self.assertLess(worst, interval, (interval, timeout, failed_retry))
            self.assertGreater(worst, failed_retry * timeout - 1e-9)

    def test_attempts_that_fill_the_interval_retry_at_once(self):
        policy = health.probe_retry_policy(0.5, 2, 3)
        self.assertEqual([policy(1), policy(2)], [0.0, 0.0])

    def test_failed_retry_must_be_positive(self):
        with self.assertRaises(ValueError):
            health.probe_retry_policy(10, 2, 0)


class NodeLeaseWriterTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube()

    def writer(self, **kwargs):
        return NodeLeaseWriter(self.clock, self.client, NODE, DEFAULTS, **kwargs)

    def test_creates_missing_lease_with_holder_duration_and_renew_time(self):
        self.successResultOf(self.writer().renew())
        lease = node_lease(self.client)
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 40)
        self.assertEqual(lease["spec"]["renewTime"], "2023-11-14T22:13:20.000000Z")
        self.assertNotIn("ownerReferences", lease["metadata"])
        self.assertEqual(requests(self.client), ["get", "get node", "create"])

    def test_created_lease_names_its_node_as_owner(self):
        """As the kubelet's own lease does: the lease goes when the Node goes."""
        self.client.put(NODES, {"metadata": {"name": NODE, "uid": "uid-7"}})
        self.successResultOf(self.writer().renew())
        self.assertEqual(node_lease(self.client)["metadata"]["ownerReferences"], [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-7"}])

    def test_node_is_not_read_while_the_lease_has_its_owner(self):
        """A renewal of a lease that names its owner is one request, also after a
        conflict and whatever the time since the Node was read."""
        self.client.put(NODES, {"metadata": {"name": NODE, "uid": "uid-7"}})
        writer = self.writer()
        self.successResultOf(writer.renew())
        put_node_lease(self.client, node_lease(self.client))  # someone else writes it
        advance(self.clock, 10)
        self.successResultOf(writer.renew())  # conflict, read again, update
        for _ in range(12):
            advance(self.clock, 10)
            self.successResultOf(writer.renew())
        self.assertEqual(requests(self.client),
                         ["get", "get node", "create", "update", "get", "update"]
                         + ["update"] * 12)

    def test_owner_is_added_on_renewal_when_the_lease_lacks_it(self):
        """As the kubelet does: a lease written without an owner (by an older agent,
        or before the server had the Node) gets it at the next renewal."""
        put_node_lease(self.client, {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40}})
        self.client.put(NODES, {"metadata": {"name": NODE, "uid": "uid-7"}})
        self.successResultOf(self.writer().renew())
        lease = node_lease(self.client)
        self.assertEqual(lease["metadata"]["ownerReferences"], [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-7"}])
        self.assertEqual(lease["spec"]["renewTime"], "2023-11-14T22:13:20.000000Z")
        self.assertEqual(requests(self.client), ["get", "get node", "update"])

    def test_a_node_that_appears_later_is_named_owner_within_the_read_interval(self):
        """While the server has no Node, it is read once per OWNER_READ_INTERVAL,
        not on every renewal; the renewal after it appeared, at most that interval
        later, names it, and from then on a renewal is one update."""
        writer = self.writer()
        self.successResultOf(writer.renew())  # no Node: created without an owner
        self.assertNotIn("ownerReferences", node_lease(self.client)["metadata"])
        advance(self.clock, 10)
        self.client.put(NODES, {"metadata": {"name": NODE, "uid": "uid-7"}})
        renewals = int(health.OWNER_READ_INTERVAL // 10) - 1
        for _ in range(renewals):  # up to 50 s after the Node was read
            self.successResultOf(writer.renew())
            advance(self.clock, 10)
        self.assertNotIn("ownerReferences", node_lease(self.client)["metadata"])
        self.assertEqual(requests(self.client).count("get node"), 1)
        self.successResultOf(writer.renew())  # 60 s after the read
        self.assertEqual(node_lease(self.client)["metadata"]["ownerReferences"][0]["uid"],
                         "uid-7")
        for _ in range(3):
            advance(self.clock, 10)
            self.successResultOf(writer.renew())
        self.assertEqual(requests(self.client),
                         ["get", "get node", "create"] + ["update"] * renewals
                         + ["get node", "update"] + ["update"] * 3)

    def test_a_missing_node_is_read_at_most_once_per_interval(self):
        writer = self.writer()
        for _ in range(31):  # 300 s of renewals every 10 s
            self.successResultOf(writer.renew())
            advance(self.clock, 10)
        self.assertEqual(requests(self.client).count("get node"),
                         1 + int(300 // health.OWNER_READ_INTERVAL))
        self.assertEqual(requests(self.client).count("update"), 30)

    def test_a_failed_node_read_does_not_keep_the_lease_from_being_created(self):
        """The heartbeat matters more than its owner: the lease is created at once
        without one, and the owner is added by a later renewal."""
        client = self.client = UnreadableNodes(error=ServerError("boom"))
        self.assertTrue(verifyObject(IObjectClient, client))
        writer = self.writer()
        self.successResultOf(writer.renew())
        lease = node_lease(client)
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertNotIn("ownerReferences", lease["metadata"])
        self.assertEqual(requests(client), ["get", "get node", "create"])
        client.unreadable = False
        client.put(NODES, {"metadata": {"name": NODE, "uid": "uid-7"}})
        advance(self.clock, health.OWNER_READ_INTERVAL)
        self.successResultOf(writer.renew())
        self.assertEqual(node_lease(client)["metadata"]["ownerReferences"][0]["uid"],
                         "uid-7")

    def test_a_node_read_that_hangs_costs_one_attempt_only(self):
        """The attempt that waited on the Node times out; the next one, after the
        policy's pause, creates the lease without reading the Node again."""
        client = self.client = UnreadableNodes(error=None)
        self.assertTrue(verifyObject(IObjectClient, client))
        writer = self.writer()
        d = writer.renew()
        advance(self.clock, DEFAULTS.timeout)  # the attempt times out on the Node read
        self.assertNoResult(d)
        advance(self.clock, 1)  # the pause before the second attempt
        self.successResultOf(d)
        self.assertNotIn("ownerReferences", node_lease(client)["metadata"])
        self.assertEqual(requests(client), ["get", "get node", "get", "create"])

    def test_renewal_keeps_the_lease_duration_the_lease_has(self):
        put_node_lease(self.client, {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 60}})
        writer = self.writer()
        self.successResultOf(writer.renew())
        advance(self.clock, 10)
        self.successResultOf(writer.renew())
        self.assertEqual(node_lease(self.client)["spec"]["leaseDurationSeconds"], 60)
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         "2023-11-14T22:13:30.000000Z")

    def test_next_renewal_updates_directly_with_new_time(self):
        writer = self.writer()
        self.successResultOf(writer.renew())
        advance(self.clock, 10)
        self.successResultOf(writer.renew())
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         "2023-11-14T22:13:30.000000Z")
        self.assertEqual(lease_requests(self.client), ["get", "create", "update"])

    def test_conflict_is_reread_and_retried_at_once(self):
        writer = self.writer()
        self.successResultOf(writer.renew())
        self.client.conflicts_on_update = 2
        advance(self.clock, 10)
        self.successResultOf(writer.renew())
        self.assertEqual(lease_requests(self.client),
                         ["get", "create", "update", "get", "update", "get", "update"])
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         "2023-11-14T22:13:30.000000Z")

    def test_last_attempt_in_conflict_is_a_failure(self):
        """Fix 10: a write that never got through must not look like a success."""
        writer = self.writer()
        self.successResultOf(writer.renew())
        written = node_lease(self.client)["spec"]["renewTime"]
        self.client.conflicts_on_update = 3
        advance(self.clock, 10)
        self.failureResultOf(writer.renew(), LeaseWriteFailed)
        self.assertEqual(requests(self.client).count("update"), 3)  # failed_retry attempts
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"], written)

    def test_other_errors_are_retried_after_the_policy_pauses(self):
        writer = self.writer()
        self.successResultOf(writer.renew())
        self.client.fail_next("*", ServerError("boom"), 2)
        advance(self.clock, 10)
        d = writer.renew()
        self.assertEqual(lease_requests(self.client)[2:], ["update"])
        advance(self.clock, 0.999)
        self.assertEqual(len(lease_requests(self.client)), 3)
        advance(self.clock, 0.001)  # 1 s after the first failure: read, fails again
        self.assertEqual(lease_requests(self.client)[3:], ["get"])
        advance(self.clock, 1.999)
        self.assertNoResult(d)
        advance(self.clock, 0.001)  # 2 s after the second failure: read and update
        self.successResultOf(d)
        self.assertEqual(lease_requests(self.client)[3:], ["get", "get", "update"])
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         format_micro_time(START + 13))

    def test_failed_retry_errors_fail_the_renewal(self):
        writer = self.writer()
        self.client.fail_next("*", ServerError("boom"), 3)
        d = writer.renew()
        advance(self.clock, 3)
        self.failureResultOf(d, ServerError)
        self.assertEqual(requests(self.client), ["get", "get", "get"])

    def test_each_attempt_is_bounded_by_the_timeout(self):
        writer = self.writer()
        self.client.hangs = 2
        d = writer.renew()
        advance(self.clock, 2)  # first attempt times out, pause 1 s
        advance(self.clock, 1)
        self.assertEqual(len(requests(self.client)), 2)
        advance(self.clock, 2)  # second attempt times out, pause 2 s
        advance(self.clock, 2)
        self.successResultOf(d)
        self.assertEqual(requests(self.client), ["get", "get", "get", "get node", "create"])

    def test_read_writes_nothing_and_absence_is_an_answer(self):
        writer = self.writer()
        self.assertIsNone(self.successResultOf(writer.read()))
        self.assertEqual(requests(self.client), ["get"])
        self.successResultOf(writer.renew())
        self.assertEqual(self.successResultOf(writer.read())["spec"]["holderIdentity"], NODE)
        self.assertEqual(requests(self.client)[-1:], ["get"])

    def test_keeps_other_annotations(self):
        put_node_lease(self.client, {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE,
                         "annotations": {"keep": "me"}},
            "spec": {}})
        writer = self.writer(annotations=lambda: {"drop": None, "add": "x"})
        self.successResultOf(writer.renew())
        self.assertEqual(node_lease(self.client)["metadata"]["annotations"],
                         {"keep": "me", "add": "x"})


class LeaseProberTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube()

    def test_first_probe_decides_healthy(self):
        metrics = RecordingMetrics()
        prober = make_prober(self.clock, self.client, report_health=metrics.set_server_healthy)
        self.assertFalse(prober.healthy)
        prober.start()
        self.assertTrue(prober.healthy)
        self.assertEqual(metrics.server_healthy, {"https://cloud-1": True})
        self.successResultOf(prober.stop())

    def test_first_answer_is_told_with_the_health_it_decided(self):
        self.client.fail_next("*", ServerError("down"), 3)
        prober = make_prober(self.clock, self.client)
        seen = []
        prober.when_answered().addCallback(lambda _: seen.append(prober.healthy))
        abandoned = prober.when_answered()
        abandoned.cancel()
        self.failureResultOf(abandoned, defer.CancelledError)
        prober.probe()
        self.assertEqual(seen, [])
        advance(self.clock, 3)
        self.assertEqual(seen, [False])
        self.assertIsNone(self.successResultOf(prober.when_answered()))

    def test_first_probe_decides_unhealthy(self):
        self.client.fail_next("*", ServerError("down"), 3)
        prober = make_prober(self.clock, self.client)
        d = prober.probe()
        advance(self.clock, 3)
        self.assertFalse(self.successResultOf(d))
        self.assertEqual(prober.probes, 1)
        self.assertIn("ServerError", prober.last_error)

    def test_failed_retry_minus_one_errors_do_not_make_a_server_unhealthy(self):
        """Two 500s in a row on one probe cost nothing: the third attempt, 3 s after
        the probe began, renews the lease and the server never turned unhealthy."""
        prober = make_prober(self.clock, self.client)
        changes = []
        prober.on_change = lambda p: changes.append((self.clock.seconds() - START, p.healthy))
        prober.start()
        self.client.fail_next("*", ServerError("down"), 2)
        advance(self.clock, 10)
        self.assertTrue(prober.healthy)
        advance(self.clock, 2.9)
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         format_micro_time(START))
        advance(self.clock, 0.1)
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         format_micro_time(START + 13))
        self.assertEqual(changes, [(0.0, True)])
        self.assertEqual((prober.probes, prober.successes), (2, 2))
        self.successResultOf(prober.stop())

    def test_failed_retry_errors_make_it_unhealthy_when_the_probe_ends(self):
        prober = make_prober(self.clock, self.client)
        changes = []
        prober.on_change = lambda p: changes.append((self.clock.seconds() - START, p.healthy))
        prober.start()
        self.client.fail_next("*", ServerError("down"), 3)
        advance(self.clock, 12.9)  # attempts at 10 s, 11 s and 13 s
        self.assertTrue(prober.healthy)
        advance(self.clock, 0.1)
        self.assertFalse(prober.healthy)
        self.assertEqual(changes, [(0.0, True), (13.0, False)])
        self.successResultOf(prober.stop())

    def test_timeouts_retry_and_a_probe_of_hangs_ends_before_the_next(self):
        """Attempts at 10 s, 13 s, 17 s each time out after 2 s: unhealthy at 19 s,
        and the next probe runs on time at 20 s."""
        prober = make_prober(self.clock, self.client)
        prober.start()
        self.client.hang = True
        times = []
        self.client.on_call = lambda verb, name: times.append(self.clock.seconds() - START)
        advance(self.clock, 18.95)
        self.assertTrue(prober.healthy)
        advance(self.clock, 0.1)
        self.assertFalse(prober.healthy)
        self.assertEqual(prober.last_error, "probe timed out")
        self.assertEqual([round(t, 3) for t in times], [10.0, 13.0, 17.0])
        self.client.hang = False
        advance(self.clock, 1)
        self.assertEqual([round(t, 3) for t in times], [10.0, 13.0, 17.0, 20.0, 20.0])
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_whole_probe_is_bounded_by_the_interval(self):
        settings = ProbeSettings(interval=1, timeout=2, failed_retry=3, healthy_threshold=2)
        prober = make_prober(self.clock, self.client, settings)
        self.client.hang = True
        prober.start()
        advance(self.clock, 0.999)
        self.assertEqual(prober.probes, 0)
        advance(self.clock, 0.001)
        self.assertEqual(prober.probes, 1)
        self.assertEqual(prober.last_error, "probe timed out")
        # The one attempt was cut short at 1 s, when the next probe began.
        self.assertEqual(requests(self.client), ["get", "get"])
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_healthy_again_after_threshold_good_probes(self):
        prober = make_prober(self.clock, self.client)
        prober.start()
        self.assertTrue(prober.healthy)
        self.client.fail_next("*", ServerError("down"), 3)
        advance(self.clock, 10)
        advance(self.clock, 3)
        self.assertFalse(prober.healthy)
        advance(self.clock, 7)  # 20 s: one good probe, below the threshold of 2
        self.assertFalse(prober.healthy)
        advance(self.clock, 10)  # 30 s: second consecutive good probe
        self.assertTrue(prober.healthy)
        self.assertEqual(prober.probes, 4)
        self.successResultOf(prober.stop())

    def test_failure_resets_the_success_count(self):
        prober = make_prober(self.clock, self.client,
                             ProbeSettings(interval=10, timeout=2, failed_retry=1,
                                           healthy_threshold=3))
        self.client.fail_next("*", ServerError("down"))
        prober.start()
        advance(self.clock, 10)
        advance(self.clock, 10)
        self.client.fail_next("*", ServerError("down"))
        advance(self.clock, 10)
        advance(self.clock, 10)
        advance(self.clock, 10)
        self.assertFalse(prober.healthy)
        advance(self.clock, 10)
        self.assertTrue(prober.healthy)
        self.successResultOf(prober.stop())

    def test_conflicts_until_last_attempt_make_the_server_unhealthy(self):
        """Fix 10 at the prober: nothing written, nothing counted as a success."""
        prober = make_prober(self.clock, self.client)
        prober.start()
        self.assertTrue(prober.healthy)
        self.client.conflicts_on_update = 3
        advance(self.clock, 10)
        self.assertFalse(prober.healthy)
        self.assertEqual(prober.successes, 1)
        self.assertIn("LeaseWriteFailed", prober.last_error)
        self.successResultOf(prober.stop())

    def test_restart_from_a_probe_that_ended_at_once_keeps_one_lattice(self):
        """A restart asked while a probe that answered synchronously is still being
        handled probes right after it, and leaves one timer, not two."""
        prober = make_prober(self.clock, self.client)
        restarts = []

        def on_change(changed):
            if not restarts:
                restarts.append(self.clock.seconds())
                changed.restart()

        prober.on_change = on_change
        prober.start()
        self.assertEqual(prober.probes, 2)  # the first, then the one asked for
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        advance(self.clock, 10)
        self.assertEqual(prober.probes, 3)
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_cancels_in_flight_probe_and_timers(self):
        prober = make_prober(self.clock, self.client)
        self.client.hang = True
        prober.start()
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(prober.probes, 0)

    def test_stop_during_a_pause_between_attempts(self):
        prober = make_prober(self.clock, self.client)
        self.client.fail_next("*", ServerError("down"))
        prober.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 2)  # pause and interval bound
        self.successResultOf(prober.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(prober.probes, 0)


class CloudHealthCheckerTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.clients = {f"https://cloud-{i}": FakeKube() for i in range(3)}
        self.checker = CloudHealthChecker.for_servers(self.clock, self.clients, NODE, DEFAULTS)

    def tearDown(self):
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def requests(self):
        return {url[-1]: list(lease_requests(client)) for url, client in self.clients.items()}

    def test_first_round_writes_through_one_and_reads_the_others(self):
        self.checker.start()
        self.assertEqual(self.requests(), {"0": ["get", "create"], "1": ["get"], "2": ["get"]})
        self.assertEqual(self.checker.servers(), dict.fromkeys(self.clients, True))
        self.assertTrue(self.checker.decided)

    def test_one_write_and_one_read_per_interval_round_robin(self):
        self.checker.start()
        for client in self.clients.values():
            del client.requests[:]
        for _ in range(4):
            advance(self.clock, 10)
        self.assertEqual(self.requests(), {"0": ["update"] * 4, "1": ["get", "get"],
                                           "2": ["get", "get"]})
        self.assertEqual(node_lease(self.clients["https://cloud-0"])["spec"]["renewTime"],
                         format_micro_time(START + 40))

    def test_failed_write_moves_at_once_to_a_healthy_server(self):
        self.checker.start()
        advance(self.clock, 10)
        self.clients["https://cloud-0"].fail_next("*", ServerError("down"), 3)
        advance(self.clock, 10)  # round at 20 s: cloud-0's attempts at 20, 21, 23 s
        self.assertIsNone(node_lease(self.clients["https://cloud-1"]))
        advance(self.clock, 3)
        self.assertFalse(self.checker.servers()["https://cloud-0"])
        self.assertEqual(self.checker.writing_server, "https://cloud-1")
        lease = node_lease(self.clients["https://cloud-1"])
        self.assertEqual(lease["spec"]["renewTime"], format_micro_time(START + 23))
        advance(self.clock, 7)  # 30 s: the heartbeat stays on cloud-1
        self.assertEqual(node_lease(self.clients["https://cloud-1"])["spec"]["renewTime"],
                         format_micro_time(START + 30))
        self.assertTrue(self.checker.healthy)

    def test_move_skips_unhealthy_servers(self):
        self.clients["https://cloud-1"].fail_next("*", ServerError("down"), 3)
        self.checker.start()
        advance(self.clock, 3)
        self.assertFalse(self.checker.servers()["https://cloud-1"])
        self.clients["https://cloud-0"].hang = True
        advance(self.clock, 7 + 9)  # 10 s: cloud-0 hangs, fails at 19 s
        self.assertEqual(self.checker.writing_server, "https://cloud-2")
        self.assertEqual(node_lease(self.clients["https://cloud-2"])["spec"]["renewTime"],
                         format_micro_time(START + 19))
        self.assertIsNone(node_lease(self.clients["https://cloud-1"]))

    def test_healthy_when_any_server_is(self):
        for client in list(self.clients.values())[:2]:
            client.fail_next("*", ServerError("down"), 3)
        self.checker.start()
        advance(self.clock, 3)
        self.assertTrue(self.checker.healthy)
        self.assertEqual(self.checker.servers(), {
            "https://cloud-0": False, "https://cloud-1": False, "https://cloud-2": True})
        self.assertEqual(self.checker.writing_server, "https://cloud-2")

    def test_unhealthy_when_every_server_is(self):
        for client in self.clients.values():
            client.fail_next("*", ServerError("down"), 9)
        self.checker.start()
        advance(self.clock, 9)
        self.assertFalse(self.checker.healthy)
        self.assertTrue(self.checker.decided)
        self.assertIsNone(self.checker.pick_healthy_server())

    def test_pick_healthy_server_rotates_among_healthy(self):
        self.clients["https://cloud-1"].fail_next("*", ServerError("down"), 3)
        self.checker.start()
        advance(self.clock, 3)
        picks = [self.checker.pick_healthy_server() for _ in range(4)]
        self.assertEqual(picks, ["https://cloud-0", "https://cloud-2",
                                 "https://cloud-0", "https://cloud-2"])

    def test_metrics_stay_per_server(self):
        metrics = RecordingMetrics()
        self.successResultOf(self.checker.stop())
        self.clients["https://cloud-2"].fail_next("*", ServerError("down"), 3)
        self.checker = CloudHealthChecker.for_servers(self.clock, self.clients, NODE, DEFAULTS,
                                                      metrics=metrics)
        self.checker.start()
        advance(self.clock, 3)
        self.assertEqual(metrics.server_healthy, {
            "https://cloud-0": True, "https://cloud-1": True, "https://cloud-2": False})


class CoordinatorHealthCheckerTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube()
        self.cloud = FakeHealth(True)
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=1)
        self.checker = CoordinatorHealthChecker(
            self.clock, {"https://coordinator": self.client}, NODE, self.cloud, settings)

    def annotations(self):
        return node_lease(self.client)["metadata"].get("annotations", {})

    def test_delegate_annotation_follows_cloud_health(self):
        self.checker.start()
        self.assertTrue(self.checker.healthy)
        self.assertNotIn(DELEGATE_HEARTBEAT_ANNOTATION, self.annotations())
        self.cloud.healthy = False
        advance(self.clock, 10)
        self.assertEqual(self.annotations().get(DELEGATE_HEARTBEAT_ANNOTATION), "true")
        advance(self.clock, 10)
        self.assertEqual(self.annotations().get(DELEGATE_HEARTBEAT_ANNOTATION), "true")
        self.cloud.healthy = True
        advance(self.clock, 10)
        self.assertNotIn(DELEGATE_HEARTBEAT_ANNOTATION, self.annotations())
        self.successResultOf(self.checker.stop())

    def test_lease_created_while_cloud_is_down_carries_annotation(self):
        self.cloud.healthy = False
        self.checker.start()
        self.assertEqual(self.annotations(), {DELEGATE_HEARTBEAT_ANNOTATION: "true",
                                              COORDINATOR_SERVER_ANNOTATION:
                                                  "https://coordinator"})
        self.successResultOf(self.checker.stop())

    def test_unhealthy_when_coordinator_refuses(self):
        self.client.fail_next("*", ServerError("down"))
        self.checker.start()
        self.assertFalse(self.checker.healthy)
        self.assertIsNone(node_lease(self.client))
        self.successResultOf(self.checker.stop())


class ServersInUseTests(unittest.TestCase):
    """The coordinator prober names on the node lease it writes the coordinator
    apiserver the write went through and the pool etcd member the pool store uses:
    without credentials, updated with the next renewal, absent while unknown."""

    SERVER = "https://coordinator-a:6443"

    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube(self.clock)
        self.member = "https://10.0.0.1:2379"
        self.checker = CoordinatorHealthChecker(
            self.clock, {self.SERVER: self.client}, NODE, FakeHealth(True), DEFAULTS,
            etcd_member=lambda: self.member)

    def tearDown(self):
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def in_use(self):
        return servers_in_use(node_lease(self.client))

    def test_the_lease_names_the_apiserver_and_the_etcd_member(self):
        self.checker.start()
        self.assertEqual(self.in_use(), ("https://10.0.0.1:2379", self.SERVER))
        self.assertEqual(node_lease(self.client)["metadata"]["annotations"], {
            ETCD_MEMBER_ANNOTATION: "https://10.0.0.1:2379",
            COORDINATOR_SERVER_ANNOTATION: self.SERVER})

    def test_a_new_member_is_written_with_the_next_renewal(self):
        self.checker.start()
        writes = len(self.client.writes)
        self.member = "https://10.0.0.2:2379"
        advance(self.clock, 9.9)
        # No write of its own: the lease still names the old member until its renewal.
        self.assertEqual(len(self.client.writes), writes)
        self.assertEqual(self.in_use()[0], "https://10.0.0.1:2379")
        advance(self.clock, 0.1)
        self.assertEqual(len(self.client.writes), writes + 1)
        self.assertEqual(self.in_use(), ("https://10.0.0.2:2379", self.SERVER))

    def test_no_pool_store_open_removes_the_etcd_member_only(self):
        put_node_lease(self.client, {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE,
                         "annotations": {"example.com/owner": "ops"}},
            "spec": {"holderIdentity": NODE}})
        self.checker.start()
        self.member = None
        advance(self.clock, 10)
        self.assertEqual(node_lease(self.client)["metadata"]["annotations"], {
            "example.com/owner": "ops", COORDINATOR_SERVER_ANNOTATION: self.SERVER})
        self.assertEqual(self.in_use(), (None, self.SERVER))

    def test_credentials_in_the_urls_are_never_written(self):
        clock, client = self.clock, FakeKube(self.clock)
        checker = CoordinatorHealthChecker(
            clock, {"https://admin:s3cret@coordinator-b:6443/": client}, NODE,
            FakeHealth(True), DEFAULTS,
            etcd_member=lambda: "https://root:pa%40ss@10.0.0.3:2379?token=abc#x")
        checker.start()
        annotations = node_lease(client)["metadata"]["annotations"]
        self.assertEqual(annotations, {
            ETCD_MEMBER_ANNOTATION: "https://10.0.0.3:2379",
            COORDINATOR_SERVER_ANNOTATION: "https://coordinator-b:6443/"})
        for _at, lease in client.writes:
            text = repr(lease)
            for secret in ("admin", "s3cret", "root", "pa%40ss", "token", "abc"):
                self.assertNotIn(secret, text)
        self.successResultOf(checker.stop())

    def test_published_url(self):
        for given, published in (
                ("https://10.0.0.1:2379", "https://10.0.0.1:2379"),
                ("http://user:pw@host:80/prefix?q=1#f", "http://host:80/prefix"),
                ("https://u:p@ss@[::1]:2379", "https://[::1]:2379"),
                (" https://host:6443 ", "https://host:6443"),
                ("http://[::1", None), ("https://host:port", None),
                ("javascript:alert(1)", None), ("host:2379", None), ("https://", None),
                ("", None), (None, None), (7, None), ({"url": "https://h"}, None)):
            self.assertEqual(published_url(given), published, given)

    def test_servers_in_use_of_any_lease(self):
        for lease in (None, "lease", {}, {"metadata": None}, {"metadata": {"annotations": 3}},
                      {"metadata": {"annotations": {ETCD_MEMBER_ANNOTATION: ["x"],
                                                    COORDINATOR_SERVER_ANNOTATION: 5}}}):
            self.assertEqual(servers_in_use(lease), (None, None), lease)


class SeveralCoordinatorServersTests(unittest.TestCase):
    """Coordinator apiservers over one pool etcd are one set, as the cloud servers
    are: the node lease is written through one and read from the others, the
    coordinator is healthy while any is, and requests go to the heartbeat's server
    while it is healthy, elsewhere as soon as one of them got no answer."""

    A, B = "https://coordinator-a", "https://coordinator-b"

    def setUp(self):
        self.clock = make_clock()
        self.clients = {self.A: FakeKube(self.clock), self.B: FakeKube(self.clock)}
        self.cloud = FakeHealth(True)
        self.metrics = RecordingMetrics()
        verifyObject(IServerHealthMetrics, self.metrics)
        self.checker = CoordinatorHealthChecker(self.clock, self.clients, NODE, self.cloud,
                                                DEFAULTS, metrics=self.metrics)

    def tearDown(self):
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def requests(self, url):
        return lease_requests(self.clients[url])

    def test_one_lease_write_and_one_read_per_interval(self):
        self.checker.start()
        advance(self.clock, 20)
        self.assertEqual(self.checker.servers(), {self.A: True, self.B: True})
        self.assertEqual(self.metrics.coordinator_server_healthy, {self.A: True, self.B: True})
        self.assertEqual(self.metrics.server_healthy, {})
        self.assertEqual(lease_requests(self.clients[self.A]),
                         ["get", "create", "update", "update"])
        self.assertEqual(lease_requests(self.clients[self.B]), ["get", "get", "get"])
        self.assertEqual(self.checker.pick_server(), self.A)

    def test_healthy_while_any_server_is(self):
        self.clients[self.B].fail_next("*", ServerError("down"), 100)
        self.checker.start()
        advance(self.clock, 3)
        self.assertEqual(self.checker.servers(), {self.A: True, self.B: False})
        self.assertEqual(self.metrics.coordinator_server_healthy, {self.A: True, self.B: False})
        self.assertTrue(self.checker.healthy)
        # Why B is unhealthy, for /readyz: its last probe's failure.
        self.assertEqual(list(self.checker.unhealthy_reasons()), [self.B])
        self.assertIn("down", self.checker.unhealthy_reasons()[self.B])
        self.clients[self.A].hang = True
        # Round at 10 s: A hangs (attempts cut at 12, 15 and 19 s); B was unhealthy.
        advance(self.clock, 7 + 8.5)
        self.assertTrue(self.checker.healthy)
        advance(self.clock, 0.5)
        self.assertFalse(self.checker.healthy)
        self.assertEqual(self.checker.servers(), {self.A: False, self.B: False})
        # With none healthy, requests still go somewhere: the heartbeat's server.
        self.assertIn(self.checker.pick_server(), (self.A, self.B))

    def test_failed_write_moves_the_heartbeat_and_the_requests(self):
        self.cloud.flip(False)  # the lease is written delegated
        self.checker.start()
        advance(self.clock, 10)
        self.clients[self.A].fail_next("*", ServerError("down"), 3)
        advance(self.clock, 9)  # round at 18 s (delegating cadence 9 s): 18, 19, 21 s
        self.assertEqual(self.checker.pick_server(), self.A)
        advance(self.clock, 2)
        self.assertEqual(self.checker.servers(), {self.A: False, self.B: True})
        self.assertEqual(self.checker.writing_server, self.B)
        self.assertEqual(self.checker.pick_server(), self.B)
        lease = node_lease(self.clients[self.B])
        self.assertEqual(lease["spec"]["renewTime"], format_micro_time(START + 21))
        # The lease names the server the write went through now.
        self.assertEqual(lease["metadata"]["annotations"],
                         {DELEGATE_HEARTBEAT_ANNOTATION: "true",
                          COORDINATOR_SERVER_ANNOTATION: self.B})
        self.assertTrue(self.checker.healthy)

    def test_suspected_writing_server_is_probed_at_once_and_avoided_meanwhile(self):
        self.checker.start()
        advance(self.clock, 3)
        self.clients[self.A].fail_next("*", ServerError("down"), 3)
        self.checker.suspect(self.A)
        # Requests leave A at once, before its probe has ended.
        self.assertEqual(self.checker.pick_server(), self.B)
        self.assertTrue(self.checker.servers()[self.A])
        advance(self.clock, 3)  # the probe of A at 3 s: attempts at 3, 4 and 6 s
        self.assertEqual(self.checker.servers(), {self.A: False, self.B: True})
        self.assertEqual(node_lease(self.clients[self.B])["spec"]["renewTime"],
                         format_micro_time(START + 6))
        # A server already known unhealthy is not probed again on suspicion.
        sent = len(self.clients[self.A].requests)
        self.checker.suspect(self.A)
        self.assertEqual(len(self.clients[self.A].requests), sent)
        self.assertEqual(self.checker.pick_server(), self.B)

    def test_suspected_server_that_answers_is_trusted_again(self):
        self.checker.start()
        advance(self.clock, 4)
        reads = self.requests(self.B).count("get")
        self.checker.suspect(self.B)
        # B is read at once and answers: nothing changes, the requests stay on A.
        self.assertEqual(self.requests(self.B).count("get"), reads + 1)
        self.assertEqual(self.checker.servers(), {self.A: True, self.B: True})
        self.clients[self.A].hang = True
        self.checker.suspect(self.A)
        self.assertEqual(self.checker.pick_server(), self.B)
        self.assertEqual(self.checker.writing_server, self.A)

    def test_one_server_takes_every_request_whatever_its_health(self):
        client = FakeKube(self.clock)
        checker = CoordinatorHealthChecker(self.clock, {self.A: client}, NODE, self.cloud,
                                           DEFAULTS)
        checker.start()
        advance(self.clock, 3)
        # A request that got no answer changes nothing: no early probe.
        sent = len(client.requests)
        checker.suspect(self.A)
        self.assertEqual((checker.pick_server(), len(client.requests)), (self.A, sent))
        client.fail_next("*", ServerError("down"), 3)
        advance(self.clock, 10)
        self.assertFalse(checker.healthy)
        self.assertEqual(checker.pick_server(), self.A)
        self.successResultOf(checker.stop())


class ServerHealthGaugeTests(unittest.TestCase):
    """The agent's metrics show each coordinator apiserver's health in
    ``node_yurthub_server_healthy_status{server}`` beside the cloud servers, as
    yurthub did, and in yurtcoord's own coordinator gauge."""

    CLOUD = "https://cloud-1"
    A, B = "https://coordinator-a", "https://coordinator-b"

    def gauges(self, metrics):
        text = metrics.render().decode("utf-8")
        return {(family.name, sample.labels["server"]): sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if family.name in ("node_yurthub_server_healthy_status",
                                   "yurtcoord_coordinator_server_healthy_status")}

    def test_coordinator_apiservers_in_both_gauges(self):
        clock = make_clock()
        metrics = Metrics(NODE, "pool-a")
        cloud = CloudHealthChecker.for_servers(clock, {self.CLOUD: FakeKube(clock)}, NODE,
                                               DEFAULTS, metrics=metrics)
        clients = {self.A: FakeKube(clock), self.B: FakeKube(clock)}
        clients[self.B].fail_next("*", ServerError("down"), 100)
        coordinator = CoordinatorHealthChecker(clock, clients, NODE, cloud, DEFAULTS,
                                               metrics=metrics)
        cloud.start()
        coordinator.start()
        advance(clock, 3)
        self.assertEqual(self.gauges(metrics), {
            ("node_yurthub_server_healthy_status", self.CLOUD): 1.0,
            ("node_yurthub_server_healthy_status", self.A): 1.0,
            ("node_yurthub_server_healthy_status", self.B): 0.0,
            ("yurtcoord_coordinator_server_healthy_status", self.A): 1.0,
            ("yurtcoord_coordinator_server_healthy_status", self.B): 0.0,
        })
        clients[self.B].clear_failures()
        advance(clock, 10 * DEFAULTS.healthy_threshold)  # B answers its read probes
        self.assertEqual(self.gauges(metrics)[("node_yurthub_server_healthy_status", self.B)],
                         1.0)
        self.successResultOf(coordinator.stop())
        self.successResultOf(cloud.stop())


class PickedServerClientTests(unittest.TestCase):
    """The client of the coordinator apiservers asks the checker's pick for every
    call and tells it of every call that got no answer."""

    def setUp(self):
        self.clients = {"https://a": FakeKube(), "https://b": FakeKube()}
        self.picked = ["https://a"]
        self.unreachable = []
        self.client = PickedServerClient(lambda: self.picked[0], self.clients.__getitem__,
                                         what="coordinator apiserver",
                                         on_unreachable=self.unreachable.append)

    def test_calls_go_to_the_server_picked_then(self):
        self.successResultOf(self.client.create(LEASES, {"metadata": {
            "name": "x", "namespace": "ns"}}, "ns"))
        self.assertIsNotNone(self.clients["https://a"].peek(LEASES, "x", "ns"))
        self.picked[0] = "https://b"
        self.failureResultOf(self.client.get(LEASES, "x", "ns"), NotFound)
        self.assertEqual(self.unreachable, [])

    def test_no_answer_is_reported_with_the_server(self):
        self.clients["https://a"].fail_next("get", ConnectionFailed("refused"))
        self.clients["https://a"].fail_next("update", Timeout("late"))
        self.failureResultOf(self.client.get(LEASES, "x", "ns"), ConnectionFailed)
        self.failureResultOf(self.client.update(LEASES, {"metadata": {
            "name": "x", "namespace": "ns", "resourceVersion": "1"}}, "ns"), Timeout)
        self.assertEqual(self.unreachable, ["https://a", "https://a"])

    def test_nothing_picked_fails_like_an_unreachable_server(self):
        self.picked[0] = None
        failure = self.failureResultOf(self.client.get(LEASES, "x", "ns"), ConnectionFailed)
        self.assertIn("no coordinator apiserver", str(failure.value))
        self.assertEqual(self.unreachable, [])


class PickedServerFailoverTests(unittest.TestCase):
    """A call whose connection failed goes at once to the server picked then, when
    sending it twice is safe: reads, and updates guarded by a resourceVersion."""

    A, B = "https://coordinator-a", "https://coordinator-b"

    def setUp(self):
        self.store = FakeKube()
        self.servers = {url: FakeKubeServer(self.store, url) for url in (self.A, self.B)}
        self.unreachable = []
        self.client = PickedServerClient(self.pick, self.servers.__getitem__,
                                         what="coordinator apiserver",
                                         on_unreachable=self.unreachable.append)
        self.lease = self.store.put(LEASES, {"metadata": {"name": "x", "namespace": "ns"},
                                             "spec": {"holderIdentity": "edge-1"}})

    def pick(self):
        """A first, B while A got no answer; A again when both got none."""
        trusted = [url for url in (self.A, self.B) if url not in self.unreachable]
        return (trusted or [self.A])[0]

    def calls(self, url):
        return [verb for verb, _name in self.servers[url].calls]

    def renewed(self, holder="edge-2"):
        lease = dict(self.lease, spec={"holderIdentity": holder})
        return lease

    def test_the_fakes_offer_the_client_interfaces(self):
        self.assertTrue(verifyObject(IObjectClient, self.servers[self.A]))
        self.assertTrue(verifyObject(IObjectClient, self.client))
        self.assertTrue(verifyObject(IListWatchClient, self.client))

    def test_refused_read_and_guarded_update_go_to_the_next_server_at_once(self):
        self.servers[self.A].kill()
        got = self.successResultOf(self.client.get(LEASES, "x", "ns"))
        self.assertEqual(got["spec"]["holderIdentity"], "edge-1")
        updated = self.successResultOf(self.client.update(LEASES, self.renewed(), "ns"))
        self.assertEqual(updated["spec"]["holderIdentity"], "edge-2")
        self.assertEqual(self.store.peek(LEASES, "x", "ns")["spec"]["holderIdentity"],
                         "edge-2")
        # A was tried once per call, then left alone; B took both.
        self.assertEqual(self.calls(self.A), ["get"])
        self.assertEqual(self.calls(self.B), ["get", "update"])
        self.assertEqual(self.unreachable, [self.A])

    def test_update_whose_answer_was_lost_after_it_landed_conflicts_on_the_other(self):
        server = self.servers[self.A]
        server.stall()
        answer = self.client.update(LEASES, self.renewed(), "ns")
        self.assertNoResult(answer)
        landed = self.store.peek(LEASES, "x", "ns")
        self.assertEqual(landed["spec"]["holderIdentity"], "edge-2")
        server.kill()
        # Sent again through B with the same resourceVersion: the store refuses it,
        # and the caller reads again as after any lost race. Written once.
        self.failureResultOf(answer, Conflict)
        self.assertEqual(self.calls(self.B), ["update"])
        self.assertEqual(self.store.peek(LEASES, "x", "ns"), landed)

    def test_calls_that_may_not_run_twice_are_not_sent_again(self):
        server = self.servers[self.A]
        server.stall()
        unguarded = self.renewed()
        unguarded["metadata"] = {"name": "x", "namespace": "ns"}
        answers = [
            self.client.create(LEASES, {"metadata": {"name": "y", "namespace": "ns"}}, "ns"),
            self.client.delete(LEASES, "x", "ns"),
            self.client.update(LEASES, unguarded, "ns"),
        ]
        server.kill()
        for answer in answers:
            self.failureResultOf(answer, ConnectionFailed)
        self.assertEqual(self.calls(self.B), [])
        self.assertEqual(self.unreachable, [self.A] * 3)

    def test_an_answer_or_a_timeout_is_not_sent_again(self):
        clients = {self.A: FakeKube(), self.B: FakeKube()}
        client = PickedServerClient(self.pick, clients.__getitem__,
                                    on_unreachable=self.unreachable.append)
        clients[self.A].fail_next("get", ServerError("etcd unavailable"))
        clients[self.A].fail_next("get", Timeout("late"))
        self.failureResultOf(client.get(LEASES, "x", "ns"), ServerError)
        self.failureResultOf(client.get(LEASES, "x", "ns"), Timeout)
        self.assertEqual(clients[self.B].calls, [])
        self.assertEqual(self.unreachable, [self.A])

    def test_each_server_is_tried_once_per_call(self):
        for server in self.servers.values():
            server.kill()
        failure = self.failureResultOf(self.client.get(LEASES, "x", "ns"), ConnectionFailed)
        self.assertIn(self.B, str(failure.value))
        self.assertEqual((self.calls(self.A), self.calls(self.B)), (["get"], ["get"]))

    def test_a_single_server_gets_the_call_once(self):
        client = PickedServerClient(lambda: self.A, self.servers.__getitem__,
                                    on_unreachable=self.unreachable.append)
        self.servers[self.A].kill()
        self.failureResultOf(client.get(LEASES, "x", "ns"), ConnectionFailed)
        self.assertEqual(self.calls(self.A), ["get"])
        self.assertEqual(self.calls(self.B), [])

    def test_cancelling_the_call_cancels_the_call_sent_again(self):
        self.servers[self.A].kill()
        self.servers[self.B].stall()
        answer = self.client.get(LEASES, "x", "ns")
        self.assertEqual(self.calls(self.B), ["get"])
        answer.cancel()
        self.failureResultOf(answer, defer.CancelledError)


class CloudProberDelegateAnnotationTests(unittest.TestCase):
    """A node heartbeating the cloud directly again drops the delegate annotation
    that the pool leader copied into its cloud lease; other annotations stay."""

    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube()
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)
        self.checker = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.client}, NODE, settings)

    def delegated_cloud_lease(self):
        """The cloud lease as the delegating leader wrote it."""
        lease = node_lease(self.client) or {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": NODE}}
        lease["metadata"]["annotations"] = {DELEGATE_HEARTBEAT_ANNOTATION: "true",
                                            "example.com/owner": "ops"}
        lease["spec"]["renewTime"] = format_micro_time(self.clock.seconds())
        put_node_lease(self.client, lease)

    def test_direct_write_after_delegation_removes_only_the_delegate_annotation(self):
        self.delegated_cloud_lease()
        self.checker.start()
        annotations = node_lease(self.client)["metadata"]["annotations"]
        self.assertEqual(annotations, {"example.com/owner": "ops"})
        # The leader wrote renewTime START at the same instant: 1 µs past it, so the
        # cloud's renewTime moves forward.
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"],
                         format_micro_time(START + 1e-6))
        self.successResultOf(self.checker.stop())

    def test_leader_write_between_renewals_is_reread_and_cleaned(self):
        self.checker.start()
        advance(self.clock, 5)
        # The leader forwards a delegated pool lease meanwhile: the prober's next
        # update conflicts, it re-reads and still removes the annotation.
        self.delegated_cloud_lease()
        advance(self.clock, 5)
        lease = node_lease(self.client)
        self.assertEqual(lease["metadata"]["annotations"], {"example.com/owner": "ops"})
        self.assertEqual(lease["spec"]["renewTime"], format_micro_time(START + 10))
        self.assertEqual(requests(self.client)[-3:], ["update", "get", "update"])
        self.successResultOf(self.checker.stop())

    def test_lease_without_annotations_stays_without(self):
        self.checker.start()
        advance(self.clock, 10)
        self.assertNotIn("annotations", node_lease(self.client)["metadata"])
        self.successResultOf(self.checker.stop())


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
        self.cloud_client = FakeKube()
        self.pool_client = FakeKube(self.clock)
        self.settings = ProbeSettings(interval=10, timeout=2, failed_retry=3,
                                      healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.cloud_client}, NODE, self.settings)
        self.checker = CoordinatorHealthChecker(
            self.clock, {"https://coordinator": self.pool_client}, NODE, self.cloud,
            self.settings)

    def tearDown(self):
        self.successResultOf(self.cloud.stop())
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def writes_since(self, since):
        return [(at - START, delegated.get(DELEGATE_HEARTBEAT_ANNOTATION))
                for at, _renew, delegated in lease_writes(self.pool_client) if at >= since]

    def test_cloud_loss_writes_at_once_then_every_nine_seconds_and_back(self):
        self.cloud.start()
        self.checker.start()
        self.assertTrue(self.cloud.healthy)
        advance(self.clock, 3)
        self.cloud_client.hang = True  # the cloud stops answering
        # The probe at 10 s tries at 10, 13 and 17 s, each attempt cut at 2 s.
        advance(self.clock, 15.5)
        self.assertTrue(self.cloud.healthy)
        advance(self.clock, 0.5)
        self.assertFalse(self.cloud.healthy)
        advance(self.clock, 30.5)
        self.assertEqual(self.writes_since(START), [
            (0.0, None), (10.0, None),
            # cloud unhealthy at 19 s: written at once, then every 9 s
            (19.0, "true"), (28.0, "true"), (37.0, "true"), (46.0, "true")])
        self.cloud_client.hang = False
        # Cloud probes at 50 s and 60 s succeed: healthy after the second one.
        advance(self.clock, 10)
        self.assertFalse(self.cloud.healthy)
        advance(self.clock, 0.5)
        self.assertTrue(self.cloud.healthy)
        self.assertEqual(self.writes_since(START + 47),
                         [(55.0, "true"), (60.0, None)])  # at once when the cloud is back
        advance(self.clock, 20)
        self.assertEqual(self.writes_since(START + 61), [(70.0, None), (80.0, None)])

    def test_health_flip_during_a_probe_in_flight_probes_right_after_it(self):
        self.cloud.start()
        self.checker.start()
        self.pool_client.hangs = 2
        advance(self.clock, 10)  # coordinator probe at 10 s: attempts at 10, 13 hang, 17 s writes
        self.cloud_client.fail_next("*", ServerError("down"), 3)
        self.cloud.restart()  # the cloud fails at 13 s, while the pool write is in flight
        advance(self.clock, 3)
        self.assertFalse(self.cloud.healthy)
        self.assertEqual(self.writes_since(START + 1), [])
        advance(self.clock, 4)
        # The probe in flight writes at 17 s, then at once the one the flip asked for.
        self.assertEqual(self.writes_since(START + 1), [(17.0, "true"), (17.0, "true")])
        advance(self.clock, 9)
        self.assertEqual(self.writes_since(START + 1),
                         [(17.0, "true"), (17.0, "true"), (26.0, "true")])


class UnknownCloudHealthTests(unittest.TestCase):
    """An agent that just started does not know its cloud's health yet: its pool lease
    neither claims delegation nor ends one on a guess."""

    def setUp(self):
        self.clock = make_clock()
        self.cloud_client = FakeKube()
        self.cloud_client.hang = True  # the cloud's first probe is still on its way
        self.pool_client = FakeKube(self.clock)
        # The cloud's probe fails at 8.25 s, off the 9 s delegating cadence.
        settings = ProbeSettings(interval=10, timeout=1, failed_retry=3, healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            self.clock, {"https://cloud-1": self.cloud_client}, NODE, settings)
        self.checker = CoordinatorHealthChecker(
            self.clock, {"https://coordinator": self.pool_client}, NODE, self.cloud, settings)

    def tearDown(self):
        self.successResultOf(self.cloud.stop())
        self.successResultOf(self.checker.stop())

    def delegated(self):
        return [delegated.get(DELEGATE_HEARTBEAT_ANNOTATION)
                for _at, _renew, delegated in lease_writes(self.pool_client)]

    def test_no_annotation_until_the_cloud_answered_then_at_once(self):
        self.cloud.start()
        self.checker.start()
        self.assertFalse(self.cloud.decided)
        self.assertEqual(self.delegated(), [None])  # written, not marked delegated
        # Attempts at 0, 2.75 and 7.25 s, each cut after 1 s.
        advance(self.clock, 8)
        self.assertFalse(self.cloud.decided)
        self.assertEqual(self.delegated(), [None])
        advance(self.clock, 0.25)  # the cloud's third attempt times out: unreachable
        self.assertTrue(self.cloud.decided)
        self.assertFalse(self.cloud.healthy)
        self.assertEqual(self.delegated(), [None, "true"])  # at once, not 10 s later

    def test_a_stored_delegation_is_kept_until_the_cloud_answered(self):
        put_node_lease(self.pool_client, {
            "metadata": {"name": NODE, "namespace": health.NODE_LEASE_NAMESPACE,
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": NODE}})
        self.cloud.start()
        self.checker.start()
        self.assertEqual(self.delegated(), ["true"])
        advance(self.clock, 9)  # the cloud's probe fails: unreachable, delegation goes on
        self.assertEqual(self.delegated(), ["true", "true"])


def cloud_gap_after_leader_death(renewals, death, takeover, latency):
    """Largest gap between successive renewTimes of the cloud lease when the pool
    leader forwards every pool renewal, stamped with the moment it saw it, until it
    dies at ``death``, and the next leader, started ``takeover`` + ``latency`` later,
    forwards the first pool renewal after its start (the one it lists as it starts is
    no change it saw)."""
    before = [t for t in renewals if t <= death]
    after = [t for t in renewals if t > death + takeover + latency]
    return after[0] - before[-1]


class CloudGapAcrossLeaderDeathTests(unittest.TestCase):
    """The cadence rule bounds the cloud gap across a leader's death at W + one
    cadence = 27 s for every phase of the death (default timings), within the node
    lifecycle controller's 40 s grace period, where the plain interval reaches 30 s
    (half of it, at twice the writes, 25 s). Pool renewals come from the real prober
    driven by a Clock."""

    def renewals(self, next_interval):
        clock = make_clock()
        client = FakeKube(clock)
        settings = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=1)
        writer = NodeLeaseWriter(clock, client, NODE, settings)
        prober = LeaseProber(clock, writer, "https://coordinator", settings,
                             next_interval=lambda: next_interval)
        prober.start()
        for _ in range(200):
            clock.advance(0.5)
        self.successResultOf(prober.stop())
        return [at - START for at, _renew, _annotations in lease_writes(client)]

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

    def test_rule_keeps_the_gap_at_most_twenty_seven_seconds(self):
        cadence = health.delegating_interval(10, takeover=17)
        self.assertAlmostEqual(cadence, 9.0)
        self.assertAlmostEqual(self.worst_gap(cadence), 27.0)

    def test_plain_interval_reaches_thirty_seconds_and_half_of_it_twenty_five(self):
        self.assertAlmostEqual(self.worst_gap(10.0), 30.0)
        self.assertAlmostEqual(self.worst_gap(5.0), 25.0)


class KubeletGatingTests(unittest.TestCase):
    def setUp(self):
        self.clock = make_clock()
        self.client = FakeKube()
        self.kubelet_code = 200
        self.kubelet_requests = []
        verifyObject(IKubeletAnswer, FakeResponse(200))

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
        advance(self.clock, 40)  # kubelet last healthy at START; 40 s is still within grace
        self.assertTrue(self.prober.healthy)
        writes = len(requests(self.client))
        advance(self.clock, 10)  # 50 s without a healthy kubelet
        self.assertFalse(self.prober.healthy)
        self.assertEqual(len(requests(self.client)), writes)
        self.assertIn("kubelet", self.prober.last_error)
        renewed = node_lease(self.client)["spec"]["renewTime"]
        advance(self.clock, 30)
        self.assertEqual(node_lease(self.client)["spec"]["renewTime"], renewed)
        self.kubelet_code = 200
        advance(self.clock, 5)  # kubelet answers again
        advance(self.clock, 5)  # next heartbeat probe writes
        self.assertNotEqual(node_lease(self.client)["spec"]["renewTime"], renewed)
        self.successResultOf(self.prober.stop())
        self.successResultOf(self.kubelet.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_never_healthy_kubelet_counts_grace_from_start(self):
        self.kubelet_code = 503
        self.kubelet.start()
        self.assertTrue(self.kubelet.is_alive())
        for _ in range(8):
            advance(self.clock, 5)
        self.assertTrue(self.kubelet.is_alive())  # exactly 40 s: still within grace
        advance(self.clock, 1)
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
        advance(self.clock, 2)
        self.assertIsNone(kubelet.last_healthy)
        self.assertTrue(pending[0].called)  # cancelled by the timeout
        self.successResultOf(kubelet.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])


class KubeletGatingSeveralServersTests(unittest.TestCase):
    """With the kubelet dead, every cloud server's probe fails without a request:
    the cloud counts as unhealthy and the heartbeat does not hop between servers."""

    def test_dead_kubelet_fails_every_server_without_requests(self):
        clock = make_clock()
        clients = {f"https://cloud-{i}": FakeKube() for i in range(3)}
        code = [200]
        kubelet = KubeletHealthChecker(clock, lambda url: defer.succeed(FakeResponse(code[0])),
                                       "http://127.0.0.1:10248/healthz", grace_period=5,
                                       interval=5, timeout=2)
        checker = CloudHealthChecker.for_servers(clock, clients, NODE, DEFAULTS,
                                                 kubelet=kubelet)
        kubelet.start()
        checker.start()
        self.assertTrue(checker.healthy)
        sent = {url: len(requests(client)) for url, client in clients.items()}
        code[0] = 500  # last healthy at 0 s: dead from 5 s on
        advance(clock, 10)
        self.assertFalse(checker.healthy)
        self.assertEqual(checker.servers(), dict.fromkeys(clients, False))
        self.assertEqual({url: len(requests(client)) for url, client in clients.items()}, sent)
        self.assertEqual(checker.writing_server, "https://cloud-0")
        code[0] = 200  # answers at 15 s
        advance(clock, 20)
        self.assertTrue(checker.healthy)
        self.assertEqual(node_lease(clients["https://cloud-0"])["spec"]["renewTime"],
                         format_micro_time(START + 30))
        self.successResultOf(checker.stop())
        self.successResultOf(kubelet.stop())
