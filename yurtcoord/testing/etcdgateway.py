"""Small HTTP servers on loopback standing in for etcd's gRPC gateway: scripted
answers, tracked connections, and the client pointed at them, for tests of how the
etcd client and the pool store meet a misbehaving server."""

import base64
import json
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Set, Tuple, Union

from twisted.internet import defer, protocol, reactor
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IAddress, IListeningPort, ITCPTransport
from twisted.trial import unittest
from twisted.web import resource, server

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.testing.poll import poll_until

# One scripted answer: (status, body), or "abort" to drop the connection unanswered.
Answer = Union[Tuple[int, bytes], str]

if TYPE_CHECKING:
    _TestCase = unittest.TestCase
else:
    _TestCase = object


class TrackingFactory(protocol.ServerFactory):
    """Wraps a factory and remembers open server-side connections, for clean teardown."""

    def __init__(self, wrapped: protocol.Factory[Any]) -> None:
        self.wrapped = wrapped
        self.open: Set[Any] = set()
        self.connections_made = 0

    def buildProtocol(self, addr: Optional[IAddress]) -> Any:
        # Any: the wrapped protocol's connectionMade and connectionLost are replaced.
        proto: Any = self.wrapped.buildProtocol(addr)
        factory = self
        original_made, original_lost = proto.connectionMade, proto.connectionLost

        def made() -> None:
            factory.open.add(proto)
            factory.connections_made += 1
            original_made()

        def lost(reason: object) -> None:
            factory.open.discard(proto)
            original_lost(reason)

        proto.connectionMade, proto.connectionLost = made, lost
        return proto


class ScriptedGateway(resource.Resource):
    """Answers POSTs from a script: ``answers[path]`` is a list of (status, body) or
    ``"abort"``, consumed in order (the last one repeats). ``seen`` keeps each
    request's path and body, ``headers`` its headers (lowercase names)."""

    isLeaf = True

    def __init__(self, answers: Dict[str, List[Answer]]) -> None:
        super().__init__()
        self.answers = answers
        self.seen: List[Tuple[str, bytes]] = []
        self.headers: List[Dict[bytes, List[bytes]]] = []

    def render_POST(self, request: server.Request) -> Union[bytes, int]:
        path = request.path.decode()
        self.seen.append((path, request.content.read() if request.content is not None else b""))
        self.headers.append({name.lower(): list(values)
                             for name, values in request.requestHeaders.getAllRawHeaders()})
        script: List[Answer] = self.answers.get(path) or [(404, b"404 page not found\n")]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, str):  # "abort"
            ITCPTransport(request.channel.transport).abortConnection()
            return server.NOT_DONE_YET
        status, body = answer
        request.setResponseCode(status)
        return body


def range_answer(*kvs: Tuple[bytes, bytes]) -> bytes:
    """The body of a range answer holding ``kvs`` ((key, value) bytes pairs)."""
    return json.dumps({
        "header": {"revision": "7"},
        "kvs": [{"key": base64.b64encode(k).decode(), "value": base64.b64encode(v).decode(),
                 "version": "1", "mod_revision": "7", "create_revision": "7"} for k, v in kvs],
        "count": str(len(kvs)),
    }).encode()


PUT_OK = json.dumps({"header": {"revision": "8"}}).encode()


class ScriptedGatewayMixin(_TestCase):
    """For trial TestCases: servers on loopback, stopped with every connection
    aborted at cleanup, and etcd clients on them."""

    def listen(self, factory: protocol.Factory[Any]) -> Tuple[str, TrackingFactory]:
        tracking = TrackingFactory(factory)
        port = reactor.listenTCP(0, tracking, interface="127.0.0.1")
        self.addCleanup(self._stop_server, port, tracking)
        address = port.getHost()
        assert isinstance(address, IPv4Address)
        return f"http://127.0.0.1:{address.port}", tracking

    @defer.inlineCallbacks
    def _stop_server(self, port: IListeningPort,
                     tracking: TrackingFactory) -> Generator[Any, Any, None]:
        yield port.stopListening()
        for proto in list(tracking.open):
            proto.transport.abortConnection()
        yield poll_until(lambda: not tracking.open)

    def gateway(self, answers: Dict[str, List[Answer]],
                ) -> Tuple[str, ScriptedGateway, TrackingFactory]:
        gw = ScriptedGateway(answers)
        url, tracking = self.listen(server.Site(gw))
        return url, gw, tracking

    def client(self, url: str, **options: Any) -> EtcdClient:
        options.setdefault("timeout", 5.0)
        client = EtcdClient(reactor, EtcdConfig(url, **options))
        self.addCleanup(client.close)
        return client
