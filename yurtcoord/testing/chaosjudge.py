"""How a chaos run is judged: the partition suite's invariants over the whole run, and
which stretches of it the faults excuse.

A chaos run (``yurtcoord.testing.chaos``) records when each fault took effect on the
test's reactor clock, the clock of the cloud's request log (``Timeline``: when an
agent went down and listened again, when a kubelet stopped and started, and the
link cuts and heals that ``netns.Topology.events`` recorded, a flap being many of
them). ``judge_chaos`` then applies the partition suite's invariants
(``yurtcoord.testing.invariants``, with ``partitions``' bounds) to the request logs
of the cloud and of both coordinator apiservers (one log, in time order: the
election lease is one object whichever server a write went through) over the whole
run, from the first fault to the end of the settle time:

1. One delegator, and fencing (``check_single_delegator``, ``check_fencing``): no
   excuse, ever. Two agents writing other nodes' heartbeats at once is wrong whatever
   failed.
2. Live leases (``check_lease_age`` with ``partitions.LIVE_LEASE_BOUND``: two
   heartbeat intervals, a leader takeover and the slack of a loaded machine). The
   bound is the partition suite's; what a fault excuses follows from what "live" and
   "a path to the cloud" mean there, never from what a run happened to show. Node N
   is excused at instant t (``excused_at``) when

   a. N's agent is down: from the signal that ended it (SIGKILL, or the SIGTERM of a
      rolling restart) until its new process listens. An agent that does not run
      heartbeats nothing, and nothing else may heartbeat for it; its node is not live;
   b. N's kubelet is stopped: from its stop until its start. The node is not live: it
      must go stale instead (rule 3);
   c. N has no path to the cloud: N's WAN link is cut, and either N's LAN link is cut
      too (its own heartbeat and the delegation both need a link) or no other agent
      could delegate for it, i.e. no other agent whose process runs, whose kubelet
      runs, and whose WAN and LAN links are both up. This is the partition suite's
      "no pool member can reach the cloud" excuse, taken per node.

   As in the partition suite, an excused window (t0, t1) lets the lease be older
   than the bound until t1 + the bound: once the fault ends, the node has one bound
   to be renewed again (an agent that listens again heartbeats at once; a leader's
   takeover is inside the bound). Nothing else is excused: an etcd member's or a
   coordinator apiserver's outage, a leader's death or a rolling restart must be
   ridden out within the bound, since the pool keeps a quorum of etcd, one
   coordinator apiserver and a candidate for leader through each of them.
3. Stale leases (``check_goes_stale`` with ``partitions.STALE_BOUND``: the kubelet
   grace period, an interval and the slack): while N's kubelet is stopped, N's cloud
   lease is not renewed (by anyone) later than the bound after the stop. A new agent
   of N started within the stop counts the kubelet's grace period from its own start
   (as ``KubeletHealthChecker`` does), which the test knows only to lie between the
   new process's spawn and the moment it was seen listening: from its spawn on, the
   bound counts from that moment (the latest it can have started), and what it
   renewed before then is its own grace's.
4. Nothing uploaded lost and the pool etcd exact against the cloud at the end, after
   a settle time (``ProcessWorld.pool_problems``), and no agent traceback or exit
   (``partitions.crashes``): judged by the run itself, not here.
"""

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attr

from yurtcoord.sim.apiserver.requestlog import LoggedRequest
from yurtcoord.testing.invariants import check_goes_stale, check_lease_age
from yurtcoord.testing.netns import LinkEvent
from yurtcoord.testing.partitionworld import LAN, WAN
from yurtcoord.testing.partitions import LIVE_LEASE_BOUND, STALE_BOUND, check_delegators

Window = Tuple[float, float]


@attr.s(auto_attribs=True)
class Timeline:
    """When the faults of a run took effect, on the reactor's clock: ``agent_down``
    and ``kubelet_down`` are windows per node, ``agent_restarts`` (spawned, seen
    listening) of each new agent of a node, ``link_cut`` windows per (host,
    network)."""

    agent_down: Dict[str, List[Window]] = attr.ib(factory=dict)
    agent_restarts: Dict[str, List[Window]] = attr.ib(factory=dict)
    kubelet_down: Dict[str, List[Window]] = attr.ib(factory=dict)
    link_cut: Dict[Tuple[str, str], List[Window]] = attr.ib(factory=dict)

    def add_links(self, events: Iterable[LinkEvent], end: float) -> None:
        """The cut windows of the topology's link ``events`` (a cut still in force
        ends at ``end``)."""
        opened: Dict[Tuple[str, str], float] = {}
        for event in sorted(events, key=lambda e: e.at):
            link = (event.host, event.network)
            if event.action == "cut":
                opened.setdefault(link, event.at)
            elif event.action == "heal" and link in opened:
                self.link_cut.setdefault(link, []).append((opened.pop(link), event.at))
        for link, began in opened.items():
            self.link_cut.setdefault(link, []).append((began, end))


def _within(windows: Optional[Sequence[Window]], at: float) -> bool:
    return any(start <= at < end for start, end in windows or ())


def could_delegate(timeline: Timeline, node: str, at: float) -> bool:
    """``node``'s agent could carry another node's heartbeat at ``at``: it runs, its
    kubelet runs, its WAN and LAN links are up (rule 2c)."""
    return not (_within(timeline.agent_down.get(node), at)
                or _within(timeline.kubelet_down.get(node), at)
                or _within(timeline.link_cut.get((node, WAN)), at)
                or _within(timeline.link_cut.get((node, LAN)), at))


def excused_at(timeline: Timeline, nodes: Sequence[str], node: str, at: float) -> bool:
    """Rule 2 of the module docstring: ``node``'s lease may be older than the bound at
    ``at`` (a, b or c)."""
    if _within(timeline.agent_down.get(node), at):
        return True
    if _within(timeline.kubelet_down.get(node), at):
        return True
    if not _within(timeline.link_cut.get((node, WAN)), at):
        return False
    if _within(timeline.link_cut.get((node, LAN)), at):
        return True
    return not any(could_delegate(timeline, other, at) for other in nodes if other != node)


def excused_windows(timeline: Timeline, nodes: Sequence[str], node: str, start: float,
                    end: float) -> List[Window]:
    """The maximal windows of [start, end] in which ``excused_at`` holds for ``node``:
    the timeline's state changes only at its windows' edges, so it is decided once
    between each two edges."""
    edges = {start, end}
    for windows in [*timeline.agent_down.values(), *timeline.kubelet_down.values(),
                    *timeline.link_cut.values()]:
        for low, high in windows:
            edges.update(edge for edge in (low, high) if start < edge < end)
    points = sorted(edges)
    found: List[Window] = []
    for low, high in zip(points, points[1:]):
        if not excused_at(timeline, nodes, node, (low + high) / 2):
            continue
        if found and found[-1][1] == low:
            found[-1] = (found[-1][0], high)
        else:
            found.append((low, high))
    return found


def stale_spans(timeline: Timeline, node: str) -> List[Window]:
    """Rule 3: (from, until) spans in each of which ``node``'s lease must not be
    renewed later than ``STALE_BOUND`` after ``from``: a kubelet stop, split where a
    new agent of the node was spawned within it (the span before it ends there), the
    next span counted from when that agent was seen listening."""
    spans = []
    restarts = sorted(timeline.agent_restarts.get(node, []))
    for stopped, started in timeline.kubelet_down.get(node, []):
        since = stopped
        for spawned, listening in restarts:
            if listening <= stopped or spawned >= started:
                continue
            until = max(stopped, spawned)
            if until > since:
                spans.append((since, until))
            since = max(since, listening)
        if started > since:
            spans.append((since, started))
    return spans


def judge_chaos(cloud_log: Sequence[LoggedRequest], coordinator_log: Sequence[LoggedRequest],
                node_of_address: Mapping[str, str], nodes: Sequence[str],
                timeline: Timeline, start: float, end: float) -> List[str]:
    """Rules 1 to 3 of the module docstring over [``start``, ``end``]; each problem
    names the records at fault (and for rule 2 the windows it excused)."""
    problems = check_delegators(cloud_log, coordinator_log, node_of_address)
    for node in nodes:
        problems += check_lease_age(cloud_log, node, start, end, LIVE_LEASE_BOUND,
                                    excused_windows(timeline, nodes, node, start, end))
        for since, until in stale_spans(timeline, node):
            problems += check_goes_stale(cloud_log, node, since, STALE_BOUND, until)
    return problems
