"""Certificate manager end to end: a TLS cloud API server holds the certs Secret,
and a TLS server that requires client certificates must see the new client
certificate on new connections, as must a client whose certificate files appear and
vanish while it is in use."""

import os
import shutil
import stat

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.certs import CERTS_SECRET_NAME, CertificateClient, CertManager
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import ConnectionFailed, NotFound
from yurtcoord.kube.gvr import NAMESPACES, SECRETS
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.certsecrets import NAMESPACE, Bundle, b64, secret
from yurtcoord.testing.poll import poll_until
from yurtcoord.sim.pki import TestCA


class CertManagerLiveTests(unittest.TestCase):
    """The Secret lives in a TLS cloud API server; a second TLS server (the
    coordinator apiserver) must see the client certificate of the current files."""

    @defer.inlineCallbacks
    def setUp(self):
        base = self.mktemp()
        tls_dir = os.path.join(base, "tls")
        self.ca = TestCA(tls_dir)
        self.ca.server_pair("server")
        cloud_pair = self.ca.client_pair("cloud-client", "system:node:edge-1", ["system:nodes"])
        self.pki_dir = os.path.join(base, "pki")
        self.cloud = KubeAPIServer(reactor, tls_dir=tls_dir)
        self.coordinator = KubeAPIServer(reactor, tls_dir=tls_dir)
        cloud_url = yield self.cloud.start()
        self.coordinator_url = yield self.coordinator.start()
        self.addCleanup(self.cloud.stop)
        self.addCleanup(self.coordinator.stop)
        self.cloud_client = KubeClient(reactor, ClientConfig(
            server=cloud_url, ca_file=self.ca.ca_file, cert_file=cloud_pair.cert_file,
            key_file=cloud_pair.key_file))
        self.addCleanup(self.cloud_client.close)
        self.changes = 0
        self.manager = CertManager(reactor, self.cloud_client, self.pki_dir, NAMESPACE,
                                   on_change=self.changed)
        self.addCleanup(self.manager.stop)

    def changed(self):
        self.changes += 1

    def pki_file(self, name):
        try:
            with open(os.path.join(self.pki_dir, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    @defer.inlineCallbacks
    def subject_of_new_connection(self, client):
        """Make a request on a fresh connection; the subject the server saw."""
        yield client.drop_connections()
        before = len(self.coordinator.client_subjects)
        yield client.get(NAMESPACES, "default")
        self.assertEqual(len(self.coordinator.client_subjects), before + 1)
        return self.coordinator.client_subjects[-1]

    @defer.inlineCallbacks
    def test_rotation_reaches_new_connections_and_deletion_drops_certs(self):
        first, second = Bundle(self.ca, "one"), Bundle(self.ca, "two")
        self.coordinator.store.create(NAMESPACES, {"metadata": {"name": "default"}})
        self.cloud.store.create(SECRETS, secret(first.data()))
        yield self.manager.start()
        yield poll_until(lambda: self.manager.ready, what="certs written")
        for name, content in first.files().items():
            self.assertEqual(self.pki_file(name), content)
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(self.pki_dir, name)).st_mode), 0o600)

        hub_pair = self.manager.yurthub_client_pair
        client = KubeClient(reactor, ClientConfig(
            server=self.coordinator_url, ca_file=self.manager.ca_file,
            cert_file=hub_pair.cert_file, key_file=hub_pair.key_file))
        self.addCleanup(client.close)
        subject = yield self.subject_of_new_connection(client)
        self.assertEqual(subject, "CN=system:yurthub:one,O=openyurt:yurthub")
        proxy_pair = self.manager.node_lease_proxy_pair
        proxy = KubeClient(reactor, ClientConfig(
            server=self.coordinator_url, ca_file=self.manager.ca_file,
            cert_file=proxy_pair.cert_file, key_file=proxy_pair.key_file))
        self.addCleanup(proxy.close)
        subject = yield self.subject_of_new_connection(proxy)
        self.assertEqual(subject, "CN=system:node-lease-proxy:one")

        stored = self.cloud.store.get(SECRETS, CERTS_SECRET_NAME, NAMESPACE)
        stored["data"] = second.data()
        self.cloud.store.update(SECRETS, stored)
        yield poll_until(
            lambda: self.pki_file("node-lease-proxy-client.key") == second.proxy_key,
            what="rotated certs written")
        subject = yield self.subject_of_new_connection(client)
        self.assertEqual(subject, "CN=system:yurthub:two,O=openyurt:yurthub")
        subject = yield self.subject_of_new_connection(proxy)
        self.assertEqual(subject, "CN=system:node-lease-proxy:two")

        # A malformed pair is rejected; the certificate in use stays.
        rejected = self.manager.rejected
        stored = self.cloud.store.get(SECRETS, CERTS_SECRET_NAME, NAMESPACE)
        stored["data"]["yurt-coordinator-yurthub-client.key"] = b64(first.hub_key)
        self.cloud.store.update(SECRETS, stored)
        yield poll_until(lambda: self.manager.rejected > rejected,
                         what="malformed pair rejected")
        self.assertEqual(self.pki_file("yurt-coordinator-yurthub-client.key"), second.hub_key)
        subject = yield self.subject_of_new_connection(client)
        self.assertEqual(subject, "CN=system:yurthub:two,O=openyurt:yurthub")

        self.cloud.store.delete(SECRETS, CERTS_SECRET_NAME, NAMESPACE)
        yield poll_until(lambda: not self.manager.ready, what="certs dropped")
        self.assertEqual(os.listdir(self.pki_dir), [])
        self.assertGreaterEqual(self.changes, 3)


class CertificateClientTests(unittest.TestCase):
    """A client whose certificate files appear (and vanish) while it is in use, against
    a TLS API server that requires a client certificate."""

    @defer.inlineCallbacks
    def setUp(self):
        base = self.mktemp()
        tls_dir = os.path.join(base, "tls")
        self.ca = TestCA(tls_dir)
        self.ca.server_pair("server")
        self.pair = self.ca.client_pair("hub", "system:node:edge-1", ["openyurt:yurthub"])
        self.pki_dir = os.path.join(base, "pki")
        os.makedirs(self.pki_dir)
        self.files = {name: os.path.join(self.pki_dir, name)
                      for name in ("ca.crt", "client.crt", "client.key")}
        self.server = KubeAPIServer(reactor, tls_dir=tls_dir)
        url = yield self.server.start()
        self.addCleanup(self.server.stop)
        self.client = CertificateClient(
            reactor,
            lambda: ClientConfig(server=url, ca_file=self.files["ca.crt"],
                                 cert_file=self.files["client.crt"],
                                 key_file=self.files["client.key"], timeout=5),
            self.files.values())
        self.addCleanup(self.client.close)

    def install(self):
        shutil.copy(self.ca.ca_file, self.files["ca.crt"])
        shutil.copy(self.pair.cert_file, self.files["client.crt"])
        shutil.copy(self.pair.key_file, self.files["client.key"])

    @defer.inlineCallbacks
    def test_calls_fail_like_an_unreachable_server_until_the_files_exist(self):
        error = yield self.assertFailure(self.client.get(NAMESPACES, "default"),
                                         ConnectionFailed)
        self.assertIn(self.files["client.key"], str(error))
        self.assertIsNone(self.client.client)
        self.install()
        yield self.assertFailure(self.client.get(SECRETS, "absent", NAMESPACE), NotFound)
        self.assertEqual(self.server.client_subjects[-1].split(",")[0], "CN=system:node:edge-1")

    @defer.inlineCallbacks
    def test_a_removed_file_ends_the_use_at_once_and_close_is_final(self):
        self.install()
        yield self.assertFailure(self.client.get(SECRETS, "absent", NAMESPACE), NotFound)
        os.remove(self.files["client.crt"])
        error = yield self.assertFailure(self.client.get(SECRETS, "absent", NAMESPACE),
                                         ConnectionFailed)
        self.assertIn(self.files["client.crt"], str(error))
        self.assertNotIn(self.files["client.key"], str(error))
        self.install()
        yield self.client.close()
        error = yield self.assertFailure(self.client.get(SECRETS, "absent", NAMESPACE),
                                         ConnectionFailed)
        self.assertIn("closed", str(error))
