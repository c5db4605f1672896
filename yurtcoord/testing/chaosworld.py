"""A pool on real test networks with a pool etcd of three members and two coordinator
apiservers, each on a host of its own: the world of a chaos run.

``ChaosWorld`` is a ``PartitionWorld`` (the cloud on the WAN, every agent a ``twistd``
process on a host of its own with a WAN and a LAN link, link cuts with
``cut``/``heal``/``topology.flap``) whose pool side is as a production pool's:

- the pool etcd is a cluster of three members (``etcd_cluster``, of a version that
  keeps acknowledged writes through SIGKILL), ``etcd-1`` to ``etcd-3``, each in its
  own namespace, listening on its LAN address and its own
  loopback; ``kill_etcd(i)`` SIGKILLs member i and ``restart_etcd(i)`` starts it again
  in its namespace on its data;
- the coordinator apiservers are two processes of their own (``CoordinatorProcess``,
  SIGKILLed with ``kill_coordinator(i)`` and started again on their port with
  ``restart_coordinator(i)``) on the hosts ``coord`` and ``coord-2``, each given every
  etcd member (starting with a different one), keeping their objects in the pool etcd;
  each writes its request log to a file, read back with ``coordinator_request_log()``;
- every agent is given every etcd member and both coordinator apiservers.

The world's own reader of the coordinator's objects (``served_object``) is an
in-process apiserver over the same etcd on the ``coord`` host's loopback, which no
fault touches. Plain http everywhere: the chaos run is about faults, the identities
are the partition suite's.

Addresses, beside ``partitionworld``'s: etcd member N (1-3) 198.19.0.(2+N), the second
coordinator apiserver 198.19.0.8.
"""

import os
from typing import Any, Dict, Generator, List, Mapping, Optional

from twisted.internet import defer
from twisted.internet.threads import deferToThread

from yurtcoord.sim.agentini import merge_sections
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.requestlog import LoggedRequest
from yurtcoord.sim.etcd import (
    EtcdBinary, EtcdCluster, EtcdProcess, etcd_binary_for, kill_safe_etcd_version,
)
from yurtcoord.sim.sandboxetcd import rotated
from yurtcoord.testing.netns import entered
from yurtcoord.testing.partitionworld import (
    API_PORT, CLOUD_ADDRESS, CLOUD_HOST, COORDINATOR_ADDRESS, COORDINATOR_HOST,
    ETCD_CLIENT_PORT, LAN, STATUS_PORT, WAN, PartitionWorld,
)
from yurtcoord.testing.world import (
    KUBELET_GRACE_PERIOD, STORAGE_PREFIX, AgentProcess, CoordinatorProcess, agent_ini,
)

ETCD_HOSTS = ("etcd-1", "etcd-2", "etcd-3")
ETCD_ADDRESSES = ("198.19.0.3", "198.19.0.4", "198.19.0.5")
ETCD_PEER_PORT = 2380
COORDINATOR_HOSTS = (COORDINATOR_HOST, "coord-2")
COORDINATOR_ADDRESSES = (COORDINATOR_ADDRESS, "198.19.0.8")
# The in-process reader of the coordinator's objects, on the coord host's loopback.
READER_PORT = 6444


class ChaosWorld(PartitionWorld):
    """See the module docstring; ``start()``/``stop()`` as ``PartitionWorld``'s."""

    def __init__(self, reactor: Any, name: str, etcd_binary: Optional[EtcdBinary] = None,
                 kubelet_grace_period: str = KUBELET_GRACE_PERIOD,
                 timings: Optional[Dict[str, Dict[str, str]]] = None) -> None:
        # Members are SIGKILLed and restarted: a version that keeps every write it
        # acknowledged through that (not etcd 3.5.0 to 3.5.2).
        etcd_binary = etcd_binary or etcd_binary_for(kill_safe_etcd_version())
        super().__init__(reactor, name, etcd_binary, kubelet_grace_period, timings,
                         coordinator_in_etcd=True, identities=False)
        binary = self.etcd.binary
        # The single member PartitionWorld made is not used: its temp dir goes now.
        self.etcd.stop()
        initial = ",".join(f"member-{index}=http://{address}:{ETCD_PEER_PORT}"
                           for index, address in enumerate(ETCD_ADDRESSES))
        members = []
        for index, address in enumerate(ETCD_ADDRESSES):
            member = EtcdProcess(binary, name=f"member-{index}", host=address,
                                 base_dir=os.path.join(self.base_dir, ETCD_HOSTS[index]),
                                 initial_cluster=initial)
            member.client_port, member.peer_port = ETCD_CLIENT_PORT, ETCD_PEER_PORT
            members.append(member)
        cluster = EtcdCluster(binary, size=len(members))
        cluster.members = members
        self.etcd_cluster = cluster
        # ProcessWorld stops ``etcd`` as well as the cluster: the first member, twice.
        self.etcd = members[0]

    # -- lifecycle ---------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self) -> Generator[defer.Deferred[Any], Any, None]:
        self.hosts[CLOUD_HOST] = self.topology.add_host(CLOUD_HOST, {WAN: CLOUD_ADDRESS})
        for host, address in zip(COORDINATOR_HOSTS, COORDINATOR_ADDRESSES):
            self.hosts[host] = self.topology.add_host(host, {LAN: address})
        for host, address in zip(ETCD_HOSTS, ETCD_ADDRESSES):
            self.hosts[host] = self.topology.add_host(host, {LAN: address})
        self.cloud = KubeAPIServer(self.hosts[CLOUD_HOST].reactor)
        reader_reactor = self.hosts[COORDINATOR_HOST].reactor
        self.coordinator = self._coordinator_server(
            self.coordinator_storage(reader_reactor), reader_reactor)
        yield deferToThread(self._start_etcd)
        yield self.cloud.start(API_PORT, CLOUD_ADDRESS)
        yield self.coordinator.start(READER_PORT, "127.0.0.1")
        for index, (host, address) in enumerate(zip(COORDINATOR_HOSTS, COORDINATOR_ADDRESSES)):
            args = ["--etcd", ",".join(rotated(self.etcd_urls(), index)),
                    "--etcd-prefix", STORAGE_PREFIX, "--interface", address,
                    "--port", str(API_PORT)]
            self.coordinator_processes.append(CoordinatorProcess(
                self.hosts[host].reactor, os.path.join(self.base_dir, f"coordinator-{index}"),
                args))
        yield defer.gatherResults([process.start() for process in self.coordinator_processes])

    def _start_etcd(self) -> None:
        """Spawn every member in its namespace (a member is healthy only once a quorum
        runs, so all are spawned before any is waited for), then wait for each on its
        own loopback."""
        members = self.etcd_members()
        for host, member in zip(ETCD_HOSTS, members):
            with entered(self.hosts[host].netns):
                member._spawn()
        for host, member in zip(ETCD_HOSTS, members):
            with entered(self.hosts[host].netns):
                member.wait_ready()

    def restart_etcd(self, member: Optional[int] = None) -> defer.Deferred[EtcdProcess]:
        """Start member ``member`` again in its namespace, on its data and ports; fires
        once it is healthy."""
        index = self._member_index(member)

        def restart() -> EtcdProcess:
            with entered(self.hosts[ETCD_HOSTS[index]].netns):
                return self.etcd_members()[index].restart()
        return deferToThread(restart)

    # -- how agents are configured, and how the test reads the pool --------------------

    def ini_for(self, agent: AgentProcess, **sections: Mapping[str, object]) -> str:
        merged = merge_sections(self.timings, sections)
        return agent_ini(agent.node, [f"http://{CLOUD_ADDRESS}:{API_PORT}"],
                         ", ".join(str(url) for url in self.coordinator_urls()),
                         ", ".join(self.etcd_urls()), agent.pki_dir, agent.cache_dir,
                         f"127.0.0.1:{STATUS_PORT}",
                         kubelet_url=agent.stand_in_kubelet().url(),
                         kubelet_grace_period=self.kubelet_grace_period,
                         kubelet_client_cert=None, **merged)

    def etcdctl_reactor(self) -> Any:
        """The host of the member ``etcdctl`` reads from (on that host's loopback)."""
        return self.hosts[ETCD_HOSTS[self.etcd_members().index(self.etcd_reader())]].reactor

    def coordinator_request_log(self) -> List[LoggedRequest]:
        """Every answer of both coordinator apiservers, over all their runs, in time
        order (one machine's wall clock, as the cloud's reactor)."""
        records: List[LoggedRequest] = []
        for process in self.coordinator_processes:
            records += process.requests()
        return sorted(records, key=lambda record: record.at)
