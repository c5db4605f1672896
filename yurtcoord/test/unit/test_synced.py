"""Pool cache synced detection on a Clock with a fake informer: a fresh renewal of the
informer sync lease is synced at once, staleness without renewal is not, and one
timer is kept, cancelled on stop."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.pool.synced import PoolCacheSyncedDetector
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.poolleases import sync_lease

STALE = 30.0
START = 1_000_000.0


class DetectorClockTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.reports = []
        self.informers = []
        self.detector = PoolCacheSyncedDetector(
            self.clock, object(), STALE, self.reports.append,
            informer_factory=FakeInformer.factory(self.informers))
        self.detector.start(store=None)
        self.informer = self.informers[-1]
        self.informer.end_list()

    def tearDown(self):
        self.detector.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_watches_only_the_informer_sync_lease(self):
        self.assertEqual((self.informer.gvr, self.informer.namespace,
                          self.informer.field_selector),
                         (gvrs.LEASES, "kube-system", "metadata.name=leader-informer-sync"))
        self.informer.add(sync_lease(START, name="yurthub"))
        self.informer.add(sync_lease(START, namespace="default"))
        self.assertEqual(self.reports, [])

    def test_fresh_renewal_is_synced_at_once(self):
        self.informer.add(sync_lease(START))
        self.assertEqual(self.reports, [True])
        self.assertTrue(self.detector.synced)

    def test_not_synced_after_stale_timeout_without_renewal(self):
        self.informer.add(sync_lease(START))
        self.clock.advance(STALE - 0.5)
        self.assertEqual(self.reports, [True])
        self.clock.advance(0.5)
        self.assertEqual(self.reports, [True, False])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_each_fresh_renewal_resets_the_one_timer(self):
        self.informer.add(sync_lease(START))
        for turn in range(1, 6):
            self.clock.advance(10)
            self.informer.add(sync_lease(self.clock.seconds(), rv=str(turn + 1)))
            self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(STALE - 1)
        self.assertEqual(self.reports, [True], "renewed 29 s ago: still synced")
        self.clock.advance(1)
        self.assertEqual(self.reports, [True, False])

    def test_delete_is_not_synced_at_once(self):
        self.informer.add(sync_lease(START))
        self.informer.delete(sync_lease(START))
        self.assertEqual(self.reports, [True, False])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_lease_renewed_long_ago_is_not_synced(self):
        self.informer.add(sync_lease(START - STALE))
        self.assertEqual(self.reports, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stale_lease_does_not_extend_the_timer(self):
        self.informer.add(sync_lease(START))
        self.clock.advance(20)
        self.informer.add(sync_lease(START - STALE, rv="2"))
        self.clock.advance(10)
        self.assertEqual(self.reports, [True, False])

    def test_stop_cancels_timer_and_ignores_later_events(self):
        self.informer.add(sync_lease(START))
        done = self.detector.stop()
        self.assertTrue(done.called)
        self.assertTrue(self.informer.stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.informer.add(sync_lease(START, rv="2"))
        self.informer.delete(sync_lease(START))
        self.assertEqual(self.reports, [True])
        self.assertFalse(self.detector.synced)

    def test_restart_after_stop(self):
        self.detector.stop()
        self.detector.start(store=None)
        informer = self.informers[-1]
        self.assertIsNot(informer, self.informer)
        informer.end_list([sync_lease(START)])
        self.assertEqual(self.reports, [True])
