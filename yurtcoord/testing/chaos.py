"""A chaos run: one pool through minutes of overlapping faults, drawn from a seed, and
judged afterwards by the partition suite's invariants.

``run_chaos(reactor, seed, minutes)`` prints the schedule (``chaosschedule``: a pure
function of its seed and minutes, so a seed replays its run's faults), brings up
a ``ChaosWorld`` (``NODES`` agents, each a ``twistd`` process on a host of its own
with a stand-in kubelet and ``PODS_PER_NODE`` pods in its cache, a pool etcd of three
members and two coordinator apiservers, each on a host of its own, at the partition
suite's timings), waits for one leader and every agent ready, then starts each fault
at its time, as the cloud's endpoints keep changing (every ``ENDPOINT_CHANGE_PERIOD``
seconds):

- agent-kill: SIGKILL the node's agent, start it again after the fault's duration;
- etcd-kill / coordinator-kill: SIGKILL one pool etcd member / coordinator apiserver,
  start it again on its data and port after the duration;
- wan-cut / lan-cut: cut one agent host's link for the duration; wan-flap /
  lan-flap: cut and heal it every ``FLAP_PERIOD`` seconds for the duration;
- kubelet-stop: stop the node's kubelet for the duration;
- rolling-restart: as a DaemonSet's rolling update, every agent in node order is
  stopped (SIGTERM) and started again, each ready (or ``READY_TIMEOUT`` passed:
  a node whose kubelet is stopped does not get ready) before the next one stops.

A fault holds the resources the schedule gave it (``chaosschedule.resources``) with
a lock, so one that starts late (its target still recovering) is delayed, never
overlapped. Once every fault ended, the pool gets a settle time (one leader, every
agent ready, the pool etcd exact against the cloud's endpoints and the agents'
caches), then runs on for the bound of a live lease and a heartbeat interval, and is
judged by ``chaosjudge.judge_chaos`` (where what each fault excuses is written down)
and ``partitions.crashes``. The outcome holds the schedule, how many faults of each
kind were injected, each violation with the records at fault, and measured notes.
"""

import json
import time
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence

import attr
from twisted.internet import defer
from twisted.internet.task import deferLater

from yurtcoord.kube.gvr import ENDPOINTS
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.sim.apiserver.requestlog import LoggedRequest
from yurtcoord.testing.chaosjudge import Timeline, excused_windows, judge_chaos
from yurtcoord.testing.chaosschedule import (
    AGENT_KILL, COORDINATOR_KILL, ETCD_KILL, FAULT_KINDS, FLAP_PERIOD, KUBELET_STOP, LAN_CUT,
    LAN_FLAP, ROLLING_RESTART, WAN_CUT, WAN_FLAP, Fault, chaos_schedule, member_index,
    resources,
)
from yurtcoord.testing.chaosworld import ChaosWorld
from yurtcoord.testing.invariants import lease_renewals, leadership_changes
from yurtcoord.testing.partitions import (
    HEARTBEAT_INTERVAL, KUBELET_GRACE, LIVE_LEASE_BOUND, STALE_BOUND, TIMINGS, crashes,
    endpoints,
)
from yurtcoord.testing.partitionworld import LAN, WAN
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE, one_leader_all_ready

NODES = 5
PODS_PER_NODE = 4
ENDPOINT_COUNT = 6
ENDPOINT_CHANGE_PERIOD = 20.0
# Deadlines of a loaded machine (not bounds that are judged).
START_TIMEOUT = 180.0
READY_TIMEOUT = 20.0
SETTLE_TIMEOUT = 120.0
EXACT_TIMEOUT = 120.0


@attr.s(auto_attribs=True)
class ChaosOutcome:
    """What a run of ``seed`` for ``minutes`` did: its ``schedule``, the faults
    ``injected`` per kind, the ``problems`` (violations and failures of the run
    itself, each with the records at fault) and measured ``notes``."""

    seed: int
    minutes: float
    schedule: List[Fault]
    injected: Dict[str, int]
    problems: List[str]
    notes: Dict[str, object]

    def summary(self) -> str:
        counts = " ".join(f"{kind}={count}" for kind, count in self.injected.items())
        return (f"CHAOS seed={self.seed} minutes={self.minutes:g} faults={sum(self.injected.values())} "
                f"{counts} violations={len(self.problems)} "
                + " ".join(f"{key}={value}" for key, value in sorted(self.notes.items())))


class FaultExecutor:
    """Starts each fault of a schedule at its time on a ``ChaosWorld`` and records
    when each took effect in ``timeline``; see the module docstring."""

    def __init__(self, world: ChaosWorld, timeline: Timeline, began: float) -> None:
        self.world = world
        self.timeline = timeline
        self.began = began
        self.injected = {kind: 0 for kind in FAULT_KINDS}
        self.problems: List[str] = []
        self.notes: Dict[str, int] = {"rollout_unready": 0}
        self._locks: Dict[str, defer.DeferredLock] = {}
        self._actions: Dict[str, Callable[[Fault], defer.Deferred[Any]]] = {
            AGENT_KILL: self._agent_kill, ETCD_KILL: self._etcd_kill,
            COORDINATOR_KILL: self._coordinator_kill, WAN_CUT: self._cut,
            LAN_CUT: self._cut, WAN_FLAP: self._flap, LAN_FLAP: self._flap,
            KUBELET_STOP: self._kubelet_stop, ROLLING_RESTART: self._rolling_restart,
        }

    def now(self) -> float:
        return float(self.world.reactor.seconds())

    def wait(self, seconds: float) -> defer.Deferred[None]:
        """Let a fault last ``seconds`` (its duration, not a poll)."""
        return deferLater(self.world.reactor, max(0.0, seconds), lambda: None)

    def _lock(self, resource: str) -> defer.DeferredLock:
        return self._locks.setdefault(resource, defer.DeferredLock())

    @defer.inlineCallbacks
    def run(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        """Start ``fault`` at its time, holding its resources; never fails (a fault
        that could not be carried out is a problem of the run)."""
        yield self.wait(self.began + fault.at - self.now())
        held = [] if fault.kind == ROLLING_RESTART else resources(
            fault.kind, fault.target, sorted(self.world.agents))
        try:
            for resource in held:
                yield self._lock(resource).acquire()
            self.injected[fault.kind] += 1
            yield self._actions[fault.kind](fault)
        except Exception as e:
            self.problems.append(f"{fault.describe()} could not be carried out: "
                                 f"{type(e).__name__}: {e}")
        finally:
            for resource in held:
                self._lock(resource).release()

    @defer.inlineCallbacks
    def _start_agent(self, node: str, down: float) -> Generator[defer.Deferred[Any], Any, None]:
        """Start ``node``'s agent again; its down window ends once it listens."""
        spawned = self.now()
        try:
            yield self.world.start_agents([node])
        finally:
            self.timeline.agent_down.setdefault(node, []).append((down, self.now()))
            self.timeline.agent_restarts.setdefault(node, []).append((spawned, self.now()))

    @defer.inlineCallbacks
    def _agent_kill(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        agent = self.world.agents[fault.target]
        down = self.now()
        agent.signal("KILL")
        yield agent.ended
        yield self.wait(fault.duration)
        yield self._start_agent(fault.target, down)

    @defer.inlineCallbacks
    def _rolling_restart(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        for node in sorted(self.world.agents):
            lock = self._lock(f"agent:{node}")
            yield lock.acquire()
            try:
                agent = self.world.agents[node]
                down = self.now()
                yield agent.stop()
                yield self._start_agent(node, down)

                def ready() -> defer.Deferred[bool]:
                    return self.world.status(agent).addCallback(
                        lambda status: bool(status.get("ready")))
                try:
                    yield poll_until(ready, READY_TIMEOUT, 0.25, self.world.reactor,
                                     what=f"{node} ready after its restart")
                except PollTimeout:
                    self.notes["rollout_unready"] += 1
            finally:
                lock.release()

    @defer.inlineCallbacks
    def _etcd_kill(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        index = member_index(fault.target)
        yield self.world.kill_etcd(index)
        yield self.wait(fault.duration)
        yield self.world.restart_etcd(index)

    @defer.inlineCallbacks
    def _coordinator_kill(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        index = member_index(fault.target)
        yield self.world.kill_coordinator(index)
        yield self.wait(fault.duration)
        yield self.world.restart_coordinator(index)

    @staticmethod
    def _network(fault: Fault) -> str:
        return WAN if fault.kind in (WAN_CUT, WAN_FLAP) else LAN

    @defer.inlineCallbacks
    def _cut(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        network = self._network(fault)
        self.world.cut(fault.target, network)
        try:
            yield self.wait(fault.duration)
        finally:
            self.world.heal(fault.target, network)

    def _flap(self, fault: Fault) -> defer.Deferred[None]:
        return self.world.topology.flap(fault.target, self._network(fault), FLAP_PERIOD,
                                        fault.duration)

    @defer.inlineCallbacks
    def _kubelet_stop(self, fault: Fault) -> Generator[defer.Deferred[Any], Any, None]:
        down = self.now()
        try:
            yield self.world.stop_kubelet(fault.target)
            yield self.wait(fault.duration)
        finally:
            self.world.start_kubelet(fault.target)
            self.timeline.kubelet_down.setdefault(fault.target, []).append((down, self.now()))


def evidence(cloud_log: Sequence[LoggedRequest], coordinator_log: Sequence[LoggedRequest],
             names: Sequence[str], timeline: Timeline, began: float,
             end: float) -> Dict[str, object]:
    """What the judge had before it, printed with the outcome: the records of both
    sides, the leadership changes, the cloud renewals of the nodes' leases and how
    long each node's lease was excused from the live bound (seconds)."""
    changes = leadership_changes(coordinator_log, ELECTION_NAMESPACE, ELECTION_LEASE)
    excused = {node: round(sum(high - low for low, high in
                               excused_windows(timeline, names, node, began, end)), 1)
               for node in names}
    return {
        "cloud_records": len(cloud_log), "coordinator_records": len(coordinator_log),
        "leadership_changes": len([c for c in changes if began <= c.at <= end]),
        "renewals": sum(len([r for r in lease_renewals(cloud_log, NODE_LEASE_NAMESPACE, node)
                             if began <= r.at <= end]) for node in names),
        "link_windows": sum(len(windows) for windows in timeline.link_cut.values()),
        "excused_s": json.dumps(excused, sort_keys=True).replace(" ", ""),
    }


@defer.inlineCallbacks
def run_chaos(reactor: Any, seed: int, minutes: float, name: str = "chaos",
              nodes: int = NODES, say: Callable[[str], None] = print,
              ) -> Generator[defer.Deferred[Any], Any, ChaosOutcome]:
    """One chaos run; see the module docstring. Never raises (a setup failure is a
    problem of the outcome), and always removes what it made."""
    names = [f"edge-{index}" for index in range(1, nodes + 1)]
    schedule = chaos_schedule(seed, minutes, names)
    say(f"chaos seed={seed} minutes={minutes:g}: {nodes} agents, 3 pool etcd members, "
        f"2 coordinator apiservers; {len(schedule)} faults:")
    for fault in schedule:
        say(f"  {fault.describe()}")
    world = ChaosWorld(reactor, name, kubelet_grace_period=f"{KUBELET_GRACE:g}s",
                       timings=TIMINGS)
    timeline = Timeline()
    problems: List[str] = []
    notes: Dict[str, object] = {}
    executor: Optional[FaultExecutor] = None
    changes: List[Any] = []
    wall = time.monotonic()
    try:
        yield world.start()
        cloud = world.servers()[0]
        for index in range(ENDPOINT_COUNT):
            cloud.store.create(ENDPOINTS, endpoints(f"svc-{index}", f"10.1.0.{index}"))
        for node in names:
            yield world.add_agent(node, pods=PODS_PER_NODE)
        yield world.start_agents()
        yield world.wait_for_pool("one leader, all ready",
                                  lambda statuses: one_leader_all_ready(statuses, nodes),
                                  START_TIMEOUT)
        notes["setup_s"] = round(time.monotonic() - wall, 1)
        began = float(reactor.seconds())
        executor = FaultExecutor(world, timeline, began)
        rounds = int(minutes * 60 // ENDPOINT_CHANGE_PERIOD)
        changes = [reactor.callLater(ENDPOINT_CHANGE_PERIOD * (index + 1),
                                     world.change_cloud_endpoints, f"round-{index}",
                                     created=1, updated=2, deleted=1)
                   for index in range(rounds)]
        yield defer.gatherResults([executor.run(fault) for fault in schedule])
        faults_ended = float(reactor.seconds())
        notes["faults_s"] = round(faults_ended - began, 1)
        try:
            yield world.wait_for_pool("one leader, all ready after the faults",
                                      lambda statuses: one_leader_all_ready(statuses, nodes),
                                      SETTLE_TIMEOUT)
            yield world.wait_pool_exact(EXACT_TIMEOUT)
        except PollTimeout as e:
            # Judged all the same: what went wrong before shows in the records.
            problems.append(f"did not settle: {e}")
        notes["settle_s"] = round(float(reactor.seconds()) - faults_ended, 1)
        # Long enough that a lease which should have moved, or gone stale, had the
        # time to.
        end_at = faults_ended + max(LIVE_LEASE_BOUND, STALE_BOUND) + HEARTBEAT_INTERVAL
        if reactor.seconds() < end_at:
            yield deferLater(reactor, end_at - reactor.seconds(), lambda: None)
        end = float(reactor.seconds())
        timeline.add_links(world.topology.events, end)
        problems += executor.problems
        coordinator_log = world.coordinator_request_log()
        problems += judge_chaos(cloud.request_log, coordinator_log, world.node_of_address,
                                names, timeline, began, end)
        notes.update(evidence(cloud.request_log, coordinator_log, names, timeline, began,
                              end))
        problems += crashes(world)
        notes.update(executor.notes)
    except PollTimeout as e:
        problems.append(f"did not settle: {e}")
    except Exception as e:  # a broken setup is a finding, reported with the others
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        for call in changes:
            if call.active():
                call.cancel()
        try:
            yield world.stop()
        except Exception as e:
            problems.append(f"stopping the world failed: {type(e).__name__}: {e}")
    notes["wall_s"] = round(time.monotonic() - wall, 1)
    injected = executor.injected if executor is not None else {kind: 0 for kind in FAULT_KINDS}
    return ChaosOutcome(seed, minutes, schedule, dict(injected), problems, notes)
