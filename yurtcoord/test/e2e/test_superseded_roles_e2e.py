"""A superseded leader stops at once, with every agent a separate ``twistd`` process.

Leader L uploads its local cache (its pool etcd link cut mid-upload, so the uploader
keeps retrying) while it forwards the heartbeat of follower F, whose cloud link is cut.
L is then moved to ``pending`` by failing its node lease probes in the coordinator
apiserver. Read from the cloud API test server's request log: no cloud write to F's
lease may arrive later than 1 s after L left the leader role. F cannot lead without
the cloud, so L is the only agent that could write it. When L is healthy again, its
local cache is uploaded in full.
"""

from datetime import datetime, timezone

from twisted.internet import defer, reactor
from twisted.internet.task import LoopingCall
from twisted.trial import unittest

from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.world import PODS_PREFIX, ProcessWorld

STEP_TIMEOUT = 30.0
# How long after the deadline the request log is watched for writes of the old leader.
WATCH_AFTER_DEADLINE = 5.0
# Seconds between two looks at the request log: each request gets the time of the
# last look before it appeared as the earliest time it could have arrived.
STAMP_INTERVAL = 0.02
LEADER, FOLLOWER = "edge-1", "edge-2"


def report(name: str, seconds: float) -> None:
    print(f"FAULT-SUITE {name}={seconds:.2f}s")


def parse_rfc3339(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()


class RequestClock:
    """Earliest arrival time of each request in a test server's request log, from
    looks at the log every ``STAMP_INTERVAL`` (the servers run in this process)."""

    def __init__(self, server: KubeAPIServer):
        self.server = server
        self._looks = []  # (time, requests seen), in order
        self._loop = LoopingCall(self._look)
        self._loop.clock = reactor

    def start(self) -> None:
        self._loop.start(STAMP_INTERVAL, now=True)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def _look(self):
        self._looks.append((reactor.seconds(), len(self.server.requests)))

    def since(self, index: int) -> list:
        """``[(earliest arrival, method, path)]`` of requests from ``index`` on that
        were seen by a look (earliest arrival: the look before)."""
        found, previous = [], (None, 0)
        for when, count in self._looks:
            for position in range(max(previous[1], index), count):
                method, path, _query = self.server.requests[position]
                found.append((previous[0] or when, method, path))
            previous = (when, count)
        return found


def writes_to_lease_of(node: str, requests: list) -> list:
    """Cloud writes that may be a write of ``node``'s lease: a PUT or PATCH of it, or a
    POST creating any node lease (a create's path does not name the lease)."""
    return [(when, method, path) for when, method, path in requests
            if (method in ("PUT", "PATCH") and path.endswith(f"/kube-node-lease/leases/{node}"))
            or (method == "POST" and path.endswith("/kube-node-lease/leases"))]


class LeaderMovedToPendingMidUploadTests(unittest.TestCase):
    timeout = 180
    big_cache = 5000

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        self.leader = yield self.world.add_agent(LEADER, etcd_proxy=True)
        self.follower = yield self.world.add_agent(FOLLOWER, pods=20)
        self.cloud_clock = RequestClock(self.world.cloud)
        self.addCleanup(self.cloud_clock.stop)

    @defer.inlineCallbacks
    def status_of(self, node):
        return (yield self.world.status(self.world.agents[node]))

    @defer.inlineCallbacks
    def wait_status(self, node, what, predicate, timeout=STEP_TIMEOUT, interval=0.05):
        seen = {}

        @defer.inlineCallbacks
        def check():
            try:
                seen["status"] = yield self.status_of(node)
            except Exception as e:  # not listening yet, or busy
                seen["status"] = repr(e)
                return False
            return predicate(seen["status"])

        try:
            yield poll_until(check, timeout, interval, reactor, what=f"{node} {what}")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\nlast status: {seen.get('status')}\n"
                              f"{self.world.log_tails()}") from None
        return seen["status"], reactor.seconds()

    @defer.inlineCallbacks
    def wait_leader_uploading(self):
        """L leads with its etcd link back, has started uploading (some of its pods are
        in the pool etcd, not all), then loses etcd again: the upload keeps retrying."""
        seen = {}

        @defer.inlineCallbacks
        def partly_uploaded():
            seen["count"] = yield self.world.count_etcd(f"{PODS_PREFIX}default/{LEADER}-pod-")
            return 0 < seen["count"] < self.big_cache

        try:
            yield poll_until(partly_uploaded, STEP_TIMEOUT, 0.01, reactor,
                             what=f"{LEADER} uploading its {self.big_cache} cached pods")
        except PollTimeout as e:
            raise PollTimeout(f"{e}: last count {seen.get('count')}\n"
                              f"{self.world.log_tails()}") from None
        yield self.leader.etcd_proxy.cut()
        print(f"FAULT-SUITE leader_moved_to_pending.pods_uploaded_when_cut={seen['count']}")

    @defer.inlineCallbacks
    def test_leader_moved_to_pending_mid_upload_stops_delegating_within_1s(self):
        self.leader.write_pods(self.big_cache, padding=200)
        # L cannot open its pool store until it leads, so that its upload runs in the
        # leader role, after heartbeat delegation started; F can never lead.
        yield self.leader.etcd_proxy.cut()
        yield self.world.cut_cloud([FOLLOWER])
        yield self.world.start_agents()
        yield self.wait_status(LEADER, "leading", lambda s: s["role"] == "leader")
        self.leader.etcd_proxy.restore()
        yield self.wait_leader_uploading()

        # L forwards F's heartbeats while its upload is in flight.
        self.cloud_clock.start()
        mark = len(self.world.cloud.requests)
        yield poll_until(lambda: writes_to_lease_of(FOLLOWER, self.cloud_clock.since(mark)),
                         STEP_TIMEOUT, 0.05, reactor,
                         what=f"{LEADER} writing {FOLLOWER}'s lease to the cloud")
        status = yield self.status_of(LEADER)
        self.assertEqual((status["role"], status["local_cache_uploaded"]), ("leader", False),
                         status)

        # L's node lease probes fail in the coordinator apiserver: L turns pending.
        self.world.coordinator.faults.fail_next(
            1000, code=500, path=f"kube-node-lease/leases/{LEADER}")
        acted_at = reactor.seconds()
        status, seen_pending_at = yield self.wait_status(
            LEADER, "moved to pending", lambda s: s["role"] == "pending", interval=0.02)
        # L left the leader role before we saw it pending, and before the second after
        # its last_transition (whole seconds).
        left_by = min(seen_pending_at, parse_rfc3339(status["last_transition"]) + 1.0)
        deadline = left_by + 1.0
        report("leader_moved_to_pending.fault_to_pending_seen", seen_pending_at - acted_at)

        late = []

        def late_writes():
            late[:] = [w for w in writes_to_lease_of(FOLLOWER, self.cloud_clock.since(mark))
                       if w[0] > deadline]
            return late or reactor.seconds() > deadline + WATCH_AFTER_DEADLINE

        yield poll_until(late_writes, deadline + WATCH_AFTER_DEADLINE - reactor.seconds()
                         + STEP_TIMEOUT, 0.05, reactor, what="the watch of the request log")
        writes = writes_to_lease_of(FOLLOWER, self.cloud_clock.since(mark))
        last = max(when for when, _method, _path in writes)
        report("leader_moved_to_pending.last_follower_lease_write_after_leaving",
               last - left_by)
        self.assertEqual(late, [], f"cloud writes of {FOLLOWER}'s lease more than 1 s "
                         f"after {LEADER} left the leader role at {left_by:.2f} at the "
                         f"latest\n{self.world.log_tails([LEADER])}")
        status = yield self.status_of(LEADER)
        self.assertEqual((status["role"], status["local_cache_uploaded"]),
                         ("pending", False), status)
        self.assertIn("role pending cancels step upload local cache of role leader",
                      self.leader.log_text())

        # Healthy again: L leads and its whole cache is uploaded after all.
        self.world.coordinator.faults.clear()
        self.leader.etcd_proxy.restore()
        yield self.wait_status(LEADER, "leading with its cache uploaded",
                               lambda s: s["role"] == "leader" and s["local_cache_uploaded"],
                               timeout=90)
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        for agent in (self.leader, self.follower):
            self.assertNotIn("Unhandled error in Deferred", agent.log_text())
            self.assertNotIn("Traceback", agent.log_text())
