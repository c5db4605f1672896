"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Agents of one pool compete for one Lease; the holder is the leader. The rules follow
client-go's ``tools/leaderelection``:

- A lease that is free (no holder) or expired is taken by writing ourselves as holder
  (``acquireTime`` = now, ``leaseTransitions`` + 1). A lease whose holder is already
  us (e.g. after a restart) is renewed directly, without a transition.
- Expiry is judged by the LOCAL clock, never by the remote ``renewTime``: clocks of
  edge nodes drift. The elector remembers the last lease record it saw and the local
  time it first saw that record (``observed_time``); the lease is expired once
  ``observed_time + leaseDurationSeconds <= now`` with nothing changed in between.
- Writes go through the agent's one ``LeaseWriter``: they carry the resourceVersion
  that was read, and a ``Conflict`` means somebody else wrote first. A leader's
  renewal of the lease it wrote last reads it again at once after a conflict; any
  other attempt is one read and one write, and a lost race waits for the next tick.
- The leader renews every ``retry_period``. If it has not renewed successfully for
  ``renew_deadline`` (counted from the start of its last successful write) it stops
  leading, before any peer can consider the lease expired. See docs/design.md,
  "Election timing".
- On ``stop()`` a leader with ``release_on_cancel`` releases the lease: holder
  cleared, ``leaseDurationSeconds`` = 1, so a peer takes over at its next attempt
  instead of after a whole ``lease_duration``.

Departures from client-go, on purpose:

- After losing the lease (renew deadline passed, or another holder seen) the elector
  keeps running as a candidate instead of exiting; only ``stop()`` ends it. The hub
  elector starts and stops it with the coordinator's health.
- ``on_stopped_leading`` is called exactly once per ``on_started_leading``, never for a
  run that did not lead, and on ``stop()`` before the release is written, so the
  leader's work has stopped before a peer can take over.
- ``on_new_leader`` is called with a non-empty holder only; ``leader`` is None while
  the lease is free.
- Candidate cadence (``LeaderElector._candidate_delay``): a candidate watching a live
  holder wakes exactly when the lease would expire, so a dead holder is replaced
  within ``lease_duration + retry_period``. See docs/design.md, "Election timing".

The elector's timers are its only clock: a tick or renew deadline whose handling
raised would leave it in a state that waits for a timer nobody armed (a candidate
that never tries again, a leader that neither renews nor steps down). Both run
guarded (loops ``election-tick`` and ``election-deadline`` of
``yurtcoord.tx.guardedloop``), as does the end of each attempt (counted as a tick),
and the two steps there that may raise are answered in place: an attempt whose start
raises ends as not written, and a ``random`` that raises gives retry_period instead
of a jittered pause; either is logged and counted in ``loop_errors`` and the next
timer is armed all the same.

Once ``stop()`` has been called, no callback fires and no late answer of a cancelled
request changes anything: the attempt in flight is dropped with the state that held
it, and its end is no input of the elector's machine (``_ELECTION``).

Longer than 600 lines on purpose: the election's config and timing rule, the elector
and its machine (``_build_election``) are one mechanism, client-go's, and read best
together: every timing rule in one place, each transition beside the step it takes.
"""

import dataclasses
import enum
import math
import random as random_module
from typing import Any, Callable, Optional, Protocol

from automat import TypeMachine, TypeMachineBuilder, pep614
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.kube.errors import Conflict, KubeError
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import LeaseRecord, build_lease, with_record
from yurtcoord.kube.leasewriter import Lease, LeaseWrite, LeaseWriteFailed, LeaseWriter
from yurtcoord.tx.guardedloop import ILoopErrors, guarded, report_loop_error

# client-go's JitterFactor: a candidate's retry after a contention waits
# retry_period * (1 + U[0, JITTER_FACTOR)).
JITTER_FACTOR = 1.2
RELEASED_LEASE_DURATION_SECONDS = 1
MIN_DELAY = 0.001


class LeaderElectionConfigError(ValueError):
    """A field of the election's configuration is refused: ``field`` names it and
    ``reason`` says why, in the words the agent's config errors show."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def _seconds(value: float) -> str:
    return f"{value:g}s"


def check_election_timing(lease_duration: float, renew_deadline: float, retry_period: float,
                          show: Callable[[float], str] = _seconds) -> None:
    """The one rule of the election's timings, client-go's:
    ``lease_duration > renew_deadline > retry_period * JITTER_FACTOR > 0``.

    A leader must give up before a peer may take the lease (see docs/design.md,
    "Election timing"), and a jittered retry must still come before the renew
    deadline. Raises ``LeaderElectionConfigError`` naming the field at fault;
    ``show`` spells the durations in its reason (the agent's config passes its own
    duration format)."""
    if not retry_period > 0:
        raise LeaderElectionConfigError("retry_period", "must be longer than 0s")
    if not lease_duration > renew_deadline:
        raise LeaderElectionConfigError(
            "renew_deadline", f"must be shorter than lease_duration ({show(lease_duration)})")
    if not renew_deadline > retry_period * JITTER_FACTOR:
        raise LeaderElectionConfigError(
            "retry_period", f"retry_period * {JITTER_FACTOR} must be shorter than "
            f"renew_deadline ({show(renew_deadline)})")


@dataclasses.dataclass(frozen=True)
class LeaderElectionConfig:
    """What to elect on and how fast. Times are seconds.

    Validated: non-empty names, finite numbers and ``check_election_timing``; a
    violation raises ``LeaderElectionConfigError`` (a ValueError) naming the field.
    The agent builds it from its ``[leader_election]`` section.
    """

    lease_namespace: str
    lease_name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        for name in ("lease_namespace", "lease_name", "identity"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise LeaderElectionConfigError(name, f"must be a non-empty string, got {value!r}")
        for name in ("lease_duration", "renew_deadline", "retry_period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise LeaderElectionConfigError(name, f"must be a number of seconds, got {value!r}")
        check_election_timing(self.lease_duration, self.renew_deadline, self.retry_period)

    @property
    def lease_key(self) -> str:
        return f"{self.lease_namespace}/{self.lease_name}"

    @property
    def lease_duration_seconds(self) -> int:
        """What we write into ``leaseDurationSeconds``: whole seconds, rounded up so
        peers never wait less than we promised."""
        return int(math.ceil(self.lease_duration))


class _Phase(enum.Enum):
    """What ``running`` and ``is_leader`` read, coarser than the states of
    ``_ELECTION``: entering waiting makes it candidate, entering leading leader, and
    a stop stopped (trying and renewing keep the phase they come from)."""

    STOPPED = "stopped"      # stopped, or a stop is releasing the lease
    CANDIDATE = "candidate"  # waiting for the next attempt, or one is in flight
    LEADER = "leader"        # leading: the next renewal is armed, or one is in flight


class _Leadership:
    """One run of leading, from the first written lease to stepping down: when we
    last renewed, and the renew deadline counted from there."""

    def __init__(self, renewed_at: float, deadline: IDelayedCall) -> None:
        self.renewed_at = renewed_at
        self.deadline = deadline


@dataclasses.dataclass(frozen=True)
class _Observation:
    """The lease as last read or written (``lease``), its record, and the local time
    that record was first seen (``since``): expiry counts from there."""

    lease: Lease
    record: LeaseRecord
    since: float


class _Attempt:
    """One try-acquire-or-renew in flight: what it saw and wrote, kept even when it
    fails midway, and the leadership it renews (None: a candidate's attempt).
    ``drop()`` cancels it when the state that holds it is left: its end is then
    no input."""

    def __init__(self, started_at: float, leadership: Optional[_Leadership]) -> None:
        self.started_at = started_at
        self.leadership = leadership
        self.seen: Optional[Lease] = None
        self.seen_at: Optional[float] = None
        self.written: Optional[Lease] = None
        self.held_by_other = False
        self.from_known = False
        self.dropped = False
        self.deferred: Optional[defer.Deferred[Any]] = None

    def drop(self) -> None:
        self.dropped = True
        if self.deferred is not None:
            self.deferred.cancel()


class _Leading:
    """The leading state's data: the leadership and the timer of its next renewal."""

    def __init__(self, leadership: _Leadership, renewal: IDelayedCall) -> None:
        self.leadership = leadership
        self.renewal = renewal


class _ElectionInputs(Protocol):
    """The inputs of the election (``_ELECTION``). An attempt's end and the renew
    deadline carry ``delay``, the pause before the next attempt that follows them."""

    def start(self) -> None:
        """Begin competing (``LeaderElector.start``)."""

    def stop(self, stopped: "defer.Deferred[bool]", release: Optional[bool]) -> None:
        """Stop competing; ``stopped`` fires with whether the lease was released."""

    def released(self, released: bool) -> None:
        """The stop's release of the lease ended (``released``: it was written)."""

    def tick(self) -> None:
        """A candidate's attempt timer fired."""

    def renew_due(self, leadership: _Leadership) -> None:
        """A leader's renewal timer fired."""

    def written(self, delay: float, attempt: _Attempt) -> None:
        """The attempt wrote the lease: we hold it."""

    def not_written(self, delay: float, attempt: _Attempt, failure: Optional[Failure]) -> None:
        """The attempt wrote nothing (``failure``: why, when it failed)."""

    def lost(self, delay: float, attempt: _Attempt) -> None:
        """A leader's renewal found another holder on the lease."""

    def deadline(self, delay: float) -> None:
        """The leader has not renewed for renew_deadline."""


def _error_kind(failure: Failure) -> str:
    return type(failure.value).__name__


class LeaderElector:
    """Competes for one Lease through ``lease_client`` and reports leadership through
    the callbacks. See the module docstring for the rules.

    ``lease_client`` has ``get(gvr, name, namespace)``, ``create(gvr, obj,
    namespace=None)`` and ``update(gvr, obj, namespace=None)`` returning Deferreds and
    failing with ``yurtcoord.kube.errors`` types (``KubeClient`` does).
    ``random`` returns floats in [0, 1); inject it to make jitter deterministic.

    Where it is is one state of the Automat machine ``_ELECTION``: stopped, waiting
    (a candidate; holds the attempt timer), trying (a candidate; holds the attempt in
    flight), leading (holds the leadership and its renewal timer), renewing (holds
    the renewal in flight, whose leadership keeps its renew deadline), releasing (a
    stop writes the release) and restarting (releasing, and started meanwhile).
    Every timer, answer and call is an input; one a state does not take raises
    ``automat.NoTransition``. What it last saw of the lease is one ``_Observation``.

    The leadership callbacks run last, once the machine is done with an input
    (``_feed``); one that stops the elector drops the rest.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, lease_client: IObjectClient,
                 config: LeaderElectionConfig,
                 on_started_leading: Optional[Callable[[], object]] = None,
                 on_stopped_leading: Optional[Callable[[], object]] = None,
                 on_new_leader: Optional[Callable[[str], object]] = None,
                 random: Optional[Callable[[], float]] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._loop_errors = loop_errors
        self._config = config
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._random = random or random_module.Random().random
        # Every write of the lease; ``_lease_read`` records each read into the
        # attempt in ``_reading``.
        self._writer = LeaseWriter(reactor, lease_client, config.lease_namespace,
                                   config.lease_name, attempts=2, on_read=self._lease_read)
        self._reading: Optional[_Attempt] = None
        self._election: _ElectionInputs = _ELECTION(self)
        # The timers' and attempts' handlers, guarded (see the module docstring).
        self._tick_due = guarded("election-tick", self._feed, loop_errors)
        self._attempt_end = guarded("election-tick", self._attempt_finished, loop_errors)
        self._deadline_passed = guarded("election-deadline", self._deadline_due, loop_errors)

        self._phase = _Phase.STOPPED
        self._stop_waiters: list[defer.Deferred[bool]] = []
        self._pending_events: list[Callable[[], None]] = []
        self._feeding = False

        self._seen: Optional[_Observation] = None  # None before the first read
        self._reported_leader: Optional[str] = None
        self._last_error_kind: Optional[str] = None

    # Public surface -------------------------------------------------------------

    @property
    def config(self) -> LeaderElectionConfig:
        return self._config

    @property
    def is_leader(self) -> bool:
        """True while we hold the lease and have renewed it within renew_deadline."""
        return self._phase is _Phase.LEADER

    @property
    def leader(self) -> Optional[str]:
        """The holder identity last observed on the lease, None while it is free or
        not yet read."""
        if self._seen is None or not self._seen.record.holder_identity:
            return None
        return self._seen.record.holder_identity

    @property
    def running(self) -> bool:
        return self._phase is not _Phase.STOPPED

    def start(self) -> None:
        """Begin competing for the lease. Does nothing when already running; when a
        stop is still releasing the lease, starts again once that is done."""
        self._feed(self._election.start)

    def stop(self, release: Optional[bool] = None) -> "defer.Deferred[bool]":
        """Stop competing: timers and the request in flight are cancelled at once.

        If we were leading, ``on_stopped_leading`` is called before this returns and,
        when ``release`` (default: the config's ``release_on_cancel``) is true, the
        lease is released. The Deferred fires with True if the lease was released,
        False otherwise; no callback fires after this call. ``stop(release=False)``
        leaves the lease to expire, as if the process had died.
        """
        waiter: defer.Deferred[bool] = defer.Deferred()
        self._feed(self._election.stop, waiter, release)
        return waiter

    # Inputs from outside the machine -------------------------------------------------

    def _feed(self, event: Callable[..., None], *args: Any) -> None:
        """Give the machine ``event``, then run the leadership callbacks it decided,
        after the machine is done (an outer ``_feed`` runs them)."""
        if self._feeding:
            event(*args)
            return
        self._feeding = True
        try:
            event(*args)
        finally:
            self._feeding = False
        self._run_events()

    def _deadline_due(self) -> None:
        self._feed(self._election.deadline, self._jittered("election-deadline"))

    # What the transitions of _ELECTION do ---------------------------------------------

    def _started(self) -> None:
        self.log.info("leader election started on lease {lease} as {identity}",
                      lease=self._config.lease_key, identity=self._config.identity)

    def _wait(self, delay: float) -> IDelayedCall:
        """A candidate waits ``delay`` for its next attempt."""
        self._phase = _Phase.CANDIDATE
        return self._reactor.callLater(delay, self._tick_due, self._election.tick)

    def _lead(self, delay: float, attempt: _Attempt) -> _Leading:
        """Leading after ``attempt``: a written lease (re)starts the renew deadline
        from the attempt's start; the next renewal comes ``delay`` later."""
        self._phase = _Phase.LEADER
        leadership = attempt.leadership
        if attempt.written is not None:
            deadline = self._arm_deadline(attempt.started_at)
            if leadership is None:
                leadership = _Leadership(attempt.started_at, deadline)
            else:
                _cancel(leadership.deadline)
                leadership.renewed_at, leadership.deadline = attempt.started_at, deadline
        assert leadership is not None, "only a written lease begins a leadership"
        renewal = self._reactor.callLater(delay, self._tick_due, self._election.renew_due,
                                          leadership)
        return _Leading(leadership, renewal)

    def _begin_attempt(self, leadership: Optional[_Leadership]) -> _Attempt:
        """One attempt; how it ends is the next input. One whose start raises is
        reported (loop ``election-tick``) and ends as not written."""
        attempt = _Attempt(self._reactor.seconds(), leadership)
        try:
            d = self._try_acquire_or_renew(attempt, leadership is not None)
        except Exception:
            report_loop_error("election-tick", Failure(), self._loop_errors)
            self._reading = None
            d = defer.succeed(attempt)
        attempt.deferred = d
        d.addTimeout(self._attempt_timeout(), self._reactor)
        d.addBoth(self._attempt_end, attempt)
        return attempt

    def _attempt_ended(self, attempt: _Attempt, failure: Optional[Failure]) -> None:
        """The leadership callbacks an attempt's end decides, after its transition."""
        if attempt.written is not None:
            self._last_error_kind = None
        elif failure is not None:
            self._log_failure(failure, attempt.leadership)
        self._announce_leader_change()

    def _started_leading(self) -> None:
        self.log.info("{identity} started leading lease {lease} (transitions={transitions})",
                      identity=self._config.identity, lease=self._config.lease_key,
                      transitions=self._observation().record.lease_transitions)
        self._pending_events.append(lambda: self._call(self._on_started_leading))

    def _step_down(self, leadership: _Leadership, reason: str) -> None:
        """We left the leader state: its renew deadline goes, and the callback saying
        so is queued."""
        _cancel(leadership.deadline)
        self.log.warn("{identity} stopped leading lease {lease}: {reason}",
                      identity=self._config.identity, lease=self._config.lease_key,
                      reason=reason)
        self._pending_events.append(lambda: self._call(self._on_stopped_leading))

    def _not_renewed(self, leadership: _Leadership) -> None:
        self._step_down(leadership,
                        f"not renewed for renew_deadline={self._config.renew_deadline}s")

    def _stopping(self, stopped: defer.Deferred[bool], release: Optional[bool],
                  leadership: Optional[_Leadership]) -> None:
        """Stop: nothing is pending any more; a leader calls ``on_stopped_leading``
        now and releases the lease; then ``released`` is the next input."""
        self._phase = _Phase.STOPPED
        self._pending_events.clear()
        self._stop_waiters.append(stopped)
        was_leading = leadership is not None
        if leadership is not None:
            _cancel(leadership.deadline)
        if release is None:
            release = self._config.release_on_cancel
        self.log.info("leader election stopping on lease {lease} as {identity} "
                      "(leading={leading}, release={release})",
                      lease=self._config.lease_key, identity=self._config.identity,
                      leading=was_leading, release=bool(release))
        if was_leading:
            self._call(self._on_stopped_leading)
        if was_leading and release and self._seen is not None:
            done = self._release()
        else:
            done = defer.succeed(False)
        done.addCallback(lambda released: self._feed(self._election.released, released))

    def _stopped(self, released: bool) -> None:
        waiters, self._stop_waiters = self._stop_waiters, []
        self.log.info("leader election stopped on lease {lease} as {identity}",
                      lease=self._config.lease_key, identity=self._config.identity)
        for waiter in waiters:
            waiter.callback(released)

    # Timing rules (all of them) --------------------------------------------------

    def _attempt_timeout(self) -> float:
        """Each attempt is bounded by renew_deadline; a leader's attempt is also cut
        short by its renew deadline timer (``_arm_deadline``)."""
        return self._config.renew_deadline

    def _lease_duration_of(self, record: LeaseRecord) -> float:
        """The lease's own duration counts (a released lease says 1 s); ours when
        the lease carries none."""
        duration = record.lease_duration_seconds
        if not duration or duration <= 0:
            return self._config.lease_duration
        return duration

    def _observed_expiry(self) -> float:
        """Local time at which the observed lease expires if nothing changes."""
        seen = self._observation()
        return seen.since + self._lease_duration_of(seen.record)

    def _observation(self) -> _Observation:
        """The lease as last seen, asked for only after an attempt read or wrote it."""
        assert self._seen is not None, "no lease observed yet"
        return self._seen

    def _is_expired(self, record: LeaseRecord, observed_time: float, now: float) -> bool:
        return observed_time + self._lease_duration_of(record) <= now

    def _candidate_delay(self, attempt: _Attempt) -> float:
        """When a candidate tries next after ``attempt`` (a leader renews every
        retry_period, its failed renewals too):
        - watching a live holder: every retry_period, and exactly at the observed
          expiry if that comes first, so a dead holder is replaced within
          lease_duration + retry_period;
        - after an error, a lost race or losing the lease: client-go's jitter,
          retry_period * (1 + U[0, 1.2)), to spread contending peers.
        """
        if attempt.held_by_other:
            # Never a zero delay: a rounding slip must not become a busy loop.
            until_expiry = self._observed_expiry() - self._reactor.seconds()
            return max(MIN_DELAY, min(self._config.retry_period, until_expiry))
        return self._jittered("election-tick")

    def _jittered(self, loop: str) -> float:
        """retry_period * (1 + U[0, JITTER_FACTOR)); a ``random`` that raises is
        reported as an error of ``loop`` and retry_period answers instead, so the
        next attempt is armed all the same."""
        period = self._config.retry_period
        try:
            return period * (1.0 + self._random() * JITTER_FACTOR)
        except Exception:
            report_loop_error(loop, Failure(), self._loop_errors)
            return period

    def _arm_deadline(self, renewed_at: float) -> IDelayedCall:
        """A leader that has not renewed for renew_deadline stops leading."""
        due = renewed_at + self._config.renew_deadline - self._reactor.seconds()
        return self._reactor.callLater(max(0.0, due), self._deadline_passed)

    # Attempts --------------------------------------------------------------------

    def _record_observation(self, record: LeaseRecord, seen_at: float) -> float:
        """The observed time restarts only when the record changed."""
        if self._seen is None or record != self._seen.record:
            return seen_at
        return self._seen.since

    def _try_acquire_or_renew(self, attempt: _Attempt,
                              leading: bool) -> "defer.Deferred[_Attempt]":
        """One write through the lease writer. A leader renews the lease it wrote
        last, directly; when that conflicts the writer reads the lease again at once
        and the ordinary rules decide (a second attempt). A candidate, or a leader
        that knows no lease, reads first and writes in one attempt: a lost race
        waits for the next tick."""
        cfg = self._config
        self._reading = attempt
        if not leading:
            self._writer.forget()
        attempt.from_known = self._writer.known is not None
        attempts = 2 if attempt.from_known else 1

        def change(current: Optional[Lease]) -> Optional[Lease]:
            if current is not None and current is not attempt.seen:
                # The lease we wrote last: its resourceVersion proves nobody wrote since.
                record = dataclasses.replace(
                    LeaseRecord.from_lease(current), holder_identity=cfg.identity,
                    lease_duration_seconds=cfg.lease_duration_seconds,
                    renew_time=attempt.started_at)
                return with_record(current, record)
            return self._acquire_or_renew(attempt, current)

        d = self._writer.write(change, attempts=attempts)

        def written(result: LeaseWrite) -> _Attempt:
            if result.written:
                attempt.written = result.lease
            return attempt

        return d.addCallback(written)

    def _lease_read(self, lease: Optional[Lease]) -> None:
        """Every read of the lease during an attempt is an observation, whatever is
        written after it."""
        attempt = self._reading
        if attempt is None:
            return
        if attempt.from_known and attempt.seen_at is None:
            self.log.info("lease {lease} changed since our last renewal; reading it again",
                          lease=self._config.lease_key)
        attempt.seen, attempt.seen_at = lease, self._reactor.seconds()

    def _acquire_or_renew(self, attempt: _Attempt, current: Optional[Lease]) -> Optional[Lease]:
        """The lease to write after reading ``current`` (None: absent), or None to
        write nothing (held by a live other holder)."""
        cfg = self._config
        now = self._reactor.seconds()
        if current is None:
            record = LeaseRecord(cfg.identity, cfg.lease_duration_seconds, now, now, 0)
            return build_lease(cfg.lease_name, cfg.lease_namespace, record)
        seen = LeaseRecord.from_lease(current)
        observed_time = self._record_observation(seen, now)
        holder = seen.holder_identity
        if holder and holder != cfg.identity and not self._is_expired(seen, observed_time, now):
            attempt.held_by_other = True
            return None
        if holder == cfg.identity:
            record = LeaseRecord(cfg.identity, cfg.lease_duration_seconds,
                                 seen.acquire_time or now, now, seen.lease_transitions)
        else:
            record = LeaseRecord(cfg.identity, cfg.lease_duration_seconds, now, now,
                                 seen.lease_transitions + 1)
        return with_record(current, record)

    def _attempt_finished(self, result: "_Attempt | Failure", attempt: _Attempt) -> None:
        """How the attempt ended is the next input: we wrote the lease, we saw another
        holder while leading, or nothing was written. A dropped attempt (stop, or the
        renew deadline) is no input: its late answer changes nothing."""
        if self._reading is attempt:
            self._reading = None
        if attempt.dropped:
            return None
        attempt.deferred = None
        failure = result if isinstance(result, Failure) else None
        period = self._config.retry_period
        if attempt.seen is not None:
            # A read records the lease and its time together (``_lease_read``).
            assert attempt.seen_at is not None
            record = LeaseRecord.from_lease(attempt.seen)
            self._seen = _Observation(attempt.seen, record,
                                      self._record_observation(record, attempt.seen_at))
        if attempt.written is not None:
            self._seen = _Observation(attempt.written, LeaseRecord.from_lease(attempt.written),
                                      self._reactor.seconds())
            self._feed(self._election.written, period, attempt)
        elif attempt.leadership is None:
            self._feed(self._election.not_written, self._candidate_delay(attempt), attempt,
                       failure)
        elif (attempt.seen is not None
              and self._observation().record.holder_identity != self._config.identity):
            self._feed(self._election.lost, self._candidate_delay(attempt), attempt)
        else:
            self._feed(self._election.not_written, period, attempt, failure)
        return None

    def _log_failure(self, failure: Failure, leadership: Optional[_Leadership]) -> None:
        """One line per failed attempt while leading (at most renew_deadline /
        retry_period of them); as a candidate, one per change of error kind."""
        kind = _error_kind(failure)
        if not failure.check(KubeError, LeaseWriteFailed, defer.TimeoutError):
            if kind != self._last_error_kind:
                self.log.failure("unexpected error electing on lease {lease} as {identity}",
                                 failure, lease=self._config.lease_key,
                                 identity=self._config.identity)
            self._last_error_kind = kind
            return
        if leadership is not None:
            self.log.warn("{identity} could not renew lease {lease}: {error} "
                          "(deadline in {left:.3f}s)",
                          identity=self._config.identity, lease=self._config.lease_key,
                          error=failure.value,
                          left=leadership.renewed_at + self._config.renew_deadline
                          - self._reactor.seconds())
        elif failure.check(Conflict, LeaseWriteFailed):
            self.log.debug("{identity} lost a race for lease {lease}",
                           identity=self._config.identity, lease=self._config.lease_key)
        elif kind != self._last_error_kind:
            self.log.warn("{identity} could not read or take lease {lease}: {error}",
                          identity=self._config.identity, lease=self._config.lease_key,
                          error=failure.value)
        self._last_error_kind = kind

    def _announce_leader_change(self) -> None:
        """Queue ``on_new_leader`` for the newly observed holder, if it differs from
        the last one reported."""
        holder = self.leader
        if holder is None:
            self._reported_leader = None
            return
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        if holder != self._config.identity:
            self.log.info("{identity} observed new leader {leader} of lease {lease}",
                          identity=self._config.identity, leader=holder,
                          lease=self._config.lease_key)
        self._pending_events.append(lambda: self._call(self._on_new_leader, holder))

    # Leadership callbacks --------------------------------------------------------

    def _run_events(self) -> None:
        """Callbacks run last, after our state is consistent; one that stops the
        elector drops the rest (stop() clears the queue)."""
        while self._pending_events:
            self._pending_events.pop(0)()

    def _call(self, callback: Optional[Callable[..., object]], *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            self.log.failure("leader election callback {callback!r} failed on lease {lease}",
                             callback=callback, lease=self._config.lease_key)

    # Stopping --------------------------------------------------------------------

    def _release(self) -> "defer.Deferred[bool]":
        cfg = self._config
        d = self._write_release()
        d.addTimeout(cfg.renew_deadline, self._reactor)

        def released(written: Optional[Lease]) -> bool:
            if written is None:
                self.log.info("{identity} did not release lease {lease}: no longer its holder",
                              identity=cfg.identity, lease=cfg.lease_key)
                return False
            self._seen = _Observation(written, LeaseRecord.from_lease(written),
                                      self._reactor.seconds())
            self._reported_leader = None
            self.log.info("{identity} released lease {lease}",
                          identity=cfg.identity, lease=cfg.lease_key)
            return True

        def not_released(failure: Failure) -> bool:
            self.log.warn("{identity} could not release lease {lease}: {error}",
                          identity=cfg.identity, lease=cfg.lease_key, error=failure.value)
            return False

        return d.addCallbacks(released, not_released)

    def _write_release(self) -> "defer.Deferred[Optional[Lease]]":
        """Clear the holder, duration 1 s, from the lease we wrote last. A renewal
        cancelled by stop() may still have been written, making that copy stale: on
        a conflict the writer reads the lease again and it is released only if we
        still hold it. Fires with the written lease, or None."""
        cfg = self._config
        self._reading = None

        def change(current: Optional[Lease]) -> Optional[Lease]:
            if current is None:
                return None
            seen = LeaseRecord.from_lease(current)
            if seen.holder_identity != cfg.identity:
                return None
            now = self._reactor.seconds()
            record = LeaseRecord("", RELEASED_LEASE_DURATION_SECONDS, now, now,
                                 seen.lease_transitions)
            return with_record(current, record)

        d = self._writer.write(change, attempts=2)
        return d.addCallback(lambda result: result.lease if result.written else None)


def _cancel(call: IDelayedCall) -> None:
    if call.active():
        call.cancel()


def _build_election() -> TypeMachine[_ElectionInputs, LeaderElector]:
    """The election's life cycle (see ``LeaderElector``)."""
    builder = TypeMachineBuilder(_ElectionInputs, LeaderElector)

    def wait(election: _ElectionInputs, core: LeaderElector, delay: float = 0.0,
             attempt: Optional[_Attempt] = None,
             failure: Optional[Failure] = None) -> IDelayedCall:
        """Started (at once), or after an attempt or the renew deadline (``delay``)."""
        return core._wait(delay)

    def attempt(election: _ElectionInputs, core: LeaderElector) -> _Attempt:
        return core._begin_attempt(None)

    def lead(election: _ElectionInputs, core: LeaderElector, delay: float, attempt: _Attempt,
             failure: Optional[Failure] = None) -> _Leading:
        return core._lead(delay, attempt)

    def renew(election: _ElectionInputs, core: LeaderElector,
              leadership: _Leadership) -> _Attempt:
        return core._begin_attempt(leadership)

    stopped = builder.state("stopped")
    waiting = builder.state("waiting", wait)
    trying = builder.state("trying", attempt)
    leading = builder.state("leading", lead)
    renewing = builder.state("renewing", renew)
    releasing = builder.state("releasing")
    restarting = builder.state("restarting")

    # Starting.
    @pep614(stopped.upon(_ElectionInputs.start).to(waiting))
    def started(election: _ElectionInputs, core: LeaderElector) -> None:
        core._started()

    for running in (waiting, trying, leading, renewing):
        running.upon(_ElectionInputs.start, nodata=True).loop().returns(None)
    releasing.upon(_ElectionInputs.start).to(restarting).returns(None)
    restarting.upon(_ElectionInputs.start).loop().returns(None)

    # Attempts.
    waiting.upon(_ElectionInputs.tick).to(trying).returns(None)
    leading.upon(_ElectionInputs.renew_due).to(renewing).returns(None)

    @pep614(trying.upon(_ElectionInputs.written).to(leading))
    def took_the_lease(election: _ElectionInputs, core: LeaderElector, tried: _Attempt,
                       delay: float, attempt: _Attempt) -> None:
        core._started_leading()
        core._attempt_ended(attempt, None)

    @pep614(renewing.upon(_ElectionInputs.written).to(leading))
    def renewed(election: _ElectionInputs, core: LeaderElector, tried: _Attempt,
                delay: float, attempt: _Attempt) -> None:
        core._attempt_ended(attempt, None)

    @pep614(trying.upon(_ElectionInputs.not_written).to(waiting))
    @pep614(renewing.upon(_ElectionInputs.not_written).to(leading))
    def nothing_written(election: _ElectionInputs, core: LeaderElector, tried: _Attempt,
                        delay: float, attempt: _Attempt, failure: Optional[Failure]) -> None:
        core._attempt_ended(attempt, failure)

    @pep614(renewing.upon(_ElectionInputs.lost).to(waiting))
    def lost(election: _ElectionInputs, core: LeaderElector, tried: _Attempt,
             delay: float, attempt: _Attempt) -> None:
        assert attempt.leadership is not None
        core._step_down(attempt.leadership, "lease now held by "
                        f"{core._observation().record.holder_identity!r}")
        core._attempt_ended(attempt, None)

    # The renew deadline.
    @pep614(leading.upon(_ElectionInputs.deadline).to(waiting))
    def deadline_while_leading(election: _ElectionInputs, core: LeaderElector,
                               current: _Leading, delay: float) -> None:
        _cancel(current.renewal)
        core._not_renewed(current.leadership)

    @pep614(renewing.upon(_ElectionInputs.deadline).to(waiting))
    def deadline_while_renewing(election: _ElectionInputs, core: LeaderElector,
                                renewal: _Attempt, delay: float) -> None:
        renewal.drop()
        assert renewal.leadership is not None
        core._not_renewed(renewal.leadership)

    # Stopping.
    @pep614(stopped.upon(_ElectionInputs.stop).loop())
    def not_running(election: _ElectionInputs, core: LeaderElector,
                    stopped: defer.Deferred[bool], release: Optional[bool]) -> None:
        stopped.callback(False)

    @pep614(waiting.upon(_ElectionInputs.stop).to(releasing))
    def stop_waiting(election: _ElectionInputs, core: LeaderElector, timer: IDelayedCall,
                     stopped: defer.Deferred[bool], release: Optional[bool]) -> None:
        _cancel(timer)
        core._stopping(stopped, release, None)

    @pep614(trying.upon(_ElectionInputs.stop).to(releasing))
    @pep614(renewing.upon(_ElectionInputs.stop).to(releasing))
    def stop_attempt(election: _ElectionInputs, core: LeaderElector, tried: _Attempt,
                     stopped: defer.Deferred[bool], release: Optional[bool]) -> None:
        tried.drop()
        core._stopping(stopped, release, tried.leadership)

    @pep614(leading.upon(_ElectionInputs.stop).to(releasing))
    def stop_leading(election: _ElectionInputs, core: LeaderElector, current: _Leading,
                     stopped: defer.Deferred[bool], release: Optional[bool]) -> None:
        _cancel(current.renewal)
        core._stopping(stopped, release, current.leadership)

    @pep614(releasing.upon(_ElectionInputs.stop).loop())
    @pep614(restarting.upon(_ElectionInputs.stop).to(releasing))
    def stop_again(election: _ElectionInputs, core: LeaderElector,
                   stopped: defer.Deferred[bool], release: Optional[bool]) -> None:
        """Already releasing: the waiter fires with that release."""
        core._stop_waiters.append(stopped)

    @pep614(releasing.upon(_ElectionInputs.released).to(stopped))
    def released(election: _ElectionInputs, core: LeaderElector, released: bool) -> None:
        core._stopped(released)

    @pep614(restarting.upon(_ElectionInputs.released).to(stopped))
    def released_then_start(election: _ElectionInputs, core: LeaderElector,
                            released: bool) -> None:
        core._stopped(released)
        election.start()

    return builder.build()


_ELECTION = _build_election()
