"""The pool page (``GET /``) over a real port: server-side HTML with every value
escaped, no external assets, and, in headless Chromium, a screenshot and a DOM that
the page's own script refreshed from ``/status`` so that it names the current leader."""

import os

import treq.client
from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.poolpage import TIMELINE_SECONDS, leader_segments
from yurtcoord.agent.status import status_site
from yurtcoord.agent.statussources import IPoolView, IStatusSource, InitialStatus, rfc3339
from yurtcoord.testing.chromium import (
    LEADER_FIELD, MEMBER_ROW, MEMBER_SERVERS, PNG_MAGIC, RECT_LEADERS, STALE_ROW,
    run_chromium,
)

EVIL_NODE = "<img src=x onerror=alert(1)>&\"edge'"
EVIL_SERVER = "https://cloud.example/<script>alert(2)</script>"
EVIL_MEMBER = "https://10.0.0.1:2379/<b>x</b>"
# (pool etcd member, coordinator apiserver) each member of ``pool_document`` uses.
SERVERS_IN_USE = {EVIL_NODE: (EVIL_MEMBER, "https://10.0.0.1:6443"),
                  "edge-3": ("https://10.0.0.3:2379", "https://10.0.0.2:6443")}
# The same as MEMBER_SERVERS reads them from Chromium's DOM (the server's HTML also
# escapes the node name's ').
SHOWN_SERVERS = [
    ("edge-&lt;1&gt;", "none", "none"),
    ("edge-3", "https://10.0.0.3:2379", "https://10.0.0.2:6443"),
    ("&lt;img src=x onerror=alert(1)&gt;&amp;&quot;edge'", "https://10.0.0.1:2379/&lt;b&gt;x&lt;/b&gt;",
     "https://10.0.0.1:6443"),
]


@implementer(IStatusSource)
class ChangingLeaderStatus:
    """A follower whose pool changes leader after the first ``status()`` read: the
    server-side render names ``first_leader``, every later read (the page's refresh
    from ``/status``) names ``later_leader``."""

    role = "follower"
    healthy = True
    ready = False

    def __init__(self, node, first_leader, later_leader, failures=("pool cache not synced",)):
        self.node = node
        self.leaders = [first_leader, later_leader]
        self.failures = list(failures)
        self.reads = 0

    def readiness_failures(self):
        return list(self.failures)

    def status(self):
        leader = self.leaders[min(self.reads, 1)]
        self.reads += 1
        return {
            "node": self.node, "pool": "pool-<a>", "role": self.role, "healthy": True,
            "ready": False, "pool_cache_synced": False, "local_cache_uploaded": True,
            "leader": leader, "cloud": {EVIL_SERVER: True, "https://10.0.0.2:6443": False},
            "coordinator_healthy": True, "last_transition": rfc3339(0),
            "delegated_heartbeats": 7, "uploaded_objects": 42,
        }


NOW = 1_780_000_000.0


def pool_document(stale=(), leader="edge-<1>", now=NOW):
    """A /pool document of three members (``stale`` ones stale), who led: edge-3 two
    hours ago, ``leader`` from 40 minutes ago, edge-3 again for the last 10 minutes."""
    members = []
    for node in (EVIL_NODE, "edge-3", leader):
        path = "stale" if node in stale else "direct"
        members.append({"node": node, "heartbeat": path, "stale": path == "stale",
                        "lease_age": 31.0 if path == "stale" else 1.5,
                        "cloud_lease_age": None, "pool_lease_age": 1.5,
                        "leader": node == "edge-3", "this_agent": node == EVIL_NODE,
                        "etcd_member": SERVERS_IN_USE.get(node, (None, None))[0],
                        "coordinator_server": SERVERS_IN_USE.get(node, (None, None))[1],
                        "upload": {"uploaded": True, "objects": 42}
                        if node == EVIL_NODE else None})
    changes = [{"time": rfc3339(at), "at": at, "leader": name}
               for at, name in ((now - 7200, "edge-3"), (now - 2400, leader),
                                (now - 600, "edge-3"))]
    return {"node": EVIL_NODE, "pool": "pool-<a>", "role": "follower", "ready": False,
            "generated": rfc3339(now), "generated_at": now, "stale_after_seconds": 9.0,
            "cloud_read": False, "leader": "edge-3",
            "election": {"holder": "edge-3", "lease_age": 0.5,
                         "lease_duration_seconds": 15, "expired": False},
            "members": members, "leader_changes": changes,
            "cache": {"synced": True, "informer_sync_lease_age": 2.5,
                      "informer_sync_holder": "edge-3",
                      "resources": {"endpoints": 5, "<evil>": None}},
            "errors": {"cloud nodes": "no healthy <cloud> server"}}


@implementer(IPoolView)
class ChangingPoolView:
    """A pool view whose documents are ``documents`` in turn, the last one repeated."""

    def __init__(self, *documents):
        self.documents = list(documents)
        self.reads = 0
        self.last_document = None

    def document(self):
        self.last_document = self.documents[min(self.reads, len(self.documents) - 1)]
        self.reads += 1
        return defer.succeed(self.last_document)


class PoolPageTests(unittest.TestCase):
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.http = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    def serve(self, source, view=None):
        site = status_site(source, Metrics("edge-2", "pool-a"), reactor, view)
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return f"http://127.0.0.1:{port.getHost().port}"

    @defer.inlineCallbacks
    def get(self, url):
        response = yield self.http.get(url)
        body = yield response.content()
        return response, body.decode("utf-8")

    @defer.inlineCallbacks
    def test_page_renders_the_pool_with_every_value_escaped(self):
        source = ChangingLeaderStatus(EVIL_NODE, "edge-<1>", "edge-3")
        base = self.serve(source)
        response, page = yield self.get(base + "/")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"),
                         ["text/html; charset=utf-8"])
        self.assertTrue(page.startswith("<!DOCTYPE html>"))
        self.assertIn("&lt;img src=x onerror=alert(1)&gt;&amp;&quot;edge&#x27;", page)
        self.assertNotIn("<img", page)
        self.assertNotIn("alert(2)</script>", page)
        self.assertIn("https://cloud.example/&lt;script&gt;alert(2)&lt;/script&gt;", page)
        self.assertIn("pool-&lt;a&gt;", page)
        self.assertEqual(LEADER_FIELD.findall(page), ["edge-&lt;1&gt;"])
        self.assertIn('<li class="no">pool cache not synced</li>', page)
        for label, shown in (("uploaded_objects", "42"), ("delegated_heartbeats", "7"),
                             ("role", "follower"), ("pool_cache_synced", "no"),
                             ("local_cache_uploaded", "yes"), ("coordinator_healthy", "yes")):
            self.assertRegex(page, rf'data-field="{label}"[^>]*>{shown}<')
        self.assertRegex(page, r'<td class="no">unhealthy</td>')
        # Self-contained: inline style and script only, nothing fetched from elsewhere.
        self.assertNotRegex(page, r"<(script|link|img|iframe)[^>]*\b(src|href)=")
        script = page.split("<script>", 1)[1].split("</script>", 1)[0]
        style = page.split("<style>", 1)[1].split("</style>", 1)[0]
        self.assertNotIn("http", script)
        self.assertNotIn("url(", style)
        self.assertNotIn("@import", style)
        self.assertIn('fetch("status"', page)

    @defer.inlineCallbacks
    def test_page_of_an_agent_before_its_coordinator_runs(self):
        base = self.serve(InitialStatus("edge-9", "pool-a", ["https://10.0.0.1:6443"]))
        response, page = yield self.get(base + "/")
        self.assertEqual(response.code, 200)
        self.assertRegex(page, r'data-field="role"[^>]*>init<')
        self.assertEqual(LEADER_FIELD.findall(page), ["none"])
        self.assertIn('<li class="no">coordinator not healthy (role init)</li>', page)
        self.assertRegex(page, r'<td>https://10\.0\.0\.1:6443</td><td class="no">unhealthy</td>')

    @defer.inlineCallbacks
    def test_other_pages_keep_their_behaviour(self):
        base = self.serve(ChangingLeaderStatus("edge-2", "edge-1", "edge-1"))
        response, body = yield self.get(base + "/status")
        self.assertEqual((response.code, response.headers.getRawHeaders("content-type")),
                         (200, ["application/json"]))
        for path in ("/nothing-here", "/index.html", "/status/x"):
            response, _ = yield self.get(base + path)
            self.assertEqual((path, response.code), (path, 404))
        response, body = yield self.get(base + "/healthz")
        self.assertEqual((response.code, body), (200, "ok\n"))

    # -- in a browser --------------------------------------------------------------------

    def chromium(self, *arguments):
        return run_chromium(self, reactor, *arguments)

    @defer.inlineCallbacks
    def test_chromium_takes_a_screenshot(self):
        base = self.serve(ChangingLeaderStatus("edge-2", "edge-1", "edge-3"))
        shot = os.path.join(os.path.abspath(self.mktemp()), "page.png")
        os.makedirs(os.path.dirname(shot))
        code, out, err = yield self.chromium(
            f"--screenshot={shot}", "--window-size=1000,700", base + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        with open(shot, "rb") as handle:
            png = handle.read()
        self.assertTrue(png.startswith(PNG_MAGIC), png[:16])
        # Width and height from the IHDR chunk: the requested window size.
        self.assertEqual((int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")),
                         (1000, 700))

    @defer.inlineCallbacks
    def test_rendered_dom_names_the_current_leader_after_refresh(self):
        source = ChangingLeaderStatus("edge-2", "edge-1", "edge-3")
        base = self.serve(source)
        code, dom, err = yield self.chromium("--virtual-time-budget=3000", "--dump-dom",
                                             base + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        dom = dom.decode("utf-8")
        # Served naming edge-1; the page's script read /status, which names edge-3.
        self.assertGreaterEqual(source.reads, 2)
        self.assertEqual(LEADER_FIELD.findall(dom), ["edge-3"])
        self.assertIn("live, updated", dom)
        self.assertRegex(dom, r'<li class="no">pool cache not synced</li>')
        self.assertIn("10.0.0.2:6443", dom)

    @defer.inlineCallbacks
    def test_page_renders_the_pool_view_escaped(self):
        source = ChangingLeaderStatus(EVIL_NODE, "edge-3", "edge-3")
        view = ChangingPoolView(pool_document(stale=("edge-3",)))
        verifyObject(IPoolView, view)
        view.document()
        base = self.serve(source, view)
        response, page = yield self.get(base + "/")
        self.assertEqual(response.code, 200)
        self.assertNotIn("<img", page)
        self.assertNotIn("<evil>", page)
        self.assertIn("&lt;evil&gt;", page)
        self.assertIn("no healthy &lt;cloud&gt; server", page)
        # The leader /status names: the one source every surface reads (the election
        # lease as last read), the one /pool names too.
        self.assertEqual(LEADER_FIELD.findall(page), ["edge-3"])
        self.assertEqual(STALE_ROW.findall(page), ["edge-3"])
        self.assertEqual(len(MEMBER_ROW.findall(page)), 3)
        self.assertIn('data-node="edge-&lt;1&gt;"', page)
        self.assertIn('<td id="sync-age">2.5s</td>', page)
        self.assertIn("<td>endpoints</td><td>5</td>", page)
        self.assertIn("<td>uploaded (42)</td>", page)
        # The servers each member uses, escaped; "none" where unknown.
        self.assertNotIn("<b>", page)
        self.assertEqual(sorted(MEMBER_SERVERS.findall(page)), sorted(
            (node.replace("'", "&#x27;"), member, server)
            for node, member, server in SHOWN_SERVERS))
        self.assertIn("<th>pool etcd member</th><th>coordinator apiserver</th>", page)
        svg = page.split('<div id="timeline">', 1)[1].split("</div>", 1)[0]
        self.assertTrue(svg.startswith("<svg "), svg[:80])
        self.assertEqual(RECT_LEADERS.findall(svg), ["edge-3", "edge-&lt;1&gt;", "edge-3"])
        self.assertNotRegex(page, r"<(script|link|img|iframe)[^>]*\b(src|href)=")
        script = page.split("<script>", 1)[1].split("</script>", 1)[0]
        self.assertNotIn("http", script)
        self.assertIn('fetch("pool"', script)

    def test_leader_segments_cover_the_last_hour(self):
        changes = pool_document()["leader_changes"]
        # edge-3's first term began before the hour: cut at its start.
        self.assertEqual(leader_segments(changes, NOW), [
            (NOW - TIMELINE_SECONDS, NOW - 2400, "edge-3"), (NOW - 2400, NOW - 600, "edge-<1>"),
            (NOW - 600, NOW, "edge-3")])
        self.assertEqual(leader_segments(changes[:1], NOW), [
            (NOW - TIMELINE_SECONDS, NOW, "edge-3")])
        self.assertEqual(leader_segments([], NOW), [])
        self.assertEqual(leader_segments([{"at": "x", "leader": "a"}, {"leader": "b"}], NOW), [])

    @defer.inlineCallbacks
    def test_chromium_shows_members_leader_timeline_and_a_member_going_stale(self):
        source = ChangingLeaderStatus("edge-2", "edge-3", "edge-3")
        view = ChangingPoolView(pool_document(), pool_document(stale=("edge-3",)))
        base = self.serve(source, view)
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        shot = os.path.join(directory, "pool-page.png")
        code, dom, err = yield self.chromium("--virtual-time-budget=3000", "--dump-dom",
                                             base + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        dom = dom.decode("utf-8")
        # The page was served before any /pool read, then its script read /pool.
        self.assertGreaterEqual(view.reads, 1)
        self.assertEqual(LEADER_FIELD.findall(dom), ["edge-3"])
        self.assertEqual(len(MEMBER_ROW.findall(dom)), 3)
        self.assertEqual(STALE_ROW.findall(dom), ["edge-3"] if view.reads > 1 else [])
        self.assertEqual(sorted(set(RECT_LEADERS.findall(dom))), ["edge-&lt;1&gt;", "edge-3"])
        self.assertNotIn("<img", dom)
        self.assertNotIn("<b>", dom)
        self.assertIn("no healthy &lt;cloud&gt; server", dom)
        # The script's rows show the servers each member uses, as the server's did.
        self.assertEqual(sorted(MEMBER_SERVERS.findall(dom)), sorted(SHOWN_SERVERS))
        code, _out, err = yield self.chromium(f"--screenshot={shot}", "--window-size=1000,1400",
                                              base + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        with open(shot, "rb") as handle:
            self.assertTrue(handle.read(8) == PNG_MAGIC)
        code, dom, err = yield self.chromium("--virtual-time-budget=3000", "--dump-dom",
                                             base + "/")
        dom = dom.decode("utf-8")
        self.assertEqual(STALE_ROW.findall(dom), ["edge-3"])
        self.assertRegex(dom, r'data-node="edge-3" data-heartbeat="stale"><td>edge-3'
                              r'<span class="badge">STALE</span>')
