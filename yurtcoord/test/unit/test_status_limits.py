"""The status port's bounds, on a Clock with in-memory transports: the request
deadline, the connection limit with its probe reserve and per-address share, and the
systemd unit's descriptor limit, far above what the status port may hold."""

import configparser
import os

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel
from twisted.trial import unittest

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import (
    MAX_STATUS_CONNECTIONS, MAX_STATUS_CONNECTIONS_PER_ADDRESS,
    MAX_STATUS_UNREAD_CONNECTIONS, PROBE_REQUEST_DEADLINE, PROBE_RESERVE_CONNECTIONS,
    STATUS_REQUEST_DEADLINE, StatusSite, is_loopback, is_probe_path, status_site,
)
from yurtcoord.agent.statuspages import status_resource
from yurtcoord.agent.statussources import InitialStatus
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.testing.paths import REPO

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"
PROBE = (b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:10267\r\n"
         b"User-Agent: kube-probe/1.30\r\n\r\n")
UNIT = os.path.join(REPO, "etc", "yurtcoord.service")


class Connections:
    """Connections made straight to a ``StatusSite`` driven by a Clock."""

    def __init__(self, test, max_connections=3, deadline=5.0, **bounds):
        self.clock = Clock()
        source = InitialStatus("edge-1", "pool-a", ())
        self.site = StatusSite(status_resource(source, Metrics("edge-1", "pool-a")),
                               self.clock, max_connections=max_connections,
                               request_deadline=deadline, **bounds)
        self.site.startFactory()
        test.addCleanup(self.site.stopFactory)
        self.count = 0

    def open(self, host="127.0.0.1"):
        """(channel, transport), or (None, None) when the site refused the connection."""
        self.count += 1
        kind = IPv6Address if ":" in host else IPv4Address
        address = kind("TCP", host, 40000 + self.count)
        channel = self.site.buildProtocol(address)
        if channel is None:
            return None, None
        transport = StringTransport(peerAddress=address)
        channel.makeConnection(transport)
        return channel, transport

    @staticmethod
    def close(channel, transport):
        channel.connectionLost(None)

    @staticmethod
    def settle(connections):
        """What the reactor would do next: connections being closed end."""
        for channel, transport in connections:
            if transport.disconnecting and not channel._lost:
                Connections.close(channel, transport)


def answers(transport):
    return transport.value().count(b"HTTP/1.1 ")


class RequestDeadlineTests(unittest.TestCase):

    def test_defaults(self):
        self.assertEqual(MAX_STATUS_CONNECTIONS, 64)
        self.assertEqual(STATUS_REQUEST_DEADLINE, 5.0)
        self.assertEqual((MAX_STATUS_CONNECTIONS_PER_ADDRESS, PROBE_RESERVE_CONNECTIONS,
                          PROBE_REQUEST_DEADLINE, MAX_STATUS_UNREAD_CONNECTIONS),
                         (16, 16, 1.0, 256))
        site = status_site(InitialStatus("edge-1", "pool-a", ()), Metrics("edge-1"), Clock())
        self.assertEqual((site.max_connections, site.request_deadline, site.max_per_address,
                          site.probe_reserve, site.probe_deadline, site.max_unread),
                         (64, 5.0, 16, 16, 1.0, 256))

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
    """The ordinary connections and the probe reserve past them."""

    def fill(self, c, count=3):
        held = [c.open() for _ in range(count)]
        self.assertTrue(all(channel is not None and not channel.reserved
                            for channel, _ in held))
        return held

    def test_past_the_limit_a_connection_is_kept_for_a_probe_and_closed_after_it(self):
        log = GlobalLogCapture(self)
        c = Connections(self, max_connections=3)
        held = self.fill(c)
        for path in (b"/readyz", b"/healthz"):
            channel, transport = c.open()
            self.assertTrue(channel.reserved)
            self.assertFalse(transport.disconnecting)
            channel.dataReceived(PROBE.replace(b"/readyz", path))
            self.assertIn(b"HTTP/1.1 503", transport.value())  # not healthy: role init
            self.assertIn(b"not healthy" if path == b"/healthz" else b"not ready",
                          transport.value())
            self.assertIn(b"connection: close", transport.value().lower())
            self.assertTrue(transport.disconnecting)
            self.assertEqual(c.site.open_connections, 4)
            Connections.close(channel, transport)
            self.assertEqual(c.site.open_connections, 3)
        warnings = log.matching("status connections at the limit of 3")
        self.assertEqual(len(warnings), 1)
        self.assertEqual(warnings[0]["log_level"], LogLevel.warn)
        self.assertEqual(c.site.refused, 0)
        # An ordinary slot freed: new connections are ordinary again.
        Connections.close(*held[0])
        recovered = log.matching("status connections below the limit of 3 again")
        self.assertEqual(len(recovered), 1)
        channel, transport = c.open()
        self.assertFalse(channel.reserved)
        channel.dataReceived(b"GET /status HTTP/1.1\r\nHost: agent\r\n\r\n")
        self.assertIn(b"HTTP/1.1 200", transport.value())
        self.assertFalse(transport.disconnecting)

    def test_another_page_asked_of_the_reserve_is_answered_503_and_closed(self):
        c = Connections(self, max_connections=3)
        self.fill(c)
        channel, transport = c.open()
        # Refused as soon as the request line is read, before any header.
        channel.dataReceived(b"GET /metrics HTTP/1.1\r\n")
        self.assertIn(b"HTTP/1.1 503 Service Unavailable", transport.value())
        self.assertIn(b"only /healthz and /readyz", transport.value())
        self.assertTrue(transport.disconnecting)
        self.assertEqual(c.site.refused, 1)

    def test_slow_partial_requests_in_the_reserve_push_each_other_out(self):
        c = Connections(self, max_connections=3, probe_reserve=4)
        self.fill(c)
        slow = []
        for index in range(10):
            channel, transport = c.open()
            channel.dataReceived(b"GET /readyz HTTP/1.1\r\nX-Slow: " if index % 2 else b"GET /rea")
            slow.append((channel, transport))
            self.assertLessEqual(len(c.site._reserve), 4)
        pushed = [t for _, t in slow if t.disconnecting]
        self.assertEqual(pushed, [t for _, t in slow[:6]])  # the oldest first
        self.assertEqual(c.site.refused, 6)
        c.settle(slow)
        self.assertEqual(c.site.open_connections, 3 + 4)
        self.assertEqual(len(c.clock.getDelayedCalls()), 3 + 4)
        # A probe is still answered, and the slow ones end at the probe deadline.
        channel, transport = c.open()
        channel.dataReceived(PROBE)
        self.assertIn(b"HTTP/1.1 503", transport.value())
        self.assertIn(b"not ready", transport.value())
        c.clock.advance(1.01)
        self.assertTrue(all(t.disconnecting for _, t in slow))

    def test_a_burst_of_slow_connections_does_not_push_out_a_probe_not_read_yet(self):
        c = Connections(self, max_connections=3, probe_reserve=4)
        self.fill(c)
        probe, probe_transport = c.open()
        # Many more arrive, and are read, before the probe's bytes are.
        flood = []
        for _ in range(100):
            channel, transport = c.open()
            channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a")
            flood.append((channel, transport))
        self.assertFalse(probe_transport.disconnecting)
        probe.dataReceived(PROBE)
        self.assertIn(b"HTTP/1.1 503", probe_transport.value())
        self.assertIn(b"not ready: coordinator not healthy", probe_transport.value())

    def test_connections_that_send_nothing_are_pushed_out_past_the_unread_bound(self):
        c = Connections(self, max_connections=3, max_unread=5)
        self.fill(c)
        quiet = [c.open() for _ in range(8)]
        self.assertEqual([t.disconnecting for _, t in quiet], [True] * 3 + [False] * 5)
        self.assertEqual(c.site.refused, 3)
        c.settle(quiet)
        self.assertEqual(c.site.reserved_connections, 5)

    def test_a_probe_being_answered_is_not_pushed_out(self):
        c = Connections(self, max_connections=1, max_unread=2)
        self.fill(c, 1)
        answered, answered_transport = c.open()
        answered.dataReceived(PROBE)
        self.assertTrue(answered_transport.disconnecting)  # closing after its answer
        quiet, quiet_transport = c.open()
        c.open()
        self.assertTrue(quiet_transport.disconnecting)
        self.assertFalse(answered._lost)
        self.assertEqual(c.site.refused, 1)

    def test_the_reserve_has_the_probe_deadline(self):
        c = Connections(self, max_connections=1)
        ordinary, ordinary_transport = c.open()
        reserved, reserved_transport = c.open()
        c.clock.advance(1.01)
        self.assertTrue(reserved_transport.disconnecting)
        self.assertFalse(ordinary_transport.disconnecting)
        self.assertEqual(reserved_transport.value(), b"")
        c.clock.advance(4.0)
        self.assertTrue(ordinary_transport.disconnecting)
        c.settle([(ordinary, ordinary_transport), (reserved, reserved_transport)])
        self.assertEqual(c.site.open_connections, 0)
        self.assertEqual(c.clock.getDelayedCalls(), [])

    def test_one_remote_address_holds_its_share_of_ordinary_connections(self):
        c = Connections(self, max_connections=6, max_per_address=2)
        first = [c.open("10.0.0.5") for _ in range(2)]
        self.assertFalse(any(channel.reserved for channel, _ in first))
        # Past its share: probes only, while other clients still get ordinary slots.
        channel, transport = c.open("10.0.0.5")
        self.assertTrue(channel.reserved)
        channel.dataReceived(b"GET /status HTTP/1.1\r\n")
        self.assertIn(b"only /healthz and /readyz", transport.value())
        other, _ = c.open("10.0.0.6")
        self.assertFalse(other.reserved)
        # Its share comes back as its connections end.
        Connections.close(*first[0])
        again, _ = c.open("10.0.0.5")
        self.assertFalse(again.reserved)

    def test_loopback_is_not_capped_per_address(self):
        for host in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
            c = Connections(self, max_connections=6, max_per_address=2)
            held = [c.open(host) for _ in range(6)]
            self.assertFalse(any(channel.reserved for channel, _ in held), host)
            self.assertTrue(c.open(host)[0].reserved)

    def test_closed_connections_free_every_count(self):
        c = Connections(self, max_connections=2, max_per_address=1)
        connections = [c.open(host) for host in ("10.0.0.5", "127.0.0.1", "10.0.0.5", "::1")]
        self.assertEqual(c.site.open_connections, 4)
        self.assertEqual(c.site.reserved_connections, 2)
        connections[2][0].dataReceived(b"GET /re")
        for connection in connections:
            Connections.close(*connection)
        self.assertEqual(c.site.open_connections, 0)
        self.assertEqual(c.site._per_address, {})
        self.assertEqual(c.clock.getDelayedCalls(), [])


class AdmissionRulesTests(unittest.TestCase):

    def test_probe_paths(self):
        for path in (b"/readyz", b"/healthz", b"/readyz/", b"/healthz?verbose"):
            self.assertTrue(is_probe_path(path), path)
        for path in (b"/", b"/status", b"/readyzz", b"/readyz/x", b"//readyz", b"/metrics"):
            self.assertFalse(is_probe_path(path), path)

    def test_loopback_addresses(self):
        for host in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", None, "/run/x.sock"):
            self.assertTrue(is_loopback(host), host)
        for host in ("10.0.0.5", "192.168.1.10", "::ffff:10.0.0.5", "fe80::1%eth0"):
            self.assertFalse(is_loopback(host), host)


class SystemdUnitTests(unittest.TestCase):

    def test_unit_gives_the_agent_many_more_descriptors_than_the_status_port_may_hold(self):
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str
        with open(UNIT, encoding="utf-8") as f:
            unit.read_file(f)
        limit = int(unit["Service"]["LimitNOFILE"])
        self.assertGreaterEqual(limit, 65536)
        self.assertGreater(limit, 100 * MAX_STATUS_CONNECTIONS)
