"""Heartbeat probes end to end, each agent a separate ``twistd -n yurtcoord`` process.

- Transient errors: ``failed_retry - 1`` consecutive 500s, or timeouts, on the leader's
  cloud node lease write change no role anywhere in the pool (``/status`` role and
  ``last_transition`` of every agent stay put); ``failed_retry`` consecutive 500s make
  the leader's probe fail, and the leader leaves its role.
- Several cloud URLs: one agent (coordinator disabled, so that everything it sends
  to the cloud is its heartbeat) with one URL, then the same node with three URLs,
  each a TCP proxy in front of the one cloud test server. From the server's answer
  log: requests per interval with three URLs at most twice those with one, and no
  409 in steady state.
- Two coordinator apiservers over one store: one node lease write per interval
  through the first, one read of the second, no 409, the election on the first.

Measured values are printed as ``PROBES-E2E <name>=<value>`` lines.
"""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.kube.gvr import LEASES
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import (
    FAILED_RETRY, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, NODE_LEASE_NAMESPACE, ProcessWorld,
    leader_of, one_leader_all_ready,
)

STEP_TIMEOUT = 30.0
SETTLE_TIMEOUT = 60.0
# Steady-state heartbeat rounds counted per run of the several-URLs test.
ROUNDS = 5


def report(name, value):
    print(f"PROBES-E2E {name}={value}")


def lease_path(node):
    return f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{node}"


class TransientCloudErrorsTests(unittest.TestCase):
    """A pool of two agents; faults on the leader's cloud node lease writes."""

    timeout = 240
    nodes = ("edge-1", "edge-2")

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for node in self.nodes:
            yield self.world.add_agent(node, pods=3)
        yield self.world.start_agents()
        self.statuses = yield self.world.wait_for_pool(
            "one leader, all following it, all ready",
            lambda s: one_leader_all_ready(s, len(self.nodes)), SETTLE_TIMEOUT)
        self.leader = leader_of(self.statuses)
        self.path = lease_path(self.leader)

    def roles(self, statuses):
        return {node: (s["role"], s["last_transition"]) for node, s in statuses.items()}

    def puts_answered(self, code=None):
        return [a for a in self.world.cloud.answers
                if a[1] == "PUT" and a[2] == self.path and (code is None or a[3] == code)]

    @defer.inlineCallbacks
    def ride_out(self, queue_fault, what):
        """Queue ``failed_retry - 1`` faults on the leader's lease PUTs, wait until
        they were met and a PUT after them was answered 200, and return how long
        that took."""
        faults = self.world.cloud.faults
        queue_fault(FAILED_RETRY - 1)
        queued_at = reactor.seconds()
        yield poll_until(lambda: faults.queued == 0, STEP_TIMEOUT, 0.05, reactor,
                         what=f"{what}: the leader's lease writes met the faults")
        met_at = reactor.seconds()
        yield poll_until(
            lambda: any(at >= met_at for at, *_ in self.puts_answered(200)),
            STEP_TIMEOUT, 0.05, reactor,
            what=f"{what}: the leader's lease written after the faults")
        return reactor.seconds() - queued_at

    @defer.inlineCallbacks
    def test_failed_retry_minus_one_failures_change_no_role(self):
        before = self.roles(self.statuses)
        faults = self.world.cloud.faults
        for round_number in range(2):
            took = yield self.ride_out(
                lambda n: faults.fail_next(n, code=500, method="PUT", path=self.path),
                f"500s round {round_number}")
            report(f"500s_round_{round_number}_to_lease_written", f"{took:.2f}s")
        took = yield self.ride_out(
            lambda n: faults.hang_next(n, method="PUT", path=self.path), "timeouts")
        report("timeouts_to_lease_written", f"{took:.2f}s")
        # A hung attempt ends after the heartbeat timeout: both were given up on.
        self.assertGreaterEqual(took, (FAILED_RETRY - 1) * HEARTBEAT_TIMEOUT)
        self.assertEqual(len(self.puts_answered(500)), 2 * (FAILED_RETRY - 1))
        # The elector checks every 500 ms: give it two heartbeats more to react.
        written = len(self.puts_answered(200))
        yield poll_until(lambda: len(self.puts_answered(200)) >= written + 2, STEP_TIMEOUT,
                         0.05, reactor, what="two more lease writes")
        after = self.roles((yield self.world.statuses()))
        self.assertEqual(after, before, self.world.log_tails())
        agent = self.world.agents[self.leader]
        self.assertNotIn(f"server {agent.cloud_proxy.url()} is unhealthy", agent.log_text())

    @defer.inlineCallbacks
    def test_failed_retry_failures_change_the_leaders_role(self):
        before = self.roles(self.statuses)
        self.world.cloud.faults.fail_next(FAILED_RETRY, code=500, method="PUT", path=self.path)
        failed_at = reactor.seconds()
        statuses = yield self.world.wait_for_pool(
            "the leader leaves its role",
            lambda s: s[self.leader]["role"] != "leader", STEP_TIMEOUT)
        report("failed_retry_500s_to_role_change", f"{reactor.seconds() - failed_at:.2f}s")
        self.assertNotEqual(self.roles(statuses)[self.leader], before[self.leader])
        self.assertIn("is unhealthy: ServerError: injected failure",
                      self.world.agents[self.leader].log_text())
        # The cloud answers again: the pool settles with a leader.
        yield self.world.wait_for_pool(
            "one leader again", lambda s: one_leader_all_ready(s, len(self.nodes)),
            SETTLE_TIMEOUT)


class SeveralCloudURLsTests(unittest.TestCase):
    """The same node heartbeating through one cloud URL, then through three."""

    timeout = 240
    node = "edge-1"

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()

    @defer.inlineCallbacks
    def run_agent(self, cloud_urls):
        """Run the node with ``cloud_urls`` URLs for ``ROUNDS`` steady heartbeat
        rounds; returns (lease requests, other requests, codes) of those rounds."""
        agent = yield self.world.add_agent(self.node, cloud_urls=cloud_urls)
        yield self.world.start_agents([self.node], coordinator={"enabled": "false"})
        yield poll_until(lambda: self.world.cloud.store.get(
            *self.lease_key()) is not None, STEP_TIMEOUT, 0.05, reactor,
            what="the node lease in the cloud")
        status = yield poll_until_status(self.world, agent, cloud_urls)
        self.assertEqual(sorted(status["cloud"]), sorted(p.url() for p in agent.cloud_proxies))
        metrics = yield self.world.metrics(agent)
        healthy = {name: value for name, value in metrics.items()
                   if name.startswith("node_yurthub_server_healthy_status{")}
        self.assertEqual(len(healthy), cloud_urls, healthy)
        self.assertEqual(set(healthy.values()), {1.0})
        # Steady state: from the second write on, ROUNDS rounds, each cut halfway
        # between two writes.
        start = len(self.writes())
        yield poll_until(lambda: len(self.writes()) >= start + ROUNDS + 2,
                         STEP_TIMEOUT + ROUNDS * HEARTBEAT_INTERVAL, 0.1, reactor,
                         what=f"{ROUNDS + 2} heartbeat writes")
        writes = self.writes()
        begin = writes[start][0] - HEARTBEAT_INTERVAL / 2
        end = writes[start + ROUNDS][0] - HEARTBEAT_INTERVAL / 2
        answers = [a for a in self.world.cloud.answers if begin <= a[0] < end]
        yield agent.stop()
        del self.world.agents[self.node]
        # The next run of the node starts a log of its own (its status URL is read there).
        os.replace(agent.log_path, f"{agent.log_path}.{cloud_urls}-urls")
        lease = [a for a in answers if a[2] == lease_path(self.node)]
        other = [a for a in answers if a[2] != lease_path(self.node)]
        return lease, other, sorted({a[3] for a in answers})

    def lease_key(self):
        return LEASES, self.node, NODE_LEASE_NAMESPACE

    def writes(self):
        return [a for a in self.world.cloud.answers
                if a[1] == "PUT" and a[2] == lease_path(self.node)]

    @defer.inlineCallbacks
    def test_three_urls_at_most_double_the_requests_and_no_conflicts(self):
        one_lease, one_other, one_codes = yield self.run_agent(1)
        three_lease, three_other, three_codes = yield self.run_agent(3)
        per_minute = 60.0 / HEARTBEAT_INTERVAL / ROUNDS
        for name, lease, other in (("one_url", one_lease, one_other),
                                   ("three_urls", three_lease, three_other)):
            report(f"{name}_node_lease_requests_per_minute", f"{len(lease) * per_minute:.1f}")
            report(f"{name}_other_requests_per_minute", f"{len(other) * per_minute:.1f}")
            methods = sorted({a[1] for a in lease})
            report(f"{name}_node_lease_requests_in_{ROUNDS}_rounds",
                   ",".join(f"{m}:{sum(1 for a in lease if a[1] == m)}" for m in methods))
        self.assertEqual(len(one_lease), ROUNDS)  # one write per interval
        self.assertGreater(len(three_lease), len(one_lease))  # the other URLs are read
        self.assertLessEqual(len(three_lease) + len(three_other),
                             2 * (len(one_lease) + len(one_other)))
        self.assertEqual(sum(1 for a in three_lease if a[1] == "PUT"), ROUNDS)
        self.assertEqual(one_codes, [200])
        self.assertEqual(three_codes, [200])  # no 409 (nor anything else) in steady state
        self.assertNotIn(409, [a[3] for a in self.world.cloud.answers])


class SeveralCoordinatorServersTests(unittest.TestCase):
    """One leading node with two coordinator apiservers over one store: its node
    lease is written through one of them once per interval and read from the
    other, never conflicting with itself, and the election goes to the first."""

    timeout = 240
    node = "edge-1"

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, coordinator_servers=2)
        self.addCleanup(self.world.stop)
        yield self.world.start()

    def writes(self, server):
        return [a for a in server.answers
                if a[1] == "PUT" and a[2] == lease_path(self.node)]

    @defer.inlineCallbacks
    def test_one_write_and_one_read_per_interval_and_no_conflicts(self):
        first, second = self.world.coordinators
        agent = yield self.world.add_agent(self.node)
        yield self.world.start_agents([self.node])
        yield self.world.wait_for_pool(
            "the node leading and ready with both coordinator apiservers healthy",
            lambda s: one_leader_all_ready(s, 1) and s[self.node]["coordinator_servers"] == {
                first.url: True, second.url: True}, SETTLE_TIMEOUT)
        metrics = yield self.world.metrics(agent)
        self.assertEqual(
            {name: value for name, value in metrics.items()
             if name.startswith("yurtcoord_coordinator_server_healthy_status{")},
            {f'yurtcoord_coordinator_server_healthy_status{{server="{url}"}}': 1.0
             for url in (first.url, second.url)})
        start = len(self.writes(first))
        yield poll_until(lambda: len(self.writes(first)) >= start + ROUNDS + 2,
                         STEP_TIMEOUT + ROUNDS * HEARTBEAT_INTERVAL, 0.1, reactor,
                         what=f"{ROUNDS + 2} heartbeat writes through the first server")
        writes = self.writes(first)
        begin = writes[start][0] - HEARTBEAT_INTERVAL / 2
        end = writes[start + ROUNDS][0] - HEARTBEAT_INTERVAL / 2
        lease = {name: [a[1] for a in server.answers
                        if begin <= a[0] < end and a[2] == lease_path(self.node)]
                 for name, server in (("first", first), ("second", second))}
        report("two_coordinator_servers_node_lease_requests_in_5_rounds", lease)
        self.assertEqual(lease, {"first": ["PUT"] * ROUNDS, "second": ["GET"] * ROUNDS})
        for server in (first, second):
            self.assertNotIn(409, [a[3] for a in server.answers])
        election = [a for a in second.answers if "/leases/" in a[2]
                    and not a[2].endswith(lease_path(self.node))]
        self.assertEqual(election, [])  # the election and sync leases go to the first


@defer.inlineCallbacks
def poll_until_status(world, agent, cloud_urls):
    """The agent's ``/status`` once it shows ``cloud_urls`` healthy servers."""
    found = {}

    @defer.inlineCallbacks
    def check():
        status = yield world.status(agent)
        found["status"] = status
        return len(status["cloud"]) == cloud_urls and all(status["cloud"].values())

    yield poll_until(check, STEP_TIMEOUT, 0.1, reactor,
                     what=f"{cloud_urls} cloud servers healthy in /status")
    return found["status"]
