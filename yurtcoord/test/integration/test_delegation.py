"""Heartbeat delegation end to end on real sockets: a plain coordinator API server, a
cloud API server that requires client certificates, and the real informer and
clients in between. The leader forwards the changes of a pool lease it sees, with its
own time."""

import os
from types import SimpleNamespace

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.heartbeat.delegation import NODE_LEASE_NAMESPACE, HeartbeatDelegation
from yurtcoord.tx.retry import backoff_policy
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.kube.lease import format_micro_time, parse_micro_time
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.delegationobjects import POOL, pool_lease, pool_node
from yurtcoord.testing.poll import poll_until


class DelegationLiveTests(unittest.TestCase):
    """A coordinator API server (plain HTTP) and a cloud API server that requires
    client certificates; the real informer and clients in between."""

    @defer.inlineCallbacks
    def setUp(self):
        tls_dir = self.mktemp()
        os.makedirs(tls_dir)
        ca = TestCA(tls_dir)
        ca.server_pair("server")
        proxy_pair = ca.client_pair("node-lease-proxy-client", "system:node-lease-proxy",
                                    organizations=["openyurt:yurt-coordinator"])
        self.pool = KubeAPIServer(reactor)
        self.cloud = KubeAPIServer(reactor, tls_dir=tls_dir)
        pool_url = yield self.pool.start()
        self.cloud_url = yield self.cloud.start()
        self.addCleanup(self.pool.stop)
        self.addCleanup(self.cloud.stop)
        self.pool_client = KubeClient(reactor, ClientConfig(server=pool_url, insecure=True))
        self.proxy_client = KubeClient(reactor, ClientConfig(
            server=self.cloud_url, ca_file=ca.ca_file, cert_file=proxy_pair.cert_file,
            key_file=proxy_pair.key_file))
        self.addCleanup(self.pool_client.close)
        self.addCleanup(self.proxy_client.close)
        clients = {self.cloud_url: self.proxy_client}
        cloud_health = SimpleNamespace(pick_healthy_server=lambda: self.cloud_url)
        for name in ("node-b", "node-c"):
            self.cloud.store.create(NODES, pool_node(name))
        self.delegation = HeartbeatDelegation.for_coordinator(
            reactor, self.pool_client, self.proxy_client, cloud_health, clients.__getitem__,
            POOL, retry_policy=backoff_policy(initial=0.05, maximum=0.5),
            heartbeat_interval=30.0)
        self.addCleanup(self.delegation.stop)
        # The pool leases name renewTimes a minute in the past of the real clock, as a
        # node whose clock is behind writes them: the cloud gets the leader's time.
        self.t0 = float(int(reactor.seconds()) - 60)

    def cloud_renew_time(self, name):
        lease = self.cloud.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
        if lease is None:
            return None
        return parse_micro_time(lease["spec"]["renewTime"])

    def renew(self, name, renewed):
        """The node renews its pool lease, naming ``renewed``; returns the real time
        it did."""
        pooled = self.pool.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
        pooled["spec"]["renewTime"] = format_micro_time(renewed)
        self.pool.store.update(LEASES, pooled)
        return reactor.seconds()

    @defer.inlineCallbacks
    def started(self):
        """Start the delegation; fire once both its informers have listed."""
        yield self.delegation.start(None)
        yield poll_until(lambda: self.delegation.pool_nodes_listed
                         and self.delegation.pool_leases_listed, what="leases and nodes listed")

    def pool_lease(self, name, renewed, delegated=True):
        lease = pool_lease(name, renewed, delegated=delegated)
        del lease["metadata"]["ownerReferences"]
        for server_set in ("resourceVersion", "uid", "creationTimestamp", "managedFields",
                           "selfLink", "generation"):
            lease["metadata"].pop(server_set)
        return lease

    @defer.inlineCallbacks
    def test_only_pool_members_leases_are_held_however_many_names_are_made_up(self):
        ghosts = [f"ghost-{index}" for index in range(300)]
        self.pool.store.create(LEASES, self.pool_lease("node-b", self.t0 + 1))
        for name in ghosts:
            self.pool.store.create(LEASES, self.pool_lease(name, self.t0 + 1))
        yield self.started()
        # Listed before or after the Nodes, no made-up name stays in the informer.
        for name in [*ghosts, "node-b"]:
            self.renew(name, self.t0 + 2)
        yield poll_until(lambda: self.delegation.delegated_heartbeats == 1,
                         what="node-b's renewal forwarded past the made-up ones")
        self.assertEqual(self.delegation.leases_held, 1)
        self.assertEqual([lease["metadata"]["name"]
                          for lease in self.cloud.store.list(LEASES, NODE_LEASE_NAMESPACE)],
                         ["node-b"])

    @defer.inlineCallbacks
    def test_delegated_leases_reach_the_cloud_through_the_proxy_certificate(self):
        # Delegated before this agent led: listed as it starts, no change it saw.
        self.pool.store.create(LEASES, self.pool_lease("node-b", self.t0 + 1))
        self.pool.store.create(LEASES, self.pool_lease("node-c", self.t0 + 1, delegated=False))
        yield self.started()
        self.assertIsNone(self.cloud_renew_time("node-b"))
        # node-b renews: that change is forwarded, stamped when the leader saw it.
        renewed_at = self.renew("node-b", self.t0 + 2)
        # The counter moves when the leader has the cloud's answer, after the store.
        yield poll_until(lambda: self.delegation.delegated_heartbeats == 1,
                         what="node-b's lease created in the cloud")
        self.assertGreaterEqual(self.cloud_renew_time("node-b"), renewed_at - 0.001)
        self.assertLessEqual(self.cloud_renew_time("node-b"), reactor.seconds())
        created = self.cloud.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        pooled = self.pool.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        node = self.cloud.store.get(NODES, "node-b")
        self.assertEqual(created["spec"]["holderIdentity"], "node-b")
        self.assertEqual(created["spec"]["leaseDurationSeconds"], 40)
        self.assertNotIn("labels", created["metadata"])
        self.assertEqual(created["metadata"]["ownerReferences"], [{
            "apiVersion": "v1", "kind": "Node", "name": "node-b",
            "uid": node["metadata"]["uid"]}])
        self.assertNotEqual(created["metadata"]["uid"], pooled["metadata"]["uid"])

        # Renewals advance the cloud lease, each with the leader's time.
        for count in (2, 3):
            before = self.cloud_renew_time("node-b")
            renewed_at = self.renew("node-b", self.t0 + count + 1)
            yield poll_until(lambda: self.delegation.delegated_heartbeats == count,
                             what=f"renewal {count} forwarded")
            self.assertGreater(self.cloud_renew_time("node-b"), before)
            self.assertGreaterEqual(self.cloud_renew_time("node-b"), renewed_at - 0.001)
        self.assertIsNone(self.cloud.store.get(LEASES, "node-c", NODE_LEASE_NAMESPACE))

        # A renewal the node wrote itself, its clock an hour ahead, is exceeded by the
        # next forward: the cloud's renewTime only ever increases.
        planted = float(int(reactor.seconds()) + 3600)
        cloud = self.cloud.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
        cloud["spec"]["renewTime"] = format_micro_time(planted)
        self.cloud.store.update(LEASES, cloud)
        self.renew("node-b", self.t0 + 5)
        yield poll_until(lambda: self.delegation.delegated_heartbeats == 4,
                         what="the renewal after the planted one forwarded")
        self.assertEqual(self.cloud.store.get(LEASES, "node-b", NODE_LEASE_NAMESPACE)
                         ["spec"]["renewTime"], format_micro_time(planted + 0.000001))

        subjects = set(self.cloud.client_subjects)
        self.assertEqual(subjects, {"CN=system:node-lease-proxy,O=openyurt:yurt-coordinator"})
        self.assertEqual(self.delegation.delegated_heartbeats, 4)
        self.assertEqual(self.delegation.failures, 0)
        self.assertEqual(self.delegation.refused["expired"], 0)

    @defer.inlineCallbacks
    def test_cloud_down_then_back_the_newest_state_is_delivered(self):
        # The pool's Nodes listed while the cloud answered stay known during the outage.
        yield self.started()
        yield self.cloud.faults.down()
        # A lease created after the list is a change the leader saw.
        self.pool.store.create(LEASES, self.pool_lease("node-b", self.t0 + 1))
        yield poll_until(lambda: self.delegation.failures >= 1,
                         what="a failed delegation")
        self.renew("node-b", self.t0 + 2)
        up_at = reactor.seconds()
        yield self.cloud.faults.up()
        yield poll_until(lambda: self.delegation.delegated_heartbeats >= 1,
                         what="newest state delivered after the cloud came back")
        self.assertGreaterEqual(self.cloud_renew_time("node-b"), up_at - 0.001)
        # The two states seen during the outage were one write.
        self.assertEqual(self.delegation.delegated_heartbeats, 1)
        self.assertEqual(self.delegation.refused["expired"], 0)
