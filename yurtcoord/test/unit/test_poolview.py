"""The pool view's parts on their own: the heartbeat path of a member judged from its
node lease (direct, delegated or stale), and the leader history on a ``task.Clock``,
newest last and bounded."""

import time

from twisted.internet import task
from twisted.trial import unittest

from yurtcoord.agent.poolview import (
    DELEGATED, DIRECT, LEADER_CHANGES_KEPT, STALE, LeaderHistory, heartbeat_path,
)
from yurtcoord.role.roles import Role
from yurtcoord.testing.poolleases import lease


class HeartbeatPathTests(unittest.TestCase):
    def test_paths(self):
        now = time.time()
        self.assertEqual(heartbeat_path(None, now, 9), (STALE, None))
        self.assertEqual(heartbeat_path({"spec": {}}, now, 9), (STALE, None))
        self.assertEqual(heartbeat_path({"spec": {"renewTime": "garbage"}}, now, 9),
                         (STALE, None))
        path, age = heartbeat_path(lease("n", 3), now, 9)
        self.assertEqual(path, DIRECT)
        self.assertLessEqual(abs(age - 3), 0.1)
        self.assertEqual(heartbeat_path(lease("n", 3, delegated=True), now, 9)[0], DELEGATED)
        self.assertEqual(heartbeat_path(lease("n", 9.5, delegated=True), now, 9)[0], STALE)
        # A renewTime ahead of this clock is fresh, of age 0.
        self.assertEqual(heartbeat_path(lease("n", -5), now, 9), (DIRECT, 0.0))


class LeaderHistoryTests(unittest.TestCase):
    def test_changes_are_kept_with_times_newest_last(self):
        clock = task.Clock()
        clock.advance(1_700_000_000)
        history = LeaderHistory(clock, "edge-1")
        history.leader_seen("edge-2")
        history.leader_seen("edge-2")
        clock.advance(30)
        history.role_changed(Role.FOLLOWER, Role.LEADER)
        history.role_changed(Role.LEADER, Role.FOLLOWER)
        history.leader_seen("")
        self.assertEqual(history.changes(), [
            {"time": "2023-11-14T22:13:20Z", "at": 1_700_000_000, "leader": "edge-2"},
            {"time": "2023-11-14T22:13:50Z", "at": 1_700_000_030, "leader": "edge-1"}])
        for i in range(LEADER_CHANGES_KEPT + 5):
            clock.advance(1)
            history.leader_seen(f"edge-{i % 2 + 2}")
        changes = history.changes()
        self.assertEqual(len(changes), LEADER_CHANGES_KEPT)
        self.assertEqual(changes[-1]["at"], 1_700_000_030 + LEADER_CHANGES_KEPT + 5)
