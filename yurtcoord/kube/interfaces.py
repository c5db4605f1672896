"""The contracts between the agent's parts and the Kubernetes API clients they use.

Code that reads and writes single objects takes any ``IObjectClient``: the real
``KubeClient``, a client that picks a server per call, or the in-memory fake of the
unit tests. Leases are such objects: the leader elector, the lease writer and the
node lease probes take an ``IObjectClient`` as their lease API. Code that follows a
resource takes an ``IInformer``. Each implementation is checked against its
interface with ``verifyObject``.
"""

from typing import Any, Callable

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

from yurtcoord.kube.gvr import GroupVersionResource


class IObjectClient(Interface):
    """Single-object calls of a Kubernetes API client. Each returns a Deferred that
    fails with a ``yurtcoord.kube.errors`` type (``NotFound``, ``Conflict``,
    ``AlreadyExists``, ...) when the server refuses."""

    def get(gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> Deferred[Any]:
        """The object ``namespace/name`` of resource ``gvr`` (a dict)."""

    def create(gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> Deferred[Any]:
        """Create ``obj``; fires with the object as stored."""

    def update(gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> Deferred[Any]:
        """Replace the object, guarded by ``obj``'s resourceVersion; fires with the
        object as stored."""

    def delete(gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> Deferred[Any]:
        """Delete the object; fires with the server's answer."""


class IListWatchClient(Interface):
    """What an informer needs of a Kubernetes API client: paged lists and watches.

    ``list`` fires with the decoded List (``items`` and ``metadata`` with
    ``resourceVersion`` and ``continue``). ``watch`` returns at once an object with a
    ``done`` Deferred (None when the stream ended cleanly or was cancelled, else a
    ``yurtcoord.kube.errors`` type), an ``events`` count and ``cancel()``.
    """

    def list(gvr: GroupVersionResource, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None,
             resource_version: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> Deferred[Any]:
        """One page of the objects of ``gvr``."""

    def watch(gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
              namespace: str | None = None, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              allow_bookmarks: bool = True, timeout_seconds: int | None = None,
              idle_timeout: float | None = None) -> Any:

        """Start a watch calling ``on_event(type, obj)`` for every event."""


class IWatch(Interface):
    """One watch started by ``IListWatchClient.watch``, as the informer and the pool
    view follow it."""

    done = Attribute(
        "A Deferred firing None when the stream ended cleanly or was cancelled, or "
        "failing with a ``yurtcoord.kube.errors`` type.")
    events = Attribute("How many events the watch has delivered.")

    def cancel() -> None:
        """End the watch; ``done`` fires None."""


class IAPIRequests(Interface):
    """Any call of a Kubernetes API client by method and path, as the pool scope asks
    the cloud's API discovery (``KubeClient.request``)."""

    def request(method: str, path: str, params: dict[str, Any] | None = None,
                body: Any = None, allow_empty: bool = False) -> Deferred[Any]:
        """The decoded JSON answer (None for an empty body if ``allow_empty``)."""


class IInformer(Interface):
    """What the agent's parts need of an informer: handlers for every change of the
    objects it mirrors, the objects it holds now, and the end of its first list.

    The real ``yurtcoord.kube.informer.Informer`` and the unit tests' fake both
    provide it, so code that consumes an informer calls these members directly.
    """

    has_synced = Attribute("True once the first list is in the store.")
    lists = Attribute(
        "How many lists the informer has made (the first one and every relist after a "
        "410): a consumer that sees it grow knows the next events are a relist's "
        "difference.")

    def add_handler(on_add: Callable[..., object] | None = None,
                    on_update: Callable[..., object] | None = None,
                    on_delete: Callable[..., object] | None = None,
                    filter: Callable[..., object] | None = None) -> Any:
        """Register handlers; objects already held are delivered as adds. Returns a
        registration with ``remove()``."""

    def get(key: str) -> Any:
        """The object held under ``key``, or None."""

    def list() -> list[Any]:
        """Every object held now."""

    def wait_for_sync() -> Deferred[bool]:
        """A Deferred firing True once synced, or False if the informer stops first."""

    def start() -> None:
        """Start listing and watching."""

    def stop() -> Deferred[None]:
        """Stop; the Deferred fires once nothing is left running."""


class ILeaderElector(Interface):
    """One candidacy in a Lease election (``yurtcoord.kube.leaderelection``'s
    ``LeaderElector``), as the hub elector drives it: built unstarted with its
    callbacks, started once, stopped once."""

    leader = Attribute("The holder of the lease as last observed, or None.")

    def start() -> None:
        """Begin trying to acquire, then renew, the lease."""

    def stop() -> Deferred[Any]:
        """Stop; the Deferred fires once the lease is released (when it was held)."""
