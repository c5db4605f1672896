"""The seeded schedule of a chaos run: which fault starts when, on what, for how long.

A chaos run (``yurtcoord.testing.chaos``) overlaps faults on one pool; which ones is
decided here, before any process starts, by ``chaos_schedule(seed, minutes, nodes)``:
a pure function of its arguments (its only randomness is ``random.Random(seed)``), so
the same seed replays the same schedule, and a failing run is replayed by its seed.

Every kind of fault (``FAULT_KINDS``) is placed at least once, in an order drawn from
its seed, before the rest are drawn by weight. A fault holds the resources it
disturbs from its start until its end plus the time its target takes to recover
(``RECOVERY``), and a fault is placed only on a target whose resources are free, so
that:

- one agent's process, kubelet, WAN link and LAN link each take one fault at a time
  (a WAN cut and a LAN cut of one host may overlap: the host is then isolated);
- at most one pool etcd member is down at once (the cluster of three keeps its
  quorum), and at most one coordinator apiserver (the agents are given both);
- a rolling restart holds every agent's process, so no agent is killed while the
  DaemonSet replaces the agents one at a time.

Every fault ends within the run's minutes (a drawn duration is cut to fit, or the
fault is dropped if what is left is shorter than its kind's shortest). The executor
holds the same resources with locks, so a fault that starts late (its target
recovered slowly) is delayed rather than overlapped.
"""

import random
from typing import Dict, List, NamedTuple, Sequence, Tuple

AGENT_KILL = "agent-kill"
ETCD_KILL = "etcd-kill"
COORDINATOR_KILL = "coordinator-kill"
WAN_CUT = "wan-cut"
LAN_CUT = "lan-cut"
WAN_FLAP = "wan-flap"
LAN_FLAP = "lan-flap"
KUBELET_STOP = "kubelet-stop"
ROLLING_RESTART = "rolling-restart"
FAULT_KINDS: Tuple[str, ...] = (AGENT_KILL, ETCD_KILL, COORDINATOR_KILL, WAN_CUT, LAN_CUT,
                                WAN_FLAP, LAN_FLAP, KUBELET_STOP, ROLLING_RESTART)
# How often each kind is drawn once every kind was placed.
WEIGHTS: Dict[str, float] = {
    AGENT_KILL: 3, ETCD_KILL: 2, COORDINATOR_KILL: 2, WAN_CUT: 3, LAN_CUT: 2,
    WAN_FLAP: 1, LAN_FLAP: 1, KUBELET_STOP: 2, ROLLING_RESTART: 0.5,
}
# Seconds a fault lasts (drawn uniformly): how long a process stays down, a link cut
# or flapping, a kubelet stopped. A kubelet stop may outlast the agents' stale bound
# (kubelet grace period 6 s plus an interval) or not.
DURATIONS: Dict[str, Tuple[float, float]] = {
    AGENT_KILL: (1.0, 6.0), ETCD_KILL: (2.0, 10.0), COORDINATOR_KILL: (2.0, 10.0),
    WAN_CUT: (5.0, 20.0), LAN_CUT: (5.0, 20.0), WAN_FLAP: (12.0, 24.0),
    LAN_FLAP: (12.0, 24.0), KUBELET_STOP: (6.0, 24.0),
}
# A rolling restart lasts this much per agent (stop, start, ready), as planned; the
# executor takes as long as the agents do.
ROLL_STEP = 8.0
# Seconds after a fault's end that its resources stay held: a process's start (an
# agent, or an etcd member catching up with the cluster), a link's reconnections.
RECOVERY: Dict[str, float] = {
    AGENT_KILL: 5.0, ETCD_KILL: 10.0, COORDINATOR_KILL: 3.0, WAN_CUT: 2.0, LAN_CUT: 2.0,
    WAN_FLAP: 2.0, LAN_FLAP: 2.0, KUBELET_STOP: 2.0, ROLLING_RESTART: 5.0,
}
# Seconds between the starts of two faults (drawn uniformly), and of the first.
GAP = (3.0, 8.0)
FIRST_AT = 2.0
# A flap cuts and heals its link every FLAP_PERIOD seconds.
FLAP_PERIOD = 3.0
ETCD_TARGET, COORDINATOR_TARGET, POOL_TARGET = "member-", "coordinator-", "pool"


class Fault(NamedTuple):
    """``kind`` on ``target`` from ``at`` seconds after the faults begin, for
    ``duration`` seconds (a rolling restart: as planned). ``target`` is a node name,
    ``member-<i>`` (the pool etcd member of index i), ``coordinator-<i>`` or
    ``pool`` (a rolling restart)."""

    at: float
    kind: str
    target: str
    duration: float

    def end(self) -> float:
        return self.at + self.duration

    def describe(self) -> str:
        return f"t+{self.at:6.1f}s {self.kind:<16} {self.target:<13} for {self.duration:4.1f}s"


def member_index(target: str) -> int:
    """The index in a ``member-<i>`` or ``coordinator-<i>`` target."""
    return int(target.rsplit("-", 1)[1])


def resources(kind: str, target: str, nodes: Sequence[str]) -> List[str]:
    """What a fault holds: see the module docstring."""
    if kind in (AGENT_KILL,):
        return [f"agent:{target}"]
    if kind == ROLLING_RESTART:
        return [f"agent:{node}" for node in nodes]
    if kind == ETCD_KILL:
        return ["etcd"]
    if kind == COORDINATOR_KILL:
        return ["coordinator"]
    if kind in (WAN_CUT, WAN_FLAP):
        return [f"wan:{target}"]
    if kind in (LAN_CUT, LAN_FLAP):
        return [f"lan:{target}"]
    if kind == KUBELET_STOP:
        return [f"kubelet:{target}"]
    raise ValueError(f"no such fault kind {kind!r}")


def _targets(kind: str, nodes: Sequence[str], etcd_members: int,
             coordinators: int) -> List[str]:
    if kind == ETCD_KILL:
        return [f"{ETCD_TARGET}{index}" for index in range(etcd_members)]
    if kind == COORDINATOR_KILL:
        return [f"{COORDINATOR_TARGET}{index}" for index in range(coordinators)]
    if kind == ROLLING_RESTART:
        return [POOL_TARGET]
    return list(nodes)


def chaos_schedule(seed: int, minutes: float, nodes: Sequence[str], etcd_members: int = 3,
                   coordinators: int = 2) -> List[Fault]:
    """The faults of a run of ``minutes`` on a pool of ``nodes`` (each an agent with
    its kubelet, WAN and LAN links), ``etcd_members`` pool etcd members and
    ``coordinators`` coordinator apiservers, in order of start; see the module
    docstring. The same arguments give the same list."""
    if not minutes > 0:
        raise ValueError(f"a chaos run needs a positive number of minutes, not {minutes!r}")
    if len(nodes) < 2 or etcd_members < 3 or coordinators < 2:
        raise ValueError("a chaos run needs two agents, three etcd members and two "
                         "coordinator apiservers: one of each may be down")
    rng = random.Random(seed)
    span = minutes * 60.0
    ordered = sorted(nodes)
    # Each kind once, in an order drawn from its seed; then drawn by weight.
    pending = list(FAULT_KINDS)
    rng.shuffle(pending)
    kinds = sorted(WEIGHTS)
    weights = [WEIGHTS[kind] for kind in kinds]
    free_at: Dict[str, float] = {}
    faults: List[Fault] = []
    at = FIRST_AT
    while at < span:
        # The first kind not placed yet that fits now, else one drawn by weight.
        choices = pending + rng.choices(kinds, weights)
        for kind in choices:
            if kind == ROLLING_RESTART:
                low = high = ROLL_STEP * len(ordered)
            else:
                low, high = DURATIONS[kind]
            duration = min(rng.uniform(low, high), span - at)
            free = [target for target in _targets(kind, ordered, etcd_members, coordinators)
                    if all(free_at.get(resource, 0.0) <= at
                           for resource in resources(kind, target, ordered))]
            if duration >= low and free:
                target = rng.choice(free)
                for resource in resources(kind, target, ordered):
                    free_at[resource] = at + duration + RECOVERY[kind]
                faults.append(Fault(round(at, 3), kind, target, round(duration, 3)))
                if kind in pending:
                    pending.remove(kind)
                break
        at += rng.uniform(*GAP)
    return faults


def fault_counts(faults: Sequence[Fault]) -> Dict[str, int]:
    """How many faults of each kind (every kind named, zero included)."""
    counts = {kind: 0 for kind in FAULT_KINDS}
    for fault in faults:
        counts[fault.kind] += 1
    return counts
