"""What the status pages read about one agent: its *status source*
(``IStatusSource``) and the pool view (``IPoolView``) behind ``/pool``.

Three sources serve the agent's life: ``InitialStatus`` before its coordinator exists,
``CloudOnlyStatus`` with ``[coordinator] enabled = false``, and ``AgentStatus`` once
the coordinator runs; the same pages (``yurtcoord.agent.statuspages``) serve each.
"""
import time
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import Attribute, Interface, implementer

from yurtcoord.agent.causes import cause_json, not_probed
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker, ICoordinatorHealthChecker
from yurtcoord.role.roles import Role

if TYPE_CHECKING:
    from yurtcoord.agent.causes import AgentCauses
    from yurtcoord.heartbeat.delegation import HeartbeatDelegation
    from yurtcoord.role.coordinator import Coordinator
    from yurtcoord.role.leadersource import ILeaderSource


class IStatusSource(Interface):
    """What the status pages need to know about one agent; safe to read at any time."""

    role = Attribute('"init", "pending", "follower" or "leader"')
    healthy = Attribute("True when the role is leader or follower")
    ready = Attribute("True when healthy, pool cache synced and local cache uploaded")

    def readiness_failures() -> list[str]:
        """A list of strings naming each failing readiness condition; empty when ready."""

    def status() -> dict[str, Any]:
        """The ``/status`` document (fields as in the README's HTTP surface) as a
        JSON-serialisable dict."""


class IPoolView(Interface):
    """The pool as one agent sees it: the ``/pool`` document (fields as in the
    README's HTTP surface)."""

    last_document = Attribute("The last document built, or None before the first.")

    def document() -> "Deferred[dict[str, Any]]":
        """The current document; never fails (a failed read is named under
        ``errors``)."""


@implementer(IPoolView)
class NoPoolView:
    """The ``/pool`` document of an agent without a coordinator: only its own node,
    nothing read, and ``errors`` saying why."""

    def __init__(self, source: IStatusSource) -> None:
        self._source = source
        self.last_document: Optional[dict[str, Any]] = None

    def document(self) -> "Deferred[dict[str, Any]]":
        status = self._source.status()
        self.last_document = {
            "node": status.get("node"), "pool": status.get("pool"),
            "role": status.get("role"), "ready": bool(status.get("ready")),
            "generated": rfc3339(time.time()), "generated_at": round(time.time(), 3),
            "stale_after_seconds": None, "cloud_read": False, "leader": None,
            "election": {"holder": None, "lease_age": None,
                         "lease_duration_seconds": None, "expired": None},
            "members": [], "leader_changes": [],
            "cache": {"synced": False, "informer_sync_lease_age": None,
                      "informer_sync_holder": None, "resources": {}},
            "errors": {"pool view": "this agent takes no part in the pool "
                                    f"(role {status.get('role')})"},
        }
        return succeed(self.last_document)


# A page: (HTTP code, content type, body) of a status source.
PageRenderer = Callable[[IStatusSource], "tuple[int, str, bytes]"]


def rfc3339(seconds: float) -> str:
    """Epoch ``seconds`` → RFC 3339 UTC text, e.g. ``2026-01-02T03:04:05Z``."""
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@implementer(IStatusSource)
class InitialStatus:
    """The status of an agent whose coordinator does not exist yet: role init, not
    healthy, not ready, nothing known about any server.

    ``since`` is the epoch time the agent entered this state (default: now);
    ``coordinator_servers`` the coordinator apiserver URLs (none when the coordinator
    is not enabled).
    """

    role = "init"
    healthy = False
    ready = False

    def __init__(self, node: str, pool: str, cloud_servers: Iterable[str],
                 since: Optional[float] = None,
                 coordinator_servers: Iterable[str] = ()) -> None:
        self.node = node
        self.pool = pool
        self.cloud_servers = tuple(cloud_servers)
        self.coordinator_servers = tuple(coordinator_servers)
        self.since = time.time() if since is None else since

    def readiness_failures(self) -> list[str]:
        return [
            "coordinator not healthy (role init)",
            "pool cache not synced",
            "local cache not uploaded",
        ]

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "pool": self.pool,
            "role": self.role,
            "healthy": self.healthy,
            "ready": self.ready,
            "pool_cache_synced": False,
            "local_cache_uploaded": False,
            "leader": None,
            "cloud": {url: False for url in self.cloud_servers},
            "coordinator_healthy": False,
            "coordinator_servers": {url: False for url in self.coordinator_servers},
            "last_transition": rfc3339(self.since),
            "delegated_heartbeats": 0,
            "uploaded_objects": 0,
            "etcd_member": None,
            "election": None,
            "cause": None,
            "servers_not_probed": None,
        }


class CloudOnlyStatus(InitialStatus):
    """Status of an agent with ``[coordinator] enabled = false``: role init for good,
    with the live health of the cloud servers its probes renew the node lease on.

    ``cloud_servers()`` maps each cloud server URL to whether it is healthy now (the
    cloud health checker's ``servers``)."""

    def __init__(self, node: str, pool: str, cloud_servers: Callable[[], Mapping[str, bool]],
                 since: Optional[float] = None) -> None:
        super().__init__(node, pool, cloud_servers().keys(), since=since)
        self._cloud_servers = cloud_servers

    def readiness_failures(self) -> list[str]:
        return ["coordinator not enabled on this node (role init)"]

    def status(self) -> dict[str, Any]:
        document = super().status()
        document["cloud"] = dict(self._cloud_servers())
        return document


@implementer(IStatusSource)
class AgentStatus:
    """The status of an agent with its coordinator: what the coordinator knows
    (role, readiness, caches), the time of its last role change (from its role
    observer), and what the agent's other parts report when a page is read.

    ``cloud_checker.servers()`` → {url: healthy}; ``coordinator_checker.healthy``
    and ``coordinator_checker.servers()`` → {url: healthy};
    ``leader`` (``ILeaderSource``): the election lease as last read, the one place
    every surface takes the pool's leader from (the hub elector knows none while this
    agent does not elect); ``delegation.delegated_heartbeats``;
    ``etcd_member()``, the pool etcd member the pool store's requests go to now (None
    while no member serves); ``causes`` names the first cause of what keeps the agent
    from being a ready, electing member (``yurtcoord.agent.causes``). While that cause
    is a dead kubelet no server is probed, so their health is null (not probed, the
    reason in ``servers_not_probed``), never false.
    """

    def __init__(self, coordinator: "Coordinator", pool: str, reactor: IReactorTime,
                 cloud_checker: ICloudHealthChecker,
                 coordinator_checker: ICoordinatorHealthChecker,
                 leader: "ILeaderSource", delegation: "HeartbeatDelegation",
                 etcd_member: Callable[[], Optional[str]] = lambda: None,
                 causes: Optional["AgentCauses"] = None) -> None:
        self._coordinator = coordinator
        self.pool = pool
        self._reactor = reactor
        self._cloud_checker = cloud_checker
        self._coordinator_checker = coordinator_checker
        self._leader = leader
        self._delegation = delegation
        self._etcd_member = etcd_member
        self._causes = causes
        self.last_transition = reactor.seconds()
        coordinator.add_role_observer(self._role_changed)

    def _role_changed(self, _previous: Role, _role: Role) -> None:
        self.last_transition = self._reactor.seconds()

    @property
    def role(self) -> str:
        return self._coordinator.role.value

    @property
    def healthy(self) -> bool:
        return self._coordinator.healthy

    @property
    def ready(self) -> bool:
        return self._coordinator.ready

    def readiness_failures(self) -> list[str]:
        """The coordinator's; while it is not healthy also why each coordinator
        apiserver's probe failed (an apiserver over a pool etcd without quorum says so
        in its answers), so that ``/readyz`` names the cause, not only the role."""
        failures = self._coordinator.readiness_failures()
        if not self._coordinator.healthy:
            failures += [f"coordinator apiserver {url}: {reason}" for url, reason in
                         sorted(self._coordinator_checker.unhealthy_reasons().items())]
        return failures

    def status(self) -> dict[str, Any]:
        coordinator = self._coordinator
        cause = self._causes.first() if self._causes is not None else None
        not_probed_reason = not_probed(cause)
        cloud: dict[str, Optional[bool]] = dict(self._cloud_checker.servers())
        servers: dict[str, Optional[bool]] = dict(self._coordinator_checker.servers())
        coordinator_healthy: Optional[bool] = bool(self._coordinator_checker.healthy)
        if not_probed_reason is not None:
            # Not probed is not unhealthy: the servers may well run.
            cloud = dict.fromkeys(cloud)
            servers = dict.fromkeys(servers)
            coordinator_healthy = None
        return {
            "node": coordinator.node_name,
            "pool": self.pool,
            "role": self.role,
            "healthy": coordinator.healthy,
            "ready": coordinator.ready,
            "pool_cache_synced": coordinator.pool_cache_synced,
            "local_cache_uploaded": coordinator.local_cache_uploaded,
            "leader": self._leader.leader,
            "cloud": cloud,
            "coordinator_healthy": coordinator_healthy,
            "coordinator_servers": servers,
            "last_transition": rfc3339(self.last_transition),
            "delegated_heartbeats": self._delegation.delegated_heartbeats,
            "uploaded_objects": coordinator.uploaded_objects,
            "etcd_member": self._etcd_member(),
            "election": self._leader.election(),
            "cause": cause_json(cause),
            "servers_not_probed": not_probed_reason,
        }
