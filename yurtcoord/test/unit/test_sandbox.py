"""The sandbox's parts without processes, on memory reactors and a Clock: a stop
signal that comes before the handlers, where the etcd binary is looked up, what the
cloud is seeded with, the sandbox's certificates (the certs Secret, each node's own, the
admin's) and the agents' configuration that uses them, the coordinator apiservers
(TLS, the pool's authorization, a request log each), their controls and what the
control page shows of them, the age of each node's cloud lease on the control page (counted on the
sandbox's clock from the change of renewTime it saw, also when the writers' clocks are
minutes off), and the lines that say when heartbeat delegation starts and ends; the
leader a role line names, the commands printed at start, and the control page (styled
as the pool page, refreshed from ``page.json`` without a reload, marking the pool and
raft leaders, stale cloud leases and cut cloud links)."""

import base64
import json
import os
import re
import signal
from types import SimpleNamespace

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from twisted.internet import defer, reactor
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger
from twisted.plugins.yurtcoord_plugin import EarlyStopSignals, make_sandbox
from twisted.trial import unittest
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer
from zope.interface.verify import verifyClass, verifyObject

from yurtcoord.agent.certs import (
    CERTS_SECRET_NAME, UNITS, check_ca, check_node_certificate, check_pair,
)
from yurtcoord.agent.config import parse_config
from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, LEASES, NODES
from yurtcoord.heartbeat.delegation import HeartbeatDelegation
from yurtcoord.kube.lease import LeaseRecord, build_lease, format_micro_time
from yurtcoord.names import (
    DELEGATE_HEARTBEAT_ANNOTATION, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE,
    NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.agent.poolpage import POOL_PAGE_STYLE
from yurtcoord.role.roles import Role
from yurtcoord.sim.sandbox import (
    CLOUD_LEASE_STALE_AFTER, DELEGATION_QUIET_PERIOD, SEEDED_SERVICES, DelegationLines,
    KubeletControlPage, Sandbox, agent_config_text, find_etcd_binary, role_line_leader,
    ISandboxAgent, seed_cloud, start_commands,
)
from yurtcoord.sim.sandboxapiservers import ELECTION_READ_TIMEOUT, SandboxCoordinators
from yurtcoord.sim.sandboxetcd import SandboxEtcd, mark_raft_leader, raft_leader_of
from yurtcoord.sim.sandboxpage import SECTIONS, render_control_page
from yurtcoord.sim.apiserver import KubeAPIServer, PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.authz import POOL_AGENTS_GROUP
from yurtcoord.sim.sandboxpki import ClientTLS, SandboxPKI
from yurtcoord.sim.kubelet import IKubeletStandIn, StandInKubelet
from yurtcoord.sim.tcpproxy import ICuttableLink, TCPProxy
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube


def two_node_sandbox(clock):
    """A sandbox of two nodes on ``clock``, each with a stand-in kubelet, no agents
    or servers started."""
    sandbox = Sandbox(clock, lambda _line: None, agent_count=2)
    for node in sandbox.nodes:
        sandbox.kubelets[node] = StandInKubelet(clock)
    return sandbox


def renew_cloud_lease(store, node, renewed):
    """``node``'s lease in the sandbox's cloud, written with renewTime ``renewed`` (its
    writer's clock, whatever it says)."""
    lease = build_lease(node, NODE_LEASE_NAMESPACE, LeaseRecord(node, 40, None, renewed))
    current = store.get(LEASES, node, NODE_LEASE_NAMESPACE)
    if current is None:
        store.create(LEASES, lease)
    else:
        store.update(LEASES, dict(lease, metadata=current["metadata"]))


@implementer(IReactorFromThreads)
class ThreadCallRecordingReactor(MemoryReactorClock):
    """A memory reactor that records ``callFromThread`` calls instead of running them
    (what a signal handler queues before the reactor runs)."""

    def __init__(self):
        super().__init__()
        self.from_thread = []

    def callFromThread(self, f, *args, **kwargs):
        self.from_thread.append((f, args, kwargs))


class SandboxPartsTests(unittest.TestCase):
    """The sandbox's pieces, checked without processes."""

    def executable(self, name):
        path = os.path.join(os.path.abspath(self.mktemp()), name)
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\nexit 0\n")
        os.chmod(path, 0o755)
        return path

    def test_a_stop_signal_before_the_handlers_stops_the_sandbox_once_the_reactor_runs(self):
        # From option parsing on, a SIGINT is remembered, not a KeyboardInterrupt; the
        # sandbox built afterwards queues the stop, which happens once the reactor runs.
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
        saved = {signum: signal.getsignal(signum) for signum in signums}
        self.addCleanup(lambda: [signal.signal(n, h) for n, h in saved.items()])
        early = EarlyStopSignals()
        early.install()
        os.kill(os.getpid(), signal.SIGINT)
        self.assertEqual(early.received, [signal.SIGINT])

        fake = ThreadCallRecordingReactor()
        verifyObject(IReactorCore, fake)
        verifyObject(IReactorFromThreads, fake)
        sandbox = make_sandbox(fake, 1, Logger(), early)
        self.assertIsInstance(sandbox, Sandbox)
        self.assertEqual(len(fake.from_thread), 1)
        self.assertFalse(fake.hasStopped)
        fake.running = True
        stop, args, kwargs = fake.from_thread.pop()
        stop(*args, **kwargs)
        self.assertTrue(fake.hasStopped)
        # Later signals reach the sandbox's own handlers, which queue a stop as well.
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertEqual(len(fake.from_thread), 1)
        self.assertEqual(early.received, [signal.SIGINT])

    def test_etcd_bin_comes_first_then_path(self):
        chosen = self.executable("etcd")
        on_path = self.executable("etcd")
        self.assertEqual(find_etcd_binary({"ETCD_BIN": chosen,
                                           "PATH": os.path.dirname(on_path)}), chosen)
        self.assertEqual(find_etcd_binary({"PATH": os.path.dirname(on_path)}), on_path)
        # An ETCD_BIN that is not an executable file is passed over.
        self.assertEqual(find_etcd_binary({"ETCD_BIN": os.path.dirname(chosen),
                                           "PATH": os.path.dirname(on_path)}), on_path)
        os.chmod(chosen, 0o644)
        self.assertEqual(find_etcd_binary({"ETCD_BIN": chosen,
                                           "PATH": os.path.dirname(on_path)}), on_path)

    def test_cloud_is_seeded_with_nodes_endpoints_and_slices(self):
        server = KubeAPIServer(reactor)
        seed_cloud(server.store, ["edge-1", "edge-2"])
        nodes = [n["metadata"]["name"] for n in server.store.list(NODES)]
        self.assertEqual(sorted(nodes), ["edge-1", "edge-2"])
        endpoints = {e["metadata"]["name"] for e in server.store.list(ENDPOINTS, "default")}
        self.assertEqual(endpoints, set(SEEDED_SERVICES))
        slices = server.store.list(ENDPOINTSLICES_V1, "default")
        self.assertEqual({s["metadata"]["labels"]["kubernetes.io/service-name"] for s in slices},
                         set(SEEDED_SERVICES))


class SandboxCoordinatorsTests(unittest.TestCase):
    """The coordinator apiservers' controls and what the control page shows of them,
    on a memory reactor: nothing listens for real and the pool etcd never answers."""

    def setUp(self):
        self.reactor = MemoryReactorClock()
        self.lines = []
        self.coordinators = SandboxCoordinators(
            self.reactor, 2, self.lines.append, self.lines.append,
            lambda: {"edge-1": {"https://127.0.0.1:0": True}},
            (ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME))
        self.directory = os.path.abspath(self.mktemp())
        self.pki = SandboxPKI(os.path.join(self.directory, "pki"), "sandbox-pool")
        self.etcd_tls = ClientTLS(self.pki.ca_file, self.pki.ca.client_pair(
            "etcd-client", "etcd-client"))
        self.urls = self.successResultOf(self.coordinators.start(
            ["https://127.0.0.1:1", "https://127.0.0.1:2"], "/registry", self.pki.directory,
            self.etcd_tls, self.directory))
        self.assertEqual(len(self.reactor.sslServers), 2)

    def test_each_server_serves_tls_authorizes_as_the_pool_and_logs_its_answers(self):
        self.assertEqual([url.split(":")[0] for url in self.urls], ["https", "https"])
        self.assertEqual(self.coordinators.request_log_paths, [
            os.path.join(self.directory, f"coordinator-{index}-requests.jsonl")
            for index in (0, 1)])
        for index, server in enumerate(self.coordinators.servers):
            self.assertIsInstance(server.authorizer, PoolCoordinatorAuthorizer)
            self.assertEqual(server.tls_dir, self.pki.directory)
            config = server.storage._client.config
            self.assertEqual((config.url, config.ca_file, config.cert_file, config.key_file),
                             (f"https://127.0.0.1:{index + 1}", self.pki.ca_file,
                              self.etcd_tls.pair.cert_file, self.etcd_tls.pair.key_file))

    def act(self, action):
        """Run a kill or restart to its end (closing an etcd client takes a turn)."""
        d = action()
        self.reactor.advance(0)
        return self.successResultOf(d)

    def test_an_etcd_that_does_not_answer_leaves_the_lease_holder_unread_in_time(self):
        d = self.coordinators.state()
        self.reactor.advance(ELECTION_READ_TIMEOUT - 0.01)
        self.assertNoResult(d)
        self.reactor.advance(0.01)
        lease = self.successResultOf(d)["election_lease"]
        self.assertEqual(lease, {"namespace": ELECTION_LEASE_NAMESPACE,
                                 "name": ELECTION_LEASE_NAME, "holder": None,
                                 "unread": f"etcd did not answer within "
                                           f"{ELECTION_READ_TIMEOUT:g} s"})
        self.assertIn("(not read: etcd did not answer within",
                      SandboxCoordinators.page_section(self.state_after_timeout()))

    def state_after_timeout(self):
        d = self.coordinators.state()
        self.reactor.advance(ELECTION_READ_TIMEOUT)
        return self.successResultOf(d)

    def test_kill_and_restart_say_what_happened_and_refuse_what_cannot_be_done(self):
        url = self.urls[0]
        self.assertEqual(
            self.act(lambda: self.coordinators.kill(0)),
            f"coordinator apiserver 0 ({url}) killed; agents that counted it healthy: "
            f"edge-1; the other serves the pool on: the agents move to it at their next "
            f"request")
        self.assertFalse(self.coordinators.is_running(0))
        self.assertEqual(self.act(lambda: self.coordinators.kill(0)),
                         f"coordinator apiserver 0 ({url}) is not running")
        state = self.state_after_timeout()
        self.assertEqual([server["running"] for server in state["apiservers"]], [False, True])
        self.assertIn("/coordinator/0/restart", SandboxCoordinators.page_section(state))
        self.assertIn("none is left", self.act(lambda: self.coordinators.kill(1)))
        self.assertEqual(self.successResultOf(self.coordinators.state())["election_lease"][
            "unread"], "no coordinator apiserver is running")

        self.assertEqual(self.act(lambda: self.coordinators.restart(0)),
                         f"coordinator apiserver 0 ({url}) restarted: the agents count it "
                         f"healthy again at their next probe of it")
        self.assertTrue(self.coordinators.is_running(0))
        self.assertEqual(self.act(lambda: self.coordinators.restart(0)),
                         f"coordinator apiserver 0 ({url}) is already running")
        self.assertEqual(len(self.lines), 5)

        self.act(self.coordinators.stop)
        self.assertEqual(self.act(lambda: self.coordinators.restart(1)),
                         "coordinator apiserver 1: the sandbox is stopping")

    def test_a_control_path_that_names_no_server_or_action_is_404(self):
        for path in (["2", "kill"], ["x", "kill"], ["0", "stop"], ["0"], ["-1", "kill"]):
            request = DummyRequest([])
            body = self.coordinators.render_post(request, path)
            self.assertEqual((request.responseCode, body),
                             (404, b"not found: POST /coordinator/<index>/kill or "
                                   b"/coordinator/<index>/restart (index 0 to 1)\n"), path)
        self.assertTrue(self.coordinators.is_running(0) and self.coordinators.is_running(1))


class CloudLeaseAgeTests(unittest.TestCase):
    """The control page's ``cloud_lease_age_seconds`` of two nodes whose cloud leases
    are written by clocks 300 s ahead of the sandbox's (edge-1) and 120 s behind it
    (edge-2, delegated by a leader that far behind), every 2 s: small while they
    change, growing on the sandbox's clock once edge-1's stop."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_800_000_000.0)
        self.sandbox = two_node_sandbox(self.clock)
        verifyObject(IKubeletStandIn, self.sandbox.kubelets["edge-1"])
        self.sandbox.follow_cloud_leases()
        self.addCleanup(lambda: self.sandbox._lease_watch.cancel())
        self.offsets = {"edge-1": +300.0, "edge-2": -120.0}

    def renew(self, node):
        renew_cloud_lease(self.sandbox.cloud.store, node, self.clock.seconds() + self.offsets[node])

    def ages(self):
        return {node: state["cloud_lease_age_seconds"]
                for node, state in self.sandbox.node_states().items()}

    def test_age_counts_from_the_change_seen_on_the_sandbox_clock(self):
        self.assertEqual(self.ages(), {"edge-1": None, "edge-2": None})
        for _ in range(5):
            self.renew("edge-1")
            self.renew("edge-2")
            self.clock.advance(1.5)
            self.assertEqual(self.ages(), {"edge-1": 1.5, "edge-2": 1.5})
            self.clock.advance(0.5)
        # edge-1's kubelet died: its lease stops changing, edge-2's goes on.
        for second in range(1, 11):
            self.renew("edge-2")
            self.clock.advance(1)
            self.assertEqual(self.ages(), {"edge-1": 2.0 + second, "edge-2": 1.0})
        state = self.sandbox.node_states()["edge-1"]
        self.assertEqual((state["role"], state["kubelet_running"]), ("not started", False))
        # The page reads the lease as it is; a lease gone has no age.
        self.sandbox.cloud.store.delete(LEASES, "edge-1", NODE_LEASE_NAMESPACE)
        self.assertIsNone(self.ages()["edge-1"])


class DelegationLinesTests(unittest.TestCase):
    """The sandbox's delegation lines follow the delegation's observer: one line when
    an agent starts forwarding, one after ``DELEGATION_QUIET_PERIOD`` without any."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_800_000_000.0)
        self.leases = FakeInformer()
        nodes = FakeInformer()
        cloud = FakeKube()
        self.delegation = HeartbeatDelegation(
            self.clock, lambda: self.leases, lambda _selector: nodes, FakeKube(),
            FakeHealth(picks_from=["https://cloud:6443"]).pick_healthy_server,
            lambda _url: cloud, "pool-a")
        self.lines = []
        self.followed = DelegationLines(self.clock, self.lines.append)
        self.followed.follow("edge-2", self.delegation)
        self.successResultOf(self.delegation.start(None))
        self.leases.end_list()
        nodes.end_list([{"metadata": {"name": "edge-1", "labels": {NODE_POOL_LABEL: "pool-a"}}}])

    def renew(self, holder="edge-1"):
        """A renewal of edge-1's delegated lease, as the pool leader's informer sees it."""
        self.leases.add({
            "metadata": {"name": "edge-1", "namespace": NODE_LEASE_NAMESPACE,
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": holder,
                     "renewTime": format_micro_time(self.clock.seconds())}})

    def test_one_line_when_delegating_starts_and_one_after_the_quiet_period(self):
        self.renew()
        self.assertEqual(self.lines, ["edge-2: delegating heartbeats of nodes without the "
                                      "cloud (1 so far)"])
        for _ in range(3):
            self.clock.advance(DELEGATION_QUIET_PERIOD - 1)
            self.renew()
        self.assertEqual(self.delegation.delegated_heartbeats, 4)
        self.assertEqual(len(self.lines), 1)
        self.clock.advance(DELEGATION_QUIET_PERIOD - 0.01)
        self.assertEqual(len(self.lines), 1)
        self.clock.advance(0.01)
        self.assertEqual(self.lines[1:], ["edge-2: no heartbeat to delegate any more "
                                          "(4 in total)"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.renew()
        self.assertEqual(self.lines[2:], ["edge-2: delegating heartbeats of nodes without "
                                          "the cloud (5 so far)"])

    def test_a_refused_heartbeat_is_no_delegation(self):
        self.renew(holder="edge-9")
        self.assertEqual(self.delegation.refused["holder_mismatch"], 1)
        self.assertEqual(self.lines, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_cancels_the_quiet_timer(self):
        self.renew()
        self.followed.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(DELEGATION_QUIET_PERIOD)
        self.assertEqual(len(self.lines), 1)


class RoleLineTests(unittest.TestCase):
    """A role line names the leader as it stands after the change, although the
    agent's leader source has not read the lease again yet."""

    def test_the_leader_each_role_line_names(self):
        self.assertEqual(role_line_leader("edge-1", Role.LEADER, None, None), "edge-1")
        self.assertEqual(role_line_leader("edge-1", Role.LEADER, "edge-2", "edge-2"), "edge-1")
        # A follower names the holder its elector saw, then the leader source's.
        self.assertEqual(role_line_leader("edge-1", Role.FOLLOWER, "edge-2", None), "edge-2")
        self.assertEqual(role_line_leader("edge-1", Role.FOLLOWER, None, "edge-3"), "edge-3")
        # An agent that just stopped leading never names itself.
        self.assertEqual(role_line_leader("edge-1", Role.FOLLOWER, "edge-1", "edge-1"), None)
        self.assertEqual(role_line_leader("edge-1", Role.PENDING, "edge-1", "edge-2"), "edge-2")

    def test_the_line_of_an_agent_turning_leader_names_it(self):
        lines = []
        sandbox = Sandbox(Clock(), lines.append, agent_count=2)
        # As when the line is printed: the elector won, the leader source still knows
        # of no leader (its read of the lease is on the way).
        sandbox.agents["edge-1"] = FakeAgent(Role.LEADER, elector_holder="edge-1",
                                             source_leader=None)
        sandbox._role_changed("edge-1", Role.FOLLOWER, Role.LEADER)
        self.assertRegex(lines[-1], r"^\[sandbox\] \d\d:\d\d:\d\d edge-1: role follower -> "
                                    r"leader \(leader: edge-1\)$")
        sandbox.agents["edge-2"] = FakeAgent(Role.FOLLOWER, elector_holder="edge-1",
                                             source_leader=None)
        sandbox._role_changed("edge-2", Role.INIT, Role.FOLLOWER)
        self.assertTrue(lines[-1].endswith("edge-2: role init -> follower (leader: edge-1)"),
                        lines[-1])


class StartCommandsTests(unittest.TestCase):
    """The commands printed at start: yurtcoordctl per agent, kubectl against a
    coordinator apiserver as the sandbox's admin and against the cloud, etcdctl with
    the etcd members' client pair, none asking for credentials."""

    def test_commands(self):
        etcdctl = ["/usr/bin/etcdctl", "--endpoints", "https://127.0.0.1:2379",
                   "--cacert", "/s/pki/ca.crt", "--cert", "/s/pki/c.crt", "--key", "/s/pki/c.key"]
        commands = start_commands(
            ".venv/bin/yurtcoordctl",
            {"edge-1": "http://127.0.0.1:9001", "edge-2": "http://127.0.0.1:9002"},
            "http://127.0.0.1:8001", "https://127.0.0.1:8002", "/s/pki/admin.kubeconfig",
            etcdctl)
        self.assertEqual(commands, [
            ".venv/bin/yurtcoordctl --server http://127.0.0.1:9001 status",
            ".venv/bin/yurtcoordctl --server http://127.0.0.1:9002 status",
            ".venv/bin/yurtcoordctl --server http://127.0.0.1:9001 members",
            "kubectl --kubeconfig /s/pki/admin.kubeconfig --server https://127.0.0.1:8002 "
            "get leases -A",
            "kubectl --kubeconfig /dev/null --server http://127.0.0.1:8001 get nodes",
            "/usr/bin/etcdctl --endpoints https://127.0.0.1:2379 --cacert /s/pki/ca.crt "
            "--cert /s/pki/c.crt --key /s/pki/c.key get /registry/leases/ --prefix --keys-only",
        ])
        # Without an etcdctl no etcdctl line; a path with a space pastes as one word.
        commands = start_commands("/opt/my env/yurtcoordctl", {"edge-1": "http://x:1"},
                                  "http://c", "https://p", "/tmp/my dir/admin.kubeconfig")
        self.assertEqual(len(commands), 4)
        self.assertTrue(commands[0].startswith("'/opt/my env/yurtcoordctl' --server"))
        self.assertEqual(commands[2], "kubectl --kubeconfig '/tmp/my dir/admin.kubeconfig' "
                                      "--server https://p get leases -A")


class SandboxPKITests(unittest.TestCase):
    """The sandbox's certificates: what the agents fetch from the cloud, what each
    node and the admin present, and the agents' configuration that uses them."""

    def setUp(self):
        self.directory = os.path.abspath(self.mktemp())
        self.pki = SandboxPKI(os.path.join(self.directory, "pki"), "sandbox-pool")

    def subject(self, path):
        with open(path, "rb") as handle:
            return x509.load_pem_x509_certificate(handle.read()).subject.rfc4514_string()

    def test_the_certs_secret_holds_what_the_certificate_manager_reads(self):
        secret = self.pki.certs_secret()
        self.assertEqual((secret["metadata"]["namespace"], secret["metadata"]["name"]),
                         ("kube-system", CERTS_SECRET_NAME))
        data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
        self.assertEqual(sorted(data), sorted(key for unit in UNITS for key, _ in unit.items))
        check_ca(data["ca.crt"])
        for unit in UNITS:
            if unit.is_pair:
                check_pair(*(data[key] for key, _file in unit.items))
        pool_agent = x509.load_pem_x509_certificate(
            data["yurt-coordinator-yurthub-client.crt"]).subject
        self.assertEqual([a.value for a in pool_agent.get_attributes_for_oid(
            NameOID.ORGANIZATION_NAME)], [POOL_AGENTS_GROUP])

    def test_each_node_has_its_own_certificate_and_the_admin_is_a_master(self):
        path = self.pki.node_certificate("edge-2", os.path.join(self.directory, "edge-2.pem"))
        check_node_certificate(path, "edge-2")
        with self.assertRaises(ValueError):
            check_node_certificate(path, "edge-1")
        self.assertEqual(self.subject(self.pki.admin.pair.cert_file),
                         "CN=admin,O=system:masters")
        kubeconfig = self.pki.write_admin_kubeconfig("https://127.0.0.1:6443")
        with open(kubeconfig) as handle:
            config = yaml.safe_load(handle)
        self.assertEqual(config["clusters"][0]["cluster"],
                         {"server": "https://127.0.0.1:6443",
                          "certificate-authority": self.pki.ca_file})
        self.assertEqual(config["users"][0]["user"],
                         {"client-certificate": self.pki.admin.pair.cert_file,
                          "client-key": self.pki.admin.pair.key_file})

    def test_an_agent_reaches_its_coordinator_as_its_node_with_the_secret_for_the_rest(self):
        cert = self.pki.node_certificate("edge-1", os.path.join(self.directory, "edge-1.pem"))
        config = parse_config(agent_config_text(
            "edge-1", "http://127.0.0.1:1", "https://127.0.0.1:2, https://127.0.0.1:3",
            "https://127.0.0.1:4", os.path.join(self.directory, "edge-1"),
            "http://127.0.0.1:5", cert), "<test>")
        self.assertEqual(config.node.kubelet_client_cert, cert)
        self.assertFalse(config.coordinator.insecure)
        self.assertEqual(list(config.coordinator.server),
                         ["https://127.0.0.1:2", "https://127.0.0.1:3"])
        self.assertTrue(config.cloud.insecure)


@implementer(ISandboxAgent)
class FakeAgent:
    """What the sandbox reads of an agent: its role, its elector's holder, its leader
    source, its kubelet check and its ``/status`` cause."""

    def __init__(self, role, elector_holder=None, source_leader=None):
        self.coordinator = SimpleNamespace(role=role)
        self.hub_elector = SimpleNamespace(leader=elector_holder)
        self.leader = SimpleNamespace(leader=source_leader)
        self.kubelet_checker = SimpleNamespace(is_alive=lambda: True)
        self.status_source = SimpleNamespace(status=lambda: {
            "cause": None, "coordinator_servers": {"http://127.0.0.1:8002": True}})


@implementer(ICuttableLink)
class FakeLink:
    """A cloud link that is cut or not."""

    is_cut = False

    def cut(self):
        self.is_cut = True
        return defer.succeed([])

    def restore(self):
        self.is_cut = False


class ControlPageTests(unittest.TestCase):
    """The control page and ``page.json`` of a sandbox of two nodes on a Clock (no
    socket): edge-1 leads, its cloud lease is written by a clock 300 s ahead of the
    sandbox's and stops changing; edge-2's, 120 s behind, goes on changing."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_800_000_000.0)
        self.sandbox = two_node_sandbox(self.clock)
        for node in self.sandbox.nodes:
            self.sandbox.cloud_links[node] = FakeLink()
            verifyObject(ICuttableLink, self.sandbox.cloud_links[node])
        self.sandbox.agents["edge-1"] = FakeAgent(Role.LEADER, "edge-1", "edge-1")
        self.sandbox.agents["edge-2"] = FakeAgent(Role.FOLLOWER, "edge-1", "edge-1")
        verifyObject(ISandboxAgent, self.sandbox.agents["edge-2"])
        self.assertTrue(verifyClass(ICuttableLink, TCPProxy))
        self.sandbox.follow_cloud_leases()
        self.addCleanup(lambda: self.sandbox._lease_watch.cancel())
        self.offsets = {"edge-1": +300.0, "edge-2": -120.0}

    def renew(self, node):
        renew_cloud_lease(self.sandbox.cloud.store, node, self.clock.seconds() + self.offsets[node])

    def get(self, path):
        request = DummyRequest([path.encode()] if path else [])
        request.path = b"/" + path.encode()
        body = KubeletControlPage(self.sandbox).render_GET(request)
        self.assertEqual(request.responseCode or 200, 200)
        return b"".join(request.written) if isinstance(body, int) else body

    def page(self):
        return self.get("").decode("utf-8")

    def test_page_looks_like_the_pool_page_and_updates_from_page_json_without_reload(self):
        page = self.page()
        self.assertIn(f"<style>{POOL_PAGE_STYLE}</style>", page)
        self.assertNotIn("http-equiv", page)
        self.assertIn('fetch("page.json"', page)
        # The page calls its script (package data) with a refresh every second.
        self.assertIn("setInterval(refresh, settings.refresh_ms);", page)
        self.assertIn('({"refresh_ms": 1000});\n</script>', page)
        for section in SECTIONS:
            self.assertIn(f'id="{section}"', page)
        document = json.loads(self.get("page.json"))
        self.assertEqual(set(document["sections"]), set(SECTIONS))
        self.assertEqual(sorted(document["state"]["nodes"]), ["edge-1", "edge-2"])
        # The sections the script puts in place are the ones the page was drawn with.
        self.assertIn(document["sections"]["nodes"], page)

    def test_a_dead_kubelet_is_named_as_the_cause_and_its_servers_not_called_down(self):
        # edge-2's agent says what its /status says while its kubelet is dead.
        self.sandbox.agents["edge-2"].status_source = SimpleNamespace(status=lambda: {
            "cause": {"kind": "kubelet_dead", "text": "kubelet dead for 12s"},
            "coordinator_servers": {"http://127.0.0.1:8002": None},
            "servers_not_probed": "not probed: kubelet dead for 12s"})
        page = self.page()
        row = re.search(r'<tr [^>]*data-node="edge-2".*?</tr>', page, re.S).group(0)
        self.assertIn("<td>kubelet dead for 12s</td>", row)
        coordinators = json.loads(self.get("page.json"))["sections"]["coordinators"]
        self.assertIn("<tr><td>edge-2</td><td>http://127.0.0.1:8002 not probed</td></tr>",
                      coordinators)
        self.assertIn("<tr><td>edge-1</td><td>http://127.0.0.1:8002 healthy</td></tr>",
                      coordinators)

    def test_pool_leader_marked(self):
        page = self.page()
        self.assertIn('data-node="edge-1" data-role="leader"', page)
        self.assertEqual(page.count("<span class=\"role-leader\">pool leader</span>"), 1)
        self.assertRegex(page, r'<span class="label">pool leader</span>'
                               r'<span class="value role-leader">edge-1</span>')

    def test_stale_lease_highlighted_by_the_change_seen_on_the_sandbox_clock(self):
        # Both renew every second; the page shows no stale lease.
        for _ in range(5):
            self.renew("edge-1")
            self.renew("edge-2")
            self.clock.advance(1)
        self.assertNotIn("STALE", self.page())
        # edge-1 stops renewing: its renewTime is still 300 s ahead of the sandbox's
        # clock, yet it is stale once not seen to change for more than
        # CLOUD_LEASE_STALE_AFTER (its age is that now).
        for _ in range(int(CLOUD_LEASE_STALE_AFTER) - 1):
            self.renew("edge-2")
            self.clock.advance(1)
        self.assertNotIn("STALE", self.page())
        self.renew("edge-2")
        self.clock.advance(0.5)
        page = self.page()
        self.assertIn('<tr class="stale" data-node="edge-1" data-role="leader" '
                      'data-stale="true"', page)
        self.assertIn('<tr class="node" data-node="edge-2" data-role="follower" '
                      'data-stale="false"', page)
        self.assertEqual(page.count('<span class="badge">STALE</span>'), 1)
        state = json.loads(self.get("page.json"))["state"]["nodes"]
        self.assertEqual((state["edge-1"]["cloud_lease_stale"],
                          state["edge-2"]["cloud_lease_stale"]), (True, False))

    def test_cut_link_shown_with_how_long_ago_until_restored(self):
        self.assertNotIn("CUT", self.page())
        self.assertIn('<ul id="links" hidden>', self.page())
        self.sandbox.cut_leader_cloud()
        self.clock.advance(12.5)
        page = self.page()
        self.assertIn('data-link="cut"', page)
        self.assertEqual(page.count('<span class="badge">CUT</span>'), 1)
        self.assertIn('<li class="no" data-cut="edge-1">cloud link of edge-1 cut 12.5 s ago '
                      '(SIGUSR1)', page)
        self.assertEqual(json.loads(self.get("page.json"))["state"]["cut_links"],
                         [{"node": "edge-1", "by": "SIGUSR1", "cut_seconds": 12.5}])
        self.sandbox.restore_clouds()
        self.assertNotIn("CUT", self.page())
        self.assertEqual(json.loads(self.get("page.json"))["state"]["cut_links"], [])

    def test_raft_leader_marked(self):
        answers = {
            "http://127.0.0.1:1": {"header": {"member_id": "11"}, "leader": "22"},
            "http://127.0.0.1:2": {"header": {"member_id": "22"}, "leader": "22"},
        }
        self.assertEqual(raft_leader_of(answers), "http://127.0.0.1:2")
        self.assertIsNone(raft_leader_of({"http://127.0.0.1:1": {"header": {"member_id": "1"}}}))
        state = {"members": [
            {"index": index, "name": f"member-{index}", "url": f"http://127.0.0.1:{index + 1}",
             "pid": 100 + index, "running": True, "agents": []} for index in range(2)],
            "agents": {}}
        marked = mark_raft_leader(state, "http://127.0.0.1:2")
        self.assertEqual([m["raft_leader"] for m in marked["members"]], [False, True])
        section = SandboxEtcd.page_section(marked)
        self.assertEqual(section.count("raft leader</span>"), 1)
        self.assertIn("<td>member-1</td><td><span class=\"role-leader\">raft leader</span>",
                      section)
        document = self.successResultOf(self.sandbox.control_document())
        document["etcd"] = marked
        self.assertRegex(render_control_page(document).decode(),
                         r'<span class="label">raft leader</span>'
                         r'<span class="value role-leader">member-1</span>')
