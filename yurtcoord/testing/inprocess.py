"""A pool of agents built in the test's own process by ``make_service``, over real
sockets: a cloud and a coordinator Kubernetes API test server, a real etcd, temp dirs
and the config text of each agent; and a reader of the agents' status pages."""

import base64
import json
import os
from typing import Any, Dict, Generator, List, Mapping, Optional, Sequence, Tuple

import treq.client
from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool

from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.agent.config import Config, parse_config
from yurtcoord.agent.service import Agent, make_service
from yurtcoord.heartbeat.probes import NODE_LEASE_NAMESPACE
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord
from yurtcoord.sim.agentini import IN_PROCESS_SUITE, loopback_agent_ini
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.etcd import EtcdProcess, etcd_binary_for
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE, POOL, add_pool_node

__all__ = ["ELECTION_LEASE", "ELECTION_NAMESPACE", "POOL", "PoolWorld", "StatusReader",
           "agent_config_text", "write_cached_pod"]


def agent_config_text(node: str, cloud_urls: Sequence[str], coordinator_url: str, etcd_url: str,
                      pki_dir: str, cache_dir: str, enabled: bool = True,
                      coordinator_tls: bool = False,
                      heartbeat: Optional[Mapping[str, str]] = None,
                      **sections: Mapping[str, object]) -> str:
    """Ini text of one test agent: the short timings of ``IN_PROCESS_SUITE``, plain
    http to the cloud, plain http or TLS (certificates from the certs Secret) to the
    coordinator; ``heartbeat`` and ``sections`` are merged over those, key by key."""
    return loopback_agent_ini(
        node, POOL, cloud_urls, coordinator_url, etcd_url, pki_dir, cache_dir,
        IN_PROCESS_SUITE,
        {"coordinator": {"enabled": "true" if enabled else "false",
                         "insecure": "false" if coordinator_tls else "true"},
         "heartbeat": heartbeat or {}},
        **sections)


def write_cached_pod(cache_dir: str, name: str, resource_version: int | str,
                     namespace: str = "default") -> None:
    """A pod in the node's yurthub disk cache layout (``kubelet/pods.v1.core``)."""
    directory = os.path.join(cache_dir, "kubelet", "pods.v1.core", namespace)
    os.makedirs(directory, exist_ok=True)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace,
                        "resourceVersion": str(resource_version)}}
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(pod, f)


class StatusReader:
    """GETs an agent's status pages over a non-persistent pool (no idle sockets left)."""

    def __init__(self) -> None:
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = treq.client.HTTPClient(HTTPAgent(reactor, pool=pool, connectTimeout=2))

    @defer.inlineCallbacks
    def get(self, base_url: str, page: str) -> Generator[Any, Any, Tuple[int, bytes]]:
        """``(code, body bytes)`` of ``base_url/page``."""
        response = yield self.http.get(f"{base_url}/{page}")
        body = yield response.content()
        return response.code, body

    @defer.inlineCallbacks
    def status(self, base_url: str) -> Generator[Any, Any, Any]:
        code, body = yield self.get(base_url, "status")
        if code != 200:
            raise AssertionError(f"/status answered {code}: {body!r}")
        return json.loads(body)

    @defer.inlineCallbacks
    def metrics(self, base_url: str) -> Generator[Any, Any, Dict[str, float]]:
        """``{name or name{labels}: value}`` of the Prometheus text page."""
        code, body = yield self.get(base_url, "metrics")
        if code != 200:
            raise AssertionError(f"/metrics answered {code}")
        samples: Dict[str, float] = {}
        for line in body.decode("utf-8").splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


class PoolWorld:
    """A cloud and a coordinator API test server and a real etcd 3.5 (3.4 when 3.5
    is missing), plus temp dirs, for agents built with ``make_service``.

    With ``tls`` the coordinator apiserver and etcd serve TLS and require client
    certificates of a test CA, and the cloud holds the certs Secret with them.
    """

    def __init__(self, test: unittest.TestCase, tls: bool = False) -> None:
        self.test = test
        self.tls = tls
        self.cloud = KubeAPIServer(reactor)
        binary = etcd_binary_for("3.5") or etcd_binary_for("3.4")
        if tls:
            self.ca = TestCA(test.mktemp())
            self.ca.server_pair("server")
            self.coordinator = KubeAPIServer(reactor, tls_dir=self.ca.directory)
            self.etcd = EtcdProcess(binary, tls_ca=self.ca)
        else:
            self.coordinator = KubeAPIServer(reactor)
            self.etcd = EtcdProcess(binary)
        self.agents: List[Agent] = []

    def certs_secret(self) -> Dict[str, Any]:
        """The certs Secret (the coordinator certificates an agent reads from the cloud) with
        client pairs of the test CA."""
        yurthub = self.ca.client_pair("yurthub-client", "system:node:yurthub",
                                      ["system:nodes"])
        proxy = self.ca.client_pair("lease-proxy-client", "system:node-lease-proxy")
        files = {
            "ca.crt": self.ca.ca_file,
            "yurt-coordinator-yurthub-client.crt": yurthub.cert_file,
            "yurt-coordinator-yurthub-client.key": yurthub.key_file,
            "node-lease-proxy-client.crt": proxy.cert_file,
            "node-lease-proxy-client.key": proxy.key_file,
        }
        data = {}
        for key, path in files.items():
            with open(path, "rb") as f:
                data[key] = base64.b64encode(f.read()).decode("ascii")
        return {"metadata": {"name": CERTS_SECRET_NAME, "namespace": "kube-system"},
                "type": "Opaque", "data": data}

    @defer.inlineCallbacks
    def start(self) -> Generator[Any, Any, None]:
        self.etcd.start()
        self.test.addCleanup(self.etcd.stop)
        yield self.cloud.start()
        self.test.addCleanup(self.cloud.stop)
        yield self.coordinator.start()
        self.test.addCleanup(self.coordinator.stop)

    def config(self, node: str, cloud_urls: Optional[Sequence[str]] = None, enabled: bool = True,
               heartbeat: Optional[Mapping[str, str]] = None) -> Config:
        cloud_url, coordinator_url = self.cloud.url, self.coordinator.url
        if cloud_url is None or coordinator_url is None:
            raise RuntimeError(f"config of {node} asked before PoolWorld.start(): the API "
                               "test servers have no URL yet")
        base = self.test.mktemp()
        cache_dir = os.path.join(base, "cache")
        os.makedirs(cache_dir)
        text = agent_config_text(node, cloud_urls or [cloud_url], coordinator_url,
                                 self.etcd.client_url, os.path.join(base, "pki"), cache_dir,
                                 enabled=enabled, coordinator_tls=self.tls,
                                 heartbeat=heartbeat)
        return parse_config(text, f"<{node}>")

    def start_agent(self, config: Config) -> Agent:
        """Build and start an agent, its Node of the pool created in the cloud first;
        it is stopped at cleanup unless stopped before."""
        add_pool_node(self.cloud, config.node.name, config.node.pool)
        agent = make_service(config, reactor)
        agent.startService()
        self.agents.append(agent)
        self.test.addCleanup(self._stop_if_running, agent)
        return agent

    @staticmethod
    def _stop_if_running(agent: Agent) -> Optional[defer.Deferred[None]]:
        if agent.running:
            return agent.stopService()
        return None

    def election_lease(self) -> Optional[LeaseRecord]:
        lease = self.coordinator.store.get(LEASES, ELECTION_LEASE, ELECTION_NAMESPACE)
        return LeaseRecord.from_lease(lease) if lease is not None else None

    def node_lease(self, server: KubeAPIServer, node: str) -> Optional[Dict[str, Any]]:
        return server.store.get(LEASES, node, NODE_LEASE_NAMESPACE)
