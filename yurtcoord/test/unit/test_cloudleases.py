"""The cloud lease log the end-to-end tests judge heartbeats by."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import LeaseRecord, build_lease, with_record
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.testing.cloudleases import CloudLeaseChanges, CloudLeaseSampler


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


class CloudLeaseSamplerIncreasesTests(unittest.TestCase):
    """The sampler judges a lease as the node lifecycle controller does: by when it saw
    the renewTime increase on its own clock, whatever time the renewTime names."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1000)
        self.server = KubeAPIServer(self.clock)
        self.lease = self.server.store.create(LEASES, build_lease(
            "edge-1", NODE_LEASE_NAMESPACE, LeaseRecord("edge-1", 40, renew_time=1300.0)),
            NODE_LEASE_NAMESPACE)
        self.sampler = CloudLeaseSampler(self.server, ["edge-1"], self.clock, every=0.5)
        self.addCleanup(self.sampler.stop)

    def renew(self, renewed):
        self.lease = self.server.store.update(
            LEASES, with_record(self.lease, LeaseRecord("edge-1", 40, renew_time=renewed)),
            NODE_LEASE_NAMESPACE)

    def test_increases_minutes_ahead_count_and_others_do_not(self):
        # A writer 300 s ahead, then one 120 s behind it (no increase), then 1 µs past.
        for second, renewed in ((2, 1302.0), (4, 1304.0), (6, 1180.0), (8, 1304.000001)):
            self.clock.advance(second - (self.clock.seconds() - 1000))
            self.renew(renewed)
            self.sampler.sample()
        self.assertEqual([at for at, _ in self.sampler.increases["edge-1"]],
                         [1002.0, 1004.0, 1008.0])
        self.assertEqual(self.sampler.seen_increasing("edge-1", 1003.0), 2)
        self.assertEqual(self.sampler.longest_gap("edge-1", 1000.0, 1010.0), 4.0)
        self.assertEqual(self.sampler.last_increase("edge-1"), 1008.0)
