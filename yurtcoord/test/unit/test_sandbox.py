"""The sandbox's parts without processes, on memory reactors and a Clock: a stop
signal that comes before the handlers, where the etcd binary is looked up, what the
cloud is seeded with, the coordinator apiservers' controls and what the control page
shows of them, the age of each node's cloud lease on the control page (counted on the
sandbox's clock from the change of renewTime it saw, also when the writers' clocks are
minutes off), and the lines that say when heartbeat delegation starts and ends."""

import os
import signal

from twisted.internet import reactor
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger
from twisted.plugins.yurtcoord_plugin import EarlyStopSignals, make_sandbox
from twisted.trial import unittest
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, LEASES, NODES
from yurtcoord.heartbeat.delegation import HeartbeatDelegation
from yurtcoord.kube.lease import LeaseRecord, build_lease, format_micro_time
from yurtcoord.names import (
    DELEGATE_HEARTBEAT_ANNOTATION, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE,
    NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.sim.sandbox import (
    DELEGATION_QUIET_PERIOD, SEEDED_SERVICES, DelegationLines, Sandbox, find_etcd_binary, seed_cloud,
)
from yurtcoord.sim.sandboxapiservers import ELECTION_READ_TIMEOUT, SandboxCoordinators
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.kubelet import IKubeletStandIn, StandInKubelet
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube


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
            lambda: {"edge-1": {"http://127.0.0.1:0": True}},
            (ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME))
        self.urls = self.successResultOf(self.coordinators.start(
            ["http://127.0.0.1:1", "http://127.0.0.1:2"], "/registry"))
        self.assertEqual(len(self.reactor.tcpServers), 2)

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
        self.sandbox = Sandbox(self.clock, lambda _line: None, agent_count=2)
        for node in self.sandbox.nodes:
            self.sandbox.kubelets[node] = StandInKubelet(self.clock)
        verifyObject(IKubeletStandIn, self.sandbox.kubelets["edge-1"])
        self.sandbox.follow_cloud_leases()
        self.addCleanup(lambda: self.sandbox._lease_watch.cancel())
        self.offsets = {"edge-1": +300.0, "edge-2": -120.0}

    def renew(self, node):
        renewed = self.clock.seconds() + self.offsets[node]
        store = self.sandbox.cloud.store
        lease = build_lease(node, NODE_LEASE_NAMESPACE, LeaseRecord(node, 40, None, renewed))
        current = store.get(LEASES, node, NODE_LEASE_NAMESPACE)
        if current is None:
            store.create(LEASES, lease)
        else:
            store.update(LEASES, dict(lease, metadata=current["metadata"]))

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
