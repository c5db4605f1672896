"""The leader's pool sync: pool-scoped resources mirrored from the cloud into the pool store.

On ``start(store)``: the informer sync lease is deleted (followers stop
trusting the pool cache), every key of component ``leader-yurthub`` is deleted (its
keys are first rebuilt from etcd, so keys a previous leader left behind are found
even when this node's key cache never knew them; keys the node's key cache records
for another component, such as kube-proxy's uploaded endpointslices, are not pool
sync's and stay: see ``yurtcoord.pool.store``), then one ``ResourceMirror``
(``yurtcoord.pool.mirror``, whose life is a state machine of its own) per pool-scoped
resource lists and watches it from a healthy cloud server:

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
renewed every ``informer_lease_renew`` by one ``Cadence``, so followers trust the
pool cache as soon as it is complete rather than a whole period later. The lease is
renewed only while every mirror has listed and none is failing to write; a renewal
skipped for that is made up as soon as the mirrors write again, and the period
counts from then.

``stop()`` cancels the lease loop, requests in flight, retry timers and informers in
the same reactor turn; once its Deferred fired nothing writes to the store.
"""

from typing import Any, Callable, Dict, Generator, Iterable, List, Optional, Union

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IObjectClient
from yurtcoord.kube.lease import LeaseRecord, build_lease, node_owner_reference, with_record
from yurtcoord.kube.leasewriter import LeaseWriter
from yurtcoord.names import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
from yurtcoord.pool.interfaces import IPoolStore, IPoolSyncMetrics, IRoleComponent
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import ResourceId
from yurtcoord.pool.mirror import ResourceMirror
from yurtcoord.pool.scope import PoolScopeResources, merge_resources
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.heap import QuietCollections
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.retry import POOL_WRITE_RETRY, RetryPolicy

DEFAULT_INFORMER_LEASE_RENEW = 10.0


def is_informer_sync_lease(obj: Optional[dict]) -> bool:
    meta = (obj or {}).get("metadata") or {}
    return (meta.get("name") == INFORMER_SYNC_LEASE_NAME
            and meta.get("namespace") == INFORMER_SYNC_LEASE_NAMESPACE)


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
        self._lease_loop: Optional[Cadence] = None
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
        loop, self._lease_loop = self._lease_loop, None
        if loop is not None:
            waits.append(loop.stop())
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
                self._lease_loop.restart()
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
        # Renew the lease now and every informer_lease_renew from now on; restart()
        # renews at once when the mirrors write again after a skipped renewal. A
        # renewal that raises is reported as an error of guarded loop
        # informer-sync-lease and the next one runs on time: a dead loop would let
        # every follower's pool cache turn unsynced one stale_timeout later.
        self._lease_loop = Cadence(self.reactor, self._renew_lease, self.informer_lease_renew,
                                   "informer-sync-lease", ILoopErrors(self.metrics, None))
        self._lease_loop.start()

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
