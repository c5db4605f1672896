"""Partition scenarios on real test networks, and the invariants judged after each.

A scenario is one ``PartitionWorld`` (three agents, each a ``twistd`` process on a host
of its own, with a stand-in kubelet) and one script of link cuts. ``run_scenario`` brings
the pool up, stops the kubelet of one follower (the "dead" node) and waits until its
agent turned pending, runs the script while the cloud's endpoints keep changing, lets
the pool settle, and then judges the run from
records that do not depend on the agents: the request logs of the cloud and coordinator
API test servers and the pool etcd read with ``etcdctl``. The coordinator apiserver keeps
its objects in the pool etcd, so an etcd cut is also a coordinator outage. Every
invariant is checked after every scenario; the outcome lists each violated one with the
records at fault.

The invariants:

- at no time do two agents write heartbeats for other nodes to the cloud, and a former
  leader stops delegating before a new leader starts (``check_single_delegator``,
  ``check_fencing``);
- the cloud lease of a node with a live kubelet is never older than
  ``LIVE_LEASE_BOUND`` (2 heartbeat intervals plus a leader takeover), except while no
  pool member can reach the cloud at all (those windows are excused, plus the bound
  after them);
- the cloud lease of the dead node is not renewed later than ``STALE_BOUND`` (kubelet
  grace period plus one interval) after its kubelet stopped;
- the pool etcd ends exact against the cloud's endpoints and the agents' caches;
- the leases the agents wrote through the coordinator apiserver (the election lease,
  held by the pool's leader, and every agent's node lease) are in the pool etcd under
  kube-apiserver's keys, as the coordinator serves them (``check_leases_in_etcd``); a
  follower cut from the cloud asks for delegation in a lease that etcd holds
  (``delegating_follower``).
- no agent exits, or logs a traceback or an unexpected error.

One agent of every scenario (``SKEWED_NODE``) runs with its clock ``SKEW`` seconds
ahead (libfaketime, ``yurtcoord.testing.skew``), as an edge node that lost NTP does: the
invariants hold whichever role it takes, since lease ages are judged by observed
increases of renewTime on the servers' clock, never by the time a renewTime names.

A rolling update is a scenario too (``ROLLING_UPDATE_SCENARIO``): six agents, two of
them cut off from the cloud, each restarted in node order, the leader included; it adds
its own checks (no leadership change for a follower's restart, at most one for the
leader's, every live node's cloud lease moving within ``ROLLOUT_LEASE_BOUND``).

Scenarios run side by side, each on a topology of its own, to keep the suite short.

Longer than 600 lines on purpose: the partition suite's scenarios, how one is run and
how it is judged are read together as the suite's one specification.
"""

import json
import math
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple

import attr
from twisted.internet import defer
from twisted.internet.task import deferLater

from yurtcoord.kube.gvr import ENDPOINTS, LEASES
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION
from yurtcoord.sim.apiserver.requestlog import LoggedRequest
from yurtcoord.testing.invariants import (
    LeadershipChange, changes_per_minute, check_fencing, check_goes_stale, check_lease_age,
    check_single_delegator, delegated_writes, leadership_changes,
)
from yurtcoord.testing.partitionworld import CLOUD_HOST, LAN, WAN, PartitionWorld
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.world import (
    ELECTION_LEASE, ELECTION_NAMESPACE, NODE_LEASE_NAMESPACE, STORAGE_PREFIX, leader_of,
)

NODE_COUNT = 3
PODS_PER_NODE = 4
ENDPOINT_COUNT = 6
# The agents' timings (seconds): the fault suite's election (lease 3 s, renew deadline
# 2 s, retry 0.5 s), heartbeats every 3 s with attempts of up to 1 s, so that a loaded
# machine does not fail a probe that a quiet one passes.
LEASE_DURATION, RETRY_PERIOD = 3.0, 0.5
HEARTBEAT_INTERVAL = 3.0
KUBELET_GRACE = 6.0
TIMINGS = {"heartbeat": {"interval": "3s", "timeout": "1s", "failed_retry": "2"}}
# A takeover: the old lease runs out, and a candidate's next try takes it.
TAKEOVER = LEASE_DURATION + 2 * RETRY_PERIOD
# Slack for processes of a loaded 2-core machine that were not scheduled for a moment.
SLACK = 2.0
LIVE_LEASE_BOUND = 2 * HEARTBEAT_INTERVAL + TAKEOVER + SLACK
STALE_BOUND = KUBELET_GRACE + HEARTBEAT_INTERVAL + SLACK
# Through a rolling update no takeover is excused: two intervals and the slack.
ROLLOUT_LEASE_BOUND = 2 * HEARTBEAT_INTERVAL + SLACK
# How long a cut lasts: well past LIVE_LEASE_BOUND, so that a heartbeat path that does
# not work shows as a gap that breaks the bound.
CUT = 16.0
# How long a follower is cut off from the cloud before the leader's own cut, so that
# the leader is forwarding its heartbeats when it loses its link.
DELEGATING = 6.0
# Deadlines of a loaded machine (not bounds that are asserted).
START_TIMEOUT = 120.0
SETTLE_TIMEOUT = 90.0
EXACT_TIMEOUT = 90.0
# Role thrash under a flapping WAN: leadership changes per minute, pool-wide. The
# processes flap for half a minute, five cut-and-heal cycles: enough to show the wiring
# (cuts reach the agents, a cut leader steps down or rides the cut out, heartbeats
# keep flowing); the role logic under a flap of two minutes is proven on a Clock
# (yurtcoord/test/unit/test_flapping_clock.py).
FLAP_PERIOD, FLAP_DURATION = 3.0, 30.0
MAX_LEADERSHIP_CHANGES_PER_MINUTE = 1.0
# The agent of every scenario whose clock is off, and by how many seconds.
SKEWED_NODE, SKEW = "edge-2", 120.0


def endpoints(name: str, ip: str, namespace: str = "default") -> dict:
    """A pool-scoped object of the cloud that the leader mirrors into the pool etcd."""
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 80}]}]}


@attr.s(auto_attribs=True)
class Run:
    """What a script needs of a running scenario, and what it reports back.

    ``excused`` lists (start, end) windows in which no pool member could reach the
    cloud; ``notes`` are measured numbers printed after the run; ``problems`` are
    violations a script found itself (role thrash)."""

    world: PartitionWorld
    leader: str
    followers: List[str]
    dead: str
    excused: List[Tuple[float, float]] = attr.ib(factory=list)
    notes: Dict[str, object] = attr.ib(factory=dict)
    problems: List[str] = attr.ib(factory=list)
    # When the dead node's agent last started, if a script restarted it: the grace
    # period of a kubelet that has not answered counts from the agent's start.
    dead_restarted_at: Optional[float] = None

    def now(self) -> float:
        return self.world.reactor.seconds()

    def wait(self, seconds: float) -> defer.Deferred:
        """Let the scenario run for ``seconds`` (a cut's length, not a poll)."""
        return deferLater(self.world.reactor, seconds, lambda: None)

    def live_followers(self) -> List[str]:
        return [node for node in self.followers if node != self.dead]


@attr.s(auto_attribs=True)
class Scenario:
    """``script(run)`` cuts and heals links on a pool of ``nodes`` agents; the dead
    node is the last follower, and scripts aim at the others."""

    name: str
    script: Callable[[Run], defer.Deferred]
    description: str = ""
    nodes: int = NODE_COUNT

    def node_names(self) -> List[str]:
        return [f"edge-{index}" for index in range(1, self.nodes + 1)]


@attr.s(auto_attribs=True)
class Outcome:
    name: str
    problems: List[str]
    notes: Dict[str, object]


def _change_endpoints(world: PartitionWorld, round_name: str) -> None:
    """The cloud keeps changing: update two endpoints, delete one, add one."""
    store = world.servers()[0].store
    existing = sorted(store.list(ENDPOINTS), key=lambda o: o["metadata"]["name"])
    for obj in existing[:2]:
        obj["subsets"][0]["addresses"][0]["ip"] = f"10.2.0.{len(round_name)}"
        store.update(ENDPOINTS, obj)
    if len(existing) > 2:
        store.delete(ENDPOINTS, existing[2]["metadata"]["name"], "default")
    store.create(ENDPOINTS, endpoints(f"{round_name}-new", "10.3.0.1"))


def _one_leader(nodes: List[str]) -> Callable[[dict], bool]:
    """Exactly one leader among ``nodes``, the others followers, all ready."""
    def predicate(statuses):
        chosen = {node: statuses.get(node) for node in nodes}
        if None in chosen.values():
            return False
        roles = sorted(s["role"] for s in chosen.values())
        return (roles == ["follower"] * (len(nodes) - 1) + ["leader"]
                and all(s["ready"] for s in chosen.values()))
    return predicate


@defer.inlineCallbacks
def run_scenario(reactor: Any, scenario: Scenario,
                 name_prefix: str = "") -> Generator[defer.Deferred[Any], Any, Outcome]:
    """Run one scenario on a topology of its own and judge it; never raises (a setup
    failure is reported as a problem), and always removes what it made."""
    # Each agent is its node on the coordinator (TLS, the Node-restricted leases), as
    # in a production pool.
    world = PartitionWorld(reactor, f"{name_prefix}{scenario.name}",
                           kubelet_grace_period=f"{KUBELET_GRACE:g}s", timings=TIMINGS,
                           identities=True)
    problems: List[str] = []
    notes: Dict[str, object] = {}
    try:
        yield world.start()
        for index in range(ENDPOINT_COUNT):
            world.servers()[0].store.create(ENDPOINTS,
                                            endpoints(f"svc-{index}", f"10.1.0.{index}"))
        nodes = scenario.node_names()
        for node in nodes:
            yield world.add_agent(node, pods=PODS_PER_NODE,
                                  clock_offset=SKEW if node == SKEWED_NODE else 0.0)
        notes["skewed"] = f"{SKEWED_NODE}:{SKEW:+g}s"
        yield world.start_agents()
        statuses = yield world.wait_for_pool("one leader, all ready", _one_leader(nodes),
                                             START_TIMEOUT)
        leader = leader_of(statuses)
        if leader is None:
            raise AssertionError("the pool had a leader a moment ago and has none now")
        followers = sorted(node for node in nodes if node != leader)
        # The dead node: a follower the script does not aim at.
        dead = followers[-1]
        run = Run(world, leader, followers, dead, notes=notes)
        started = run.now()
        yield world.stop_kubelet(dead)
        stopped_at = run.now()
        # The dead node's agent stops its heartbeats once the kubelet grace ran out and
        # turns pending; the cuts start after that, so that the leadership changes of a
        # scenario are the cuts' and not the dead node's.
        yield world.wait_for_pool(f"{dead} pending after its kubelet stopped",
                                  lambda statuses: statuses[dead]["role"] == "pending",
                                  SETTLE_TIMEOUT)
        reactor.callLater(CUT / 3, _change_endpoints, world, "during")
        yield scenario.script(run)
        healed = run.now()
        _change_endpoints(world, "after")
        live = [leader] + run.live_followers()
        yield world.wait_for_pool("one leader among the live agents, all ready",
                                  _one_leader(live), SETTLE_TIMEOUT)
        yield world.wait_pool_exact(EXACT_TIMEOUT)
        # Watch long enough that a lease that should be stale has had time to move, and
        # that the nodes' leases ran their bound after the heal.
        dead_since = max(stopped_at, run.dead_restarted_at or stopped_at)
        end_at = max(dead_since + STALE_BOUND, healed + LIVE_LEASE_BOUND) + HEARTBEAT_INTERVAL
        if run.now() < end_at:
            yield run.wait(end_at - run.now())
        end = run.now()
        problems += run.problems
        if run.dead_restarted_at is not None:
            stopped_at = max(stopped_at, run.dead_restarted_at)
        problems += judge(world, run, started, stopped_at, end)
        settled = yield world.statuses()
        problems += yield check_leases_in_etcd(world, leader_of(settled))
        problems += crashes(world)
        notes.update(measure(world, run, started, end))
    except PollTimeout as e:
        problems.append(f"did not settle: {e}")
    except Exception as e:  # a broken setup is a finding, reported with the others
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        try:
            yield world.stop()
        except Exception as e:
            problems.append(f"stopping the world failed: {type(e).__name__}: {e}")
    return Outcome(scenario.name, problems, notes)


def judge(world: PartitionWorld, run: Run, started: float, stopped_at: float,
          end: float) -> List[str]:
    """Every invariant of the module docstring, from the servers' request logs."""
    cloud, coordinator = world.servers()
    return judge_request_logs(cloud.request_log, coordinator.request_log,
                              world.node_of_address, [run.leader] + run.live_followers(),
                              run.dead, started, stopped_at, end, run.excused)


def judge_request_logs(cloud_log: Sequence[LoggedRequest],
                       coordinator_log: Sequence[LoggedRequest],
                       node_of_address: Mapping[str, str], live: Sequence[str], dead: str,
                       started: float, stopped_at: float, end: float,
                       excused: Sequence[Tuple[float, float]] = ()) -> List[str]:
    """The invariants of the module docstring that the request logs of the cloud and
    the coordinator apiserver decide, over [``started``, ``end``]: one delegator at a
    time, fencing, the ``live`` nodes' cloud leases never older than
    ``LIVE_LEASE_BOUND`` outside the ``excused`` windows, and the ``dead`` node, whose
    kubelet stopped at ``stopped_at``, stale within ``STALE_BOUND``. Whoever keeps such
    logs is judged alike: the API test servers of a scenario, or the fake links of a
    pool on a ``Clock``."""
    problems = check_delegators(cloud_log, coordinator_log, node_of_address)
    for node in live:
        problems += check_lease_age(cloud_log, node, started, end, LIVE_LEASE_BOUND,
                                    excused)
    problems += check_goes_stale(cloud_log, dead, stopped_at, STALE_BOUND, end)
    return problems


def check_delegators(cloud_log: Sequence[LoggedRequest],
                     coordinator_log: Sequence[LoggedRequest],
                     node_of_address: Mapping[str, str]) -> List[str]:
    """Who forwarded heartbeats to the cloud: one delegator at a time, and only under
    a term of the pool's election lease (fencing); every judge of a pool's run starts
    with these two."""
    return (check_single_delegator(cloud_log, coordinator_log, node_of_address,
                                   ELECTION_NAMESPACE, ELECTION_LEASE, LEASE_DURATION)
            + check_fencing(cloud_log, coordinator_log, node_of_address,
                            ELECTION_NAMESPACE, ELECTION_LEASE))


def leadership_changes_allowed(seconds: float) -> int:
    """How many leadership changes a flap of ``seconds`` may cause:
    ``MAX_LEADERSHIP_CHANGES_PER_MINUTE`` over the flap, and never less than one. A
    leader that loses the cloud in a cut steps down and stays a follower, since the
    new leader keeps the lease: one change, which is no thrash however short the flap.
    Over two minutes this is the rate bound itself (two changes)."""
    return max(1, math.floor(MAX_LEADERSHIP_CHANGES_PER_MINUTE * seconds / 60.0 + 1e-9))


def role_thrash(changes: Sequence[LeadershipChange], began: float,
                end: float) -> Optional[str]:
    """The problem with the leadership ``changes`` of a flap over [``began``, ``end``]
    when there are more than ``leadership_changes_allowed``; None otherwise."""
    allowed = leadership_changes_allowed(end - began)
    if len(changes) <= allowed:
        return None
    rate = changes_per_minute(changes, began, end)
    return (f"role thrash: {len(changes)} leadership changes in {end - began:.0f} s "
            f"({rate:.2f}/min; at most {allowed}, {MAX_LEADERSHIP_CHANGES_PER_MINUTE}/min "
            f"and never less than one): {list(changes)}")


def lease_key(namespace: str, name: str) -> str:
    """The pool etcd key of a Lease, as kube-apiserver names it under the agents' prefix."""
    return f"{STORAGE_PREFIX}/leases/{namespace}/{name}"


@defer.inlineCallbacks
def check_leases_in_etcd(world: PartitionWorld, leader: Optional[str],
                         ) -> Generator[defer.Deferred[Any], Any, List[str]]:
    """The leases the agents wrote through the coordinator apiserver are the pool etcd's:
    each, as the coordinator serves it over HTTP, is the value of its kube-apiserver
    key at the revision it reports as its resourceVersion, that revision is the key's
    mod revision (read with ``etcdctl``), and its holder is the pool's ``leader`` (the
    election lease) or the node (a node lease)."""
    problems: List[str] = []
    wanted = [(ELECTION_NAMESPACE, ELECTION_LEASE, leader)] + [
        (NODE_LEASE_NAMESPACE, node, node) for node in sorted(world.agents)]
    for namespace, name, holder in wanted:
        key = lease_key(namespace, name)
        served = yield world.served_object(LEASES, name, namespace)
        if served is None:
            problems.append(f"{key}: the coordinator serves no lease {namespace}/{name}")
            continue
        revision = int(served["metadata"]["resourceVersion"])
        stored = yield world.read_etcd_revisions(key)
        if key not in stored:
            problems.append(f"{key}: served at resourceVersion {revision}, not in the pool "
                            f"etcd")
            continue
        if stored[key][1] > revision:
            # Renewed since it was served: the value it had then.
            stored = yield world.read_etcd_revisions(key, revision=revision)
        value, mod_revision = stored.get(key, (b"{}", None))
        lease = json.loads(value)
        if mod_revision != revision:
            problems.append(f"{key}: served at resourceVersion {revision}, mod revision "
                            f"{mod_revision} in the pool etcd")
        if lease.get("spec") != served.get("spec"):
            problems.append(f"{key}: served spec {served.get('spec')} differs from the pool "
                            f"etcd's {lease.get('spec')}")
        if lease.get("spec", {}).get("holderIdentity") != holder:
            problems.append(f"{key}: held by {lease.get('spec', {}).get('holderIdentity')!r} "
                            f"in the pool etcd, not by {holder!r}")
    return problems


@defer.inlineCallbacks
def delegation_in_etcd(world: PartitionWorld, node: str,
                       ) -> Generator[defer.Deferred[Any], Any, Optional[str]]:
    """The delegate-heartbeat annotation of ``node``'s lease in the pool etcd (None
    without lease or annotation), read with ``etcdctl``."""
    key = lease_key(NODE_LEASE_NAMESPACE, node)
    stored = yield world.read_etcd(key)
    if key not in stored:
        return None
    annotations = json.loads(stored[key]).get("metadata", {}).get("annotations") or {}
    return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION)


def crashes(world: PartitionWorld) -> List[str]:
    """Agents that exited, or logged a traceback or a critical event (what the agents
    log for an error they did not expect): nothing a partition does may crash one."""
    problems = []
    for node, agent in sorted(world.agents.items()):
        if not agent.running:
            problems.append(f"{node} exited with {agent.exit_code}\n{agent.log_tail()}")
        lines = agent.log_text().splitlines()
        for index, line in enumerate(lines):
            if ("Traceback (most recent call last)" in line or "Unhandled Error" in line
                    or "#critical]" in line):
                # The event before it, and the traceback up to its exception line.
                last = index + 1
                while last < len(lines) and lines[last].startswith(("\t", " ")):
                    last += 1
                problems.append(f"{node} logged a traceback:\n"
                                + "\n".join(lines[max(0, index - 2):last + 1]))
                break
    return problems


def measure(world: PartitionWorld, run: Run, started: float, end: float) -> Dict[str, object]:
    """Numbers printed after a run, from the same request logs: leadership changes,
    who delegated how often, the longest gap between cloud writes of each live node's
    lease, the takeover after the first cut, and the margin between a former leader's
    last delegated write and its successor's first election write."""
    changes = [c for c in leadership_changes(world.servers()[1].request_log,
                                             ELECTION_NAMESPACE, ELECTION_LEASE)
               if c.at >= started]
    delegated = delegated_writes(world.servers()[0].request_log, world.node_of_address)
    writers: Dict[str, int] = {}
    for write in delegated:
        writers[write.writer] = writers.get(write.writer, 0) + 1
    notes: Dict[str, object] = {
        "leadership_changes": len(changes),
        "changes_per_minute": round(changes_per_minute(changes, started, end), 2),
        "delegated_writes": json.dumps(writers, sort_keys=True),
    }
    for node in [run.leader] + run.live_followers():
        writes = [r.at for r in world.servers()[0].request_log
                  if r.is_lease_write and r.succeeded and r.name == node
                  and r.namespace == NODE_LEASE_NAMESPACE and started <= r.at <= end]
        edges = [started] + writes + [end]
        notes[f"longest_gap_{node}"] = round(max(b - a for a, b in zip(edges, edges[1:])), 2)
    cuts = [event.at for event in world.topology.events if event.action == "cut"]
    for change in changes:
        before = [at for at in cuts if at <= change.at]
        if before:
            # The first change after a cut: how long the pool was without a leader.
            notes["takeover_after_cut"] = round(change.at - max(before), 2)
            break
    margins = []
    for change in changes:
        before = [w.at for w in delegated
                  if w.writer == change.previous_holder and w.at < change.at]
        if before:
            margins.append(change.at - max(before))
    if margins:
        notes["fencing_margin"] = round(min(margins), 2)
    return notes


# -- the scripts ---------------------------------------------------------------------


def cut_for(host_of: Callable[[Run], List[str]], network: str, direction: str = "both",
            excused: bool = False) -> Callable[[Run], defer.Deferred]:
    """A script: cut ``network`` of the hosts ``host_of(run)`` names for ``CUT`` seconds,
    then heal; with ``excused`` the cut leaves no pool member a way to the cloud."""
    @defer.inlineCallbacks
    def script(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
        hosts = host_of(run)
        began = run.now()
        for host in hosts:
            run.world.cut(host, network, direction)
        yield run.wait(CUT)
        for host in hosts:
            run.world.heal(host, network)
        if excused:
            run.excused.append((began, run.now()))
    return script


def delegating_follower(network: str = WAN) -> Callable[[Run], defer.Deferred]:
    """A script: one follower's ``network`` is cut for ``CUT`` seconds; within the cut,
    the delegate-heartbeat annotation it writes through the coordinator apiserver (over
    the LAN) must show in its lease in the pool etcd, and be gone again after the heal."""
    @defer.inlineCallbacks
    def script(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
        follower = run.live_followers()[0]
        began = run.now()
        run.world.cut(follower, network)

        @defer.inlineCallbacks
        def delegating() -> Generator[defer.Deferred[Any], Any, bool]:
            return (yield delegation_in_etcd(run.world, follower)) == "true"

        try:
            yield poll_until(delegating, CUT, 0.25, run.world.reactor,
                             what=f"{follower}'s delegation in the pool etcd")
            run.notes["delegation_in_etcd_after"] = round(run.now() - began, 2)
        except PollTimeout as e:
            run.problems.append(f"{e}: {follower} was cut from the cloud and its lease in "
                                f"the pool etcd never asked for delegation")
        if run.now() < began + CUT:
            yield run.wait(began + CUT - run.now())
        run.world.heal(follower, network)

        @defer.inlineCallbacks
        def withdrawn() -> Generator[defer.Deferred[Any], Any, bool]:
            return (yield delegation_in_etcd(run.world, follower)) != "true"

        try:
            yield poll_until(withdrawn, SETTLE_TIMEOUT, 0.25, run.world.reactor,
                             what=f"{follower}'s delegation withdrawn in the pool etcd")
        except PollTimeout as e:
            run.problems.append(f"{e}: {follower}'s cloud link healed and its lease in the "
                                f"pool etcd still asks for delegation")
    return script


def leader_cut_while_delegating(network: str,
                                direction: str = "both") -> Callable[[Run], defer.Deferred]:
    """A script: one follower loses the cloud, so the leader forwards its heartbeat;
    then the leader's ``network`` is cut (``direction``) for ``CUT`` seconds while it
    is doing so, and another agent must take over, with no overlap."""
    @defer.inlineCallbacks
    def script(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
        cut_off = run.live_followers()[0]
        run.world.cut(cut_off, WAN)
        yield run.wait(DELEGATING)
        run.world.cut(run.leader, network, direction)
        yield run.wait(CUT)
        run.world.heal(run.leader, network)
        run.world.heal(cut_off, WAN)
    return script


def flapping(host_of: Callable[[Run], List[str]], network: str) -> Callable[[Run], defer.Deferred]:
    """A script: the link flaps every ``FLAP_PERIOD`` seconds for ``FLAP_DURATION``."""
    @defer.inlineCallbacks
    def script(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
        (host,) = host_of(run)

        began = run.now()
        yield run.world.topology.flap(host, network, FLAP_PERIOD, FLAP_DURATION)
        changes = [c for c in leadership_changes(run.world.servers()[1].request_log,
                                                 ELECTION_NAMESPACE, ELECTION_LEASE)
                   if c.at >= began]
        run.notes["flap_leadership_changes"] = len(changes)
        problem = role_thrash(changes, began, run.now())
        if problem is not None:
            run.problems.append(problem)
    return script


def _ready(node: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether ``node``'s agent reports ready in the pool's statuses."""
    def predicate(statuses: Mapping[str, Any]) -> bool:
        return bool((statuses.get(node) or {}).get("ready"))
    return predicate


def rolling_update(cut_count: int = 2) -> Callable[[Run], defer.Deferred]:
    """A script: a DaemonSet's rolling update while ``cut_count`` followers are cut off
    from the cloud. Every agent, the leader included, is stopped (SIGTERM) and started
    again, one at a time in node order, and each new agent is ready (the dead node's:
    listening) before the next one stops. A follower's restart changes no leadership,
    the leader's at most once; the invariants judged after the run (one delegator, the
    live nodes' cloud leases, the pool etcd exact) get no excused window for any
    restart. The dead node's agent, restarted too, counts its kubelet's grace period
    from its new start, as every agent does (``KubeletHealthChecker``)."""
    @defer.inlineCallbacks
    def script(run: Run) -> Generator[defer.Deferred[Any], Any, None]:
        world = run.world
        cut_off = run.live_followers()[:cut_count]
        for node in cut_off:
            world.cut(node, WAN)
        yield run.wait(DELEGATING)
        restarts: List[Tuple[str, float, bool]] = []
        for node in sorted(world.agents):
            statuses = yield world.statuses()
            began = run.now()
            restarts.append((node, began, leader_of(statuses) == node))
            yield world.agents[node].stop()
            yield world.start_agents([node])
            if node == run.dead:
                run.dead_restarted_at = run.now()
            else:
                yield world.wait_for_pool(f"{node} ready again after its restart",
                                          _ready(node), SETTLE_TIMEOUT)
        ended = run.now()
        for node in cut_off:
            world.heal(node, WAN)
        changes = leadership_changes(world.servers()[1].request_log, ELECTION_NAMESPACE,
                                     ELECTION_LEASE)
        ends = [began for _node, began, _leading in restarts[1:]] + [ended]
        for (node, began, leading), until in zip(restarts, ends):
            within = [change for change in changes if began <= change.at < until]
            if len(within) > (1 if leading else 0):
                run.problems.append(
                    f"restart of {node} ({'the leader' if leading else 'a follower'}) "
                    f"changed the leadership {len(within)} times: {within}")
        # Through the rollout every live node's cloud lease moves at least every two
        # heartbeat intervals (a loaded machine's slack aside), the leader's restart
        # included: the pool's tighter bound, not the partition suite's takeover one.
        cloud_log = world.servers()[0].request_log
        for node in [run.leader] + run.live_followers():
            run.problems.extend(check_lease_age(cloud_log, node, restarts[0][1], ended,
                                                ROLLOUT_LEASE_BOUND))
        run.notes["restarts"] = len(restarts)
        run.notes["rollout_s"] = round(ended - restarts[0][1], 1)
        run.notes["restart_leadership_changes"] = len(
            [c for c in changes if restarts[0][1] <= c.at < ended])
    return script


def _leader(run: Run) -> List[str]:
    return [run.leader]


def _follower(run: Run) -> List[str]:
    return [run.live_followers()[0]]


def _every_agent(run: Run) -> List[str]:
    return list(run.world.agents)


def _cloud(run: Run) -> List[str]:
    return [CLOUD_HOST]


WAN_SCENARIOS = [
    Scenario("follower-wan", delegating_follower(WAN),
             "one follower loses the cloud and asks for delegation in the pool etcd; the "
             "leader carries its heartbeat"),
    Scenario("leader-wan", cut_for(_leader, WAN),
             "the leader loses the cloud; another agent takes over and carries its heartbeat"),
    Scenario("every-wan", cut_for(_every_agent, WAN, excused=True),
             "the pool alone: no agent reaches the cloud"),
    Scenario("cloud-down", cut_for(_cloud, WAN, excused=True),
             "the cloud itself is unreachable"),
]
LAN_SCENARIOS = [
    Scenario("follower-lan", cut_for(_follower, LAN),
             "one agent reaches the cloud but not its pool"),
    # Four agents: the leader, the follower it forwards for, the one that takes over,
    # and the dead node.
    Scenario("leader-lan", leader_cut_while_delegating(LAN),
             "fencing: the leader still reaches the cloud but loses the election lease "
             "while it forwards a cut-off follower's heartbeat", nodes=4),
    Scenario("leader-wan-in", leader_cut_while_delegating(WAN, direction="in"),
             "one way: the leader's requests reach the cloud, no answer comes back, while "
             "it forwards a cut-off follower's heartbeat", nodes=4),
    Scenario("etcd-lan", cut_for(lambda run: ["etcd-1"], LAN),
             "the pool etcd member is cut from the pool"),
]
FLAP_SCENARIO = Scenario("leader-wan-flaps", flapping(_leader, WAN),
                         "the leader's WAN flaps every 3 s for half a minute")
# Six agents: the leader, two followers cut off from the cloud, two others and the
# dead node.
ROLLING_UPDATE_SCENARIO = Scenario(
    "rolling-update", rolling_update(),
    "every agent restarted one at a time, the leader included, while two followers are "
    "cut off from the cloud", nodes=6)
