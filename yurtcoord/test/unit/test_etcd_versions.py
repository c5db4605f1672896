"""Which etcd releases the agent warns about."""

from twisted.trial import unittest

from yurtcoord.etcd.versions import (
    loses_acknowledged_writes_on_kill, parse_version, version_warning,
)


class EtcdVersionTests(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_version("3.5.1"), (3, 5, 1))
        self.assertEqual(parse_version("v3.4.23"), (3, 4, 23))
        self.assertEqual(parse_version("3.5.3-rc.0"), (3, 5, 3))
        for bad in ("", None, "3.5", "three", "not-a-version"):
            self.assertIsNone(parse_version(bad), bad)

    def test_releases_that_lose_acknowledged_writes(self):
        for version in ("3.5.0", "3.5.1", "3.5.2", "v3.5.2"):
            self.assertTrue(loses_acknowledged_writes_on_kill(version), version)
        for version in ("3.4.23", "3.5.3", "3.5.17", "3.6.0", "garbage", None):
            self.assertFalse(loses_acknowledged_writes_on_kill(version), version)

    def test_warning_names_version_issue_and_fix(self):
        warning = version_warning("3.5.1")
        self.assertIn("3.5.1", warning)
        self.assertIn("etcd-io/etcd#13766", warning)
        self.assertIn("3.5.3", warning)
        self.assertIsNone(version_warning("3.4.23"))
