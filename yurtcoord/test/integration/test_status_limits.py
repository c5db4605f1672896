"""The status port's access log over a real socket: requests are logged at debug
level only."""

import treq
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.logger import LogLevel, formatEvent
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import status_site
from yurtcoord.agent.statussources import InitialStatus
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.testing.poll import poll_until


class AccessLogTests(unittest.TestCase):

    @defer.inlineCallbacks
    def test_status_requests_are_logged_at_debug_only(self):
        site = status_site(InitialStatus("edge-1", "pool-a", ()), Metrics("edge-1"), reactor)
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
        self.addCleanup(port.stopListening)
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        client = treq.client.HTTPClient(Agent(reactor, pool=pool))
        log = GlobalLogCapture(self)
        base = f"http://127.0.0.1:{port.getHost().port}"
        for path in ("/", "/status", "/readyz", "/healthz", "/metrics"):
            response = yield client.get(base + path)
            yield response.content()
        yield poll_until(lambda: log.matching("/metrics"), 5)
        mentions = log.matching("/healthz") + log.matching("/readyz") + log.matching('"GET /')
        self.assertGreaterEqual(len(mentions), 2)
        self.assertEqual({e["log_level"] for e in mentions}, {LogLevel.debug}, [
            formatEvent(e) for e in mentions])
        self.assertEqual(len(log.matching("status request GET /healthz 503 from 127.0.0.1")),
                         1)
        yield poll_until(lambda: site.open_connections == 0, 5)
