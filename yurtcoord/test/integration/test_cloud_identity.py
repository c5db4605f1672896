"""The node's own lease goes to the cloud as the node.

An agent built in the test process (``make_service``) with a cloud API test server that
serves TLS and requires client certificates. Its ``[cloud]`` credentials are a
ServiceAccount's stand-in (a client certificate of its own user), its ``[node]
kubelet_client_cert`` the node's own. The cloud's request log names the user of every
request: the node's lease is written as the node, never with the agent's shared
credentials, which therefore need no right to write any lease.
"""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.config import ConfigError, parse_config
from yurtcoord.agent.service import make_service
from yurtcoord.kube.gvr import LEASES
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.inprocess import agent_config_text
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import add_pool_node

NODE = "edge-1"
SERVICE_ACCOUNT = "system:serviceaccount:kube-system:yurtcoord"
STEP_TIMEOUT = 20.0


class CloudIdentityTests(unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        self.ca = TestCA(self.mktemp())
        self.ca.server_pair("server")
        self.cloud = KubeAPIServer(reactor, tls_dir=self.ca.directory)
        self.cloud_url = yield self.cloud.start()
        self.addCleanup(self.cloud.stop)
        add_pool_node(self.cloud, NODE)
        self.account = self.ca.client_pair("service-account", SERVICE_ACCOUNT,
                                           ["system:serviceaccounts"])

    def config(self, node_cert: str):
        base = self.mktemp()
        cache_dir = os.path.join(base, "cache")
        os.makedirs(cache_dir)
        text = agent_config_text(
            NODE, [self.cloud_url], "http://127.0.0.1:9", "http://127.0.0.1:9",
            os.path.join(base, "pki"), cache_dir, enabled=False,
            kubelet_client_cert=node_cert,
            cloud={"insecure": "false", "ca_file": self.ca.ca_file,
                   "cert_file": self.account.cert_file, "key_file": self.account.key_file})
        return parse_config(text, f"<{NODE}>")

    @defer.inlineCallbacks
    def test_the_nodes_lease_is_written_as_the_node(self):
        node_cert = self.ca.node_client_pem(NODE, os.path.join(self.mktemp() + ".pem"))
        agent = make_service(self.config(node_cert), reactor)
        agent.startService()
        self.addCleanup(agent.stopService)
        yield poll_until(lambda: self.cloud.store.get(LEASES, NODE, NODE_LEASE_NAMESPACE),
                         STEP_TIMEOUT, 0.02, reactor, what=f"{NODE}'s lease in the cloud")
        lease_requests = [r for r in self.cloud.request_log if "/leases" in r.path]
        self.assertTrue(any(r.method in ("POST", "PUT") for r in lease_requests))
        self.assertEqual({r.user for r in lease_requests}, {f"system:node:{NODE}"})
        self.assertNotIn(SERVICE_ACCOUNT, {r.user for r in self.cloud.request_log})

    def test_a_certificate_of_another_node_stops_the_agent(self):
        other = self.ca.node_client_pem("edge-2", self.mktemp() + ".pem")
        with self.assertRaises(ConfigError) as raised:
            make_service(self.config(other), reactor)
        self.assertEqual(raised.exception.section, "cloud")
        self.assertIn("CN=system:node:edge-2", str(raised.exception))
