"""A stand-in kubelet: the healthz endpoint an agent's kubelet liveness check asks.

It answers ``GET /healthz`` with ``200 ok`` (or ``code`` when a test sets another one)
from the reactor it is given, on loopback. ``stop()`` stops listening and drops every
open connection, so the agent's next check is refused as it would be by a kubelet that
died; ``start()`` listens again on the same port, like a kubelet restarted by systemd.
"""

from typing import Any, Optional

from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IListeningPort

from twisted.protocols.policies import WrappingFactory
from twisted.web.resource import Resource
from twisted.web.server import Request, Site
from zope.interface import Attribute, Interface, implementer

HEALTHZ_PATH = "/healthz"


class IKubeletStandIn(Interface):
    """What tests, the fault world and the sandbox do with a stand-in kubelet."""

    port = Attribute("The port it listens on (kept while stopped); None before start().")
    running = Attribute("True while it listens.")
    code = Attribute("The HTTP status its healthz answers (200 unless a test changes it).")
    requests = Attribute("How many healthz requests it answered.")

    def start(port: Optional[int] = None) -> int:
        """Listen on 127.0.0.1:``port`` (0 picks one; None: the port used before)."""

    def stop() -> defer.Deferred[Any]:
        """Stop listening and drop open connections; a Deferred firing when done."""

    def url() -> str:
        """The healthz URL an agent's ``kubelet_healthz_url`` names."""


class _Healthz(Resource):
    isLeaf = True

    def __init__(self, kubelet: "StandInKubelet") -> None:
        super().__init__()
        self._kubelet = kubelet

    def render_GET(self, request: Request) -> bytes:
        self._kubelet.requests += 1
        request.setResponseCode(self._kubelet.code)
        request.setHeader(b"content-type", b"text/plain")
        return b"ok" if self._kubelet.code == 200 else b"unhealthy"


@implementer(IKubeletStandIn)
class StandInKubelet:
    """See the module docstring; ``reactor`` serves it."""

    def __init__(self, reactor: Any, interface: str = "127.0.0.1") -> None:
        self._reactor = reactor
        self._interface = interface
        root = Resource()
        root.putChild(HEALTHZ_PATH.strip("/").encode("ascii"), _Healthz(self))
        self._factory = WrappingFactory(Site(root))
        self._listening: IListeningPort | None = None
        self.port: int | None = None
        self.code = 200
        self.requests = 0

    @property
    def running(self) -> bool:
        return self._listening is not None

    def start(self, port: Optional[int] = None) -> int:
        """Listen now (synchronously); returns the port number."""
        if self._listening is not None and self.port is not None:
            return self.port
        if port is None:
            port = self.port or 0
        self._listening = self._reactor.listenTCP(port, self._factory,
                                                  interface=self._interface)
        address = self._listening.getHost()
        assert isinstance(address, (IPv4Address, IPv6Address))
        self.port = address.port
        return address.port

    def stop(self) -> defer.Deferred[Any]:

        listening, self._listening = self._listening, None
        if listening is None:
            return defer.succeed(None)
        stopped = defer.maybeDeferred(listening.stopListening)
        for protocol in list(self._factory.protocols):
            protocol.transport.abortConnection()
        return stopped

    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the stand-in kubelet was never started")
        return f"http://{self._interface}:{self.port}{HEALTHZ_PATH}"
