"""The status port's bounds, on a Clock with in-memory transports: the request
deadline and the connection limit, and the systemd unit's descriptor limit, far above
what the status port may hold."""

import configparser
import os

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel
from twisted.trial import unittest

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import (
    MAX_STATUS_CONNECTIONS, STATUS_REQUEST_DEADLINE, InitialStatus, StatusSite,
    status_resource, status_site,
)
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.testing.paths import REPO

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"
UNIT = os.path.join(REPO, "etc", "yurtcoord.service")


class Connections:
    """Connections made straight to a ``StatusSite`` driven by a Clock."""

    def __init__(self, test, max_connections=3, deadline=5.0):
        self.clock = Clock()
        source = InitialStatus("edge-1", "pool-a", ())
        self.site = StatusSite(status_resource(source, Metrics("edge-1", "pool-a")),
                               self.clock, max_connections=max_connections,
                               request_deadline=deadline)
        self.site.startFactory()
        test.addCleanup(self.site.stopFactory)
        self.count = 0

    def open(self):
        """(channel, transport), or (None, None) when the site refused the connection."""
        self.count += 1
        channel = self.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000 + self.count))
        if channel is None:
            return None, None
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000 + self.count))
        channel.makeConnection(transport)
        return channel, transport

    @staticmethod
    def close(channel, transport):
        channel.connectionLost(None)


def answers(transport):
    return transport.value().count(b"HTTP/1.1 ")


class RequestDeadlineTests(unittest.TestCase):

    def test_defaults(self):
        self.assertEqual(MAX_STATUS_CONNECTIONS, 64)
        self.assertEqual(STATUS_REQUEST_DEADLINE, 5.0)
        site = status_site(InitialStatus("edge-1", "pool-a", ()), Metrics("edge-1"), Clock())
        self.assertEqual((site.max_connections, site.request_deadline), (64, 5.0))

    def test_silent_connection_is_dropped_at_the_deadline(self):
        c = Connections(self)
        channel, transport = c.open()
        c.clock.advance(4.9)
        self.assertFalse(transport.disconnecting)
        c.clock.advance(0.2)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), b"")

    def test_request_sent_a_byte_at_a_time_is_dropped_at_the_deadline(self):
        c = Connections(self)
        channel, transport = c.open()
        for byte in REQUEST[:-1]:
            channel.dataReceived(bytes([byte]))
            c.clock.advance(0.25)
            if transport.disconnecting:
                break
        self.assertTrue(transport.disconnecting)
        self.assertLessEqual(c.clock.seconds(), 5.0 + 0.25)
        self.assertEqual(answers(transport), 0)

    def test_each_request_of_a_kept_alive_connection_gets_the_full_deadline(self):
        c = Connections(self)
        channel, transport = c.open()
        for round_ in range(1, 4):
            c.clock.advance(4.5)
            channel.dataReceived(REQUEST)
            self.assertEqual(answers(transport), round_)
            self.assertFalse(transport.disconnecting)
        c.clock.advance(5.1)
        self.assertTrue(transport.disconnecting)

    def test_pipelined_requests_are_answered_and_the_deadline_runs_after_the_last(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(REQUEST * 3)
        self.assertEqual(answers(transport), 3)
        c.clock.advance(4.9)
        self.assertFalse(transport.disconnecting)
        c.clock.advance(0.2)
        self.assertTrue(transport.disconnecting)

    def test_request_body_past_the_bound_drops_the_connection(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(b"POST /status HTTP/1.1\r\nHost: agent\r\n"
                             b"Content-Length: 100000000\r\n\r\n" + b"x" * 60000)
        self.assertFalse(transport.disconnecting)
        channel.dataReceived(b"x" * 6000)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(answers(transport), 0)
        self.assertLessEqual(channel.requests[-1].content.tell(), 64 * 1024)
        self.assertEqual(c.clock.getDelayedCalls(), [])

    def test_chunked_body_past_the_bound_drops_the_connection(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(b"POST /status HTTP/1.1\r\nHost: agent\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(20):
            if transport.disconnecting:
                break
            channel.dataReceived(b"1000\r\n" + b"x" * 0x1000 + b"\r\n")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(answers(transport), 0)

    def test_small_body_is_read_and_answered(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n"
                             b"Content-Length: 10\r\n\r\n0123456789" + REQUEST)
        self.assertEqual(answers(transport), 2)
        self.assertFalse(transport.disconnecting)

    def test_connection_closing_after_its_answer_is_still_bounded(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(b"GET /healthz HTTP/1.0\r\n\r\n")
        self.assertEqual(answers(transport), 0)  # an HTTP/1.0 answer
        self.assertIn(b"HTTP/1.0 503", transport.value())
        self.assertTrue(transport.disconnecting)
        self.assertEqual(len(c.clock.getDelayedCalls()), 1)

    def test_closed_connection_leaves_no_timer(self):
        c = Connections(self)
        channel, transport = c.open()
        channel.dataReceived(REQUEST)
        Connections.close(channel, transport)
        self.assertEqual(c.clock.getDelayedCalls(), [])
        self.assertEqual(c.site.open_connections, 0)


class ConnectionLimitTests(unittest.TestCase):

    def test_connections_past_the_limit_are_closed_at_once_and_counted(self):
        log = GlobalLogCapture(self)
        c = Connections(self, max_connections=3)
        held = [c.open() for _ in range(3)]
        self.assertTrue(all(channel is not None for channel, _ in held))
        self.assertEqual(c.site.open_connections, 3)
        for _ in range(5):
            self.assertEqual(c.open(), (None, None))
        self.assertEqual(c.site.refused, 5)
        warnings = log.matching("status connections at the limit of 3")
        self.assertEqual(len(warnings), 1)
        self.assertEqual(warnings[0]["log_level"], LogLevel.warn)
        # The deadline ends the held ones; new connections are served again.
        c.clock.advance(5.1)
        for channel, transport in held:
            self.assertTrue(transport.disconnecting)
            Connections.close(channel, transport)
        self.assertEqual(c.site.open_connections, 0)
        recovered = log.matching("status connections below the limit of 3 again")
        self.assertEqual(len(recovered), 1)
        self.assertEqual(recovered[0]["refused"], 5)
        channel, transport = c.open()
        channel.dataReceived(REQUEST)
        self.assertIn(b"HTTP/1.1 503", transport.value())


class SystemdUnitTests(unittest.TestCase):

    def test_unit_gives_the_agent_many_more_descriptors_than_the_status_port_may_hold(self):
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str
        with open(UNIT, encoding="utf-8") as f:
            unit.read_file(f)
        limit = int(unit["Service"]["LimitNOFILE"])
        self.assertGreaterEqual(limit, 65536)
        self.assertGreater(limit, 100 * MAX_STATUS_CONNECTIONS)
