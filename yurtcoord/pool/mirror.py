"""One pool-scoped resource mirrored from the cloud into the pool store.

The leader's pool sync (``yurtcoord.pool.sync``) runs one ``ResourceMirror`` per
pool-scoped resource. A mirror's life is one Automat machine whose states hold what
exists only in them:

- ``new``: built, nothing running;
- ``awaiting_list``: the informer runs and its first list is not in yet; the state
  holds the informer's sync Deferred, and changes delivered meanwhile are left to
  the list;
- ``mirroring``: every change delivered is queued for the pool store, after the
  informer's whole list (written first, as one replace of the component's keys);
- ``relisting``: the informer relisted (after 410) and delivers the difference in
  one go; the state holds the timer of the next reactor turn, when the informer's
  whole new list is queued as one replace, and changes delivered until then are
  covered by it;
- ``stopped``: informer, writes and timers cancelled.

Whether the mirror has listed and whether its writes fail are not states of its life
but facts of its writes: lists written so far, and the write queue's consecutive
failures. An input a state does not accept (a change before ``start``, a first list
after ``stop``) raises ``automat.NoTransition``: it is a defect of the caller.
"""

import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Optional, Protocol, Tuple, Union, cast

from automat import TypeMachineBuilder
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IInformer
from yurtcoord.kube.lease import resource_version_number as _resource_version
from yurtcoord.pool.interfaces import IPoolStore, IPoolSyncMetrics
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import InvalidKey, KeyBuildInfo, PoolKey
from yurtcoord.pool.scope import describe
from yurtcoord.pool.store import ObjectTooLarge
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.retry import POOL_WRITE_RETRY, RetryPolicy
from yurtcoord.tx.workqueue import WorkQueue


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


class MirrorLife(Protocol):
    """The inputs of a mirror's life (see the module docstring for its states)."""

    def start(self) -> None:
        """Start the informer (``new`` only)."""

    def synced(self) -> None:
        """The informer's first list is in (``awaiting_list`` only)."""

    def changed(self, event_type: str, obj: dict) -> None:
        """The informer delivered one change of its current list."""

    def relisted(self, event_type: str) -> None:
        """The informer delivered the first change of a new list (a relist)."""

    def relist_delivered(self) -> None:
        """The turn after a relist's delivery came (``relisting`` only)."""

    def rewrite(self) -> None:
        """Write the whole list again at the next chance (after a pool etcd outage)."""

    def stop(self) -> defer.Deferred[None]:
        """Stop everything; fires when all is quiet. Stopping twice is fine."""

    def relist_pending(self) -> bool:
        """Whether a relist's whole list waits for the next turn."""


@dataclass
class _AwaitingList:
    """The data of ``awaiting_list``: the informer's sync Deferred."""

    wait: "defer.Deferred[bool]"


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
                 component: str = POOL_SCOPED_COMPONENT,
                 metrics: Optional[IPoolSyncMetrics] = None,
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
        self.writes = 0
        # Whole lists written (first list, relists, rewrites).
        self.lists_written = 0
        # One key (this resource): its pending write, the write running and the
        # retry pause after a failed one.
        self._queue: WorkQueue[str, Write] = WorkQueue(
            reactor, self._write, _merge_writes,
            retry_policy,
            on_success=self._wrote, on_failure=self._failed,
            loop_errors=ILoopErrors(metrics, None))
        # The informer's handlers, from start to stop.
        self._registration: Any = None
        # The informer's list count at the last change delivered: a new count is a relist.
        self._lists_seen: Optional[int] = None
        # The machine of this mirror's life (see the module docstring); the informer's
        # handlers and the relist timer feed it, and tests drive it directly.
        self.life: MirrorLife = _MirrorMachine(self)

    @property
    def name(self) -> str:
        return describe(self.gvr)

    @property
    def listed(self) -> bool:
        """Whether the informer's whole list was written once."""
        return self.lists_written > 0

    @property
    def failing(self) -> bool:
        """Whether the last write failed (and is being retried)."""
        return self._queue.failures(self.name) > 0

    @property
    def idle(self) -> bool:
        """Listed, nothing queued and no write running: the store equals the informer."""
        return (self.listed and not self.life.relist_pending()
                and not self._queue.has_work(self.name))

    @property
    def writing(self) -> bool:
        """Whether a write to the pool store is running now."""
        return self._queue.running(self.name)

    def start(self) -> None:
        """Start the informer; its first list is written once it is in."""
        self.life.start()

    def rewrite(self) -> None:
        """Write the informer's whole list again (as one replace) at the next chance.

        For when the pool etcd came back from an outage (see the pool sync's module
        docstring). Before the first list nothing is written anyway.
        """
        self.life.rewrite()

    def stop(self) -> defer.Deferred[None]:
        """Stop the informer, cancel writes and retries; fires when all is quiet."""
        return self.life.stop()

    # -- what the machine's transitions do ----------------------------------------------

    def _begin(self) -> None:
        self._registration = self.informer.add_handler(
            on_add=lambda obj: self._delivered("ADDED", obj),
            on_update=lambda _old, new: self._delivered("MODIFIED", new),
            on_delete=lambda obj: self._delivered("DELETED", obj))
        self.informer.start()

    def _await_list(self, life: MirrorLife) -> _AwaitingList:
        wait = self.informer.wait_for_sync()
        wait.addCallback(lambda synced: life.synced() if synced else None)
        # Cancelled by a stop before the first list.
        wait.addErrback(lambda f: f.trap(defer.CancelledError) and None)
        return _AwaitingList(wait)

    def _end(self) -> defer.Deferred[None]:
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        waits = [self.informer.stop(), self._queue.stop()]
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    def _delivered(self, event_type: str, obj: dict) -> None:
        """An informer handler: a relist (a new list count) or one change."""
        lists = self.informer.lists
        if lists != self._lists_seen:
            self._lists_seen = lists
            self.life.relisted(event_type)
        else:
            self.life.changed(event_type, obj)

    def _first_list(self) -> None:
        # From here on every change is queued; the list itself is written first.
        self._lists_seen = self.informer.lists
        self._queue.add(self.name, WRITE_LIST)

    def _count(self, event_type: str) -> None:
        self._busy()
        if self.metrics is not None:
            self.metrics.count_pool_sync_event(self.name, event_type)

    def _queue_change(self, event_type: str, obj: dict) -> None:
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

    def _queue_list(self) -> None:
        self._queue.add(self.name, WRITE_LIST)

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

    def _write(self, _name: str, write: Write) -> defer.Deferred[None]:
        """One write the queue runs: the informer's whole list, or a batch of
        changes (the entries written are removed from it, so a retry after a
        failure writes only the rest). ``stop()`` cancels it at its store call."""
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
        self.writes += len(snapshot)
        first = not self.listed
        self.lists_written += 1
        if self.metrics is not None:
            self.metrics.count_pool_sync_event(self.name, "LIST")
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

    def _wrote(self, _name: str, write: Write, _result: object, failures: int) -> None:
        if not failures:
            return
        if not isinstance(write, str):
            # The failures may have been etcd restarting (see the pool sync's module
            # docstring).
            self._queue.add(self.name, WRITE_LIST)
        self.log.info("pool sync of {resource} writes again", resource=self.name)
        self._on_change()

    def _failed(self, _name: str, write: Write, failure: Failure, failures: int,
                delay: float) -> None:
        what = "writing the list" if isinstance(write, str) else f"writing {len(write)} changes"
        self.log.warn("pool sync of {resource} failed {what}: {error}; retry in {delay:.2f}s",
                      resource=self.name, what=what,
                      error=failure.getErrorMessage() or type(failure.value).__name__,
                      delay=delay)
        if failures == 1:
            self._on_change()


def _await_list(life: MirrorLife, mirror: ResourceMirror) -> _AwaitingList:
    """The data of ``awaiting_list``."""
    return mirror._await_list(life)


def _next_turn(life: MirrorLife, mirror: ResourceMirror, event_type: str) -> IDelayedCall:
    """The data of ``relisting``: the timer of the turn after the relist's delivery."""
    return mirror.reactor.callLater(0, life.relist_delivered)


def _build_mirror_machine() -> Callable[[ResourceMirror], MirrorLife]:
    """The machine of a mirror's life; its transitions call the mirror's steps."""
    builder = TypeMachineBuilder(MirrorLife, ResourceMirror)
    new = builder.state("new")
    awaiting_list = builder.state("awaiting_list", _await_list)
    mirroring = builder.state("mirroring")
    relisting = builder.state("relisting", _next_turn)
    stopped = builder.state("stopped")

    @new.upon(MirrorLife.start).to(awaiting_list)
    def start(life: MirrorLife, mirror: ResourceMirror) -> None:
        mirror._begin()

    @awaiting_list.upon(MirrorLife.synced).to(mirroring)
    def first_list(life: MirrorLife, mirror: ResourceMirror, data: _AwaitingList) -> None:
        mirror._first_list()

    @awaiting_list.upon(MirrorLife.changed).loop()
    def change_before_list(life: MirrorLife, mirror: ResourceMirror, data: _AwaitingList,
                           event_type: str, obj: dict) -> None:
        """The first list covers it."""

    @awaiting_list.upon(MirrorLife.relisted).loop()
    def list_before_list(life: MirrorLife, mirror: ResourceMirror, data: _AwaitingList,
                         event_type: str) -> None:
        """The first list covers it."""

    awaiting_list.upon(MirrorLife.rewrite).loop().returns(None)

    @mirroring.upon(MirrorLife.changed).loop()
    def queue_change(life: MirrorLife, mirror: ResourceMirror, event_type: str,
                     obj: dict) -> None:
        mirror._count(event_type)
        mirror._queue_change(event_type, obj)

    @mirroring.upon(MirrorLife.relisted).to(relisting)
    def relist(life: MirrorLife, mirror: ResourceMirror, event_type: str) -> None:
        # A relist (after 410) delivers its difference in one go: write the
        # informer's whole new list once it is over, not change by change.
        mirror._count(event_type)

    @mirroring.upon(MirrorLife.rewrite).loop()
    def rewrite(life: MirrorLife, mirror: ResourceMirror) -> None:
        mirror._queue_list()

    @relisting.upon(MirrorLife.changed).loop()
    def change_in_relist(life: MirrorLife, mirror: ResourceMirror, turn: IDelayedCall,
                         event_type: str, obj: dict) -> None:
        mirror._count(event_type)

    @relisting.upon(MirrorLife.relisted).loop()
    def relist_in_relist(life: MirrorLife, mirror: ResourceMirror, turn: IDelayedCall,
                         event_type: str) -> None:
        mirror._count(event_type)

    @relisting.upon(MirrorLife.relist_delivered).to(mirroring)
    def relist_over(life: MirrorLife, mirror: ResourceMirror, turn: IDelayedCall) -> None:
        mirror._queue_list()

    @relisting.upon(MirrorLife.rewrite).loop()
    def rewrite_in_relist(life: MirrorLife, mirror: ResourceMirror,
                          turn: IDelayedCall) -> None:
        mirror._queue_list()

    @new.upon(MirrorLife.stop).to(stopped)
    @mirroring.upon(MirrorLife.stop).to(stopped)
    def stop(life: MirrorLife, mirror: ResourceMirror) -> defer.Deferred[None]:
        return mirror._end()

    @awaiting_list.upon(MirrorLife.stop).to(stopped)
    def stop_awaiting(life: MirrorLife, mirror: ResourceMirror,
                      data: _AwaitingList) -> defer.Deferred[None]:
        data.wait.cancel()
        return mirror._end()

    @relisting.upon(MirrorLife.stop).to(stopped)
    def stop_relisting(life: MirrorLife, mirror: ResourceMirror,
                       turn: IDelayedCall) -> defer.Deferred[None]:
        turn.cancel()
        return mirror._end()

    @stopped.upon(MirrorLife.stop).loop()
    def stop_again(life: MirrorLife, mirror: ResourceMirror) -> defer.Deferred[None]:
        return defer.succeed(None)

    for state in (new, mirroring, stopped):
        state.upon(MirrorLife.relist_pending).loop().returns(False)
    awaiting_list.upon(MirrorLife.relist_pending).loop().returns(False)
    relisting.upon(MirrorLife.relist_pending).loop().returns(True)
    return builder.build()


_MirrorMachine = _build_mirror_machine()
