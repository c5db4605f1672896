"""What a component logs, captured as formatted lines for a test to read."""

from typing import List

from twisted.logger import Logger, formatEvent


def capture_log(component) -> List[str]:
    """Route ``component.log`` into a list of formatted messages."""
    messages: List[str] = []
    component.log = Logger(observer=lambda event: messages.append(formatEvent(event)))
    return messages
