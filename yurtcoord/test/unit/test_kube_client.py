"""KubeClient on a memory reactor: a request whose connection never completes ends as
a timeout or a cancellation, never as Twisted's ``ConnectingCancelledError``."""

from twisted.internet import defer
from twisted.trial import unittest

from yurtcoord.kube import errors
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import NODES


class ConnectingCancelledTests(unittest.TestCase):
    """A request whose connection never completes (a cut link drops the SYN) and is
    cancelled or times out while still connecting: Twisted then fails it with
    ``ConnectingCancelledError``, which is neither a cancellation nor a typed error
    unless the client says what it is."""

    def setUp(self):
        from twisted.internet.testing import MemoryReactorClock
        self.reactor = MemoryReactorClock()
        self.client = KubeClient(self.reactor,
                                 ClientConfig(server="http://127.0.0.1:6443", timeout=2.0,
                                              insecure=True))

    def test_the_client_timeout_while_connecting_is_a_timeout(self):
        d = self.client.get(NODES, "edge-1")
        self.assertEqual(len(self.reactor.tcpClients), 1)
        self.reactor.advance(2.0)
        self.failureResultOf(d, errors.Timeout)

    def test_a_cancel_while_connecting_is_a_cancellation(self):
        d = self.client.get(NODES, "edge-1")
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)

    def test_an_attempt_timeout_of_the_lease_writer_while_connecting_is_a_timeout(self):
        from yurtcoord.kube.leasewriter import LeaseWriter
        writer = LeaseWriter(self.reactor, self.client, "kube-node-lease", "edge-1",
                             attempts=1, attempt_timeout=0.5)
        d = writer.write(lambda current: None)
        self.reactor.advance(0.5)
        self.failureResultOf(d, defer.TimeoutError)
