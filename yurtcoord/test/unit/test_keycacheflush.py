"""The key cache flusher's machine on a Clock (``yurtcoord.pool.keycacheflush``): every
input in every state, the illegal ones included, with the exact times of the writes;
writes in a thread run on a thread pool the test steps by hand."""

from typing import Any, Callable, List, Tuple

from automat import NoTransition
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial import unittest
from zope.interface import Interface, implementer
from zope.interface.verify import verifyObject

from yurtcoord.kube import gvr
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keycacheflush import KeyCacheFlusher, key_cache_flusher
from yurtcoord.testing.logcapture import GlobalLogCapture

INTERVAL = 1.0
START = 100.0


class IThreadPoolCalls(Interface):
    """What ``deferToThreadPool`` asks of a thread pool."""

    def callInThreadWithCallback(onResult, func, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` in a thread, then ``onResult(ok, result)``."""


@implementer(IThreadPoolCalls)
class SteppedThreadPool:
    """Keeps each call until the test runs it with ``finish``; ``started`` holds the
    clock's time of each call."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: List[Tuple[Callable[..., Any], Callable[..., Any], Any, Any]] = []
        self.started: List[float] = []

    def callInThreadWithCallback(self, onResult, func, *args, **kwargs):
        self.started.append(self.clock.seconds())
        self.calls.append((onResult, func, args, kwargs))

    def finish(self, error: Exception | None = None) -> None:
        """Run the oldest call (really), or fail it with ``error`` without running it."""
        on_result, func, args, kwargs = self.calls.pop(0)
        if error is not None:
            on_result(False, Failure(error))
        else:
            on_result(True, func(*args, **kwargs))


@implementer(IReactorThreads)
class ThreadedClock(Clock):
    """A Clock with a thread pool; calls from threads run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = SteppedThreadPool(self)

    def getThreadPool(self):
        return self.pool

    def suggestThreadPoolSize(self, size):
        pass

    def callFromThread(self, callable, *args, **kwargs):
        callable(*args, **kwargs)

    def callInThread(self, callable, *args, **kwargs):
        self.pool.callInThreadWithCallback(lambda ok, result: None, callable, *args,
                                           **kwargs)


class FlusherTestCase(unittest.TestCase):
    threaded = True

    def setUp(self) -> None:
        self.clock = ThreadedClock() if self.threaded else Clock()
        # The thread pool the flusher's writes run on (unused without threads).
        self.pool = (self.clock.pool if isinstance(self.clock, ThreadedClock)
                     else SteppedThreadPool(self.clock))
        self.clock.advance(START)
        self.cache = ComponentKeyCache.in_directory(self.mktemp()).load()
        # Times of the writes on the reactor, and of the writes started in a thread.
        self.here: List[float] = []
        self.threads: List[float] = self.pool.started if self.threaded else []
        write = self.cache.write

        def write_here() -> None:
            self.here.append(self.clock.seconds())
            write()

        self.cache.write = write_here
        self.flusher: KeyCacheFlusher = key_cache_flusher(self.clock, self.cache, INTERVAL)
        self.keys = 0

    def change(self) -> None:
        self.keys += 1
        self.cache.add("leader-yurthub", gvr.PODS, [f"/registry/pods/ns/p{self.keys}"])

    def on_disk(self) -> int:
        return len(ComponentKeyCache(self.cache.path, rebuilt_components=()).load()
                   .keys("leader-yurthub"))

    def assertIllegal(self, *inputs: str) -> None:
        for name in inputs:
            self.assertRaises(NoTransition, getattr(self.flusher, name))

    # The states, reached through the public inputs.

    def enter_waiting(self) -> None:
        """A write at START, a change and a request: the timer until START + 1."""
        self.change()
        self.flusher.flush_now()
        self.change()
        self.flusher.flush_soon()
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()],
                         [START + INTERVAL])

    def enter_writing(self) -> None:
        self.change()
        self.flusher.flush_soon()
        self.assertEqual(len(self.pool.calls), 1)

    def enter_closed(self) -> None:
        self.successResultOf(self.flusher.close())


class FakesTests(unittest.TestCase):
    def test_the_fakes_provide_their_interfaces(self) -> None:
        clock = ThreadedClock()
        self.assertTrue(verifyObject(IReactorThreads, clock))
        self.assertTrue(verifyObject(IThreadPoolCalls, clock.getThreadPool()))


class IdleTests(FlusherTestCase):
    def test_flush_soon_when_due_writes_in_a_thread(self) -> None:
        self.change()
        self.flusher.flush_soon()
        self.assertEqual(self.threads, [START])
        self.assertEqual(self.here, [])
        self.assertFalse(self.cache.dirty)
        self.pool.finish()
        self.assertEqual(self.on_disk(), 1)
        # Back in idle: the end of the write is not expected again.
        self.assertIllegal("_written")

    def test_flush_soon_with_nothing_changed_writes_nothing(self) -> None:
        self.flusher.flush_soon()
        self.assertEqual((self.here, self.threads, self.clock.getDelayedCalls()), ([], [], []))
        self.assertIllegal("_interval_passed", "_written")

    def test_flush_soon_too_early_waits_for_the_interval(self) -> None:
        self.enter_waiting()
        self.clock.advance(INTERVAL - 0.001)
        self.assertEqual(self.threads, [])
        self.clock.advance(0.001)
        self.assertEqual(self.threads, [START + INTERVAL])

    def test_flush_now_writes_on_the_reactor(self) -> None:
        self.change()
        self.flusher.flush_now()
        self.assertEqual(self.here, [START])
        self.flusher.flush_now()  # nothing changed: no write
        self.assertEqual(self.here, [START])
        self.assertEqual(self.on_disk(), 1)

    def test_close_writes_the_changes_and_fires(self) -> None:
        self.change()
        self.successResultOf(self.flusher.close())
        self.assertEqual(self.here, [START])

    def test_illegal_inputs(self) -> None:
        self.assertIllegal("_interval_passed", "_written")


class IdleWithoutThreadsTests(FlusherTestCase):
    threaded = False

    def test_flush_soon_writes_on_the_reactor_once_per_interval(self) -> None:
        for _ in range(10):
            self.change()
            self.flusher.flush_soon()
            self.clock.advance(0.25)
        self.assertEqual(self.here, [START, START + 1, START + 2])
        self.assertTrue(self.cache.dirty)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.successResultOf(self.flusher.close())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.here, [START, START + 1, START + 2, START + 2.5])
        self.assertEqual(self.on_disk(), 10)


class WaitingTests(FlusherTestCase):
    def test_flush_soon_keeps_the_one_timer(self) -> None:
        self.enter_waiting()
        self.clock.advance(0.5)
        self.flusher.flush_soon()
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()],
                         [START + INTERVAL])

    def test_the_interval_passed_writes_in_a_thread(self) -> None:
        self.enter_waiting()
        self.clock.advance(INTERVAL)
        self.assertEqual(self.threads, [START + INTERVAL])
        self.assertEqual(len(self.pool.calls), 1)
        self.assertIllegal("_interval_passed")

    def test_the_interval_passed_with_nothing_changed_meanwhile_writes_nothing(self) -> None:
        self.enter_waiting()
        self.cache.dirty = False
        self.clock.advance(INTERVAL)
        self.assertEqual((self.threads, self.pool.calls), ([], []))
        # Idle again: a request that is due now writes.
        self.change()
        self.flusher.flush_soon()
        self.assertEqual(self.threads, [START + INTERVAL])

    def test_flush_now_cancels_the_timer_and_writes_on_the_reactor(self) -> None:
        self.enter_waiting()
        self.clock.advance(0.5)
        self.flusher.flush_now()
        self.assertEqual(self.here, [START, START + 0.5])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIllegal("_interval_passed", "_written")

    def test_close_cancels_the_timer_and_writes(self) -> None:
        self.enter_waiting()
        self.successResultOf(self.flusher.close())
        self.assertEqual(self.here, [START, START])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.on_disk(), 2)

    def test_illegal_inputs(self) -> None:
        self.enter_waiting()
        self.assertIllegal("_written", "_wait", "_write_in_thread")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)


class WritingTests(FlusherTestCase):
    def test_the_write_ends_in_idle(self) -> None:
        self.enter_writing()
        self.pool.finish()
        self.assertEqual(self.on_disk(), 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIllegal("_written")

    def test_flush_soon_meanwhile_asks_again_once_the_write_is_over(self) -> None:
        self.enter_writing()
        self.change()
        self.flusher.flush_soon()
        self.flusher.flush_soon()
        self.assertEqual(len(self.pool.calls), 1)
        self.clock.advance(0.25)
        self.pool.finish()
        # The write began at START: the next waits until START + 1.
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()],
                         [START + INTERVAL])
        self.clock.advance(0.75)
        self.assertEqual(self.threads, [START, START + INTERVAL])

    def test_asked_again_after_a_long_write_writes_at_once(self) -> None:
        self.enter_writing()
        self.change()
        self.flusher.flush_soon()
        self.clock.advance(2 * INTERVAL)
        self.pool.finish()
        self.assertEqual(self.threads, [START, START + 2 * INTERVAL])

    def test_a_failed_write_is_logged_and_leaves_the_cache_to_write(self) -> None:
        capture = GlobalLogCapture(self)
        self.enter_writing()
        self.pool.finish(OSError("disk full"))
        self.assertTrue(self.cache.dirty)
        self.assertEqual(len(capture.matching("cannot write component key cache")), 1)
        self.clock.advance(INTERVAL)
        self.flusher.flush_soon()
        self.assertEqual(self.threads, [START, START + INTERVAL])

    def test_flush_now_writes_on_the_reactor_beside_the_thread(self) -> None:
        self.enter_writing()
        self.change()
        self.flusher.flush_now()
        self.assertEqual(self.here, [START])
        # The thread's older snapshot does not replace the newer file.
        self.pool.finish()
        self.assertEqual(self.on_disk(), 2)
        self.assertIllegal("_written")

    def test_close_writes_and_fires_once_the_thread_write_is_over(self) -> None:
        self.enter_writing()
        self.change()
        self.flusher.flush_soon()  # not asked again after close
        closed = self.flusher.close()
        self.assertEqual(self.here, [START])
        self.assertNoResult(closed)
        self.pool.finish()
        self.assertIsNone(self.successResultOf(closed))
        self.assertEqual(self.pool.calls, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_illegal_inputs(self) -> None:
        self.enter_writing()
        self.assertIllegal("_interval_passed", "_wait", "_write_in_thread")
        self.assertEqual(len(self.pool.calls), 1)


class ClosedTests(FlusherTestCase):
    def test_every_request_writes_on_the_reactor_without_timers_or_threads(self) -> None:
        self.enter_closed()
        self.change()
        self.flusher.flush_soon()
        self.change()
        self.flusher.flush_soon()
        self.change()
        self.flusher.flush_now()
        self.assertEqual(self.here, [START] * 3)
        self.assertEqual((self.clock.getDelayedCalls(), self.pool.calls), ([], []))
        self.successResultOf(self.flusher.close())
        self.assertEqual(self.on_disk(), 3)

    def test_illegal_inputs(self) -> None:
        self.enter_closed()
        self.assertIllegal("_interval_passed", "_wait", "_write_in_thread")
