"""How late the reactor runs a timer: the first thing to look at when timers are missed.

Every timer of the agent (probes, lease renewals, the election) runs on one reactor
thread. When that thread is busy (a large answer parsed, a full garbage collection,
the machine giving the CPU to another process), every timer due meanwhile runs late,
and a probe that runs late can turn into a missed heartbeat. ``ReactorLagProbe`` is a
``Cadence`` that measures, on each run, how much later than due it ran, and passes
that lag on to its observers: the agent exports it as a histogram and logs one line for a lag longer
than the probe timeout; the benchmarks keep the longest.

A stall longer than the probe's interval always covers a due time, so it is always
seen, with its full length (to within one interval) as the lag of the call that was
due first in it.

The probe's tick is guarded (``yurtcoord.tx.guardedloop``, loop ``reactor-lag``): an
observer that raises is logged and counted, and the probe goes on measuring.
"""

import functools
from typing import Callable, Optional

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors, report_loop_error
from yurtcoord.tx.observers import Observers

# Seconds between two calls of the probe: short enough that every stall of 0.1 s or
# longer covers a due time; a call costs some microseconds.
LAG_PROBE_INTERVAL = 0.1

LagObserver = Callable[[float], None]


class ReactorLagProbe:
    """A ``Cadence`` on ``clock`` every ``interval`` seconds that calls each observer
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
        # An observer that raises is an error of the loop: counted, and the others
        # still hear the lag.
        self._observers: Observers[[float]] = Observers(
            "reactor lag", functools.partial(report_loop_error, "reactor-lag",
                                             sink=loop_errors))
        self._ticks = Cadence(clock, self._tick, interval, "reactor-lag", loop_errors)

    def add_observer(self, observer: LagObserver) -> None:
        """Call ``observer(lag_seconds)`` after every call of the probe."""
        self._observers.add(observer)

    @property
    def running(self) -> bool:
        return self._ticks.running

    def start(self) -> None:
        """Start probing; the first call is due one interval from now."""
        if self._ticks.running:
            return
        self.longest = 0.0
        self._ticks.start(now=False)

    def stop(self) -> None:
        self._ticks.stop()

    def _tick(self) -> None:
        lag = max(0.0, self.clock.seconds() - self._ticks.due)
        self.longest = max(self.longest, lag)
        if self.warn_after is not None and lag > self.warn_after:
            self.log.warn("reactor ran a timer {lag:.3f}s late, longer than the probe timeout "
                          "{bound}s: timers due meanwhile (probes, lease renewals) ran late too",
                          lag=lag, bound=self.warn_after)
        self._observers.notify(lag)
