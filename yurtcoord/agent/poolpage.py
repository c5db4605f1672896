"""The pool page (``GET /``): the pool as one agent sees it, rendered whole on the
server so that it shows the pool without JavaScript, then redrawn by its script from
``/status``, ``/readyz`` and ``/pool``.

The page's style and script are package data (``static/pool.css`` and
``static/pool.js`` beside this module: ``yurtcoord.agent.pagefiles``), read once when
this module is imported and put inline in every page. The sandbox's control page
shares the style (one style for every page an operator opens).
"""
import html
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from yurtcoord.agent.pagefiles import page_script, static_text
from yurtcoord.agent.statussources import IPoolView, IStatusSource, PageRenderer, rfc3339

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
POOL_PAGE_STYLE = static_text("yurtcoord.agent", "pool.css")


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



# The pool page's script (package data), read once and put inline in every page.
POOL_PAGE_SCRIPT = page_script("yurtcoord.agent", "pool.js", {
    "refresh_ms": POOL_PAGE_REFRESH_MS, "span": TIMELINE_SECONDS, "width": TIMELINE_WIDTH,
    "height": TIMELINE_HEIGHT, "bar": TIMELINE_BAR, "colours": list(TIMELINE_COLOURS)})


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
<script>{POOL_PAGE_SCRIPT}</script>
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
