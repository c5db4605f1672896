"""What a component logs, captured as formatted lines for a test to read."""

from typing import List, Protocol

from twisted.logger import ILogObserver, LogEvent, Logger, formatEvent
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


def capture_log(component: Logs) -> List[str]:
    """Route ``component.log`` into a list of formatted messages."""
    messages: List[str] = []
    component.log = Logger(observer=_Lines(messages))
    return messages
