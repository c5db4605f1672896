"""A pool store in memory for fast unit tests of its writers: the leader's pool sync
and the local cache uploader.

It provides ``IPoolStore`` as ``yurtcoord.pool.store.PoolStore`` does, records every
call, keeps what was written, and can be told to fail calls, to lose the writes of a
call (as etcd 3.5.0 to 3.5.2 may forget writes it acknowledged just before a kill)
and to hold a call in flight.
"""

import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, Union

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.etcd.errors import EtcdUnavailable
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import KeyBuildInfo, PoolKey, PoolKeyBuilder
from yurtcoord.pool.store import ObjectTooLarge, WriteOutcome


@implementer(IPoolStore)
class FakePoolStore:
    """Objects by key path in ``objects`` (decoded) with their resourceVersion in
    ``versions``; a write of a key is taken only when newer than what is stored.

    Records: ``calls`` lists ``("recover", component, resources)``,
    ``("delete_component", component)``, ``("replace", resource, count)``,
    ``("put", paths)`` and ``("delete_many", paths)`` in order; ``puts`` counts the
    ``create_or_update_many`` calls; ``flushes`` the ``flush_key_cache()`` calls and
    ``soon_flushes`` lists ``len(calls)`` at each ``flush_key_cache_soon()``;
    ``health_observers`` and ``term_observers`` are the observers registered now;
    ``closes`` counts the ``close()`` calls, each also passed to ``on_close(store)``.

    Faults: ``fail`` errors are raised by the next writes, one per call; the
    ``create_or_update_many`` calls numbered in ``fail_on`` (from 1) fail with
    ``error``; on call number ``lose_at`` the writes of the call before are forgotten
    and the call fails with ``EtcdUnavailable``; a key in ``fail_deletes`` fails the
    ``delete_many`` reaching it (the keys before it are deleted);
    ``hold_delete_component`` keeps the next ``delete_component_resources`` in flight
    until cancelled; with ``hold_writes`` each ``create_or_update_many`` stays in flight
    (in ``held``, oldest first, with ``in_flight`` the calls not answered yet) until
    ``release()`` answers it. Objects named ``huge...`` are too large for the store.
    """

    def __init__(self, reactor: Any = None, prefix: str = "/registry", name: str = "store",
                 on_close: Optional[Callable[["FakePoolStore"], object]] = None) -> None:
        self.reactor = reactor
        self.name = name
        # One call at a time from a writer that runs as many as this, so that "the
        # call before" of ``lose_at`` is well defined.
        self.parallel_batches = 1
        self._on_close = on_close
        self.keys = PoolKeyBuilder(prefix)
        self.calls: List[Tuple[Any, ...]] = []
        self.puts = 0
        self.objects: Dict[str, Any] = {}
        self.versions: Dict[str, int] = {}
        self.fail: List[BaseException] = []
        self.fail_on: Set[int] = set()
        self.error: BaseException = EtcdUnavailable("down")
        self.lose_at: Optional[int] = None
        self.fail_deletes: Set[str] = set()
        self.hold_delete_component = False
        self.hold_writes = False
        self.held: List[Tuple[defer.Deferred[WriteOutcome], WriteOutcome]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.flushes = 0
        self.soon_flushes: List[int] = []
        self.closes = 0
        self.health_observers: List[Callable[[bool], object]] = []
        self.unreachable: Optional[str] = None
        self.unreachable_observers: List[Callable[[Optional[str]], object]] = []
        self.term_observers: List[Callable[[], object]] = []
        self._last_written: List[str] = []

    def __repr__(self) -> str:
        return f"<FakePoolStore {self.name}>"

    # Test controls ---------------------------------------------------------------

    def health(self, healthy: bool, reason: str = "down") -> None:
        """The store's health flips: every health observer hears of it."""
        for observer in list(self.health_observers):
            observer(healthy)

    def unreachable_for(self, reason: Optional[str]) -> None:
        """The pool etcd starts (``reason``) or stops (None) counting as unreachable:
        every unreachable observer hears of it."""
        self.unreachable = reason
        for observer in list(self.unreachable_observers):
            observer(reason)

    def new_term(self) -> None:
        """etcd reports a new raft term: every term observer hears of it."""
        for observer in list(self.term_observers):
            observer()

    def release(self) -> None:
        """Answer the oldest held ``create_or_update_many``."""
        d, outcome = self.held.pop(0)
        self.in_flight -= 1
        d.callback(outcome)

    # IPoolStore -----------------------------------------------------------------

    def key_func(self, info: KeyBuildInfo) -> PoolKey:
        return self.keys.object_key(info)

    def on_health_change(self, observer: Callable[[bool], object]) -> None:
        self.health_observers.append(observer)

    def remove_health_observer(self, observer: Callable[[bool], object]) -> None:
        self.health_observers.remove(observer)

    def on_unreachable_change(self, observer: Callable[[Optional[str]], object]) -> None:
        self.unreachable_observers.append(observer)

    def remove_unreachable_observer(self, observer: Callable[[Optional[str]], object]) -> None:
        self.unreachable_observers.remove(observer)

    def on_new_term(self, observer: Callable[[], object]) -> None:
        self.term_observers.append(observer)

    def remove_new_term_observer(self, observer: Callable[[], object]) -> None:
        self.term_observers.remove(observer)

    def flush_key_cache(self) -> None:
        self.flushes += 1

    def flush_key_cache_soon(self) -> None:
        self.soon_flushes.append(len(self.calls))

    def close(self) -> defer.Deferred[Any]:
        self.closes += 1
        if self._on_close is not None:
            self._on_close(self)
        return defer.succeed(None)

    def recover_pool_scoped_keys(self, resources: Iterable[Any],
                                 component: str = POOL_SCOPED_COMPONENT,
                                 ) -> defer.Deferred[Dict[Any, Any]]:
        self.calls.append(("recover", component, tuple(str(g) for g in resources)))
        return defer.succeed({})

    def delete_component_resources(self, component: str) -> defer.Deferred[int]:
        self.calls.append(("delete_component", component))
        if self.hold_delete_component:
            self.hold_delete_component = False
            held: defer.Deferred[int] = defer.Deferred(
                lambda d: self.calls.append(("delete_component cancelled",)))
            return held
        deleted = len(self.objects)
        self.objects.clear()
        self.versions.clear()
        return defer.succeed(deleted)

    def replace_component_list(self, component: str, gvr: GroupVersionResource,
                               namespace: Optional[str],
                               objects: Iterable[bytes | Dict[str, Any]],
                               ) -> defer.Deferred[Tuple[int, int]]:
        objects = list(objects)
        self.calls.append(("replace", str(gvr), len(objects)))
        failed = self._maybe_fail()
        if failed:
            return failed
        listed: Dict[str, Any] = {}
        for value in objects:
            obj = value if isinstance(value, dict) else json.loads(value)
            meta = obj["metadata"]
            path = self.key_func(KeyBuildInfo(component, gvr.resource, gvr.group, gvr.version,
                                              meta.get("namespace") or "", meta["name"])).path
            if meta["name"].startswith("huge"):
                return defer.fail(ObjectTooLarge(path, 2 << 20, 1 << 20))
            listed[path] = obj
        prefix = self.keys.list_prefix(gvr.group, gvr.resource)
        for path in [p for p in self.objects if p.startswith(prefix)]:
            del self.objects[path]
            self.versions.pop(path, None)
        for path, obj in listed.items():
            self.objects[path] = obj
            self.versions[path] = int(obj["metadata"].get("resourceVersion") or 0)
        return defer.succeed((len(objects), 0))

    def create_or_update_many(self, items: Iterable[Tuple[PoolKey, bytes, Union[int, str]]],
                              outcome: Optional[WriteOutcome] = None,
                              flush_key_cache: bool = True,
                              in_flight: Optional[int] = None) -> defer.Deferred[WriteOutcome]:
        items = list(items)
        self.puts += 1
        self.calls.append(("put", sorted(key.path for key, _v, _rv in items)))
        if self.puts == self.lose_at:
            for path in self._last_written:
                self.objects.pop(path, None)
                self.versions.pop(path, None)
            return defer.fail(EtcdUnavailable("etcd restarted"))
        failed = self._maybe_fail()
        if failed:
            return failed
        if self.puts in self.fail_on:
            return defer.fail(self.error)
        outcome = outcome if outcome is not None else WriteOutcome()
        self._last_written = []
        for key, value, given_rv in items:
            rv = int(given_rv)  # the store compares resourceVersions as numbers
            stored = self.versions.get(key.path)
            if stored is None:
                outcome.created.append(key.path)
            elif stored < rv:
                outcome.updated.append(key.path)
            else:
                outcome.not_newer.append(key.path)
                continue
            self.objects[key.path] = json.loads(value)
            self.versions[key.path] = rv
            self._last_written.append(key.path)
        if self.hold_writes:
            held: defer.Deferred[WriteOutcome] = defer.Deferred()
            self.held.append((held, outcome))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            return held
        return defer.succeed(outcome)

    def delete_many(self, keys: Iterable[PoolKey | str],
                    flush_key_cache: bool = True) -> defer.Deferred[int]:
        paths = [key.path if isinstance(key, PoolKey) else key for key in keys]
        self.calls.append(("delete_many", paths))
        failed = self._maybe_fail()
        if failed:
            return failed
        for path in paths:
            if path in self.fail_deletes:
                self.fail_deletes.discard(path)
                return defer.fail(EtcdUnavailable("etcd down"))
            self.objects.pop(path, None)
            self.versions.pop(path, None)
        return defer.succeed(len(paths))

    def _maybe_fail(self) -> Optional[defer.Deferred[Any]]:
        if self.fail:
            return defer.fail(self.fail.pop(0))
        return None
