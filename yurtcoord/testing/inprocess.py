"""A pool of agents built in the test's own process by ``make_service``, over real
sockets: a cloud and a coordinator Kubernetes API test server, a real etcd, temp dirs
and the config text of each agent.

This is the pool world for tests that reach into an agent (its coordinator, hub
elector, delegation) or swap one of its parts; ``world.ProcessWorld`` runs each agent
as a separate ``twistd`` process instead, for faults that need one (an agent killed,
sent SIGTERM, or failing apart from the test's reactor). What the two share is written
once: the ini text (``sim.agentini``), the reader of the agents' pages
(``agentpages``), and in ``world`` the pool's Nodes in the cloud, the readers of node
leases and their delegate annotation, and the pods of a node's local cache."""

import base64
import os
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.agent.config import Config, parse_config
from yurtcoord.agent.service import Agent, make_service
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord
from yurtcoord.sim.agentini import IN_PROCESS_SUITE, Sections, loopback_agent_ini
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.authz import POOL_AGENTS_GROUP, PoolCoordinatorAuthorizer
from yurtcoord.sim.etcd import EtcdProcess, default_etcd_binary, preferred_etcd_binary
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.agentpages import Statuses, StatusReader, wait_for_statuses
from yurtcoord.testing.sharedetcd import use_shared_etcd
from yurtcoord.testing.world import (
    ELECTION_LEASE, ELECTION_NAMESPACE, POOL, add_pool_node, read_delegate_annotation,
    read_node_lease, write_cached_pod,
)

__all__ = ["ELECTION_LEASE", "ELECTION_NAMESPACE", "POOL", "PoolWorld", "agent_config_text",
           "certs_secret", "write_cached_pod"]


def agent_config_text(node: str, cloud_urls: Sequence[str], coordinator_url: str, etcd_url: str,
                      pki_dir: str, cache_dir: str, enabled: bool = True,
                      coordinator_tls: bool = False,
                      kubelet_client_cert: Optional[str] = None,
                      heartbeat: Optional[Mapping[str, str]] = None,
                      timings: Sections = IN_PROCESS_SUITE,
                      **sections: Mapping[str, object]) -> str:
    """Ini text of one test agent: the short timings of ``IN_PROCESS_SUITE`` (or
    ``timings``), plain http to the cloud, plain http or TLS (certificates from the
    certs Secret and, as the node's identity there, ``kubelet_client_cert``) to the
    coordinator; ``heartbeat`` and ``sections`` are merged over those, key by key."""
    return loopback_agent_ini(
        node, POOL, cloud_urls, coordinator_url, etcd_url, pki_dir, cache_dir, timings,
        {"node": {"kubelet_client_cert": kubelet_client_cert} if kubelet_client_cert else {},
         "coordinator": {"enabled": "true" if enabled else "false",
                         "insecure": "false" if coordinator_tls else "true"},
         "heartbeat": heartbeat or {}},
        **sections)


def certs_secret(ca: TestCA) -> Dict[str, Any]:
    """The certs Secret (the coordinator certificates an agent reads from the cloud) with
    client pairs issued by ``ca``."""
    # The pool's agents' pair (the pool etcd's client, the pool's agent on the
    # coordinator): it names no node.
    yurthub = ca.client_pair("yurthub-client", "openyurt:yurt-coordinator:yurthub",
                             [POOL_AGENTS_GROUP])
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
    is missing), plus temp dirs, for agents built with ``make_service`` in the test
    process; ``statuses()`` and ``wait_for_pool()`` read them as ``ProcessWorld``
    reads its agent processes, through the shared ``StatusReader`` (``reader``).

    With ``tls`` the coordinator apiserver and etcd serve TLS and require client
    certificates of a test CA, and the cloud holds the certs Secret with them. With
    ``shared_etcd`` the etcd is the run's shared one of its kind
    (``yurtcoord.testing.sharedetcd``: already running, emptied after the test) instead
    of one started for this world, and the CA with ``tls`` is that etcd's. With
    ``coordinator_servers`` above 1 there are that many coordinator apiservers
    (``coordinators``, the first also ``coordinator``) serving one store, as
    apiservers over one pool etcd do, and every agent is given all of them.
    """

    def __init__(self, test: unittest.TestCase, tls: bool = False,
                 coordinator_servers: int = 1, shared_etcd: bool = False) -> None:
        self.test = test
        self.tls = tls
        self.shared_etcd = shared_etcd
        self.cloud = KubeAPIServer(reactor)
        binary = preferred_etcd_binary()
        tls_dir = None
        if shared_etcd:
            self.etcd = use_shared_etcd(test, binary or default_etcd_binary(), tls=tls)
            if self.etcd.tls_ca is not None:
                self.ca = self.etcd.tls_ca
        elif tls:
            self.ca = TestCA(test.mktemp())
            self.etcd = EtcdProcess(binary, tls_ca=self.ca)
        else:
            self.etcd = EtcdProcess(binary)
        if tls:
            self.ca.server_pair("server")
            tls_dir = self.ca.directory
        # With TLS the coordinators authorize as a production pool's do.
        authorizer = PoolCoordinatorAuthorizer() if tls else None
        self.coordinator = KubeAPIServer(reactor, tls_dir=tls_dir, authorizer=authorizer)
        self.coordinators = [self.coordinator] + [
            KubeAPIServer(reactor, tls_dir=tls_dir, storage=self.coordinator.storage,
                          authorizer=authorizer)
            for _ in range(coordinator_servers - 1)]
        self.agents: List[Agent] = []
        self.reader = StatusReader()

    def certs_secret(self) -> Dict[str, Any]:
        """The certs Secret of this world's test CA (see ``certs_secret``)."""
        return certs_secret(self.ca)

    @defer.inlineCallbacks
    def start(self) -> Generator[Any, Any, None]:
        if not self.shared_etcd:
            self.etcd.start()
            self.test.addCleanup(self.etcd.stop)
        yield self.cloud.start()
        self.test.addCleanup(self.cloud.stop)
        for server in self.coordinators:
            yield server.start()
            self.test.addCleanup(server.stop)

    def config(self, node: str, cloud_urls: Optional[Sequence[str]] = None, enabled: bool = True,
               heartbeat: Optional[Mapping[str, str]] = None,
               timings: Sections = IN_PROCESS_SUITE,
               **sections: Mapping[str, object]) -> Config:
        """The config of agent ``node`` (see ``agent_config_text``), with a pki and a
        cache dir of its own under the test's temp dir."""
        cloud_url = self.cloud.url
        coordinator_urls = [server.url for server in self.coordinators]
        if cloud_url is None or None in coordinator_urls:
            raise RuntimeError(f"config of {node} asked before PoolWorld.start(): the API "
                               "test servers have no URL yet")
        base = self.test.mktemp()
        cache_dir = os.path.join(base, "cache")
        os.makedirs(cache_dir)
        node_cert = None
        if self.tls:
            # The node's own certificate, as the kubelet keeps it: the agent's identity
            # on the coordinator apiservers.
            node_cert = self.ca.node_client_pem(
                node, os.path.join(base, "kubelet-client-current.pem"))
        text = agent_config_text(node, cloud_urls or [cloud_url],
                                 ", ".join(url for url in coordinator_urls if url),
                                 self.etcd.client_url, os.path.join(base, "pki"), cache_dir,
                                 enabled=enabled, coordinator_tls=self.tls,
                                 kubelet_client_cert=node_cert, heartbeat=heartbeat,
                                 timings=timings, **sections)
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

    node_lease = staticmethod(read_node_lease)
    delegate_annotation = staticmethod(read_delegate_annotation)

    # -- reading the agents' pages -----------------------------------------------------

    def running_agents(self) -> Dict[str, Agent]:
        """``{node: agent}`` of every agent started and not stopped."""
        return {agent.config.node.name: agent for agent in self.agents if agent.running}

    def statuses(self) -> "defer.Deferred[Statuses]":
        """``{node: /status document}`` of every running agent."""
        return self.reader.statuses({node: str(agent.status_http.url)
                                     for node, agent in self.running_agents().items()})

    def wait_for_pool(self, what: str, predicate: Callable[[Statuses], object],
                      timeout: float, interval: float = 0.05) -> "defer.Deferred[Statuses]":
        """Poll every running agent's ``/status`` until ``predicate({node: doc})``; on
        timeout the assertion names ``what`` and each agent's last (role, leader, ready)."""
        return wait_for_statuses(self.statuses, what, predicate, timeout, reactor, interval)
