"""The leader's pool sync: pool-scoped resources mirrored from the cloud into the pool store.

On ``start(store)``: the informer sync lease is deleted (followers stop
trusting the pool cache), every key of component ``leader-yurthub`` is deleted (its
keys are first rebuilt from etcd, so keys a previous leader left behind are found
even when this node's key cache never knew them; keys the node's key cache records
for another component, such as kube-proxy's uploaded endpointslices, are not pool
sync's and stay: see ``yurtcoord.pool.store``), then one ``ResourceMirror`` per
pool-scoped resource lists and watches it from a healthy cloud server:

- the first list replaces the component's keys of that resource (stale ones deleted);
- ADDED/MODIFIED become create-or-update by resourceVersion, DELETED a delete;
- a relist after 410 is written like the first list, as a replace of the component's
  keys with the informer's new list, so deletions missed while the watch was gone
  reach the store in a few transactions.

After the pool etcd was unreachable (a failed write, or the store's health check) or
restarted between two health checks (a new raft term), a mirror writes its whole list
again: etcd may have lost what it acknowledged, and a watch event is never delivered
twice. See docs/design.md, "etcd that forgets acknowledged writes".

When every resource has listed, the informer sync lease is created at once and then
renewed every ``informer_lease_renew`` by one ``LoopingCall``, so followers trust the
pool cache as soon as it is complete rather than a whole period later. The lease is
renewed only while every mirror has listed and none is failing to write; a renewal
skipped for that is made up as soon as the mirrors write again, and the period
counts from then.

``stop()`` cancels the lease loop, requests in flight, retry timers and informers in
the same reactor turn; once its Deferred fired nothing writes to the store.
"""

import json
from typing import (Any, Callable, Dict, Generator, Iterable, List, Optional,
                    Tuple, Union, cast)

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.heap import QuietCollections
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.workqueue import WorkQueue
from yurtcoord.kube import gvr as gvrs
from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.retry import POOL_WRITE_RETRY, RetryPolicy
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IObjectClient
from yurtcoord.kube.lease import LeaseRecord, build_lease, node_owner_reference, with_record
from yurtcoord.kube.lease import resource_version_number as _resource_version
from yurtcoord.kube.leasewriter import LeaseWriter
from yurtcoord.pool.interfaces import IPoolStore, IPoolSyncMetrics, IRoleComponent
from yurtcoord.pool.scope import PoolScopeResources, describe, merge_resources
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import InvalidKey, KeyBuildInfo, PoolKey, ResourceId
from yurtcoord.pool.store import ObjectTooLarge
from yurtcoord.names import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE

DEFAULT_INFORMER_LEASE_RENEW = 10.0


def is_informer_sync_lease(obj: Optional[dict]) -> bool:
    meta = (obj or {}).get("metadata") or {}
    return (meta.get("name") == INFORMER_SYNC_LEASE_NAME
            and meta.get("namespace") == INFORMER_SYNC_LEASE_NAMESPACE)


def object_bytes(obj: dict, gvr: GroupVersionResource, kind: Optional[str] = None) -> bytes:
    """The JSON bytes stored for ``obj``: list items lack apiVersion/kind, which the
    coordinator apiserver needs to decode what it reads from etcd."""
    if "apiVersion" not in obj or ("kind" not in obj and kind):
        obj = dict(obj)
        obj.setdefault("apiVersion", gvr.group_version)
        if kind:
            obj.setdefault("kind", kind)
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


# The pending write of a mirror that writes the informer's whole list (as one replace).
WRITE_LIST = "list"
# One queued change of a key: the key, and the object's bytes and resourceVersion
# (both None for a delete).
Change = Tuple[PoolKey, Optional[bytes], Optional[int]]
# What a mirror's queue holds: WRITE_LIST, or a batch of changes by key path.
Write = Union[str, Dict[str, Change]]


def _merge_writes(old: Write, new: Write) -> Write:
    """The write to keep of two pending writes of one mirror: a whole list covers
    every change (it is read from the informer when it runs); two batches of changes
    become one, the newer change of a key winning. The older batch is the queue's
    own (pending, or failed and done with) and grows in place: a burst of single
    changes arriving while a write runs costs one dict update each, not a copy."""
    if isinstance(old, str) or isinstance(new, str):
        return WRITE_LIST
    old.update(new)
    return old


class ResourceMirror:
    """Keeps the pool store's copy of one resource equal to the cloud's.

    Writes go through a ``WorkQueue``, one store call at a time, coalesced per key (the
    newest change of a key wins), so the order of changes to one key is kept while
    a burst of changes becomes few etcd transactions. A list (the first, or a relist
    the informer made after 410) supersedes every queued change: it is written as
    one replace of the informer's whole store. A failed write is retried with
    backoff; changes queued meanwhile are kept. The component key cache file is
    written at most once per drained batch of changes and at most once per
    ``key_cache_flush_interval`` (``PoolStore.flush_key_cache_soon``), never per key:
    at 100k keys one rewrite takes tens of milliseconds of the reactor, and a storm of
    deletes would otherwise stall it for seconds. ``busy()`` is called for every change
    delivered (the manager's ``QuietCollections.busy``, which keeps full garbage
    collections out of a burst of changes).
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, store: IPoolStore, informer: IInformer,
                 gvr: GroupVersionResource, kind: Optional[str] = None,
                 component: str = POOL_SCOPED_COMPONENT, metrics: Optional[IPoolSyncMetrics] = None,
                 on_change: Optional[Callable[[], None]] = None,
                 retry_policy: RetryPolicy = POOL_WRITE_RETRY,
                 busy: Optional[Callable[[], None]] = None) -> None:
        self.reactor = reactor
        self.store = store
        self.informer = informer
        self.gvr = gvr
        self.kind = kind
        self.component = component
        self.metrics = metrics
        self._on_change = on_change or (lambda: None)
        self._busy = busy or (lambda: None)
        self.listed = False
        self.failing = False
        self.writes = 0
        # Whole lists written (first list, relists, rewrites).
        self.lists_written = 0
        self._accepting = False
        self._stopped = False
        # One key (this resource): its pending write, the write running and the
        # retry pause after a failed one.
        self._queue: WorkQueue[str, Write] = WorkQueue(
            reactor, self._write, _merge_writes,
            retry_policy,
            on_success=self._wrote, on_failure=self._failed,
            loop_errors=ILoopErrors(metrics, None))
        self._registration: Any = None
        self._sync_wait: Optional[defer.Deferred[bool]] = None
        self._lists_seen: Optional[int] = None
        self._next_turn: Optional[IDelayedCall] = None

    @property
    def name(self) -> str:
        return describe(self.gvr)

    @property
    def idle(self) -> bool:
        """Listed, nothing queued and no write running: the store equals the informer."""
        return self.listed and not self._relisting and not self._queue.has_work(self.name)

    @property
    def writing(self) -> bool:
        """Whether a write to the pool store is running now."""
        return self._queue.running(self.name)

    @property
    def _relisting(self) -> bool:
        return self._next_turn is not None and self._next_turn.active()

    def start(self) -> None:
        self._registration = self.informer.add_handler(
            on_add=lambda obj: self._changed("ADDED", obj),
            on_update=lambda _old, new: self._changed("MODIFIED", new),
            on_delete=lambda obj: self._changed("DELETED", obj))
        self._sync_wait = self.informer.wait_for_sync()
        self._sync_wait.addCallback(self._first_list)
        self.informer.start()

    def rewrite(self) -> None:
        """Write the informer's whole list again (as one replace) at the next chance.

        For when the pool etcd came back from an outage (see the module docstring).
        Before the first list nothing is written anyway.
        """
        if self._stopped or not self._accepting:
            return
        self._queue.add(self.name, WRITE_LIST)

    def stop(self) -> defer.Deferred[None]:
        """Stop the informer, cancel writes and retries; fires when all is quiet."""
        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        self._accepting = False
        if self._registration is not None:
            self._registration.remove()
        if self._next_turn is not None and self._next_turn.active():
            self._next_turn.cancel()
        waits = [self.informer.stop(), self._queue.stop()]
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    # -- events --------------------------------------------------------------------

    def _changed(self, event_type: str, obj: dict) -> None:
        if not self._accepting:
            # Before the first list is written, the list snapshot covers every change.
            return
        self._busy()
        if self.metrics is not None:
            self.metrics.count_pool_sync_event(self.name, event_type)
        if self._relisted():
            # A relist (after 410) delivers its difference in one go: write the
            # informer's whole new list once it is over, not change by change.
            self._kick_next_turn()
            return
        if self._relisting:
            return
        key = self._key(obj)
        if key is None:
            return
        if event_type == "DELETED":
            change: Change = (key, None, None)
        else:
            rv = _resource_version(obj)
            if rv is None:
                self.log.warn("{resource} {key} has no numeric resourceVersion; not mirrored",
                              resource=self.name, key=key.path)
                return
            change = (key, object_bytes(obj, self.gvr, self.kind), rv)
        self._queue.add(self.name, {key.path: change})

    def _key(self, obj: dict) -> Optional[PoolKey]:
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "") if self.gvr.namespaced else ""
        try:
            return self.store.key_func(KeyBuildInfo(
                self.component, self.gvr.resource, self.gvr.group, self.gvr.version,
                namespace, meta.get("name") or ""))
        except InvalidKey as e:
            self.log.warn("{resource} object not mirrored: {error}", resource=self.name,
                          error=str(e))
            return None

    def _first_list(self, synced: bool) -> None:
        if not synced or self._stopped:
            return None
        # From here on every change is queued; the list itself is written first.
        self._accepting = True
        self._lists_seen = self.informer.lists
        self._queue.add(self.name, WRITE_LIST)
        return None

    def _relisted(self) -> bool:
        """True (once per list) when the informer delivers the difference of a relist."""
        lists = self.informer.lists
        if lists == self._lists_seen:
            return False
        self._lists_seen = lists
        return True

    def _snapshot(self) -> Dict[str, bytes]:
        """``{key path: bytes}`` of every object the informer holds now."""
        snapshot: Dict[str, bytes] = {}
        for obj in self.informer.list():
            key = self._key(obj)
            if key is None or _resource_version(obj) is None:
                continue
            snapshot[key.path] = object_bytes(obj, self.gvr, self.kind)
        return snapshot

    # -- the write queue ---------------------------------------------------------------

    def _kick_next_turn(self) -> None:
        """Write the whole list once the informer's current delivery (a whole relist)
        is over; changes delivered until then are covered by it."""
        if not self._relisting:
            self._next_turn = self.reactor.callLater(
                0, self._queue.add, self.name, WRITE_LIST)

    def _write(self, _name: str, write: Write) -> defer.Deferred[None]:
        """One write the queue runs: the informer's whole list, or a batch of
        changes (the entries written are removed from it, so a retry after a
        failure writes only the rest)."""
        if isinstance(write, str):
            # The snapshot covers every change delivered so far.
            return self._write_list(self._snapshot())
        return self._write_changes(write)

    @defer.inlineCallbacks
    def _write_list(self, snapshot: Dict[str, bytes]) -> Generator[Any, Any, None]:
        """Replace the component's objects of this resource with ``snapshot``."""
        while True:
            try:
                yield self.store.replace_component_list(
                    self.component, self.gvr, None, list(snapshot.values()))
            except ObjectTooLarge as e:
                if snapshot.pop(e.key, None) is None:
                    raise
                self.log.error("{resource} {key} too large for the pool store; not mirrored",
                               resource=self.name, key=e.key)
                continue
            break
        if self._stopped:
            return
        self.writes += len(snapshot)
        self.lists_written += 1
        if self.metrics is not None:
            self.metrics.count_pool_sync_event(self.name, "LIST")
        first = not self.listed
        self.listed = True
        self.log.info("pool sync {what} {resource}: {count} objects in the pool store",
                      what="listed" if first else "relisted", resource=self.name,
                      count=len(snapshot))
        if first:
            self._on_change()

    @defer.inlineCallbacks
    def _write_changes(self, batch: Dict[str, Change]) -> Generator[Any, Any, None]:
        """Write queued changes; entries written are removed from ``batch``. The key
        cache file is written (soon) at the end, whether the writes succeeded or not."""
        try:
            yield self._write_puts_and_deletes(batch)
        finally:
            self.store.flush_key_cache_soon()

    @defer.inlineCallbacks
    def _write_puts_and_deletes(self, batch: Dict[str, Change]
                                ) -> Generator[Any, Any, None]:
        # A change with a value is a put; the store checks each put's resourceVersion.
        puts = cast(List[Tuple[PoolKey, bytes, Union[int, str]]],
                    [entry for entry in batch.values() if entry[1] is not None])
        deletes = [entry[0] for entry in batch.values() if entry[1] is None]
        if puts:
            outcome = yield self.store.create_or_update_many(puts, flush_key_cache=False)
            for path in outcome.too_large:
                self.log.error("{resource} {key} too large for the pool store; not mirrored",
                               resource=self.name, key=path)
            for key, _value, _rv in puts:
                batch.pop(key.path, None)
            self.writes += len(puts)
        if deletes:
            yield self.store.delete_many(deletes, flush_key_cache=False)
            for key in deletes:
                batch.pop(key.path, None)
            self.writes += len(deletes)

    def _wrote(self, _name: str, write: Write, _result: object, _failures: int) -> None:
        if not self.failing:
            return
        self.failing = False
        if not isinstance(write, str):
            # The failures may have been etcd restarting (see the module docstring).
            self._queue.add(self.name, WRITE_LIST)
        self.log.info("pool sync of {resource} writes again", resource=self.name)
        self._on_change()

    def _failed(self, _name: str, write: Write, failure: Failure, _failures: int,
                delay: float) -> None:
        what = "writing the list" if isinstance(write, str) else f"writing {len(write)} changes"
        first = not self.failing
        self.failing = True
        self.log.warn("pool sync of {resource} failed {what}: {error}; retry in {delay:.2f}s",
                      resource=self.name, what=what,
                      error=failure.getErrorMessage() or type(failure.value).__name__,
                      delay=delay)
        if first:
            self._on_change()


@implementer(IRoleComponent)
class PoolSyncManager:
    """The leader's pool sync (an IRoleComponent: ``start(store)`` / ``stop()``).

    :param coordinator_client: ``KubeClient`` of the coordinator apiserver (lease).
    :param cloud_client: ``KubeClient`` or ``HealthyCloudClient`` of the cloud.
    :param pool_scope: a ``PoolScopeResources`` on the same cloud; started here if
        it is not running yet, and then stopped again by ``stop()``.
    :param informer_factory: ``(reactor, client, gvr)`` → an ``IInformer``.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, node_name: str, coordinator_client: IObjectClient,
                 cloud_client: Any, pool_scope: PoolScopeResources,
                 informer_lease_renew: float = DEFAULT_INFORMER_LEASE_RENEW,
                 metrics: Optional[IPoolSyncMetrics] = None,
                 informer_factory: Callable[[IReactorTime, Any, GroupVersionResource],
                                            IInformer] = Informer,
                 write_retry_policy: RetryPolicy = POOL_WRITE_RETRY,
                 component: str = POOL_SCOPED_COMPONENT) -> None:
        self.reactor = reactor
        self.node_name = node_name
        self.coordinator = coordinator_client
        self.cloud_client = cloud_client
        self.pool_scope = pool_scope
        self.informer_lease_renew = float(informer_lease_renew)
        self.metrics = metrics
        self._informer_factory = informer_factory
        self._write_retry_policy = write_retry_policy
        self.component = component
        self.store: Optional[IPoolStore] = None
        self.mirrors: Dict[ResourceId, ResourceMirror] = {}
        self.lease: Optional[dict] = None
        self.lease_writes = 0
        # Renews the lease it wrote last; a conflict, a lease deleted behind our back
        # or one created meanwhile is read again at once.
        self._lease_writer = LeaseWriter(reactor, coordinator_client,
                                         INFORMER_SYNC_LEASE_NAMESPACE,
                                         INFORMER_SYNC_LEASE_NAME, attempts=3)
        self._lease_loop: Optional[LoopingCall] = None
        self._lease_loop_done: Optional[defer.Deferred[LoopingCall]] = None
        # The lease loop's last turn skipped the renewal (a mirror not listed or
        # failing): the next mirror change that makes every mirror synced renews at once.
        self._renewal_skipped = False
        self._started_scope = False
        self._running = False
        # ``{resource id: lists_written}`` when the store went unreachable, else None.
        self._lists_at_outage: Optional[Dict[ResourceId, int]] = None
        self._in_flight = InFlight()
        self._stopping: List[defer.Deferred[None]] = []
        # Freezes the synced heap and holds full collections off during bursts.
        self._heap: Optional[QuietCollections] = None

    @property
    def running(self) -> bool:
        return self._running

    @property
    def all_listed(self) -> bool:
        """Every pool-scoped resource has listed and writes without failing."""
        return (self.pool_scope.resources is not None
                and all(m.listed and not m.failing for m in self.mirrors.values()))

    # -- IRoleComponent ------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self, store: IPoolStore) -> Generator[Any, Any, None]:
        if self._running:
            return
        # Stops of mirrors dropped by a previous run must finish before this store is used.
        if self._stopping:
            yield defer.DeferredList(self._stopping, consumeErrors=True)
        try:
            yield self._in_flight.track(self.coordinator.delete(
                gvrs.LEASES, INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE))
        except NotFound:
            self.log.debug("no informer sync lease to delete on node {node}",
                           node=self.node_name)
        known = merge_resources(self.pool_scope.defaults, self.pool_scope.configured)
        if self.pool_scope.resources:
            known = merge_resources(known, self.pool_scope.resources)
        yield self._in_flight.track(
            store.recover_pool_scoped_keys(known, component=self.component))
        deleted = yield self._in_flight.track(store.delete_component_resources(self.component))
        self.log.info("pool sync starting on node {node}: informer sync lease deleted, "
                      "{deleted} old pool-scoped keys deleted", node=self.node_name,
                      deleted=deleted)
        self.store = store
        self.lease = None
        self._renewal_skipped = False
        self._lease_writer.forget()  # deleted above
        self._running = True
        self._heap = QuietCollections(self.reactor)
        self._lists_at_outage = None
        store.on_health_change(self._store_health_changed)
        store.on_new_term(self._store_new_term)
        self.pool_scope.add_listener(self._resources_changed)
        if not self.pool_scope.running:
            self._started_scope = True
            self.pool_scope.start()
        if self.pool_scope.resources is not None:
            self._resources_changed(self.pool_scope.resources)

    def stop(self) -> defer.Deferred[None]:
        if not self._running:
            if self._stopping:
                return defer.DeferredList(list(self._stopping), consumeErrors=True) \
                    .addCallback(lambda _: None)
            return defer.succeed(None)
        self._running = False
        self.pool_scope.remove_listener(self._resources_changed)
        waits: List[defer.Deferred[Any]] = []
        if self._started_scope:
            self._started_scope = False
            waits.append(self.pool_scope.stop())
        self._in_flight.cancel_all()
        if self._lease_loop is not None:
            loop, self._lease_loop = self._lease_loop, None
            done, self._lease_loop_done = self._lease_loop_done, None
            if loop.running:
                loop.stop()
            if done is not None:
                waits.append(done)
        mirrors, self.mirrors = self.mirrors, {}
        for mirror in mirrors.values():
            waits.append(mirror.stop())
        waits.extend(self._stopping)
        store, self.store = self.store, None
        heap, self._heap = self._heap, None
        # start() set both before it set _running.
        assert store is not None and heap is not None
        store.remove_health_observer(self._store_health_changed)
        store.remove_new_term_observer(self._store_new_term)
        heap.stop()
        self.log.info("pool sync stopping on node {node}", node=self.node_name)
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    def _store_health_changed(self, healthy: bool) -> None:
        """After the pool etcd was unreachable, every mirror that has not written a whole
        list since writes it again: an outage with no write attempted would otherwise
        hide writes etcd lost, and a mirror that recovered from failed writes has just
        written its list."""
        if not self._running:
            return
        if not healthy:
            if self._lists_at_outage is None:
                self._lists_at_outage = {rid: m.lists_written for rid, m in self.mirrors.items()}
            return
        if self._lists_at_outage is not None:
            at_outage, self._lists_at_outage = self._lists_at_outage, None
            self._rewrite("reachable again", [
                m for rid, m in self.mirrors.items() if at_outage.get(rid) == m.lists_written])

    def _store_new_term(self) -> None:
        """etcd restarted between two health checks: the same repair as after an outage."""
        if self._running:
            self._rewrite("in a new raft term", list(self.mirrors.values()))

    def _rewrite(self, why: str, mirrors: List[ResourceMirror]) -> None:
        self.log.info("pool etcd {why}: pool sync writes {count} lists again", why=why,
                      count=len(mirrors))
        for mirror in mirrors:
            mirror.rewrite()

    # -- resources -------------------------------------------------------------------------

    def _resources_changed(self, resources: Iterable[GroupVersionResource]) -> None:
        store, heap = self.store, self._heap
        if not self._running or store is None or heap is None:
            return
        wanted = {ResourceId.of(g): g for g in resources}
        for rid in [r for r in self.mirrors if r not in wanted
                    or self.mirrors[r].gvr.namespaced != wanted[r].namespaced]:
            mirror = self.mirrors.pop(rid)
            self.log.info("pool sync stops mirroring {resource}", resource=mirror.name)
            self._forget(mirror)
        for rid, gvr in wanted.items():
            if rid in self.mirrors:
                continue
            informer = self._informer_factory(self.reactor, self.cloud_client, gvr)
            mirror = ResourceMirror(
                self.reactor, store, informer, gvr, kind=self._kind_of(gvr),
                component=self.component, metrics=self.metrics,
                on_change=self._mirror_changed, retry_policy=self._write_retry_policy,
                busy=heap.busy)
            self.mirrors[rid] = mirror
            self.log.info("pool sync mirrors {resource}", resource=mirror.name)
            mirror.start()
        self._mirror_changed()

    def _kind_of(self, gvr: GroupVersionResource) -> Optional[str]:
        return self.pool_scope.kind_of(gvr)

    def _forget(self, mirror: ResourceMirror) -> None:
        """Stop a mirror of a resource no longer pool-scoped and delete its keys."""
        store = self.store

        @defer.inlineCallbacks
        def stop_and_clean() -> Generator[Any, Any, None]:
            yield mirror.stop()
            if self._running and store is not None and self.store is store:
                try:
                    yield self._in_flight.track(store.replace_component_list(
                        self.component, mirror.gvr, None, []))
                except Exception as e:
                    if self._running:
                        self.log.warn("could not delete keys of {resource}: {error}",
                                      resource=mirror.name, error=str(e))

        def stopped(result: Any) -> Any:
            self._stopping.remove(d)
            return result

        d = stop_and_clean()
        self._stopping.append(d)
        d.addBoth(stopped)

    # -- informer sync lease -------------------------------------------------------------------

    def _mirror_changed(self) -> None:
        heap = self._heap
        if not self._running or heap is None or not self.all_listed:
            return
        if self._lease_loop is not None:
            if self._renewal_skipped:
                # Writes go through again: renew now rather than up to a whole period
                # later, while followers may already count the lease as stale.
                self._renewal_skipped = False
                self.log.info("pool-scoped resources synced again on node {node}: "
                              "informer sync lease renewed now", node=self.node_name)
                self._start_lease_loop()
            return
        self.log.info("pool-scoped resources synced on node {node}: {resources}",
                      node=self.node_name,
                      resources=", ".join(m.name for m in self.mirrors.values()) or "none")
        # The informers now hold every pool-scoped object (100k objects are about
        # 700,000 containers), and they live as long as this leadership. Left to the
        # cyclic garbage collector, each full collection would walk them all and stall
        # the reactor for hundreds of milliseconds during a storm of changes; frozen,
        # they are skipped (see ``yurtcoord.tx.heap``). ``stop()`` thaws them.
        heap.freeze()
        # Guarded (loop informer-sync-lease): a renewal that raises is logged and
        # counted and the next one runs on time; a stopped loop would let every
        # follower's pool cache turn unsynced one stale_timeout later.
        self._lease_loop = LoopingCall(guarded(
            "informer-sync-lease", self._renew_lease, ILoopErrors(self.metrics, None)))
        self._lease_loop.clock = self.reactor
        self._start_lease_loop()

    def _start_lease_loop(self) -> None:
        """Renew the lease now and every ``informer_lease_renew`` from now on. Also
        restarts a loop whose last turn skipped the renewal: that turn returned
        nothing, so no renewal is in flight."""
        loop = self._lease_loop
        assert loop is not None
        if loop.running:
            loop.stop()
        self._lease_loop_done = loop.start(self.informer_lease_renew, now=True)
        self._lease_loop_done.addErrback(
            lambda f: self.log.failure("informer sync lease loop failed", f))

    def _renew_lease(self) -> Optional[defer.Deferred[None]]:
        if not self.all_listed:
            self._renewal_skipped = True
            self.log.warn("informer sync lease not renewed on node {node}: pool-scoped "
                          "resources are not all synced", node=self.node_name)
            return None
        self._renewal_skipped = False
        d = self._write_lease()
        d.addErrback(self._lease_failed)
        return d

    def _lease_failed(self, failure: Failure) -> None:
        if failure.check(defer.CancelledError) or not self._running:
            return None
        self.log.warn("informer sync lease write failed on node {node}: {error}",
                      node=self.node_name, error=failure.getErrorMessage())
        self.lease = None
        return None

    @defer.inlineCallbacks
    def _write_lease(self) -> Generator[Any, Any, None]:
        previous = self.lease
        result = yield self._in_flight.track(self._lease_writer.write(self._lease_change))
        self.lease = result.lease
        self.lease_writes += 1
        if previous is None:
            self.log.info("informer sync lease {namespace}/{name} written by node {node}",
                          namespace=INFORMER_SYNC_LEASE_NAMESPACE,
                          name=INFORMER_SYNC_LEASE_NAME, node=self.node_name)

    def _lease_change(self, current: Optional[dict]) -> Union[dict, defer.Deferred[dict]]:
        """The informer sync lease to write over ``current`` (None: absent): held by
        this node for ``informer_lease_renew``, its acquireTime kept while this node
        held it already. A lease created here names this node's Node as owner."""
        now = self.reactor.seconds()
        duration = int(self.informer_lease_renew)
        if current is None:
            return self._new_lease(now, duration)
        seen = LeaseRecord.from_lease(current)
        acquired = seen.acquire_time if seen.holder_identity == self.node_name else None
        record = LeaseRecord(self.node_name, duration, acquired or now, now,
                             seen.lease_transitions)
        return with_record(current, record)

    @defer.inlineCallbacks
    def _new_lease(self, now: float, duration: int) -> Generator[Any, Any, dict]:
        lease = build_lease(INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE,
                            LeaseRecord(self.node_name, duration, now, now, 0))
        try:
            owner = yield node_owner_reference(self.coordinator, self.node_name)
        except Exception as error:
            # The owner only lets the lease go with its Node: a failed read must not
            # keep the pool from counting as synced.
            self.log.warn("informer sync lease created without an owner: reading Node "
                          "{node} failed: {error}", node=self.node_name,
                          error=describe_failure(Failure(error)))
            owner = None
        if owner is not None:
            lease["metadata"]["ownerReferences"] = [owner]
        return lease
