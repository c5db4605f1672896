"""The one way the agent writes a Lease: get-or-create, then update under optimistic
concurrency, re-reading on conflict, in a bounded number of attempts.

Every lease the agent writes goes through ``LeaseWriter``: the node's heartbeat lease
(health probes), the election lease, the heartbeats the leader forwards to the cloud,
and the informer sync lease. What differs between them is only what they write, which
the caller says with a ``change`` function, and how hard they try, which the caller
says with ``attempts``, ``retry_errors`` and a retry policy.

One write:

- The writer starts from the lease it wrote (or read) last, so a steady renewal is a
  single update; with nothing remembered it reads the lease first (absent: ``None``).
- ``change(current)`` returns the lease to write: a new lease to create when
  ``current`` is ``None``, or ``current`` changed (it carries ``current``'s
  resourceVersion, which makes the update optimistic). Returning ``None`` writes
  nothing: the write ends as ``unchanged``. ``change`` may also return a Deferred
  of either, when what to write needs a request of its own (a node lease without an
  owner reads its Node to name it); that request belongs to the attempt and its timeout.
- A conflict (the lease changed since it was read, was created meanwhile, or was
  deleted under an update) reads the lease again and asks ``change`` again, at once.
- Any other error ends the write, unless ``retry_errors``: then the next attempt
  follows after the retry policy's delay (``yurtcoord.tx.retry.LEASE_WRITE_RETRY``
  unless given). A heartbeat must survive one lost request; the elector and the
  delegation have retry cadences of their own.
- Each attempt (a read and a write at most) is bounded by ``attempt_timeout``. The
  caller bounds the whole write by cancelling the returned Deferred (``addTimeout``).

A write that used up its attempts fails with the last error; when that was a conflict,
with ``LeaseWriteFailed``: a lease write that was not written is never a success.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from yurtcoord.kube.errors import AlreadyExists, Conflict, NotFound
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.tx.retry import LEASE_WRITE_RETRY, RetryPolicy

CREATED = "created"
UPDATED = "updated"
UNCHANGED = "unchanged"

Lease = dict[str, Any]
Change = Callable[[Optional[Lease]], "Optional[Lease] | defer.Deferred[Any]"]


class LeaseWriteFailed(Exception):
    """Every attempt to write the lease ended in a conflict: nothing was written."""


@dataclass(frozen=True)
class LeaseWrite:
    """What a write did: ``outcome`` is ``created``, ``updated`` or ``unchanged``;
    ``lease`` is the lease as the server now holds it (written, or as read when
    ``change`` wrote nothing; ``None`` when it is absent and stays absent)."""

    outcome: str
    lease: Optional[Lease]

    @property
    def written(self) -> bool:
        return self.outcome != UNCHANGED


class LeaseWriter:
    """Writes the lease ``namespace/name`` through ``client``.

    ``client`` has Deferred-returning ``get(gvr, name, namespace=...)``,
    ``create(gvr, obj, namespace=...)`` and ``update(gvr, obj, namespace=...)`` that
    fail with ``yurtcoord.kube.errors`` types (``KubeClient`` does).
    ``on_read(lease)``, when given, is called with every lease read from the server
    (``None``: absent), before ``change`` sees it; the elector judges expiry by when
    it saw a lease change.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, client: IObjectClient, namespace: str, name: str,
                 attempts: int = 1, retry_errors: bool = False,
                 retry_policy: Optional[RetryPolicy] = None,
                 attempt_timeout: Optional[float] = None,
                 on_read: Optional[Callable[[Optional[Lease]], None]] = None) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self._clock = clock
        self._client = client
        self.namespace = namespace
        self.name = name
        self._attempts = attempts
        self._retry_errors = retry_errors
        self._retry_policy = retry_policy or LEASE_WRITE_RETRY
        self._attempt_timeout = attempt_timeout
        self._on_read = on_read
        # The lease as the server held it after our last write or read: the next
        # write starts from it instead of reading. Dropped after an error, when what
        # the server holds is unknown.
        self._known: Optional[Lease] = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def known(self) -> Optional[Lease]:
        """The lease as last written or read by this writer, or None."""
        return self._known

    def forget(self) -> None:
        """Read the lease again at the next write."""
        self._known = None

    def write(self, change: Change,
              attempts: Optional[int] = None) -> "defer.Deferred[LeaseWrite]":
        """One write (see the module docstring); fires with a ``LeaseWrite``.

        ``attempts`` overrides the writer's for this write only: the elector renews
        its own lease with a conflict re-read, but takes a lease in one attempt."""
        if attempts is not None and attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        return self._write(change, attempts or self._attempts)

    @defer.inlineCallbacks
    def _write(self, change: Change,
               attempts: int) -> Generator["defer.Deferred[Any]", Any, LeaseWrite]:
        current, self._known = self._known, None
        from_cache = current is not None
        failures = 0
        last_error: Optional[Exception] = None
        for attempt in range(1, attempts + 1):
            if last_error is not None and not isinstance(last_error, (Conflict, NotFound)):
                failures += 1
                yield task.deferLater(self._clock, self._retry_policy(failures), lambda: None)
            step = self._attempt(change, current, from_cache)
            if self._attempt_timeout is not None:
                step.addTimeout(self._attempt_timeout, self._clock)
            try:
                result = yield step
            except (Conflict, NotFound) as error:
                # Changed, created or deleted since read: read again, at once.
                last_error, current, from_cache = error, None, False
                continue
            except defer.CancelledError:
                raise
            except Exception as error:
                if not self._retry_errors:
                    raise
                last_error, current, from_cache = error, None, False
                self.log.debug("lease {lease} write attempt {attempt} failed: {error}",
                               lease=self.key, attempt=attempt, error=error)
                continue
            self._known = result.lease
            return result
        if isinstance(last_error, (Conflict, NotFound)):
            raise LeaseWriteFailed(
                f"lease {self.key} still conflicted after {attempts} attempts")
        # Every attempt that did not return or raise recorded its error.
        assert last_error is not None
        raise last_error

    @defer.inlineCallbacks
    def _attempt(self, change: Change, current: Optional[Lease],
                 from_cache: bool) -> Generator[Any, Any, LeaseWrite]:
        # Yields Deferreds, and what ``change`` returns, which may be a plain value.
        if not from_cache:
            try:
                current = yield self._client.get(LEASES, self.name, namespace=self.namespace)
            except NotFound:
                current = None
            if self._on_read is not None:
                self._on_read(current)
        desired = yield change(current)
        if desired is None:
            return LeaseWrite(UNCHANGED, current)
        if current is None:
            try:
                created = yield self._client.create(LEASES, desired, namespace=self.namespace)
            except AlreadyExists:
                raise Conflict(f"lease {self.key} was created meanwhile") from None
            return LeaseWrite(CREATED, created)
        updated = yield self._client.update(LEASES, desired, namespace=self.namespace)
        return LeaseWrite(UPDATED, updated)
