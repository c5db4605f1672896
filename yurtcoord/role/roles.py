"""Roles of an agent in its pool.

The interface of the components a role runs, ``IRoleComponent``, is the pool's
(``yurtcoord.pool.interfaces``): the pool sync implements it, and ``pool/`` imports
nothing from ``role/``.
"""

from __future__ import annotations

import enum

from yurtcoord.pool.interfaces import IRoleComponent

__all__ = ["IRoleComponent", "Role"]


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
