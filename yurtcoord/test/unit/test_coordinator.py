"""Coordinator role state machine: steps per role, superseded roles, retries, readiness."""

from types import SimpleNamespace

from automat import NoTransition
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.metrics import IRoleGauges, follow_coordinator
from yurtcoord.agent.statussources import AgentStatus
from yurtcoord.role.coordinator import Coordinator
from yurtcoord.tx.retry import backoff_policy
from yurtcoord.pool.uploader import UploadCounts
from yurtcoord.role.roles import IRoleComponent, Role
from yurtcoord.testing.fakepoolstore import FakePoolStore

PENDING, LEADER, FOLLOWER = Role.PENDING, Role.LEADER, Role.FOLLOWER


class StoreOpener:
    """open_pool_store(): immediate stores by default; ``hold`` keeps the next opens
    pending; ``failures`` fails the next N opens. Cancelling a held open leaves no
    store behind, as the agent's opener does."""

    def __init__(self, clock, journal):
        self._clock = clock
        self._journal = journal
        self.stores = []
        self.attempt_times = []
        self.failures = 0
        self.hold = False
        self.held = []
        self.cancelled = 0

    def __call__(self):
        self.attempt_times.append(self._clock.seconds())
        if self.failures:
            self.failures -= 1
            self._journal.append(("open failed",))
            return defer.fail(ConnectionError("etcd unreachable"))
        if self.hold:
            d = defer.Deferred(self._cancel)
            self.held.append(d)
            return d
        store = self._new_store()
        return defer.succeed(store)

    def _new_store(self):
        store = FakePoolStore(self._clock, name=f"s{len(self.stores) + 1}",
                              on_close=lambda closed: self._journal.append(("close", closed.name)))
        self.stores.append(store)
        self._journal.append(("open", store.name))
        return store

    def _cancel(self, d):
        self.held.remove(d)
        self.cancelled += 1
        self._journal.append(("open cancelled",))

    def release(self):
        self.held.pop(0).callback(self._new_store())


@implementer(IRoleComponent)
class FakeComponent:
    """A role component; ``hold_start``/``hold_stop`` keep the next start/stop pending
    (in ``held``) until the test fires it. Cancelling a held start leaves it stopped."""

    def __init__(self, name, journal):
        self.name = name
        self._journal = journal
        self.store = None
        self.start_failures = 0
        self.hold_start = False
        self.hold_stop = False
        self.held = None
        self.starts_cancelled = 0

    def start(self, store):
        assert self.store is None, f"{self.name} started twice"
        assert self.held is None, f"{self.name} started before its stop finished"
        assert store.closes == 0, f"{self.name} started on closed store {store.name}"
        if self.start_failures:
            self.start_failures -= 1
            self._journal.append(("start failed", self.name, store.name))
            return defer.fail(RuntimeError(f"{self.name} could not start"))
        if self.hold_start:
            self._journal.append(("starting", self.name, store.name))
            self.held = defer.Deferred(self._cancel_start)
            self.held.addCallback(self._started, store)
            return self.held
        self._started(None, store)
        return defer.succeed(None)

    def _started(self, _result, store):
        self.held = None
        self.store = store
        self._journal.append(("start", self.name, store.name))

    def _cancel_start(self, d):
        self.held = None
        self.starts_cancelled += 1
        self._journal.append(("start cancelled", self.name))

    def stop(self):
        assert self.store is not None, f"{self.name} stopped while not running"
        assert self.held is None, f"{self.name} stopped twice"
        self._journal.append(("stop", self.name))
        self.store = None
        if self.hold_stop:
            self.held = defer.Deferred()
            self.held.addCallback(self._stopped)
            return self.held
        return defer.succeed(None)

    def _stopped(self, _result):
        self.held = None
        self._journal.append(("stopped", self.name))

    def release(self):
        self.held.callback(None)


class Uploader:
    def __init__(self, journal, clock):
        self._journal = journal
        self._clock = clock
        self.results = []  # per call: UploadCounts to fire with, an exception, or a Deferred
        self.attempt_times = []

    def __call__(self, store):
        self.attempt_times.append(self._clock.seconds())
        result = self.results.pop(0) if self.results else UploadCounts(created=7)
        if isinstance(result, defer.Deferred):
            self._journal.append(("upload", store.name))
            return result
        if isinstance(result, Exception):
            self._journal.append(("upload failed", store.name))
            return defer.fail(result)
        self._journal.append(("upload", store.name))
        return defer.succeed(result)


@implementer(IRoleGauges)
class RecordingMetrics:
    def __init__(self):
        self.role = self.healthy = self.ready = None

    def set_role(self, role):
        self.role = role

    def set_healthy(self, healthy):
        self.healthy = healthy

    def set_ready(self, ready):
        self.ready = ready


class CoordinatorTestCase(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.journal = []
        self.opener = StoreOpener(self.clock, self.journal)
        self.pool_sync = FakeComponent("pool sync", self.journal)
        self.delegation = FakeComponent("delegation", self.journal)
        self.detector = FakeComponent("detector", self.journal)
        self.upload = Uploader(self.journal, self.clock)
        self.metrics = RecordingMetrics()
        self.coordinator = Coordinator(
            self.clock, "edge-1", self.opener, self.pool_sync, self.delegation, self.detector,
            self.upload, retry_delay=backoff_policy(initial=1, maximum=4, jitter=0.0))
        follow_coordinator(self.metrics, self.coordinator)

    def tearDown(self):
        self.successResultOf(self.coordinator.stop())
        for component in (self.pool_sync, self.delegation, self.detector):
            self.assertIsNone(component.store, f"{component.name} left running")
        for store in self.opener.stores:
            self.assertEqual(store.closes, 1, f"{store.name} not closed exactly once")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def take_journal(self):
        entries, self.journal[:] = list(self.journal), []
        return entries

    def running(self):
        return {c.name: c.store.name for c in (self.pool_sync, self.delegation, self.detector)
                if c.store is not None}


class RoleTransitionTests(CoordinatorTestCase):
    def test_init_is_neither_healthy_nor_ready(self):
        """Fix 8."""
        self.assertEqual(self.coordinator.role, Role.INIT)
        self.assertFalse(self.coordinator.healthy)
        self.assertFalse(self.coordinator.ready)
        self.assertEqual(self.coordinator.readiness_failures(), ["coordinator not healthy (role init)"])
        self.assertEqual((self.metrics.role, self.metrics.healthy, self.metrics.ready),
                         ("init", False, False))

    def test_every_transition_in_order(self):
        c = self.coordinator
        c.set_role(PENDING)
        self.assertEqual(self.take_journal(), [])
        self.assertFalse(c.healthy)
        self.assertEqual(self.metrics.role, "pending")

        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [
            ("open", "s1"), ("start", "detector", "s1"), ("upload", "s1")])
        self.assertTrue(c.healthy)
        self.assertFalse(c.ready, "not synced yet")
        self.assertEqual(c.readiness_failures(), ["pool cache not synced"])
        c.set_pool_cache_synced(True)
        self.assertTrue(c.ready)
        self.assertEqual((self.metrics.role, self.metrics.healthy, self.metrics.ready),
                         ("follower", True, True))

        c.set_role(LEADER)
        self.assertEqual(self.take_journal(), [
            ("start", "pool sync", "s1"), ("start", "delegation", "s1")])
        self.assertEqual(self.running(), {"pool sync": "s1", "delegation": "s1", "detector": "s1"})
        self.assertTrue(c.ready)
        self.assertEqual(self.metrics.role, "leader")

        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [("stop", "pool sync"), ("stop", "delegation")])
        self.assertEqual(self.running(), {"detector": "s1"})
        self.assertTrue(c.ready)

        c.set_role(PENDING)
        self.assertEqual(self.take_journal(), [("stop", "detector"), ("close", "s1")])
        self.assertEqual(self.running(), {})
        self.assertIsNone(c.store)
        self.assertFalse(c.healthy)
        self.assertFalse(c.ready)
        self.assertFalse(c.pool_cache_synced)
        self.assertTrue(c.need_upload_local_cache)
        self.assertEqual((self.metrics.role, self.metrics.healthy, self.metrics.ready),
                         ("pending", False, False))

    def test_leader_steps_from_pending(self):
        c = self.coordinator
        c.set_role(PENDING)
        c.set_role(LEADER)
        self.assertEqual(self.take_journal(), [
            ("open", "s1"), ("start", "pool sync", "s1"), ("start", "delegation", "s1"),
            ("start", "detector", "s1"), ("upload", "s1")])
        self.assertEqual(c.uploaded_objects, 7)

    def test_objects_the_pool_already_had_count_as_uploaded(self):
        """A re-upload after a role change finds the node's objects in the pool already
        (not newer): they are in the pool, so they count; bad files do not."""
        c = self.coordinator
        self.upload.results = [UploadCounts(created=2, updated=1, skipped_not_newer=5,
                                            skipped_bad=4)]
        c.set_role(FOLLOWER)
        self.assertEqual(c.uploaded_objects, 8)
        self.assertEqual(c.uploaded_objects, 8)

    def test_pending_to_leader_uses_a_new_store(self):
        """Fix 7: the new store is open before sync starts; the old one is never used."""
        c = self.coordinator
        c.set_role(LEADER)
        c.set_role(PENDING)
        self.take_journal()
        self.opener.hold = True
        c.set_role(LEADER)
        self.assertEqual(self.running(), {}, "nothing starts before the store is open")
        self.opener.release()
        self.assertEqual(self.take_journal(), [
            ("open", "s2"), ("start", "pool sync", "s2"), ("start", "delegation", "s2"),
            ("start", "detector", "s2"), ("upload", "s2")])
        self.assertEqual(self.opener.stores[0].closes, 1)

    def test_upload_repeated_after_pending(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        c.set_role(LEADER)
        self.assertEqual([e for e in self.journal if e[0] == "upload"], [("upload", "s1")])
        c.set_role(PENDING)
        c.set_role(FOLLOWER)
        self.assertEqual([e for e in self.journal if e[0] == "upload"],
                         [("upload", "s1"), ("upload", "s2")])

    def test_same_role_twice_does_nothing(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        self.take_journal()
        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [])

    def test_one_log_line_per_role_change(self):
        with capturedLogs() as events:
            self.coordinator.set_role(FOLLOWER)
        changes = [e for e in events if e.get("role") == "follower" and "previous" in e]
        self.assertEqual(len(changes), 1)
        self.assertEqual(changes[0]["node"], "edge-1")
        self.assertEqual(changes[0]["previous"], "init")


class SupersededRoleTests(CoordinatorTestCase):
    def test_slow_leader_open_superseded_by_pending(self):
        """The open is cancelled at once; no store is left behind."""
        c = self.coordinator
        self.opener.hold = True
        c.set_role(LEADER)
        c.set_role(PENDING)
        self.assertEqual(c.role, PENDING)
        self.assertEqual(self.take_journal(), [("open cancelled",)])
        self.assertEqual(self.opener.held, [])
        self.assertEqual(self.running(), {})
        self.assertIsNone(c.store)
        self.assertFalse(c.healthy)

    def test_only_the_newest_of_queued_roles_runs(self):
        c = self.coordinator
        self.opener.hold = True
        c.set_role(LEADER)
        c.set_role(PENDING)
        c.set_role(LEADER)
        c.set_role(FOLLOWER)
        self.opener.hold = False
        self.opener.release()
        self.assertEqual(self.take_journal(), [
            ("open cancelled",), ("open cancelled",),
            ("open", "s1"), ("start", "detector", "s1"), ("upload", "s1")])
        self.assertEqual(self.running(), {"detector": "s1"})

    def test_upload_of_superseded_role_does_not_count(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        c.set_role(PENDING)
        hold = defer.Deferred()
        self.upload.results = [hold]
        c.set_role(LEADER)
        c.set_role(PENDING)
        hold.callback(UploadCounts(created=99))
        self.assertTrue(c.need_upload_local_cache)
        self.assertNotEqual(c.uploaded_objects, 99)
        self.assertEqual(self.running(), {})


class RetryTests(CoordinatorTestCase):
    def test_failed_open_is_retried_with_capped_growing_delays(self):
        """Fix 5: no busy loop; delays 1, 2, 4, 4 (cap) from each failure."""
        c = self.coordinator
        self.opener.failures = 5
        c.set_role(LEADER)
        for _ in range(40):
            self.clock.advance(0.5)
        start = self.opener.attempt_times[0]
        self.assertEqual([t - start for t in self.opener.attempt_times], [0, 1, 3, 7, 11, 15])
        self.assertEqual(self.running(), {"pool sync": "s1", "delegation": "s1", "detector": "s1"})
        self.assertEqual(c.failed_attempts, 0)

    def test_role_change_cancels_the_retry_and_resets_backoff(self):
        c = self.coordinator
        self.opener.failures = 3
        c.set_role(LEADER)
        self.clock.advance(1)
        self.clock.advance(2)
        self.assertEqual(len(self.opener.attempt_times), 3)
        self.assertEqual(c.failed_attempts, 3)
        c.set_role(PENDING)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(60)
        self.assertEqual(len(self.opener.attempt_times), 3)
        self.opener.failures = 1
        c.set_role(FOLLOWER)
        self.clock.advance(0.99)
        self.assertEqual(len(self.opener.attempt_times), 4)
        self.clock.advance(0.01)
        self.assertEqual(len(self.opener.attempt_times), 5, "backoff restarts at 1 s")

    def test_failed_upload_leaves_not_ready_and_is_retried(self):
        """Fix 2: the seed cleared needUploadLocalCache although the upload failed."""
        c = self.coordinator
        self.upload.results = [IOError("etcd went away"), IOError("still away"),
                               UploadCounts(created=12)]
        c.set_role(FOLLOWER)
        c.set_pool_cache_synced(True)
        self.assertTrue(c.need_upload_local_cache)
        self.assertFalse(c.local_cache_uploaded)
        self.assertFalse(c.ready)
        self.assertFalse(self.metrics.ready)
        self.assertEqual(c.readiness_failures(), [
            "steps of role follower not done yet "
            "(last error: upload local cache: etcd went away)",
            "local cache not uploaded"])
        self.assertEqual(c.uploaded_objects, 0)
        self.assertIn("upload local cache", c.last_error)
        self.clock.advance(1)
        self.assertFalse(c.ready)
        self.clock.advance(2)
        self.assertTrue(c.ready)
        self.assertEqual(c.uploaded_objects, 12)
        start = self.upload.attempt_times[0]
        self.assertEqual([t - start for t in self.upload.attempt_times], [0, 1, 3])
        self.assertEqual(len(self.opener.stores), 1, "the open store is reused by retries")

    def test_failed_component_start_is_retried(self):
        c = self.coordinator
        self.delegation.start_failures = 1
        c.set_role(LEADER)
        self.assertEqual(self.running(), {"pool sync": "s1"})
        self.assertFalse(c.ready)
        self.clock.advance(1)
        self.assertEqual(self.running(), {"pool sync": "s1", "delegation": "s1", "detector": "s1"})
        self.assertEqual([e for e in self.journal if e[0] == "start"], [
            ("start", "pool sync", "s1"), ("start", "delegation", "s1"),
            ("start", "detector", "s1")])

    def test_failed_step_is_logged_with_error(self):
        self.opener.failures = 1
        with capturedLogs() as events:
            self.coordinator.set_role(LEADER)
        failures = [e for e in events if e.get("step") == "open pool store"]
        self.assertEqual(len(failures), 1)
        self.assertIn("etcd unreachable", str(failures[0]["error"]))
        self.assertEqual(failures[0]["delay"], 1)
        self.clock.advance(1)


class ReadinessTests(CoordinatorTestCase):
    def test_late_synced_report_after_pending_is_ignored(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        c.set_role(PENDING)
        c.set_pool_cache_synced(True)
        self.assertFalse(c.pool_cache_synced)

    def test_detector_may_report_synced_from_inside_start(self):
        c = self.coordinator
        original = self.detector.start

        def start_and_report(store):
            d = original(store)
            c.set_pool_cache_synced(True)
            return d

        self.detector.start = start_and_report
        c.set_role(FOLLOWER)
        self.assertTrue(c.ready)

    def test_ready_waits_for_role_steps(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        c.set_pool_cache_synced(True)
        self.opener.hold = True
        c.set_role(PENDING)
        c.set_role(LEADER)
        self.assertFalse(c.ready)
        self.opener.release()
        c.set_pool_cache_synced(True)
        self.assertTrue(c.ready)

    def test_unreachable_pool_etcd_is_a_readiness_failure_naming_its_members(self):
        """While the open pool store's health checks fail (no etcd member serves, as
        when a quorum of the cluster is down), /readyz says so with the members and
        their failures; the next good check makes the agent ready again."""
        c = self.coordinator
        flips = []
        c.add_readiness_observer(flips.append)
        c.set_role(FOLLOWER)
        c.set_pool_cache_synced(True)
        self.assertTrue(c.ready)
        reason = ("no etcd member serves (each is skipped until its /health answers): "
                  "http://127.0.0.1:2379: Connection refused; "
                  "http://127.0.0.1:2381: etcd member at http://127.0.0.1:2381 has no "
                  "raft leader")
        self.opener.stores[-1].unreachable_for(reason)
        self.assertEqual(c.readiness_failures(), [f"pool etcd unreachable: {reason}"])
        self.assertEqual((self.metrics.role, self.metrics.ready), ("follower", False))
        self.opener.stores[-1].unreachable_for(None)
        self.assertTrue(c.ready)
        self.assertEqual(flips, [True, False, True])
        c.set_role(PENDING)
        self.assertEqual(self.opener.stores[-1].unreachable_observers, [],
                         "the dropped store's reachability is no longer followed")

    def test_uploaded_count_from_uploader_counts(self):
        self.upload.results = [UploadCounts(created=3, updated=2, skipped_bad=1)]
        self.coordinator.set_role(FOLLOWER)
        self.assertEqual(self.coordinator.uploaded_objects, 5)

    def test_status_document(self):
        c = self.coordinator
        status = AgentStatus(
            c, "pool-a", self.clock,
            cloud_checker=SimpleNamespace(servers=lambda: {"https://cloud": True}),
            coordinator_checker=SimpleNamespace(
                healthy=True, servers=lambda: {"https://coordinator-1": True,
                                               "https://coordinator-2": False}),
            leader=SimpleNamespace(leader="edge-2", election=lambda: {"holder": "edge-2"}),
            delegation=SimpleNamespace(delegated_heartbeats=3))
        self.clock.advance(5)
        c.set_role(FOLLOWER)
        self.clock.advance(5)
        c.set_pool_cache_synced(True)
        self.assertEqual(status.status(), {
            "node": "edge-1", "pool": "pool-a", "role": "follower", "healthy": True,
            "ready": True, "pool_cache_synced": True, "local_cache_uploaded": True,
            "leader": "edge-2", "cloud": {"https://cloud": True}, "coordinator_healthy": True,
            "coordinator_servers": {"https://coordinator-1": True,
                                    "https://coordinator-2": False},
            "last_transition": "2023-11-14T22:13:25Z", "delegated_heartbeats": 3,
            "uploaded_objects": 7, "etcd_member": None, "election": {"holder": "edge-2"},
            "cause": None, "servers_not_probed": None})


class StopTests(CoordinatorTestCase):
    def test_stop_stops_everything_and_closes_the_store_once(self):
        c = self.coordinator
        c.set_role(LEADER)
        self.take_journal()
        self.successResultOf(c.stop())
        self.assertEqual(self.take_journal(), [
            ("stop", "pool sync"), ("stop", "delegation"), ("stop", "detector"), ("close", "s1")])
        self.successResultOf(c.stop())
        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [])

    def test_stop_during_slow_open_cancels_it(self):
        c = self.coordinator
        self.opener.hold = True
        c.set_role(LEADER)
        self.successResultOf(c.stop())
        self.assertEqual(self.take_journal(), [("open cancelled",)])
        self.assertEqual(self.opener.held, [])
        self.assertEqual(self.running(), {})

    def test_stop_cancels_a_pending_retry(self):
        self.opener.failures = 1
        self.coordinator.set_role(FOLLOWER)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.successResultOf(self.coordinator.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_many_role_flips_leave_nothing_behind(self):
        c = self.coordinator
        for _ in range(100):
            for role in (LEADER, FOLLOWER, PENDING):
                c.set_role(role)
        self.assertEqual(self.running(), {})
        self.assertEqual(len(self.opener.stores), 100)
        self.assertTrue(all(s.closes == 1 for s in self.opener.stores))
        self.assertEqual(self.clock.getDelayedCalls(), [])


class HubElectorDrivesCoordinatorTests(CoordinatorTestCase):
    """The hub elector's roles fed straight into the coordinator, on one Clock."""

    def setUp(self):
        from yurtcoord.role.hubelector import HubElector

        super().setUp()

        class Health:
            healthy = True

        class Elector:
            """Like LeaderElector: stop() of a leader calls on_stopped_leading."""

            leader = None
            leading = False

            def __init__(self, started, stopped, new_leader):
                self.started_leading = started
                self.stopped_leading = stopped

            def start(self):
                electors.append(self)

            def stop(self):
                if self.leading:
                    self.leading = False
                    self.stopped_leading()
                return defer.succeed(True)

        electors = []
        self.electors = electors
        self.cloud, self.pool = Health(), Health()
        self.hub = HubElector(self.clock, self.cloud, self.pool, Elector, 5,
                              self.coordinator.set_role)

    def tearDown(self):
        self.successResultOf(self.hub.stop())
        super().tearDown()

    def test_health_changes_reach_the_components(self):
        self.hub.start()
        self.assertEqual(self.coordinator.role, FOLLOWER)
        self.assertEqual(self.running(), {"detector": "s1"})
        self.electors[-1].leading = True
        self.electors[-1].started_leading()
        self.assertEqual(self.running(), {"pool sync": "s1", "delegation": "s1", "detector": "s1"})

        self.cloud.healthy = False  # cloud lost: follower, no more leading
        self.clock.advance(5)
        self.assertEqual(self.coordinator.role, FOLLOWER)
        self.assertEqual(self.running(), {"detector": "s1"})

        self.pool.healthy = False  # coordinator lost: pending, store dropped
        self.clock.advance(5)
        self.assertEqual(self.coordinator.role, PENDING)
        self.assertEqual(self.running(), {})
        self.assertEqual(self.opener.stores[0].closes, 1)

        self.cloud.healthy = self.pool.healthy = True
        self.clock.advance(5)
        self.electors[-1].leading = True
        self.electors[-1].started_leading()
        self.assertEqual(self.running(), {"pool sync": "s2", "delegation": "s2", "detector": "s2"})
        self.coordinator.set_pool_cache_synced(True)
        self.assertTrue(self.coordinator.ready)

    def test_coordinator_lost_while_leading_stays_pending(self):
        """Fix 9 end to end: the elector's stopped-leading on stop changes nothing."""
        self.hub.start()
        self.electors[-1].leading = True
        self.electors[-1].started_leading()
        self.pool.healthy = False
        self.clock.advance(5)
        self.assertEqual(self.coordinator.role, PENDING)
        self.assertEqual(self.running(), {})


class SupersededRoleCancelsTests(CoordinatorTestCase):
    """A role change cancels the old role's step in flight and runs the new role's
    steps in the same reactor turn (no clock advance in between)."""

    def held_upload(self):
        """The next upload stays in flight; returns the times it was cancelled at."""
        cancelled = []
        self.upload.results = [defer.Deferred(
            lambda d: cancelled.append(self.clock.seconds()))]
        return cancelled

    def assert_no_step_error(self, events):
        self.assertIsNone(self.coordinator.last_error)
        self.assertEqual(self.coordinator.failed_attempts, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [], "no retry scheduled")
        self.assertEqual([e for e in events if "attempt" in e and "step" in e], [])

    def test_fakes_provide_the_component_interface(self):
        verifyObject(IRoleComponent, self.pool_sync)
        verifyObject(IRoleGauges, self.metrics)

    def test_leader_to_pending_mid_upload_stops_leader_work_at_once(self):
        c = self.coordinator
        cancelled = self.held_upload()
        c.set_role(LEADER)
        self.take_journal()
        with capturedLogs() as events:
            c.set_role(PENDING)
        self.assertEqual(cancelled, [self.clock.seconds()], "upload cancelled at once")
        self.assertEqual(self.take_journal(), [
            ("stop", "pool sync"), ("stop", "delegation"), ("stop", "detector"),
            ("close", "s1")])
        self.assertEqual(self.running(), {})
        self.assertIsNone(c.store)
        self.assertTrue(c.need_upload_local_cache)
        self.assertEqual(c.uploaded_objects, 0)
        self.assert_no_step_error(events)

        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [
            ("open", "s2"), ("start", "detector", "s2"), ("upload", "s2")])
        self.assertFalse(c.need_upload_local_cache, "uploaded again in the next healthy role")
        self.assertEqual(c.uploaded_objects, 7)

    def test_leader_to_follower_mid_upload_stops_leader_work_at_once(self):
        c = self.coordinator
        cancelled = self.held_upload()
        c.set_role(LEADER)
        self.take_journal()
        with capturedLogs() as events:
            c.set_role(FOLLOWER)
        self.assertEqual(cancelled, [self.clock.seconds()])
        # The follower's steps run in the same turn, and upload to the same store.
        self.assertEqual(self.take_journal(), [
            ("stop", "pool sync"), ("stop", "delegation"), ("upload", "s1")])
        self.assertEqual(self.running(), {"detector": "s1"})
        self.assertFalse(c.need_upload_local_cache)
        self.assertEqual(c.uploaded_objects, 7)
        self.assert_no_step_error(events)

    def test_slow_pool_sync_stop_does_not_delay_stopping_delegation(self):
        """Both leader components are told to stop in the turn the role changes; the
        store closes, and a new start happens, only after their stops finished."""
        c = self.coordinator
        cancelled = self.held_upload()
        c.set_role(LEADER)
        self.take_journal()
        self.pool_sync.hold_stop = True
        c.set_role(PENDING)
        self.assertEqual(cancelled, [self.clock.seconds()])
        self.assertEqual(self.take_journal(), [
            ("stop", "pool sync"), ("stop", "delegation"), ("stop", "detector")])
        self.assertEqual(self.opener.stores[0].closes, 0, "close waits for the stops")
        self.pool_sync.hold_stop = False
        c.set_role(LEADER)  # the pending run is superseded while it waits
        self.assertEqual(self.take_journal(), [("open", "s2")], "the dropped store is not reused")
        self.assertEqual(self.running(), {}, "pool sync has not finished stopping")
        self.pool_sync.release()
        self.assertEqual(self.take_journal(), [
            ("stopped", "pool sync"), ("close", "s1"), ("start", "pool sync", "s2"),
            ("start", "delegation", "s2"), ("start", "detector", "s2"), ("upload", "s2")])

    def test_pending_to_leader_while_a_store_open_is_in_flight(self):
        c = self.coordinator
        self.opener.hold = True
        c.set_role(LEADER)
        with capturedLogs() as events:
            c.set_role(PENDING)
            c.set_role(LEADER)
        # The first open was cancelled and the second started at once.
        self.assertEqual(self.opener.cancelled, 1)
        self.assertEqual(len(self.opener.held), 1)
        self.assertEqual(self.opener.attempt_times, [self.clock.seconds()] * 2)
        self.opener.release()
        self.assertEqual(self.take_journal(), [
            ("open cancelled",), ("open", "s1"), ("start", "pool sync", "s1"),
            ("start", "delegation", "s1"), ("start", "detector", "s1"), ("upload", "s1")])
        self.assertTrue(c.local_cache_uploaded)
        self.assert_no_step_error(events)

    def test_pool_sync_start_in_flight_is_cancelled(self):
        c = self.coordinator
        self.pool_sync.hold_start = True
        c.set_role(LEADER)
        self.assertEqual(self.take_journal(), [("open", "s1"), ("starting", "pool sync", "s1")])
        with capturedLogs() as events:
            c.set_role(FOLLOWER)
        self.assertEqual(self.pool_sync.starts_cancelled, 1)
        self.assertEqual(self.take_journal(), [
            ("start cancelled", "pool sync"), ("start", "detector", "s1"), ("upload", "s1")])
        self.assertEqual(self.running(), {"detector": "s1"})
        self.assert_no_step_error(events)

    def test_stop_cancels_the_upload(self):
        c = self.coordinator
        cancelled = self.held_upload()
        c.set_role(LEADER)
        self.take_journal()
        self.successResultOf(c.stop())
        self.assertEqual(cancelled, [self.clock.seconds()])
        self.assertEqual(self.take_journal(), [
            ("stop", "pool sync"), ("stop", "delegation"), ("stop", "detector"),
            ("close", "s1")])


class RoleObserverTests(CoordinatorTestCase):
    def test_readiness_observers_see_each_flip_once(self):
        seen = []
        self.coordinator.add_readiness_observer(seen.append)
        c = self.coordinator
        self.opener.hold = True
        c.set_role(FOLLOWER)
        self.assertEqual(seen, [])
        self.opener.release()
        c.set_pool_cache_synced(True)
        self.assertEqual(seen, [True])
        c.set_role(LEADER)
        self.assertEqual(seen, [True, False, True],
                         "not ready while the leader's steps run, ready once they are done")
        c.set_role(PENDING)
        self.assertEqual(seen, [True, False, True, False])

    def test_observers_see_every_change_once_even_while_a_step_is_cancelled(self):
        seen = []
        self.coordinator.add_role_observer(lambda previous, role: seen.append((previous, role)))
        self.upload.results.append(defer.Deferred())  # the upload stays in flight
        self.coordinator.set_role(LEADER)
        self.coordinator.set_role(LEADER)  # no change: nothing to observe
        self.coordinator.set_role(PENDING)
        self.coordinator.set_role(FOLLOWER)
        self.assertEqual(seen, [(Role.INIT, Role.LEADER), (Role.LEADER, Role.PENDING),
                                (Role.PENDING, Role.FOLLOWER)])

    def test_a_failing_observer_is_logged_and_changes_nothing(self):
        seen = []

        def broken(previous, role):
            raise RuntimeError("observer broke")

        self.coordinator.add_role_observer(broken)
        self.coordinator.add_role_observer(lambda previous, role: seen.append(role))
        self.coordinator.set_role(FOLLOWER)
        self.assertEqual(seen, [Role.FOLLOWER])
        self.assertEqual(self.coordinator.role, Role.FOLLOWER)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class LifeCycleTests(CoordinatorTestCase):
    """Every transition of the coordinator's life cycle (``_LIFE``), and every input
    its states refuse. idle, applying (a run in flight), waiting (a retry timer),
    stopping (stop() waits for the run to end) and stopped."""

    def assert_refused(self, *inputs):
        life = self.coordinator._life
        calls = {"run_done": lambda: life.run_done(),
                 "run_failed": lambda: life.run_failed(RuntimeError("late")),
                 "run_superseded": lambda: life.run_superseded(),
                 "retry_due": lambda: life.retry_due()}
        for name in inputs:
            self.assertRaises(NoTransition, calls[name])

    def assert_idle(self):
        c = self.coordinator
        self.assertFalse(c.applying)
        self.assertNotIn("not done yet", " ".join(c.readiness_failures()))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assert_refused("run_done", "run_failed", "run_superseded", "retry_due")

    def assert_waiting(self, due):
        c = self.coordinator
        self.assertTrue(c.applying)
        [retry] = self.clock.getDelayedCalls()
        self.assertEqual(retry.getTime(), due)
        self.assert_refused("run_done", "run_failed", "run_superseded")

    def test_init_is_idle(self):
        self.assertEqual(self.coordinator.role, Role.INIT)
        self.assert_idle()

    def test_idle_a_role_applies_it_and_its_end_is_idle(self):
        c = self.coordinator
        self.opener.hold = True
        c.set_role(FOLLOWER)
        self.assertTrue(c.applying)
        self.assertIn("steps of role follower not done yet", c.readiness_failures())
        self.assert_refused("retry_due")
        self.opener.release()
        self.assert_idle()
        self.assertEqual(self.running(), {"detector": "s1"})

    def test_applying_a_newer_role_cancels_the_run_and_runs_the_newest(self):
        c = self.coordinator
        self.opener.hold = True
        c.set_role(LEADER)
        c.set_role(FOLLOWER)
        self.assertEqual(self.take_journal(), [("open cancelled",)])
        self.assertEqual(self.opener.attempt_times, [self.clock.seconds()] * 2)
        self.opener.release()
        self.assertEqual(self.take_journal(), [
            ("open", "s1"), ("start", "detector", "s1"), ("upload", "s1")])
        self.assert_idle()
        self.assertEqual(c.role, FOLLOWER)

    def test_applying_a_failed_run_waits_then_retries_at_the_policy_delay(self):
        c = self.coordinator
        start = self.clock.seconds()
        self.opener.failures = 2
        c.set_role(FOLLOWER)
        self.assert_waiting(start + 1)
        self.assertEqual(c.failed_attempts, 1)
        self.clock.advance(0.999)
        self.assertEqual(len(self.opener.attempt_times), 1)
        self.clock.advance(0.001)
        self.assert_waiting(start + 1 + 2)
        self.clock.advance(2)
        self.assertEqual(self.opener.attempt_times, [start, start + 1, start + 3])
        self.assert_idle()
        self.assertIsNone(c.last_error)

    def test_a_raising_retry_policy_still_arms_the_retry(self):
        """The policy is the one step of a failed run that may raise: the retry is
        armed with ROLE_RETRY's pause instead (at most 0.5 s for the first)."""
        calls = []

        def policy(attempt):
            calls.append(attempt)
            raise ValueError("policy broke")

        c = Coordinator(self.clock, "edge-2", self.opener, self.pool_sync, self.delegation,
                        self.detector, self.upload, retry_delay=policy)
        self.addCleanup(c.stop)
        self.opener.failures = 1
        c.set_role(FOLLOWER)
        [retry] = self.clock.getDelayedCalls()
        self.assertTrue(0.4 <= retry.getTime() - self.clock.seconds() <= 0.5)
        self.assertEqual(calls, [1])
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)
        self.clock.advance(0.5)
        self.assertFalse(c.applying)
        self.successResultOf(c.stop())

    def test_waiting_a_role_cancels_the_retry_and_applies_it(self):
        c = self.coordinator
        self.opener.failures = 1
        c.set_role(LEADER)
        self.assert_waiting(self.clock.seconds() + 1)
        c.set_role(FOLLOWER)
        self.assertEqual(c.failed_attempts, 0)
        self.assert_idle()
        self.assertEqual(self.running(), {"detector": "s1"})

    def test_idle_stop_is_stopped_for_good(self):
        c = self.coordinator
        c.set_role(FOLLOWER)
        self.take_journal()
        self.successResultOf(c.stop())
        self.assertEqual(self.take_journal(), [("stop", "detector"), ("close", "s1")])
        self.assertFalse(c.applying)
        self.assertIn("steps of role follower not done yet", c.readiness_failures())
        c.set_role(LEADER)  # stopped: ignored
        self.assertEqual(c.role, FOLLOWER)
        self.successResultOf(c.stop())  # later stops fire at once
        self.assertEqual(self.take_journal(), [])
        self.assert_refused("run_done", "run_failed", "run_superseded", "retry_due")

    def test_waiting_stop_cancels_the_retry(self):
        c = self.coordinator
        self.opener.failures = 1
        c.set_role(FOLLOWER)
        self.successResultOf(c.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertFalse(c.applying)
        self.assert_refused("run_done", "run_failed", "run_superseded", "retry_due")

    def stop_while_uploading(self, on_cancel):
        """A follower's run waits on its upload; stop() cancels it and
        ``on_cancel(upload)`` decides how the run ends, in the stopping state."""
        c = self.coordinator
        seen = []

        def cancel(upload):
            seen.append((c.applying, c.ready))
            on_cancel(upload)

        self.upload.results.append(defer.Deferred(cancel))
        c.set_role(FOLLOWER)
        self.take_journal()
        stopped = c.stop()
        self.assertEqual(seen, [(True, False)], "applying, not ready while stopping")
        self.successResultOf(stopped)
        self.assertFalse(c.applying)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.take_journal(), [("stop", "detector"), ("close", "s1")])
        self.assert_refused("run_done", "run_failed", "run_superseded", "retry_due")

    def test_stopping_a_run_that_ends_cancelled_is_stopped(self):
        self.stop_while_uploading(lambda upload: None)
        self.assertFalse(self.coordinator.local_cache_uploaded)

    def test_stopping_a_run_that_ends_done_is_stopped(self):
        self.stop_while_uploading(lambda upload: upload.callback(UploadCounts(created=3)))
        self.assertEqual(self.coordinator.uploaded_objects, 3)

    def test_stopping_a_run_that_ends_failed_is_stopped_without_retry(self):
        self.stop_while_uploading(lambda upload: upload.errback(RuntimeError("etcd gone")))
        self.assertEqual(self.coordinator.failed_attempts, 0)

    def test_stopping_ignores_roles_and_later_stops_fire_at_once(self):
        c = self.coordinator
        fired = []

        def during_stop(upload):
            c.set_role(LEADER)
            c.stop().addCallback(lambda _: fired.append("second"))

        self.upload.results.append(defer.Deferred(during_stop))
        c.set_role(FOLLOWER)
        c.stop().addCallback(lambda _: fired.append("first"))
        self.assertEqual(fired, ["second", "first"])
        self.assertEqual(c.role, FOLLOWER)
        self.assertEqual(self.running(), {})
