"""``GET /pool`` answered at hand: a whole plain request for the pool view's document,
when the document is built, is answered from bytes made once per document, without
twisted.web's request machinery (the README's "Pool view"). Every other
request, and a document still being built, takes the ordinary way; both ways answer
the same."""

import gzip
import json

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel
from twisted.trial import unittest
from twisted.web import server
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import status_site
from yurtcoord.agent.statussources import IPoolView, InitialStatus
from yurtcoord.testing.logcapture import GlobalLogCapture

AT_HAND = b"GET /pool HTTP/1.1\r\nHost: agent\r\nAccept-Encoding: gzip, deflate\r\n\r\n"
PLAIN = b"GET /pool HTTP/1.1\r\nHost: agent\r\n\r\n"
# The same request by another spelling of the path: always the ordinary way.
ORDINARY = b"GET /pool/ HTTP/1.1\r\nHost: agent\r\nAccept-Encoding: gzip, deflate\r\n\r\n"


@implementer(IPoolView)
class ScriptedPoolView:
    """A pool view whose document is at hand (``document``) or pending (``pending``
    set: each call gets a Deferred the test fires)."""

    def __init__(self, document):
        self.last_document = document
        self.pending = False
        self.waiting = []
        self.asked = 0

    def document(self):
        self.asked += 1
        if self.pending:
            answer = Deferred()
            self.waiting.append(answer)
            return answer
        return succeed(self.last_document)

    def build(self, document):
        self.last_document = document
        self.pending = False
        waiting, self.waiting = self.waiting, []
        for answer in waiting:
            answer.callback(document)


class CountingRequest(server.Request):
    """twisted.web's request, counted as made."""
    made = 0

    def __init__(self, *args, **kwargs):
        type(self).made += 1
        super().__init__(*args, **kwargs)


def parse(raw):
    """[(code, {header: value}, body)] of the HTTP/1.1 answers in ``raw``."""
    answers = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        code = int(lines[0].split(b" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers[b"content-length"])
        answers.append((code, headers, rest[:length]))
        raw = rest[length:]
    return answers


class PoolAnswerAtHandTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_764_800_000)
        self.document = {"node": "edge-1", "members": [{"node": f"edge-{i}"} for i in range(50)]}
        self.view = ScriptedPoolView(self.document)
        self.site = status_site(InitialStatus("edge-1", "pool-a", ()),
                                Metrics("edge-1", "pool-a"), self.clock, self.view)
        CountingRequest.made = 0
        self.site.requestFactory = CountingRequest
        self.site.startFactory()
        self.addCleanup(self.site.stopFactory)

    def connect(self):
        channel = self.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40001))
        channel.makeConnection(transport)
        return channel, transport

    def test_the_fake_is_a_pool_view(self):
        verifyObject(IPoolView, self.view)

    def test_a_document_at_hand_is_answered_without_a_web_request(self):
        channel, transport = self.connect()
        channel.dataReceived(AT_HAND)
        [(code, headers, body)] = parse(transport.value())
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(gzip.decompress(body)), self.document)
        self.assertEqual(CountingRequest.made, 0)
        self.assertFalse(transport.disconnecting)

    def test_both_ways_answer_the_same(self):
        for request in (AT_HAND, PLAIN):
            channel, transport = self.connect()
            channel.dataReceived(request)
            ordinary = request.replace(b"GET /pool ", b"GET /pool/ ")
            channel.dataReceived(ordinary)
            at_hand, by_web = parse(transport.value())
            self.assertEqual(CountingRequest.made, 1)
            CountingRequest.made = 0
            # twisted.web dates its answers by the wall clock, the site by its reactor's.
            self.assertEqual(at_hand[1].pop(b"date"), b"Wed, 03 Dec 2025 22:13:20 GMT")
            by_web[1].pop(b"date")
            self.assertEqual(at_hand, by_web)
            self.assertEqual(at_hand[1][b"content-type"], b"application/json")
            self.assertEqual(at_hand[1][b"cache-control"], b"no-store")
            self.assertEqual(at_hand[1][b"vary"], b"accept-encoding")
            self.assertEqual(at_hand[1].get(b"content-encoding"),
                             b"gzip" if request is AT_HAND else None)

    def test_the_answer_is_made_once_per_document(self):
        channel, transport = self.connect()
        channel.dataReceived(AT_HAND)
        first = self.site.pool_page.answer_at_hand(b"gzip")
        channel.dataReceived(AT_HAND)
        self.assertIs(self.site.pool_page.answer_at_hand(b"gzip")[1], first[1])
        self.view.last_document = {"node": "edge-1", "members": []}
        channel.dataReceived(AT_HAND)
        bodies = [json.loads(gzip.decompress(body)) for _, _, body in parse(transport.value())]
        self.assertEqual(bodies, [self.document, self.document, self.view.last_document])

    def test_a_document_being_built_is_answered_once_built(self):
        self.view.pending = True
        channel, transport = self.connect()
        channel.dataReceived(AT_HAND)
        self.assertEqual(transport.value(), b"")
        self.view.build({"node": "edge-1", "members": []})
        [(code, _, body)] = parse(transport.value())
        self.assertEqual((code, json.loads(gzip.decompress(body))),
                         (200, {"node": "edge-1", "members": []}))
        self.assertEqual(CountingRequest.made, 1)

    def test_other_requests_take_the_ordinary_way(self):
        cases = {
            "pipelined": AT_HAND * 2,
            "connection close": AT_HAND.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
            "a body": AT_HAND.replace(b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n{}"),
            "HTTP/1.0": AT_HAND.replace(b"HTTP/1.1", b"HTTP/1.0"),
            "a query": AT_HAND.replace(b"/pool", b"/pool?x=1"),
            "a folded header": AT_HAND.replace(b"\r\n\r\n", b"\r\nX-A: 1\r\n 2\r\n\r\n"),
            "in two reads": AT_HAND[:10],
        }
        for name, request in cases.items():
            CountingRequest.made = 0
            channel, transport = self.connect()
            channel.dataReceived(request)
            if name == "in two reads":
                channel.dataReceived(AT_HAND[10:])
            self.assertEqual(CountingRequest.made, 2 if name == "pipelined" else 1, name)
            self.assertTrue(all(code == 200 for code, _, _ in parse(transport.value())), name)

    def test_a_browser_keeping_its_connection_is_answered_at_hand(self):
        channel, transport = self.connect()
        channel.dataReceived(AT_HAND.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n"))
        self.assertEqual([code for code, _, _ in parse(transport.value())], [200])
        self.assertEqual(CountingRequest.made, 0)
        self.assertFalse(transport.disconnecting)

    def test_what_twisted_web_refuses_is_refused_as_it_would(self):
        cases = {
            "a bare LF": AT_HAND.replace(b"\r\n\r\n", b"\r\nX: a\nConnection: close\r\n\r\n"),
            "a space in a name": AT_HAND.replace(b"\r\n\r\n", b"\r\nHo st: x\r\n\r\n"),
            "a NUL in a value": AT_HAND.replace(b"\r\n\r\n", b"\r\nX-A: a\0b\r\n\r\n"),
        }
        for name, request in cases.items():
            channel, transport = self.connect()
            channel.dataReceived(request)
            self.assertTrue(transport.value().startswith(b"HTTP/1.1 400 "), name)
            self.assertTrue(transport.disconnecting, name)

    def test_the_deadline_runs_again_after_an_answer_at_hand(self):
        channel, transport = self.connect()
        self.clock.advance(4.5)
        channel.dataReceived(AT_HAND)
        self.clock.advance(4.9)
        self.assertFalse(transport.disconnecting)
        self.clock.advance(0.2)
        self.assertTrue(transport.disconnecting)

    def test_an_answer_at_hand_is_in_the_access_log(self):
        channel, transport = self.connect()
        captured = GlobalLogCapture(self)
        channel.dataReceived(AT_HAND)
        lines = [event for event in captured.events
                 if event.get("log_format", "").startswith("status request")]
        self.assertEqual([(e["log_level"], e["method"], e["path"], e["code"], e["client"])
                          for e in lines],
                         [(LogLevel.debug, "GET", "/pool", 200, "127.0.0.1")])

    def test_a_connection_of_the_probe_reserve_is_not_answered_at_hand(self):
        self.site.max_connections = 0
        channel, transport = self.connect()
        self.assertTrue(channel.reserved)
        channel.dataReceived(AT_HAND)
        self.assertEqual(parse(transport.value())[0][0], 503)
