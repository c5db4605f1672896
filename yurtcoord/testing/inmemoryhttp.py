"""The Kubernetes API test server's HTTP stack driven without a socket."""

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from yurtcoord.sim.apiserver import KubeAPIServer


class InMemoryHTTP:
    """Drives the server's HTTP stack over an in-memory transport, on a fake
    clock: fast enough for property tests, and still real HTTP parsing."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.server = KubeAPIServer(self.clock)
        self._address = IPv4Address("TCP", "127.0.0.1", 40000)

    def request(self, method: bytes, path: bytes, body: bytes = b"",
                content_type: bytes = b"application/json") -> tuple[int, bytes]:
        """(status code, raw body) of one request on a fresh connection."""
        channel = self.server._connections.buildProtocol(self._address)
        transport = StringTransport(peerAddress=self._address)
        channel.makeConnection(transport)
        head = (b"%s %s HTTP/1.1\r\nHost: test\r\nContent-Type: %s\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                % (method, path, content_type, len(body)))
        channel.dataReceived(head + body)
        raw = transport.value()
        channel.connectionLost(Exception("done"))
        status_line, _, rest = raw.partition(b"\r\n")
        code = int(status_line.split()[1])
        return code, rest.partition(b"\r\n\r\n")[2]
