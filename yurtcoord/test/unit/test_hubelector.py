"""Hub elector: health → role, candidacy start/stop, stale elector callbacks (fix 9)."""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyClass, verifyObject

from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import ILeaderElector
from yurtcoord.kube.leaderelection import LeaderElector
from yurtcoord.role.hubelector import HubElector
from yurtcoord.role.roles import Role
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakekube import FakeKube

CHECK = 5


@implementer(ILeaderElector)
class FakeElector:
    """Stands for LeaderElector: the test fires its callbacks by hand."""

    def __init__(self, on_started_leading, on_stopped_leading, on_new_leader):
        self.started_leading = on_started_leading
        self.stopped_leading = on_stopped_leading
        self.new_leader = on_new_leader
        self.leader = None
        self.starts = 0
        self.stops = 0
        self.stop_result = defer.succeed(None)

    def start(self):
        self.starts += 1

    def stop(self):
        self.stops += 1
        return self.stop_result


class FakeElectorTests(unittest.TestCase):
    def test_the_fake_and_the_real_elector_fit_the_contract(self):
        self.assertTrue(verifyObject(ILeaderElector, FakeElector(None, None, None)))
        # The real one is not declared (kube/leaderelection.py); its methods fit.
        self.assertTrue(verifyClass(ILeaderElector, LeaderElector, tentative=True))


class HubElectorTests(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.cloud = FakeHealth(True)
        self.coordinator = FakeHealth(True)
        self.electors = []
        self.roles = []

        def factory(*callbacks):
            elector = FakeElector(*callbacks)
            self.electors.append(elector)
            return elector

        self.hub = HubElector(self.clock, self.cloud, self.coordinator, factory, CHECK,
                              self.roles.append)

    def tearDown(self):
        self.successResultOf(self.hub.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_starts_in_init_without_emitting(self):
        self.assertEqual(self.hub.role, Role.INIT)
        self.assertEqual(self.roles, [])

    def test_coordinator_unhealthy_is_pending_without_candidacy(self):
        self.coordinator.healthy = False
        self.hub.start()
        self.clock.advance(CHECK)
        self.clock.advance(CHECK)
        self.assertEqual(self.roles, [Role.PENDING])
        self.assertEqual(self.electors, [])

    def test_cloud_unhealthy_is_follower_without_candidacy(self):
        self.cloud.healthy = False
        self.hub.start()
        self.clock.advance(CHECK)
        self.assertEqual(self.roles, [Role.FOLLOWER])
        self.assertEqual(self.electors, [])

    def test_healthy_stands_as_follower_then_leads_when_it_wins(self):
        self.hub.start()
        self.assertEqual(self.roles, [Role.FOLLOWER])
        self.assertEqual(len(self.electors), 1)
        self.assertEqual(self.electors[0].starts, 1)
        self.electors[0].leader = "edge-1"
        self.electors[0].new_leader("edge-1")
        self.electors[0].started_leading()
        self.assertEqual(self.roles, [Role.FOLLOWER, Role.LEADER])
        self.assertEqual(self.hub.leader, "edge-1")
        self.clock.advance(CHECK)
        self.clock.advance(CHECK)
        self.assertEqual(len(self.electors), 1, "a running candidacy is not restarted")
        self.assertEqual(self.roles, [Role.FOLLOWER, Role.LEADER])

    def test_full_cycle_of_roles(self):
        self.coordinator.healthy = False
        self.hub.start()
        self.coordinator.healthy = True
        self.clock.advance(CHECK)
        self.electors[0].started_leading()
        self.cloud.healthy = False
        self.clock.advance(CHECK)
        self.coordinator.healthy = False
        self.clock.advance(CHECK)
        self.assertEqual(self.roles,
                         [Role.PENDING, Role.FOLLOWER, Role.LEADER, Role.FOLLOWER, Role.PENDING])

    def test_cloud_lost_while_leading_gives_up_the_lease(self):
        self.hub.start()
        self.electors[0].started_leading()
        self.cloud.healthy = False
        self.clock.advance(CHECK)
        self.assertEqual(self.hub.role, Role.FOLLOWER)
        self.assertEqual(self.electors[0].stops, 1)
        self.assertFalse(self.hub.electing)
        self.assertIsNone(self.hub.leader)
        self.clock.advance(CHECK)
        self.assertEqual(len(self.electors), 1, "no candidacy without the cloud")
        self.cloud.healthy = True
        self.clock.advance(CHECK)
        self.assertEqual(len(self.electors), 2)
        self.assertEqual(self.electors[1].starts, 1)

    def test_late_stopped_leading_keeps_pending(self):
        """Fix 9: the cancelled election's late callback must not make it a follower."""
        self.hub.start()
        old = self.electors[0]
        old.started_leading()
        self.coordinator.healthy = False
        self.clock.advance(CHECK)
        self.assertEqual(self.hub.role, Role.PENDING)
        old.stopped_leading()
        old.new_leader("edge-2")
        old.started_leading()
        self.assertEqual(self.hub.role, Role.PENDING)
        self.assertEqual(self.roles, [Role.FOLLOWER, Role.LEADER, Role.PENDING])
        self.assertIsNone(self.hub.leader)
        self.assertEqual(len(self.electors), 1, "no candidacy while pending")

    def test_callbacks_of_a_replaced_elector_are_ignored(self):
        self.hub.start()
        first = self.electors[0]
        self.cloud.healthy = False
        self.clock.advance(CHECK)
        self.cloud.healthy = True
        self.clock.advance(CHECK)
        first.started_leading()
        self.assertEqual(self.hub.role, Role.FOLLOWER)
        self.electors[1].started_leading()
        self.assertEqual(self.hub.role, Role.LEADER)

    def test_leader_observers_hear_the_current_candidacy_only(self):
        seen = []
        self.hub.add_leader_observer(seen.append)
        self.hub.add_leader_observer(lambda leader: 1 / 0)
        self.hub.start()
        first = self.electors[0]
        first.new_leader("edge-3")
        self.cloud.healthy = False
        self.clock.advance(CHECK)
        self.cloud.healthy = True
        self.clock.advance(CHECK)
        first.new_leader("edge-4")
        self.electors[1].new_leader("edge-5")
        self.assertEqual(seen, ["edge-3", "edge-5"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 2)

    def test_first_check_waits_until_health_is_known(self):
        known = defer.Deferred()
        self.hub.start(health_known=known)
        self.clock.advance(CHECK * 3)
        self.assertEqual((self.hub.role, self.roles, self.electors), (Role.INIT, [], []))
        known.callback(None)
        self.assertEqual(self.roles, [Role.FOLLOWER])
        self.assertEqual(len(self.electors), 1)

    def test_stop_while_waiting_for_health_cancels_the_wait(self):
        known = defer.Deferred()
        self.hub.start(health_known=known)
        self.successResultOf(self.hub.stop())
        self.assertTrue(known.called, "the wait was cancelled")
        self.assertEqual((self.roles, self.electors), ([], []))

    def test_losing_the_lease_makes_follower_and_stays_candidate(self):
        self.hub.start()
        self.electors[0].started_leading()
        self.electors[0].stopped_leading()
        self.assertEqual(self.roles, [Role.FOLLOWER, Role.LEADER, Role.FOLLOWER])
        self.assertEqual(self.electors[0].stops, 0)
        self.clock.advance(CHECK)
        self.assertEqual(len(self.electors), 1)
        self.electors[0].started_leading()
        self.assertEqual(self.roles[-1], Role.LEADER)

    def test_leader_is_read_from_the_running_election(self):
        self.hub.start()
        self.electors[0].leader = "edge-3"
        self.assertEqual(self.hub.leader, "edge-3")
        self.coordinator.healthy = False
        self.clock.advance(CHECK)
        self.assertIsNone(self.hub.leader)

    def test_roles_only_change_at_checks(self):
        self.hub.start()
        self.coordinator.healthy = False
        self.clock.advance(CHECK - 0.1)
        self.assertEqual(self.hub.role, Role.FOLLOWER)
        self.clock.advance(0.1)
        self.assertEqual(self.hub.role, Role.PENDING)

    def test_stop_waits_for_the_elector_to_release(self):
        self.hub.start()
        elector = self.electors[0]
        elector.started_leading()
        elector.stop_result = defer.Deferred()
        stopped = self.hub.stop()
        self.assertNoResult(stopped)
        self.assertEqual(elector.stops, 1)
        elector.stop_result.callback(None)
        self.successResultOf(stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        elector.stopped_leading()
        self.assertEqual(self.hub.role, Role.LEADER, "no callback after stop changes the role")

    def test_a_failing_elector_stop_does_not_break_the_hub(self):
        self.hub.start()
        self.electors[0].stop_result = defer.fail(RuntimeError("release failed"))
        self.coordinator.healthy = False
        self.clock.advance(CHECK)
        self.assertEqual(self.hub.role, Role.PENDING)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_a_raising_role_callback_does_not_stop_the_checks(self):
        calls = []

        def on_role(role):
            calls.append(role)
            if role == Role.FOLLOWER:
                raise RuntimeError("consumer broke")

        hub = HubElector(self.clock, self.cloud, self.coordinator, FakeElector, CHECK, on_role)
        hub.start()
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.coordinator.healthy = False
        self.clock.advance(CHECK)
        self.assertEqual(calls, [Role.FOLLOWER, Role.PENDING])
        self.successResultOf(hub.stop())

    def test_a_raising_role_callback_does_not_skip_the_candidacy(self):
        def on_role(role):
            raise RuntimeError("consumer broke")

        hub = HubElector(self.clock, self.cloud, self.coordinator, FakeElector, CHECK, on_role)
        hub.start()
        self.assertTrue(hub.electing)
        self.flushLoggedErrors(RuntimeError)
        self.successResultOf(hub.stop())


class HubElectorWithLeaseElectionTests(unittest.TestCase):
    """Two hubs electing through the real LeaderElector on one in-memory lease."""

    def setUp(self):
        from yurtcoord.kube.leaderelection import LeaderElectionConfig, LeaderElector

        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.client = FakeKube()
        self.cloud = FakeHealth(True)
        self.health = {}
        self.roles = {}
        self.hubs = {}
        for node in ("edge-a", "edge-b"):
            config = LeaderElectionConfig("kube-system", "yurthub", node, lease_duration=15,
                                          renew_deadline=10, retry_period=2)

            def factory(started, stopped, new_leader, config=config):
                return LeaderElector(self.clock, self.client, config, started, stopped,
                                     new_leader, random=lambda: 0.0)

            self.health[node] = FakeHealth(True)
            self.roles[node] = []
            self.hubs[node] = HubElector(self.clock, self.cloud, self.health[node], factory,
                                         CHECK, self.roles[node].append)

    def tearDown(self):
        for hub in self.hubs.values():
            self.successResultOf(hub.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def advance(self, seconds, step=0.5):
        for _ in range(int(seconds / step)):
            self.clock.advance(step)

    def lease_holder(self):
        lease = self.client.peek(LEASES, "yurthub", "kube-system")
        return lease["spec"].get("holderIdentity") if lease else None

    def test_one_leader_and_handover_when_its_coordinator_is_lost(self):
        for hub in self.hubs.values():
            hub.start()
        self.advance(1)
        leaders = [n for n, h in self.hubs.items() if h.role == Role.LEADER]
        self.assertEqual(len(leaders), 1)
        leader = leaders[0]
        other = "edge-b" if leader == "edge-a" else "edge-a"
        self.assertEqual(self.hubs[other].role, Role.FOLLOWER)
        self.assertEqual(self.lease_holder(), leader)
        self.assertEqual(self.hubs[other].leader, leader)

        self.health[leader].healthy = False
        self.advance(CHECK)
        self.assertEqual(self.hubs[leader].role, Role.PENDING)
        self.assertEqual(self.roles[leader], [Role.FOLLOWER, Role.LEADER, Role.PENDING],
                         "the elector's stopped-leading on stop must not make it follower")
        self.advance(2 + 0.5)  # the released lease is taken within one retry period
        self.assertEqual(self.hubs[other].role, Role.LEADER)
        self.assertEqual(self.lease_holder(), other)
        self.advance(30)
        self.assertEqual(self.hubs[leader].role, Role.PENDING)
