"""The reactor lag probe: how late its cadence ran, exactly, on a Clock."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.testing.logcapture import capture_log
from yurtcoord.tx.reactorlag import ReactorLagProbe


class ReactorLagProbeTests(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.lags = []
        self.probe = ReactorLagProbe(self.clock, interval=0.5, warn_after=2.0)
        self.probe.add_observer(self.lags.append)
        self.addCleanup(self.probe.stop)

    def test_on_time_calls_report_no_lag(self):
        self.probe.start()
        self.clock.pump([0.5, 0.5, 0.5])
        self.assertEqual(self.lags, [0.0, 0.0, 0.0])
        self.assertEqual(self.probe.longest, 0.0)

    def test_a_stall_is_the_lag_of_the_call_due_first_in_it(self):
        self.probe.start()
        self.clock.advance(0.5)
        # The reactor is busy from 0.5 to 1.8: the call due at 1.0 runs at 1.8.
        self.clock.advance(1.3)
        self.assertEqual(self.lags, [0.0, 0.8])
        # The cadence skips the boundary at 1.5 and calls next at 2.0: on time.
        self.clock.advance(0.2)
        self.assertEqual(self.lags, [0.0, 0.8, 0.0])
        self.assertEqual(self.probe.longest, 0.8)

    def test_a_late_call_after_a_skipped_boundary_counts_from_its_own_due_time(self):
        self.probe.start()
        self.clock.advance(1.75)   # due 0.5, runs 1.75: next due 2.0
        self.clock.advance(0.5)    # runs 2.25: 0.25 late, not 0.75
        self.assertEqual(self.lags, [1.25, 0.25])

    def test_a_lag_past_the_bound_is_logged_once_with_its_length(self):
        lines = capture_log(self.probe)
        self.probe.start()
        self.clock.advance(0.5 + 2.5)
        self.clock.advance(0.5)
        self.assertEqual(lines, ["reactor ran a timer 2.500s late, longer than the probe "
                                 "timeout 2.0s: timers due meanwhile (probes, lease renewals) "
                                 "ran late too"])

    def test_stop_ends_the_calls_and_start_again_counts_afresh(self):
        self.probe.start()
        self.clock.advance(1.5)
        self.probe.stop()
        self.assertFalse(self.probe.running)
        self.clock.advance(5.0)
        self.assertEqual(self.lags, [1.0])
        self.probe.start()
        self.assertEqual(self.probe.longest, 0.0)
        self.clock.advance(0.5)
        self.assertEqual(self.lags, [1.0, 0.0])

    def test_an_interval_that_is_not_positive_is_refused(self):
        with self.assertRaises(ValueError) as raised:
            ReactorLagProbe(self.clock, interval=0)
        self.assertIn("interval", str(raised.exception))
