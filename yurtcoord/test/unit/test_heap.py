"""Full and middle garbage collections held off during bursts of changes, on an
injected clock.

The collections and thresholds asserted are the interpreter's own (``gc.get_stats``,
``gc.get_threshold``): while a burst holds them off, no automatic full or middle
collection can run, so the counts are exact.
"""

import gc

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.tx.heap import MIN_GROWTH, QuietCollections


def full_collections():
    return gc.get_stats()[2]["collections"]


def middle_collections():
    return gc.get_stats()[1]["collections"]


class QuietCollectionsTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *self.threshold)
        self.addCleanup(gc.unfreeze)

    def collector(self, **kwargs):
        collector = QuietCollections(self.clock, **kwargs)
        self.addCleanup(collector.stop)
        return collector

    def test_a_burst_holds_full_collections_off_until_it_is_quiet(self):
        collector = self.collector(quiet=1.0, longest=30.0)
        before = full_collections()
        collector.busy()
        self.assertTrue(collector.holding)
        self.assertEqual(gc.get_threshold()[0], self.threshold[0])
        self.assertGreater(gc.get_threshold()[1], 1_000_000)
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        self.clock.advance(0.5)
        collector.busy()
        self.clock.advance(0.9)
        self.assertEqual(full_collections(), before, "changes arrived 0.9 s ago")
        self.clock.advance(0.1)
        # Nothing was collected since this collector began: its first burst ends in one.
        self.assertEqual(full_collections(), before + 1)
        self.assertEqual(collector.collections, 1)
        self.assertFalse(collector.holding)
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(self.clock.getDelayedCalls(), [], "no timer between bursts")

    def test_a_burst_ends_in_a_full_collection_only_when_the_heap_grew(self):
        collector = self.collector(quiet=1.0, longest=30.0)
        collector.busy()
        self.clock.advance(1.0)
        before = full_collections()
        # A burst that leaves no long-lived objects behind: the thresholds come back,
        # the interpreter's own rules decide when to collect.
        collector.busy()
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        self.clock.advance(1.0)
        self.assertEqual(full_collections(), before)
        self.assertEqual(gc.get_threshold(), self.threshold)
        # One that leaves more than a quarter more (lists moved to the oldest generation).
        grown = max(MIN_GROWTH, len(gc.get_objects(2)) // 4) + 1000
        kept = [[i] for i in range(grown)]
        gc.collect(1)
        collector.busy()
        self.clock.advance(1.0)
        self.assertEqual(full_collections(), before + 1)
        self.assertEqual(collector.collections, 2)
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(len(kept), grown)

    def test_a_burst_holds_middle_collections_off(self):
        # A burst keeps what it brings (an informer's store): young collections still
        # run, but none of the middle generation walks the survivors again.
        collector = self.collector(quiet=1.0, longest=30.0)
        collector.busy()
        young, middle = gc.get_stats()[0]["collections"], middle_collections()
        kept = [[i] for i in range(50 * self.threshold[0] * self.threshold[1])]
        self.assertGreater(gc.get_stats()[0]["collections"], young + 10 * self.threshold[1])
        self.assertEqual(middle_collections(), middle)
        self.clock.advance(1.0)
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(len(kept), 50 * self.threshold[0] * self.threshold[1])

    def test_a_burst_of_objects_that_do_not_stay_leaves_middle_collections_running(self):
        # An upload drops every file it sent: its middle collections go on.
        collector = self.collector(quiet=1.0, longest=30.0, hold_middle=False)
        collector.busy()
        self.assertEqual(gc.get_threshold()[:2], self.threshold[:2])
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        middle = middle_collections()
        kept = [[i] for i in range(50 * self.threshold[0] * self.threshold[1])]
        self.assertGreater(middle_collections(), middle)
        self.clock.advance(1.0)
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(len(kept), 50 * self.threshold[0] * self.threshold[1])

    def test_middle_collections_are_held_while_any_holder_holds_them(self):
        uploading = self.collector(quiet=1.0, longest=30.0, hold_middle=False)
        syncing = self.collector(quiet=2.0, longest=30.0)
        uploading.busy()
        syncing.busy()
        self.assertGreater(gc.get_threshold()[1], 1_000_000)
        self.clock.advance(1.0)
        # The upload's burst is over; pool sync's is not: both still held for it.
        self.assertFalse(uploading.holding)
        self.assertGreater(gc.get_threshold()[1], 1_000_000)
        self.clock.advance(0.5)
        uploading.busy()
        self.clock.advance(0.5)
        self.assertFalse(syncing.holding)
        self.assertTrue(uploading.holding)
        # Only the upload holds now: middle collections run again, full ones wait.
        self.assertEqual(gc.get_threshold()[:2], self.threshold[:2])
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        self.clock.advance(0.5)
        self.assertFalse(uploading.holding)
        self.assertEqual(gc.get_threshold(), self.threshold)

    def test_objects_in_the_middle_generation_count_as_growth(self):
        # A burst's objects that outlived young collections but met no middle one
        # (held off) are long-lived too: they are what the full collection is for.
        collector = self.collector(quiet=1.0, longest=30.0)
        collector.busy()
        self.clock.advance(1.0)
        before = full_collections()
        grown = max(MIN_GROWTH, len(gc.get_objects(2)) // 4) + 1000
        collector.busy()
        kept = [[i] for i in range(grown)]
        gc.collect(0)
        self.assertGreaterEqual(len(gc.get_objects(1)), grown)
        self.clock.advance(1.0)
        self.assertEqual(full_collections(), before + 1)
        self.assertEqual(len(gc.get_objects(1)), 0, "the full collection took them")
        self.assertEqual(len(kept), grown)

    def test_an_endless_burst_is_collected_every_longest_seconds(self):
        collector = self.collector(quiet=1.0, longest=30.0)
        before = full_collections()
        for _ in range(130):
            collector.busy()
            self.clock.advance(0.5)
        # Changes every 0.5 s for 65 s: collected at 30 s and 60 s, still held off.
        self.assertEqual(full_collections(), before + 2)
        self.assertTrue(collector.holding)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        collector.stop()
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(full_collections(), before + 2)

    def test_thresholds_come_back_when_the_last_holder_lets_go(self):
        first = self.collector(quiet=1.0)
        second = self.collector(quiet=5.0)
        first.busy()
        second.busy()
        self.clock.advance(1.0)
        self.assertFalse(first.holding)
        self.assertTrue(second.holding)
        self.assertGreater(gc.get_threshold()[2], 1_000_000, "the second one still holds")
        first.busy()
        first.stop()
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        self.clock.advance(4.0)
        self.assertEqual(gc.get_threshold(), self.threshold)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_freeze_and_stop_thaw_the_heap(self):
        gc.unfreeze()
        collector = self.collector()
        collector.freeze()
        self.assertGreater(gc.get_freeze_count(), 0)
        collector.busy()
        collector.stop()
        self.assertEqual(gc.get_freeze_count(), 0)
        self.assertEqual(gc.get_threshold(), self.threshold)
        # After stop a late change starts nothing.
        collector.busy()
        self.assertFalse(collector.holding)
        self.assertEqual(self.clock.getDelayedCalls(), [])
