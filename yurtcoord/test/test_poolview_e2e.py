"""The pool view of a running pool, end to end: three ``twistd`` agents, one follower's
pool page in headless Chromium and ``yurtcoordctl`` against it.

- Both show every member and the leader; the pool cache counts are read from the pool
  etcd.
- Another follower's kubelet stops: both show it stale soon after its node lease went
  stale (renewed more than ``interval`` + ``max_clock_skew`` ago). Kubelet stop →
  stale shown and lease stale → stale shown are printed as ``POOLVIEW-E2E
  <name>=<seconds>s`` lines; the screenshot of the page is kept in the test's temp dir.
- The viewing follower is cut off from the cloud: it no longer elects, so ``/status``
  names no leader, yet ``/pool``, the page and ``yurtcoordctl leader`` name the
  holder of the coordinator's election lease.
"""

import io
import json
import os

from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from yurtcoord.agent import ctl
from yurtcoord.agent.config import parse_duration
from yurtcoord.agent.poolview import POOL_VIEW_TTL
from yurtcoord.kube.gvr import ENDPOINTS
from yurtcoord.kube.lease import renew_time
from yurtcoord.testing.chromium import (
    LEADER_FIELD, MEMBER_ROW, PNG_MAGIC, RECT_LEADERS, STALE_ROW, run_chromium,
)
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.partitions import endpoints
from yurtcoord.testing.world import (
    ENDPOINTS_PREFIX, ProcessWorld, leader_of, one_leader_all_ready,
)

GRACE = 3.0
# Heartbeats a few times shorter than the suite's (as the kubelet gate's end-to-end
# tests), so that a member goes stale within seconds of its kubelet's grace period.
HEARTBEAT = {"interval": "1s", "timeout": "300ms", "max_clock_skew": "1s"}
INTERVAL = parse_duration(HEARTBEAT["interval"])
STALE_AFTER = INTERVAL + parse_duration(HEARTBEAT["max_clock_skew"])
SERVICES = 3
SETTLE_TIMEOUT = 60.0
STEP_TIMEOUT = 40.0
# A loaded 2-core machine may not schedule a process for a moment.
SLACK = 1.5


def report(name, seconds):
    print(f"POOLVIEW-E2E {name}={seconds:.2f}s")


def yurtcoordctl(*argv):
    """``yurtcoordctl argv`` in a thread: (exit status, stdout, stderr)."""
    def run():
        out, err = io.StringIO(), io.StringIO()
        return ctl.run(list(argv), out, err), out.getvalue(), err.getvalue()
    return threads.deferToThread(run)


class PoolViewEndToEndTests(unittest.TestCase):
    timeout = 300
    nodes = ("edge-1", "edge-2", "edge-3")

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, kubelet_grace_period=f"{GRACE:g}s")
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for node in self.nodes:
            yield self.world.add_agent(node, pods=2)
        for index in range(SERVICES):
            self.world.cloud.store.create(ENDPOINTS, endpoints(f"svc-{index}",
                                                               f"10.0.0.{index + 1}"))

    @defer.inlineCallbacks
    def members_of(self, url):
        """{node: heartbeat} of ``yurtcoordctl members -o json``, and its exit status."""
        code, out, err = yield yurtcoordctl("members", "--server", url, "-o", "json",
                                            "--timeout", "5")
        if code not in (0, ctl.NOT_READY):
            raise AssertionError(f"yurtcoordctl members: {code} {err}")
        return {m["node"]: m["heartbeat"] for m in json.loads(out)["members"]}, code

    @defer.inlineCallbacks
    def page(self, url, *arguments):
        code, dom, err = yield run_chromium(self, reactor, "--virtual-time-budget=3000", *arguments,
                                            "--dump-dom", url + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        return dom.decode("utf-8")

    @defer.inlineCallbacks
    def test_page_and_cli_show_the_pool_a_stale_member_and_the_leader_when_cut_off(self):
        yield self.world.start_agents(heartbeat=HEARTBEAT)
        statuses = yield self.world.wait_for_pool(
            "one leader among 3 agents, all ready", lambda s: one_leader_all_ready(s, 3),
            SETTLE_TIMEOUT)
        leader = leader_of(statuses)
        viewer, victim = sorted(n for n in self.nodes if n != leader)
        url = self.world.agents[viewer].url

        # Every member heartbeats directly; the viewer is ready (exit status 0).
        seen = {}

        @defer.inlineCallbacks
        def all_direct():
            seen["members"], seen["code"] = yield self.members_of(url)
            return seen["members"] == {n: "direct" for n in self.nodes} and seen["code"] == 0

        yield poll_until(all_direct, STEP_TIMEOUT, 0.2, reactor,
                         what=f"every member direct on {viewer}: {seen}")
        code, out, err = yield yurtcoordctl("members", "--server", url)
        self.assertEqual((code, err), (0, ""))
        self.assertRegex(out, rf"(?m)^{leader} +direct +[0-9.]+s .* true ")
        # The leader mirrored the cloud's endpoints: the counts are the pool etcd's.
        @defer.inlineCallbacks
        def endpoints_counted():
            code, out, err = yield yurtcoordctl("cache", "--server", url, "-o", "json")
            seen["pool"] = json.loads(out)
            return seen["pool"]["cache"]["resources"].get("endpoints") == SERVICES

        yield poll_until(endpoints_counted, STEP_TIMEOUT, 0.2, reactor,
                         what=f"{SERVICES} endpoints counted on {viewer}")
        pool = seen["pool"]
        stored = yield self.world.read_etcd(ENDPOINTS_PREFIX)
        self.assertEqual(len(stored), SERVICES)
        self.assertEqual(pool["leader"], leader)
        self.assertEqual(pool["errors"], {})
        self.assertIsInstance(pool["cache"]["informer_sync_lease_age"], float)
        self.assertEqual(pool["cache"]["informer_sync_holder"], leader)
        viewer_entry = next(m for m in pool["members"] if m["node"] == viewer)
        self.assertEqual(viewer_entry["upload"]["uploaded"], True)
        dom = yield self.page(url)
        self.assertEqual(sorted(MEMBER_ROW.findall(dom)),
                         [(n, "direct") for n in self.nodes])
        self.assertEqual(LEADER_FIELD.findall(dom), [leader])
        # The viewer's election saw the leader take over: the timeline's one term.
        self.assertEqual(RECT_LEADERS.findall(dom), [leader])

        # The victim's kubelet dies: its lease goes stale, the CLI and the page show it.
        yield self.world.stop_kubelet(victim)
        stopped_at = reactor.seconds()

        @defer.inlineCallbacks
        def victim_stale():
            seen["members"], seen["code"] = yield self.members_of(url)
            return seen["members"].get(victim) == "stale"

        try:
            yield poll_until(victim_stale, STEP_TIMEOUT, 0.1, reactor,
                             what=f"{victim} stale on {viewer}")
        except PollTimeout as e:
            raise PollTimeout(f"{e}: {seen}\n{self.world.log_tails()}") from None
        cli_at = reactor.seconds()
        dom = yield self.page(url)
        page_at = reactor.seconds()
        self.assertIn((victim, "stale"), MEMBER_ROW.findall(dom))
        self.assertEqual(STALE_ROW.findall(dom), [victim])
        self.assertEqual(seen["members"][viewer], "direct")
        # The lease went stale STALE_AFTER after its last renewal, which came at most
        # GRACE + INTERVAL after the kubelet stopped.
        lease = self.world.node_lease(self.world.cloud, victim)
        stale_due = renew_time(lease) + STALE_AFTER
        report("kubelet_stop_to_stale_in_cli", cli_at - stopped_at)
        report("kubelet_stop_to_stale_on_page", page_at - stopped_at)
        report("lease_stale_to_stale_in_cli", cli_at - stale_due)
        self.assertLessEqual(cli_at - stale_due, INTERVAL + POOL_VIEW_TTL + SLACK)
        self.assertLessEqual(cli_at - stopped_at,
                             GRACE + INTERVAL + STALE_AFTER + INTERVAL + POOL_VIEW_TTL + SLACK)
        shot = os.path.join(os.path.abspath(self.mktemp()), "pool-page-stale-member.png")
        os.makedirs(os.path.dirname(shot))
        code, _out, err = yield run_chromium(self, reactor, f"--screenshot={shot}",
                                             "--window-size=1000,1400",
                                             "--virtual-time-budget=3000", url + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        with open(shot, "rb") as handle:
            self.assertEqual(handle.read(8), PNG_MAGIC)
        print(f"POOLVIEW-E2E screenshot={shot}")

        # The viewer loses the cloud: it stops electing, but the coordinator's election
        # lease still names the leader.
        yield self.world.cut_cloud([viewer])
        yield self.world.wait_for_pool(
            f"{viewer} cut off: no cloud, no leader seen by its election",
            lambda s: s[viewer]["leader"] is None and not any(s[viewer]["cloud"].values()),
            STEP_TIMEOUT)

        @defer.inlineCallbacks
        def leader_from_coordinator():
            code, out, err = yield yurtcoordctl("leader", "--server", url, "-o", "json")
            seen["leader"] = (code, out[:300], err)
            document = json.loads(out) if out else {}
            return document.get("leader") == leader and not document.get("cloud_read")

        yield poll_until(leader_from_coordinator, STEP_TIMEOUT, 0.2, reactor,
                         what=f"{viewer}'s /pool naming {leader}: {seen}")
        code, out, err = yield yurtcoordctl("leader", "--server", url)
        self.assertRegex(out, rf"^LEADER .*\n{leader} +{leader} ")
        dom = yield self.page(url)
        self.assertEqual(LEADER_FIELD.findall(dom), [leader])
