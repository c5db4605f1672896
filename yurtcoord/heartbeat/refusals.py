"""The delegated lease states the leader does not forward to the cloud: counted by
reason, and logged without letting made-up names flood the log.

A refused lease is counted by reason (``yurtcoord_heartbeat_delegation_refused_total``
and the delegation's observers). One whose name is a Node of the pool is logged once
per lease and reason; the others are logged together (how many, by reason, and a few
of the leases), at most once per ``SUMMARY_PERIOD``: such names may be made up by the
thousand.
"""

from typing import Dict, List, Optional, Set, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import Interface

from yurtcoord.tx.durations import format_duration
from yurtcoord.tx.observers import Observers

# Why a delegated lease is not forwarded (label ``reason`` of the refused counter).
REFUSED_NAMESPACE = "namespace"
REFUSED_NOT_POOL_MEMBER = "not_pool_member"
REFUSED_NO_SUCH_NODE = "no_such_node"
REFUSED_HOLDER_MISMATCH = "holder_mismatch"
REFUSED_EXPIRED = "expired"
REFUSAL_REASONS = (REFUSED_NAMESPACE, REFUSED_NOT_POOL_MEMBER, REFUSED_NO_SUCH_NODE,
                   REFUSED_HOLDER_MISMATCH, REFUSED_EXPIRED)
# Refusals of leases whose names are not known Nodes of the pool are logged together,
# at most once per SUMMARY_PERIOD, naming at most SUMMARY_EXAMPLES of the leases.
SUMMARY_PERIOD = 60.0
SUMMARY_EXAMPLES = 5


class IDelegationMetrics(Interface):
    """What the delegation reports to the agent's metrics."""

    def observe_delegation(seconds: float, succeeded: bool) -> None:
        """One finished delegation, ``seconds`` after its pool event."""

    def count_delegation_refused(reason: str) -> None:
        """One delegated pool lease state not forwarded, for ``reason``."""

    def set_delegation_limit(limit: int) -> None:
        """How many delegations may run at once now (the bound follows the cloud)."""


class Refusals:
    """The refusals of one delegation: ``counts`` by reason (they survive leadership
    terms), each told to ``metrics`` and ``observers`` (``(node, reason)``), and
    logged as the module docstring says."""

    log = Logger()

    def __init__(self, reactor: IReactorTime, pool: str,
                 metrics: Optional[IDelegationMetrics], observers: Observers[[str, str]]
                 ) -> None:
        self._reactor = reactor
        self._pool = pool
        self._metrics = metrics
        self._observers = observers
        self.counts = dict.fromkeys(REFUSAL_REASONS, 0)
        # Refusals logged of leases whose names are Nodes of the pool: name ->
        # {(key, reason)}, each logged once. Refusals of other names are summed up
        # in ``_dropped`` (reason -> count) with a few of their keys, and logged at
        # most once per ``SUMMARY_PERIOD``.
        self._logged: Dict[str, Set[Tuple[str, str]]] = {}
        self._dropped: Dict[str, int] = {}
        self._examples: List[str] = []
        self._last_summary: Optional[float] = None
        self._summary_call: Optional[IDelayedCall] = None

    def __len__(self) -> int:
        """Entries kept per lease or name: the per-lease log marks, the reasons and
        the examples of the summary to come."""
        return (sum(len(logged) for logged in self._logged.values()) + len(self._logged)
                + len(self._dropped) + len(self._examples))

    def count(self, key: str, reason: str, detail: str, member: bool) -> None:
        """Lease ``key`` refused for ``reason``; ``member`` when its name is a Node of
        the pool (then logged once per lease and reason, else summed up)."""
        self.counts[reason] += 1
        if self._metrics is not None:
            self._metrics.count_delegation_refused(reason)
        name = key.partition("/")[2]
        self._observers.notify(name, reason)
        if not member:
            self._summarize(key, reason)
            return
        logged = self._logged.setdefault(name, set())
        if (key, reason) not in logged:
            logged.add((key, reason))
            self.log.warn("heartbeat lease {lease} not forwarded to the cloud "
                          "(reason={reason}): {detail}", lease=key, reason=reason,
                          detail=detail)

    def forget_node(self, name: str) -> None:
        """Node ``name`` left the pool: its leases' refusals are logged anew."""
        self._logged.pop(name, None)

    def forget_lease(self, key: str, name: str) -> None:
        """Lease ``key`` was deleted: its refusals are logged anew."""
        logged = self._logged.get(name)
        if logged:
            logged.difference_update({entry for entry in logged if entry[0] == key})

    def end_term(self) -> None:
        """The term ended: what the summary holds is told now rather than a minute
        later, and the per-lease marks are forgotten."""
        self._logged.clear()
        self.log_summary()

    def _summarize(self, key: str, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        examples = self._examples
        if len(examples) < SUMMARY_EXAMPLES and key not in examples:
            examples.append(key)
        if self._summary_call is not None:
            return
        now = self._reactor.seconds()
        due = now if self._last_summary is None else self._last_summary + SUMMARY_PERIOD
        if due <= now:
            self.log_summary()
        else:
            self._summary_call = self._reactor.callLater(due - now, self.log_summary)

    def log_summary(self) -> None:
        """Log the refusals summed up since the last summary, if any."""
        call, self._summary_call = self._summary_call, None
        if call is not None and call.active():
            call.cancel()
        dropped, self._dropped = self._dropped, {}
        examples, self._examples = self._examples, []
        if not dropped:
            return
        self._last_summary = self._reactor.seconds()
        self.log.warn(
            "heartbeat leases not forwarded to the cloud, their names not known as Nodes "
            "of pool {pool}: {count} renewals dropped ({reasons}), e.g. {examples}; "
            "logged together at most once every {period}",
            count=sum(dropped.values()), pool=self._pool,
            reasons=", ".join(f"{reason}={count}" for reason, count in sorted(dropped.items())),
            examples=", ".join(examples), period=format_duration(SUMMARY_PERIOD))
