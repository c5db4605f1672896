"""Heartbeat probes and the roles they decide, on a ``Clock``: the logic of
``test_probes_e2e`` proved to the instant, with the fault suite's timings
(``FAULT_SUITE``, as its agent processes run) and the parts an agent wires together.

Each node here is what an agent builds with the coordinator enabled: a
``CloudHealthChecker`` over its cloud servers, a ``CoordinatorHealthChecker`` over the
coordinator apiservers, a ``HubElector`` deciding its role from both, and a
``LeaderElector`` on the pool's election lease through the coordinator apiservers
(``PickedServerClient``), all over ``FakeKube`` stores: one coordinator store for the
pool, and a cloud store per node, which only its own node lease is written to (faults
are injected on it alone, as the live test injects them on the path of one lease).

- ``failed_retry - 1`` 500s, or timeouts, on the leader's cloud node lease writes are
  absorbed within the probe: the lease is written by its last attempt, at the time the
  retry policy gives, and no role changes anywhere in the pool.
- ``failed_retry`` 500s end the probe unhealthy: the leader leaves its role at the
  hub elector's next check and the other node takes the election lease.
- Three cloud URLs (``FakeKubeServer``s in front of one cloud store): one write and
  one read per interval, twice the requests of one URL, and no write ever conflicts.
- A node whose clock is 300 s behind the pool leader that delegated its heartbeat
  reconnects: the renewTime it writes to the cloud moves forward at every write (1 µs
  past the leader's, also after the leader wrote again in between) until its own clock
  passes the leader's, and is its own clock's time from then on.

The two coordinator apiservers' one write and one read per interval is
``SeveralCoordinatorServersTests.test_one_lease_write_and_one_read_per_interval`` in
``yurtcoord/test/unit/test_health.py``.
"""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.agent.config import Config, parse_config
from yurtcoord.heartbeat.probes import (
    NODE_LEASE_NAMESPACE, CloudHealthChecker, CoordinatorHealthChecker, probe_retry_policy,
)
from yurtcoord.kube.errors import ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord, build_lease, format_micro_time, parse_micro_time
from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION
from yurtcoord.role.hubelector import HubElector
from yurtcoord.role.roles import Role
from yurtcoord.sim.agentini import FAULT_SUITE, loopback_agent_ini
from yurtcoord.testing.fakekube import FakeKube, FakeKubeServer
from yurtcoord.testing.leaseprobes import START, make_clock
from yurtcoord.testing.clocks import advance

POOL = "pool-a"
COORDINATOR_URL = "http://coordinator-0"
# Steady heartbeat intervals counted by the several-URLs test, as the live test counts.
ROUNDS = 5


def fault_suite_config(node, cloud_urls):
    """The configuration of the fault suite's agent ``node`` with ``cloud_urls``."""
    return parse_config(loopback_agent_ini(
        node, POOL, cloud_urls, COORDINATOR_URL, "http://127.0.0.1:2379",
        "/nonexistent/pki", "/nonexistent/cache", FAULT_SUITE))


class ClockNode:
    """One node's probes, hub elector and leader elector on ``clock``, wired as
    ``yurtcoord.agent.service.Agent`` wires them; ``roles`` lists ``(seconds, role)``
    of every role the hub elector gave, ``cloud_flips`` ``(seconds, healthy)`` of
    every change of the cloud's health as its checker told it."""

    def __init__(self, clock: Clock, config: Config, cloud_servers, coordinator_servers):
        self.clock = clock
        self.name = config.node.name
        heartbeat, election = config.heartbeat, config.leader_election
        self.cloud_checker = CloudHealthChecker.for_servers(
            clock, cloud_servers, self.name, heartbeat)
        self.coordinator_checker = CoordinatorHealthChecker(
            clock, coordinator_servers, self.name, self.cloud_checker, heartbeat,
            takeover=election.lease_duration + election.retry_period)
        self.coordinator_client = PickedServerClient(
            self.coordinator_checker.pick_server, coordinator_servers.__getitem__,
            what="coordinator apiserver", on_unreachable=self.coordinator_checker.suspect)
        self.election_config = LeaderElectionConfig(
            lease_namespace=election.lease_namespace, lease_name=election.lease_name,
            identity=self.name, lease_duration=election.lease_duration,
            renew_deadline=election.renew_deadline, retry_period=election.retry_period,
            release_on_cancel=True)
        self.roles = []
        self.cloud_flips = []
        self.cloud_checker.add_listener(
            lambda healthy: self.cloud_flips.append((clock.seconds(), healthy)))
        self.hub = HubElector(clock, self.cloud_checker, self.coordinator_checker,
                              self._make_elector, election.check_interval,
                              lambda role: self.roles.append((clock.seconds(), role)))

    def _make_elector(self, started_leading, stopped_leading, new_leader):
        return LeaderElector(self.clock, self.coordinator_client, self.election_config,
                             started_leading, stopped_leading, new_leader,
                             random=lambda: 0.0)

    def start(self):
        self.cloud_checker.start()
        self.coordinator_checker.start()
        self.hub.start()

    def stop(self, test):
        test.successResultOf(self.hub.stop())
        test.successResultOf(self.coordinator_checker.stop())
        test.successResultOf(self.cloud_checker.stop())


def node_lease_writes(store, node):
    """Seconds of every write of ``node``'s lease ``store`` accepted."""
    return [at for at, obj in store.writes
            if obj["metadata"]["name"] == node
            and obj["metadata"].get("namespace") == NODE_LEASE_NAMESPACE]


class TransientCloudErrorsTests(unittest.TestCase):
    """A pool of two nodes, edge-1 leading; faults on edge-1's cloud node lease
    writes, as ``test_probes_e2e.TransientCloudErrorsTests`` injects them in the cloud
    test server."""

    nodes = ("edge-1", "edge-2")

    def setUp(self):
        self.clock = make_clock()
        self.coordinator = FakeKube(self.clock)
        self.clouds = {}
        self.pool = {}
        for index, node in enumerate(self.nodes):
            url = f"http://cloud-proxy-{index}"
            config = fault_suite_config(node, [url])
            self.heartbeat = config.heartbeat
            self.election = config.leader_election
            self.clouds[node] = FakeKube(self.clock)
            self.pool[node] = ClockNode(
                self.clock, config, {url: self.clouds[node]},
                {COORDINATOR_URL: FakeKubeServer(self.coordinator, COORDINATOR_URL)})
        self.leader, self.follower = self.nodes
        self.cloud = self.clouds[self.leader]
        self.pool[self.leader].start()
        advance(self.clock, 1)
        self.pool[self.follower].start()
        advance(self.clock, 2 * self.heartbeat.interval)
        self.assertEqual(self.roles(), {self.leader: [Role.FOLLOWER, Role.LEADER],
                                        self.follower: [Role.FOLLOWER]})
        self.assertEqual(self.election_holder(), self.leader)
        self.settled = {node: list(n.roles) for node, n in self.pool.items()}
        self.pauses = probe_retry_policy(self.heartbeat.interval, self.heartbeat.timeout,
                                         self.heartbeat.failed_retry)

    def tearDown(self):
        for node in self.pool.values():
            node.stop(self)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def roles(self):
        return {name: [role for _at, role in node.roles] for name, node in self.pool.items()}

    def election_lease(self):
        return self.coordinator.peek(LEASES, self.election.lease_name,
                                     self.election.lease_namespace)["spec"]

    def election_holder(self):
        return self.election_lease()["holderIdentity"]

    def next_probe(self):
        """The time of the leader's next cloud probe: its lattice counts whole
        intervals from its start at ``START``."""
        interval = self.heartbeat.interval
        return START + (int((self.clock.seconds() - START) // interval) + 1) * interval

    def leader_lease_writes(self):
        return node_lease_writes(self.cloud, self.leader)

    def test_failed_retry_minus_one_failures_change_no_role(self):
        """Twice ``failed_retry - 1`` 500s, then ``failed_retry - 1`` timeouts, on the
        leader's cloud node lease writes: each probe writes the lease with its last
        attempt, after the retry policy's pauses (and the timed-out attempts'
        timeouts), the cloud never counts unhealthy, and no role changes in the pool;
        the election lease keeps its holder without a transition."""
        retries = self.heartbeat.failed_retry - 1
        transitions = self.election_lease().get("leaseTransitions", 0)
        for round_number in range(2):
            probe_at = self.next_probe()
            self.cloud.fail_next("update", ServerError("injected failure (500)"), retries)
            advance(self.clock, probe_at - self.clock.seconds())
            written_at = probe_at + sum(self.pauses(n) for n in range(1, retries + 1))
            advance(self.clock, written_at - self.clock.seconds() - 0.01)
            self.assertLess(self.leader_lease_writes()[-1], probe_at, round_number)
            advance(self.clock, 0.01)
            self.assertEqual(self.leader_lease_writes()[-1], written_at, round_number)
        probe_at = self.next_probe()
        self.cloud.hangs = retries
        written_at = probe_at + sum(self.heartbeat.timeout + self.pauses(n)
                                    for n in range(1, retries + 1))
        advance(self.clock, written_at - self.clock.seconds() - 0.01)
        self.assertLess(self.leader_lease_writes()[-1], probe_at)
        advance(self.clock, 0.01)
        self.assertEqual(self.leader_lease_writes()[-1], written_at)
        self.assertEqual(self.cloud.hangs, 0)
        advance(self.clock, 2 * self.heartbeat.interval)
        self.assertEqual([at for at, _ in self.pool[self.leader].cloud_flips], [START])
        self.assertEqual(self.roles(), {node: [role for _at, role in roles]
                                        for node, roles in self.settled.items()})
        self.assertEqual(self.election_holder(), self.leader)
        self.assertEqual(self.election_lease().get("leaseTransitions", 0), transitions)

    def test_failed_retry_failures_change_the_leaders_role(self):
        """``failed_retry`` 500s on the leader's cloud node lease writes: the probe
        ends unhealthy with its last attempt, the leader becomes follower at the hub
        elector's next check and releases the election lease, and the other node
        leads within one retry period. The cloud answering again, the old leader's
        next probe finds it healthy and the pool keeps one leader."""
        probe_at = self.next_probe()
        self.cloud.fail_next("update", ServerError("injected failure (500)"),
                             self.heartbeat.failed_retry)
        unhealthy_at = probe_at + sum(self.pauses(n)
                                      for n in range(1, self.heartbeat.failed_retry))
        advance(self.clock, unhealthy_at - self.clock.seconds() - 0.01)
        self.assertEqual(self.roles(), {node: [role for _at, role in roles]
                                        for node, roles in self.settled.items()})
        advance(self.clock, 0.01)
        leader = self.pool[self.leader]
        self.assertEqual(leader.cloud_flips[-1], (unhealthy_at, False))
        self.assertIn("ServerError: injected failure (500)",
                      leader.cloud_checker.probers[0].last_error)
        advance(self.clock, self.election.check_interval + self.election.retry_period)
        left_at, role = leader.roles[-1]
        self.assertEqual(role, Role.FOLLOWER)
        self.assertGreaterEqual(left_at, unhealthy_at)
        self.assertLessEqual(left_at, unhealthy_at + self.election.check_interval)
        took_at, role = self.pool[self.follower].roles[-1]
        self.assertEqual(role, Role.LEADER)
        self.assertLessEqual(took_at, left_at + self.election.retry_period)
        self.assertEqual(self.election_holder(), self.follower)
        advance(self.clock, probe_at + self.heartbeat.interval - self.clock.seconds())
        self.assertEqual(leader.cloud_flips[-1], (probe_at + self.heartbeat.interval, True))
        advance(self.clock, 2 * self.heartbeat.interval)
        self.assertEqual(self.roles(), {self.leader: [Role.FOLLOWER, Role.LEADER,
                                                      Role.FOLLOWER],
                                        self.follower: [Role.FOLLOWER, Role.LEADER]})
        self.assertEqual(self.election_holder(), self.follower)


class SeveralCloudURLsTests(unittest.TestCase):
    """One node with the coordinator disabled (only its heartbeat reaches the cloud)
    through one cloud URL, then through three URLs in front of the same cloud."""

    node = "edge-1"

    def heartbeat_rounds(self, url_count):
        """The calls each cloud server got in ``ROUNDS`` steady intervals (from the
        second interval on, each cut halfway between two writes), and the cloud
        store."""
        clock = make_clock()
        store = FakeKube(clock)
        urls = [f"http://cloud-proxy-{index}" for index in range(url_count)]
        servers = {url: FakeKubeServer(store, url) for url in urls}
        heartbeat = fault_suite_config(self.node, urls).heartbeat
        checker = CloudHealthChecker.for_servers(clock, servers, self.node, heartbeat)
        checker.start()
        advance(clock, heartbeat.interval * 1.5)
        self.assertEqual(checker.servers(), dict.fromkeys(urls, True))
        counted_from = {url: len(server.calls) for url, server in servers.items()}
        writes_before = len(store.writes)
        advance(clock, heartbeat.interval * ROUNDS)
        self.successResultOf(checker.stop())
        self.assertEqual(clock.getDelayedCalls(), [])
        calls = {url: server.calls[counted_from[url]:] for url, server in servers.items()}
        return calls, store, len(store.writes) - writes_before

    def test_three_urls_at_most_double_the_requests_and_no_conflicts(self):
        """With one URL, one lease write per interval and nothing else; with three in
        front of the same cloud, the same one write per interval through one of them
        and one read of another, in turn: twice the requests, never more, and every
        write accepted (none answered ``Conflict``: the lease is read back before a
        write only through the server written to)."""
        one, _store, one_written = self.heartbeat_rounds(1)
        three, store, three_written = self.heartbeat_rounds(3)
        self.assertEqual(list(one.values()), [[("update", self.node)] * ROUNDS])
        self.assertEqual(one_written, ROUNDS)
        one_total = sum(len(calls) for calls in one.values())
        three_total = sum(len(calls) for calls in three.values())
        self.assertLessEqual(three_total, 2 * one_total)
        self.assertGreater(three_total, one_total)
        updates = [url for url, calls in three.items() for verb, _ in calls if verb == "update"]
        self.assertEqual(len(updates), ROUNDS)
        self.assertEqual(len(set(updates)), 1, "the writes went through one server")
        reads = {url: [verb for verb, _ in calls] for url, calls in three.items()
                 if url != updates[0]}
        self.assertEqual(sorted(len(verbs) for verbs in reads.values()),
                         [ROUNDS // 2, ROUNDS - ROUNDS // 2])
        self.assertEqual({verb for verbs in reads.values() for verb in verbs}, {"get"})
        self.assertEqual(three_written, ROUNDS)


class CloudRenewTimeAfterDelegationTests(unittest.TestCase):
    """edge-1's cloud prober, its clock ``BEHIND`` seconds behind the pool leader's,
    after the leader forwarded its heartbeat to the cloud with the leader's clock."""

    node = "edge-1"
    BEHIND = 300.0

    def setUp(self):
        self.clock = make_clock()
        self.cloud = FakeKube(self.clock)
        self.heartbeat = fault_suite_config(self.node, ["http://cloud-proxy-0"]).heartbeat
        self.checker = CloudHealthChecker.for_servers(
            self.clock, {"http://cloud-proxy-0": self.cloud}, self.node, self.heartbeat)

    def tearDown(self):
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def leader_forwards(self):
        """The leader's write of edge-1's cloud lease: renewTime from its clock."""
        leader_now = self.clock.seconds() + self.BEHIND
        current = self.cloud.peek(LEASES, self.node, NODE_LEASE_NAMESPACE)
        lease = build_lease(self.node, NODE_LEASE_NAMESPACE,
                            LeaseRecord(self.node, 40, None, leader_now),
                            annotations={DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        if current is not None:
            lease["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self.cloud.put(LEASES, lease)
        return leader_now

    def written_renew_times(self):
        """The renewTimes of edge-1's own writes to the cloud, as written."""
        return [obj["spec"]["renewTime"] for _at, obj in self.cloud.writes
                if obj["metadata"]["name"] == self.node]

    def test_the_cloud_renew_time_moves_forward_at_every_write(self):
        forwarded = self.leader_forwards()
        self.checker.start()
        interval = self.heartbeat.interval
        for _ in range(3):
            advance(self.clock, interval)
        forwarded_again = self.leader_forwards()
        for _ in range(3):
            advance(self.clock, interval)
        written = self.written_renew_times()
        self.assertEqual(len(written), 7)
        self.assertEqual(written[:4], [format_micro_time(forwarded + step * 1e-6)
                                       for step in range(1, 5)])
        self.assertEqual(written[4:], [format_micro_time(forwarded_again + step * 1e-6)
                                       for step in range(1, 4)])
        # The node's clock passes the leader's last renewTime: its own time again.
        advance(self.clock, self.BEHIND)
        now = self.clock.seconds()
        self.assertEqual(self.written_renew_times()[-1], format_micro_time(now))
        times = [parse_micro_time(text) for text in self.written_renew_times()]
        self.assertEqual(times, sorted(set(times)), "strictly increasing")
        self.assertTrue(self.checker.healthy)
        # Writing directly again: the delegate annotation is gone.
        lease = self.cloud.peek(LEASES, self.node, NODE_LEASE_NAMESPACE)
        self.assertNotIn(DELEGATE_HEARTBEAT_ANNOTATION,
                         (lease["metadata"].get("annotations") or {}))
