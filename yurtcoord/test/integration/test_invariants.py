"""The request-log invariants fed by the logs of real servers, written over loopback
by clients on addresses of their own: the records the checks read are the ones a
server really logs."""

import json

import treq
from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.heartbeat.probes import NODE_LEASE_NAMESPACE
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.invariants import (
    check_fencing, delegated_writes, lease_path, leadership_changes,
)
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE


class RealServerLogTests(unittest.TestCase):
    """Two real servers, written by clients on their own loopback addresses."""

    @defer.inlineCallbacks
    def setUp(self):
        self.cloud = KubeAPIServer(reactor)
        self.coordinator = KubeAPIServer(reactor)
        for server in (self.cloud, self.coordinator):
            yield server.start()
            self.addCleanup(server.stop)
        self.clients = {}
        for node, address in (("n1", "127.0.0.2"), ("n2", "127.0.0.3")):
            pool = HTTPConnectionPool(reactor, persistent=False)
            self.addCleanup(pool.closeCachedConnections)
            self.clients[node] = treq.client.HTTPClient(
                Agent(reactor, bindAddress=(address, 0), pool=pool))

    @defer.inlineCallbacks
    def put(self, node, server, namespace, name, holder, version=None):
        metadata = {"name": name}
        if version is not None:
            metadata["resourceVersion"] = version
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                 "spec": {"holderIdentity": holder, "renewTime": format_micro_time(1.0)}}
        path = server.url + lease_path(namespace, name)
        if version is None:
            response = yield self.clients[node].post(path.rpartition("/")[0],
                                                     data=json.dumps(lease).encode())
        else:
            response = yield self.clients[node].put(path, data=json.dumps(lease).encode())
        body = yield response.json()
        return response.code, body

    @defer.inlineCallbacks
    def test_logs_of_real_servers_feed_the_checks(self):
        code, first = yield self.put("n1", self.coordinator, ELECTION_NAMESPACE,
                                     ELECTION_LEASE, "n1")
        self.assertEqual(code, 201)
        yield self.put("n1", self.cloud, NODE_LEASE_NAMESPACE, "n3", "n3")
        version = first["metadata"]["resourceVersion"]
        code, _ = yield self.put("n2", self.coordinator, ELECTION_NAMESPACE, ELECTION_LEASE,
                                 "n2", version)
        self.assertEqual(code, 200)
        code, _ = yield self.put("n1", self.coordinator, ELECTION_NAMESPACE, ELECTION_LEASE,
                                 "n1", version)
        self.assertEqual(code, 409)
        yield self.put("n2", self.cloud, NODE_LEASE_NAMESPACE, "n2", "n2")
        yield self.put("n1", self.cloud, NODE_LEASE_NAMESPACE, "n4", "n4")
        yield poll_until(lambda: len(self.coordinator.request_log) == 3
                         and len(self.cloud.request_log) == 3, what="six requests logged")

        changes = leadership_changes(self.coordinator.request_log, ELECTION_NAMESPACE,
                                     ELECTION_LEASE)
        self.assertEqual([change[1:] for change in changes], [(None, "n1"), ("n1", "n2")])
        self.assertEqual([change.at for change in changes],
                         [r.at for r in self.coordinator.request_log[:2]])
        node_of_peer = {"127.0.0.2": "n1", "127.0.0.3": "n2"}
        self.assertEqual([(w.writer, w.node) for w in
                          delegated_writes(self.cloud.request_log, node_of_peer)],
                         [("n1", "n3"), ("n1", "n4")])
        problems = check_fencing(self.cloud.request_log, self.coordinator.request_log,
                                 node_of_peer, ELECTION_NAMESPACE, ELECTION_LEASE)
        self.assertEqual(len(problems), 1)
        self.assertIn("n1 wrote n4's cloud lease at", problems[0])
        self.assertIn("after n2 took the election lease", problems[0])
