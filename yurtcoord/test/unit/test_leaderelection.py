"""Lease leader election driven by a Clock against an in-memory lease store; with one
``task.Clock`` per agent (``SkewedAgentsTests``), clocks minutes apart: the lead does not
move while skewed candidates run, and a candidate takes over a dead leader's lease
exactly ``lease_duration`` after it last saw the lease change on its own clock, whatever
time the leader's renewTime names (docs/design.md, "Clocks")."""

from random import Random

from automat import NoTransition
from hypothesis import given, settings, strategies as st
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.heartbeat.probes import CoordinatorHealthChecker, ProbeSettings
from yurtcoord.kube.errors import Conflict, ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import (
    LeaseRecord, build_lease, format_micro_time, holder_identity, lease_duration_seconds,
    lease_transitions, parse_micro_time, renew_time,
)
from yurtcoord.kube.leaderelection import (
    LeaderElectionConfig, LeaderElectionConfigError, LeaderElector, check_election_timing)
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.testing.clocks import SkewedClock, run_until
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakekube import FakeKube, FakeKubeServer

NS, NAME = "kube-system", "yurthub"
START = 1_800_000_000.0


def make_config(identity="edge-1", **overrides):
    values = dict(lease_namespace=NS, lease_name=NAME, identity=identity,
                  lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)
    values.update(overrides)
    return LeaderElectionConfig(**values)


class Recorder:
    """Every callback of one elector, in order, with the clock time."""

    def __init__(self, clock):
        self.clock = clock
        self.events = []

    def started(self):
        self.events.append(("started", self.clock.seconds()))

    def stopped(self):
        self.events.append(("stopped", self.clock.seconds()))

    def new_leader(self, identity):
        self.events.append(("new_leader", identity))

    def names(self):
        return [event[0] for event in self.events]

    def count(self, name):
        return self.names().count(name)


class ElectionTestCase(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.kube = FakeKube()
        self.electors = []

    def tearDown(self):
        for elector in self.electors:
            elector.stop(release=False)
        self.assertEqual(self.clock.getDelayedCalls(), [],
                         "a stopped elector left timers behind")

    def elector(self, identity="edge-1", random=lambda: 0.5, **overrides):
        recorder = Recorder(self.clock)
        elector = LeaderElector(
            self.clock, self.kube, make_config(identity, **overrides),
            on_started_leading=recorder.started, on_stopped_leading=recorder.stopped,
            on_new_leader=recorder.new_leader, random=random)
        self.electors.append(elector)
        return elector, recorder

    def put_lease(self, holder, renew, duration=15, transitions=0, acquire=None):
        record = LeaseRecord(holder, duration, acquire if acquire is not None else renew,
                             renew, transitions)
        return self.kube.put(LEASES, build_lease(NAME, NS, record))

    def lease(self):
        return self.kube.peek(LEASES, NAME, NS)

    def advance_to(self, when, step=0.25):
        """Advance the clock to ``when`` in small steps, running every timer due."""
        while self.clock.seconds() + step < when:
            self.clock.advance(step)
        self.clock.advance(max(0.0, when - self.clock.seconds()))


class LeaseHelpersTests(unittest.TestCase):
    def test_micro_time_round_trip(self):
        text = format_micro_time(START + 0.123456)
        self.assertEqual(text, "2027-01-15T08:00:00.123456Z")
        self.assertAlmostEqual(parse_micro_time(text), START + 0.123456, places=6)

    def test_parse_accepts_other_rfc3339_forms(self):
        self.assertEqual(parse_micro_time("2027-01-15T08:00:00Z"), START)
        self.assertAlmostEqual(parse_micro_time("2027-01-15T08:00:00.5Z"), START + 0.5)
        self.assertAlmostEqual(parse_micro_time("2027-01-15T08:00:00.123456789Z"),
                               START + 0.123456, places=6)
        self.assertEqual(parse_micro_time("2027-01-15T10:00:00+02:00"), START)

    def test_parse_rejects_garbage(self):
        for bad in ("yesterday", "2027-01-15", "", None, 12):
            self.assertRaises(ValueError, parse_micro_time, bad)

    def test_parse_of_the_canonical_form_agrees_with_the_calendar(self):
        # The pool leader parses a thousand renewTimes a second, nearly all in the
        # MicroTime form: seconds of the same minute, parsed again, give what the
        # calendar says, to the microsecond.
        import datetime
        for offset in (0.0, 0.000001, 59.999999, 60.0, 3599.5, 86399.25, -0.5, 12.345678):
            for _ in range(2):
                when = START + offset
                text = format_micro_time(when)
                moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=datetime.timezone.utc)
                self.assertEqual(parse_micro_time(text), moment.timestamp(), text)

    def test_parse_rejects_a_malformed_time_of_the_canonical_length(self):
        parse_micro_time("2027-01-15T08:00:00.000000Z")  # its minute is known now
        for bad in ("2027-01-15T08:00:60.000000Z", "2027-01-15T08:00:0x.000000Z",
                    "2027-01-15T08:00: 5.000000Z", "2027-01-15T08:00:+5.000000Z",
                    "2027-01-15T08:00:05.00000-Z", "2027-01-15T08:00:05.0000 0Z",
                    "2027-01-15T08:00:05.0000\u00b20Z", "2027-13-15T08:00:00.000000Z",
                    "2027-01-15X08:00:00.000000Z"):
            self.assertRaises(ValueError, parse_micro_time, bad)

    def test_record_reads_fields_and_tolerates_bad_times(self):
        lease = build_lease(NAME, NS, LeaseRecord("edge-2", 15, START, START + 1, 4))
        self.assertEqual(holder_identity(lease), "edge-2")
        self.assertEqual(lease_duration_seconds(lease), 15)
        self.assertEqual(renew_time(lease), START + 1)
        self.assertEqual(lease_transitions(lease), 4)
        lease["spec"]["renewTime"] = "not a time"
        self.assertIsNone(renew_time(lease))
        self.assertEqual(holder_identity({}), "")
        self.assertEqual(lease_transitions({"spec": {}}), 0)


class ConfigTests(unittest.TestCase):
    def assertRejects(self, field, **overrides):
        with self.assertRaises(ValueError) as caught:
            make_config(**overrides)
        self.assertIn(field, str(caught.exception))

    def test_valid_config(self):
        config = make_config()
        self.assertEqual(config.lease_key, "kube-system/yurthub")
        self.assertTrue(config.release_on_cancel)
        self.assertEqual(make_config(lease_duration=2.5, renew_deadline=2.0,
                                     retry_period=1.0).lease_duration_seconds, 3)

    def test_invalid_configs_name_the_field(self):
        self.assertRejects("identity", identity="")
        self.assertRejects("lease_name", lease_name="")
        self.assertRejects("lease_namespace", lease_namespace="")
        self.assertRejects("lease_duration", lease_duration=10.0)
        self.assertRejects("lease_duration", lease_duration=5.0)
        self.assertRejects("renew_deadline", renew_deadline=2.4)
        self.assertRejects("retry_period", retry_period=0.0, renew_deadline=1.0,
                           lease_duration=2.0)
        self.assertRejects("retry_period", retry_period=-1.0)
        self.assertRejects("retry_period", retry_period="2s")
        self.assertRejects("lease_duration", lease_duration=float("nan"))

    def test_the_timing_rule_names_the_field_at_fault(self):
        """The one rule the agent's config checks too: the field to change, and a
        reason whose durations are spelled by ``show``."""
        cases = [((10.0, 10.0, 2.0), "renew_deadline", "must be shorter than lease_duration (<10.0>)"),
                 ((15.0, 10.0, 8.5), "retry_period",
                  "retry_period * 1.2 must be shorter than renew_deadline (<10.0>)"),
                 ((15.0, 10.0, 0.0), "retry_period", "must be longer than 0s")]
        for timings, field, reason in cases:
            with self.assertRaises(LeaderElectionConfigError) as caught:
                check_election_timing(*timings, show=lambda seconds: f"<{seconds}>")
            self.assertEqual((caught.exception.field, caught.exception.reason), (field, reason))
        check_election_timing(15.0, 10.0, 8.0)  # 8 * 1.2 = 9.6 < 10
        with self.assertRaises(LeaderElectionConfigError) as caught:
            make_config(lease_duration=10.0)
        self.assertEqual(str(caught.exception),
                         "renew_deadline must be shorter than lease_duration (10s)")


class AcquireTests(ElectionTestCase):
    def test_acquires_a_missing_lease_by_creating_it(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.assertTrue(elector.is_leader)
        self.assertEqual(elector.leader, "edge-1")
        lease = self.lease()
        self.assertEqual(lease["spec"]["holderIdentity"], "edge-1")
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 15)
        self.assertEqual(lease["spec"]["leaseTransitions"], 0)
        self.assertEqual(parse_micro_time(lease["spec"]["acquireTime"]), START)
        self.assertEqual(recorder.names(), ["started", "new_leader"])
        self.assertEqual(recorder.events[1], ("new_leader", "edge-1"))

    def test_acquires_a_free_lease_and_counts_the_transition(self):
        self.put_lease("", START - 100, transitions=3)
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.assertTrue(elector.is_leader)
        spec = self.lease()["spec"]
        self.assertEqual(spec["holderIdentity"], "edge-1")
        self.assertEqual(spec["leaseTransitions"], 4)
        self.assertEqual(parse_micro_time(spec["acquireTime"]), START)
        self.assertEqual(parse_micro_time(spec["renewTime"]), START)

    def test_start_is_idempotent(self):
        elector, recorder = self.elector()
        elector.start()
        elector.start()
        self.clock.advance(0)
        self.assertEqual(self.kube.calls, [("get", NAME), ("create", NAME)])
        self.assertEqual(recorder.count("started"), 1)

    def test_does_not_take_a_lease_that_keeps_being_renewed(self):
        # The holder's clock is an hour behind: its renewTime is always in the past.
        # What counts is that the record keeps changing.
        self.put_lease("edge-2", START - 3600)
        elector, recorder = self.elector()
        elector.start()
        for second in range(1, 91):
            self.advance_to(START + second)
            if second % 5 == 0:
                self.put_lease("edge-2", START - 3600 + second)
        self.assertFalse(elector.is_leader)
        self.assertEqual(elector.leader, "edge-2")
        self.assertEqual(holder_identity(self.lease()), "edge-2")
        self.assertEqual(recorder.names(), ["new_leader"])
        self.assertNotIn("update", [verb for verb, _ in self.kube.calls])

    def test_takes_an_unchanged_lease_after_lease_duration_despite_future_renew_time(self):
        # The holder's clock is a day ahead and it died: renewTime stays in the future.
        self.put_lease("edge-2", START + 86400, transitions=7)
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.advance_to(START + 15 - 0.01)
        self.assertFalse(elector.is_leader)
        self.advance_to(START + 15)
        self.assertTrue(elector.is_leader)
        spec = self.lease()["spec"]
        self.assertEqual(spec["holderIdentity"], "edge-1")
        self.assertEqual(spec["leaseTransitions"], 8)
        self.assertEqual(parse_micro_time(spec["acquireTime"]), START + 15)
        self.assertEqual(recorder.events,
                         [("new_leader", "edge-2"), ("started", START + 15),
                          ("new_leader", "edge-1")])

    def test_expiry_counts_from_the_last_observed_change(self):
        self.put_lease("edge-2", START)
        elector, _ = self.elector()
        elector.start()
        self.clock.advance(0)
        self.advance_to(START + 10)
        self.put_lease("edge-2", START + 10)      # last renewal, seen at the next poll
        self.advance_to(START + 24)
        self.assertFalse(elector.is_leader)
        self.advance_to(START + 28)
        self.assertTrue(elector.is_leader)
        # Seen at the next poll (START+12), taken exactly at its local expiry.
        acquired = parse_micro_time(self.lease()["spec"]["acquireTime"])
        self.assertEqual(acquired, START + 12 + 15)

    def test_uses_the_lease_duration_written_in_the_lease(self):
        self.put_lease("edge-2", START, duration=40)
        elector, _ = self.elector()
        elector.start()
        self.clock.advance(0)
        self.advance_to(START + 39.5)
        self.assertFalse(elector.is_leader)
        self.advance_to(START + 40)
        self.assertTrue(elector.is_leader)

    def test_renews_its_own_lease_directly_after_a_restart(self):
        self.put_lease("edge-1", START - 5, transitions=3, acquire=START - 500)
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.assertTrue(elector.is_leader)
        spec = self.lease()["spec"]
        self.assertEqual(spec["leaseTransitions"], 3)
        self.assertEqual(parse_micro_time(spec["acquireTime"]), START - 500)
        self.assertEqual(parse_micro_time(spec["renewTime"]), START)
        self.assertEqual(recorder.names(), ["started", "new_leader"])

    def test_lost_race_is_retried_with_jitter(self):
        self.put_lease("", START)
        self.kube.fail_next("update", Conflict("stale"))
        elector, _ = self.elector(random=lambda: 0.5)
        elector.start()
        self.clock.advance(0)
        self.assertFalse(elector.is_leader)
        # retry_period * (1 + 0.5 * 1.2) = 3.2 s
        self.clock.advance(3.19)
        self.assertFalse(elector.is_leader)
        self.clock.advance(0.01)
        self.assertTrue(elector.is_leader)

    def test_server_errors_keep_the_candidate_trying(self):
        self.kube.fail_next("get", ServerError("down"), count=5)
        elector, _ = self.elector(random=lambda: 0.0)
        elector.start()
        self.clock.advance(0)
        for _ in range(5):
            self.assertFalse(elector.is_leader)
            self.clock.advance(2.0)
        self.assertTrue(elector.is_leader)

    def test_hung_request_is_bounded_by_renew_deadline(self):
        self.kube.hold("get")
        elector, _ = self.elector(random=lambda: 0.0)
        elector.start()
        self.clock.advance(0)
        self.assertEqual(len(self.kube.held), 1)
        self.clock.advance(10.0)                  # the attempt times out
        self.assertTrue(self.kube.held[0].cancelled)
        self.kube.release_hold("get")
        self.clock.advance(2.0)                   # next attempt after the jitter
        self.assertTrue(elector.is_leader)
        self.kube.deliver_held()                  # the timed-out answer changes nothing
        self.assertTrue(elector.is_leader)


class RenewTests(ElectionTestCase):
    def test_leader_renews_every_retry_period(self):
        elector, _ = self.elector()
        elector.start()
        self.clock.advance(0)
        for n in range(1, 6):
            self.clock.advance(2.0)
            self.assertEqual(renew_time(self.lease()), START + 2.0 * n)
        self.assertEqual(lease_transitions(self.lease()), 0)
        # Renewals go straight to update with the last resourceVersion.
        self.assertEqual([verb for verb, _ in self.kube.calls],
                         ["get", "create"] + ["update"] * 5)

    def test_leader_that_cannot_renew_for_renew_deadline_stops_leading(self):
        elector, recorder = self.elector(random=lambda: 0.0)
        elector.start()
        self.clock.advance(0)
        self.clock.advance(2.0)                   # last successful renewal at START+2
        self.kube.fail_next("*", ServerError("etcd unavailable"), count=1000)
        self.advance_to(START + 2 + 10 - 0.01, step=0.01)
        self.assertTrue(elector.is_leader)
        self.advance_to(START + 2 + 10)
        self.assertFalse(elector.is_leader)
        self.assertEqual(recorder.events[-1], ("stopped", START + 12))
        self.assertEqual(recorder.count("started"), 1)
        self.assertEqual(recorder.count("stopped"), 1)
        # Still a candidate: once the server is back it renews its own lease again.
        self.kube.clear_failures()
        self.advance_to(START + 15)
        self.assertTrue(elector.is_leader)
        self.assertEqual(recorder.count("started"), 2)
        self.assertEqual(lease_transitions(self.lease()), 0)

    def test_renew_deadline_counts_from_the_start_of_the_last_renewal(self):
        """Peers may see a renewal as soon as it is written, before its answer
        comes back: the deadline runs from when the write was sent."""
        elector, _ = self.elector(random=lambda: 0.0)
        elector.start()
        self.clock.advance(0)
        self.kube.hold("update")
        self.clock.advance(2.0)                   # renewal sent and written at START+2
        self.clock.advance(1.5)
        self.kube.release_hold("update")
        self.kube.deliver_held()                  # its answer arrives at START+3.5
        self.assertTrue(elector.is_leader)
        self.kube.fail_next("*", ServerError("etcd unavailable"), count=1000)
        self.advance_to(START + 2 + 10 - 0.01, step=0.01)
        self.assertTrue(elector.is_leader)
        self.advance_to(START + 2 + 10)
        self.assertFalse(elector.is_leader)

    def test_renewal_answered_after_the_deadline_is_ignored(self):
        elector, recorder = self.elector(random=lambda: 0.0)
        elector.start()
        self.clock.advance(0)
        self.kube.hold("update")
        self.clock.advance(2.0)                   # renewal hangs
        self.advance_to(START + 10)
        self.assertFalse(elector.is_leader)       # deadline counted from START
        self.assertEqual(recorder.count("stopped"), 1)
        self.assertTrue(self.kube.held[0].cancelled)
        self.kube.deliver_held()
        self.assertFalse(elector.is_leader)
        self.assertEqual(recorder.count("started"), 1)

    def test_leader_steps_down_when_another_holder_took_the_lease(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.put_lease("edge-9", START + 1, transitions=1)
        self.clock.advance(2.0)
        self.assertFalse(elector.is_leader)
        self.assertEqual(elector.leader, "edge-9")
        self.assertEqual(recorder.names(), ["started", "new_leader", "stopped", "new_leader"])
        self.assertEqual(recorder.events[-1], ("new_leader", "edge-9"))
        self.assertEqual(holder_identity(self.lease()), "edge-9")


class ServerFailoverTests(unittest.TestCase):
    """A leader renewing through one of two coordinator apiservers over one store,
    picked by the coordinator's health checker as the agent wires them: when that
    apiserver dies, the renewal in flight reaches the other within the same attempt,
    and the leader keeps leading. Timings of the end-to-end tests: lease 3 s, renew
    deadline 2 s, retry period 0.5 s."""

    A, B = "https://coordinator-a", "https://coordinator-b"

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.store = FakeKube(self.clock)
        self.servers = {url: FakeKubeServer(self.store, url) for url in (self.A, self.B)}
        self.checker = CoordinatorHealthChecker(
            self.clock, self.servers, "edge-1", FakeHealth(True),
            ProbeSettings(interval=4, timeout=1, failed_retry=3, healthy_threshold=1))
        client = PickedServerClient(self.checker.pick_server, self.servers.__getitem__,
                                    what="coordinator apiserver",
                                    on_unreachable=self.checker.suspect)
        self.recorder = Recorder(self.clock)
        self.elector = LeaderElector(
            self.clock, client,
            make_config(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5),
            on_started_leading=self.recorder.started,
            on_stopped_leading=self.recorder.stopped, random=lambda: 0.5)
        self.checker.start()
        self.elector.start()
        self.clock.advance(0)
        self.assertTrue(self.elector.is_leader)
        self.assertEqual(self.checker.servers(), {self.A: True, self.B: True})

    def tearDown(self):
        self.elector.stop(release=False)
        self.successResultOf(self.checker.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def election_calls(self, url):
        return [verb for verb, name in self.servers[url].calls if name == NAME]

    def test_the_apiserver_fake_offers_the_lease_api(self):
        self.assertTrue(verifyObject(IObjectClient, self.servers[self.A]))

    def test_a_renewal_refused_by_the_dead_apiserver_lands_on_the_other_at_once(self):
        self.clock.advance(0.5)                   # renewed through A at +0.5
        self.assertEqual(self.election_calls(self.A), ["get", "create", "update"])
        self.servers[self.A].kill()
        self.clock.advance(0.5)                   # the renewal at +1.0
        self.assertEqual(renew_time(self.store.peek(LEASES, NAME, NS)), START + 1.0)
        self.assertEqual(self.election_calls(self.A), ["get", "create", "update", "update"])
        self.assertEqual(self.election_calls(self.B), ["update"])
        # The next renewals go to B alone, one update each, a retry period apart.
        for n in range(2, 8):
            self.clock.advance(0.5)
            self.assertEqual(renew_time(self.store.peek(LEASES, NAME, NS)),
                             START + 0.5 * (n + 1))
        self.assertEqual(self.election_calls(self.A), ["get", "create", "update", "update"])
        self.assertEqual(self.election_calls(self.B), ["update"] * 7)
        self.assertTrue(self.elector.is_leader)
        self.assertEqual(self.recorder.names(), ["started"])

    def test_a_renewal_lost_with_the_apiserver_just_before_the_deadline_keeps_the_lease(self):
        """The renewal sent at +1.0 lands but its answer hangs; the apiserver dies at
        +2.3, 0.2 s before the renew deadline (the last renewal that answered was
        sent at +0.5), less than a retry period. Sent again through B, the renewal
        conflicts with its own first copy; the lease is read again and renewed, all
        at +2.3."""
        self.clock.advance(0.5)                   # renewed through A at +0.5
        self.servers[self.A].stall()
        self.clock.advance(0.5)                   # the renewal at +1.0 lands, no answer
        self.assertEqual(renew_time(self.store.peek(LEASES, NAME, NS)), START + 1.0)
        self.clock.advance(1.3)
        self.assertTrue(self.elector.is_leader)
        self.servers[self.A].kill()               # +2.3: the answer is lost
        lease = self.store.peek(LEASES, NAME, NS)
        self.clock.advance(0.2)                   # past the deadline of the +0.5 renewal
        self.assertTrue(self.elector.is_leader)
        self.assertEqual(self.recorder.names(), ["started"])
        self.assertEqual(renew_time(lease), START + 2.3)
        self.assertEqual((holder_identity(lease), lease_transitions(lease)), ("edge-1", 0))
        self.assertEqual(self.election_calls(self.B), ["update", "get", "update"])
        self.clock.advance(0.3)                   # the next renewal, a retry period on
        self.assertEqual(renew_time(self.store.peek(LEASES, NAME, NS)), START + 2.8)
        self.assertEqual(self.recorder.names(), ["started"])


class StopTests(ElectionTestCase):
    def test_stop_releases_the_lease(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.clock.advance(4.0)
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [True])
        spec = self.lease()["spec"]
        self.assertEqual(spec["holderIdentity"], "")
        self.assertEqual(spec["leaseDurationSeconds"], 1)
        self.assertEqual(parse_micro_time(spec["renewTime"]), START + 4)
        self.assertEqual(spec["leaseTransitions"], 0)
        self.assertFalse(elector.is_leader)
        self.assertIsNone(elector.leader)
        self.assertEqual(recorder.names(), ["started", "new_leader", "stopped"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_during_a_renewal_still_releases(self):
        """The cancelled renewal reached the server, so our copy of the lease is
        stale: the release reads it again and, still holding it, releases it."""
        elector, _ = self.elector()
        elector.start()
        self.clock.advance(0)
        self.kube.hold("update")
        self.clock.advance(2.0)                   # renewal written, answer pending
        self.assertEqual(renew_time(self.lease()), START + 2)
        self.kube.release_hold("update")
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [True])
        self.assertEqual(holder_identity(self.lease()), "")
        self.assertEqual(lease_duration_seconds(self.lease()), 1)
        self.kube.deliver_held()
        self.assertFalse(elector.is_leader)

    def test_stop_without_release_leaves_the_lease_held(self):
        elector, recorder = self.elector(release_on_cancel=False)
        elector.start()
        self.clock.advance(0)
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [False])
        self.assertEqual(holder_identity(self.lease()), "edge-1")
        self.assertEqual(recorder.count("stopped"), 1)

    def test_release_is_refused_when_someone_else_wrote_since(self):
        elector, _ = self.elector()
        elector.start()
        self.clock.advance(0)
        self.put_lease("edge-9", START)
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [False])
        self.assertEqual(holder_identity(self.lease()), "edge-9")

    def test_candidate_stop_writes_nothing(self):
        self.put_lease("edge-2", START)
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        calls = list(self.kube.calls)
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [False])
        self.assertEqual(self.kube.calls, calls)
        self.assertEqual(recorder.names(), ["new_leader"])

    def test_peer_takes_over_within_one_retry_period_after_release(self):
        first, _ = self.elector("edge-1")
        second, second_events = self.elector("edge-2")
        first.start()
        self.clock.advance(0)
        second.start()
        self.clock.advance(0.7)
        self.advance_to(START + 30)
        self.assertTrue(first.is_leader)
        self.assertFalse(second.is_leader)
        first.stop()
        stopped_at = self.clock.seconds()
        self.advance_to(stopped_at + 2.0, step=0.05)
        self.assertTrue(second.is_leader)
        self.assertLessEqual(second_events.events[-2][1] - stopped_at, 2.0)
        self.assertEqual(lease_transitions(self.lease()), 1)

    def test_transitions_counted_across_holders(self):
        first, _ = self.elector("edge-1")
        second, _ = self.elector("edge-2")
        holders = []
        first.start()
        self.clock.advance(0)
        second.start()
        for leaving, staying in ((first, second), (second, first), (first, second)):
            self.advance_to(self.clock.seconds() + 5)
            self.assertTrue(leaving.is_leader)
            holders.append(holder_identity(self.lease()))
            leaving.stop()
            self.advance_to(self.clock.seconds() + 5)
            self.assertTrue(staying.is_leader)
            leaving.start()
        self.assertEqual(holders, ["edge-1", "edge-2", "edge-1"])
        self.assertEqual(lease_transitions(self.lease()), 3)

    def test_no_callbacks_after_stop(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        elector.stop()
        seen = list(recorder.events)
        self.put_lease("edge-3", START)
        self.advance_to(START + 100)
        self.assertEqual(recorder.events, seen)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_late_acquire_answer_after_stop_is_ignored(self):
        self.kube.hold("create")
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.assertEqual(len(self.kube.held), 1)   # the create reached the server
        results = []
        elector.stop().addCallback(results.append)
        self.assertEqual(results, [False])
        self.kube.deliver_held()
        self.clock.advance(100)
        self.assertFalse(elector.is_leader)
        self.assertEqual(recorder.events, [])

    def test_late_answer_from_a_client_that_ignores_cancellation(self):
        """A client whose Deferreds cannot be cancelled still answers late; the
        answer must not make the stopped elector lead."""
        pending = []

        class StubbornClient(FakeKube):
            """A lease API whose reads ignore cancellation; the rest is FakeKube's."""

            def get(self, gvr, name, namespace=None):
                # ``answer`` fires whenever the test says; cancelling the returned
                # Deferred does not reach it.
                answer = defer.Deferred()
                pending.append(answer)
                returned = defer.Deferred()
                answer.addBoth(lambda result: None if returned.called
                               else returned.callback(result))
                return returned

        recorder = Recorder(self.clock)
        client = StubbornClient()
        verifyObject(IObjectClient, client)
        elector = LeaderElector(self.clock, client, make_config(),
                                on_started_leading=recorder.started,
                                on_stopped_leading=recorder.stopped,
                                on_new_leader=recorder.new_leader)
        elector.start()
        self.clock.advance(0)
        elector.stop()
        lease = build_lease(NAME, NS, LeaseRecord("edge-2", 15, START, START, 0))
        lease["metadata"]["resourceVersion"] = "1"
        pending[0].callback(lease)
        self.assertEqual(recorder.events, [])
        self.assertIsNone(elector.leader)

    def test_stop_from_inside_a_callback(self):
        recorder = Recorder(self.clock)
        holder = {}

        def started():
            recorder.started()
            holder["stop"] = holder["elector"].stop()

        elector = LeaderElector(self.clock, self.kube, make_config(),
                                on_started_leading=started,
                                on_stopped_leading=recorder.stopped,
                                on_new_leader=recorder.new_leader)
        holder["elector"] = elector
        elector.start()
        self.clock.advance(0)
        self.assertEqual(recorder.names(), ["started", "stopped"])
        self.assertTrue(holder["stop"].called)
        self.assertEqual(holder_identity(self.lease()), "")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_restart_after_stop(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        elector.stop()
        elector.start()
        self.clock.advance(0)
        self.assertTrue(elector.is_leader)
        self.assertEqual(recorder.names(),
                         ["started", "new_leader", "stopped", "started", "new_leader"])
        self.assertEqual(lease_transitions(self.lease()), 1)

    def test_start_during_a_pending_release_runs_after_it(self):
        elector, recorder = self.elector()
        elector.start()
        self.clock.advance(0)
        self.kube.hold("update")
        first = elector.stop()
        elector.start()
        self.assertFalse(elector.running)
        self.kube.release_hold("update")
        self.kube.deliver_held()
        self.assertTrue(first.called)
        self.assertTrue(elector.running)
        self.clock.advance(0)
        self.assertTrue(elector.is_leader)
        self.assertEqual(recorder.count("started"), 2)
        self.assertEqual(recorder.count("stopped"), 1)

    def test_failing_callback_does_not_break_the_election(self):
        def boom():
            raise RuntimeError("callback bug")

        elector = LeaderElector(self.clock, self.kube, make_config(),
                                on_started_leading=boom)
        self.electors.append(elector)
        elector.start()
        self.clock.advance(0)
        self.clock.advance(2.0)
        self.assertTrue(elector.is_leader)
        self.assertEqual(renew_time(self.lease()), START + 2)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class SkewedAgentsTests(unittest.TestCase):
    """Electors of one lease, each on its own clock (a ``SkewedClock`` of one shared
    ``task.Clock``, stepped call by call with ``run_until``): edge-0
    leads, its clock ``leader_offset`` seconds off the true time; candidates join whose
    clocks are 120 s ahead, 120 s behind and 300 s ahead. No elector ever compares a
    renewTime or acquireTime with its clock (``LeaderElector``'s module docstring): a
    candidate that did would take a live lease written by a clock behind its own, and
    wait minutes past a dead leader whose renewTimes lie in its future."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.kube = FakeKube()
        self.electors, self.recorders = {}, {}

    def tearDown(self):
        for elector in self.electors.values():
            elector.stop(release=False)
        self.assertEqual(self.clock.getDelayedCalls(), [],
                         "a stopped elector left timers behind")

    def start(self, identity, offset):
        clock = SkewedClock(self.clock, offset)
        recorder = Recorder(clock)
        elector = LeaderElector(
            clock, self.kube, make_config(identity), on_started_leading=recorder.started,
            on_stopped_leading=recorder.stopped, on_new_leader=recorder.new_leader,
            random=lambda: 0.0)
        self.electors[identity], self.recorders[identity] = elector, recorder
        elector.start()
        return elector

    def spec(self):
        return self.kube.peek(LEASES, NAME, NS)["spec"]

    def lead_stays_put(self, leader_offset):
        leader = self.start("edge-0", leader_offset)
        run_until(self.clock, START + 1)
        self.assertTrue(leader.is_leader)
        for index, offset in enumerate((+120.0, -120.0, +300.0), start=1):
            self.start(f"edge-{index}", offset)
            run_until(self.clock, START + 1 + 0.5 * index)
        for second in range(3, 121):
            run_until(self.clock, START + second)
            self.assertEqual([i for i, e in self.electors.items() if e.is_leader], ["edge-0"],
                             second)
        spec = self.spec()
        self.assertEqual((spec["holderIdentity"], spec["leaseTransitions"]), ("edge-0", 0))
        # The renewTimes are the leader's clock: minutes off the candidates'.
        self.assertEqual(parse_micro_time(spec["renewTime"]), START + 120 + leader_offset)
        self.assertEqual(self.recorders["edge-0"].events,
                         [("started", START + leader_offset), ("new_leader", "edge-0")])
        for identity in ("edge-1", "edge-2", "edge-3"):
            self.assertEqual(self.recorders[identity].events, [("new_leader", "edge-0")])
            self.assertEqual(self.electors[identity].leader, "edge-0")

    def test_a_leader_on_true_time_keeps_the_lead_among_candidates_minutes_off(self):
        self.lead_stays_put(0.0)

    def test_a_leader_300_s_ahead_keeps_the_lead(self):
        self.lead_stays_put(+300.0)

    def test_a_leader_120_s_behind_keeps_the_lead(self):
        # The candidate 300 s ahead reads renewTimes 420 s old on its clock.
        self.lead_stays_put(-120.0)

    def takeover(self, first, second):
        """edge-0, 300 s ahead, leads from true time 0 and dies at 60.5 without
        releasing (its last renewal at 60); candidate ``first`` joins at 1 and
        ``second`` at 1.5, each reading the lease every retry_period: ``first`` sees
        the last renewal at 61 and takes over at 61 + lease_duration, on its clock."""
        self.start("edge-0", +300.0)
        run_until(self.clock, START + 1)
        self.start(first, self.offsets[first])
        run_until(self.clock, START + 1.5)
        self.start(second, self.offsets[second])
        run_until(self.clock, START + 60.5)
        self.assertTrue(self.electors["edge-0"].is_leader)
        self.assertEqual(parse_micro_time(self.spec()["renewTime"]), START + 300 + 60)
        self.electors["edge-0"].stop(release=False)
        run_until(self.clock, START + 76 - 0.001)
        self.assertEqual([e for e in self.electors.values() if e.is_leader], [],
                         "nobody leads before lease_duration has passed on its clock")
        run_until(self.clock, START + 76)
        self.assertEqual([i for i, e in self.electors.items() if e.is_leader], [first])
        spec = self.spec()
        self.assertEqual((spec["holderIdentity"], spec["leaseTransitions"]), (first, 1))
        self.assertEqual(parse_micro_time(spec["acquireTime"]),
                         START + 76 + self.offsets[first])
        self.assertEqual(self.recorders[first].events[-2:],
                         [("started", START + 76 + self.offsets[first]),
                          ("new_leader", first)])
        run_until(self.clock, START + 120)
        self.assertEqual([i for i, e in self.electors.items() if e.is_leader], [first])
        self.assertEqual(self.electors[second].leader, first)
        self.assertEqual(self.recorders[second].count("started"), 0)

    offsets = {"edge-1": +120.0, "edge-2": -120.0}

    def test_a_candidate_120_s_ahead_takes_over_a_dead_leader_300_s_ahead(self):
        self.takeover("edge-1", "edge-2")

    def test_a_candidate_120_s_behind_takes_over_a_dead_leader_300_s_ahead(self):
        self.takeover("edge-2", "edge-1")


class Network:
    """Faults between the electors and the lease store: request and answer
    latencies, lost answers, and nodes cut off from the server."""

    def __init__(self, clock, kube, rng, max_latency, drop_rate):
        self.clock = clock
        self.kube = kube
        self.rng = rng
        self.max_latency = max_latency
        self.drop_rate = drop_rate
        self.cut = set()

    def client(self, identity):
        network = self

        @implementer(IObjectClient)
        class Client:
            """One elector's view of the lease API, through the network's faults."""

            def get(self, gvr, name, namespace=None):
                return network.call(identity, "get", gvr, name, namespace)

            def create(self, gvr, obj, namespace=None):
                return network.call(identity, "create", gvr, obj, namespace)

            def update(self, gvr, obj, namespace=None):
                return network.call(identity, "update", gvr, obj, namespace)

            def delete(self, gvr, name, namespace=None):
                return network.call(identity, "delete", gvr, name, namespace)

        return Client()

    def call(self, identity, verb, *args):
        answer = defer.Deferred()
        if identity in self.cut:
            self.clock.callLater(self.rng.uniform(0, self.max_latency), self._answer,
                                 answer, defer.fail(ServerError("unreachable")))
            return answer

        def arrive():
            if answer.called:
                return      # cancelled before it reached the server
            result = getattr(self.kube, verb)(*args)
            if identity in self.cut or self.rng.random() < self.drop_rate:
                result.addErrback(lambda _: None)
                return      # written, but the answer is lost
            self.clock.callLater(self.rng.uniform(0, self.max_latency), self._answer,
                                 answer, result)

        self.clock.callLater(self.rng.uniform(0, self.max_latency), arrive)
        return answer

    @staticmethod
    def _answer(answer, result):
        if not answer.called:
            result.chainDeferred(answer)
        else:
            result.addErrback(lambda _: None)


def _moment(low, high):
    return st.floats(low, high).map(lambda t: round(t, 1))


# (elector, from, for how long) and (elector, at, graceful, down for how long).
_partitions = st.tuples(st.integers(0, 2), _moment(0, 55), _moment(0.5, 20))
_stops = st.tuples(st.integers(0, 2), _moment(0, 55), st.booleans(), _moment(0.5, 10))


class FaultSimulationTests(unittest.TestCase):
    """Three electors with skewed wall clocks under random latency, lost answers,
    partitions and stops: never two leaders at once, callbacks paired, and a single
    leader once the faults are over."""

    def test_the_faulty_network_offers_the_lease_api(self):
        network = Network(Clock(), FakeKube(), Random(1), 0.1, 0.0)
        self.assertTrue(verifyObject(IObjectClient, network.client("edge-1")))

    STEP = 0.05

    def simulate(self, seed, max_latency, drop_rate, partitions, stops):
        rng = Random(seed)
        clock = Clock()
        clock.advance(START)
        kube = FakeKube()
        network = Network(clock, kube, rng, max_latency, drop_rate)
        electors, recorders = {}, {}
        for n, offset in enumerate((0.0, 86400.0 * 3, -7200.0)):
            identity = f"edge-{n}"
            recorder = Recorder(clock)
            recorders[identity] = recorder
            electors[identity] = LeaderElector(
                SkewedClock(clock, offset), network.client(identity),
                make_config(identity, lease_duration=4.0, renew_deadline=3.5,
                            retry_period=0.5),
                on_started_leading=recorder.started, on_stopped_leading=recorder.stopped,
                on_new_leader=recorder.new_leader, random=rng.random)
        names = sorted(electors)

        def actions_at(now):
            for index, begin, length in partitions:
                identity = names[index]
                if abs(now - begin) < self.STEP / 2:
                    network.cut.add(identity)
                if abs(now - (begin + length)) < self.STEP / 2:
                    network.cut.discard(identity)
            for index, at, graceful, down_for in stops:
                elector = electors[names[index]]
                if abs(now - at) < self.STEP / 2 and elector.running:
                    elector.stop(release=graceful)
                if abs(now - (at + down_for)) < self.STEP / 2:
                    elector.start()

        def check(now):
            leading = [i for i, e in electors.items() if e.is_leader]
            self.assertLessEqual(len(leading), 1, f"two leaders at t={now:.2f}: {leading}")
            for identity, elector in electors.items():
                recorder = recorders[identity]
                open_terms = recorder.count("started") - recorder.count("stopped")
                self.assertEqual(open_terms, 1 if elector.is_leader else 0,
                                 f"{identity} callbacks unpaired at t={now:.2f}")

        for elector in electors.values():
            elector.start()
        steps = int(60 / self.STEP)
        for step in range(steps + 1):
            now = round(step * self.STEP, 6)
            actions_at(now)
            clock.advance(self.STEP)
            check(now)
        # Faults over: everyone up and connected; one leader emerges and stays.
        network.cut.clear()
        network.drop_rate = 0.0
        for elector in electors.values():
            elector.start()
        for step in range(int(20 / self.STEP)):
            clock.advance(self.STEP)
            check(60 + step * self.STEP)
        leading = [i for i, e in electors.items() if e.is_leader]
        self.assertEqual(len(leading), 1)
        self.assertEqual(holder_identity(kube.peek(LEASES, NAME, NS)), leading[0])
        for elector in electors.values():
            elector.stop(release=False)
        clock.advance(10)
        self.assertEqual(clock.getDelayedCalls(), [])

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(seed=st.integers(0, 2**32), max_latency=st.floats(0, 0.7),
           drop_rate=st.floats(0, 0.3), partitions=st.lists(_partitions, max_size=4),
           stops=st.lists(_stops, max_size=4))
    def test_random_faults(self, seed, max_latency, drop_rate, partitions, stops):
        self.simulate(seed, max_latency, drop_rate, partitions, stops)


class ElectionMachineTests(ElectionTestCase):
    """Every transition of the elector's machine (``_ELECTION``) on a Clock, and
    every input each state refuses. States: stopped, waiting (the attempt timer),
    trying (a candidate's attempt in flight), leading (the renewal timer and the
    renew deadline), renewing (a renewal in flight, the renew deadline), releasing
    (a stop writing the release) and restarting (started again meanwhile)."""

    REFUSABLE = {
        "released": (False,), "tick": (), "renew_due": (None,), "written": (0.0, None),
        "not_written": (0.0, None, None), "lost": (0.0, None), "deadline": (0.0,)}
    TAKES = {
        "stopped": (), "waiting": ("tick",), "trying": ("written", "not_written"),
        "leading": ("renew_due", "deadline"),
        "renewing": ("written", "not_written", "lost", "deadline"),
        "releasing": ("released",), "restarting": ("released",)}

    def assert_state(self, elector, state, timers=None):
        """``state``'s public face, the delayed calls at exactly ``timers`` (seconds
        from now), and every input it does not take refused."""
        self.assertEqual(elector.running, state in ("waiting", "trying", "leading",
                                                    "renewing"), state)
        self.assertEqual(elector.is_leader, state in ("leading", "renewing"), state)
        if timers is not None:
            now = self.clock.seconds()
            self.assertEqual(sorted(round(call.getTime() - now, 6)
                                    for call in self.clock.getDelayedCalls()),
                             sorted(timers), state)
        for name, args in self.REFUSABLE.items():
            if name not in self.TAKES[state]:
                self.assertRaises(NoTransition, getattr(elector._election, name), *args)

    def leading(self, **overrides):
        elector, recorder = self.elector(**overrides)
        elector.start()
        self.clock.advance(0)
        return elector, recorder

    def test_stopped_takes_start_and_stop_only(self):
        elector, recorder = self.elector()
        self.assert_state(elector, "stopped", timers=[])
        self.assertIs(self.successResultOf(elector.stop()), False)
        self.assert_state(elector, "stopped", timers=[])
        self.assertEqual(recorder.names(), [])

    def test_start_waits_for_an_attempt_at_once_and_a_second_start_changes_nothing(self):
        elector, recorder = self.elector()
        elector.start()
        self.assert_state(elector, "waiting", timers=[0])
        elector.start()
        self.assert_state(elector, "waiting", timers=[0])
        self.assertEqual(self.kube.calls, [])

    def test_a_candidates_tick_tries_and_a_written_lease_leads(self):
        elector, recorder = self.elector()
        self.kube.hold("get")
        elector.start()
        self.clock.advance(0)
        # In flight: only the attempt's timeout (renew_deadline) is armed.
        self.assert_state(elector, "trying", timers=[10])
        elector.start()
        self.assert_state(elector, "trying", timers=[10])
        self.kube.release_hold("get")
        self.kube.deliver_held()
        # Renewal every retry_period; the renew deadline counts from the attempt.
        self.assert_state(elector, "leading", timers=[2, 10])
        self.assertEqual(recorder.names(), ["started", "new_leader"])
        elector.start()
        self.assert_state(elector, "leading", timers=[2, 10])

    def test_a_candidates_attempt_that_writes_nothing_waits_again(self):
        elector, recorder = self.elector(random=lambda: 0.5)
        self.kube.fail_next("get", ServerError("busy"))
        elector.start()
        self.clock.advance(0)
        # An error: client-go's jitter, 2 * (1 + 0.5 * 1.2) = 3.2 s.
        self.assert_state(elector, "waiting", timers=[3.2])
        self.put_lease("edge-2", renew=self.clock.seconds())
        self.clock.advance(3.2)
        # A live holder: every retry_period (its expiry is 11.8 s away).
        self.assert_state(elector, "waiting", timers=[2])
        self.assertEqual(recorder.names(), ["new_leader"])

    def test_a_leaders_renewal_is_in_flight_then_written(self):
        elector, recorder = self.leading()
        self.kube.hold("update")
        self.clock.advance(2)
        self.assert_state(elector, "renewing", timers=[8, 10])
        elector.start()
        self.assert_state(elector, "renewing", timers=[8, 10])
        self.kube.release_hold("update")
        self.kube.deliver_held()
        # Written: the renew deadline counts from this renewal's start.
        self.assert_state(elector, "leading", timers=[2, 10])
        self.assertEqual(recorder.names(), ["started", "new_leader"])

    def test_a_failed_renewal_keeps_leading_and_keeps_the_deadline(self):
        elector, recorder = self.leading()
        self.kube.fail_next("update", ServerError("busy"))
        self.clock.advance(2)
        self.assert_state(elector, "leading", timers=[2, 8])
        self.assertEqual(recorder.names(), ["started", "new_leader"])

    def test_a_renewal_that_finds_another_holder_loses_the_lease(self):
        elector, recorder = self.leading()
        self.clock.advance(1)
        self.put_lease("edge-2", renew=self.clock.seconds())
        self.clock.advance(1)
        self.assert_state(elector, "waiting", timers=[2])
        self.assertEqual(recorder.names(), ["started", "new_leader", "stopped", "new_leader"])
        self.assertEqual(elector.leader, "edge-2")

    def test_the_renew_deadline_while_leading_steps_down(self):
        elector, recorder = self.leading(renew_deadline=9.0, random=lambda: 0.5)
        self.kube.fail_next("update", ServerError("busy"), count=4)
        self.clock.advance(8)
        self.assert_state(elector, "leading", timers=[1, 2])
        self.clock.advance(1)
        self.assert_state(elector, "waiting", timers=[3.2])
        self.assertEqual(recorder.events[-1], ("stopped", START + 9))

    def test_the_renew_deadline_while_renewing_drops_the_renewal(self):
        elector, recorder = self.leading(renew_deadline=9.0, random=lambda: 0.5)
        self.kube.hold("update")
        self.clock.advance(2)
        self.assert_state(elector, "renewing", timers=[7, 9])
        self.clock.advance(7)
        self.assert_state(elector, "waiting", timers=[3.2])
        self.assertEqual(recorder.events[-1], ("stopped", START + 9))
        # The renewal's late answer is no input: the lease stays where it is.
        self.kube.release_hold("update")
        self.kube.deliver_held()
        self.assert_state(elector, "waiting", timers=[3.2])

    def test_stop_while_waiting_or_trying_ends_stopped_at_once(self):
        elector, recorder = self.elector()
        elector.start()
        self.assertIs(self.successResultOf(elector.stop()), False)
        self.assert_state(elector, "stopped", timers=[])
        self.kube.hold("get")
        elector.start()
        self.clock.advance(0)
        self.assert_state(elector, "trying")
        self.assertIs(self.successResultOf(elector.stop()), False)
        self.assert_state(elector, "stopped", timers=[])
        self.kube.release_hold("get")
        self.kube.deliver_held()  # the dropped attempt's answer: no input
        self.assert_state(elector, "stopped", timers=[])
        self.assertEqual(recorder.names(), [])

    def test_stop_while_renewing_drops_the_renewal_and_releases(self):
        elector, recorder = self.leading()
        self.kube.hangs = 1
        self.clock.advance(2)
        self.assert_state(elector, "renewing")
        self.assertIs(self.successResultOf(elector.stop()), True)
        self.assert_state(elector, "stopped", timers=[])
        self.assertEqual(recorder.names(), ["started", "new_leader", "stopped"])

    def test_releasing_restarting_and_released(self):
        elector, recorder = self.leading()
        self.kube.hold("update")
        first = elector.stop()
        self.assertEqual(recorder.names(), ["started", "new_leader", "stopped"])
        self.assert_state(elector, "releasing", timers=[10])  # the release's timeout
        second = elector.stop()
        self.assert_state(elector, "releasing")
        elector.start()
        self.assert_state(elector, "restarting")
        elector.start()
        self.assert_state(elector, "restarting")
        third = elector.stop()  # restarting: stopping again for good
        self.assert_state(elector, "releasing")
        elector.start()
        self.assert_state(elector, "restarting")
        self.assertNoResult(first)
        self.kube.release_hold("update")
        self.kube.deliver_held()
        self.assertEqual([self.successResultOf(d) for d in (first, second, third)],
                         [True, True, True])
        # Restarting: started again once the release is written.
        self.assert_state(elector, "waiting", timers=[0])
        self.assertEqual(holder_identity(self.lease()), "")

    def test_released_while_releasing_ends_stopped(self):
        elector, recorder = self.leading()
        self.kube.hold("update")
        stopped = elector.stop()
        self.assert_state(elector, "releasing")
        self.kube.release_hold("update")
        self.kube.deliver_held()
        self.assertIs(self.successResultOf(stopped), True)
        self.assert_state(elector, "stopped", timers=[])
