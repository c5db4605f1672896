"""Pool cache sync when the leader dies without a word: agents run as ``twistd -n
yurtcoord`` processes (``ProcessWorld``) against a cloud and a coordinator Kubernetes API
test server and a real etcd 3.5, and the leader is killed with SIGKILL. Its follower,
cut from the cloud so that it never leads, must report the pool cache not synced once
the informer sync lease has gone stale: not before, and not much later.

Each agent's ``/status`` page is polled with bounded deadlines; times are taken when an
answer arrives, so every "became X at" is at most one poll round late. The agents
built in the test process are in the integration tier.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.pool.sync import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
from yurtcoord.sim.etcd import etcd_binary_for
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import ProcessWorld, agent_ini
from yurtcoord.testing.cloudobjects import seed_cloud

ETCD_35 = etcd_binary_for("3.5")
# How often /status (and the pool etcd) is sampled while a transition is awaited.
SAMPLE_INTERVAL = 0.02
# Generous deadlines for a loaded 2-core machine; the bounds asserted are separate.
STEP_TIMEOUT = 45.0


class KilledLeaderTests(unittest.TestCase):
    """The leader is a ``twistd`` process killed with SIGKILL: it releases nothing and
    deletes nothing, so its follower can only notice that renewals stopped."""

    timeout = 180
    STALE_TIMEOUT = 3.0
    RENEW = 1.0

    @defer.inlineCallbacks
    def setUp(self):
        if ETCD_35 is None:
            raise unittest.SkipTest("etcd 3.5 not available")
        self.world = ProcessWorld(reactor, etcd_binary=ETCD_35)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        seed_cloud(self.world.cloud, 20)

    def start_agent(self, agent):
        ini = agent_ini(agent.node, agent.cloud_proxy.url(), self.world.coordinator.url,
                        self.world.etcd.client_url, agent.pki_dir, agent.cache_dir,
                        "127.0.0.1:0",
                        pool_cache={"informer_lease_renew": f"{self.RENEW:g}s",
                                    "stale_timeout": f"{self.STALE_TIMEOUT:g}s"})
        agent.start(ini)
        return agent.wait_listening()

    @defer.inlineCallbacks
    def wait_status(self, agent, what, predicate):
        seen = {}

        @defer.inlineCallbacks
        def check():
            seen["status"] = yield self.world.status(agent)
            return predicate(seen["status"])

        yield poll_until(check, STEP_TIMEOUT, SAMPLE_INTERVAL, reactor,
                         what=f"{what} (last: {seen})")
        return seen["status"]

    @defer.inlineCallbacks
    def test_followers_not_synced_within_stale_timeout_of_the_leader_killed(self):
        leader = yield self.world.add_agent("edge-1", pods=2)
        follower = yield self.world.add_agent("edge-2", pods=2)
        # Without the cloud edge-2 never leads: nobody re-syncs once edge-1 is gone.
        yield self.world.cut_cloud(["edge-2"])
        yield self.start_agent(leader)
        yield self.wait_status(leader, "edge-1 leading and ready",
                               lambda s: s["role"] == "leader" and s["ready"])
        yield self.start_agent(follower)
        yield self.wait_status(follower, "edge-2 a synced follower",
                               lambda s: s["role"] == "follower" and s["pool_cache_synced"])

        leader.signal("KILL")
        killed_at = reactor.seconds()
        status = yield self.wait_status(follower, "edge-2 not synced after the kill",
                                        lambda s: not s["pool_cache_synced"])
        delay = reactor.seconds() - killed_at
        yield leader.ended
        print(f"POOLSYNC-AGENTS edge-2: not synced {delay:.2f}s after the leader was killed "
              f"(stale_timeout {self.STALE_TIMEOUT:g}s)")
        self.assertEqual(status["role"], "follower")
        self.assertFalse(status["ready"])
        # Not later than stale_timeout after the last renewal (at most one renewal
        # period before the kill) plus one check...
        self.assertLessEqual(delay, self.STALE_TIMEOUT + 1.0)
        # ...and not earlier: staleness, not a delete or a release, ended it.
        self.assertGreaterEqual(delay, self.STALE_TIMEOUT - self.RENEW - 0.5)
        lease = yield self.world.coordinator_lease(INFORMER_SYNC_LEASE_NAME,
                                                   INFORMER_SYNC_LEASE_NAMESPACE)
        self.assertEqual(lease["spec"]["holderIdentity"], "edge-1")
        holder = yield self.world.election_holder()
        self.assertEqual(holder, "edge-1")
