"""The test API server's objects in etcd, laid out as kube-apiserver lays them out.

Keys are the pool store's own (``yurtcoord.pool.keys``): ``<prefix>/<resource>/
<namespace>/<name>`` with kube-apiserver's special resource prefixes, so this server
serves exactly what the agents write into the pool etcd. Values are the objects'
JSON, stored without a resourceVersion; an object read carries its key's etcd mod
revision as ``metadata.resourceVersion``, as kube-apiserver reports it, and lists
carry the store revision they were read at.

Writes are guarded transactions: create only if the key is absent, update and
delete only if the key's mod revision is still the one read (a client's
resourceVersion must be that revision, else 409; without one, the write is tried
again on the newer object). LIST reads at a revision (410 once compacted); watches
are etcd watches over the gateway's stream (``EtcdClient.watch``), 410 when their
revision was compacted.

The ``/mirror/rv<key>`` keys the agents write beside their objects are not objects:
they lie outside every resource's key range, and any key under the mirror prefix
is left out of lists and watches all the same.
"""

import json
import random
from typing import Any, Callable, Generator

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.etcd.client import EtcdClient, prefix_keyset, prefix_range_end
from yurtcoord.etcd.errors import EtcdError, RequestRejected
from yurtcoord.etcd.txaioetcd_private import txaioetcd
from yurtcoord.etcd.watch import EtcdWatch, KeyEvent, WatchCompacted, WatchResponse
from yurtcoord.kube.errors import KubeError
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.pool.keys import (
    MIRROR_RV_PREFIX, InvalidKey, KeyBuildInfo, PoolKeyBuilder)
from yurtcoord.sim.apiserver import status
from yurtcoord.sim.apiserver.catalog import Catalog, ResourceType
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.storage import (
    EventCallback, IObjectStorage, IStorageWatch, StoragePage)
from yurtcoord.sim.apiserver.store import (
    check_preconditions, decorate, generated_name, incoming, namespace_of, new_object,
    replacement, served_type, validate_name)
from yurtcoord.sim.apiserver.watchers import deliver

Objects = list[dict[str, Any]]

# The component name key building asks for; ownership means nothing to the server.
_COMPONENT = "kube-apiserver"
# Times an unconditional update or delete is tried when the object changed under it
# (as many as concurrent writers can win before it; kube-apiserver retries without
# bound), and names tried for a generateName.
_ATTEMPTS = 64
_MIRROR = MIRROR_RV_PREFIX.encode()
_log = Logger()


def _encode(obj: dict[str, Any]) -> bytes:
    """The stored bytes: the object's JSON without its resourceVersion (etcd's mod
    revision is the object's version)."""
    stored = dict(obj)
    stored["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return json.dumps(stored, separators=(",", ":")).encode()


def _etcd_error(failure: Failure) -> Failure:
    """etcd's failures as the Status errors a client of the API understands."""
    if failure.check(KubeError):
        return failure
    if failure.check(RequestRejected) and "compacted" in str(failure.value):
        raise status.error(410, f"too old resource version: {failure.value}")
    if failure.check(EtcdError):
        _log.warn("etcd request of the API server failed: {error}",
                  error=failure.getErrorMessage())
        raise status.error(500, f"etcd: {failure.value}")
    return failure


@implementer(IStorageWatch)
class EtcdStorageWatch:
    """One API watch over one etcd watch; events become ADDED/MODIFIED/DELETED
    through the watch's filter, as etcd sends them (nothing is held back)."""

    log = Logger()
    replaying = False

    def __init__(self, storage: "EtcdStorage", resource_type: ResourceType,
                 object_filter: ObjectFilter, callback: EventCallback, revision: int) -> None:
        self._storage = storage
        self._type = resource_type
        self._filter = object_filter
        self._callback = callback
        self.resource_version = revision
        self.ended: Deferred[None] = Deferred()
        self._etcd_watch: EtcdWatch | None = None
        self._cancelled = False

    def _attach(self, etcd_watch: EtcdWatch) -> "EtcdStorageWatch":
        self._etcd_watch = etcd_watch
        etcd_watch.finished.addBoth(self._finished)
        if self._cancelled:
            etcd_watch.cancel()
        return self

    def _finished(self, result: object) -> None:
        self._storage._watches.discard(self)
        if self._cancelled or self.ended.called:
            return
        if isinstance(result, Failure):
            if isinstance(result.value, WatchCompacted):
                self.ended.errback(status.expired(self.resource_version,
                                                  result.value.compact_revision))
                return
            if result.check(KubeError):
                self.ended.errback(result)
                return
            if result.check(EtcdError):
                self.log.info("etcd watch of {resource} ended: {error}",
                              resource=self._type.gvr.resource,
                              error=result.getErrorMessage())
            else:
                self.log.failure("etcd watch of {resource} failed", result,
                                 resource=self._type.gvr.resource)
        # The client watches again from the last version it saw.
        self.ended.callback(None)

    def response(self, response: WatchResponse) -> None:
        """Deliver one etcd watch answer's events (raising ends the watch)."""
        for event in response.events:
            if event.key.startswith(_MIRROR):
                continue
            self._event(event)
            self.resource_version = max(self.resource_version, event.mod_revision)

    def _event(self, event: KeyEvent) -> None:
        decode = self._storage._decode
        revision = event.mod_revision
        if event.type == "DELETE":
            if event.prev_value is None:
                raise status.error(500, f"etcd sent the deletion of {event.key!r} without "
                                        f"the object deleted")
            gone = decode(self._type, event.key, event.prev_value, revision)
            deliver(self._filter, self._callback, "DELETED", gone, None, revision)
            return
        obj = decode(self._type, event.key, event.value, revision)
        if event.create_revision == revision:
            deliver(self._filter, self._callback, "ADDED", obj, None, revision)
            return
        # Without the object before, it counts as unchanged in the filter's eyes.
        old = obj if event.prev_value is None else decode(
            self._type, event.key, event.prev_value, revision)
        deliver(self._filter, self._callback, "MODIFIED", obj, old, revision)

    def replay(self, count: int) -> None:
        """etcd sends the replay itself: nothing is held back here."""

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._storage._watches.discard(self)
        if self._etcd_watch is not None:
            self._etcd_watch.cancel()


@implementer(IObjectStorage)
class EtcdStorage:
    """Objects of the catalog's types in etcd under ``prefix`` (``/registry``), through
    an ``EtcdClient`` that ``connect()`` makes when one is needed and ``close()``
    closes (so that a server stopped and started again has a new one); ``clock``
    gives creation timestamps."""

    log = Logger()

    def __init__(self, connect: Callable[[], EtcdClient], clock: IReactorTime,
                 catalog: Catalog | None = None, prefix: str = "/registry",
                 seed: int | None = None) -> None:
        self._connect = connect
        self._current: EtcdClient | None = None
        self.catalog = catalog or Catalog()
        self._keys = PoolKeyBuilder(prefix)
        self._clock = clock
        self._random = random.Random(seed)
        self._watches: set[EtcdStorageWatch] = set()

    @property
    def _client(self) -> EtcdClient:
        if self._current is None:
            self._current = self._connect()
        return self._current

    @property
    def prefix(self) -> str:
        return self._keys.prefix

    # -- keys and values ---------------------------------------------------------

    def key(self, gvr: GroupVersionResource, name: str, namespace: str = "") -> bytes:
        """The etcd key of one object, as kube-apiserver names it."""
        try:
            return self._keys.object_key(KeyBuildInfo(
                _COMPONENT, gvr.resource, gvr.group, gvr.version, namespace, name)).path.encode()
        except InvalidKey as e:
            raise status.bad_request(f"invalid object name or namespace: {e}")

    def _prefix(self, resource_type: ResourceType, namespace: str | None) -> bytes:
        gvr = resource_type.gvr
        try:
            return self._keys.list_prefix(gvr.group, gvr.resource, namespace or None).encode()
        except InvalidKey as e:
            raise status.bad_request(f"invalid namespace: {e}")

    def _decode(self, resource_type: ResourceType, key: bytes, value: bytes,
                revision: int) -> dict[str, Any]:
        """The object stored at ``key`` as served: its JSON with kind and apiVersion of
        the type asked for and the revision as its resourceVersion."""
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            raise status.error(500, f"the object stored at {key.decode('utf-8', 'replace')} "
                                    f"is not a JSON object with metadata")
        obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
        return decorate(resource_type, obj)

    @defer.inlineCallbacks
    def _read(self, key: bytes) -> Generator[Deferred[Any], Any, Any]:
        page = yield self._client.range_page(txaioetcd.KeySet(key))
        return page.kvs[0] if page.kvs else None

    # -- reads -------------------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> "Deferred[dict[str, Any] | None]":
        return defer.ensureDeferred(self._get(gvr, name, namespace)).addErrback(_etcd_error)

    async def _get(self, gvr: GroupVersionResource, name: str,
                   namespace: str | None) -> dict[str, Any] | None:
        resource_type = served_type(self.catalog, gvr)
        key = self.key(gvr, name, namespace_of(resource_type, {}, namespace))
        kv = await self._read(key)
        if kv is None:
            return None
        return self._decode(resource_type, key, kv.value, kv.mod_revision)

    def list(self, gvr: GroupVersionResource, namespace: str | None = None,
             revision: int | None = None) -> "Deferred[tuple[Objects, int]]":
        return defer.ensureDeferred(self._list(gvr, namespace, revision)).addErrback(
            _etcd_error)

    async def _list(self, gvr: GroupVersionResource, namespace: str | None,
                    revision: int | None) -> tuple[Objects, int]:
        resource_type = served_type(self.catalog, gvr)
        if not resource_type.gvr.namespaced:
            namespace = None
        page = await self._client.range_page(self._prefix(resource_type, namespace),
                                             revision=revision)
        items = [self._decode(resource_type, kv.key, kv.value, kv.mod_revision)
                 for kv in page.kvs if not kv.key.startswith(_MIRROR)]
        return items, revision or page.revision or 0

    def list_page(self, gvr: GroupVersionResource, namespace: str | None,
                  revision: int | None, after: str | None,
                  limit: int | None) -> "Deferred[StoragePage]":
        return defer.ensureDeferred(
            self._list_page(gvr, namespace, revision, after, limit)).addErrback(_etcd_error)

    async def _list_page(self, gvr: GroupVersionResource, namespace: str | None,
                         revision: int | None, after: str | None,
                         limit: int | None) -> StoragePage:
        resource_type = served_type(self.catalog, gvr)
        if not resource_type.gvr.namespaced:
            namespace = None
        prefix = self._prefix(resource_type, namespace)
        # A position is the key below the resource's own prefix (all namespaces).
        start = self._prefix(resource_type, None) + after.encode() + b"\x00" if after else prefix
        page = await self._client.range_page(
            txaioetcd.KeySet(max(start, prefix), range_end=prefix_range_end(prefix)),
            limit=limit, revision=revision)
        items = [self._decode(resource_type, kv.key, kv.value, kv.mod_revision)
                 for kv in page.kvs if not kv.key.startswith(_MIRROR)]
        return StoragePage(items, revision or page.revision or 0,
                           max(0, page.count - len(page.kvs)))

    # -- writes ------------------------------------------------------------------

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> "Deferred[dict[str, Any]]":
        return defer.ensureDeferred(self._create(gvr, obj, namespace)).addErrback(_etcd_error)

    async def _create(self, gvr: GroupVersionResource, obj: dict[str, Any],
                      namespace: str | None) -> dict[str, Any]:
        resource_type, obj, metadata, ns = incoming(self.catalog, gvr, obj, namespace)
        generate = metadata.get("generateName") if not metadata.get("name") else None
        for _ in range(_ATTEMPTS if generate else 1):
            name = generated_name(generate, self._random) if generate else metadata.get("name")
            validate_name(resource_type, name, ns)
            assert isinstance(name, str)
            created = new_object(resource_type, dict(obj, metadata=dict(metadata)), ns, name,
                                 self._clock.seconds())
            key = self.key(gvr, name, ns)
            result = await self._client.submit(txaioetcd.Transaction(
                compare=[txaioetcd.CompVersion(key, "==", 0)],
                success=[txaioetcd.OpSet(key, _encode(created))]), raise_on_failure=False)
            if result.succeeded:
                created["metadata"]["resourceVersion"] = str(result.revision)
                self.log.debug("created {key} rv={rv}", key=key, rv=result.revision)
                return created
        raise status.already_exists(resource_type, str(name))

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None,
               subresource: str | None = None) -> "Deferred[dict[str, Any]]":
        return defer.ensureDeferred(self._update(gvr, obj, namespace, subresource)).addErrback(
            _etcd_error)

    async def _update(self, gvr: GroupVersionResource, obj: dict[str, Any],
                      namespace: str | None, subresource: str | None) -> dict[str, Any]:
        resource_type, obj, metadata, ns = incoming(self.catalog, gvr, obj, namespace)
        name = metadata.get("name")
        if not name:
            raise status.invalid(resource_type, name, "metadata.name",
                                 "Required value: name is required")
        key = self.key(gvr, name, ns)
        wanted = metadata.get("resourceVersion")
        for _ in range(_ATTEMPTS):
            kv = await self._read(key)
            if kv is None:
                raise status.not_found(resource_type, name)
            current = self._decode(resource_type, key, kv.value, kv.mod_revision)
            new = replacement(resource_type, current, json.loads(json.dumps(obj)), ns,
                              subresource)
            if new is None:
                return current
            result = await self._client.submit(txaioetcd.Transaction(
                compare=[txaioetcd.CompModified(key, "==", kv.mod_revision)],
                success=[txaioetcd.OpSet(key, _encode(new))]), raise_on_failure=False)
            if result.succeeded:
                new["metadata"]["resourceVersion"] = str(result.revision)
                self.log.debug("updated {key} rv={rv}", key=key, rv=result.revision)
                return new
            if wanted:
                break
        raise status.conflict(resource_type, name)

    def delete(self, gvr: GroupVersionResource, name: str, namespace: str | None = None,
               preconditions: dict[str, Any] | None = None) -> "Deferred[dict[str, Any]]":
        return defer.ensureDeferred(self._delete(gvr, name, namespace, preconditions)).addErrback(
            _etcd_error)

    async def _delete(self, gvr: GroupVersionResource, name: str, namespace: str | None,
                      preconditions: dict[str, Any] | None) -> dict[str, Any]:
        resource_type = served_type(self.catalog, gvr)
        key = self.key(gvr, name, namespace_of(resource_type, {}, namespace))
        for _ in range(_ATTEMPTS):
            kv = await self._read(key)
            if kv is None:
                raise status.not_found(resource_type, name)
            current = self._decode(resource_type, key, kv.value, kv.mod_revision)
            check_preconditions(resource_type, name, current, preconditions)
            result = await self._client.submit(txaioetcd.Transaction(
                compare=[txaioetcd.CompModified(key, "==", kv.mod_revision)],
                success=[txaioetcd.OpDel(key)]), raise_on_failure=False)
            if result.succeeded:
                current["metadata"]["resourceVersion"] = str(result.revision)
                self.log.debug("deleted {key} rv={rv}", key=key, rv=result.revision)
                return current
        raise status.conflict(resource_type, name)

    # -- watch -------------------------------------------------------------------

    def watch(self, gvr: GroupVersionResource, object_filter: ObjectFilter, since: int | None,
              callback: EventCallback) -> "Deferred[IStorageWatch]":
        return defer.ensureDeferred(self._watch(gvr, object_filter, since, callback)).addErrback(
            _etcd_error)

    async def _watch(self, gvr: GroupVersionResource, object_filter: ObjectFilter,
                     since: int | None, callback: EventCallback) -> IStorageWatch:
        resource_type = served_type(self.catalog, gvr)
        namespace = object_filter.namespace if resource_type.gvr.namespaced else None
        if not since:
            items, since = await self._list(gvr, namespace, None)
            for item in items:
                if object_filter.matches(item):
                    callback("ADDED", item)
        watch = EtcdStorageWatch(self, resource_type, object_filter, callback, since)
        self._watches.add(watch)
        try:
            etcd_watch = await self._client.watch(
                prefix_keyset(self._prefix(resource_type, namespace)), watch.response,
                start_revision=since + 1, prev_kv=True)
        except BaseException:
            self._watches.discard(watch)
            raise
        return watch._attach(etcd_watch)

    def watch_count(self) -> int:
        """How many watches are open on etcd."""
        return len(self._watches)

    def encoded(self, obj: dict[str, Any]) -> str | None:
        """None: an event's object is decoded from its etcd value, not kept encoded."""
        return None

    # -- maintenance -------------------------------------------------------------

    def compact(self) -> "Deferred[None]":
        return defer.ensureDeferred(self._compact()).addErrback(_etcd_error)

    async def _compact(self) -> None:
        # Any read answers with the store revision.
        page = await self._client.range_page(txaioetcd.KeySet(self.prefix.encode() or b"/"),
                                             count_only=True)
        await self._client.compact(page.revision or 0)
        self.log.info("etcd compacted at revision {revision}", revision=page.revision)

    def close(self) -> "Deferred[None]":
        for watch in list(self._watches):
            watch.cancel()
        client, self._current = self._current, None
        if client is None:
            return defer.succeed(None)
        return client.close().addCallback(lambda _: None)


def storage_for(reactor: Any, urls: str, prefix: str = "/registry",
                catalog: Catalog | None = None, **config: Any) -> EtcdStorage:
    """An ``EtcdStorage`` on the comma-separated etcd ``urls``, the members of one
    cluster (the client moves between them as the agents' does; ``config`` goes to its
    ``EtcdConfig``: TLS files, timeout)."""
    from yurtcoord.etcd.client import EtcdConfig
    members = [url.strip() for url in urls.split(",") if url.strip()]
    if not members:
        raise ValueError(f"no etcd URL in {urls!r}")
    etcd_config = EtcdConfig(members[0], more_urls=tuple(members[1:]), **config)
    return EtcdStorage(lambda: EtcdClient(reactor, etcd_config), reactor, catalog, prefix)

