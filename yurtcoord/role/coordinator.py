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
"""

import enum
from typing import TYPE_CHECKING, Any, Callable, Generator, List, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.pool.interfaces import IPoolStore, IRoleComponent
from yurtcoord.role.roles import Role
from yurtcoord.tx.fsm import TransitionTable
from yurtcoord.tx.guardedloop import ILoopErrors, guarded
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


class _Life(enum.Enum):
    """Where the coordinator's role steps are (see ``_LIFE``)."""

    IDLE = "idle"          # the current role's steps are done (or role init)
    APPLYING = "applying"  # one run of role steps is in progress
    WAITING = "waiting"    # the last run failed; its retry is scheduled
    STOPPING = "stopping"  # stop() cancelled the run in progress
    STOPPED = "stopped"    # components stopped, pool store closed, for good


# The whole life cycle. Inputs: ``role`` (a new role), ``done``/``failed``/
# ``superseded`` (how a run ended), ``retry`` (the retry delay passed), ``stop``.
_LIFE = TransitionTable("coordinator", {
    (_Life.IDLE, "role"): _Life.APPLYING,
    (_Life.APPLYING, "role"): _Life.APPLYING,
    (_Life.WAITING, "role"): _Life.APPLYING,
    (_Life.STOPPING, "role"): _Life.STOPPING,
    (_Life.STOPPED, "role"): _Life.STOPPED,
    (_Life.APPLYING, "done"): _Life.IDLE,
    (_Life.APPLYING, "failed"): _Life.WAITING,
    (_Life.APPLYING, "superseded"): _Life.APPLYING,
    (_Life.WAITING, "retry"): _Life.APPLYING,
    (_Life.IDLE, "stop"): _Life.STOPPED,
    (_Life.WAITING, "stop"): _Life.STOPPED,
    (_Life.APPLYING, "stop"): _Life.STOPPING,
    (_Life.STOPPING, "done"): _Life.STOPPED,
    (_Life.STOPPING, "failed"): _Life.STOPPED,
    (_Life.STOPPING, "superseded"): _Life.STOPPED,
})


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
    either of them raising would leave the role's steps undone with no retry armed
    (``applying`` for good, the agent never ready). Both run guarded
    (``yurtcoord.tx.guardedloop``) and ``_rearm_retry`` arms the retry again.

    The life cycle is the transition table ``_LIFE``: every input goes through
    ``_input``, which moves to the table's next state and then runs the action of
    that transition. An input the table does not list for the current state raises.
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
        self._retry = guarded("role-retry", self._input, loop_errors, self._rearm_retry)
        self._run_end = guarded("role-retry", self._run_ended_with, loop_errors,
                                self._rearm_retry)
        self.node_name = node_name
        self._open_pool_store = open_pool_store
        self._pool_sync = _ComponentSlot("pool sync", pool_sync, node_name)
        self._delegation = _ComponentSlot("heartbeat delegation", delegation, node_name)
        self._detector = _ComponentSlot("synced detection", synced_detector,
                                        node_name)
        self._upload_local_cache = upload_local_cache
        self._retry_delay = retry_delay or ROLE_RETRY

        self._life = _Life.IDLE
        self.role = Role.INIT
        self.store: Optional[IPoolStore] = None
        self.pool_cache_synced = False
        self.need_upload_local_cache = True
        self.uploaded_objects = 0
        self.failed_attempts = 0
        self.last_error: Optional[str] = None
        self._step = "start"
        self._run: Optional[defer.Deferred[None]] = None
        self._retry_call: Optional[IDelayedCall] = None
        self._stopped: Optional[defer.Deferred[None]] = None
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
        return self._life in (_Life.APPLYING, _Life.WAITING, _Life.STOPPING)

    def readiness_failures(self) -> List[str]:
        if not self.healthy:
            return [f"coordinator not healthy (role {self.role.value})"]
        failures: List[str] = []
        if self._life is not _Life.IDLE:
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
        self._input("role", role)

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
        if self._life in (_Life.STOPPING, _Life.STOPPED):
            return defer.succeed(None)
        self._stopped = defer.Deferred()
        stopped = self._stopped
        self._input("stop")
        return stopped

    # -- the state machine -------------------------------------------------------

    def _input(self, event: str, *args: Any) -> None:
        """Move along ``_LIFE`` for ``event`` and run that transition's action."""
        before = self._life
        self._life = _LIFE.next(before, event)
        actions: dict[str, Callable[..., None]] = {
            "role": self._on_role, "done": self._on_done, "failed": self._on_failed,
            "superseded": self._on_superseded, "retry": self._on_retry,
            "stop": self._on_stop}
        actions[event](before, *args)

    def _on_role(self, before: _Life, role: Role) -> None:
        if before in (_Life.STOPPING, _Life.STOPPED):
            return
        previous, self.role = self.role, role
        self.failed_attempts = 0
        self._cancel_retry()
        self.log.info("role {previous} -> {role} on node {node}",
                      previous=previous.value, role=role.value, node=self.node_name)
        self._role_observers.notify(previous, role)
        self._changed()
        if before is _Life.APPLYING:
            if self._run is not None:
                self.log.info("role {role} cancels step {step} of role {previous} on "
                              "node {node}", role=role.value, step=self._step,
                              previous=previous.value, node=self.node_name)
                self._run.cancel()
            # else: the run is still in its first synchronous part; _start_run
            # cancels it as soon as it returns.
        else:
            self._start_run()

    def _on_done(self, before: _Life) -> None:
        if before is _Life.STOPPING:
            self._shut_down()
            return
        self.failed_attempts = 0
        self.last_error = None
        self._changed()

    def _on_failed(self, before: _Life, role: Role, error: BaseException) -> None:
        if before is _Life.STOPPING:
            self._shut_down()
            return
        self.failed_attempts += 1
        self.last_error = f"{self._step}: {error}"
        delay = self._retry_delay(self.failed_attempts)
        self.log.warn("step {step} of role {role} failed on node {node}: {error}; "
                      "retry {attempt} in {delay}s",
                      step=self._step, role=role.value, node=self.node_name,
                      error=error, attempt=self.failed_attempts, delay=delay)
        self._retry_call = self._reactor.callLater(delay, self._retry, "retry")
        self._changed()

    def _on_superseded(self, before: _Life) -> None:
        if before is _Life.STOPPING:
            self._shut_down()
            return
        self._start_run()

    def _on_retry(self, before: _Life) -> None:
        self._retry_call = None
        self._start_run()

    def _on_stop(self, before: _Life) -> None:
        self._cancel_retry()
        if before is _Life.APPLYING:
            if self._run is not None:
                self._run.cancel()
            return
        self._shut_down()

    def _shut_down(self) -> None:
        stopped = self._stop_components(self._pool_sync, self._delegation, self._detector)
        self._drop_store_after(stopped).addCallback(self._shut_down_done)

    def _shut_down_done(self, _result: object) -> None:
        self._changed()
        # Only stop() leads here, and it made the Deferred first.
        if self._stopped is not None:
            self._stopped.callback(None)

    def _start_run(self) -> None:
        """Run the current role's steps; how the run ends is the next input."""
        role = self.role
        self._step = "start"
        run = self._apply(role)
        if not run.called:
            self._run = run
            if role != self.role:
                # The role changed during the run's synchronous first part.
                run.cancel()
        run.addBoth(self._run_end, role)

    def _run_ended_with(self, result: object, role: Role) -> None:
        """A run of ``role`` ended with ``result``: done, failed, or superseded (its
        role is no longer the current one, or it was cancelled)."""
        self._run = None
        if isinstance(result, Failure):
            if role != self.role or result.check(defer.CancelledError, _Superseded):
                self._input("superseded")
            else:
                self._input("failed", role, result.value)
        elif role != self.role:
            self._input("superseded")
        else:
            self._input("done")

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
        if role != self.role or self._life is not _Life.APPLYING:
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

    def _rearm_retry(self, failure: Failure) -> None:
        """A retry or a run's end raised (already reported): a run that is no longer
        running counts as failed, and a failed run without its retry timer gets one,
        so the steps of the current role are tried again."""
        if self._life is _Life.APPLYING and self._run is None:
            self._input("failed", self.role, failure.value)
        elif self._life is _Life.WAITING and (
                self._retry_call is None or not self._retry_call.active()):
            delay = self._retry_delay(max(1, self.failed_attempts))
            self._retry_call = self._reactor.callLater(delay, self._retry, "retry")

    def _cancel_retry(self) -> None:
        if self._retry_call is not None:
            if self._retry_call.active():
                self._retry_call.cancel()
            self._retry_call = None
