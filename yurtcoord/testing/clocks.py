"""Driving a ``twisted.internet.task.Clock`` the way a reactor's time passes.

A single ``Clock.advance(n)`` runs every call that falls due within ``n`` seconds at
the end of the advance, so a call scheduled by an earlier one counts from the end, not
from when that earlier one ran. Tests of timing rules (a retry after a failure, a
renewal after a write, a takeover after an expiry) advance one due call at a time
instead, each run at its own time.

``SkewedClock`` is one machine's view of such a Clock: its wall clock is off by a
fixed offset, as an edge node that lost NTP keeps it, while its timers run at the
Clock's rate. Several agents of one test, each on a ``SkewedClock`` of one shared
Clock, run their timers in true-time order however far apart their clocks are.
"""

from typing import Any, Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import Clock
from zope.interface import implementer


def run_until(clock: Clock, when: float) -> None:
    """Advance ``clock`` to ``when``, running each call that falls due on the way at its
    own time (a call it schedules is run too, if due by ``when``)."""
    while True:
        due = [call.getTime() for call in clock.getDelayedCalls() if call.getTime() <= when]
        if not due:
            break
        clock.advance(max(0.0, min(due) - clock.seconds()))
    clock.advance(max(0.0, when - clock.seconds()))


def advance(clock: Clock, seconds: float) -> None:
    """``run_until`` ``seconds`` from now."""
    run_until(clock, clock.seconds() + seconds)


@implementer(IReactorTime)
class SkewedClock:
    """``clock`` as read on a machine whose clock is ``offset`` seconds off:
    ``seconds()`` is off by ``offset``, timers are ``clock``'s."""

    def __init__(self, clock: Clock, offset: float) -> None:
        self._clock = clock
        self.offset = offset

    def seconds(self) -> float:
        return self._clock.seconds() + self.offset

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any,  # noqa: N802
                  **kw: Any) -> IDelayedCall:
        return self._clock.callLater(delay, callable, *args, **kw)

    def getDelayedCalls(self) -> list[IDelayedCall]:  # noqa: N802 - IReactorTime's name
        return list(self._clock.getDelayedCalls())
