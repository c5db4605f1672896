"""Pool cache synced detection with the real informer against the API test server's
informer sync lease: synced on renewal, also when the leader's clock is minutes behind
this one, not synced on delete, and not synced ``stale_timeout`` after the last change of
renewTime seen, whatever renewTime says and whatever else is written meanwhile."""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.lease import LeaseRecord, with_record
from yurtcoord.pool.synced import PoolCacheSyncedDetector
from yurtcoord.sim.apiserver.clients import start_server_with_client
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.poolleases import sync_lease


class DetectorLiveTests(unittest.TestCase):
    """The real informer against the API test server's lease."""

    @defer.inlineCallbacks
    def setUp(self):
        self.server, self.client = yield start_server_with_client(self, reactor)

    @defer.inlineCallbacks
    def test_synced_on_renewal_not_synced_on_delete_and_on_staleness(self):
        reports = []
        detector = PoolCacheSyncedDetector(reactor, self.client, 1.0, reports.append)
        self.addCleanup(detector.stop)
        yield detector.start(store=None)
        # renewTime two minutes behind (a leader whose clock runs slow): synced however
        # old it looks to this clock.
        behind = -120.0
        self.server.store.create(gvrs.LEASES, sync_lease(reactor.seconds() + behind))
        created = reactor.seconds()
        yield poll_until(lambda: detector.synced, timeout=5.0, what="synced")
        self.assertLess(reactor.seconds() - created, 5.0)
        self.server.store.delete(gvrs.LEASES, "leader-informer-sync", "kube-system")
        yield poll_until(lambda: not detector.synced, what="not synced on delete")
        self.assertEqual(reports, [True, False])

        # renewTime a little ahead (a leader whose clock runs fast): staleness still
        # counts on the local clock, from the renewal seen.
        ahead = 5.0
        lease = self.server.store.create(gvrs.LEASES, sync_lease(reactor.seconds() + ahead))
        yield poll_until(lambda: detector.synced, what="synced again")
        renewed = reactor.seconds() + ahead
        lease["spec"] = with_record(lease, LeaseRecord("edge-1", 10, renewed, renewed))["spec"]
        lease = self.server.store.update(gvrs.LEASES, lease)
        yield poll_until(lambda: detector.renewals_seen == 3, what="renewal seen")
        seen = reactor.seconds()
        # A write of other fields only: seen, but no renewal.
        lease["metadata"]["labels"] = {"touched": "true"}
        self.server.store.update(gvrs.LEASES, lease)
        yield poll_until(lambda: not detector.synced, timeout=10.0, what="stale")
        self.assertGreaterEqual(reactor.seconds() - seen, 0.9,
                                "stale after stale_timeout on the local clock")
        self.assertLess(reactor.seconds(), renewed + 1.0,
                        "a renewTime ahead of the local clock does not extend staleness")
        self.assertEqual(detector.renewals_seen, 3)
        self.assertEqual(reports, [True, False, True, False])
