"""A pool on real test networks: every agent, apiserver and etcd member on a host of its own.

``PartitionWorld`` is a ``ProcessWorld`` whose parts sit on the hosts of a
``netns.Topology``: the cloud API test server on the WAN, the coordinator API test server
and the etcd member on the pool LAN, and every agent (a ``twistd`` process spawned inside
its host's network namespace) on both. The API test servers and the stand-in kubelets are
still served from the test's own reactor, on sockets made inside their hosts' namespaces,
so their fault knobs and request logs stay plain attributes. Cuts are link cuts
(``topology.cut``/``heal``/``flap``), not proxies: an agent that lost its WAN reaches
neither the cloud nor anything else on it, and whatever TCP connections it held stall.

The coordinator apiserver keeps its objects in the pool etcd, as ``ProcessWorld``'s do
(``coordinator_in_etcd=False`` keeps them in memory): its etcd client connects from the
coordinator host over the LAN, so a cut of the etcd member's LAN is also an outage of
the coordinator, as it is in a pool. The cloud keeps its objects in memory.

The test reads the agents' status pages on each agent host's own loopback, the
coordinator's objects through its HTTP API from the coordinator host
(``served_object``) and etcd with ``etcdctl`` on the member host's loopback, so no cut
ever blinds the observer.

Addresses (198.18.0.0/15 is set aside for network test beds; each topology has its own
switch, so parallel worlds reuse them):

- WAN 198.18.0.0/24: the cloud 198.18.0.2, agent N 198.18.0.(10+N);
- LAN 198.19.0.0/24: the coordinator 198.19.0.2, etcd member N 198.19.0.(2+N), agent N
  198.19.0.(10+N).
"""

import json
import os
import tempfile
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional

import treq.client
from twisted.internet import defer
from twisted.internet import ssl
from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IStreamClientEndpoint
from twisted.internet.threads import deferToThread
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool
from zope.interface import implementer
from twisted.web.client import URI
from twisted.web.iweb import IAgentEndpointFactory

from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.etcd import EtcdBinary, EtcdProcess, preferred_etcd_binary
from yurtcoord.sim.kubelet import StandInKubelet
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.netns import Topology, entered
from yurtcoord.sim.agentini import merge_sections
from yurtcoord.testing.world import (
    KUBELET_GRACE_PERIOD, PAGE_TIMEOUT, AgentProcess, ProcessWorld, add_pool_node, agent_ini,
)

WAN, LAN = "wan", "lan"
NETWORKS = {WAN: "198.18.0.0/24", LAN: "198.19.0.0/24"}
CLOUD_HOST, COORDINATOR_HOST, ETCD_HOST = "cloud", "coord", "etcd-1"
CLOUD_ADDRESS, COORDINATOR_ADDRESS, ETCD_ADDRESS = "198.18.0.2", "198.19.0.2", "198.19.0.3"
API_PORT, ETCD_CLIENT_PORT, STATUS_PORT, KUBELET_PORT = 6443, 2379, 10267, 10248


@implementer(IAgentEndpointFactory)
class _EndpointsOnHost:
    """Connects every request from inside one host's network namespace."""

    def __init__(self, host_reactor: Any,
                 tls: Optional[Callable[[str], IOpenSSLClientConnectionCreator]] = None,
                 ) -> None:
        self._reactor = host_reactor
        self._tls = tls

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:  # noqa: N802 - Twisted's name
        host = uri.host.decode("ascii")
        endpoint = TCP4ClientEndpoint(self._reactor, host, uri.port, timeout=2)
        if uri.scheme == b"https" and self._tls is not None:
            return wrapClientTLS(self._tls(host), endpoint)
        return endpoint


def agent_addresses(index: int) -> Dict[str, str]:
    """WAN and LAN addresses of the ``index``-th agent (1-based)."""
    return {WAN: f"198.18.0.{10 + index}", LAN: f"198.19.0.{10 + index}"}


class PartitionWorld(ProcessWorld):
    """A pool on its own test networks; see the module docstring.

    ``name`` names the topology (its namespaces carry it), so that several worlds run
    side by side. ``start()``/``stop()`` bracket it like ``ProcessWorld``; ``stop()``
    also closes the topology, which removes every namespace, bridge and process it made.
    ``coordinator_in_etcd`` as for ``ProcessWorld``.
    """

    def __init__(self, reactor: Any, name: str, etcd_binary: EtcdBinary | None = None,
                 kubelet_grace_period: str = KUBELET_GRACE_PERIOD,
                 timings: Optional[Dict[str, Dict[str, str]]] = None,
                 coordinator_in_etcd: bool = True, identities: bool = False) -> None:
        # Not ProcessWorld.__init__: its servers and etcd live on the test's loopback.
        self.reactor = reactor
        self.coordinator_in_etcd = coordinator_in_etcd
        self.name = name
        self.kubelet_grace_period = kubelet_grace_period
        # Ini sections merged over the suite's for every agent (e.g. heartbeat timings).
        self.timings = timings or {}
        self.base_dir = tempfile.mkdtemp(prefix=f"yurtcoord-{name}-")
        self.topology = Topology(reactor, name, NETWORKS)
        self.hosts: Dict[str, Any] = {}
        # With identities, as ProcessWorld's: TLS to the coordinator and etcd, whose
        # certificates name their addresses on the LAN.
        self.ca = None
        if identities:
            self.ca = TestCA(os.path.join(self.base_dir, "ca"))
            self.ca.server_pair("server", [COORDINATOR_ADDRESS])
            self._admin = self.ca.client_pair("admin", "admin", ["system:masters"])
        self.etcd = EtcdProcess(etcd_binary or preferred_etcd_binary(),
                                host=ETCD_ADDRESS, tls_ca=self.ca)
        self.cloud = None
        self.coordinator = None
        # None here: the coordinator apiserver runs on the coordinator host (start()).
        self.coordinator_processes = []
        self.agents = {}
        self.node_of_address: Dict[str, str] = {}
        self._proxies = []
        self._kubelets = []
        self._clients: Dict[str, treq.client.HTTPClient] = {}
        self._pools: List[HTTPConnectionPool] = []
        self._http_pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = treq.client.HTTPClient(HTTPAgent(reactor, pool=self._http_pool))
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self) -> Generator[defer.Deferred[Any], Any, None]:
        self.hosts[CLOUD_HOST] = self.topology.add_host(CLOUD_HOST, {WAN: CLOUD_ADDRESS})
        self.hosts[COORDINATOR_HOST] = self.topology.add_host(
            COORDINATOR_HOST, {LAN: COORDINATOR_ADDRESS})
        self.hosts[ETCD_HOST] = self.topology.add_host(ETCD_HOST, {LAN: ETCD_ADDRESS})
        self.cloud = KubeAPIServer(self.hosts[CLOUD_HOST].reactor)
        coordinator_reactor = self.hosts[COORDINATOR_HOST].reactor
        self.coordinator = self._coordinator_server(
            self.coordinator_storage(coordinator_reactor), coordinator_reactor)
        yield deferToThread(self._start_etcd)
        yield self.cloud.start(API_PORT, CLOUD_ADDRESS)
        self._publish_certificates(self.cloud)
        yield self.coordinator.start(API_PORT, COORDINATOR_ADDRESS)

    def _start_etcd(self) -> None:
        with entered(self.hosts[ETCD_HOST].netns):
            self.etcd.start()

    def add_agent(self, node: str, pods: int = 0, cloud_urls: int = 1,
                  etcd_proxy: bool = False, clock_offset: float = 0.0, **pod_options: Any,
                  ) -> defer.Deferred[AgentProcess]:
        """Prepare an agent on a host of its own (WAN and LAN), with a running stand-in
        kubelet on that host's loopback, its Node in the cloud and ``pods`` good pods in
        its cache; not started. Its one cloud URL and its etcd are the servers'
        addresses on the test networks: no proxies."""
        if cloud_urls != 1 or etcd_proxy:
            raise ValueError(f"agent {node}: a partition world's agents have one cloud URL "
                             "and no etcd proxy")
        index = len(self.agents) + 1
        addresses = agent_addresses(index)
        host = self.topology.add_host(node, addresses)
        self.hosts[node] = host
        self.node_of_address[addresses[WAN]] = node
        self.node_of_address[addresses[LAN]] = node
        kubelet = StandInKubelet(host.reactor)
        kubelet.start(KUBELET_PORT)
        self._kubelets.append(kubelet)
        add_pool_node(self.servers()[0], node)

        def spawn(child: Any, argv: List[str], env: Dict[str, str], path: str,
                  child_fds: Dict[int, int]) -> None:
            self.topology.spawn(node, child, argv, env=env, path=path, childFDs=child_fds)

        agent = AgentProcess(host.reactor, node, os.path.join(self.base_dir, node), [],
                             None, kubelet, spawn=spawn, clock_offset=clock_offset)
        self._give_identity(agent)
        if pods:
            agent.write_pods(pods, **pod_options)
        self.agents[node] = agent
        return defer.succeed(agent)

    def ini_for(self, agent: AgentProcess, **sections: Mapping[str, object]) -> str:
        merged = merge_sections(self.timings, sections)
        scheme = "http" if self.ca is None else "https"
        return agent_ini(agent.node, [f"http://{CLOUD_ADDRESS}:{API_PORT}"],
                         f"{scheme}://{COORDINATOR_ADDRESS}:{API_PORT}", self.etcd.client_url,
                         agent.pki_dir, agent.cache_dir, f"127.0.0.1:{STATUS_PORT}",
                         kubelet_url=agent.stand_in_kubelet().url(),
                         kubelet_grace_period=self.kubelet_grace_period,
                         kubelet_client_cert=agent.node_cert, **merged)

    def _http_pools(self) -> list:
        return [self._http_pool] + self._pools

    def _tear_down_network(self) -> defer.Deferred:
        """Kill whatever still runs in the topology's namespaces and remove them (the
        bridges go with the switch's namespace)."""
        return self.topology.close()

    # -- how the test reaches the agents and etcd --------------------------------------

    def http_for(self, agent: AgentProcess) -> treq.client.HTTPClient:
        return self._http_on(agent.node)

    def _admin_tls(self) -> Optional[Callable[[str], IOpenSSLClientConnectionCreator]]:
        """With identities: TLS as the pool's admin (``system:masters``), whom the
        coordinator lets read everything, for the test's own reads."""
        if self.ca is None:
            return None
        with open(self.ca.ca_file, "rb") as f:
            authority = ssl.Certificate.loadPEM(f.read())
        with open(self._admin.cert_file, "rb") as f:
            cert = f.read()
        with open(self._admin.key_file, "rb") as f:
            client = ssl.PrivateCertificate.loadPEM(cert + f.read())
        return lambda host: ssl.optionsForClientTLS(host, trustRoot=authority,
                                                    clientCertificate=client)

    def _http_on(self, host: str) -> treq.client.HTTPClient:
        """An HTTP client whose connections start inside ``host``'s namespace."""
        client = self._clients.get(host)
        if client is None:
            pool = HTTPConnectionPool(self.reactor, persistent=False)
            self._pools.append(pool)
            endpoints = _EndpointsOnHost(self.hosts[host].reactor, self._admin_tls())
            client = treq.client.HTTPClient(
                HTTPAgent.usingEndpointFactory(self.reactor, endpoints, pool=pool))
            self._clients[host] = client
        return client

    @defer.inlineCallbacks
    def served_object(self, gvr: GroupVersionResource, name: str,
                      namespace: Optional[str] = None,
                      ) -> Generator[defer.Deferred[Any], Any, Optional[Dict[str, Any]]]:
        """The coordinator's object as its apiserver answers a GET of it (None on 404),
        asked from the coordinator host, which no cut separates from its server."""
        url = f"{self.servers()[1].url}{gvr.object_path(name, namespace)}"
        response = yield self._http_on(COORDINATOR_HOST).get(url, timeout=PAGE_TIMEOUT)
        body = yield response.content()
        if response.code == 404:
            return None
        if response.code != 200:
            raise AssertionError(f"GET {url} answered {response.code}: {body[:200]!r}")
        return json.loads(body)

    def etcdctl_reactor(self) -> Any:

        return self.hosts[ETCD_HOST].reactor

    # -- cuts --------------------------------------------------------------------------

    def cut(self, host: str, network: str, direction: str = "both") -> None:
        self.topology.cut(host, network, direction)

    def heal(self, host: str, network: str) -> None:
        self.topology.heal(host, network)

    def agent_nodes(self) -> List[str]:
        return list(self.agents)
