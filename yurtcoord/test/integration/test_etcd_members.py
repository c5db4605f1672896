"""Which etcd member the client's requests go to, over real sockets: the client on
scripted gateways (switching on the errors etcd answers while it has no leader, never
resending a delivered write to another member), then on a real three-member cluster
that lost its quorum (3.4 and 3.5 both refuse for want of a leader, with the same
error), on a version that keeps acknowledged writes through SIGKILL: the killed members
are restarted and read back, and a member of a 3.5.0 to 3.5.2 cluster restarted after
SIGKILL can answer without writes the cluster acknowledged (etcd-io/etcd#13766). Member selection itself, on a Clock, is in the unit
tier."""

import json
from typing import Any

from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher
from twisted.trial import unittest
from twisted.web import server

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.etcd.errors import EtcdTimeout, EtcdUnavailable, NoLeader, RequestRejected
from yurtcoord.etcd.txaioetcd_private import txaioetcd
from yurtcoord.sim.etcd import EtcdCluster, make_etcd_test_class
from yurtcoord.testing.etcdgateway import (
    PUT_OK,
    ScriptedGateway,
    ScriptedGatewayMixin,
    range_answer,
)
from yurtcoord.testing.poll import poll_until

A, B, C = "http://a:2379", "http://b:2379", "http://c:2379"

NO_LEADER = (503, json.dumps({"error": "etcdserver: no leader", "code": 14,
                              "message": "etcdserver: no leader"}).encode())
LEADER_CHANGED = (503, json.dumps({"error": "etcdserver: leader changed", "code": 14,
                                   "message": "etcdserver: leader changed"}).encode())
# What etcd 3.4 and 3.5 answer a put (after 7 s) when the member lost its quorum.
DEADLINE_EXCEEDED = (500, json.dumps({"error": "context deadline exceeded", "code": 2,
                                      "message": "context deadline exceeded"}).encode())
HEALTHY = (200, b'{"health":"true"}')
UNHEALTHY = (503, b'{"health":"false","reason":"RAFT NO LEADER"}')


class HealthGateway(ScriptedGateway):
    """A scripted gateway that also answers ``GET /health`` from ``answers["/health"]``."""

    def render_GET(self, request: server.Request) -> Any:
        return self.render_POST(request)


class ClientOnMembersTests(ScriptedGatewayMixin, unittest.TestCase):
    """The client on two or three scripted members over real sockets."""

    def members(self, *scripts: dict) -> tuple[list[HealthGateway], Any]:
        gateways, urls = [], []
        for script in scripts:
            gateway = HealthGateway(script)
            url, _tracking = self.listen(server.Site(gateway))
            gateways.append(gateway)
            urls.append(url)
        client = self.client(urls[0], more_urls=tuple(urls[1:]), timeout=1.0)
        return gateways, client

    def posts(self, gateway: ScriptedGateway) -> list[str]:
        return [path for path, _body in gateway.seen if path != "/health"]

    def switches(self) -> list[tuple[Any, Any, str]]:
        """The member switches logged during the test: (from, to, reason)."""
        return [(e["from"], e["to"], e["reason"]) for e in self.events
                if e.get("log_format", "").startswith("etcd member switch")]

    def setUp(self) -> None:
        super().setUp()
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    @defer.inlineCallbacks
    def test_a_read_answered_no_leader_moves_on_and_is_resent(self):
        for refusal in (NO_LEADER, LEADER_CHANGED):
            (first, second), client = self.members(
                {"/v3/kv/range": [refusal], "/health": [UNHEALTHY]},
                {"/v3/kv/range": [(200, range_answer((b"k", b"v")))]})
            kv = yield client.get(b"k")
            self.assertEqual(kv.value, b"v")
            self.assertEqual((self.posts(first), self.posts(second)),
                             (["/v3/kv/range"], ["/v3/kv/range"]))
            self.assertEqual(client.member, client.config.more_urls[0])

    @defer.inlineCallbacks
    def test_a_write_answered_no_leader_was_never_proposed_and_goes_to_the_next(self):
        (first, second), client = self.members(
            {"/v3/kv/put": [NO_LEADER], "/health": [UNHEALTHY]},
            {"/v3/kv/put": [(200, PUT_OK)]})
        revision = yield client.put(b"k", b"v")
        self.assertEqual(revision, 8)
        self.assertEqual((self.posts(first), self.posts(second)),
                         (["/v3/kv/put"], ["/v3/kv/put"]))
        self.assertEqual(client.member, client.config.more_urls[0])
        self.assertEqual(self.switches(), [
            (client.config.url, client.config.more_urls[0],
             "etcd unavailable: etcdserver: no leader")])

    @defer.inlineCallbacks
    def test_a_write_answered_no_leader_everywhere_fails_at_once_not_applied(self):
        (first, second, third), client = self.members(
            *[{"/v3/kv/txn": [NO_LEADER], "/health": [UNHEALTHY]}] * 3)
        began = reactor.seconds()
        error = yield self.assertFailure(
            client.submit(txaioetcd.Transaction(success=[txaioetcd.OpSet(b"k", b"v")])),
            EtcdUnavailable)
        # Well before the request timeout (1 s here): no member held the request.
        self.assertLess(reactor.seconds() - began, 0.9)
        self.assertFalse(error.maybe_applied)
        self.assertIn("etcdserver: no leader", str(error))
        self.assertEqual([self.posts(g) for g in (first, second, third)],
                         [["/v3/kv/txn"]] * 3)
        self.assertIsNone(client.member)

    @defer.inlineCallbacks
    def test_a_write_answered_leader_changed_is_not_resent_but_the_next_request_moves_on(self):
        (first, second), client = self.members(
            {"/v3/kv/put": [LEADER_CHANGED], "/health": [UNHEALTHY]},
            {"/v3/kv/put": [(200, PUT_OK)]})
        with self.assertRaisesRegex(EtcdUnavailable, "etcdserver: leader changed"):
            yield client.put(b"k", b"v")
        self.assertEqual((self.posts(first), self.posts(second)), (["/v3/kv/put"], []))
        revision = yield client.put(b"k", b"v")
        self.assertEqual(revision, 8)
        self.assertEqual((self.posts(first), self.posts(second)),
                         (["/v3/kv/put"], ["/v3/kv/put"]))

    @defer.inlineCallbacks
    def test_a_write_whose_connection_died_stays_in_doubt_and_is_not_resent(self):
        (first, second), client = self.members(
            {"/v3/kv/put": ["abort"], "/health": [UNHEALTHY]},
            {"/v3/kv/put": [(200, PUT_OK)]})
        error = yield self.assertFailure(client.put(b"k", b"v"), EtcdUnavailable)
        self.assertTrue(error.maybe_applied)
        self.assertEqual((self.posts(first), self.posts(second)), (["/v3/kv/put"], []))
        self.assertEqual(client.member, client.config.more_urls[0])

    @defer.inlineCallbacks
    def test_a_write_that_never_reached_a_member_goes_to_the_next(self):
        _url, gateway, _tracking = self.gateway({"/v3/kv/put": [(200, PUT_OK)]})
        closed = self.closed_port_url()
        client = self.client(closed, more_urls=(_url,), timeout=1.0)
        revision = yield client.put(b"k", b"v")
        self.assertEqual(revision, 8)
        self.assertEqual(gateway.seen[0][0], "/v3/kv/put")
        self.assertEqual(client.member, _url)

    @defer.inlineCallbacks
    def test_a_timeout_moves_the_next_request_on(self):
        hung = HungGateway()
        hung_url, _tracking = self.listen(server.Site(hung))
        second_url, second, _t2 = self.gateway(
            {"/v3/kv/range": [(200, range_answer((b"k", b"v")))]})
        client = self.client(hung_url, more_urls=(second_url,), timeout=0.3)
        yield self.assertFailure(client.get(b"k"), EtcdTimeout)
        self.assertEqual(client.member, second_url)
        kv = yield client.get(b"k")
        self.assertEqual(kv.value, b"v")

    @defer.inlineCallbacks
    def test_no_member_serving_fails_at_once_and_a_healthy_one_is_used_again(self):
        (first, second), client = self.members(
            {"/v3/kv/range": [NO_LEADER, (200, range_answer((b"k", b"1")))],
             "/health": [UNHEALTHY, HEALTHY]},
            {"/v3/kv/range": [NO_LEADER], "/health": [UNHEALTHY]})
        error = yield self.assertFailure(client.get(b"k"), EtcdUnavailable)
        self.assertIn("etcdserver: no leader", str(error))
        self.assertIsNone(client.member)
        error = yield self.assertFailure(client.get(b"k"), EtcdUnavailable)
        self.assertIn("no etcd member serves", str(error))
        self.assertIn(f"{client.config.url}: etcd unavailable: etcdserver: no leader",
                      str(error))
        self.assertEqual(self.posts(first) + self.posts(second),
                         ["/v3/kv/range", "/v3/kv/range"])
        yield poll_until(lambda: client.member == client.config.url, timeout=15.0)
        kv = yield client.get(b"k")
        self.assertEqual(kv.value, b"1")

    @defer.inlineCallbacks
    def test_a_put_answered_context_deadline_exceeded_may_be_applied(self):
        _url, _gateway, _tracking = self.gateway({"/v3/kv/put": [DEADLINE_EXCEEDED]})
        client = self.client(_url)
        error = yield self.assertFailure(client.put(b"k", b"v"), EtcdTimeout)
        self.assertTrue(error.maybe_applied)

    @defer.inlineCallbacks
    def test_a_status_without_a_leader_moves_on(self):
        leaderless = json.dumps({"header": {"revision": "3", "raft_term": "4"},
                                 "version": "3.5.1", "dbSize": "20480"}).encode()
        led = json.dumps({"header": {"revision": "3", "raft_term": "4"}, "version": "3.5.1",
                          "dbSize": "20480", "leader": "1234"}).encode()
        (first, second), client = self.members(
            {"/v3/maintenance/status": [(200, leaderless)], "/health": [UNHEALTHY]},
            {"/v3/maintenance/status": [(200, led)]})
        status = yield client.status()
        self.assertEqual(status.version, "3.5.1")
        self.assertEqual(client.member, client.config.more_urls[0])
        self.assertEqual(self.posts(first), ["/v3/maintenance/status"])

    @defer.inlineCallbacks
    def test_a_status_without_a_leader_on_every_member_is_unavailable(self):
        leaderless = json.dumps({"header": {"revision": "3"}, "version": "3.4.23"}).encode()
        _gateways, client = self.members(
            {"/v3/maintenance/status": [(200, leaderless)], "/health": [UNHEALTHY]},
            {"/v3/maintenance/status": [(200, leaderless)], "/health": [UNHEALTHY]})
        yield self.assertFailure(client.status(), EtcdUnavailable)
        self.assertIsNone(client.member)

    @defer.inlineCallbacks
    def test_a_write_that_timed_out_in_etcd_may_have_landed_one_refused_for_no_leader_not(self):
        timed_out = (503, json.dumps({
            "error": "etcdserver: request timed out, possibly due to previous leader failure",
            "code": 14,
            "message": "etcdserver: request timed out, possibly due to previous leader failure",
        }).encode())
        _url, _gateway, _tracking = self.gateway({"/v3/kv/put": [timed_out, NO_LEADER]})
        client = self.client(_url)
        error = yield self.assertFailure(client.put(b"k", b"v"), EtcdUnavailable)
        self.assertTrue(error.maybe_applied)
        error = yield self.assertFailure(client.put(b"k", b"v"), EtcdUnavailable)
        self.assertFalse(error.maybe_applied)

    @defer.inlineCallbacks
    def test_other_refusals_do_not_move_on(self):
        refused = (400, json.dumps({"error": "etcdserver: key is not provided", "code": 3,
                                    "message": "etcdserver: key is not provided"}).encode())
        (first, second), client = self.members({"/v3/kv/range": [refused]}, {})
        yield self.assertFailure(client.get(b"k"), RequestRejected)
        self.assertEqual(client.member, client.config.url)
        self.assertEqual(self.posts(second), [])

    def closed_port_url(self) -> str:
        port = reactor.listenTCP(0, server.Site(HealthGateway({})), interface="127.0.0.1")
        number = port.getHost().port
        port.stopListening()
        return f"http://127.0.0.1:{number}"


class HungGateway(ScriptedGateway):
    """Reads every request and never answers."""

    def __init__(self) -> None:
        super().__init__({})

    def render_POST(self, request: server.Request) -> Any:
        return server.NOT_DONE_YET


class LeaderlessClusterTestsMixin:
    """The client on a real cluster of three members, two of them SIGKILLed: the one
    left knows soon that it has no leader. Each test kills members: a cluster of its
    own."""

    timeout = 120
    etcd_binary = None

    def setUp(self) -> None:
        self.cluster = EtcdCluster(self.etcd_binary)
        self.addCleanup(self.cluster.stop)
        self.cluster.start()

    def client_on(self, *urls: str) -> EtcdClient:
        client = EtcdClient(reactor, EtcdConfig(urls[0], more_urls=urls[1:], timeout=5.0))
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def test_a_write_to_members_without_a_leader_fails_at_once_and_was_never_applied(self):
        leader = self.cluster.leader()
        left, other = [m for m in self.cluster.members if m is not leader]
        client = self.client_on(left.client_url, leader.client_url, other.client_url)
        yield client.put(b"/before", b"1")
        self.cluster.kill(self.cluster.members.index(leader))
        self.cluster.kill(self.cluster.members.index(other))

        lone = self.client_on(left.client_url)

        def refused_for_no_leader() -> "defer.Deferred[bool]":
            d = lone.status(timeout=2.0)
            return d.addCallbacks(lambda _status: False,
                                  lambda failure: failure.check(NoLeader) is not None)

        yield poll_until(refused_for_no_leader, timeout=30.0, interval=0.1,
                         what=f"{left.client_url} refusing requests for want of a leader")

        began = reactor.seconds()
        error = yield self.assertFailure(
            client.submit(txaioetcd.Transaction(success=[txaioetcd.OpSet(b"/during",
                                                                          b"2")])),
            EtcdUnavailable)
        took = reactor.seconds() - began
        # Without the refusal the member held the write for the 5 s request timeout.
        self.assertLess(took, 2.5, str(error))
        self.assertFalse(error.maybe_applied, str(error))
        self.assertIsNone(client.member)
        error = yield self.assertFailure(client.get(b"/before"), EtcdUnavailable)
        self.assertIn(f"{left.client_url}: etcd unavailable: etcdserver: no leader",
                      str(error))

        self.cluster.restart(self.cluster.members.index(other))
        self.cluster.restart(self.cluster.members.index(leader))
        # Refused before it was proposed: the write never lands.
        self.assertEqual(self.cluster.read("/before"), {b"/before": b"1"})
        self.assertEqual(self.cluster.read("/during"), {})

        def written() -> "defer.Deferred[bool]":
            return client.put(b"/after", b"3").addCallback(lambda _revision: True)

        yield poll_until(written, timeout=30.0, interval=0.2,
                         what="a write once the members are back")
        self.assertEqual(self.cluster.read("/after"), {b"/after": b"3"})


make_etcd_test_class(LeaderlessClusterTestsMixin, globals(), restarts_killed_members=True)
