"""Roles of an agent in its pool, and the interface of the components a role runs."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from zope.interface import Interface

if TYPE_CHECKING:
    from yurtcoord.pool.interfaces import IPoolStore


class Role(str, enum.Enum):
    """What an agent does in its pool.

    ``INIT`` is the state before the first health check decided anything: it is
    neither healthy nor ready.
    """

    INIT = "init"
    PENDING = "pending"
    LEADER = "leader"
    FOLLOWER = "follower"

    def __str__(self) -> str:
        return self.value

    @property
    def metric_value(self) -> int:
        """Value of gauge ``node_yurthub_yurt_coordinator_yurthub_role``
        (yurthub's numbering: 1 leader, 2 follower, 3 pending; 0 before any decision)."""
        return _METRIC_VALUES[self]

    @property
    def is_healthy(self) -> bool:
        """A leader or follower hub can use the pool; pending and init cannot."""
        return self in (Role.LEADER, Role.FOLLOWER)


_METRIC_VALUES: dict[Role, int] = {Role.INIT: 0, Role.LEADER: 1, Role.FOLLOWER: 2, Role.PENDING: 3}


class IRoleComponent(Interface):
    """A piece of work that runs only in some roles (pool sync, heartbeat
    delegation, pool-cache-synced detection).

    The coordinator calls ``start`` and ``stop`` alternately and never calls one
    before the Deferred of the previous call has fired, so a component need not
    guard against overlapping calls.
    """

    def start(store: IPoolStore) -> defer.Deferred[None]:
        """Begin working against the open pool ``store``.

        Returns a Deferred that fires once the component runs, or errbacks if it
        could not start (the coordinator then retries the role's steps). A role
        change cancels a start still in progress: like a failed start, it must
        leave nothing of the component running.
        """

    def stop() -> defer.Deferred[Any]:
        """Stop all work: watches, timers and requests of this component.

        Returns a Deferred that fires when nothing of the component is left
        running; after it fired the component calls none of its callbacks.
        The coordinator never cancels it. Requests and timers are cancelled within
        this call, so that an agent that stops leading stops writing at once; the
        Deferred may fire later.
        """

