"""The stand-in kubelet of the tests over a real socket: it answers, stops and
restarts on the same port, and the agent's kubelet checker sees it stop and come
back. The gate's exact timing is tested on a Clock in the unit tier."""

import treq.client
from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool
from zope.interface.verify import verifyObject

from yurtcoord.heartbeat.probes import KubeletHealthChecker
from yurtcoord.sim.kubelet import IKubeletStandIn, StandInKubelet


class StandInKubeletTests(unittest.TestCase):
    """The stand-in kubelet over a real socket: answers, stops, restarts on its port."""

    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.addCleanup(self.pool.closeCachedConnections)
        self.http = treq.client.HTTPClient(HTTPAgent(reactor, pool=self.pool,
                                                     connectTimeout=2))

    @defer.inlineCallbacks
    def get(self, url):
        response = yield self.http.get(url, timeout=5)
        body = yield response.content()
        return response.code, body

    @defer.inlineCallbacks
    def test_answers_stops_and_restarts_on_the_same_port(self):
        kubelet = StandInKubelet(reactor)
        verifyObject(IKubeletStandIn, kubelet)
        port = kubelet.start(0)
        self.addCleanup(kubelet.stop)
        self.assertTrue(kubelet.url().startswith("http://127.0.0.1:"))
        self.assertEqual((yield self.get(kubelet.url())), (200, b"ok"))

        # A persistent connection is open now; stop() drops it too.
        yield kubelet.stop()
        self.assertFalse(kubelet.running)
        with self.assertRaises(Exception):
            yield self.get(kubelet.url())

        self.assertEqual(kubelet.start(), port)
        self.assertEqual((yield self.get(kubelet.url())), (200, b"ok"))
        kubelet.code = 500
        self.assertEqual((yield self.get(kubelet.url())), (500, b"unhealthy"))
        self.assertEqual(kubelet.requests, 3)

    @defer.inlineCallbacks
    def test_the_agent_checker_sees_it_stop_and_come_back(self):
        kubelet = StandInKubelet(reactor)
        kubelet.start()
        self.addCleanup(kubelet.stop)
        checker = KubeletHealthChecker(reactor, self.http.get, kubelet.url(), 30,
                                       interval=30, timeout=2)
        self.assertTrue((yield checker.check()))
        yield kubelet.stop()
        self.assertFalse((yield checker.check()))
        kubelet.start()
        self.assertTrue((yield checker.check()))
