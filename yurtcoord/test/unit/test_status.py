"""The status sources without a server: the initial status of an agent that is
starting, and the status of an agent without the coordinator (role init for good,
live cloud health)."""

from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.agent.statussources import (
    CloudOnlyStatus, IStatusSource, InitialStatus, rfc3339,
)
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


class CredentialsNeverShownTests(unittest.TestCase):
    """A server URL with credentials (``https://admin:S3cret@...``) shows on no page
    and in no metric label: configuration refuses such URLs, and what the pages show
    of a URL from elsewhere (an etcd member the cluster names) is masked too."""

    URL = "https://admin:S3cret@10.0.0.1:6443"

    def test_status_and_metrics_mask_the_credentials(self):
        from yurtcoord.agent.metrics import Metrics
        from yurtcoord.agent.statuspages import metrics_page, status_page

        source = CloudOnlyStatus("edge-1", "pool-a", lambda: {self.URL: True}, since=0)
        metrics = Metrics("edge-1", "pool-a")
        metrics.set_coordinator_server_healthy("https://root:t0ken@10.0.0.2:443", True)
        shown = [status_page(source)[2].decode(), metrics_page(metrics)(source)[2].decode()]
        for body in shown:
            self.assertNotIn("S3cret", body)
            self.assertNotIn("admin", body)
            self.assertNotIn("t0ken", body)
        self.assertIn('"https://***@10.0.0.1:6443": true', shown[0])
        self.assertIn('server="https://***@10.0.0.1:6443"', shown[1])
        self.assertIn('server="https://***@10.0.0.2:443"', shown[1])
