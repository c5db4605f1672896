"""Who leads the pool, as this agent knows it: the election lease as last read.

Every surface of an agent (``/status``, ``/pool``, the pool page, ``yurtcoordctl``)
names the leader from one ``ElectionLeader``, so that they cannot disagree. The hub
elector is no such place: an agent without the cloud, or whose coordinator is not
healthy, stops electing, and its elector then knows no leader, although the election
lease on the coordinator apiserver still names one. ``ElectionLeaseReader`` reads
that lease every ``interval`` whatever the agent's role, and at once when the
elector saw a new holder or this agent's role changed; the ``/pool`` builds feed
their own reads of the lease in too.

The holder is judged as the elector judges it, on the local clock (docs/design.md,
"Clocks"): the lease is expired once its renewTime was not seen to change for its
``leaseDurationSeconds`` (``RenewalsSeen``); no renewTime, acquireTime or read time
written by another machine is compared with the local clock.

The leader history (``LeaderHistory``) records every new term this agent learns of:
a new holder, or the same holder after ``leaseTransitions`` moved (somebody held the
lease in between). A term is dated by when it began where the lease tells it (its
``acquireTime``, written by the holder's clock: recorded and shown, never compared),
``dated_by: "lease"``, else by the local time the agent learned of it,
``dated_by: "seen"``; each entry also says when it was learned.
"""

import collections
import datetime
from collections.abc import Callable, Mapping
from typing import Any, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Attribute, Interface, implementer

from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord
from yurtcoord.kube.renewals import RenewalsSeen
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors, report_loop_error
from yurtcoord.tx.observers import Observers

# Leader changes a history keeps, the newest last.
LEADER_CHANGES_KEPT = 20
# How a history entry is dated: by the lease's acquireTime, or by when it was learned.
DATED_BY_LEASE, DATED_BY_SEEN = "lease", "seen"
# The key of the election lease in the ``RenewalsSeen`` of an ``ElectionLeader``.
_ELECTION_KEY = "election"


def rfc3339(seconds: float) -> str:
    """Epoch ``seconds`` → RFC 3339 UTC text, as the status pages show times."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class ILeaderSource(Interface):
    """The one place an agent's surfaces take the pool's leader from."""

    leader = Attribute(
        "Holder of the election lease as last read; None while it is free, expired "
        "(its renewTime not seen to change for its duration) or never read.")
    read_at = Attribute("Local time of the last answered read of the lease, or None.")

    def election() -> dict[str, Any]:
        """The ``election`` object of ``/status`` and ``/pool``: the lease as last
        read and when (see the README's HTTP surface)."""

    def changes() -> list[dict[str, Any]]:
        """The leader history, oldest first (see ``LeaderHistory.changes``)."""

    def add_leader_observer(observer: Callable[[Optional[str]], None]) -> None:
        """Call ``observer(leader)`` each time ``leader`` changes as lease reads show."""


class LeaderHistory:
    """The last ``kept`` terms this agent learned of, the newest last."""

    def __init__(self, kept: int = LEADER_CHANGES_KEPT) -> None:
        self._changes: collections.deque[dict[str, Any]] = collections.deque(maxlen=kept)

    def add(self, leader: str, seen_at: float, acquired_at: Optional[float],
            transitions: Optional[int]) -> None:
        """A term of ``leader`` learned of at local time ``seen_at``; ``acquired_at``
        is the lease's acquireTime (the holder's clock), None when it has none."""
        at, dated_by = ((acquired_at, DATED_BY_LEASE) if acquired_at is not None
                        else (seen_at, DATED_BY_SEEN))
        self._changes.append({
            "time": rfc3339(at), "at": round(at, 3), "leader": leader,
            "dated_by": dated_by, "seen": rfc3339(seen_at), "seen_at": round(seen_at, 3),
            "lease_transitions": transitions})

    def changes(self) -> list[dict[str, Any]]:
        """Oldest first: ``time``/``at`` (when the term began: the lease's acquireTime
        with ``dated_by: "lease"``, else when it was learned with ``"seen"``),
        ``leader``, ``seen``/``seen_at`` (when this agent learned of it, local) and
        ``lease_transitions``."""
        return [dict(change) for change in self._changes]


@implementer(ILeaderSource)
class ElectionLeader:
    """The election lease as last read, with the local time it was read, and the
    history of the terms it showed. Fed by ``observe(lease)`` with every read (None:
    no such lease) and ``read_failed(why)`` when a read got no answer."""

    def __init__(self, clock: IReactorTime, history: Optional[LeaderHistory] = None) -> None:
        self._clock = clock
        self.history = history if history is not None else LeaderHistory()
        self._renewals = RenewalsSeen(clock)
        self._record: Optional[LeaseRecord] = None
        # (holder, leaseTransitions) of the term last recorded; None while free.
        self._term: Optional[tuple[str, int]] = None
        self._observers: Observers[[Optional[str]]] = Observers("pool leader changes")
        self._last_leader: Optional[str] = None
        self.read_at: Optional[float] = None
        self.error: Optional[str] = None

    def add_leader_observer(self, observer: Callable[[Optional[str]], None]) -> None:
        self._observers.add(observer)

    def observe(self, lease: Optional[Mapping[str, Any]]) -> None:
        """``lease`` is what the coordinator apiserver holds now (None: none)."""
        now = self._clock.seconds()
        self.read_at, self.error = now, None
        if not isinstance(lease, Mapping):
            self._record, self._term = None, None
            self._renewals.forget(_ELECTION_KEY)
            self._tell()
            return
        record = LeaseRecord.from_lease(lease)
        self._record = record
        self._renewals.observe(_ELECTION_KEY, lease)
        holder = record.holder_identity or None
        if holder is None:
            self._term = None
        else:
            term = (holder, record.lease_transitions)
            if term != self._term:
                self._term = term
                self.history.add(holder, now, record.acquire_time, record.lease_transitions)
        self._tell()

    def read_failed(self, why: str) -> None:
        """A read got no answer: the lease is as last read, and ages on."""
        self.error = why
        self._tell()

    def _tell(self) -> None:
        leader = self.leader
        if leader != self._last_leader:
            self._last_leader = leader
            self._observers.notify(leader)

    def _age(self) -> Optional[float]:
        return self._renewals.age(_ELECTION_KEY)

    @property
    def holder(self) -> Optional[str]:
        """The holder the lease named when last read, expired or not."""
        if self._record is None:
            return None
        return self._record.holder_identity or None

    @property
    def expired(self) -> Optional[bool]:
        """None before a lease was read; True when free or not seen renewed for its
        duration (on the local clock)."""
        if self._record is None:
            return None
        if self.holder is None:
            return True
        age, duration = self._age(), self._record.lease_duration_seconds
        return age is None or (duration is not None and age > duration)

    @property
    def leader(self) -> Optional[str]:
        return None if self.expired is not False else self.holder

    def election(self) -> dict[str, Any]:
        record, now = self._record, self._clock.seconds()
        age = self._age() if record is not None else None
        return {
            "holder": self.holder,
            "lease_age": None if age is None else round(age, 1),
            "lease_duration_seconds": None if record is None else record.lease_duration_seconds,
            "expired": self.expired,
            "acquire_time": self._acquire_time_text(),
            "lease_transitions": None if record is None else record.lease_transitions,
            "read_at": None if self.read_at is None else rfc3339(self.read_at),
            "read_age": None if self.read_at is None else round(max(0.0, now - self.read_at), 1),
            "read_error": self.error,
        }

    def changes(self) -> list[dict[str, Any]]:
        return self.history.changes()

    def _acquire_time_text(self) -> Optional[str]:
        """The lease's acquireTime as RFC 3339: written by the holder's clock, so only
        shown, never compared with this one (kept apart from any clock reading)."""
        record = self._record
        if record is None or record.acquire_time is None:
            return None
        return rfc3339(record.acquire_time)


class ElectionLeaseReader:
    """Reads the election lease through ``client`` (``get``) every ``interval`` and
    feeds each answer to ``source``, whatever this agent's role: an agent that takes
    no part in the election still learns of every new leader within one interval.
    Each read is bounded by ``timeout``; a tick while a read is in flight is skipped.
    ``read_now()`` reads at once (after the read in flight, if any): the elector saw a
    new holder, or this agent's role changed."""

    log = Logger()

    def __init__(self, reactor: IReactorTime, client: Any, lease: tuple[str, str],
                 source: ElectionLeader, interval: float, timeout: float,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._loop_errors = loop_errors
        self._client = client
        self._namespace, self._name = lease
        self.source = source
        self.interval = interval
        self.timeout = timeout
        # Every read runs in a Deferred whose unexpected errors end in ``_unexpected``
        # (loop election-lease-read), so a tick cannot raise.
        self._ticks = Cadence(reactor, self._tick, interval, "election-lease-read",
                              loop_errors)
        self._reading: Optional[defer.Deferred[None]] = None
        self._again = False
        self.reads = 0

    def start(self) -> None:
        self._ticks.start()

    def stop(self) -> defer.Deferred[Any]:
        """Stop reading; a read in flight is cancelled."""
        self._again = False
        stopped = self._ticks.stop()
        if self._reading is not None:
            self._reading.cancel()
        return stopped

    def _tick(self) -> None:
        if self._reading is None:
            self._read()

    def read_now(self, *_ignored: object) -> None:
        """Read at once, or right after the read in flight; nothing when stopped.
        Takes and ignores any arguments, so that it can be any observer."""
        if not self._ticks.running:
            return
        if self._reading is not None:
            self._again = True
            return
        self._read()

    def _read(self) -> None:
        self.reads += 1
        d = defer.maybeDeferred(self._client.get, LEASES, self._name, self._namespace)
        d.addTimeout(self.timeout, self._reactor)
        self._reading = d
        d.addCallbacks(self.source.observe, self._failed)
        d.addErrback(self._unexpected)
        d.addBoth(self._done)

    def _unexpected(self, failure: Failure) -> None:
        """A defect, not a failed read: logged with its traceback and counted (loop
        election-lease-read); the next tick reads again."""
        report_loop_error("election-lease-read", failure, self._loop_errors)

    def _failed(self, failure: Failure) -> None:
        if failure.check(NotFound):
            self.source.observe(None)
        elif failure.check(defer.CancelledError) and not self._ticks.running:
            return
        elif failure.check(defer.TimeoutError):
            self.source.read_failed(f"no answer within {self.timeout:g}s")
        else:
            self.source.read_failed(describe_failure(failure))

    def _done(self, _result: object) -> None:
        self._reading = None
        if self._again and self._ticks.running:
            self._again = False
            self._read()
