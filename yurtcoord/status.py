"""The agent's status HTTP surface: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``.

The pages read everything from a *status source* (``IStatusSource``) passed in, so the
same resources serve an agent whose coordinator does not exist yet (``InitialStatus``)
and, later, the running coordinator. A source that raises gives a 500 and one log line;
it never takes the HTTP server down.
"""

import json
import time
from datetime import datetime, timezone

from twisted.logger import Logger
from twisted.web import pages, resource, server
from zope.interface import Attribute, Interface, implementer

from yurtcoord.metrics import METRICS_CONTENT_TYPE

NOT_FOUND = pages.notFound("No such page", "Pages: /healthz /readyz /status /metrics")


class IStatusSource(Interface):
    """What the status pages need to know about one agent; safe to read at any time."""

    role = Attribute('"init", "pending", "follower" or "leader"')
    healthy = Attribute("True when the role is leader or follower")
    ready = Attribute("True when healthy, pool cache synced and local cache uploaded")

    def readiness_failures():
        """A list of strings naming each failing readiness condition; empty when ready."""

    def status():
        """The ``/status`` document (SPEC §4) as a JSON-serialisable dict."""


def rfc3339(seconds):
    """Epoch ``seconds`` → RFC 3339 UTC text, e.g. ``2026-01-02T03:04:05Z``."""
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@implementer(IStatusSource)
class InitialStatus:
    """The status of an agent whose coordinator does not exist yet: role init, not
    healthy, not ready, nothing known about any server.

    ``since`` is the epoch time the agent entered this state (default: now).
    """

    role = "init"
    healthy = False
    ready = False

    def __init__(self, node, pool, cloud_servers, since=None):
        self.node = node
        self.pool = pool
        self.cloud_servers = tuple(cloud_servers)
        self.since = time.time() if since is None else since

    def readiness_failures(self):
        return [
            "coordinator not healthy (role init)",
            "pool cache not synced",
            "local cache not uploaded",
        ]

    def status(self):
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
            "last_transition": rfc3339(self.since),
            "delegated_heartbeats": 0,
            "uploaded_objects": 0,
        }


class SourcePage(resource.Resource):
    """A leaf page rendered by ``render_page(source)`` → (code, content type, body bytes).

    A failing source gives a 500 and one log line.
    """

    isLeaf = True
    log = Logger()

    def __init__(self, source, render_page):
        super().__init__()
        self.source = source
        self.render_page = render_page

    def render_GET(self, request):
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


def _text(code, text):
    return code, "text/plain; charset=utf-8", text.encode("utf-8")


def healthz_page(source):
    """200 ``ok`` when the coordinator is healthy (leader or follower), else 503."""
    if source.healthy:
        return _text(200, "ok\n")
    return _text(503, f"not healthy: role {source.role}\n")


def readyz_page(source):
    """200 ``ok`` when ready, else 503 naming each failing condition on its own line."""
    if source.ready:
        return _text(200, "ok\n")
    failures = list(source.readiness_failures()) or ["not ready"]
    return _text(503, "".join(f"not ready: {failure}\n" for failure in failures))


def status_page(source):
    """The SPEC §4 JSON document."""
    body = json.dumps(source.status(), indent=2) + "\n"
    return 200, "application/json", body.encode("utf-8")


def metrics_page(metrics):
    """Prometheus text; refreshes the role/health/readiness/server gauges from the source
    first, so a scrape never shows older values than the status pages."""

    def render(source):
        metrics.set_role(source.role)
        metrics.set_healthy(source.healthy)
        metrics.set_ready(source.ready)
        for server_url, healthy in (source.status().get("cloud") or {}).items():
            metrics.set_server_healthy(server_url, bool(healthy))
        return 200, METRICS_CONTENT_TYPE, metrics.render()

    return render


class StatusRoot(resource.Resource):
    """Root of the status pages; any other path is a plain 404."""

    def getChild(self, path, request):
        return NOT_FOUND


def status_resource(source, metrics):
    """The resource tree: the four pages as children of an otherwise empty root."""
    root = StatusRoot()
    root.putChild(b"healthz", SourcePage(source, healthz_page))
    root.putChild(b"readyz", SourcePage(source, readyz_page))
    root.putChild(b"status", SourcePage(source, status_page))
    root.putChild(b"metrics", SourcePage(source, metrics_page(metrics)))
    return root


def status_site(source, metrics, reactor):
    """A ``twisted.web.server.Site`` serving ``status_resource``; no tracebacks to clients."""
    site = server.Site(status_resource(source, metrics), reactor=reactor)
    site.displayTracebacks = False
    site.noisy = False
    return site
