"""The status sources without a server: the initial status of an agent that is
starting, and the status of an agent without the coordinator (role init for good,
live cloud health)."""

from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.agent.status import CloudOnlyStatus, IStatusSource, InitialStatus, rfc3339
from yurtcoord.testing.agentdocuments import STATUS_KEYS


class InitialStatusTests(unittest.TestCase):
    def test_provides_the_interface(self):
        source = InitialStatus("edge-1", "pool-a", ["https://a"])
        self.assertTrue(verifyObject(IStatusSource, source))
        self.assertEqual((source.role, source.healthy, source.ready), ("init", False, False))
        self.assertEqual(len(source.readiness_failures()), 3)

    def test_rfc3339(self):
        self.assertEqual(rfc3339(1700000000.75), "2023-11-14T22:13:20Z")


class CloudOnlyStatusTests(unittest.TestCase):
    """An agent without the coordinator: role init for good, live cloud health."""

    def setUp(self):
        self.cloud = {"https://a:6443": False, "https://b:6443": True}
        self.source = CloudOnlyStatus("edge-1", "pool-a", lambda: dict(self.cloud), since=0)

    def test_provides_the_interface_and_is_never_ready(self):
        self.assertTrue(verifyObject(IStatusSource, self.source))
        self.assertEqual((self.source.role, self.source.healthy, self.source.ready),
                         ("init", False, False))
        self.assertEqual(self.source.readiness_failures(),
                         ["coordinator not enabled on this node (role init)"])

    def test_status_shows_the_cloud_health_of_the_moment(self):
        document = self.source.status()
        self.assertEqual(set(document), STATUS_KEYS)
        self.assertEqual(document["cloud"], {"https://a:6443": False, "https://b:6443": True})
        self.cloud["https://a:6443"] = True
        self.assertEqual(self.source.status()["cloud"],
                         {"https://a:6443": True, "https://b:6443": True})
        self.assertEqual(document["last_transition"], "1970-01-01T00:00:00Z")
        # No coordinator apiserver is used without the coordinator.
        self.assertEqual(document["coordinator_servers"], {})
