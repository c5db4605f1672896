"""``twistd yurtcoord`` writes no debug line at ``[log] level = info`` (the default):
a real twistd child is asked for its status pages, which logs an access line at
debug, and is stopped; the same child at ``level = debug`` writes that line, so the
check at info looks for a line that exists."""

import os

import treq
from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.sim.agentini import ini_text
from yurtcoord.testing.offline import closed_loopback_port
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.twistd import TWISTD, TwistdProcess, child_environment, write_ini

START_DEADLINE = 30.0
ACCESS_LINE = "status request GET /healthz"


class LevelUnderTwistdTests(unittest.TestCase):
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.client = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    @defer.inlineCallbacks
    def run_agent(self, level):
        """Start an agent at ``level`` (no cloud answers, no coordinator), GET its
        /healthz once, stop it with SIGTERM; its whole output."""
        directory = os.path.abspath(self.mktemp())
        ini = write_ini(directory, ini_text({
            "node": {"name": "edge-1"},
            "cloud": {"servers": f"http://127.0.0.1:{closed_loopback_port()}",
                      "insecure": "true"},
            "coordinator": {"enabled": "false"},
            "heartbeat": {"kubelet_healthz_url": "off"},
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
