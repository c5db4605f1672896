"""Deferreds still running, so that a stop or close can cancel them.

A component that stops must not wait for a retry pause, a discovery call or a store
open to run its course, and a client that closes must end its requests at once: each
tracks such Deferreds while they run and cancels the ones still running.
"""

from typing import Any, Set, TypeVar

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime

T = TypeVar("T")


class InFlight:
    """The Deferreds tracked and not yet fired; ``cancel_all()`` cancels them."""

    def __init__(self) -> None:
        self._running: Set[defer.Deferred[Any]] = set()

    def track(self, d: defer.Deferred[T]) -> defer.Deferred[T]:
        """Keep ``d`` until it fires; returns ``d`` (with its result unchanged)."""
        self._running.add(d)

        def done(result: Any) -> Any:
            self._running.discard(d)
            return result

        d.addBoth(done)
        return d

    def cancel_all(self) -> None:
        for d in list(self._running):
            d.cancel()


def cancellable_sleep(reactor: IReactorTime, seconds: float) -> defer.Deferred[None]:
    """A pause of ``seconds`` on ``reactor`` (Twisted's ``deferLater``); cancelling it
    fails with CancelledError."""
    return task.deferLater(reactor, seconds, lambda: None)
