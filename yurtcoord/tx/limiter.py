"""A bound on requests in flight that follows the remote's latency.

A fixed bound on the requests a component keeps in flight to a remote is wrong both
ways: too low and a large pool's heartbeats queue behind a bound the remote could
easily serve; too high and a slow remote gets more work piled on it while it is
already queueing. ``AdaptiveLimit`` moves the bound by what the remote's answers say
(additive increase, multiplicative decrease):

- **baseline**: the shortest latency of a successful request seen in the current or
  the previous ``window`` seconds. It follows a remote whose unloaded latency
  changes (a different server, a busier machine) within two windows;
- **grow**: a successful request whose latency stayed within ``tolerance`` times the
  baseline plus ``slack`` counts one credit, but only when the bound was what held
  work back (as many requests in flight as the bound when it finished). Once the
  credits reach the bound, the bound grows by one: one step per round of requests,
  up to ``maximum``;
- **shrink**: a failed request (an error answer, a timeout, no healthy server)
  multiplies the bound by ``decrease`` (rounded down, at least ``minimum``) and drops
  the credits. So does slowness (latency above that tolerance), but only slowness
  that lasts: the first slow request marks when the slowness was seen, and the bound
  shrinks when a request that *started* at or after that mark is slow as well. A
  short stall of the remote or of the machine (a full garbage collection, a burst of
  other processes on a loaded host) makes every request in flight across it slow at
  once, yet says nothing about how many requests the remote serves well; cutting the
  bound for it would leave the backlog the stall built queued behind a smaller bound
  that regrows by one per round. A fast request started at or after the mark clears
  it. Requests that started before the last decrease ran under the old bound and
  cannot decrease it again, so one slow round shrinks the bound once, not once per
  request.

The clock is injected; a request's start time is the clock's ``seconds()`` when it
started, so tests drive the exact steps with ``twisted.internet.task.Clock``.
"""

import math
from typing import Optional

from twisted.internet.interfaces import IReactorTime

DEFAULT_TOLERANCE = 2.0
DEFAULT_SLACK = 0.05
DEFAULT_DECREASE = 0.75
DEFAULT_WINDOW = 30.0


class AdaptiveLimit:
    """The bound on requests in flight, ``limit``, moved by each finished request's
    ``sample``; see the module docstring for the rules.

    :param clock: tells the time of each sample and opens the baseline windows.
    :param initial: the bound before any sample.
    :param minimum: the lowest bound (at least 1); ``maximum``: the highest.
    :param tolerance: how many times the baseline a latency may be and still count
        as near it; ``slack``: seconds added to that, so that scheduling noise on a
        baseline of a millisecond does not count as the remote slowing down.
    :param decrease: the factor a failure or a slow request multiplies the bound by.
    :param window: seconds of the baseline's windows.
    """

    def __init__(self, clock: IReactorTime, initial: int, minimum: int, maximum: int,
                 tolerance: float = DEFAULT_TOLERANCE, slack: float = DEFAULT_SLACK,
                 decrease: float = DEFAULT_DECREASE, window: float = DEFAULT_WINDOW) -> None:
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError(f"an adaptive limit needs 1 <= minimum <= initial <= maximum, "
                             f"got {minimum}, {initial}, {maximum}")
        if tolerance < 1.0 or slack < 0.0:
            raise ValueError(f"an adaptive limit needs tolerance >= 1 and slack >= 0, "
                             f"got {tolerance} and {slack}")
        if not 0.0 < decrease < 1.0:
            raise ValueError(f"an adaptive limit needs 0 < decrease < 1, got {decrease}")
        if window <= 0.0:
            raise ValueError(f"an adaptive limit needs a window > 0 seconds, got {window}")
        self._clock = clock
        self.minimum = minimum
        self.maximum = maximum
        self.tolerance = tolerance
        self.slack = slack
        self.decrease = decrease
        self.window = window
        self._limit = initial
        self._credits = 0
        self._decreased_at = -math.inf
        self._slow_since: Optional[float] = None
        self._window_started = clock.seconds()
        self._window_best = math.inf
        self._previous_best = math.inf

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return self._limit

    @property
    def baseline(self) -> float:
        """The shortest successful latency of this and the previous window (``inf``
        before any)."""
        self._rotate(self._clock.seconds())
        return min(self._window_best, self._previous_best)

    def sample(self, started: float, in_flight: int, succeeded: bool) -> None:
        """One request finished now: it started at ``started`` (the clock's seconds),
        ``in_flight`` requests are in flight as it finishes, itself included, and it
        ``succeeded`` or not (an error answer, a timeout)."""
        now = self._clock.seconds()
        latency = max(0.0, now - started)
        self._rotate(now)
        if succeeded:
            self._window_best = min(self._window_best, latency)
        baseline = min(self._window_best, self._previous_best)
        if succeeded and latency <= baseline * self.tolerance + self.slack:
            if self._slow_since is not None and started >= self._slow_since:
                self._slow_since = None  # the remote answered quickly again
            if in_flight >= self._limit:
                self._credits += 1
                if self._credits >= self._limit:
                    self._credits = 0
                    self._limit = min(self.maximum, self._limit + 1)
            return
        if started < self._decreased_at:
            return  # ran under the bound before the last decrease
        if succeeded and (self._slow_since is None or started < self._slow_since):
            # Slow, but it may have been in flight across one short stall: it takes
            # a request started from now on being slow too to shrink the bound.
            if self._slow_since is None:
                self._slow_since = now
            return
        self._decreased_at = now
        self._slow_since = now if succeeded else None
        self._credits = 0
        self._limit = max(self.minimum, int(self._limit * self.decrease))

    def _rotate(self, now: float) -> None:
        elapsed = now - self._window_started
        if elapsed < self.window:
            return
        # Two or more windows without a sample leave nothing of the old baseline.
        self._previous_best = self._window_best if elapsed < 2 * self.window else math.inf
        self._window_best = math.inf
        self._window_started = now
