"""Heartbeat delegation across a pool leader's death, on a Clock: the timing logic of
the leader-death scenarios of ``test_delegation_pool`` and ``test_delegation_e2e``,
exact, with no process and no socket.

Three agents of one pool, each wired from its own parsed configuration as
``yurtcoord.agent.service.Agent`` wires them: the cloud and coordinator health
checkers writing the node lease, the hub elector starting a ``LeaderElector`` per
candidacy, the coordinator starting the ``HeartbeatDelegation`` in the leader role.
The cloud and the coordinator apiserver are one ``FakeKube`` each; every agent
reaches the cloud through a ``CloudLink`` of its own, so the cloud can be cut for one
agent (B) alone, and the coordinator through a ``FakeKubeServer`` of its own. The
leader's lease informer hears of every pool lease change in the next reactor turn (a
watch with no latency), and the leader stamps the cloud lease with its own clock, so
a forwarded renewTime is exactly the moment B renewed (all agents share the Clock).

The leader (A) dies as a SIGKILL leaves it: its links go dead in one instant and its
elector stops without releasing the election lease; the survivor (C) takes over when
the lease it saw last has expired by its own clock.

The agents start a fraction of ``retry_period`` apart (``START_OFFSETS``), as real
agents never start in one instant; none of the offsets is a multiple of it, so a
candidate's polls never fall on the leader's renewals, and no two timers the
outcome depends on are due at the same moment. The deaths are placed on a grid
(``death_phases``) that never meets a renewal either.

Expectations are stated from the configuration and the rules of docs/design.md
("Election timing", "Delegating cadence"), not from what the code computes:

- the leader renews the election lease every ``retry_period`` from its acquisition;
- the survivor takes over ``lease_duration`` after it first saw the leader's last
  renewal, that is ``lease_duration`` plus its poll phase (less than one
  ``retry_period``) after that renewal;
- while its cloud is unhealthy B renews its pool lease every
  ``W / ceil(W / interval)``, ``W = lease_duration + retry_period + 1 s``, from the
  moment its cloud turned unhealthy; every renewal reaches the cloud at once through
  the leader. The new leader forwards B's first renewal after it took over: the pool
  leases it lists as it starts are no change it saw.
"""

import math

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.config import parse_config
from yurtcoord.agent.service import FIRST_PROBE_SLACK
from yurtcoord.heartbeat.delegation import HeartbeatDelegation
from yurtcoord.heartbeat.probes import (
    TAKEOVER_MARGIN_SECONDS, CloudHealthChecker, CoordinatorHealthChecker,
)
from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.kube.interfaces import IInformer, IObjectClient
from yurtcoord.kube.lease import holder_identity, renew_time
from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector
from yurtcoord.names import (
    DELEGATE_HEARTBEAT_ANNOTATION, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE,
    NODE_LEASE_NAMESPACE,
)
from yurtcoord.pool.uploader import UploadCounts
from yurtcoord.role.coordinator import Coordinator
from yurtcoord.role.hubelector import HubElector
from yurtcoord.role.roles import IRoleComponent, Role
from yurtcoord.sim.agentini import FAULT_SUITE, TEST_ELECTION_LEASE, loopback_agent_ini
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube, FakeKubeServer
from yurtcoord.testing.fakepoolstore import FakePoolStore
from yurtcoord.testing.clocks import SkewedClock, run_until
from yurtcoord.testing.delegationobjects import pool_node
from yurtcoord.testing.idlecomponent import IdleComponent

T0 = 1_800_000_000.0
POOL = "pool-a"
NODES_OF_POOL = ("edge-1", "edge-2", "edge-3")
# A leads (it starts first), B is cut off from the cloud, C survives A.
LEADER, CUT, SURVIVOR = NODES_OF_POOL
# When each agent starts after T0, in units of its retry_period.
START_OFFSETS = {LEADER: 0.0, CUT: 1 / 8, SURVIVOR: 3 / 8}
CLOUD_URL = "http://cloud.example:6443"
COORDINATOR_URL = "http://coordinator.example:6443"
# The bound on a cut node's cloud renewTime gap across a leader's death with the
# default timings: twice the heartbeat interval plus the takeover (lease_duration +
# retry_period). The cadence rule keeps it at W + one cadence, 27 s.
MAX_GAP_ACROSS_LEADER_DEATH = 2 * 10.0 + 15.0 + 2.0


def agent_config(node, *presets):
    """The parsed configuration of an agent of the pool with ``presets``' timings; every
    key they leave out has the configuration's default."""
    return parse_config(loopback_agent_ini(
        node, POOL, [CLOUD_URL], COORDINATOR_URL, "http://etcd.example:2379",
        "/nonexistent/pki", "/nonexistent/cache", *presets), f"<{node}>")


def delegating_cadence(config):
    """How often a cut-off node renews its pool lease, as docs/design.md ("Delegating
    cadence") states it: ``W / ceil(W / interval)``, ``W`` = takeover + margin."""
    election = config.leader_election
    window = election.lease_duration + election.retry_period + TAKEOVER_MARGIN_SECONDS
    return window / math.ceil(window / config.heartbeat.interval)


def lattice_at_or_before(start, step, when):
    """The last of ``start + k * step`` (k >= 0) not after ``when``."""
    return start + math.floor((when - start) / step) * step


@implementer(IObjectClient)
class CloudLink:
    """One agent's way to the cloud apiserver. Until ``cut()`` every call reaches
    ``cloud``; then every call fails at once with ``ConnectionFailed`` (refused), as
    through a cut proxy, until ``restore()``.

    Every lease this agent writes for another node is noted in ``foreign_writes`` as
    ``(agent, lease name, the agent's hub role then)``: only a leader may forward.
    """

    def __init__(self, cloud, agent, foreign_writes):
        self.cloud = cloud
        self.agent = agent
        self.foreign_writes = foreign_writes
        self.cut_off = False

    def cut(self):
        self.cut_off = True

    def restore(self):
        self.cut_off = False

    def _send(self, call, *args):
        if self.cut_off:
            return defer.fail(ConnectionFailed(f"cannot reach {CLOUD_URL}: connection refused"))
        return call(*args)

    def _note(self, gvr, obj):
        name = obj["metadata"]["name"]
        if gvr == LEASES and name != self.agent.name:
            self.foreign_writes.append((self.agent.name, name, self.agent.hub_elector.role))

    def get(self, gvr, name, namespace=None):
        return self._send(self.cloud.get, gvr, name, namespace)

    def create(self, gvr, obj, namespace=None):
        self._note(gvr, obj)
        return self._send(self.cloud.create, gvr, obj, namespace)

    def update(self, gvr, obj, namespace=None):
        self._note(gvr, obj)
        return self._send(self.cloud.update, gvr, obj, namespace)

    def delete(self, gvr, name, namespace=None):
        return self._send(self.cloud.delete, gvr, name, namespace)


class StoreInformer(FakeInformer):
    """An informer of ``gvr`` in a ``FakeKube``: ``start()`` lists the store, then every
    change of it arrives in the next reactor turn, as a watch with no latency delivers
    it; after ``stop()`` none does."""

    def __init__(self, clock, store, gvr):
        super().__init__(reactor=clock, client=store, gvr=gvr)
        self._unwatch = None

    def start(self):
        super().start()
        self._unwatch = self.client.add_write_observer(self._changed)
        self.end_list(self.client.stored(self.gvr))

    def stop(self):
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        return super().stop()

    def _changed(self, event, obj):
        if obj.get("kind") == ("Lease" if self.gvr == LEASES else "Node"):
            self.reactor.callLater(0, self._deliver, self._unwatch, event, obj)

    def _deliver(self, watch, event, obj):
        if watch is not self._unwatch:
            return  # stopped (or started again) meanwhile
        if event == "DELETED":
            self.delete(obj)
        else:
            self.add(obj)


class ClockAgent:
    """The parts of one agent that decide when a delegated heartbeat reaches the cloud,
    wired as ``Agent`` wires them, with the kubelet check off, reading the pool's
    Clock ``skew`` seconds off. ``roles`` lists ``(seconds, role)`` of every hub role
    change (the pool's Clock); ``electors`` every candidacy's elector."""

    def __init__(self, pool, config, skew=0.0):
        self.pool_clock = pool.clock
        clock = SkewedClock(pool.clock, skew) if skew else pool.clock
        self.config = config
        self.name = name = config.node.name
        self.clock = clock
        self.roles = []
        self.electors = []
        self.cloud_link = CloudLink(pool.cloud, self, pool.foreign_writes)
        self.coordinator_server = FakeKubeServer(pool.coordinator_store, COORDINATOR_URL)
        heartbeat, election = config.heartbeat, config.leader_election
        self.cloud_checker = CloudHealthChecker.for_servers(
            clock, {CLOUD_URL: self.cloud_link}, name, heartbeat)
        self.coordinator_checker = CoordinatorHealthChecker(
            clock, {COORDINATOR_URL: self.coordinator_server}, name, self.cloud_checker,
            heartbeat, takeover=election.lease_duration + election.retry_period)
        self.delegation = HeartbeatDelegation(
            clock, lambda: StoreInformer(clock, pool.coordinator_store, LEASES),
            lambda _selector: StoreInformer(clock, pool.cloud, NODES), self.cloud_link,
            self.cloud_checker.pick_healthy_server, {CLOUD_URL: self.cloud_link}.__getitem__,
            config.node.pool, heartbeat_interval=heartbeat.interval)
        self.coordinator = Coordinator(
            clock, name, lambda: defer.succeed(FakePoolStore(clock)), IdleComponent(),
            self.delegation, IdleComponent(), lambda _store: defer.succeed(UploadCounts()))
        self.election_config = LeaderElectionConfig(
            lease_namespace=election.lease_namespace, lease_name=election.lease_name,
            identity=name, lease_duration=election.lease_duration,
            renew_deadline=election.renew_deadline, retry_period=election.retry_period,
            release_on_cancel=True)
        self.hub_elector = HubElector(clock, self.cloud_checker, self.coordinator_checker,
                                      self._make_elector, election.check_interval,
                                      on_role=self._role)

    def _make_elector(self, started_leading, stopped_leading, new_leader):
        elector = LeaderElector(self.clock, self.coordinator_server, self.election_config,
                                started_leading, stopped_leading, new_leader)
        self.electors.append(elector)
        return elector

    def _role(self, role):
        self.roles.append((self.pool_clock.seconds(), role))
        self.coordinator.set_role(role)

    @property
    def role(self):
        return self.hub_elector.role

    def start(self):
        """Probes first, then the hub elector once every prober answered (at the
        latest an interval and ``FIRST_PROBE_SLACK`` later), as the agent starts."""
        self.cloud_checker.start()
        self.coordinator_checker.start()
        probers = [*self.cloud_checker.probers, *self.coordinator_checker.probers]
        answered = defer.DeferredList([p.when_answered() for p in probers],
                                      fireOnOneErrback=True, consumeErrors=True)
        answered.addTimeout(self.config.heartbeat.interval + FIRST_PROBE_SLACK, self.clock)
        answered.addErrback(lambda failure: failure.trap(defer.TimeoutError))
        self.hub_elector.start(health_known=answered)

    def kill(self):
        """Die as a SIGKILL leaves it: from this instant nothing of this agent reaches
        a server, and its election lease is not released."""
        self.cloud_link.cut()
        self.coordinator_server.kill()
        if self.electors:
            self.electors[-1].stop(release=False)
        return self.stop()

    def stop(self):
        return defer.gatherResults([
            self.hub_elector.stop(), self.coordinator.stop(), self.coordinator_checker.stop(),
            self.cloud_checker.stop()])


class ClockPool:
    """The three agents of ``NODES_OF_POOL`` with the timings of ``presets``, over one
    cloud and one coordinator apiserver on one Clock starting at ``T0``; ``skews``
    names the agents whose clocks are off, and by how many seconds.

    ``cloud.writes`` and ``coordinator_store.writes`` hold every accepted write with
    its time (the pool's Clock, the servers'); ``foreign_writes`` every lease an agent
    wrote for another node."""

    def __init__(self, test, *presets, skews=None):
        self.test = test
        self.clock = Clock()
        self.clock.advance(T0)
        self.cloud = FakeKube(self.clock)
        self.coordinator_store = FakeKube(self.clock)
        self.foreign_writes = []
        for name in NODES_OF_POOL:
            self.cloud.put(NODES, pool_node(name))
        self.agents = {name: ClockAgent(self, agent_config(name, *presets),
                                        (skews or {}).get(name, 0.0))
                       for name in NODES_OF_POOL}
        config = self.agents[LEADER].config
        self.election = config.leader_election
        self.heartbeat = config.heartbeat
        self.retry = self.election.retry_period
        self.cadence = delegating_cadence(config)
        self.cut_flips = []
        self.agents[CUT].cloud_checker.add_listener(
            lambda healthy: self.cut_flips.append((self.clock.seconds(), healthy)))
        self._starts = [self.clock.callLater(offset * self.retry, self.agents[name].start)
                        for name, offset in START_OFFSETS.items()]
        test.addCleanup(self.stop)

    def stop(self):
        for start in self._starts:
            if start.active():
                start.cancel()
        for agent in self.agents.values():
            self.test.successResultOf(agent.stop())
        run_until(self.clock, self.clock.seconds())
        self.test.assertEqual(self.clock.getDelayedCalls(), [])

    def run_until(self, when):
        run_until(self.clock, when)

    def election_writes(self):
        """``(written at, lease)`` of every write of the election lease."""
        return [(at, lease) for at, lease in self.coordinator_store.writes
                if lease["metadata"]["name"] == ELECTION_LEASE_NAME]

    def election_renewals(self, holder):
        """renewTimes of the election lease written with ``holder`` as its holder."""
        return [renew_time(lease) for _at, lease in self.election_writes()
                if holder_identity(lease) == holder]

    def election_holder(self):
        lease = self.coordinator_store.peek(LEASES, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE)
        return holder_identity(lease)

    def pool_renewals(self, node, annotated):
        """renewTimes of ``node``'s pool lease, those with the delegate annotation or
        those without."""
        return [renew_time(lease) for _at, lease in self.coordinator_store.writes
                if lease["metadata"]["name"] == node
                and lease["metadata"]["namespace"] == NODE_LEASE_NAMESPACE
                and delegated(lease) == annotated]

    def cloud_changes(self, node):
        """``(written at, renewTime, delegated)`` of every write of ``node``'s cloud lease."""
        return [(at, renew_time(lease), delegated(lease)) for at, lease in self.cloud.writes
                if lease.get("kind") == "Lease" and lease["metadata"]["name"] == node]

    def cloud_renewals(self, node):
        """The distinct renewTimes of ``node``'s cloud lease, in the order written."""
        times = []
        for _at, renewed, _delegated in self.cloud_changes(node):
            if not times or renewed != times[-1]:
                times.append(renewed)
        return times


def delegated(lease):
    return (lease["metadata"].get("annotations") or {}).get(DELEGATE_HEARTBEAT_ANNOTATION) \
        == "true"


def gaps(times):
    return [b - a for a, b in zip(times, times[1:])]


class LeaderDeath:
    """One run of the scenario: the pool settles, B's cloud is cut, B's heartbeats go
    through A for a while, A dies ``phase`` seconds after two delegating cadences
    past B's cloud turning unhealthy, and C takes over. Fields: ``cut_at``,
    ``unhealthy_at`` (B's cloud turned unhealthy), ``killed_at``, ``takeover_at``
    (C's first write of the election lease), ``ended_at``; all on the pool's Clock,
    whatever ``skews`` (see ``ClockPool``) the agents' clocks have."""

    def __init__(self, test, *presets, phase, after_takeover=3, skews=None):
        self.pool = pool = ClockPool(test, *presets, skews=skews)
        interval = pool.heartbeat.interval
        b_start = T0 + START_OFFSETS[CUT] * pool.retry
        # Settled: every agent heartbeated the cloud a few times, A leads.
        pool.run_until(T0 + 4 * interval)
        test.assertEqual({name: agent.role for name, agent in pool.agents.items()},
                         {LEADER: Role.LEADER, CUT: Role.FOLLOWER, SURVIVOR: Role.FOLLOWER})
        test.assertTrue(pool.agents[LEADER].delegation.running)
        # Halfway between two of B's cloud heartbeats.
        self.cut_at = lattice_at_or_before(b_start, interval, pool.clock.seconds()) \
            + interval / 2
        pool.run_until(self.cut_at)
        pool.agents[CUT].cloud_link.cut()
        # B's next heartbeat fails, and the probe ends within its interval.
        pool.run_until(self.cut_at + interval / 2 + interval)
        test.assertEqual([healthy for _at, healthy in pool.cut_flips], [True, False])
        self.unhealthy_at = pool.cut_flips[-1][0]
        self.killed_at = self.unhealthy_at + 2 * pool.cadence + phase
        test.assertGreater(self.killed_at, pool.clock.seconds())
        pool.run_until(self.killed_at)
        test.assertEqual(pool.election_holder(), LEADER)
        test.successResultOf(pool.agents[LEADER].kill())
        pool.run_until(self.killed_at + pool.election.lease_duration + 2 * pool.retry)
        self.takeover_at = self.first_election_write(SURVIVOR)
        self.ended_at = self.takeover_at + after_takeover * pool.cadence
        pool.run_until(self.ended_at)

    def first_election_write(self, holder):
        writes = [at for at, lease in self.pool.election_writes()
                  if holder_identity(lease) == holder]
        return writes[0] if writes else None

    # What the rules say -------------------------------------------------------------

    def expected_leader_renewals(self):
        """A acquires the lease as it starts (T0) and renews it every retry_period
        until it dies."""
        last = lattice_at_or_before(T0, self.pool.retry, self.killed_at)
        return [T0 + k * self.pool.retry
                for k in range(round((last - T0) / self.pool.retry) + 1)]

    def expected_takeover(self):
        """``lease_duration`` after C first saw A's last renewal: C polls every
        retry_period from its start, so that is its first poll after the renewal."""
        last_renewal = self.expected_leader_renewals()[-1]
        c_start = T0 + START_OFFSETS[SURVIVOR] * self.pool.retry
        first_seen = c_start + math.ceil((last_renewal - c_start) / self.pool.retry) \
            * self.pool.retry
        return first_seen + self.pool.election.lease_duration

    def expected_pool_renewals(self):
        """B's annotated pool renewals: every delegating cadence from the moment its
        cloud turned unhealthy."""
        count = math.floor((self.ended_at - self.unhealthy_at) / self.pool.cadence) + 1
        return [self.unhealthy_at + k * self.pool.cadence for k in range(count)]

    def expected_cloud_writes(self):
        """``(written at, renewTime)`` of B's cloud lease: B's own heartbeats every
        interval until the cut, then its pool renewals as A forwards them until A's
        death, and those after C took over as C forwards them, each in the instant it
        was renewed and with that time: the renewal C lists as it starts is none."""
        interval = self.pool.heartbeat.interval
        b_start = T0 + START_OFFSETS[CUT] * self.pool.retry
        direct = [b_start + k * interval
                  for k in range(math.floor((self.cut_at - b_start) / interval) + 1)]
        pool = self.expected_pool_renewals()
        takeover = self.expected_takeover()
        before_death = [p for p in pool if p < self.killed_at]
        after = [p for p in pool if p > takeover]
        return [(p, p) for p in direct + before_death + after]

    def expected_cloud_renewals(self):
        return [renewed for _at, renewed in self.expected_cloud_writes()]

    def across_death_gap(self):
        """The cloud renewTime gap the death made, as the cloud saw it: A's last
        forward to C's first."""
        forwarded = self.pool.cloud_renewals(CUT)
        last_by_a = max(p for p in forwarded if p < self.killed_at)
        return min(p for p in forwarded if p > self.killed_at) - last_by_a


def death_phases(pool_cadence, retry):
    """Deaths on a grid of retry_period / 4 across two delegating cadences (every
    phase of the death against B's renewals and A's), offset by an eighth of a step
    so that none falls on a renewal."""
    step = retry / 4
    return [(k + 1 / 8) * step for k in range(math.ceil(2 * pool_cadence / step))]


class LeaderDeathAssertions:
    """Exact checks of one ``LeaderDeath`` run against what the rules say."""

    def assert_death_follows_the_rules(self, run):
        pool = run.pool
        self.assertEqual(pool.election_renewals(LEADER), run.expected_leader_renewals())
        # Not released: nobody wrote the lease from A's death until C took it.
        self.assertEqual([at for at, _lease in pool.election_writes()
                          if run.killed_at <= at < run.takeover_at], [])
        self.assertEqual(run.takeover_at, run.expected_takeover())
        self.assertEqual([(at, role) for at, role in pool.agents[SURVIVOR].roles
                          if role == Role.LEADER], [(run.takeover_at, Role.LEADER)])
        self.assertEqual(pool.pool_renewals(CUT, annotated=True), run.expected_pool_renewals())
        self.assertEqual([(at, renewed) for at, renewed, _annotated in pool.cloud_changes(CUT)],
                         run.expected_cloud_writes())
        self.assertEqual([annotated for at, _renewed, annotated in pool.cloud_changes(CUT)],
                         [at > run.cut_at for at, _renewed in run.expected_cloud_writes()])
        # Only leaders forward: A until its death, C from its takeover.
        self.assertEqual({w for w in pool.foreign_writes},
                         {(LEADER, CUT, Role.LEADER), (SURVIVOR, CUT, Role.LEADER)})
        self.assertEqual(pool.agents[CUT].role, Role.FOLLOWER)


class DefaultTimingsLeaderDeathTests(LeaderDeathAssertions, unittest.TestCase):
    """``test_delegation_pool``'s scenario with every timing at its default (lease
    15 s, renew 10 s, retry 2 s, heartbeat every 10 s): a cut-off node's cloud lease
    across the leader's death."""

    def test_fakes_provide_their_interfaces(self):
        pool = ClockPool(self, TEST_ELECTION_LEASE)
        agent = pool.agents[CUT]
        verifyObject(IObjectClient, agent.cloud_link)
        verifyObject(IRoleComponent, IdleComponent())
        verifyObject(IInformer, StoreInformer(pool.clock, pool.cloud, NODES))

    def test_death_just_before_the_cut_nodes_renewal_leaves_the_widest_gap(self):
        """The worst phase (test_delegation_pool's): A dies just before B's next pool
        renewal, so C, which forwards only renewals it saw after it took over,
        forwards the one a whole ``W`` after that, ``W`` + one cadence after A's last
        forward and no later."""
        timings = agent_config(LEADER, TEST_ELECTION_LEASE)
        cadence = delegating_cadence(timings)
        phase = max(p for p in death_phases(cadence, timings.leader_election.retry_period)
                    if p < cadence)
        run = LeaderDeath(self, TEST_ELECTION_LEASE, phase=phase)
        self.assert_death_follows_the_rules(run)
        pool, election = run.pool, run.pool.election
        window = election.lease_duration + election.retry_period + TAKEOVER_MARGIN_SECONDS
        self.assertEqual(run.across_death_gap(), window + cadence)
        self.assertLessEqual(max(gaps(pool.cloud_renewals(CUT))), MAX_GAP_ACROSS_LEADER_DEATH)
        # The takeover: lease_duration after A's last renewal, plus C's poll phase.
        last_renewal = pool.election_renewals(LEADER)[-1]
        self.assertEqual(run.takeover_at - last_renewal,
                         election.lease_duration + START_OFFSETS[SURVIVOR] * election.retry_period)

    def test_cut_node_gap_stays_within_the_bound_whatever_the_phase_of_the_death(self):
        timings = agent_config(LEADER, TEST_ELECTION_LEASE)
        election, cadence = timings.leader_election, delegating_cadence(timings)
        phases = death_phases(cadence, election.retry_period)
        self.assertGreaterEqual(len(phases), 36)
        window = election.lease_duration + election.retry_period + TAKEOVER_MARGIN_SECONDS
        across = {}
        for phase in phases:
            run = LeaderDeath(self, TEST_ELECTION_LEASE, phase=phase, after_takeover=1)
            self.assert_death_follows_the_rules(run)
            self.assertGreaterEqual(run.takeover_at - run.pool.election_renewals(LEADER)[-1],
                                    election.lease_duration)
            self.assertLess(run.takeover_at - run.pool.election_renewals(LEADER)[-1],
                            election.lease_duration + election.retry_period)
            gap = max(gaps(run.pool.cloud_renewals(CUT)))
            self.assertLessEqual(gap, MAX_GAP_ACROSS_LEADER_DEATH, phase)
            across[phase] = run.across_death_gap()
            self.assertLessEqual(across[phase], window + cadence, phase)
        # Both outcomes occur: C's first forward is B's renewal a whole W after A's
        # last (C took over before it), or the one after that, W + one cadence after
        # A's last; never more. C never forwards the renewal it lists as it starts.
        self.assertEqual(set(across.values()), {window, window + cadence})


class ProcessWorldLeaderDeathTests(LeaderDeathAssertions, unittest.TestCase):
    """``test_delegation_e2e``'s SIGKILL scenario with the process world's timings
    (``FAULT_SUITE``): the cut node's cloud renewTime is never older than
    2 x interval + takeover (lease_duration + retry_period)."""

    def test_cut_node_renew_time_stays_fresh_across_a_leader_sigkill(self):
        timings = agent_config(LEADER, FAULT_SUITE)
        election, interval = timings.leader_election, timings.heartbeat.interval
        max_renew_age = 2 * interval + election.lease_duration + election.retry_period
        for phase in death_phases(delegating_cadence(timings), election.retry_period):
            run = LeaderDeath(self, FAULT_SUITE, phase=phase)
            self.assert_death_follows_the_rules(run)
            # The age of B's cloud renewTime from the cut on peaks just before each
            # write of a newer one, and at the end.
            renewed, ages = None, []
            for at, renewal, _annotated in run.pool.cloud_changes(CUT):
                if renewed is not None and at > run.cut_at:
                    ages.append(at - renewed)
                renewed = renewal
            ages.append(run.ended_at - renewed)
            writes = run.expected_cloud_writes()
            expected = [at - before for (_, before), (at, _) in zip(writes, writes[1:])
                        if at > run.cut_at] + [run.ended_at - writes[-1][1]]
            self.assertEqual(ages, expected)
            # The oldest: just before A's first forward (B's cloud turning unhealthy)
            # or just before C's (B's first renewal after the takeover).
            self.assertEqual(max(ages), max(
                run.unhealthy_at - max(r for _at, r in writes if r < run.cut_at),
                min(r for _at, r in writes if r > run.takeover_at)
                - max(r for _at, r in writes if r < run.killed_at)))
            self.assertLessEqual(max(ages), max_renew_age, phase)


def increases(changes):
    """The moments (the cloud's clock) at which a lease's renewTime increased, of its
    ``(written at, renewTime, ...)`` changes: when the node lifecycle controller
    counts a heartbeat."""
    moments, highest = [], None
    for at, renewed, *_rest in changes:
        if highest is None or renewed > highest:
            moments.append(at)
            highest = renewed
    return moments


def to_micros(times):
    return [round(t * 1_000_000) for t in times]


class SkewedClocksLeaderDeathTests(unittest.TestCase):
    """The leader-death scenario with the agents' clocks minutes apart, as edge nodes
    that lost NTP keep them, and the cloud judged as the node lifecycle controller
    judges it: by the moments, on its own clock, at which B's cloud renewTime
    increased. Every write of B's lease increases it, and the moments are those of
    the scenario with every clock true (``LeaderDeath.expected_cloud_writes``): no
    clock, of the node or of either leader, costs B a heartbeat or moves one."""

    SKEWS = {
        "the cut node 2 min ahead": {CUT: 120.0},
        "the cut node 2 min behind": {CUT: -120.0},
        "the leader 5 min ahead": {LEADER: 300.0},
        "a takeover from a leader 5 min ahead by one 2 min behind, the cut node 2 min "
        "ahead": {LEADER: 300.0, SURVIVOR: -120.0, CUT: 120.0},
    }

    def test_skewed_clock_reads_the_pool_clock_off(self):
        clock = Clock()
        skewed = SkewedClock(clock, -120.0)
        verifyObject(IReactorTime, skewed)
        clock.advance(1000)
        self.assertEqual(skewed.seconds(), 880.0)
        fired = []
        skewed.callLater(5, fired.append, True)
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        clock.advance(5)
        self.assertEqual(fired, [True])

    def test_the_cloud_sees_every_heartbeat_the_true_clocks_give_it(self):
        timings = agent_config(LEADER, TEST_ELECTION_LEASE)
        cadence = delegating_cadence(timings)
        phases = death_phases(cadence, timings.leader_election.retry_period)[::4]
        for what, skews in self.SKEWS.items():
            for phase in phases:
                run = LeaderDeath(self, TEST_ELECTION_LEASE, phase=phase, skews=skews)
                pool, where = run.pool, f"{what}, phase {phase}"
                changes = pool.cloud_changes(CUT)
                self.assertEqual(to_micros(increases(changes)), to_micros(at for at, *_rest in changes),
                                 where)
                self.assertEqual(to_micros(increases(changes)),
                                 to_micros(at for at, _ in run.expected_cloud_writes()), where)
                # The election is judged by changes seen, whatever the clocks.
                self.assertEqual(round(run.takeover_at, 6), round(run.expected_takeover(), 6),
                                 where)
                self.assertEqual(set(pool.foreign_writes),
                                 {(LEADER, CUT, Role.LEADER), (SURVIVOR, CUT, Role.LEADER)},
                                 where)
                self.assertEqual(pool.agents[CUT].role, Role.FOLLOWER, where)
                self.assertLessEqual(max(gaps(increases(changes))),
                                     MAX_GAP_ACROSS_LEADER_DEATH, where)
