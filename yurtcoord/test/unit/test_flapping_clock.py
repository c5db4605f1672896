"""The leader's cloud link flapping for two minutes, on a ``Clock``.

The partition suite flaps the leader's WAN on real test networks (``partitions.
FLAP_SCENARIO``); there it proves the wiring, here the logic. Three agents' role
machinery as ``make_service`` wires it (kubelet liveness, cloud and coordinator
health checkers, hub elector with the Lease election, coordinator, heartbeat
delegation), in one process on one ``Clock``, with the partition suite's timings. The
apiservers are in-memory stores; each agent reaches each of them through a
``FakeLink`` that can be cut and keeps the request log the API test servers keep. As
there, the kubelet of one follower stops first (the dead node) and the leader's cloud
link is cut for ``FLAP_PERIOD`` seconds, healed for as long, and so on; then the run is
judged by ``partitions.judge_request_logs``, the scenario's own invariants, and by the
same bound on leadership changes.

Whether a flapping leader keeps leading depends on where its heartbeat probes fall in
a cut: a probe is two attempts 1.5 s apart within the 3 s heartbeat interval, so a
probe that starts late in a cut has its second attempt reach the cloud in the up phase
that follows, and one that starts early fails whole. Both cases are run, each with its
exact outcome.
"""

import random

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.agent.config import parse_duration
from yurtcoord.agent.service import FIRST_PROBE_SLACK, REQUEST_TIMEOUT
from yurtcoord.heartbeat.delegation import HeartbeatDelegation
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker, ICoordinatorHealthChecker
from yurtcoord.heartbeat.probes import (
    CloudHealthChecker, CoordinatorHealthChecker, KubeletHealthChecker, ProbeSettings,
)
from yurtcoord.kube.gvr import NODES
from yurtcoord.kube.interfaces import IInformer, IObjectClient
from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.uploader import UploadCounts
from yurtcoord.role.coordinator import Coordinator
from yurtcoord.role.hubelector import HubElector
from yurtcoord.role.roles import IRoleComponent, Role
from yurtcoord.sim.agentini import merge_sections
from yurtcoord.testing import partitions
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube
from yurtcoord.testing.fakelink import FakeLink
from yurtcoord.testing.fakepoolstore import FakePoolStore
from yurtcoord.testing.invariants import delegated_writes, leadership_changes
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE, TIMINGS
from yurtcoord.testing.clocks import advance
from yurtcoord.testing.delegationobjects import pool_node
from yurtcoord.testing.idlecomponent import IdleComponent

# The partition suite's agents: the fault suite's timings with its heartbeat ones over.
SECTIONS = merge_sections(TIMINGS, partitions.TIMINGS)
ELECTION = {name: parse_duration(str(value))
            for name, value in SECTIONS["leader_election"].items()
            if name in ("lease_duration", "renew_deadline", "retry_period", "check_interval")}
HEARTBEAT = SECTIONS["heartbeat"]
SETTINGS = ProbeSettings(interval=parse_duration(str(HEARTBEAT["interval"])),
                         timeout=parse_duration(str(HEARTBEAT["timeout"])),
                         failed_retry=int(str(HEARTBEAT["failed_retry"])),
                         healthy_threshold=int(str(HEARTBEAT["healthy_threshold"])))
NODES_OF_POOL = partitions.FLAP_SCENARIO.node_names()
POOL = "pool-flap"
CLOUD_URL = "https://198.18.0.2:6443"
COORDINATOR_URL = "https://198.19.0.2:6443"
# Two minutes: twenty cuts, so that even one leadership change per cut and heal would
# be ten times over the bound.
FLAP_DURATION = 120.0
# How late a change of the coordinator's leases reaches a leader's informer.
WATCH_DELAY = 0.05
# Deadlines of the waits for a role (Clock seconds), not bounds that are asserted.
ROLE_DEADLINE = 30.0
# The start of the first cut before a probe of the leader is due: early in a cut both
# attempts are lost, late in a cut the second one reaches the cloud after the heal.
EARLY_IN_A_CUT, LATE_IN_A_CUT = 0.25, 2.0
# When each agent starts (seconds after the first): agents of a pool do not start in
# one instant, and offsets off the election's 0.5 s retry grid keep the timers of two
# agents out of one instant (a release and a peer's takeover, say).
START_OFFSETS = (0.0, 0.37, 0.81)


def advance_until(clock, predicate, deadline, what, step=0.1):
    """Advance in steps of ``step`` until ``predicate()`` holds; fail after ``deadline``
    seconds of the clock, saying ``what()`` was waited for."""
    end = clock.seconds() + deadline
    while not predicate():
        if clock.seconds() >= end:
            raise AssertionError(f"not within {deadline} s of the clock: {what()}")
        advance(clock, step)


class KubeletResponse:
    """The kubelet's healthz answer as treq gives it."""

    code = 200

    def content(self):
        return defer.succeed(b"ok")


class CoordinatorLeases:
    """The leases of the coordinator store, as the leader's delegation watches them:
    every informer it makes lists them ``WATCH_DELAY`` after it was made, then gets
    each lease the store took ``WATCH_DELAY`` after the write."""

    def __init__(self, clock, store):
        self._clock = clock
        self._store = store
        self._seen = 0
        self.leases = {}
        self.informers = []
        store.on_call = self._called

    def make_informer(self):
        informer = FakeInformer()
        self.informers.append(informer)
        self._clock.callLater(WATCH_DELAY, self._list, informer)
        return informer

    def _list(self, informer):
        if informer.started and not informer.stopped:
            informer.end_list(list(self.leases.values()))

    def _called(self, verb, name):
        if verb in ("create", "update"):
            self._clock.callLater(WATCH_DELAY, self._deliver)

    def _deliver(self):
        writes, self._seen = self._store.writes[self._seen:], len(self._store.writes)
        for _at, obj in writes:
            if obj.get("kind") != "Lease":
                continue
            metadata = obj["metadata"]
            self.leases[(metadata["namespace"], metadata["name"])] = obj
            for informer in self.informers:
                if informer.has_synced and not informer.stopped:
                    informer.add(obj)


class PoolMember:
    """One agent's role machinery, wired as ``make_service`` wires it, reaching the
    cloud and the coordinator apiserver through links of its own."""

    def __init__(self, clock, node, peer, cloud, coordinator, cloud_log, coordinator_log,
                 coordinator_leases, seed):
        self.clock = clock
        self.node = node
        self.peer = peer
        self.cloud_link = FakeLink(clock, cloud, peer, cloud_log, REQUEST_TIMEOUT)
        self.coordinator_link = FakeLink(clock, coordinator, peer, coordinator_log,
                                         REQUEST_TIMEOUT)
        self.kubelet_alive = True
        self.kubelet = KubeletHealthChecker(
            clock, self._kubelet_healthz, f"http://{node}:10248/healthz",
            partitions.KUBELET_GRACE, interval=SETTINGS.interval, timeout=SETTINGS.timeout)
        self.kubelet.add_listener(self._kubelet_changed)
        self.cloud_checker = CloudHealthChecker.for_servers(
            clock, {CLOUD_URL: self.cloud_link}, node, SETTINGS, kubelet=self.kubelet)
        self.coordinator_checker = CoordinatorHealthChecker(
            clock, {COORDINATOR_URL: self.coordinator_link}, node, self.cloud_checker,
            SETTINGS, kubelet=self.kubelet,
            takeover=ELECTION["lease_duration"] + ELECTION["retry_period"])
        self.delegation = HeartbeatDelegation(
            clock, coordinator_leases.make_informer, self._pool_nodes, self.cloud_link,
            self.cloud_checker.pick_healthy_server, {CLOUD_URL: self.cloud_link}.__getitem__,
            POOL, heartbeat_interval=SETTINGS.interval)
        self.pool_sync, self.synced_detector = IdleComponent(), IdleComponent()
        self.coordinator = Coordinator(
            clock, node, lambda: defer.succeed(FakePoolStore(clock)), self.pool_sync,
            self.delegation, self.synced_detector,
            lambda store: defer.succeed(UploadCounts(created=1)))
        self.election = LeaderElectionConfig(
            ELECTION_NAMESPACE, ELECTION_LEASE, node,
            lease_duration=ELECTION["lease_duration"],
            renew_deadline=ELECTION["renew_deadline"],
            retry_period=ELECTION["retry_period"], release_on_cancel=True)
        self._random = random.Random(seed).random
        self.hub = HubElector(clock, self.cloud_checker, self.coordinator_checker,
                              self._make_elector, ELECTION["check_interval"],
                              on_role=self.coordinator.set_role)

    def _kubelet_healthz(self, url):
        if self.kubelet_alive:
            return defer.succeed(KubeletResponse())
        return defer.fail(ConnectionRefusedError(f"{url}: connection refused"))

    def _kubelet_changed(self, alive):
        if alive:
            self.cloud_checker.restart()
            self.coordinator_checker.restart()

    def _pool_nodes(self, label_selector):
        informer = FakeInformer()
        informer.end_list([pool_node(name, POOL) for name in NODES_OF_POOL])
        return informer

    def _make_elector(self, started_leading, stopped_leading, new_leader):
        return LeaderElector(self.clock, self.coordinator_link, self.election,
                             started_leading, stopped_leading, new_leader,
                             random=self._random)

    @property
    def role(self):
        return self.coordinator.role

    def start(self):
        """In ``make_service``'s order: probes, then the hub elector, whose first check
        waits for every prober's first answer."""
        self.kubelet.start()
        self.cloud_checker.start()
        self.coordinator_checker.start()
        probers = [*self.cloud_checker.probers, *self.coordinator_checker.probers]
        answered = defer.DeferredList([p.when_answered() for p in probers],
                                      fireOnOneErrback=True, consumeErrors=True)
        answered.addTimeout(SETTINGS.interval + FIRST_PROBE_SLACK, self.clock)
        answered.addErrback(lambda failure: failure.trap(defer.TimeoutError))
        self.hub.start(health_known=answered)

    def stop(self):
        """In ``make_service``'s order, the reverse of the start."""
        return defer.gatherResults([
            self.hub.stop(), self.coordinator.stop(), self.coordinator_checker.stop(),
            self.cloud_checker.stop(), self.kubelet.stop()])


class FlappingCloudLinkTests(unittest.TestCase):
    """Three agents; the leader's cloud link flaps every ``FLAP_PERIOD`` seconds for
    ``FLAP_DURATION``, the others' links stay up."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.cloud = FakeKube(self.clock)
        self.coordinator = FakeKube(self.clock)
        for name in NODES_OF_POOL:
            self.cloud.put(NODES, pool_node(name, POOL))
        self.cloud_log, self.coordinator_log = [], []
        self.coordinator_leases = CoordinatorLeases(self.clock, self.coordinator)
        self.members = {}
        for index, node in enumerate(NODES_OF_POOL, start=1):
            self.members[node] = PoolMember(
                self.clock, node, f"198.18.0.{10 + index}", self.cloud, self.coordinator,
                self.cloud_log, self.coordinator_log, self.coordinator_leases, seed=index)
        self.node_of_address = {member.peer: node for node, member in self.members.items()}

    def tearDown(self):
        stopped = defer.gatherResults([m.stop() for m in self.members.values()])
        advance(self.clock, REQUEST_TIMEOUT + 1)
        self.successResultOf(stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_the_fakes_provide_their_interfaces(self):
        member = self.members[NODES_OF_POOL[0]]
        verifyObject(IObjectClient, member.cloud_link)
        verifyObject(IObjectClient, member.coordinator_link)
        verifyObject(IObjectClient, self.cloud)
        verifyObject(IInformer, self.coordinator_leases.make_informer())
        verifyObject(IRoleComponent, member.pool_sync)
        verifyObject(IPoolStore, FakePoolStore(self.clock))
        verifyObject(ICloudHealthChecker, member.cloud_checker)
        verifyObject(ICoordinatorHealthChecker, member.coordinator_checker)

    # -- the scenario ----------------------------------------------------------------

    def roles(self):
        return {node: member.role for node, member in self.members.items()}

    def one_leader(self, nodes):
        roles = sorted(self.members[node].role for node in nodes)
        return roles == sorted([Role.LEADER] + [Role.FOLLOWER] * (len(nodes) - 1))

    def start_pool(self):
        """``run_scenario``'s start: one leader, the others followers; then the dead
        node's kubelet stops and its agent turns pending."""
        for offset, member in zip(START_OFFSETS, self.members.values()):
            self.clock.callLater(offset, member.start)
        advance_until(self.clock, lambda: self.one_leader(NODES_OF_POOL), ROLE_DEADLINE,
                      lambda: f"one leader among {NODES_OF_POOL}: {self.roles()}")
        self.leader = next(n for n, m in self.members.items() if m.role == Role.LEADER)
        self.followers = sorted(n for n in NODES_OF_POOL if n != self.leader)
        self.dead = self.followers[-1]
        self.live = [self.leader] + self.followers[:-1]
        self.started = self.clock.seconds()
        self.members[self.dead].kubelet_alive = False
        self.stopped_at = self.clock.seconds()
        advance_until(self.clock, lambda: self.members[self.dead].role == Role.PENDING,
                      ROLE_DEADLINE,
                      lambda: f"{self.dead} pending after its kubelet stopped: {self.roles()}")

    def leader_probe_due(self):
        """When the leader's next cloud heartbeat is due: its probes keep the lattice of
        its last write."""
        writes = [r.at for r in self.cloud_log if r.is_lease_write and r.name == self.leader
                  and r.peer == self.members[self.leader].peer]
        due = writes[-1] + SETTINGS.interval
        while due <= self.clock.seconds() + 1:
            due += SETTINGS.interval
        return due

    def flap(self, link, period, duration):
        """``Topology.flap`` on a link: cut for ``period``, healed for ``period``, and
        so on, each step scheduled from the start; healed at the end."""
        start = self.clock.seconds()
        steps = int(duration // period)
        for step in range(steps):
            self.clock.callLater(step * period, link.heal if step % 2 else link.cut)
        self.clock.callLater(duration, link.heal)
        advance(self.clock, duration)
        self.assertFalse(link.is_cut)
        self.assertEqual(self.clock.seconds(), start + duration)

    def run_flap(self, cut_before_probe):
        """Start the pool, flap the leader's cloud link with its first cut
        ``cut_before_probe`` seconds before one of its probes is due, let the pool
        settle as ``run_scenario`` does, and judge it. Returns the leadership changes
        during the flap."""
        self.start_pool()
        advance(self.clock, self.leader_probe_due() - cut_before_probe - self.clock.seconds())
        self.began = self.clock.seconds()
        self.flap(self.members[self.leader].cloud_link, partitions.FLAP_PERIOD, FLAP_DURATION)
        healed = self.clock.seconds()
        changes = [c for c in leadership_changes(self.coordinator_log, ELECTION_NAMESPACE,
                                                 ELECTION_LEASE)
                   if c.at >= self.began]
        self.assertIsNone(partitions.role_thrash(changes, self.began, healed))
        advance_until(self.clock, lambda: self.one_leader(self.live), ROLE_DEADLINE,
                      lambda: f"one leader among the live agents {self.live}: {self.roles()}")
        end_at = max(self.stopped_at + partitions.STALE_BOUND,
                     healed + partitions.LIVE_LEASE_BOUND) + partitions.HEARTBEAT_INTERVAL
        advance(self.clock, max(0.0, end_at - self.clock.seconds()))
        self.end = self.clock.seconds()
        self.assertEqual(
            partitions.judge_request_logs(
                self.cloud_log, self.coordinator_log, self.node_of_address, self.live,
                self.dead, self.started, self.stopped_at, self.end), [])
        self.assertEqual(self.members[self.dead].role, Role.PENDING)
        return changes

    def longest_gap(self, node):
        """The longest time ``node``'s cloud lease went without a write over the run."""
        writes = [r.at for r in self.cloud_log if r.is_lease_write and r.name == node
                  and self.started <= r.at <= self.end]
        edges = [self.started] + writes + [self.end]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def test_a_leader_whose_probes_fail_in_a_cut_steps_down_once(self):
        """Probes early in each cut: the leader loses the cloud in the first cut, steps
        down and releases the lease; a peer takes over within one retry period and keeps
        the lease through the rest of the flap, forwarding the former leader's
        heartbeat in every later cut. One leadership change in two minutes."""
        changes = self.run_flap(EARLY_IN_A_CUT)
        former, successor = self.leader, self.live[1]
        self.assertEqual([(c.previous_holder, c.new_holder) for c in changes],
                         [("", successor)])
        # Unhealthy when the second attempt of the first probe in the cut times out;
        # the hub's next check stops the candidacy, which releases the lease, and the
        # successor takes it at its next try.
        pause = (SETTINGS.interval - 2 * SETTINGS.timeout) / 2
        probe_failed = self.began + EARLY_IN_A_CUT + 2 * SETTINGS.timeout + pause
        released = [r.at for r in self.coordinator_log
                    if r.is_lease_write and r.name == ELECTION_LEASE and r.at >= self.began
                    and r.holder == ""]
        self.assertEqual(len(released), 1)
        self.assertGreaterEqual(released[0], probe_failed)
        self.assertLessEqual(released[0], probe_failed + ELECTION["check_interval"])
        self.assertGreater(changes[0].at, released[0])
        self.assertLessEqual(changes[0].at, released[0] + ELECTION["retry_period"])
        forwarded = delegated_writes(self.cloud_log, self.node_of_address)
        self.assertEqual({(w.writer, w.node) for w in forwarded}, {(successor, former)})
        # One forward of the former leader's heartbeat per cut after the first: the
        # pool renewal the successor listed as it took over in the first cut is no
        # change it saw, and the cut healed before the next one.
        cuts = int(FLAP_DURATION // partitions.FLAP_PERIOD + 1) // 2
        self.assertEqual(len(forwarded), cuts - 1)
        for node in self.live:
            self.assertLessEqual(self.longest_gap(node), 2 * SETTINGS.interval)

    def test_a_leader_whose_probe_retries_reach_an_up_phase_keeps_leading(self):
        """Probes late in each cut: the first attempt is lost, the second one, after the
        pause, reaches the cloud in the up phase. The leader never turns unhealthy:
        no leadership change, nothing delegated, and its cloud lease is renewed once
        per heartbeat interval all along, in every cut late by the lost attempt's
        timeout and the pause."""
        changes = self.run_flap(LATE_IN_A_CUT)
        self.assertEqual(changes, [])
        self.assertEqual(self.members[self.leader].role, Role.LEADER)
        self.assertEqual(delegated_writes(self.cloud_log, self.node_of_address), [])
        pause = (SETTINGS.interval - 2 * SETTINGS.timeout) / 2
        self.assertEqual(self.longest_gap(self.leader),
                         SETTINGS.interval + SETTINGS.timeout + pause)
