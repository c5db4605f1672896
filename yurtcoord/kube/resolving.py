"""A client that finds the ``KubeClient`` to use anew on every call.

Some clients cannot be fixed once: "whichever cloud server is healthy now", or "the
client whose certificate files exist now". Such a client resolves a ``KubeClient``
on every call and forwards the call to it; when it cannot resolve one, the call fails
like a call to an unreachable server, so callers retry as they would anyway.
"""

from typing import Any, Callable

from twisted.internet import defer

from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.kube.gvr import GroupVersionResource



class FailedWatch:
    """What ``watch`` returns when no client can be resolved: already done, failed."""

    events = 0
    cancelled = False

    def __init__(self, error: BaseException) -> None:
        self.done = defer.fail(error)

    def cancel(self) -> None:
        self.cancelled = True


class ResolvingClient:
    """Forwards the read calls of a ``KubeClient`` to the client ``_resolve()`` gives.

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

    def list(self, gvr: GroupVersionResource, **kwargs: Any) -> defer.Deferred[Any]:
        return self._call("list", gvr, **kwargs)

    def watch(self, gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
              **kwargs: Any) -> Any:
        try:
            client = self._resolve()
        except ConnectionFailed as error:
            return FailedWatch(error)
        return client.watch(gvr, on_event, **kwargs)
