"""The pool store: objects in the pool's etcd, in the coordinator apiserver's layout.

Every object key has a companion ``/mirror/rv<key>`` holding its resourceVersion padded
to 32 digits; padded versions compare as bytes exactly as numbers do, so etcd itself
can check "the stored object is older" inside a transaction compare.

Consistency rules:

- every change touching several keys goes to etcd as transactions, split into batches
  within etcd's limits, and an older object never overwrites a newer one: every write
  of an object is guarded by compares on the mirror keys
  (``yurtcoord.pool.guardedwrites``);
- the component key cache is changed only after etcd accepted a batch, and written to
  disk at the end of each store operation, whether it succeeded or not, so file,
  memory and etcd agree after a failure (a rejected batch leaves the cache as etcd
  is: with the batches accepted before it, without the rejected one); a caller
  making a stream of small operations (pool sync draining watch events) passes
  ``flush_key_cache=False`` and calls ``flush_key_cache_soon()`` after each batch, which
  writes the file at most once per ``key_cache_flush_interval``;
- an object is never stored empty, and every key belongs to a named component, which
  the key cache records (``yurtcoord.pool.storereads`` says how the pool-scoped
  component's keys are rebuilt from etcd).

The store's other jobs live beside it: its reads (``yurtcoord.pool.storereads``), its
health checks, which expose ``healthy`` and tell observers when etcd comes and goes
(``yurtcoord.pool.storehealth``), and the writes of the key cache file at most once per
interval (``yurtcoord.pool.keycacheflush``).

Longer than 600 lines on purpose: what is left is the one class callers see, each
operation a few lines that take the key cache, a batch of guarded writes and the
flush in one order; split further, that order would be read across modules.
"""

import functools
import json
import os
from collections.abc import Callable, Iterable
from typing import Any, Generator, List, ParamSpec, Tuple, Union

from twisted.internet import defer
from twisted.internet.defer import inlineCallbacks
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.etcd.errors import TransactionFailed
from yurtcoord.etcd import transactions as etcdtx
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT, ComponentKeyCache
from yurtcoord.pool.keycacheflush import key_cache_flusher
from yurtcoord.pool.keys import (
    InvalidKey, KeyBuildInfo, PoolKey, PoolKeyBuilder, ResourceId, ResourceLike,
)
from yurtcoord.pool.guardedwrites import GuardedWriter, Steps, delete_ops, put_ops
from yurtcoord.pool.storeobjects import (
    ConflictRetriesExhausted, KeyExists, KeyNotFound, ObjectTooLarge, PoolStoreError,
    UpdateConflict, WriteItem, WriteOutcome, metadata_of, object_metadata, rv_or_none,
)
from yurtcoord.pool.storehealth import UNREACHABLE_AFTER_CHECKS, StoreHealth
from yurtcoord.pool.storereads import StoreReader
from yurtcoord.tx.guardedloop import ILoopErrors

DEFAULT_MAX_OPS = 128
# Seconds between two writes of the key cache file by ``flush_key_cache_soon``.
DEFAULT_KEY_CACHE_FLUSH_INTERVAL = 1.0
DEFAULT_MAX_BYTES = 1536 * 1024

_P = ParamSpec("_P")
# An object key: a PoolKey, or its path.
Key = Union[PoolKey, str]


def _returns_deferred(method: Callable[_P, object]) -> Callable[_P, defer.Deferred[Any]]:
    """Make bad arguments fail the returned Deferred instead of raising at the call, and
    make cancelling it end with CancelledError.

    The etcd client reports a cancelled request as an etcd error (``RequestCancelled``,
    in doubt, so that the store keeps allowing for a write that may have landed); a
    caller that cancels a store operation (a role change, a stop) must see a
    cancellation, not an etcd failure it would retry or log.
    """
    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> defer.Deferred[Any]:
        inner = defer.maybeDeferred(method, *args, **kwargs)
        cancelled = []

        def cancel(_outer: object) -> None:
            cancelled.append(True)
            inner.cancel()

        outer: defer.Deferred[Any] = defer.Deferred(cancel)

        def relay(result: object) -> None:
            if outer.called:
                return None
            if cancelled and isinstance(result, Failure):
                outer.errback(defer.CancelledError())
            elif isinstance(result, Failure):
                outer.errback(result)
            else:
                outer.callback(result)
            return None

        inner.addBoth(relay)
        return outer

    return wrapper


def _as_path(key: Key) -> str:
    return key.path if isinstance(key, PoolKey) else str(key)


@implementer(IPoolStore)
class PoolStore:
    """Objects of the pool in etcd, with the component key cache beside them.

    :param reactor: the reactor/clock for the health loop and timing.
    :param etcd_client: a ``yurtcoord.etcd.client.EtcdClient``.
    :param prefix: the coordinator apiserver's ``--etcd-prefix`` (``/registry``).
    :param key_cache: a loaded ``ComponentKeyCache``.
    :param max_ops: operations (and compares) per transaction.
    :param max_bytes: bytes per request.
    :param close_client: close ``etcd_client`` in ``close()``.
    :param parallel_batches: batches of one create_or_update_many in flight at once.
    :param key_cache_flush_interval: least seconds between two key cache file writes
        asked for with ``flush_key_cache_soon``.
    """

    log = Logger()

    def __init__(self, reactor, etcd_client, prefix, key_cache, max_ops=DEFAULT_MAX_OPS,
                 max_bytes=DEFAULT_MAX_BYTES, health_interval=5.0, health_timeout=2.0,
                 metrics=None, close_client=False, parallel_batches=4,
                 key_cache_flush_interval=DEFAULT_KEY_CACHE_FLUSH_INTERVAL):
        # The guarded writes and batched deletes (and the checks of their limits).
        self._writer = GuardedWriter(self._submit, key_cache, max_ops, max_bytes,
                                     parallel_batches)
        self.reactor = reactor
        self.etcd = etcd_client
        self.keys = PoolKeyBuilder(prefix)
        self.key_cache = key_cache
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.metrics = metrics
        self.close_client = close_client
        self.parallel_batches = parallel_batches
        # The health checks; ``metrics``, when it provides ``ILoopErrors``, counts
        # the checks that raised.
        self.health = StoreHealth(reactor, etcd_client, self.keys.prefix, health_interval,
                                  health_timeout, ILoopErrors(metrics, None))
        self._reader = StoreReader(etcd_client, self._timed, self.keys, metrics)
        self.closed = False
        self.key_cache_flush_interval = key_cache_flush_interval
        self._key_cache_flusher = key_cache_flusher(reactor, key_cache,
                                                    key_cache_flush_interval)

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    @property
    def _byte_budget(self) -> int:
        return self._writer.byte_budget

    @property
    def lost_races(self) -> int:
        """Rounds whose guarded write, planned from fresh reads, still lost to a
        concurrent writer (observability of contention between agents)."""
        return self._writer.lost_races

    # -- keys ----------------------------------------------------------------------

    def key_func(self, info: KeyBuildInfo) -> PoolKey:
        """The PoolKey of a KeyBuildInfo (InvalidKey for names etcd paths cannot hold)."""
        return self.keys.object_key(info)

    # -- health (yurtcoord.pool.storehealth) ---------------------------------------

    @property
    def healthy(self) -> bool:
        """Whether the last health check reached etcd."""
        return self.health.healthy

    @property
    def unreachable(self) -> str | None:
        """Why the health checks fail, once ``UNREACHABLE_AFTER_CHECKS`` failed in a
        row; None after a good one (and before any)."""
        return self.health.unreachable

    @property
    def etcd_version(self) -> str | None:
        """The version the pool etcd last reported (health checks), None before."""
        return self.health.etcd_version

    def start(self) -> "PoolStore":
        """Start the health checks; the first runs at once."""
        self.health.start()
        return self

    def check_health(self) -> defer.Deferred[Any]:
        """Ask etcd for its status now; fires when ``healthy`` reflects the answer."""
        return self.health.check()

    def on_health_change(self, observer: Callable[[bool], object]) -> None:
        """Call ``observer(healthy)`` on every change of ``healthy``."""
        self.health.health_changes.add(observer)

    def remove_health_observer(self, observer: Callable[[bool], object]) -> None:
        """Stop calling ``observer`` (no error when it was not registered)."""
        self.health.health_changes.remove(observer)

    def on_unreachable_change(self, observer: Callable[[str | None], object]) -> None:
        """Call ``observer(unreachable)`` when the pool etcd starts or stops counting as
        unreachable (``UNREACHABLE_AFTER_CHECKS`` failed checks in a row; the reason,
        or None after a good check)."""
        self.health.unreachable_changes.add(observer)

    def remove_unreachable_observer(self, observer: Callable[[str | None], object]) -> None:
        """Stop calling ``observer`` (no error when it was not registered)."""
        self.health.unreachable_changes.remove(observer)

    def on_new_term(self, observer: Callable[[], object]) -> None:
        """Call ``observer()`` when a check finds etcd in a new raft term although the
        check before found it reachable: etcd restarted (or elected a new leader) between
        two checks, unseen by ``on_health_change``. See docs/design.md, "etcd that forgets acknowledged writes"."""
        self.health.new_terms.add(observer)

    def remove_new_term_observer(self, observer: Callable[[], object]) -> None:
        """Stop calling ``observer`` (no error when it was not registered)."""
        self.health.new_terms.remove(observer)

    def close(self) -> defer.Deferred[Any]:
        """Stop the health checks (and the etcd client with ``close_client``)."""
        self.closed = True
        self.health.close()
        # Fires once a key cache write in a thread is over too.
        flushed = self._key_cache_flusher.close()
        d = self.etcd.close() if self.close_client else defer.succeed(None)
        d.addBoth(lambda result: flushed.addCallback(lambda _: result))
        return d

    # -- timing helpers ---------------------------------------------------------------

    def _timed(self, op, d):
        if self.metrics is None:
            return d
        started = self.reactor.seconds()

        def observe(result):
            self.metrics.observe_store_request(op, self.reactor.seconds() - started)
            return result

        d.addBoth(observe)
        return d

    def _submit(self, op, txn, raise_on_failure=True):
        return self._timed(op, self.etcd.submit(txn, raise_on_failure=raise_on_failure))

    def flush_key_cache(self) -> None:
        """Write the component key cache file if it changed (errors are logged)."""
        self._flush_cache(None)

    def flush_key_cache_soon(self) -> None:
        """Write the key cache file now, or, when the last write is more recent than
        ``key_cache_flush_interval``, once that interval has passed since it, in a
        thread where the reactor has one (``yurtcoord.pool.keycacheflush``).

        For callers that change the cache in a stream of small operations (pool sync
        draining watch events). The pool-scoped component's entries, which such
        streams change, are rebuilt from etcd on start anyway; ``close()`` writes
        whatever is pending.
        """
        self._key_cache_flusher.flush_soon()

    def _flush_cache(self, result):
        self._key_cache_flusher.flush_now()
        return result

    # -- single objects --------------------------------------------------------------

    @_returns_deferred
    @inlineCallbacks
    def create(self, key: PoolKey, value: bytes, rv: int | None = None) -> Steps:
        """Put the object and its mirror rv only if the key is absent, else KeyExists."""
        item = self._item(key, value, rv)
        self._check_size(item)
        txn = etcdtx.transaction(
            compare=[etcdtx.key_absent(item.path_bytes)], success=put_ops(item))
        try:
            yield self._submit("create", txn)
        except TransactionFailed:
            raise KeyExists(item.path) from None
        self.key_cache.add(key.component, key.resource, [item.path])
        self._flush_cache(None)

    @_returns_deferred
    @inlineCallbacks
    def update(self, key: PoolKey, value: bytes, rv: int) -> Steps:
        """Put both only if the stored mirror rv is lower; else UpdateConflict(stored object).

        KeyNotFound when the key is absent.
        """
        item = self._item(key, value, rv)
        self._check_size(item)
        txn = etcdtx.transaction(
            compare=[etcdtx.key_present(item.path_bytes),
                     etcdtx.value_below(item.mirror_bytes, item.rv_bytes)],
            success=put_ops(item),
            failure=[etcdtx.get(item.path_bytes), etcdtx.get(item.mirror_bytes)])
        try:
            yield self._submit("update", txn)
        except TransactionFailed as e:
            stored_kvs, mirror_kvs = etcdtx.range_results(e.responses, 2)
            if not stored_kvs:
                raise KeyNotFound(item.path) from None
            stored_rv = rv_or_none(mirror_kvs[0].value) if mirror_kvs else None
            raise UpdateConflict(item.path, stored_kvs[0].value, stored_rv) from None
        self.key_cache.add(key.component, key.resource, [item.path])
        self._flush_cache(None)

    @_returns_deferred
    def create_or_update(self, key: PoolKey, value: bytes,
                         rv: int | None = None) -> defer.Deferred[str]:
        """One object, by resourceVersion; fires with "created", "updated" or "not_newer"."""
        item = self._item(key, value, rv)
        d = self.create_or_update_many([(item.key, item.value, item.rv)])

        def kind(outcome: WriteOutcome) -> str:
            if outcome.too_large:
                raise ObjectTooLarge(item.path, item.size, self._byte_budget)
            if outcome.created:
                return "created"
            if outcome.updated:
                return "updated"
            return "not_newer"

        d.addCallback(kind)
        return d

    # -- reads (yurtcoord.pool.storereads) ---------------------------------------------

    @_returns_deferred
    def get(self, key: Key) -> defer.Deferred[bytes]:
        """The stored bytes at ``key`` (PoolKey or path); KeyNotFound if absent."""
        return self._reader.get(_as_path(key))

    @_returns_deferred
    def get_resource_version(self, key: Key) -> defer.Deferred[int | None]:
        """The stored mirror resourceVersion of ``key``, or None."""
        return self._reader.get_resource_version(_as_path(key))

    @_returns_deferred
    def list(self, prefix: str) -> defer.Deferred[List[bytes]]:
        """Values of every object under ``prefix`` (which must end in ``/``), by key order."""
        return self._reader.list(prefix)

    @_returns_deferred
    def list_keys(self, prefix: str) -> defer.Deferred[List[str]]:
        """Key paths under ``prefix`` (which must end in ``/``), in key order; keys that
        are not UTF-8 are left out (reported as in ``recover_pool_scoped_keys``)."""
        return self._reader.list_keys(prefix)

    @_returns_deferred
    @inlineCallbacks
    def delete(self, key: Key) -> Steps:
        """Delete the object and its mirror rv in one transaction (absent key: no error)."""
        path = _as_path(key)
        txn = etcdtx.transaction(success=delete_ops(path))
        yield self._submit("delete", txn)
        self._forget_key(key, path)
        self._flush_cache(None)

    # -- component lists ---------------------------------------------------------------

    def list_resource_keys_of_component(self, component: str,
                                        gvr: ResourceLike) -> List[str]:
        """Key paths the component owns for a resource, from the key cache, sorted."""
        return sorted(self.key_cache.keys(component, gvr))

    @_returns_deferred
    def replace_component_list(self, component: str, gvr: GroupVersionResource,
                               namespace: str | None,
                               objects: Iterable[bytes | dict[str, Any]],
                               ) -> defer.Deferred[Tuple[int, int]]:
        """Make the component's objects of ``gvr`` (a ``GroupVersionResource``; in
        ``namespace``, or all) exactly ``objects``.

        ``objects`` are JSON bytes or dicts with metadata name and resourceVersion. Every
        put is guarded by the mirror rv as in ``create_or_update_many``: an object stored
        at a newer resourceVersion than the list's copy (a watch event written meanwhile,
        another writer) is kept, and still counts as this component's. Only keys owned
        by this component, of this resource and (if given) this namespace are deleted.
        Puts and deletes go in transactions of at most ``max_ops``/``max_bytes``; the
        key cache follows each accepted transaction. An empty ``component`` is an
        ``InvalidKey`` error: keys nobody owns could never be cleaned up.
        """
        if not isinstance(component, str) or not component:
            raise InvalidKey(f"component must be a non-empty string, got {component!r}")
        resource = ResourceId.of(gvr)
        namespaced = gvr.namespaced
        items: dict[str, WriteItem] = {}
        for obj in objects:
            value = obj if isinstance(obj, bytes) else json.dumps(obj).encode("utf-8")
            name, obj_namespace, rv = object_metadata(value)
            if namespace and obj_namespace and obj_namespace != namespace:
                raise ValueError(f"object {obj_namespace}/{name} is not in namespace {namespace}")
            if namespace and not obj_namespace and namespaced:
                obj_namespace = namespace
            if not namespaced:
                obj_namespace = ""
            key = self.keys.object_key(KeyBuildInfo(
                component, resource.resource, resource.group, resource.version,
                obj_namespace, name))
            item = WriteItem(key, value, rv)
            self._check_size(item)
            previous = items.get(key.path)
            if previous is None or previous.rv < rv:
                items[key.path] = item
        prefix = self.keys.list_prefix(resource.group, resource.resource, namespace or None)
        owned = {k for k in self.key_cache.keys(component, resource) if k.startswith(prefix)}
        stale = sorted(owned - set(items))
        d = self._replace_list(component, resource, [items[p] for p in sorted(items)], stale)
        d.addBoth(self._flush_cache)

        def done(_: object) -> Tuple[int, int]:
            self.log.info("replaced list of {component} {resource} in {namespace}: "
                          "{count} objects, {deleted} deleted", component=component,
                          resource=str(resource), namespace=namespace or "all namespaces",
                          count=len(items), deleted=len(stale))
            return len(items), len(stale)

        d.addCallback(done)
        return d

    @inlineCallbacks
    def _replace_list(self, component, resource, items, stale):
        """Guarded puts of the list (the key cache follows each accepted or possibly
        applied batch, see ``yurtcoord.pool.guardedwrites``), then deletes of stale keys."""
        yield self._writer.write(items, WriteOutcome())

        def forget(paths):
            self.key_cache.discard(component, resource, paths)

        yield self._writer.delete("replace_list", stale, forget)

    @_returns_deferred
    def delete_many(self, keys: Iterable[Key],
                    flush_key_cache: bool = True) -> defer.Deferred[int]:
        """Delete objects (PoolKeys or paths) and their mirror rvs, many per transaction.

        Absent keys are no error. The key cache forgets each batch once etcd accepted
        it (a PoolKey for its component and resource, a path for every component).
        ``flush_key_cache=False`` leaves writing the key cache file to the caller
        (``flush_key_cache()``): one write per drained batch of changes instead of one
        per call. Fires with the number of keys deleted (asked for, present or not).
        """
        owners: dict[str, List[Key]] = {}
        for key in keys:
            path = _as_path(key)
            owners.setdefault(path, []).append(key)

        def forget(paths):
            for path in paths:
                for key in owners[path]:
                    self._forget_key(key, path)

        d = self._writer.delete("delete", sorted(owners), forget)
        if flush_key_cache:
            d.addBoth(self._flush_cache)
        d.addCallback(lambda _: len(owners))
        return d

    def _forget_key(self, key, path):
        if isinstance(key, PoolKey):
            self.key_cache.discard(key.component, key.resource, [path])
            return
        for component in self.key_cache.components():
            for resource in self.key_cache.resources(component):
                self.key_cache.discard(component, resource, [path])

    @_returns_deferred
    def delete_component_resources(self, component: str) -> defer.Deferred[int]:
        """Delete every key the component owns (all resources), then forget the component."""
        d = self._delete_component(component)
        d.addBoth(self._flush_cache)
        return d

    @inlineCallbacks
    def _delete_component(self, component):
        deleted = 0
        for resource in self.key_cache.resources(component):
            paths = sorted(self.key_cache.keys(component, resource))

            def forget(batch_paths, resource=resource):
                self.key_cache.discard(component, resource, batch_paths)

            yield self._writer.delete("delete_component", paths, forget)
            deleted += len(paths)
        self.key_cache.drop(component)
        self.log.info("deleted {count} keys of component {component}", count=deleted,
                      component=component)
        return deleted

    @_returns_deferred
    @inlineCallbacks
    def recover_pool_scoped_keys(self, resources: Iterable[Any],
                                 component: str = POOL_SCOPED_COMPONENT) -> Steps:
        """Rebuild the pool-scoped component's keys from etcd (the file is not trusted).

        Every key under the resources' prefixes is adopted except those the key cache
        records for another component, and those that are not UTF-8 (skipped, counted
        and logged once); see ``yurtcoord.pool.storereads`` for why.
        """
        others = set()
        for other in self.key_cache.components():
            if other != component:
                others.update(self.key_cache.keys(other))
        rebuilt, left = yield self._reader.keys_under(resources, others)
        self.key_cache.set_component(component, rebuilt)
        self._flush_cache(None)
        self.log.info("rebuilt keys of {component} from etcd: {count} keys, {left} keys "
                      "of other components left to them", component=component,
                      count=sum(len(k) for k in rebuilt.values()), left=left)
        return rebuilt

    # -- create or update many by resourceVersion --------------------------------------

    @_returns_deferred
    def create_or_update_many(self, items: Iterable[Tuple[PoolKey, bytes, Union[int, str]]],
                              outcome: WriteOutcome | None = None,
                              flush_key_cache: bool = True,
                              in_flight: int | None = None) -> defer.Deferred[WriteOutcome]:
        """Create absent objects and update older ones, many per transaction.

        ``items``: iterable of ``(PoolKey, bytes, resourceVersion)``. Fires with a
        WriteOutcome (pass the same one again to resume after an etcd error: decided
        keys are not redone, writes whose answer was lost are recognised). Each batch
        is written with compares guarding every key (absent key / stored rv lower),
        so a concurrent writer makes the write fail and the batch is planned again
        from fresh reads, never overwritten (see ``yurtcoord.pool.guardedwrites``). Objects
        with an equal or newer stored rv, or stored without a mirror rv, are left
        alone (``not_newer``).  Up to ``parallel_batches``
        batches are in flight at once (their keys are disjoint), so etcd can commit
        several with one disk sync; ``in_flight`` sets another bound for this call (a
        caller running several calls at once, each with ``in_flight=1``, keeps
        ``parallel_batches`` in flight in all).  ``flush_key_cache=False`` leaves writing
        the key cache file to the caller (``key_cache.flush()``), for callers making many
        calls.
        """
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        outcome = outcome if outcome is not None else WriteOutcome()
        pending: dict[str, WriteItem] = {}
        budget = self._byte_budget
        for key, value, rv in items:
            item = WriteItem(key, value, int(rv))
            if item.path in outcome.decided:
                continue
            if item.size > budget:
                if item.path not in outcome.too_large:
                    outcome.too_large.append(item.path)
                    outcome.decided.add(item.path)
                continue
            previous = pending.get(item.path)
            if previous is None or previous.rv < item.rv:
                pending[item.path] = item
        d = self._writer.write(list(pending.values()), outcome, in_flight)
        if flush_key_cache:
            d.addBoth(self._flush_cache)
        d.addCallback(lambda _: outcome)
        return d

    # -- transaction building -----------------------------------------------------------

    def _item(self, key, value, rv):
        if not isinstance(key, PoolKey):
            raise TypeError(f"expected a PoolKey (from key_func), got {type(key).__name__}")
        if not isinstance(value, bytes):
            raise TypeError(f"object value must be bytes, got {type(value).__name__}")
        if rv is None:
            _name, _namespace, rv = object_metadata(value)
        return WriteItem(key, value, int(rv))

    def _check_size(self, item):
        if item.size > self._byte_budget:
            raise ObjectTooLarge(item.path, item.size, self._byte_budget)



@inlineCallbacks
def open_pool_store(reactor: Any, etcd_client: Any, prefix: str, local_cache_dir: str,
                    pool_scoped_resources: Iterable[Any],
                    check_timeout: float | None = None,
                    **store_kwargs: Any) -> Generator[defer.Deferred[Any], Any, PoolStore]:
    """Load the key cache, rebuild the keys of ``pool_scoped_resources`` from etcd (none
    given: left to pool sync, which rebuilds them when it starts), start health checks.

    With ``check_timeout`` (seconds) etcd must first answer a status request within
    that time: a store is opened only on an etcd that answers, so a role step against
    a dead etcd fails fast and is retried instead of hanging in its first write.
    ``local_cache_dir`` is created when missing (the key cache file lives there).

    Fires with a started PoolStore, or fails with an etcd error and leaves nothing
    running. A malformed key cache file is set aside and the cache starts empty
    (``ComponentKeyCache.load_or_set_aside``): it would never mend itself.
    """
    os.makedirs(local_cache_dir, exist_ok=True)
    if check_timeout is not None:
        yield etcd_client.status(timeout=check_timeout)
    key_cache = ComponentKeyCache.in_directory(local_cache_dir).load_or_set_aside()
    store = PoolStore(reactor, etcd_client, prefix, key_cache, **store_kwargs)
    try:
        if pool_scoped_resources:
            yield store.recover_pool_scoped_keys(pool_scoped_resources)
    except BaseException:
        yield store.close()
        raise
    return store.start()


__all__ = [
    "PoolStore", "PoolStoreError", "KeyExists", "KeyNotFound", "UpdateConflict",
    "ObjectTooLarge", "ConflictRetriesExhausted", "WriteOutcome", "object_metadata",
    "metadata_of",
    "open_pool_store", "UNREACHABLE_AFTER_CHECKS",
]
