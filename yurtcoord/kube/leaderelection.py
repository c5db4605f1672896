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
- Candidate cadence (``LeaderElector._next_delay``): a candidate watching a live
  holder wakes exactly when the lease would expire, so a dead holder is replaced
  within ``lease_duration + retry_period``. See docs/design.md, "Election timing".

The elector's timers are its only clock: a tick or renew deadline whose handling
raised would leave it in a state that waits for a timer nobody armed (a candidate
that never tries again, a leader that neither renews nor steps down). Both run
guarded (loops ``election-tick`` and ``election-deadline`` of
``yurtcoord.tx.guardedloop``), as does the end of each attempt (counted as a tick):
the error is logged and counted in ``loop_errors`` and ``_rearm`` brings the elector
back to a state with its timers armed.

Once ``stop()`` has been called, no callback fires and no late answer of a cancelled
request changes anything: the elector's state (``_ELECTION``) no longer expects it.
"""

import dataclasses
import enum
import math
import random as random_module
from typing import Any, Callable, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.kube.errors import Conflict, KubeError
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import LeaseRecord, build_lease, with_record
from yurtcoord.kube.leasewriter import Lease, LeaseWrite, LeaseWriteFailed, LeaseWriter
from yurtcoord.tx.fsm import TransitionTable
from yurtcoord.tx.guardedloop import ILoopErrors, guarded

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


class _Election(enum.Enum):
    """Where the elector is (see ``_ELECTION``)."""

    STOPPED = "stopped"        # not competing
    WAITING = "waiting"        # candidate; the next attempt is scheduled
    TRYING = "trying"          # candidate; an attempt is in flight
    LEADING = "leading"        # leader; the next renewal is scheduled, deadline armed
    RENEWING = "renewing"      # leader; a renewal is in flight, deadline armed
    RELEASING = "releasing"    # stop(): a leader's release is being written
    RESTARTING = "restarting"  # releasing, and start() was called meanwhile


_RUNNING = (_Election.WAITING, _Election.TRYING, _Election.LEADING, _Election.RENEWING)
_LEADER = (_Election.LEADING, _Election.RENEWING)

# The whole life cycle. Inputs: ``start``, ``stop``, ``released`` (the stop's
# release ended), ``tick`` (the attempt timer fired), ``written`` / ``lost`` /
# ``not_written`` (how an attempt ended: we wrote the lease; as leader we saw
# another holder; nothing written) and ``deadline`` (the renew deadline passed).
# An attempt cancelled by stop() or the deadline ends in a state that expects no
# attempt to end (no TRYING or RENEWING): its answer is dropped unread.
_ELECTION = TransitionTable("leader election", {
    **{(state, "start"): state for state in _RUNNING},
    (_Election.STOPPED, "start"): _Election.WAITING,
    (_Election.RELEASING, "start"): _Election.RESTARTING,
    (_Election.RESTARTING, "start"): _Election.RESTARTING,
    **{(state, "stop"): _Election.RELEASING for state in _RUNNING},
    (_Election.RELEASING, "stop"): _Election.RELEASING,
    (_Election.RESTARTING, "stop"): _Election.RELEASING,
    (_Election.RELEASING, "released"): _Election.STOPPED,
    (_Election.RESTARTING, "released"): _Election.STOPPED,
    (_Election.WAITING, "tick"): _Election.TRYING,
    (_Election.LEADING, "tick"): _Election.RENEWING,
    (_Election.TRYING, "written"): _Election.LEADING,
    (_Election.TRYING, "not_written"): _Election.WAITING,
    (_Election.RENEWING, "written"): _Election.LEADING,
    (_Election.RENEWING, "not_written"): _Election.LEADING,
    (_Election.RENEWING, "lost"): _Election.WAITING,
    (_Election.LEADING, "deadline"): _Election.WAITING,
    (_Election.RENEWING, "deadline"): _Election.WAITING,
})


@dataclasses.dataclass(frozen=True)
class _Observation:
    """The lease as last read or written (``lease``), its record, and the local time
    that record was first seen (``since``): expiry counts from there."""

    lease: Lease
    record: LeaseRecord
    since: float


class _Attempt:
    """What one try-acquire-or-renew saw and wrote, kept even when it fails midway."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.seen: Optional[Lease] = None
        self.seen_at: Optional[float] = None
        self.written: Optional[Lease] = None
        self.held_by_other = False
        self.from_known = False


def _error_kind(failure: Failure) -> str:
    return type(failure.value).__name__


class LeaderElector:
    """Competes for one Lease through ``lease_client`` and reports leadership through
    the callbacks. See the module docstring for the rules.

    ``lease_client`` has ``get(gvr, name, namespace)``, ``create(gvr, obj,
    namespace=None)`` and ``update(gvr, obj, namespace=None)`` returning Deferreds and
    failing with ``yurtcoord.kube.errors`` types (``KubeClient`` does).
    ``random`` returns floats in [0, 1); inject it to make jitter deterministic.

    Where it is (candidate or leader, waiting or with a request in flight, releasing)
    is one state of ``_ELECTION``; every timer, answer and call is an input checked
    against that table in ``_input``. What it last saw of the lease is one
    ``_Observation``.
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
        # The timers' and attempts' handlers, guarded (see the module docstring).
        self._tick = guarded("election-tick", self._input, loop_errors, self._rearm)
        self._attempt_end = guarded("election-tick", self._attempt_finished, loop_errors,
                                    self._rearm)
        self._deadline_passed = guarded("election-deadline", self._input, loop_errors,
                                        self._rearm)
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

        self._state = _Election.STOPPED
        self._timer: Optional[IDelayedCall] = None
        self._deadline: Optional[IDelayedCall] = None
        self._inflight: Optional[defer.Deferred[Any]] = None
        self._stop_waiters: list[defer.Deferred[bool]] = []
        self._pending_events: list[Callable[[], None]] = []

        self._seen: Optional[_Observation] = None  # None before the first read
        self._renewed_at: Optional[float] = None
        self._reported_leader: Optional[str] = None
        self._last_error_kind: Optional[str] = None

    # Public surface -------------------------------------------------------------

    @property
    def config(self) -> LeaderElectionConfig:
        return self._config

    @property
    def is_leader(self) -> bool:
        """True while we hold the lease and have renewed it within renew_deadline."""
        return self._state in _LEADER

    @property
    def leader(self) -> Optional[str]:
        """The holder identity last observed on the lease, None while it is free or
        not yet read."""
        if self._seen is None or not self._seen.record.holder_identity:
            return None
        return self._seen.record.holder_identity

    @property
    def running(self) -> bool:
        return self._state in _RUNNING

    def start(self) -> None:
        """Begin competing for the lease. Does nothing when already running; when a
        stop is still releasing the lease, starts again once that is done."""
        self._input("start")

    def stop(self, release: Optional[bool] = None) -> "defer.Deferred[bool]":
        """Stop competing: timers and the request in flight are cancelled at once.

        If we were leading, ``on_stopped_leading`` is called before this returns and,
        when ``release`` (default: the config's ``release_on_cancel``) is true, the
        lease is released. The Deferred fires with True if the lease was released,
        False otherwise; no callback fires after this call. ``stop(release=False)``
        leaves the lease to expire, as if the process had died.
        """
        waiter: defer.Deferred[bool] = defer.Deferred()
        if self._state is _Election.STOPPED:
            waiter.callback(False)
            return waiter
        self._stop_waiters.append(waiter)
        self._input("stop", release)
        return waiter

    # The state machine -------------------------------------------------------------

    def _input(self, event: str, *args: Any) -> None:
        """Move along ``_ELECTION`` for ``event``, then run that transition's action."""
        before = self._state
        self._state = _ELECTION.next(before, event)
        actions: dict[str, Callable[..., None]] = {"start": self._on_start, "stop": self._on_stop,
                   "released": self._on_released, "tick": self._on_tick,
                   "written": self._on_attempt_ended, "not_written": self._on_attempt_ended,
                   "lost": self._on_attempt_ended, "deadline": self._on_deadline}
        actions[event](before, *args)

    def _on_start(self, before: _Election) -> None:
        if before is not _Election.STOPPED:
            return
        self.log.info("leader election started on lease {lease} as {identity}",
                      lease=self._config.lease_key, identity=self._config.identity)
        self._schedule(0)

    def _on_stop(self, before: _Election, release: Optional[bool]) -> None:
        if before not in _RUNNING:
            return  # already releasing: the waiter fires with that release
        self._pending_events.clear()
        self._cancel_timer()
        self._cancel_deadline()
        self._cancel_inflight()
        was_leading = before in _LEADER
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
        done.addCallback(lambda released: self._input("released", released))

    def _on_released(self, before: _Election, released: bool) -> None:
        waiters, self._stop_waiters = self._stop_waiters, []
        self.log.info("leader election stopped on lease {lease} as {identity}",
                      lease=self._config.lease_key, identity=self._config.identity)
        for waiter in waiters:
            waiter.callback(released)
        if before is _Election.RESTARTING:
            self.start()

    def _on_tick(self, before: _Election) -> None:
        self._timer = None
        attempt = _Attempt(self._reactor.seconds())
        d = self._try_acquire_or_renew(attempt, before is _Election.LEADING)
        self._inflight = d
        d.addTimeout(self._attempt_timeout(), self._reactor)
        d.addBoth(self._attempt_end, attempt)

    def _on_deadline(self, before: _Election) -> None:
        self._deadline = None
        self._cancel_inflight()
        self._pending_events.append(self._step_down(
            f"not renewed for renew_deadline={self._config.renew_deadline}s"))
        self._schedule(self._jittered(self._config.retry_period))
        self._run_events()

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

    def _renewed(self) -> float:
        """When we last renewed, asked for only while leading."""
        assert self._renewed_at is not None, "never renewed"
        return self._renewed_at

    def _is_expired(self, record: LeaseRecord, observed_time: float, now: float) -> bool:
        return observed_time + self._lease_duration_of(record) <= now

    def _next_delay(self, attempt: Optional[_Attempt]) -> float:
        """When to try next after ``attempt``:
        - leader: every retry_period (renewals, and retries of failed renewals);
        - candidate watching a live holder: every retry_period, and exactly at the
          observed expiry if that comes first, so a dead holder is replaced within
          lease_duration + retry_period;
        - candidate after an error, a lost race or losing the lease: client-go's
          jitter, retry_period * (1 + U[0, 1.2)), to spread contending peers.
        """
        period = self._config.retry_period
        if self._state in _LEADER:
            return period
        if attempt is not None and attempt.held_by_other:
            # Never a zero delay: a rounding slip must not become a busy loop.
            until_expiry = self._observed_expiry() - self._reactor.seconds()
            return max(MIN_DELAY, min(period, until_expiry))
        return self._jittered(period)

    def _jittered(self, period: float) -> float:
        return period * (1.0 + self._random() * JITTER_FACTOR)

    def _arm_deadline(self) -> None:
        """A leader that has not renewed for renew_deadline stops leading."""
        self._cancel_deadline()
        due = self._renewed() + self._config.renew_deadline - self._reactor.seconds()
        self._deadline = self._reactor.callLater(max(0.0, due), self._deadline_passed,
                                                 "deadline")

    # Attempts --------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self._reactor.callLater(delay, self._tick, "tick")

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
        holder while leading, or nothing was written."""
        if self._reading is attempt:
            self._reading = None
        if self._state not in (_Election.TRYING, _Election.RENEWING):
            # Cancelled by stop() or the renew deadline: a late answer changes nothing.
            return None
        self._inflight = None
        if attempt.seen is not None:
            # A read records the lease and its time together (``_lease_read``).
            assert attempt.seen_at is not None
            record = LeaseRecord.from_lease(attempt.seen)
            self._seen = _Observation(attempt.seen, record,
                                      self._record_observation(record, attempt.seen_at))
        if attempt.written is not None:
            self._seen = _Observation(attempt.written, LeaseRecord.from_lease(attempt.written),
                                      self._reactor.seconds())
            self._input("written", attempt, result)
        elif (self._state is _Election.RENEWING and attempt.seen is not None
              and self._observation().record.holder_identity != self._config.identity):
            self._input("lost", attempt, result)
        else:
            self._input("not_written", attempt, result)
        return None

    def _on_attempt_ended(self, before: _Election, attempt: _Attempt,
                          result: "_Attempt | Failure") -> None:
        if attempt.written is not None:
            self._renewed_at = attempt.started_at
            self._last_error_kind = None
            if before is _Election.TRYING:
                self.log.info("{identity} started leading lease {lease} "
                              "(transitions={transitions})",
                              identity=self._config.identity, lease=self._config.lease_key,
                              transitions=self._observation().record.lease_transitions)
                self._pending_events.append(lambda: self._call(self._on_started_leading))
            self._arm_deadline()
        elif self._state is _Election.WAITING and before is _Election.RENEWING:
            self._pending_events.append(self._step_down(
                f"lease now held by {self._observation().record.holder_identity!r}"))
        elif isinstance(result, Failure):
            self._log_failure(result)
        self._schedule(self._next_delay(attempt))
        new_leader = self._leader_change()
        if new_leader is not None:
            self._pending_events.append(lambda: self._call(self._on_new_leader, new_leader))
        self._run_events()

    def _log_failure(self, failure: Failure) -> None:
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
        if self._state in _LEADER:
            self.log.warn("{identity} could not renew lease {lease}: {error} "
                          "(deadline in {left:.3f}s)",
                          identity=self._config.identity, lease=self._config.lease_key,
                          error=failure.value,
                          left=self._renewed() + self._config.renew_deadline
                          - self._reactor.seconds())
        elif failure.check(Conflict, LeaseWriteFailed):
            self.log.debug("{identity} lost a race for lease {lease}",
                           identity=self._config.identity, lease=self._config.lease_key)
        elif kind != self._last_error_kind:
            self.log.warn("{identity} could not read or take lease {lease}: {error}",
                          identity=self._config.identity, lease=self._config.lease_key,
                          error=failure.value)
        self._last_error_kind = kind

    def _leader_change(self) -> Optional[str]:
        """The newly observed holder, if it differs from the last one reported."""
        holder = self.leader
        if holder is None:
            self._reported_leader = None
            return None
        if holder == self._reported_leader:
            return None
        self._reported_leader = holder
        if holder != self._config.identity:
            self.log.info("{identity} observed new leader {leader} of lease {lease}",
                          identity=self._config.identity, leader=holder,
                          lease=self._config.lease_key)
        return holder

    # Leadership changes ----------------------------------------------------------

    def _step_down(self, reason: str) -> Callable[[], None]:
        """We left the leader state; returns the event announcing it."""
        self._cancel_deadline()
        self.log.warn("{identity} stopped leading lease {lease}: {reason}",
                      identity=self._config.identity, lease=self._config.lease_key,
                      reason=reason)
        return lambda: self._call(self._on_stopped_leading)

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

    def _rearm(self, _failure: Failure) -> None:
        """A tick, an attempt's end or the renew deadline raised (already reported):
        an attempt left in flight or half handled ends as not written, which arms the
        next tick; a waiting candidate or leader without a tick gets one; a leader
        keeps its renew deadline; and the leadership callbacks already decided run."""
        if self._state in (_Election.TRYING, _Election.RENEWING):
            dropped, self._inflight = self._inflight, None
            self._reading = None
            self._input("not_written", _Attempt(self._reactor.seconds()), None)
            if dropped is not None:
                dropped.cancel()  # its late end is dropped unread: no attempt expected
        if self._state in (_Election.WAITING, _Election.LEADING) and (
                self._timer is None or not self._timer.active()):
            self._schedule(self._next_delay(None))
        if self._state is _Election.LEADING and self._deadline is None:
            self._arm_deadline()
        self._run_events()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _cancel_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def _cancel_inflight(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.cancel()
