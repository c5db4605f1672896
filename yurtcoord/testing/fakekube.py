"""An in-memory stand-in for ``KubeClient``'s get/create/update/delete, for fast unit
tests of code that reads and writes objects with optimistic concurrency.

It keeps one resourceVersion counter like an apiserver, answers ``Conflict`` to an
update whose resourceVersion is stale, ``AlreadyExists`` and ``NotFound`` as the real
client raises them, and can be told to fail the next calls or to hold answers back
so a test can deliver them late (after the caller gave up on them).
"""

import copy
from collections import deque
from typing import Any

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.kube.errors import AlreadyExists, Conflict, NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IObjectClient


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

    ``calls`` lists ``(verb, name)`` for every call made, in order.
    """

    def __init__(self) -> None:
        self._objects: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._version = 0
        self._failures: dict[str, deque[BaseException]] = {}
        self._hold: set[str] = set()
        self.held: list[HeldCall] = []
        self.calls: list[tuple[str, str]] = []

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

    # The client interface ------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("get", name, lambda: self._get(gvr, name, namespace))

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        name = obj["metadata"]["name"]
        return self._call("create", name, lambda: self._create(gvr, obj, namespace))

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        name = obj["metadata"]["name"]
        return self._call("update", name, lambda: self._update(gvr, obj, namespace))

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> defer.Deferred[Any]:

        return self._call("delete", name, lambda: self._delete(gvr, name, namespace))

    # Internals -------------------------------------------------------------------

    def _call(self, verb, name, action):
        self.calls.append((verb, name))
        error = self._next_failure(verb)
        result = None
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

    def _next_failure(self, verb):
        for key in (verb, "*"):
            queue = self._failures.get(key)
            if queue:
                return queue.popleft()
        return None

    @staticmethod
    def _key(gvr, name, namespace):
        return (str(gvr), namespace if gvr.namespaced else None, name)

    def _namespace_of(self, gvr, obj, namespace):
        return namespace or (obj.get("metadata") or {}).get("namespace")

    def _store(self, gvr, obj, namespace=None):
        stored = copy.deepcopy(obj)
        metadata = stored.setdefault("metadata", {})
        ns = self._namespace_of(gvr, stored, namespace)
        if gvr.namespaced:
            metadata["namespace"] = ns
        self._version += 1
        metadata["resourceVersion"] = str(self._version)
        self._objects[self._key(gvr, metadata["name"], ns)] = stored
        return stored

    def _get(self, gvr, name, namespace):
        stored = self._objects.get(self._key(gvr, name, namespace))
        if stored is None:
            raise NotFound(f"{gvr} {namespace}/{name} not found")
        return copy.deepcopy(stored)

    def _create(self, gvr, obj, namespace):
        ns = self._namespace_of(gvr, obj, namespace)
        name = obj["metadata"]["name"]
        if self._key(gvr, name, ns) in self._objects:
            raise AlreadyExists(f"{gvr} {ns}/{name} already exists")
        fresh = copy.deepcopy(obj)
        fresh["metadata"].pop("resourceVersion", None)
        return copy.deepcopy(self._store(gvr, fresh, ns))

    def _update(self, gvr, obj, namespace):
        ns = self._namespace_of(gvr, obj, namespace)
        name = obj["metadata"]["name"]
        stored = self._objects.get(self._key(gvr, name, ns))
        if stored is None:
            raise NotFound(f"{gvr} {ns}/{name} not found")
        wanted = (obj.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"{gvr} {ns}/{name}: resourceVersion {wanted} is stale")
        return copy.deepcopy(self._store(gvr, obj, ns))

    def _delete(self, gvr, name, namespace):
        stored = self._objects.pop(self._key(gvr, name, namespace), None)
        if stored is None:
            raise NotFound(f"{gvr} {namespace}/{name} not found")
        return copy.deepcopy(stored)
