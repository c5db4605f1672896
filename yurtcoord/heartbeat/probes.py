"""Health of the cloud apiservers and of the pool coordinator apiserver.

A server is judged by writing something that matters: the node's own heartbeat
lease ``kube-node-lease/<node>``. A server that accepted the heartbeat is healthy;
one that did not is not, whatever else it still answers. A probe survives what a
single request may meet on a busy link: it is one lease write tried up to
``failed_retry`` times (``probe_retry_policy`` says when), and only a probe whose
every attempt failed turns a server unhealthy. Several cloud URLs usually lead to
one cloud, and several coordinator apiservers share the pool etcd, so the node lease
is written through one server of such a set per interval and the others are read
(``ServerSet``): a node never races itself for its lease. The coordinator prober
writes the same lease to the coordinator apiservers and marks it for delegation
while the cloud is unreachable, so the pool leader forwards it to the cloud.

A cloud prober removes that mark from the cloud lease when it writes: the leader
copies the pool lease's delegate annotation into the cloud lease while it delegates,
and a node heartbeating the cloud directly again must not keep claiming delegation
there (other annotations stay untouched).

The coordinator prober also names, on the lease it writes, what this agent uses of the
pool: the coordinator apiserver the write goes through and the pool etcd member its
pool store uses (``published_url``: never credentials). Agents cannot reach each
other's status pages, so this is how each agent's pool view learns what every member
uses (``servers_in_use``). Both stay in the pool: the leader forwards only the delegate
annotation of a lease to the cloud.

While the cloud is unhealthy the coordinator prober renews the pool lease every
``delegating_interval(interval, takeover)`` instead of every ``interval``, so that a
cut-off node's cloud lease survives the death of the pool leader; a flip of the
cloud's health restarts the cadence with a probe at once. See docs/design.md,
"Delegating cadence".

The parts live in modules of their own: the lease write and the probe timings in
``yurtcoord.heartbeat.nodelease``, one server's prober and a set of servers in
``yurtcoord.heartbeat.serverset``, the kubelet check in
``yurtcoord.heartbeat.kubeletcheck``; this module builds the cloud's and the
coordinator's sets of them, and names them all for the code that imports them from
here.
"""

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Optional

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from yurtcoord.heartbeat.interfaces import (
    ICloudHealthChecker, ICoordinatorHealthChecker, IServerHealthMetrics,
)
from yurtcoord.heartbeat.kubeletcheck import KubeletHealthChecker
from yurtcoord.heartbeat.nodelease import (
    NODE_LEASE_DURATION_SECONDS, OWNER_READ_INTERVAL, Annotations, NodeLeaseWriter,
    ProbeSettings, Settings, probe_retry_policy, published_url, servers_in_use,
)
from yurtcoord.heartbeat.serverset import LeaseProber, ServerSet
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.names import (
    COORDINATOR_SERVER_ANNOTATION, DELEGATE_HEARTBEAT_ANNOTATION, ETCD_MEMBER_ANNOTATION,
    NODE_LEASE_NAMESPACE,
)
from yurtcoord.tx.guardedloop import ILoopErrors

__all__ = [
    "CloudHealthChecker", "CoordinatorHealthChecker", "DEFAULT_TAKEOVER_SECONDS",
    "DELEGATE_HEARTBEAT_ANNOTATION", "KubeletHealthChecker", "LeaseProber",
    "NODE_LEASE_DURATION_SECONDS", "NODE_LEASE_NAMESPACE", "NodeLeaseWriter",
    "OWNER_READ_INTERVAL", "ProbeSettings", "ServerSet", "TAKEOVER_MARGIN_SECONDS",
    "delegating_interval", "probe_retry_policy", "published_url", "servers_in_use",
]

# Seconds from the pool leader's death until the next leader forwards heartbeats with
# the default election timings: lease_duration (15 s) + retry_period (2 s).
DEFAULT_TAKEOVER_SECONDS = 17.0
# What a new leader's start plus one forward may take within the cadence rule.
TAKEOVER_MARGIN_SECONDS = 1.0


def delegating_interval(interval: float, takeover: float = DEFAULT_TAKEOVER_SECONDS,
                        margin: float = TAKEOVER_MARGIN_SECONDS) -> float:
    """Seconds between pool lease renewals while the cloud is unhealthy.

    ``W / ceil(W / interval)`` with ``W = takeover + margin``: never longer than
    ``interval``, and a whole fraction of ``W`` so that the cloud lease's renewTime
    gap across a leader's death is at most ``W`` plus one cadence (see docs/design.md,
    "Delegating cadence").
    """
    if interval <= 0:
        raise ValueError("interval must be positive")
    window = takeover + margin
    if window <= 0:
        return interval
    steps = max(1, math.ceil(window / interval - 1e-9))
    return window / steps



@implementer(ICloudHealthChecker)
class CloudHealthChecker(ServerSet):
    """Health of the cloud: healthy when any cloud server is (see ``ServerSet``).

    ``add_listener(callback)``: ``callback(healthy)`` is called when the cloud's
    health becomes known and whenever it flips (the coordinator prober restarts its
    cadence on it).
    """

    def __init__(self, reactor: IReactorTime, probers: Iterable[LeaseProber], interval: float,
                 kubelet: Optional["KubeletHealthChecker"] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        super().__init__(reactor, probers, lambda: interval, kubelet=kubelet, name="cloud",
                         loop_errors=loop_errors)

    @classmethod
    def for_servers(cls, reactor: IReactorTime, clients: Mapping[str, IObjectClient],
                    node_name: str, settings: Settings,
                    kubelet: Optional["KubeletHealthChecker"] = None,
                    metrics: Optional[IServerHealthMetrics] = None) -> "CloudHealthChecker":
        """One prober per cloud server; ``clients`` maps server URL to its client.

        Each writes the node lease without the delegate annotation: a node that
        heartbeats the cloud directly is not delegating (see the module docstring).
        """
        probers = [
            LeaseProber(reactor,
                        NodeLeaseWriter(reactor, client, node_name, settings,
                                        annotations=_not_delegated),
                        url, settings, kubelet=kubelet,
                        report_health=None if metrics is None else metrics.set_server_healthy,
                        loop_errors=metrics)
            for url, client in clients.items()
        ]
        return cls(reactor, probers, settings.interval, kubelet=kubelet, loop_errors=metrics)


def _not_delegated() -> Annotations:
    return {DELEGATE_HEARTBEAT_ANNOTATION: None}


@implementer(ICoordinatorHealthChecker)
class CoordinatorHealthChecker(ServerSet):
    """Health of the coordinator apiservers, judged by writing the node lease there:
    healthy while any of them is. The apiservers share the pool etcd, so they are one
    ``ServerSet``: the lease is written through one of them, the others are read.

    While ``cloud_checker`` reports the cloud unhealthy the written lease carries
    ``openyurt.io/delegate-heartbeat: "true"`` so that the pool leader forwards it
    to the cloud, and it is renewed every ``delegating_interval(interval,
    takeover)``; once the cloud is back the annotation is removed and the cadence
    is ``interval`` again. ``takeover`` is the election's lease_duration +
    retry_period. ``cloud_checker`` is an ``ICloudHealthChecker``: every flip of the
    cloud's health writes at once instead of at the next renewal.

    Every write also sets ``coordinator.openyurt.io/apiserver`` to the URL of the
    apiserver it goes through and ``coordinator.openyurt.io/etcd-member`` to
    ``etcd_member()``, the pool etcd member this agent's pool store uses (the
    annotation is removed while that is None: no pool store open), both through
    ``published_url``. They are what the pool views of the other agents show for this
    node. A change of either is written with the next renewal of the lease, within one
    interval (or delegating interval), not at once: no write of its own, so the
    requests per interval stay what they are. Read probes of the other apiservers
    write nothing.

    ``clients`` maps each coordinator apiserver URL to its client; ``metrics`` gets
    each server's health (``set_coordinator_server_healthy``).
    """

    def __init__(self, reactor: IReactorTime, clients: Mapping[str, IObjectClient],
                 node_name: str, cloud_checker: ICloudHealthChecker, settings: Settings,
                 kubelet: Optional["KubeletHealthChecker"] = None,
                 metrics: Optional[IServerHealthMetrics] = None,
                 takeover: float = DEFAULT_TAKEOVER_SECONDS,
                 etcd_member: Callable[[], Optional[str]] = lambda: None) -> None:
        self._cloud = cloud_checker
        self._etcd_member = etcd_member
        self._interval = settings.interval
        self.delegating_interval = delegating_interval(settings.interval, takeover)
        report = None if metrics is None else metrics.set_coordinator_server_healthy
        probers = [
            LeaseProber(reactor,
                        NodeLeaseWriter(reactor, client, node_name, settings,
                                        annotations=functools.partial(
                                            self._lease_annotations, url)),
                        url, settings, kubelet=kubelet, report_health=report,
                        loop_errors=metrics)
            for url, client in clients.items()
        ]
        super().__init__(reactor, probers, self._next_interval, kubelet=kubelet,
                         name="coordinator", loop_errors=metrics)
        cloud_checker.add_listener(self._cloud_changed)

    def _lease_annotations(self, server: str) -> Annotations:
        """What a write of the node lease through ``server`` sets (and removes)."""
        annotations = dict(self._delegation_annotations())
        annotations[COORDINATOR_SERVER_ANNOTATION] = published_url(server)
        annotations[ETCD_MEMBER_ANNOTATION] = published_url(self._etcd_member())
        return annotations

    def _delegation_annotations(self) -> Annotations:
        # Until the cloud's health is known (an agent just started) the annotation is
        # left as the stored lease has it: neither a delegation nor its end is claimed
        # on a guess.
        if not self._cloud.decided:
            return {}
        if self._cloud.healthy:
            return {DELEGATE_HEARTBEAT_ANNOTATION: None}
        return {DELEGATE_HEARTBEAT_ANNOTATION: "true"}

    def _next_interval(self) -> float:
        return self._interval if self._cloud.healthy else self.delegating_interval

    def _cloud_changed(self, _healthy: bool) -> None:
        self.restart()
