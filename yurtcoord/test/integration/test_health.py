"""Health checkers over real sockets against the Kubernetes API test server: the cloud
and coordinator probers as servers go down and come back, and the delegation that
cloud loss starts."""

from twisted.internet import defer
from twisted.trial import unittest

from yurtcoord.heartbeat import probes as health
from yurtcoord.heartbeat.probes import (
    DELEGATE_HEARTBEAT_ANNOTATION, CloudHealthChecker, CoordinatorHealthChecker, ProbeSettings,
)
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.testing.leaseprobes import NODE
from yurtcoord.testing.poll import poll_until


class LiveHealthCheckerTests(unittest.TestCase):
    """Cloud and coordinator probers over real sockets against the Kubernetes API
    test server, with servers going down and coming back."""

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        from twisted.internet import reactor

        from yurtcoord.kube.client import ClientConfig, KubeClient
        from yurtcoord.sim.apiserver import KubeAPIServer

        self.reactor = reactor
        self.servers = {}
        self.clients = {}
        for name in ("cloud-a", "cloud-b", "coordinator"):
            server = KubeAPIServer(reactor)
            url = yield server.start(port=0)
            self.servers[name] = server
            self.clients[name] = KubeClient(reactor, ClientConfig(server=url, insecure=True,
                                                                  timeout=1.0))
        # Each attempt may take 0.2 s on a loaded machine; two fit in the interval.
        settings = ProbeSettings(interval=0.5, timeout=0.2, failed_retry=2, healthy_threshold=2)
        self.cloud = CloudHealthChecker.for_servers(
            reactor, {self.servers[n].url: self.clients[n] for n in ("cloud-a", "cloud-b")},
            NODE, settings)
        self.coordinator = CoordinatorHealthChecker(
            reactor, {self.servers["coordinator"].url: self.clients["coordinator"]}, NODE,
            self.cloud, settings)

    @defer.inlineCallbacks
    def tearDown(self):
        yield self.cloud.stop()
        yield self.coordinator.stop()
        for client in self.clients.values():
            yield client.close()
        for server in self.servers.values():
            yield server.stop()

    def poll_until(self, condition, what, timeout=10.0):
        return poll_until(condition, timeout, 0.005, self.reactor, what=what)

    def lease_on(self, name):
        return self.servers[name].store.get(LEASES, NODE, health.NODE_LEASE_NAMESPACE)

    def delegated(self):
        lease = self.lease_on("coordinator")
        annotations = (lease or {}).get("metadata", {}).get("annotations") or {}
        return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true"

    @defer.inlineCallbacks
    def test_cloud_loss_and_return_drive_health_and_delegation(self):
        url_a, url_b = self.servers["cloud-a"].url, self.servers["cloud-b"].url
        node = self.servers["cloud-a"].store.create(NODES, {"metadata": {"name": NODE}})
        self.cloud.start()
        self.coordinator.start()
        yield self.poll_until(lambda: all(self.cloud.servers().values()) and self.coordinator.healthy,
                              "every server healthy")
        for name in ("cloud-a", "coordinator"):
            spec = self.lease_on(name)["spec"]
            self.assertEqual(spec["holderIdentity"], NODE)
            self.assertEqual(spec["leaseDurationSeconds"], 40)
        # The lease created where the Node is names it as owner, as the kubelet's does.
        self.assertEqual(self.lease_on("cloud-a")["metadata"]["ownerReferences"], [
            {"apiVersion": "v1", "kind": "Node", "name": NODE,
             "uid": node["metadata"]["uid"]}])
        self.assertNotIn("ownerReferences", self.lease_on("coordinator")["metadata"])
        # The heartbeat goes through one cloud server; the other is only read.
        self.assertEqual(self.cloud.writing_server, url_a)
        self.assertIsNone(self.lease_on("cloud-b"))
        # The very first coordinator probe may have run before the cloud's first
        # answer (cloud not yet healthy, so delegated); the next one clears it.
        yield self.poll_until(lambda: not self.delegated(), "no delegate annotation")

        yield self.servers["cloud-a"].faults.down()
        yield self.poll_until(lambda: not self.cloud.servers()[url_a], "cloud-a unhealthy")
        yield self.poll_until(lambda: self.lease_on("cloud-b") is not None,
                              "heartbeat moved to cloud-b")
        self.assertEqual(self.cloud.writing_server, url_b)
        self.assertTrue(self.cloud.healthy)
        self.assertEqual({self.cloud.pick_healthy_server() for _ in range(3)}, {url_b})

        yield self.servers["cloud-b"].faults.down()
        yield self.poll_until(lambda: not self.cloud.healthy, "cloud unhealthy")
        self.assertIsNone(self.cloud.pick_healthy_server())
        yield self.poll_until(self.delegated, "delegate annotation on the coordinator lease")
        self.assertTrue(self.coordinator.healthy)

        yield self.servers["cloud-a"].faults.up()
        yield self.servers["cloud-b"].faults.up()
        yield self.poll_until(lambda: all(self.cloud.servers().values()), "cloud back")
        yield self.poll_until(lambda: not self.delegated(), "delegate annotation removed")

    @defer.inlineCallbacks
    def test_coordinator_down_is_unhealthy_and_recovers(self):
        self.cloud.start()
        self.coordinator.start()
        yield self.poll_until(lambda: self.coordinator.healthy, "coordinator healthy")
        yield self.servers["coordinator"].faults.down()
        yield self.poll_until(lambda: not self.coordinator.healthy, "coordinator unhealthy")
        yield self.servers["coordinator"].faults.up()
        yield self.poll_until(lambda: self.coordinator.healthy, "coordinator healthy again")
        self.assertGreaterEqual(self.coordinator.probers[0].successes, 3)
