"""No silent deaths: every periodic loop of the agent survives an unexpected exception
of its step, logs it once with its traceback and counts it in
``yurtcoord_loop_errors_total{loop}`` (``yurtcoord.tx.guardedloop``).

``LoopInjectionTests`` makes the step of each loop of ``LOOPS`` raise, by name, and
checks the counter for that name, the one logged traceback and the loop's next tick;
a loop added to ``LOOPS`` without a scenario here fails ``test_every_loop_has_a_scenario``.
"""

import collections
from typing import Any, Callable, Dict, List, Optional

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import LogEvent
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.store import PoolStore
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.tx.guardedloop import LOOPS, ILoopErrors, guarded


class Injected(Exception):
    """The exception a test makes a loop's step raise."""


@implementer(ILoopErrors)
class CountingSink:
    """Counts loop errors by loop name, as the agent's metrics do."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = collections.Counter()

    def count_loop_error(self, loop: str) -> None:
        self.counts[loop] += 1


def loop_failures(capture: GlobalLogCapture, name: str) -> List[LogEvent]:
    """The logged events of loop ``name`` that carry a traceback."""
    return [e for e in capture.events if e.get("loop") == name and "log_failure" in e]


class GuardedTests(unittest.TestCase):
    """``guarded`` itself: what a step's error becomes."""

    def test_the_sink_and_the_metrics_provide_the_interface(self) -> None:
        self.assertTrue(verifyObject(ILoopErrors, CountingSink()))
        self.assertTrue(verifyObject(ILoopErrors, Metrics("edge-1", "pool-a")))

    def test_an_unknown_loop_name_is_refused(self) -> None:
        self.assertRaises(ValueError, guarded, "no-such-loop", lambda: None)

    def test_a_raising_step_is_logged_counted_and_handed_on(self) -> None:
        capture, sink, handed = GlobalLogCapture(self), CountingSink(), []

        def step() -> None:
            raise Injected("boom")

        self.assertIsNone(guarded("reactor-lag", step, sink, handed.append)())
        self.assertEqual(sink.counts["reactor-lag"], 1)
        self.assertEqual(len(loop_failures(capture, "reactor-lag")), 1)
        self.assertEqual([f.type for f in handed], [Injected])
        self.assertEqual(len(self.flushLoggedErrors(Injected)), 1)

    def test_a_failed_deferred_fires_with_none(self) -> None:
        sink = CountingSink()
        d = guarded("reactor-lag", lambda: defer.fail(Injected("late")), sink)()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(sink.counts["reactor-lag"], 1)
        self.assertEqual(len(self.flushLoggedErrors(Injected)), 1)

    def test_a_cancellation_is_no_error(self) -> None:
        sink = CountingSink()
        d = guarded("reactor-lag", lambda: defer.fail(defer.CancelledError()), sink)()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(sink.counts, {})

    def test_the_metrics_export_every_loop_and_count_by_name(self) -> None:
        metrics = Metrics("edge-1", "pool-a")
        metrics.count_loop_error("pool-store-health")
        page = metrics.render().decode()
        for name in LOOPS:
            expected = 1.0 if name == "pool-store-health" else 0.0
            self.assertIn(f'yurtcoord_loop_errors_total{{loop="{name}"}} {expected}', page)


class Status:
    """An etcd status answer as the etcd client parses it."""

    def __init__(self, version: Any, raft_term: Any = None) -> None:
        self.version = version
        self.raft_term = raft_term


class StatusClient:
    """Answers ``status()`` with Deferreds the test fires."""

    def __init__(self) -> None:
        self.pending: List[defer.Deferred[Any]] = []

    def status(self, timeout: Any = None) -> defer.Deferred[Any]:
        d: defer.Deferred[Any] = defer.Deferred()
        self.pending.append(d)
        return d


class MalformedStatusTests(unittest.TestCase):
    """The finding of issue 29: a status answer with ``"version": 5`` raised out of the
    pool store's health loop, which stopped with ``healthy`` still True."""

    def test_the_health_loop_goes_on_and_the_store_turns_unhealthy(self) -> None:
        clock, client, sink = Clock(), StatusClient(), CountingSink()
        capture = GlobalLogCapture(self)
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=5.0, metrics=sink)
        store.start()
        client.pending[0].callback(Status("3.5.9"))
        self.assertTrue(store.healthy)
        clock.advance(5)
        client.pending[1].callback(Status(5))
        self.assertFalse(store.healthy)
        self.assertEqual(sink.counts["pool-store-health"], 1)
        self.assertEqual(len(loop_failures(capture, "pool-store-health")), 1)
        self.assertEqual(len(self.flushLoggedErrors(TypeError)), 1)
        clock.advance(5)
        self.assertEqual(len(client.pending), 3)
        client.pending[2].callback(Status("3.5.9"))
        self.assertTrue(store.healthy)
        self.successResultOf(store.close())


# -- each loop by name ---------------------------------------------------------------------


class Raising:
    """A callable that raises ``Injected`` on its first call and then does what
    ``then`` does (nothing by default): the one bad step of a loop."""

    def __init__(self, then: Callable[..., Any] = lambda *args, **kwargs: None) -> None:
        self.calls = 0
        self._then = then

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise Injected("injected into the loop's step")
        return self._then(*args, **kwargs)


class Injection:
    """A loop whose step has raised once: ``clock`` and ``interval`` reach its next
    tick, ``runs()`` counts its steps so far, ``check()`` asserts what else the
    loop's owner must show after the error."""

    def __init__(self, clock: Clock, interval: float, runs: Callable[[], int],
                 check: Callable[[], None] = lambda: None) -> None:
        self.clock = clock
        self.interval = interval
        self.runs = runs
        self.check = check


def inject_pool_store_health(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    clock, client = Clock(), StatusClient()
    store = PoolStore(clock, client, "/registry", ComponentKeyCache(test.mktemp()),
                      health_interval=5.0, metrics=sink)
    store.start()
    test.addCleanup(store.close)
    client.pending[0].callback(Status("3.5.9"))
    clock.advance(5)
    client.pending[1].callback(Status(5))
    return Injection(clock, 5.0, lambda: len(client.pending),
                     lambda: test.assertFalse(store.healthy))


def inject_informer_sync_lease(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.pool.scope import PoolScopeResources
    from yurtcoord.pool.sync import PoolSyncManager
    from yurtcoord.testing.discovery import cloud_discovery
    from yurtcoord.testing.fakeinformer import FakeInformer
    from yurtcoord.testing.fakekube import FakeKube
    from yurtcoord.testing.fakepoolstore import FakePoolStore

    clock = Clock()
    clock.advance(1_700_000_000.0)
    scope_informers: List[Any] = []
    informers: List[Any] = []
    scope = PoolScopeResources(clock, cloud_discovery(),
                               informer_factory=FakeInformer.factory(scope_informers))
    manager = PoolSyncManager(clock, "edge-1", FakeKube(), object(), scope,
                              informer_lease_renew=10, metrics=sink,
                              informer_factory=FakeInformer.factory(informers))
    test.successResultOf(manager.start(FakePoolStore()))
    test.addCleanup(manager.stop)
    scope_informers[-1].end_list(())
    # The first renewal (as the last list comes in) raises.
    manager._write_lease = Raising(manager._write_lease)  # type: ignore[method-assign]
    for informer in informers:
        informer.end_list(())
    return Injection(clock, 10.0, lambda: manager.lease_writes)


def inject_hub_role_check(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.heartbeat.interfaces import IHealthChecker
    from yurtcoord.role.hubelector import HubElector
    from yurtcoord.testing.fakehealth import FakeHealth

    class RaisingHealth(FakeHealth):
        """A coordinator checker whose ``healthy`` raises once when ``armed``."""

        reads = 0
        armed = False

        @property  # type: ignore[override]
        def healthy(self) -> bool:
            self.reads += 1
            if self.armed:
                self.armed = False
                raise Injected("injected into the hub role check")
            return False

        @healthy.setter
        def healthy(self, _value: bool) -> None:
            pass

    clock, coordinator = Clock(), RaisingHealth()
    test.assertTrue(verifyObject(IHealthChecker, coordinator))
    coordinator.armed = True
    hub = HubElector(clock, FakeHealth(True), coordinator, lambda *_: None, 5.0,
                     lambda role: None, loop_errors=sink)
    hub.start()
    test.addCleanup(hub.stop)
    return Injection(clock, 5.0, lambda: coordinator.reads)


def inject_kubelet_check(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.heartbeat.probes import KubeletHealthChecker

    clock, asked = Clock(), []

    def get(url: str) -> defer.Deferred[Any]:
        asked.append(url)
        return defer.fail(ConnectionRefusedError())

    checker = KubeletHealthChecker(clock, get, "http://127.0.0.1:10248/healthz", 30,
                                   interval=5, timeout=2, loop_errors=sink)
    # A failed answer asks is_alive(), which raises the first time.
    checker.is_alive = Raising(checker.is_alive)  # type: ignore[method-assign]
    checker.start()
    test.addCleanup(checker.stop)
    return Injection(clock, 5.0, lambda: len(asked))


def _prober(clock: Clock, sink: ILoopErrors,
            next_interval: Optional[Callable[[], float]] = None) -> Any:
    from yurtcoord.heartbeat.probes import LeaseProber, NodeLeaseWriter
    from yurtcoord.testing.fakekube import FakeKube
    from yurtcoord.testing.leaseprobes import DEFAULTS

    writer = NodeLeaseWriter(clock, FakeKube(), "edge-1", DEFAULTS)
    return LeaseProber(clock, writer, "https://cloud-1", DEFAULTS,
                       next_interval=next_interval, loop_errors=sink)


def inject_lease_probe(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.testing.leaseprobes import make_clock

    # The end of the first probe asks for the step to the next one, which raises:
    # without the guard no next probe is armed and the error goes unseen.
    clock = make_clock()
    prober = _prober(clock, sink, Raising(lambda: 10.0))
    prober.start()
    test.addCleanup(prober.stop)
    return Injection(clock, 10.0, lambda: prober.probes,
                     lambda: test.assertEqual(len(clock.getDelayedCalls()), 1))


def inject_heartbeat(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.heartbeat.probes import CloudHealthChecker
    from yurtcoord.testing.leaseprobes import make_clock

    clock = make_clock()
    prober = _prober(clock, None)
    checker = CloudHealthChecker(clock, [prober], 10.0, loop_errors=sink)
    # The end of the first round asks for the step to the next one, which raises:
    # without the guard no next round is armed and the error goes unseen.
    core = checker._cadence._core
    core.next_interval = Raising(core.next_interval)
    checker.start()
    test.addCleanup(checker.stop)
    return Injection(clock, 10.0, lambda: prober.probes,
                     lambda: test.assertEqual(len(clock.getDelayedCalls()), 1))


def inject_reactor_lag(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.tx.reactorlag import ReactorLagProbe

    clock, observer = Clock(), Raising()
    probe = ReactorLagProbe(clock, interval=0.1, loop_errors=sink)
    probe.add_observer(observer)
    probe.start()
    test.addCleanup(probe.stop)
    clock.advance(0.1)
    return Injection(clock, 0.1, lambda: observer.calls)


def inject_etcd_member_probe(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.etcd.members import MemberSet
    from yurtcoord.tx.retry import backoff_policy

    clock, probes = Clock(), []

    def probe(url: str) -> defer.Deferred[bool]:
        probes.append(url)
        return defer.succeed(False)

    members = MemberSet(clock, ["https://etcd-a:2379", "https://etcd-b:2379"], probe,
                        backoff_policy(initial=1.0, maximum=1.0, jitter=0.0),
                        loop_errors=sink)
    test.addCleanup(members.close)
    members.failed("https://etcd-a:2379", "connection refused")
    # The probe answers unhealthy; scheduling the next probe raises once.
    retries = members._members[0].retries
    retries.next_delay = Raising(retries.next_delay)  # type: ignore[method-assign]
    clock.advance(1.0)
    return Injection(clock, 1.0, lambda: len(probes), lambda: test.assertEqual(
        members.skipped(), {"https://etcd-a:2379": "connection refused"}))


class HangingWatch:
    """A watch stream that delivers nothing until cancelled."""

    def __init__(self) -> None:
        self.done: defer.Deferred[None] = defer.Deferred()
        self.events = 0

    def cancel(self) -> None:
        if not self.done.called:
            self.done.callback(None)


def inject_informer(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.kube.gvr import CONFIGMAPS, GroupVersionResource
    from yurtcoord.kube.informer import Informer
    from yurtcoord.kube.interfaces import IListWatchClient
    from yurtcoord.tx.retry import Retries, backoff_policy

    @implementer(IListWatchClient)
    class ListWatchClient:
        """Lists no object; its first ``watch`` call raises before any stream exists."""

        def __init__(self) -> None:
            self.lists = 0
            self._watch = Raising(HangingWatch)

        def list(self, gvr: GroupVersionResource, namespace: Any = None,
                 label_selector: Any = None, field_selector: Any = None,
                 resource_version: Any = None, limit: Any = None,
                 continue_token: Any = None) -> defer.Deferred[Any]:
            self.lists += 1
            return defer.succeed({"items": [],
                                  "metadata": {"resourceVersion": str(self.lists)}})

        def watch(self, gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
                  namespace: Any = None, resource_version: Any = None,
                  label_selector: Any = None, field_selector: Any = None,
                  allow_bookmarks: bool = True, timeout_seconds: Any = None,
                  idle_timeout: Any = None) -> Any:
            return self._watch()

    clock, client = Clock(), ListWatchClient()
    test.assertTrue(verifyObject(IListWatchClient, client))
    informer = Informer(clock, client, CONFIGMAPS, namespace="kube-system",
                        backoff=Retries(backoff_policy(initial=2.0, maximum=2.0, jitter=0.0)),
                        loop_errors=sink)
    informer.start()
    test.addCleanup(informer.stop)
    return Injection(clock, 2.0, lambda: client.lists,
                     lambda: test.assertTrue(informer.running))


def _elector(test: unittest.TestCase, sink: ILoopErrors, random: Callable[[], float],
             stopped: List[float]) -> Any:
    from yurtcoord.kube.interfaces import IObjectClient
    from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector
    from yurtcoord.testing.fakekube import FakeKube

    clock, kube = Clock(), FakeKube()
    clock.advance(1_800_000_000.0)
    test.assertTrue(verifyObject(IObjectClient, kube))
    config = LeaderElectionConfig(lease_namespace="kube-system", lease_name="yurthub",
                                  identity="edge-1", lease_duration=15.0,
                                  renew_deadline=10.0, retry_period=2.0)
    elector = LeaderElector(clock, kube, config,
                            on_stopped_leading=lambda: stopped.append(clock.seconds()),
                            random=random, loop_errors=sink)
    test.addCleanup(elector.stop, release=False)
    return clock, kube, elector


def inject_election_tick(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    clock, kube, elector = _elector(test, sink, lambda: 0.0, [])
    # The first attempt raises before any request.
    elector._try_acquire_or_renew = Raising(  # type: ignore[method-assign]
        elector._try_acquire_or_renew)
    elector.start()
    clock.advance(0)
    return Injection(clock, 2.0, lambda: len(kube.calls),
                     lambda: test.assertTrue(elector.running))


def inject_election_deadline(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    stopped: List[float] = []
    clock, kube, elector = _elector(test, sink, lambda: 0.0, stopped)
    elector.start()
    clock.advance(0)
    test.assertTrue(elector.is_leader)
    # Renewals get no answer; at the renew deadline, arming the next tick raises.
    kube.hang = True
    elector._random = Raising(lambda: 0.0)
    for _ in range(5):
        clock.advance(2.0)

    def check() -> None:
        test.assertFalse(elector.is_leader)
        test.assertEqual(len(stopped), 1)
    return Injection(clock, 2.0, lambda: len(kube.calls), check)


def inject_role_retry(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.role.coordinator import Coordinator
    from yurtcoord.role.roles import IRoleComponent, Role
    from yurtcoord.testing.idlecomponent import IdleComponent

    clock, opens = Clock(), []

    def open_pool_store() -> defer.Deferred[Any]:
        opens.append(clock.seconds())
        return defer.fail(ConnectionRefusedError("pool etcd down"))

    components = [IdleComponent() for _ in range(3)]
    for component in components:
        test.assertTrue(verifyObject(IRoleComponent, component))
    # Asking for the first retry's delay raises.
    coordinator = Coordinator(clock, "edge-1", open_pool_store, *components,
                              upload_local_cache=lambda store: defer.succeed(None),
                              retry_delay=Raising(lambda attempt: 1.0), loop_errors=sink)
    coordinator.set_role(Role.LEADER)
    test.addCleanup(coordinator.stop)
    return Injection(clock, 1.0, lambda: len(opens),
                     lambda: test.assertTrue(coordinator.applying))


def inject_watch_idle(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from twisted.internet.testing import StringTransport

    from yurtcoord.kube.watch import IdleWatchdog, WatchStreamProtocol

    clock = Clock()
    stream = WatchStreamProtocol(lambda kind, obj: None, "https://api/watch", clock,
                                 max_line=1024)
    transport = StringTransport()
    stream.makeConnection(transport)
    # Nothing arrives; the first check that finds the watch idle raises as it ends it.
    expire = stream.expire = Raising(stream.expire)  # type: ignore[method-assign]
    watchdog = IdleWatchdog(clock, 10.0, stream, loop_errors=sink)
    test.addCleanup(watchdog.stop)
    clock.advance(10.0)

    def check() -> None:
        # Not expired yet, and not left without a check: one is armed again.
        test.assertFalse(transport.disconnecting)
        test.assertEqual(len(clock.getDelayedCalls()), 1)
    return Injection(clock, 10.0, lambda: expire.calls, check)


def inject_work_retry(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.tx.retry import backoff_policy
    from yurtcoord.tx.workqueue import WorkQueue

    clock, attempts = Clock(), []

    def work(key: str, item: int) -> defer.Deferred[None]:
        attempts.append((key, item))
        return defer.fail(ConnectionRefusedError("remote down"))

    queue: WorkQueue[str, int] = WorkQueue(
        clock, work, lambda old, new: new,
        backoff_policy(initial=1.0, maximum=1.0, jitter=0.0), loop_errors=sink)
    test.addCleanup(queue.stop)
    queue.add("edge-1", 1)
    # The first attempt failed; putting the key back at its retry raises once.
    queue._pump = Raising(queue._pump)  # type: ignore[method-assign]
    clock.advance(1.0)
    return Injection(clock, 1.0, lambda: len(attempts),
                     lambda: test.assertTrue(queue.has_work("edge-1")))


def inject_election_lease_read(test: unittest.TestCase, sink: ILoopErrors) -> Injection:
    from yurtcoord.role.leadersource import ElectionLeader, ElectionLeaseReader
    from yurtcoord.testing.fakekube import FakeKube

    clock = Clock()
    coordinator, leader = FakeKube(clock), ElectionLeader(clock)
    reader = ElectionLeaseReader(clock, coordinator, ("kube-system", "yurthub"), leader,
                                 interval=2.0, timeout=1.0, loop_errors=sink)
    # Handling the first answer raises once (a defect, not a failed read).
    leader.observe = Raising(leader.observe)  # type: ignore[method-assign]
    reader.start()
    test.addCleanup(reader.stop)
    return Injection(clock, 2.0, lambda: reader.reads)


INJECTIONS: Dict[str, Callable[[unittest.TestCase, ILoopErrors], Injection]] = {
    "pool-store-health": inject_pool_store_health,
    "informer-sync-lease": inject_informer_sync_lease,
    "hub-role-check": inject_hub_role_check,
    "kubelet-check": inject_kubelet_check,
    "lease-probe": inject_lease_probe,
    "heartbeat": inject_heartbeat,
    "reactor-lag": inject_reactor_lag,
    "etcd-member-probe": inject_etcd_member_probe,
    "informer": inject_informer,
    "election-tick": inject_election_tick,
    "election-deadline": inject_election_deadline,
    "role-retry": inject_role_retry,
    "watch-idle": inject_watch_idle,
    "work-retry": inject_work_retry,
    "election-lease-read": inject_election_lease_read,
}


class LoopInjectionTests(unittest.TestCase):
    """For each loop of ``LOOPS``: its step raises once; the error is counted under its
    name in the agent's metrics, logged once with its traceback, and the loop runs its
    step again at its next tick."""

    def test_every_loop_has_a_scenario(self) -> None:
        self.assertEqual(sorted(INJECTIONS), sorted(LOOPS))

    def check_loop(self, name: str) -> None:
        capture, metrics = GlobalLogCapture(self), Metrics("edge-1", "pool-a")
        injected = INJECTIONS[name](self, metrics)
        self.assertEqual(metrics.registry.get_sample_value(
            "yurtcoord_loop_errors_total", {"loop": name}), 1.0)
        self.assertEqual(len(loop_failures(capture, name)), 1)
        self.assertEqual(len(self.flushLoggedErrors(Injected, TypeError, defer.FirstError)), 1)
        injected.check()
        runs = injected.runs()
        injected.clock.advance(injected.interval)
        self.assertGreater(injected.runs(), runs, f"loop {name} did not run again")
        self.assertEqual(metrics.registry.get_sample_value(
            "yurtcoord_loop_errors_total", {"loop": name}), 1.0)


def _loop_test(name: str) -> Callable[[LoopInjectionTests], None]:
    def test(self: LoopInjectionTests) -> None:
        self.check_loop(name)
    test.__doc__ = f"Loop {name} ({LOOPS[name]}) survives an exception of its step."
    return test


for _name in LOOPS:
    setattr(LoopInjectionTests, f"test_{_name.replace('-', '_')}", _loop_test(_name))
