"""The sandbox's control page, drawn from one control document.

The page looks like an agent's pool page (it shares ``POOL_PAGE_STYLE``: one style
for every page an operator opens) and, like it, is rendered whole by the server so
that it shows the pool without JavaScript. Its inline script (package data,
``static/control.js`` beside this module) then fetches
``page.json`` every ``CONTROL_PAGE_REFRESH_MS`` and replaces the sections whose HTML
changed, so that the page follows the pool without reloading (a reload every second
lost the scroll position and flashed the page). The sections are rendered here, on
the server, for both: one renderer, every value escaped.

What the page marks: the pool leader (every agent whose role is leader: two would be
a fault), the pool etcd's raft leader, each node whose cloud lease the sandbox has
not seen renewed for ``stale_after_seconds`` (on its own clock: docs/design.md,
"Clocks") and each agent whose cloud link is cut (SIGUSR1), with how long ago.
"""

import html
import json
from typing import Any, Mapping

from yurtcoord.agent.pagefiles import page_script
from yurtcoord.agent.poolpage import POOL_PAGE_STYLE
from yurtcoord.sim.sandboxapiservers import SandboxCoordinators
from yurtcoord.sim.sandboxetcd import SandboxEtcd

# Milliseconds between two refreshes of the control page in the browser.
CONTROL_PAGE_REFRESH_MS = 1000
# The sections the script replaces: element id -> what it holds.
SECTIONS = ("summary", "links", "nodes", "etcd", "coordinators")

# The page's script (package data), read once and put inline in every page.
CONTROL_PAGE_SCRIPT = page_script("yurtcoord.sim", "control.js",
                                  {"refresh_ms": CONTROL_PAGE_REFRESH_MS})


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _seconds(value: object) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "-"


def pool_leaders(document: Mapping[str, Any]) -> list[str]:
    """The nodes whose agent's role is leader, in node order."""
    return [node for node, state in document["nodes"].items() if state["role"] == "leader"]


def _card(label: str, value: str, css: str = "") -> str:
    return (f'<div class="card"><span class="label">{_e(label)}</span>'
            f'<span class="value {css}">{_e(value)}</span></div>')


def summary_section(document: Mapping[str, Any]) -> str:
    """Cards: the pool leader, the raft leader, stale cloud leases, cut cloud links."""
    leaders = pool_leaders(document)
    etcd = document.get("etcd") or {}
    raft = next((member["name"] for member in etcd.get("members", [])
                 if member.get("raft_leader")), None)
    stale = [node for node, state in document["nodes"].items()
             if state.get("cloud_lease_stale")]
    cut = [link["node"] for link in document["cut_links"]]
    return "".join((
        _card("pool leader", ", ".join(leaders) or "none",
              "role-leader" if len(leaders) == 1 else "no"),
        _card("raft leader", raft or "none", "role-leader" if raft else "no"),
        _card("stale cloud leases", ", ".join(stale) or "none", "no" if stale else "yes"),
        _card("cut cloud links", ", ".join(cut) or "none", "no" if cut else "yes"),
    ))


def links_section(document: Mapping[str, Any]) -> str:
    """One item per cut cloud link, with how long ago it was cut and how to restore
    it; empty while every link is up."""
    pid = document.get("pid")
    return "".join(
        f'<li class="no" data-cut="{_e(link["node"])}">cloud link of {_e(link["node"])} '
        f'cut {_e(_seconds(link["cut_seconds"]))} ago ({_e(link["by"])}): it reaches '
        f"no cloud apiserver; <code>kill -USR2 {_e(pid)}</code> restores every link</li>"
        for link in document["cut_links"])


def _node_row(node: str, state: Mapping[str, Any]) -> str:
    stale = bool(state.get("cloud_lease_stale"))
    cut = state.get("cloud_link") == "cut"
    badges = ('<span class="badge">STALE</span>' if stale else "") + (
        '<span class="badge">CUT</span>' if cut else "")
    role = str(state["role"])
    leader_mark = '<span class="role-leader">pool leader</span>' if role == "leader" else ""
    running = bool(state["kubelet_running"])
    action = "stop" if running else "start"
    link = (f'<span class="no">cut {_e(_seconds(state.get("cloud_link_cut_seconds")))} ago'
            "</span>" if cut else '<span class="yes">up</span>')
    sees = state["agent_sees_kubelet_alive"]
    return (
        f'<tr class="{"stale" if stale else "node"}" data-node="{_e(node)}" '
        f'data-role="{_e(role)}" data-stale="{str(stale).lower()}" '
        f'data-link="{"cut" if cut else "up"}">'
        f"<td>{_e(node)}{badges}</td>"
        f'<td class="role-{_e(role)}">{_e(role)}</td><td>{leader_mark}</td>'
        f'<td>{_e(state.get("leader") or "none")}</td>'
        f'<td class="{"yes" if running else "no"}">'
        f'{"answering" if running else "stopped"}</td>'
        f'<td class="{"yes" if sees else "no"}">{"alive" if sees else "dead"}</td>'
        f'<td>{_e(state.get("cause") or "-")}</td><td>{link}</td>'
        f'<td>{_e(state.get("cloud_lease_renew_time") or "-")}</td>'
        f'<td class="{"path-stale" if stale else ""}">'
        f'{_e(_seconds(state.get("cloud_lease_age_seconds")))}</td>'
        f"<td><form method='post' action='/kubelet/{_e(node)}/{action}'>"
        f"<button>{action} kubelet</button></form></td></tr>")


def nodes_section(document: Mapping[str, Any]) -> str:
    """A row per node: role, the leader its agent names, its kubelet, its cloud link
    and its cloud lease, stale ones highlighted."""
    return "".join(_node_row(node, state) for node, state in document["nodes"].items())


def etcd_section(document: Mapping[str, Any]) -> str:
    etcd = document.get("etcd")
    return SandboxEtcd.page_section(etcd) if etcd is not None else ""


def coordinators_section(document: Mapping[str, Any]) -> str:
    return SandboxCoordinators.page_section(document["coordinators"])


def control_sections(document: Mapping[str, Any]) -> dict[str, str]:
    """``{section id: its inner HTML}`` of the control page for ``document``."""
    return {"summary": summary_section(document), "links": links_section(document),
            "nodes": nodes_section(document), "etcd": etcd_section(document),
            "coordinators": coordinators_section(document)}


def control_page_json(document: Mapping[str, Any]) -> bytes:
    """``GET /page.json``: the control document and the sections drawn from it, which
    the page's script puts in place."""
    return json.dumps({"state": document, "sections": control_sections(document)},
                      indent=1).encode("utf-8")


def render_control_page(document: Mapping[str, Any]) -> bytes:
    """The whole control page for ``document``; its script keeps it up to date."""
    sections = control_sections(document)
    grace = document.get("kubelet_grace_period", "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>yurtcoord sandbox &#183; {_e(document["pool"])}</title>
<style>{POOL_PAGE_STYLE}</style>
</head>
<body>
<header>
<h1>yurtcoord sandbox: pool {_e(document["pool"])}</h1>
<p>control page of the sandbox (pid {_e(document.get("pid"))}) &#183;
<span id="refresh">rendered by the sandbox</span></p>
</header>
<main>
<div class="cards" id="summary">{sections["summary"]}</div>
<ul id="links"{"" if sections["links"] else " hidden"}>{sections["links"]}</ul>
<h2>Nodes</h2>
<p class="muted">Stop a node's kubelet: after the {_e(grace)} grace period its agent stops
renewing the node lease, directly or through the pool leader, and the lease in the cloud
goes stale (not seen renewed for {_e(_seconds(document.get("stale_after_seconds")))} on the
sandbox's clock). Start it again: it is renewed again within seconds.</p>
<table><thead><tr><th>node</th><th>role</th><th>pool leader</th><th>leader it names</th>
<th>kubelet</th><th>agent sees it</th><th>cause</th><th>cloud link</th>
<th>cloud renewTime</th><th>age</th><th></th></tr></thead>
<tbody id="nodes">{sections["nodes"]}</tbody></table>
<div id="etcd">{sections["etcd"]}</div>
<div id="coordinators">{sections["coordinators"]}</div>
</main>
<script>{CONTROL_PAGE_SCRIPT}</script>
</body>
</html>
""".encode("utf-8")
