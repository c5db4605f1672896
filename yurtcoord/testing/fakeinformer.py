"""An informer stand-in for fast unit tests: the test emits the events.

Code under test registers handlers and starts and stops it as it would a
``yurtcoord.kube.informer.Informer`` (both provide ``IInformer``); the test calls
``add``/``update``/``delete`` to deliver events, ``end_list`` to end the first list
and ``relist`` for a list after 410.
"""

from typing import Any, Callable, Dict, Iterable, List, Optional

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.kube.informer import Obj, object_key
from yurtcoord.kube.interfaces import IInformer

Handler = Optional[Callable[..., object]]


@implementer(IInformer)
class FakeInformer:
    """Holds the objects a test emits and tells the handlers; counts starts and stops.

    Constructed with no arguments, or by ``factory`` with the arguments a real
    informer gets (kept as attributes for the test to read). ``synced``: None leaves
    the first list open for the test to end with ``end_list``; any other value ends
    it at once, ``wait_for_sync()`` firing with that value.
    """

    def __init__(self, reactor: Any = None, client: Any = None, gvr: Any = None,
                 namespace: Optional[str] = None, field_selector: Optional[str] = None,
                 synced: Optional[bool] = None, **_kwargs: Any) -> None:
        self.reactor = reactor
        self.client = client
        self.gvr = gvr
        self.namespace = namespace
        self.field_selector = field_selector
        # Keyed as the real informer keys its store: ``namespace/name``, or ``name``.
        self.store: Dict[str, Obj] = {}
        self.has_synced = False
        self.lists = 0
        self.started = 0
        self.stopped = 0
        self._handlers: List[_Registration] = []
        self._waiters: List[defer.Deferred[bool]] = []
        self._synced_with = True
        if synced is not None:
            self.end_list(synced=synced)

    @classmethod
    def factory(cls, made: List["FakeInformer"]) -> Callable[..., "FakeInformer"]:
        """An informer factory that appends every informer it makes to ``made``."""
        def make(*args: Any, **kwargs: Any) -> "FakeInformer":
            informer = cls(*args, **kwargs)
            made.append(informer)
            return informer
        return make

    # IInformer -----------------------------------------------------------------

    def add_handler(self, on_add: Handler = None, on_update: Handler = None,
                    on_delete: Handler = None, filter: Handler = None) -> "_Registration":
        handler = _Registration(self, on_add, on_update, on_delete, filter)
        self._handlers.append(handler)
        for obj in list(self.store.values()):
            handler.add(obj)
        return handler

    def get(self, key: str) -> Optional[Obj]:
        return self.store.get(key)

    def list(self) -> List[Obj]:
        return list(self.store.values())

    def wait_for_sync(self) -> "defer.Deferred[bool]":
        if self.has_synced:
            return defer.succeed(self._synced_with)
        d: defer.Deferred[bool] = defer.Deferred()
        self._waiters.append(d)
        return d

    def start(self) -> None:
        self.started += 1

    def stop(self) -> "defer.Deferred[None]":
        self.stopped += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(False)
        return defer.succeed(None)

    # Test controls -------------------------------------------------------------

    def end_list(self, objects: Iterable[Obj] = (), synced: bool = True) -> None:
        """The first list: every object delivered as an add, then ``wait_for_sync()``
        fires with ``synced``."""
        self.lists += 1
        for obj in objects:
            self.add(obj)
        self.has_synced = True
        self._synced_with = synced
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(synced)

    def relist(self, objects: List[Obj]) -> None:
        """A list after 410: the difference to the store delivered as events."""
        self.lists += 1
        fresh = {object_key(obj): obj for obj in objects}
        for key in [k for k in self.store if k not in fresh]:
            self.delete(self.store[key])
        for obj in objects:
            if self.store.get(object_key(obj)) != obj:
                self.add(obj)

    def add(self, obj: Obj) -> None:
        """``obj`` arrives: an add, or an update of the object held under its key."""
        key = object_key(obj)
        old = self.store.get(key)
        self.store[key] = obj
        for handler in list(self._handlers):
            if old is None:
                handler.add(obj)
            else:
                handler.update(old, obj)

    def update(self, old: Obj, new: Obj) -> None:
        """An update event from ``old`` to ``new``, as the test gives them."""
        self.store[object_key(new)] = new
        for handler in list(self._handlers):
            handler.update(old, new)

    def delete(self, obj: Obj) -> None:
        old = self.store.pop(object_key(obj), obj)
        for handler in list(self._handlers):
            handler.delete(old)


class _Registration:
    def __init__(self, informer: FakeInformer, on_add: Handler, on_update: Handler,
                 on_delete: Handler, filter: Handler) -> None:
        self.informer = informer
        self.on_add, self.on_update, self.on_delete = on_add, on_update, on_delete
        self.filter: Callable[..., object] = filter or (lambda obj: True)

    def add(self, obj: Obj) -> None:
        if self.on_add and self.filter(obj):
            self.on_add(obj)

    def update(self, old: Obj, new: Obj) -> None:
        if self.on_update and self.filter(new):
            self.on_update(old, new)

    def delete(self, obj: Obj) -> None:
        if self.on_delete and self.filter(obj):
            self.on_delete(obj)

    def remove(self) -> None:
        if self in self.informer._handlers:
            self.informer._handlers.remove(self)
