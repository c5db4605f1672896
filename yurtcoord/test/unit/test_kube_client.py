"""KubeClient on a memory reactor: a request whose connection never completes ends as
a timeout or a cancellation, never as Twisted's ``ConnectingCancelledError``."""

import json

from twisted.internet import defer
from twisted.trial import unittest

from yurtcoord.kube import errors
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import NODES


class ConnectingCancelledTests(unittest.TestCase):
    """A request whose connection never completes (a cut link drops the SYN) and is
    cancelled or times out while still connecting: Twisted then fails it with
    ``ConnectingCancelledError``, which is neither a cancellation nor a typed error
    unless the client says what it is."""

    def setUp(self):
        from twisted.internet.testing import MemoryReactorClock
        self.reactor = MemoryReactorClock()
        self.client = KubeClient(self.reactor,
                                 ClientConfig(server="http://127.0.0.1:6443", timeout=2.0,
                                              insecure=True))

    def test_the_client_timeout_while_connecting_is_a_timeout(self):
        d = self.client.get(NODES, "edge-1")
        self.assertEqual(len(self.reactor.tcpClients), 1)
        self.reactor.advance(2.0)
        self.failureResultOf(d, errors.Timeout)

    def test_a_cancel_while_connecting_is_a_cancellation(self):
        d = self.client.get(NODES, "edge-1")
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)

    def test_an_attempt_timeout_of_the_lease_writer_while_connecting_is_a_timeout(self):
        from yurtcoord.kube.leasewriter import LeaseWriter
        writer = LeaseWriter(self.reactor, self.client, "kube-node-lease", "edge-1",
                             attempts=1, attempt_timeout=0.5)
        d = writer.write(lambda current: None)
        self.reactor.advance(0.5)
        self.failureResultOf(d, defer.TimeoutError)


class RequestsSentTests(unittest.TestCase):
    """What goes on the wire for a read and for a write, on a memory reactor: the
    request line, the headers and the body, and the answer read back."""

    def setUp(self):
        from twisted.internet.testing import MemoryReactorClock
        self.reactor = MemoryReactorClock()
        self.token = self.mktemp()
        with open(self.token, "w", encoding="utf-8") as f:
            f.write("first")
        self.client = KubeClient(self.reactor,
                                 ClientConfig(server="http://127.0.0.1:6443", timeout=2.0,
                                              insecure=True, token_file=self.token))
        self.addCleanup(self.client.close)

    def exchange(self, d, answer=b'{"kind":"Lease"}'):
        """Connect the request's pending connection, answer it, and return what was
        sent as (request line, {header: [values]}, body) and the answer's result."""
        from twisted.internet.testing import StringTransport
        _host, _port, factory, _timeout, _bind = self.reactor.tcpClients.pop()
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        head, _, body = transport.value().partition(b"\r\n\r\n")
        line, *header_lines = head.split(b"\r\n")
        headers = {}
        for header in header_lines:
            name, _, value = header.partition(b":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        # Each answer closes its connection: the next request connects anew.
        protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                              % (len(answer), answer))
        return line, headers, body, self.successResultOf(d)

    def test_a_write_asks_for_no_compression_and_a_read_does(self):
        from yurtcoord.kube.gvr import LEASES
        lease = {"metadata": {"name": "edge-1", "namespace": "kube-node-lease",
                              "resourceVersion": "7"}, "spec": {"holderIdentity": "edge-1"}}
        line, headers, body, result = self.exchange(
            self.client.update(LEASES, lease, namespace="kube-node-lease"))
        self.assertEqual(line, b"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/"
                               b"leases/edge-1 HTTP/1.1")
        self.assertEqual(result, {"kind": "Lease"})
        self.assertEqual(json.loads(body), lease)
        self.assertEqual(headers, {
            b"accept": [b"application/json"], b"user-agent": [b"yurtcoord"],
            b"content-type": [b"application/json"], b"authorization": [b"Bearer first"],
            b"host": [b"127.0.0.1:6443"], b"content-length": [b"%d" % len(body)]})
        line, headers, body, result = self.exchange(self.client.get(NODES, "edge-1"))
        self.assertEqual(line, b"GET /api/v1/nodes/edge-1 HTTP/1.1")
        self.assertEqual(headers[b"accept-encoding"], [b"gzip"])
        self.assertNotIn(b"content-type", headers)
        self.assertEqual(body, b"")

    def test_headers_follow_the_token_file(self):
        from yurtcoord.kube.gvr import LEASES
        lease = {"metadata": {"name": "edge-1", "namespace": "kube-node-lease"}}
        sent = [self.exchange(self.client.update(LEASES, lease))[1][b"authorization"]]
        sent.append(self.exchange(self.client.update(LEASES, lease))[1][b"authorization"])
        with open(self.token, "w", encoding="utf-8") as f:
            f.write("second, longer")
        sent.append(self.exchange(self.client.update(LEASES, lease))[1][b"authorization"])
        sent.append(self.exchange(self.client.get(NODES, "a"))[1][b"authorization"])
        self.assertEqual(sent, [[b"Bearer first"], [b"Bearer first"],
                                [b"Bearer second, longer"], [b"Bearer second, longer"]])

    def test_a_path_is_escaped_only_where_it_needs_it(self):
        from yurtcoord.kube.gvr import CONFIGMAPS
        line = self.exchange(self.client.get(CONFIGMAPS, "b c\u00e9", "ns1"))[0]
        self.assertEqual(line, b"GET /api/v1/namespaces/ns1/configmaps/b%20c%C3%A9 HTTP/1.1")
        line = self.exchange(self.client.get(CONFIGMAPS, "a-b.c_~%41", "ns1"))[0]
        self.assertEqual(line, b"GET /api/v1/namespaces/ns1/configmaps/a-b.c_~%2541 HTTP/1.1")

    def test_a_write_to_a_server_with_a_path_and_the_default_port(self):
        from yurtcoord.kube.gvr import LEASES
        client = KubeClient(self.reactor, ClientConfig(server="http://127.0.0.1/k8s/",
                                                       insecure=True))
        self.addCleanup(client.close)
        lease = {"metadata": {"name": "edge 1", "namespace": "kube-node-lease"}}
        line, headers, _body, _result = self.exchange(client.update(LEASES, lease))
        self.assertEqual(line, b"PUT /k8s/apis/coordination.k8s.io/v1/namespaces/"
                               b"kube-node-lease/leases/edge%201 HTTP/1.1")
        self.assertEqual(headers[b"host"], [b"127.0.0.1"])
        self.assertEqual(self.reactor.tcpClients, [])
        line, headers, _body, _result = self.exchange(client.delete(LEASES, "a", "ns"))
        self.assertEqual(line, b"DELETE /k8s/apis/coordination.k8s.io/v1/namespaces/ns/"
                               b"leases/a HTTP/1.1")
        line, headers, _body, _result = self.exchange(client.get(LEASES, "a", "ns"))
        self.assertEqual(line, b"GET /k8s/apis/coordination.k8s.io/v1/namespaces/ns/"
                               b"leases/a HTTP/1.1")
        self.assertEqual(headers[b"host"], [b"127.0.0.1"])

    def test_writes_share_the_reads_connections(self):
        from yurtcoord.kube.gvr import LEASES
        from twisted.internet.error import ConnectionDone
        from twisted.internet.testing import StringTransport
        from twisted.python.failure import Failure
        d = self.client.get(NODES, "a")
        _host, _port, factory, _timeout, _bind = self.reactor.tcpClients.pop()
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(self.successResultOf(d), {})
        transport.clear()
        written = self.client.update(LEASES, {"metadata": {"name": "a", "namespace": "ns"}})
        self.assertEqual(self.reactor.tcpClients, [], "the pooled connection is used")
        self.assertTrue(transport.value().startswith(b"PUT /apis/"))
        protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(self.successResultOf(written), {})
        protocol.connectionLost(Failure(ConnectionDone()))  # before the client closes
