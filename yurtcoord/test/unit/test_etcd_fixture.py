"""Which etcd binaries the real-etcd fixture finds, and which version the tests that do
not depend on the version run on (the fixture itself is tested in the integration tier)."""

import os

from twisted.trial import unittest

from yurtcoord.sim.etcd import (
    etcd_binaries, etcd_binary_for, make_etcd_test_class, preferred_etcd_binary, preferred_etcd_version,
)


class EtcdBinariesTests(unittest.TestCase):

    def test_binaries_have_distinct_versions_and_etcdctl(self):
        binaries = etcd_binaries()
        if not binaries:
            raise unittest.SkipTest("no etcd installed")
        versions = [b.version for b in binaries]
        self.assertEqual(len(versions), len(set(versions)))
        for b in binaries:
            self.assertTrue(os.access(b.etcd, os.X_OK), b)
            self.assertTrue(os.access(b.etcdctl, os.X_OK), b)
            self.assertRegex(b.version, r"^3\.\d+\.\d+")

    def test_etcd_bin_comes_first(self):
        binaries = etcd_binaries()
        if len(binaries) < 2:
            raise unittest.SkipTest("needs two etcd versions")
        last = binaries[-1]
        old = os.environ.get("ETCD_BIN")
        os.environ["ETCD_BIN"] = last.etcd
        self.addCleanup(_restore_env, "ETCD_BIN", old)
        self.assertEqual(etcd_binaries()[0].version, last.version)

    def test_unknown_version_is_none(self):
        self.assertIsNone(etcd_binary_for("2.99"))

    def test_the_preferred_version_is_35_when_installed_else_34(self):
        """Tests whose behaviour does not differ between etcd versions run on this one
        only, the etcd worlds run on."""
        expected = "3.5" if etcd_binary_for("3.5") else "3.4" if etcd_binary_for("3.4") else "3.5"
        self.assertEqual(preferred_etcd_version(), expected)
        self.assertEqual(preferred_etcd_binary(), etcd_binary_for("3.5") or etcd_binary_for("3.4"))
        made = make_etcd_test_class(type("ExampleTestsMixin", (), {}), {"__name__": __name__})
        self.assertEqual(made.__name__, f"ExampleTests_etcd{expected.replace('.', '')}")


def _restore_env(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
