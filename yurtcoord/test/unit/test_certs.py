"""Certificate manager: the certs Secret, delivered by an informer, becomes files in
pki_dir, validated and written atomically (a malformed version leaves the files as
they were), and the validation of CA and key pairs."""

import os
import stat

from twisted.internet import reactor
from twisted.logger import Logger, formatEvent
from twisted.trial import unittest

from yurtcoord.agent.certs import (
    CertManager, MalformedCerts, check_ca, check_node_certificate, check_pair,
)
from yurtcoord.tx.atomicfiles import replace_files_atomically
from yurtcoord.testing.certsecrets import FILES, NAMESPACE, Bundle, b64, secret
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.sim.pki import TestCA


class CertManagerTests(unittest.TestCase):
    def setUp(self):
        base = self.mktemp()
        self.ca = TestCA(os.path.join(base, "ca"))
        self.pki_dir = os.path.join(base, "pki")
        self.first = Bundle(self.ca, "one")
        self.second = Bundle(self.ca, "two")
        self.informer = FakeInformer()
        self.changes = 0
        self.events = []
        self.manager = CertManager(reactor, None, self.pki_dir, NAMESPACE,
                                   on_change=self.changed, make_informer=lambda: self.informer)
        self.manager.log = Logger(observer=self.events.append)
        self.successResultOf(self.manager.start())
        self.addCleanup(self.manager.stop)

    def changed(self):
        self.changes += 1

    def read(self, name):
        with open(os.path.join(self.pki_dir, name), "rb") as f:
            return f.read()

    def mode(self, name):
        return stat.S_IMODE(os.stat(os.path.join(self.pki_dir, name)).st_mode)

    def assertFiles(self, expected):
        self.assertEqual(sorted(os.listdir(self.pki_dir)), sorted(expected))
        for name, content in expected.items():
            self.assertEqual(self.read(name), content, name)
            self.assertEqual(self.mode(name), 0o600, name)

    def logged_text(self):
        return "\n".join(formatEvent(e) for e in self.events)

    def test_paths(self):
        self.assertEqual(self.manager.ca_file, os.path.join(self.pki_dir, "yurt-coordinator-ca.crt"))
        self.assertEqual(self.manager.yurthub_client_pair.key_file,
                         os.path.join(self.pki_dir, "yurt-coordinator-yurthub-client.key"))
        self.assertEqual(self.manager.node_lease_proxy_pair.cert_file,
                         os.path.join(self.pki_dir, "node-lease-proxy-client.crt"))
        self.assertEqual(stat.S_IMODE(os.stat(self.pki_dir).st_mode), 0o700)

    def test_secret_created_then_updated_writes_new_files_with_mode_0600(self):
        self.assertFalse(self.manager.ready)
        created = secret(self.first.data())
        self.informer.add(created)
        self.assertFiles(self.first.files())
        self.assertTrue(self.manager.ready)
        self.assertTrue(self.manager.has_certs)
        self.assertEqual(self.changes, 1)
        updated = secret(self.second.data())
        self.informer.update(created, updated)
        self.assertFiles(self.second.files())
        self.assertEqual(self.changes, 2)
        # Pairs were rewritten; the unchanged CA was not.
        self.assertEqual(self.manager.writes, 3 + 2)

    def test_unchanged_secret_rewrites_nothing(self):
        self.informer.add(secret(self.first.data()))
        inode = os.stat(os.path.join(self.pki_dir, FILES[1])).st_ino
        self.informer.update(secret(self.first.data()), secret(self.first.data()))
        self.assertEqual(os.stat(os.path.join(self.pki_dir, FILES[1])).st_ino, inode)
        self.assertEqual(self.changes, 1)
        self.assertEqual(self.manager.writes, 3)

    def test_mismatched_pair_is_rejected_and_previous_files_kept(self):
        self.informer.add(secret(self.first.data()))
        data = self.second.data()
        # The hub certificate with the proxy's key: both parse, they do not match.
        data["yurt-coordinator-yurthub-client.key"] = b64(self.second.proxy_key)
        self.informer.update(secret(self.first.data()), secret(data))
        expected = self.first.files()
        expected["node-lease-proxy-client.crt"] = self.second.proxy_cert
        expected["node-lease-proxy-client.key"] = self.second.proxy_key
        self.assertFiles(expected)
        self.assertEqual(self.manager.rejected, 1)
        self.assertIn("yurthub-client", self.manager.last_error)
        self.assertIn("does not belong", self.manager.last_error)
        self.assertTrue(self.manager.ready)
        text = self.logged_text()
        self.assertIn("rejected yurthub-client", text)
        for secret_material in (self.second.proxy_key, self.second.hub_key, self.first.hub_key):
            body = secret_material.decode().splitlines()[1]
            self.assertNotIn(body, text)
            self.assertNotIn(b64(secret_material)[:40], text)
        self.assertNotIn("PRIVATE KEY", text)

    def test_malformed_units_are_rejected(self):
        self.informer.add(secret(self.first.data()))
        cases = [  # (secret key, bad value, file that must keep its content)
            ("yurt-coordinator-yurthub-client.crt", b64(b"not a certificate"),
             "yurt-coordinator-yurthub-client.crt"),
            ("node-lease-proxy-client.key", b64(b"-----BEGIN PRIVATE KEY-----\nxx\n"),
             "node-lease-proxy-client.key"),
            ("node-lease-proxy-client.crt", "%%%not base64%%%", "node-lease-proxy-client.crt"),
            ("ca.crt", b64(b"garbage"), "yurt-coordinator-ca.crt"),
        ]
        for key, bad, kept in cases:
            data = self.second.data()
            data[key] = bad
            self.informer.add(secret(data))
            self.assertEqual(self.read(kept), self.first.files()[kept], key)
            self.informer.add(secret(self.first.data()))
        self.assertEqual(self.manager.rejected, 4)
        self.assertFiles(self.first.files())

    def test_half_a_pair_is_rejected_not_removed(self):
        self.informer.add(secret(self.first.data()))
        data = self.second.data()
        del data["node-lease-proxy-client.key"]
        self.informer.add(secret(data))
        self.assertEqual(self.read("node-lease-proxy-client.crt"), self.first.proxy_cert)
        self.assertEqual(self.read("node-lease-proxy-client.key"), self.first.proxy_key)
        self.assertIn("missing", self.manager.last_error)

    def test_keys_removed_from_the_secret_remove_their_files(self):
        self.informer.add(secret(self.first.data()))
        data = self.first.data()
        del data["node-lease-proxy-client.crt"]
        del data["node-lease-proxy-client.key"]
        self.informer.add(secret(data))
        expected = self.first.files()
        del expected["node-lease-proxy-client.crt"]
        del expected["node-lease-proxy-client.key"]
        self.assertFiles(expected)
        self.assertFalse(self.manager.ready)
        self.assertEqual(self.changes, 2)

    def test_secret_deleted_drops_every_file_and_readiness(self):
        self.informer.add(secret(self.first.data()))
        self.informer.delete(secret(self.first.data()))
        self.assertEqual(os.listdir(self.pki_dir), [])
        self.assertFalse(self.manager.ready)
        self.assertEqual(self.changes, 2)

    def test_other_secrets_are_ignored(self):
        self.informer.add(secret(self.first.data(), name="something-else"))
        self.informer.add(secret(self.first.data(), namespace="other"))
        self.assertEqual(os.listdir(self.pki_dir), [])
        self.assertEqual(self.changes, 0)

    def test_files_of_an_earlier_run_count_until_the_list_lacks_the_secret(self):
        self.informer.add(secret(self.first.data()))
        self.successResultOf(self.manager.stop())
        informer = FakeInformer()
        restarted = CertManager(reactor, None, self.pki_dir, NAMESPACE, on_change=self.changed,
                                make_informer=lambda: informer)
        self.assertTrue(restarted.ready)
        self.successResultOf(restarted.start())
        self.addCleanup(restarted.stop)
        self.assertTrue(restarted.ready)
        informer.end_list()  # listed: the Secret is gone
        self.assertFalse(restarted.ready)
        self.assertEqual(os.listdir(self.pki_dir), [])

    def test_secret_in_the_initial_list_is_kept(self):
        self.informer.add(secret(self.first.data()))
        self.informer.end_list()
        self.assertTrue(self.manager.ready)

    def test_events_after_stop_are_ignored(self):
        self.successResultOf(self.manager.stop())
        self.assertEqual(self.informer.stopped, 1)
        self.informer.add(secret(self.first.data()))
        self.assertEqual(os.listdir(self.pki_dir), [])


class ValidationTests(unittest.TestCase):
    def setUp(self):
        self.ca = TestCA(self.mktemp())
        self.bundle = Bundle(self.ca, "v")

    def test_checks(self):
        check_ca(self.bundle.ca_pem + self.bundle.hub_cert)
        check_pair(self.bundle.hub_cert, self.bundle.hub_key)
        self.assertRaises(MalformedCerts, check_ca, b"")
        self.assertRaises(MalformedCerts, check_pair, self.bundle.hub_cert, self.bundle.proxy_key)
        self.assertRaises(MalformedCerts, check_pair, self.bundle.hub_key, self.bundle.hub_key)

    def test_replace_is_all_or_nothing_when_staging_fails(self):
        directory = self.mktemp()
        os.makedirs(directory)
        replace_files_atomically(directory, {"a.crt": b"old-a", "a.key": b"old-b"})
        with self.assertRaises(OSError):
            replace_files_atomically(directory, {"a.crt": b"new-a", "missing/a.key": b"new-b"})
        self.assertEqual(sorted(os.listdir(directory)), ["a.crt", "a.key"])
        with open(os.path.join(directory, "a.crt"), "rb") as f:
            self.assertEqual(f.read(), b"old-a")


class NodeCertificateTests(unittest.TestCase):
    """The node's own certificate is the agent's identity on the coordinator: one that
    names another node must stop the agent, not be used."""

    def setUp(self):
        self.ca = TestCA(self.mktemp())

    def test_the_nodes_own_certificate_passes(self):
        check_node_certificate(self.ca.node_client_pem("edge-1"), "edge-1")

    def test_a_file_not_written_yet_passes(self):
        check_node_certificate(os.path.join(self.ca.directory, "absent.pem"), "edge-1")

    def test_another_nodes_certificate_is_refused_naming_the_file_and_both_names(self):
        path = self.ca.node_client_pem("edge-2")
        with self.assertRaises(ValueError) as raised:
            check_node_certificate(path, "edge-1")
        message = str(raised.exception)
        self.assertIn(path, message)
        self.assertIn("CN=system:node:edge-2", message)
        self.assertIn("CN=system:node:edge-1", message)

    def test_a_certificate_outside_the_nodes_group_is_refused(self):
        pair = self.ca.client_pair("lone", "system:node:edge-1", ["system:masters"])
        with self.assertRaises(ValueError) as raised:
            check_node_certificate(pair.cert_file, "edge-1")
        self.assertIn("O=system:nodes", str(raised.exception))

    def test_a_file_without_a_certificate_is_refused(self):
        path = os.path.join(self.ca.directory, "garbage.pem")
        with open(path, "wb") as f:
            f.write(b"not a certificate")
        with self.assertRaises(ValueError) as raised:
            check_node_certificate(path, "edge-1")
        self.assertIn(path, str(raised.exception))
