"""The coordinator: applies the hub role to the pool store and the role components.

Only the newest role counts: at most one run of role steps is in progress, and
it applies one role. A role change cancels the step that run
waits on (an upload, opening the pool store, a component start): the run drops
the old role's work at once and goes on with the newest role in the same
reactor turn, so an agent that stops leading stops pool sync and heartbeat
delegation before anything that may wait. A run whose role is no longer the
current one applies none of its results (a store it opened is closed again); its
cancellation is not a failure. A failed step is retried with capped backoff
until it succeeds or the role changes. The local cache counts as uploaded only
after an upload really succeeded: a cancelled upload runs again in the next
healthy role.

Role steps:

- pending: stop pool sync, delegation and synced detection; close the pool
  store; the local cache needs uploading again; not synced.
- leader: open the pool store (reused if one is open; a store dropped by pending
  is never reused), then start pool sync, delegation and synced detection on it,
  then upload the local cache if needed.
- follower: stop pool sync and delegation, open the pool store, start synced
  detection, upload the local cache if needed.

Stopping is never cancelled: a component's ``stop()`` is called in the turn the
role changes, and a later start waits for that stop to finish, so start and stop
alternate as ``IRoleComponent`` promises.

Longer than 600 lines on purpose: the steps of each role and the machine that runs
them (``_build_life``) are one life cycle; the machine's transitions name the steps,
and the steps' order is the role contract above.
"""

import enum
from typing import TYPE_CHECKING, Any, Callable, Generator, List, Optional, Protocol

from automat import TypeMachine, TypeMachineBuilder, pep614

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.pool.interfaces import IPoolStore, IRoleComponent
from yurtcoord.role.roles import Role
from yurtcoord.tx.guardedloop import ILoopErrors, guarded, report_loop_error
from yurtcoord.tx.observers import Observers
from yurtcoord.tx.retry import ROLE_RETRY, RetryPolicy

if TYPE_CHECKING:
    from yurtcoord.pool.uploader import UploadCounts


def _uploaded_count(counts: "UploadCounts") -> int:
    """Objects of the node's cache that the pool holds after an upload: created,
    updated, or already there at the same or a newer version, as a re-upload after a
    role change finds everything there."""
    return counts.created + counts.updated + counts.skipped_not_newer


class _Superseded(Exception):
    """The role changed while a step was in progress: drop this run."""


def _wait_for(d: defer.Deferred[Any]) -> defer.Deferred[None]:
    """A Deferred that fires when ``d`` does; cancelling it ends the wait, not ``d``.

    For the work a role change must not cut short: a component stopping, a store
    closing.
    """
    waiter: defer.Deferred[None] = defer.Deferred()

    def relay(result: object) -> object:
        if not waiter.called:
            waiter.callback(None)
        return result

    d.addBoth(relay)
    return waiter


class _ComponentSlot:
    """A role component and what the coordinator did with it last.

    ``store`` is the store it was started on (None: stopped). A stop counts from the
    moment ``stop()`` is called; ``stopped()`` fires once the component's own stop
    has finished.
    """

    log = Logger()

    def __init__(self, name: str, component: IRoleComponent, node_name: str) -> None:
        self.name = name
        self.component = component
        self.node_name = node_name
        self.store: Optional[IPoolStore] = None
        self._stopping: Optional[defer.Deferred[None]] = None

    @property
    def running(self) -> bool:
        return self.store is not None

    def stop(self) -> None:
        """Call the component's ``stop()`` now, if it runs.

        A failed stop is logged and counts as stopped: its ``stop()`` promises that
        nothing of the component is left running once it fired."""
        if self.store is not None:
            self.store = None
            stopping = defer.maybeDeferred(self.component.stop)
            stopping.addCallbacks(self._stop_done, self._stop_failed)
            if not stopping.called:
                self._stopping = stopping

    def stopped(self) -> defer.Deferred[None]:
        """Fires when no stop of the component is in progress (at once when none is)."""
        if self._stopping is None:
            return defer.succeed(None)
        return _wait_for(self._stopping)

    def _stop_done(self, _result: object) -> None:
        self._stopping = None
        self.log.info("{component} stopped on node {node}", component=self.name,
                      node=self.node_name)

    def _stop_failed(self, failure: Failure) -> None:
        self._stopping = None
        self.log.warn("stopping {component} failed on node {node}: {error}",
                      component=self.name, node=self.node_name,
                      error=failure.getErrorMessage())


class _Progress(enum.Enum):
    """How far the current role's steps are, as readiness and the status pages read it;
    each transition of ``_LIFE`` that changes it says so."""

    DONE = "done"            # idle: the current role's steps are done (or role init)
    UNDER_WAY = "under way"  # a run is in progress, or waits for its retry
    STOPPING = "stopping"    # stop() cancelled the run in progress
    STOPPED = "stopped"      # components stopped, pool store closed, for good


class _LifeInputs(Protocol):
    """The inputs of the coordinator's life cycle (``_LIFE``)."""

    def role_changed(self, role: Role) -> None:
        """The hub elector named ``role``, a role other than the current one."""

    def run_done(self) -> None:
        """The run of role steps did every step of the current role."""

    def run_failed(self, error: BaseException) -> None:
        """A step of the current role's run failed with ``error``."""

    def run_superseded(self) -> None:
        """The run ended cancelled, or for a role that is no longer the current one."""

    def retry_due(self) -> None:
        """The pause after a failed run has passed."""

    def stop(self, stopped: "defer.Deferred[None]") -> None:
        """Stop for good; ``stopped`` fires once components and store are stopped."""


class _Run:
    """The run of role steps in flight: the Deferred its role's steps wait on (None
    once it ended, while its end is being told)."""

    def __init__(self) -> None:
        self.deferred: Optional[defer.Deferred[None]] = None


class Coordinator:
    """Reacts to role changes (``set_role``) and tells its observers about role and
    readiness changes; the status pages, the metrics and the sandbox subscribe.

    Collaborators:

    - ``open_pool_store()`` → Deferred(store); ``store.close()`` (may return a
      Deferred) releases it.
    - ``pool_sync``, ``delegation``, ``synced_detector``: IRoleComponent
      (``start(store)``/``stop()``). The synced detector reports through
      ``set_pool_cache_synced(bool)``.
    - ``upload_local_cache(store)`` → Deferred firing with the uploader's
      ``UploadCounts`` and errbacking when the upload failed.
    - ``retry_delay(attempt)`` → seconds before retry ``attempt`` (1, 2, ...) of
      a failed run: a ``yurtcoord.tx.retry`` policy, ``ROLE_RETRY`` by default.
    - ``loop_errors``: where an unexpected error of the retry loop is counted (loop
      ``role-retry``; the agent's metrics, or None).

    A failed run is retried by a timer, and each run's end decides the next retry:
    both run guarded (loop ``role-retry`` of ``yurtcoord.tx.guardedloop``). The retry
    policy is the one step there that may raise: ``_retry_after`` reports that and
    waits ``ROLE_RETRY``'s pause instead, so a failed run always has its retry armed
    (else ``applying`` for good, the agent never ready).

    The life cycle is the Automat machine ``_LIFE``: its states are idle, applying
    (holding the run in flight), waiting (holding the retry timer), stopping (holding
    the stop's Deferred) and stopped; the timer and the run exist only in the states
    that hold them. An input the machine has no transition for in its state raises
    ``automat.NoTransition``. An input that arrives while a transition runs (the end
    of a run that ends in the turn it starts, a role set by an observer) is taken
    once that transition is done.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, node_name: str,
                 open_pool_store: Callable[[], defer.Deferred[Any]],
                 pool_sync: IRoleComponent, delegation: IRoleComponent,
                 synced_detector: IRoleComponent,
                 upload_local_cache: Callable[[IPoolStore], defer.Deferred["UploadCounts"]],
                 retry_delay: Optional[RetryPolicy] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._loop_errors = loop_errors
        self._life: _LifeInputs = _LIFE(self)
        self._retry_due = guarded("role-retry", self._life.retry_due, loop_errors)
        self._run_end = guarded("role-retry", self._run_ended_with, loop_errors)
        self.node_name = node_name
        self._open_pool_store = open_pool_store
        self._pool_sync = _ComponentSlot("pool sync", pool_sync, node_name)
        self._delegation = _ComponentSlot("heartbeat delegation", delegation, node_name)
        self._detector = _ComponentSlot("synced detection", synced_detector,
                                        node_name)
        self._upload_local_cache = upload_local_cache
        self._retry_delay = retry_delay or ROLE_RETRY

        self._progress = _Progress.DONE
        self.role = Role.INIT
        self.store: Optional[IPoolStore] = None
        self.pool_cache_synced = False
        self.need_upload_local_cache = True
        self.uploaded_objects = 0
        self.failed_attempts = 0
        self.last_error: Optional[str] = None
        self._step = "start"
        self._role_observers: Observers[[Role, Role]] = Observers(
            f"role changes on node {node_name}")
        self._readiness_observers: Observers[[bool]] = Observers(
            f"readiness changes on node {node_name}")
        self._last_ready = False

    # -- what the status pages and metrics read ---------------------------------

    @property
    def healthy(self) -> bool:
        return self.role.is_healthy

    @property
    def ready(self) -> bool:
        return not self.readiness_failures()

    @property
    def local_cache_uploaded(self) -> bool:
        return not self.need_upload_local_cache

    @property
    def applying(self) -> bool:
        """True while a run of role steps is in progress or waits for its retry."""
        return self._progress in (_Progress.UNDER_WAY, _Progress.STOPPING)

    def readiness_failures(self) -> List[str]:
        if not self.healthy:
            return [f"coordinator not healthy (role {self.role.value})"]
        failures: List[str] = []
        if self._progress is not _Progress.DONE:
            detail = f" (last error: {self.last_error})" if self.last_error else ""
            failures.append(f"steps of role {self.role.value} not done yet{detail}")
        if not self.pool_cache_synced:
            failures.append("pool cache not synced")
        if self.need_upload_local_cache:
            failures.append("local cache not uploaded")
        if self.store is not None and self.store.unreachable is not None:
            failures.append(f"pool etcd unreachable: {self.store.unreachable}")
        return failures

    # -- observers ---------------------------------------------------------------

    def add_role_observer(self, observer: Callable[[Role, Role], None]) -> None:
        """Call ``observer(previous, role)`` after every role change, in the turn it
        happens; a failing observer is logged and changes nothing."""
        self._role_observers.add(observer)

    def add_readiness_observer(self, observer: Callable[[bool], None]) -> None:
        """Call ``observer(ready)`` each time ``ready`` flips, in the turn it does; a
        failing observer is logged and changes nothing."""
        self._readiness_observers.add(observer)

    def _changed(self) -> None:
        """Something readiness depends on may have changed: tell the readiness
        observers if it flipped."""
        ready = self.ready
        if ready != self._last_ready:
            self._last_ready = ready
            self._readiness_observers.notify(ready)

    # -- inputs ------------------------------------------------------------------

    def set_role(self, role: Role | str) -> None:
        """The hub elector's newest role; supersedes everything older.

        The step the run waits on is cancelled, and the run goes on with this role
        before this call returns (up to its first step that has to wait)."""
        role = Role(role)
        if role == self.role:
            return
        self._life.role_changed(role)

    def set_pool_cache_synced(self, synced: bool) -> None:
        """Called by the synced detector. Ignored while detection is not running,
        so a late report after pending cannot mark a dropped cache as synced."""
        synced = bool(synced)
        if synced and not (self._detector.running and self.healthy):
            return
        if synced != self.pool_cache_synced:
            self.pool_cache_synced = synced
            self.log.info("pool cache synced={synced} on node {node}",
                          synced=synced, node=self.node_name)
            self._changed()

    def stop(self) -> defer.Deferred[None]:
        """Cancel the step in progress, stop every component and close the pool
        store, exactly once each. The first call fires once all of that is done,
        later ones at once."""
        stopped: defer.Deferred[None] = defer.Deferred()
        self._life.stop(stopped)
        return stopped

    # -- what the transitions of _LIFE do ---------------------------------------

    def _announce(self, role: Role) -> None:
        """``role`` is the current role from now on: observers learn it in this turn."""
        previous, self.role = self.role, role
        self.failed_attempts = 0
        self.log.info("role {previous} -> {role} on node {node}",
                      previous=previous.value, role=role.value, node=self.node_name)
        self._role_observers.notify(previous, role)
        self._changed()

    def _start_run(self, life: _LifeInputs, run: _Run) -> _Run:
        """Run the current role's steps in ``run``; how it ends is the next input."""
        role = self.role
        self._step = "start"
        d = self._apply(role)
        run.deferred = None if d.called else d
        d.addBoth(self._run_end, role, life)
        return run

    def _run_ended_with(self, result: object, role: Role, life: _LifeInputs) -> None:
        """A run of ``role`` ended with ``result``: done, failed, or superseded (its
        role is no longer the current one, or it was cancelled)."""
        if isinstance(result, Failure):
            if role != self.role or result.check(defer.CancelledError, _Superseded):
                life.run_superseded()
            else:
                life.run_failed(result.value or Exception(result.getErrorMessage()))
        elif role != self.role:
            life.run_superseded()
        else:
            life.run_done()

    def _cancel_run(self, run: _Run, role: Role, previous: Role) -> None:
        """A newer role, or stop(), drops the run: the step it waits on is cancelled
        and its end (superseded) is the next input."""
        if run.deferred is not None:
            self.log.info("role {role} cancels step {step} of role {previous} on "
                          "node {node}", role=role.value, step=self._step,
                          previous=previous.value, node=self.node_name)
            run.deferred.cancel()

    def _retry_later(self, life: _LifeInputs, error: BaseException) -> IDelayedCall:
        """The run failed: count it and arm the retry."""
        self.failed_attempts += 1
        self.last_error = f"{self._step}: {error}"
        delay = self._retry_after(self.failed_attempts)
        self.log.warn("step {step} of role {role} failed on node {node}: {error}; "
                      "retry {attempt} in {delay}s",
                      step=self._step, role=self.role.value, node=self.node_name,
                      error=error, attempt=self.failed_attempts, delay=delay)
        return self._reactor.callLater(delay, self._retry_due)

    def _retry_after(self, attempt: int) -> float:
        """The policy's pause before retry ``attempt``; a policy that raises is
        reported (loop ``role-retry``) and ``ROLE_RETRY`` answers instead, so the
        retry is armed all the same."""
        try:
            return self._retry_delay(attempt)
        except Exception:
            report_loop_error("role-retry", Failure(), self._loop_errors)
            return ROLE_RETRY(attempt)

    def _steps_done(self) -> None:
        self._progress = _Progress.DONE
        self.failed_attempts = 0
        self.last_error = None
        self._changed()

    def _shut_down(self, stopped: defer.Deferred[None]) -> None:
        """Stop every component and close the pool store; then ``stopped`` fires."""
        self._progress = _Progress.STOPPED
        done = self._stop_components(self._pool_sync, self._delegation, self._detector)

        def shut_down(_result: object) -> None:
            self._changed()
            stopped.callback(None)

        self._drop_store_after(done).addCallback(shut_down)

    def _apply(self, role: Role) -> defer.Deferred[None]:
        if role == Role.LEADER:
            d = self._apply_leader(role)
        elif role == Role.FOLLOWER:
            d = self._apply_follower(role)
        elif role == Role.PENDING:
            d = self._apply_pending()
        else:
            d = defer.succeed(None)
        return d

    def _check(self, role: Role) -> None:
        if role != self.role:
            raise _Superseded()

    @defer.inlineCallbacks
    def _apply_pending(self) -> Generator[defer.Deferred[Any], Any, None]:
        self.need_upload_local_cache = True
        self._step = "stop components, close pool store"
        stopped = self._stop_components(self._pool_sync, self._delegation, self._detector)
        yield _wait_for(self._drop_store_after(stopped))

    @defer.inlineCallbacks
    def _apply_leader(self, role: Role) -> Generator[defer.Deferred[Any], Any, None]:
        store = yield self._ensure_store(role)
        for slot in (self._pool_sync, self._delegation, self._detector):
            self._step = f"start {slot.name}"
            yield self._ensure_started(slot, store)
            self._check(role)
        yield self._upload_if_needed(store, role)

    @defer.inlineCallbacks
    def _apply_follower(self, role: Role) -> Generator[defer.Deferred[Any], Any, None]:
        self._step = "stop leader components"
        yield _wait_for(self._stop_components(self._pool_sync, self._delegation))
        self._check(role)
        store = yield self._ensure_store(role)
        self._step = f"start {self._detector.name}"
        yield self._ensure_started(self._detector, store)
        self._check(role)
        yield self._upload_if_needed(store, role)

    @defer.inlineCallbacks
    def _ensure_store(self, role: Role) -> Generator[defer.Deferred[Any], Any, IPoolStore]:
        if self.store is not None:
            return self.store
        self._step = "open pool store"
        store = yield self._open_pool_store()
        if role != self.role or self._progress is not _Progress.UNDER_WAY:
            yield _wait_for(self._close_quietly(store))
            raise _Superseded()
        self.store = store
        store.on_unreachable_change(self._store_unreachable_changed)
        self._changed()
        return store

    def _store_unreachable_changed(self, _reason: Optional[str]) -> None:
        """The pool etcd became unreachable or answers again: readiness follows."""
        self._changed()

    @defer.inlineCallbacks
    def _ensure_started(self, slot: _ComponentSlot,
                        store: IPoolStore) -> Generator[defer.Deferred[Any], Any, None]:
        if slot.store is store:
            return
        # Start only after the last stop finished, also one of a superseded run.
        yield _wait_for(self._stop_components(slot))
        # Marked running before start() returns: a component may report (e.g.
        # "synced") from inside its start.
        slot.store = store
        try:
            yield slot.component.start(store)
        except BaseException:
            slot.store = None
            raise
        self.log.info("{component} started on node {node}",
                      component=slot.name, node=self.node_name)

    def _stop_components(self, *slots: _ComponentSlot) -> defer.Deferred[Any]:
        """Call the ``stop()`` of each running slot now, in this turn.

        Returns a Deferred that fires (never fails) once no stop of them is in
        progress. A run waits on it through ``_wait_for``: a stop goes on when the
        run is cancelled."""
        for slot in slots:
            slot.stop()
        if self._detector in slots and self.pool_cache_synced:
            self.pool_cache_synced = False
            self._changed()
        return defer.DeferredList([slot.stopped() for slot in slots])

    @defer.inlineCallbacks
    def _upload_if_needed(self, store: IPoolStore,
                          role: Role) -> Generator[defer.Deferred[Any], Any, None]:
        if not self.need_upload_local_cache:
            return
        self._step = "upload local cache"
        counts = yield self._upload_local_cache(store)
        self._check(role)
        uploaded = _uploaded_count(counts)
        self.uploaded_objects = uploaded
        self.need_upload_local_cache = False
        self.log.info("local cache uploaded from node {node}: {uploaded} objects",
                      node=self.node_name, uploaded=uploaded)
        self._changed()

    def _drop_store_after(self, stopped: defer.Deferred[Any]) -> defer.Deferred[Any]:
        """The pool store is never used again; it closes once ``stopped`` fired (the
        components stopped), also when a newer role cancels the run meanwhile.
        Returns ``stopped``, firing after the close."""
        store, self.store = self.store, None
        if store is not None:
            store.remove_unreachable_observer(self._store_unreachable_changed)
            self._changed()
            stopped.addCallback(lambda _: self._close_quietly(store))
        return stopped

    def _close_quietly(self, store: IPoolStore) -> defer.Deferred[Any]:
        """Close ``store``; the returned Deferred never fails (a failure is logged)."""
        closing = defer.maybeDeferred(store.close)
        closing.addErrback(lambda failure: self.log.warn(
            "closing the pool store failed on node {node}: {error}",
            node=self.node_name, error=failure.getErrorMessage()))
        return closing


def _build_life() -> TypeMachine[_LifeInputs, Coordinator]:
    """The coordinator's life cycle. A role change while a run is in progress
    cancels it, and its end (superseded) starts the newest role's run; stop() waits
    for the run in progress to end before it stops components and store."""
    builder = TypeMachineBuilder(_LifeInputs, Coordinator)

    def begin_run(life: _LifeInputs, core: Coordinator, role: Optional[Role] = None) -> _Run:
        core._progress = _Progress.UNDER_WAY
        if role is not None:
            core._announce(role)
        return core._start_run(life, _Run())

    def retry_later(life: _LifeInputs, core: Coordinator, error: BaseException) -> IDelayedCall:
        return core._retry_later(life, error)

    def stopping(life: _LifeInputs, core: Coordinator,
                 stopped: defer.Deferred[None]) -> defer.Deferred[None]:
        core._progress = _Progress.STOPPING
        return stopped

    idle = builder.state("idle")
    applying = builder.state("applying", begin_run)
    waiting = builder.state("waiting", retry_later)
    stopping_ = builder.state("stopping", stopping)
    stopped_ = builder.state("stopped")

    idle.upon(_LifeInputs.role_changed).to(applying).returns(None)
    waiting.upon(_LifeInputs.retry_due).to(applying).returns(None)
    applying.upon(_LifeInputs.run_failed).to(waiting).returns(None)

    @pep614(applying.upon(_LifeInputs.role_changed).loop())
    def newer_role(life: _LifeInputs, core: Coordinator, run: _Run, role: Role) -> None:
        previous = core.role
        core._announce(role)
        core._cancel_run(run, role, previous)

    @pep614(applying.upon(_LifeInputs.run_superseded).loop())
    def run_newest_role(life: _LifeInputs, core: Coordinator, run: _Run) -> None:
        core._start_run(life, run)

    @pep614(applying.upon(_LifeInputs.run_done).to(idle))
    def done(life: _LifeInputs, core: Coordinator, run: _Run) -> None:
        core._steps_done()

    @pep614(waiting.upon(_LifeInputs.role_changed).to(applying))
    def role_while_waiting(life: _LifeInputs, core: Coordinator, retry: IDelayedCall,
                           role: Role) -> None:
        retry.cancel()

    @pep614(applying.upon(_LifeInputs.stop).to(stopping_))
    def stop_run(life: _LifeInputs, core: Coordinator, run: _Run,
                 stopped: defer.Deferred[None]) -> None:
        core._cancel_run(run, core.role, core.role)

    @pep614(idle.upon(_LifeInputs.stop).to(stopped_))
    def stop_idle(life: _LifeInputs, core: Coordinator, stopped: defer.Deferred[None]) -> None:
        core._shut_down(stopped)

    @pep614(waiting.upon(_LifeInputs.stop).to(stopped_))
    def stop_waiting(life: _LifeInputs, core: Coordinator, retry: IDelayedCall,
                     stopped: defer.Deferred[None]) -> None:
        retry.cancel()
        core._shut_down(stopped)

    @pep614(stopping_.upon(_LifeInputs.run_done).to(stopped_))
    @pep614(stopping_.upon(_LifeInputs.run_superseded).to(stopped_))
    def run_ended_stopping(life: _LifeInputs, core: Coordinator,
                           stopped: defer.Deferred[None]) -> None:
        core._shut_down(stopped)

    @pep614(stopping_.upon(_LifeInputs.run_failed).to(stopped_))
    def run_failed_stopping(life: _LifeInputs, core: Coordinator,
                            stopped: defer.Deferred[None], error: BaseException) -> None:
        core._shut_down(stopped)

    # Stopping is for good: a later role changes nothing, and only the first
    # stop() waits; later ones fire at once.
    @pep614(stopping_.upon(_LifeInputs.role_changed, nodata=True).loop())
    @pep614(stopped_.upon(_LifeInputs.role_changed).loop())
    def role_ignored(life: _LifeInputs, core: Coordinator, role: Role) -> None:
        pass

    @pep614(stopping_.upon(_LifeInputs.stop, nodata=True).loop())
    @pep614(stopped_.upon(_LifeInputs.stop).loop())
    def already_stopping(life: _LifeInputs, core: Coordinator,
                         stopped: defer.Deferred[None]) -> None:
        stopped.callback(None)

    return builder.build()


_LIFE = _build_life()
