"""Pool cache synced detection on a Clock with a fake informer: a renewal of the
informer sync lease (a renewTime that changed) is synced at once, no renewal seen for
``stale_timeout`` on the follower's clock is not, and one timer is kept, cancelled on
stop. The leader's clock may be minutes off the follower's (docs/design.md, "Clocks"):
``LeaderClockSkewTests`` run the same renewals with the leader's clock 120 s ahead,
120 s behind and 300 s ahead."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.pool.synced import PoolCacheSyncedDetector
from yurtcoord.testing.clocks import advance
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.poolleases import sync_lease

STALE = 30.0
START = 1_000_000.0
# Seconds between the leader's renewals of the informer sync lease.
RENEW = 10.0


class DetectorOnAClock:
    """A started detector on a Clock at ``START``, its informer listed; mixed into the
    test cases below."""

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


class DetectorClockTests(DetectorOnAClock, unittest.TestCase):

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

    def test_lease_first_seen_counts_as_renewed_then_whatever_its_renew_time(self):
        # As client-go counts a lease it sees first: its renewTime is the leader's
        # clock, which says nothing about this one.
        self.informer.add(sync_lease(START - 3600))
        self.assertEqual(self.reports, [True])
        self.clock.advance(STALE)
        self.assertEqual(self.reports, [True, False])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_update_that_leaves_the_renew_time_does_not_extend_the_timer(self):
        self.informer.add(sync_lease(START))
        self.clock.advance(20)
        # Another resourceVersion, the same renewTime: a write of other fields.
        self.informer.add(sync_lease(START, rv="2"))
        self.assertEqual(self.detector.renewals_seen, 1)
        self.clock.advance(10)
        self.assertEqual(self.reports, [True, False])
        self.informer.add(sync_lease(START, rv="3"))
        self.assertEqual(self.reports, [True, False])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_renew_time_that_moved_backwards_is_a_renewal(self):
        # The leader's clock was stepped back (or another leader, behind, took over).
        self.informer.add(sync_lease(START + 300))
        self.clock.advance(20)
        self.informer.add(sync_lease(START - 100, rv="2"))
        self.clock.advance(STALE - 0.5)
        self.assertEqual(self.reports, [True])
        self.clock.advance(0.5)
        self.assertEqual(self.reports, [True, False])

    def test_the_renew_time_seen_before_a_restart_is_no_renewal_after_it(self):
        # A restart (a role change) lists the lease again: what was seen before counts.
        self.informer.add(sync_lease(START))
        self.detector.stop()
        self.clock.advance(STALE)
        self.detector.start(store=None)
        self.informers[-1].end_list([sync_lease(START)])
        self.assertEqual(self.reports, [True])
        self.assertFalse(self.detector.synced)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # Renewed, then listed again unchanged 10 s later: synced for the 20 s left.
        self.informers[-1].add(sync_lease(START + 1, rv="2"))
        self.clock.advance(10)
        self.detector.stop()
        self.detector.start(store=None)
        self.informers[-1].end_list([sync_lease(START + 1, rv="2")])
        self.assertEqual(self.reports, [True, True, True])
        self.clock.advance(STALE - 10 - 0.5)
        self.assertTrue(self.detector.synced)
        self.clock.advance(0.5)
        self.assertEqual(self.reports, [True, True, True, False])

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


class LeaderClockSkewTests(DetectorOnAClock, unittest.TestCase):
    """A follower's detector while the leader, whose clock is ``offset`` seconds off the
    follower's, renews the informer sync lease every ``RENEW`` seconds writing its own
    clock's time. Synced from the first renewal on and as long as renewals come;
    not synced exactly ``STALE`` after the last renewal seen, on the follower's clock,
    also when a relist delivers the last lease again meanwhile."""

    def setUp(self):
        super().setUp()
        self.written = 0

    def leader_renews(self, offset):
        """One renewal by the leader: renewTime is its clock, ``offset`` s off ours."""
        self.written += 1
        lease = sync_lease(self.clock.seconds() + offset, rv=str(self.written))
        self.informer.add(lease)
        return lease

    def synced_while_renewed_then_not(self, offset):
        self.leader_renews(offset)
        self.assertEqual(self.reports, [True], "synced at the first renewal")
        for _ in range(6):
            advance(self.clock, RENEW)
            last = self.leader_renews(offset)
        self.assertEqual(self.reports, [True], "synced while the leader renews")
        self.assertEqual(self.detector.renewals_seen, 7)
        # The leader dies after its last renewal. The informer delivers its last lease
        # again (a resync, a relist after 410): no renewal, nothing extended.
        advance(self.clock, RENEW)
        self.informer.update(last, last)
        self.informer.add(last)
        advance(self.clock, STALE - RENEW - 0.001)
        self.assertEqual(self.reports, [True], "still within the window of the last renewal")
        advance(self.clock, 0.001)
        self.assertEqual(self.reports, [True, False],
                         "not synced STALE after the last renewal, on the follower's clock")
        self.assertEqual(self.detector.renewals_seen, 7)
        # A new leader, as far off, renews again: synced at once.
        self.leader_renews(offset)
        self.assertEqual(self.reports, [True, False, True])

    def test_leader_120_s_ahead(self):
        self.synced_while_renewed_then_not(+120.0)

    def test_leader_120_s_behind(self):
        self.synced_while_renewed_then_not(-120.0)

    def test_leader_300_s_ahead(self):
        self.synced_while_renewed_then_not(+300.0)
