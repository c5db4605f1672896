"""Where the test API server keeps its objects, behind one interface.

The HTTP layer (``resource``, ``watch``, ``pages``) talks only to an
``IObjectStorage``, whose every call answers with a Deferred, so that the same
verbs run over the in-memory ``ObjectStore`` (``MemoryStorage``, answers at once)
and over etcd in kube-apiserver's key layout (``etcdstorage.EtcdStorage``).

Errors are the ``KubeError``s the HTTP layer turns into Status answers (404, 409,
410 ...), failed through the Deferred.
"""

from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer
from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface, implementer

from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.sim.apiserver.catalog import Catalog
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.store import ObjectStore, position
from yurtcoord.sim.apiserver.watchers import Watcher

__all__ = ["IObjectStorage", "IStorageWatch", "MemoryStorage", "MemoryWatch", "StoragePage",
           "position"]

Objects = list[dict[str, Any]]
EventCallback = Callable[[str, dict[str, Any]], object]


@dataclass
class StoragePage:
    """Part of a list: ``items`` in position order, the ``revision`` they were read
    at, and how many objects of the range come after them (``remaining``)."""

    items: Objects
    revision: int
    remaining: int


class IStorageWatch(Interface):
    """One registered watch of a storage."""

    resource_version = Attribute(
        "int: the revision up to which this watch has delivered every change; what a "
        "BOOKMARK event reports.")
    ended = Attribute(
        "Deferred firing when the storage ends the watch by itself: with None for a "
        "clean end (the client watches again), failing with a KubeError (410 when the "
        "revision was compacted under it). Never fires after cancel().")

    replaying = Attribute(
        "bool: part of the watch's replay is still to be handed on by replay(); the "
        "changes that come meanwhile wait behind it.")

    def replay(count: int) -> None:
        """Hand on up to ``count`` more events of the replay through the callback.
        (A storage that delivers its replay as it comes has nothing held back.)"""

    def cancel() -> None:
        """Stop delivering; idempotent."""


class IObjectStorage(Interface):
    """Objects of the served types: get, list at a revision, guarded writes, watch."""

    catalog = Attribute("The Catalog of served types.")

    def get(gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> "Deferred[dict[str, Any] | None]":
        """The object, or None."""

    def list(gvr: GroupVersionResource, namespace: str | None = None,
             revision: int | None = None) -> "Deferred[tuple[Objects, int]]":
        """``(objects, revision)``: the objects of ``gvr`` (in ``namespace``; all
        namespaces for None) sorted by namespace and name, as they are now
        (``revision`` None) or were at ``revision``; 410 when that revision is no
        longer kept."""

    def list_page(gvr: GroupVersionResource, namespace: str | None, revision: int | None,
                  after: str | None, limit: int | None) -> "Deferred[StoragePage]":
        """At most ``limit`` (None: all) objects of ``gvr`` (in ``namespace``) whose
        position comes after ``after`` (None: from the first), now or at
        ``revision``; 410 when that revision is no longer kept."""

    def create(gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> "Deferred[dict[str, Any]]":
        """Store a new object only if none of that name exists (409 AlreadyExists)."""

    def update(gvr: GroupVersionResource, obj: dict[str, Any], namespace: str | None = None,
               subresource: str | None = None) -> "Deferred[dict[str, Any]]":
        """Replace an object; a resourceVersion in ``obj`` must be the current one
        (409 Conflict), none means unconditional."""

    def delete(gvr: GroupVersionResource, name: str, namespace: str | None = None,
               preconditions: dict[str, Any] | None = None) -> "Deferred[dict[str, Any]]":
        """Remove an object (uid / resourceVersion preconditions hold, else 409);
        fires with it as last seen, carrying the revision of the deletion."""

    def watch(gvr: GroupVersionResource, object_filter: ObjectFilter, since: int | None,
              callback: EventCallback) -> "Deferred[IStorageWatch]":
        """Call ``callback(event_type, obj)`` for every change matching the filter
        after ``since``; ``since`` None first delivers ADDED for every matching
        object. 410 when ``since`` is older than what the storage keeps."""

    def encoded(obj: dict[str, Any]) -> str | None:
        """The JSON this storage keeps of ``obj``, an object it handed to a watch
        callback, or None when it keeps none: a watch stream writes that text
        instead of encoding the object again."""

    def compact() -> "Deferred[None]":
        """Forget the history: a watch or list from before the newest change gets 410
        (the in-memory store forgets that change too; etcd keeps the revision it was
        compacted at)."""

    def close() -> "Deferred[None]":
        """Release connections; the storage is not used afterwards."""


@implementer(IStorageWatch)
class MemoryWatch:
    """A watch on the in-memory store, never ended by the store. Its replay is handed
    on as the watch stream asks for it (``replay``); changes after it at once."""

    def __init__(self, store: ObjectStore, watcher: Watcher) -> None:
        self._store = store
        self._watcher = watcher
        self.ended: Deferred[None] = Deferred()

    @property
    def resource_version(self) -> int:
        # Once the replay is handed on, delivery is synchronous: every change up to
        # the store's version was offered.
        if self._watcher.replaying:
            return self._watcher.replayed_to
        return self._store.resource_version

    @property
    def replaying(self) -> bool:
        return self._watcher.replaying

    def replay(self, count: int) -> None:
        self._watcher.replay(count)

    def cancel(self) -> None:
        self._watcher.cancel()


@implementer(IObjectStorage)
class MemoryStorage:
    """The in-memory ``ObjectStore`` as an ``IObjectStorage`` (answers fire at once)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @property
    def catalog(self) -> Catalog:
        return self.store.catalog

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> "Deferred[dict[str, Any] | None]":
        return defer.maybeDeferred(self.store.get, gvr, name, namespace)

    def list(self, gvr: GroupVersionResource, namespace: str | None = None,
             revision: int | None = None) -> "Deferred[tuple[Objects, int]]":
        def listed() -> tuple[Objects, int]:
            if revision is None:
                return self.store.list_with_version(gvr, namespace)
            return self.store.list_at(gvr, namespace, revision), revision
        return defer.maybeDeferred(listed)

    def list_page(self, gvr: GroupVersionResource, namespace: str | None,
                  revision: int | None, after: str | None,
                  limit: int | None) -> "Deferred[StoragePage]":
        return defer.maybeDeferred(
            lambda: StoragePage(*self.store.list_page(gvr, namespace, revision, after, limit)))

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> "Deferred[dict[str, Any]]":
        return defer.maybeDeferred(self.store.create, gvr, obj, namespace)

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None,
               subresource: str | None = None) -> "Deferred[dict[str, Any]]":
        return defer.maybeDeferred(self.store.update, gvr, obj, namespace, subresource)

    def delete(self, gvr: GroupVersionResource, name: str, namespace: str | None = None,
               preconditions: dict[str, Any] | None = None) -> "Deferred[dict[str, Any]]":
        return defer.maybeDeferred(self.store.delete, gvr, name, namespace, preconditions)

    def watch(self, gvr: GroupVersionResource, object_filter: ObjectFilter, since: int | None,
              callback: EventCallback) -> "Deferred[IStorageWatch]":
        return defer.maybeDeferred(
            lambda: MemoryWatch(self.store,
                                self.store.watch(gvr, object_filter, since, callback,
                                                 lazy=True)))

    def encoded(self, obj: dict[str, Any]) -> str | None:
        return self.store.encoded(obj)

    def compact(self) -> "Deferred[None]":
        return defer.maybeDeferred(self.store.compact)

    def close(self) -> "Deferred[None]":
        return defer.succeed(None)
