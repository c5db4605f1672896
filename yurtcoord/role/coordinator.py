"""The coordinator: applies the hub role to the pool store and the role components.

Only the newest role counts: every role change bumps a generation and at most
one run of role steps is in progress. A role change cancels the step that run
waits on (an upload, opening the pool store, a component start): the run drops
the old role's work at once and goes on with the newest role in the same
reactor turn, so an agent that stops leading stops pool sync and heartbeat
delegation before anything that may wait. A run whose generation is no longer
current applies none of its results (a store it opened is closed again); its
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

from typing import Callable

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.role.roles import Role
from yurtcoord.agent.status import IStatusSource, rfc3339
from yurtcoord.tx.retry import ROLE_RETRY


def _uploaded_count(counts):
    """Objects of the node's cache that the pool holds after an upload, from an int or
    the uploader's counts (``uploaded``, or ``created`` + ``updated`` +
    ``skipped_not_newer``, as keys or attributes): an object the pool already had at
    the same or a newer version counts, as a re-upload after a role change finds
    everything there."""
    if counts is None:
        return 0
    if isinstance(counts, int):
        return counts

    def field(name):
        if hasattr(counts, "get"):
            return counts.get(name)
        return getattr(counts, name, None)
    if field("uploaded") is not None:
        return int(field("uploaded"))
    return sum(int(field(name) or 0) for name in ("created", "updated", "skipped_not_newer"))


class _Superseded(Exception):
    """The role changed while a step was in progress: drop this run."""


def _wait_for(d: defer.Deferred) -> defer.Deferred:
    """A Deferred that fires when ``d`` does; cancelling it ends the wait, not ``d``.

    For the work a role change must not cut short: a component stopping, a store
    closing.
    """
    waiter = defer.Deferred()

    def relay(result):
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

    def __init__(self, name: str, component, node_name: str):
        self.name = name
        self.component = component
        self.node_name = node_name
        self.store = None
        self._stopping = None

    @property
    def running(self):
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

    def stopped(self) -> defer.Deferred:
        """Fires when no stop of the component is in progress (at once when none is)."""
        if self._stopping is None:
            return defer.succeed(None)
        return _wait_for(self._stopping)

    def _stop_done(self, _result):
        self._stopping = None
        self.log.info("{component} stopped on node {node}", component=self.name,
                      node=self.node_name)

    def _stop_failed(self, failure):
        self._stopping = None
        self.log.warn("stopping {component} failed on node {node}: {error}",
                      component=self.name, node=self.node_name,
                      error=failure.getErrorMessage())


@implementer(IStatusSource)
class Coordinator:
    """Reacts to role changes (``set_role``) and exposes health and readiness.

    Collaborators:

    - ``open_pool_store()`` → Deferred(store); ``store.close()`` (may return a
      Deferred) releases it.
    - ``pool_sync``, ``delegation``, ``synced_detector``: IRoleComponent
      (``start(store)``/``stop()``). The synced detector reports through
      ``set_pool_cache_synced(bool)``.
    - ``upload_local_cache(store)`` → Deferred firing with the uploaded object
      count (an int, or counts with ``uploaded`` or ``created`` + ``updated``,
      as keys or attributes) and errbacking when the upload failed.
    - ``retry_delay(attempt)`` → seconds before retry ``attempt`` (1, 2, ...) of
      a failed run: a ``yurtcoord.tx.retry`` policy, ``ROLE_RETRY`` by default.
    - ``metrics``: optional, with ``set_role(name)``, ``set_healthy(bool)`` and
      ``set_ready(bool)``.
    - For ``status()``: optional callables ``cloud_servers()`` → {url: healthy},
      ``coordinator_healthy()`` → bool, ``leader()`` → holder identity or None,
      ``delegated_heartbeats()`` → int.
    """

    log = Logger()

    def __init__(self, reactor, node_name, open_pool_store, pool_sync, delegation,
                 synced_detector, upload_local_cache, retry_delay=None, metrics=None,
                 pool_name="", cloud_servers=None, coordinator_healthy=None, leader=None,
                 delegated_heartbeats=None):
        self._reactor = reactor
        self.node_name = node_name
        self.pool_name = pool_name
        self._open_pool_store = open_pool_store
        self._pool_sync = _ComponentSlot("pool sync", pool_sync, node_name)
        self._delegation = _ComponentSlot("heartbeat delegation", delegation, node_name)
        self._detector = _ComponentSlot("synced detection", synced_detector,
                                        node_name)
        self._upload_local_cache = upload_local_cache
        self._retry_delay = retry_delay or ROLE_RETRY
        self._metrics = metrics
        self._cloud_servers = cloud_servers or dict
        self._coordinator_healthy = coordinator_healthy
        self._leader = leader or (lambda: None)
        self._delegated_heartbeats = delegated_heartbeats or (lambda: 0)

        self.role = Role.INIT
        self.store = None
        self.pool_cache_synced = False
        self.need_upload_local_cache = True
        self.uploaded_objects = 0
        self.last_transition = reactor.seconds()
        self.failed_attempts = 0
        self.last_error = None
        self._applied = False
        self._step = "start"
        self._generation = 0
        self._run = None
        self._retry_call = None
        self._stopped = False
        self._role_observers = []
        self._publish()

    # -- what the status pages and metrics read ---------------------------------

    @property
    def healthy(self):
        return self.role.is_healthy

    @property
    def ready(self):
        return not self.readiness_failures()

    @property
    def local_cache_uploaded(self):
        return not self.need_upload_local_cache

    def readiness_failures(self):
        if not self.healthy:
            return [f"coordinator not healthy (role {self.role.value})"]
        failures = []
        if not self._applied:
            detail = f" (last error: {self.last_error})" if self.last_error else ""
            failures.append(f"steps of role {self.role.value} not done yet{detail}")
        if not self.pool_cache_synced:
            failures.append("pool cache not synced")
        if self.need_upload_local_cache:
            failures.append("local cache not uploaded")
        return failures

    def status(self):
        coordinator_healthy = (self._coordinator_healthy() if self._coordinator_healthy
                               else self.healthy)
        return {
            "node": self.node_name,
            "pool": self.pool_name,
            "role": self.role.value,
            "healthy": self.healthy,
            "ready": self.ready,
            "pool_cache_synced": self.pool_cache_synced,
            "local_cache_uploaded": self.local_cache_uploaded,
            "leader": self._leader(),
            "cloud": dict(self._cloud_servers()),
            "coordinator_healthy": bool(coordinator_healthy),
            "last_transition": rfc3339(self.last_transition),
            "delegated_heartbeats": self._delegated_heartbeats(),
            "uploaded_objects": self.uploaded_objects,
        }

    # -- inputs ------------------------------------------------------------------

    def set_role(self, role):
        """The hub elector's newest role; supersedes everything older.

        The step the run waits on is cancelled, and the run goes on with this role
        before this call returns (up to its first step that has to wait)."""
        role = Role(role)
        if self._stopped or role == self.role:
            return
        previous, self.role = self.role, role
        self._generation += 1
        self._applied = False
        self.failed_attempts = 0
        self.last_transition = self._reactor.seconds()
        self._cancel_retry()
        self.log.info("role {previous} -> {role} on node {node}",
                      previous=previous.value, role=role.value, node=self.node_name)
        self._publish()
        self._notify_role_observers(previous, role)
        if self._run is not None:
            self.log.info("role {role} cancels step {step} of role {previous} on node "
                          "{node}", role=role.value, step=self._step,
                          previous=previous.value, node=self.node_name)
            self._run.cancel()
        else:
            self._kick()

    def add_role_observer(self, observer: Callable[[Role, Role], None]) -> None:
        """Call ``observer(previous, role)`` after every role change, in the turn it
        happens; a failing observer is logged and changes nothing."""
        self._role_observers.append(observer)

    def _notify_role_observers(self, previous: Role, role: Role) -> None:
        for observer in list(self._role_observers):
            try:
                observer(previous, role)
            except Exception:
                self.log.failure("role observer {observer!r} failed on node {node}",
                                 observer=observer, node=self.node_name)

    def set_pool_cache_synced(self, synced):
        """Called by the synced detector. Ignored while detection is not running,
        so a late report after pending cannot mark a dropped cache as synced."""
        synced = bool(synced)
        if synced and not (self._detector.running and self.healthy):
            return
        if synced != self.pool_cache_synced:
            self.pool_cache_synced = synced
            self.log.info("pool cache synced={synced} on node {node}",
                          synced=synced, node=self.node_name)
            self._publish()

    def stop(self):
        """Cancel the step in progress, stop every component and close the pool
        store, exactly once each."""
        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        self._generation += 1
        self._cancel_retry()
        running = self._run
        if running is not None:
            running.cancel()
        else:
            running = defer.succeed(None)

        def shut_down(_):
            stopped = self._stop_components(self._pool_sync, self._delegation, self._detector)
            return self._drop_store_after(stopped).addCallback(lambda _: self._publish())

        return running.addCallback(shut_down)

    # -- the state machine -------------------------------------------------------

    def _kick(self):
        if self._run is not None or self._stopped:
            return
        run = self._run_newest()
        if not run.called:
            self._run = run

    @defer.inlineCallbacks
    def _run_newest(self):
        """Apply the newest role; loop while newer roles arrived during a run.

        A run superseded by a newer role (its step cancelled or its result dropped)
        counts as neither a success nor a failure."""
        try:
            while not self._stopped:
                generation, role = self._generation, self.role
                self._step = "start"
                try:
                    yield self._apply(role, generation)
                except Exception as error:
                    if generation != self._generation:
                        continue  # a newer role arrived: run it
                    self._schedule_retry(role, error)
                    break
                if generation == self._generation:
                    self._applied = True
                    self.failed_attempts = 0
                    self.last_error = None
                    self._publish()
                    break
        finally:
            self._run = None

    def _apply(self, role, generation):
        if role == Role.LEADER:
            return self._apply_leader(generation)
        if role == Role.FOLLOWER:
            return self._apply_follower(generation)
        if role == Role.PENDING:
            return self._apply_pending(generation)
        return defer.succeed(None)

    def _check(self, generation):
        if generation != self._generation:
            raise _Superseded()

    @defer.inlineCallbacks
    def _apply_pending(self, generation):
        self.need_upload_local_cache = True
        self._step = "stop components, close pool store"
        stopped = self._stop_components(self._pool_sync, self._delegation, self._detector)
        yield _wait_for(self._drop_store_after(stopped))

    @defer.inlineCallbacks
    def _apply_leader(self, generation):
        store = yield self._ensure_store(generation)
        for slot in (self._pool_sync, self._delegation, self._detector):
            self._step = f"start {slot.name}"
            yield self._ensure_started(slot, store)
            self._check(generation)
        yield self._upload_if_needed(store, generation)

    @defer.inlineCallbacks
    def _apply_follower(self, generation):
        self._step = "stop leader components"
        yield _wait_for(self._stop_components(self._pool_sync, self._delegation))
        self._check(generation)
        store = yield self._ensure_store(generation)
        self._step = f"start {self._detector.name}"
        yield self._ensure_started(self._detector, store)
        self._check(generation)
        yield self._upload_if_needed(store, generation)

    @defer.inlineCallbacks
    def _ensure_store(self, generation):
        if self.store is not None:
            return self.store
        self._step = "open pool store"
        store = yield self._open_pool_store()
        if generation != self._generation:
            yield _wait_for(self._close_quietly(store))
            raise _Superseded()
        self.store = store
        return store

    @defer.inlineCallbacks
    def _ensure_started(self, slot, store):
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

    def _stop_components(self, *slots):
        """Call the ``stop()`` of each running slot now, in this turn.

        Returns a Deferred that fires (never fails) once no stop of them is in
        progress. A run waits on it through ``_wait_for``: a stop goes on when the
        run is cancelled."""
        for slot in slots:
            slot.stop()
        if self._detector in slots and self.pool_cache_synced:
            self.pool_cache_synced = False
            self._publish()
        return defer.DeferredList([slot.stopped() for slot in slots])

    @defer.inlineCallbacks
    def _upload_if_needed(self, store, generation):
        if not self.need_upload_local_cache:
            return
        self._step = "upload local cache"
        counts = yield self._upload_local_cache(store)
        self._check(generation)
        uploaded = _uploaded_count(counts)
        self.uploaded_objects = uploaded
        self.need_upload_local_cache = False
        self.log.info("local cache uploaded from node {node}: {uploaded} objects",
                      node=self.node_name, uploaded=uploaded)
        self._publish()

    def _drop_store_after(self, stopped):
        """The pool store is never used again; it closes once ``stopped`` fired (the
        components stopped), also when a newer role cancels the run meanwhile.
        Returns ``stopped``, firing after the close."""
        store, self.store = self.store, None
        if store is not None:
            stopped.addCallback(lambda _: self._close_quietly(store))
        return stopped

    def _close_quietly(self, store):
        """Close ``store``; the returned Deferred never fails (a failure is logged)."""
        closing = defer.maybeDeferred(store.close)
        closing.addErrback(lambda failure: self.log.warn(
            "closing the pool store failed on node {node}: {error}",
            node=self.node_name, error=failure.getErrorMessage()))
        return closing

    def _schedule_retry(self, role, error):
        self.failed_attempts += 1
        self.last_error = f"{self._step}: {error}"
        delay = self._retry_delay(self.failed_attempts)
        self.log.warn("step {step} of role {role} failed on node {node}: {error}; "
                      "retry {attempt} in {delay}s",
                      step=self._step, role=role.value, node=self.node_name,
                      error=error, attempt=self.failed_attempts, delay=delay)
        self._retry_call = self._reactor.callLater(delay, self._retry)

    def _retry(self):
        self._retry_call = None
        self._kick()

    def _cancel_retry(self):
        if self._retry_call is not None:
            if self._retry_call.active():
                self._retry_call.cancel()
            self._retry_call = None

    def _publish(self):
        if self._metrics is None:
            return
        self._metrics.set_role(self.role.value)
        self._metrics.set_healthy(self.healthy)
        self._metrics.set_ready(self.ready)
