"""The status HTTP pages, the agent metrics and the composition root, over real
listening sockets with treq."""

import json

import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory
from twisted.protocols.policies import WrappingFactory
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from zope.interface import implementer

from yurtcoord.agent.config import parse_config
from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.service import make_service
from yurtcoord.agent.status import status_site
from yurtcoord.agent.statussources import IStatusSource, InitialStatus, rfc3339
from yurtcoord.testing.agentdocuments import STATUS_KEYS
from yurtcoord.testing.offline import offline_ini
from yurtcoord.testing.poll import poll_until


@implementer(IStatusSource)
class StaticStatus:
    """A status source with fixed answers, for driving the pages."""

    def __init__(self, role, ready=False, failures=(), cloud=None):
        self.role = role
        self.healthy = role in ("leader", "follower")
        self.ready = ready
        self._failures = list(failures)
        self._cloud = cloud or {}

    def readiness_failures(self):
        return list(self._failures)

    def status(self):
        return {
            "node": "edge-2", "pool": "pool-a", "role": self.role, "healthy": self.healthy,
            "ready": self.ready, "pool_cache_synced": self.ready,
            "local_cache_uploaded": self.ready, "leader": "edge-2" if self.role == "leader"
            else None, "cloud": dict(self._cloud), "coordinator_healthy": self.healthy,
            "coordinator_servers": {"https://coordinator:443": self.healthy},
            "last_transition": rfc3339(0), "delegated_heartbeats": 4, "uploaded_objects": 17,
        }


class BrokenStatus(StaticStatus):
    def status(self):
        raise RuntimeError("status source exploded")

    def readiness_failures(self):
        raise RuntimeError("status source exploded")


class HTTPTestMixin:
    """A treq client whose connections are all closed at cleanup."""

    def http_client(self):
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.addCleanup(self.pool.closeCachedConnections)
        return treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    @defer.inlineCallbacks
    def fetch(self, url):
        response = yield self.client.get(url)
        body = yield response.content()
        return response, body


class StatusPagesTests(HTTPTestMixin, unittest.TestCase):
    """The four pages served from a real port."""

    @defer.inlineCallbacks
    def serve(self, source, metrics=None):
        self.metrics = metrics or Metrics("edge-2", "pool-a")
        factory = WrappingFactory(status_site(source, self.metrics, reactor))
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)

        @defer.inlineCallbacks
        def stop():
            yield port.stopListening()
            yield poll_until(lambda: not factory.protocols, timeout=5)

        self.addCleanup(stop)
        self.client = self.http_client()
        self.base = f"http://127.0.0.1:{port.getHost().port}"

    @defer.inlineCallbacks
    def test_initial_status_is_neither_healthy_nor_ready(self):
        source = InitialStatus("edge-1", "pool-a", ["https://10.0.0.1:6443"], since=0)
        yield self.serve(source)
        response, body = yield self.fetch(self.base + "/healthz")
        self.assertEqual(response.code, 503)
        self.assertEqual(body, b"not healthy: role init\n")

        response, body = yield self.fetch(self.base + "/readyz")
        self.assertEqual(response.code, 503)
        self.assertEqual(body.decode().splitlines(), [
            "not ready: coordinator not healthy (role init)",
            "not ready: pool cache not synced",
            "not ready: local cache not uploaded",
        ])

        response, body = yield self.fetch(self.base + "/status")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"application/json"])
        document = json.loads(body)
        self.assertEqual(set(document), STATUS_KEYS)
        self.assertEqual(document, {
            "node": "edge-1", "pool": "pool-a", "role": "init", "healthy": False,
            "ready": False, "pool_cache_synced": False, "local_cache_uploaded": False,
            "leader": None, "cloud": {"https://10.0.0.1:6443": False},
            "coordinator_healthy": False, "coordinator_servers": {},
            "last_transition": "1970-01-01T00:00:00Z",
            "delegated_heartbeats": 0, "uploaded_objects": 0, "etcd_member": None,
            "election": None, "cause": None, "servers_not_probed": None,
        })

    @defer.inlineCallbacks
    def test_ready_leader(self):
        yield self.serve(StaticStatus("leader", ready=True))
        response, body = yield self.fetch(self.base + "/healthz")
        self.assertEqual((response.code, body), (200, b"ok\n"))
        response, body = yield self.fetch(self.base + "/readyz")
        self.assertEqual((response.code, body), (200, b"ok\n"))
        response, body = yield self.fetch(self.base + "/status")
        document = json.loads(body)
        self.assertEqual((document["role"], document["leader"], document["ready"]),
                         ("leader", "edge-2", True))

    @defer.inlineCallbacks
    def test_follower_not_synced_is_healthy_but_not_ready(self):
        yield self.serve(StaticStatus("follower", failures=["pool cache not synced"]))
        response, body = yield self.fetch(self.base + "/healthz")
        self.assertEqual((response.code, body), (200, b"ok\n"))
        response, body = yield self.fetch(self.base + "/readyz")
        self.assertEqual((response.code, body), (503, b"not ready: pool cache not synced\n"))

    @defer.inlineCallbacks
    def test_pending_is_unhealthy(self):
        yield self.serve(StaticStatus("pending", failures=["role is pending"]))
        response, body = yield self.fetch(self.base + "/healthz")
        self.assertEqual((response.code, body), (503, b"not healthy: role pending\n"))
        response, body = yield self.fetch(self.base + "/readyz")
        self.assertEqual(response.code, 503)
        self.assertIn(b"role is pending", body)
        response, body = yield self.fetch(self.base + "/status")
        self.assertEqual(json.loads(body)["role"], "pending")

    @defer.inlineCallbacks
    def test_metrics_follow_the_source_on_scrape(self):
        source = StaticStatus("leader", ready=True,
                              cloud={"https://a:6443": True, "https://b:6443": False})
        yield self.serve(source)
        self.metrics.observe_delegation(0.02, succeeded=True)
        self.metrics.observe_delegation(0.5, succeeded=False)
        self.metrics.count_uploaded(5)
        self.metrics.count_skipped("not-json")
        self.metrics.count_pool_sync_event("endpoints", "ADDED")
        self.metrics.observe_store_request("txn", 0.003)

        response, body = yield self.fetch(self.base + "/metrics")
        self.assertEqual(response.code, 200)
        self.assertTrue(response.headers.getRawHeaders(b"content-type")[0]
                        .startswith(b"text/plain; version=0.0.4"))
        samples = parse_samples(body.decode())
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_yurthub_role", ())], 1.0)
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_healthy_status", ())], 1.0)
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_ready_status", ())], 1.0)
        self.assertEqual(samples[("node_yurthub_server_healthy_status",
                                  (("server", "https://a:6443"),))], 1.0)
        self.assertEqual(samples[("node_yurthub_server_healthy_status",
                                  (("server", "https://b:6443"),))], 0.0)
        self.assertEqual(samples[("yurtcoord_heartbeat_delegations_total", ())], 2.0)
        self.assertEqual(samples[("yurtcoord_heartbeat_delegation_failures_total", ())], 1.0)
        self.assertEqual(samples[("yurtcoord_heartbeat_delegation_latency_seconds_count", ())],
                         2.0)
        self.assertEqual(samples[("yurtcoord_uploaded_objects_total", ())], 5.0)
        self.assertEqual(samples[("yurtcoord_skipped_objects_total",
                                  (("reason", "not-json"),))], 1.0)
        self.assertEqual(samples[("yurtcoord_pool_sync_events_total",
                                  (("resource", "endpoints"), ("type", "ADDED")))], 1.0)
        self.assertEqual(samples[("yurtcoord_pool_store_request_latency_seconds_count",
                                  (("op", "txn"),))], 1.0)
        self.assertEqual(samples[("yurtcoord_agent_info",
                                  (("node", "edge-2"), ("pool", "pool-a")))], 1.0)

        source.role, source.healthy, source.ready = "pending", False, False
        response, body = yield self.fetch(self.base + "/metrics")
        samples = parse_samples(body.decode())
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_yurthub_role", ())], 3.0)
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_healthy_status", ())], 0.0)
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_ready_status", ())], 0.0)

    @defer.inlineCallbacks
    def test_init_role_metric_is_zero(self):
        yield self.serve(InitialStatus("edge-1", "", ["https://a:6443"]))
        response, body = yield self.fetch(self.base + "/metrics")
        samples = parse_samples(body.decode())
        self.assertEqual(samples[("node_yurthub_yurt_coordinator_yurthub_role", ())], 0.0)
        self.assertEqual(samples[("node_yurthub_server_healthy_status",
                                  (("server", "https://a:6443"),))], 0.0)

    @defer.inlineCallbacks
    def test_two_agents_in_one_process_keep_separate_metrics(self):
        first, second = Metrics("edge-1"), Metrics("edge-2")
        first.count_uploaded(3)
        yield self.serve(StaticStatus("follower"), metrics=second)
        response, body = yield self.fetch(self.base + "/metrics")
        samples = parse_samples(body.decode())
        self.assertEqual(samples[("yurtcoord_uploaded_objects_total", ())], 0.0)
        self.assertEqual(parse_samples(first.render().decode())[
            ("yurtcoord_uploaded_objects_total", ())], 3.0)

    @defer.inlineCallbacks
    def test_failing_source_gives_500_and_the_server_keeps_serving(self):
        yield self.serve(BrokenStatus("follower"))
        for page in ("/status", "/readyz", "/metrics"):
            response, body = yield self.fetch(self.base + page)
            self.assertEqual((page, response.code, body), (page, 500, b"internal error\n"))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 3)
        response, body = yield self.fetch(self.base + "/healthz")
        self.assertEqual((response.code, body), (200, b"ok\n"))

    @defer.inlineCallbacks
    def test_unknown_path_is_404(self):
        yield self.serve(StaticStatus("leader", ready=True))
        for path in ("/nothing-here", "/status/x", "/healthz/y/z"):
            response, body = yield self.fetch(self.base + path)
            self.assertEqual((path, response.code), (path, 404))
        response, body = yield self.fetch(self.base + "/healthz/")
        self.assertEqual((response.code, body), (200, b"ok\n"))


def parse_samples(text):
    """Prometheus text → {(sample name, sorted label pairs): value}, using
    prometheus-client's own parser as an independent reader of the format."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


class ComposedAgentTests(HTTPTestMixin, unittest.TestCase):
    """``make_service`` from a parsed config, started and stopped like twistd does."""

    @defer.inlineCallbacks
    def test_make_service_serves_status_and_releases_the_port(self):
        config = parse_config(offline_ini(self.mktemp(), node="edge-9", pool="pool-z"),
                              "test.ini")
        agent = make_service(config, reactor)
        http_service = agent.getServiceNamed("status-http")
        http_service.site = WrappingFactory(http_service.site)
        agent.startService()
        self.addCleanup(lambda: agent.running and agent.stopService())
        self.client = self.http_client()
        url = http_service.url
        self.assertTrue(url.startswith("http://127.0.0.1:"), url)
        port_number = http_service.port.getHost().port

        response, body = yield self.fetch(url + "/status")
        document = json.loads(body)
        self.assertEqual((document["node"], document["pool"]), ("edge-9", "pool-z"))
        self.assertIn(document["role"], ("init", "pending"))
        self.assertEqual(list(document["cloud"].values()), [False])
        self.assertEqual(list(document["coordinator_servers"]),
                         list(config.coordinator.server))
        response, body = yield self.fetch(url + "/healthz")
        self.assertEqual(response.code, 503)

        yield self.pool.closeCachedConnections()
        yield agent.stopService()
        yield poll_until(lambda: not http_service.site.protocols, timeout=5)
        self.assertIsNone(http_service.url)
        # The port is free again: listening on it succeeds.
        port = yield TCP4ServerEndpoint(reactor, port_number, interface="127.0.0.1").listen(
            WrappingFactory(http_service.site))
        yield port.stopListening()

    def test_port_in_use_fails_the_start(self):
        blocker = reactor.listenTCP(0, WrappingFactory(Factory()), interface="127.0.0.1")
        self.addCleanup(blocker.stopListening)
        config = parse_config(
            offline_ini(self.mktemp(), node="edge-9", listen=f"127.0.0.1:{blocker.getHost().port}"),
            "test.ini")
        agent = make_service(config, reactor)
        self.assertRaises(CannotListenError, agent.startService)
        self.assertIsNone(agent.getServiceNamed("status-http").port)
