"""Heartbeat delegation: logic with a Clock and in-memory fakes, then end to end on
real sockets (a plain coordinator API server and a TLS cloud API server)."""

import copy
import os
from types import SimpleNamespace

from twisted.internet import defer, reactor
from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent
from twisted.trial import unittest

from yurtcoord.delegation import (
    DELEGATE_HEARTBEAT_ANNOTATION, MAX_ATTEMPTS, NODE_LEASE_NAMESPACE, HeartbeatDelegation,
    lease_for_create, merged_cloud_lease,
)
from yurtcoord.kube.backoff import Backoff
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import Conflict, ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import format_micro_time, parse_micro_time
from yurtcoord.testing.apiserver import KubeAPIServer
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube
from yurtcoord.testing.pki import TestCA
from yurtcoord.testing.poll import poll_until

T0 = 1_800_000_000.0
CLOUD_A = "https://cloud-a:6443"
CLOUD_B = "https://cloud-b:6443"


def pool_lease(name, renewed, delegated=True, annotations=None, labels=None):
    """A node lease as the coordinator apiserver holds it, server fields included."""
    notes = dict(annotations or {})
    if delegated:
        notes[DELEGATE_HEARTBEAT_ANNOTATION] = "true"
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NODE_LEASE_NAMESPACE,
            "resourceVersion": "4711",
            "uid": "pool-uid-" + name,
            "creationTimestamp": "2027-01-15T08:00:00Z",
            "generation": 3,
            "selfLink": f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}",
            "managedFields": [{"manager": "yurthub", "operation": "Update"}],
            "labels": dict(labels or {"node.openyurt.io/pool": "pool-a"}),
            "annotations": notes,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                 "uid": "node-uid-" + name}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": format_micro_time(renewed),
        },
    }


def cloud_lease(name, renewed, annotations=None, holder=None):
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                     "annotations": dict(annotations or {})},
        "spec": {"holderIdentity": holder or name, "leaseDurationSeconds": 40,
                 "renewTime": format_micro_time(renewed)},
    }


class RecordingKube(FakeKube):
    """FakeKube that also keeps the bodies of creates and updates."""

    def __init__(self):
        super().__init__()
        self.created_bodies = []
        self.updated_bodies = []

    def create(self, gvr, obj, namespace=None):
        self.created_bodies.append(copy.deepcopy(obj))
        return super().create(gvr, obj, namespace)

    def update(self, gvr, obj, namespace=None):
        self.updated_bodies.append(copy.deepcopy(obj))
        return super().update(gvr, obj, namespace)


class FakeHealth:
    """``pick_healthy_server`` answering from a list in turn (None = no healthy server)."""

    def __init__(self, servers):
        self.servers = list(servers)
        self.picks = 0

    def pick_healthy_server(self):
        server = self.servers[self.picks % len(self.servers)]
        self.picks += 1
        return server


class FakeMetrics:
    def __init__(self):
        self.observed = []

    def observe_delegation(self, seconds, succeeded):
        self.observed.append((seconds, succeeded))


class DelegationLogicTests(unittest.TestCase):
    """One delegation component over fakes; the clock is a ``Clock``."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(T0)
        self.informer = FakeInformer()
        self.clouds = {CLOUD_A: RecordingKube(), CLOUD_B: RecordingKube()}
        self.cloud = self.clouds[CLOUD_A]
        self.health = FakeHealth([CLOUD_A])
        self.metrics = FakeMetrics()
        self.clients_asked = []
        self.delegation = self.build()

    def build(self, **kwargs):
        def client_for(url):
            self.clients_asked.append(url)
            return self.clouds[url]

        def make_backoff():
            return Backoff(initial=1.0, maximum=4.0, jitter=0.0)

        return HeartbeatDelegation(
            self.clock, lambda: self.informer, self.health.pick_healthy_server, client_for,
            metrics=self.metrics, make_backoff=make_backoff, **kwargs)

    def start(self):
        d = self.delegation.start(None)
        self.assertIsNone(self.successResultOf(d))

    def stored(self, name, cloud=None):
        return (cloud or self.cloud).peek(LEASES, name, NODE_LEASE_NAMESPACE)

    def test_absent_cloud_lease_is_created_from_the_pool_lease(self):
        # The seed created its empty get result instead (fix 1).
        self.start()
        lease = pool_lease("node-b", T0 + 1)
        self.informer.add(lease)
        created = self.stored("node-b")
        self.assertIsNotNone(created)
        self.assertEqual(created["spec"], lease["spec"])
        self.assertEqual(created["spec"]["holderIdentity"], "node-b")
        self.assertEqual(created["metadata"]["labels"], {"node.openyurt.io/pool": "pool-a"})
        self.assertEqual(created["metadata"]["annotations"],
                         {DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.assertEqual(created["metadata"]["ownerReferences"],
                         lease["metadata"]["ownerReferences"])
        [body] = self.cloud.created_bodies
        for server_set in ("resourceVersion", "uid", "creationTimestamp", "managedFields",
                           "selfLink", "generation"):
            self.assertNotIn(server_set, body["metadata"])
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.delegation.created, 1)
        self.assertEqual(self.metrics.observed, [(0.0, True)])
        # The pool lease object the informer holds is not modified.
        self.assertEqual(lease["metadata"]["uid"], "pool-uid-node-b")

    def test_present_cloud_lease_gets_renew_time_and_merged_annotations(self):
        self.cloud.put(LEASES, cloud_lease(
            "node-b", T0, holder="node-b-cloud",
            annotations={"cloud.example/keep": "yes", "shared.example/x": "cloud"}))
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 10,
                                     annotations={"shared.example/x": "pool"}))
        lease = self.stored("node-b")
        self.assertEqual(parse_micro_time(lease["spec"]["renewTime"]), T0 + 10)
        self.assertEqual(lease["metadata"]["annotations"], {
            "cloud.example/keep": "yes",
            "shared.example/x": "pool",
            DELEGATE_HEARTBEAT_ANNOTATION: "true",
        })
        # Only annotations and renewTime come from the pool.
        self.assertEqual(lease["spec"]["holderIdentity"], "node-b-cloud")
        [body] = self.cloud.updated_bodies
        self.assertEqual(body["metadata"]["resourceVersion"], "1")
        self.assertEqual(self.cloud.created_bodies, [])
        self.assertEqual(self.delegation.delegated_heartbeats, 1)

    def test_older_pool_renew_time_never_overwrites_newer_cloud(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0 + 10))
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 5))
        self.informer.update(pool_lease("node-b", T0 + 5), pool_lease("node-b", T0 + 10))
        lease = self.stored("node-b")
        self.assertEqual(parse_micro_time(lease["spec"]["renewTime"]), T0 + 10)
        self.assertEqual(lease["metadata"]["resourceVersion"], "1")
        self.assertEqual(self.cloud.updated_bodies, [])
        self.assertEqual(self.delegation.skipped, 2)
        self.assertEqual(self.delegation.delegated_heartbeats, 0)
        self.assertEqual(self.delegation.failures, 0)

    def test_conflicts_are_reread_and_retried(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.fail_next("update", Conflict("stale"), count=MAX_ATTEMPTS - 1)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 10))
        verbs = [verb for verb, _ in self.cloud.calls]
        self.assertEqual(verbs, ["get", "update"] * MAX_ATTEMPTS)
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 10)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.delegation.failures, 0)

    def test_conflict_on_every_attempt_is_a_failure_then_retried_after_backoff(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.fail_next("update", Conflict("stale"), count=MAX_ATTEMPTS)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 10))
        verbs = [verb for verb, _ in self.cloud.calls]
        self.assertEqual(verbs, ["get", "update"] * MAX_ATTEMPTS)
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0)
        self.assertEqual(self.delegation.failures, 1)
        self.assertEqual(self.delegation.delegated_heartbeats, 0)
        self.assertEqual(self.metrics.observed, [(0.0, False)])
        # Nothing more until the backoff has passed, then the same state succeeds.
        self.clock.advance(0.9)
        self.assertEqual(len(self.cloud.calls), 2 * MAX_ATTEMPTS)
        self.clock.advance(0.1)
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 10)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.metrics.observed[-1], (1.0, True))

    def test_one_chain_per_lease_in_flight_and_newest_renew_time_wins(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 3))
        self.informer.update(pool_lease("node-b", T0 + 3), pool_lease("node-b", T0 + 2))
        self.assertEqual(self.cloud.calls, [("get", "node-b")])
        self.assertEqual(self.delegation.in_flight, 1)
        self.cloud.hold("update")
        self.cloud.deliver_held()  # first chain: update to T0+1 (held)
        self.assertEqual(self.cloud.calls, [("get", "node-b"), ("update", "node-b")])
        self.cloud.deliver_held()  # then the pending one, from the lease just written
        self.assertEqual(self.cloud.calls,
                         [("get", "node-b"), ("update", "node-b"), ("update", "node-b")])
        self.assertEqual(self.delegation.in_flight, 1)
        self.cloud.deliver_held()
        renewed = [parse_micro_time(b["spec"]["renewTime"]) for b in self.cloud.updated_bodies]
        self.assertEqual(renewed, [T0 + 1, T0 + 3])
        self.assertEqual(self.delegation.in_flight, 0)
        self.assertEqual(self.delegation.delegated_heartbeats, 2)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_renewal_is_one_update_after_the_first_delegation(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        for step in (2, 3, 4):
            self.informer.update(pool_lease("node-b", T0 + step - 1), pool_lease("node-b", T0 + step))
        self.assertEqual([verb for verb, _ in self.cloud.calls],
                         ["get", "create", "update", "update", "update"])
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 4)

    def test_renewal_written_meanwhile_by_the_node_is_reread_and_kept(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        direct = self.cloud.peek(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        direct["spec"]["renewTime"] = format_micro_time(T0 + 50)
        self.cloud.put(LEASES, direct)  # the node reached the cloud itself
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.assertEqual([verb for verb, _ in self.cloud.calls],
                         ["get", "create", "update", "get"])
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 50)
        self.assertEqual(self.delegation.skipped, 1)
        self.assertEqual(self.delegation.failures, 0)

    def test_chains_in_flight_are_bounded_and_queued_in_order(self):
        self.delegation = self.build(max_concurrent=2)
        self.cloud.hold("get")
        self.start()
        for name in ("node-a", "node-b", "node-c", "node-d"):
            self.informer.add(pool_lease(name, T0 + 1))
        self.assertEqual(self.delegation.in_flight, 2)
        self.assertEqual(self.delegation.queued, 2)
        self.assertEqual(self.cloud.calls, [("get", "node-a"), ("get", "node-b")])
        # node-a renews while it is in flight: it queues behind c and d.
        self.informer.update(pool_lease("node-a", T0 + 1), pool_lease("node-a", T0 + 2))
        self.cloud.deliver_held()
        self.assertEqual([name for verb, name in self.cloud.calls if verb == "get"],
                         ["node-a", "node-b", "node-c", "node-d"])
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.in_flight, 0)
        self.assertEqual(self.delegation.queued, 0)
        self.assertEqual(self.delegation.delegated_heartbeats, 5)
        self.assertEqual(parse_micro_time(self.stored("node-a")["spec"]["renewTime"]), T0 + 2)

    def test_many_leases_with_a_synchronous_client(self):
        self.start()
        for i in range(3000):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.assertEqual(self.delegation.delegated_heartbeats, 3000)
        self.assertEqual(self.delegation.in_flight, 0)

    def test_leases_of_different_nodes_run_concurrently(self):
        self.cloud.hold("get")
        self.start()
        for name in ("node-a", "node-b", "node-c"):
            self.informer.add(pool_lease(name, T0 + 1))
        self.assertEqual(self.delegation.in_flight, 3)
        self.assertEqual(sorted(name for _, name in self.cloud.calls),
                         ["node-a", "node-b", "node-c"])
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        for name in ("node-a", "node-b", "node-c"):
            self.assertEqual(self.stored(name)["spec"]["holderIdentity"], name)
        self.assertEqual(self.delegation.delegated_heartbeats, 3)

    def test_leases_without_the_annotation_are_never_forwarded(self):
        self.start()
        self.informer.add(pool_lease("node-a", T0 + 1, delegated=False))
        self.informer.add(pool_lease("node-c", T0 + 1, delegated=False,
                                     annotations={DELEGATE_HEARTBEAT_ANNOTATION: "false"}))
        self.informer.update(pool_lease("node-a", T0 + 1, delegated=False),
                             pool_lease("node-a", T0 + 2, delegated=False))
        self.assertEqual(self.cloud.calls, [])
        self.assertEqual(self.health.picks, 0)
        self.assertEqual(self.metrics.observed, [])

    def test_annotation_removed_while_in_flight_drops_the_pending_state(self):
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.informer.update(pool_lease("node-b", T0 + 2),
                             pool_lease("node-b", T0 + 3, delegated=False))
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.cloud.calls, [("get", "node-b"), ("create", "node-b")])
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 1)

    def test_a_healthy_server_is_picked_for_every_delegation(self):
        self.health.servers = [CLOUD_A, CLOUD_B]
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.informer.update(pool_lease("node-b", T0 + 2), pool_lease("node-b", T0 + 3))
        self.assertEqual(self.health.picks, 3)
        self.assertEqual(self.clients_asked, [CLOUD_A, CLOUD_B, CLOUD_A])
        renewed_a = parse_micro_time(self.stored("node-b", self.clouds[CLOUD_A])["spec"]["renewTime"])
        renewed_b = parse_micro_time(self.stored("node-b", self.clouds[CLOUD_B])["spec"]["renewTime"])
        self.assertEqual((renewed_a, renewed_b), (T0 + 3, T0 + 2))

    def test_no_healthy_server_counts_a_failure_and_retries_the_newest_state(self):
        self.health.servers = [None]
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(self.delegation.failures, 1)
        self.assertEqual(self.metrics.observed, [(0.0, False)])
        self.assertEqual(self.clients_asked, [])
        # A newer state arriving during the backoff waits for it and replaces the old.
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.assertEqual(self.health.picks, 1)
        self.clock.advance(1.0)  # still no server: second failure, backoff doubles
        self.assertEqual(self.delegation.failures, 2)
        self.health.servers = [CLOUD_A]
        self.clock.advance(1.9)
        self.assertIsNone(self.stored("node-b"))
        self.clock.advance(0.1)
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 2)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.metrics.observed[-1], (3.0, True))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_cloud_outage_is_logged_once_not_per_lease(self):
        events = []
        self.delegation.log = Logger(observer=events.append)
        self.health.servers = [None]
        self.start()
        for i in range(20):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.clock.advance(1.0)
        self.assertEqual(self.delegation.failures, 40)
        warnings = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(warnings, ["no healthy cloud server: heartbeat delegations wait and retry"])
        self.health.servers = [CLOUD_A]
        self.clock.advance(2.0)
        self.assertEqual(self.delegation.delegated_heartbeats, 20)
        infos = [formatEvent(e) for e in events if e["log_level"] == LogLevel.info]
        self.assertIn(f"heartbeat delegations reach the cloud again via {CLOUD_A}", infos)

    def test_server_errors_are_retried_with_backoff(self):
        self.cloud.fail_next("get", ServerError("boom"), count=2)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(1.0)
        self.assertEqual(self.delegation.failures, 2)
        self.clock.advance(2.0)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertIsNotNone(self.stored("node-b"))

    def test_deleted_pool_lease_cancels_its_retry(self):
        self.health.servers = [None]
        self.start()
        lease = pool_lease("node-b", T0 + 1)
        self.informer.add(lease)
        self.informer.delete(lease)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_cancels_requests_and_timers_at_once(self):
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.health.servers = [None]
        self.cloud.release_hold("get")
        self.informer.add(pool_lease("node-c", T0 + 1))  # fails: a retry timer
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        d = self.delegation.stop()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.informer.stopped, 1)
        self.assertTrue(self.cloud.held[0].cancelled)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.delegation.in_flight, 0)
        # Late answers and events change nothing.
        self.cloud.deliver_held()
        self.informer.add(pool_lease("node-d", T0 + 1))
        self.assertEqual(self.delegation.delegated_heartbeats, 0)
        self.assertEqual(self.metrics.observed, [(0.0, False)])
        self.assertIsNone(self.stored("node-b"))

    def test_restart_uses_a_new_informer_and_forwards_again(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.successResultOf(self.delegation.stop())
        self.informer = FakeInformer()
        self.start()
        self.assertEqual(self.informer.started, 1)
        self.informer.add(pool_lease("node-b", T0 + 2))
        self.assertEqual(parse_micro_time(self.stored("node-b")["spec"]["renewTime"]), T0 + 2)
        self.assertEqual(self.delegation.delegated_heartbeats, 2)

    def test_latency_is_measured_from_the_pool_event(self):
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(0.25)
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.metrics.observed, [(0.25, True)])


class LeaseShapingTests(unittest.TestCase):
    def test_lease_for_create_drops_server_fields_only(self):
        lease = pool_lease("node-b", T0)
        created = lease_for_create(lease)
        self.assertEqual(set(created["metadata"]),
                         {"name", "namespace", "labels", "annotations", "ownerReferences"})
        self.assertEqual(created["spec"], lease["spec"])
        self.assertIn("uid", lease["metadata"])

    def test_merge_keeps_cloud_resource_version(self):
        cloud = cloud_lease("node-b", T0, annotations={"a": "1"})
        cloud["metadata"]["resourceVersion"] = "9"
        merged = merged_cloud_lease(cloud, pool_lease("node-b", T0 + 1, annotations={"b": "2"}))
        self.assertEqual(merged["metadata"]["resourceVersion"], "9")
        self.assertEqual(merged["metadata"]["annotations"],
                         {"a": "1", "b": "2", DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.assertEqual(cloud["metadata"]["annotations"], {"a": "1"})


class DelegationLiveTests(unittest.TestCase):
    """A coordinator API server (plain HTTP) and a cloud API server that requires
    client certificates; the real informer and clients in between."""

    @defer.inlineCallbacks
    def setUp(self):
        tls_dir = self.mktemp()
        os.makedirs(tls_dir)
        ca = TestCA(tls_dir)
        ca.server_pair("server")
        proxy_pair = ca.client_pair("node-lease-proxy-client", "system:node-lease-proxy",
                                    organizations=["openyurt:yurt-coordinator"])
        self.pool = KubeAPIServer(reactor)
        self.cloud = KubeAPIServer(reactor, tls_dir=tls_dir)
        pool_url = yield self.pool.start()
        self.cloud_url = yield self.cloud.start()
        self.addCleanup(self.pool.stop)
        self.addCleanup(self.cloud.stop)
        self.pool_client = KubeClient(reactor, ClientConfig(server=pool_url, insecure=True))
        self.proxy_client = KubeClient(reactor, ClientConfig(
            server=self.cloud_url, ca_file=ca.ca_file, cert_file=proxy_pair.cert_file,
            key_file=proxy_pair.key_file))
        self.addCleanup(self.pool_client.close)
        self.addCleanup(self.proxy_client.close)
        clients = {self.cloud_url: self.proxy_client}
        cloud_health = SimpleNamespace(pick_healthy_server=lambda: self.cloud_url)
        self.delegation = HeartbeatDelegation.for_coordinator(
            reactor, self.pool_client, cloud_health, clients.__getitem__,
            make_backoff=lambda: Backoff(initial=0.05, maximum=0.5))
        self.addCleanup(self.delegation.stop)

    def cloud_renew_time(self, name):
        lease = self.cloud.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
        if lease is None:
            return None
        return parse_micro_time(lease["spec"]["renewTime"])

    def pool_lease(self, name, renewed, delegated=True):
        lease = pool_lease(name, renewed, delegated=delegated)
        for server_set in ("resourceVersion", "uid", "creationTimestamp", "managedFields",
                           "selfLink", "generation"):
            lease["metadata"].pop(server_set)
        return lease

    @defer.inlineCallbacks
    def test_delegated_leases_reach_the_cloud_through_the_proxy_certificate(self):
        # Delegated before this agent led: forwarded by the initial list.
        self.pool.store.create(LEASES, self.pool_lease("node-b", T0 + 1))
        self.pool.store.create(LEASES, self.pool_lease("node-c", T0 + 1, delegated=False))
        yield self.delegation.start(None)
        yield poll_until(lambda: self.cloud_renew_time("node-b") == T0 + 1,
                         what="node-b's lease created in the cloud")
        created = self.cloud.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        pooled = self.pool.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        self.assertEqual(created["spec"]["holderIdentity"], "node-b")
        self.assertEqual(created["spec"]["leaseDurationSeconds"], 40)
        self.assertEqual(created["metadata"]["labels"], {"node.openyurt.io/pool": "pool-a"})
        self.assertNotEqual(created["metadata"]["uid"], pooled["metadata"]["uid"])

        # Renewals advance the cloud lease.
        for step in (2, 3):
            pooled = self.pool.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
            pooled["spec"]["renewTime"] = format_micro_time(T0 + step)
            self.pool.store.update(LEASES, pooled)
            yield poll_until(lambda: self.cloud_renew_time("node-b") == T0 + step,
                             what=f"renewal {step} forwarded")
        self.assertIsNone(self.cloud.store.get(LEASES, "node-c", NODE_LEASE_NAMESPACE))

        # A newer renewal the node wrote itself is never moved back.
        cloud = self.cloud.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        cloud["spec"]["renewTime"] = format_micro_time(T0 + 100)
        self.cloud.store.update(LEASES, cloud)
        pooled = self.pool.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        pooled["spec"]["renewTime"] = format_micro_time(T0 + 4)
        self.pool.store.update(LEASES, pooled)
        yield poll_until(lambda: self.delegation.skipped >= 1,
                         what="older renewal skipped")
        self.assertEqual(self.cloud_renew_time("node-b"), T0 + 100)

        subjects = set(self.cloud.client_subjects)
        self.assertEqual(subjects, {"CN=system:node-lease-proxy,O=openyurt:yurt-coordinator"})
        self.assertEqual(self.delegation.delegated_heartbeats, 3)
        self.assertEqual(self.delegation.failures, 0)

    @defer.inlineCallbacks
    def test_cloud_down_then_back_the_newest_state_is_delivered(self):
        yield self.delegation.start(None)
        yield self.cloud.faults.down()
        self.pool.store.create(LEASES, self.pool_lease("node-b", T0 + 1))
        yield poll_until(lambda: self.delegation.failures >= 1,
                         what="a failed delegation")
        pooled = self.pool.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        pooled["spec"]["renewTime"] = format_micro_time(T0 + 2)
        self.pool.store.update(LEASES, pooled)
        yield self.cloud.faults.up()
        yield poll_until(lambda: self.cloud_renew_time("node-b") == T0 + 2,
                         what="newest state delivered after the cloud came back")
