"""``twistd yurtcoord`` writes no debug line at ``[log] level = info`` (the default):
a real twistd child is asked for its status pages, which logs an access line at
debug, and is stopped; the same child at ``level = debug`` writes that line, so the
check at info looks for a line that exists.

Nor does it write a factory line per connection: a child probing a local stand-in
kubelet every second for a few seconds writes no "Starting factory" or "Stopping
factory" line, at info or at debug (before, two per probe: 120 a minute at a 1 s
interval)."""

import os

import treq
from twisted.internet import defer, reactor, task
from twisted.trial import unittest
from twisted.web import resource, server
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.sim.agentini import ini_text
from yurtcoord.testing.offline import closed_loopback_port
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.twistd import TWISTD, TwistdProcess, child_environment, write_ini

START_DEADLINE = 30.0
ACCESS_LINE = "status request GET /healthz"
# Seconds a child probes its kubelet (once a second) before it is stopped.
PROBING_SECONDS = 4.0
FACTORY_LINES = ("Starting factory", "Stopping factory")


class Kubelet(resource.Resource):
    """A kubelet's /healthz that answers ok and counts the probes."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.probes = 0

    def render_GET(self, request):
        self.probes += 1
        return b"ok"


class LevelUnderTwistdTests(unittest.TestCase):
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.client = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    @defer.inlineCallbacks
    def run_agent(self, level, kubelet_url="off", running=0.0):
        """Start an agent at ``level`` (no cloud answers, no coordinator, probes every
        second), GET its /healthz once, let it run ``running`` seconds more, stop it
        with SIGTERM; its whole output."""
        directory = os.path.abspath(self.mktemp())
        ini = write_ini(directory, ini_text({
            "node": {"name": "edge-1"},
            "cloud": {"servers": f"http://127.0.0.1:{closed_loopback_port()}",
                      "insecure": "true"},
            "coordinator": {"enabled": "false"},
            "heartbeat": {"kubelet_healthz_url": kubelet_url, "interval": "1s"},
            "server": {"listen": "127.0.0.1:0"},
            "log": {"level": level}}))
        child = TwistdProcess()
        reactor.spawnProcess(
            child, TWISTD, [TWISTD, "--nodaemon", "--pidfile=", "yurtcoord", "--config", ini],
            env=child_environment(), path=directory)

        def kill_if_running():
            if not child.ended.called:
                child.transport.signalProcess("KILL")
                return child.ended
            return None

        self.addCleanup(kill_if_running)
        yield poll_until(lambda: child.listening_url() or child.ended.called,
                         timeout=START_DEADLINE)
        url = child.listening_url()
        self.assertIsNotNone(url, child.output.decode())
        response = yield self.client.get(url + "/healthz", timeout=5)
        yield response.content()
        if running:
            yield task.deferLater(reactor, running, lambda: None)
        child.transport.signalProcess("TERM")
        code = yield child.ended
        output = child.output.decode("utf-8", "replace")
        self.assertEqual(code, 0, output)
        return output

    @defer.inlineCallbacks
    def test_debug_lines_appear_at_debug_and_not_at_info(self):
        at_debug = yield self.run_agent("debug")
        self.assertIn(ACCESS_LINE, at_debug)
        self.assertIn("#debug]", at_debug)

        at_info = yield self.run_agent("info")
        self.assertIn("status pages listening on", at_info)
        self.assertNotIn(ACCESS_LINE, at_info)
        self.assertNotIn("#debug]", at_info)

    @defer.inlineCallbacks
    def test_no_factory_line_per_kubelet_probe(self):
        kubelet = Kubelet()
        site = server.Site(kubelet)
        site.noisy = False
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        kubelet_url = f"http://127.0.0.1:{port.getHost().port}/healthz"

        for level in ("info", "debug"):
            probes_before = kubelet.probes
            output = yield self.run_agent(level, kubelet_url, running=PROBING_SECONDS)
            self.assertGreaterEqual(kubelet.probes - probes_before, 2, output)
            factory_lines = [line for line in output.splitlines()
                             if any(text in line for text in FACTORY_LINES)]
            self.assertEqual(factory_lines, [], level)
