"""The real-etcd test fixture: start, SIGKILL, restart on the same data dir, TLS, cleanup."""

import json
import os
import shutil
import ssl
import tempfile
import urllib.error
import urllib.request

from twisted.trial import unittest

from yurtcoord.sim.etcd import (
    EtcdFixtureError,
    EtcdProcess,
    etcd_binaries,
    etcd_binary_for,
    make_etcd_test_classes,
)
from yurtcoord.sim.pki import TestCA


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


def _restore_env(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class EtcdFixtureTestsMixin:
    """Run per etcd version (see make_etcd_test_classes)."""

    def start_etcd(self, **kwargs):
        etcd = EtcdProcess(self.etcd_binary, **kwargs)
        self.addCleanup(etcd.stop)
        return etcd.start()

    def test_starts_on_loopback_and_reports_its_version(self):
        etcd = self.start_etcd()
        self.assertTrue(etcd.health())
        self.assertTrue(etcd.client_url.startswith("http://127.0.0.1:"))
        self.assertEqual(_server_version(etcd), self.etcd_binary.version)

    def test_sigkill_then_restart_on_same_data_dir_keeps_writes(self):
        etcd = self.start_etcd()
        written = {f"/fixture/k{i:03d}".encode(): f"value-{i}\n\x00end".encode()
                   for i in range(20)}
        for key, value in written.items():
            etcd.put(key, value)
        port, data_dir = etcd.client_port, etcd.data_dir
        pid = etcd.pid

        etcd.kill()
        self.assertFalse(etcd.is_running())
        self.assertRaises(OSError, etcd.health)

        etcd.restart()
        self.assertNotEqual(etcd.pid, pid)
        self.assertEqual((etcd.client_port, etcd.data_dir), (port, data_dir))
        self.assertEqual(etcd.read(b"/fixture/", prefix=True), written)

    def test_terminate_then_restart(self):
        etcd = self.start_etcd()
        etcd.put("/t", "1")
        etcd.terminate()
        self.assertFalse(etcd.is_running())
        etcd.restart()
        self.assertEqual(etcd.read("/t"), {b"/t": b"1"})

    def test_freeze_makes_etcd_silent_until_thawed(self):
        etcd = self.start_etcd()
        etcd.freeze()
        self.addCleanup(etcd.thaw)
        self.assertTrue(etcd.is_running())
        self.assertRaises(OSError, etcd.health, 0.3)
        etcd.thaw()
        self.assertTrue(etcd.health())

    def test_stop_removes_everything(self):
        etcd = self.start_etcd()
        base = etcd.base_dir
        self.assertTrue(os.path.isdir(os.path.join(etcd.data_dir, "member")))
        etcd.stop()
        self.assertFalse(etcd.is_running())
        self.assertFalse(os.path.exists(base))
        etcd.stop()

    def test_failed_start_reports_log_tail(self):
        etcd = EtcdProcess(self.etcd_binary, extra_args=["--no-such-flag-here"])
        self.addCleanup(etcd.stop)
        e = self.assertRaises(EtcdFixtureError, etcd.start, 20)
        self.assertIn("no-such-flag-here", str(e))
        self.assertFalse(etcd.is_running())

    def test_etcdctl_failure_is_an_error(self):
        etcd = self.start_etcd()
        self.assertRaises(EtcdFixtureError, etcd.etcdctl, "no-such-command")

    def test_tls_requires_client_certificate(self):
        ca_dir = tempfile.mkdtemp(prefix="yurtcoord-ca-")
        self.addCleanup(shutil.rmtree, ca_dir, True)
        ca = TestCA(ca_dir)
        etcd = self.start_etcd(tls_ca=ca)
        self.assertTrue(etcd.client_url.startswith("https://127.0.0.1:"))
        etcd.put("/tls", "yes")
        self.assertEqual(etcd.read("/tls"), {b"/tls": b"yes"})

        no_cert = ssl.create_default_context(cafile=ca.ca_file)
        with self.assertRaises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(etcd.client_url + "/health", timeout=5,
                                   context=no_cert).read()

        etcd.kill()
        etcd.restart()
        self.assertEqual(etcd.read("/tls"), {b"/tls": b"yes"})


def _server_version(etcd):
    status = json.loads(etcd.etcdctl("endpoint", "status", "-w", "json"))
    return status[0]["Status"]["version"]


make_etcd_test_classes(EtcdFixtureTestsMixin, globals())
