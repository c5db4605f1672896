"""2,000 idle connections against the leader's status port, agents as ``twistd`` processes.

A ``ProcessWorld`` with two agents of one pool, each started with a soft limit of
1,024 open files (``RLIMIT_NOFILE``, inherited from this process at spawn), the way a
small edge node runs them. The follower's cloud link is cut so that the leader
delegates its heartbeats. Then this process opens 2,000 connections to the leader's
status port, in batches, and sends nothing on them. While they are held:

- the leader keeps its election lease (same holder, renewTime never older than the
  lease duration) and keeps renewing its own node lease in the cloud;
- the cut follower's cloud lease keeps receiving forwarded heartbeats;
- the agent holds at most ``MAX_STATUS_CONNECTIONS`` of them once the batches end
  (the ones in its probe reserve go after ``PROBE_REQUEST_DEADLINE``) and drops the
  ones it holds once ``STATUS_REQUEST_DEADLINE`` has passed.

Afterwards ``/healthz`` answers on a fresh connection. Measured figures are printed
as ``STATUS-FLOOD <name>=<value>`` lines; on a shared two-core machine the agent held
at most 86 descriptors, its election lease was never older than 0.5 s and 22 to 32 of
the follower's heartbeats were forwarded while the flood lasted. With the probe
reserve (which holds up to 256 connections not read from yet) one run measured at
most 353 descriptors, the election lease never older than 0.56 s and 6 heartbeats
forwarded while opening the flood took 14.6 s. Without the limits the agent never
closed the idle connections.
"""

import os
import resource

from twisted.internet import defer, protocol, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial import unittest

from yurtcoord.heartbeat.probes import NODE_LEASE_NAMESPACE
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import renew_time
from yurtcoord.agent.status import MAX_STATUS_CONNECTIONS, STATUS_REQUEST_DEADLINE
from yurtcoord.testing.cloudleases import CloudLeaseChanges
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import (
    HEARTBEAT_INTERVAL, LEASE_DURATION, ProcessWorld,
    leader_of,
    one_leader_all_ready,
)

NODES_OF_POOL = ("edge-1", "edge-2")
AGENT_OPEN_FILES = 1024
FLOOD = 2000
BATCH = 100
# Descriptors this process needs besides the flood (etcd, servers, proxies, agents).
OWN_SPARE = 500
SETTLE_TIMEOUT = 45.0
STEP_TIMEOUT = 30.0
# How long the flood is held and watched: longer than the election lease and the
# status request deadline together.
HOLD = LEASE_DURATION + STATUS_REQUEST_DEADLINE + 2.0
SAMPLE_EVERY = 0.1
# What a renewal may take beyond the heartbeat interval: the write itself, on a loaded
# machine.
OWN_LEASE_SLACK = 1.5


def report(name, value):
    print(f"STATUS-FLOOD {name}={value}")


def raise_own_open_files(needed):
    """Raise this process's soft RLIMIT_NOFILE to at least ``needed`` (up to the hard
    limit); the previous soft limit, or None when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        return None
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return soft


class Idle(protocol.Protocol):
    """A client connection that sends nothing; notes when the server closes it."""

    def __init__(self, flood):
        self.flood = flood

    def connectionMade(self):
        self.flood.open.add(self)

    def connectionLost(self, reason):
        self.flood.open.discard(self)
        self.flood.closed += 1


class Flood:
    def __init__(self, port):
        self.endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=10)
        self.open = set()
        self.closed = 0
        self.failed = 0
        self.most_open = 0

    @defer.inlineCallbacks
    def start(self, count, batch):
        for first in range(0, count, batch):
            attempts = [connectProtocol(self.endpoint, Idle(self))
                        for _ in range(min(batch, count - first))]
            results = yield defer.DeferredList(attempts, consumeErrors=True)
            self.failed += sum(1 for ok, _ in results if not ok)
            self.most_open = max(self.most_open, len(self.open))

    def close_all(self):
        for connection in list(self.open):
            connection.transport.abortConnection()


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class StatusFloodTests(unittest.TestCase):
    timeout = 240

    @defer.inlineCallbacks
    def setUp(self):
        previous = raise_own_open_files(FLOOD + OWN_SPARE)
        if previous is None:
            raise unittest.SkipTest(f"this process may not open {FLOOD + OWN_SPARE} files "
                                    f"(hard RLIMIT_NOFILE too low)")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (previous, hard))
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for node in NODES_OF_POOL:
            yield self.world.add_agent(node)
        self.cloud_log = CloudLeaseChanges(self.world.cloud, reactor)
        self.addCleanup(self.cloud_log.stop)
        # The agents inherit the soft limit in force when they are spawned.
        resource.setrlimit(resource.RLIMIT_NOFILE, (AGENT_OPEN_FILES, hard))
        try:
            started = self.world.start_agents()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        yield started
        statuses = yield self.world.wait_for_pool(
            "one leader among 2 agents, the other following it, both ready",
            lambda s: one_leader_all_ready(s, len(NODES_OF_POOL)), SETTLE_TIMEOUT)
        self.leader = leader_of(statuses)
        self.follower = next(n for n in NODES_OF_POOL if n != self.leader)

    def agent_pid(self, node):
        return self.world.agents[node]._child.transport.pid

    @defer.inlineCallbacks
    def election(self):
        lease = yield self.world.election_lease()
        spec = (lease or {}).get("spec", {})
        return spec.get("holderIdentity"), renew_time(lease) if lease else None

    def own_lease_renewed(self, node):
        lease = self.world.cloud.store.get(LEASES, node, NODE_LEASE_NAMESPACE)
        return renew_time(lease) if lease else None

    @defer.inlineCallbacks
    def test_two_thousand_idle_connections_leave_election_probes_and_delegation_working(self):
        world, leader, follower = self.world, self.leader, self.follower
        agent = world.agents[leader]
        with open(f"/proc/{self.agent_pid(leader)}/limits", encoding="ascii") as f:
            limits = f.read()
        self.assertRegex(limits, rf"Max open files\s+{AGENT_OPEN_FILES}\s")

        # The follower cut off from the cloud: the leader forwards its heartbeats.
        yield world.cut_cloud([follower])
        cut_at = reactor.seconds()
        yield poll_until(lambda: len(self.cloud_log.delegated(follower, cut_at)) >= 2,
                         STEP_TIMEOUT, 0.05, reactor,
                         what=f"{leader} forwarding {follower}'s heartbeats")

        port = int(agent.url.rsplit(":", 1)[1].split("/")[0])
        flood = Flood(port)
        fds = []
        samples = []

        @defer.inlineCallbacks
        def sample():
            holder, renewed = yield self.election()
            now = reactor.seconds()
            own = self.own_lease_renewed(leader)
            samples.append((now, holder, now - renewed if renewed else None,
                            now - own if own else None))
            fds.append(open_fds(self.agent_pid(leader)))

        sampler = task.LoopingCall(sample)
        sampler.clock = reactor
        sampler.start(SAMPLE_EVERY)
        self.addCleanup(lambda: sampler.running and sampler.stop())
        self.addCleanup(flood.close_all)

        flood_at = reactor.seconds()
        yield flood.start(FLOOD, BATCH)
        report("flood_opened_in", f"{reactor.seconds() - flood_at:.2f}s")
        report("connect_failures", flood.failed)
        # The agent closes what is past its limit at once, and the rest at the deadline.
        yield poll_until(lambda: len(flood.open) <= MAX_STATUS_CONNECTIONS, STEP_TIMEOUT,
                         0.05, reactor, what="the agent closing connections past its limit")
        report("most_open_after_a_batch", flood.most_open)
        yield poll_until(lambda: not flood.open, STATUS_REQUEST_DEADLINE + STEP_TIMEOUT,
                         0.05, reactor, what="the agent dropping the idle connections")
        report("all_dropped_after", f"{reactor.seconds() - flood_at:.2f}s")
        # Keep watching until the whole hold time has passed.
        yield poll_until(lambda: reactor.seconds() - flood_at >= HOLD, HOLD + 5, 0.1, reactor)
        sampler.stop()

        held = [s for s in samples if s[0] >= flood_at]
        report("samples", len(held))
        self.assertGreater(len(held), HOLD / SAMPLE_EVERY / 2)
        holders = {holder for _, holder, _, _ in held}
        self.assertEqual(holders, {leader}, f"election lease holders {holders}\n"
                                            f"{world.log_tails()}")
        oldest_election = max(age for _, _, age, _ in held)
        oldest_own = max(age for _, _, _, age in held)
        report("oldest_election_renew_time", f"{oldest_election:.2f}s (lease "
                                             f"{LEASE_DURATION:.0f}s)")
        report("oldest_own_node_lease_renew_time", f"{oldest_own:.2f}s (heartbeat "
                                                   f"{HEARTBEAT_INTERVAL:.0f}s)")
        self.assertLess(oldest_election, LEASE_DURATION, world.log_tails())
        # Renewed once per heartbeat interval; one missed renewal would add another.
        self.assertLess(oldest_own, HEARTBEAT_INTERVAL + OWN_LEASE_SLACK, world.log_tails())
        forwarded = self.cloud_log.delegated(follower, flood_at)
        report("heartbeats_forwarded_during_flood", len(forwarded))
        self.assertGreaterEqual(len(forwarded), 4, world.log_tails())
        known = [n for n in fds if n is not None]
        report("agent_open_fds_max", max(known) if known else "unknown")
        if known:
            self.assertLess(max(known), AGENT_OPEN_FILES)
        log = agent.log_text()
        self.assertNotIn("Too many open files", log)
        self.assertIn(f"status connections at the limit of {MAX_STATUS_CONNECTIONS}", log)

        # A fresh connection is answered now that the idle ones are gone.
        response = yield world.http.get(f"{agent.url}/healthz", timeout=5)
        body = yield response.content()
        self.assertEqual((response.code, body), (200, b"ok\n"))
        statuses = yield world.statuses()
        self.assertEqual(statuses[leader]["role"], "leader")
