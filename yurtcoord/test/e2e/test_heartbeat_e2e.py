"""Heartbeats tied to the kubelet, end to end: every agent a separate ``twistd``
process with a stand-in kubelet of its own, the cloud cut for one node through its TCP
proxy, and the node leases read straight from the cloud API test server's store.

- A kubelet stopped, on a cut-off node (its heartbeat reaches the cloud through the
  pool leader) and on a connected node: the node's cloud ``renewTime`` stops advancing
  within ``kubelet_grace_period`` + interval, stays put while the kubelet is down, and
  is renewed again within 2 intervals once it is back.
- The example configuration with no ``kubelet_healthz_url`` line and nothing on port
  10248: the node stops being renewed after the grace period and its agent reports the
  coordinator unhealthy.

Measured times are printed as ``HEARTBEAT-E2E <name>=<seconds>s`` lines.
"""

import os
import re
import socket

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.config import parse_config, parse_duration
from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION
from yurtcoord.testing.cloudleases import CloudLeaseSampler
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.paths import REPO
from yurtcoord.testing.world import (
    TIMINGS, AgentProcess, ProcessWorld, leader_of, one_leader_all_ready,
)

EXAMPLE_INI = os.path.join(REPO, "etc", "yurtcoord.ini")
GRACE = 3.0
# Heartbeats of these tests: shorter than the suite's, so that a grace period of a few
# seconds still spans several kubelet checks; 3 attempts of 300 ms fit in an interval.
HEARTBEAT = {"interval": "1s", "timeout": "300ms"}
INTERVAL = parse_duration(HEARTBEAT["interval"])
# Deadlines for a loaded 2-core machine; the asserted bounds are separate.
SETTLE_TIMEOUT = 45.0
STEP_TIMEOUT = 30.0
# Slack on the asserted bounds: the agents' renewTime comes from their own clock
# readings at write time, so it does not include delivery; what remains is a process
# that was not scheduled for a moment.
SLACK = 1.0
# How long a stopped renewTime is watched to see that it stays put.
HOLD = 4.0
KUBELET_DEFAULT_PORT = 10248


def report(name, seconds):
    print(f"HEARTBEAT-E2E {name}={seconds:.2f}s")


def nothing_listens_on(port):
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) != 0


class KubeletStoppedTests(unittest.TestCase):
    timeout = 180
    nodes = ("edge-1", "edge-2", "edge-3")

    # One agent's clock is off, as an edge node's that lost NTP: the heartbeats are
    # judged by when the test saw each cloud renewTime increase, never by the time a
    # renewTime names (docs/design.md, "Clocks").
    skewed = {"edge-3": -120.0}

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, kubelet_grace_period=f"{GRACE:g}s")
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for node in self.nodes:
            yield self.world.add_agent(node, clock_offset=self.skewed.get(node, 0.0))

    @defer.inlineCallbacks
    def wait_renewed_after(self, trace, node, since, what):
        """Fire once ``node``'s cloud renewTime was seen to increase after ``since``
        (the test's clock)."""
        try:
            yield poll_until(lambda: trace.seen_increasing(node, since) > 0, STEP_TIMEOUT,
                             0.05, reactor, what=what)
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{self.world.log_tails([node])}") from None

    @defer.inlineCallbacks
    def test_a_stopped_kubelet_ends_the_heartbeat_cut_off_or_connected(self):
        yield self.world.start_agents(heartbeat=HEARTBEAT)
        statuses = yield self.world.wait_for_pool(
            "one leader among 3 agents, all ready", lambda s: one_leader_all_ready(s, 3),
            SETTLE_TIMEOUT)
        leader = leader_of(statuses)
        cut_off, connected = sorted(n for n in self.nodes if n != leader)
        trace = CloudLeaseSampler(self.world.cloud, self.nodes, reactor)
        self.addCleanup(trace.stop)

        # The cut-off node's heartbeat reaches the cloud through the leader.
        yield self.world.cut_cloud([cut_off])
        cut_at = reactor.seconds()
        yield poll_until(
            lambda: (self.world.node_lease(self.world.cloud, cut_off)["metadata"]
                     .get("annotations") or {}).get(DELEGATE_HEARTBEAT_ANNOTATION) == "true",
            STEP_TIMEOUT, 0.05, reactor, what=f"{leader} delegating {cut_off}'s heartbeat")
        yield self.wait_renewed_after(trace, cut_off, reactor.seconds(),
                                      f"{cut_off} renewed through {leader}")
        self.assertGreater(trace.last_increase(cut_off), cut_at)

        # Both kubelets die.
        yield self.world.stop_kubelet(cut_off)
        yield self.world.stop_kubelet(connected)
        stopped_at = reactor.seconds()
        watched = (cut_off, connected)
        # Renewed up to the stop...
        for node in watched:
            self.assertGreaterEqual(trace.last_increase(node),
                                    stopped_at - 2 * INTERVAL - SLACK, node)
        # ...and no more once grace + interval passed, nor for HOLD seconds after.
        deadline = stopped_at + GRACE + INTERVAL
        yield poll_until(lambda: reactor.seconds() >= deadline + SLACK, STEP_TIMEOUT, 0.05,
                         reactor, what="the grace period to run out")
        statuses = yield self.world.wait_for_pool(
            f"{cut_off} and {connected} pending with their kubelets dead",
            lambda s: all(s[n]["role"] == "pending" and not s[n]["coordinator_healthy"]
                          for n in watched), STEP_TIMEOUT)
        self.assertEqual(leader_of(statuses), leader)
        hold_until = reactor.seconds() + HOLD
        yield poll_until(lambda: reactor.seconds() >= hold_until, HOLD + 5, 0.1, reactor,
                         what="the hold period")
        # When the test last saw each renewTime increase: a renewal written after the
        # deadline, directly or forwarded by the leader, would be seen later.
        stopped_renewals = {node: trace.last_increase(node) for node in watched}
        for node in watched:
            self.assertLessEqual(stopped_renewals[node], deadline + SLACK,
                                 f"{node} renewed {stopped_renewals[node] - stopped_at:.2f}s "
                                 f"after its kubelet stopped")
            report(f"{node}.last_renewal_after_kubelet_stop",
                   stopped_renewals[node] - stopped_at)
            self.assertIn("heartbeats stop until it answers", self.world.agents[node].log_text())

        # The kubelets are back: renewed again within 2 intervals.
        for node in watched:
            self.world.start_kubelet(node)
        back_at = reactor.seconds()
        for node in watched:
            yield self.wait_renewed_after(trace, node, back_at,
                                          f"{node} renewed again with its kubelet back")
            first = next(at for at, _renewed in trace.increases[node] if at >= back_at)
            report(f"{node}.renewal_after_kubelet_back", first - back_at)
            self.assertLessEqual(first, back_at + 2 * INTERVAL + SLACK, node)
            self.assertIn("answers again: heartbeats resume", self.world.agents[node].log_text())
        # Still through the leader for the cut-off node.
        annotations = self.world.node_lease(self.world.cloud, cut_off)["metadata"].get(
            "annotations") or {}
        self.assertEqual(annotations.get(DELEGATE_HEARTBEAT_ANNOTATION), "true")
        yield self.world.wait_for_pool(
            "the connected node a follower again",
            lambda s: s[connected]["role"] == "follower" and s[connected]["leader"] == leader,
            STEP_TIMEOUT)


def example_ini_for(text, values, removed):
    """``text`` with each ``(section, key)`` of ``values`` set and each of ``removed``
    dropped, comments and everything else untouched; each must occur exactly once."""
    lines, section, done = [], None, []
    for line in text.splitlines():
        header = re.fullmatch(r"\[([a-z_]+)\]\s*", line)
        if header:
            section = header.group(1)
        match = re.match(r"([a-z_]+)\s*=", line)
        if match and (section, match.group(1)) in removed:
            done.append((section, match.group(1)))
            continue
        if match and (section, match.group(1)) in values:
            done.append((section, match.group(1)))
            line = f"{match.group(1)} = {values[(section, match.group(1))]}"
        lines.append(line)
    expected = sorted([*values, *removed])
    if sorted(done) != expected:
        raise AssertionError(f"example ini keys changed: rewrote {sorted(done)}, "
                             f"expected {expected}")
    return "\n".join(lines) + "\n"


class ExampleConfigTests(unittest.TestCase):
    """``etc/yurtcoord.ini`` as an operator who left out ``kubelet_healthz_url`` runs it
    on a machine without a kubelet."""

    timeout = 120

    @defer.inlineCallbacks
    def setUp(self):
        if not nothing_listens_on(KUBELET_DEFAULT_PORT):
            raise unittest.SkipTest(
                f"something listens on 127.0.0.1:{KUBELET_DEFAULT_PORT} (a kubelet?): "
                "the default kubelet check would find it")
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()

    @defer.inlineCallbacks
    def test_no_kubelet_line_and_no_kubelet_stops_renewals_after_grace(self):
        with open(EXAMPLE_INI, encoding="utf-8") as handle:
            example = handle.read()
        directory = os.path.join(self.world.base_dir, "example")
        node = parse_config(example, EXAMPLE_INI).node.name
        agent = AgentProcess(reactor, node, directory, cloud_proxies=[])
        self.world.agents[node] = agent
        grace = 3.0
        ini = example_ini_for(example, {
            ("cloud", "servers"): self.world.cloud.url,
            ("cloud", "insecure"): "true",
            ("coordinator", "server"): self.world.coordinator.url,
            ("coordinator", "storage"): self.world.etcd.client_url,
            ("coordinator", "pki_dir"): os.path.join(directory, "pki"),
            ("coordinator", "insecure"): "true",
            ("leader_election", "lease_duration"): TIMINGS["leader_election"]["lease_duration"],
            ("leader_election", "renew_deadline"): TIMINGS["leader_election"]["renew_deadline"],
            ("leader_election", "retry_period"): TIMINGS["leader_election"]["retry_period"],
            ("leader_election", "check_interval"): TIMINGS["leader_election"]["check_interval"],
            ("heartbeat", "interval"): HEARTBEAT["interval"],
            ("heartbeat", "timeout"): HEARTBEAT["timeout"],
            ("heartbeat", "healthy_threshold"): "1",
            ("heartbeat", "kubelet_grace_period"): f"{grace:g}s",
            ("pool_cache", "local_cache_dir"): os.path.join(directory, "cache"),
            ("server", "listen"): "127.0.0.1:0",
        }, removed={("heartbeat", "kubelet_healthz_url")})
        config = parse_config(ini, "rewritten example")
        self.assertEqual(config.heartbeat.kubelet_healthz_url,
                         f"http://127.0.0.1:{KUBELET_DEFAULT_PORT}/healthz")
        agent.start(ini)
        yield agent.wait_listening()
        trace = CloudLeaseSampler(self.world.cloud, [node], reactor)
        self.addCleanup(trace.stop)

        # Renewed at first: the grace period counts from the agent's start.
        yield poll_until(lambda: len(trace.seen[node]) >= 2, STEP_TIMEOUT, 0.05, reactor,
                         what=f"{node} renewed during its grace period")
        first = trace.seen[node][0][1]

        # Then no more: the last renewal is within grace + interval of the first.
        @defer.inlineCallbacks
        def stopped_and_unhealthy():
            newest_seen_at = trace.seen[node][-1][0]
            if reactor.seconds() - newest_seen_at < HOLD:
                return False
            status = yield self.world.status(agent)
            return not status["coordinator_healthy"] and not any(status["cloud"].values())

        try:
            yield poll_until(stopped_and_unhealthy, grace + STEP_TIMEOUT, 0.1, reactor,
                             what=f"{node} no longer renewed and reporting unhealthy")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{agent.log_tail()}") from None
        last = trace.last(node)
        report("example.renewed_after_start", last - first)
        self.assertLessEqual(last - first, grace + INTERVAL + SLACK)
        self.assertGreaterEqual(last - first, grace - INTERVAL - SLACK)
        status = yield self.world.status(agent)
        self.assertEqual(status["role"], "pending")
        log = agent.log_text()
        self.assertIn(f"kubelet liveness checked at http://127.0.0.1:{KUBELET_DEFAULT_PORT}"
                      f"/healthz", log)
        self.assertIn("has not answered since the agent started", log)
