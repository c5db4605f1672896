"""How long to wait before retrying something that failed: one policy shape for every
retry loop of the agent, and the named delays each loop uses.

A retry policy is a callable ``policy(failures) -> seconds``: ``failures`` counts the
consecutive failures so far (1 after the first), the answer is the pause before the
next attempt. Twisted's ``ClientService`` takes the same shape (``retryPolicy``), so a
policy made by ``twisted.application.internet.backoffPolicy`` fits wherever one of
these does, and the other way round.

``backoff_policy`` doubles (``factor``) the pause from ``initial`` up to ``maximum``
and shrinks each pause by a random share of up to ``jitter``, so that many agents
that failed at the same moment do not retry in lockstep; the cap is never exceeded.
A policy keeps no state: a loop that retries one thing counts its failures itself,
or with a ``Retries`` per thing it retries.

``retrying`` is the one loop that tries one request a number of times under a
policy, on an injected clock, and can be cancelled as a whole (discovery of the
pool-scoped resources and the pool etcd client's resends use it); loops that retry
for as long as they run count their failures (the work queue per key) or keep a
``Retries`` (the coordinator's role steps).
"""

import random as _random
from typing import Any, Callable, Generator, Optional, TypeVar

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

T = TypeVar("T")

RetryPolicy = Callable[[int], float]


def backoff_policy(*, initial: float, maximum: float, factor: float = 2.0,
                   jitter: float = 0.2,
                   random: Optional[Callable[[], float]] = None) -> RetryPolicy:
    """``failures`` (1, 2, ...) → ``min(maximum, initial * factor ** (failures - 1))``
    shrunk by up to ``jitter`` of it (``random()`` in [0, 1) picks how much; injectable
    so that tests get exact pauses)."""
    if initial < 0 or maximum < initial:
        raise ValueError(f"backoff needs 0 <= initial <= maximum, got {initial}, {maximum}")
    if factor < 1:
        raise ValueError(f"backoff factor must be >= 1, got {factor}")
    if not 0 <= jitter < 1:
        raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
    draw = random if random is not None else _random.random

    def policy(failures: int) -> float:
        exponent = min(max(failures, 1) - 1, 64)
        base = min(maximum, initial * factor ** exponent)
        return base * (1.0 - jitter * draw()) if jitter else base

    return policy


class Retries:
    """The consecutive failures of one thing retried under ``policy``.

    ``next_delay()`` counts one more failure and answers the pause before the next
    attempt; ``reset()`` after a success starts the policy afresh.
    """

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        return self.policy(self.failures)

    def reset(self) -> None:
        self.failures = 0


# The retry delays of the agent, by what is retried. Jittered where many agents may
# fail at once against one server; without jitter where a caller's own cadence
# already spreads them.

# A failed role step of the coordinator (opening the pool store, a component start).
ROLE_RETRY = backoff_policy(initial=0.5, maximum=30.0)
# An informer's list or watch that failed: the apiserver may be down for long.
INFORMER_RETRY = backoff_policy(initial=0.5, maximum=30.0)
# A pool etcd write of the local cache upload or of pool sync.
POOL_WRITE_RETRY = backoff_policy(initial=0.5, maximum=10.0)
# The /health probe of a pool etcd member skipped after a failed request: soon after
# the failure (a member restarts in about a second), then every few seconds.
ETCD_MEMBER_PROBE_RETRY = backoff_policy(initial=0.5, maximum=5.0)
# A heartbeat the leader forwards to the cloud: retried well within a renewal interval.
DELEGATION_RETRY = backoff_policy(initial=0.5, maximum=5.0)
# A lease write whose attempt failed with an error (not a conflict): 1 s, 2 s, 4 s,
# then 5 s; a lease write's attempts are few.
LEASE_WRITE_RETRY = backoff_policy(initial=1.0, maximum=5.0, jitter=0.0)
# A pool etcd request resent (``yurtcoord.etcd.resend``): at once, since it goes to the
# next member, or on a fresh connection to the only one.
ETCD_RESEND_RETRY = backoff_policy(initial=0.0, maximum=0.0, jitter=0.0)


def _always(_failure: Failure) -> bool:
    return True


def _ignore(_failure: Failure, _attempt: int) -> None:
    return None


def retrying(clock: IReactorTime, attempt: Callable[[], "defer.Deferred[T]"],
             policy: RetryPolicy, attempts: int, *,
             retryable: Callable[[Failure], bool] = _always,
             on_failure: Callable[[Failure, int], object] = _ignore,
             ) -> "defer.Deferred[T]":
    """Fire with the result of the first of at most ``attempts`` calls of ``attempt()``
    that succeeds, pausing ``policy(failures)`` seconds on ``clock`` between two.

    ``on_failure(failure, number)`` is told of each failed attempt that is
    ``retryable``, the last one included; a failure that is not retryable, a
    cancellation and the last attempt's failure end the loop with that failure.
    Cancelling the returned Deferred cancels the attempt or the pause in progress.
    """
    if attempts < 1:
        raise ValueError(f"retrying needs at least one attempt, got {attempts}")

    @defer.inlineCallbacks
    def loop() -> Generator["defer.Deferred[Any]", Any, T]:
        number = 1
        while True:
            try:
                result = yield attempt()
            except Exception:
                failure = Failure()
                if failure.check(defer.CancelledError) or not retryable(failure):
                    raise
                on_failure(failure, number)
                if number >= attempts:
                    raise
                yield task.deferLater(clock, policy(number), lambda: None)
                number += 1
                continue
            return result

    return loop()

