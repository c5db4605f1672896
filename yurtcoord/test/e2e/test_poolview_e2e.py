"""The pool view of a running pool, end to end: three ``twistd`` agents, one follower's
pool page in headless Chromium and ``yurtcoordctl`` against it.

- Both show every member and the leader; the pool cache counts are read from the pool
  etcd.
- Another follower's kubelet stops: both show it stale soon after its node lease went
  stale (the viewer saw its renewTime change last more than two heartbeat intervals
  ago, on its own clock). Kubelet stop →
  stale shown and lease stale → stale shown are printed as ``POOLVIEW-E2E
  <name>=<seconds>s`` lines; the screenshot of the page is kept in the test's temp dir.
- The viewing follower is cut off from the cloud: it no longer elects, yet
  ``/status``, ``/pool``, the page and ``yurtcoordctl leader`` name the holder of the
  coordinator's election lease (the agent reads it whatever its role).
- With three pool etcd members and two coordinator apiservers, one follower's
  ``yurtcoordctl members`` and pool page show the member and the apiserver every
  agent uses; after the member they all use is killed, then the apiserver they all
  write through goes down, both show every agent on another one. The times from each
  fault until the viewer showed every agent moved are printed as ``POOLVIEW-E2E``
  lines.
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
    LEADER_FIELD, MEMBER_ROW, MEMBER_SERVERS, PNG_MAGIC, RECT_LEADERS, STALE_ROW,
    run_chromium,
)
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.partitions import endpoints
from yurtcoord.testing.world import (
    ENDPOINTS_PREFIX, ProcessWorld, leader_of, one_leader_all_ready,
)

GRACE = 3.0
# Heartbeats a few times shorter than the suite's (as the kubelet gate's end-to-end
# tests), so that a member goes stale within seconds of its kubelet's grace period.
HEARTBEAT = {"interval": "1s", "timeout": "300ms"}
INTERVAL = parse_duration(HEARTBEAT["interval"])
# The viewer's window (``stale_after_seconds``): two intervals since it saw a change.
STALE_AFTER = 2 * INTERVAL
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


class PoolViewWorld:
    """Three agents with pods, the cloud's endpoints, and the helpers reading a pool
    view; ``world_options`` are the ``ProcessWorld``'s."""

    timeout = 300
    nodes = ("edge-1", "edge-2", "edge-3")
    world_options: dict = {}

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, kubelet_grace_period=f"{GRACE:g}s",
                                  **self.world_options)
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
    def servers_of(self, url):
        """{node: (etcd member, coordinator apiserver)} of ``yurtcoordctl members -o
        json``."""
        code, out, err = yield yurtcoordctl("members", "--server", url, "-o", "json",
                                            "--timeout", "5")
        if code not in (0, ctl.NOT_READY):
            raise AssertionError(f"yurtcoordctl members: {code} {err}")
        return {m["node"]: (m["etcd_member"], m["coordinator_server"])
                for m in json.loads(out)["members"]}

    @defer.inlineCallbacks
    def page(self, url, *arguments):
        code, dom, err = yield run_chromium(self, reactor, "--virtual-time-budget=3000", *arguments,
                                            "--dump-dom", url + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        return dom.decode("utf-8")


class PoolViewEndToEndTests(PoolViewWorld, unittest.TestCase):

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
        self.assertEqual(pool["stale_after_seconds"], STALE_AFTER)
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
        # GRACE + INTERVAL after the kubelet stopped; the viewer saw that renewal within
        # one document's POOL_VIEW_TTL and shows it stale at most one more later.
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

        # The viewer loses the cloud: it stops electing, but it reads the coordinator's
        # election lease, which still names the leader.
        yield self.world.cut_cloud([viewer])
        yield self.world.wait_for_pool(
            f"{viewer} cut off: no cloud, the leader still named from the election lease",
            lambda s: s[viewer]["leader"] == leader and not any(s[viewer]["cloud"].values()),
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


class ServersInUseEndToEndTests(PoolViewWorld, unittest.TestCase):
    """Which pool etcd member and coordinator apiserver each agent uses, as another
    agent shows it, before and after the ones in use are lost."""

    world_options = {"etcd_members": 3, "coordinator_servers": 2}
    # Heartbeats a few times faster than the default, with attempts long enough for a
    # loaded machine running three etcd members: a probe that fails there makes its
    # agent pending for a moment, and a pending agent has no pool store open.
    heartbeat = {"interval": "2s", "timeout": "500ms"}

    @defer.inlineCallbacks
    def rows_of(self, url):
        """{node: (etcd member, coordinator apiserver)} as the pool page shows them
        (``none`` where unknown), once its script has read ``/pool``."""
        dom = yield self.page(url)
        return {node: (member, server) for node, member, server
                in MEMBER_SERVERS.findall(dom)}

    @defer.inlineCallbacks
    def wait_servers(self, read, what, predicate):
        """``read()``'s {node: servers} once ``predicate`` holds for it, and when."""
        seen = {}

        @defer.inlineCallbacks
        def check():
            seen["servers"] = yield read()
            return predicate(seen["servers"])

        try:
            yield poll_until(check, STEP_TIMEOUT, 0.2, reactor, what=what)
        except PollTimeout as e:
            raise PollTimeout(f"{e}: {seen}\n{self.world.log_tails()}") from None
        return seen["servers"], reactor.seconds()

    @defer.inlineCallbacks
    def test_every_agent_moving_to_another_member_and_apiserver_is_shown(self):
        world = self.world
        yield world.start_agents(heartbeat=self.heartbeat)
        statuses = yield world.wait_for_pool(
            "one leader among 3 agents, all ready", lambda s: one_leader_all_ready(s, 3),
            SETTLE_TIMEOUT)
        leader = leader_of(statuses)
        viewer = sorted(n for n in self.nodes if n != leader)[0]
        url = world.agents[viewer].url
        cli, page = (lambda: self.servers_of(url)), (lambda: self.rows_of(url))
        members = world.etcd_urls()
        first, second = (server.url for server in world.coordinators)
        # Every agent is shown with a member and an apiserver of the pool. Which
        # apiserver is not fixed: a heartbeat moves to the other one whenever a write
        # fails (on a loaded machine an attempt may time out), and stays there.
        def shown(servers, allowed_members, allowed_servers):
            return set(servers) == set(self.nodes) and all(
                member in allowed_members and server in allowed_servers
                for member, server in servers.values())

        servers, _at = yield self.wait_servers(
            cli, f"every agent's member and apiserver in {viewer}'s yurtcoordctl",
            lambda servers: shown(servers, members, (first, second)))
        # Nothing failed over yet: the pool stores use the first member.
        self.assertEqual({node: member for node, (member, _server) in servers.items()},
                         dict.fromkeys(self.nodes, members[0]))
        yield self.wait_servers(
            page, f"every agent's member and apiserver on {viewer}'s pool page",
            lambda rows: shown(rows, members, (first, second)))

        # The member every agent uses dies: each agent's pool store moves to another
        # member, and its next heartbeat says so.
        yield world.kill_etcd(0)
        killed_at = reactor.seconds()
        servers, moved_at = yield self.wait_servers(
            cli, f"every agent off {members[0]} in {viewer}'s yurtcoordctl",
            lambda servers: shown(servers, members[1:], (first, second)))
        report("etcd_member_killed_to_every_agent_moved_in_cli", moved_at - killed_at)

        # The apiserver every agent writes through goes down: each heartbeat moves to
        # the other one and names it.
        yield world.coordinators[0].faults.down()
        down_at = reactor.seconds()
        servers, moved_at = yield self.wait_servers(
            cli, f"every agent writing through {second} in {viewer}'s yurtcoordctl",
            lambda servers: shown(servers, members[1:], (second,)))
        report("coordinator_apiserver_down_to_every_agent_moved_in_cli", moved_at - down_at)
        _rows, shown_at = yield self.wait_servers(
            page, f"every agent on another member and {second} on {viewer}'s pool page",
            lambda rows: shown(rows, members[1:], (second,)))
        report("coordinator_apiserver_down_to_every_agent_moved_on_page", shown_at - down_at)
        # The viewer's own row is what its /status says it uses.
        status = yield world.status(world.agents[viewer])
        self.assertEqual(servers[viewer][0], status["etcd_member"])
        self.assertEqual(status["coordinator_servers"], {first: False, second: True})
