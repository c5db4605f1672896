"""Heartbeat probes end to end, each agent a separate ``twistd -n yurtcoord`` process:
one live test per kind of fault, proving the wiring (faults injected in the test
servers reach the agents' probes, roles, ``/status`` and ``/metrics``). The logic, to
the instant, is proved on a ``Clock`` in ``yurtcoord/test/unit/test_probes_clock.py``
(transient errors, several cloud URLs) and ``SeveralCoordinatorServersTests`` in
``yurtcoord/test/unit/test_health.py`` (several coordinator apiservers).

- Transient errors: ``failed_retry`` consecutive 500s on the leader's cloud node lease
  write make the leader's probe fail, and the leader leaves its role; the pool
  settles with a leader again.
- Several cloud URLs: one agent (coordinator disabled, so that everything it sends
  to the cloud is its heartbeat) with three URLs, each a TCP proxy in front of the
  one cloud test server. From the server's answer log: one node lease write per
  interval, reads besides, at most two lease requests per interval, and no 409.
- Two coordinator apiservers over one store: one node lease write per interval
  through the first, one read of the second, no 409, the election on the first.

Measured values are printed as ``PROBES-E2E <name>=<value>`` lines.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.kube.gvr import LEASES
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import (
    FAILED_RETRY, HEARTBEAT_INTERVAL, NODE_LEASE_NAMESPACE, ProcessWorld,
    leader_of, one_leader_all_ready,
)

STEP_TIMEOUT = 30.0
SETTLE_TIMEOUT = 60.0
# Steady-state heartbeat rounds counted by the several-servers tests.
ROUNDS = 3


def report(name, value):
    print(f"PROBES-E2E {name}={value}")


def lease_path(node):
    return f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{node}"


class TransientCloudErrorsTests(unittest.TestCase):
    """A pool of two agents; faults on the leader's cloud node lease writes. That
    ``failed_retry - 1`` of them change no role is proved on a Clock, by
    ``TransientCloudErrorsTests.test_failed_retry_minus_one_failures_change_no_role``
    in ``yurtcoord/test/unit/test_probes_clock.py``."""

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
    """A node heartbeating through three cloud URLs. That three URLs send at most
    twice the requests of one is proved on a Clock, by
    ``SeveralCloudURLsTests.test_three_urls_at_most_double_the_requests_and_no_conflicts``
    in ``yurtcoord/test/unit/test_probes_clock.py``."""

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
        # Steady state: from the next write on, ROUNDS rounds, each cut halfway
        # between two writes.
        start = len(self.writes())
        yield poll_until(lambda: len(self.writes()) >= start + ROUNDS + 1,
                         STEP_TIMEOUT + ROUNDS * HEARTBEAT_INTERVAL, 0.1, reactor,
                         what=f"{ROUNDS + 1} heartbeat writes")
        writes = self.writes()
        begin = writes[start][0] - HEARTBEAT_INTERVAL / 2
        end = writes[start + ROUNDS][0] - HEARTBEAT_INTERVAL / 2
        answers = [a for a in self.world.cloud.answers if begin <= a[0] < end]
        lease = [a for a in answers if a[2] == lease_path(self.node)]
        other = [a for a in answers if a[2] != lease_path(self.node)]
        return lease, other, sorted({a[3] for a in answers})

    def lease_key(self):
        return LEASES, self.node, NODE_LEASE_NAMESPACE

    def writes(self):
        return [a for a in self.world.cloud.answers
                if a[1] == "PUT" and a[2] == lease_path(self.node)]

    @defer.inlineCallbacks
    def test_three_urls_write_through_one_read_the_others_and_no_conflicts(self):
        """Three proxies of the one cloud, all shown healthy in ``/status`` and
        ``/metrics``; in steady state one node lease write per interval, reads of the
        others besides, no more than two lease requests per interval, nothing else
        sent, and every answer 200."""
        lease, other, codes = yield self.run_agent(3)
        per_minute = 60.0 / HEARTBEAT_INTERVAL / ROUNDS
        report("three_urls_node_lease_requests_per_minute", f"{len(lease) * per_minute:.1f}")
        report("three_urls_other_requests_per_minute", f"{len(other) * per_minute:.1f}")
        methods = sorted({a[1] for a in lease})
        report(f"three_urls_node_lease_requests_in_{ROUNDS}_rounds",
               ",".join(f"{m}:{sum(1 for a in lease if a[1] == m)}" for m in methods))
        self.assertEqual(sum(1 for a in lease if a[1] == "PUT"), ROUNDS)
        self.assertIn("GET", methods)  # the other URLs are read
        self.assertLessEqual(len(lease), 2 * ROUNDS)
        self.assertEqual(other, [])
        self.assertEqual(codes, [200])  # no 409 (nor anything else) in steady state
        self.assertNotIn(409, [a[3] for a in self.world.cloud.answers])


class SeveralCoordinatorServersTests(unittest.TestCase):
    """One leading node with two coordinator apiservers over one store: its node
    lease is written through one of them once per interval and read from the
    other, never conflicting with itself, and the election goes to the first. The
    same cadence, to the instant, on a Clock:
    ``SeveralCoordinatorServersTests.test_one_lease_write_and_one_read_per_interval`` in
    ``yurtcoord/test/unit/test_health.py``."""

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
        yield poll_until(lambda: len(self.writes(first)) >= start + ROUNDS + 1,
                         STEP_TIMEOUT + ROUNDS * HEARTBEAT_INTERVAL, 0.1, reactor,
                         what=f"{ROUNDS + 1} heartbeat writes through the first server")
        writes = self.writes(first)
        begin = writes[start][0] - HEARTBEAT_INTERVAL / 2
        end = writes[start + ROUNDS][0] - HEARTBEAT_INTERVAL / 2
        lease = {name: [a[1] for a in server.answers
                        if begin <= a[0] < end and a[2] == lease_path(self.node)]
                 for name, server in (("first", first), ("second", second))}
        report(f"two_coordinator_servers_node_lease_requests_in_{ROUNDS}_rounds", lease)
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
