"""Renewals of other machines' leases seen on this agent's own ``Clock``: a changed
renewTime counts from the moment it was seen, whatever time it names; the same
renewTime seen again, or a lease seen for the first time, is as the module says."""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.kube.lease import LeaseRecord, build_lease
from yurtcoord.kube.renewals import RenewalsSeen, renew_mark

START = 1_700_000_000.0


def lease_renewed_at(renewed):
    """A node lease whose renewTime is ``renewed`` (the writer's clock)."""
    return build_lease("edge-2", "kube-node-lease", LeaseRecord("edge-2", 40, None, renewed))


class RenewalsSeenTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.seen = RenewalsSeen(self.clock)

    def test_a_lease_seen_first_counts_as_changed_then_whatever_its_renew_time(self):
        for key, offset in (("ahead", 300.0), ("behind", -120.0), ("long ago", -86400.0)):
            self.assertEqual(self.seen.observe(key, lease_renewed_at(START + offset)), START)
            self.assertEqual(self.seen.age(key), 0.0)

    def test_age_counts_on_the_local_clock_from_the_change_seen(self):
        # The writer's clock is 300 s ahead: its renewTimes are in this clock's future.
        self.seen.observe("edge-2", lease_renewed_at(START + 300))
        self.clock.advance(7)
        self.assertEqual(self.seen.age("edge-2"), 7.0)
        self.assertEqual(self.seen.observe("edge-2", lease_renewed_at(START + 310)), START + 7)
        self.clock.advance(2)
        self.assertEqual(self.seen.age("edge-2"), 2.0)

    def test_the_same_renew_time_seen_again_is_no_renewal(self):
        renewed = lease_renewed_at(START - 120)
        self.seen.observe("edge-2", renewed)
        self.clock.advance(30)
        other_fields = dict(renewed, metadata=dict(renewed["metadata"], resourceVersion="9"))
        self.assertEqual(self.seen.observe("edge-2", other_fields), START)
        self.assertEqual(self.seen.age("edge-2"), 30.0)

    def test_the_same_instant_written_otherwise_is_no_renewal_and_then_text_again(self):
        renewed = lease_renewed_at(START - 120)
        self.seen.observe("edge-2", renewed)
        self.clock.advance(30)
        written = renewed["spec"]["renewTime"]
        self.assertTrue(written.endswith("Z"), written)
        # The same instant with an explicit offset, then as first written again.
        for text in (written[:-1] + "+00:00", written):
            other = dict(renewed, spec=dict(renewed["spec"], renewTime=text))
            self.assertEqual(self.seen.observe("edge-2", other), START)
            self.assertEqual(self.seen.age("edge-2"), 30.0)
        self.assertEqual(self.seen.observe("edge-2", lease_renewed_at(START - 110)), START + 30)

    def test_a_renew_time_moving_backwards_is_a_change(self):
        # The writer's clock was stepped back (NTP came back): it still renewed.
        self.seen.observe("edge-2", lease_renewed_at(START + 300))
        self.clock.advance(5)
        self.assertEqual(self.seen.observe("edge-2", lease_renewed_at(START - 10)), START + 5)

    def test_no_lease_or_no_readable_renew_time_forgets_it(self):
        self.seen.observe("edge-2", lease_renewed_at(START))
        for nothing in (None, {"spec": {}}, {"spec": {"renewTime": "garbage"}},
                        {"spec": ["not", "a", "spec"]}, "not a lease"):
            self.seen.observe("edge-2", lease_renewed_at(START))
            self.assertIsNone(self.seen.observe("edge-2", nothing), nothing)
            self.assertIsNone(self.seen.age("edge-2"))
            self.assertIsNone(self.seen.changed_at("edge-2"))
        self.assertIsNone(renew_mark({"spec": {"renewTime": 7}}))

    def test_forgotten_and_unretained_keys_count_as_new_when_seen_again(self):
        for key in ("edge-1", "edge-2", "edge-3"):
            self.seen.observe(key, lease_renewed_at(START))
        self.clock.advance(60)
        self.seen.forget("edge-1")
        self.seen.retain({"edge-1", "edge-2"})
        self.assertEqual(len(self.seen), 1)
        self.assertEqual(self.seen.age("edge-2"), 60.0)
        self.assertIsNone(self.seen.age("edge-3"))
        self.assertEqual(self.seen.observe("edge-3", lease_renewed_at(START)), START + 60)
