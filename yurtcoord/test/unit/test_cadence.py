"""The cadence, on a ``task.Clock`` with exact timings: every transition of its
machine, including the inputs a state refuses."""

import collections
from typing import Any, Callable, Dict, List, Optional

from automat import NoTransition
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors

LOOP = "hub-role-check"


class Boom(Exception):
    pass


@implementer(ILoopErrors)
class CountingSink:
    def __init__(self) -> None:
        self.counts: Dict[str, int] = collections.Counter()

    def count_loop_error(self, loop: str) -> None:
        self.counts[loop] += 1


class Runs:
    """A run that records when it started; with ``hold`` it returns a Deferred the
    test fires (``pending``), else it ends at once (or raises ``raises``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started: List[float] = []
        self.pending: List[defer.Deferred[Any]] = []
        self.hold = False
        self.raises: Optional[Exception] = None
        self.during: Callable[[], object] = lambda: None
        # How many held runs were cancelled; with wind_down, a cancelled run ends only
        # once that Deferred fired.
        self.cancelled = 0
        self.wind_down: Optional[defer.Deferred[None]] = None
        self.on_cancel: Callable[[], object] = lambda: None

    def __call__(self) -> Any:
        self.started.append(self.clock.seconds())
        self.during()
        if self.raises is not None:
            raise self.raises
        if self.hold:
            d: defer.Deferred[Any] = defer.Deferred(self._cancel)
            self.pending.append(d)
            if self.wind_down is not None:
                wind_down = self.wind_down
                d.addErrback(lambda _failure: wind_down)
            return d
        return None

    def _cancel(self, _d: defer.Deferred[Any]) -> None:
        self.cancelled += 1
        self.on_cancel()


class CadenceTests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000.0)
        self.runs = Runs(self.clock)
        self.sink = CountingSink()
        self.assertTrue(verifyObject(ILoopErrors, self.sink))
        self.cadence = Cadence(self.clock, self.runs, 5.0, LOOP, self.sink)

    def offsets(self) -> List[float]:
        return [t - 1000.0 for t in self.runs.started]

    # -- idle ---------------------------------------------------------------------------

    def test_idle_start_runs_at_once_and_then_every_step(self) -> None:
        self.assertFalse(self.cadence.running)
        self.cadence.start()
        self.assertTrue(self.cadence.running)
        self.clock.pump([5.0, 5.0])
        self.assertEqual(self.offsets(), [0.0, 5.0, 10.0])

    def test_a_run_sees_the_cadence_running_and_a_cancelled_run_sees_it_stopped(self) -> None:
        seen: List[bool] = []
        self.runs.during = lambda: seen.append(self.cadence.running)
        self.runs.hold = True
        self.cadence.start()
        self.runs.on_cancel = lambda: seen.append(self.cadence.running)
        self.successResultOf(self.cadence.stop())
        self.assertEqual(seen, [True, False])

    def test_idle_start_later_runs_one_step_from_now(self) -> None:
        self.cadence.start(now=False)
        self.assertTrue(self.cadence.running)
        self.assertEqual(self.offsets(), [])
        self.clock.advance(5.0)
        self.assertEqual(self.offsets(), [5.0])

    def test_idle_restart_and_stop_do_nothing(self) -> None:
        self.cadence.restart()
        self.assertEqual(self.runs.started, [])
        self.assertIsNone(self.successResultOf(self.cadence.stop()))
        self.assertFalse(self.cadence.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_idle_refuses_the_timer_and_the_end_of_a_run(self) -> None:
        machine = self.cadence._machine
        self.assertRaises(NoTransition, machine._due, 1000.0)
        self.assertRaises(NoTransition, machine._ran, None)
        self.assertRaises(NoTransition, machine._wait_until, 1000.0)

    # -- waiting ------------------------------------------------------------------------

    def test_waiting_holds_the_only_timer(self) -> None:
        self.cadence.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1005.0)

    def test_waiting_start_does_nothing(self) -> None:
        self.cadence.start()
        self.cadence.start()
        self.cadence.start(now=False)
        self.clock.advance(5.0)
        self.assertEqual(self.offsets(), [0.0, 5.0])

    def test_waiting_restart_runs_now_and_anchors_the_lattice_there(self) -> None:
        self.cadence.start()
        self.clock.advance(2.0)
        self.cadence.restart()
        self.assertEqual(self.offsets(), [0.0, 2.0])
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(3.0)
        self.assertEqual(self.offsets(), [0.0, 2.0])
        self.clock.advance(2.0)
        self.assertEqual(self.offsets(), [0.0, 2.0, 7.0])

    def test_waiting_stop_cancels_the_timer(self) -> None:
        self.cadence.start()
        self.assertIsNone(self.successResultOf(self.cadence.stop()))
        self.assertFalse(self.cadence.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(10.0)
        self.assertEqual(self.offsets(), [0.0])

    def test_waiting_refuses_the_end_of_a_run(self) -> None:
        self.cadence.start()
        machine = self.cadence._machine
        self.assertRaises(NoTransition, machine._ran, None)
        self.assertRaises(NoTransition, machine._wait_until, 1010.0)

    def test_a_timer_late_by_a_whole_step_runs_once_in_that_instant(self) -> None:
        self.cadence.start()
        self.clock.advance(10.0)  # due 5, runs 10: the slot at 10 is passed with it
        self.assertEqual(self.offsets(), [0.0, 10.0])
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1015.0)

    def test_a_late_timer_runs_once_and_the_next_slot_is_on_the_lattice(self) -> None:
        due: List[float] = []
        self.runs.during = lambda: due.append(self.cadence.due - 1000.0)
        self.cadence.start()
        self.clock.advance(12.0)  # due 5, runs 12: 10 was missed, next 15
        self.assertEqual(self.offsets(), [0.0, 12.0])
        self.clock.advance(2.9)
        self.assertEqual(len(self.runs.started), 2)
        self.clock.advance(0.1)
        self.assertEqual(self.offsets(), [0.0, 12.0, 15.0])
        self.assertEqual(due, [0.0, 5.0, 15.0])

    # -- running ------------------------------------------------------------------------

    def test_running_holds_the_run_and_no_timer(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.assertTrue(self.cadence.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(3.0)
        self.runs.pending[0].callback(None)
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1005.0)

    def test_a_run_longer_than_a_step_skips_the_slots_it_missed(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.clock.advance(11.0)
        self.runs.pending[0].callback(None)
        self.clock.advance(3.9)
        self.assertEqual(len(self.runs.started), 1)
        self.clock.advance(0.1)
        self.assertEqual(self.offsets(), [0.0, 15.0])

    def test_a_run_that_ends_at_the_next_slot_is_followed_at_once(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.clock.advance(5.0)
        self.runs.pending[0].callback(None)
        self.clock.advance(0)
        self.assertEqual(self.offsets(), [0.0, 5.0])

    def test_running_start_does_nothing(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.cadence.start()
        self.cadence.start(now=False)
        self.assertEqual(len(self.runs.started), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_running_restart_runs_again_right_after_once(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.clock.advance(1.0)
        self.cadence.restart()
        self.cadence.restart()
        self.assertTrue(self.cadence.running)
        self.assertEqual(self.offsets(), [0.0])
        self.clock.advance(1.0)
        self.runs.pending[0].callback(None)
        self.assertEqual(self.offsets(), [0.0, 2.0])
        self.runs.pending[1].callback(None)
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1007.0)

    def test_a_restart_from_inside_a_run_that_ends_at_once_runs_after_it(self) -> None:
        self.cadence.start()
        self.clock.advance(1.0)
        def once() -> None:
            self.runs.during = lambda: None
            self.cadence.restart()

        self.runs.during = once
        self.cadence.restart()
        # The run asked for a run again: it came right after, once.
        self.assertEqual(self.offsets(), [0.0, 1.0, 1.0])
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_running_stop_cancels_the_run_and_fires_when_it_ended(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        stopped = self.cadence.stop()
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual(self.runs.cancelled, 1)
        self.assertFalse(self.cadence.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.sink.counts, {})

    def test_running_refuses_the_timer_and_a_second_end(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        machine = self.cadence._machine
        self.assertRaises(NoTransition, machine._due, 1005.0)
        self.assertRaises(NoTransition, machine._wait_until, 1005.0)

    # -- running, then again ------------------------------------------------------------

    def test_running_then_again_stop_cancels_and_runs_no_more(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.cadence.restart()
        self.cadence.start()
        self.assertTrue(self.cadence.running)
        self.assertIsNone(self.successResultOf(self.cadence.stop()))
        self.assertEqual(self.runs.cancelled, 1)
        self.assertEqual(len(self.runs.started), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_running_then_again_refuses_the_timer_and_a_second_hand_over(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.cadence.restart()
        machine = self.cadence._machine
        self.assertRaises(NoTransition, machine._due, 1005.0)
        self.assertRaises(NoTransition, machine._run_again, None)

    # -- stopping -----------------------------------------------------------------------

    def winding_down(self) -> defer.Deferred[None]:
        """Start a run that takes a turn of its own to end once cancelled."""
        self.runs.hold = True
        wound_down = self.runs.wind_down = defer.Deferred()
        self.cadence.start()
        self.runs.wind_down = None
        return wound_down

    def test_stopping_waits_for_the_cancelled_run(self) -> None:
        wound_down = self.winding_down()
        first, second = self.cadence.stop(), self.cadence.stop()
        self.assertFalse(self.cadence.running)
        self.assertNoResult(first)
        self.cadence.restart()
        self.assertEqual(len(self.runs.started), 1)
        wound_down.callback(None)
        self.assertIsNone(self.successResultOf(first))
        self.assertIsNone(self.successResultOf(second))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stopping_refuses_start_until_the_run_has_ended(self) -> None:
        wound_down = self.winding_down()
        stopped = self.cadence.stop()
        self.assertRaises(NoTransition, self.cadence.start)
        self.assertRaises(NoTransition, self.cadence.start, now=False)
        self.assertRaises(NoTransition, self.cadence._machine._due, 1005.0)
        wound_down.callback(None)
        self.successResultOf(stopped)
        self.cadence.start()
        self.assertEqual(len(self.runs.started), 2)

    def test_a_failure_of_a_stopped_run_is_no_error(self) -> None:
        wound_down = self.winding_down()
        stopped = self.cadence.stop()
        wound_down.errback(Boom("cut short"))
        self.successResultOf(stopped)
        self.assertEqual(self.sink.counts, {})

    # -- errors -------------------------------------------------------------------------

    def test_a_run_that_raises_is_counted_and_the_cadence_goes_on(self) -> None:
        self.runs.raises = Boom("sync")
        self.cadence.start()
        self.runs.raises = None
        self.assertEqual(self.sink.counts[LOOP], 1)
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)
        self.clock.advance(5.0)
        self.assertEqual(self.offsets(), [0.0, 5.0])

    def test_a_run_that_fails_later_is_counted_and_the_cadence_goes_on(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.runs.pending[0].errback(Boom("async"))
        self.assertEqual(self.sink.counts[LOOP], 1)
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)
        self.clock.advance(5.0)
        self.assertEqual(self.offsets(), [0.0, 5.0])

    def test_a_cancelled_run_while_running_is_no_error(self) -> None:
        self.runs.hold = True
        self.cadence.start()
        self.runs.pending[0].errback(defer.CancelledError())
        self.assertEqual(self.sink.counts, {})
        self.clock.advance(5.0)
        self.assertEqual(self.offsets(), [0.0, 5.0])

    def test_a_raising_next_interval_is_counted_and_the_next_run_is_a_step_later(self) -> None:
        steps: List[Any] = [Boom("no step"), 3.0, 4.0, 5.0]

        def next_interval() -> float:
            step = steps.pop(0)
            if isinstance(step, Exception):
                raise step
            return float(step)

        cadence = Cadence(self.clock, self.runs, next_interval, LOOP, self.sink,
                          first_step=7.0)
        cadence.start()
        self.assertEqual(self.sink.counts[LOOP], 1)
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1007.0)
        self.clock.advance(7.0)
        self.clock.advance(3.0)
        self.clock.advance(4.0)
        self.assertEqual(self.offsets(), [0.0, 7.0, 10.0, 14.0])

    # -- construction -------------------------------------------------------------------

    def test_what_a_cadence_refuses_to_be_built_with(self) -> None:
        self.assertRaises(ValueError, Cadence, self.clock, self.runs, 5.0, "no-such-loop")
        self.assertRaises(ValueError, Cadence, self.clock, self.runs, 0.0, LOOP)
        self.assertRaises(ValueError, Cadence, self.clock, self.runs, lambda: 5.0, LOOP)
