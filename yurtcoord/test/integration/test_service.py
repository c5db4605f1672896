"""The composition root over real sockets: an agent built by ``make_service`` from its
config, against a cloud and a coordinator Kubernetes API test server and a real etcd
(``yurtcoord.testing.inprocess.PoolWorld``), seen on its ``/status`` page: leading,
following and delegating its heartbeat, stopping in bounded time, over TLS once the
certs Secret exists; and the TCP proxy each agent's cloud link goes through. The
bounded wait these tests rely on is tested on a Clock in the unit tier.
"""

import os
import time

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.heartbeat.delegation import DEFAULT_MAX_CONCURRENT
from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION, servers_in_use
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.kube.gvr import ENDPOINTS, LEASES, SECRETS
from yurtcoord.pool.sync import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
from yurtcoord.agent.service import make_service
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.kubelet import StandInKubelet
from yurtcoord.testing.agentpages import StatusReader
from yurtcoord.testing.inprocess import PoolWorld, write_cached_pod
from yurtcoord.testing.poll import poll_until
from yurtcoord.sim.tcpproxy import TCPProxy

# Generous bounds for a loaded 2-core CI machine; the timings below make each step
# take well under a second when nothing else runs.
STEP_TIMEOUT = 20.0


class AgentServiceTests(unittest.TestCase):
    timeout = 90

    @defer.inlineCallbacks
    def setUp(self):
        self.world = PoolWorld(self, shared_etcd=True)
        yield self.world.start()
        self.reader = StatusReader()

    @defer.inlineCallbacks
    def wait_for_status(self, agent, what, predicate, timeout=STEP_TIMEOUT):
        """Poll the agent's ``/status`` until ``predicate(document)``; the document."""
        seen = {}

        @defer.inlineCallbacks
        def check():
            seen["status"] = yield self.reader.status(agent.status_http.url)
            return predicate(seen["status"])

        yield poll_until(check, timeout, 0.02, reactor, what=what)
        return seen["status"]

    @defer.inlineCallbacks
    def test_agent_leads_becomes_ready_and_releases_its_lease_on_stop(self):
        config = self.world.config("edge-1")
        write_cached_pod(config.pool_cache.local_cache_dir, "pod-a", 7)
        self.world.cloud.store.create(ENDPOINTS, {
            "metadata": {"name": "svc-a", "namespace": "default"}, "subsets": []})
        agent = self.world.start_agent(config)

        status = yield self.wait_for_status(
            agent, "edge-1 leading and ready",
            lambda s: s["role"] == "leader" and s["ready"])
        self.assertEqual(status["leader"], "edge-1")
        self.assertEqual(status["cloud"], {self.world.cloud.url: True})
        self.assertTrue(status["coordinator_healthy"])
        self.assertTrue(status["pool_cache_synced"])
        self.assertTrue(status["local_cache_uploaded"])
        self.assertEqual(status["etcd_member"], config.coordinator.storage[0])
        code, body = yield self.reader.get(agent.status_http.url, "healthz")
        self.assertEqual((code, body), (200, b"ok\n"))
        code, _ = yield self.reader.get(agent.status_http.url, "readyz")
        self.assertEqual(code, 200)
        metrics = yield self.reader.metrics(agent.status_http.url)
        self.assertEqual(metrics["node_yurthub_yurt_coordinator_yurthub_role"], 1)
        self.assertEqual(metrics["node_yurthub_yurt_coordinator_ready_status"], 1)

        # What the agent wrote, read back independently: the uploaded pod and the
        # mirrored endpoints in etcd (etcdctl), the leases on the apiservers.
        stored = self.world.etcd.read("/registry/", prefix=True)
        self.assertIn(b"/registry/pods/default/pod-a", stored)
        self.assertIn(b"/registry/services/endpoints/default/svc-a", stored)
        self.assertIsNotNone(self.world.node_lease(self.world.cloud, "edge-1"))
        self.assertIsNotNone(self.world.coordinator.store.get(
            LEASES, INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE))
        self.assertEqual(self.world.election_lease().holder_identity, "edge-1")

        stopped = []
        for stage in agent:
            original = stage.stopService

            def recording(stage=stage, original=original):
                stopped.append(stage.name)
                return original()

            stage.stopService = recording
        yield agent.stopService()

        self.assertEqual(stopped, ["hub-elector", "election-lease-reader", "coordinator",
                                   "pool-view", "probes", "clients", "reactor-lag",
                                   "status-http"])
        record = self.world.election_lease()
        self.assertEqual(record.holder_identity, "")
        self.assertEqual(record.lease_duration_seconds, 1)
        self.assertIsNone(agent.status_http.port)
        self.assertEqual(agent.coordinator.store, None)

    def test_cloud_clients_keep_a_connection_for_every_delegation_chain(self):
        # The leader may run that many heartbeat delegations at once: a pool that
        # kept fewer connections would close the others after each answer and open
        # them again (a TLS handshake each) for the next chains.
        agent = self.world.start_agent(self.world.config("edge-1"))
        self.assertTrue(agent.cloud_clients)
        for url, client in agent.cloud_clients.items():
            self.assertEqual(client.pool.maxPersistentPerHost, DEFAULT_MAX_CONCURRENT, url)
        for url in agent.cloud_clients:
            self.assertEqual(agent._cloud_client_config(url).max_connections_per_host,
                             DEFAULT_MAX_CONCURRENT, url)

    @defer.inlineCallbacks
    def test_a_corrupt_key_cache_file_is_set_aside_and_the_agent_gets_ready(self):
        config = self.world.config("edge-1")
        cache_dir = config.pool_cache.local_cache_dir
        os.makedirs(cache_dir, exist_ok=True)
        key_cache = os.path.join(cache_dir, "component-key-cache")
        with open(key_cache, "w") as f:
            f.write("kubelet#_v1_pods:/registry/pods/default/old\nnot a cache line\n")
        write_cached_pod(cache_dir, "pod-a", 7)
        agent = self.world.start_agent(config)

        yield self.wait_for_status(agent, "edge-1 leading and ready despite the bad file",
                                   lambda s: s["role"] == "leader" and s["ready"])
        with open(key_cache + ".corrupt") as f:
            self.assertIn("not a cache line", f.read())
        with open(key_cache) as f:
            self.assertIn("kubelet#_v1_pods:/registry/pods/default/pod-a", f.read())
        self.assertIn(b"/registry/pods/default/pod-a",
                      self.world.etcd.read("/registry/pods/", prefix=True))

    @defer.inlineCallbacks
    def test_role_stays_init_until_the_first_probes_answered(self):
        """No agent is called pending merely because its first probes are still on
        the way: the first role follows the first answers."""
        self.world.coordinator.faults.latency = 0.3
        agent = make_service(self.world.config("edge-1"), reactor)
        roles = []
        agent.coordinator.add_role_observer(lambda _previous, role: roles.append(role.value))
        agent.startService()
        self.addCleanup(agent.stopService)
        status = yield self.reader.status(agent.status_http.url)
        self.assertEqual(status["role"], "init")
        yield self.wait_for_status(agent, "edge-1 leading", lambda s: s["role"] == "leader")
        self.assertEqual(roles, ["follower", "leader"])

    @defer.inlineCallbacks
    def test_cloud_cut_makes_a_follower_that_delegates_its_heartbeat(self):
        """One agent alone, cloud down: follower, node lease on the coordinator with
        the delegate annotation; cloud back: leader again, annotation removed."""
        agent = self.world.start_agent(self.world.config("edge-1"))
        yield self.wait_for_status(agent, "edge-1 leading", lambda s: s["role"] == "leader")

        yield self.world.cloud.faults.down()
        status = yield self.wait_for_status(
            agent, "edge-1 follower without the cloud", lambda s: s["role"] == "follower")
        self.assertEqual(status["cloud"], {self.world.cloud.url: False})

        def delegated():
            lease = self.world.node_lease(self.world.coordinator, "edge-1")
            annotations = (lease or {}).get("metadata", {}).get("annotations") or {}
            return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true"

        yield poll_until(delegated, STEP_TIMEOUT, 0.02, reactor,
                         what="the delegate annotation on edge-1's coordinator lease")

        yield self.world.cloud.faults.up()
        yield self.wait_for_status(agent, "edge-1 leading again", lambda s: s["role"] == "leader")
        yield poll_until(lambda: not delegated(), STEP_TIMEOUT, 0.02, reactor,
                         what="the delegate annotation removed")

    @defer.inlineCallbacks
    def test_stop_is_bounded_when_every_peer_is_down(self):
        agent = self.world.start_agent(self.world.config("edge-1"))
        yield self.wait_for_status(agent, "edge-1 leading", lambda s: s["role"] == "leader")

        yield self.world.coordinator.faults.down()
        yield self.world.cloud.faults.down()
        self.world.etcd.kill()
        began = reactor.seconds()
        yield agent.stopService()
        # The release attempt fails at once (connection refused); nothing waits for
        # a timeout.
        self.assertLess(reactor.seconds() - began, 5.0)
        self.assertIsNone(agent.status_http.port)

    @defer.inlineCallbacks
    def test_coordinator_disabled_probes_the_cloud_and_stays_init(self):
        agent = self.world.start_agent(self.world.config("edge-1", enabled=False))
        self.assertIsNone(agent.coordinator)
        status = yield self.wait_for_status(
            agent, "cloud healthy", lambda s: s["cloud"] == {self.world.cloud.url: True})
        self.assertEqual((status["role"], status["healthy"], status["ready"]),
                         ("init", False, False))
        code, _ = yield self.reader.get(agent.status_http.url, "healthz")
        self.assertEqual(code, 503)
        self.assertIsNotNone(self.world.node_lease(self.world.cloud, "edge-1"))
        self.assertIsNone(self.world.election_lease())
        metrics = yield self.reader.metrics(agent.status_http.url)
        self.assertEqual(metrics["node_yurthub_yurt_coordinator_yurthub_role"], 0)
        self.assertEqual(
            metrics[f'node_yurthub_server_healthy_status{{server="{self.world.cloud.url}"}}'], 1)
        yield agent.stopService()
        self.assertIsNone(agent.status_http.port)


    @defer.inlineCallbacks
    def test_a_reactor_blocked_on_purpose_shows_in_the_lag_histogram(self):
        agent = self.world.start_agent(self.world.config("edge-1", enabled=False))
        yield self.wait_for_status(agent, "status served", lambda s: True)
        before = yield self.reader.metrics(agent.status_http.url)
        self.assertEqual(before['yurtcoord_reactor_lag_seconds_bucket{le="+Inf"}'],
                         before["yurtcoord_reactor_lag_seconds_count"])
        # Block the reactor thread for 0.6 s: the probe's call due in it runs late.
        reactor.callLater(0, time.sleep, 0.6)

        @defer.inlineCallbacks
        def stall_seen():
            samples = yield self.reader.metrics(agent.status_http.url)
            late = (samples["yurtcoord_reactor_lag_seconds_count"]
                    - samples['yurtcoord_reactor_lag_seconds_bucket{le="0.25"}'])
            before_late = (before["yurtcoord_reactor_lag_seconds_count"]
                           - before['yurtcoord_reactor_lag_seconds_bucket{le="0.25"}'])
            return late > before_late and samples["yurtcoord_reactor_lag_seconds_sum"] >= (
                before["yurtcoord_reactor_lag_seconds_sum"] + 0.4)

        yield poll_until(stall_seen, STEP_TIMEOUT, 0.05, reactor, what="a lag over 0.25 s")
        self.assertGreaterEqual(agent.reactor_lag.longest, 0.4)
        yield agent.stopService()
        self.assertFalse(agent.reactor_lag.running)

    @defer.inlineCallbacks
    def test_a_dead_kubelet_stops_the_heartbeats_and_the_role(self):
        """With ``kubelet_healthz_url`` the probes stop once the kubelet has not been
        healthy for its grace period: the agent goes pending instead of keeping a
        dead node alive."""
        kubelet = StandInKubelet(reactor)
        kubelet.start()
        self.addCleanup(kubelet.stop)
        config = self.world.config("edge-1", heartbeat={
            "kubelet_healthz_url": kubelet.url(),
            # Longer than the heartbeat interval, at which the kubelet is asked.
            "kubelet_grace_period": "5s"})
        agent = self.world.start_agent(config)
        self.assertIsNotNone(agent.kubelet_checker)
        yield self.wait_for_status(agent, "edge-1 leading", lambda s: s["role"] == "leader")

        kubelet.code = 500
        status = yield self.wait_for_status(
            agent, "edge-1 pending with a dead kubelet", lambda s: s["role"] == "pending")
        # Its servers are not probed while the kubelet is dead: named as the cause,
        # not reported unhealthy.
        self.assertEqual(status["cloud"], {self.world.cloud.url: None})
        self.assertIsNone(status["coordinator_healthy"])
        self.assertEqual(status["cause"]["kind"], "kubelet_dead")
        self.assertIn("kubelet dead", status["servers_not_probed"])

        kubelet.code = 200
        yield self.wait_for_status(agent, "edge-1 leading again",
                                   lambda s: s["role"] == "leader")

        # A kubelet that stops listening (its process died) counts as dead as well,
        # and one listening again on its port is back.
        yield kubelet.stop()
        yield self.wait_for_status(agent, "edge-1 pending with its kubelet stopped",
                                   lambda s: s["role"] == "pending")
        kubelet.start()
        yield self.wait_for_status(agent, "edge-1 leading with its kubelet restarted",
                                   lambda s: s["role"] == "leader")

    def test_kubelet_check_off_builds_no_checker(self):
        config = self.world.config("edge-1", heartbeat={"kubelet_healthz_url": "off"})
        self.assertIsNone(config.heartbeat.kubelet_healthz_url)
        self.assertIsNone(make_service(config, reactor).kubelet_checker)
        default = self.world.config("edge-1", heartbeat={
            "kubelet_healthz_url": "http://127.0.0.1:10248/healthz"})
        checker = make_service(default, reactor).kubelet_checker
        self.assertEqual(checker.url, "http://127.0.0.1:10248/healthz")


class AgentOverTLSTests(unittest.TestCase):
    """``[coordinator] insecure = false``: the agent starts without certificates,
    fetches them from the cloud's certs Secret, then talks TLS with client
    certificates to the coordinator apiserver and to etcd."""

    timeout = 90

    @defer.inlineCallbacks
    def setUp(self):
        self.world = PoolWorld(self, tls=True, coordinator_servers=2, shared_etcd=True)
        yield self.world.start()
        self.reader = StatusReader()

    @defer.inlineCallbacks
    def test_agent_waits_for_the_certs_secret_then_leads_over_tls(self):
        config = self.world.config("edge-1")
        self.assertEqual(len(config.coordinator.server), 2)
        self.assertTrue(all(url.startswith("https://") for url in config.coordinator.server))
        agent = self.world.start_agent(config)
        self.assertIsNotNone(agent.cert_manager)
        with self.assertRaises(ConnectionFailed) as raised:
            yield agent.coordinator_client.get(LEASES, "edge-1", namespace="kube-node-lease")
        self.assertIn("certificates not available", str(raised.exception))
        status = yield self.reader.status(agent.status_http.url)
        self.assertIn(status["role"], ("init", "pending"))

        self.world.cloud.store.create(SECRETS, self.world.certs_secret())

        @defer.inlineCallbacks
        def leading_and_ready():
            document = yield self.reader.status(agent.status_http.url)
            return document["role"] == "leader" and document["ready"]

        yield poll_until(leading_and_ready, STEP_TIMEOUT, 0.02, reactor,
                         what="edge-1 leading and ready over TLS")
        self.assertEqual(self.world.election_lease().holder_identity, "edge-1")
        # Two identities with every coordinator apiserver: the node's own certificate
        # (its node lease) and the Secret's pair (the pool's agent: the election and
        # the reads of the pool's leases), and no other.
        node_identity = "CN=system:node:edge-1,O=system:nodes"
        identities = {node_identity,
                      "CN=openyurt:yurt-coordinator:yurthub,O=openyurt:yurthub"}
        for server in self.world.coordinators:
            # Each is probed as the node; the pool's requests go to the one picked.
            yield poll_until(
                lambda: node_identity in server.client_subjects,
                STEP_TIMEOUT, 0.02, reactor, what=f"{server.url} seeing the node's cert")
        self.assertEqual({subject for server in self.world.coordinators
                          for subject in server.client_subjects}, identities)
        # Nothing refused but the one read of the leader's Node the pool's agent may not
        # make (the informer sync lease is then written without an owner).
        refused = {(r.method, r.path, r.code, r.user)
                   for server in self.world.coordinators for r in server.request_log
                   if r.code in (401, 403)}
        self.assertLessEqual(refused, {("GET", "/api/v1/nodes/edge-1", 403,
                                        "openyurt:yurt-coordinator:yurthub")})
        status = yield self.reader.status(agent.status_http.url)
        self.assertEqual(status["coordinator_servers"],
                         {server.url: True for server in self.world.coordinators})
        # Its node lease on the coordinator names the pool etcd member its pool store
        # uses and the apiserver its heartbeat goes through, for the pool's views.
        self.assertTrue(agent.etcd.member.startswith("https://"))

        def servers_named():
            lease = self.world.coordinator.store.get(LEASES, "edge-1", "kube-node-lease")
            return servers_in_use(lease) == (agent.etcd.member,
                                             agent.coordinator_checker.writing_server)

        yield poll_until(servers_named, STEP_TIMEOUT, 0.02, reactor,
                         what="edge-1's node lease naming its etcd member and apiserver")
        pki_files = sorted(os.listdir(config.coordinator.pki_dir))
        self.assertIn("yurt-coordinator-yurthub-client.key", pki_files)
        self.assertEqual(os.stat(os.path.join(
            config.coordinator.pki_dir, "yurt-coordinator-yurthub-client.key")).st_mode & 0o777,
            0o600)

        # Secret deleted: certificates removed, the coordinator is unhealthy.
        self.world.cloud.store.delete(SECRETS, CERTS_SECRET_NAME, "kube-system")
        status = yield self.wait_for_pending(agent)
        self.assertFalse(status["coordinator_healthy"])
        self.assertNotIn("yurt-coordinator-yurthub-client.key",
                         os.listdir(config.coordinator.pki_dir))
        yield agent.stopService()

    @defer.inlineCallbacks
    def wait_for_pending(self, agent):
        seen = {}

        @defer.inlineCallbacks
        def pending():
            seen["status"] = yield self.reader.status(agent.status_http.url)
            return seen["status"]["role"] == "pending"

        yield poll_until(pending, STEP_TIMEOUT, 0.02, reactor,
                         what="edge-1 pending without certificates")
        return seen["status"]


class TCPProxyTests(unittest.TestCase):
    """The per-agent cloud link of the live tests: forwards, cuts, restores."""

    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        self.server = KubeAPIServer(reactor)
        yield self.server.start()
        self.addCleanup(self.server.stop)
        self.proxy = TCPProxy(reactor, "127.0.0.1", self.server.port_number)
        yield self.proxy.start()
        self.addCleanup(self.proxy.stop)
        self.client = KubeClient(reactor, ClientConfig(server=self.proxy.url(),
                                                       insecure=True, timeout=5.0))
        self.addCleanup(self.client.close)

    @defer.inlineCallbacks
    def test_cut_refuses_and_restore_forwards_again(self):
        created = yield self.client.create(
            LEASES, {"metadata": {"name": "edge-1", "namespace": "kube-node-lease"}})
        self.assertEqual(created["metadata"]["name"], "edge-1")
        self.assertGreater(self.proxy.connections, 0)

        yield self.proxy.cut()
        self.assertEqual(self.proxy.connections, 0)
        with self.assertRaises(ConnectionFailed):
            yield self.client.get(LEASES, "edge-1", namespace="kube-node-lease")

        self.proxy.restore()
        lease = yield self.client.get(LEASES, "edge-1", namespace="kube-node-lease")
        self.assertEqual(lease["metadata"]["name"], "edge-1")
