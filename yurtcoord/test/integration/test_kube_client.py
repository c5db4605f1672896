"""KubeClient against real sockets: a small fake apiserver for error mapping, timeouts,
pool size, TLS and watches; CRUD against the Kubernetes API test server."""

import base64
import json
import os
import time

from cryptography.x509.oid import NameOID
from twisted.internet import defer, reactor, ssl
from twisted.trial import unittest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Site
from zope.interface.verify import verifyObject

from yurtcoord.kube import errors
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import CONFIGMAPS, NODES
from yurtcoord.kube.kubeconfig import KubeconfigError
from yurtcoord.kube.tls import TLSConfigError
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.poll import poll_until


def status(code, reason, message=""):
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": message or reason}


class FakeAPI(Resource):
    """Answers by path; records what it saw. Handlers may return NOT_DONE_YET."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.seen = []
        self.routes = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.pending = []
        self.subjects = []
        self.open_streams = []

    def render(self, request):
        path = request.path.decode()
        body = request.content.read()
        self.seen.append({
            "method": request.method.decode(), "path": path,
            "args": {k.decode(): v[0].decode() for k, v in request.args.items()},
            "headers": {k.decode().lower(): v[0].decode()
                        for k, v in request.requestHeaders.getAllRawHeaders()},
            "body": json.loads(body) if body else None,
        })
        cert = getattr(request.channel.transport, "getPeerCertificate", lambda: None)()
        if cert is not None:
            names = cert.to_cryptography().subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            self.subjects.append(names[0].value)
        handler = self.routes.get((request.method.decode(), path)) or self.routes.get(path)
        if handler is None:
            request.setResponseCode(404)
            return json.dumps(status(404, "NotFound", f"{path} not found")).encode()
        return handler(request)


def answer(code, payload, content_type=b"application/json"):
    def handler(request):
        request.setResponseCode(code)
        request.setHeader(b"content-type", content_type)
        return payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return handler


class ClientFixture:
    """Starts the fake server (plain or TLS) and clients, and cleans them all up."""

    def start_fake(self, tls_context=None):
        self.api = FakeAPI()
        verifyObject(IResource, self.api)
        site = Site(self.api)
        if tls_context is None:
            port = reactor.listenTCP(0, site, interface="127.0.0.1")
            scheme = "http"
        else:
            port = reactor.listenSSL(0, site, tls_context, interface="127.0.0.1")
            scheme = "https"
        self.addCleanup(port.stopListening)
        self.addCleanup(self._finish_pending)
        return f"{scheme}://127.0.0.1:{port.getHost().port}"

    def _finish_pending(self):
        for request in self.api.pending:
            if not request.finished and not request._disconnected:
                request.channel.transport.abortConnection()
        for transport in self.api.open_streams:
            transport.abortConnection()

    def client(self, url, **kwargs):
        kwargs.setdefault("insecure", url.startswith("http:"))
        kwargs.setdefault("timeout", 5.0)
        client = KubeClient(reactor, ClientConfig(server=url, **kwargs))
        self.addCleanup(client.close)
        return client


class ClientRequestTests(ClientFixture, unittest.TestCase):
    @defer.inlineCallbacks
    def test_get_list_create_update_delete_use_the_right_paths(self):
        url = self.start_fake()
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "5"}}
        self.api.routes[("GET", "/api/v1/namespaces/ns1/configmaps/a")] = answer(200, cm)
        self.api.routes[("GET", "/api/v1/namespaces/ns1/configmaps")] = answer(
            200, {"kind": "ConfigMapList", "metadata": {"resourceVersion": "9"}, "items": [cm]})
        self.api.routes[("POST", "/api/v1/namespaces/ns1/configmaps")] = answer(201, cm)
        self.api.routes[("PUT", "/api/v1/namespaces/ns1/configmaps/a")] = answer(200, cm)
        self.api.routes[("DELETE", "/api/v1/namespaces/ns1/configmaps/a")] = answer(200, b"")
        self.api.routes[("DELETE", "/api/v1/nodes/n1")] = answer(200, {"kind": "Status", "status": "Success"})
        client = self.client(url, token="s3cret")

        got = yield client.get(CONFIGMAPS, "a", "ns1")
        self.assertEqual(got, cm)
        listed = yield client.list(CONFIGMAPS, "ns1", label_selector="app=x",
                                   field_selector="metadata.name=a", resource_version="0")
        self.assertEqual(listed["metadata"]["resourceVersion"], "9")
        created = yield client.create(CONFIGMAPS, cm)
        self.assertEqual(created, cm)
        yield client.update(CONFIGMAPS, cm)
        deleted = yield client.delete(CONFIGMAPS, "a", "ns1")
        self.assertIsNone(deleted)
        node_deleted = yield client.delete(NODES, "n1")
        self.assertEqual(node_deleted["status"], "Success")

        methods = [(s["method"], s["path"]) for s in self.api.seen]
        self.assertEqual(methods, [
            ("GET", "/api/v1/namespaces/ns1/configmaps/a"),
            ("GET", "/api/v1/namespaces/ns1/configmaps"),
            ("POST", "/api/v1/namespaces/ns1/configmaps"),
            ("PUT", "/api/v1/namespaces/ns1/configmaps/a"),
            ("DELETE", "/api/v1/namespaces/ns1/configmaps/a"),
            ("DELETE", "/api/v1/nodes/n1"),
        ])
        self.assertEqual(self.api.seen[1]["args"], {
            "labelSelector": "app=x", "fieldSelector": "metadata.name=a", "resourceVersion": "0"})
        self.assertEqual(self.api.seen[2]["body"], cm)
        self.assertEqual(self.api.seen[2]["headers"]["content-type"], "application/json")
        self.assertTrue(all(s["headers"]["authorization"] == "Bearer s3cret" for s in self.api.seen))

    @defer.inlineCallbacks
    def test_gzip_answers_redirects_and_names_to_escape(self):
        # What client-go's transport does too: gzip accepted and decoded, a GET
        # redirected followed; a name with characters a path cannot carry is sent
        # percent-encoded.
        import gzip
        url = self.start_fake()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns1"}}

        def zipped(request):
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-encoding", b"gzip")
            return gzip.compress(json.dumps(cm).encode())

        def moved(request):
            request.setResponseCode(307)
            request.setHeader(b"location", b"/api/v1/namespaces/ns1/configmaps/a")
            return b""

        self.api.routes[("GET", "/api/v1/namespaces/ns1/configmaps/a")] = zipped
        self.api.routes[("GET", "/api/v1/namespaces/ns1/configmaps/old")] = moved
        self.api.routes[("GET", "/api/v1/namespaces/ns1/configmaps/b%20c%C3%A9")] = answer(200, cm)
        client = self.client(url)
        self.assertEqual((yield client.get(CONFIGMAPS, "a", "ns1")), cm)
        self.assertEqual((yield client.get(CONFIGMAPS, "old", "ns1")), cm)
        self.assertEqual((yield client.get(CONFIGMAPS, "b c\u00e9", "ns1")), cm)
        self.assertEqual(self.api.seen[0]["headers"]["accept-encoding"], "gzip")
        self.assertEqual([s["path"] for s in self.api.seen][1:], [
            "/api/v1/namespaces/ns1/configmaps/old", "/api/v1/namespaces/ns1/configmaps/a",
            "/api/v1/namespaces/ns1/configmaps/b%20c%C3%A9"])

    @defer.inlineCallbacks
    def test_status_errors_become_typed_exceptions(self):
        url = self.start_fake()
        cases = {
            "/api/v1/namespaces/x/configmaps/nf": (404, status(404, "NotFound"), errors.NotFound),
            "/api/v1/namespaces/x/configmaps/ae": (409, status(409, "AlreadyExists"), errors.AlreadyExists),
            "/api/v1/namespaces/x/configmaps/cf": (409, status(409, "Conflict"), errors.Conflict),
            "/api/v1/namespaces/x/configmaps/gone": (410, status(410, "Expired"), errors.Gone),
            "/api/v1/namespaces/x/configmaps/un": (401, status(401, "Unauthorized"), errors.Unauthorized),
            "/api/v1/namespaces/x/configmaps/fb": (403, status(403, "Forbidden"), errors.Forbidden),
            "/api/v1/namespaces/x/configmaps/se": (500, status(500, "InternalError"), errors.ServerError),
            "/api/v1/namespaces/x/configmaps/text500": (503, b"upstream down", errors.ServerError),
            "/api/v1/namespaces/x/configmaps/bare404": (404, b"no", errors.NotFound),
        }
        for path, (code, payload, _) in cases.items():
            self.api.routes[path] = answer(code, payload)
        client = self.client(url)
        for path, (code, _, expected) in cases.items():
            name = path.rsplit("/", 1)[1]
            with self.subTest(name=name):
                failure = yield self.assertFailure(client.get(CONFIGMAPS, name, "x"), expected)
                self.assertEqual(type(failure), expected)
                self.assertEqual(failure.code, code)

    @defer.inlineCallbacks
    def test_answer_that_is_not_json_is_a_server_error_naming_the_url(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/x/configmaps/g"] = answer(200, b"<html>oops", b"text/html")
        client = self.client(url)
        failure = yield self.assertFailure(client.get(CONFIGMAPS, "g", "x"), errors.ServerError)
        self.assertIn("not JSON from " + url + "/api/v1/namespaces/x/configmaps/g", str(failure))

    @defer.inlineCallbacks
    def test_any_answer_becomes_a_typed_error(self):
        url = self.start_fake()
        deep = b"[" * 100000 + b"]" * 100000
        answers = {
            "/api/v1/nodes/list": (200, b"[1, 2]"),
            "/api/v1/nodes/text": (200, b'"text"'),
            "/api/v1/nodes/deep": (200, deep),
            "/api/v1/nodes/deep-error": (500, deep),
            "/api/v1/nodes/bad-status": (409, json.dumps(
                {"kind": "Status", "code": "409", "reason": ["Conflict"],
                 "message": {"a": 1}}).encode()),
        }
        for path, (code, body) in answers.items():
            self.api.routes[path] = answer(code, body)
        client = self.client(url)
        for path in answers:
            failure = yield self.assertFailure(client.request("GET", path), errors.KubeError)
            self.assertIn(type(failure), (errors.ServerError, errors.Conflict), path)
        bad_status = yield self.assertFailure(client.request("GET", "/api/v1/nodes/bad-status"),
                                              errors.Conflict)
        self.assertEqual((bad_status.code, bad_status.reason), (409, "Conflict"))

    @defer.inlineCallbacks
    def test_no_answer_within_timeout_is_timeout_and_connection_is_aborted(self):
        url = self.start_fake()
        closed = []

        def hang(request):
            self.api.pending.append(request)
            request.notifyFinish().addErrback(lambda f: closed.append(f))
            return NOT_DONE_YET
        self.api.routes["/api/v1/namespaces/x/configmaps/slow"] = hang
        client = self.client(url, timeout=0.2)
        started = time.monotonic()
        yield self.assertFailure(client.get(CONFIGMAPS, "slow", "x"), errors.Timeout)
        self.assertLess(time.monotonic() - started, 5.0)
        yield poll_until(lambda: closed)

    @defer.inlineCallbacks
    def test_body_that_stops_midway_times_out(self):
        url = self.start_fake()

        def half(request):
            self.api.pending.append(request)
            request.setHeader(b"content-length", b"100")
            request.write(b'{"kind":')
            return NOT_DONE_YET
        self.api.routes["/api/v1/namespaces/x/configmaps/half"] = half
        client = self.client(url, timeout=0.2)
        yield self.assertFailure(client.get(CONFIGMAPS, "half", "x"), errors.Timeout)

    @defer.inlineCallbacks
    def test_connection_reset_mid_body_is_connection_failed(self):
        url = self.start_fake()

        def reset(request):
            request.setHeader(b"content-length", b"100")
            request.write(b'{"kind":')
            reactor.callLater(0, request.channel.transport.abortConnection)
            return NOT_DONE_YET
        self.api.routes["/api/v1/namespaces/x/configmaps/reset"] = reset
        client = self.client(url)
        yield self.assertFailure(client.get(CONFIGMAPS, "reset", "x"), errors.ConnectionFailed)

    @defer.inlineCallbacks
    def test_connection_refused_is_connection_failed(self):
        port = reactor.listenTCP(0, Site(Resource()), interface="127.0.0.1")
        number = port.getHost().port
        yield port.stopListening()
        client = self.client(f"http://127.0.0.1:{number}")
        failure = yield self.assertFailure(client.get(NODES, "n"), errors.ConnectionFailed)
        self.assertIn(f"127.0.0.1:{number}", str(failure))

    @defer.inlineCallbacks
    def test_pool_runs_many_requests_to_one_host_concurrently(self):
        url = self.start_fake()

        def slow(request):
            self.api.in_flight += 1
            self.api.max_in_flight = max(self.api.max_in_flight, self.api.in_flight)
            self.api.pending.append(request)
            return NOT_DONE_YET
        self.api.routes["/api/v1/nodes/slow"] = slow
        client = self.client(url)
        calls = [client.get(NODES, "slow") for _ in range(12)]
        yield poll_until(lambda: self.api.in_flight == 12)
        for request in list(self.api.pending):
            request.setHeader(b"content-type", b"application/json")
            request.write(b'{"kind":"Node"}')
            request.finish()
        results = yield defer.gatherResults(calls)
        self.assertEqual(results, [{"kind": "Node"}] * 12)
        self.assertEqual(self.api.max_in_flight, 12)

    def test_plain_http_needs_insecure(self):
        with self.assertRaises(ValueError):
            KubeClient(reactor, ClientConfig(server="http://127.0.0.1:1"))

    @defer.inlineCallbacks
    def test_token_file_is_reread_when_it_changes(self):
        url = self.start_fake()
        self.api.routes["/api/v1/nodes/n"] = answer(200, {"kind": "Node"})
        token_file = os.path.join(self.mktemp() + "-token")
        with open(token_file, "w") as f:
            f.write("first\n")
        client = self.client(url, token_file=token_file)
        yield client.get(NODES, "n")
        with open(token_file, "w") as f:
            f.write("second-token")
        os.utime(token_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        yield client.get(NODES, "n")
        self.assertEqual([s["headers"]["authorization"] for s in self.api.seen],
                         ["Bearer first", "Bearer second-token"])

    @defer.inlineCallbacks
    def test_close_fails_requests_in_flight_and_closes_their_connections(self):
        url = self.start_fake()
        closed = []

        def hang(request):
            self.api.pending.append(request)
            request.notifyFinish().addErrback(closed.append)
            return NOT_DONE_YET
        self.api.routes["/api/v1/nodes/slow"] = hang
        client = self.client(url)
        call = client.get(NODES, "slow")
        yield poll_until(lambda: self.api.pending)
        yield client.close()
        failure = yield self.assertFailure(call, errors.ConnectionFailed)
        self.assertIn("client closed", str(failure))
        yield poll_until(lambda: closed)

    @defer.inlineCallbacks
    def test_closed_client_refuses_requests(self):
        url = self.start_fake()
        client = self.client(url)
        yield client.close()
        yield self.assertFailure(client.get(NODES, "n"), errors.ConnectionFailed)


def tls_server_context(ca, server_pair):
    with open(ca.ca_file, "rb") as f:
        ca_cert = ssl.Certificate.loadPEM(f.read())
    with open(server_pair.cert_file, "rb") as f:
        cert_pem = f.read()
    with open(server_pair.key_file, "rb") as f:
        key_pem = f.read()
    server = ssl.PrivateCertificate.loadPEM(cert_pem + key_pem)
    # Verifies client certificates against the CA when offered; does not require one.
    return ssl.CertificateOptions(
        privateKey=server.privateKey.original, certificate=server.original,
        verify=True, caCerts=[ca_cert.original], requireCertificate=False)


class ClientTLSTests(ClientFixture, unittest.TestCase):
    def setUp(self):
        self.ca = TestCA(self.mktemp())
        self.url = self.start_fake(tls_server_context(self.ca, self.ca.server_pair("apiserver")))
        self.api.routes["/api/v1/nodes/n"] = answer(200, {"kind": "Node"})

    @defer.inlineCallbacks
    def test_client_certificate_is_presented_and_reloaded_after_rotation(self):
        pair = self.ca.client_pair("hub-a", "system:node:a", ["system:nodes"])
        client = self.client(self.url, ca_file=self.ca.ca_file,
                             cert_file=pair.cert_file, key_file=pair.key_file)
        yield client.get(NODES, "n")
        self.assertEqual(self.api.subjects, ["system:node:a"])
        rotated = self.ca.client_pair("hub-b", "system:node:b", ["system:nodes"])
        for src, dst in ((rotated.cert_file, pair.cert_file), (rotated.key_file, pair.key_file)):
            with open(src, "rb") as f, open(dst + ".tmp", "wb") as g:
                g.write(f.read())
            os.replace(dst + ".tmp", dst)
        yield client.drop_connections()
        yield client.get(NODES, "n")
        self.assertEqual(self.api.subjects, ["system:node:a", "system:node:b"])

    @defer.inlineCallbacks
    def test_watch_over_tls_batches_reads_and_ends_cleanly(self):
        lines = [watch_line("ADDED", cm(f"o{i}", i)) for i in range(1, 201)]
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = stream_handler(self.api, lines)
        pair = self.ca.client_pair("hub-w", "system:node:w", ["system:nodes"])
        client = self.client(self.url, ca_file=self.ca.ca_file,
                             cert_file=pair.cert_file, key_file=pair.key_file)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(o["metadata"]["name"]), namespace="ns")
        self.assertIsNone((yield w.done))
        self.assertEqual(seen, [f"o{i}" for i in range(1, 201)])
        self.assertIsNotNone(w._body_batcher)
        self.assertLess(w._body_batcher.reads, 100)

    @defer.inlineCallbacks
    def test_half_written_certificate_keeps_the_previous_one(self):
        pair = self.ca.client_pair("hub-c", "system:node:c")
        client = self.client(self.url, ca_file=self.ca.ca_file,
                             cert_file=pair.cert_file, key_file=pair.key_file)
        yield client.get(NODES, "n")
        with open(pair.cert_file, "r+b") as f:
            f.truncate(40)
        yield client.drop_connections()
        yield client.get(NODES, "n")
        self.assertEqual(self.api.subjects, ["system:node:c", "system:node:c"])
        self.assertEqual(client.tls.reloads, 1)

    @defer.inlineCallbacks
    def test_server_not_signed_by_the_ca_is_connection_failed(self):
        other = TestCA(self.mktemp())
        client = self.client(self.url, ca_file=other.ca_file)
        yield self.assertFailure(client.get(NODES, "n"), errors.ConnectionFailed)
        self.assertEqual(self.api.seen, [])

    @defer.inlineCallbacks
    def test_insecure_skips_verification(self):
        client = self.client(self.url, insecure=True)
        got = yield client.get(NODES, "n")
        self.assertEqual(got, {"kind": "Node"})

    @defer.inlineCallbacks
    def test_kubeconfig_with_inline_data_and_token(self):
        pair = self.ca.client_pair("kc", "kc-user")
        path = os.path.join(self.ca.directory, "kubeconfig")

        def b64(p):
            with open(p, "rb") as f:
                return base64.b64encode(f.read()).decode()
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
current-context: pool
contexts:
- name: pool
  context: {{cluster: c1, user: u1}}
clusters:
- name: c1
  cluster:
    server: {self.url}
    certificate-authority-data: {b64(self.ca.ca_file)}
users:
- name: u1
  user:
    client-certificate-data: {b64(pair.cert_file)}
    client-key-data: {b64(pair.key_file)}
    token: kc-token
""")
        config = ClientConfig.from_kubeconfig(path)
        self.assertNotIn("kc-token", repr(config))
        client = KubeClient(reactor, config)
        self.addCleanup(client.close)
        yield client.get(NODES, "n")
        self.assertEqual(self.api.subjects, ["kc-user"])
        self.assertEqual(self.api.seen[0]["headers"]["authorization"], "Bearer kc-token")

    def test_kubeconfig_with_relative_files(self):
        directory = self.ca.directory
        path = os.path.join(directory, "kc2")
        with open(path, "w") as f:
            f.write(f"""current-context: x
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
clusters: [{{name: c, cluster: {{server: "{self.url}", certificate-authority: ca.crt}}}}]
users: [{{name: u, user: {{tokenFile: tok}}}}]
""")
        config = ClientConfig.from_kubeconfig(path)
        self.assertEqual(config.ca_file, os.path.abspath(self.ca.ca_file))
        self.assertEqual(config.token_file, os.path.join(os.path.abspath(directory), "tok"))
        self.assertEqual(config.server, self.url)

    def test_broken_kubeconfig_and_key_mismatch_are_clear_errors(self):
        path = os.path.join(self.ca.directory, "bad")
        with open(path, "w") as f:
            f.write("current-context: nope\ncontexts: []\n")
        with self.assertRaises(KubeconfigError) as caught:
            ClientConfig.from_kubeconfig(path)
        self.assertIn("nope", str(caught.exception))
        pair = self.ca.client_pair("m", "m")
        with self.assertRaises(TLSConfigError):
            KubeClient(reactor, ClientConfig(server=self.url, cert_file=pair.cert_file))


def watch_line(kind, obj):
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def cm(name, rv):
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


def stream_handler(api, chunks, end="finish"):
    """A watch handler that writes ``chunks`` (one HTTP chunk each) then finishes,
    cuts or stays open."""
    def handler(request):
        request.setHeader(b"content-type", b"application/json")
        for chunk in chunks:
            request.write(chunk)
        if end == "finish":
            request.finish()
        elif end == "cut":
            reactor.callLater(0.01, request.channel.transport.abortConnection)
        else:
            api.open_streams.append(request.channel.transport)
            api.pending.append(request)
        return NOT_DONE_YET
    return handler


class ClientWatchTests(ClientFixture, unittest.TestCase):
    def stream(self, chunks, end="finish"):
        return stream_handler(self.api, chunks, end)

    @defer.inlineCallbacks
    def test_events_split_across_writes_arrive_whole_and_params_are_sent(self):
        url = self.start_fake()
        data = b"".join([watch_line("ADDED", cm("a", 1)), watch_line("MODIFIED", cm("a", 2)),
                         watch_line("BOOKMARK", {"metadata": {"resourceVersion": "3"}}),
                         watch_line("DELETED", cm("a", 4))])
        chunks = [data[:7], data[7:60], data[60:61], data[61:]]
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(chunks)
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append((t, o["metadata"]["resourceVersion"])),
                         namespace="ns", resource_version="0", label_selector="a=b",
                         timeout_seconds=30)
        result = yield w.done
        self.assertIsNone(result)
        self.assertEqual(seen, [("ADDED", "1"), ("MODIFIED", "2"), ("BOOKMARK", "3"), ("DELETED", "4")])
        self.assertEqual(self.api.seen[0]["args"], {
            "watch": "1", "resourceVersion": "0", "labelSelector": "a=b",
            "allowWatchBookmarks": "true", "timeoutSeconds": "30"})

    @defer.inlineCallbacks
    def test_error_event_410_is_gone(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(
            [watch_line("ADDED", cm("a", 1)), watch_line("ERROR", status(410, "Expired", "too old"))],
            end="open")
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(t), namespace="ns")
        failure = yield self.assertFailure(w.done, errors.Gone)
        self.assertEqual(failure.code, 410)
        self.assertEqual(seen, ["ADDED"])

    @defer.inlineCallbacks
    def test_cut_in_the_middle_of_a_line_is_connection_failed(self):
        url = self.start_fake()
        line = watch_line("MODIFIED", cm("b", 2))
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(
            [watch_line("ADDED", cm("a", 1)), line[:20]], end="cut")
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(t), namespace="ns")
        yield self.assertFailure(w.done, errors.ConnectionFailed)
        self.assertEqual(seen, ["ADDED"])

    @defer.inlineCallbacks
    def test_cancel_closes_the_connection_and_done_fires_none(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(
            [watch_line("ADDED", cm("a", 1))], end="open")
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(t), namespace="ns")
        yield poll_until(lambda: seen)
        request = self.api.pending[0]
        lost = request.notifyFinish()
        w.cancel()
        result = yield w.done
        self.assertIsNone(result)
        yield self.assertFailure(lost, Exception)

    @defer.inlineCallbacks
    def test_cancel_before_the_answer(self):
        url = self.start_fake()

        def hang(request):
            self.api.pending.append(request)
            return NOT_DONE_YET
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = hang
        client = self.client(url)
        w = client.watch(CONFIGMAPS, lambda t, o: None, namespace="ns")
        yield poll_until(lambda: self.api.pending)
        w.cancel()
        self.assertIsNone((yield w.done))

    @defer.inlineCallbacks
    def test_watch_refused_with_status_is_typed(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = answer(410, status(410, "Expired"))
        client = self.client(url)
        w = client.watch(CONFIGMAPS, lambda t, o: None, namespace="ns", resource_version="1")
        yield self.assertFailure(w.done, errors.Gone)

    @defer.inlineCallbacks
    def test_silent_stream_ends_with_timeout_after_idle_timeout(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(
            [watch_line("ADDED", cm("a", 1))], end="open")
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(t), namespace="ns",
                         idle_timeout=0.2)
        yield poll_until(lambda: self.api.pending)
        lost = self.api.pending[0].notifyFinish()
        lost.addErrback(lambda f: None)
        started = time.monotonic()
        failure = yield self.assertFailure(w.done, errors.Timeout)
        self.assertGreaterEqual(time.monotonic() - started, 0.1)
        self.assertIn("nothing received", str(failure))
        self.assertEqual(seen, ["ADDED"])
        yield lost

    @defer.inlineCallbacks
    def test_close_cancels_running_watches(self):
        url = self.start_fake()
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream([b"\n"], end="open")
        client = self.client(url)
        w = client.watch(CONFIGMAPS, lambda t, o: None, namespace="ns")
        yield poll_until(lambda: self.api.pending)
        yield client.close()
        self.assertTrue(w.done.called)

    @defer.inlineCallbacks
    def test_events_written_together_arrive_in_few_reads_in_order(self):
        url = self.start_fake()
        lines = [watch_line("ADDED", cm(f"o{i}", i)) for i in range(1, 301)]
        lines.append(watch_line("BOOKMARK", {"metadata": {"resourceVersion": "301"}}))
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = self.stream(lines)
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append((t, o["metadata"]["resourceVersion"])),
                         namespace="ns")
        self.assertIsNone((yield w.done))
        self.assertEqual(seen, [("ADDED", str(i)) for i in range(1, 301)] + [("BOOKMARK", "301")])
        self.assertEqual(w.events, 301)
        # One call per read, not one per chunk (each write above is its own chunk).
        self.assertIsNotNone(w._body_batcher)
        self.assertLess(w._body_batcher.reads, 100)

    @defer.inlineCallbacks
    def test_body_with_content_length_is_read_without_the_batcher(self):
        url = self.start_fake()
        body = b"".join(watch_line("ADDED", cm(f"o{i}", i)) for i in range(1, 4))

        def handler(request):
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-length", b"%d" % len(body))
            request.write(body)
            request.finish()
            return NOT_DONE_YET
        self.api.routes["/api/v1/namespaces/ns/configmaps"] = handler
        client = self.client(url)
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append(o["metadata"]["name"]), namespace="ns")
        self.assertIsNone((yield w.done))
        self.assertEqual(seen, ["o1", "o2", "o3"])
        self.assertIsNone(w._body_batcher)


class TestServerFixture:
    """The Kubernetes API test server, started per test and stopped in cleanup."""

    @defer.inlineCallbacks
    def start_server(self, tls_dir=None, **kwargs):
        from yurtcoord.sim.apiserver import KubeAPIServer

        self.server = KubeAPIServer(reactor, tls_dir=tls_dir, **kwargs)
        url = yield self.server.start(port=0)
        self.addCleanup(self.server.stop)
        return url


class ClientAgainstTestServerTests(TestServerFixture, ClientFixture, unittest.TestCase):
    @defer.inlineCallbacks
    def test_crud_round_trip_and_error_types(self):
        url = yield self.start_server()
        client = self.client(url)
        created = yield client.create(CONFIGMAPS, {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x"}},
            "data": {"k": "v"}})
        rv = created["metadata"]["resourceVersion"]
        got = yield client.get(CONFIGMAPS, "a", "ns")
        self.assertEqual(got, created)
        yield client.create(CONFIGMAPS, {"metadata": {"name": "b", "namespace": "ns"}})
        listed = yield client.list(CONFIGMAPS, "ns", label_selector="app=x")
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["a"])
        self.assertTrue(listed["metadata"]["resourceVersion"])
        by_field = yield client.list(CONFIGMAPS, field_selector="metadata.name=b")
        self.assertEqual([i["metadata"]["name"] for i in by_field["items"]], ["b"])

        got["data"]["k"] = "v2"
        updated = yield client.update(CONFIGMAPS, got)
        self.assertNotEqual(updated["metadata"]["resourceVersion"], rv)
        self.assertEqual(self.server.store.get(CONFIGMAPS, "a", "ns")["data"], {"k": "v2"})

        yield self.assertFailure(client.update(CONFIGMAPS, got), errors.Conflict)
        dup = yield self.assertFailure(
            client.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": "ns"}}),
            errors.AlreadyExists)
        self.assertEqual(dup.code, 409)
        yield self.assertFailure(client.get(CONFIGMAPS, "zzz", "ns"), errors.NotFound)

        yield client.delete(CONFIGMAPS, "a", "ns")
        self.assertIsNone(self.server.store.get(CONFIGMAPS, "a", "ns"))
        yield self.assertFailure(client.delete(CONFIGMAPS, "a", "ns"), errors.NotFound)

        node = yield client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        self.assertNotIn("namespace", node["metadata"])
        nodes = yield client.list(NODES)
        self.assertEqual([n["metadata"]["name"] for n in nodes["items"]], ["n1"])

    @defer.inlineCallbacks
    def test_faults_500_garbage_and_latency(self):
        url = yield self.start_server()
        self.server.store.create(NODES, {"metadata": {"name": "n1"}})
        client = self.client(url, timeout=0.3)
        self.server.faults.fail_next(1, code=500)
        yield self.assertFailure(client.get(NODES, "n1"), errors.ServerError)
        self.server.faults.garbage_next(1)
        failure = yield self.assertFailure(client.get(NODES, "n1"), errors.ServerError)
        self.assertIn("not JSON from", str(failure))
        self.server.faults.latency = 2.0
        yield self.assertFailure(client.get(NODES, "n1"), errors.Timeout)
        self.server.faults.latency = 0.0
        got = yield client.get(NODES, "n1")
        self.assertEqual(got["metadata"]["name"], "n1")

    @defer.inlineCallbacks
    def test_server_down_is_connection_failed_then_recovers(self):
        url = yield self.start_server()
        self.server.store.create(NODES, {"metadata": {"name": "n1"}})
        client = self.client(url)
        yield client.get(NODES, "n1")
        yield self.server.faults.down()
        yield self.assertFailure(client.get(NODES, "n1"), errors.ConnectionFailed)
        yield self.server.faults.up()
        got = yield client.get(NODES, "n1")
        self.assertEqual(got["metadata"]["name"], "n1")

    @defer.inlineCallbacks
    def test_tls_with_client_certificate(self):
        tls_dir = self.mktemp()
        ca = TestCA(tls_dir)
        ca.server_pair("server")
        url = yield self.start_server(tls_dir=tls_dir)
        pair = ca.client_pair("hub", "system:node:edge-1", ["system:nodes"])
        client = self.client(url, ca_file=ca.ca_file, cert_file=pair.cert_file,
                             key_file=pair.key_file)
        created = yield client.create(CONFIGMAPS, {"metadata": {"name": "t", "namespace": "ns"}})
        self.assertEqual(created["metadata"]["name"], "t")
        self.assertIn("CN=system:node:edge-1", self.server.client_subjects[0])
        # Without a client certificate the server refuses the handshake.
        anonymous = self.client(url, ca_file=ca.ca_file)
        yield self.assertFailure(anonymous.get(CONFIGMAPS, "t", "ns"), errors.ConnectionFailed)

    @defer.inlineCallbacks
    def test_watch_sees_changes_and_410_after_compaction(self):
        url = yield self.start_server()
        client = self.client(url)
        first = self.server.store.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": "ns"}})
        seen = []
        w = client.watch(CONFIGMAPS, lambda t, o: seen.append((t, o["metadata"].get("name"))),
                         namespace="ns", resource_version=first["metadata"]["resourceVersion"],
                         allow_bookmarks=False)
        yield poll_until(lambda: self.server.open_watches == 1)
        self.server.store.create(CONFIGMAPS, {"metadata": {"name": "b", "namespace": "ns"}})
        self.server.store.delete(CONFIGMAPS, "a", "ns")
        yield poll_until(lambda: len(seen) == 2)
        self.assertEqual(seen, [("ADDED", "b"), ("DELETED", "a")])
        self.server.faults.cut_watches(mid_line=True)
        yield self.assertFailure(w.done, errors.ConnectionFailed)
        self.server.store.compact()
        old = client.watch(CONFIGMAPS, lambda t, o: None, namespace="ns",
                           resource_version=first["metadata"]["resourceVersion"])
        yield self.assertFailure(old.done, errors.Gone)
