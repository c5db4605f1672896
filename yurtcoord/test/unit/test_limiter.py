"""The adaptive bound on requests in flight, step by step on an injected clock: growth
near the baseline, one decrease per round for failed requests or lasting slowness
(not for one stall across the requests in flight), the bounds, and
a baseline that follows the remote within two windows."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.tx.limiter import AdaptiveLimit


class AdaptiveLimitTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()

    def limit(self, initial=4, minimum=2, maximum=6, **kwargs):
        kwargs.setdefault("tolerance", 2.0)
        kwargs.setdefault("slack", 0.0)
        kwargs.setdefault("decrease", 0.5)
        kwargs.setdefault("window", 10.0)
        return AdaptiveLimit(self.clock, initial, minimum, maximum, **kwargs)

    def request(self, limit, latency, in_flight=None, succeeded=True):
        """One request of ``latency`` seconds, started now with ``in_flight`` in flight
        (the limit's bound unless given), finished after the clock advanced."""
        started = self.clock.seconds()
        self.clock.advance(latency)
        limit.sample(started, limit.limit if in_flight is None else in_flight, succeeded)

    def test_grows_by_one_after_a_round_of_fast_requests_at_the_bound(self):
        limit = self.limit(initial=4)
        for _ in range(3):
            self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 4)
        self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 5)
        # The next round is as long as the new bound.
        for _ in range(4):
            self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 5)
        self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 6)

    def test_never_grows_past_the_maximum(self):
        limit = self.limit(initial=6, maximum=6)
        for _ in range(20):
            self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 6)

    def test_does_not_grow_while_the_bound_holds_nothing_back(self):
        limit = self.limit(initial=4)
        for _ in range(20):
            self.request(limit, 0.0078125, in_flight=3)
        self.assertEqual(limit.limit, 4)

    def test_latency_within_tolerance_of_the_baseline_still_grows(self):
        limit = self.limit(initial=2)
        self.request(limit, 0.0078125)  # baseline 1/128 s
        self.request(limit, 0.015625)  # exactly 2x: near enough
        self.assertEqual(limit.limit, 3)

    def test_slack_widens_what_counts_as_near(self):
        limit = self.limit(initial=4, slack=0.0078125)
        self.request(limit, 0.0078125)
        self.request(limit, 0.0234375)  # 2 x 1/128 s + 1/128 s
        self.assertEqual(limit.limit, 4)
        self.request(limit, 0.0234376)
        self.request(limit, 0.0234376)  # slow again, started after the first: it lasts
        self.assertEqual(limit.limit, 2)

    def test_lasting_slowness_multiplies_the_bound_by_decrease(self):
        limit = self.limit(initial=6, decrease=0.5)
        self.request(limit, 0.0078125)
        self.request(limit, 0.016)  # more than 2x the baseline: slowness seen
        self.assertEqual(limit.limit, 6)
        self.request(limit, 0.016)  # started after it was seen, slow too
        self.assertEqual(limit.limit, 3)

    def test_a_short_stall_across_every_request_in_flight_keeps_the_bound(self):
        limit = self.limit(initial=6, minimum=1, maximum=8, decrease=0.5)
        self.request(limit, 0.0078125)  # baseline
        # Six requests in flight when the remote (or the machine) stalls 1/4 s: all
        # six finish slow, one after the other, as the stall ends.
        started = self.clock.seconds()
        self.clock.advance(0.25)
        for _ in range(6):
            self.clock.advance(0.0009765625)
            limit.sample(started, 6, True)
        self.assertEqual(limit.limit, 6)
        # The requests started after it are fast again: the bound still grows.
        for _ in range(6):
            self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 7)
        # A later stall is one stall again, not the confirmation of the first.
        started = self.clock.seconds()
        self.clock.advance(0.25)
        limit.sample(started, 7, True)
        self.assertEqual(limit.limit, 7)

    def test_a_fast_request_started_before_the_slowness_does_not_clear_it(self):
        limit = self.limit(initial=6, decrease=0.5)
        self.request(limit, 0.0078125)  # baseline
        self.request(limit, 0.0625)  # slowness seen now
        mark = self.clock.seconds()
        self.clock.advance(0.00390625)
        limit.sample(mark - 0.0009765625, 6, True)  # fast, but started before the mark
        self.request(limit, 0.0625)  # started after the mark: slow, it lasts
        self.assertEqual(limit.limit, 3)

    def test_a_failed_request_decreases_and_drops_the_growth_credits(self):
        limit = self.limit(initial=4, maximum=8, decrease=0.75)
        for _ in range(3):
            self.request(limit, 0.0078125)  # 3 of 4 credits
        self.request(limit, 0.0009765625, succeeded=False)
        self.assertEqual(limit.limit, 3)  # int(4 * 0.75)
        self.request(limit, 0.0078125)
        self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 3)  # the credits started again from 0
        self.request(limit, 0.0078125)
        self.assertEqual(limit.limit, 4)

    def test_requests_started_before_a_decrease_do_not_decrease_again(self):
        limit = self.limit(initial=6, minimum=1, decrease=0.5)
        self.request(limit, 0.0078125)  # baseline
        self.request(limit, 0.125)  # slowness seen
        # Four requests of one slow round, all started at t, after the mark.
        started = self.clock.seconds()
        self.clock.advance(0.125)
        limit.sample(started, 6, True)
        self.assertEqual(limit.limit, 3)
        for _ in range(3):
            self.clock.advance(0.0009765625)
            limit.sample(started, 6, False)
        self.assertEqual(limit.limit, 3)
        # A request started after the decrease ran under the new bound: it counts.
        self.request(limit, 0.125)
        self.assertEqual(limit.limit, 1)

    def test_never_shrinks_below_the_minimum(self):
        limit = self.limit(initial=4, minimum=2, decrease=0.5)
        for _ in range(5):
            self.request(limit, 1.0, succeeded=False)
        self.assertEqual(limit.limit, 2)

    def test_the_baseline_follows_a_slower_remote_within_two_windows(self):
        limit = self.limit(initial=4, window=10.0)
        self.request(limit, 0.0078125)
        self.assertEqual(limit.baseline, 0.0078125)
        self.clock.advance(10.0)  # a new window: the old best is the previous one
        self.request(limit, 0.0625)
        self.request(limit, 0.0625)
        self.assertEqual(limit.baseline, 0.0078125)
        self.assertEqual(limit.limit, 2)  # 1/16 s, twice, is slow against 1/128 s
        self.clock.advance(10.0)  # two windows on: only 1/16 s is left
        self.assertEqual(limit.baseline, 0.0625)
        self.request(limit, 0.0625)
        self.request(limit, 0.0625)
        self.assertEqual(limit.limit, 3)  # 1/16 s is the remote's pace now: it grows

    def test_a_long_quiet_spell_forgets_the_baseline(self):
        limit = self.limit(window=10.0)
        self.request(limit, 0.0078125)
        self.clock.advance(25.0)
        self.assertEqual(limit.baseline, float("inf"))
        self.request(limit, 0.09375)  # the first sample after it is the baseline
        self.assertEqual(limit.baseline, 0.09375)
        self.assertEqual(limit.limit, 4)

    def test_bad_settings_are_refused_with_the_setting_named(self):
        for kwargs, word in [({"initial": 1, "minimum": 2}, "minimum"),
                             ({"initial": 7, "maximum": 6}, "maximum"),
                             ({"minimum": 0, "initial": 1}, "minimum"),
                             ({"tolerance": 0.5}, "tolerance"),
                             ({"slack": -1.0}, "slack"),
                             ({"decrease": 1.0}, "decrease"),
                             ({"window": 0.0}, "window")]:
            error = self.assertRaises(ValueError, self.limit, **kwargs)
            self.assertIn(word, str(error))
