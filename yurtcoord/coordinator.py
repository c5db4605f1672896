"""The coordinator: applies the hub role to the pool store and the role components.

This is the seed's Run loop as an explicit state machine (SPEC §6.2). Only the
newest role counts: every role change bumps a generation, at most one run of
role steps is in progress, and a run whose generation is no longer current stops
at its next step and applies none of its results (a store it opened is closed
again). A failed step is retried with capped backoff until it succeeds or the
role changes (fix 5). The local cache counts as uploaded only after an upload
really succeeded (fix 2).

Role steps:

- pending: stop pool sync, delegation and synced detection; close the pool
  store; the local cache needs uploading again; not synced.
- leader: open the pool store (reused if one is open; a store dropped by pending
  is never reused), then start pool sync, delegation and synced detection on it,
  then upload the local cache if needed.
- follower: open the pool store, stop pool sync and delegation, start synced
  detection, upload the local cache if needed.
"""

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.roles import Role
from yurtcoord.status import IStatusSource, rfc3339


def capped_backoff(initial=0.5, factor=2.0, cap=30.0):
    """Retry policy: ``attempt`` (1, 2, ...) → delay in seconds, growing by
    ``factor`` from ``initial`` up to ``cap``."""

    def delay(attempt):
        return min(cap, initial * factor ** (attempt - 1))

    return delay


def backoff_policy(backoff):
    """Retry policy from a ``yurtcoord.kube.backoff.Backoff`` (capped, jittered):
    attempt 1 starts it afresh."""

    def delay(attempt):
        if attempt == 1:
            backoff.reset()
        return backoff.next_delay()

    return delay


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


class _ComponentSlot:
    """What the coordinator started a component with (None: stopped)."""

    def __init__(self, name, component):
        self.name = name
        self.component = component
        self.store = None

    @property
    def running(self):
        return self.store is not None


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
      a failed run; ``capped_backoff()`` by default, ``backoff_policy(Backoff())``
      for jitter.
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
        self._pool_sync = _ComponentSlot("pool sync", pool_sync)
        self._delegation = _ComponentSlot("heartbeat delegation", delegation)
        self._detector = _ComponentSlot("synced detection", synced_detector)
        self._upload_local_cache = upload_local_cache
        self._retry_delay = retry_delay or capped_backoff()
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
        """The hub elector's newest role; supersedes everything older."""
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
        self._kick()

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
        """Stop every component and close the pool store, exactly once each."""
        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        self._generation += 1
        self._cancel_retry()
        running = self._run if self._run is not None else defer.succeed(None)

        @defer.inlineCallbacks
        def shut_down(_):
            for slot in (self._pool_sync, self._delegation, self._detector):
                try:
                    yield self._ensure_stopped(slot)
                except Exception as error:
                    self.log.warn("stopping {component} failed on node {node}: {error}",
                                  component=slot.name, node=self.node_name, error=error)
            yield self._close_store()
            self.pool_cache_synced = False
            self._publish()

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
        """Apply the newest role; loop while newer roles arrived during a run."""
        try:
            while not self._stopped:
                generation, role = self._generation, self.role
                self._step = "start"
                try:
                    yield self._apply(role, generation)
                except _Superseded:
                    continue  # a newer role arrived: run it
                except Exception as error:
                    if generation == self._generation:
                        self._schedule_retry(role, error)
                else:
                    if generation == self._generation:
                        self._applied = True
                        self.failed_attempts = 0
                        self.last_error = None
                        self._publish()
                if generation == self._generation:
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
        self.pool_cache_synced = False
        self.need_upload_local_cache = True
        self._publish()
        for slot in (self._pool_sync, self._delegation, self._detector):
            self._step = f"stop {slot.name}"
            yield self._ensure_stopped(slot)
            self._check(generation)
        self._step = "close pool store"
        yield self._close_store()

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
        store = yield self._ensure_store(generation)
        for slot in (self._pool_sync, self._delegation):
            self._step = f"stop {slot.name}"
            yield self._ensure_stopped(slot)
            self._check(generation)
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
            yield self._close_quietly(store)
            raise _Superseded()
        self.store = store
        return store

    @defer.inlineCallbacks
    def _ensure_started(self, slot, store):
        if slot.store is store:
            return
        if slot.running:
            yield self._ensure_stopped(slot)
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

    @defer.inlineCallbacks
    def _ensure_stopped(self, slot):
        if not slot.running:
            return
        yield slot.component.stop()
        slot.store = None
        if slot is self._detector:
            self.pool_cache_synced = False
            self._publish()
        self.log.info("{component} stopped on node {node}",
                      component=slot.name, node=self.node_name)

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

    @defer.inlineCallbacks
    def _close_store(self):
        store, self.store = self.store, None
        if store is not None:
            yield self._close_quietly(store)

    @defer.inlineCallbacks
    def _close_quietly(self, store):
        try:
            yield defer.maybeDeferred(store.close)
        except Exception as error:
            self.log.warn("closing the pool store failed on node {node}: {error}",
                          node=self.node_name, error=error)

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
