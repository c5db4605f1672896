"""The one TLS reloader both clients use: what it loads, when it reloads, what it
keeps when a rotation is half done."""

import os

from twisted.logger import LogLevel, capturedLogs
from twisted.trial import unittest

from yurtcoord.sim.pki import TestCA
from yurtcoord.tx.tlsreload import PEMSource, ReloadingTLSPolicy, split_pem_certificates


class MaterialError(Exception):
    """The caller's own error type."""


def install(source, target):
    """Replace ``target`` the way a rotation does: write aside, then rename over."""
    with open(source, "rb") as f:
        data = f.read()
    with open(target + ".tmp", "wb") as f:
        f.write(data)
    os.replace(target + ".tmp", target)


class ReloadingTLSPolicyTests(unittest.TestCase):
    def setUp(self):
        base = self.mktemp()
        os.makedirs(base)
        self.ca = TestCA(os.path.join(base, "ca"))
        self.cert_file = os.path.join(base, "c.crt")
        self.key_file = os.path.join(base, "c.key")
        pair = self.ca.client_pair("a", "client-a")
        install(pair.cert_file, self.cert_file)
        install(pair.key_file, self.key_file)
        self.changes = []

    def policy(self, **kwargs):
        return ReloadingTLSPolicy(PEMSource(self.ca.ca_file), PEMSource(self.cert_file),
                                  PEMSource(self.key_file), error=MaterialError,
                                  on_change=lambda: self.changes.append(1), **kwargs)

    def common_name(self, policy):
        return policy._material.client_cert.getSubject().commonName.decode()

    def test_split_pem_keeps_every_certificate_in_order(self):
        with open(self.ca.ca_file, "rb") as f:
            ca = f.read()
        with open(self.cert_file, "rb") as f:
            leaf = f.read()
        blocks = split_pem_certificates(b"junk\n" + leaf + ca + b"trailing")
        self.assertEqual(len(blocks), 2)
        self.assertTrue(blocks[0].startswith(b"-----BEGIN CERTIFICATE-----"))
        self.assertEqual(blocks[1].strip(), ca.strip())

    def test_files_are_loaded_once_and_reloaded_when_they_change(self):
        policy = self.policy()
        first = policy.creatorForNetloc(b"localhost", 443)
        self.assertIs(policy.creatorForNetloc(b"localhost", 443), first)
        self.assertEqual((policy.reloads, self.changes), (1, []))
        rotated = self.ca.client_pair("b", "client-b")
        install(rotated.cert_file, self.cert_file)
        install(rotated.key_file, self.key_file)
        second = policy.creatorForNetloc(b"localhost", 443)
        self.assertIsNot(second, first)
        self.assertEqual((policy.reloads, self.changes), (2, [1]))
        self.assertEqual(self.common_name(policy), "client-b")

    def test_a_half_done_rotation_keeps_the_previous_material_and_warns_once(self):
        policy = self.policy()
        policy.creatorForNetloc(b"localhost", 443)
        with open(self.cert_file, "r+b") as f:
            f.truncate(40)
        with capturedLogs() as events:
            self.assertFalse(policy.refresh())
            self.assertFalse(policy.refresh())
        warnings = [e for e in events if e["log_level"] == LogLevel.warn]
        self.assertEqual(len(warnings), 1)
        self.assertIn(self.cert_file, warnings[0]["error"])
        self.assertEqual(self.common_name(policy), "client-a")
        os.remove(self.key_file)
        self.assertFalse(policy.refresh())
        self.assertEqual((policy.reloads, self.changes), (1, []))
        finished = self.ca.client_pair("c", "client-c")
        install(finished.cert_file, self.cert_file)
        install(finished.key_file, self.key_file)
        self.assertTrue(policy.refresh())
        self.assertEqual(self.common_name(policy), "client-c")
        self.assertEqual(self.changes, [1])

    def test_material_that_never_loaded_is_the_callers_error_naming_the_file(self):
        os.remove(self.cert_file)
        policy = self.policy()
        with self.assertRaises(MaterialError) as caught:
            policy.creatorForNetloc(b"localhost", 443)
        self.assertIn(self.cert_file, str(caught.exception))
        with self.assertRaises(MaterialError):
            ReloadingTLSPolicy(PEMSource(self.ca.ca_file), PEMSource(self.cert_file),
                               error=MaterialError)

    def test_a_key_of_another_certificate_does_not_load(self):
        other = self.ca.client_pair("o", "other")
        install(other.key_file, self.key_file)
        with self.assertRaises(MaterialError) as caught:
            self.policy().refresh()
        self.assertIn("do not load", str(caught.exception))

    def test_the_chain_after_the_leaf_is_kept(self):
        with open(self.cert_file, "ab") as f, open(self.ca.ca_file, "rb") as ca:
            f.write(ca.read())
        policy = self.policy()
        policy.refresh()
        self.assertEqual(len(policy._material.chain), 1)
        policy.creatorForNetloc(b"localhost", 443)

    def test_inline_material_is_loaded_once(self):
        with open(self.ca.ca_file, "rb") as f:
            policy = ReloadingTLSPolicy(PEMSource(data=f.read()), error=MaterialError)
        self.assertTrue(policy.refresh())
        self.assertFalse(policy.refresh())
        self.assertIsNone(policy._material.client_cert)

    def test_insecure_still_builds_a_creator_with_the_client_certificate(self):
        policy = self.policy(insecure=True)
        creator = policy.creatorForNetloc(b"127.0.0.1", 443)
        self.assertTrue(hasattr(creator, "clientConnectionForTLS"))
