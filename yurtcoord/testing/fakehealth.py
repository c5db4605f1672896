"""A health checker stand-in for unit tests: the test says how healthy it is.

It provides ``ICloudHealthChecker`` (and so ``IHealthChecker``): the hub elector
reads ``healthy`` of it, the coordinator's prober follows ``decided`` and
``add_listener``, delegation asks ``pick_healthy_server``.
"""

from typing import Callable, Dict, List, Optional, Sequence

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.heartbeat.interfaces import ICloudHealthChecker


@implementer(ICloudHealthChecker)
class FakeHealth:
    """``healthy`` and ``decided`` are plain attributes a test sets; ``flip(healthy)``
    also tells the listeners, as a real checker does when the health changes.

    ``pick_healthy_server`` answers from ``picks_from`` in turn (None stands for "no
    healthy server"), counting the calls in ``picks``.
    """

    def __init__(self, healthy: bool = True, picks_from: Sequence[Optional[str]] = (),
                 decided: bool = True) -> None:
        self.healthy = healthy
        self.decided = decided
        self.picks_from: List[Optional[str]] = list(picks_from)
        self.picks = 0
        self.starts = 0
        self.restarts = 0
        self.stops = 0
        self._listeners: List[Callable[[bool], object]] = []

    def flip(self, healthy: bool) -> None:
        """The health becomes known as ``healthy``; every listener hears of it."""
        self.healthy = healthy
        self.decided = True
        for callback in list(self._listeners):
            callback(healthy)

    def add_listener(self, callback: Callable[[bool], object]) -> None:
        self._listeners.append(callback)

    def servers(self) -> Dict[str, bool]:
        return {server: self.healthy for server in self.picks_from if server is not None}

    def pick_healthy_server(self) -> Optional[str]:
        if not self.picks_from:
            return None
        server = self.picks_from[self.picks % len(self.picks_from)]
        self.picks += 1
        return server

    def start(self) -> None:
        self.starts += 1

    def restart(self) -> None:
        self.restarts += 1

    def stop(self) -> defer.Deferred:
        self.stops += 1
        return defer.succeed(None)
