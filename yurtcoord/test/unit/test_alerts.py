"""``deploy/prometheus/`` is what ``yurtcoord.monitoring.alerts`` writes, and each alert links a
section of docs/runbook.md that exists."""

import os
import re

import yaml
from twisted.trial import unittest

from yurtcoord.monitoring import alerts
from yurtcoord.testing.paths import REPO

RUNBOOK = os.path.join(REPO, "docs", "runbook.md")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def runbook_anchors() -> set:
    with open(RUNBOOK, encoding="utf-8") as f:
        return {github_anchor(line.lstrip("#")) for line in f if line.startswith("#")}


def alert_rules(groups):
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


class ShippedFilesTests(unittest.TestCase):

    def test_the_shipped_files_are_what_the_source_writes(self):
        self.assertEqual(alerts.out_of_date(), [])

    def test_a_hand_edit_is_found(self):
        directory = self.mktemp()
        self.assertEqual(alerts.main(["--directory", directory]), 0)
        self.assertEqual(alerts.out_of_date(directory), [])
        path = os.path.join(directory, alerts.PROMETHEUS_RULE_FILE)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("for: 5m", "for: 1m", 1))
        self.assertEqual(alerts.out_of_date(directory), [alerts.PROMETHEUS_RULE_FILE])
        self.assertEqual(alerts.main(["--check", "--directory", directory]), 1)

    def test_the_prometheus_rule_holds_the_groups_of_the_rules_file(self):
        with open(os.path.join(alerts.DEPLOY_DIR, alerts.RULES_FILE), encoding="utf-8") as f:
            plain = yaml.safe_load(f)
        with open(os.path.join(alerts.DEPLOY_DIR, alerts.PROMETHEUS_RULE_FILE),
                  encoding="utf-8") as f:
            manifest = yaml.safe_load(f)
        self.assertEqual(manifest["kind"], "PrometheusRule")
        self.assertEqual(manifest["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(manifest["spec"]["groups"], plain["groups"])


class AlertTests(unittest.TestCase):

    def test_every_alert_links_an_existing_runbook_section(self):
        anchors = runbook_anchors()
        for rule in alert_rules(alerts.rule_groups()):
            url = rule["annotations"]["runbook_url"]
            path, _, anchor = url.partition("#")
            self.assertEqual(path, "docs/runbook.md", rule["alert"])
            self.assertIn(anchor, anchors, rule["alert"])
            self.assertIn(url, rule["annotations"]["description"])

    def test_the_runbook_table_lists_every_alert(self):
        with open(RUNBOOK, encoding="utf-8") as f:
            text = f.read()
        for rule in alert_rules(alerts.rule_groups()):
            section = rule["annotations"]["runbook_url"].partition("#")[2]
            self.assertRegex(text, rf"\| `{rule['alert']}` \|.*\(#{re.escape(section)}\)")

    def test_shortened_timings_change_only_thresholds_and_durations(self):
        shipped = alert_rules(alerts.rule_groups())
        short = alert_rules(alerts.rule_groups(alerts.shortened(3, 5, 12)))
        self.assertEqual([r["alert"] for r in shipped], [r["alert"] for r in short])
        durations = {r["alert"]: r.get("for") for r in short}
        self.assertEqual(durations["YurtcoordPoolNoLeader"], "12s")
        self.assertEqual(durations["YurtcoordNodeHeartbeatStale"], "3s")
        self.assertIn("> 5 ", next(r["expr"] for r in short
                                   if r["alert"] == "YurtcoordNodeHeartbeatStale") + " ")
