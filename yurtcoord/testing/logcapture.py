"""What a component logs, captured as formatted lines for a test to read; or every
event of the global log while a test runs, for what is logged by no one component."""

from typing import List, Protocol

from twisted.logger import ILogObserver, LogEvent, Logger, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer


class Logs(Protocol):
    """A component that logs through its ``log`` attribute."""

    log: Logger


@implementer(ILogObserver)
class _Lines:
    """Appends each event, formatted, to ``lines``."""

    def __init__(self, lines: List[str]) -> None:
        self.lines = lines

    def __call__(self, event: LogEvent) -> None:
        self.lines.append(formatEvent(event))


@implementer(ILogObserver)
class _Events:
    """Appends each event to ``events``."""

    def __init__(self, events: List[LogEvent]) -> None:
        self.events = events

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)


def capture_log(component: Logs) -> List[str]:
    """Route ``component.log`` into a list of formatted messages."""
    messages: List[str] = []
    component.log = Logger(observer=_Lines(messages))
    return messages


class GlobalLogCapture:
    """Events of the global log while a test runs."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.events: List[LogEvent] = []
        observer = _Events(self.events)
        globalLogPublisher.addObserver(observer)
        test.addCleanup(globalLogPublisher.removeObserver, observer)

    def matching(self, text: str) -> List[LogEvent]:
        """The events whose formatted text contains ``text``."""
        return [e for e in self.events if text in (formatEvent(e) or "")]
