"""The test PKI's certificates pass a strict X.509 verifier in a real TLS handshake.

Python 3.13's ``ssl`` verifies with ``VERIFY_X509_STRICT`` by default, and so do the
``kubernetes`` client and the etcd fixture's health check built on it. These tests set
the flag explicitly, so they hold the test PKI to RFC 5280 on every supported Python:
a TLS handshake over loopback with both sides verifying.
"""

import os
import select
import socket
import ssl
import time

from twisted.trial import unittest

from yurtcoord.sim.pki import TestCA

_HANDSHAKE_DEADLINE = 30.0
X509_V_ERR_INVALID_PURPOSE = 26  # OpenSSL's "unsuitable certificate purpose"


def strict_server_context(ca, pair):
    """A server context that presents ``pair`` and requires a client certificate
    from ``ca``, verifying strictly."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pair.cert_file, pair.key_file)
    ctx.load_verify_locations(cafile=ca.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


def strict_client_context(ca, pair=None):
    """A client context trusting ``ca`` (hostname checked), presenting ``pair`` if
    given, verifying strictly."""
    ctx = ssl.create_default_context(cafile=ca.ca_file)
    if pair is not None:
        ctx.load_cert_chain(pair.cert_file, pair.key_file)
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


def handshake(server_ctx, client_ctx, server_hostname="localhost"):
    """Connect ``client_ctx`` to ``server_ctx`` over 127.0.0.1 and run both sides of
    the TLS handshake in this thread. Returns ``(server_side, client_side)`` wrapped
    sockets (closed by the caller); raises the first side's ``ssl.SSLError``."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        raw_client = socket.create_connection(listener.getsockname(), timeout=5)
        raw_server, _ = listener.accept()
    finally:
        listener.close()
    server = server_ctx.wrap_socket(raw_server, server_side=True,
                                    do_handshake_on_connect=False)
    client = client_ctx.wrap_socket(raw_client, server_hostname=server_hostname,
                                    do_handshake_on_connect=False)
    sides = [server, client]
    for s in sides:
        s.setblocking(False)
    pending = list(sides)
    deadline = time.monotonic() + _HANDSHAKE_DEADLINE
    try:
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"TLS handshake not done within {_HANDSHAKE_DEADLINE}s")
            waiting = []
            for s in list(pending):
                try:
                    s.do_handshake()
                    pending.remove(s)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    waiting.append(s)
            if waiting:
                select.select(waiting, [], [], 0.5)
    except BaseException:
        for s in sides:
            s.close()
        raise
    return server, client


class StrictHandshakeTests(unittest.TestCase):

    def setUp(self):
        self.ca = TestCA(os.path.abspath(self.mktemp()))
        self.server_pair = self.ca.server_pair("server")
        self.client_pair = self.ca.client_pair("client", "system:node:edge-1",
                                               ["system:nodes"])

    def test_mutual_tls_handshake_verifies_strictly(self):
        self.assertTrue(ssl.VERIFY_X509_STRICT
                        & strict_client_context(self.ca).verify_flags)
        server, client = handshake(strict_server_context(self.ca, self.server_pair),
                                   strict_client_context(self.ca, self.client_pair))
        self.addCleanup(server.close)
        self.addCleanup(client.close)
        seen_by_server = dict(rdn[0] for rdn in server.getpeercert()["subject"])
        self.assertEqual(seen_by_server["commonName"], "system:node:edge-1")
        self.assertEqual(seen_by_server["organizationName"], "system:nodes")
        seen_by_client = client.getpeercert()
        self.assertIn(("IP Address", "127.0.0.1"), seen_by_client["subjectAltName"])
        self.assertIn(("DNS", "localhost"), seen_by_client["subjectAltName"])
        # Data crosses once both sides have verified each other.
        client.setblocking(True)
        server.setblocking(True)
        client.settimeout(_HANDSHAKE_DEADLINE)
        server.settimeout(_HANDSHAKE_DEADLINE)
        client.sendall(b"ping")
        self.assertEqual(server.recv(4), b"ping")

    def test_server_certificate_verifies_by_ip_address(self):
        server, client = handshake(strict_server_context(self.ca, self.server_pair),
                                   strict_client_context(self.ca, self.client_pair),
                                   server_hostname="127.0.0.1")
        self.addCleanup(server.close)
        self.addCleanup(client.close)
        self.assertIsNotNone(client.getpeercert())

    def test_client_certificate_cannot_serve(self):
        """A client pair carries only the clientAuth usage: a verifier checking the
        server purpose refuses it."""
        impostor = self.ca.issue("impostor", "localhost", client=True)
        with self.assertRaises(ssl.SSLCertVerificationError) as caught:
            server, client = handshake(strict_server_context(self.ca, impostor),
                                       strict_client_context(self.ca, self.client_pair))
            server.close()
            client.close()
        self.assertEqual(caught.exception.verify_code, X509_V_ERR_INVALID_PURPOSE,
                         caught.exception.verify_message)

    def test_other_ca_is_refused(self):
        other = TestCA(os.path.abspath(self.mktemp()))
        with self.assertRaises(ssl.SSLCertVerificationError):
            server, client = handshake(strict_server_context(self.ca, self.server_pair),
                                       strict_client_context(other, None))
            server.close()
            client.close()
