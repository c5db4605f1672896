"""How late the reactor runs a timer: the first thing to look at when timers are missed.

Every timer of the agent (probes, lease renewals, the election) runs on one reactor
thread. When that thread is busy (a large answer parsed, a full garbage collection,
the machine giving the CPU to another process), every timer due meanwhile runs late,
and a probe that runs late can turn into a missed heartbeat. ``ReactorLagProbe`` is a
``LoopingCall`` that measures, on each call, how much later than due it ran, and passes
that lag on: the agent exports it as a histogram and logs one line for a lag longer
than the probe timeout; the benchmarks keep the longest.

A stall longer than the probe's interval always covers a due time, so it is always
seen, with its full length (to within one interval) as the lag of the call that was
due first in it.

The probe's tick is guarded (``yurtcoord.tx.guardedloop``, loop ``reactor-lag``): an
observer that raises is logged and counted, and the probe goes on measuring.
"""

import math
from typing import Callable, Optional

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.tx.guardedloop import ILoopErrors, guarded

# Seconds between two calls of the probe: short enough that every stall of 0.1 s or
# longer covers a due time; a call costs some microseconds.
LAG_PROBE_INTERVAL = 0.1

LagObserver = Callable[[float], None]


class ReactorLagProbe:
    """A ``LoopingCall`` on ``clock`` every ``interval`` seconds that calls each observer
    with how many seconds later than due it ran (0 when on time).

    ``longest`` is the longest lag seen since ``start``. With ``warn_after`` set, a lag
    longer than it is logged (one line, with the lag and the bound). ``loop_errors``
    counts the ticks that raised.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, interval: float = LAG_PROBE_INTERVAL,
                 warn_after: Optional[float] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        if interval <= 0:
            raise ValueError(f"reactor lag probe interval must be positive, not {interval!r}")
        self.clock = clock
        self.interval = interval
        self.warn_after = warn_after
        self.longest = 0.0
        self._observers: list[LagObserver] = []
        self._loop = task.LoopingCall(guarded("reactor-lag", self._tick, loop_errors))
        self._loop.clock = clock
        self._due = 0.0

    def add_observer(self, observer: LagObserver) -> None:
        """Call ``observer(lag_seconds)`` after every call of the probe."""
        self._observers.append(observer)

    @property
    def running(self) -> bool:
        return bool(self._loop.running)

    def start(self) -> None:
        """Start probing; the first call is due one interval from now."""
        if self._loop.running:
            return
        self.longest = 0.0
        self._due = self.clock.seconds() + self.interval
        self._loop.start(self.interval, now=False).addErrback(self._loop_failed)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def _tick(self) -> None:
        now = self.clock.seconds()
        lag = max(0.0, now - self._due)
        self._due = self._next_due(now)
        self.longest = max(self.longest, lag)
        if self.warn_after is not None and lag > self.warn_after:
            self.log.warn("reactor ran a timer {lag:.3f}s late, longer than the probe timeout "
                          "{bound}s: timers due meanwhile (probes, lease renewals) ran late too",
                          lag=lag, bound=self.warn_after)
        for observer in self._observers:
            observer(lag)

    def _next_due(self, now: float) -> float:
        """When the loop calls next: ``LoopingCall`` keeps to the interval boundaries
        counted from its start and skips those that passed while the reactor was busy."""
        start = self._loop.starttime
        if start is None:
            return now + self.interval
        passed = math.floor((now - start) / self.interval) + 1
        return float(start + passed * self.interval)

    def _loop_failed(self, failure: Failure) -> None:
        # An observer that raised stops the loop; say so rather than lose the probe quietly.
        self.log.failure("reactor lag probe stopped", failure=failure)
