"""Invariants of a pool's run, judged from the API test servers' request logs.

An agent's own logs and metrics say what it meant to do; the servers' request logs
(``KubeAPIServer.request_log``) say what it did, and nothing a partition does to an
agent can change them. The checks here read only those records, so a scenario can
cut links as it likes and still be judged afterwards by the same rules:

- only the leader of the pool, the holder of the election lease on the coordinator
  apiserver, writes heartbeats of other nodes to the cloud (``delegated_writes``,
  ``tenures``, ``check_single_delegator``);
- a former leader stops delegating before a new leader starts (``check_fencing``);
- a live node's cloud lease is never older than its bound, except while nobody of
  the pool could reach the cloud (``check_lease_age``);
- a node whose kubelet stopped goes stale within its bound (``check_goes_stale``);

A lease's age is judged as the node lifecycle controller judges it: a write renews a
lease when its renewTime is greater than every renewTime written before it
(``lease_renewals``), whatever time it names; the times compared are the server's own.
So a write that names an older renewTime keeps no node alive, and a node whose clock
is minutes off is judged like any other.
- leadership does not thrash (``leadership_changes``, ``changes_per_minute``).

Who wrote a record is known by the client's IP address only: the agents of a pool
share one client certificate. Scenarios give each agent its own address and pass
the map from address to node name. Election lease holders are node names, node
leases live in ``kube-node-lease`` named after their node.

Times are the servers' reactor seconds when each answer went out; records of two
servers compare only when both servers run on one clock (one process, or one
machine's wall clock). Every check returns human-readable problems naming the node,
the times and the records at fault; an empty list means the invariant holds.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Optional

from yurtcoord.kube.lease import parse_micro_time
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.sim.apiserver.requestlog import LoggedRequest

Window = tuple[float, float]


class DelegatedWrite(NamedTuple):
    """A successful cloud write of ``node``'s lease by another node, ``writer``."""

    at: float
    writer: str
    node: str
    record: LoggedRequest


class LeadershipChange(NamedTuple):
    """The election lease got a new holder at ``at``: ``previous_holder`` is who held
    it before (``""`` when it was released, None for the first holder ever)."""

    at: float
    previous_holder: Optional[str]
    new_holder: str


class _Tenure:
    """One stretch of one holder on the election lease, as the server saw it.

    ``last_write`` is the holder's last write in it; ``cut`` the record that ended it
    before ``last_write + lease_duration``: a release, or another holder's write."""

    __slots__ = ("holder", "start", "first", "last_write", "cut")

    def __init__(self, record: LoggedRequest):
        self.holder = record.holder or ""
        self.start = record.at
        self.first = record
        self.last_write = record.at
        self.cut: Optional[LoggedRequest] = None

    def end(self, lease_duration: float) -> float:
        natural = self.last_write + lease_duration
        return natural if self.cut is None else min(natural, self.cut.at)


def lease_path(namespace: str, name: str) -> str:
    """The API path of the lease ``namespace/name``, as a request log records a write
    of it."""
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


def _t(seconds: float) -> str:
    return f"{seconds:.3f}"


def _in_order(log: Iterable[LoggedRequest]) -> list[LoggedRequest]:
    # Stable: records answered at the same instant keep the server's order.
    return sorted(log, key=lambda record: record.at)


def _lease_writes(log: Iterable[LoggedRequest], namespace: str,
                  name: Optional[str] = None) -> list[LoggedRequest]:
    return [record for record in _in_order(log)
            if record.is_lease_write and record.namespace == namespace
            and (name is None or record.name == name)]


def _election_events(coordinator_log: Iterable[LoggedRequest], lease_namespace: str,
                     lease_name: str) -> list[LoggedRequest]:
    return [record for record in _in_order(coordinator_log)
            if (record.is_lease_write or record.is_lease_delete)
            and record.namespace == lease_namespace and record.name == lease_name]


def lease_renewals(log: Iterable[LoggedRequest], namespace: str,
                   name: str) -> list[LoggedRequest]:
    """The successful writes of the lease ``namespace/name`` that increased its
    renewTime, in time order: each names a renewTime greater than every one written
    before it (the node lifecycle controller's view of a heartbeat). A write without a
    renewTime it can parse renews nothing."""
    renewals = []
    highest: Optional[float] = None
    for record in _lease_writes(log, namespace, name):
        try:
            renewed = parse_micro_time(record.renew_time) if record.renew_time else None
        except ValueError:
            renewed = None
        if renewed is None or (highest is not None and renewed <= highest):
            continue
        highest = renewed
        renewals.append(record)
    return renewals


def _check_duration(what: str, seconds: float) -> None:
    if not seconds > 0:
        raise ValueError(f"{what} must be positive seconds, got {seconds!r}")


def _check_span(start: float, end: float) -> None:
    if end < start:
        raise ValueError(f"end {end!r} is before start {start!r}")


def delegated_writes(cloud_log: Iterable[LoggedRequest], node_of_peer: Mapping[str, str],
                     namespace: str = NODE_LEASE_NAMESPACE) -> list[DelegatedWrite]:
    """Successful cloud writes of a node lease in ``namespace`` by a writer other
    than the lease's node, in time order.

    The writer is ``node_of_peer[peer]``; a peer missing from the map is a writer
    named by its address, so a stray client shows up instead of hiding."""
    found = []
    for record in _lease_writes(cloud_log, namespace):
        writer = node_of_peer.get(record.peer, record.peer)
        if record.name is not None and writer != record.name:

            found.append(DelegatedWrite(record.at, writer, record.name, record))
    return found


def _tenure_list(coordinator_log: Iterable[LoggedRequest], lease_namespace: str,
                 lease_name: str, lease_duration: float) -> list[_Tenure]:
    _check_duration("lease_duration", lease_duration)
    found: list[_Tenure] = []
    current: Optional[_Tenure] = None
    for record in _election_events(coordinator_log, lease_namespace, lease_name):
        if current is not None and record.at >= current.last_write + lease_duration:
            # Expired: nobody may count on it any longer, its holder included; a
            # write by that holder now starts a new tenure.
            current = None
        holder = record.holder if record.is_lease_write else ""
        if not holder:
            if current is not None:
                current.cut = record
                current = None
            continue
        if current is not None and current.holder == holder:
            current.last_write = record.at
            continue
        if current is not None:
            current.cut = record
        current = _Tenure(record)
        found.append(current)
    return found


def tenures(coordinator_log: Iterable[LoggedRequest], lease_namespace: str, lease_name: str,
            lease_duration: float) -> dict[str, list[Window]]:
    """When each holder of the election lease may act as leader: holder -> [(start,
    end)], in time order.

    A successful write whose holder differs from the lease's holder (or follows an
    expired tenure) starts a tenure of that holder. It ends at the earliest of: the
    holder's last write in it plus ``lease_duration`` (the lease expires), the next
    write by another holder, a release (a write with an empty holder, or a DELETE of
    the lease)."""
    found: dict[str, list[Window]] = {}
    for tenure in _tenure_list(coordinator_log, lease_namespace, lease_name, lease_duration):
        found.setdefault(tenure.holder, []).append((tenure.start, tenure.end(lease_duration)))
    return found


def _describe_windows(windows: Sequence[Window]) -> str:
    if not windows:
        return "none"
    return ", ".join(f"[{_t(start)}, {_t(end)}]" for start, end in windows)


def check_single_delegator(cloud_log: Iterable[LoggedRequest],
                           coordinator_log: Iterable[LoggedRequest],
                           node_of_peer: Mapping[str, str], lease_namespace: str,
                           lease_name: str, lease_duration: float) -> list[str]:
    """At no time do two agents write heartbeats of other nodes to the cloud.

    Judged three ways, each with its own problems:

    - every delegated write by X lies within a tenure of X (``tenures``);
    - no holder took the election lease before the previous holder's lease expired
      (its last write plus ``lease_duration``) without a release in between: the
      tenures of the two would overlap, had the first not been cut by the takeover;
    - no delegated write by a former holder X after another holder's tenure started
      and before X wrote the election lease again."""
    cloud_log = list(cloud_log)
    coordinator_log = list(coordinator_log)
    tenure_list = _tenure_list(coordinator_log, lease_namespace, lease_name, lease_duration)
    windows = tenures(coordinator_log, lease_namespace, lease_name, lease_duration)
    problems = []
    delegations = delegated_writes(cloud_log, node_of_peer)
    for write in delegations:
        own = windows.get(write.writer, [])
        if not any(start <= write.at <= end for start, end in own):
            problems.append(
                f"{write.writer} wrote {write.node}'s cloud lease at {_t(write.at)} outside "
                f"its tenures as election lease holder ({_describe_windows(own)}): "
                f"{write.record.describe()}")
    for before, after in zip(tenure_list, tenure_list[1:]):
        expiry = before.last_write + lease_duration
        if before.cut is after.first and after.start < expiry:
            problems.append(
                f"{after.holder} took the election lease at {_t(after.start)} while "
                f"{before.holder}'s tenure lasted until {_t(expiry)} (last write at "
                f"{_t(before.last_write)}, lease duration {lease_duration} s): tenures "
                f"overlap by {_t(expiry - after.start)} s; {after.first.describe()}")
    for write in delegations:
        started = [tenure for tenure in tenure_list if tenure.start <= write.at]
        own_writes = [tenure.last_write for tenure in started if tenure.holder == write.writer]
        if not started or started[-1].holder == write.writer or not own_writes:
            continue
        newer = started[-1]
        last_own = max(own_writes)
        if last_own < newer.start:
            problems.append(
                f"former leader {write.writer} wrote {write.node}'s cloud lease at "
                f"{_t(write.at)}, after {newer.holder} took the election lease at "
                f"{_t(newer.start)} ({write.writer}'s last election write at {_t(last_own)}): "
                f"{write.record.describe()}")
    return problems


def check_fencing(cloud_log: Iterable[LoggedRequest], coordinator_log: Iterable[LoggedRequest],
                  node_of_peer: Mapping[str, str], lease_namespace: str,
                  lease_name: str) -> list[str]:
    """A former leader stops delegating before a new leader starts.

    For every change of holder from A to B, at B's first successful write t_B, A
    made no delegated write at or after t_B (until A holds the lease again). Each
    offending write is reported with its lag behind t_B. When A's lease expired
    does not matter here (``check_single_delegator`` judges writes after expiry)."""
    tenure_list = _tenure_list(coordinator_log, lease_namespace, lease_name, math.inf)
    delegations = delegated_writes(cloud_log, node_of_peer)
    problems = []
    for index, (before, after) in enumerate(zip(tenure_list, tenure_list[1:]), start=1):
        if before.holder == after.holder:
            continue
        again = [tenure.start for tenure in tenure_list[index + 1:]
                 if tenure.holder == before.holder]
        until = again[0] if again else float("inf")
        for write in delegations:
            if write.writer == before.holder and after.start <= write.at < until:
                problems.append(
                    f"{before.holder} wrote {write.node}'s cloud lease at {_t(write.at)}, "
                    f"{_t(write.at - after.start)} s after {after.holder} took the election "
                    f"lease at {_t(after.start)}: {write.record.describe()}; "
                    f"takeover: {after.first.describe()}")
    return problems


def _merged(windows: Iterable[Window]) -> list[Window]:
    merged: list[list[float]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _uncovered(low: float, high: float, covered: Sequence[Window]) -> list[Window]:
    """The parts of (low, high) outside every window of ``covered`` (merged, sorted)."""
    pieces = []
    for start, end in covered:
        if end <= low:
            continue
        if start >= high:
            break
        if start > low:
            pieces.append((low, start))
        low = max(low, end)
        if low >= high:
            return pieces
    if low < high:
        pieces.append((low, high))
    return pieces


def check_lease_age(cloud_log: Iterable[LoggedRequest], node: str, start: float, end: float,
                    bound: float, excused: Sequence[Window] = (),
                    namespace: str = NODE_LEASE_NAMESPACE) -> list[str]:
    """A live node's cloud lease never gets older than ``bound`` over [start, end].

    The renewals (``lease_renewals``) of ``node``'s cloud lease (by anyone: the node
    or a delegating leader) in [start, end] leave no gap longer than ``bound``, the gaps
    from ``start`` to the first write and from the last write to ``end`` included.
    An excused window (t0, t1), e.g. while no pool member could reach the cloud,
    lets the lease be older than ``bound`` from t0 until t1 + ``bound``: a gap is
    excused when every instant at which the lease was older than ``bound`` lies in
    such an extended window."""
    _check_duration("bound", bound)
    _check_span(start, end)
    for t0, t1 in excused:
        _check_span(t0, t1)
    allowed = _merged((t0, t1 + bound) for t0, t1 in excused)
    writes = [record for record in lease_renewals(cloud_log, namespace, node)
              if start <= record.at <= end]
    points: list[tuple[float, str]] = [(start, "the start")]
    points += [(record.at, record.describe()) for record in writes]
    points.append((end, "the end"))
    problems = []
    for (low, low_what), (high, high_what) in zip(points, points[1:]):
        if high - low <= bound:
            continue
        stale = _uncovered(low + bound, high, allowed)
        if stale:
            problems.append(
                f"{node}'s cloud lease went {_t(high - low)} s without a renewal, longer than "
                f"{bound} s: from {_t(low)} ({low_what}) to {_t(high)} ({high_what}); older "
                f"than the bound over {_describe_windows(stale)}, outside the excused "
                f"windows {_describe_windows(list(excused))}")
    return problems


def check_goes_stale(cloud_log: Iterable[LoggedRequest], node: str, stopped_at: float,
                     bound: float, end: float,
                     namespace: str = NODE_LEASE_NAMESPACE) -> list[str]:
    """A node whose kubelet stopped at ``stopped_at`` goes stale within ``bound``: no
    renewal (``lease_renewals``) of its cloud lease (by anyone) after
    ``stopped_at + bound``, up to ``end``."""
    _check_duration("bound", bound)
    _check_span(stopped_at, end)
    deadline = stopped_at + bound
    return [f"{node}'s cloud lease was written at {_t(record.at)}, "
            f"{_t(record.at - stopped_at)} s after its kubelet stopped at {_t(stopped_at)} "
            f"(bound {bound} s): {record.describe()}"
            for record in lease_renewals(cloud_log, namespace, node)
            if deadline < record.at <= end]


def leadership_changes(coordinator_log: Iterable[LoggedRequest], lease_namespace: str,
                       lease_name: str) -> list[LeadershipChange]:
    """Every successful write that gave the election lease a holder other than the
    one it had, in time order. A release (empty holder, or the lease deleted) is no
    change by itself; it leaves the previous holder ``""`` for the next one."""
    changes = []
    holder: Optional[str] = None
    for record in _election_events(coordinator_log, lease_namespace, lease_name):
        new = record.holder if record.is_lease_write else ""
        if new and new != holder:
            changes.append(LeadershipChange(record.at, holder, new))
        holder = new
    return changes


def changes_per_minute(changes: Iterable[LeadershipChange], start: float, end: float) -> float:
    """Leadership changes in [start, end] per minute, for the bound on role thrash."""
    if not end > start:
        raise ValueError(f"end {end!r} must be after start {start!r}")
    count = sum(1 for change in changes if start <= change.at <= end)
    return count * 60.0 / (end - start)
