"""The certificates of ``yurtcoordctl pki`` end to end: a real etcd 3.4 and the API test
server serve with these very files under mutual TLS, the coordinator apiserver keeps its
objects in that etcd, and agents (built in the test's process) become one leader and a
ready follower with nothing but the files the command wrote: the certs Secret it wrote
(in the cloud, in the pool's namespace) and each node's own client pair.
"""

import os
import shlex
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any, Generator

import yaml
from twisted.internet import defer, reactor, utils
from twisted.trial import unittest

from yurtcoord.agent import poolpki
from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.agent.config import parse_config
from yurtcoord.agent.service import make_service
from yurtcoord.kube.gvr import SECRETS
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.authz import PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.etcdstorage import storage_for
from yurtcoord.sim.etcd import EtcdCluster, EtcdProcess, EtcdTLSFiles, etcd_binary_for
from yurtcoord.sim.pki import CertPair
from yurtcoord.testing.agentpages import StatusReader, wait_for_statuses
from yurtcoord.testing.inprocess import POOL, agent_config_text
from yurtcoord.testing.deploydoc import ADMIN_KUBECONFIG, AGENT_ADDRESS, POOL_CHECKS
from yurtcoord.testing.kustomize import KUBECTL
from yurtcoord.testing.world import add_pool_node, leader_of, one_leader_all_ready

NODES = ("edge-1", "edge-2")
CTL = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
NAMESPACE = poolpki.NAMESPACE_PREFIX + POOL
STEP_TIMEOUT = 40.0


def pair(directory: str, name: str) -> CertPair:
    return CertPair(os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key"))


class PoolPKIEndToEndTests(unittest.TestCase):
    """The pool's certificates with a real etcd, the API test server and two agents."""

    timeout = 120

    def setUp(self):
        binary = etcd_binary_for("3.4")
        if binary is None:
            raise unittest.SkipTest("etcd 3.4 is not installed")
        self.pki = os.path.abspath(self.mktemp())
        # As an operator runs it, plus the loopback names a test serves on.
        done = subprocess.run(
            [CTL, "pki", "--pool", POOL, "--out", self.pki, "--extra-san", "127.0.0.1",
             "--extra-san", "localhost"] + [arg for node in NODES for arg in ("--node", node)],
            capture_output=True, timeout=60, check=False)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.etcd_client = pair(self.pki, "apiserver-etcd-client")
        self.etcd = EtcdProcess(binary, tls_files=EtcdTLSFiles(
            os.path.join(self.pki, "ca.crt"), pair(self.pki, "etcd-server"), self.etcd_client))
        self.etcd.start()
        self.addCleanup(self.etcd.stop)
        # The API test server reads its TLS files from one directory: the pki's own
        # files, linked under the names it looks for.
        tls_dir = os.path.abspath(self.mktemp())
        os.makedirs(tls_dir)
        for name, source in (("ca.crt", "client-ca.crt"), ("server.crt", "apiserver.crt"),
                             ("server.key", "apiserver.key")):
            os.symlink(os.path.join(self.pki, source), os.path.join(tls_dir, name))
        storage = storage_for(reactor, self.etcd.client_url, "/registry",
                              ca_file=os.path.join(self.pki, "ca.crt"),
                              cert_file=self.etcd_client.cert_file,
                              key_file=self.etcd_client.key_file)
        # Authorizing as the pool's coordinator does: each agent's own node lease as its
        # node, what the pool shares as the pool's agents (the Secret's pair).
        self.coordinator = KubeAPIServer(reactor, tls_dir=tls_dir, storage=storage,
                                         authorizer=PoolCoordinatorAuthorizer())
        self.cloud = KubeAPIServer(reactor)
        self.reader = StatusReader()
        return self.start_servers()

    @defer.inlineCallbacks
    def start_servers(self) -> Generator[Any, Any, None]:
        for server in (self.cloud, self.coordinator):
            yield server.start()
            self.addCleanup(server.stop)
        with open(os.path.join(self.pki, "secrets.yaml"), encoding="utf-8") as f:
            (certs,) = [s for s in yaml.safe_load_all(f)
                        if s["metadata"]["name"] == CERTS_SECRET_NAME]
        self.assertEqual(certs["metadata"]["namespace"], NAMESPACE)
        self.cloud.store.create(SECRETS, certs)

    def start_agent(self, node: str) -> Any:
        base = os.path.abspath(self.mktemp())
        cache = os.path.join(base, "cache")
        os.makedirs(cache)
        text = agent_config_text(
            node, [self.cloud.url], self.coordinator.url, self.etcd.client_url,
            os.path.join(base, "pki"), cache, coordinator_tls=True,
            kubelet_client_cert=os.path.join(self.pki, "nodes", f"{node}.pem"),
            coordinator={"secret_namespace": NAMESPACE})
        add_pool_node(self.cloud, node, POOL)
        agent = make_service(parse_config(text, f"<{node}>"), reactor)
        agent.startService()
        self.addCleanup(lambda: agent.stopService() if agent.running else None)
        return agent

    def etcd_context(self, with_client_cert: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        if with_client_cert:
            context.load_cert_chain(self.etcd_client.cert_file, self.etcd_client.key_file)
        return context

    def test_three_members_form_a_cluster_over_peer_tls(self):
        """The StatefulSet's members with the etcd-peer pair: https between them, each
        asking the others for a certificate of the pool CA."""
        cluster = EtcdCluster(self.etcd.binary, size=3, tls_files=EtcdTLSFiles(
            os.path.join(self.pki, "ca.crt"), pair(self.pki, "etcd-server"), self.etcd_client,
            peer=pair(self.pki, "etcd-peer")))
        self.addCleanup(cluster.stop)
        cluster.start()
        members = cluster.etcdctl("member", "list")
        self.assertEqual(members.count("https://127.0.0.1:"), 6, members)  # peer, client
        cluster.members[0].put("/registry/written-through-0", "x")
        self.assertEqual(cluster.members[2].read("/registry/written-through-0"),
                         {b"/registry/written-through-0": b"x"})

    def test_etcd_asks_for_a_client_certificate_of_the_pool_ca(self):
        url = self.etcd.client_url + "/health"
        with urllib.request.urlopen(url, timeout=10,
                                    context=self.etcd_context(True)) as answer:
            self.assertEqual(answer.status, 200)
        with self.assertRaises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            with urllib.request.urlopen(url, timeout=10,
                                        context=self.etcd_context(False)) as answer:
                answer.read()

    @defer.inlineCallbacks
    def test_agents_elect_a_leader_and_get_ready_with_the_pool_certificates(self):
        agents = {node: self.start_agent(node) for node in NODES}

        def statuses():
            return self.reader.statuses({node: str(agent.status_http.url)
                                         for node, agent in agents.items()})

        found = yield wait_for_statuses(statuses, "one leader, all ready",
                                        lambda s: one_leader_all_ready(s, len(NODES)),
                                        STEP_TIMEOUT, reactor)
        leader = leader_of(found)
        # Each agent reached the coordinator apiserver as its node, with its pair, and
        # as the pool's agents, with the Secret's.
        for node in NODES:
            self.assertIn(f"CN=system:node:{node},O=system:nodes",
                          self.coordinator.client_subjects)
        self.assertIn(f"CN={poolpki.YURTHUB_ETCD_CLIENT_CN},O={poolpki.POOL_AGENTS_GROUP}",
                      self.coordinator.client_subjects)
        # What the agents wrote through the coordinator apiserver is in the pool etcd,
        # read by etcdctl with the apiserver's own etcd client pair.
        leases = self.etcd.read("/registry/leases/", prefix=True)
        self.assertIn(b"/registry/leases/kube-system/yurthub", leases)
        for node in NODES:
            self.assertIn(f"/registry/leases/kube-node-lease/{node}".encode(), leases)

        # Step 7's checks of docs/deploying.md: yurtcoordctl on each node (the agent's
        # address here), kubectl on the coordinator apiserver with the admin kubeconfig
        # the command wrote (this test's server in place of the port forward's).
        outputs = {}
        for check in POOL_CHECKS:
            for node, agent in agents.items():
                argv = shlex.split(check.replace(AGENT_ADDRESS, str(agent.status_http.url))
                                   .replace(ADMIN_KUBECONFIG,
                                            os.path.join(self.pki, "admin.kubeconfig")))
                if argv[0] == "kubectl":
                    argv[1:1] = ["--server", self.coordinator.url]
                program = {"kubectl": KUBECTL, "yurtcoordctl": CTL}[argv[0]]
                out, err, code = yield utils.getProcessOutputAndValue(
                    program, argv[1:], env=os.environ)
                self.assertEqual(code, 0, f"{check}: {err!r}")
                outputs.setdefault(check, []).append(out.decode())
        status, members, election, node_leases = (outputs[check] for check in POOL_CHECKS)
        for text in status + election:
            self.assertIn(leader, text)
        for text in members + node_leases:
            for node in NODES:
                self.assertIn(node, text)
        self.assertIn(f"CN={poolpki.ADMIN_CN},O={poolpki.MASTERS_GROUP}",
                      self.coordinator.client_subjects)
