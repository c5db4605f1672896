"""The one retry policy shape: pauses by failure count, capped, jittered, stateless."""

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.tx import retry
from yurtcoord.tx.retry import Retries, backoff_policy


class BackoffPolicyTests(unittest.TestCase):
    def test_pauses_double_from_initial_up_to_the_cap(self):
        policy = backoff_policy(initial=0.5, maximum=3.0, jitter=0.0)
        self.assertEqual([policy(n) for n in range(1, 7)], [0.5, 1.0, 2.0, 3.0, 3.0, 3.0])

    def test_factor_sets_the_growth(self):
        policy = backoff_policy(initial=1.0, maximum=100.0, factor=3.0, jitter=0.0)
        self.assertEqual([policy(n) for n in range(1, 5)], [1.0, 3.0, 9.0, 27.0])

    def test_jitter_shrinks_each_pause_by_its_share(self):
        policy = backoff_policy(initial=1.0, maximum=8.0, jitter=0.5, random=lambda: 0.5)
        self.assertEqual([policy(n) for n in range(1, 6)], [0.75, 1.5, 3.0, 6.0, 6.0])

    def test_default_jitter_stays_within_a_fifth_below_the_pause(self):
        draws = iter([0.0, 0.999999, 0.5])
        policy = backoff_policy(initial=2.0, maximum=2.0, random=lambda: next(draws))
        pauses = [policy(1), policy(2), policy(3)]
        self.assertEqual(pauses[0], 2.0)
        self.assertAlmostEqual(pauses[1], 1.6, places=5)
        self.assertEqual(pauses[2], 1.8)

    def test_the_policy_keeps_no_state(self):
        policy = backoff_policy(initial=1.0, maximum=8.0, jitter=0.0)
        self.assertEqual([policy(4), policy(1), policy(4)], [8.0, 1.0, 8.0])

    def test_a_huge_failure_count_is_the_cap(self):
        policy = backoff_policy(initial=0.5, maximum=30.0, jitter=0.0)
        self.assertEqual(policy(10_000), 30.0)

    def test_zero_failures_is_the_first_pause(self):
        policy = backoff_policy(initial=0.5, maximum=30.0, jitter=0.0)
        self.assertEqual(policy(0), 0.5)

    def test_zero_initial_retries_at_once(self):
        policy = backoff_policy(initial=0.0, maximum=0.0, jitter=0.0)
        self.assertEqual([policy(1), policy(5)], [0.0, 0.0])

    def test_bad_parameters_name_what_is_wrong(self):
        for kwargs, word in (({"initial": 2.0, "maximum": 1.0}, "initial <= maximum"),
                             ({"initial": -1.0, "maximum": 1.0}, "initial <= maximum"),
                             ({"initial": 1.0, "maximum": 2.0, "factor": 0.5}, "factor"),
                             ({"initial": 1.0, "maximum": 2.0, "jitter": 1.0}, "jitter"),
                             ({"initial": 1.0, "maximum": 2.0, "jitter": -0.1}, "jitter")):
            with self.assertRaises(ValueError) as raised:
                backoff_policy(**kwargs)
            self.assertIn(word, str(raised.exception), kwargs)


class NamedPolicyTests(unittest.TestCase):
    """The delays each retry loop of the agent uses."""

    def test_lease_writes_pause_as_twisteds_backoff_policy_did(self):
        # What the lease writer used before: Twisted's policy at 0.5 s, doubling, 5 s cap.
        twisted = backoffPolicy(initialDelay=0.5, maxDelay=5.0, factor=2.0, jitter=lambda: 0.0)
        self.assertEqual([retry.LEASE_WRITE_RETRY(n) for n in range(1, 7)],
                         [twisted(n) for n in range(1, 7)])
        self.assertEqual([retry.LEASE_WRITE_RETRY(n) for n in range(1, 6)],
                         [1.0, 2.0, 4.0, 5.0, 5.0])

    def test_jittered_policies_stay_between_four_fifths_and_the_pause(self):
        for name, policy, initial, maximum in (
                ("ROLE_RETRY", retry.ROLE_RETRY, 0.5, 30.0),
                ("INFORMER_RETRY", retry.INFORMER_RETRY, 0.5, 30.0),
                ("POOL_WRITE_RETRY", retry.POOL_WRITE_RETRY, 0.5, 10.0),
                ("DELEGATION_RETRY", retry.DELEGATION_RETRY, 0.5, 5.0)):
            for failures, base in ((1, initial), (100, maximum)):
                for _ in range(20):
                    pause = policy(failures)
                    self.assertLessEqual(pause, base, name)
                    self.assertGreater(pause, 0.8 * base - 1e-9, name)


class RetriesTests(unittest.TestCase):
    def test_counts_failures_and_starts_afresh_after_a_reset(self):
        retries = Retries(backoff_policy(initial=1.0, maximum=4.0, jitter=0.0))
        self.assertEqual([retries.next_delay() for _ in range(4)], [1.0, 2.0, 4.0, 4.0])
        self.assertEqual(retries.failures, 4)
        retries.reset()
        self.assertEqual(retries.failures, 0)
        self.assertEqual(retries.next_delay(), 1.0)

    def test_one_per_thing_counts_each_on_its_own(self):
        policy = backoff_policy(initial=1.0, maximum=8.0, jitter=0.0)
        a, b = Retries(policy), Retries(policy)
        a.next_delay()
        a.next_delay()
        self.assertEqual((a.next_delay(), b.next_delay()), (4.0, 1.0))


@implementer(IStreamClientEndpoint)
class RefusingEndpoint:
    """An endpoint whose every connect fails, counting the tries and when they were."""

    def __init__(self, clock):
        self.clock = clock
        self.tries = []

    def connect(self, protocolFactory):
        self.tries.append(self.clock.seconds())
        return defer.fail(ConnectionRefusedError("refused"))


class TwistedAcceptsThePolicyTests(unittest.TestCase):
    def test_client_service_retries_after_the_policys_pauses(self):
        clock = Clock()
        endpoint = RefusingEndpoint(clock)
        self.assertTrue(verifyObject(IStreamClientEndpoint, endpoint))
        service = ClientService(endpoint, Factory.forProtocol(Protocol), clock=clock,
                                retryPolicy=backoff_policy(initial=1.0, maximum=4.0,
                                                           jitter=0.0))
        service.startService()
        clock.pump([0.5] * 30)
        self.assertEqual(endpoint.tries, [0.0, 1.0, 3.0, 7.0, 11.0, 15.0])
        self.successResultOf(service.stopService())


class RetryingTests(unittest.TestCase):
    """``retrying``: at most n attempts, the policy's pauses on the clock between them."""

    def setUp(self):
        self.clock = Clock()
        self.answers = []
        self.calls = []
        self.failures = []

    def attempt(self):
        self.calls.append(self.clock.seconds())
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed(answer)

    def start(self, attempts=3, **kwargs):
        return retry.retrying(self.clock, self.attempt, lambda n: float(n), attempts,
                              on_failure=lambda f, n: self.failures.append((f.value, n)),
                              **kwargs)

    def test_retries_after_the_policys_pauses_until_an_attempt_succeeds(self):
        first, second = ValueError("a"), ValueError("b")
        self.answers = [first, second, "ok"]
        d = self.start()
        self.assertNoResult(d)
        self.clock.advance(1.0)
        self.assertNoResult(d)
        self.clock.advance(2.0)
        self.assertEqual(self.successResultOf(d), "ok")
        self.assertEqual(self.calls, [0.0, 1.0, 3.0])
        self.assertEqual(self.failures, [(first, 1), (second, 2)])

    def test_the_last_attempts_failure_ends_the_loop(self):
        self.answers = [ValueError("a"), ValueError("b")]
        d = self.start(attempts=2)
        self.clock.advance(1.0)
        self.failureResultOf(d, ValueError)
        self.assertEqual([n for _e, n in self.failures], [1, 2])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_failure_that_is_not_retryable_ends_the_loop_untold(self):
        self.answers = [KeyError("gone")]
        d = self.start(retryable=lambda f: not f.check(KeyError))
        self.failureResultOf(d, KeyError)
        self.assertEqual((self.failures, self.calls), ([], [0.0]))

    def test_cancelling_cancels_the_pause(self):
        self.answers = [ValueError("a"), "never asked"]
        d = self.start()
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.calls, [0.0])

    def test_cancelling_cancels_the_attempt_in_flight(self):
        cancelled = []
        pending = defer.Deferred(cancelled.append)
        d = retry.retrying(self.clock, lambda: pending, lambda n: 1.0, 3)
        d.cancel()
        self.assertEqual(cancelled, [pending])
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_attempt_that_raises_counts_as_failed(self):
        def attempt():
            raise ValueError("at once")
        d = retry.retrying(self.clock, attempt, lambda n: 1.0, 1)
        self.failureResultOf(d, ValueError)

    def test_at_least_one_attempt(self):
        self.assertRaises(ValueError, retry.retrying, self.clock, self.attempt,
                          lambda n: 1.0, 0)
