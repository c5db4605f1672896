"""Which member of the pool etcd cluster the client's requests go to.

Requests go to one member at a time, the *current* one, so that a client's
requests see one member's view and reuse its connections. When a request to it fails
in a way that says the member cannot serve (no connection, no answer in time, the
member has no leader or lost it), the member is *skipped* and the next member in
configuration order that is not skipped becomes current; the switch is logged once,
with the member left, the one taken and the reason.

A skipped member is probed on its ``/health`` on the client's clock, after the pauses
of a retry policy (``yurtcoord.tx.retry``); once it answers healthy it may be current
again. While every member is skipped there is no current member and requests fail at
once, without waiting for a timeout: the caller retries later as it does when etcd is
down.

A client of one member never skips it: requests always go to it, as they would with
nowhere else to go.
"""

from typing import Callable, Optional

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.retry import ETCD_MEMBER_PROBE_RETRY, Retries, RetryPolicy

__all__ = ["MemberSet"]

# Characters of a failure reason kept for the log and the "no member" error.
_REASON_CHARS = 300


def _short(reason: str) -> str:
    return reason if len(reason) <= _REASON_CHARS else reason[:_REASON_CHARS] + "..."


class _Member:
    """One member: its URL and, while skipped, why and its probe schedule."""

    def __init__(self, url: str, policy: RetryPolicy) -> None:
        self.url = url
        self.skipped = False
        self.reason = ""
        self.retries = Retries(policy)
        self.probe_call: Optional[IDelayedCall] = None
        self.probing: Optional["Deferred[bool]"] = None


class MemberSet:
    """The members of one etcd cluster and the one requests go to now.

    :param clock: the reactor (or a ``task.Clock``) the probes are scheduled on.
    :param urls: the members' base URLs, in the order they are tried.
    :param probe: ``probe(url)`` fires True when the member's ``/health`` says it
        serves; False or a failure keeps it skipped.
    :param policy: the pause before each probe of a skipped member, by the number of
        probes so far (the first pause follows the failure that skipped it).
    :param loop_errors: where an unexpected error of the probe chain is counted
        (loop ``etcd-member-probe``; the agent's metrics, or None).
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, urls: list[str],
                 probe: Callable[[str], "Deferred[bool]"],
                 policy: RetryPolicy = ETCD_MEMBER_PROBE_RETRY,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        if not urls:
            raise ValueError("an etcd cluster needs at least one member URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"etcd member URLs appear twice: {', '.join(urls)}")
        self._clock = clock
        self._probe = probe
        self._members = [_Member(url, policy) for url in urls]
        self._current: Optional[_Member] = self._members[0]
        self._closed = False
        self._loop_errors = loop_errors

    @property
    def urls(self) -> list[str]:
        return [member.url for member in self._members]

    @property
    def current(self) -> Optional[str]:
        """The URL of the member requests go to now; None while every member is skipped."""
        return self._current.url if self._current is not None else None

    def skipped(self) -> dict[str, str]:
        """``{url: reason}`` of every member skipped now."""
        return {member.url: member.reason for member in self._members if member.skipped}

    def pick(self) -> Optional[str]:
        """The member for the next request (``current``)."""
        return self.current

    def no_member_reason(self) -> str:
        """Why no member is current: each member with the failure that skipped it."""
        return "; ".join(f"{member.url}: {member.reason}" for member in self._members)

    def failed(self, url: str, reason: str) -> None:
        """A request to ``url`` failed with ``reason``, a failure meaning the member
        cannot serve: skip it until its ``/health`` answers, and move on."""
        if len(self._members) == 1 or self._closed:
            return
        member = self._member(url)
        if member is None or member.skipped:
            return
        member.skipped = True
        member.reason = _short(reason)
        member.retries.reset()
        self._schedule_probe(member)
        if member is self._current:
            self._switch(member, self._next_usable(member), member.reason)

    def _member(self, url: str) -> Optional[_Member]:
        for member in self._members:
            if member.url == url:
                return member
        return None

    def _next_usable(self, after: _Member) -> Optional[_Member]:
        start = self._members.index(after)
        for offset in range(1, len(self._members) + 1):
            member = self._members[(start + offset) % len(self._members)]
            if not member.skipped:
                return member
        return None

    def _switch(self, previous: Optional[_Member], new: Optional[_Member],
                reason: str) -> None:
        self._current = new
        if new is None:
            self.log.warn("etcd member switch: from {from} to none, every member is "
                          "skipped until its /health answers ({reason})",
                          reason=reason, **{"from": previous.url if previous else None,
                                            "to": None})
            return
        self.log.info("etcd member switch: from {from} to {to} ({reason})", reason=reason,
                      **{"from": previous.url if previous else None, "to": new.url})

    def _schedule_probe(self, member: _Member) -> None:
        delay = member.retries.next_delay()
        member.probe_call = self._clock.callLater(delay, self._run_probe, member)

    def _run_probe(self, member: _Member) -> None:
        member.probe_call = None
        # Each probe's end schedules the next one: an end that raised would leave the
        # member skipped for good, so it is guarded and schedules the next probe.
        done = guarded("etcd-member-probe", self._probe_done, self._loop_errors,
                       on_error=lambda _failure: self._probe_again(member))
        try:
            probing = self._probe(member.url)
        except Exception:
            self.log.failure("etcd member {url} health probe failed to start", url=member.url)
            done(False, member)
            return
        member.probing = probing
        probing.addCallbacks(lambda healthy: bool(healthy) is True, lambda _f: False)
        probing.addCallback(done, member)

    def _probe_again(self, member: _Member) -> None:
        """The end of a probe raised: the member, still skipped, is probed again after
        its next pause unless a probe is already scheduled or running."""
        member.probing = None
        if (self._closed or not member.skipped or member.probe_call is not None):
            return
        self._schedule_probe(member)

    def _probe_done(self, healthy: "bool | Failure", member: _Member) -> None:
        member.probing = None
        if self._closed or not member.skipped:
            return
        if healthy is not True:
            self._schedule_probe(member)
            return
        member.skipped = False
        member.retries.reset()
        self.log.info("etcd member {url} answers /health again; it may take requests",
                      url=member.url)
        if self._current is None:
            self._switch(None, member, f"{member.url} is healthy again")

    def close(self) -> None:
        """Stop probing (the client is closed)."""
        self._closed = True
        for member in self._members:
            if member.probe_call is not None and member.probe_call.active():
                member.probe_call.cancel()
            member.probe_call = None
            if member.probing is not None:
                member.probing.cancel()
