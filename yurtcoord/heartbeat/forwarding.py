"""What the leases' machines ask of the heartbeat delegation, and the bound on the
chains they run.

Each delegated lease is a machine of its own (``yurtcoord.heartbeat.leaselife``);
``LeaseForwarding`` is what they share: the write of one state (unless its Node left
the pool, or the leader saw it more than a heartbeat interval ago), the slots among
the chains in flight, the start of a retry, and each chain's outcome counted, timed,
logged and told to the delegation's observers.

Concurrency: leases of different nodes are delegated concurrently, but at most one
request chain per lease is in flight. How many chains run at once over all leases
follows the cloud's latency (``yurtcoord.tx.limiter.AdaptiveLimit``, read by
``ChainSlots`` whenever a chain could start; the leases ready wait in the order they
became ready): it grows while the chains finish about as fast as the fastest seen
lately and more leases wait, and shrinks when they fail or stay slow (not for one
stall), between ``min_concurrent`` and ``max_concurrent``. A pool of 5,000 nodes renewing every 5 s offers 1,000 delegations
a second: a fixed bound of 16 chains holds that only while a chain takes under 16 ms.
Changes seen meanwhile only replace the remembered pending state of that lease (the
one seen last wins), which runs when the chain finishes. A failed delegation (no
healthy cloud server, the cloud answering errors, conflicts to the end) is counted and
the newest state of that lease is retried after a capped backoff while it is fresh, so
a heartbeat is not lost until the next renewal.
"""

from collections import deque
from typing import Callable, Deque, Optional, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.heartbeat.cloudwrite import CloudLeaseWrites, NoHealthyCloudServer
from yurtcoord.heartbeat.leaselife import DelegatedLease, Heartbeat, ILeaseChains, Ready
from yurtcoord.heartbeat.refusals import REFUSED_EXPIRED, IDelegationMetrics
from yurtcoord.kube.leasewriter import CREATED, UNCHANGED
from yurtcoord.tx.durations import format_duration
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.observers import Observers


class ChainSlots:
    """The bound on chains in flight over all leases: the ``Ready`` leases wait in the
    order they became ready, and start while fewer than ``limit()`` chains run (read
    each time one could start, as the limit follows the cloud)."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._ready: Deque[Tuple[DelegatedLease, Ready]] = deque()
        self.in_flight = 0
        self._starting = False

    @property
    def queued(self) -> int:
        """How many leases wait for a free slot."""
        return sum(1 for _lease, ready in self._ready if ready.queued)

    def enqueue(self, lease: DelegatedLease, ready: Ready) -> None:
        self._ready.append((lease, ready))

    def ended(self) -> None:
        self.in_flight -= 1

    def take_free_slot(self) -> bool:
        """Take a slot for a chain to start at once, when one is free and no lease
        waits for one (a renewal of a lease that held nothing, the common case, then
        skips the queue)."""
        if self._ready or self.in_flight >= self._limit():
            return False
        self.in_flight += 1
        return True

    def start_chains(self) -> None:
        """Start the chains of the leases first ready while slots are free."""
        if self._starting:
            return  # a chain ended synchronously: the outer loop goes on
        self._starting = True
        try:
            while self._ready and self.in_flight < self._limit():
                lease, ready = self._ready.popleft()
                if ready.queued:
                    self.in_flight += 1
                    lease.start(ready.heartbeat)
        finally:
            self._starting = False

    def clear(self) -> None:
        self._ready.clear()
        self.in_flight = 0


# Seconds after an unexpected error of a lease's retry before the chains start again.
CHAINS_AGAIN_AFTER_ERROR = 1.0


@implementer(ILeaseChains)
class LeaseForwarding:
    """The delegation's side of every lease's machine (``ILeaseChains``).

    :param writes: the cloud writes; their ``limit`` bounds the chains in flight.
    :param node_of: ``(name)`` → the pool's Node of that name as listed, or None.
    :param refuse: ``(key, reason, detail)`` counts a refused state (``expired``).
    :param released: ``(key, lease)``: the machine holds nothing any more.
    :param heartbeat_interval: a state seen longer ago is not written any more.

    ``delegated``, ``created``, ``skipped`` and ``failures`` count the outcomes of the
    chains for /status and tests; they survive leadership terms. ``reads`` counts the
    cloud reads of lease names running now (one per lease reading).
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, writes: CloudLeaseWrites,
                 node_of: Callable[[str], Optional[dict]],
                 refuse: Callable[[str, str, str], None],
                 released: Callable[[str, DelegatedLease], None],
                 heartbeat_interval: float, metrics: Optional[IDelegationMetrics],
                 observers: Observers[[str, str]]) -> None:
        self.clock = self._reactor = reactor
        self._writes = writes
        self.slots = ChainSlots(lambda: writes.limit.limit)
        self._node_of = node_of
        self._refuse = refuse
        self._released = released
        self.heartbeat_interval = heartbeat_interval
        self._metrics = metrics
        self._loop_errors = ILoopErrors(metrics, None)
        self._observers = observers
        self._cloud_unavailable = False
        # Starting the chains again after an error of a retry (``retry``).
        self._chains_again: Optional[IDelayedCall] = None
        # Cloud reads of lease names running now (one per ``Reading`` lease).
        self.reads = 0
        self.delegated = 0
        self.created = 0
        self.skipped = 0
        self.failures = 0

    def stop(self) -> None:
        """The term ended: no chain runs, and a new term reads the cloud first."""
        if self._chains_again is not None and self._chains_again.active():
            self._chains_again.cancel()
        self._chains_again = None
        self.slots.clear()
        self._writes.clear()
        self.reads = 0

    def write(self, key: str, heartbeat: Heartbeat) -> defer.Deferred[Tuple[str, Optional[str]]]:
        """One delegation of the pool lease state ``heartbeat``; fires with (outcome,
        server), outcome being ``LeaseWriter``'s created or updated, or unchanged when
        nothing was written."""
        pool_lease = heartbeat.lease
        node = self._node_of(pool_lease["metadata"]["name"])
        if node is None:
            return defer.succeed((UNCHANGED, None))
        age = self._reactor.seconds() - heartbeat.seen
        if age > self.heartbeat_interval:
            # Held back (the cloud unreachable, a retry's backoff) and no change of
            # the lease seen since. The chain ends as a no-op; a newer state of the
            # lease (if any) runs after it.
            self._refuse(key, REFUSED_EXPIRED, (
                f"this leader saw that state {age:.1f}s ago and no change since, more "
                f"than the heartbeat interval {format_duration(self.heartbeat_interval)}: "
                "the node stopped renewing its pool lease"))
            return defer.succeed((UNCHANGED, None))
        return self._writes.write(key, pool_lease, node)

    def enqueue(self, lease: DelegatedLease, ready: Ready) -> None:
        self.slots.enqueue(lease, ready)

    def chain_ended(self) -> None:
        self.slots.ended()

    def start_chains(self) -> None:
        self.slots.start_chains()

    def read_ended(self) -> None:
        self.reads -= 1

    def retry(self, lease: DelegatedLease) -> None:
        def step() -> None:
            lease.retry_due()
            self.slots.start_chains()

        # Guarded (loop ``work-retry``): a defect there is logged and counted, and the
        # chains are started again ``CHAINS_AGAIN_AFTER_ERROR`` later, so a lease put
        # back in the FIFO is not left waiting for another lease's event.
        guarded("work-retry", step, self._loop_errors, self._start_chains_later)()

    def _start_chains_later(self, _failure: Failure) -> None:
        if self._chains_again is None or not self._chains_again.active():
            self._chains_again = self._reactor.callLater(
                CHAINS_AGAIN_AFTER_ERROR, guarded("work-retry", self._start_chains_again,
                                                  self._loop_errors, self._start_chains_later))

    def _start_chains_again(self) -> None:
        self._chains_again = None
        self.slots.start_chains()

    def released(self, key: str, lease: DelegatedLease) -> None:
        self._released(key, lease)

    def written(self, key: str, heartbeat: Heartbeat, result: Tuple[str, Optional[str]],
                failures: int) -> None:
        seconds = max(0.0, self._reactor.seconds() - heartbeat.since)
        if self._metrics is not None:
            self._metrics.observe_delegation(seconds, True)
        outcome, server = result
        if self._cloud_unavailable:
            self._cloud_unavailable = False
            self.log.info("heartbeat delegations reach the cloud again via {server}",
                          server=server)
        if failures:
            self.log.info("heartbeat delegation of {lease} recovered after {failures} failures",
                          lease=key, failures=failures)
        if outcome == UNCHANGED:
            self.skipped += 1
        else:
            self.delegated += 1
            if outcome == CREATED:
                self.created += 1
            self._observers.notify(key.partition("/")[2], outcome)
        # No log event per forwarded heartbeat: a large pool forwards a thousand a
        # second, and the metrics count and time each one.

    def failed(self, key: str, heartbeat: Heartbeat, failure: Failure, failures: int,
               delay: float) -> None:
        """Counted; the lease retries its newest state after ``delay``."""
        self.failures += 1
        if self._metrics is not None:
            self._metrics.observe_delegation(
                max(0.0, self._reactor.seconds() - heartbeat.since), False)
        # One line per outage, not one per node and retry: a cut cloud fails every
        # lease every few seconds.
        if failure.check(NoHealthyCloudServer) and not self._cloud_unavailable:
            self._cloud_unavailable = True
            self.log.warn("no healthy cloud server: heartbeat delegations wait and retry")
        if failures == 1 and not failure.check(NoHealthyCloudServer):
            self.log.warn("heartbeat delegation of {lease} failed: {error}; retry in {delay:.2f}s",
                          lease=key, error=describe_failure(failure), delay=delay)
        else:
            self.log.debug("heartbeat delegation of {lease} failed again: {error}; "
                           "retry in {delay:.2f}s", lease=key, error=describe_failure(failure),
                           delay=delay)

