"""A keyed work queue: one item of work per key at a time, coalesced, bounded, retried.

The leader's pool sync pushes a stream of states per key to a slow remote: each
resource's changes to the pool etcd (the heartbeat delegation keeps the same guarantees
in its leases' machines, see docs/design.md, "One of each"). It needs:

- per key at most one item is in flight, so the writes of one key keep their order;
- items offered while one runs do not pile up: they are merged into the one item
  pending for that key (``merge(old, new)`` decides what survives: the newest lease,
  or the union of two batches of changes), so a burst becomes few writes;
- at most ``max_concurrent`` items run over all keys (a number, or a ``Limit`` whose
  ``limit`` may change between items, such as ``yurtcoord.tx.limiter.AdaptiveLimit``);
  keys wait for a free slot in the order they became ready, so one busy key cannot
  starve the others;
- a failed item is merged with what arrived meanwhile and runs again after the key's
  own backoff, so one failing key neither hammers the remote nor delays other keys;
  a success resets that backoff;
- ``forget(key)`` drops what is pending for a key and cancels its retry: the running
  item (if any) finishes, but its failure is not retried;
- ``stop()`` cancels every running item (Deferred cancellation) and every retry timer
  in the calling reactor turn, and leaves no delayed call behind.

A key's retry timer is guarded (loop ``work-retry`` of ``yurtcoord.tx.guardedloop``):
if putting the key back raises (a ``Limit`` whose ``limit`` raises, a defect), the
error is logged and counted in ``loop_errors`` and the key's retry is armed again
after its backoff. Unguarded, the key would wait in the ready queue until some other
key's event happened to pump it, and with no other traffic its work would stay stuck.

The clock and the retry policy (``yurtcoord.tx.retry``'s one shape, ``policy(failures)
-> seconds``; the queue counts each key's failures) are injected, so tests drive the queue with
``twisted.internet.task.Clock`` and deterministic delays.
"""

from __future__ import annotations

from collections import deque
from typing import (Any, Callable, Deque, Dict, Generic, Hashable, List, Optional, Protocol,
                    Tuple, TypeVar)

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.retry import RetryPolicy

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Limit(Protocol):
    """A bound on items running at once that may change; read before each item starts."""

    @property
    def limit(self) -> int:
        """Items that may run at once now (at least 1)."""


class _FixedLimit:
    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit


class _Slot(Generic[T]):
    """What the queue knows of one key: the pending item, the running one, the retry
    timer, its consecutive failures, and whether it waits in the ready queue."""

    __slots__ = ("pending", "running", "retry", "failures", "queued", "discard_running")

    def __init__(self) -> None:
        # The pending item in a box, so that any value (None too) can be an item.
        self.pending: Optional[Tuple[T]] = None
        self.running: Optional[defer.Deferred[Any]] = None
        self.retry: Optional[IDelayedCall] = None
        self.failures = 0
        self.queued = False
        # The running item was forgotten: its failure is not retried.
        self.discard_running = False

    @property
    def idle(self) -> bool:
        return self.pending is None and self.running is None and self.retry is None

    def take(self) -> Optional[Tuple[T]]:
        """The pending item (boxed), or None; nothing is pending afterwards."""
        pending, self.pending = self.pending, None
        return pending

    def offer(self, item: T, merge: Callable[[T, T], T]) -> None:
        """Make ``item`` the pending item, merged with the one pending already."""
        self.pending = (item,) if self.pending is None else (merge(self.pending[0], item),)


class WorkQueue(Generic[K, T]):
    """Runs ``work(key, item)`` for the items offered with ``add``, see the module
    docstring for the guarantees.

    :param clock: schedules the retries (the reactor, or a ``Clock`` in tests).
    :param work: ``(key, item)`` → a Deferred (or a plain value) of one attempt; a
        failure is retried. It must accept cancellation: ``stop()`` cancels it.
    :param merge: ``(old, new)`` → the item to keep when ``new`` is offered while
        ``old`` is pending, and when an attempt of ``old`` failed while ``new`` was
        offered.
    :param policy: ``failures`` → the pause before a key's next attempt, the key's
        consecutive failures counted by the queue (``yurtcoord.tx.retry.RetryPolicy``).
    :param max_concurrent: items running at once over all keys: a number, or a
        ``Limit`` read whenever an item could start (a limit that grows lets more
        start when the next item finishes or is offered).
    :param on_success: ``(key, item, result, failures)`` after an attempt succeeded;
        ``failures`` counts the failed attempts of that key just before it.
    :param on_failure: ``(key, item, failure, failures, delay)`` after an attempt
        failed; ``failures`` counts this one, ``delay`` is the pause before a retry.
    :param loop_errors: where an unexpected error of a retry timer is counted (loop
        ``work-retry``, the agent's metrics); without it, it is only logged.

    An exception raised by ``on_success`` or ``on_failure`` is logged; the queue
    goes on, so a defect in reporting cannot stall every key.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, work: Callable[[K, T], Any],
                 merge: Callable[[T, T], T], policy: RetryPolicy,
                 max_concurrent: "int | Limit" = 1,
                 on_success: Optional[Callable[[K, T, Any, int], None]] = None,
                 on_failure: Optional[Callable[[K, T, Failure, int, float], None]] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        if isinstance(max_concurrent, int):
            if max_concurrent < 1:
                raise ValueError(
                    f"a work queue needs max_concurrent >= 1, got {max_concurrent}")
            max_concurrent = _FixedLimit(max_concurrent)
        self._clock = clock
        self._work = work
        self._merge = merge
        self._policy = policy
        self._limit: Limit = max_concurrent
        self._on_success = on_success
        self._on_failure = on_failure
        self._loop_errors = loop_errors
        self._slots: Dict[K, _Slot[T]] = {}
        self._ready: Deque[K] = deque()
        self._active = 0
        self._pumping = False

    # -- what callers read -------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """How many items are running now."""
        return self._active

    @property
    def queued(self) -> int:
        """How many keys wait for a free slot."""
        return sum(1 for slot in self._slots.values() if slot.queued)

    def has_work(self, key: K) -> bool:
        """Whether ``key`` has an item pending, running or waiting for its retry."""
        slot = self._slots.get(key)
        return slot is not None and not slot.idle

    def running(self, key: K) -> bool:
        """Whether an item of ``key`` is running now."""
        slot = self._slots.get(key)
        return slot is not None and slot.running is not None

    def failures(self, key: K) -> int:
        """Consecutive failed attempts of ``key`` (0 after a success)."""
        slot = self._slots.get(key)
        return 0 if slot is None else slot.failures

    # -- offering and forgetting ---------------------------------------------------------

    def add(self, key: K, item: T) -> None:
        """Offer ``item`` for ``key``: merged into the pending item, if any, and run
        when the key has nothing running, no retry pause and a free slot."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        slot.offer(item, self._merge)
        self._enqueue(key, slot)

    def forget(self, key: K) -> None:
        """Drop the pending item of ``key`` and cancel its retry. A running item
        finishes (its success is reported), but its failure is not retried."""
        slot = self._slots.get(key)
        if slot is None:
            return
        slot.take()
        slot.queued = False
        if slot.retry is not None:
            if slot.retry.active():
                slot.retry.cancel()
            slot.retry = None
        if slot.running is not None:
            slot.discard_running = True
        else:
            del self._slots[key]

    def stop(self) -> defer.Deferred[None]:
        """Cancel every running item and retry timer and forget every key, in this
        reactor turn; the Deferred fires once the cancelled items have ended. Nothing
        of a cancelled item is reported. The queue may be used again afterwards."""
        slots, self._slots = self._slots, {}
        self._ready.clear()
        self._active = 0
        running: List[defer.Deferred[Any]] = []
        for slot in slots.values():
            if slot.retry is not None and slot.retry.active():
                slot.retry.cancel()
            slot.retry = None
            slot.take()
            slot.queued = False
            if slot.running is not None:
                d, slot.running = slot.running, None
                d.cancel()
                running.append(d)
        return defer.DeferredList(running, consumeErrors=True).addCallback(lambda _: None)

    # -- running -------------------------------------------------------------------------

    def _enqueue(self, key: K, slot: "_Slot[T]") -> None:
        if slot.pending is not None and slot.running is None and slot.retry is None \
                and not slot.queued:
            slot.queued = True
            self._ready.append(key)
        self._pump()

    def _pump(self) -> None:
        if self._pumping:
            return  # an item finished synchronously: the outer loop goes on
        self._pumping = True
        try:
            while self._ready and self._active < self._limit.limit:
                key = self._ready.popleft()
                slot = self._slots.get(key)
                if slot is None or not slot.queued:
                    continue  # forgotten while it waited
                slot.queued = False
                self._run(key, slot)
        finally:
            self._pumping = False

    def _run(self, key: K, slot: "_Slot[T]") -> None:
        pending = slot.take()
        if pending is None:
            return
        (item,) = pending
        self._active += 1
        d = defer.maybeDeferred(self._work, key, item)
        slot.running = d
        # Runs at once when the work finished synchronously.
        d.addBoth(self._finished, key, slot, item, d)

    def _finished(self, result: Any, key: K, slot: "_Slot[T]", item: T,
                  d: defer.Deferred[Any]) -> None:
        if slot.running is not d:
            return None  # stopped meanwhile: nothing of this item is reported
        slot.running = None
        self._active -= 1
        discard, slot.discard_running = slot.discard_running, False
        if not isinstance(result, Failure):
            failures, slot.failures = slot.failures, 0
            if self._on_success is not None:
                self._report(self._on_success, key, item, result, failures)
        else:
            slot.failures += 1
            delay = self._policy(slot.failures)
            if not discard:
                newer, slot.pending = slot.pending, (item,)
                if newer is not None:
                    slot.offer(newer[0], self._merge)
            if slot.pending is not None:
                slot.retry = self._clock.callLater(delay, self._guarded_retry, key, slot)
            if self._on_failure is not None:
                self._report(self._on_failure, key, item, result, slot.failures, delay)
        if self._slots.get(key) is slot:
            if slot.idle:
                del self._slots[key]
            else:
                self._enqueue(key, slot)
                return None
        self._pump()
        return None

    def _report(self, report: Callable[..., None], key: K, *args: Any) -> None:
        try:
            report(key, *args)
        except Exception:
            self.log.failure("reporting the outcome of work on {key!r} failed", key=key)

    def _guarded_retry(self, key: K, slot: "_Slot[T]") -> None:
        """The retry timer of ``key``: ``_retry`` guarded (loop ``work-retry``)."""
        guarded("work-retry", self._retry, self._loop_errors,
                lambda _failure: self._retry_failed(key, slot))(key, slot)

    def _retry(self, key: K, slot: "_Slot[T]") -> None:
        slot.retry = None
        if self._slots.get(key) is slot:
            self._enqueue(key, slot)

    def _retry_failed(self, key: K, slot: "_Slot[T]") -> None:
        """After a retry that raised: the key leaves the ready queue (nothing else
        would take it out again) and its retry is armed anew after its backoff, unless
        it was forgotten, stopped or runs already."""
        if self._slots.get(key) is not slot or slot.running is not None \
                or slot.retry is not None:
            return
        slot.queued = False
        if slot.pending is not None:
            slot.retry = self._clock.callLater(self._policy(slot.failures),
                                               self._guarded_retry, key, slot)
        elif slot.idle:
            del self._slots[key]
