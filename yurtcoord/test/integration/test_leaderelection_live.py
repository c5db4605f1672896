"""Three electors over real sockets against the Kubernetes API test server, while
the leader is repeatedly stopped gracefully or killed.

A "kill" is ``stop(release=False)``: timers and the request in flight are dropped
and the lease is left to expire, as when the process dies. (Its
``on_stopped_leading`` still fires; the shared tracker takes that as the moment
the dead leader stopped acting.)

Bounds (timings: lease 2 s, renew deadline 1.5 s, retry 0.3 s):
- graceful stop → new leader within retry_period + 0.5 s;
- kill → new leader within lease_duration + retry_period + LOAD_SLACK. Candidates
  watching a live holder poll every retry_period and wake exactly at the local
  expiry, so the rule itself needs lease_duration + retry_period plus request
  latency; LOAD_SLACK (0.4 s) absorbs request latency and reactor delays on a
  loaded CI machine (measured on an idle one: about 0.05 s).
"""

from twisted.internet import defer, reactor
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.trial import unittest

from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord
from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.poll import poll_until

NS, NAME = "kube-system", "yurthub"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 2.0, 1.5, 0.3
LOAD_SLACK = 0.4
ABRUPT_BOUND = LEASE_DURATION + RETRY_PERIOD + LOAD_SLACK
GRACEFUL_BOUND = RETRY_PERIOD + 0.5
RUN_FOR = 10.0


class LeadershipTracker:
    """Who leads, according to the callbacks of every elector; records any overlap
    and checks each new leader against the lease object on the server."""

    def __init__(self, server):
        self.server = server
        self.leaders = set()
        self.violations = []
        self.started = []          # (time, identity)

    def lease_record(self):
        return LeaseRecord.from_lease(self.server.store.get(LEASES, NAME, NS))

    def on_started(self, identity):
        if self.leaders:
            self.violations.append(f"{identity} started leading while {self.leaders} lead")
        holder = self.lease_record().holder_identity
        if holder != identity:
            self.violations.append(f"{identity} started leading but the lease says {holder!r}")
        self.leaders.add(identity)
        self.started.append((reactor.seconds(), identity))

    def on_stopped(self, identity):
        if identity not in self.leaders:
            self.violations.append(f"{identity} stopped leading without having started")
        self.leaders.discard(identity)

    @property
    def leader(self):
        return next(iter(self.leaders)) if len(self.leaders) == 1 else None


class LiveElectionTests(unittest.TestCase):
    timeout = 60
    log = Logger()

    @defer.inlineCallbacks
    def setUp(self):
        self.server = KubeAPIServer(reactor)
        url = yield self.server.start(port=0)
        self.tracker = LeadershipTracker(self.server)
        self.clients = []
        self.electors = {}
        for n in (1, 2, 3):
            identity = f"edge-{n}"
            client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=5.0))
            self.clients.append(client)
            self.electors[identity] = self.make_elector(identity, client)
        self.sampler = LoopingCall(self.sample)
        self.sampler.clock = reactor
        self.samples = 0

    @defer.inlineCallbacks
    def tearDown(self):
        if self.sampler.running:
            self.sampler.stop()
        yield defer.gatherResults([e.stop(release=False) for e in self.electors.values()])
        for client in self.clients:
            yield client.close()
        yield self.server.stop()

    def make_elector(self, identity, client):
        config = LeaderElectionConfig(
            lease_namespace=NS, lease_name=NAME, identity=identity,
            lease_duration=LEASE_DURATION, renew_deadline=RENEW_DEADLINE,
            retry_period=RETRY_PERIOD, release_on_cancel=True)
        return LeaderElector(
            reactor, client, config,
            on_started_leading=lambda: self.tracker.on_started(identity),
            on_stopped_leading=lambda: self.tracker.on_stopped(identity))

    def sample(self):
        """Every few ms: at most one elector believes it leads, and it is the
        lease's holder."""
        self.samples += 1
        leading = [i for i, e in self.electors.items() if e.is_leader]
        if len(leading) > 1:
            self.tracker.violations.append(f"two electors lead at once: {leading}")
        if leading:
            lease = self.server.store.get(LEASES, NAME, NS)
            holder = LeaseRecord.from_lease(lease).holder_identity
            if holder != leading[0]:
                self.tracker.violations.append(
                    f"{leading[0]} believes it leads but the lease says {holder!r}")

    @defer.inlineCallbacks
    def wait_for_renewals(self, leader, count):
        """Wait until ``leader`` has renewed the lease ``count`` more times."""
        seen = {self.tracker.lease_record().renew_time}

        def renewed():
            record = self.tracker.lease_record()
            if record.holder_identity == leader:
                seen.add(record.renew_time)
            return len(seen) > count

        yield poll_until(renewed, RENEW_DEADLINE * count, what=f"{count} renewals by {leader}")

    @defer.inlineCallbacks
    def test_one_leader_at_a_time_through_stops_and_kills(self):
        self.sampler.start(0.005, now=True)
        began = reactor.seconds()
        for elector in self.electors.values():
            elector.start()
        yield poll_until(lambda: self.tracker.leader is not None, 5.0, what="a first leader")

        takeovers = {"graceful": [], "kill": []}
        rounds = 0
        while reactor.seconds() - began < RUN_FOR or min(map(len, takeovers.values())) < 2:
            leader = self.tracker.leader
            self.assertIsNotNone(leader, "nobody leads")
            yield self.wait_for_renewals(leader, 3)
            mode = "graceful" if rounds % 2 == 0 else "kill"
            rounds += 1
            stopped_at = reactor.seconds()
            transitions = self.tracker.lease_record().lease_transitions
            stopping = self.electors[leader].stop(release=(mode == "graceful"))
            yield poll_until(lambda: self.tracker.leader not in (None, leader),
                             ABRUPT_BOUND + 5.0, what=f"a new leader after {mode} of {leader}")
            started_at, successor = self.tracker.started[-1]
            takeovers[mode].append(started_at - stopped_at)
            self.assertNotEqual(successor, leader)
            self.assertEqual(self.tracker.lease_record().lease_transitions, transitions + 1)
            released = yield stopping
            self.assertEqual(released, mode == "graceful")
            self.electors[leader].start()

        self.sampler.stop()
        self.assertEqual(self.tracker.violations, [])
        self.assertGreater(self.samples, 100)
        for delay in takeovers["graceful"]:
            self.assertLessEqual(delay, GRACEFUL_BOUND, f"graceful takeovers: {takeovers}")
        for delay in takeovers["kill"]:
            self.assertLessEqual(delay, ABRUPT_BOUND, f"takeovers after kills: {takeovers}")
            # Nobody took over before the lease could have expired.
            self.assertGreaterEqual(delay, LEASE_DURATION - RETRY_PERIOD - 0.1)
        self.log.info("takeover delays (s): graceful={graceful} kill={kill}", **takeovers)

    @defer.inlineCallbacks
    def start_and_wait_for_leader(self):
        self.sampler.start(0.005, now=True)
        for elector in self.electors.values():
            elector.start()
        yield poll_until(lambda: self.tracker.leader is not None, 5.0, what="a first leader")
        leader = self.tracker.leader
        yield self.wait_for_renewals(leader, 2)
        return leader

    @defer.inlineCallbacks
    def test_server_down_and_back(self):
        """The leader gives up within renew_deadline of losing the server, nobody
        leads while it is down, and a leader is back soon after it returns."""
        leader = yield self.start_and_wait_for_leader()
        went_down = reactor.seconds()
        yield self.server.faults.down()
        yield poll_until(lambda: not self.tracker.leaders, RENEW_DEADLINE + 5.0,
                         what=f"{leader} to stop leading")
        gave_up_after = reactor.seconds() - went_down
        self.assertLessEqual(gave_up_after, RENEW_DEADLINE + LOAD_SLACK)
        # Not before renew_deadline after its last renewal (at most one retry
        # period, plus the request, before the server went down).
        self.assertGreaterEqual(gave_up_after, RENEW_DEADLINE - RETRY_PERIOD - 0.1)
        self.assertEqual([e for e in self.electors.values() if e.is_leader], [])

        came_back = reactor.seconds()
        yield self.server.faults.up()
        yield poll_until(lambda: self.tracker.leader is not None,
                         LEASE_DURATION + 5.0, what="a leader after the server came back")
        back_after = self.tracker.started[-1][0] - came_back
        # Candidates retry with jitter after errors: up to retry_period * 2.2.
        self.assertLessEqual(back_after, LEASE_DURATION + RETRY_PERIOD * 2.2 + LOAD_SLACK)
        yield self.wait_for_renewals(self.tracker.leader, 2)
        self.sampler.stop()
        self.assertEqual(self.tracker.violations, [])
        self.log.info("server down: leader gave up after {gave_up:.3f}s; "
                      "leader again {back:.3f}s after the server came back",
                      gave_up=gave_up_after, back=back_after)

    @defer.inlineCallbacks
    def test_leader_rides_out_failed_renewals_shorter_than_renew_deadline(self):
        leader = yield self.start_and_wait_for_leader()
        terms = len(self.tracker.started)
        # Three renewals in a row answered 500: about 3 * retry_period < renew_deadline.
        first_request = len(self.server.requests)
        self.server.faults.fail_next(3, code=500, method="PUT")
        yield self.wait_for_renewals(leader, 3)
        self.sampler.stop()
        puts = [r for r in self.server.requests[first_request:] if r[0] == "PUT"]
        self.assertGreaterEqual(len(puts), 3 + 3)    # the failed ones came first
        self.assertEqual(self.tracker.leader, leader)
        self.assertEqual(len(self.tracker.started), terms)
        self.assertEqual(self.tracker.violations, [])
