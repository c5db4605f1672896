"""One delegated lease's machine on a Clock: every transition, what each state holds
(a read's Deferred, a chain's Deferred, a backoff timer) and gives up, and the inputs
a state does not take, which raise."""

from automat import NoTransition
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.heartbeat.forwarding import ChainSlots
from yurtcoord.heartbeat.leaselife import (
    Heartbeat, ILeaseChains, delegated_lease, newest,
)
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.tx.retry import backoff_policy

KEY = "kube-node-lease/node-a"
POLICY = backoff_policy(initial=1.0, maximum=4.0, jitter=0.0)


def heartbeat(seen, since=None):
    return Heartbeat({"metadata": {"name": "node-a", "resourceVersion": str(seen)}}, seen,
                     seen if since is None else since)


@implementer(ILeaseChains)
class RecordingChains:
    """The delegation's side of a lease's machine, recorded; each write is a Deferred
    the test fires."""

    def __init__(self):
        self.clock = Clock()
        self.writes = []
        self.ready = []
        self.ended = 0
        self.started = 0
        self.outcomes = []
        self.reads_ended = 0
        self.retried = []
        self.released_keys = []

    def write(self, key, heartbeat):
        d = defer.Deferred()
        self.writes.append((key, heartbeat, d))
        return d

    def enqueue(self, lease, ready):
        self.ready.append(ready)

    def chain_ended(self):
        self.ended += 1

    def start_chains(self):
        self.started += 1

    def written(self, key, heartbeat, result, failures):
        self.outcomes.append(("written", heartbeat.seen, result, failures))

    def failed(self, key, heartbeat, failure, failures, delay):
        self.outcomes.append(("failed", heartbeat.seen, failures, delay))

    def read_ended(self):
        self.reads_ended += 1

    def retry(self, lease):
        self.retried.append(self.clock.seconds())
        lease.retry_due()

    def released(self, key, lease):
        self.released_keys.append(key)


class LeaseMachineTests(unittest.TestCase):

    def setUp(self):
        self.chains = RecordingChains()
        verifyObject(ILeaseChains, self.chains)
        self.lease = delegated_lease(KEY, self.chains, POLICY)

    def illegal(self, *inputs):
        for name, args in inputs:
            with self.assertRaises(NoTransition, msg=name):
                getattr(self.lease, name)(*args)

    def writing(self, seen=1.0):
        self.lease.queue(heartbeat(seen))
        self.lease.start(self.chains.ready[-1].heartbeat)
        return self.chains.writes[-1][2]

    def reading(self, seen=1.0):
        lookup = defer.Deferred()
        self.lease.read(heartbeat(seen), lookup)
        return lookup

    # -- Idle ----------------------------------------------------------------------

    def test_idle_takes_only_the_inputs_that_give_it_something_to_hold(self):
        self.illegal(("take", ()), ("retry_due", ()), ("delivered", ()), ("not_member", (heartbeat(1),)),
                     ("confirmed", ()), ("answered", ()), ("start", (heartbeat(1),)),
                     ("refuse", ()), ("drop", ()), ("retry_due", ()), ("stop", ()))

    def test_a_lease_that_held_nothing_writes_at_once_when_given_a_slot(self):
        self.lease.write(heartbeat(1))
        self.assertEqual([(key, hb.seen) for key, hb, _d in self.chains.writes], [(KEY, 1)])
        self.assertEqual(self.chains.ready, [])
        self.illegal(("write", (heartbeat(2),)))
        self.chains.writes[0][2].callback(("updated", None))
        self.assertEqual(self.chains.released_keys, [KEY])

    # -- Waiting -------------------------------------------------------------------

    def test_waiting_keeps_the_newest_state_and_hands_it_back_once_listed(self):
        self.lease.wait(heartbeat(1))
        self.lease.wait(heartbeat(2))
        self.assertIsNone(self.lease.delivered())
        self.lease.refuse()
        self.assertEqual(self.lease.take().seen, 2)
        self.assertEqual(self.chains.released_keys, [KEY])
        self.illegal(("take", ()))

    def test_waiting_dropped_or_stopped(self):
        self.lease.wait(heartbeat(1))
        self.illegal(("queue", (heartbeat(2),)), ("read", (heartbeat(2), defer.Deferred())),
                     ("start", (heartbeat(2),)), ("retry_due", ()),
                     ("not_member", (heartbeat(2),)), ("confirmed", ()))
        self.lease.drop()
        self.assertEqual(self.chains.released_keys, [KEY])
        other = delegated_lease(KEY, self.chains, POLICY)
        other.wait(heartbeat(1))
        self.assertIsNone(other.stop())
        with self.assertRaises(NoTransition):
            other.wait(heartbeat(2))

    # -- Reading and Parked ----------------------------------------------------------

    def test_a_read_parks_the_newest_state_and_a_confirmation_keeps_it_parked(self):
        lookup = self.reading(1)
        self.assertTrue(self.lease.not_member(heartbeat(2)))
        self.lease.refuse()
        self.illegal(("queue", (heartbeat(3),)), ("wait", (heartbeat(3),)),
                     ("start", (heartbeat(3),)), ("take", ()))
        self.lease.confirmed()
        self.assertEqual(self.chains.reads_ended, 1)
        self.assertFalse(lookup.called)
        # Parked.
        self.assertTrue(self.lease.not_member(heartbeat(3)))
        self.lease.refuse()
        self.illegal(("confirmed", ()), ("queue", (heartbeat(4),)), ("take", ()))
        self.assertEqual(self.lease.delivered().seen, 3)
        self.assertEqual(self.chains.released_keys, [KEY])

    def test_an_answer_ends_the_read_and_the_lease(self):
        self.reading()
        self.lease.answered()
        self.assertEqual((self.chains.reads_ended, self.chains.released_keys), (1, [KEY]))
        self.illegal(("answered", ()))

    def test_a_node_delivered_while_its_read_runs_makes_the_read_moot(self):
        lookup = self.reading(1)
        self.assertEqual(self.lease.delivered().seen, 1)
        self.failureResultOf(lookup, defer.CancelledError)
        self.assertEqual((self.chains.reads_ended, self.chains.released_keys), (1, [KEY]))

    def test_a_read_is_cancelled_when_the_lease_is_dropped_or_stopped(self):
        lookup = self.reading()
        self.lease.drop()
        self.failureResultOf(lookup, defer.CancelledError)
        other = delegated_lease(KEY, self.chains, POLICY)
        second = defer.Deferred()
        other.read(heartbeat(1), second)
        self.assertIsNone(other.stop())
        self.failureResultOf(second, defer.CancelledError)
        self.assertEqual(self.chains.reads_ended, 2)

    def test_parked_dropped_or_stopped(self):
        self.reading()
        self.lease.confirmed()
        self.lease.drop()
        self.assertEqual(self.chains.released_keys, [KEY])
        other = delegated_lease(KEY, self.chains, POLICY)
        other.read(heartbeat(1), defer.Deferred())
        other.confirmed()
        self.assertIsNone(other.stop())
        with self.assertRaises(NoTransition):
            other.delivered()

    # -- Ready ---------------------------------------------------------------------

    def test_ready_merges_states_until_a_slot_starts_its_chain(self):
        self.lease.queue(heartbeat(1, since=0.5))
        self.lease.queue(heartbeat(2))
        (ready,) = self.chains.ready
        self.assertEqual((ready.heartbeat.seen, ready.heartbeat.since), (2, 0.5))
        self.assertIsNone(self.lease.delivered())
        self.illegal(("wait", (heartbeat(3),)), ("read", (heartbeat(3), defer.Deferred())),
                     ("retry_due", ()), ("not_member", (heartbeat(3),)),
                     ("write", (heartbeat(3),)))
        self.lease.start(ready.heartbeat)
        self.assertFalse(ready.queued)
        self.assertEqual([(key, hb.seen) for key, hb, _d in self.chains.writes], [(KEY, 2)])

    def test_ready_refused_dropped_or_stopped_leaves_the_queue(self):
        self.lease.queue(heartbeat(1))
        self.lease.refuse()
        self.assertFalse(self.chains.ready[0].queued)
        self.assertEqual(self.chains.released_keys, [KEY])
        for leave in ("drop", "stop"):
            other = delegated_lease(KEY, self.chains, POLICY)
            other.queue(heartbeat(1))
            getattr(other, leave)()
            self.assertFalse(self.chains.ready[-1].queued)
        self.assertEqual(self.chains.writes, [])

    # -- Writing -------------------------------------------------------------------

    def test_a_chain_that_succeeds_rests_and_is_reported_after(self):
        chain = self.writing(1)
        self.assertIsNone(self.lease.delivered())
        self.assertFalse(self.lease.not_member(heartbeat(2)))
        self.illegal(("wait", (heartbeat(2),)), ("start", (heartbeat(2),)),
                     ("retry_due", ()), ("confirmed", ()))
        chain.callback(("updated", "https://cloud"))
        self.assertEqual(self.chains.released_keys, [KEY])
        self.assertEqual(self.chains.outcomes, [("written", 1, ("updated", "https://cloud"), 0)])
        self.assertEqual((self.chains.ended, self.chains.started), (1, 1))

    def test_a_state_seen_while_a_chain_runs_is_written_next(self):
        chain = self.writing(1)
        self.lease.queue(heartbeat(2))
        self.lease.queue(heartbeat(3))
        chain.callback(("updated", None))
        self.assertEqual(self.chains.released_keys, [])
        self.assertEqual(self.chains.ready[-1].heartbeat.seen, 3)
        self.assertTrue(self.chains.ready[-1].queued)

    def test_a_failed_chain_backs_off_then_is_ready_with_the_newest_state(self):
        chain = self.writing(1)
        self.lease.queue(heartbeat(2))
        chain.errback(Failure(RuntimeError("cloud down")))
        self.assertEqual(self.chains.outcomes, [("failed", 1, 1, 1.0)])
        self.assertEqual(self.chains.clock.getDelayedCalls()[0].getTime(), 1.0)
        self.lease.queue(heartbeat(3))
        self.assertIsNone(self.lease.delivered())
        self.illegal(("start", (heartbeat(3),)), ("read", (heartbeat(3), defer.Deferred())),
                     ("wait", (heartbeat(3),)), ("not_member", (heartbeat(3),)),
                     ("write", (heartbeat(3),)))
        self.chains.clock.advance(1.0)
        self.assertEqual(self.chains.retried, [1.0])
        self.assertEqual(self.chains.ready[-1].heartbeat.seen, 3)
        # The second failure in a row waits longer; a success resets the count.
        self.lease.start(self.chains.ready[-1].heartbeat)
        self.chains.writes[-1][2].errback(Failure(RuntimeError("still down")))
        self.assertEqual(self.chains.outcomes[-1], ("failed", 3, 2, 2.0))
        self.chains.clock.advance(2.0)
        self.lease.start(self.chains.ready[-1].heartbeat)
        self.chains.writes[-1][2].callback(("updated", None))
        self.assertEqual(self.chains.outcomes[-1], ("written", 3, ("updated", None), 2))

    def test_a_forgotten_chain_finishes_but_its_failure_is_not_retried(self):
        for forget in ("refuse", "drop"):
            chains = self.chains = RecordingChains()
            self.lease = delegated_lease(KEY, chains, POLICY)
            chain = self.writing(1)
            self.lease.queue(heartbeat(2))
            getattr(self.lease, forget)()
            chain.errback(Failure(RuntimeError("cloud down")))
            self.assertEqual(chains.clock.getDelayedCalls(), [])
            self.assertEqual(chains.released_keys, [KEY])
            self.assertEqual(chains.outcomes, [("failed", 1, 1, 1.0)])

    def test_a_read_instead_of_a_chain_cancels_the_chain(self):
        chain = self.writing(1)
        lookup = defer.Deferred()
        self.lease.read(heartbeat(2), lookup)
        self.assertEqual(self.chains.ended, 1)
        self.successResultOf(chain)  # cancelled, its end told to nobody
        self.assertEqual(self.chains.outcomes, [])
        self.lease.answered()

    def test_stop_cancels_the_chain_and_returns_it(self):
        chain = self.writing(1)
        stopped = self.lease.stop()
        self.assertIs(stopped, chain)
        self.assertIsNone(self.successResultOf(stopped))
        self.assertEqual((self.chains.ended, self.chains.outcomes), (1, []))
        self.illegal(("queue", (heartbeat(2),)), ("stop", ()), ("drop", ()))

    def test_a_chain_that_ends_at_once_moves_the_lease_before_the_outcome_is_told(self):
        chains = RecordingChains()
        chains.write = lambda key, hb: defer.succeed(("created", None))
        lease = delegated_lease(KEY, chains, POLICY)
        lease.queue(heartbeat(1))
        lease.start(chains.ready[-1].heartbeat)
        self.assertEqual(chains.released_keys, [KEY])
        self.assertEqual(chains.outcomes, [("written", 1, ("created", None), 0)])

    def test_a_report_that_raises_is_logged_and_the_lease_still_moves_on(self):
        logged = GlobalLogCapture(self)
        chains = RecordingChains()

        def written(key, hb, result, failures):
            raise ValueError("a defect in counting")

        chains.written = written
        lease = delegated_lease(KEY, chains, POLICY)
        lease.queue(heartbeat(1))
        lease.start(chains.ready[-1].heartbeat)
        chains.writes[-1][2].callback(("updated", None))
        self.assertEqual(chains.released_keys, [KEY])
        events = logged.matching(f"reporting the outcome of the delegation of {KEY} failed")
        self.assertEqual([e["log_namespace"] for e in events],
                         ["yurtcoord.heartbeat.leaselife"])
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)
        # A lease that held nothing again starts from a new machine, as before.
        lease.queue(heartbeat(2))
        self.assertEqual(len(chains.ready), 2)

    # -- BackingOff ----------------------------------------------------------------

    def test_a_backoff_is_cancelled_when_forgotten_or_stopped(self):
        for leave in ("refuse", "drop", "stop"):
            chains = RecordingChains()
            lease = delegated_lease(KEY, chains, POLICY)
            lease.queue(heartbeat(1))
            lease.start(chains.ready[-1].heartbeat)
            chains.writes[-1][2].errback(Failure(RuntimeError("down")))
            self.assertEqual(len(chains.clock.getDelayedCalls()), 1)
            getattr(lease, leave)()
            self.assertEqual(chains.clock.getDelayedCalls(), [], leave)


class NewestTests(unittest.TestCase):

    def test_the_state_seen_last_waiting_since_the_older(self):
        merged = newest(heartbeat(1, since=0.5), heartbeat(2, since=2))
        self.assertEqual((merged.lease["metadata"]["resourceVersion"], merged.seen,
                          merged.since), ("2", 2, 0.5))


class ChainSlotsTests(unittest.TestCase):

    def test_ready_leases_start_in_order_while_slots_are_free(self):
        limit = [1]
        slots = ChainSlots(lambda: limit[0])
        chains = RecordingChains()
        leases = [delegated_lease(f"kube-node-lease/node-{i}", chains, POLICY) for i in range(3)]
        for lease in leases:
            lease.queue(heartbeat(1))
        for lease, ready in zip(leases, chains.ready):
            slots.enqueue(lease, ready)
        slots.start_chains()
        self.assertEqual((slots.in_flight, slots.queued, len(chains.writes)), (1, 2, 1))
        # The lease second in line is forgotten; a bound that grows lets the third run.
        leases[1].drop()
        limit[0] = 2
        slots.start_chains()
        self.assertEqual([key for key, _hb, _d in chains.writes],
                         ["kube-node-lease/node-0", "kube-node-lease/node-2"])
        self.assertEqual((slots.in_flight, slots.queued), (2, 0))
        slots.ended()
        self.assertEqual(slots.in_flight, 1)
        slots.clear()
        self.assertEqual(slots.in_flight, 0)

    def test_a_free_slot_is_taken_at_once_only_when_no_lease_waits(self):
        slots = ChainSlots(lambda: 1)
        self.assertTrue(slots.take_free_slot())
        self.assertFalse(slots.take_free_slot())  # the bound
        slots.ended()
        chains = RecordingChains()
        lease = delegated_lease(KEY, chains, POLICY)
        lease.queue(heartbeat(1))
        slots.enqueue(lease, chains.ready[0])
        self.assertFalse(slots.take_free_slot())  # a lease waits: it goes first
        slots.start_chains()
        self.assertEqual(slots.in_flight, 1)
