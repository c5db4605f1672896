"""Three agents of one pool over real sockets (issue 5 acceptance).

One cloud and one coordinator Kubernetes API test server, one real etcd, three agents
built by ``make_service`` in this process, each with its own status port and its own
TCP proxy in front of the cloud, so that the cloud can be taken from one agent alone.
Every step is checked through the agents' HTTP pages (``/status``, ``/healthz``,
``/metrics``) and through the servers' own stores, polled with bounded deadlines.

The leak check drives one live agent's coordinator (real etcd, real apiservers)
through 100 role changes directly, with its hub elector and probes stopped so that
nothing but the role changes opens or closes anything.
"""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION
from yurtcoord.kube.lease import renew_time
from yurtcoord.role.roles import Role
from yurtcoord.testing.poll import poll_until
from yurtcoord.sim.tcpproxy import TCPProxy
from yurtcoord.testing.agentpages import StatusReader
from yurtcoord.testing.inprocess import PoolWorld, write_cached_pod

NODES = ("edge-1", "edge-2", "edge-3")
STEP_TIMEOUT = 30.0
ROLE_GAUGE = "node_yurthub_yurt_coordinator_yurthub_role"
HEALTHY_GAUGE = "node_yurthub_yurt_coordinator_healthy_status"
READY_GAUGE = "node_yurthub_yurt_coordinator_ready_status"
ROLE_VALUES = {"leader": 1, "follower": 2, "pending": 3}


class ThreeAgentPoolTests(unittest.TestCase):
    timeout = 240

    @defer.inlineCallbacks
    def setUp(self):
        self.world = PoolWorld(self, shared_etcd=True)
        yield self.world.start()
        self.reader = StatusReader()
        self.proxies = {}
        self.agents = {}
        cloud_port = self.world.cloud.port_number
        for node in NODES:
            proxy = TCPProxy(reactor, "127.0.0.1", cloud_port)
            yield proxy.start()
            self.addCleanup(proxy.stop)
            self.proxies[node] = proxy
            config = self.world.config(node, cloud_urls=[proxy.url()])
            write_cached_pod(config.pool_cache.local_cache_dir, f"pod-of-{node}", 10)
            self.agents[node] = self.world.start_agent(config)
        self.started_at = reactor.seconds()
        self.timings = {}

    # -- reading the agents ------------------------------------------------------------

    def wait_for_pool(self, what, predicate, timeout=STEP_TIMEOUT):
        """Poll every running agent's ``/status`` until ``predicate({node: document})``."""
        return self.world.wait_for_pool(what, predicate, timeout)

    @defer.inlineCallbacks
    def wait_for_metrics(self, node, role, healthy, ready):
        """Poll the agent's ``/metrics`` until the role/healthy/ready gauges read so."""
        url = self.agents[node].status_http.url
        expected = {ROLE_GAUGE: ROLE_VALUES[role], HEALTHY_GAUGE: int(healthy),
                    READY_GAUGE: int(ready)}
        seen = {}

        @defer.inlineCallbacks
        def check():
            samples = yield self.reader.metrics(url)
            seen["gauges"] = {name: samples.get(name) for name in expected}
            return seen["gauges"] == expected

        yield poll_until(check, STEP_TIMEOUT, 0.05, reactor,
                         what=f"/metrics of {node} to read {expected} (last {seen})")

    def one_leader_all_ready(self, statuses):
        roles = sorted(s["role"] for s in statuses.values())
        leaders = {s["leader"] for s in statuses.values()}
        return (roles == ["follower", "follower", "leader"] and len(leaders) == 1
                and None not in leaders and all(s["ready"] for s in statuses.values()))

    @staticmethod
    def leader_of(statuses):
        return next(node for node, s in statuses.items() if s["role"] == "leader")

    @defer.inlineCallbacks
    def check_pool_metrics(self, leader, ready=True):
        for node in NODES:
            role = "leader" if node == leader else "follower"
            yield self.wait_for_metrics(node, role, healthy=True, ready=ready)

    def pool_lease_annotation(self, node):
        return self.world.delegate_annotation(self.world.coordinator, node)

    # -- the scenario ------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_election_cloud_cut_and_coordinator_outage(self):
        # 1. Exactly one leader; every agent names it; all ready.
        statuses = yield self.wait_for_pool("one leader, two followers, all ready",
                                            self.one_leader_all_ready)
        self.timings["start_to_all_ready"] = reactor.seconds() - self.started_at
        leader = self.leader_of(statuses)
        self.assertEqual({s["leader"] for s in statuses.values()}, {leader})
        self.assertEqual(self.world.election_lease().holder_identity, leader)
        yield self.check_pool_metrics(leader)
        for node in NODES:
            code, body = yield self.reader.get(self.agents[node].status_http.url, "healthz")
            self.assertEqual((code, body), (200, b"ok\n"))
        stored = self.world.etcd.read("/registry/pods/", prefix=True)
        self.assertEqual(sorted(stored), sorted(
            f"/registry/pods/default/pod-of-{node}".encode() for node in NODES))

        # 2. The leader loses the cloud: it turns follower, another agent leads, and
        #    the cut node's heartbeat reaches the cloud through the new leader.
        cut = leader
        cloud_lease_before = renew_time(self.world.node_lease(self.world.cloud, cut))
        yield self.proxies[cut].cut()
        cut_at = reactor.seconds()
        statuses = yield self.wait_for_pool(
            f"{cut} follower without the cloud and a new leader",
            lambda s: s[cut]["role"] == "follower" and s[cut]["cloud"] == {
                self.proxies[cut].url(): False}
            and sum(d["role"] == "leader" for d in s.values()) == 1
            # Every agent with the cloud names the one in the leader role (each reads
            # the election lease again once its role changed; until that read answers
            # the new leader may still name the old holder).
            and {d["leader"] for n, d in s.items() if n != cut} == {
                n for n, d in s.items() if d["role"] == "leader"})
        self.timings["cloud_cut_to_new_leader"] = reactor.seconds() - cut_at
        leader = self.leader_of(statuses)
        # Without the cloud an agent takes no part in the election, yet it names the
        # new leader too, as it reads the election lease whatever its role (within a
        # read interval).
        self.assertNotEqual(leader, cut)
        self.assertEqual({d["leader"] for n, d in statuses.items() if n != cut}, {leader})
        statuses = yield self.wait_for_pool(
            f"{cut}, cut off, naming the new leader {leader}",
            lambda s: s[cut]["leader"] == leader)
        yield poll_until(lambda: self.pool_lease_annotation(cut) == "true", STEP_TIMEOUT,
                         0.02, reactor,
                         what=f"{cut}'s lease on the coordinator with the delegate annotation")

        def delegated_to_cloud():
            lease = self.world.node_lease(self.world.cloud, cut)
            annotations = lease["metadata"].get("annotations") or {}
            return (renew_time(lease) > cloud_lease_before
                    and annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true")

        yield poll_until(delegated_to_cloud, STEP_TIMEOUT, 0.02, reactor,
                         what=f"{cut}'s cloud lease renewed by the delegating leader {leader}")
        self.timings["cloud_cut_to_delegated_heartbeat"] = reactor.seconds() - cut_at
        statuses = yield self.wait_for_pool(
            f"leader {leader} counting delegated heartbeats, all ready",
            lambda s: s[leader]["delegated_heartbeats"] > 0 and all(
                d["ready"] for d in s.values()))
        yield self.check_pool_metrics(leader)

        # 3. The cloud comes back for that agent: it stays a follower, stops
        #    delegating, and the pool keeps its leader.
        self.proxies[cut].restore()
        yield self.wait_for_pool(
            f"{cut} with the cloud again",
            lambda s: s[cut]["cloud"] == {self.proxies[cut].url(): True}
            and self.one_leader_all_ready(s) and s[cut]["leader"] == leader)
        yield poll_until(lambda: self.pool_lease_annotation(cut) is None, STEP_TIMEOUT,
                         0.02, reactor, what=f"the delegate annotation removed for {cut}")

        # 4. The coordinator apiserver goes down: every agent pending, /healthz 503.
        yield self.world.coordinator.faults.down()
        down_at = reactor.seconds()
        yield self.wait_for_pool(
            "every agent pending",
            lambda s: all(d["role"] == "pending" and not d["ready"]
                          and not d["coordinator_healthy"] for d in s.values()))
        self.timings["coordinator_down_to_all_pending"] = reactor.seconds() - down_at
        for node in NODES:
            code, body = yield self.reader.get(self.agents[node].status_http.url, "healthz")
            self.assertEqual((code, body), (503, b"not healthy: role pending\n"))
            yield self.wait_for_metrics(node, "pending", healthy=False, ready=False)

        # 5. It comes back: roles and readiness recover, with the same agents.
        agents_before = dict(self.agents)
        yield self.world.coordinator.faults.up()
        up_at = reactor.seconds()
        statuses = yield self.wait_for_pool("one leader, two followers, all ready again",
                                            self.one_leader_all_ready)
        self.timings["coordinator_up_to_all_ready"] = reactor.seconds() - up_at
        leader = self.leader_of(statuses)
        self.assertEqual(self.world.election_lease().holder_identity, leader)
        yield self.check_pool_metrics(leader)
        for node in NODES:
            self.assertIs(self.agents[node], agents_before[node])
            self.assertTrue(self.agents[node].running)
            code, _ = yield self.reader.get(self.agents[node].status_http.url, "healthz")
            self.assertEqual(code, 200)

        # 6. Stopping the leader hands the lease over at once (it was released).
        stop_at = reactor.seconds()
        yield self.agents[leader].stopService()
        self.timings["leader_stop"] = reactor.seconds() - stop_at
        self.assertNotEqual(self.world.election_lease().holder_identity, leader)
        del self.agents[leader]
        yield self.wait_for_pool(
            "a new leader among the two agents left",
            lambda s: sorted(d["role"] for d in s.values()) == ["follower", "leader"]
            and len({d["leader"] for d in s.values()}) == 1,
            timeout=10.0)
        self.timings["leader_stop_to_new_leader"] = reactor.seconds() - stop_at
        print("timings (s):", {name: round(value, 2) for name, value in self.timings.items()})


def _socket_inodes():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def open_fd_count():
    return len(os.listdir("/proc/self/fd"))


def tcp_connection_count():
    """Established TCP connections whose sockets this process holds."""
    ours = _socket_inodes()
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "01" and fields[9] in ours:
                count += 1
    return count


def resource_counts():
    return {"fds": open_fd_count(), "tcp": tcp_connection_count(),
            "delayed_calls": len(reactor.getDelayedCalls())}


class RoleFlipLeakTests(unittest.TestCase):
    """100 role changes of a live coordinator leave nothing behind."""

    timeout = 240
    FLIPS = 100

    @defer.inlineCallbacks
    def setUp(self):
        self.world = PoolWorld(self, shared_etcd=True)
        yield self.world.start()
        self.reader = StatusReader()
        config = self.world.config("edge-1")
        write_cached_pod(config.pool_cache.local_cache_dir, "pod-a", 3)
        self.agent = self.world.start_agent(config)

    def settled(self, role):
        """The coordinator applied ``role`` and, as leader, sees the pool synced."""
        coordinator = self.agent.coordinator
        if coordinator.role != role or coordinator.applying:
            return False
        if role == Role.PENDING:
            return coordinator.store is None
        return coordinator.ready

    @defer.inlineCallbacks
    def quiet_counts(self, baseline=None):
        """Counts once idle pooled connections are closed and, with ``baseline``, once
        they are back to it (bounded); closing connections takes a reactor turn or two."""
        agent = self.agent

        @defer.inlineCallbacks
        def measure():
            for client in [*agent.coordinator_clients.values(), *agent.cloud_clients.values()]:
                yield client.drop_connections()
            yield agent.etcd._transport.pool.closeCachedConnections()
            counts = resource_counts()
            measure.last = counts
            return baseline is None or counts == baseline

        measure.last = None
        yield poll_until(measure, 10.0, 0.05, reactor,
                         what=f"resource counts back at {baseline}")
        return measure.last

    @defer.inlineCallbacks
    def test_hundred_role_flips_leave_no_fds_connections_or_timers(self):
        agent = self.agent
        yield poll_until(lambda: self.settled(Role.LEADER), 30.0, 0.02, reactor,
                         what="edge-1 leading and ready")
        # Only the role changes below may open or close anything from here on.
        yield agent.getServiceNamed("hub-elector").stopService()
        yield agent.getServiceNamed("probes").stopService()
        agent.coordinator.set_role(Role.PENDING)
        yield poll_until(lambda: self.settled(Role.PENDING), 30.0, 0.02, reactor,
                         what="edge-1 pending")
        before = yield self.quiet_counts()

        cycle = (Role.LEADER, Role.FOLLOWER, Role.PENDING)
        flips = 0
        began = reactor.seconds()
        while flips < self.FLIPS or agent.coordinator.role != Role.PENDING:
            role = cycle[flips % len(cycle)]
            agent.coordinator.set_role(role)
            flips += 1
            yield poll_until(lambda: self.settled(role), 30.0, 0.01, reactor,
                             what=f"flip {flips} to {role.value} applied")
        took = reactor.seconds() - began

        after = yield self.quiet_counts(baseline=before)
        self.assertEqual(after, before)
        self.assertGreaterEqual(flips, self.FLIPS)
        print(f"{flips} role flips in {took:.1f}s; counts before and after: {before}")
