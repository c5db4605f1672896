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
from yurtcoord.sim.agentini import loopback_agent_ini
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.etcd import EtcdProcess, etcd_binary_for
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE, POOL, add_pool_node

__all__ = ["ELECTION_LEASE", "ELECTION_NAMESPACE", "POOL", "PoolWorld", "StatusReader",
           "agent_config_text", "certs_secret", "write_cached_pod"]


def agent_config_text(node: str, cloud_urls: Sequence[str], coordinator_url: str, etcd_url: str,
                      pki_dir: str, cache_dir: str, enabled: bool = True,
                      coordinator_tls: bool = False,
                      heartbeat: Optional[Mapping[str, str]] = None) -> str:
    """Ini text of one test agent: short timings (lease 2 s, renew 1.5 s, retry 0.3 s,
    check every 0.3 s, heartbeat every 4 s in up to 3 attempts of 1.2 s (a first
    write reads the lease and the Node, then creates), healthy after one probe), plain
    http to the cloud, plain http or TLS (certificates from the certs Secret) to the
    coordinator."""
    return loopback_agent_ini(
        node, POOL, cloud_urls, coordinator_url, etcd_url, pki_dir, cache_dir,
        coordinator={"enabled": "true" if enabled else "false",
                     "insecure": "false" if coordinator_tls else "true"},
        leader_election={"lease_namespace": ELECTION_NAMESPACE,
                         "lease_name": ELECTION_LEASE, "lease_duration": "2s",
                         "renew_deadline": "1500ms", "retry_period": "300ms",
                         "check_interval": "300ms"},
        heartbeat={"interval": "4s", "failed_retry": "3", "healthy_threshold": "1",
                   "timeout": "1200ms", **(heartbeat or {})},
        pool_cache={"informer_lease_renew": "1s", "stale_timeout": "3s"})


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


def certs_secret(ca: TestCA) -> Dict[str, Any]:
    """The certs Secret (the coordinator certificates an agent reads from the cloud) with
    client pairs issued by ``ca``."""
    yurthub = ca.client_pair("yurthub-client", "system:node:yurthub", ["system:nodes"])
    proxy = ca.client_pair("lease-proxy-client", "system:node-lease-proxy")
    files = {
        "ca.crt": ca.ca_file,
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


class PoolWorld:
    """A cloud and a coordinator API test server and a real etcd 3.5 (3.4 when 3.5
    is missing), plus temp dirs, for agents built with ``make_service``.

    With ``tls`` the coordinator apiserver and etcd serve TLS and require client
    certificates of a test CA, and the cloud holds the certs Secret with them. With
    ``coordinator_servers`` above 1 there are that many coordinator apiservers
    (``coordinators``, the first also ``coordinator``) serving one store, as
    apiservers over one pool etcd do, and every agent is given all of them.
    """

    def __init__(self, test: unittest.TestCase, tls: bool = False,
                 coordinator_servers: int = 1) -> None:
        self.test = test
        self.tls = tls
        self.cloud = KubeAPIServer(reactor)
        binary = etcd_binary_for("3.5") or etcd_binary_for("3.4")
        tls_dir = None
        if tls:
            self.ca = TestCA(test.mktemp())
            self.ca.server_pair("server")
            tls_dir = self.ca.directory
            self.etcd = EtcdProcess(binary, tls_ca=self.ca)
        else:
            self.etcd = EtcdProcess(binary)
        self.coordinator = KubeAPIServer(reactor, tls_dir=tls_dir)
        self.coordinators = [self.coordinator] + [
            KubeAPIServer(reactor, tls_dir=tls_dir, storage=self.coordinator.storage)
            for _ in range(coordinator_servers - 1)]
        self.agents: List[Agent] = []

    def certs_secret(self) -> Dict[str, Any]:
        """The certs Secret of this world's test CA (see ``certs_secret``)."""
        return certs_secret(self.ca)

    @defer.inlineCallbacks
    def start(self) -> Generator[Any, Any, None]:
        self.etcd.start()
        self.test.addCleanup(self.etcd.stop)
        yield self.cloud.start()
        self.test.addCleanup(self.cloud.stop)
        for server in self.coordinators:
            yield server.start()
            self.test.addCleanup(server.stop)

    def config(self, node: str, cloud_urls: Optional[Sequence[str]] = None, enabled: bool = True,
               heartbeat: Optional[Mapping[str, str]] = None) -> Config:
        cloud_url = self.cloud.url
        coordinator_urls = [server.url for server in self.coordinators]
        if cloud_url is None or None in coordinator_urls:
            raise RuntimeError(f"config of {node} asked before PoolWorld.start(): the API "
                               "test servers have no URL yet")
        base = self.test.mktemp()
        cache_dir = os.path.join(base, "cache")
        os.makedirs(cache_dir)
        text = agent_config_text(node, cloud_urls or [cloud_url],
                                 ", ".join(url for url in coordinator_urls if url),
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
