"""A pool whose agents run as separate ``twistd -n yurtcoord`` processes, for fault tests.

``ProcessWorld`` owns one real etcd (``EtcdProcess``; with ``etcd_members=3`` an
``EtcdCluster`` of three members, all given to every agent), a cloud and a coordinator
Kubernetes API test server served from the test's own reactor (so that their fault
knobs are plain method calls; with ``coordinator_servers=2`` two coordinator
apiservers serving one storage, both given to every agent), and any number of agents,
each a child process with
its own ini file, status port, local cache dir, pki dir and log file in the world's
temp dir. Every agent reaches the cloud through a ``TCPProxy`` of its own, so the
cloud can be cut for one agent or for all, and has a stand-in kubelet of its own served
from the test's reactor (``stop_kubelet`` / ``start_kubelet``), so one node's kubelet
can die and come back. Each agent also exists in the cloud as a Node labelled with the
world's pool, as a real pool member does.

The coordinator apiservers keep their objects in the pool etcd, under the agents'
``[coordinator] storage_prefix``, as a pool's coordinator apiserver does: the leases
the agents write through them are keys of that etcd, and what the leader mirrors and
each agent uploads straight into etcd is what they serve (so an etcd outage is also
an outage of every coordinator apiserver). Their objects are read with the Deferred
helpers ``coordinator_object``, ``coordinator_lease``, ``election_lease``,
``election_holder``, ``coordinator_node_lease`` and ``coordinator_delegate_annotation``
(the cloud stays in memory: ``cloud.store`` is synchronous). ``coordinator_in_etcd=False``
keeps the coordinator's objects in memory, apart from the pool etcd.
``start_coordinator_processes(count)`` runs that many coordinator apiservers over the
pool etcd as processes of their own instead (``CoordinatorProcess``), given to agents
started afterwards, so that one can be SIGKILLed (``kill_coordinator``) and started
again (``restart_coordinator``) as a kube-apiserver of the pool is.

It also judges the outcome: ``statuses()`` reads every live agent's ``/status``, and
``pool_problems()`` compares the pool etcd (read with ``etcdctl``, an independent
client) with the cloud's pool-scoped objects and with what the agents' local caches
hold: an object missing, left over, or with a lower resourceVersion than its source is
a problem. Blocking etcd steps (start, kill, restart) run in a thread so that the
in-process apiservers keep answering the agents meanwhile.

This is the pool world for faults that need an agent to be a process of its own (it is
killed, sent SIGTERM, or fails apart from the test's reactor); ``inprocess.PoolWorld``
builds the agents in the test process instead, for tests that reach into them. The two
share the ini text (``sim.agentini``), the reader of the agents' pages
(``agentpages``), ``add_pool_node``, ``read_node_lease``, ``read_delegate_annotation``
and ``write_cached_pod``.

Longer than 600 lines on purpose: ``ProcessWorld``, most of it, is one pool of
processes with the servers they talk to, built, faulted and torn down as one; the
helpers before it are the few its suites share with it.
"""

import base64
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Generator, Iterable, Mapping, Sequence

import treq.client
from twisted.internet import defer, error, protocol
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.failure import Failure
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube.gvr import ENDPOINTS, LEASES, NODES, SECRETS, GroupVersionResource
from yurtcoord.names import (
    DELEGATE_HEARTBEAT_ANNOTATION, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE,
    NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.agent.config import parse_duration
from yurtcoord.sim.agentini import FAULT_SUITE, loopback_agent_ini
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.authz import PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.etcdstorage import EtcdStorage
from yurtcoord.sim.apiserver.requestlog import LoggedRequest, read_request_log
from yurtcoord.sim.etcd import EtcdBinary, EtcdCluster, EtcdProcess, preferred_etcd_binary, tail
from yurtcoord.sim.pki import TestCA
from yurtcoord.sim.kubelet import StandInKubelet
from yurtcoord.sim.sandboxetcd import rotated
from yurtcoord.testing.agentpages import Statuses, StatusReader, wait_for_statuses
from yurtcoord.testing.certsecrets import Bundle, secret
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.sim.tcpproxy import TCPProxy
from yurtcoord.testing.twistd import TWISTD, child_environment
from yurtcoord.testing.skew import skewed_clock_environment

POOL = "pool-a"
ELECTION_NAMESPACE, ELECTION_LEASE = ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME
STORAGE_PREFIX = "/registry"
MIRROR_RV_PREFIX = "/mirror/rv"
ENDPOINTS_PREFIX = f"{STORAGE_PREFIX}/services/endpoints/"
PODS_PREFIX = f"{STORAGE_PREFIX}/pods/"
LISTENING_MARK = "status pages listening on "
# How much of what an agent logs after its start is searched for LISTENING_MARK: the
# mark comes within its first lines.
LISTENING_SEARCH_BYTES = 256 * 1024
# Seconds an agent gets to exit after SIGTERM before it is killed.
STOP_DEADLINE = 15.0
# Seconds an agent gets from spawn to listening on its status port.
START_DEADLINE = 30.0
# Seconds one read of an agent's page may take.
PAGE_TIMEOUT = 5.0

# The fault suite's timings (ini sections, see ``FAULT_SUITE``) and, in seconds, the
# ones its tests compute bounds from.
TIMINGS = FAULT_SUITE
LEASE_DURATION = parse_duration(str(TIMINGS["leader_election"]["lease_duration"]))
RETRY_PERIOD = parse_duration(str(TIMINGS["leader_election"]["retry_period"]))
HEARTBEAT_INTERVAL = parse_duration(str(TIMINGS["heartbeat"]["interval"]))
HEARTBEAT_TIMEOUT = parse_duration(str(TIMINGS["heartbeat"]["timeout"]))
FAILED_RETRY = int(str(TIMINGS["heartbeat"]["failed_retry"]))
KUBELET_GRACE_PERIOD = str(TIMINGS["heartbeat"]["kubelet_grace_period"])


def agent_ini(node: str, cloud_url: str | Iterable[str], coordinator_url: str, etcd_url: str,
              pki_dir: str, cache_dir: str, listen: str, kubelet_url: str = "off",
              kubelet_grace_period: str = KUBELET_GRACE_PERIOD,
              kubelet_client_cert: str | None = None,
              **sections: Mapping[str, object]) -> str:
    """Ini text of one agent of the fault suite: plain http everywhere, the suite's
    timings (``FAULT_SUITE``); the kubelet check asks ``kubelet_url`` (off by default).
    With ``kubelet_client_cert`` (the node's own certificate) the coordinator
    apiservers and etcd are reached over TLS, as that node.

    ``cloud_url`` is one URL or a list of them; ``sections`` are merged over the
    suite's, key by key (``coordinator={"enabled": "false"}``)."""
    cloud_urls = [cloud_url] if isinstance(cloud_url, str) else list(cloud_url)
    identity: dict[str, dict[str, object]] = {}
    if kubelet_client_cert is not None:
        identity = {"node": {"kubelet_client_cert": kubelet_client_cert},
                    "coordinator": {"insecure": "false"}}
    return loopback_agent_ini(
        node, POOL, cloud_urls, coordinator_url, etcd_url, pki_dir, cache_dir, FAULT_SUITE,
        {"heartbeat": {"kubelet_healthz_url": kubelet_url,
                       "kubelet_grace_period": kubelet_grace_period},
         "server": {"listen": listen}},
        identity, **sections)


def cached_pod(name: str, resource_version: int | str, namespace: str = "default",
               padding: int = 0) -> dict[str, Any]:
    """A pod as yurthub caches it; ``padding`` bytes of annotation make it bigger."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                "resourceVersion": str(resource_version)}
    if padding:
        metadata["annotations"] = {"example.com/padding": "x" * padding}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"nodeName": "edge"}}


def write_cache_file(cache_dir: str, namespace: str, name: str, data: bytes) -> None:
    """Any bytes as the cached pod ``namespace/name`` of a node's yurthub disk cache
    (``kubelet/pods.v1.core/<ns>/<name>``): also the way to plant bad entries."""
    directory = os.path.join(cache_dir, "kubelet", "pods.v1.core", namespace)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def write_cached_pod(cache_dir: str, name: str, resource_version: int | str,
                     namespace: str = "default", padding: int = 0) -> None:
    """A good pod (``cached_pod``) in a node's yurthub disk cache."""
    pod = cached_pod(name, resource_version, namespace, padding)
    write_cache_file(cache_dir, namespace, name, json.dumps(pod).encode("utf-8"))


def pool_node(name: str, pool: str = POOL) -> dict:
    """A cloud Node of ``pool``: the leader forwards heartbeats only of such Nodes."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {NODE_POOL_LABEL: pool,
                                                   "kubernetes.io/hostname": name}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def add_pool_node(cloud: KubeAPIServer, name: str, pool: str = POOL) -> None:
    """Create the Node ``name`` of ``pool`` in the cloud API test server unless it exists."""
    if cloud.store.get(NODES, name) is None:
        cloud.store.create(NODES, pool_node(name, pool))


def read_node_lease(server: KubeAPIServer, node: str) -> dict[str, Any] | None:
    """``node``'s lease in ``kube-node-lease`` on ``server`` (the cloud or the
    coordinator apiserver), None when there is none."""
    return server.store.get(LEASES, node, NODE_LEASE_NAMESPACE)


def read_delegate_annotation(server: KubeAPIServer, node: str) -> str | None:
    """The delegate-heartbeat annotation of ``node``'s lease on ``server`` (``"true"``
    while the node asks the pool leader to forward it), None without lease or annotation."""
    lease = read_node_lease(server, node) or {}
    return (lease.get("metadata", {}).get("annotations") or {}).get(
        DELEGATE_HEARTBEAT_ANNOTATION)


def endpoints(name: str, ip: str, namespace: str = "default") -> dict[str, Any]:
    """Cloud Endpoints ``name`` with one address ``ip`` on port 80."""
    return {"metadata": {"name": name, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 80}]}]}


class _ChildProtocol(protocol.ProcessProtocol):
    """Notices the child's exit; its output goes straight to the log file."""

    def __init__(self) -> None:
        self.ended: defer.Deferred[int | None] = defer.Deferred()
        self.exit_code: int | None = None
        self.signal: int | None = None

    def processEnded(self, reason: Failure) -> None:
        if isinstance(reason.value, (error.ProcessDone, error.ProcessTerminated)):
            self.exit_code = reason.value.exitCode
            self.signal = getattr(reason.value, "signal", None)
        self.ended.callback(self.exit_code)

    def send(self, name: str) -> None:
        """Send ``"KILL"``, ``"TERM"``... to the child if it still runs."""
        if self.transport is not None and not self.ended.called:
            self.transport.signalProcess(name)

    @defer.inlineCallbacks
    def terminate(self, reactor: Any) -> Generator[defer.Deferred[Any], Any, None]:
        """SIGTERM, then SIGKILL if it has not exited within ``STOP_DEADLINE``."""
        if self.ended.called:
            return
        self.send("TERM")
        timer = reactor.callLater(STOP_DEADLINE, self.send, "KILL")
        yield self.ended
        if timer.active():
            timer.cancel()


class AgentProcess:
    """One agent as a ``twistd -n yurtcoord --config <ini>`` child process.

    Its directory holds ``yurtcoord.ini``, ``agent.log`` (stdout and stderr),
    ``cache/`` (the local yurthub cache it uploads) and ``pki/``. ``expected_pods``
    maps each pool etcd pod key written into its cache to the resourceVersion it has.
    ``kubelet`` is its stand-in kubelet (None when the agent checks none).
    """

    def __init__(self, reactor: Any, node: str, directory: str, cloud_proxies: Iterable[TCPProxy],
                 etcd_proxy: TCPProxy | None = None, kubelet: StandInKubelet | None = None,
                 spawn: Callable[..., object] | None = None, clock_offset: float = 0.0,
                 ) -> None:
        self.reactor = reactor
        # How the child is spawned: ``spawn(protocol, argv, env, path, childFDs)``; by
        # default ``reactor.spawnProcess`` (a world on test networks spawns it inside
        # the agent's network namespace).
        self._spawn = spawn or self._spawn_here
        self.node = node
        self.directory = directory
        # One proxy per cloud URL of the agent, all in front of the one cloud.
        self.cloud_proxies = list(cloud_proxies)
        self.cloud_proxy = self.cloud_proxies[0] if self.cloud_proxies else None
        # A TCPProxy between this agent and the pool etcd, when one was asked for.
        self.etcd_proxy = etcd_proxy
        self.kubelet = kubelet
        self.cache_dir = os.path.join(directory, "cache")
        self.pki_dir = os.path.join(directory, "pki")
        # The node's own certificate and key (the kubelet's), in a world with
        # identities; None: the agent reaches its coordinator over plain http.
        self.node_cert: str | None = None
        self.ini_path = os.path.join(directory, "yurtcoord.ini")
        self.log_path = os.path.join(directory, "agent.log")
        self.expected_pods: dict[str, int] = {}
        # Seconds the agent's wall clock is off (libfaketime, ``testing/skew.py``), as
        # an edge node's that lost NTP; 0: its clock is true.
        self.clock_offset = clock_offset
        self.url: str | None = None
        # Where in agent.log the agent's latest start began.
        self._log_offset = 0
        self._child: _ChildProtocol | None = None
        os.makedirs(self.cache_dir, exist_ok=True)

    # -- the local cache ---------------------------------------------------------------

    def write_pod(self, name: str, resource_version: int, namespace: str = "default",
                  padding: int = 0) -> None:
        """A good pod file in the cache (``kubelet/pods.v1.core/<ns>/<name>``)."""
        write_cached_pod(self.cache_dir, name, resource_version, namespace, padding)
        self.expected_pods[f"{PODS_PREFIX}{namespace}/{name}"] = int(resource_version)

    def write_cache_file(self, namespace: str, name: str, data: bytes) -> None:
        """Any bytes as a cache file: the way to plant bad entries."""
        write_cache_file(self.cache_dir, namespace, name, data)

    def write_pods(self, count: int, prefix: str | None = None, first_rv: int = 10,
                   padding: int = 0) -> None:
        prefix = prefix or f"{self.node}-pod"
        for index in range(count):
            self.write_pod(f"{prefix}-{index}", first_rv + index, padding=padding)

    # -- the process -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._child is not None and not self._child.ended.called

    @property
    def exit_code(self) -> int | None:
        return None if self._child is None else self._child.exit_code

    @property
    def exit_signal(self) -> int | None:
        """The number of the signal that ended the agent, if one did."""
        return None if self._child is None else self._child.signal

    @property
    def ended(self) -> defer.Deferred[int | None]:
        if self._child is None:
            raise RuntimeError(f"agent {self.node} was never started")
        return self._child.ended

    def rss_kib(self) -> int:
        """The running agent's resident memory now (``VmRSS`` of its process), KiB."""
        transport = None if self._child is None else self._child.transport
        pid = getattr(transport, "pid", None)
        if pid is None:
            raise RuntimeError(f"agent {self.node} is not running")
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise LookupError(f"no VmRSS for agent {self.node} (pid {pid})")

    def start(self, ini_text: str) -> None:
        """Spawn the agent with ``ini_text``; also again after it ended (its status
        URL is then read anew from what it logs from now on)."""
        with open(self.ini_path, "w", encoding="utf-8") as f:
            f.write(ini_text)
        self.url = None
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        self._child = _ChildProtocol()
        with open(self.log_path, "ab") as log, open(os.devnull, "rb") as null:
            self._spawn(
                self._child,
                [TWISTD, "--nodaemon", "--pidfile=", "yurtcoord", "--config", self.ini_path],
                {**child_environment(without_etcd=True),
                 **(skewed_clock_environment(self.clock_offset) if self.clock_offset else {})},
                self.directory,
                {0: null.fileno(), 1: log.fileno(), 2: log.fileno()})

    def _spawn_here(self, child: protocol.ProcessProtocol, argv: list[str], env: dict[str, str],
                    path: str, child_fds: dict[int, int]) -> None:
        self.reactor.spawnProcess(child, argv[0], argv, env=env, path=path,
                                  childFDs=child_fds)

    def _listening_url(self) -> str | None:
        if self.url is None:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                started = log.read(LISTENING_SEARCH_BYTES).decode("utf-8", "replace")
            for line in started.splitlines():
                if LISTENING_MARK in line:
                    self.url = line.split(LISTENING_MARK, 1)[1].split()[0]
                    break
        return self.url

    @defer.inlineCallbacks
    def wait_listening(self, timeout: float = START_DEADLINE,
                       ) -> Generator[defer.Deferred[Any], Any, str]:
        """Fire with the status URL once the agent logged it is listening."""
        try:
            yield poll_until(lambda: self._listening_url() or not self.running, timeout,
                             0.05, self.reactor, what=f"{self.node} listening")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{self.log_tail()}") from None
        if self.url is None:
            raise AssertionError(f"{self.node} exited with {self.exit_code} before "
                                 f"listening\n{self.log_tail()}")
        return self.url

    def signal(self, name: str) -> None:
        """Send ``"KILL"``, ``"TERM"``... to the agent if it still runs."""
        if self._child is not None:
            self._child.send(name)

    def stop(self) -> defer.Deferred[None]:
        """SIGTERM, then SIGKILL if it has not exited within ``STOP_DEADLINE``."""
        if self._child is None:
            return defer.succeed(None)
        return self._child.terminate(self.reactor)

    def stand_in_kubelet(self) -> StandInKubelet:
        """The agent's stand-in kubelet (every agent of a world has one)."""
        if self.kubelet is None:
            raise RuntimeError(f"agent {self.node} has no stand-in kubelet")
        return self.kubelet

    def log_tail(self, lines: int = 30) -> str:

        return f"--- {self.node} ({self.log_path}), last {lines} lines:\n" + tail(
            self.log_path, lines)

    def log_text(self) -> str:
        return tail(self.log_path, 10 ** 7)


class CoordinatorProcess:
    """A coordinator apiserver as a process of its own: ``python -m
    yurtcoord.sim.apiserver --etcd <members>``, keeping its objects in the pool etcd,
    so that a fault can SIGKILL it as a crashed kube-apiserver dies (its port, its
    connections, its watches and its etcd requests in flight end with it) and start it
    again on the same port.

    Its directory holds ``apiserver.log`` (its output, one URL line per start) and
    ``requests.jsonl``, the record of every answer it sent (``requests()``).
    """

    def __init__(self, reactor: Any, directory: str, etcd_args: Iterable[str]) -> None:
        self.reactor = reactor
        self.directory = directory
        self._etcd_args = list(etcd_args)
        self.log_path = os.path.join(directory, "apiserver.log")
        self.request_log_path = os.path.join(directory, "requests.jsonl")
        # Known once it listened: a restart listens on the same port again.
        self.port_number: int | None = None
        self.url: str | None = None
        # Where in agent.log the agent's latest start began.
        self._log_offset = 0
        self._child: _ChildProtocol | None = None
        os.makedirs(directory, exist_ok=True)

    @property
    def running(self) -> bool:
        return self._child is not None and not self._child.ended.called

    @property
    def exit_signal(self) -> int | None:
        """The number of the signal that ended its last run, if one did."""
        return None if self._child is None else self._child.signal

    @defer.inlineCallbacks
    def start(self) -> Generator[defer.Deferred[Any], Any, str]:
        """Spawn it (on its former port once it had one); fire with its URL once it
        listens."""
        if self.running:
            raise RuntimeError(f"coordinator apiserver {self.url} already runs")
        with open(self.log_path, "ab") as log, open(os.devnull, "rb") as null:
            offset = log.tell()
            self._child = _ChildProtocol()
            argv = [sys.executable, "-m", "yurtcoord.sim.apiserver",
                    "--port", str(self.port_number or 0),
                    "--request-log", self.request_log_path, *self._etcd_args]
            self.reactor.spawnProcess(self._child, argv[0], argv,
                                      env=child_environment(without_etcd=True),
                                      path=self.directory,
                                      childFDs={0: null.fileno(), 1: log.fileno(),
                                                2: log.fileno()})
        seen: dict[str, str] = {}

        def listening() -> bool:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                for line in log.read().decode("utf-8", "replace").splitlines():
                    if line.startswith(("http://", "https://")):
                        seen["url"] = line.strip()
            return "url" in seen or not self.running

        try:
            yield poll_until(listening, START_DEADLINE, 0.05, self.reactor,
                             what=f"coordinator apiserver in {self.directory} listening")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{self.log_tail()}") from None
        if "url" not in seen:
            raise AssertionError(f"coordinator apiserver exited before listening\n"
                                 f"{self.log_tail()}")
        self.url = seen["url"]
        self.port_number = int(self.url.rsplit(":", 1)[1])
        return self.url

    @defer.inlineCallbacks
    def kill(self) -> Generator[defer.Deferred[Any], Any, None]:
        """SIGKILL it; fire once it is gone."""
        if self._child is None or not self.running:
            raise RuntimeError(f"coordinator apiserver {self.url} does not run")
        self._child.send("KILL")
        yield self._child.ended

    def stop(self) -> defer.Deferred[None]:
        """SIGTERM, then SIGKILL if it has not exited within ``STOP_DEADLINE``."""
        if self._child is None:
            return defer.succeed(None)
        return self._child.terminate(self.reactor)

    def requests(self) -> list[LoggedRequest]:
        """Every answer it sent in full, over all its runs, in order."""
        if not os.path.exists(self.request_log_path):
            return []
        return read_request_log(self.request_log_path)

    def log_tail(self, lines: int = 30) -> str:
        return (f"--- coordinator apiserver {self.url} ({self.log_path}), last {lines} "
                f"lines:\n" + tail(self.log_path, lines))


class ProcessWorld:
    """Etcd, cloud and coordinator apiservers, and agent processes; see the module doc.

    ``start()`` and ``stop()`` bracket it; ``stop()`` kills every agent, closes the
    servers, proxies and stand-in kubelets, stops etcd and removes the temp dir, and is
    safe to call twice. ``kubelet_grace_period`` is the agents' ini value;
    ``coordinator_servers`` the number of coordinator apiservers (``coordinators``,
    the first of them also ``coordinator``), all serving the first one's storage: the
    pool etcd, or with ``coordinator_in_etcd=False`` an in-memory store.
    ``etcd_members`` above 1 runs the pool etcd as an ``EtcdCluster`` of that size
    (``etcd_cluster``; see "The pool etcd as a cluster" below).

    With ``identities`` the pool runs as a production pool does: one test CA
    (``ca``) for the coordinator apiservers and the pool etcd, both serving TLS and
    requiring client certificates; the coordinator apiservers authorize as the Node
    authorizer and NodeRestriction do (``PoolCoordinatorAuthorizer``: a node writes
    only its own node lease); the cloud holds the certs Secret; and each agent has its
    node's own certificate (``AgentProcess.node_cert``), its identity there.
    """

    # The coordinator apiservers after the first (none in a world that makes its
    # servers in start()).
    _more_coordinators: tuple[KubeAPIServer, ...] = ()
    # The pool etcd cluster of a world of several members (None: ``etcd`` alone).
    etcd_cluster: EtcdCluster | None = None
    # Whether the coordinator apiservers keep their objects in the pool etcd.
    coordinator_in_etcd = False

    def __init__(self, reactor: Any, etcd_binary: EtcdBinary | None = None,
                 kubelet_grace_period: str = KUBELET_GRACE_PERIOD,
                 coordinator_servers: int = 1, etcd_members: int = 1,
                 coordinator_in_etcd: bool = True, identities: bool = False) -> None:
        self.reactor = reactor
        self.kubelet_grace_period = kubelet_grace_period
        self.base_dir = tempfile.mkdtemp(prefix="yurtcoord-world-")
        binary = etcd_binary or preferred_etcd_binary()
        self.ca: TestCA | None = None
        if identities:
            self.ca = TestCA(os.path.join(self.base_dir, "ca"))
            self.ca.server_pair("server")
        self.etcd = EtcdProcess(binary, tls_ca=self.ca)
        self.etcd_cluster = (EtcdCluster(binary, size=etcd_members, tls_ca=self.ca)
                             if etcd_members > 1 else None)
        self.coordinator_in_etcd = coordinator_in_etcd
        # None only in a world whose servers are made by start() (see PartitionWorld).
        self.cloud: KubeAPIServer | None = KubeAPIServer(reactor)
        self.coordinator: KubeAPIServer | None = self._coordinator_server(
            self.coordinator_storage())
        self._more_coordinators = tuple(self._coordinator_server(self.coordinator.storage)
                                        for _ in range(coordinator_servers - 1))
        # Coordinator apiservers run as processes of their own, once started (see
        # ``start_coordinator_processes``).
        self.coordinator_processes: list[CoordinatorProcess] = []
        self.agents: dict[str, AgentProcess] = {}
        self._proxies: list[TCPProxy] = []
        self._kubelets: list[StandInKubelet] = []
        self._http_pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = treq.client.HTTPClient(
            HTTPAgent(reactor, pool=self._http_pool, connectTimeout=2))
        self._stopped = False

    def _coordinator_server(self, storage: Any, reactor: Any = None) -> KubeAPIServer:
        """One coordinator apiserver over ``storage`` (on ``reactor``, the world's by
        default): plain http, or with ``identities`` TLS with client certificates and
        the pool's authorization."""
        on = self.reactor if reactor is None else reactor
        if self.ca is None:
            return KubeAPIServer(on, storage=storage)
        return KubeAPIServer(on, storage=storage, tls_dir=self.ca.directory,
                             authorizer=PoolCoordinatorAuthorizer())

    def _publish_certificates(self, cloud: KubeAPIServer) -> None:
        """With ``identities``: the pool's certificates in the cloud, as the cloud
        keeps them for its agents (the certs Secret)."""
        if self.ca is not None:
            cloud.store.create(SECRETS, secret(Bundle(self.ca, "pool").data()))

    def _give_identity(self, agent: "AgentProcess") -> None:
        """With ``identities``: the node's own certificate and key, where the kubelet
        keeps them, for ``agent``'s ``[node] kubelet_client_cert``."""
        if self.ca is not None:
            agent.node_cert = self.ca.node_client_pem(
                agent.node, os.path.join(agent.directory, "kubelet-client-current.pem"))

    def servers(self) -> tuple[KubeAPIServer, KubeAPIServer]:
        """The cloud and the coordinator apiserver."""
        if self.cloud is None or self.coordinator is None:
            raise RuntimeError("the world's apiservers are made by start()")
        return self.cloud, self.coordinator

    @property
    def coordinators(self) -> list[KubeAPIServer]:
        """Every coordinator apiserver, in the order agents are given them."""
        return [self.servers()[1], *self._more_coordinators]

    # -- the coordinator apiservers' storage -------------------------------------------

    def coordinator_storage(self, reactor: Any = None) -> EtcdStorage | None:
        """A new storage for a coordinator apiserver: the pool etcd under the agents'
        storage prefix (None, the in-memory default, with ``coordinator_in_etcd``
        false). Its etcd client is made at first use, from ``coordinator_etcd_config``,
        so that the members' ports are known by then, and connects through ``reactor``
        (the world's by default; the coordinator host's on test networks, so that it
        reaches etcd over the pool's own links)."""
        if not self.coordinator_in_etcd:
            return None
        on = self.reactor if reactor is None else reactor
        return EtcdStorage(lambda: EtcdClient(on, self.coordinator_etcd_config()), on,
                           prefix=STORAGE_PREFIX)

    def coordinator_etcd_config(self) -> EtcdConfig:
        """How the coordinator apiservers reach the pool etcd: every member the agents
        use, with the members' client certificate when etcd serves TLS."""
        first, *more = self.etcd_urls()
        member = self.etcd_members()[0]
        if member.tls_ca is None or member.client_cert is None:
            return EtcdConfig(first, more_urls=tuple(more))
        return EtcdConfig(first, more_urls=tuple(more), ca_file=member.tls_ca.ca_file,
                          cert_file=member.client_cert.cert_file,
                          key_file=member.client_cert.key_file)

    # -- lifecycle ---------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self) -> Generator[defer.Deferred[Any], Any, None]:
        yield deferToThread(self._etcd_service().start)
        cloud, coordinator = self.servers()
        yield cloud.start()
        self._publish_certificates(cloud)
        yield coordinator.start()
        for server in self._more_coordinators:
            yield server.start()

    @defer.inlineCallbacks
    def add_agent(self, node: str, pods: int = 0, cloud_urls: int = 1,
                  etcd_proxy: bool = False, clock_offset: float = 0.0, **pod_options: Any,
                  ) -> Generator[defer.Deferred[Any], Any, AgentProcess]:
        """Prepare an agent (dir, ``cloud_urls`` proxies in front of the cloud, running
        stand-in kubelet, its Node in the cloud, ``pods`` good pods in its cache, its
        clock ``clock_offset`` seconds off); not started.

        With ``etcd_proxy`` the agent reaches the pool etcd through its own TCPProxy
        (``agent.etcd_proxy``), so that its etcd link alone can be cut."""
        proxies = []
        cloud = self.servers()[0]
        cloud_port = cloud.port_number
        assert cloud_port is not None, "the cloud apiserver listens once started"
        for _ in range(cloud_urls):
            proxy = TCPProxy(self.reactor, "127.0.0.1", cloud_port)
            yield proxy.start()
            self._proxies.append(proxy)
            proxies.append(proxy)
        etcd = None
        if etcd_proxy:
            assert self.etcd_cluster is None, "an etcd proxy fronts a single etcd member"
            assert self.etcd.client_port is not None, "etcd listens once started"
            etcd = TCPProxy(self.reactor, "127.0.0.1", self.etcd.client_port)
            yield etcd.start()
            self._proxies.append(etcd)
        kubelet = StandInKubelet(self.reactor)
        kubelet.start()
        self._kubelets.append(kubelet)
        add_pool_node(cloud, node)
        agent = AgentProcess(self.reactor, node, os.path.join(self.base_dir, node), proxies,
                             etcd, kubelet, clock_offset=clock_offset)
        self._give_identity(agent)
        if pods:
            agent.write_pods(pods, **pod_options)
        self.agents[node] = agent
        return agent

    @defer.inlineCallbacks
    def run_pool(self, nodes: Sequence[str], timeout: float,
                 ) -> Generator[defer.Deferred[Any], Any, str | None]:
        """Add an agent for each of ``nodes`` and start them all; fire with the leader
        once one leads and every agent is ready (within ``timeout``)."""
        for node in nodes:
            yield self.add_agent(node)
        yield self.start_agents()
        statuses = yield self.wait_for_pool(
            f"one leader among {len(nodes)} agents, all following it, all ready",
            lambda s: one_leader_all_ready(s, len(nodes)), timeout)
        return leader_of(statuses)

    @defer.inlineCallbacks
    def start_agents(self, nodes: Iterable[str] | None = None, **sections: Mapping[str, object],
                     ) -> Generator[defer.Deferred[Any], Any, None]:
        """Spawn the agents (all prepared ones by default); fire once all listen.
        ``sections`` are merged over the suite's ini (see ``agent_ini``)."""
        chosen = [self.agents[n] for n in (nodes or list(self.agents))]
        for agent in chosen:
            agent.start(self.ini_for(agent, **sections))
        # Every wait runs to its end (listening, exit, or deadline) before a failure is
        # raised, so that no poll is left behind.
        results = yield defer.DeferredList([agent.wait_listening() for agent in chosen],
                                           consumeErrors=True)
        for succeeded, result in results:
            if not succeeded:
                result.raiseException()

    def ini_for(self, agent: AgentProcess, **sections: Mapping[str, object]) -> str:
        """The ini text ``start_agents`` runs ``agent`` with; ``sections`` are merged
        over the suite's (see ``agent_ini``)."""
        etcd_url = (", ".join(self.etcd_urls()) if agent.etcd_proxy is None
                    else agent.etcd_proxy.url(self.etcd.scheme))
        coordinator_urls = self.coordinator_urls()
        assert None not in coordinator_urls, "the coordinator apiservers listen once started"
        return agent_ini(agent.node, [p.url() for p in agent.cloud_proxies],
                         ", ".join(url for url in coordinator_urls if url), etcd_url, agent.pki_dir, agent.cache_dir,
                         "127.0.0.1:0", kubelet_url=agent.stand_in_kubelet().url(),
                         kubelet_grace_period=self.kubelet_grace_period,
                         kubelet_client_cert=agent.node_cert, **sections)

    @defer.inlineCallbacks
    def stop(self) -> Generator[defer.Deferred[Any], Any, None]:
        if self._stopped:
            return
        self._stopped = True
        try:
            yield defer.DeferredList([agent.stop() for agent in self.agents.values()])
            yield defer.DeferredList([p.stop() for p in self.coordinator_processes])
            for proxy in self._proxies:
                yield proxy.stop()
            # Also the kubelets of agents a test dropped from ``agents``.
            for kubelet in self._kubelets:
                yield kubelet.stop()
            for server in (self.cloud, self.coordinator, *self._more_coordinators):
                if server is not None:  # a world whose start failed early
                    yield server.stop()
            for pool in self._http_pools():
                yield pool.closeCachedConnections()
        finally:
            # The single member's temp dir exists in a world of a cluster too.
            yield deferToThread(self.etcd.stop)
            if self.etcd_cluster is not None:
                yield deferToThread(self.etcd_cluster.stop)
            yield self._tear_down_network()
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _http_pools(self) -> list:
        """The connection pools of the test's own HTTP clients."""
        return [self._http_pool]

    def _tear_down_network(self) -> defer.Deferred:
        """Remove what the world made of the network beyond its sockets (nothing here)."""
        return defer.succeed(None)

    # -- coordinator apiservers as processes of their own -----------------------------

    @defer.inlineCallbacks
    def start_coordinator_processes(self, count: int,
                                    ) -> Generator[defer.Deferred[Any], Any, list[str]]:
        """Run ``count`` coordinator apiservers as processes of their own
        (``coordinator_processes``, each a ``CoordinatorProcess`` in
        ``coordinator-<index>/``) over the pool etcd, each given every member starting
        with a different one (``rotated``), as the sandbox's servers are; fire with
        their URLs. Agents started from then on are given these URLs, in this order,
        instead of the in-process servers' (which keep serving the same etcd and
        remain the world's reader of the coordinator's objects)."""
        if not self.coordinator_in_etcd:
            raise ValueError("coordinator apiserver processes keep their objects in the "
                             "pool etcd: the world needs coordinator_in_etcd")
        if self.ca is not None:
            raise ValueError("coordinator apiserver processes serve plain http: a world "
                             "with identities keeps its coordinators in the test process")
        if self.coordinator_processes:
            raise RuntimeError("the coordinator apiserver processes already run")
        config = self.coordinator_etcd_config()
        tls = [(flag, path) for flag, path in (("--etcd-cafile", config.ca_file),
                                                ("--etcd-certfile", config.cert_file),
                                                ("--etcd-keyfile", config.key_file)) if path]
        for index in range(count):
            args = ["--etcd", ",".join(rotated(self.etcd_urls(), index)),
                    "--etcd-prefix", STORAGE_PREFIX]
            for flag, path in tls:
                args += [flag, path]
            self.coordinator_processes.append(CoordinatorProcess(
                self.reactor, os.path.join(self.base_dir, f"coordinator-{index}"), args))
        for process in self.coordinator_processes:
            yield process.start()
        return [str(process.url) for process in self.coordinator_processes]

    def coordinator_urls(self) -> list[str | None]:
        """The ``[coordinator] server`` URLs agents are given, in order: the
        coordinator apiserver processes' once started, else the in-process servers'."""
        if self.coordinator_processes:
            return [process.url for process in self.coordinator_processes]
        return [server.url for server in self.coordinators]

    def kill_coordinator(self, index: int) -> defer.Deferred[None]:
        """SIGKILL coordinator apiserver process ``index``."""
        return self.coordinator_processes[index].kill()

    def restart_coordinator(self, index: int) -> defer.Deferred[str]:
        """Start coordinator apiserver process ``index`` again, on its port; fires with
        its URL once it listens."""
        return self.coordinator_processes[index].start()

    # -- faults of etcd (blocking steps run in a thread) -------------------------------

    def kill_etcd(self, member: int | None = None) -> defer.Deferred[Any]:
        """SIGKILL the pool etcd; in a cluster, member number ``member``."""
        if self.etcd_cluster is None:
            return deferToThread(self.etcd.kill)
        return deferToThread(self.etcd_cluster.kill, self._member_index(member))

    def restart_etcd(self, member: int | None = None) -> defer.Deferred[EtcdProcess]:
        """Start the pool etcd again on its data; in a cluster, member ``member``
        (healthy once a quorum of the cluster runs)."""
        if self.etcd_cluster is None:
            return deferToThread(self.etcd.restart)
        return deferToThread(self.etcd_cluster.restart, self._member_index(member))

    # -- the pool etcd as a cluster ----------------------------------------------------
    # With ``etcd_members`` above 1 every agent's ``storage`` lists every member, the
    # faults above take a member's index, and the judge reads from a running member.

    def _etcd_service(self) -> EtcdCluster | EtcdProcess:
        """What starts and stops the pool etcd: the cluster, or the single member."""
        return self.etcd_cluster if self.etcd_cluster is not None else self.etcd

    def _member_index(self, member: int | None) -> int:
        if member is None:
            raise ValueError("the pool etcd is a cluster: say which member (its index)")
        return member

    def etcd_urls(self) -> list[str]:
        """The client URL of every pool etcd member, in member order."""
        if self.etcd_cluster is None:
            return [self.etcd.client_url]
        return self.etcd_cluster.client_urls

    def etcd_members(self) -> list[EtcdProcess]:
        """Every pool etcd member (one without a cluster)."""
        return [self.etcd] if self.etcd_cluster is None else list(self.etcd_cluster.members)

    def etcd_leader(self) -> defer.Deferred[int]:
        """The index of the member that is the raft leader now (waits for an election)."""
        cluster = self.etcd_cluster
        if cluster is None:
            return defer.succeed(0)
        return deferToThread(lambda: cluster.members.index(cluster.leader()))

    def etcd_reader(self) -> EtcdProcess:
        """The member ``etcdctl`` reads from: a running one (reads are linearizable, so
        any member of a cluster with a quorum answers what the cluster holds)."""
        if self.etcd_cluster is None:
            return self.etcd
        running = self.etcd_cluster.running()
        if not running:
            raise AssertionError("no pool etcd member is running")
        return running[0]

    # -- cuts of the cloud -------------------------------------------------------------

    def cut_cloud(self, nodes: Iterable[str] | None = None) -> defer.Deferred[list[Any]]:
        return defer.gatherResults([proxy.cut() for n in (nodes or list(self.agents))
                                    for proxy in self.agents[n].cloud_proxies])

    def restore_cloud(self, nodes: Iterable[str] | None = None) -> None:
        for node in nodes or list(self.agents):
            for proxy in self.agents[node].cloud_proxies:
                proxy.restore()

    # -- the stand-in kubelets ---------------------------------------------------------

    def stop_kubelet(self, node: str) -> defer.Deferred:
        """``node``'s kubelet dies: it stops listening, its connections drop."""
        return self.agents[node].stand_in_kubelet().stop()

    def start_kubelet(self, node: str) -> None:
        """``node``'s kubelet is back, on the port its agent checks."""
        self.agents[node].stand_in_kubelet().start()

    # -- reading the agents ------------------------------------------------------------

    def running_agents(self) -> dict[str, AgentProcess]:
        return {node: a for node, a in self.agents.items() if a.running}

    def http_for(self, agent: AgentProcess) -> treq.client.HTTPClient:
        """The HTTP client that reaches ``agent``'s status pages."""
        return self.http

    def etcdctl_reactor(self) -> Any:
        """The reactor that spawns ``etcdctl`` (one where the etcd member is reachable)."""
        return self.reactor

    def reader_for(self, agent: AgentProcess) -> StatusReader:
        """The reader of ``agent``'s pages (through ``http_for(agent)``)."""
        return StatusReader(self.http_for(agent), timeout=PAGE_TIMEOUT)

    def status(self, agent: AgentProcess) -> defer.Deferred[Any]:
        """The agent's ``/status`` document."""
        return self.reader_for(agent).status(str(agent.url))

    def metrics(self, agent: AgentProcess) -> defer.Deferred[dict[str, float]]:
        """``{sample name with labels: value}`` of the agent's ``/metrics``."""
        return self.reader_for(agent).metrics(str(agent.url))

    @defer.inlineCallbacks
    def statuses(self) -> Generator[defer.Deferred[Any], Any, Statuses]:
        """``{node: /status document}`` of every running agent."""
        documents = {}
        for node, agent in self.running_agents().items():
            documents[node] = yield self.status(agent)
        return documents

    def log_tails(self, nodes: Iterable[str] | None = None, lines: int = 30) -> str:
        return "\n".join(self.agents[n].log_tail(lines) for n in (nodes or list(self.agents)))

    def wait_for_pool(self, what: str, predicate: Callable[[Statuses], object],
                      timeout: float, interval: float = 0.05) -> defer.Deferred[Statuses]:
        """Poll every running agent's ``/status`` until ``predicate({node: doc})``.

        On timeout the assertion names ``what``, the last (role, leader, ready) of each
        agent and the tail of every agent's log.
        """
        return wait_for_statuses(self.statuses, what, predicate, timeout, self.reactor,
                                 interval, details=self.log_tails)

    # -- reading the pool etcd and judging it ------------------------------------------

    @defer.inlineCallbacks
    def _etcdctl_json(self, *args: str) -> Generator[defer.Deferred[Any], Any, Any]:
        """The JSON answer of ``etcdctl <args> -w json``."""
        env = child_environment(without_etcd=True)
        env["ETCDCTL_API"] = "3"
        command = self.etcd_reader().etcdctl_command(*args, "-w", "json")
        out, err, code = yield getProcessOutputAndValue(command[0], command[1:], env=env,
                                                        reactor=self.etcdctl_reactor())
        if code != 0:
            raise AssertionError(f"etcdctl {' '.join(args)} failed ({code}): {err!r}")
        return json.loads(out)

    @defer.inlineCallbacks
    def read_etcd_revisions(self, key: str, prefix: bool = False, revision: int | None = None,
                            ) -> Generator[defer.Deferred[Any], Any, dict[str, tuple[bytes, int]]]:
        """``{key: (value, mod revision)}`` of ``key`` (every key under it with
        ``prefix``), as it is or as it was at ``revision``, read by etcdctl."""
        args = ["get", key] + (["--prefix"] if prefix else [])
        if revision is not None:
            args += ["--rev", str(revision)]
        answer = yield self._etcdctl_json(*args)
        return {base64.b64decode(kv["key"]).decode("utf-8"):
                (base64.b64decode(kv.get("value", "")), int(kv["mod_revision"]))
                for kv in answer.get("kvs", [])}

    def read_etcd(self, prefix: str) -> defer.Deferred[dict[str, bytes]]:
        """``{key: value}`` (str keys, bytes values) under ``prefix``, read by etcdctl."""
        return self.read_etcd_revisions(prefix, prefix=True).addCallback(
            lambda entries: {key: value for key, (value, _) in entries.items()})

    @defer.inlineCallbacks
    def count_etcd(self, prefix: str) -> Generator[defer.Deferred[Any], Any, int]:
        """How many keys are under ``prefix`` (the range's count, read with limit 1)."""
        answer = yield self._etcdctl_json("get", prefix, "--prefix", "--limit", "1",
                                          "--keys-only")
        return int(answer.get("count", 0))

    @defer.inlineCallbacks
    def wait_for_keys_between(self, what: str, prefix: str, low: int, high: int,
                              timeout: float) -> Generator[defer.Deferred[Any], Any, int]:
        """Fire with the count as soon as ``low < keys under prefix < high``: a write of
        many keys (``what``) under way, for a fault to land in its middle."""
        seen: dict[str, int] = {}

        @defer.inlineCallbacks
        def partly_written() -> Generator[defer.Deferred[Any], Any, bool]:
            seen["count"] = yield self.count_etcd(prefix)
            return low < seen["count"] < high

        try:
            yield poll_until(partly_written, timeout, 0.01, self.reactor,
                             what=f"{what} under way")
        except PollTimeout as e:
            raise PollTimeout(f"{e}: last count {seen.get('count')}\n"
                              f"{self.log_tails()}") from None
        return seen["count"]

    def change_cloud_endpoints(self, round_name: str, created: int = 10, updated: int = 10,
                               deleted: int = 5) -> None:
        """Create, update and delete some cloud endpoints (named after ``round_name``);
        the pool must follow."""
        store = self.servers()[0].store
        existing = store.list(ENDPOINTS)
        for index in range(created):
            store.create(ENDPOINTS, endpoints(f"{round_name}-{index}", f"10.1.0.{index}"))
        for obj in existing[:updated]:
            obj["subsets"][0]["addresses"] = [{"ip": "10.9.9.9"}]
            store.update(ENDPOINTS, obj)
        for obj in existing[updated:updated + deleted]:
            store.delete(ENDPOINTS, obj["metadata"]["name"], obj["metadata"]["namespace"])

    def cloud_endpoints(self) -> dict[str, int]:
        """``{pool etcd key: resourceVersion}`` of the cloud's endpoints."""
        return {f"{ENDPOINTS_PREFIX}{obj['metadata']['namespace']}/{obj['metadata']['name']}":
                int(obj["metadata"]["resourceVersion"])
                for obj in self.servers()[0].store.list(ENDPOINTS)}

    @defer.inlineCallbacks
    def pool_problems(self, agents: Iterable[AgentProcess] | None = None,
                      ) -> Generator[defer.Deferred[Any], Any, list[str]]:
        """Differences between the pool etcd and its sources, as readable lines.

        Endpoints must match the cloud exactly (same keys, same resourceVersion); every
        pod of the local caches of ``agents`` (default all) must be there with a
        resourceVersion not lower than the cached one; every object's mirror rv key must
        agree with the object it describes.
        """
        objects = yield self.read_etcd(f"{STORAGE_PREFIX}/")
        mirrors = yield self.read_etcd(f"{MIRROR_RV_PREFIX}{STORAGE_PREFIX}/")
        problems = []

        def stored_rv(key: str) -> int | None:
            try:
                return int(json.loads(objects[key])["metadata"]["resourceVersion"])
            except (ValueError, KeyError, TypeError):
                return None

        for key, value in objects.items():
            if not (key.startswith(ENDPOINTS_PREFIX) or key.startswith(PODS_PREFIX)):
                continue
            mirror = mirrors.get(MIRROR_RV_PREFIX + key)
            if mirror is None or int(mirror) != stored_rv(key):
                problems.append(f"{key}: mirror rv {mirror!r} disagrees with the object's "
                                f"{stored_rv(key)}")
        cloud = self.cloud_endpoints()
        pooled = {k for k in objects if k.startswith(ENDPOINTS_PREFIX)}
        for key, rv in sorted(cloud.items()):
            if key not in objects:
                problems.append(f"{key}: in the cloud (rv {rv}), missing in the pool etcd")
            elif stored_rv(key) != rv:
                problems.append(f"{key}: rv {stored_rv(key)} in the pool etcd, {rv} in the cloud")
        for key in sorted(pooled - set(cloud)):
            problems.append(f"{key}: in the pool etcd, deleted in the cloud")
        for agent in (agents or list(self.agents.values())):
            for key, rv in sorted(agent.expected_pods.items()):
                if key not in objects:
                    problems.append(f"{key}: in {agent.node}'s cache, missing in the pool etcd")
                elif (stored_rv(key) or 0) < rv:
                    problems.append(f"{key}: regressed to rv {stored_rv(key)} below the "
                                    f"cached {rv}")
        return problems

    @defer.inlineCallbacks
    def wait_pool_exact(self, timeout: float, agents: Iterable[AgentProcess] | None = None,
                        ) -> Generator[defer.Deferred[Any], Any, None]:
        """Poll until ``pool_problems()`` is empty; fail listing the first problems."""
        seen: dict[str, Any] = {}

        @defer.inlineCallbacks
        def exact() -> Generator[defer.Deferred[Any], Any, bool]:
            seen["problems"] = yield self.pool_problems(agents)
            return not seen["problems"]

        try:
            yield poll_until(exact, timeout, 0.25, self.reactor, what="pool etcd exact")
        except PollTimeout as e:
            problems = seen.get("problems") or []
            listed = "\n".join(problems[:20])
            raise PollTimeout(f"{e}\n{len(problems)} problems, first ones:\n{listed}\n"
                              f"{self.log_tails()}") from None

    # -- the leases -------------------------------------------------------------------

    # Synchronous, of an in-memory server (the cloud).
    node_lease = staticmethod(read_node_lease)
    delegate_annotation = staticmethod(read_delegate_annotation)

    # Of the coordinator apiservers, in etcd or in memory alike: through their storage,
    # every answer a Deferred.

    def coordinator_object(self, gvr: GroupVersionResource, name: str,
                           namespace: str | None = None,
                           ) -> defer.Deferred[dict[str, Any] | None]:
        """The coordinator's object, as its apiservers serve it; None when absent."""
        return self.servers()[1].storage.get(gvr, name, namespace)

    def coordinator_lease(self, name: str, namespace: str,
                          ) -> defer.Deferred[dict[str, Any] | None]:
        return self.coordinator_object(LEASES, name, namespace)

    def election_lease(self) -> defer.Deferred[dict[str, Any] | None]:
        """The pool's leader election lease in the coordinator."""
        return self.coordinator_lease(ELECTION_LEASE, ELECTION_NAMESPACE)

    def election_holder(self) -> defer.Deferred[str | None]:
        """The holder of the election lease, None without lease or holder."""
        return self.election_lease().addCallback(
            lambda lease: (lease or {}).get("spec", {}).get("holderIdentity"))

    def coordinator_node_lease(self, node: str) -> defer.Deferred[dict[str, Any] | None]:
        """``node``'s lease in ``kube-node-lease`` in the coordinator."""
        return self.coordinator_lease(node, NODE_LEASE_NAMESPACE)

    def coordinator_delegate_annotation(self, node: str) -> defer.Deferred[str | None]:
        """The delegate-heartbeat annotation of ``node``'s lease in the coordinator."""
        return self.coordinator_node_lease(node).addCallback(
            lambda lease: ((lease or {}).get("metadata", {}).get("annotations") or {}).get(
                DELEGATE_HEARTBEAT_ANNOTATION))


def one_leader_all_ready(statuses: Mapping[str, Any], count: int) -> bool:
    """Exactly one leader among ``count`` agents, the others followers naming it, all ready."""
    if len(statuses) != count:
        return False
    roles = sorted(s["role"] for s in statuses.values())
    leaders = {s["leader"] for s in statuses.values()}
    return (roles == ["follower"] * (count - 1) + ["leader"] and len(leaders) == 1
            and None not in leaders and all(s["ready"] for s in statuses.values()))


def leader_of(statuses: Mapping[str, Any]) -> str | None:

    return next((node for node, s in statuses.items() if s["role"] == "leader"), None)

