"""The cloud lease log the end-to-end tests judge heartbeats by."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord, build_lease, with_record
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.cloudleases import CloudLeaseChanges


class CloudLeaseChangesTests(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.server = KubeAPIServer(self.clock)
        self.changes = CloudLeaseChanges(self.server, self.clock)
        self.addCleanup(self.changes.stop)

    def test_a_delegated_write_without_renew_time_is_no_renewal(self):
        """A delegated write whose lease carries no renewTime renewed nothing; the
        renewals around it are still listed."""
        store = self.server.store
        annotations = {DELEGATE_HEARTBEAT_ANNOTATION: "true"}
        lease = store.create(LEASES, build_lease(
            "edge-1", NODE_LEASE_NAMESPACE, LeaseRecord("edge-1", 40),
            annotations=annotations), NODE_LEASE_NAMESPACE)
        self.clock.advance(1)
        store.update(LEASES, with_record(lease, LeaseRecord("edge-1", 40, renew_time=1001.0)),
                     NODE_LEASE_NAMESPACE)
        self.assertEqual(self.changes.delegated("edge-1", since=0.0), [1001.0])
