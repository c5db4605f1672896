"""A client that finds the ``KubeClient`` to use anew on every call.

Some clients cannot be fixed once: "whichever cloud server is healthy now", or "the
client whose certificate files exist now". Such a client resolves a ``KubeClient``
on every call and forwards the call to it; when it cannot resolve one, the call fails
like a call to an unreachable server, so callers retry as they would anyway.
"""

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.kube.errors import ConnectionFailed, Timeout
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IListWatchClient, IObjectClient


class FailedWatch:
    """What ``watch`` returns when no client can be resolved: already done, failed."""

    events = 0
    cancelled = False

    def __init__(self, error: BaseException) -> None:
        self.done = defer.fail(error)

    def cancel(self) -> None:
        self.cancelled = True


class ResolvingClient:
    """Forwards the calls of a ``KubeClient`` to the client ``_resolve()`` gives.

    Subclasses implement ``_resolve()``: a ``KubeClient``, or raise
    ``ConnectionFailed`` saying why there is none. A call whose resolution raises one
    of ``resolve_errors`` returns a failed Deferred; a watch returns a
    ``FailedWatch`` when resolution raises ``ConnectionFailed``.
    """

    resolve_errors: tuple[type[BaseException], ...] = (ConnectionFailed,)

    def _resolve(self) -> Any:
        """The client to forward the next call to."""
        raise NotImplementedError

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            client = self._resolve()
        except self.resolve_errors:
            return defer.fail()
        return getattr(client, method)(*args, **kwargs)

    def request(self, method: str, path: str, params: dict[str, Any] | None = None,
                body: object = None, allow_empty: bool = False) -> defer.Deferred[Any]:
        return self._call("request", method, path, params=params, body=body,
                          allow_empty=allow_empty)

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("get", gvr, name, namespace)

    def create(self, gvr: GroupVersionResource, obj: dict,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("create", gvr, obj, namespace)

    def update(self, gvr: GroupVersionResource, obj: dict,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("update", gvr, obj, namespace)

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("delete", gvr, name, namespace)

    def list(self, gvr: GroupVersionResource, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None,
             resource_version: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> defer.Deferred[Any]:
        return self._call("list", gvr, namespace=namespace, label_selector=label_selector,
                          field_selector=field_selector, resource_version=resource_version,
                          limit=limit, continue_token=continue_token)

    def watch(self, gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
              namespace: str | None = None, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              allow_bookmarks: bool = True, timeout_seconds: int | None = None,
              idle_timeout: float | None = None) -> Any:
        try:
            client, on_failure = self._watch_target()
        except ConnectionFailed as error:
            return FailedWatch(error)
        watch = client.watch(gvr, on_event, namespace=namespace,
                             resource_version=resource_version, label_selector=label_selector,
                             field_selector=field_selector, allow_bookmarks=allow_bookmarks,
                             timeout_seconds=timeout_seconds, idle_timeout=idle_timeout)
        if on_failure is not None:
            watch.done.addErrback(on_failure)
        return watch

    def _watch_target(self) -> tuple[Any, Callable[[Failure], Failure] | None]:
        """The client a watch starts through, and what follows a failure of that watch
        (None: nothing)."""
        return self._resolve(), None


@implementer(IObjectClient, IListWatchClient)
class PickedServerClient(ResolvingClient):
    """A client for "the server ``pick()`` names now", among servers in front of one
    store (several cloud apiservers over the cloud's etcd, several coordinator
    apiservers over the pool etcd).

    Every call asks ``pick()`` for a server URL and sends the request through
    ``client_for(url)`` (the caller owns and closes those clients), so an elector's
    next attempt, or an informer that reconnects after a failure, moves on to the
    server picked then. The servers share one store, so resourceVersions carry over
    between them. While ``pick()`` names none (None or empty), a call fails with
    ``ConnectionFailed("no <what>")``. ``on_unreachable(url)``, when given, is told of
    every call or watch through ``url`` that got no answer (``ConnectionFailed``,
    ``Timeout``), so that whoever picks can stop picking a server that died.

    Failover within a call: a call whose connection to ``url`` failed
    (``ConnectionFailed``: refused, reset, cut) is sent again at once through the
    server ``pick()`` names then, if that is one this call has not tried yet, and so
    on until a server answers or ``pick()`` names only servers tried. A leader's
    lease renewal thus reaches the surviving apiserver within the attempt in which
    the one it used died, instead of a retry period later. Only calls that may be
    sent twice are: an answer lost with the connection leaves it unknown whether the
    first one was carried out, so a call is sent again only when carrying it out
    twice changes nothing (``get``, ``list``) or the store refuses the second
    (``update`` of an object that carries its resourceVersion: ``Conflict``, and the
    caller reads again as after any lost race). ``create``, ``delete``, an update
    without a resourceVersion and raw ``request`` calls fail as they did. A
    ``Timeout`` is not sent again either: the server may only be slow and still
    working on it, and the caller's time is mostly spent.
    """

    log = Logger()

    def __init__(self, pick: Callable[[], str | None], client_for: Callable[[str], Any],
                 what: str = "server",
                 on_unreachable: Callable[[str], object] | None = None) -> None:
        self._pick = pick
        self._client_for = client_for
        self._what = what
        self._on_unreachable = on_unreachable

    def _url(self) -> str:
        url = self._pick()
        if not url:
            raise ConnectionFailed(f"no {self._what}")
        return url

    def _resolve(self) -> Any:
        return self._client_for(self._url())

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            url = self._url()
        except ConnectionFailed:
            return defer.fail()
        return self._send(url, frozenset(), _may_send_twice(method, args, kwargs),
                          method, args, kwargs)

    def _send(self, url: str, tried: frozenset[str], may_send_again: bool, method: str,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> defer.Deferred[Any]:
        d = getattr(self._client_for(url), method)(*args, **kwargs)
        d.addErrback(self._failed, url)
        if may_send_again:
            d.addErrback(self._send_elsewhere, tried | {url}, method, args, kwargs)
        return d

    def _send_elsewhere(self, failure: Failure, tried: frozenset[str], method: str,
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call failed on its connection: send it through the server picked now
        (``on_unreachable`` has been told), unless this call has tried that one."""
        if not failure.check(ConnectionFailed):
            return failure
        url = self._pick()
        if not url or url in tried:
            return failure
        self.log.info("{what} call {method} sent again through {url}: {error}",
                      what=self._what, method=method, url=url, error=failure.value)
        return self._send(url, tried, True, method, args, kwargs)

    def _watch_target(self) -> tuple[Any, Callable[[Failure], Failure] | None]:
        """The client of the server picked now; a watch cut by a failed connection
        tells ``on_unreachable``."""
        url = self._url()
        return self._client_for(url), lambda failure: self._failed(failure, url)

    def _failed(self, failure: Failure, url: str) -> Failure:
        if self._on_unreachable is not None and failure.check(ConnectionFailed, Timeout):
            self._on_unreachable(url)
        return failure


def _may_send_twice(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call whose answer was lost may be sent again: a read, or an update
    guarded by the resourceVersion of the object it replaces."""
    if method in ("get", "list"):
        return True
    if method != "update":
        return False
    obj = args[1] if len(args) > 1 else kwargs.get("obj")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return isinstance(metadata, dict) and bool(metadata.get("resourceVersion"))
