"""One agent's network path to an in-memory apiserver, for pools tested on a ``Clock``.

A partition cuts links, not servers: an agent whose WAN is down reaches no cloud
server while its peers still do. ``FakeLink`` stands between one agent and one
in-memory server (a ``FakeKube`` store, or a ``FakeKubeServer`` in front of one) and
can be cut and healed. While it is cut a request is lost on the way: it never reaches
the server, and the caller's client gives up after ``request_timeout`` with
``Timeout``, as ``KubeClient`` does with a request that gets no answer (a cut link
loses packets, it refuses nothing). An answer that comes back while the link is cut
is lost the same way.

The server's side of every answer is recorded in ``request_log`` as the API test
server records it (``LoggedRequest``: the link's ``peer`` address, the method and
path the real client would send, the code, the lease fields of a Lease written, the
clock's time when the answer went out), so the invariants of
``yurtcoord.testing.invariants`` judge a pool on a ``Clock`` from the same records as
a pool of processes. The links of all agents to one server share one log. An error
without an HTTP code (``ConnectionFailed`` of a dead server) was never answered and
is not recorded.
"""

from typing import Any, Callable, List, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.kube.errors import KubeError, Timeout
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.sim.apiserver.requestlog import LoggedRequest, logged_request

# ``[client] timeout`` of the agents' clients (``yurtcoord.agent.service.REQUEST_TIMEOUT``).
DEFAULT_REQUEST_TIMEOUT = 10.0

_METHODS = {"get": "GET", "create": "POST", "update": "PUT", "delete": "DELETE"}
_SUCCESS_CODES = {"create": 201}


@implementer(IObjectClient)
class FakeLink:
    """``server``'s object calls as the agent at ``peer`` sees them over a link that
    ``cut()`` loses and ``heal()`` restores (see the module docstring).

    ``request_log``: the list every answer is appended to (pass one list to the
    links of all agents to one server); ``calls`` counts the calls made, ``lost``
    those the link lost (cut on the way there or back).
    """

    def __init__(self, clock: IReactorTime, server: IObjectClient, peer: str,
                 request_log: Optional[List[LoggedRequest]] = None,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self._clock = clock
        self._server = server
        self.peer = peer
        self.request_log: List[LoggedRequest] = [] if request_log is None else request_log
        self.request_timeout = request_timeout
        self.is_cut = False
        self.calls = 0
        self.lost = 0

    def cut(self) -> None:
        """From now on requests and answers are lost (until ``heal()``)."""
        self.is_cut = True

    def heal(self) -> None:
        """Requests reach the server again."""
        self.is_cut = False

    # The client interface ------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("get", gvr, name, namespace,
                          lambda: self._server.get(gvr, name, namespace))

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("create", gvr, None, _namespace_of(obj, namespace),
                          lambda: self._server.create(gvr, obj, namespace))

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("update", gvr, obj["metadata"]["name"], _namespace_of(obj, namespace),
                          lambda: self._server.update(gvr, obj, namespace))

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: str | None = None) -> defer.Deferred[Any]:
        return self._call("delete", gvr, name, namespace,
                          lambda: self._server.delete(gvr, name, namespace))

    # Internals -------------------------------------------------------------------

    def _call(self, verb: str, gvr: GroupVersionResource, name: Optional[str],
              namespace: Optional[str],
              send: Callable[[], defer.Deferred[Any]]) -> defer.Deferred[Any]:
        self.calls += 1
        path = (gvr.collection_path(namespace) if name is None
                else gvr.object_path(name, namespace if gvr.namespaced else None))
        answer: defer.Deferred[Any] = defer.Deferred()
        if self.is_cut:
            self.lost += 1
        else:
            sent = send()
            sent.addBoth(self._answered, verb, path, answer)
        if not answer.called:
            answer.addTimeout(self.request_timeout, self._clock,
                              onTimeoutCancel=self._timed_out(verb, path))
        return answer

    def _answered(self, result: Any, verb: str, path: str,
                  answer: defer.Deferred[Any]) -> None:
        self._record(result, verb, path)
        if self.is_cut:
            self.lost += 1
            return  # lost on the way back, a failure with it
        if answer.called:
            return  # the caller gave up on it
        if isinstance(result, Failure):
            answer.errback(result)
        else:
            answer.callback(result)

    def _record(self, result: Any, verb: str, path: str) -> None:
        if isinstance(result, Failure):
            error = result.value
            code = error.code if isinstance(error, KubeError) else 0
            if not code:
                return
            body: Any = None
        else:
            code = _SUCCESS_CODES.get(verb, 200)
            body = result
        self.request_log.append(
            logged_request(self._clock.seconds(), self.peer, _METHODS[verb], path, code, body))

    def _timed_out(self, verb: str, path: str) -> Callable[[Any, float], Any]:
        def timed_out(result: Any, timeout: float) -> Any:
            raise Timeout(f"no complete answer to {_METHODS[verb]} {path} from "
                          f"{self.peer} within {timeout}s")
        return timed_out


def _namespace_of(obj: dict[str, Any], namespace: Optional[str]) -> Optional[str]:
    return namespace or (obj.get("metadata") or {}).get("namespace")
