"""The etcd client's resend policy (``yurtcoord.etcd.resend``) on ``task.Clock``: each
decision (the answer stands, resent to which member after what pause, or given up)
over real ``MemberSet``s whose health probes never answer, with sends scripted per
member."""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.etcd.errors import (
    BadResponse, ClientClosed, EtcdError, EtcdTimeout, EtcdUnavailable, NoLeader,
    RequestCancelled,
)
from yurtcoord.etcd.members import MemberSet
from yurtcoord.etcd.resend import Sends, Unanswered
from yurtcoord.tx.retry import ETCD_RESEND_RETRY

A, B, C = "http://a:2379", "http://b:2379", "http://c:2379"
OK = (200, b"{}")


def lost(delivered=True):
    error = EtcdUnavailable("connection lost")
    error.maybe_applied = delivered
    return Unanswered(error, not_delivered=not delivered)


class Script:
    """Answers each send to a member with the next outcome scripted for it: a value,
    an ``Unanswered``, an exception (a failure), or a Deferred (in flight)."""

    def __init__(self, **outcomes):
        self.outcomes = {url: list(values) for url, values in outcomes.items()}
        self.sent = []

    def send(self, base):
        self.sent.append(base)
        outcome = self.outcomes[base].pop(0)
        if isinstance(outcome, defer.Deferred):
            return outcome
        if isinstance(outcome, Exception):
            return defer.fail(outcome)
        return defer.succeed(outcome)


def refuse_unavailable(base, answer):
    """A refusal: any answer other than OK says the member cannot serve."""
    if answer == OK:
        return None
    return NoLeader("etcdserver: no leader") if answer[0] == 503 else EtcdUnavailable(
        "etcdserver: leader changed")


class SendsTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.closed = False

    def members(self, *urls):
        members = MemberSet(self.clock, list(urls), lambda url: defer.Deferred())
        self.addCleanup(members.close)
        return members

    def send(self, members, script, idempotent=False, refusal=refuse_unavailable,
            policy=ETCD_RESEND_RETRY, attempts=None):
        sends = Sends(members, script.send, "/kv/put", idempotent, lambda: self.closed,
                      refusal, policy)
        return sends.run(self.clock, attempts)

    # -- the answer stands ----------------------------------------------------------------

    def test_an_answer_stands_after_one_send(self):
        script = Script(**{A: [OK]})
        d = self.send(self.members(A, B), script)
        self.assertEqual(self.successResultOf(d), OK)
        self.assertEqual(script.sent, [A])

    def test_the_only_member_is_never_refused_for_its_answers(self):
        members = self.members(A)
        script = Script(**{A: [(503, b"no leader")]})
        d = self.send(members, script)
        self.assertEqual(self.successResultOf(d), (503, b"no leader"))
        self.assertEqual((script.sent, members.current), ([A], A))

    # -- unanswered ------------------------------------------------------------------------

    def test_a_write_that_never_arrived_goes_to_the_next_member_after_the_pause(self):
        members = self.members(A, B)
        script = Script(**{A: [lost(delivered=False)], B: [OK]})
        d = self.send(members, script, policy=lambda failures: 1.5)
        self.assertNoResult(d)
        self.assertEqual((script.sent, members.current), ([A], B))
        self.clock.advance(1.4)
        self.assertEqual(script.sent, [A])
        self.clock.advance(0.1)
        self.assertEqual(self.successResultOf(d), OK)
        self.assertEqual(script.sent, [A, B])

    def test_resends_follow_at_once_by_default(self):
        script = Script(**{A: [lost(delivered=False)], B: [OK]})
        d = self.send(self.members(A, B), script)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d), OK)

    def test_a_write_that_may_have_arrived_is_not_resent_but_its_member_is_skipped(self):
        members = self.members(A, B)
        outcome = lost(delivered=True)
        d = self.send(members, Script(**{A: [outcome]}))
        self.assertIs(self.failureResultOf(d, EtcdUnavailable).value, outcome.error)
        self.assertTrue(outcome.error.maybe_applied)
        self.assertEqual(members.current, B)

    def test_a_read_is_resent_whatever_became_of_it(self):
        script = Script(**{A: [lost(delivered=True)], B: [OK]})
        d = self.send(self.members(A, B), script, idempotent=True)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d), OK)
        self.assertEqual(script.sent, [A, B])

    def test_a_timeout_is_never_resent(self):
        members = self.members(A, B)
        timeout = Unanswered(EtcdTimeout("no answer within 5s"), not_delivered=False)
        d = self.send(members, Script(**{A: [timeout]}), idempotent=True)
        self.failureResultOf(d, EtcdTimeout)
        self.assertEqual(members.current, B)

    def test_each_member_is_sent_a_request_once(self):
        members = self.members(A, B, C)
        script = Script(**{A: [lost()], B: [lost()], C: [lost()]})
        d = self.send(members, script, idempotent=True)
        self.clock.advance(0)
        self.clock.advance(0)
        self.failureResultOf(d, EtcdUnavailable)
        self.assertEqual(script.sent, [A, B, C])

    def test_the_only_member_is_sent_a_request_twice(self):
        script = Script(**{A: [lost(delivered=False), lost(delivered=False)]})
        d = self.send(self.members(A), script)
        self.clock.advance(0)
        self.failureResultOf(d, EtcdUnavailable)
        self.assertEqual(script.sent, [A, A])

    # -- refusals --------------------------------------------------------------------------

    def test_a_write_refused_for_no_leader_goes_to_the_next_member(self):
        members = self.members(A, B)
        script = Script(**{A: [(503, b"no leader")], B: [OK]})
        d = self.send(members, script)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d), OK)
        self.assertEqual(script.sent, [A, B])

    def test_a_write_refused_otherwise_is_not_resent_but_the_member_is_skipped(self):
        members = self.members(A, B)
        d = self.send(members, Script(**{A: [(500, b"leader changed")]}))
        error = self.failureResultOf(d, EtcdUnavailable).value
        self.assertNotIsInstance(error, NoLeader)
        self.assertEqual(members.current, B)

    def test_a_refused_read_is_resent(self):
        script = Script(**{A: [(500, b"leader changed")], B: [OK]})
        d = self.send(self.members(A, B), script, idempotent=True)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d), OK)

    # -- given up --------------------------------------------------------------------------

    def test_other_failures_end_the_request_and_keep_the_member(self):
        members = self.members(A, B)
        d = self.send(members, Script(**{A: [BadResponse("not JSON")]}), idempotent=True)
        self.failureResultOf(d, BadResponse)
        self.assertEqual(members.current, A)

    def test_no_member_serving_fails_at_once(self):
        members = self.members(A, B)
        members.failed(A, "down")
        members.failed(B, "down")
        script = Script()
        d = self.send(members, script, idempotent=True)
        error = self.failureResultOf(d, EtcdUnavailable).value
        self.assertIn("no etcd member serves", str(error))
        self.assertEqual(script.sent, [])

    def test_nothing_is_resent_once_the_client_is_closed(self):
        script = Script(**{A: [lost(delivered=False)], B: [OK]})
        self.closed = True
        d = self.send(self.members(A, B), script)
        self.failureResultOf(d, EtcdUnavailable)
        self.assertEqual(script.sent, [A])

    def test_at_most_the_attempts_asked_for(self):
        script = Script(**{A: [lost(delivered=False)]})
        d = self.send(self.members(A, B), script, attempts=1)
        self.failureResultOf(d, EtcdUnavailable)
        self.assertEqual(script.sent, [A])

    def test_a_cancel_during_a_send_is_the_senders_answer(self):
        in_flight = defer.Deferred(lambda d: d.errback(RequestCancelled("cancelled")))
        d = self.send(self.members(A, B), Script(**{A: [in_flight]}))
        d.cancel()
        self.failureResultOf(d, RequestCancelled)

    def test_a_cancel_during_the_pause_is_an_etcd_error(self):
        script = Script(**{A: [lost(delivered=False)], B: [OK]})
        d = self.send(self.members(A, B), script, policy=lambda failures: 1.0)
        d.cancel()
        self.assertIsInstance(self.failureResultOf(d, RequestCancelled).value, EtcdError)
        self.clock.advance(1.0)
        self.assertEqual(script.sent, [A])

    def test_a_cancel_during_the_pause_of_a_closed_client_is_client_closed(self):
        script = Script(**{A: [lost(delivered=False)], B: [OK]})
        d = self.send(self.members(A, B), script, policy=lambda failures: 1.0)
        self.closed = True
        d.cancel()
        self.failureResultOf(d, ClientClosed)
