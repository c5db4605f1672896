"""The shared etcd of the tests: one per kind, emptied after each test that used it,
replaced once a test left it dead. On the preferred etcd version: the fixture does
nothing that differs between versions."""

from twisted.trial import reporter, unittest

from yurtcoord.sim.etcd import preferred_etcd_binary
from yurtcoord.testing.sharedetcd import shared_etcd, use_shared_etcd, wipe

ETCD = preferred_etcd_binary()


def all_keys(etcd):
    """Every key etcd holds, as etcdctl lists them."""
    out = etcd.etcdctl("get", "", "--from-key", "--keys-only")
    return [line for line in out.splitlines() if line]


class SharedEtcdTests(unittest.TestCase):

    def setUp(self):
        if ETCD is None:
            raise unittest.SkipTest("no etcd installed")

    def test_one_etcd_per_kind(self):
        plain = shared_etcd(ETCD)
        self.assertIs(shared_etcd(ETCD), plain)
        self.assertTrue(plain.is_running())
        limited = shared_etcd(ETCD, extra_args=("--max-txn-ops", "16"))
        self.assertIsNot(limited, plain)
        self.assertIs(shared_etcd(ETCD, extra_args=["--max-txn-ops", "16"]), limited)
        self.assertIn("--max-txn-ops", limited.extra_args)
        secure = shared_etcd(ETCD, tls=True)
        self.assertNotIn(secure, (plain, limited))
        self.assertTrue(secure.client_url.startswith("https://"))
        self.assertIsNotNone(secure.tls_ca)
        self.assertTrue(plain.client_url.startswith("http://"))

    def test_wipe_deletes_every_key(self):
        etcd = use_shared_etcd(self, ETCD)
        for key in ("\x01first", "/registry/pods/ns/a", "/mirror/rv/registry/pods/ns/a",
                    "zzz-last"):
            etcd.put(key, b"value")
        self.assertEqual(len(all_keys(etcd)), 4)
        wipe(etcd)
        self.assertEqual(all_keys(etcd), [])

    def test_a_test_finds_it_empty_and_its_cleanups_see_its_keys(self):
        seen = {}

        class Inner(unittest.SynchronousTestCase):
            def test_writes(inner):
                etcd = use_shared_etcd(inner, ETCD)
                seen["etcd"] = etcd
                seen["at_start"] = all_keys(etcd)
                inner.addCleanup(lambda: seen.setdefault("in_cleanup", all_keys(etcd)))
                etcd.put("/left/by/the/test", b"1")

        result = reporter.TestResult()
        Inner("test_writes").run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(seen["at_start"], [])
        self.assertEqual(seen["in_cleanup"], ["/left/by/the/test"])
        self.assertEqual(all_keys(seen["etcd"]), [])

    def test_a_killed_and_restarted_etcd_is_kept_a_dead_one_replaced(self):
        etcd = use_shared_etcd(self, ETCD)
        etcd.kill()
        etcd.restart()
        self.assertIs(shared_etcd(ETCD), etcd)
        etcd.kill()
        wipe(etcd)  # nothing to wipe on a dead etcd, and no error
        again = use_shared_etcd(self, ETCD)
        self.assertIsNot(again, etcd)
        self.assertTrue(again.is_running())
        self.assertEqual(all_keys(again), [])
