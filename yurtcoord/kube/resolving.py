"""A client that finds the ``KubeClient`` to use anew on every call.

Some clients cannot be fixed once: "whichever cloud server is healthy now", or "the
client whose certificate files exist now". Such a client resolves a ``KubeClient``
on every call and forwards the call to it; when it cannot resolve one, the call fails
like a call to an unreachable server, so callers retry as they would anyway.
"""

from twisted.internet import defer

from yurtcoord.kube.errors import ConnectionFailed


class FailedWatch:
    """What ``watch`` returns when no client can be resolved: already done, failed."""

    events = 0
    cancelled = False

    def __init__(self, error):
        self.done = defer.fail(error)

    def cancel(self):
        self.cancelled = True


class ResolvingClient:
    """Forwards the read calls of a ``KubeClient`` to the client ``_resolve()`` gives.

    Subclasses implement ``_resolve()``: a ``KubeClient``, or raise
    ``ConnectionFailed`` saying why there is none. A call whose resolution raises one
    of ``resolve_errors`` returns a failed Deferred; a watch returns a
    ``FailedWatch`` when resolution raises ``ConnectionFailed``.
    """

    resolve_errors = (ConnectionFailed,)

    def _call(self, method, *args, **kwargs):
        try:
            client = self._resolve()
        except self.resolve_errors:
            return defer.fail()
        return getattr(client, method)(*args, **kwargs)

    def request(self, method, path, params=None, body=None, allow_empty=False):
        return self._call("request", method, path, params=params, body=body,
                          allow_empty=allow_empty)

    def get(self, gvr, name, namespace=None):
        return self._call("get", gvr, name, namespace)

    def list(self, gvr, **kwargs):
        return self._call("list", gvr, **kwargs)

    def watch(self, gvr, on_event, **kwargs):
        try:
            client = self._resolve()
        except ConnectionFailed as error:
            return FailedWatch(error)
        return client.watch(gvr, on_event, **kwargs)
