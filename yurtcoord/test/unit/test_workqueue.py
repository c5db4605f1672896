"""The keyed work queue on an injected clock: coalescing, the bound on items in flight,
FIFO fairness, per-key backoff, forgetting and stopping, with exact timings."""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.tx.retry import backoff_policy
from yurtcoord.tx.workqueue import WorkQueue


class Boom(Exception):
    pass


class WorkQueueTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        # (key, item, time) of every attempt started.
        self.started = []
        # key -> the Deferred of its running attempt, fired by the test.
        self.running = {}
        self.cancelled = []
        self.succeeded = []
        self.failed = []
        # Set to make attempts finish synchronously instead of being held.
        self.outcome = None

    def work(self, key, item):
        self.started.append((key, item, self.clock.seconds()))
        if self.outcome is not None:
            return self.outcome(key, item)
        d = defer.Deferred(lambda d: self.cancelled.append(key))
        self.running[key] = d
        return d

    def queue(self, max_concurrent=1, merge=None):
        return WorkQueue(
            self.clock, self.work, merge or (lambda old, new: new),
            backoff_policy(initial=1.0, maximum=4.0, jitter=0.0),
            max_concurrent=max_concurrent,
            on_success=lambda key, item, result, failures: self.succeeded.append(
                (key, item, result, failures)),
            on_failure=lambda key, item, failure, failures, delay: self.failed.append(
                (key, item, failure.type, failures, delay)))

    def succeed(self, key, result="ok"):
        self.running.pop(key).callback(result)

    def fail(self, key):
        self.running.pop(key).errback(Boom(key))

    def test_items_offered_while_one_runs_are_merged_into_one_pending_item(self):
        merges = []

        def newest(old, new):
            merges.append((old, new))
            return max(old, new)

        queue = self.queue(merge=newest)
        queue.add("a", 1)
        queue.add("a", 3)
        queue.add("a", 2)
        self.assertEqual(self.started, [("a", 1, 0)])
        self.assertEqual(merges, [(3, 2)])
        self.assertTrue(queue.has_work("a"))
        self.succeed("a")
        self.assertEqual(self.started, [("a", 1, 0), ("a", 3, 0)])
        self.succeed("a")
        self.assertEqual([(key, item) for key, item, _, _ in self.succeeded],
                         [("a", 1), ("a", 3)])
        self.assertFalse(queue.has_work("a"))
        self.assertEqual(queue.in_flight, 0)

    def test_at_most_n_items_run_and_waiting_keys_start_in_fifo_order(self):
        queue = self.queue(max_concurrent=2)
        for key in "abcd":
            queue.add(key, 1)
        self.assertEqual([key for key, _, _ in self.started], ["a", "b"])
        self.assertEqual((queue.in_flight, queue.queued), (2, 2))
        # a is offered again while it runs: it queues behind c and d.
        queue.add("a", 2)
        self.succeed("a")
        self.assertEqual([key for key, _, _ in self.started], ["a", "b", "c"])
        self.succeed("b")
        self.succeed("c")
        self.assertEqual([key for key, _, _ in self.started], ["a", "b", "c", "d", "a"])
        self.assertEqual(self.started[-1][1], 2)
        self.assertEqual((queue.in_flight, queue.queued), (2, 0))
        self.succeed("d")
        self.succeed("a")
        self.assertEqual((queue.in_flight, queue.queued), (0, 0))

    def test_a_failed_key_backs_off_alone_and_a_success_resets_its_backoff(self):
        queue = self.queue(max_concurrent=2)
        calls = {"a": 0}

        def outcome(key, item):
            if key == "a":
                calls["a"] += 1
                return defer.fail(Boom()) if calls["a"] <= 4 else defer.succeed("ok")
            return defer.succeed("ok")

        self.outcome = outcome
        queue.add("a", 1)
        # Backoff 1, 2, 4, 4 (the cap) between the attempts.
        for _ in range(11):
            queue.add("b", 1)  # another key runs at once meanwhile
            self.clock.advance(1)
        self.assertEqual([time for key, _, time in self.started if key == "a"],
                         [0, 1, 3, 7, 11])
        self.assertEqual([(failures, delay) for _, _, _, failures, delay in self.failed],
                         [(1, 1.0), (2, 2.0), (3, 4.0), (4, 4.0)])
        self.assertEqual([key for key, _, _ in self.started].count("b"), 11)
        self.assertEqual([s for s in self.succeeded if s[0] == "a"], [("a", 1, "ok", 4)])
        self.assertEqual(queue.failures("a"), 0)
        # The next failure of a waits the initial delay again.
        calls["a"] = 0
        queue.add("a", 2)
        self.clock.advance(0.999)
        self.assertEqual([time for key, _, time in self.started if key == "a"][-1], 11)
        self.clock.advance(0.001)
        self.assertEqual([time for key, _, time in self.started if key == "a"][-1], 12)
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 14)

    def test_a_success_resets_the_backoff_of_a_key_that_stays_busy(self):
        queue = self.queue()
        queue.add("a", 1)
        self.fail("a")
        self.clock.advance(1)
        self.fail("a")      # second failure: 2 s
        self.clock.advance(2)
        queue.add("a", 2)   # pending while the retry of 1 runs
        self.succeed("a")   # 2 starts at once
        self.assertEqual(self.started[-1], ("a", 2, 3))
        self.fail("a")
        self.assertEqual(self.failed[-1], ("a", 2, Boom, 1, 1.0))

    def test_a_failed_item_waits_its_backoff_merged_with_what_arrived_meanwhile(self):
        queue = self.queue(merge=lambda old, new: old | new)
        queue.add("a", frozenset({1}))
        queue.add("a", frozenset({2}))   # pending while 1 runs
        self.fail("a")
        self.assertEqual(len(self.started), 1, "a failed key waits even with a newer item")
        queue.add("a", frozenset({3}))   # during the pause: merged, still waits
        self.clock.advance(0.999)
        self.assertEqual(len(self.started), 1)
        self.clock.advance(0.001)
        self.assertEqual(self.started[-1], ("a", frozenset({1, 2, 3}), 1.0))
        self.succeed("a")
        self.assertFalse(queue.has_work("a"))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_forgetting_a_key_cancels_its_retry_and_drops_its_pending_item(self):
        queue = self.queue(max_concurrent=1)
        queue.add("a", 1)
        self.fail("a")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        queue.forget("a")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(queue.has_work("a"))
        self.clock.advance(10)
        self.assertEqual(len(self.started), 1)
        # A key waiting for a slot is dropped from the queue too.
        queue.add("b", 1)
        queue.add("c", 1)
        queue.forget("c")
        self.succeed("b")
        self.assertEqual([key for key, _, _ in self.started], ["a", "b"])

    def test_a_running_item_of_a_forgotten_key_finishes_but_is_not_retried(self):
        queue = self.queue()
        queue.add("a", 1)
        queue.add("a", 2)
        queue.forget("a")
        self.assertTrue(queue.running("a"))
        self.fail("a")
        self.assertEqual(self.failed, [("a", 1, Boom, 1, 1.0)])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(queue.has_work("a"))
        # Offered again after the forget while it ran: only the new item is retried.
        queue.add("a", 3)
        queue.forget("a")
        queue.add("a", 4)
        self.running.pop("a").errback(Boom())
        self.clock.advance(1)
        self.assertEqual([item for _, item, _ in self.started], [1, 3, 4])

    def test_stop_cancels_every_running_item_and_timer_and_reports_nothing(self):
        queue = self.queue(max_concurrent=2)
        for key in "abc":
            queue.add(key, 1)
        self.fail("b")     # b waits for its retry, c starts
        queue.add("a", 2)  # pending behind the running a
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        reported = (list(self.succeeded), list(self.failed))
        stopped = queue.stop()
        self.assertEqual(sorted(self.cancelled), ["a", "c"])
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual((list(self.succeeded), list(self.failed)), reported)
        self.assertEqual((queue.in_flight, queue.queued), (0, 0))
        self.clock.advance(60)
        self.assertEqual(len(self.started), 3)
        # Usable again afterwards, from a clean slate.
        queue.add("b", 5)
        self.assertEqual(self.started[-1], ("b", 5, 60))
        self.assertEqual(queue.failures("b"), 0)

    def test_work_finishing_synchronously_drains_a_large_burst(self):
        self.outcome = lambda key, item: defer.succeed(item)
        queue = self.queue(max_concurrent=4)
        for i in range(5000):
            queue.add(i, i)
        self.assertEqual(len(self.succeeded), 5000)
        self.assertEqual((queue.in_flight, queue.queued), (0, 0))

    def test_an_exception_raised_by_the_work_is_a_failed_attempt(self):
        def raises(key, item):
            raise Boom()

        self.outcome = raises
        queue = self.queue()
        queue.add("a", 1)
        self.assertEqual(self.failed, [("a", 1, Boom, 1, 1.0)])
        self.assertTrue(queue.has_work("a"))

    def test_an_exception_while_reporting_is_logged_and_the_queue_goes_on(self):
        def report(key, item, result, failures):
            raise Boom(key)

        self.outcome = lambda key, item: defer.succeed(item)
        queue = WorkQueue(self.clock, self.work, lambda old, new: new,
                          backoff_policy(initial=1.0, maximum=30.0, jitter=0.0),
                          on_success=report)
        queue.add("a", 1)
        queue.add("b", 2)
        self.assertEqual([key for key, _, _ in self.started], ["a", "b"])
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 2)
        self.assertEqual((queue.in_flight, queue.has_work("a")), (0, False))

    def test_max_concurrent_must_be_positive(self):
        with self.assertRaises(ValueError):
            self.queue(max_concurrent=0)

    def test_a_limit_that_changes_is_read_whenever_an_item_could_start(self):
        class Bound:
            limit = 2

        bound = Bound()
        queue = self.queue(max_concurrent=bound)
        for key in "abcdef":
            queue.add(key, 1)
        self.assertEqual([key for key, _, _ in self.started], ["a", "b"])
        # Grown while a and b run: the next finish lets two more start.
        bound.limit = 3
        self.succeed("a")
        self.assertEqual([key for key, _, _ in self.started], ["a", "b", "c", "d"])
        # Shrunk: nothing starts until fewer than the bound run.
        bound.limit = 1
        self.succeed("b")
        self.succeed("c")
        self.assertEqual(queue.in_flight, 1)
        self.assertEqual(len(self.started), 4)
        self.succeed("d")
        self.assertEqual([key for key, _, _ in self.started], ["a", "b", "c", "d", "e"])
