"""Deferreds still running, so that a stop or close can cancel them.

A component that stops must not wait for a retry pause, a discovery call or a store
open to run its course, and a client that closes must end its requests at once: each
tracks such Deferreds while they run and cancels the ones still running.
"""

from twisted.internet import defer


class InFlight:
    """The Deferreds tracked and not yet fired; ``cancel_all()`` cancels them."""

    def __init__(self):
        self._running = set()

    def track(self, d):
        """Keep ``d`` until it fires; returns ``d`` (with its result unchanged)."""
        self._running.add(d)

        def done(result):
            self._running.discard(d)
            return result

        d.addBoth(done)
        return d

    def cancel_all(self):
        for d in list(self._running):
            d.cancel()


def cancellable_sleep(reactor, seconds):
    """A pause of ``seconds`` on ``reactor``; cancelling it fails with CancelledError."""
    d = defer.Deferred(lambda d: call.cancel() if call.active() else None)
    call = reactor.callLater(seconds, d.callback, None)
    return d
