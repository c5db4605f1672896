"""The one place an agent takes the pool's leader from, and the first cause it names,
on a ``task.Clock``:

- ``ElectionLeader`` / ``ElectionLeaseReader``: the election lease read every interval
  whatever the role, so a cut-off agent names a new leader within one interval; the
  holder expires once its renewTime is not seen to change for its duration, whatever
  the holder's clock says; each new term is recorded once, dated by the lease's
  acquireTime (``dated_by: "lease"``) or, without one, by when it was read (``"seen"``);
- ``first_cause`` / ``AgentCauses``: a dead kubelet comes first and its servers are
  then not probed, not unhealthy; then the coordinator, the cloud, etcd, the pool cache.

The fakes provide the declared interfaces, checked with ``verifyObject``.
"""

from types import SimpleNamespace
from typing import Any, Callable, Optional

from twisted.internet import task
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent.causes import (
    CLOUD_UNREACHABLE, COORDINATOR_UNREACHABLE, ETCD_UNREACHABLE, KUBELET_DEAD,
    POOL_CACHE_NOT_SYNCED, AgentCauses, CauseFacts, first_cause, not_probed,
)
from yurtcoord.agent.statussources import AgentStatus
from yurtcoord.heartbeat.interfaces import ICoordinatorHealthChecker, IKubeletLiveness
from yurtcoord.kube.errors import ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import LeaseRecord, build_lease
from yurtcoord.role.leadersource import (
    ElectionLeader, ElectionLeaseReader, ILeaderSource, LeaderHistory,
)
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakekube import FakeKube

START = 1_700_000_000.0
ELECTION = ("kube-system", "yurthub")
DURATION = 15
RETRY = 2.0


def election_lease(holder: str, renewed: float, acquired: Optional[float],
                   transitions: int) -> dict[str, Any]:
    return build_lease(ELECTION[1], ELECTION[0],
                       LeaseRecord(holder, DURATION, acquired, renewed, transitions))


class LeaderSourceTests(unittest.TestCase):
    """An agent cut off from the cloud reads the lease the others write; the writers'
    clocks are 300 s ahead of it."""

    SKEW = 300.0

    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(START)
        self.coordinator = FakeKube(self.clock)
        self.leader = ElectionLeader(self.clock)
        self.reader = ElectionLeaseReader(self.clock, self.coordinator, ELECTION, self.leader,
                                          interval=RETRY, timeout=1.0)
        self.seen: list[Optional[str]] = []
        self.leader.add_leader_observer(self.seen.append)

    def tearDown(self):
        self.successResultOf(self.reader.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def write(self, holder, acquired=None, transitions=0):
        """``holder`` writes the lease now, on its clock (``SKEW`` ahead)."""
        now = self.clock.seconds() + self.SKEW
        self.coordinator.put(LEASES, election_lease(holder, now, acquired, transitions))

    def test_the_fakes_offer_the_interfaces(self):
        verifyObject(IObjectClient, self.coordinator)
        verifyObject(ILeaderSource, self.leader)

    def test_a_new_leader_is_named_within_one_interval_and_dated_by_the_lease(self):
        acquired = START + self.SKEW
        self.write("edge-1", acquired=acquired, transitions=0)
        self.reader.start()
        self.assertEqual(self.leader.leader, "edge-1")
        self.assertEqual(self.leader.changes(), [{
            "time": "2023-11-14T22:18:20Z", "at": acquired, "leader": "edge-1",
            "dated_by": "lease", "seen": "2023-11-14T22:13:20Z", "seen_at": START,
            "lease_transitions": 0}])
        # edge-2 takes over; edge-1 renews no more. Read again every RETRY.
        self.clock.advance(5)
        takeover = self.clock.seconds() + self.SKEW
        self.write("edge-2", acquired=takeover, transitions=1)
        self.clock.advance(RETRY)
        self.assertEqual(self.leader.leader, "edge-2")
        self.assertEqual(self.seen, ["edge-1", "edge-2"])
        last = self.leader.changes()[-1]
        self.assertEqual((last["leader"], last["at"], last["dated_by"], last["seen_at"]),
                         ("edge-2", takeover, "lease", START + 5 + RETRY))
        election = self.leader.election()
        self.assertEqual((election["holder"], election["lease_transitions"],
                          election["read_age"], election["read_error"]),
                         ("edge-2", 1, 0.0, None))
        # Renewals of the same term are no new entry.
        for _ in range(5):
            self.write("edge-2", acquired=takeover, transitions=1)
            self.clock.advance(RETRY)
        self.assertEqual(len(self.leader.changes()), 2)

    def test_a_lease_without_acquire_time_is_dated_when_seen(self):
        self.clock.advance(3)
        self.write("edge-3")
        self.reader.start()
        [change] = self.leader.changes()
        self.assertEqual((change["dated_by"], change["at"]), ("seen", START + 3))

    def test_the_holder_expires_by_the_local_clock_only(self):
        self.write("edge-1", acquired=START, transitions=0)
        self.reader.start()
        # The renewTime is 300 s ahead of this clock: no matter, it was just seen.
        self.assertFalse(self.leader.expired)
        self.clock.advance(DURATION)
        self.assertEqual(self.leader.leader, "edge-1")
        self.clock.advance(RETRY)
        self.assertIsNone(self.leader.leader)
        self.assertEqual(self.leader.election()["holder"], "edge-1")
        self.assertEqual(self.seen, ["edge-1", None])

    def test_a_failed_read_keeps_the_last_lease_and_says_why(self):
        self.write("edge-1", acquired=START)
        self.reader.start()
        self.coordinator.fail_next("get", ServerError("etcd down", code=503))
        self.clock.advance(RETRY)
        self.assertEqual(self.leader.leader, "edge-1")
        election = self.leader.election()
        self.assertEqual(election["read_age"], RETRY)
        self.assertIn("etcd down", election["read_error"])

    def test_the_same_holder_after_transitions_moved_is_a_new_term(self):
        self.write("edge-1", acquired=START, transitions=0)
        self.reader.start()
        self.write("edge-1", acquired=START + 50, transitions=2)
        self.reader.read_now()
        self.assertEqual([(c["leader"], c["lease_transitions"]) for c in
                          self.leader.changes()], [("edge-1", 0), ("edge-1", 2)])

    def test_no_lease_is_no_leader_and_the_history_is_bounded(self):
        self.reader.start()
        self.assertIsNone(self.leader.leader)
        self.assertIsNone(self.leader.expired)
        history = LeaderHistory(kept=3)
        for i in range(5):
            history.add(f"edge-{i}", START + i, None, i)
        self.assertEqual([c["leader"] for c in history.changes()],
                         ["edge-2", "edge-3", "edge-4"])


@implementer(IKubeletLiveness)
class FakeKubelet:
    """Dead since ``died_at`` on ``clock`` (None: alive)."""

    def __init__(self, clock: task.Clock) -> None:
        self.clock = clock
        self.died_at: Optional[float] = None

    def is_alive(self) -> bool:
        return self.died_at is None

    def dead_for(self) -> Optional[float]:
        return None if self.died_at is None else self.clock.seconds() - self.died_at

    def add_listener(self, callback: Callable[[bool], object]) -> None:
        pass


@implementer(ICoordinatorHealthChecker)
class FakeCoordinatorHealth(FakeHealth):
    """``FakeHealth`` over coordinator apiservers: every server as healthy as the set,
    ``reasons`` why each failed."""

    def __init__(self, servers: tuple[str, ...]) -> None:
        super().__init__(picks_from=servers)
        self.reasons: dict[str, str] = {}

    def unhealthy_reasons(self) -> dict[str, str]:
        return dict(self.reasons)

    def pick_server(self) -> str:
        return str(self.picks_from[0])

    def suspect(self, server: str) -> None:
        pass


class CauseTests(unittest.TestCase):

    def test_the_causes_in_their_order(self):
        everything = CauseFacts(kubelet_dead_for=42.4, coordinator_healthy=False,
                                cloud_healthy=False, coordinator_reasons={"u": "refused"},
                                etcd_unreachable="no quorum", pool_cache_synced=False)
        kinds = []
        facts = everything
        for change in ({"kubelet_dead_for": None}, {"coordinator_healthy": True},
                       {"cloud_healthy": True}, {"etcd_unreachable": None},
                       {"pool_cache_synced": True}):
            cause = first_cause(facts)
            kinds.append(None if cause is None else cause.kind)
            facts = CauseFacts(**{**facts.__dict__, **change})
        kinds.append(first_cause(facts))
        self.assertEqual(kinds, [KUBELET_DEAD, COORDINATOR_UNREACHABLE, CLOUD_UNREACHABLE,
                                 ETCD_UNREACHABLE, POOL_CACHE_NOT_SYNCED, None])
        self.assertEqual(first_cause(everything).text, "kubelet dead for 42s")
        self.assertEqual(not_probed(first_cause(everything)), "not probed: kubelet dead for 42s")
        self.assertIsNone(not_probed(first_cause(CauseFacts(cloud_healthy=False))))
        self.assertEqual(first_cause(CauseFacts(coordinator_healthy=False,
                                                coordinator_reasons={"u": "refused"})).text,
                         "coordinator apiservers unreachable: refused")

    def test_a_dead_kubelet_leaves_the_servers_not_probed_in_the_status(self):
        clock = task.Clock()
        clock.advance(START)
        kubelet = FakeKubelet(clock)
        cloud = FakeHealth(picks_from=("https://cloud:6443",))
        coordinator = FakeCoordinatorHealth(("https://c1:6443", "https://c2:6443"))
        verifyObject(IKubeletLiveness, kubelet)
        verifyObject(ICoordinatorHealthChecker, coordinator)
        causes = AgentCauses(kubelet, cloud, coordinator, lambda: None, lambda: True)
        leader = ElectionLeader(clock)
        leader.observe(election_lease("edge-2", START, START, 0))
        node = SimpleNamespace(
            role=SimpleNamespace(value="follower"), healthy=True, ready=True,
            pool_cache_synced=True, local_cache_uploaded=True, uploaded_objects=0,
            node_name="edge-1", add_role_observer=lambda observer: None)
        status = AgentStatus(node, "pool-a", clock, cloud, coordinator, leader,
                             SimpleNamespace(delegated_heartbeats=0), causes=causes)
        document = status.status()
        self.assertEqual((document["cause"], document["servers_not_probed"],
                          document["cloud"], document["leader"]),
                         (None, None, {"https://cloud:6443": True}, "edge-2"))
        # The kubelet dies; the probes that follow fail without a request.
        kubelet.died_at = clock.seconds()
        clock.advance(42)
        cloud.healthy = coordinator.healthy = False
        coordinator.reasons = {"https://c1:6443": "kubelet has not been healthy"}
        document = status.status()
        self.assertEqual(document["cause"], {"kind": KUBELET_DEAD,
                                             "text": "kubelet dead for 42s"})
        self.assertEqual(document["servers_not_probed"], "not probed: kubelet dead for 42s")
        self.assertEqual(document["cloud"], {"https://cloud:6443": None})
        self.assertEqual(document["coordinator_servers"],
                         {"https://c1:6443": None, "https://c2:6443": None})
        self.assertIsNone(document["coordinator_healthy"])
        # The leader is still read from the lease, which the leader renews.
        leader.observe(election_lease("edge-2", START + 42, START, 0))
        self.assertEqual(status.status()["leader"], "edge-2")
