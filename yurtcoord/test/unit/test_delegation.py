"""Heartbeat delegation with a Clock and in-memory fakes: what the leader forwards of
the pool's delegated node leases to the cloud, with concurrency, conflicts, retries
and stop; the rules deciding which leases are forwarded; how the leader stamps the
cloud lease with its own clock, whatever clocks the nodes and earlier leaders kept;
the observers; and the shape of the cloud lease it writes."""

import gc
import tracemalloc

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, Logger, LogLevel, formatEvent
from twisted.trial import unittest

from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.heartbeat import absentnames, cloudwrite, forwarding, leaselife, refusals
from yurtcoord.heartbeat import delegation as delegation_module
from yurtcoord.heartbeat.cloudwrite import lease_for_create, merged_cloud_lease
from yurtcoord.heartbeat.delegation import (
    ABSENT_NAMES, ABSENT_NAMES_TTL, DELEGATE_HEARTBEAT_ANNOTATION, MAX_ATTEMPTS, MAX_NODE_READS,
    MAX_WAITING, NODE_LEASE_NAMESPACE, REFUSAL_REASONS, HeartbeatDelegation, IDelegationMetrics,
)
from yurtcoord.heartbeat.refusals import SUMMARY_EXAMPLES, SUMMARY_PERIOD
from yurtcoord.heartbeat.probes import NODE_LEASE_DURATION_SECONDS
from yurtcoord.kube.lease import stamped_renew_time
from yurtcoord.tx.heap import QuietCollections
from yurtcoord.tx.retry import backoff_policy
from yurtcoord.kube.errors import Conflict, ConnectionFailed, ServerError
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.kube.interfaces import IInformer, IObjectClient
from yurtcoord.kube.lease import format_micro_time, parse_micro_time
from yurtcoord.names import COORDINATOR_SERVER_ANNOTATION, ETCD_MEMBER_ANNOTATION
from yurtcoord.testing.delegationobjects import POOL, pool_lease, pool_node
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube

T0 = 1_800_000_000.0
# The leader's clock in the logic tests. The pool leases name renewTimes of T0 + a few
# seconds, 1000 s behind it, as nodes whose clocks run behind write them: the leader
# never compares them with its clock.
NOW = T0 + 1000.0
CLOUD_A = "https://cloud-a:6443"
CLOUD_B = "https://cloud-b:6443"


def cloud_lease(name, renewed, annotations=None, holder=None):
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                     "annotations": dict(annotations or {})},
        "spec": {"holderIdentity": holder or name, "leaseDurationSeconds": 40,
                 "renewTime": format_micro_time(renewed)},
    }


def sent(kube, verb):
    """The bodies of the ``verb`` calls (create or update) sent to ``kube``."""
    return [body for called, body in kube.bodies if called == verb]


def micros(time):
    """POSIX microseconds, exactly, of a MicroTime string or of POSIX seconds (times
    of this century: a float holds their microseconds)."""
    seconds = parse_micro_time(time) if isinstance(time, str) else time
    return round(seconds * 1_000_000)


def renewed_by_node(name, renewed):
    """``pool_lease(name, renewed)``, with the resourceVersion the coordinator gave
    that renewal (each write of a lease moves it)."""
    lease = pool_lease(name, renewed)
    lease["metadata"]["resourceVersion"] = str(micros(renewed))
    return lease


@implementer(ILogObserver)
class LogEvents(list):
    """The log events of the component under test, in order; with a clock, each
    carries the clock's time it was logged at as ``clock_time``."""

    def __init__(self, clock=None):
        super().__init__()
        self.clock = clock

    def __call__(self, event):
        if self.clock is not None:
            event["clock_time"] = self.clock.seconds()
        self.append(event)


def made_up_lease(name, renewed, holder=None):
    """A delegated lease as anyone writing made-up names into the coordinator
    apiserver could write it: only what passes the lease's own checks."""
    return {"metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                         "resourceVersion": str(micros(renewed)),
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": holder or name, "renewTime": format_micro_time(renewed)}}


@implementer(IDelegationMetrics)
class FakeMetrics:
    def __init__(self):
        self.observed = []
        self.refused = []
        self.limits = []

    def observe_delegation(self, seconds, succeeded):
        self.observed.append((seconds, succeeded))

    def count_delegation_refused(self, reason):
        self.refused.append(reason)

    def set_delegation_limit(self, limit):
        self.limits.append(limit)


class DelegationFixture:
    """One delegation component over fakes; the clock is a ``Clock``, the leader's."""

    # Nodes of the pool the node informer lists at start.
    pool_nodes = ("node-a", "node-b", "node-c", "node-d", "node-ghost",
                  *(f"node-{i}" for i in range(3000)))

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(NOW)
        self.informer = FakeInformer()
        self.nodes = FakeInformer()
        self.node_selectors = []
        # The cloud's Nodes as a read of one Node sees them (other pools included).
        self.node_reader = FakeKube()
        self.clouds = {CLOUD_A: FakeKube(self.clock), CLOUD_B: FakeKube(self.clock)}
        self.cloud = self.clouds[CLOUD_A]
        self.health = FakeHealth(picks_from=[CLOUD_A])
        self.metrics = FakeMetrics()
        self.clients_asked = []
        self.delegation = self.build()

    def build(self, **kwargs):
        def client_for(url):
            self.clients_asked.append(url)
            return self.clouds[url]

        def make_node_informer(label_selector):
            self.node_selectors.append(label_selector)
            return self.nodes

        verifyObject(IDelegationMetrics, self.metrics)
        verifyObject(IInformer, self.informer)
        verifyObject(IInformer, self.nodes)
        verifyObject(IObjectClient, self.node_reader)
        for cloud in self.clouds.values():
            verifyObject(IObjectClient, cloud)
        return HeartbeatDelegation(
            self.clock, lambda: self.informer, make_node_informer, self.node_reader,
            self.health.pick_healthy_server, client_for, POOL, metrics=self.metrics,
            retry_policy=backoff_policy(initial=1.0, maximum=4.0, jitter=0.0), **kwargs)

    def start(self, listed=True, leases=()):
        """Start. The lease informer's first list holds ``leases``, what the
        coordinator held as this term started; with ``listed``, the node informer
        lists ``pool_nodes`` at once."""
        d = self.delegation.start(None)
        self.assertIsNone(self.successResultOf(d))
        self.informer.end_list(leases)
        if listed:
            self.list_nodes()

    def list_nodes(self, names=None):
        for name in self.pool_nodes if names is None else names:
            self.nodes.add(pool_node(name))
        self.nodes.end_list()

    def stored(self, name, cloud=None):
        return (cloud or self.cloud).peek(LEASES, name, NODE_LEASE_NAMESPACE)

    def renewed(self, name, cloud=None):
        """The renewTime of ``name``'s cloud lease in POSIX microseconds; None
        without a lease."""
        lease = self.stored(name, cloud)
        return None if lease is None else micros(lease["spec"]["renewTime"])

    def written(self, name, cloud=None):
        """The renewTimes (POSIX microseconds) of every write of ``name``'s cloud
        lease the cloud took, in order."""
        return [micros(lease["spec"]["renewTime"]) for _at, lease in (cloud or self.cloud).writes
                if lease["metadata"]["name"] == name]


# The annotations a coordinator prober sets on a pool lease besides the delegate one.
SERVERS_IN_USE = {ETCD_MEMBER_ANNOTATION: "https://10.0.0.1:2379",
                  COORDINATOR_SERVER_ANNOTATION: "https://10.0.0.1:6443"}


class DelegationLogicTests(DelegationFixture, unittest.TestCase):
    """Forwarding: what is written, concurrency, conflicts, retries, stop."""

    def test_absent_cloud_lease_is_created_for_the_pool_lease(self):
        # The seed created its empty get result instead (fix 1).
        self.start()
        # What the node's agent uses of the pool stays in the pool, as any other annotation.
        lease = pool_lease("node-b", T0 + 1, annotations={"example.com/other": "x",
                                                          **SERVERS_IN_USE})
        lease["spec"]["acquireTime"] = format_micro_time(T0)
        lease["spec"]["leaseTransitions"] = 4
        self.informer.add(lease)
        created = self.stored("node-b")
        self.assertIsNotNone(created)
        # The leader's spec: its own time, its own lease duration, the node as holder;
        # no label, no other annotation or spec field of the pool lease.
        self.assertEqual(created["spec"], {"holderIdentity": "node-b",
                                           "leaseDurationSeconds": NODE_LEASE_DURATION_SECONDS,
                                           "renewTime": format_micro_time(NOW)})
        [body] = sent(self.cloud, "create")
        self.assertEqual(body["metadata"], {
            "name": "node-b", "namespace": NODE_LEASE_NAMESPACE,
            "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"},
            # To the Node as the informer listed it, as the kubelet's own lease has.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-b",
                                 "uid": "node-uid-node-b"}],
        })
        self.assertEqual(body["kind"], "Lease")
        self.assertEqual(body["apiVersion"], "coordination.k8s.io/v1")
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.delegation.created, 1)
        self.assertEqual(self.metrics.observed, [(0.0, True)])
        # The pool lease object the informer holds is not modified.
        self.assertEqual(lease["metadata"]["uid"], "pool-uid-node-b")
        self.assertEqual(lease["spec"]["renewTime"], format_micro_time(T0 + 1))

    def test_present_cloud_lease_gets_only_the_leaders_fields(self):
        present = cloud_lease(
            "node-b", T0, holder="node-b-cloud",
            annotations={"cloud.example/keep": "yes", "shared.example/x": "cloud"})
        present["metadata"]["labels"] = {"cloud.example/label": "kept"}
        present["spec"]["leaseDurationSeconds"] = 10
        present["spec"]["leaseTransitions"] = 2
        self.cloud.put(LEASES, present)
        self.start()
        forwarded = pool_lease("node-b", T0 + 10, annotations={"shared.example/x": "pool",
                                                               **SERVERS_IN_USE})
        forwarded["spec"]["leaseTransitions"] = 9
        self.informer.add(forwarded)
        lease = self.stored("node-b")
        self.assertEqual(lease["spec"], {"holderIdentity": "node-b",
                                         "leaseDurationSeconds": NODE_LEASE_DURATION_SECONDS,
                                         "renewTime": format_micro_time(NOW),
                                         "leaseTransitions": 2})
        # The delegate annotation is set; the pool's other annotations stay out, the
        # cloud's stay in, and so do its labels.
        self.assertEqual(lease["metadata"]["annotations"], {
            "cloud.example/keep": "yes",
            "shared.example/x": "cloud",
            DELEGATE_HEARTBEAT_ANNOTATION: "true",
        })
        self.assertEqual(lease["metadata"]["labels"], {"cloud.example/label": "kept"})
        self.assertNotIn("ownerReferences", lease["metadata"])
        [body] = sent(self.cloud, "update")
        self.assertEqual(body["metadata"]["resourceVersion"], "1")
        self.assertEqual(sent(self.cloud, "create"), [])
        self.assertEqual(self.delegation.delegated_heartbeats, 1)

    def test_conflicts_are_reread_and_retried(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.fail_next("update", Conflict("stale"), count=MAX_ATTEMPTS - 1)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 10))
        verbs = [verb for verb, _ in self.cloud.calls]
        self.assertEqual(verbs, ["get", "update"] * MAX_ATTEMPTS)
        self.assertEqual(self.renewed("node-b"), micros(NOW))
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.delegation.failures, 0)

    def test_conflict_on_every_attempt_is_a_failure_then_retried_after_backoff(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.fail_next("update", Conflict("stale"), count=MAX_ATTEMPTS)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 10))
        verbs = [verb for verb, _ in self.cloud.calls]
        self.assertEqual(verbs, ["get", "update"] * MAX_ATTEMPTS)
        self.assertEqual(self.renewed("node-b"), micros(T0))
        self.assertEqual(self.delegation.failures, 1)
        self.assertEqual(self.delegation.delegated_heartbeats, 0)
        self.assertEqual(self.metrics.observed, [(0.0, False)])
        # Nothing more until the backoff has passed, then the same state succeeds,
        # stamped with the time of the write.
        self.clock.advance(0.9)
        self.assertEqual(len(self.cloud.calls), 2 * MAX_ATTEMPTS)
        self.clock.advance(0.1)
        self.assertEqual(self.renewed("node-b"), micros(NOW + 1))
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.metrics.observed[-1], (1.0, True))

    def test_one_chain_per_lease_in_flight_and_the_state_seen_last_wins(self):
        self.cloud.put(LEASES, cloud_lease("node-b", T0))
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 3))
        # The node's clock stepped back (NTP came back): still a change, seen last.
        self.informer.update(pool_lease("node-b", T0 + 3), pool_lease("node-b", T0 + 2))
        self.assertEqual(self.cloud.calls, [("get", "node-b")])
        self.assertEqual(self.delegation.in_flight, 1)
        self.cloud.hold("update")
        self.cloud.deliver_held()  # first chain: update (held)
        self.assertEqual(self.cloud.calls, [("get", "node-b"), ("update", "node-b")])
        self.cloud.deliver_held()  # then the pending one, from the lease just written
        self.assertEqual(self.cloud.calls,
                         [("get", "node-b"), ("update", "node-b"), ("update", "node-b")])
        self.assertEqual(self.delegation.in_flight, 1)
        self.cloud.deliver_held()
        # Two writes for three changes, each past the one before although the
        # leader's clock did not move.
        self.assertEqual(self.written("node-b"), [micros(NOW), micros(NOW) + 1])
        self.assertEqual(self.delegation.in_flight, 0)
        self.assertEqual(self.delegation.delegated_heartbeats, 2)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_renewal_is_one_update_after_the_first_delegation(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        for step in (2, 3, 4):
            self.clock.advance(1)
            self.informer.update(pool_lease("node-b", T0 + step - 1), pool_lease("node-b", T0 + step))
        self.assertEqual([verb for verb, _ in self.cloud.calls],
                         ["get", "create", "update", "update", "update"])
        self.assertEqual(self.written("node-b"), [micros(NOW + k) for k in range(4)])

    def test_renewal_written_meanwhile_by_the_node_is_reread_and_exceeded(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        direct = self.cloud.peek(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        # The node reached the cloud itself, with its clock 50 s ahead of the leader's.
        direct["spec"]["renewTime"] = format_micro_time(NOW + 50)
        self.cloud.put(LEASES, direct)
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.assertEqual([verb for verb, _ in self.cloud.calls],
                         ["get", "create", "update", "get", "update"])
        self.assertEqual(self.renewed("node-b"), micros(NOW + 50) + 1)
        self.assertEqual(self.delegation.delegated_heartbeats, 2)
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
        self.assertEqual(self.written("node-a"), [micros(NOW), micros(NOW) + 1])

    def test_the_bound_on_chains_follows_the_clouds_latency(self):
        self.metrics.limits.clear()
        self.delegation = self.build(max_concurrent=20, min_concurrent=2)
        self.assertEqual(self.delegation.concurrency_limit, 16)
        self.cloud.hold("get")
        self.start()
        for i in range(70):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.assertEqual(self.delegation.in_flight, 16)
        # A round of 16 answers in 10 ms with every slot taken: one more slot.
        self.clock.advance(0.010)
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.delegated_heartbeats, 16)
        self.assertEqual(self.delegation.concurrency_limit, 17)
        self.assertEqual(self.delegation.in_flight, 17)
        # The cloud answers a round in 500 ms: one stall across every chain in flight
        # takes nothing off.
        self.clock.advance(0.500)
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.delegated_heartbeats, 33)
        self.assertEqual(self.delegation.concurrency_limit, 17)
        # The next round, started after it, is as slow: the cloud slowed down. The
        # first of its answers takes a quarter off, the others of that round ran
        # under the old bound and take nothing more.
        self.clock.advance(0.500)
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.delegated_heartbeats, 50)
        self.assertEqual(self.delegation.concurrency_limit, 12)
        self.assertEqual(self.delegation.in_flight, 12)
        self.assertEqual(self.metrics.limits, [16, 17, 12])
        # Per-lease coalescing stays: a lease renewed twice while it waits is one chain.
        self.informer.update(pool_lease("node-69", T0 + 1), pool_lease("node-69", T0 + 2))
        self.informer.update(pool_lease("node-69", T0 + 2), pool_lease("node-69", T0 + 3))
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.in_flight, 0)
        self.assertEqual(self.delegation.delegated_heartbeats, 70)
        self.assertEqual(self.written("node-69"), [micros(self.clock.seconds())])

    def test_a_failing_cloud_shrinks_the_bound_on_chains(self):
        self.delegation = self.build(max_concurrent=20, min_concurrent=2)
        self.cloud.hold("get")
        self.cloud.fail_next("get", ServerError("overloaded"), count=16)
        self.start()
        for i in range(16):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.clock.advance(0.010)
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.failures, 16)
        self.assertEqual(self.delegation.concurrency_limit, 12)

    def test_by_default_the_bound_never_drops_below_the_clouds_connections(self):
        self.cloud.hold("get")
        self.cloud.fail_next("get", ServerError("overloaded"), count=16)
        self.start()
        for i in range(16):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.clock.advance(5.0)
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.failures, 16)
        self.assertEqual(self.delegation.concurrency_limit, 16)

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
        self.assertEqual(self.written("node-b"), [micros(NOW)])

    def test_annotation_removed_while_a_failing_chain_runs_is_not_retried(self):
        self.cloud.fail_next("get", ServerError("boom"))
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.informer.update(pool_lease("node-b", T0 + 1),
                             pool_lease("node-b", T0 + 2, delegated=False))
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.delegation.failures, 1)
        # The node writes to the cloud itself again: its old state is not retried.
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(60)
        self.assertEqual(self.cloud.calls, [("get", "node-b")])
        self.assertIsNone(self.stored("node-b"))

    def test_a_healthy_server_is_picked_for_every_delegation(self):
        self.health.picks_from = [CLOUD_A, CLOUD_B]
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        for step in (2, 3):
            self.clock.advance(1)
            self.informer.update(pool_lease("node-b", T0 + step - 1),
                                 pool_lease("node-b", T0 + step))
        self.assertEqual(self.health.picks, 3)
        self.assertEqual(self.clients_asked, [CLOUD_A, CLOUD_B, CLOUD_A])
        self.assertEqual(self.written("node-b", self.clouds[CLOUD_A]),
                         [micros(NOW), micros(NOW + 2)])
        self.assertEqual(self.written("node-b", self.clouds[CLOUD_B]), [micros(NOW + 1)])

    def test_no_healthy_server_counts_a_failure_and_retries_the_newest_state(self):
        self.health.picks_from = [None]
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
        self.health.picks_from = [CLOUD_A]
        self.clock.advance(1.9)
        self.assertIsNone(self.stored("node-b"))
        self.clock.advance(0.1)
        self.assertEqual(self.written("node-b"), [micros(NOW + 3)])
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.metrics.observed[-1], (3.0, True))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_cloud_outage_is_logged_once_not_per_lease(self):
        events = []
        self.delegation.log = Logger(observer=events.append)
        self.health.picks_from = [None]
        self.start()
        for i in range(20):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.clock.advance(1.0)
        self.assertEqual(self.delegation.failures, 40)
        warnings = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(warnings, ["no healthy cloud server: heartbeat delegations wait and retry"])
        self.health.picks_from = [CLOUD_A]
        self.clock.advance(2.0)
        self.assertEqual(self.delegation.delegated_heartbeats, 20)
        infos = [formatEvent(e) for e in events if e["log_level"] == LogLevel.info]
        self.assertIn(f"heartbeat delegations reach the cloud again via {CLOUD_A}", infos)

    def test_a_steady_renewal_logs_nothing(self):
        # A pool of thousands of nodes renews a thousand leases a second; a log
        # line per forwarded heartbeat costs the leader more than forwarding it
        # (the delegation metrics count and time every one).
        events = []
        self.start()
        for i in range(20):
            self.informer.add(pool_lease(f"node-{i}", T0 + 1))
        self.delegation.log = Logger(observer=events.append)
        for i in range(20):
            self.informer.update(pool_lease(f"node-{i}", T0 + 1), pool_lease(f"node-{i}", T0 + 2))
        self.assertEqual(self.delegation.delegated_heartbeats, 40)
        self.assertEqual([formatEvent(e) for e in events], [])

    def test_server_errors_are_retried_with_backoff(self):
        self.cloud.fail_next("get", ServerError("boom"), count=2)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(1.0)
        self.assertEqual(self.delegation.failures, 2)
        self.clock.advance(2.0)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.written("node-b"), [micros(NOW + 3)])

    def test_an_error_starting_the_chains_at_a_retry_starts_them_again_later(self):
        self.cloud.fail_next("get", ServerError("boom"))
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(self.delegation.failures, 1)
        slots = self.delegation._forwarding.slots
        start_chains, raised = slots.start_chains, []

        def once():
            if not raised:
                raised.append(True)
                raise RuntimeError("a defect")
            start_chains()

        slots.start_chains = once
        [retry] = self.clock.getDelayedCalls()
        self.clock.advance(retry.getTime() - self.clock.seconds())
        self.assertEqual((raised, self.delegation.delegated_heartbeats), ([True], 0))
        self.clock.advance(forwarding.CHAINS_AGAIN_AFTER_ERROR)
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_deleted_pool_lease_cancels_its_retry(self):
        self.health.picks_from = [None]
        self.start()
        lease = pool_lease("node-b", T0 + 1)
        self.informer.add(lease)
        self.informer.delete(lease)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_cancels_requests_and_timers_at_once(self):
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.health.picks_from = [None]
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
        self.assertEqual(self.nodes.stopped, 1)
        self.informer, self.nodes = FakeInformer(), FakeInformer()
        self.start(leases=[pool_lease("node-b", T0 + 1)])
        self.assertEqual((self.informer.started, self.nodes.started), (1, 1))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.assertEqual(self.written("node-b"), [micros(NOW), micros(NOW) + 1])
        self.assertEqual(self.delegation.delegated_heartbeats, 2)

    def test_latency_is_measured_from_the_pool_event(self):
        self.cloud.hold("get")
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(0.25)
        self.cloud.release_hold("get")
        self.cloud.deliver_held()
        self.assertEqual(self.metrics.observed, [(0.25, True)])


class DelegationRuleTests(DelegationFixture, unittest.TestCase):
    """The rules deciding which delegated leases are forwarded, each reason counted."""

    pool_nodes = ("node-a", "node-b", "node-c")

    def forged(self):
        """One delegated lease per reason a lease is refused for as it arrives, keyed
        by the reason."""
        elsewhere = pool_lease("node-a", T0 + 1)
        elsewhere["metadata"]["namespace"] = "default"
        impostor = pool_lease("node-b", T0 + 1)
        impostor["spec"]["holderIdentity"] = "node-a"
        return {
            "namespace": elsewhere,
            "not_pool_member": pool_lease("node-other", T0 + 1),
            "no_such_node": pool_lease("node-missing", T0 + 1),
            "holder_mismatch": impostor,
        }

    def refused_warnings(self, events):
        return [formatEvent(e) for e in events
                if e["log_level"] >= LogLevel.warn and "not forwarded" in formatEvent(e)]

    def test_forged_leases_are_refused_and_counted_by_reason(self):
        self.node_reader.put(NODES, pool_node("node-other", pool="pool-b"))
        self.start()
        self.assertEqual(self.node_selectors, ["apps.openyurt.io/nodepool=pool-a"])
        for lease in self.forged().values():
            self.informer.add(lease)
        # Nothing reached the cloud, not even a read.
        self.assertEqual(self.cloud.calls, [])
        self.assertEqual(self.health.picks, 0)
        self.assertEqual(sorted(self.metrics.refused), sorted(self.forged()))
        self.assertEqual(self.delegation.refused,
                         {**dict.fromkeys(REFUSAL_REASONS, 0), **dict.fromkeys(self.forged(), 1)})
        # Only the two names missing from the pool were read, to tell why.
        self.assertEqual(self.node_reader.calls, [("get", "node-other"), ("get", "node-missing")])
        self.assertEqual(self.metrics.observed, [])
        # Nothing waits to be retried (the refusals of names not in the pool are
        # logged together once a minute).
        self.clock.advance(SUMMARY_PERIOD)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # The genuine leases of the same names are forwarded.
        self.informer.add(pool_lease("node-a", T0 + 2))
        self.informer.add(pool_lease("node-c", T0 + 2))
        self.assertEqual(self.written("node-a"), [micros(NOW + SUMMARY_PERIOD)])
        self.assertEqual(self.written("node-c"), [micros(NOW + SUMMARY_PERIOD)])

    def test_every_reason_is_known_from_the_start(self):
        self.assertEqual(self.delegation.refused, dict.fromkeys(REFUSAL_REASONS, 0))
        self.assertEqual(set(REFUSAL_REASONS), {*self.forged(), "expired"})

    def test_a_lease_without_a_name_is_refused_and_the_others_still_forwarded(self):
        # An empty name and holderIdentity are equal, yet such a lease names no node:
        # it is refused as it arrives, without reading the cloud (a read of the Node ""
        # would ask for the whole Node collection), and the genuine leases waiting for
        # the Nodes' list with it are forwarded once the list is in.
        nameless = pool_lease("", T0 + 1)
        self.start(listed=False)
        self.informer.add(nameless)
        self.informer.add(pool_lease("node-a", T0 + 2))
        self.informer.add(pool_lease("node-b", T0 + 2))
        self.list_nodes()
        self.assertEqual(self.delegation.refused["holder_mismatch"], 1)
        self.assertEqual(self.metrics.refused, ["holder_mismatch"])
        self.assertEqual(self.node_reader.calls, [])
        self.assertEqual(self.written("node-a"), [micros(NOW)])
        self.assertEqual(self.written("node-b"), [micros(NOW)])

    def test_a_refused_lease_of_a_pool_node_is_logged_once_per_lease_and_reason(self):
        events = LogEvents()
        verifyObject(ILogObserver, events)
        self.delegation.log = Logger(observer=events)
        self.start()
        for step in range(5):
            self.informer.add(pool_lease("node-missing", T0 + step))
            impostor = pool_lease("node-b", T0 + step)
            impostor["spec"]["holderIdentity"] = "node-c"
            self.informer.add(impostor)
        self.assertEqual(self.delegation.refused["no_such_node"], 5)
        self.assertEqual(self.delegation.refused["holder_mismatch"], 5)
        self.assertEqual(self.node_reader.calls, [("get", "node-missing")])
        warnings = self.refused_warnings(events)
        # A name that is no Node of the pool is logged with the others like it.
        self.assertEqual(warnings, [
            "heartbeat leases not forwarded to the cloud, their names not known as Nodes "
            "of pool pool-a: 1 renewals dropped (no_such_node=1), e.g. "
            "kube-node-lease/node-missing; logged together at most once every 1m",
            "heartbeat lease kube-node-lease/node-b not forwarded to the cloud "
            "(reason=holder_mismatch): holderIdentity 'node-c' is not the lease's name"])
        # Another reason for the same lease is logged once more.
        impostor = pool_lease("node-b", T0 + 9)
        impostor["metadata"]["namespace"] = "default"
        self.informer.add(impostor)
        self.informer.add(impostor)
        self.assertEqual(len(self.refused_warnings(events)), 3)
        # A deleted lease starts afresh.
        self.informer.delete(impostor)
        self.informer.add(impostor)
        self.assertEqual(len(self.refused_warnings(events)), 4)

    def test_leases_wait_until_the_pool_nodes_are_listed(self):
        self.start(listed=False)
        self.informer.add(pool_lease("node-a", T0 + 1))
        self.informer.update(pool_lease("node-a", T0 + 1), pool_lease("node-a", T0 + 3))
        self.informer.update(pool_lease("node-a", T0 + 3), pool_lease("node-a", T0 + 2))
        self.informer.add(pool_lease("node-missing", T0 + 1))
        # Waiting is not refusing, and nothing goes to the cloud.
        self.assertEqual(self.cloud.calls, [])
        self.assertEqual(self.metrics.refused, [])
        self.assertFalse(self.delegation.pool_nodes_listed)
        self.clock.advance(2)
        self.list_nodes()
        self.assertTrue(self.delegation.pool_nodes_listed)
        # The state seen last of each waiting lease is judged once the list is in.
        self.assertEqual([verb for verb, _ in self.cloud.calls], ["get", "create"])
        self.assertEqual(self.written("node-a"), [micros(NOW + 2)])
        self.assertEqual(self.metrics.refused, ["no_such_node"])

    def test_a_state_that_waited_for_the_nodes_longer_than_an_interval_is_not_written(self):
        self.delegation = self.build(heartbeat_interval=2.0)
        self.start(listed=False)
        self.informer.add(pool_lease("node-a", T0 + 1))
        self.clock.advance(1)
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(1.5)
        self.list_nodes()
        self.assertIsNone(self.stored("node-a"))
        self.assertEqual(self.written("node-b"), [micros(NOW + 2.5)])
        self.assertEqual(self.metrics.refused, ["expired"])

    def test_rules_that_need_no_node_list_refuse_at_once(self):
        self.start(listed=False)
        impostor = pool_lease("node-a", T0 + 1)
        impostor["spec"]["holderIdentity"] = "node-b"
        self.informer.add(impostor)
        self.assertEqual(self.metrics.refused, ["holder_mismatch"])
        self.list_nodes()
        self.assertEqual(self.cloud.calls, [])

    def test_a_node_deleted_or_moved_out_of_the_pool_stops_the_forwarding(self):
        self.node_reader.put(NODES, pool_node("node-b", pool="pool-b"))
        self.start()
        self.informer.add(pool_lease("node-a", T0 + 1))
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(self.delegation.delegated, 2)
        # node-a fails to be forwarded and waits for a retry when its Node is deleted.
        self.health.picks_from = [None]
        self.informer.update(pool_lease("node-a", T0 + 1), pool_lease("node-a", T0 + 2))
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.nodes.delete(pool_node("node-a"))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.health.picks_from = [CLOUD_A]
        # node-b was relabelled into another pool: the informer delivers a delete.
        self.nodes.delete(pool_node("node-b"))
        self.informer.update(pool_lease("node-a", T0 + 2), pool_lease("node-a", T0 + 3))
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 3))
        self.clock.advance(60)
        self.assertEqual(self.written("node-a"), [micros(NOW)])
        self.assertEqual(self.written("node-b"), [micros(NOW)])
        self.assertEqual(self.metrics.refused, ["no_such_node", "not_pool_member"])

    def test_a_node_joining_the_pool_later_is_forwarded_from_its_next_change(self):
        # A refused state is dropped, not kept for a join that may never come (see
        # DelegationBoundTests): the node's next renewal, within one interval, is
        # forwarded.
        self.start()
        self.informer.add(pool_lease("node-new", T0 + 1))
        self.informer.update(pool_lease("node-new", T0 + 1), pool_lease("node-new", T0 + 2))
        self.assertEqual(self.metrics.refused, ["no_such_node"] * 2)
        self.clock.advance(1)
        self.nodes.add(pool_node("node-new"))
        self.assertIsNone(self.stored("node-new"))
        self.clock.advance(1)
        self.informer.update(pool_lease("node-new", T0 + 2), pool_lease("node-new", T0 + 3))
        created = self.stored("node-new")
        self.assertEqual(micros(created["spec"]["renewTime"]), micros(NOW + 2))
        self.assertEqual(created["metadata"]["ownerReferences"][0]["uid"], "node-uid-node-new")
        self.assertEqual(self.metrics.refused, ["no_such_node"] * 2)

    def test_a_node_of_the_pool_not_yet_listed_is_not_counted(self):
        # The informer has not delivered the Node yet, the cloud has it in the pool.
        self.node_reader.put(NODES, pool_node("node-late"))
        self.start()
        self.informer.add(pool_lease("node-late", T0 + 1))
        self.assertEqual(self.metrics.refused, [])
        self.nodes.add(pool_node("node-late"))
        self.assertEqual(self.written("node-late"), [micros(NOW)])

    def test_a_failed_node_read_is_not_counted_and_asked_again(self):
        self.node_reader.fail_next("get", ServerError("boom"))
        self.start()
        self.informer.add(pool_lease("node-missing", T0 + 1))
        self.assertEqual(self.metrics.refused, [])
        self.informer.add(pool_lease("node-missing", T0 + 2))
        self.assertEqual(self.metrics.refused, ["no_such_node"])
        self.assertEqual(self.node_reader.calls, [("get", "node-missing")] * 2)
        self.assertIsNone(self.stored("node-missing"))

    def test_a_node_read_cancelled_as_a_closed_connection_is_moot(self):
        # A client may end a cancelled read with another error than CancelledError
        # (KubeClient closed meanwhile: ConnectionFailed). The read is moot all the same.
        lookups = []

        def get(*_args, **_kwargs):
            lookups.append(defer.Deferred(lambda d: d.errback(
                ConnectionFailed("client closed during the request"))))
            return lookups[-1]

        self.node_reader.get = get
        self.start()
        self.informer.add(pool_lease("node-late", T0 + 1))
        self.nodes.add(pool_node("node-late"))  # delivered: the read is cancelled
        self.assertIsNone(self.successResultOf(lookups[0]))
        self.assertEqual(self.written("node-late"), [micros(NOW)])
        self.assertEqual(self.metrics.refused, [])

    def test_a_node_read_in_flight_is_cancelled_by_stop(self):
        self.node_reader.hold("get")
        self.start()
        self.informer.add(pool_lease("node-missing", T0 + 1))
        self.informer.add(pool_lease("node-missing", T0 + 2))
        self.assertEqual(len(self.node_reader.held), 1)
        self.successResultOf(self.delegation.stop())
        self.assertTrue(self.node_reader.held[0].cancelled)
        self.node_reader.deliver_held()
        self.assertEqual(self.metrics.refused, [])


class DelegationBoundTests(DelegationFixture, unittest.TestCase):
    """Delegated leases whose names are no Nodes of the pool, made up by the ten
    thousand by anyone who may write leases to the coordinator apiserver: what they
    cost the cloud, the leader's memory and its log stays bounded whatever their
    number, and the pool's own nodes are forwarded meanwhile."""

    pool_nodes = ("node-a", "node-b", "node-c")
    flood = 50_000

    def setUp(self):
        super().setUp()
        self.events = LogEvents(self.clock)
        verifyObject(ILogObserver, self.events)
        self.delegation.log = Logger(observer=self.events)

    def made_up(self, renewed, count=None, prefix="made-up", holder=None):
        """Leases of ``count`` (default ``flood``) names no Node has, each renewed."""
        for i in range(self.flood if count is None else count):
            self.informer.add(made_up_lease(f"{prefix}-{i}", renewed, holder))

    def renew_members(self, renewed):
        for name in self.pool_nodes:
            self.informer.add(renewed_by_node(name, renewed))

    def node_reads(self):
        """Cloud reads of a Node so far."""
        return self.node_reader.requests.count("get nodes")

    def dropped(self):
        d = self.delegation
        return d.refused["not_pool_member"] + d.refused["no_such_node"]

    def kept(self):
        """Entries of the leader's maps and queues kept per lease or per name (of a
        map of sets, the sets' too)."""
        d = self.delegation
        maps = [d._leases, d._absent, d._writes, d._refusals]
        return (sum(len(kept) for kept in maps) + d._absent.reads_remembered + d.queued
                + d.in_flight + d._forwarding.reads)

    def summaries(self):
        """The warnings of lease renewals not forwarded."""
        return [event for event in self.events if event["log_level"] >= LogLevel.warn
                and "not forwarded" in formatEvent(event)]

    def test_made_up_names_cost_at_most_the_cache_bound_in_cloud_reads(self):
        self.start()
        self.made_up(T0 + 1)
        self.assertLessEqual(self.node_reads(), ABSENT_NAMES)
        # Each one counted and dropped; those read by reason of the read.
        self.assertEqual(self.dropped(), self.flood)
        self.assertEqual(self.delegation.refused["no_such_node"], self.node_reads())
        # Renewed within the time the answers are remembered: not one more read.
        self.clock.advance(10)
        reads = self.node_reads()
        self.made_up(T0 + 11)
        self.assertEqual(self.node_reads(), reads)
        self.assertEqual(self.dropped(), 2 * self.flood)
        # Later, at most as many reads again.
        self.clock.advance(ABSENT_NAMES_TTL)
        self.made_up(T0 + 71)
        self.assertLessEqual(self.node_reads(), 2 * ABSENT_NAMES)
        self.assertEqual(self.cloud.calls, [])

    def test_cloud_reads_in_flight_are_bounded(self):
        self.node_reader.hold("get")
        self.start()
        self.made_up(T0 + 1)
        self.assertEqual(len(self.node_reader.held), MAX_NODE_READS)
        self.assertEqual(self.dropped(), self.flood - MAX_NODE_READS)
        self.node_reader.deliver_held()
        self.assertEqual(self.dropped(), self.flood)
        self.assertEqual(self.delegation.refused["no_such_node"], MAX_NODE_READS)

    def test_the_leaders_state_stays_bounded_whatever_the_number_of_names(self):
        self.start()
        bound = (2 * ABSENT_NAMES + 2 * MAX_NODE_READS + SUMMARY_EXAMPLES
                 + len(REFUSAL_REASONS) + 4 * len(self.pool_nodes))
        self.made_up(T0 + 1)
        self.renew_members(T0 + 1)
        self.assertLessEqual(self.kept(), bound)
        # Other names later, renewed or forged: no more.
        self.clock.advance(ABSENT_NAMES_TTL)
        self.made_up(T0 + 61, count=10_000)
        self.made_up(T0 + 61, count=10_000, prefix="other", holder="someone")
        self.renew_members(T0 + 61)
        self.assertLessEqual(self.kept(), bound)

    def test_the_leaders_memory_stays_bounded_whatever_the_number_of_names(self):
        # A loose bound on what the delegation module allocates and keeps: a few
        # hundred bytes per name remembered would pass it, not per name made up.
        self.start()
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        self.made_up(T0 + 1, count=10_000)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, module.__file__) for module in (
                delegation_module, leaselife, forwarding, absentnames, refusals, cloudwrite)])
        kept = sum(stat.size for stat in snapshot.statistics("filename"))
        self.assertLess(kept, 512 * 1024)

    def test_pool_nodes_are_forwarded_meanwhile_and_a_name_joining_the_pool_once_it_changes(self):
        self.start()
        for step, count in enumerate((self.flood, 5000, 5000)):
            self.renew_members(T0 + 10 * step)
            self.made_up(T0 + 10 * step + 1, count=count)
            self.clock.advance(10)
        for name in self.pool_nodes:
            self.assertEqual(self.written(name), [micros(NOW + 10 * step) for step in range(3)])
        # One of the names becomes a Node of the pool: the states dropped before are
        # not forwarded; its next change is.
        self.nodes.add(pool_node("made-up-7"))
        self.assertIsNone(self.stored("made-up-7"))
        self.informer.add(made_up_lease("made-up-7", T0 + 31))
        self.assertEqual(self.written("made-up-7"), [micros(NOW + 30)])
        self.assertEqual(self.dropped(), self.flood + 10_000)

    def test_one_warning_a_minute_in_all_with_the_count_and_a_few_names(self):
        self.start()
        for second in range(0, 180, 5):
            self.made_up(T0 + second, count=500)
            self.made_up(T0 + second, count=50, prefix="forged", holder="node-a")
            self.clock.advance(5)
        self.successResultOf(self.delegation.stop())
        summaries = self.summaries()
        times = [event["clock_time"] for event in summaries]
        self.assertEqual(times, [NOW, NOW + 60, NOW + 120, NOW + 180])
        # Together they tell every renewal dropped, and name a few.
        self.assertEqual(sum(event["count"] for event in summaries), 36 * 550)
        self.assertEqual(self.dropped() + self.delegation.refused["holder_mismatch"], 36 * 550)
        for event in summaries:
            examples = event["examples"].split(", ")
            self.assertLessEqual(len(examples), SUMMARY_EXAMPLES)
            self.assertTrue(all(example.startswith(f"{NODE_LEASE_NAMESPACE}/")
                                for example in examples), examples)
        self.assertIn("holder_mismatch=", summaries[-1]["reasons"])
        # No other warning.
        self.assertEqual(len([e for e in self.events if e["log_level"] >= LogLevel.warn]),
                         len(summaries))

    def test_leases_waiting_for_the_node_list_are_bounded(self):
        self.start(listed=False)
        self.renew_members(T0)
        self.made_up(T0 + 1)
        self.assertEqual(self.delegation.leases_kept, MAX_WAITING)
        # The members renew again (a live node does within an interval): kept, and
        # the states renewed least recently make room.
        self.clock.advance(1)
        self.renew_members(T0 + 2)
        self.assertEqual(self.delegation.leases_kept, MAX_WAITING)
        self.assertEqual(self.cloud.calls, [])
        self.list_nodes()
        for name in self.pool_nodes:
            self.assertEqual(self.written(name), [micros(NOW + 1)])
        self.assertLessEqual(self.node_reads(), ABSENT_NAMES)
        # Nothing waits any more: what is left is being read about.
        self.assertLessEqual(self.delegation.leases_kept, MAX_NODE_READS)
        # What did not wait is said once, with how many.
        dropped = [event for event in self.events if "did not wait" in formatEvent(event)]
        self.assertEqual([event["dropped"] for event in dropped],
                         [self.flood + 2 * len(self.pool_nodes) - MAX_WAITING])

    def test_a_pool_node_the_informer_has_not_delivered_is_read_once_and_parked_once(self):
        # The cloud has the Node in the pool; the informer has not delivered it yet.
        self.node_reader.put(NODES, pool_node("node-late"))
        self.start()
        for step in range(5):
            self.informer.add(renewed_by_node("node-late", T0 + step))
        self.assertEqual(self.node_reader.calls, [("get", "node-late")])
        self.assertEqual(self.delegation.leases_kept, 1)
        self.assertEqual(self.metrics.refused, [])
        self.nodes.add(pool_node("node-late"))
        self.assertEqual(self.written("node-late"), [micros(NOW)])
        self.assertEqual(self.delegation.leases_kept, 0)


class DelegationClockTests(DelegationFixture, unittest.TestCase):
    """The leader judges a pool lease by seeing it change, on its own clock, and
    stamps the cloud lease with its own time: no clock of a node or of an earlier
    leader decides whether, or with which renewTime, a heartbeat reaches the cloud."""

    pool_nodes = ("node-a", "node-b", "node-c", "node-d")

    def renew(self, leases, name, renewed):
        """``name`` renews its pool lease, naming ``renewed`` (its own clock)."""
        lease = renewed_by_node(name, renewed)
        if name in leases:
            self.informer.update(leases[name], lease)
        else:
            self.informer.add(lease)
        leases[name] = lease

    def test_nodes_minutes_or_years_off_are_forwarded_at_every_change_with_the_leaders_time(self):
        # Offsets of each node's clock from the leader's: two minutes ahead and
        # behind, three years ahead, and a device that booted at the epoch.
        offsets = {"node-a": 120.0, "node-b": -120.0, "node-c": 3 * 365 * 86400.0,
                   "node-d": 100.0 - NOW}
        self.start()
        leases = {}
        for step in range(3):
            for name, offset in offsets.items():
                self.renew(leases, name, self.clock.seconds() + offset)
            self.assertEqual({name: self.renewed(name) for name in offsets},
                             dict.fromkeys(offsets, micros(self.clock.seconds())))
            self.clock.advance(10)
        for name in offsets:
            self.assertEqual(self.written(name), [micros(NOW + 10 * k) for k in range(3)])
        self.assertEqual(self.metrics.refused, [])
        self.assertEqual(self.delegation.refused, dict.fromkeys(REFUSAL_REASONS, 0))

    def test_a_leader_whose_clock_is_300s_ahead_forwards_with_its_own_time(self):
        # The nodes' clocks are true; the leader's runs 300 s ahead of them. The cloud
        # holds what the nodes wrote themselves before they were cut off.
        true_now = NOW - 300
        for name in ("node-a", "node-b"):
            self.cloud.put(LEASES, cloud_lease(name, true_now - 5))
        self.start()
        leases = {}
        for step in range(3):
            for name in ("node-a", "node-b"):
                self.renew(leases, name, true_now + 10 * step)
            self.clock.advance(10)
        for name in ("node-a", "node-b"):
            self.assertEqual(self.written(name), [micros(NOW + 10 * k) for k in range(3)])
        self.assertEqual(self.metrics.refused, [])

    def test_the_cloud_renew_time_increases_past_one_a_leader_ahead_left(self):
        # Written by the previous leader, whose clock ran 300 s ahead of this one's.
        self.cloud.put(LEASES, cloud_lease("node-a", NOW + 300))
        self.start()
        leases = {}
        for step in range(4):
            self.renew(leases, "node-a", NOW + 10 * step)
            self.clock.advance(10)
        # Each forward 1 µs past the last: the node lifecycle controller sees every one.
        self.assertEqual(self.written("node-a"), [micros(NOW + 300) + k for k in (1, 2, 3, 4)])
        # Once this leader's clock passes it, its own time again.
        self.clock.advance(300)
        self.renew(leases, "node-a", NOW + 340)
        self.assertEqual(self.written("node-a")[-1], micros(NOW + 340))
        self.assertEqual(self.delegation.delegated, 5)

    def test_lease_duration_in_the_cloud_is_the_leaders_whatever_the_pool_lease_says(self):
        present = cloud_lease("node-b", T0)
        present["spec"]["leaseDurationSeconds"] = 3600
        self.cloud.put(LEASES, present)
        self.start()
        for name in ("node-a", "node-b"):
            lease = pool_lease(name, T0 + 1)
            lease["spec"]["leaseDurationSeconds"] = 3600
            self.informer.add(lease)
        durations = {name: self.stored(name)["spec"]["leaseDurationSeconds"]
                     for name in ("node-a", "node-b")}
        self.assertEqual(durations, dict.fromkeys(("node-a", "node-b"),
                                                  NODE_LEASE_DURATION_SECONDS))
        self.assertNotEqual(NODE_LEASE_DURATION_SECONDS, 3600)

    def test_a_configured_lease_duration_is_written(self):
        self.delegation = self.build(lease_duration_seconds=25)
        self.start()
        lease = pool_lease("node-a", T0 + 1)
        lease["spec"]["leaseDurationSeconds"] = 3600
        self.informer.add(lease)
        self.assertEqual(self.stored("node-a")["spec"]["leaseDurationSeconds"], 25)

    def test_a_lease_listed_at_start_is_not_forwarded_until_it_changes(self):
        listed = [renewed_by_node("node-a", T0 + 1), renewed_by_node("node-b", T0 + 1)]
        self.start(leases=listed)
        self.clock.advance(5)
        # The same states again (a relist with nothing changed) are no change either.
        self.informer.relist(listed)
        self.informer.update(listed[0], dict(listed[0]))
        self.assertEqual(self.cloud.calls, [])
        self.assertEqual(self.metrics.refused, [])
        # node-a renews: that change is forwarded; node-b, dead, never is.
        self.informer.update(listed[0], renewed_by_node("node-a", T0 + 11))
        self.clock.advance(60)
        self.assertEqual(self.written("node-a"), [micros(NOW + 5)])
        self.assertIsNone(self.stored("node-b"))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_new_resource_version_alone_is_a_change(self):
        listed = renewed_by_node("node-a", T0 + 1)
        self.start(leases=[listed])
        rewritten = renewed_by_node("node-a", T0 + 1)
        rewritten["metadata"]["resourceVersion"] = "99"
        self.informer.update(listed, rewritten)
        self.assertEqual(self.written("node-a"), [micros(NOW)])

    def test_a_lease_created_after_the_list_is_a_change(self):
        self.start(leases=[renewed_by_node("node-a", T0 + 1)])
        self.informer.add(renewed_by_node("node-b", T0 + 1))
        self.assertEqual(self.written("node-b"), [micros(NOW)])
        self.assertIsNone(self.stored("node-a"))

    def test_a_lease_that_stops_changing_stops_being_forwarded(self):
        # The node's kubelet died: after its grace period the agent renews its pool
        # lease no more, and the cloud renewTime stops at the last change seen.
        self.start()
        leases = {}
        for step in range(5):
            self.renew(leases, "node-a", T0 + 10 * step)
            self.clock.advance(10)
        self.clock.advance(100)
        self.assertEqual(self.written("node-a"), [micros(NOW + 10 * k) for k in range(5)])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_state_queued_behind_a_cloud_outage_is_dropped_once_older_than_an_interval(self):
        """A dead node's last renewal, held back during an outage, must not reach the
        cloud late: the cloud would count it as a heartbeat at that moment."""
        events = []
        self.delegation = self.build(heartbeat_interval=2.0)
        self.delegation.log = Logger(observer=events.append)
        self.start()
        leases = {}
        for name in ("node-a", "node-b"):
            self.renew(leases, name, T0)
        self.assertEqual(self.delegation.delegated, 2)
        self.health.picks_from = [None]
        for name in ("node-a", "node-b"):
            self.renew(leases, name, T0 + 0.5)
        self.assertEqual(self.delegation.failures, 2)
        # node-b's kubelet died: its agent renews no more. node-a keeps renewing every
        # 0.5 s; the cloud is back after 4 s, and the retries (backoff 1, 2, 4 s) run.
        for step in range(1, 21):
            self.clock.advance(0.5)
            if step == 8:
                self.health.picks_from = [CLOUD_A]
            self.renew(leases, "node-a", T0 + 0.5 + step * 0.5)
        self.assertEqual(self.renewed("node-a"), micros(NOW + 10))
        self.assertEqual(self.written("node-b"), [micros(NOW)])
        self.assertEqual(self.delegation.refused["expired"], 1)
        self.assertEqual(self.metrics.refused, ["expired"])
        self.assertTrue(any("kube-node-lease/node-b not forwarded to the cloud (reason=expired)"
                            in formatEvent(e) and "the node stopped renewing" in formatEvent(e)
                            for e in events))
        # Nothing is left waiting or running.
        self.assertEqual(self.delegation.in_flight, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_state_retried_after_a_backoff_longer_than_an_interval_is_dropped(self):
        self.delegation = self.build(heartbeat_interval=2.0)
        self.cloud.fail_next("get", ServerError("boom"), count=2)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(1.0)  # retried 1 s after it was seen: fails again
        self.assertEqual(self.delegation.failures, 2)
        self.clock.advance(2.0)  # the next retry comes 3 s after it was seen
        self.assertIsNone(self.stored("node-b"))
        self.assertEqual(self.cloud.calls, [("get", "node-b")] * 2)
        self.assertEqual(self.metrics.refused, ["expired"])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class DelegationObserverTests(DelegationFixture, unittest.TestCase):
    """Observers hear of every forwarded and every refused heartbeat, once each."""

    pool_nodes = ("node-a", "node-b", "node-c")

    def setUp(self):
        super().setUp()
        self.heard = []
        self.delegation.add_delegation_observer(
            lambda node, outcome: self.heard.append((node, outcome)))

    def test_each_forward_is_heard_once_with_its_node_and_outcome(self):
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(self.heard, [("node-b", "created")])
        self.informer.update(pool_lease("node-b", T0 + 1), pool_lease("node-b", T0 + 2))
        self.informer.add(pool_lease("node-c", T0 + 2))
        self.assertEqual(self.heard, [("node-b", "created"), ("node-b", "updated"),
                                      ("node-c", "created")])
        self.assertEqual(len(self.heard), self.delegation.delegated_heartbeats)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_state_not_written_in_time_is_heard_as_expired(self):
        self.delegation = self.build(heartbeat_interval=2.0)
        self.delegation.add_delegation_observer(
            lambda node, outcome: self.heard.append((node, outcome)))
        self.health.picks_from = [None]
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.clock.advance(1.0)
        self.health.picks_from = [CLOUD_A]
        self.clock.advance(2.0)
        self.assertEqual(self.heard, [("node-b", "expired")])
        self.assertIsNone(self.stored("node-b"))

    def test_a_forward_that_failed_first_is_heard_once_when_it_is_written(self):
        self.cloud.fail_next("get", ServerError("boom"), count=2)
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(self.heard, [])
        self.clock.advance(1.0)
        self.assertEqual(self.heard, [])
        self.clock.advance(2.0)
        self.assertEqual(self.delegation.failures, 2)
        self.assertEqual(self.heard, [("node-b", "created")])
        self.clock.advance(60)
        self.assertEqual(self.heard, [("node-b", "created")])

    def test_each_refusal_is_heard_with_its_reason(self):
        self.node_reader.put(NODES, pool_node("node-other", pool="pool-b"))
        self.start()
        impostor = pool_lease("node-b", T0 + 1)
        impostor["spec"]["holderIdentity"] = "node-a"
        elsewhere = pool_lease("node-c", T0 + 1)
        elsewhere["metadata"]["namespace"] = "default"
        self.informer.add(impostor)
        self.informer.add(pool_lease("node-other", T0 + 1))
        self.informer.add(elsewhere)
        # An hour ahead of the leader's clock is a heartbeat like any other.
        self.informer.add(pool_lease("node-a", NOW + 3600))
        self.assertEqual(self.heard, [("node-b", "holder_mismatch"),
                                      ("node-other", "not_pool_member"),
                                      ("node-c", "namespace"),
                                      ("node-a", "created")])
        self.assertEqual(self.cloud.calls, [("get", "node-a"), ("create", "node-a")])

    def test_a_failing_observer_is_logged_and_the_forward_still_counts(self):
        def broken(node, outcome):
            raise RuntimeError("observer broke")

        delegation = self.build()
        delegation.add_delegation_observer(broken)
        delegation.add_delegation_observer(
            lambda node, outcome: self.heard.append((node, outcome)))
        self.delegation = delegation
        self.start()
        self.informer.add(pool_lease("node-b", T0 + 1))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.heard, [("node-b", "created")])
        self.assertEqual(delegation.delegated_heartbeats, 1)
        self.assertIsNotNone(self.stored("node-b"))


STAMP = "2027-01-15T08:00:00.000000Z"


class DelegationCollectionsTests(DelegationFixture, unittest.TestCase):
    """The garbage collections of a term, as ``for_coordinator`` asks for them: the
    heap is frozen once a first list is in, full and middle collections are held off
    while leases renew, and everything is given back when the term ends. The
    thresholds and the frozen count asserted are the interpreter's own."""

    pool_nodes = ("node-a", "node-b")

    def setUp(self):
        super().setUp()
        self.threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *self.threshold)
        self.addCleanup(gc.unfreeze)
        gc.unfreeze()
        self.made = []

        def collections():
            self.made.append(QuietCollections(self.clock, quiet=1.0, longest=30.0))
            return self.made[-1]

        self.delegation = self.build(collections=collections)

    def held(self):
        return gc.get_threshold()[1:] != self.threshold[1:]

    def test_the_heap_is_frozen_once_listed_and_collections_wait_while_leases_renew(self):
        self.delegation.start(None)
        self.assertEqual((gc.get_freeze_count(), self.held()), (0, False))
        self.informer.end_list()
        self.assertGreater(gc.get_freeze_count(), 0, "the leases are listed")
        gc.unfreeze()
        self.list_nodes()
        self.assertGreater(gc.get_freeze_count(), 0, "the Nodes are listed")
        self.assertFalse(self.held())
        self.informer.add(pool_lease("node-a", T0 + 1))
        self.assertTrue(self.held())
        self.assertEqual(self.renewed("node-a"), micros(NOW), "forwarded as ever")
        self.clock.advance(0.5)
        self.informer.update(pool_lease("node-a", T0 + 1), pool_lease("node-a", T0 + 2))
        self.clock.advance(0.9)
        self.assertTrue(self.held(), "a lease renewed 0.9 s ago")
        self.clock.advance(0.1)
        self.assertEqual(gc.get_threshold(), self.threshold)
        # A lease refused for what it says itself is not a renewal of the pool.
        posing = pool_lease("node-b", T0 + 3)
        posing["spec"]["holderIdentity"] = "node-a"
        self.informer.add(posing)
        self.assertFalse(self.held())
        self.informer.add(pool_lease("node-b", T0 + 4))
        self.assertTrue(self.held())
        self.successResultOf(self.delegation.stop())
        self.assertEqual((gc.get_threshold(), gc.get_freeze_count()), (self.threshold, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # A new term has collections of its own.
        self.delegation.start(None)
        self.assertEqual(len(self.made), 2)

    def test_a_term_that_stops_before_its_lists_freezes_nothing(self):
        self.delegation.start(None)
        self.successResultOf(self.delegation.stop())
        self.informer.end_list()
        self.list_nodes()
        self.assertEqual((gc.get_threshold(), gc.get_freeze_count()), (self.threshold, 0))

    def test_a_delegation_made_for_the_coordinator_has_them(self):
        delegation = HeartbeatDelegation.for_coordinator(
            self.clock, FakeKube(), self.node_reader, self.health, lambda url: self.cloud,
            POOL)
        self.assertIsNotNone(delegation._make_collections)
        self.assertIsNone(self.build()._make_collections)


class LeaseShapingTests(unittest.TestCase):
    def test_lease_for_create_carries_the_leaders_fields_only(self):
        lease = pool_lease("node-b", T0, annotations={"b": "2"})
        lease["spec"]["leaseDurationSeconds"] = 3600
        created = lease_for_create(lease, STAMP, 40, pool_node("node-b"))
        self.assertEqual(set(created["metadata"]),
                         {"name", "namespace", "annotations", "ownerReferences"})
        self.assertEqual(created["metadata"]["annotations"],
                         {DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.assertEqual(created["spec"], {"holderIdentity": "node-b",
                                           "leaseDurationSeconds": 40, "renewTime": STAMP})
        self.assertIn("uid", lease["metadata"])
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 3600)

    def test_no_owner_reference_without_a_node_uid(self):
        node = pool_node("node-b")
        del node["metadata"]["uid"]
        created = lease_for_create(pool_lease("node-b", T0), STAMP, 40, node)
        self.assertNotIn("ownerReferences", created["metadata"])

    def test_merge_keeps_cloud_resource_version_and_sets_the_leaders_spec(self):
        cloud = cloud_lease("node-b", T0, annotations={"a": "1"}, holder="someone")
        cloud["metadata"]["resourceVersion"] = "9"
        cloud["spec"]["leaseTransitions"] = 3
        merged = merged_cloud_lease(cloud, pool_lease("node-b", T0 + 1, annotations={"b": "2"}),
                                    STAMP, 25)
        self.assertEqual(merged["metadata"]["resourceVersion"], "9")
        self.assertEqual(merged["metadata"]["annotations"],
                         {"a": "1", DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.assertEqual(merged["spec"], {"holderIdentity": "node-b", "leaseDurationSeconds": 25,
                                          "renewTime": STAMP, "leaseTransitions": 3})
        self.assertEqual(cloud["metadata"]["annotations"], {"a": "1"})
        self.assertEqual(parse_micro_time(cloud["spec"]["renewTime"]), T0)


class StampedRenewTimeTests(unittest.TestCase):
    """``renewTime = max(leader's now, cloud renewTime + 1 µs)``, exact to the
    microsecond."""

    def test_the_leaders_time_when_the_cloud_is_behind_it_or_has_none(self):
        self.assertEqual(stamped_renew_time(NOW, format_micro_time(NOW - 0.000001)),
                         format_micro_time(NOW))
        self.assertEqual(stamped_renew_time(NOW, format_micro_time(T0)), format_micro_time(NOW))
        self.assertEqual(stamped_renew_time(NOW), format_micro_time(NOW))
        for unreadable in ("", "soon", 17, {"renewTime": "x"}):
            self.assertEqual(stamped_renew_time(NOW, unreadable), format_micro_time(NOW))

    def test_one_microsecond_past_a_cloud_renew_time_at_or_ahead_of_the_leader(self):
        self.assertEqual(stamped_renew_time(NOW, format_micro_time(NOW)),
                         format_micro_time(NOW + 0.000001))
        self.assertEqual(stamped_renew_time(NOW, "2027-01-15T09:00:00.999999Z"),
                         "2027-01-15T09:00:01.000000Z")
        # Other spellings of a time, as other clients may write them.
        self.assertEqual(stamped_renew_time(NOW, "2027-01-15T10:00:00.5+01:00"),
                         "2027-01-15T09:00:00.500001Z")
        self.assertEqual(stamped_renew_time(NOW, "2027-01-15T09:00:00.123456789Z"),
                         "2027-01-15T09:00:00.123457Z")

    def test_exact_for_times_a_float_of_seconds_cannot_hold_to_the_microsecond(self):
        self.assertEqual(stamped_renew_time(NOW, "2500-06-30T23:59:59.999998Z"),
                         "2500-06-30T23:59:59.999999Z")

    def test_the_leaders_time_past_the_last_micro_time_there_is(self):
        self.assertEqual(stamped_renew_time(NOW, "9999-12-31T23:59:59.999999Z"),
                         format_micro_time(NOW))

    def test_the_same_stamp_as_one_made_of_datetimes_for_any_time_read(self):
        """Stamps are made from integer microseconds and remembered minutes: the same
        text as the stamp made with a datetime of each time, whatever the times (far
        past and future, a minute's edges, seconds past 59, other spellings, garbage)
        and in whatever order (a minute read before, or not)."""
        import datetime
        import random
        from yurtcoord.kube.lease import _micro_moment

        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

        def with_datetimes(now, current_renew_time):
            stamp = epoch + datetime.timedelta(microseconds=round(now * 1e6))
            current = _micro_moment(current_renew_time)
            if current is not None and current >= stamp:
                try:
                    stamp = current + datetime.timedelta(microseconds=1)
                except OverflowError:
                    pass
            return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        rng = random.Random(20261204)
        first = -62135596800 * 10**6  # 0001-01-01T00:00:00Z
        last = 253402300799999999  # 9999-12-31T23:59:59.999999Z

        def spelled(micros):
            return (epoch + datetime.timedelta(microseconds=micros)).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")

        reads = ["", None, 17, "soon", "2027-01-15T09:00:60.000000Z",
                 "2027-01-15T09:00:5x.000000Z", "2027-01-15T09:00:00.00000aZ",
                 "2027-01-15T10:00:00.5+01:00", "2027-01-15T09:00:00.123456789Z",
                 "2027-01-15T09:00:00.123456z", spelled(last), spelled(first),
                 spelled(last - 1), "2027-01-15T09:00:59.999999Z", "2027-01-15T09:01:00.000000Z"]
        for _ in range(3000):
            micros = rng.choice([rng.randrange(first, last + 1),
                                 round(NOW * 1e6) + rng.randrange(-120_000_000, 120_000_000)])
            reads.append(spelled(micros))
        for read in reads + reads[::-1]:
            now = rng.choice([NOW, NOW + rng.random() * 100, 1.0e-6, 253402300799.999,
                              -62135596800.0])
            self.assertEqual(stamped_renew_time(now, read), with_datetimes(now, read),
                             (now, read))
