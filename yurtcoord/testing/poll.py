"""Waiting for a condition in real-socket tests, bounded by a deadline.

Tests never sleep for a fixed time: they ask for the condition they need and give up
after a deadline, so a fast machine is not slowed down and a slow one fails with a
message that names what never happened.
"""

from typing import Any, Callable, Generator

from twisted.internet import defer
from twisted.internet.task import deferLater


class PollTimeout(AssertionError):
    """The awaited condition did not hold before the deadline.

    An ``AssertionError`` so that trial and pytest report it as a test failure.
    """


def _describe(condition: object, what: str | None) -> str:
    if what:
        return what
    name = getattr(condition, "__qualname__", None) or getattr(condition, "__name__", None)
    return name or repr(condition)


def poll_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
               reactor: Any = None, what: str | None = None) -> defer.Deferred[Any]:
    """Fire once ``condition()`` is true; check it every ``interval`` seconds.

    ``condition`` returns a bool or a Deferred firing with one (an errback counts as
    "not yet" and its message is kept for the final report). Fails with
    ``PollTimeout`` naming ``what`` (or the condition's name) and the last answer
    after ``timeout`` seconds of ``reactor`` time.
    """
    if reactor is None:
        from twisted.internet import reactor
    description = _describe(condition, what)

    @defer.inlineCallbacks
    def poll() -> Generator[defer.Deferred[Any], Any, Any]:

        deadline = reactor.seconds() + timeout
        last = None
        while True:
            try:
                last = yield defer.maybeDeferred(condition)
            except Exception as error:
                last = f"{type(error).__name__}: {error}"
            else:
                if last:
                    return last
            if reactor.seconds() >= deadline:
                raise PollTimeout(
                    f"timed out after {timeout}s waiting for {description} "
                    f"(last answer: {last!r})")
            yield deferLater(reactor, interval, lambda: None)

    return poll()
