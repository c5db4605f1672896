"""The shipped rules under promtool (Debian package ``prometheus``): ``promtool check
rules`` on ``deploy/prometheus/yurtcoord-rules.yaml`` and ``promtool test rules`` with
``deploy/prometheus/tests.yaml`` (each alert firing and not firing), the expected
annotations filled from ``yurtcoord.monitoring.alerts``."""

import os

import yaml
from twisted.trial import unittest

from yurtcoord.monitoring.alerts import dump, rules_document, shortened
from yurtcoord.testing.prometheus import (
    MISSING, PROMTOOL, filled_unit_tests, promtool, shipped_rules_path,
)


class PromtoolTests(unittest.TestCase):

    def setUp(self):
        if PROMTOOL is None:
            raise unittest.SkipTest(MISSING)
        self.directory = self.mktemp()
        os.makedirs(self.directory)

    def write(self, name, text):
        path = os.path.join(self.directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_check_rules_accepts_the_shipped_rules(self):
        result = promtool("check", "rules", shipped_rules_path())
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("SUCCESS: 13 rules found", result.stdout)

    def test_check_rules_refuses_a_broken_expression(self):
        document = rules_document()
        document["groups"][0]["rules"][-1]["expr"] = "sum by (pool) ("
        result = promtool("check", "rules", self.write("broken.yaml", dump(document)))
        self.assertNotEqual(result.returncode, 0)

    def test_unit_tests_pass_on_the_shipped_rules(self):
        tests = self.write("tests.yaml", yaml.safe_dump(filled_unit_tests(shipped_rules_path())))
        result = promtool("test", "rules", tests)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("SUCCESS", result.stdout)

    def test_unit_tests_fail_on_rules_with_other_durations(self):
        """The not-firing cases hold the shipped ``for:`` durations: rules that fire
        after 2 s fail them."""
        rules = self.write("short.yaml", dump(rules_document(shortened(2, 40, 2))))
        tests = self.write("tests.yaml", yaml.safe_dump(filled_unit_tests(rules)))
        result = promtool("test", "rules", tests)
        self.assertNotEqual(result.returncode, 0)
        for alert in ("YurtcoordPoolNoLeader", "YurtcoordNodeHeartbeatStale",
                      "YurtcoordPoolCacheNotSynced", "YurtcoordReactorLag"):
            self.assertIn(f"alertname: {alert}", result.stdout + result.stderr)
