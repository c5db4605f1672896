"""The kubelet's probes of the status port under a slowloris flood, over real loopback
sockets.

``FLOOD`` connections (well past ``MAX_STATUS_CONNECTIONS`` plus the probe reserve)
each send part of a request line or part of the headers of a request for a page that
is no probe, then trickle a byte now and then; whenever the agent drops one it is
opened again at once. Meanwhile 20 ``/readyz`` requests are made the way the kubelet
makes them (a new connection each, nothing kept alive, one second to answer), one every
``PROBE_EVERY`` seconds, so that they span the ordinary request deadline and the
flood's reconnections after it. Each must be answered 200 within ``PROBE_TIMEOUT``.
Before the probe reserve the agent closed every new connection while the flood held
its 64 slots: 20 of 20 probes failed.
"""

import time

from twisted.internet import defer, protocol, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.trial import unittest
from zope.interface import implementer

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.config import ListenAddress
from yurtcoord.agent.service import StatusHTTPService
from yurtcoord.agent.status import (
    MAX_STATUS_CONNECTIONS, PROBE_RESERVE_CONNECTIONS, status_site,
)
from yurtcoord.agent.statussources import IStatusSource
from yurtcoord.testing.poll import poll_until

FLOOD = 2 * (MAX_STATUS_CONNECTIONS + PROBE_RESERVE_CONNECTIONS)
PROBES = 20
PROBE_EVERY = 0.35
PROBE_TIMEOUT = 1.0
TRICKLE_EVERY = 0.5
# What the flood connections send first: a partial request line, or a whole request
# line for an ordinary page and partial headers.
PARTIAL_REQUESTS = (
    b"GET /status HTT",
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    b"GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    b"GET /",
)


@implementer(IStatusSource)
class ReadyStatus:
    role = "leader"
    healthy = True
    ready = True

    def readiness_failures(self):
        return []

    def status(self):
        return {"node": "edge-1", "pool": "pool-a", "role": "leader", "ready": True}


class Slow(protocol.Protocol):
    """Sends part of a request, then one more byte every ``TRICKLE_EVERY`` seconds."""

    def __init__(self, flood, first):
        self.flood = flood
        self.first = first
        self.trickle = None

    def connectionMade(self):
        self.flood.opened += 1
        self.flood.open.add(self)
        self.transport.write(self.first)
        self.trickle = task.LoopingCall(self.transport.write, b"a")
        self.trickle.clock = reactor
        self.trickle.start(TRICKLE_EVERY, now=False)

    def connectionLost(self, reason):
        self.flood.open.discard(self)
        self.flood.dropped += 1
        if self.trickle is not None and self.trickle.running:
            self.trickle.stop()
        self.flood.reconnect(self.first)


class Flood:
    """``count`` slow connections, each opened again as soon as it ends."""

    def __init__(self, port):
        self.endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5)
        self.open = set()
        self.connecting = set()
        self.opened = 0
        self.dropped = 0
        self.running = True

    def start(self, count):
        for index in range(count):
            self.reconnect(PARTIAL_REQUESTS[index % len(PARTIAL_REQUESTS)], at_once=True)

    def reconnect(self, first, at_once=False):
        if not self.running:
            return
        factory = protocol.Factory.forProtocol(lambda: Slow(self, first))
        connecting = self.endpoint.connect(factory)
        self.connecting.add(connecting)

        def settled(result):
            self.connecting.discard(connecting)
            return result

        connecting.addBoth(settled)
        # A refused connect (the backlog full) is tried again at once too.
        connecting.addErrback(lambda _failure: self.reconnect(first))

    def stop(self):
        self.running = False
        for connecting in list(self.connecting):
            connecting.cancel()
        for connection in list(self.open):
            connection.transport.abortConnection()


class Probe(protocol.Protocol):
    """One kubelet-style probe: a whole request on a new connection, the answer read
    until the agent closes it."""

    def __init__(self, path):
        self.path = path
        self.received = b""
        self.done = defer.Deferred()

    def connectionMade(self):
        self.transport.write(b"GET " + self.path + b" HTTP/1.1\r\nHost: 127.0.0.1:10267\r\n"
                             b"User-Agent: kube-probe/1.30\r\nAccept: */*\r\n"
                             b"Connection: close\r\n\r\n")

    def dataReceived(self, data):
        self.received += data

    def connectionLost(self, reason):
        self.done.callback(self.received)


@defer.inlineCallbacks
def probe(port, path=b"/readyz", timeout=PROBE_TIMEOUT):
    """(status line or an error, seconds taken) of one probe, given up after
    ``timeout`` seconds."""
    started = time.monotonic()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=timeout)
    attempt = Probe(path)
    answer = defer.Deferred()
    connecting = endpoint.connect(protocol.Factory.forProtocol(lambda: attempt))

    def connected(proto):
        proto.done.addBoth(lambda received: answer.called or answer.callback(received))

    def failed(failure):
        if not answer.called:
            answer.callback(f"connect failed: {failure.getErrorMessage()}")

    connecting.addCallbacks(connected, failed)
    timer = reactor.callLater(timeout, lambda: answer.called or answer.callback(
        f"no answer within {timeout}s"))
    received = yield answer
    if timer.active():
        timer.cancel()
    if attempt.transport is not None:
        attempt.transport.abortConnection()
    elapsed = time.monotonic() - started
    if isinstance(received, bytes):
        received = received.split(b"\r\n", 1)[0].decode("latin-1") or "closed, no answer"
    return received, elapsed


class ProbeFloodTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_readyz_answers_within_a_second_under_a_reconnecting_slowloris_flood(self):
        site = status_site(ReadyStatus(), Metrics("edge-1", "pool-a"), reactor)
        # Listening as the agent does (its listen backlog included: the flood's
        # connects arrive at once).
        server = StatusHTTPService(ListenAddress("127.0.0.1", 0), site, reactor)
        server.startService()
        self.addCleanup(server.stopService)
        number = server.port.getHost().port
        flood = Flood(number)
        self.addCleanup(flood.stop)
        flood.start(FLOOD)
        yield poll_until(lambda: site.open_connections >= MAX_STATUS_CONNECTIONS, 10, 0.05,
                         reactor, what="the flood holding every ordinary status connection")

        results = []
        for _ in range(PROBES):
            results.append((yield probe(number)))
            yield task.deferLater(reactor, PROBE_EVERY, lambda: None)
        held = site.open_connections
        flood.stop()

        answered = [r for r in results if r[0] == "HTTP/1.1 200 OK" and r[1] <= PROBE_TIMEOUT]
        worst = max(elapsed for _, elapsed in results)
        print(f"PROBE-FLOOD flood={FLOOD} opened={flood.opened} dropped={flood.dropped} "
              f"held_at_end={held} answered={len(answered)}/{PROBES} worst={worst:.3f}s")
        self.assertEqual(len(answered), PROBES, results)
        # The flood was real: it held the ordinary slots and was dropped and came back.
        self.assertGreaterEqual(held, MAX_STATUS_CONNECTIONS)
        self.assertGreater(flood.opened, FLOOD)
        # Once the flood ends every connection is let go.
        yield poll_until(lambda: site.open_connections == 0, 10, 0.05, reactor,
                         what="the status connections closing after the flood")
