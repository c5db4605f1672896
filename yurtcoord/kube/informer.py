"""The informer (client-go's reflector + indexer): a local copy of one resource,
kept current by list and watch, with add/update/delete handlers.

Flow: list, then watch from the list's resourceVersion. Every event and bookmark
advances the last seen resourceVersion, so a watch that is cut resumes from there
without losing or repeating anything. When the server answers 410 Gone (the version
fell out of its history), the informer lists again and emits the difference between
its store and the fresh list as add/update/delete, so handlers see every change.
Reconnects wait a capped, jittered exponential backoff, reset after a list or a watch
that delivered events.

Lists are fetched ``page_size`` objects per request (``limit``/``continue``, as
client-go's pager does), so a large resource over a slow link is many bounded answers,
not one that must arrive whole within the request timeout. Every page is of one
snapshot; when the server no longer has it (410 on a continue token) the list starts
again in one request. A list that needs more than ``MAX_LIST_PAGES`` requests fails
with ``ListTooLong`` and is retried after the backoff like any failed list. A page
that is larger than the client reads (``ResponseTooLarge``) is asked for again from
the same place in pages half as large, down to one object per page.
A list answer that is not a list of objects (or whose continue token or
resourceVersion is not a string) is ``ServerError``, retried the same way.

``stop()`` is exact: it cancels the pending timer, list or watch and fires only once
the connection is closed, so nothing is left behind.

Handlers: ``add_handler(on_add, on_update, on_delete, filter=None)``; on_add(obj),
on_update(old, new), on_delete(obj). With a filter, an object that stops matching is
delivered as a delete (of its last matching state), one that starts matching as an
add. A handler that raises is logged; the informer carries on.

``keep(obj)`` (optional) says which objects the store holds. The others are handed to
the handlers as they come, each watch event of one as an add with no old state, and
are never stored (a list drops them as each page arrives): a resource of which a
component needs few objects, among many it must only see pass (delegated leases of
names made up by the ten thousand), costs memory per kept object only. An object that
stops being kept is removed from the store and delivered as a delete of its last kept
state, then as an add; a delete of an object never stored is delivered as it comes.

Each list or watch of the loop is one guarded step (loop ``informer`` of
``yurtcoord.tx.guardedloop``): a step that raises where no error is expected (the
client's ``watch`` call itself, or replacing the store after a list) would otherwise
end the loop for good, leaving the store as it was and never synced again; it is
logged, counted in ``loop_errors`` and the informer lists again after its backoff.
"""

from typing import Any, Callable, List, Optional

from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.retry import INFORMER_RETRY, Retries
from yurtcoord.kube.errors import Gone, ListTooLong, ResponseTooLarge, ServerError
from yurtcoord.kube.gvr import GroupVersionResource

# An object of the Kubernetes API as decoded JSON.
Obj = dict[str, Any]
Handler = Optional[Callable[..., object]]
from yurtcoord.kube.interfaces import IInformer
from yurtcoord.kube.lease import resource_version

MIN_HEALTHY_WATCH_SECONDS = 1.0
# Objects per list request (client-go's pager uses 500 too).
DEFAULT_PAGE_SIZE = 500
# Requests one list may take: a million objects at the default page size, several
# times the largest clusters Kubernetes is tested with. A server that answers every
# page with a continue token would otherwise grow one list without end.
MAX_LIST_PAGES = 2000


def object_key(obj: Obj) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = meta.get("name", "")
    return f"{namespace}/{name}" if namespace else name


def _page_of(result, gvr):
    """``(items, metadata)`` of one list answer, each item an object with object
    metadata; anything else from the server is ``ServerError``."""
    if not isinstance(result, dict):
        raise ServerError(f"list of {gvr} from the server is not an object")
    items, metadata = result.get("items"), result.get("metadata")
    if items is None:
        items = []
    if metadata is None:
        metadata = {}
    if (not isinstance(items, list) or not isinstance(metadata, dict)
            or not all(isinstance(item, dict)
                       and isinstance(item.get("metadata", {}), dict) for item in items)):
        raise ServerError(f"list of {gvr} from the server is not a list of objects")
    token, version = metadata.get("continue"), metadata.get("resourceVersion")
    if not isinstance(token, (str, type(None))) or not isinstance(version, (str, type(None))):
        raise ServerError(f"list of {gvr} from the server has a continue token or "
                          f"resourceVersion that is not a string")
    return items, metadata


class HandlerRegistration:
    """One set of handlers; ``remove()`` stops delivering to it."""

    def __init__(self, informer: "Informer", on_add: Handler, on_update: Handler,
                 on_delete: Handler, filter: Handler) -> None:
        self._informer = informer
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        self.filter = filter

    def remove(self) -> None:
        self._informer._remove_handler(self)


@implementer(IInformer)
class Informer:
    """Keeps ``store`` equal to the server's objects of ``gvr`` (in ``namespace``,
    matching the selectors), and tells handlers about every change.

    ``store`` maps ``object_key(obj)`` to the object as last received; handlers get
    the same dicts, so both must treat them as read-only. ``resource_version`` is
    the last version seen (list, event or bookmark): where a watch resumes.
    """

    log = Logger()

    def __init__(self, reactor: Any, client: Any, gvr: GroupVersionResource,
                 namespace: Optional[str] = None, label_selector: Optional[str] = None,
                 field_selector: Optional[str] = None, backoff: Optional[Retries] = None,
                 watch_timeout_seconds: Optional[int] = 300,
                 watch_idle_timeout: Optional[float] = None,
                 page_size: Optional[int] = DEFAULT_PAGE_SIZE,
                 max_list_pages: int = MAX_LIST_PAGES,
                 loop_errors: Optional[ILoopErrors] = None,
                 keep: Optional[Callable[[Obj], bool]] = None) -> None:
        if page_size is not None and page_size < 1:
            raise ValueError(f"page_size must be >= 1 or None, got {page_size}")
        if max_list_pages < 1:
            raise ValueError(f"max_list_pages must be >= 1, got {max_list_pages}")
        self.max_list_pages = max_list_pages
        self.loop_errors = loop_errors
        self.reactor = reactor
        self.page_size = page_size
        self.client = client
        self.gvr = gvr
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.backoff = backoff if backoff is not None else Retries(INFORMER_RETRY)
        self.watch_timeout_seconds = watch_timeout_seconds
        if watch_idle_timeout is None and watch_timeout_seconds:
            # The server ends every stream after watch_timeout_seconds; a stream
            # silent for much longer than that is a dead connection.
            watch_idle_timeout = watch_timeout_seconds + 60
        self.watch_idle_timeout = watch_idle_timeout
        self.keep = keep
        self.store: dict[str, Obj] = {}
        self.resource_version: Optional[str] = None
        self.has_synced = False
        self.lists = 0
        self.watches = 0
        # A tuple, replaced on change: delivery iterates it without copying, and a
        # handler added or removed by a handler takes effect from the next event.
        self._handlers: tuple[HandlerRegistration, ...] = ()
        self._sync_waiters: List[defer.Deferred[bool]] = []
        self._running: Optional[defer.Deferred[Any]] = None
        self._stopping = False
        self._pending: Optional[defer.Deferred[Any]] = None
        self._watch: Any = None

    # -- public ------------------------------------------------------------

    def add_handler(self, on_add: Handler = None, on_update: Handler = None,
                    on_delete: Handler = None, filter: Handler = None) -> HandlerRegistration:
        """Register handlers; objects already in the store are delivered as adds."""
        registration = HandlerRegistration(self, on_add, on_update, on_delete, filter)
        self._handlers = self._handlers + (registration,)
        for obj in list(self.store.values()):
            if self._matches(registration, obj, "add"):
                self._call(registration.on_add, "add", obj)
        return registration

    def _remove_handler(self, registration):
        self._handlers = tuple(h for h in self._handlers if h is not registration)

    def get(self, key: str) -> Optional[Obj]:
        return self.store.get(key)

    def list(self) -> List[Obj]:
        return list(self.store.values())

    @property
    def running(self) -> bool:
        return self._running is not None

    def wait_for_sync(self) -> defer.Deferred[bool]:
        """Fires True once synced, or False if the informer stops first."""
        if self.has_synced:
            return defer.succeed(True)
        d: defer.Deferred[bool] = defer.Deferred()
        self._sync_waiters.append(d)
        return d

    def start(self) -> None:
        if self._running is not None:
            return
        self._stopping = False
        self.log.info("informer starting gvr={gvr} namespace={namespace}",
                      gvr=str(self.gvr), namespace=self.namespace)
        running = self._run()
        if not running.called:
            self._running = running
        running.addErrback(
            lambda f: self.log.failure("informer loop crashed gvr={gvr}", f, gvr=str(self.gvr)))

    def stop(self) -> defer.Deferred[None]:
        """Cancel everything; the Deferred fires once no connection or timer is left."""
        if self._running is None:
            return defer.succeed(None)
        self._stopping = True
        running = self._running
        if self._pending is not None:
            self._pending.cancel()
        if self._watch is not None:
            self._watch.cancel()
        done: defer.Deferred[None] = defer.Deferred()

        def ended(_: object) -> None:
            done.callback(None)
        running.addBoth(ended)
        return done

    # -- the loop ------------------------------------------------------------

    def _wait(self, d):
        """Remember ``d`` as what stop() must cancel while the loop waits on it."""
        self._pending = d

        def clear(result):
            self._pending = None
            return result
        return d.addBoth(clear)

    @defer.inlineCallbacks
    def _run(self):
        need_list = True
        step = guarded("informer", self._step, self.loop_errors)
        try:
            while not self._stopping:
                result = yield step(need_list)
                if result is None:
                    # The step raised (reported by the guard): the store may be half
                    # replaced or the watch never started, so list again, after the
                    # backoff, as after a failed list.
                    need_list = True
                    yield self._sleep(self.backoff.next_delay())
                else:
                    need_list = result
        finally:
            self._running = None
            for waiter in self._sync_waiters:
                waiter.callback(False)
            self._sync_waiters = []
            self.log.info("informer stopped gvr={gvr}", gvr=str(self.gvr))

    @defer.inlineCallbacks
    def _step(self, need_list):
        """One list (when ``need_list``) and one watch; True when a relist is needed
        next, False to watch again (or to end, once stopping)."""
        if need_list:
            listed = yield self._list()
            if not listed or self._stopping:
                # Listing again; or a sync waiter stopped the informer.
                return not listed
        return (yield self._watch_once())

    @defer.inlineCallbacks
    def _list(self):
        """One list and replace; True on success, False after a failure and its backoff."""
        try:
            items, rv = yield self._list_pages()
        except Exception as e:
            if self._stopping:
                return False
            delay = self.backoff.next_delay()
            self.log.warn("informer list failed gvr={gvr} reason={reason} retry_in={delay:.2f}s",
                          gvr=str(self.gvr), reason=str(e) or type(e).__name__, delay=delay)
            yield self._sleep(delay)
            return False
        self.lists += 1
        self.backoff.reset()
        self._replace(items)
        self.resource_version = rv
        if not self.has_synced:
            self.has_synced = True
            waiters, self._sync_waiters = self._sync_waiters, []
            for waiter in waiters:
                waiter.callback(True)
        return True

    @defer.inlineCallbacks
    def _list_pages(self):
        """``(items, resourceVersion)`` of one list, ``page_size`` objects per request."""
        items: List[Obj] = []
        token = None
        page_size = self.page_size

        requests = 0
        while True:
            if requests >= self.max_list_pages:
                raise ListTooLong(
                    f"list of {self.gvr} took more than {self.max_list_pages} pages "
                    f"({len(items)} objects so far) and was given up")
            requests += 1
            try:
                result = yield self._wait(self.client.list(
                    self.gvr, namespace=self.namespace, label_selector=self.label_selector,
                    field_selector=self.field_selector, limit=page_size,
                    continue_token=token))
            except ResponseTooLarge as e:
                if page_size == 1:
                    raise
                # A page past the client's bound (objects far larger than usual):
                # the same place again, in pages half as large.
                smaller = max(1, (page_size or self.page_size or DEFAULT_PAGE_SIZE) // 2)
                self.log.warn("informer list page too large gvr={gvr} limit={limit}, "
                              "asking for {smaller} objects per page: {reason}",
                              gvr=str(self.gvr), limit=page_size, smaller=smaller,
                              reason=str(e))
                page_size = smaller
                continue
            except Gone as e:
                if token is None:
                    raise
                self.log.info("informer list continue expired gvr={gvr} after {count} "
                              "objects, listing again in one request: {reason}",
                              gvr=str(self.gvr), count=len(items), reason=str(e))
                items, token, page_size = [], None, None
                continue
            page, metadata = _page_of(result, self.gvr)
            items.extend(page if self.keep is None else filter(self._kept, page))
            token = metadata.get("continue") if page_size else None
            if not token:
                return items, metadata.get("resourceVersion")

    @defer.inlineCallbacks
    def _watch_once(self):
        """One watch until it ends; True when a relist is needed."""
        started = self.reactor.seconds()
        self.watches += 1
        self._watch = self.client.watch(
            self.gvr, self._on_event, namespace=self.namespace,
            resource_version=self.resource_version, label_selector=self.label_selector,
            field_selector=self.field_selector, allow_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds, idle_timeout=self.watch_idle_timeout)
        watch = self._watch
        error = None
        try:
            yield watch.done
        except Exception as e:
            error = e
        finally:
            self._watch = None
        if self._stopping:
            return False
        if watch.events or self.reactor.seconds() - started >= MIN_HEALTHY_WATCH_SECONDS:
            self.backoff.reset()
            healthy = True
        else:
            healthy = False
        if isinstance(error, Gone):
            delay = 0.0 if healthy else self.backoff.next_delay()
            self.log.info("informer relisting gvr={gvr} reason={reason} rv={rv} retry_in={delay:.2f}s",
                          gvr=str(self.gvr), reason=str(error), rv=self.resource_version, delay=delay)
            yield self._sleep(delay)
            return True
        if error is None:
            delay = 0.0 if healthy else self.backoff.next_delay()
            reason = "watch ended by the server"
        else:
            delay = self.backoff.next_delay()
            reason = str(error) or type(error).__name__
        self.log.info("informer reconnecting gvr={gvr} reason={reason} rv={rv} retry_in={delay:.2f}s",
                      gvr=str(self.gvr), reason=reason, rv=self.resource_version, delay=delay)
        yield self._sleep(delay)
        return False

    def _sleep(self, delay):
        if delay <= 0 or self._stopping:
            return defer.succeed(None)
        d = self._wait(deferLater(self.reactor, delay, lambda: None))
        d.addErrback(lambda f: f.trap(defer.CancelledError))
        return d

    # -- store and delivery ---------------------------------------------------

    def _on_event(self, kind, obj):
        # object_key and resource_version inlined: this runs for every event.
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv is not None and type(rv) is not str:
            # Where the next watch resumes: it must be the server's opaque string.
            raise ServerError(f"{kind} event of {self.gvr} with a resourceVersion that "
                              f"is not a string: {rv!r:.100}")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        namespace = meta.get("namespace")
        key = f"{namespace}/{meta.get('name', '')}" if namespace else meta.get("name", "")
        old = self.store.get(key)
        if kind == "DELETED":
            if old is not None:
                del self.store[key]
                self._deliver_delete(obj)
            elif self.keep is not None:
                self._deliver_delete(obj)
        elif self.keep is not None and not self._kept(obj):
            if old is not None:
                del self.store[key]
                self._deliver_delete(old)
            self._deliver_add(obj)
        else:
            self.store[key] = obj
            if old is None:
                self._deliver_add(obj)
            else:
                self._deliver_update(old, obj)
        if rv:
            self.resource_version = rv

    def _replace(self, items):
        """Make the store equal ``items``, delivering the difference."""
        fresh = {object_key(obj): obj for obj in items}
        for key in [k for k in self.store if k not in fresh]:
            gone = self.store.pop(key)
            self._deliver_delete(gone)

        for key, obj in fresh.items():
            old = self.store.get(key)
            self.store[key] = obj
            if old is None:
                self._deliver_add(obj)
            elif resource_version(old) != resource_version(obj) or (
                    resource_version(obj) is None and old != obj):
                self._deliver_update(old, obj)

    def _kept(self, obj: Obj) -> bool:
        """Whether the store holds ``obj``; a ``keep`` that raises keeps it (logged):
        memory is the lesser loss than a change never told."""
        try:
            return bool(self.keep(obj))  # type: ignore[misc]
        except Exception:
            self.log.failure("informer keep failed gvr={gvr} key={key}",
                             gvr=str(self.gvr), key=object_key(obj))
            return True

    def _matches(self, handler, obj, event):
        if handler.filter is None:
            return True
        try:
            return bool(handler.filter(obj))
        except Exception:
            self.log.failure("informer filter failed gvr={gvr} event={event} key={key}",
                             gvr=str(self.gvr), event=event, key=object_key(obj))
            return False

    def _call(self, fn, event, *args):
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            self._handler_failed(event, args[-1])

    def _handler_failed(self, event, obj):
        self.log.failure("informer handler failed gvr={gvr} event={event} key={key}",
                         gvr=str(self.gvr), event=event, key=object_key(obj))

    def _deliver_add(self, obj):
        for h in self._handlers:
            if h.on_add is not None and (h.filter is None or self._matches(h, obj, "add")):
                try:
                    h.on_add(obj)
                except Exception:
                    self._handler_failed("add", obj)

    def _deliver_update(self, old, new):
        for h in self._handlers:
            if h.filter is None:
                self._call(h.on_update, "update", old, new)
                continue
            was, now = self._matches(h, old, "update"), self._matches(h, new, "update")
            if was and now:
                self._call(h.on_update, "update", old, new)
            elif now:
                self._call(h.on_add, "add", new)
            elif was:
                self._call(h.on_delete, "delete", old)

    def _deliver_delete(self, obj):
        for h in self._handlers:
            if h.on_delete is not None and (h.filter is None or self._matches(h, obj, "delete")):
                try:
                    h.on_delete(obj)
                except Exception:
                    self._handler_failed("delete", obj)
