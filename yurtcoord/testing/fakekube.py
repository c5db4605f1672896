"""An in-memory stand-in for ``KubeClient``'s get/create/update/delete, for fast unit
tests of code that reads and writes objects with optimistic concurrency: the one
fake ``IObjectClient``, and so the one fake lease API (the leader elector, the lease
writer, the node lease probes and delegation all write leases through it).

It keeps one resourceVersion counter like an apiserver, answers ``Conflict`` to an
update whose resourceVersion is stale, ``AlreadyExists`` and ``NotFound`` as the real
client raises them, and can be told to fail the next calls, to lose them (no answer
ever), to let a concurrent writer win the next updates, or to hold answers back so a
test can deliver them late (after the caller gave up on them). ``FakeKubeServer``
puts several apiservers in front of one such store, each of which can stall and die.
A test that needs the store's changes as a watch would deliver them (a fake informer
fed by the store) follows them with ``add_write_observer`` and lists with ``stored``.
"""

import copy
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from yurtcoord.kube.errors import AlreadyExists, Conflict, ConnectionFailed, NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IObjectClient

Obj = Dict[str, Any]
# (resource, namespace or None for cluster-scoped resources, name)
Key = Tuple[str, Optional[str], str]


class HeldCall:
    """A call whose answer the test releases later with ``deliver()``.

    The effect on the store happens when the call is made (the write reached the
    server); only the answer is late. Cancelling the caller's Deferred does not
    undo the write, as with a real server.
    """

    def __init__(self, verb: str, outcome: tuple[Any, BaseException | None]) -> None:
        self.verb = verb
        self._outcome = outcome
        self.cancelled = False
        self.deferred: defer.Deferred[Any] = defer.Deferred(self._cancel)

    def _cancel(self, d: object) -> None:
        self.cancelled = True

    def deliver(self) -> None:
        """Fire the caller's Deferred with the answer, unless it was cancelled."""
        if self.deferred.called:
            return
        result, error = self._outcome
        if error is not None:
            self.deferred.errback(error)
        else:
            self.deferred.callback(result)


@implementer(IObjectClient)
class FakeKube:
    """Objects of any resource kept in memory, keyed by (resource, namespace, name).

    ``calls`` lists ``(verb, name)`` for every call made, in order; ``requests`` the
    same calls as ``"verb resource"`` (``"get leases"``, ``"get nodes"``);
    ``bodies`` the ``(verb, object)`` sent by every create and update, as sent;
    ``writes`` the ``(seconds, object)`` stored by every accepted create or update,
    the time read from ``clock`` (None without one). ``on_call(verb, name)``, when
    set, is called as each call arrives.

    Knobs: ``hang`` makes every call get no answer (the request is lost before the
    server), ``hangs`` the next N calls; ``conflicts_on_update`` makes the next N
    updates lose to a concurrent writer (the stored resourceVersion moves on and the
    update answers ``Conflict``).

    ``add_write_observer(observer)``: ``observer(event, obj)`` is called with
    ``"ADDED"``, ``"MODIFIED"`` or ``"DELETED"`` and a copy of the object after every
    change of the store, before the call that made it answers.
    """

    def __init__(self, clock: Optional[IReactorTime] = None) -> None:
        self._objects: Dict[Key, Obj] = {}
        self._version = 0
        self._failures: Dict[str, Deque[BaseException]] = {}
        self._hold: Set[str] = set()
        self._clock = clock
        self.held: List[HeldCall] = []
        self.calls: List[Tuple[str, str]] = []
        self.requests: List[str] = []
        self.bodies: List[Tuple[str, Obj]] = []
        self.writes: List[Tuple[Optional[float], Obj]] = []
        self.on_call: Optional[Callable[[str, str], object]] = None
        self.hang = False
        self.hangs = 0
        self.conflicts_on_update = 0
        self._write_observers: List[Callable[[str, Obj], object]] = []

    # Test controls -----------------------------------------------------------

    def fail_next(self, verb: str, error: BaseException, count: int = 1) -> None:
        """Make the next ``count`` calls of ``verb`` (get/create/update/delete, or
        ``"*"`` for any) fail with ``error`` without touching the store."""
        queue = self._failures.setdefault(verb, deque())
        queue.extend([error] * count)

    def clear_failures(self) -> None:
        self._failures.clear()

    def hold(self, verb: str) -> None:
        """From now on, keep answers of ``verb`` calls in ``held`` until delivered."""
        self._hold.add(verb)

    def release_hold(self, verb: str) -> None:
        """Stop holding new ``verb`` answers (already held ones stay held)."""
        self._hold.discard(verb)

    def deliver_held(self) -> None:
        """Deliver every held answer, oldest first."""
        held, self.held = self.held, []
        for call in held:
            call.deliver()

    def put(self, gvr: GroupVersionResource, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as-is apart from a new resourceVersion, as another client's
        write would; returns the stored copy."""
        return copy.deepcopy(self._store(gvr, obj))

    def peek(self, gvr: GroupVersionResource, name: str,
             namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object (a copy) or None, without recording a call."""
        stored = self._objects.get(self._key(gvr, name, namespace))
        return copy.deepcopy(stored)

    def stored(self, gvr: GroupVersionResource) -> List[Obj]:
        """Copies of every stored object of ``gvr``, without recording a call (what
        a list would answer)."""
        return [copy.deepcopy(obj) for (resource, _ns, _name), obj in self._objects.items()
                if resource == str(gvr)]

    def add_write_observer(self, observer: Callable[[str, Obj], object]
                           ) -> Callable[[], None]:
        """Call ``observer(event, obj)`` after every change of the store (see the class
        docstring); returns the callable that stops that."""
        self._write_observers.append(observer)

        def remove() -> None:
            if observer in self._write_observers:
                self._write_observers.remove(observer)

        return remove

    def _notify(self, event: str, obj: Obj) -> None:
        for observer in list(self._write_observers):
            observer(event, copy.deepcopy(obj))

    # The client interface ------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("get", gvr, name, lambda: self._get(gvr, name, namespace))

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        name = obj["metadata"]["name"]
        self.bodies.append(("create", copy.deepcopy(obj)))
        return self._call("create", gvr, name, lambda: self._create(gvr, obj, namespace))

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        name = obj["metadata"]["name"]
        self.bodies.append(("update", copy.deepcopy(obj)))
        return self._call("update", gvr, name, lambda: self._update(gvr, obj, namespace))

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("delete", gvr, name, lambda: self._delete(gvr, name, namespace))

    # Internals -------------------------------------------------------------------

    def _call(self, verb: str, gvr: GroupVersionResource, name: str,
              action: Callable[[], Obj]) -> defer.Deferred[Any]:
        self.calls.append((verb, name))
        self.requests.append(f"{verb} {gvr.resource}")
        if self.on_call is not None:
            self.on_call(verb, name)
        if self.hang:
            return defer.Deferred()
        if self.hangs:
            self.hangs -= 1
            return defer.Deferred()
        error = self._next_failure(verb)
        result: Optional[Obj] = None
        if error is None:
            try:
                result = action()
            except Exception as failure:
                error = failure
        if verb in self._hold:
            call = HeldCall(verb, (result, error))
            self.held.append(call)
            return call.deferred
        if error is not None:
            return defer.fail(error)
        return defer.succeed(result)

    def _next_failure(self, verb: str) -> Optional[BaseException]:
        for key in (verb, "*"):
            queue = self._failures.get(key)
            if queue:
                return queue.popleft()
        return None

    @staticmethod
    def _key(gvr: GroupVersionResource, name: str, namespace: Optional[str]) -> Key:
        return (str(gvr), namespace if gvr.namespaced else None, name)

    def _namespace_of(self, gvr: GroupVersionResource, obj: Obj,
                      namespace: Optional[str]) -> Optional[str]:
        return namespace or (obj.get("metadata") or {}).get("namespace")

    def _store(self, gvr: GroupVersionResource, obj: Obj,
               namespace: Optional[str] = None) -> Obj:
        stored = copy.deepcopy(obj)
        metadata = stored.setdefault("metadata", {})
        ns = self._namespace_of(gvr, stored, namespace)
        if gvr.namespaced:
            metadata["namespace"] = ns
        self._version += 1
        metadata["resourceVersion"] = str(self._version)
        key = self._key(gvr, metadata["name"], ns)
        event = "MODIFIED" if key in self._objects else "ADDED"
        self._objects[key] = stored
        self._notify(event, stored)
        return stored

    def _get(self, gvr: GroupVersionResource, name: str, namespace: Optional[str]) -> Obj:
        stored = self._objects.get(self._key(gvr, name, namespace))
        if stored is None:
            raise NotFound(f"{gvr} {namespace}/{name} not found")
        return copy.deepcopy(stored)

    def _create(self, gvr: GroupVersionResource, obj: Obj, namespace: Optional[str]) -> Obj:
        ns = self._namespace_of(gvr, obj, namespace)
        name = obj["metadata"]["name"]
        if self._key(gvr, name, ns) in self._objects:
            raise AlreadyExists(f"{gvr} {ns}/{name} already exists")
        fresh = copy.deepcopy(obj)
        fresh["metadata"].pop("resourceVersion", None)
        return copy.deepcopy(self._written(self._store(gvr, fresh, ns)))

    def _written(self, stored: Obj) -> Obj:
        at = self._clock.seconds() if self._clock is not None else None
        self.writes.append((at, copy.deepcopy(stored)))
        return stored

    def _update(self, gvr: GroupVersionResource, obj: Obj, namespace: Optional[str]) -> Obj:
        ns = self._namespace_of(gvr, obj, namespace)
        name = obj["metadata"]["name"]
        stored = self._objects.get(self._key(gvr, name, ns))
        if stored is None:
            raise NotFound(f"{gvr} {ns}/{name} not found")
        if self.conflicts_on_update:
            self.conflicts_on_update -= 1
            self._store(gvr, stored, ns)
            raise Conflict(f"{gvr} {ns}/{name}: written by someone else meanwhile")
        wanted = (obj.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"{gvr} {ns}/{name}: resourceVersion {wanted} is stale")
        return copy.deepcopy(self._written(self._store(gvr, obj, ns)))

    def _delete(self, gvr: GroupVersionResource, name: str, namespace: Optional[str]) -> Obj:
        stored = self._objects.pop(self._key(gvr, name, namespace), None)
        if stored is None:
            raise NotFound(f"{gvr} {namespace}/{name} not found")
        self._notify("DELETED", stored)
        return copy.deepcopy(stored)


@implementer(IObjectClient)
class FakeKubeServer:
    """One of several apiservers in front of one ``FakeKube`` store, as coordinator
    apiservers serve one pool etcd: calls go to the shared store, and the server can
    stall and die on its own.

    ``calls`` lists ``(verb, name)`` of every call sent to this server, answered or
    not. ``stall()``: calls still reach the store (a write lands) but their answers
    wait. ``kill()``: every waiting answer fails with ``ConnectionFailed`` (the
    connection was lost; what reached the store stays), and from then on every call
    fails at once with ``ConnectionFailed`` without reaching the store (refused).
    """

    def __init__(self, store: FakeKube, url: str) -> None:
        self.store = store
        self.url = url
        self.calls: List[Tuple[str, str]] = []
        self.dead = False
        self._stalled = False
        self._waiting: List[defer.Deferred[Any]] = []

    def stall(self) -> None:
        self._stalled = True

    def kill(self) -> None:
        self.dead = True
        waiting, self._waiting = self._waiting, []
        for answer in waiting:
            if not answer.called:
                answer.errback(ConnectionFailed(
                    f"connection to {self.url} failed: connection lost"))

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("get", name, lambda: self.store.get(gvr, name, namespace))

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("create", obj["metadata"]["name"],
                          lambda: self.store.create(gvr, obj, namespace))

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("update", obj["metadata"]["name"],
                          lambda: self.store.update(gvr, obj, namespace))

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("delete", name, lambda: self.store.delete(gvr, name, namespace))

    def _call(self, verb: str, name: str,
              send: Callable[[], defer.Deferred[Any]]) -> defer.Deferred[Any]:
        self.calls.append((verb, name))
        if self.dead:
            return defer.fail(ConnectionFailed(
                f"cannot reach {self.url}: connection refused"))
        answer = send()
        if not self._stalled:
            return answer
        waiting: defer.Deferred[Any] = defer.Deferred()
        self._waiting.append(waiting)
        # The store has answered; the answer waits for the server to die.
        answer.addErrback(lambda _failure: None)
        return waiting
