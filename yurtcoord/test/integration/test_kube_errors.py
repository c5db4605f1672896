"""Any answer a peer sends becomes one of the client's typed errors, through
``KubeClient`` against a small web resource over a loopback socket: Status objects
with fields of the wrong type, JSON that is not a Status, nesting too deep for the
parser, bytes that are not UTF-8, an empty body, for requests and for watches."""

from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import Site

from yurtcoord.kube import errors
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import CONFIGMAPS
from yurtcoord.testing.hostilestatuses import DEEP_LIST, HOSTILE


class HostileAnswers(Resource):
    """Answers ``/api/v1/namespaces/x/configmaps/<case>`` (and a watch of
    ``/api/v1/namespaces/<case>/configmaps``) with the code and body of
    ``HOSTILE[case]``, or a 200 with the raw body of ``SUCCESS[case]``."""

    isLeaf = True

    def render(self, request):
        parts = request.path.decode().split("/")
        name = parts[-2] if parts[-1] == "configmaps" else parts[-1]
        if name in HOSTILE:
            code, body, _ = HOSTILE[name]
        else:
            code, body = 200, SUCCESS[name][0]
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        return body


# 200 answers that are no API object: (body, expected class).
SUCCESS = {
    "ok-deep": (DEEP_LIST, errors.ServerError),
    "ok-not-utf8": (b'{"kind":"ConfigMap","data":"\xff"}', errors.ServerError),
    "ok-list": (b"[1, 2]", errors.ServerError),
    "ok-number": (b"5", errors.ServerError),
}


class ClientOverLoopbackTests(unittest.TestCase):
    def setUp(self):
        port = reactor.listenTCP(0, Site(HostileAnswers()), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.client = KubeClient(reactor, ClientConfig(
            server=f"http://127.0.0.1:{port.getHost().port}", insecure=True, timeout=30.0))
        self.addCleanup(self.client.close)

    @defer.inlineCallbacks
    def test_every_hostile_error_answer_is_the_typed_error_of_its_code(self):
        for name, (code, _, expected) in HOSTILE.items():
            with self.subTest(name=name):
                try:
                    yield self.client.get(CONFIGMAPS, name, "x")
                except Exception as e:  # whatever came out is what is checked
                    error = e
                else:
                    self.fail(f"{name}: no error")
                self.assertIs(type(error), expected, f"{name}: {error!r}")
                self.assertEqual(error.code, code)

    @defer.inlineCallbacks
    def test_a_successful_answer_that_is_no_object_is_a_server_error(self):
        for name, (_, expected) in SUCCESS.items():
            with self.subTest(name=name):
                try:
                    yield self.client.get(CONFIGMAPS, name, "x")
                except Exception as e:
                    error = e
                else:
                    self.fail(f"{name}: no error")
                self.assertIs(type(error), expected, f"{name}: {error!r}")
                self.assertIn("not JSON from", str(error))

    @defer.inlineCallbacks
    def test_a_refused_watch_with_a_hostile_body_ends_with_the_typed_error(self):
        for name in ("string-code", "deep-status", "not-utf8", "empty"):
            code, _, expected = HOSTILE[name]
            watch = self.client.watch(CONFIGMAPS, lambda kind, obj: None, namespace=name)
            with self.subTest(name=name):
                try:
                    yield watch.done
                except Exception as e:
                    error = e
                else:
                    self.fail(f"{name}: the watch ended without an error")
                self.assertIs(type(error), expected, f"{name}: {error!r}")
