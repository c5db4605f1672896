"""The first cause of what keeps an agent from being a ready, electing member of its
pool, named once for every surface (``/status``, the pool page, ``yurtcoordctl
status``, the sandbox's control page).

Symptoms follow from causes: a dead kubelet stops every probe (a node whose kubelet is
dead must not be kept alive), so every cloud server and coordinator apiserver then
fails its probe without a request being sent, and the agent turns pending. Reporting
those servers unhealthy would send an operator to look at servers that run. So the
causes are checked in the order in which one brings the next about, and the first
that holds is named:

1. ``kubelet_dead``: the kubelet has not answered for its grace period; while it is,
   no server is probed (their health is reported as not probed, not as unhealthy);
2. ``coordinator_unreachable``: no coordinator apiserver answers its probe (the agent
   is pending);
3. ``cloud_unreachable``: no cloud server answers (the agent does not elect);
4. ``etcd_unreachable``: the pool store cannot reach the pool etcd;
5. ``pool_cache_not_synced``: the pool leader's informers have not synced the pool
   cache.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from yurtcoord.heartbeat.interfaces import (
    ICloudHealthChecker, ICoordinatorHealthChecker, IKubeletLiveness,
)

KUBELET_DEAD = "kubelet_dead"
COORDINATOR_UNREACHABLE = "coordinator_unreachable"
CLOUD_UNREACHABLE = "cloud_unreachable"
ETCD_UNREACHABLE = "etcd_unreachable"
POOL_CACHE_NOT_SYNCED = "pool_cache_not_synced"
# In the order they are checked: each one may bring about those after it.
CAUSE_KINDS = (KUBELET_DEAD, COORDINATOR_UNREACHABLE, CLOUD_UNREACHABLE, ETCD_UNREACHABLE,
               POOL_CACHE_NOT_SYNCED)


@dataclass(frozen=True)
class Cause:
    """One cause: ``kind`` (one of ``CAUSE_KINDS``) and a line for operators."""

    kind: str
    text: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


@dataclass(frozen=True)
class CauseFacts:
    """What the causes are judged on, read at one moment.

    ``kubelet_dead_for``: seconds the kubelet has counted as dead, None while alive
    (or not checked); ``coordinator_healthy``/``cloud_healthy``: whether any server of
    each answers its probe; ``coordinator_reasons``: why each coordinator apiserver's
    probe failed; ``etcd_unreachable``: why the pool store cannot reach the pool etcd,
    None when it can (or is not open); ``pool_cache_synced``."""

    kubelet_dead_for: Optional[float] = None
    coordinator_healthy: bool = True
    cloud_healthy: bool = True
    coordinator_reasons: Mapping[str, str] = field(default_factory=dict)
    etcd_unreachable: Optional[str] = None
    pool_cache_synced: bool = True


def first_cause(facts: CauseFacts) -> Optional[Cause]:
    """The first cause that holds (see the module docstring), or None."""
    if facts.kubelet_dead_for is not None:
        return Cause(KUBELET_DEAD, f"kubelet dead for {facts.kubelet_dead_for:.0f}s")
    if not facts.coordinator_healthy:
        reasons = dict(facts.coordinator_reasons)
        detail = f": {sorted(reasons.items())[0][1]}" if reasons else ""
        return Cause(COORDINATOR_UNREACHABLE, f"coordinator apiservers unreachable{detail}")
    if not facts.cloud_healthy:
        return Cause(CLOUD_UNREACHABLE, "cloud unreachable")
    if facts.etcd_unreachable is not None:
        return Cause(ETCD_UNREACHABLE, f"pool etcd unreachable: {facts.etcd_unreachable}")
    if not facts.pool_cache_synced:
        return Cause(POOL_CACHE_NOT_SYNCED, "pool cache not synced")
    return None


def not_probed(cause: Optional[Cause]) -> Optional[str]:
    """Why no server is probed now (``not probed: kubelet dead for 42s``), or None
    while servers are probed: their health is then what the probes found."""
    if cause is None or cause.kind != KUBELET_DEAD:
        return None
    return f"not probed: {cause.text}"


class AgentCauses:
    """Reads the facts of one agent from its parts when asked (``facts()``), and
    names its first cause (``first()``).

    ``kubelet`` is None on a node without a kubelet check; ``etcd_unreachable()`` and
    ``pool_cache_synced()`` read the coordinator."""

    def __init__(self, kubelet: Optional[IKubeletLiveness], cloud: ICloudHealthChecker,
                 coordinator: ICoordinatorHealthChecker,
                 etcd_unreachable: Callable[[], Optional[str]],
                 pool_cache_synced: Callable[[], bool]) -> None:
        self._kubelet = kubelet
        self._cloud = cloud
        self._coordinator = coordinator
        self._etcd_unreachable = etcd_unreachable
        self._pool_cache_synced = pool_cache_synced

    def facts(self) -> CauseFacts:
        coordinator_healthy = bool(self._coordinator.healthy)
        return CauseFacts(
            kubelet_dead_for=None if self._kubelet is None else self._kubelet.dead_for(),
            coordinator_healthy=coordinator_healthy,
            cloud_healthy=bool(self._cloud.healthy),
            coordinator_reasons=({} if coordinator_healthy
                                 else dict(self._coordinator.unhealthy_reasons())),
            etcd_unreachable=self._etcd_unreachable(),
            pool_cache_synced=bool(self._pool_cache_synced()))

    def first(self) -> Optional[Cause]:
        return first_cause(self.facts())


def cause_json(cause: Optional[Cause]) -> Optional[dict[str, Any]]:
    """The ``cause`` object of ``/status``: ``{"kind", "text"}`` or null."""
    return None if cause is None else cause.as_json()
