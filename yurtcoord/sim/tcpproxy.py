"""A loopback TCP forwarder whose link can be cut and restored, for network faults.

Give one agent the proxy's URL instead of the server's and ``cut()`` takes that
server away from this agent only, while other agents keep talking to it directly:
open connections are aborted and new ones are accepted and aborted at once (the
client sees a reset, as through a broken link). ``restore()`` forwards again.
"""

from typing import Any, Generator

from twisted.internet import defer, protocol
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IAddress, IConnector, IListeningPort, IReactorTCP
from twisted.python.failure import Failure
from twisted.logger import Logger
from zope.interface import Attribute, Interface, implementer


class _Side(protocol.Protocol):
    """One end of a forwarded connection; writes what it receives to its peer."""

    peer: "_Side | None" = None
    lost = False
    # A TCP transport: it also aborts, and produces and consumes for its peer.
    transport: Any

    def __init__(self, proxy: "TCPProxy") -> None:
        self.proxy = proxy
        self._lost: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.proxy._sides.add(self)

    def dataReceived(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.lost = True
        self.proxy._sides.discard(self)
        peer, self.peer = self.peer, None
        if peer is not None:
            peer.peer = None
            if peer.transport is not None:
                peer.transport.loseConnection()
        self._lost.callback(None)

    def abort(self) -> defer.Deferred[None]:
        if self.transport is not None:
            self.transport.abortConnection()
        return self._lost


class _Upstream(_Side):
    """The proxy's connection to the target."""

    def __init__(self, proxy: "TCPProxy", downstream: "_Downstream") -> None:
        super().__init__(proxy)
        self.peer = downstream

    def connectionMade(self) -> None:
        super().connectionMade()
        downstream = self.peer
        if downstream is None or downstream.lost or self.proxy.is_cut:
            self.transport.abortConnection()
            return
        downstream.peer = self
        self.transport.registerProducer(downstream.transport, True)
        downstream.transport.registerProducer(self.transport, True)
        downstream.transport.resumeProducing()


class _UpstreamFactory(protocol.ClientFactory):
    noisy = False

    def __init__(self, proxy: "TCPProxy", downstream: "_Downstream") -> None:
        self.proxy = proxy
        self.downstream = downstream

    def startedConnecting(self, connector: IConnector) -> None:
        self.proxy._connecting.add(connector)

    def buildProtocol(self, addr: IAddress | None) -> "_Upstream":
        return _Upstream(self.proxy, self.downstream)

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        self.proxy._connecting.discard(connector)
        if not self.downstream.lost:
            self.downstream.transport.abortConnection()

    def clientConnectionLost(self, connector: IConnector, reason: Failure) -> None:
        self.proxy._connecting.discard(connector)


class _Downstream(_Side):
    """A client's connection to the proxy."""

    def connectionMade(self) -> None:
        super().connectionMade()
        if self.proxy.is_cut:
            self.transport.abortConnection()
            return
        self.transport.pauseProducing()
        self.proxy.reactor.connectTCP(self.proxy.target_host, self.proxy.target_port,
                                      _UpstreamFactory(self.proxy, self), timeout=5)


class _DownstreamFactory(protocol.ServerFactory):
    noisy = False

    def __init__(self, proxy: "TCPProxy") -> None:
        self.proxy = proxy

    def buildProtocol(self, addr: IAddress | None) -> _Downstream:
        return _Downstream(self.proxy)


class ICuttableLink(Interface):
    """A link the sandbox cuts and restores (an agent's link to the cloud)."""

    is_cut = Attribute("True from ``cut()`` until ``restore()``.")

    def cut() -> defer.Deferred[list[None]]:
        """Lose every connection over the link and refuse new ones."""

    def restore() -> None:
        """Let new connections through again."""


@implementer(ICuttableLink)
class TCPProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port``.

    ``start()`` listens (port 0 picks a free one) and fires with the port number;
    ``url(scheme)`` is the address to hand to clients. ``stop()`` closes the port and
    every forwarded connection and fires when they are all gone.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTCP, target_host: str, target_port: int) -> None:
        self.reactor = reactor
        self.target_host = target_host
        self.target_port = target_port
        self.is_cut = False
        self.port_number: int | None = None
        self._port: IListeningPort | None = None
        self._sides: set[_Side] = set()
        self._connecting: set[Any] = set()

    def start(self, port: int = 0) -> defer.Deferred[int]:
        self._port = self.reactor.listenTCP(port, _DownstreamFactory(self),
                                            interface="127.0.0.1")
        address = self._port.getHost()
        assert isinstance(address, (IPv4Address, IPv6Address))
        self.port_number = address.port
        return defer.succeed(address.port)

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port_number}"

    @property
    def connections(self) -> int:
        """Open sockets of the proxy (both ends of every forwarded connection)."""
        return len(self._sides)

    def cut(self) -> defer.Deferred[list[None]]:
        """Abort every forwarded connection and refuse to forward new ones."""
        self.is_cut = True
        self.log.info("tcp proxy to {host}:{port} cut", host=self.target_host,
                      port=self.target_port)
        return self._abort_all()

    def restore(self) -> None:
        """Forward new connections again."""
        self.is_cut = False
        self.log.info("tcp proxy to {host}:{port} restored", host=self.target_host,
                      port=self.target_port)

    def _abort_all(self) -> defer.Deferred[list[None]]:
        for connector in list(self._connecting):
            if connector.state == "connecting":
                connector.stopConnecting()
        return defer.gatherResults([side.abort() for side in list(self._sides)])

    @defer.inlineCallbacks
    def stop(self) -> Generator[Any, Any, None]:

        port, self._port = self._port, None
        if port is not None:
            yield port.stopListening()
        yield self._abort_all()
