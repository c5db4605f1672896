"""When a request to the pool etcd is sent again: the one home of the client's resend
policy.

A request goes to the member ``MemberSet.pick()`` names. After each send, ``Sends``
judges what came back and decides: the answer stands, or the request is given up with
its error, or it is sent again, after ``ETCD_RESEND_RETRY``'s pause (none: another
member, or a fresh connection to the only one, is tried at once), to the member
``pick()`` names then. The loop is ``yurtcoord.tx.retry.retrying``.

- A request the member did not answer (``Unanswered``: no connection, the connection
  lost, no answer in time) skips that member until its ``/health`` answers. It is
  resent when it is a read (idempotent) or surely never reached the member, unless it
  timed out: a request that timed out may still be at work there.
- An answer saying its member cannot serve now (no leader, leader changed,
  unavailable, timed out) counts only when there are several members, since the only
  one is never skipped for its answers; it skips the member too, and is resent when
  idempotent or when it is ``NoLeader`` (refused before it was proposed, so surely
  not applied).
- Each member is sent a request once at most; the only member is sent it twice.
- Nothing is resent once the client is closed.

Whatever is not resent ends the request with its typed error; a write that reached a
member carries ``maybe_applied`` and its caller resolves the doubt.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.etcd.errors import (
    ClientClosed, EtcdError, EtcdTimeout, EtcdUnavailable, NoLeader, RequestCancelled,
)
from yurtcoord.etcd.members import MemberSet
from yurtcoord.tx.retry import ETCD_RESEND_RETRY, RetryPolicy, retrying

__all__ = ["Unanswered", "Sends"]

A = TypeVar("A")


@dataclass(frozen=True)
class Unanswered:
    """A request its member did not answer: the ``error`` it ends with unless resent,
    and whether it surely never reached the member (no connection was made, or the
    request was not sent)."""

    error: EtcdError
    not_delivered: bool


class Sends(Generic[A]):
    """The sends of one request over ``members``, judged and resent as the module doc
    says.

    :param send: ``base`` → a Deferred of the answer (type ``A``) or of an
        ``Unanswered``; any other failure ends the request as it is.
    :param refusal: ``(base, answer)`` → the error of an answer saying its member cannot
        serve now, else None; None when no answer is a refusal (a stream's headers).
    :param closed: whether the client was closed.
    """

    log = Logger()

    def __init__(self, members: MemberSet, send: Callable[[str], "defer.Deferred[Any]"],
                 what: str, idempotent: bool, closed: Callable[[], bool],
                 refusal: Optional[Callable[[str, A], Optional[EtcdError]]] = None,
                 policy: RetryPolicy = ETCD_RESEND_RETRY) -> None:
        self._members = members
        self._send = send
        self._what = what
        self._idempotent = idempotent
        self._closed = closed
        several = len(members.urls) > 1
        self._refusal = refusal if several else None
        self._policy = policy
        self.attempts = len(members.urls) if several else 2
        # The error of the last send when that send is to be resent.
        self._resend: Optional[EtcdError] = None
        # The member of the last send.
        self.base = ""

    def run(self, clock: IReactorTime, attempts: Optional[int] = None) -> "defer.Deferred[A]":
        """Send until an answer stands or the request is given up (at most
        ``attempts`` sends, by default as many as the policy allows)."""
        d: defer.Deferred[A] = retrying(
            clock, self.attempt, self._policy, attempts or self.attempts,
            retryable=self.resending, on_failure=self._failed)
        return d.addErrback(self._cancelled_between_sends)

    def attempt(self) -> "defer.Deferred[A]":
        """One send to the member that serves now; EtcdUnavailable at once when none
        does."""
        self._resend = None
        base = self._members.pick()
        if base is None:
            return defer.fail(EtcdUnavailable(
                f"no etcd member serves (each is skipped until its /health answers): "
                f"{self._members.no_member_reason()}"))
        self.base = base
        return self._send(base).addCallback(self.judge, base)

    def judge(self, outcome: "A | Unanswered", base: str) -> A:
        """The answer of a send to ``base`` when it stands; else its error is raised,
        to be resent when ``resending`` says so. A member that did not answer, or
        answered that it cannot serve, is skipped from now on."""
        if isinstance(outcome, Unanswered):
            error = outcome.error
            self._members.failed(base, str(error))
            if not isinstance(error, EtcdTimeout) and (self._idempotent or outcome.not_delivered):
                self._resend = error
            raise error
        refusal = self._refusal(base, outcome) if self._refusal is not None else None
        if refusal is None:
            return outcome
        self._members.failed(base, str(refusal))
        if self._idempotent or isinstance(refusal, NoLeader):
            self._resend = refusal
        raise refusal

    def resending(self, failure: Failure) -> bool:
        """Whether the failed send is sent again (within the loop's attempts)."""
        return failure.value is self._resend and not self._closed()

    def _failed(self, failure: Failure, sends: int) -> None:
        if sends < self.attempts:
            self.log.debug("etcd request {what} failed, resending: {error}",
                           what=self._what, error=str(failure.value))

    def _cancelled_between_sends(self, failure: Failure) -> Failure:
        """A caller that cancels during the pause before a resend learns it as it
        would during a send: an etcd error."""
        if failure.check(defer.CancelledError):
            if self._closed():
                raise ClientClosed("etcd client closed")
            raise RequestCancelled(f"etcd request {self._what} cancelled by its caller")
        return failure
