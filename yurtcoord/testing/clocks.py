"""Driving a ``twisted.internet.task.Clock`` the way a reactor's time passes.

A single ``Clock.advance(n)`` runs every call that falls due within ``n`` seconds at
the end of the advance, so a call scheduled by an earlier one counts from the end, not
from when that earlier one ran. Tests of timing rules (a retry after a failure, a
renewal after a write, a takeover after an expiry) advance one due call at a time
instead, each run at its own time.
"""

from twisted.internet.task import Clock


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
