"""Canaries for the private names of Twisted and txaioetcd the agent relies on.

Each private use sits in one module (``yurtcoord.tx.twisted_private``,
``yurtcoord.etcd.txaioetcd_private``); ``setup.py`` bounds both libraries to the
versions these tests passed on. When a release renames, removes or reshapes one of the
names, the test for it fails with a message saying what changed and where it is used,
rather than the agent failing somewhere far away at run time.
"""

import ast
import inspect
import json
import sys

import treq.client
import txaioetcd
from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest
from twisted.web import client as web_client, http as twisted_http, _newclient
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from yurtcoord.etcd import txaioetcd_private
from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.testing.twistd import child_environment
from yurtcoord.tx import twisted_private


class Canary(unittest.TestCase):
    """Assertions whose failure message names the library change and its user."""

    holder = ""

    def require(self, condition, what):
        if not condition:
            self.fail(f"{what}; {self.holder} relies on it: adapt that module and the "
                      f"version bounds in setup.py")

    def require_attribute(self, owner, name):
        self.require(hasattr(owner, name),
                     f"{getattr(owner, '__name__', owner)!s} has no attribute {name!r} any more")
        return getattr(owner, name)

    def require_parameters(self, function, expected):
        parameters = list(inspect.signature(function).parameters)
        self.require(parameters[:len(expected)] == list(expected),
                     f"{function.__qualname__} takes {parameters}, not {list(expected)}")


class TwistedCanaries(Canary):
    holder = "yurtcoord/tx/twisted_private.py"

    def test_newclient_names(self):
        parse_error = self.require_attribute(_newclient, "ParseError")
        self.require(issubclass(parse_error, Exception), "ParseError is no exception")
        proxy_class = self.require_attribute(_newclient, "TransportProxyProducer")
        connection = object()
        proxy = proxy_class(connection)
        self.require(twisted_private.proxied_transport(proxy) is connection,
                     "TransportProxyProducer no longer keeps its producer in _producer")
        proxy.stopProxying()
        self.require(twisted_private.proxied_transport(proxy) is None,
                     "TransportProxyProducer._producer is not None after stopProxying()")
        request_class = self.require_attribute(_newclient, "Request")
        self.require_parameters(request_class.__init__, ["self", "method", "uri", "headers",
                                                         "bodyProducer", "persistent"])
        self.require(hasattr(_newclient.HTTP11ClientProtocol, "request"),
                     "HTTP11ClientProtocol has no request() any more")

    def test_the_pool_makes_connections_with_its_factory_attribute(self):
        factory = self.require_attribute(web_client, "_HTTP11ClientFactory")
        self.require(web_client.HTTPConnectionPool._factory is factory,
                     "HTTPConnectionPool._factory is not _HTTP11ClientFactory")
        self.require_parameters(factory.__init__, ("self", "quiescentCallback", "metadata"))
        pool = twisted_private.QuietHTTPConnectionPool(reactor)
        seen = []

        class Endpoint:
            def connect(self, factory):
                seen.append(factory)
                return defer.Deferred()

        pool.getConnection(("http", b"h", 1), Endpoint())
        self.require(len(seen) == 1 and isinstance(seen[0], factory) and not seen[0].noisy,
                     f"HTTPConnectionPool no longer builds connections from _factory: {seen}")

    def test_no_class_attribute_of_twisted_changes(self):
        noisy_before = web_client._HTTP11ClientFactory.noisy
        client = EtcdClient(reactor, EtcdConfig(url="http://127.0.0.1:1"))
        self.addCleanup(client.close)
        self.assertEqual(web_client._HTTP11ClientFactory.noisy, noisy_before)
        self.assertTrue(web_client._HTTP11ClientFactory.noisy)
        self.assertFalse(client._transport.pool._factory.noisy)
        self.assertFalse(client.txaioetcd._pool._factory.noisy)

    def test_chunked_decoder_state(self):
        decoder_class = self.require_attribute(twisted_http, "_ChunkedTransferDecoder")
        self.require_parameters(decoder_class.__init__,
                                ("self", "dataCallback", "finishCallback"))
        self.require(isinstance(self.require_attribute(twisted_http, "maxChunkSizeLineLength"),
                                int), "maxChunkSizeLineLength is no int")
        delivered = []
        decoder = decoder_class(delivered.append, lambda rest: None)
        for data, state in ((b"", "CHUNK_LENGTH"), (b"5\r\nab", "BODY"), (b"cde", "CRLF"),
                            (b"\r\n", "CHUNK_LENGTH")):
            decoder.dataReceived(data)
            self.require(decoder.state == state,
                         f"_ChunkedTransferDecoder is in state {decoder.state!r} where it "
                         f"was {state!r}")
            self.require(isinstance(decoder._buffer, bytearray) and decoder._start == 0,
                         "_ChunkedTransferDecoder._buffer/_start changed shape")
            if state == "BODY":
                self.require(decoder.length == 3, "_ChunkedTransferDecoder.length is not the "
                                                  "rest of the current chunk")
            self.require(decoder.dataCallback == delivered.append,
                         "_ChunkedTransferDecoder.dataCallback is not the data callback")
        self.require(b"".join(delivered) == b"abcde", f"decoder delivered {delivered}")

    @defer.inlineCallbacks
    def test_the_batcher_finds_the_decoder_of_a_real_response(self):
        requests = []

        class Chunked(Resource):
            isLeaf = True

            def render_GET(self, request):
                request.write(b"line 0\n")
                requests.append(request)
                return NOT_DONE_YET

        port = reactor.listenTCP(0, Site(Chunked()), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        pool = twisted_private.QuietHTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        http = treq.client.HTTPClient(web_client.Agent(reactor, pool=pool))
        response = yield http.get(f"http://127.0.0.1:{port.getHost().port}/".encode(),
                                  unbuffered=True)
        batcher = twisted_private.batch_chunked_body(response)
        self.require(batcher is not None,
                     "batch_chunked_body no longer finds the HTTP parser and its chunked "
                     "decoder under a response (HTTP11ClientProtocol._parser, "
                     "HTTPClientParser.bodyDecoder, Response._transport)")
        body = treq.content(response)
        for i in range(1, 20):
            requests[0].write(b"line %d\n" % i)
        requests[0].finish()
        body = yield body
        self.assertEqual(body, b"".join(b"line %d\n" % i for i in range(20)))
        self.assertGreaterEqual(batcher.reads, 1)


class _RecordingTransport:
    def __init__(self, answer):
        self.answer = answer
        self.posts = []

    def post(self, path, data, timeout):
        self.posts.append((path, data, timeout))
        return defer.succeed(self.answer)

    def post_body(self, path, body, timeout):
        return self.post(path, json.loads(body), timeout)


class TxaioetcdCanaries(Canary):
    holder = "yurtcoord/etcd/txaioetcd_private.py"

    def client(self, answer):
        transport = _RecordingTransport(answer)
        client = txaioetcd_private.GatewayClient(reactor, "http://127.0.0.1:2379", transport,
                                                 defer.fail)
        return client, transport

    def test_client_keeps_its_url_and_posts_through_post(self):
        post = self.require_attribute(txaioetcd.Client, "_post")
        self.require_parameters(post, ("self", "url", "data", "timeout"))
        self.require_parameters(txaioetcd.Client.__init__, ("self", "reactor", "url", "pool"))
        client, transport = self.client({"header": {"revision": "7"}})
        self.require(client._url == "http://127.0.0.1:2379", "Client._url is not the URL given")
        revision = self.successResultOf(client.set(b"k", b"v", timeout=3))
        self.require(transport.posts == [("/kv/put", {"key": "aw==", "value": "dg=="}, 3)],
                     f"Client.set no longer posts through _post to /v3alpha/kv/put: "
                     f"{transport.posts}")
        self.assertEqual(revision.header.revision, 7)

    def test_transactions_and_deletes_post_through_post(self):
        client, transport = self.client({"header": {"revision": "8"}, "deleted": "1"})
        deleted = self.successResultOf(client.delete(txaioetcd.KeySet(b"k")))
        self.assertEqual(deleted.deleted, 1)
        transport.answer = {"header": {"revision": "9"}, "succeeded": True, "responses": []}
        txn = txaioetcd.Transaction(compare=[txaioetcd.CompVersion(b"k", "==", 0)],
                                    success=[txaioetcd.OpSet(b"k", b"v")])
        self.successResultOf(client.submit(txn))
        self.require([p[0] for p in transport.posts] == ["/kv/deleterange", "/kv/txn"],
                     f"delete/submit no longer post through _post: {transport.posts}")

    def test_a_transaction_is_encoded_and_answered_as_txaioetcd_does(self):
        """``GatewayClient.submit`` writes the body that ``Transaction._marshal()``
        describes and reads the answer with ``validate_client_submit_response``."""
        self.require(callable(getattr(sys.modules["txaioetcd._client_commons"],
                                      "validate_client_submit_response", None)),
                     "txaioetcd._client_commons.validate_client_submit_response is gone")
        for name in ("key", "value", "lease", "return_previous"):
            self.require(hasattr(txaioetcd.OpSet(b"k", b"v"), name),
                         f"OpSet has no attribute {name!r} any more")
        txn = txaioetcd.Transaction(compare=[txaioetcd_private.KeyAbsent(b"k")],
                                    success=[txaioetcd.OpSet(b"k", b"v")],
                                    failure=[txaioetcd.OpGet(b"k")])
        self.require(json.loads(txaioetcd_private.encode_transaction(txn)) == txn._marshal(),
                     f"Transaction._marshal() changed shape: {txn._marshal()}")
        client, transport = self.client(
            {"header": {"revision": "9"}, "succeeded": True,
             "responses": [{"response_put": {"header": {"revision": "9"}}}]})
        success = self.successResultOf(client.submit(txn, timeout=4))
        self.require(transport.posts == [("/kv/txn", txn._marshal(), 4)],
                     f"submit posted {transport.posts}")
        self.require(isinstance(success, txaioetcd.Success)
                     and success.header.revision == 9
                     and isinstance(success.responses[0], txaioetcd.Revision),
                     f"validate_client_submit_response changed: {success}")
        transport.answer = {"header": {"revision": "10"},
                            "responses": [{"response_range": {"header": {}, "kvs": []}}]}
        failed = self.failureResultOf(client.submit(txn), txaioetcd.Failed).value
        self.require(failed.header.revision == 10
                     and isinstance(failed.responses[0], txaioetcd.Range),
                     f"a failed guard is no longer answered as Failed: {failed}")
        transport.answer = {"error": "etcdserver: duplicate key given in txn request",
                            "code": 3}
        error = self.failureResultOf(client.submit(txn), txaioetcd.Error).value
        self.require(error.code == 3, f"an etcd error is no longer an Error: {error}")

    def test_marshal_and_parse(self):
        self.require_attribute(txaioetcd.OpGet, "_marshal")
        op = txaioetcd.OpGet(txaioetcd.KeySet(b"a", range_end=b"b"), keys_only=True, limit=5)
        self.require(txaioetcd_private.marshal_range_request(op) ==
                     {"key": "YQ==", "range_end": "Yg==", "keys_only": True, "limit": 5},
                     f"OpGet._marshal() changed shape: {op._marshal()}")
        self.require_parameters(self.require_attribute(txaioetcd.KeyValue, "_parse"), ("obj",))
        kv = txaioetcd_private.parse_key_value(
            {"key": "YQ==", "value": "dg==", "version": "2", "mod_revision": "5"})
        self.require((kv.key, kv.value, kv.version, kv.mod_revision) == (b"a", b"v", 2, 5),
                     f"KeyValue._parse changed: {kv}")
        self.require_parameters(self.require_attribute(txaioetcd.Status, "_parse"), ("obj",))
        status = txaioetcd_private.parse_status(
            {"header": {"revision": "3"}, "version": "3.5.1", "dbSize": "10", "leader": "1"})
        self.require(status.version == "3.5.1" and status.header.revision == 3,
                     f"Status._parse changed: {status}")

    def test_a_compare_of_our_own_is_marshalled_by_its_marshal(self):
        self.require_parameters(txaioetcd.Comp.__init__, ("self", "key", "compare"))
        txn = txaioetcd.Transaction(compare=[txaioetcd_private.KeyAbsent(b"k")],
                                    success=[txaioetcd.OpSet(b"k", b"v")])
        self.require(txn._marshal().get("compare") == [{"key": "aw=="}],
                     f"Transaction._marshal() no longer takes a compare's _marshal(): "
                     f"{txn._marshal()}")

    def test_the_package_init_takes_the_client_names_from_the_client_modules(self):
        """``import_client_only`` copies what txaioetcd's ``__init__`` takes from the
        client's modules and leaves out only its database layer."""
        with open(txaioetcd.__file__, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        taken = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "txaioetcd."):
                taken.setdefault(node.module, set()).update(a.name for a in node.names)
        client = dict(txaioetcd_private.CLIENT_MODULES)
        self.require(set(taken) - set(client) == {"txaioetcd._pmap", "txaioetcd._database"},
                     f"txaioetcd's __init__ imports {sorted(taken)}, not the client modules "
                     f"{sorted(client)} plus its database layer (_pmap, _database)")
        for module_name, names in client.items():
            module = sys.modules[module_name]
            copied = set(module.__all__ if names is None else names)
            self.require(taken.get(module_name) == copied,
                         f"txaioetcd's __init__ takes {sorted(taken.get(module_name, ()))} "
                         f"from {module_name}, not {sorted(copied)}")

    @defer.inlineCallbacks
    def fresh_interpreter(self, code):
        """Run ``code`` in a new interpreter (this one has all of txaioetcd loaded);
        fire with the JSON document it prints."""
        out, err, status = yield getProcessOutputAndValue(
            sys.executable, ["-c", code], env=child_environment(), reactor=reactor)
        self.assertEqual(status, 0, err.decode("utf-8", "replace"))
        return json.loads(out)

    @defer.inlineCallbacks
    def test_the_client_loads_without_the_database_layer(self):
        seen = yield self.fresh_interpreter(
            "import json, sys\n"
            "from yurtcoord.etcd.client import EtcdClient\n"
            "import txaioetcd, txaioetcd._client_tx as c\n"
            "print(json.dumps({'loaded': sorted(m for m in ('zlmdb', 'numpy', 'cbor2', "
            "'txaioetcd._pmap', 'txaioetcd._database') if m in sys.modules), "
            "'client': txaioetcd.Client is c.Client, "
            "'names': sorted(n for n in ('KeySet', 'Transaction', 'OpSet', 'Lease', "
            "'Failed', 'Error', 'Status') if n in vars(txaioetcd))}))\n")
        self.require(seen == {"loaded": [], "client": True, "names": [
            "Error", "Failed", "KeySet", "Lease", "OpSet", "Status", "Transaction"]},
            f"the etcd client no longer loads txaioetcd without its database layer: {seen}")

    @defer.inlineCallbacks
    def test_any_other_name_loads_the_whole_package(self):
        seen = yield self.fresh_interpreter(
            "import json, sys\n"
            "from yurtcoord.etcd.txaioetcd_private import txaioetcd\n"
            "before = 'zlmdb' in sys.modules\n"
            "from txaioetcd import Database, MapStringJson\n"
            "print(json.dumps({'before': before, 'after': 'zlmdb' in sys.modules, "
            "'database': Database.__module__, 'same_keyset': txaioetcd.KeySet is "
            "sys.modules['txaioetcd._types'].KeySet, 'version': txaioetcd.version}))\n")
        self.assertEqual(seen, {"before": False, "after": True,
                                "database": "txaioetcd._database", "same_keyset": True,
                                "version": txaioetcd.version})
