"""Pool cache synced detection with the real informer against the API test server's
informer sync lease: synced on renewal, not synced on delete and on staleness."""

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
        # renewTime a little ahead (a leader whose clock runs fast): fresh however slowly
        # this machine delivers the event; staleness still counts on the local clock.
        ahead = 5.0
        self.server.store.create(gvrs.LEASES, sync_lease(reactor.seconds() + ahead))
        created = reactor.seconds()
        yield poll_until(lambda: detector.synced, timeout=5.0, what="synced")
        self.assertLess(reactor.seconds() - created, 5.0)
        self.server.store.delete(gvrs.LEASES, "leader-informer-sync", "kube-system")
        yield poll_until(lambda: not detector.synced, what="not synced on delete")
        self.assertEqual(reports, [True, False])

        lease = self.server.store.create(gvrs.LEASES, sync_lease(reactor.seconds() + ahead))
        yield poll_until(lambda: detector.synced, what="synced again")
        renewed = reactor.seconds() + ahead
        lease["spec"] = with_record(lease, LeaseRecord("edge-1", 10, renewed, renewed))["spec"]
        self.server.store.update(gvrs.LEASES, lease)
        yield poll_until(lambda: detector.renewals_seen == 3, what="renewal seen")
        seen = reactor.seconds()
        yield poll_until(lambda: not detector.synced, timeout=10.0, what="stale")
        self.assertGreaterEqual(reactor.seconds() - seen, 0.9,
                                "stale after stale_timeout on the local clock")
        self.assertLess(reactor.seconds(), renewed + 1.0,
                        "a renewTime ahead of the local clock does not extend staleness")
        self.assertEqual(reports, [True, False, True, False])
