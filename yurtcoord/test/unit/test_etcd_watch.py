"""The etcd gateway's watch stream, parsed: answers split anywhere across reads,
several in one read, and whatever a peer sends instead."""

import base64
import json

from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial import unittest
from twisted.web.client import ResponseDone

from yurtcoord.etcd.errors import BadResponse, EtcdUnavailable, RequestRejected
from yurtcoord.etcd.watch import EtcdWatch, KeyEvent, WatchCompacted, watch_request


def _b64(data):
    return base64.b64encode(data).decode()


def answer(revision, *events, **extra):
    result = {"header": {"revision": str(revision)}, **extra}
    if events:
        result["events"] = list(events)
    return json.dumps({"result": result}).encode() + b"\n"


def put(key, value, create, mod, prev=None):
    event = {"kv": {"key": _b64(key), "value": _b64(value), "create_revision": str(create),
                    "mod_revision": str(mod)}}
    if prev is not None:
        event["prev_kv"] = {"key": _b64(key), "value": _b64(prev)}
    return event


class EtcdWatchParserTests(unittest.TestCase):

    def setUp(self):
        self.responses = []
        self.watch = EtcdWatch(self.responses.append, max_line=10_000)
        self.transport = StringTransport()
        self.watch.protocol.makeConnection(self.transport)

    def end(self, reason=ResponseDone()):
        self.watch.protocol.connectionLost(Failure(reason))

    def test_answers_split_at_every_byte_arrive_whole(self):
        stream = (answer(5, created=True)
                  + answer(7, put(b"/r/a", b"x" * 500, 6, 6),
                           {"type": "DELETE", "kv": {"key": _b64(b"/r/a"), "mod_revision": "7"},
                            "prev_kv": {"key": _b64(b"/r/a"), "value": _b64(b"x" * 500)}})
                  + answer(8, put(b"/r/b", b"2", 3, 8, prev=b"1")))
        for index in range(len(stream)):
            self.watch.protocol.dataReceived(stream[index:index + 1])
        self.end()
        self.assertEqual([r.revision for r in self.responses], [5, 7, 8])
        self.assertTrue(self.responses[0].created)
        self.assertEqual(self.responses[1].events, [
            KeyEvent("PUT", b"/r/a", b"x" * 500, 6, 6, None),
            KeyEvent("DELETE", b"/r/a", b"", 0, 7, b"x" * 500)])
        self.assertEqual(self.responses[2].events, [KeyEvent("PUT", b"/r/b", b"2", 3, 8, b"1")])
        self.assertIsNone(self.successResultOf(self.watch.finished))

    def test_many_answers_in_one_read(self):
        self.watch.protocol.dataReceived(b"".join(
            answer(n, put(b"/k", b"v", 2, n)) for n in range(2, 50)))
        self.assertEqual([r.revision for r in self.responses], list(range(2, 50)))

    def test_compacted_start_revision_ends_the_watch_with_its_compact_revision(self):
        self.watch.protocol.dataReceived(answer(5, created=True) + json.dumps(
            {"result": {"header": {}, "canceled": True, "compact_revision": "3"}}).encode()
            + b"\n")
        self.assertTrue(self.transport.disconnecting or self.transport.disconnected)
        self.end()
        error = self.failureResultOf(self.watch.finished, WatchCompacted).value
        self.assertEqual(error.compact_revision, 3)

    def test_cut_in_the_middle_of_an_answer_is_unavailable(self):
        self.watch.protocol.dataReceived(answer(5, created=True) + b'{"result":{"hea')
        self.end(ResponseDone())
        self.failureResultOf(self.watch.finished, EtcdUnavailable)
        self.assertEqual(len(self.responses), 1)

    def test_what_is_not_a_watch_answer_is_a_bad_response(self):
        for garbage in (b"not json\n", b"[1,2]\n", b'{"result":{"events":{}}}\n',
                        b'{"result":{"events":[{"kv":{"key":7}}]}}\n',
                        b'{"result":{"events":[{"type":"MOVE","kv":{"key":"L2E="}}]}}\n',
                        b'{"result":{"header":{"revision":true}}}\n',
                        b'{"result":{"events":[{"kv":{"key":"!!"}}]}}\n',
                        b"[" * 100_000 + b"\n"):
            with self.subTest(garbage=garbage[:40]):
                watch = EtcdWatch(self.responses.append, max_line=1_000_000)
                watch.protocol.makeConnection(StringTransport())
                watch.protocol.dataReceived(garbage)
                watch.protocol.connectionLost(Failure(ResponseDone()))
                self.failureResultOf(watch.finished, BadResponse)

    def test_an_answer_longer_than_the_bound_is_refused_unbuffered(self):
        self.watch.protocol.dataReceived(b"x" * 6_000)
        self.watch.protocol.dataReceived(b"x" * 6_000)
        self.assertLessEqual(self.watch.protocol.pending_bytes, 10_000)
        self.end()
        self.failureResultOf(self.watch.finished, BadResponse)

    def test_an_error_in_the_stream_is_typed(self):
        self.watch.protocol.dataReceived(
            b'{"error":{"grpc_code":14,"http_code":503,"message":"no leader"}}\n')
        self.end()
        self.failureResultOf(self.watch.finished, EtcdUnavailable)
        watch = EtcdWatch(self.responses.append)
        watch.protocol.makeConnection(StringTransport())
        watch.protocol.dataReceived(b'{"error":{"grpc_code":3,"message":"bad key"}}\n')
        watch.protocol.connectionLost(Failure(ResponseDone()))
        self.failureResultOf(watch.finished, RequestRejected)

    def test_a_consumer_that_raises_ends_the_watch_with_its_error(self):
        def refuse(response):
            raise KeyError("no")
        watch = EtcdWatch(refuse)
        watch.protocol.makeConnection(StringTransport())
        watch.protocol.dataReceived(answer(5, created=True))
        watch.protocol.connectionLost(Failure(ResponseDone()))
        self.failureResultOf(watch.finished, KeyError)

    def test_cancel_ends_cleanly(self):
        self.watch.cancel()
        self.watch.protocol.dataReceived(answer(5, created=True))
        self.end(EtcdUnavailable("aborted"))
        self.assertIsNone(self.successResultOf(self.watch.finished))
        self.assertEqual(self.responses, [])

    def test_watch_request(self):
        self.assertEqual(watch_request(b"/a/", b"/a0", 7, True), {"create_request": {
            "key": _b64(b"/a/"), "range_end": _b64(b"/a0"), "start_revision": 7,
            "prev_kv": True}})
        self.assertEqual(watch_request(b"/a", None, None, False),
                         {"create_request": {"key": _b64(b"/a")}})
