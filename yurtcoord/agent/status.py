"""The agent's status HTTP surface: ``/`` (the pool page), ``/healthz``, ``/readyz``,
``/status``, ``/metrics``.

The pages read everything from a *status source* (``IStatusSource``) passed in, so the
same resources serve an agent whose coordinator does not exist yet (``InitialStatus``)
and, later, the running coordinator. A source that raises gives a 500 and one log line;
it never takes the HTTP server down.

The port is open to anything on the node, so it bounds what a client can hold:
at most ``MAX_STATUS_CONNECTIONS`` ordinary connections at once, and each request must
have arrived whole within ``STATUS_REQUEST_DEADLINE`` seconds of the connection
opening or of the previous answer (a connection idle or sending that slowly is
dropped), with at most ``MAX_STATUS_REQUEST_BODY`` bytes of body. A crowd of idle or
slow clients thus costs a few hundred descriptors at most (with the probe reserve
below) for a few seconds, and never the descriptors the agent needs for its own
connections.

That crowd must not starve the kubelet's readiness probe, which comes from the node
itself (``host: 127.0.0.1`` in the DaemonSet), on a new connection each time, and
gives up after one second. Past the ordinary connections are
``PROBE_RESERVE_CONNECTIONS`` more that only ``/healthz`` and ``/readyz`` may use: a
connection that finds no ordinary slot is taken on trial into the reserve and must
send its whole request within ``PROBE_REQUEST_DEADLINE``; once its request line is
read, a request for any other page is answered 503 and the connection closed, and a
probe gets its answer and the connection is closed. When the reserve is full, a new
connection pushes out the one in it that has waited longest (first those that have
sent part of a request: they have shown how slowly they send; one that has sent
nothing yet may be a probe whose bytes are not read yet). New connections are thus
never closed unread however many wait: a flood can only push its own connections out
of the reserve, and a probe, which sends its request at once, is answered before
``PROBE_RESERVE_CONNECTIONS`` others arrive behind it.

One client address holds at most ``MAX_STATUS_CONNECTIONS_PER_ADDRESS`` of the
ordinary connections (more go to the reserve), so that one remote client cannot take
them all from the others when the port listens beyond loopback. Loopback addresses
are not capped so: every client on the node (the kubelet, Prometheus on the node,
``kubectl port-forward``, curl) comes from them, and with the default ``listen`` of
``127.0.0.1`` they are the only clients, so capping loopback would cap the node's own
clients as one and protect nobody; the reserve, which looks at what is asked and not
at who asks, is what keeps the probes answered.

Requests are logged at debug level only (the pool page polls twice every two
seconds), at most ``ACCESS_LOG_LINES_PER_SECOND`` lines a second (then one line says
how many were dropped) with paths cut at ``ACCESS_LOG_PATH_CHARS``: a client flooding
the port with long paths costs a bounded amount of log, whatever ``[log] level`` is.

A server URL never shows its credentials (``user:password@``) on these pages or in
metric labels: configuration refuses them, and what is shown is masked anyway.
"""
import gzip
import html
import io
import ipaddress
import json
import time
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.logger import Logger
from twisted.web import http, pages, resource, server
from zope.interface import Attribute, Interface, implementer

from yurtcoord.tx.credentials import mask_url_credentials
from yurtcoord.tx.httpbody import drop_connection
from yurtcoord.tx.logs import LinesPerSecond, shown_path
from yurtcoord.agent.causes import cause_json, not_probed
from yurtcoord.agent.metrics import METRICS_CONTENT_TYPE, Metrics
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker, ICoordinatorHealthChecker
from yurtcoord.role.roles import Role

if TYPE_CHECKING:
    from yurtcoord.agent.causes import AgentCauses
    from yurtcoord.heartbeat.delegation import HeartbeatDelegation
    from yurtcoord.role.coordinator import Coordinator
    from yurtcoord.role.leadersource import ILeaderSource

NOT_FOUND = pages.notFound("No such page",
                           "Pages: / /healthz /readyz /status /pool /metrics")
# Connections the kernel queues for the status port before the agent accepts them.
# Twisted's default of 50 overflows when a flood of clients connects at once, and the
# kernel then drops the kubelet's probe's connect, which it retries only a second
# later, past the probe's timeout; the kernel caps it at net.core.somaxconn.
STATUS_LISTEN_BACKLOG = 1024
# gzip level of /pool answers: 6 compresses a 1,000-member document about tenfold in a
# few milliseconds, once per build.
POOL_GZIP_LEVEL = 6
# Ordinary status connections open at once (any page); more go to the probe reserve.
MAX_STATUS_CONNECTIONS = 64
# Ordinary connections one client address may hold; loopback addresses are not capped
# (every client on the node comes from them, the kubelet's probes included).
MAX_STATUS_CONNECTIONS_PER_ADDRESS = 16
# Connections past the ordinary ones that only ``PROBE_PATHS`` may use, counted once
# they have sent part of a request.
PROBE_RESERVE_CONNECTIONS = 16
# Connections past the ordinary ones held until their first bytes are read, so that
# a burst of new connections cannot push out a probe before it is read.
MAX_STATUS_UNREAD_CONNECTIONS = 256
# Seconds a connection in the probe reserve may take to send its whole request (the
# kubelet sends it at once and waits one second by default).
PROBE_REQUEST_DEADLINE = 1.0
# The pages a connection in the probe reserve may ask for.
PROBE_PATHS = frozenset({b"/healthz", b"/readyz"})
# Seconds a status connection may take to send one whole request, counted from when
# it opened or from the previous answer; then it is dropped.
STATUS_REQUEST_DEADLINE = 5.0
# Bytes of request body a status connection may send with one request (the pages take
# none); past it the connection is dropped. Bodies are kept in memory, never on disk.
MAX_STATUS_REQUEST_BODY = 64 * 1024


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


class SourcePage(resource.Resource):
    """A leaf page rendered by ``render_page(source)`` → (code, content type, body bytes).

    A failing source gives a 500 and one log line.
    """

    isLeaf = True
    log = Logger()

    def __init__(self, source: IStatusSource, render_page: PageRenderer) -> None:
        super().__init__()
        self.source = source
        self.render_page = render_page

    def render_GET(self, request: server.Request) -> object:
        if request.postpath not in ([], [b""]):
            return NOT_FOUND.render(request)
        try:
            code, content_type, body = self.render_page(self.source)
        except Exception:
            self.log.failure("status page {path} failed to read the agent status",
                             path=request.path.decode("latin-1"))
            code, content_type, body = 500, "text/plain; charset=utf-8", b"internal error\n"
        request.setResponseCode(code)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return body


def _text(code: int, text: str) -> tuple[int, str, bytes]:
    return code, "text/plain; charset=utf-8", text.encode("utf-8")


def healthz_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """200 ``ok`` when the coordinator is healthy (leader or follower), else 503."""
    if source.healthy:
        return _text(200, "ok\n")
    return _text(503, f"not healthy: role {source.role}\n")


def readyz_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """200 ``ok`` when ready, else 503 naming each failing condition on its own line."""
    if source.ready:
        return _text(200, "ok\n")
    failures = list(source.readiness_failures()) or ["not ready"]
    return _text(503, "".join(f"not ready: {failure}\n" for failure in failures))


def status_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """The ``/status`` JSON document of ``source``, URLs without credentials."""
    body = mask_url_credentials(json.dumps(source.status(), indent=2)) + "\n"
    return 200, "application/json", body.encode("utf-8")


def metrics_page(metrics: Metrics) -> PageRenderer:
    """Prometheus text; refreshes the role/health/readiness/server gauges from the source
    first, so a scrape never shows older values than the status pages."""

    def render(source: IStatusSource) -> tuple[int, str, bytes]:
        metrics.set_role(source.role)
        metrics.set_healthy(source.healthy)
        metrics.set_ready(source.ready)
        for server_url, healthy in (source.status().get("cloud") or {}).items():
            # Not probed (null, the kubelet dead): the gauge keeps what was probed.
            if healthy is not None:
                metrics.set_server_healthy(server_url, bool(healthy))
        return 200, METRICS_CONTENT_TYPE, metrics.render()

    return render


# The facts of the pool page: (``/status`` key, label, how to show the value).
POOL_PAGE_FIELDS = (
    ("role", "role", "role"),
    ("leader", "leader", "text"),
    ("healthy", "healthy", "bool"),
    ("ready", "ready", "bool"),
    ("cause", "cause", "cause"),
    ("coordinator_healthy", "coordinator apiserver healthy", "probed"),
    ("pool_cache_synced", "pool cache synced", "bool"),
    ("local_cache_uploaded", "local cache uploaded", "bool"),
    ("uploaded_objects", "uploaded objects", "text"),
    ("delegated_heartbeats", "delegated heartbeats", "text"),
    ("last_transition", "last role change", "text"),
    ("etcd_member", "pool etcd member", "text"),
)
# Milliseconds between two refreshes of the pool page in the browser.
POOL_PAGE_REFRESH_MS = 2000
KNOWN_ROLES = ("init", "pending", "follower", "leader")

# The look of the pool page, which the sandbox's control page shares (one style for
# every page an operator opens).
POOL_PAGE_STYLE = """
:root { color-scheme: light; --ok: #1a7f37; --bad: #c62828; --muted: #666; }
body { font: 15px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       background: #f4f6f8; color: #1f2328; }
header { background: #24292f; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 22px; }
header p { margin: 4px 0 0; color: #c9d1d9; }
main { padding: 16px 24px; max-width: 1100px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin-bottom: 16px; }
.card { background: #fff; border: 1px solid #d0d7de; border-radius: 8px;
        padding: 10px 16px; min-width: 150px; }
.card .label, th { color: var(--muted); font-size: 12px; text-transform: uppercase;
                   letter-spacing: .04em; }
.card .label, .card .value { display: block; }
.card .value { font-size: 22px; font-weight: 600; overflow-wrap: anywhere; }
table { border-collapse: collapse; background: #fff; border: 1px solid #d0d7de;
        width: 100%; margin-bottom: 16px; }
th, td { text-align: left; padding: 6px 12px; border-bottom: 1px solid #eaeef2;
         overflow-wrap: anywhere; }
h2 { font-size: 16px; margin: 18px 0 8px; }
.yes { color: var(--ok); } .no { color: var(--bad); } .none { color: var(--muted); }
.role-leader { color: #0550ae; } .role-follower { color: var(--ok); }
.role-pending, .role-init { color: #9a6700; }
#refresh.stale { color: #ffb4a9; }
ul { background: #fff; border: 1px solid #d0d7de; margin: 0; padding: 8px 32px; }
tr.stale td { background: #fff0ee; }
.badge { display: inline-block; font-size: 11px; font-weight: 700; padding: 1px 6px;
         border-radius: 8px; margin-left: 6px; color: #fff; background: var(--bad); }
.path-direct { color: var(--ok); } .path-delegated { color: #0550ae; }
.path-stale { color: var(--bad); font-weight: 700; }
#timeline { background: #fff; border: 1px solid #d0d7de; padding: 8px; }
#timeline svg { display: block; width: 100%; height: auto; }
.muted { color: var(--muted); }
.legend { margin: 4px 0 0; font-size: 13px; }
.legend .key { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 8px; }
"""

_POOL_PAGE_SCRIPT = """
(function () {
  "use strict";
  var SPAN = %(span)d, WIDTH = %(width)d, HEIGHT = %(height)d, BAR = %(bar)d;
  var COLOURS = %(colours)s;
  function show(el, kind, value) {
    if (kind === "cause") {
      var named = value && typeof value.text === "string";
      el.textContent = named ? value.text : "none";
      el.className = "value " + (named ? "no" : "yes");
    } else if (kind === "probed" && (value === null || value === undefined)) {
      el.textContent = "not probed";
      el.className = "value none";
    } else if (kind === "bool" || kind === "probed") {
      el.textContent = value ? "yes" : "no";
      el.className = "value " + (value ? "yes" : "no");
    } else if (value === null || value === undefined) {
      el.textContent = "none";
      el.className = "value none";
    } else {
      el.textContent = String(value);
      el.className = kind === "role" ? "value role-" + String(value) : "value";
    }
  }
  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = text;
    if (className) { td.className = className; }
    row.appendChild(td);
  }
  function render(status) {
    var fields = document.querySelectorAll("[data-field]");
    for (var i = 0; i < fields.length; i++) {
      var el = fields[i];
      show(el, el.getAttribute("data-kind"), status[el.getAttribute("data-field")]);
    }
    document.title = "yurtcoord " + status.node + " \\u00b7 " + status.role;
    var body = document.getElementById("cloud-servers");
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var urls = Object.keys(status.cloud || {}).sort();
    for (var j = 0; j < urls.length; j++) {
      var row = document.createElement("tr");
      var healthy = status.cloud[urls[j]];
      cell(row, urls[j]);
      if (healthy === null || healthy === undefined) {
        cell(row, status.servers_not_probed || "not probed", "none");
      } else {
        cell(row, healthy ? "healthy" : "unhealthy", healthy ? "yes" : "no");
      }
      body.appendChild(row);
    }
    if (!urls.length) {
      var empty = document.createElement("tr");
      cell(empty, "no cloud servers", "none");
      body.appendChild(empty);
    }
  }
  function renderReadiness(code, text) {
    var list = document.getElementById("readiness");
    while (list.firstChild) { list.removeChild(list.firstChild); }
    var lines = code === 200 ? ["ready"] : text.split("\\n").filter(Boolean).map(
      function (line) { return line.replace(/^not ready: /, ""); });
    for (var i = 0; i < lines.length; i++) {
      var item = document.createElement("li");
      item.textContent = lines[i];
      item.className = code === 200 ? "yes" : "no";
      list.appendChild(item);
    }
  }
  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }
  function age(value) {
    return typeof value === "number" ? value.toFixed(1) + "s" : "none";
  }
  function serverCell(row, column, url) {
    var known = typeof url === "string" && url !== "";
    var td = document.createElement("td");
    td.setAttribute("data-column", column);
    if (!known) { td.className = "none"; }
    td.textContent = known ? url : "none";
    row.appendChild(td);
  }
  function renderMembers(pool) {
    var body = document.getElementById("members");
    clear(body);
    var members = pool.members || [];
    for (var i = 0; i < members.length; i++) {
      var m = members[i], path = String(m.heartbeat), stale = path === "stale";
      var row = document.createElement("tr");
      row.className = stale ? "stale" : "member";
      row.setAttribute("data-node", String(m.node));
      row.setAttribute("data-heartbeat", path);
      cell(row, String(m.node));
      if (stale) {
        var badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = "STALE";
        row.firstChild.appendChild(badge);
      }
      cell(row, path, "path-" + path);
      cell(row, age(m.lease_age));
      cell(row, m.leader === true ? "leader" : "", m.leader === true ? "role-leader" : "");
      serverCell(row, "etcd-member", m.etcd_member);
      serverCell(row, "coordinator-server", m.coordinator_server);
      var upload = m.upload;
      cell(row, upload ? (upload.uploaded ? "uploaded (" + upload.objects + ")"
                                          : "not uploaded") : "unknown");
      body.appendChild(row);
    }
    if (!members.length) {
      var empty = document.createElement("tr");
      cell(empty, "no members known yet", "none");
      body.appendChild(empty);
    }
  }
  function segmentsOf(changes, now) {
    var points = [], segments = [];
    for (var i = 0; i < changes.length; i++) {
      if (typeof changes[i].at === "number" && changes[i].leader) {
        points.push([changes[i].at, String(changes[i].leader)]);
      }
    }
    for (var j = 0; j < points.length; j++) {
      var end = j + 1 < points.length ? points[j + 1][0] : now;
      var start = Math.max(points[j][0], now - SPAN);
      end = Math.min(end, now);
      if (end > start) { segments.push([start, end, points[j][1]]); }
    }
    return segments;
  }
  function svgChild(svg, tag, attributes, text) {
    var el = document.createElementNS(svg.namespaceURI, tag);
    for (var name in attributes) { el.setAttribute(name, String(attributes[name])); }
    if (text !== undefined) { el.textContent = text; }
    svg.appendChild(el);
    return el;
  }
  function renderTimeline(pool) {
    var box = document.getElementById("timeline");
    clear(box);
    var segments = segmentsOf(pool.leader_changes || [], pool.generated_at);
    if (!segments.length) {
      var note = document.createElement("p");
      note.className = "muted";
      note.textContent = "no leader change seen by this agent in the last hour";
      box.appendChild(note);
      return;
    }
    var svg = document.getElementById("timeline-svg").content.firstElementChild
      .cloneNode(false);
    var leaders = segments.map(function (s) { return s[2]; }).filter(
      function (name, i, all) { return all.indexOf(name) === i; }).sort();
    var scale = WIDTH / SPAN, origin = pool.generated_at - SPAN;
    for (var i = 0; i < segments.length; i++) {
      var s = segments[i], x = (s[0] - origin) * scale;
      var width = Math.max(3, (s[1] - s[0]) * scale);
      var rect = svgChild(svg, "rect", {x: x.toFixed(1), y: 4, width: width.toFixed(1),
        height: BAR, fill: COLOURS[leaders.indexOf(s[2]) %% COLOURS.length],
        "data-leader": s[2]});
      svgChild(rect, "title", {}, s[2] + ": " + new Date(s[0] * 1000).toISOString() +
               " to " + new Date(s[1] * 1000).toISOString());
      if (width > 8 * s[2].length) {
        svgChild(svg, "text", {x: (x + 4).toFixed(1), y: 23, fill: "#fff",
                               "font-size": 12}, s[2]);
      }
    }
    svgChild(svg, "text", {x: 0, y: HEIGHT - 6, "font-size": 11, fill: "#666"},
             "1 hour ago");
    svgChild(svg, "text", {x: WIDTH, y: HEIGHT - 6, "font-size": 11, fill: "#666",
                           "text-anchor": "end"}, "now");
    box.appendChild(svg);
    var legend = document.createElement("p");
    legend.className = "legend";
    for (var j = 0; j < leaders.length; j++) {
      var key = document.createElement("span");
      key.className = "key";
      key.style.background = COLOURS[j %% COLOURS.length];
      legend.appendChild(key);
      legend.appendChild(document.createTextNode(leaders[j] + " "));
    }
    box.appendChild(legend);
  }
  function renderCache(pool) {
    var cache = pool.cache || {};
    document.getElementById("sync-age").textContent = age(cache.informer_sync_lease_age);
    document.getElementById("sync-holder").textContent = cache.informer_sync_holder || "none";
    var synced = document.getElementById("sync-synced");
    synced.textContent = cache.synced ? "yes" : "no";
    synced.className = cache.synced ? "yes" : "no";
    var body = document.getElementById("cache-resources");
    clear(body);
    var names = Object.keys(cache.resources || {}).sort();
    for (var i = 0; i < names.length; i++) {
      var row = document.createElement("tr");
      var count = cache.resources[names[i]];
      cell(row, names[i]);
      cell(row, count === null ? "none" : String(count));
      body.appendChild(row);
    }
    var list = document.getElementById("pool-errors");
    clear(list);
    var errors = Object.keys(pool.errors || {}).sort();
    for (var j = 0; j < errors.length; j++) {
      var item = document.createElement("li");
      item.className = "no";
      item.textContent = errors[j] + ": " + pool.errors[errors[j]];
      list.appendChild(item);
    }
    list.hidden = !errors.length;
  }
  function renderPool(pool) {
    renderMembers(pool);
    renderTimeline(pool);
    renderCache(pool);
  }
  function mark(text, stale) {
    var el = document.getElementById("refresh");
    el.textContent = text;
    el.className = stale ? "stale" : "";
  }
  function refresh() {
    var status = fetch("status", {cache: "no-store"}).then(function (response) {
      if (!response.ok) { throw new Error("/status answered " + response.status); }
      return response.json();
    });
    var readiness = fetch("readyz", {cache: "no-store"}).then(function (response) {
      return response.text().then(function (text) { return [response.status, text]; });
    });
    var pool = fetch("pool", {cache: "no-store"}).then(function (response) {
      return response.ok ? response.json() : null;
    }).catch(function () { return null; });
    Promise.all([status, readiness, pool]).then(function (results) {
      var pool = results[2];
      render(results[0]);
      renderReadiness(results[1][0], results[1][1]);
      if (pool) { renderPool(pool); }
      mark("live, updated " + new Date().toLocaleTimeString(), false);
    }).catch(function (error) {
      mark("cannot reach this agent (" + error.message + "); showing the last answer", true);
    });
  }
  refresh();
  setInterval(refresh, %(refresh_ms)d);
})();
"""


def _page_value(kind: str, value: object) -> tuple[str, str]:
    """(text, CSS class) of one value as the page shows it, before escaping."""
    if kind == "cause":
        text = value.get("text") if isinstance(value, Mapping) else None
        return (text, "no") if isinstance(text, str) else ("none", "yes")
    if kind == "probed" and value is None:
        return "not probed", "none"
    if kind in ("bool", "probed"):
        return ("yes", "yes") if value else ("no", "no")
    if value is None:
        return "none", "none"
    if kind == "role":
        return str(value), f"role-{value}" if value in KNOWN_ROLES else ""
    return str(value), ""


def _escaped(value: object) -> str:
    return html.escape(str(value), quote=True)


# The leader timeline: seconds it spans back from the document's time, its size, and
# the colours its leaders get in turn (by name order).
TIMELINE_SECONDS = 3600
TIMELINE_WIDTH, TIMELINE_HEIGHT, TIMELINE_BAR = 720, 56, 28
TIMELINE_COLOURS = ("#0969da", "#1a7f37", "#8250df", "#bf3989", "#9a6700", "#cf222e",
                    "#1b7c83", "#6e7781")


def _age_text(seconds: object) -> str:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "none"
    return f"{seconds:.1f}s"


def leader_segments(changes: Iterable[Mapping[str, Any]], now: float,
                    span: float = TIMELINE_SECONDS) -> list[tuple[float, float, str]]:
    """``(start, end, leader)`` of who led when within ``span`` seconds before ``now``,
    from the leader changes (oldest first, each with ``at`` and ``leader``): a leader
    leads from its change to the next one, the last one until ``now``."""
    points = [(float(c["at"]), str(c["leader"])) for c in changes
              if isinstance(c, Mapping) and isinstance(c.get("at"), (int, float))
              and not isinstance(c.get("at"), bool) and c.get("leader")]
    segments = []
    for i, (at, leader) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else now
        start, end = max(at, now - span), min(end, now)
        if end > start:
            segments.append((start, end, leader))
    return segments


def render_timeline(pool: Mapping[str, Any]) -> str:
    """The inline SVG of who led when over the last ``TIMELINE_SECONDS``; every name
    escaped. The page's script draws the same from each ``/pool`` it reads."""
    now = pool.get("generated_at")
    changes = pool.get("leader_changes")
    if not isinstance(now, (int, float)) or not isinstance(changes, list):
        return '<p class="muted">no pool view yet</p>'
    segments = leader_segments(changes, float(now))
    if not segments:
        return '<p class="muted">no leader change seen by this agent in the last hour</p>'
    leaders = sorted({leader for _, _, leader in segments})
    colour = {leader: TIMELINE_COLOURS[i % len(TIMELINE_COLOURS)]
              for i, leader in enumerate(leaders)}
    scale = TIMELINE_WIDTH / TIMELINE_SECONDS
    start_of_view = float(now) - TIMELINE_SECONDS
    parts = []
    for start, end, leader in segments:
        x, width = (start - start_of_view) * scale, max(3.0, (end - start) * scale)
        parts.append(
            f'<rect x="{x:.1f}" y="4" width="{width:.1f}" height="{TIMELINE_BAR}" '
            f'fill="{colour[leader]}" data-leader="{_escaped(leader)}">'
            f"<title>{_escaped(leader)}: {_escaped(rfc3339(start))} to "
            f"{_escaped(rfc3339(end))}</title></rect>")
        if width > 8 * len(leader):
            parts.append(f'<text x="{x + 4:.1f}" y="23" fill="#fff" font-size="12">'
                         f"{_escaped(leader)}</text>")
    parts.append(f'<text x="0" y="{TIMELINE_HEIGHT - 6}" font-size="11" fill="#666">'
                 "1 hour ago</text>")
    parts.append(f'<text x="{TIMELINE_WIDTH}" y="{TIMELINE_HEIGHT - 6}" font-size="11" '
                 'fill="#666" text-anchor="end">now</text>')
    legend = "".join(f'<span class="key" style="background: {colour[leader]}"></span>'
                     f"{_escaped(leader)} " for leader in leaders)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {TIMELINE_WIDTH} '
            f'{TIMELINE_HEIGHT}" role="img" aria-label="leader timeline">'
            + "".join(parts) + f'</svg><p class="legend">{legend}</p>')


def _member_row(member: Mapping[str, Any]) -> str:
    path = str(member.get("heartbeat"))
    stale = path == "stale"
    upload = member.get("upload")
    upload_text = "unknown"
    if isinstance(upload, Mapping):
        upload_text = (f"uploaded ({upload.get('objects')})" if upload.get("uploaded")
                       else "not uploaded")
    badge = '<span class="badge">STALE</span>' if stale else ""
    leader = '<span class="role-leader">leader</span>' if member.get("leader") is True else ""
    return (f'<tr class="{"stale" if stale else "member"}" '
            f'data-node="{_escaped(member.get("node"))}" data-heartbeat="{_escaped(path)}">'
            f'<td>{_escaped(member.get("node"))}{badge}</td>'
            f'<td class="path-{_escaped(path)}">{_escaped(path)}</td>'
            f'<td>{_escaped(_age_text(member.get("lease_age")))}</td>'
            f"<td>{leader}</td>"
            f'{_server_cell("etcd-member", member.get("etcd_member"))}'
            f'{_server_cell("coordinator-server", member.get("coordinator_server"))}'
            f"<td>{_escaped(upload_text)}</td></tr>")


def _server_cell(column: str, url: object) -> str:
    """The cell of a member's pool etcd member or coordinator apiserver: its URL, or
    ``none`` when unknown (as the page's script draws it)."""
    if isinstance(url, str) and url:
        return f'<td data-column="{column}">{_escaped(url)}</td>'
    return f'<td data-column="{column}" class="none">none</td>'


def render_pool_sections(pool: Optional[Mapping[str, Any]]) -> str:
    """Members, leader timeline, pool cache and the reads that failed, from one
    ``/pool`` document (None: not built yet); every value escaped."""
    def part(key: str, kind: type) -> Any:
        value = (pool or {}).get(key)
        return value if isinstance(value, kind) else kind()

    members = part("members", list)
    member_rows = "".join(_member_row(m) for m in members if isinstance(m, Mapping)) or (
        '<tr><td class="none" colspan="7">no members known yet</td></tr>')
    cache = part("cache", dict)
    resources = cache.get("resources") if isinstance(cache.get("resources"), dict) else {}
    resource_rows = "".join(
        f"<tr><td>{_escaped(name)}</td><td>{_escaped('none' if n is None else n)}</td></tr>"
        for name, n in sorted(resources.items()))
    errors = part("errors", dict)
    error_items = "".join(f'<li class="no">{_escaped(what)}: {_escaped(why)}</li>'
                          for what, why in sorted(errors.items()))
    synced_text, synced_css = _page_value("bool", cache.get("synced"))
    return f"""<h2>Members</h2>
<table><thead><tr><th>node</th><th>heartbeat</th><th>lease age</th><th>leader</th>
<th>pool etcd member</th><th>coordinator apiserver</th><th>upload</th></tr></thead>
<tbody id="members">{member_rows}</tbody></table>
<h2>Leader timeline (last hour)</h2>
<div id="timeline">{render_timeline(pool or {})}</div>
<h2>Pool cache</h2>
<table><tbody id="cache-freshness">
<tr><th scope="row">informer sync lease age</th><td id="sync-age">{
    _escaped(_age_text(cache.get("informer_sync_lease_age")))}</td></tr>
<tr><th scope="row">renewed by</th><td id="sync-holder">{
    _escaped(cache.get("informer_sync_holder") or "none")}</td></tr>
<tr><th scope="row">synced</th><td id="sync-synced" class="{synced_css}">{
    _escaped(synced_text)}</td></tr>
</tbody></table>
<table><thead><tr><th>pool-scoped resource</th><th>objects</th></tr></thead>
<tbody id="cache-resources">{resource_rows}</tbody></table>
<ul id="pool-errors"{'' if error_items else ' hidden'}>{error_items}</ul>
"""


def render_pool_page(status: Mapping[str, Any], readiness_failures: Iterable[str],
                     pool_document: Optional[Mapping[str, Any]] = None) -> str:
    """The pool page's HTML for one ``/status`` document and the last ``/pool``
    document (None before the first): rendered here so that it shows the pool without
    JavaScript, refreshed by its inline script every ``POOL_PAGE_REFRESH_MS`` from
    ``/status``, ``/readyz`` and ``/pool``. Every value is escaped (node names and
    server URLs come from configuration and the cluster). The leader shown is
    ``/status``'s, which ``/pool`` names too: both take it from the election lease
    as last read (``ILeaderSource``)."""

    def value(key: str, kind: str) -> str:
        text, css = _page_value(kind, status.get(key))
        classes = f"value {css}" if css else "value"
        return (f'<span class="{classes}" data-field="{key}" data-kind="{kind}">'
                f"{_escaped(text)}</span>")

    cards = "".join(f'<div class="card"><span class="label">{_escaped(label)}</span>'
                    f"{value(key, kind)}</div>"
                    for key, label, kind in POOL_PAGE_FIELDS[:5])
    rows = "".join(f'<tr><th scope="row">{_escaped(label)}</th><td>{value(key, kind)}</td></tr>'
                   for key, label, kind in POOL_PAGE_FIELDS[5:])
    cloud = status.get("cloud") or {}
    not_probed_text = status.get("servers_not_probed") or "not probed"
    cloud_rows = "".join(
        f'<tr><td>{_escaped(url)}</td><td class="none">{_escaped(not_probed_text)}</td></tr>'
        if healthy is None else
        f"<tr><td>{_escaped(url)}</td><td class=\"{'yes' if healthy else 'no'}\">"
        f"{'healthy' if healthy else 'unhealthy'}</td></tr>"
        for url, healthy in sorted(cloud.items())) or (
        '<tr><td class="none">no cloud servers</td></tr>')
    failures = list(readiness_failures) if not status.get("ready") else []
    readiness = "".join(f'<li class="no">{_escaped(failure)}</li>' for failure in failures) \
        or '<li class="yes">ready</li>'
    node, pool = status.get("node") or "", status.get("pool") or ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>yurtcoord {_escaped(node)} &#183; {_escaped(status.get("role"))}</title>
<style>{POOL_PAGE_STYLE}</style>
</head>
<body>
<header>
<h1>yurtcoord agent <span data-field="node" data-kind="text">{_escaped(node)}</span></h1>
<p>pool <span data-field="pool" data-kind="text">{_escaped(pool)}</span>, as this agent sees it
&#183; <span id="refresh">rendered by the agent</span></p>
</header>
<main>
<div class="cards">{cards}</div>
<table><tbody>{rows}</tbody></table>
<h2>Cloud servers</h2>
<table><thead><tr><th>server</th><th>health</th></tr></thead>
<tbody id="cloud-servers">{cloud_rows}</tbody></table>
<h2>Readiness</h2>
<ul id="readiness">{readiness}</ul>
{render_pool_sections(pool_document)}</main>
<template id="timeline-svg"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {
    TIMELINE_WIDTH} {TIMELINE_HEIGHT}" role="img" aria-label="leader timeline"></svg></template>
<script>{_POOL_PAGE_SCRIPT % {
    "refresh_ms": POOL_PAGE_REFRESH_MS, "span": TIMELINE_SECONDS, "width": TIMELINE_WIDTH,
    "height": TIMELINE_HEIGHT, "bar": TIMELINE_BAR,
    "colours": json.dumps(list(TIMELINE_COLOURS))}}</script>
</body>
</html>
"""


def pool_page(view: IPoolView) -> PageRenderer:
    """``GET /``: the pool as this agent sees it, as a self-refreshing HTML page, with
    the view's last ``/pool`` document (its script reads a fresh one at once).

    The page is rendered once per pool document and agent status: while the view
    holds the same document (until its next build) and ``/status`` reads the same,
    every request gets the bytes rendered for the first (a page of a 1,000-member
    pool is milliseconds of CPU to render, and the browser asks every two seconds)."""
    # (document, status, readiness failures) the page was rendered for, and its bytes.
    rendered: list[tuple[Optional[Mapping[str, Any]], dict[str, Any], list[str], bytes]] = []

    def render(source: IStatusSource) -> tuple[int, str, bytes]:
        status = source.status()
        failures = [] if source.ready else list(source.readiness_failures())
        document = view.last_document
        if rendered:
            seen_document, seen_status, seen_failures, body = rendered[0]
            if (seen_document is document and seen_status == status
                    and seen_failures == failures):
                return 200, "text/html; charset=utf-8", body
        body = render_pool_page(status, failures, document).encode("utf-8")
        rendered[:] = [(document, status, failures, body)]
        return 200, "text/html; charset=utf-8", body

    return render


def accepts_gzip(accept_encoding: Optional[bytes]) -> bool:
    """Whether an ``Accept-Encoding`` header value accepts gzip: listed (or ``*``)
    without ``q=0``."""
    if not accept_encoding:
        return False
    accepted: dict[str, bool] = {}
    for item in accept_encoding.decode("latin-1").split(","):
        name, _, parameters = item.strip().partition(";")
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        accepted[name.strip().lower()] = quality > 0
    return accepted.get("gzip", accepted.get("*", False))


class PoolDocumentPage(resource.Resource):
    """``GET /pool``: the pool view's JSON document, answered once it is built (the
    view bounds every read it makes). A client gone meanwhile gets nothing; a defect
    of the view gives a 500 and one log line, as the other pages.

    A document is encoded once: the view answers with the same document until its
    next build, and every request for it gets the bytes encoded for the first (a
    document of a 1,000-member pool is milliseconds of CPU to encode). A client that
    accepts gzip (the pool page's browser, most tools) gets those bytes compressed,
    also once per document: sending the ~200 kB of a 1,000-member pool's document to
    each of many readers cost the agent more CPU than building it. The answer carries
    its length (no chunked framing around the body), and a document at hand is
    answered at once, without waiting on the client's end."""

    isLeaf = True
    log = Logger()

    def __init__(self, view: IPoolView) -> None:
        super().__init__()
        self.view = view
        # The document last encoded, its bytes, and those compressed (once asked).
        self._encoded: Optional[tuple[dict[str, Any], bytes]] = None
        self._compressed: Optional[tuple[dict[str, Any], bytes]] = None

    def encoded(self, document: dict[str, Any]) -> bytes:
        """The JSON bytes of ``document``, encoded once per document."""
        if self._encoded is not None and self._encoded[0] is document:
            return self._encoded[1]
        # Compact: the C encoder (an indented document is encoded in Python, ten
        # times slower) and a quarter fewer bytes to send per request.
        body = (json.dumps(document, separators=(",", ":")) + "\n").encode("utf-8")
        self._encoded = (document, body)
        return body

    def compressed(self, document: dict[str, Any]) -> bytes:
        """``encoded(document)`` gzipped, once per document."""
        if self._compressed is not None and self._compressed[0] is document:
            return self._compressed[1]
        body = gzip.compress(self.encoded(document), compresslevel=POOL_GZIP_LEVEL, mtime=0)
        self._compressed = (document, body)
        return body

    def render_GET(self, request: server.Request) -> object:
        if request.postpath not in ([], [b""]):
            return NOT_FOUND.render(request)
        gone: list[bool] = []
        built = self.view.document()
        if not built.called:
            # Answered once built: unless the client is gone by then.
            request.notifyFinish().addErrback(lambda _failure: gone.append(True))

        def answer(document: dict[str, Any]) -> None:
            request.setHeader(b"vary", b"accept-encoding")
            if accepts_gzip(request.getHeader(b"accept-encoding")):
                request.setHeader(b"content-encoding", b"gzip")
                self._finish(request, gone, 200, "application/json", self.compressed(document))
            else:
                self._finish(request, gone, 200, "application/json", self.encoded(document))

        def failed(failure: Failure) -> None:
            self.log.failure("status page /pool failed to read the pool view", failure)
            self._finish(request, gone, 500, "text/plain; charset=utf-8", b"internal error\n")

        built.addCallback(answer).addErrback(failed)
        return server.NOT_DONE_YET

    @staticmethod
    def _finish(request: server.Request, gone: list[bool], code: int, content_type: str,
                body: bytes) -> None:
        if gone:
            return
        request.setResponseCode(code)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()


class StatusRoot(resource.Resource):
    """Root of the status pages; any other path is a plain 404."""

    def getChild(self, path: bytes, request: server.Request) -> resource.IResource:
        return NOT_FOUND


def status_resource(source: IStatusSource, metrics: Metrics,
                    pool_view: Optional[IPoolView] = None) -> StatusRoot:
    """The resource tree: the pool page at ``/`` and the five pages beside it;
    ``/pool`` serves ``pool_view`` (``NoPoolView`` without one)."""
    view = pool_view if pool_view is not None else NoPoolView(source)
    root = StatusRoot()
    root.putChild(b"", SourcePage(source, pool_page(view)))
    root.putChild(b"healthz", SourcePage(source, healthz_page))
    root.putChild(b"readyz", SourcePage(source, readyz_page))
    root.putChild(b"status", SourcePage(source, status_page))
    root.putChild(b"pool", PoolDocumentPage(view))
    root.putChild(b"metrics", SourcePage(source, metrics_page(metrics)))
    return root


# The answer to a request for another page on a connection of the probe reserve.
_PROBES_ONLY_BODY = b"status connections at their limit: only /healthz and /readyz\n"
_PROBES_ONLY = (b"HTTP/1.1 503 Service Unavailable\r\n"
                b"Content-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: %d\r\nCache-Control: no-store\r\nRetry-After: 5\r\n"
                b"Connection: close\r\n\r\n%s" % (len(_PROBES_ONLY_BODY), _PROBES_ONLY_BODY))


def is_probe_path(path: bytes) -> bool:
    """Whether a request target names a probe page (``/healthz`` or ``/readyz``, with
    or without a trailing slash or a query)."""
    path = path.split(b"?", 1)[0]
    if path.endswith(b"/") and len(path) > 1:
        path = path[:-1]
    return path in PROBE_PATHS


def is_loopback(host: Optional[str]) -> bool:
    """Whether a client address is the node itself over loopback (127.0.0.0/8, ::1,
    or an IPv4-mapped 127.x); an address that is no IP address (a UNIX socket) is
    local too."""
    if host is None:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class StatusChannel(http.HTTPChannel):
    """HTTP/1.1 of the status pages, with a deadline for every request.

    The deadline runs from the connection's start, and again from each answer, until
    the next request has arrived whole; then the connection is aborted. A client that
    sends nothing, or a byte now and then, holds its descriptor for
    ``site.request_deadline`` seconds at most (``site.probe_deadline`` in the probe
    reserve, ``reserved``).

    A connection of the probe reserve asks the site about its request line as soon as
    it is read (``site.request_line_read``) and is closed after its one answer.
    """

    site: "StatusSite"
    # In the probe reserve rather than in an ordinary slot.
    reserved = False
    # The client address counted against its share of ordinary slots (None: not counted).
    counted_host: Optional[str] = None
    # Some of a request not yet answered has arrived (a push-out prefers these).
    started_request = False
    # The connection's request is being answered or was (no push-out then).
    answering = False
    _deadline: Optional[IDelayedCall] = None
    _busy = False
    _lost = False
    _body_bytes = 0

    def connectionMade(self) -> None:
        super().connectionMade()
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.callLater(self._deadline_seconds(), self._too_slow)

    def _deadline_seconds(self) -> float:
        return self.site.probe_deadline if self.reserved else self.site.request_deadline

    def _disarm(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        self.site.log_dropped(self, f"no whole request within {self._deadline_seconds()}s")
        drop_connection(self.transport)

    def drop(self, why: str) -> None:
        """Abort the connection now, saying ``why`` in the (bounded) debug log."""
        self._disarm()
        self.site.log_dropped(self, why)
        drop_connection(self.transport)

    def dataReceived(self, data: bytes) -> None:
        starting = not self._busy and not self.started_request and bool(data)
        if starting:
            self.started_request = True
        super().dataReceived(data)
        # A probe that came whole is answered by now; one still arriving counts.
        if starting and self.reserved and not self.answering and self._open():
            self.site.reserve_started(self)

    def _open(self) -> bool:
        """Neither lost nor being closed."""
        return (not self._lost and self.transport is not None
                and not getattr(self.transport, "disconnecting", False))

    def lineReceived(self, line: bytes) -> None:
        requests = len(self.requests)
        super().lineReceived(line)
        # A new request was begun: its request line has just been parsed.
        if self.reserved and len(self.requests) > requests and self._open():
            # ``line`` was that request line: "<method> <path> <version>".
            parts = line.split(b" ")
            self.site.request_line_read(self, parts[1] if len(parts) > 1 else b"")

    def answer_probes_only(self) -> None:
        """Answer that only the probe pages are served on this connection, and close it."""
        self._disarm()
        self.answering = True
        if self.transport is not None:
            self.transport.write(_PROBES_ONLY)
            self.transport.loseConnection()

    def checkPersistence(self, request: server.Request, version: bytes) -> bool:
        """A connection of the probe reserve is closed after its answer, so that the
        slot is free for the next probe (the kubelet opens one per probe anyway)."""
        if self.reserved:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return bool(super().checkPersistence(request, version))

    def allHeadersReceived(self) -> None:
        self._body_bytes = 0
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        # The body of the request being received (later requests pipelined behind
        # one being answered are only buffered here, and counted when their turn comes).
        if not self._busy:
            self._body_bytes += len(data)
            if self._body_bytes > self.site.max_request_body:
                self.drop(f"request body larger than {self.site.max_request_body} bytes")
                return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._disarm()
        self._busy = True
        self.answering = True
        super().allContentReceived()

    def requestDone(self, request: server.Request) -> None:
        self._busy = False
        self.started_request = False
        super().requestDone(request)
        # A request pipelined behind this one may have been answered meanwhile. A
        # connection closing after its answer is armed too: a client that does not
        # read the answer would keep it open.
        if not self._busy and not self._lost and self._deadline is None:
            self._arm()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._lost = True
        self._disarm()
        self.site.channel_closed(self)
        super().connectionLost(reason)


class StatusSite(server.Site):
    """The status site: at most ``max_connections`` ordinary connections, at most
    ``max_per_address`` of them from one client address other than loopback, and
    ``probe_reserve`` more for ``PROBE_PATHS`` only (see the module docstring); each
    request due within ``request_deadline`` seconds (``probe_deadline`` in the
    reserve) with at most ``max_request_body`` bytes of body (``StatusChannel``);
    requests logged at debug, at most ``access_log.limit`` lines a second
    (``LinesPerSecond``).

    ``open_connections`` is how many are open now, ``refused`` how many were closed
    unanswered or answered only "probes only" because no ordinary slot was theirs
    (pushed out of the reserve, or asking the reserve for another page).
    """

    # Not ``log``: that is the access log method of Twisted's Site.
    logger = Logger()
    # Twisted types a site's channels as its HTTP/2-negotiating wrapper; this site
    # builds plain HTTP/1.1 ``StatusChannel``s.
    protocol: Callable[[], Any] = StatusChannel
    displayTracebacks = False
    noisy = False

    def __init__(self, root: resource.Resource, reactor: IReactorTime,
                 max_connections: int = MAX_STATUS_CONNECTIONS,
                 request_deadline: float = STATUS_REQUEST_DEADLINE,
                 max_request_body: int = MAX_STATUS_REQUEST_BODY,
                 max_per_address: int = MAX_STATUS_CONNECTIONS_PER_ADDRESS,
                 probe_reserve: int = PROBE_RESERVE_CONNECTIONS,
                 probe_deadline: float = PROBE_REQUEST_DEADLINE,
                 max_unread: int = MAX_STATUS_UNREAD_CONNECTIONS) -> None:
        # No idle timeout of Twisted's own: the request deadline covers idle clients.
        super().__init__(root, reactor=reactor, timeout=None)
        self.max_connections = max_connections
        self.request_deadline = request_deadline
        self.max_request_body = max_request_body
        self.max_per_address = max_per_address
        self.probe_reserve = probe_reserve
        self.probe_deadline = probe_deadline
        self.max_unread = max_unread
        self.refused = 0
        self._ordinary: set[StatusChannel] = set()
        # The probe reserve, oldest first (the order in which it pushes connections
        # out): those nothing was read from yet, and those that sent part of a request.
        self._unread: dict[StatusChannel, None] = {}
        self._reserve: dict[StatusChannel, None] = {}
        self._per_address: dict[str, int] = {}
        self._refusing_since: Optional[int] = None
        # Lines a client causes: the access log and dropped connections.
        self.access_log = LinesPerSecond(reactor, self._access_lines_dropped)

    @property
    def open_connections(self) -> int:
        return len(self._ordinary) + len(self._unread) + len(self._reserve)

    @property
    def reserved_connections(self) -> int:
        """Connections open now in the probe reserve (read from or not)."""
        return len(self._unread) + len(self._reserve)

    def buildProtocol(self, addr: Optional[IAddress]) -> Any:
        """A ``StatusChannel`` in an ordinary slot when one is free for its address,
        else in the probe reserve, among the connections not read from yet (pushing
        out the oldest of those when ``max_unread`` are open). Never None: a new
        connection is not closed before it has been read."""
        host: Optional[str] = getattr(addr, "host", None)
        capped = host is not None and not is_loopback(host)
        if len(self._ordinary) < self.max_connections and not (
                capped and host is not None
                and self._per_address.get(host, 0) >= self.max_per_address):
            channel = super().buildProtocol(addr)
            self._ordinary.add(channel)
            if capped and host is not None:
                channel.counted_host = host
                self._per_address[host] = self._per_address.get(host, 0) + 1
            return channel
        if len(self._ordinary) >= self.max_connections:
            self._at_limit()
        else:
            self.log_dropped_peer(host, f"its address holds {self.max_per_address} "
                                        "ordinary status connections: probes only")
        if len(self._unread) >= self.max_unread:
            # The oldest not being answered (a probe that came whole in its first
            # bytes is, until its answer is sent).
            victim = next((waiting for waiting in self._unread if not waiting.answering),
                          None)
            if victim is not None:
                self._push_out(victim, "sent nothing while "
                                       f"{self.max_unread} newer connections arrived")
        channel = super().buildProtocol(addr)
        channel.reserved = True
        self._unread[channel] = None
        return channel

    def reserve_started(self, channel: StatusChannel) -> None:
        """``channel``, in the probe reserve, has sent part of a request and not all
        of it: it takes a place among ``probe_reserve``, pushing out the one there
        that has waited longest when they are all taken (one being answered is
        not pushed out)."""
        self._unread.pop(channel, None)
        self._reserve[channel] = None
        if len(self._reserve) <= self.probe_reserve:
            return
        victim = next((waiting for waiting in self._reserve if not waiting.answering),
                      None)
        if victim is not None:
            self._push_out(victim, f"{self.probe_reserve} newer connections of the "
                                   "probe reserve sent part of a request")

    def _push_out(self, channel: StatusChannel, why: str) -> None:
        self._unread.pop(channel, None)
        self._reserve.pop(channel, None)
        self.refused += 1
        channel.drop(f"pushed out of the probe reserve: {why}")

    def _at_limit(self) -> None:
        if self._refusing_since is None:
            self._refusing_since = self.refused
            self.logger.warn("status connections at the limit of {limit}: new ones are "
                             "answered for /healthz and /readyz only until some end",
                             limit=self.max_connections)

    def request_line_read(self, channel: StatusChannel, path: bytes) -> None:
        """The request line of a connection in the probe reserve: a probe is served,
        any other page answered 503 (and the connection closed)."""
        if is_probe_path(path):
            return
        self.refused += 1
        self.log_dropped(channel, "only /healthz and /readyz are answered while the "
                                  "ordinary status connections are taken")
        channel.answer_probes_only()

    def startFactory(self) -> None:
        """Nothing to open: the access log goes to the debug log (see ``log``), so
        Twisted's log file and its once-a-second date timer are not needed."""

    def stopFactory(self) -> None:
        """The port stopped listening: report the access log lines dropped so far,
        leaving no timer behind."""
        self.access_log.stop()

    def _access_lines_dropped(self, count: int) -> None:
        self.logger.debug("status access log: {count} lines dropped in the last second "
                          "(at most {limit} a second)", count=count,
                          limit=self.access_log.limit)

    def channel_closed(self, channel: StatusChannel) -> None:
        """Free the slot of ``channel`` (once; a pushed-out one is freed at once)."""
        self._unread.pop(channel, None)
        self._reserve.pop(channel, None)
        if channel in self._ordinary:
            self._ordinary.discard(channel)
            host = channel.counted_host
            if host is not None:
                left = self._per_address.get(host, 1) - 1
                if left > 0:
                    self._per_address[host] = left
                else:
                    self._per_address.pop(host, None)
        if self._refusing_since is not None and len(self._ordinary) < self.max_connections:
            refused = self.refused - self._refusing_since
            self._refusing_since = None
            self.logger.info("status connections below the limit of {limit} again, "
                             "{refused} refused meanwhile", limit=self.max_connections,
                             refused=refused)

    def log_dropped(self, channel: StatusChannel, why: str) -> None:
        transport = channel.transport
        peer = getattr(transport.getPeer(), "host", None) if transport is not None else None
        self.log_dropped_peer(peer, why)

    def log_dropped_peer(self, peer: Optional[str], why: str) -> None:
        """One debug line about a connection of ``peer``, within the access log's
        bound."""
        if not self.access_log.allow():
            return
        self.logger.debug("status connection from {peer} dropped: {why}",
                          peer=peer or "?", why=why)

    def getContentFile(self, length: Optional[int]) -> io.BytesIO:
        """Where a request body goes: memory (it is at most ``max_request_body``)."""
        return io.BytesIO()

    def log(self, request: http.Request) -> None:
        """The access log: debug only (the pool page polls twice every 2 s), and at
        most ``access_log.limit`` lines a second with paths cut short."""
        if not self.access_log.allow():
            return
        self.logger.debug(
            "status request {method} {path} {code} from {client}",
            method=shown_path(request.method.decode("latin-1")),
            path=shown_path(request.uri.decode("latin-1")),
            code=request.code, client=request.getClientAddress().host)


def status_site(source: IStatusSource, metrics: Metrics, reactor: IReactorTime,
                pool_view: Optional[IPoolView] = None) -> StatusSite:
    """A ``StatusSite`` serving ``status_resource``; no tracebacks to clients."""
    return StatusSite(status_resource(source, metrics, pool_view), reactor)
