"""Prometheus metrics of one agent, in a registry of its own.

Several agents can run in one process (the sandbox, tests), so nothing here touches
prometheus-client's global registry: each ``Metrics`` owns a ``CollectorRegistry`` and
``render()`` produces that agent's ``/metrics`` page.

The ``node_yurthub_*`` gauges keep yurthub's names and values so existing dashboards
keep working. yurthub has no value for role ``init``; yurtcoord exports it as 0.
"""

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client import exposition
from prometheus_client.exposition import generate_latest
from zope.interface import Interface, implementer

from yurtcoord.heartbeat.delegation import REFUSAL_REASONS, IDelegationMetrics
from yurtcoord.heartbeat.interfaces import IServerHealthMetrics
from yurtcoord.pool.interfaces import IPoolSyncMetrics
from yurtcoord.pool.uploader import SKIP_REASONS
from yurtcoord.role.roles import Role
from yurtcoord.tx.credentials import mask_url_credentials
from yurtcoord.tx.guardedloop import LOOPS, ILoopErrors

if TYPE_CHECKING:
    from yurtcoord.heartbeat.probes import KubeletHealthChecker
    from yurtcoord.role.coordinator import Coordinator

ROLE_VALUES = {"init": 0, "leader": 1, "follower": 2, "pending": 3}

# Latency buckets (seconds) for requests to apiservers and etcd on a local network.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Reactor lag buckets (seconds): from a busy moment (5 ms) to a stall that misses
# several heartbeat intervals.
REACTOR_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# A node whose heartbeat this agent has not written to the cloud for so long is no
# longer exported in yurtcoord_node_cloud_heartbeat_age_seconds (a member that left
# the pool, or one a former leader forwarded once).
CLOUD_HEARTBEAT_FORGET_SECONDS = 3600.0

# generate_latest writes the classic text format 0.0.4; newer prometheus-client releases
# moved CONTENT_TYPE_LATEST on to 1.0.0, so name the format explicitly.
METRICS_CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4",
                               "text/plain; version=0.0.4; charset=utf-8")


class IRoleGauges(Interface):
    """The gauges ``follow_coordinator`` keeps: ``Metrics`` has them."""

    def set_role(role: str) -> None:
        """The coordinator's role now (``init``, ``pending``, ``follower``, ``leader``)."""

    def set_healthy(healthy: bool) -> None:
        """Whether the coordinator is healthy now."""

    def set_ready(ready: bool) -> None:
        """Whether the agent is ready now."""


@implementer(IDelegationMetrics, ILoopErrors, IPoolSyncMetrics, IRoleGauges,
             IServerHealthMetrics)
class Metrics:
    """Every metric of one agent (the README's metrics table lists them); components
    get this object passed in."""

    def __init__(self, node: str, pool: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry

        self.agent_info = Info(
            "yurtcoord_agent", "Identity of this yurtcoord agent.", registry=registry)
        self.agent_info.info({"node": node, "pool": pool})

        self.role = Gauge(
            "node_yurthub_yurt_coordinator_yurthub_role",
            "yurt coordinator status of yurthub. 1: LeaderHub, 2: FollowerHub, 3: Pending, "
            "0: Init (coordinator not started)",
            registry=registry)
        self.healthy = Gauge(
            "node_yurthub_yurt_coordinator_healthy_status",
            "yurt coordinator healthy status 1: healthy, 0: unhealthy",
            registry=registry)
        self.ready = Gauge(
            "node_yurthub_yurt_coordinator_ready_status",
            "yurt coordinator ready status 1: ready, 0: notReady",
            registry=registry)
        # The cloud apiservers and the coordinator apiservers, as in yurthub.
        self.server_healthy = Gauge(
            "node_yurthub_server_healthy_status",
            "healthy status of remote servers. 1: healthy, 0: unhealthy",
            ["server"], registry=registry)
        self.coordinator_server_healthy = Gauge(
            "yurtcoord_coordinator_server_healthy_status",
            "healthy status of the coordinator apiservers. 1: healthy, 0: unhealthy",
            ["server"], registry=registry)

        # What the pool's alerts (deploy/prometheus/) read besides the role gauges.
        self.kubelet_healthy = Gauge(
            "yurtcoord_kubelet_healthy_status",
            "1 while the node's kubelet answers its healthz within the grace period (or is "
            "not checked: kubelet_healthz_url = off), 0 once it counts as dead",
            registry=registry)
        self.kubelet_healthy.set(1)
        self.pool_cache_synced = Gauge(
            "yurtcoord_pool_cache_synced_status",
            "1 while the pool cache counts as synced (the leader's informer sync lease is "
            "fresh), 0 otherwise",
            registry=registry)
        self.local_cache_uploaded = Gauge(
            "yurtcoord_local_cache_uploaded_status",
            "1 once the node's local cache was uploaded to the pool store since the agent "
            "last became healthy, 0 otherwise",
            registry=registry)
        self.etcd_member_healthy = Gauge(
            "yurtcoord_pool_etcd_member_healthy_status",
            "1 while the pool etcd member is usable, 0 while this agent skips it (a request "
            "failed and its /health has not answered since)",
            ["member"], registry=registry)
        self.cloud_heartbeat_age = Gauge(
            "yurtcoord_node_cloud_heartbeat_age_seconds",
            "Seconds since this agent last wrote the node lease of node to the cloud: its "
            "own directly, a pool member's as leader forwarding a delegated heartbeat",
            ["node"], registry=registry)
        self._cloud_heartbeats: dict[str, float] = {}
        self._etcd_members: Callable[[], Mapping[str, bool]] = dict

        self.delegations = Counter(
            "yurtcoord_heartbeat_delegations",
            "Heartbeat delegations this leader finished (written, dropped, or failed).",
            registry=registry)
        self.delegation_failures = Counter(
            "yurtcoord_heartbeat_delegation_failures",
            "Heartbeat delegations that could not be written to the cloud.",
            registry=registry)
        self.delegation_refused = Counter(
            "yurtcoord_heartbeat_delegation_refused",
            "Delegated pool lease states this leader did not forward to the cloud, by reason.",
            ["reason"], registry=registry)
        for reason in REFUSAL_REASONS:
            self.delegation_refused.labels(reason=reason)
        self.delegation_latency = Histogram(
            "yurtcoord_heartbeat_delegation_latency_seconds",
            "Time from picking up a pool lease to finishing its cloud write.",
            buckets=REQUEST_BUCKETS, registry=registry)
        self.delegation_limit = Gauge(
            "yurtcoord_heartbeat_delegation_concurrency_limit",
            "Heartbeat delegations this leader may run at once; follows the cloud's latency.",
            registry=registry)
        self.uploaded_objects = Counter(
            "yurtcoord_uploaded_objects",
            "Objects of the local cache written to the pool store.",
            registry=registry)
        self.skipped_objects = Counter(
            "yurtcoord_skipped_objects",
            "Local cache files not uploaded, by reason.",
            ["reason"], registry=registry)
        for reason in SKIP_REASONS:
            self.skipped_objects.labels(reason=reason)
        self.pool_sync_events = Counter(
            "yurtcoord_pool_sync_events",
            "Events of pool-scoped resources mirrored into the pool store.",
            ["resource", "type"], registry=registry)
        self.pool_store_latency = Histogram(
            "yurtcoord_pool_store_request_latency_seconds",
            "Latency of requests to the pool etcd, by operation.",
            ["op"], buckets=REQUEST_BUCKETS, registry=registry)
        self.pool_store_undecodable_keys = Counter(
            "yurtcoord_pool_store_undecodable_keys",
            "Keys under pool-scoped prefixes in the pool etcd that are not UTF-8, skipped "
            "when the pool-scoped keys were rebuilt.",
            registry=registry)

        self.reactor_lag = Histogram(
            "yurtcoord_reactor_lag_seconds",
            "How much later than due the reactor ran the lag probe's timer.",
            buckets=REACTOR_LAG_BUCKETS, registry=registry)
        # Every guarded loop (yurtcoord.tx.guardedloop.LOOPS) exported at 0 from the
        # start, so an alert on an increase sees the first error too.
        self.loop_errors = Counter(
            "yurtcoord_loop_errors",
            "Unexpected errors of a periodic loop, which logged each with its traceback "
            "and went on (docs/runbook.md, \"A loop raised\").",
            ["loop"], registry=registry)
        for loop in LOOPS:
            self.loop_errors.labels(loop=loop)

        self.set_role("init")
        self.set_healthy(False)
        self.set_ready(False)

    def set_role(self, role: str) -> None:
        """``role`` is one of init, pending, follower, leader."""
        self.role.set(ROLE_VALUES[role])

    def set_healthy(self, healthy: bool) -> None:
        self.healthy.set(1 if healthy else 0)

    def set_ready(self, ready: bool) -> None:
        self.ready.set(1 if ready else 0)

    def follow(self, coordinator: "Coordinator") -> None:
        """Keep the role, healthy and ready gauges equal to ``coordinator``'s; the pool
        cache and upload gauges read it at every scrape."""
        follow_coordinator(self, coordinator)
        self.pool_cache_synced.set_function(lambda: 1 if coordinator.pool_cache_synced else 0)
        self.local_cache_uploaded.set_function(
            lambda: 1 if coordinator.local_cache_uploaded else 0)

    def follow_kubelet(self, kubelet: "KubeletHealthChecker") -> None:
        """Export ``kubelet``'s liveness, asked at every scrape."""
        self.kubelet_healthy.set_function(lambda: 1 if kubelet.is_alive() else 0)

    def follow_etcd_members(self, health: Callable[[], Mapping[str, bool]]) -> None:
        """Export ``health()`` (``{member URL: usable}``) at every scrape."""
        self._etcd_members = health

    def note_cloud_heartbeat(self, node: str) -> None:
        """Node ``node``'s lease was written to the cloud just now, by this agent."""
        self._cloud_heartbeats[node] = self._clock()

    def set_server_healthy(self, server: str, healthy: bool) -> None:
        """Health of cloud apiserver ``server`` (URL; a label never shows credentials)."""
        server = mask_url_credentials(server)
        self.server_healthy.labels(server=server).set(1 if healthy else 0)

    def set_coordinator_server_healthy(self, server: str, healthy: bool) -> None:
        """Health of coordinator apiserver ``server`` (URL), in
        ``yurtcoord_coordinator_server_healthy_status`` and, as yurthub reports it, in
        ``node_yurthub_server_healthy_status`` beside the cloud servers: dashboards
        built on yurthub's gauge keep showing the coordinator apiserver."""
        server = mask_url_credentials(server)
        value = 1 if healthy else 0
        self.coordinator_server_healthy.labels(server=server).set(value)
        self.server_healthy.labels(server=server).set(value)

    def observe_delegation(self, seconds: float, succeeded: bool) -> None:
        """One finished delegation: counted, timed, and counted as failure if it failed."""
        self.delegations.inc()
        if not succeeded:
            self.delegation_failures.inc()
        self.delegation_latency.observe(seconds)

    def count_delegation_refused(self, reason: str) -> None:
        """One delegated pool lease state not forwarded, for one of
        ``yurtcoord.heartbeat.delegation.REFUSAL_REASONS``: ``namespace``,
        ``not_pool_member``, ``no_such_node``, ``holder_mismatch`` or ``expired``."""
        self.delegation_refused.labels(reason=reason).inc()

    def set_delegation_limit(self, limit: int) -> None:
        """The bound on heartbeat delegations in flight, as it moved."""
        self.delegation_limit.set(limit)

    def count_uploaded(self, count: int = 1) -> None:
        self.uploaded_objects.inc(count)

    def count_skipped(self, reason: str, count: int = 1) -> None:
        self.skipped_objects.labels(reason=reason).inc(count)

    def count_pool_sync_event(self, resource: str, event_type: str) -> None:
        """``event_type`` is LIST, ADDED, MODIFIED, DELETED or another watch event type."""
        self.pool_sync_events.labels(resource=resource, type=event_type).inc()

    def observe_store_request(self, op: str, seconds: float) -> None:
        self.pool_store_latency.labels(op=op).observe(seconds)

    def count_undecodable_keys(self, count: int) -> None:
        self.pool_store_undecodable_keys.inc(count)

    def observe_reactor_lag(self, seconds: float) -> None:
        self.reactor_lag.observe(seconds)

    def count_loop_error(self, loop: str) -> None:
        """One unexpected error of guarded loop ``loop`` (a name in ``LOOPS``)."""
        self.loop_errors.labels(loop=loop).inc()

    def refresh(self) -> None:
        """Set the gauges computed at scrape time: heartbeat ages and etcd members."""
        now = self._clock()
        for node, written in list(self._cloud_heartbeats.items()):
            age = max(0.0, now - written)
            if age > CLOUD_HEARTBEAT_FORGET_SECONDS:
                del self._cloud_heartbeats[node]
                self.cloud_heartbeat_age.remove(node)
            else:
                self.cloud_heartbeat_age.labels(node=node).set(age)
        self.etcd_member_healthy.clear()
        for member, healthy in self._etcd_members().items():
            self.etcd_member_healthy.labels(member=mask_url_credentials(member)).set(
                1 if healthy else 0)

    def render(self) -> bytes:
        """The Prometheus text exposition of this agent's registry (bytes)."""
        self.refresh()
        return generate_latest(self.registry)


def follow_coordinator(gauges: IRoleGauges, coordinator: "Coordinator") -> None:
    """Set ``gauges``' role, healthy and ready (``set_role``, ``set_healthy``,
    ``set_ready``) from ``coordinator`` now and from its role and readiness
    observers after every change: a scrape never needs to ask the coordinator."""

    def role_changed(_previous: Role, role: Role) -> None:
        gauges.set_role(role.value)
        gauges.set_healthy(role.is_healthy)

    gauges.set_role(coordinator.role.value)
    gauges.set_healthy(coordinator.healthy)
    gauges.set_ready(coordinator.ready)
    coordinator.add_role_observer(role_changed)
    coordinator.add_readiness_observer(gauges.set_ready)
