"""The pool page (``GET /``) over a real port: server-side HTML with every value
escaped, no external assets, and, in headless Chromium, a screenshot and a DOM that
the page's own script refreshed from ``/status`` so that it names the current leader."""

import os
import re
import shutil

import treq.client
from twisted.internet import defer, error, reactor
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from zope.interface import implementer

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import IStatusSource, InitialStatus, rfc3339, status_site
from yurtcoord.testing.processes import CollectingProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_TIMEOUT = 90.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL_NODE = "<img src=x onerror=alert(1)>&\"edge'"
EVIL_SERVER = "https://cloud.example/<script>alert(2)</script>"
LEADER_FIELD = re.compile(r'data-field="leader"[^>]*>([^<]*)<')


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


class ChromiumRun(CollectingProcess):
    """One chromium child; ``ended`` fires with (exit code, stdout, stderr)."""

    def processEnded(self, reason):
        code = getattr(reason.value, "exitCode", None)
        self.ended.callback((code, self.out, self.err))


class PoolPageTests(unittest.TestCase):
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.http = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    def serve(self, source):
        site = status_site(source, Metrics("edge-2", "pool-a"), reactor)
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
        """Run headless chromium with ``arguments``; (exit code, stdout, stderr)."""
        if CHROMIUM is None:
            raise unittest.SkipTest("chromium is not installed (Debian package chromium)")
        profile = os.path.abspath(self.mktemp())
        os.makedirs(profile)
        run = ChromiumRun()
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", *arguments]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ")}
        env["HOME"] = profile
        transport = reactor.spawnProcess(run, CHROMIUM, argv, env=env, path=profile)

        def give_up():
            try:
                transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                return

        killer = reactor.callLater(CHROMIUM_TIMEOUT, give_up)

        def ended(result):
            if killer.active():
                killer.cancel()
            return result

        def kill_if_running():
            if run.ended.called:
                return None
            give_up()
            return run.ended

        self.addCleanup(kill_if_running)
        return run.ended.addBoth(ended)

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
