"""A role component with nothing to do, for Clock tests of a pool's roles.

The coordinator starts and stops pool sync and pool-cache-synced detection with each
role; tests of elections, probes and heartbeat delegation need the coordinator, not
what those components write.
"""

from typing import Any

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.role.roles import IRoleComponent


@implementer(IRoleComponent)
class IdleComponent:
    """Started and stopped as the coordinator says; ``running`` tells which it is in."""

    def __init__(self) -> None:
        self.running = False

    def start(self, store: Any) -> "defer.Deferred[None]":
        self.running = True
        return defer.succeed(None)

    def stop(self) -> "defer.Deferred[None]":
        self.running = False
        return defer.succeed(None)
