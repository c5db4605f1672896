"""The life of one delegated node lease on the leader, as one Automat machine.

The leader's heartbeat delegation (``yurtcoord.heartbeat.delegation``) keeps one
``DelegatedLease`` per pool lease it holds something of, in one dict; the machine is
dropped from it as soon as it holds nothing (``Idle``). What it holds is its state's
own data, so a parked lease, a cloud read, a write in flight or a retry timer exists
only in the one state that needs it:

- ``Waiting``: the newest state of the lease, kept until the pool's Nodes are listed;
- ``Reading``: the newest state, parked while a cloud read of its name (the Deferred
  held here) tells whether it is a Node of the pool the informer has not delivered;
- ``Parked``: the newest state, after the cloud answered that the Node is in the
  pool, until the informer delivers it;
- ``Ready``: the state to write, waiting in the delegation's queue for a free chain;
- ``Writing``: the one request chain of this lease in flight (its Deferred), with
  the newest state seen meanwhile pending, and whether a failure is to be retried
  (not once the lease was forgotten);
- ``BackingOff``: the state to retry and the timer of the lease's backoff;
- ``Stopped``: the term ended; whatever the lease held was cancelled.

Which state a new lease state goes to is the delegation's decision (it knows the
pool's Nodes and the budget of cloud reads); the machine keeps one chain per lease,
merges states seen while one runs, and retries after its own backoff. An input the
current state does not take raises ``automat.NoTransition``: no flag tells the
machine where it is.

The chains in flight over all leases are bounded by ``ChainSlots``
(``yurtcoord.heartbeat.forwarding``): a FIFO of the ``Ready`` leases and a limit read
whenever a chain could start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from automat import TypeMachineBuilder
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Attribute, Interface

from yurtcoord.tx.retry import RetryPolicy


class Heartbeat:
    """One state of a pool lease on its way to the cloud: when the leader saw it (its
    own clock: the moment of the heartbeat, which bounds how late it may still be
    written), and since when the oldest state it replaced has been waiting (for the
    latency metric)."""

    __slots__ = ("lease", "seen", "since")

    def __init__(self, lease: dict, seen: float, since: float) -> None:
        self.lease = lease
        self.seen = seen
        self.since = since


def newest(old: Heartbeat, new: Heartbeat) -> Heartbeat:
    """The state to forward of two states of one lease: the one seen last, waiting
    since the older of the two."""
    return Heartbeat(new.lease, max(old.seen, new.seen), min(old.since, new.since))


class ILeaseChains(Interface):
    """What one lease's machine asks of the delegation that holds it."""

    clock = Attribute("The leader's IReactorTime: the backoff timers run on it.")

    def write(key: str, heartbeat: Heartbeat) -> defer.Deferred[Any]:
        """Start the one request chain that writes ``heartbeat`` of lease ``key`` to
        the cloud; it must accept cancellation."""

    def enqueue(lease: "DelegatedLease", ready: "Ready") -> None:
        """``lease`` waits for a free chain (``ready.queued`` until it starts or
        leaves ``Ready``)."""

    def chain_ended() -> None:
        """A chain of some lease ended (or was cancelled): a slot is free."""

    def start_chains() -> None:
        """Start the chains of the leases ready first while slots are free."""

    def written(key: str, heartbeat: Heartbeat, result: Any, failures: int) -> None:
        """A chain succeeded; ``failures`` counts the failed ones just before it."""

    def failed(key: str, heartbeat: Heartbeat, failure: Failure, failures: int,
               delay: float) -> None:
        """A chain failed; the lease retries after ``delay`` if it still has a state
        to write."""

    def read_ended() -> None:
        """A cloud read of a lease's name ended, was cancelled or is moot."""

    def retry(lease: "DelegatedLease") -> None:
        """``lease``'s backoff is over: tell it ``retry_due`` and start chains."""

    def released(key: str, lease: "DelegatedLease") -> None:
        """``lease`` holds nothing any more: forget it."""


class DelegatedLease(Protocol):
    """The inputs of one delegated lease's machine (see the module docstring)."""

    def wait(self, heartbeat: Heartbeat) -> None:
        """A state seen before the pool's Nodes are listed: keep the newest."""

    def read(self, heartbeat: Heartbeat, lookup: defer.Deferred[Any]) -> None:
        """Park ``heartbeat`` while ``lookup``, a cloud read of its name, runs."""

    def not_member(self, heartbeat: Heartbeat) -> bool:
        """A state whose name the informer does not hold: True when it replaced the
        one parked (no new read is needed), False when nothing is parked."""

    def confirmed(self) -> None:
        """The read answered that the Node is in the pool: parked until delivered."""

    def answered(self) -> None:
        """The read answered (no such Node, or not in the pool): the parked state is
        refused, and the lease holds nothing more."""

    def take(self) -> Heartbeat:
        """The Nodes were listed: the state that waited is handed back, to be placed
        anew."""

    def delivered(self) -> Optional[Heartbeat]:
        """The informer delivered the lease's Node: the state read about (the read is
        moot) or parked is handed back, to be placed anew; None when none is."""

    def queue(self, heartbeat: Heartbeat) -> None:
        """A state of a pool member: written when the lease has no chain running, no
        backoff and a free slot; merged with the state pending, if any."""

    def start(self, heartbeat: Heartbeat) -> None:
        """A slot is free: the chain writing ``heartbeat``, the ready state, starts."""

    def refuse(self) -> None:
        """A newer state was refused: what is pending to write is dropped, a running
        chain finishes and its failure is not retried; a waiting or parked state
        stays."""

    def drop(self) -> None:
        """The lease was deleted, stopped asking for delegation, or its Node left the
        pool: nothing of it is written any more (a running chain finishes, not
        retried)."""

    def retry_due(self) -> None:
        """The backoff is over: the state to retry waits for a slot."""

    def stop(self) -> Optional[defer.Deferred[Any]]:
        """The term ends: cancel what the lease holds; the Deferred of a chain
        cancelled, if one ran."""

    def write(self, heartbeat: Heartbeat) -> None:
        """A state of a pool member, with a slot taken for it already: its chain
        starts now (a lease that held nothing, when no other lease waits)."""

    def _succeeded(self, result: Any) -> None:
        """The chain succeeded with ``result``, nothing seen meanwhile."""

    def _succeeded_pending(self, heartbeat: Heartbeat, result: Any) -> None:
        """The chain succeeded; ``heartbeat``, seen meanwhile, waits for a slot."""

    def _failed(self, heartbeat: Heartbeat, delay: float, result: Failure) -> None:
        """The chain failed; ``heartbeat`` (the newest state to write) is retried
        after ``delay``."""

    def _failed_forgotten(self, delay: float, result: Failure) -> None:
        """The chain failed after the lease was forgotten: nothing is retried."""

    def _again(self, heartbeat: Heartbeat) -> None:
        """The backoff is over: ``heartbeat`` waits for a slot."""

    def _park(self, heartbeat: Heartbeat) -> None:
        """The read confirmed the Node: ``heartbeat`` is parked until it is delivered."""


# One logger for every lease's machine: one is made for nearly every heartbeat sent.
_log = Logger()


@dataclass
class LeaseCore:
    """What one lease keeps across its states: its key, the delegation it reports to,
    its retry policy and its consecutive failed chains (0 after a success; a lease
    that held nothing for a while starts from 0 again)."""

    key: str
    chains: ILeaseChains
    policy: RetryPolicy
    failures: int = 0


@dataclass
class Kept:
    """The state of a lease held while waiting (``Waiting``, ``Parked``)."""

    heartbeat: Heartbeat


@dataclass
class Read:
    """The state parked while a cloud read of the lease's name runs, and that read."""

    heartbeat: Heartbeat
    lookup: defer.Deferred[Any]


@dataclass
class Ready:
    """The state to write; ``queued`` while it waits in the FIFO of ``ChainSlots``."""

    heartbeat: Heartbeat
    queued: bool = True


@dataclass
class Chain:
    """The running chain of a lease: the state it writes and its Deferred, the newest
    state seen meanwhile, and whether its failure is retried. ``live`` until the
    chain's end is told to the machine or the chain is cancelled."""

    heartbeat: Heartbeat
    running: defer.Deferred[Any]
    pending: Optional[Heartbeat] = None
    retry: bool = True
    live: bool = True


@dataclass
class Backoff:
    """The state to retry and the timer of the lease's backoff."""

    heartbeat: Heartbeat
    timer: IDelayedCall


# The data factories: each gets the arguments of the input entering its state.

def _kept(lease: DelegatedLease, core: LeaseCore, heartbeat: Heartbeat) -> Kept:
    return Kept(heartbeat)


def _reading(lease: DelegatedLease, core: LeaseCore, heartbeat: Heartbeat,
             lookup: defer.Deferred[Any]) -> Read:
    return Read(heartbeat, lookup)


def _ready(lease: DelegatedLease, core: LeaseCore, heartbeat: Heartbeat,
           result: Any = None) -> Ready:
    ready = Ready(heartbeat)
    core.chains.enqueue(lease, ready)
    return ready


def _chain(lease: DelegatedLease, core: LeaseCore, heartbeat: Heartbeat) -> Chain:
    running = defer.maybeDeferred(core.chains.write, core.key, heartbeat)
    chain = Chain(heartbeat, running)

    def ended(result: Any) -> None:
        if chain.live:
            chain.live = False
            _end(lease, core, chain, result)
            # After the lease moved on (unless it is starting this very chain: then
            # the loop starting chains goes on once it has).
            core.chains.start_chains()
        return None

    running.addBoth(ended)
    return chain


def _end(lease: DelegatedLease, core: LeaseCore, chain: Chain, result: Any) -> None:
    """Tell the lease how its chain ended, by what the chain holds: a newer state
    pending, and whether a failure is retried (a machine's input names its next
    state, so the chain's data picks the input)."""
    if not isinstance(result, Failure):
        if chain.pending is None:
            lease._succeeded(result)
        else:
            lease._succeeded_pending(chain.pending, result)
        return
    delay = core.policy(core.failures + 1)
    retried = chain.heartbeat if chain.retry else None
    if chain.pending is not None:
        retried = chain.pending if retried is None else newest(retried, chain.pending)
    if retried is None:
        lease._failed_forgotten(delay, result)
    else:
        lease._failed(retried, delay, result)


def _backing_off(lease: DelegatedLease, core: LeaseCore, heartbeat: Heartbeat,
                 delay: float, result: Failure) -> Backoff:
    return Backoff(heartbeat, core.chains.clock.callLater(delay, core.chains.retry, lease))


_builder = TypeMachineBuilder(DelegatedLease, LeaseCore)
Idle = _builder.state("Idle")
Waiting = _builder.state("Waiting", _kept)
Reading = _builder.state("Reading", _reading)
Parked = _builder.state("Parked", _kept)
ReadyToWrite = _builder.state("Ready", _ready)
Writing = _builder.state("Writing", _chain)
BackingOff = _builder.state("BackingOff", _backing_off)
Stopped = _builder.state("Stopped")


# -- before the pool's Nodes are listed ------------------------------------------------

Idle.upon(DelegatedLease.wait).to(Waiting).returns(None)


@Waiting.upon(DelegatedLease.wait).loop()
def _wait_again(lease: DelegatedLease, core: LeaseCore, kept: Kept,
                heartbeat: Heartbeat) -> None:
    kept.heartbeat = heartbeat


@Waiting.upon(DelegatedLease.take).to(Idle)
def _take_waiting(lease: DelegatedLease, core: LeaseCore, kept: Kept) -> Heartbeat:
    core.chains.released(core.key, lease)
    return kept.heartbeat


@Parked.upon(DelegatedLease.delivered).to(Idle)
def _deliver_parked(lease: DelegatedLease, core: LeaseCore,
                    kept: Kept) -> Optional[Heartbeat]:
    core.chains.released(core.key, lease)
    return kept.heartbeat


@Waiting.upon(DelegatedLease.delivered).loop()
def _delivered_while_waiting(lease: DelegatedLease, core: LeaseCore,
                             kept: Kept) -> Optional[Heartbeat]:
    """Before the list the lease waits for it, whichever Nodes arrive first."""
    return None


@ReadyToWrite.upon(DelegatedLease.delivered, nodata=True).loop()
@Writing.upon(DelegatedLease.delivered, nodata=True).loop()
@BackingOff.upon(DelegatedLease.delivered, nodata=True).loop()
def _delivered_while_written(lease: DelegatedLease, core: LeaseCore) -> Optional[Heartbeat]:
    """A Node updated while its lease is written: nothing was parked."""
    return None


@Waiting.upon(DelegatedLease.refuse).loop()
@Parked.upon(DelegatedLease.refuse).loop()
def _kept_despite_refusal(lease: DelegatedLease, core: LeaseCore, kept: Kept) -> None:
    return None


@Waiting.upon(DelegatedLease.drop).to(Idle)
@Parked.upon(DelegatedLease.drop).to(Idle)
def _drop_kept(lease: DelegatedLease, core: LeaseCore, kept: Kept) -> None:
    core.chains.released(core.key, lease)


@Waiting.upon(DelegatedLease.stop).to(Stopped)
@Parked.upon(DelegatedLease.stop).to(Stopped)
def _stop_kept(lease: DelegatedLease, core: LeaseCore,
               kept: Kept) -> Optional[defer.Deferred[Any]]:
    return None


# -- a name the informer does not hold ---------------------------------------------------

Idle.upon(DelegatedLease.read).to(Reading).returns(None)


@Writing.upon(DelegatedLease.read).to(Reading)
def _read_instead_of_writing(lease: DelegatedLease, core: LeaseCore, chain: Chain,
                             heartbeat: Heartbeat, lookup: defer.Deferred[Any]) -> None:
    """The Node left the pool while a chain of its lease ran, and the lease changed
    again: the chain's state is not wanted any more, the newer state is read about."""
    _cancel_chain(core, chain)


@Reading.upon(DelegatedLease.not_member).loop()
def _park_newer_while_reading(lease: DelegatedLease, core: LeaseCore, read: Read,
                              heartbeat: Heartbeat) -> bool:
    read.heartbeat = heartbeat
    return True


@Parked.upon(DelegatedLease.not_member).loop()
def _park_newer(lease: DelegatedLease, core: LeaseCore, kept: Kept,
                heartbeat: Heartbeat) -> bool:
    kept.heartbeat = heartbeat
    return True


@Writing.upon(DelegatedLease.not_member).loop()
def _nothing_parked_while_writing(lease: DelegatedLease, core: LeaseCore, chain: Chain,
                                  heartbeat: Heartbeat) -> bool:
    return False


@Reading.upon(DelegatedLease.confirmed).loop()
def _confirmed(lease: DelegatedLease, core: LeaseCore, read: Read) -> None:
    core.chains.read_ended()
    lease._park(read.heartbeat)


Reading.upon(DelegatedLease._park).to(Parked).returns(None)


@Reading.upon(DelegatedLease.answered).to(Idle)
def _answered(lease: DelegatedLease, core: LeaseCore, read: Read) -> None:
    core.chains.read_ended()
    core.chains.released(core.key, lease)


@Reading.upon(DelegatedLease.delivered).to(Idle)
def _deliver_read(lease: DelegatedLease, core: LeaseCore, read: Read) -> Optional[Heartbeat]:
    """The Node was delivered while its read ran: the read is moot."""
    _cancel_read(core, read)
    core.chains.released(core.key, lease)
    return read.heartbeat


@Reading.upon(DelegatedLease.refuse).loop()
def _read_despite_refusal(lease: DelegatedLease, core: LeaseCore, read: Read) -> None:
    return None


@Reading.upon(DelegatedLease.drop).to(Idle)
def _drop_read(lease: DelegatedLease, core: LeaseCore, read: Read) -> None:
    _cancel_read(core, read)
    core.chains.released(core.key, lease)


@Reading.upon(DelegatedLease.stop).to(Stopped)
def _stop_read(lease: DelegatedLease, core: LeaseCore,
               read: Read) -> Optional[defer.Deferred[Any]]:
    _cancel_read(core, read)
    return None


def _cancel_read(core: LeaseCore, read: Read) -> None:
    core.chains.read_ended()
    read.lookup.cancel()


# -- writing to the cloud -----------------------------------------------------------------

Idle.upon(DelegatedLease.queue).to(ReadyToWrite).returns(None)
Idle.upon(DelegatedLease.write).to(Writing).returns(None)


@ReadyToWrite.upon(DelegatedLease.queue).loop()
def _merge_ready(lease: DelegatedLease, core: LeaseCore, ready: Ready,
                 heartbeat: Heartbeat) -> None:
    ready.heartbeat = newest(ready.heartbeat, heartbeat)


@ReadyToWrite.upon(DelegatedLease.start).to(Writing)
def _start(lease: DelegatedLease, core: LeaseCore, ready: Ready,
           heartbeat: Heartbeat) -> None:
    ready.queued = False


@ReadyToWrite.upon(DelegatedLease.refuse).to(Idle)
@ReadyToWrite.upon(DelegatedLease.drop).to(Idle)
def _forget_ready(lease: DelegatedLease, core: LeaseCore, ready: Ready) -> None:
    ready.queued = False
    core.chains.released(core.key, lease)


@ReadyToWrite.upon(DelegatedLease.stop).to(Stopped)
def _stop_ready(lease: DelegatedLease, core: LeaseCore,
                ready: Ready) -> Optional[defer.Deferred[Any]]:
    ready.queued = False
    return None


@Writing.upon(DelegatedLease.queue).loop()
def _pend(lease: DelegatedLease, core: LeaseCore, chain: Chain,
          heartbeat: Heartbeat) -> None:
    chain.pending = heartbeat if chain.pending is None else newest(chain.pending, heartbeat)


@Writing.upon(DelegatedLease.refuse).loop()
@Writing.upon(DelegatedLease.drop).loop()
def _forget_writing(lease: DelegatedLease, core: LeaseCore, chain: Chain) -> None:
    chain.pending = None
    chain.retry = False


# The chain's end: the lease moves on (rests, waits for a slot, or backs off), and
# once it is there the outcome is reported, so that whoever hears of it finds the
# lease where it belongs.

@Writing.upon(DelegatedLease._succeeded).to(Idle)
def _succeeded(lease: DelegatedLease, core: LeaseCore, chain: Chain, result: Any) -> None:
    failures = _succeeded_chain(core)
    core.chains.released(core.key, lease)
    _report(core, core.chains.written, core.key, chain.heartbeat, result, failures)


@Writing.upon(DelegatedLease._succeeded_pending).to(ReadyToWrite)
def _succeeded_pending(lease: DelegatedLease, core: LeaseCore, chain: Chain,
                       heartbeat: Heartbeat, result: Any) -> None:
    failures = _succeeded_chain(core)
    _report(core, core.chains.written, core.key, chain.heartbeat, result, failures)


@Writing.upon(DelegatedLease._failed).to(BackingOff)
def _failed(lease: DelegatedLease, core: LeaseCore, chain: Chain, heartbeat: Heartbeat,
            delay: float, result: Failure) -> None:
    _failed_chain(core, chain, delay, result)


@Writing.upon(DelegatedLease._failed_forgotten).to(Idle)
def _failed_forgotten(lease: DelegatedLease, core: LeaseCore, chain: Chain, delay: float,
                      result: Failure) -> None:
    core.chains.released(core.key, lease)
    _failed_chain(core, chain, delay, result)


def _succeeded_chain(core: LeaseCore) -> int:
    """The failures just before this success; the count starts afresh."""
    core.chains.chain_ended()
    failures, core.failures = core.failures, 0
    return failures


def _failed_chain(core: LeaseCore, chain: Chain, delay: float, result: Failure) -> None:
    core.chains.chain_ended()
    core.failures += 1
    _report(core, core.chains.failed, core.key, chain.heartbeat, result, core.failures, delay)


@Writing.upon(DelegatedLease.stop).to(Stopped)
def _stop_writing(lease: DelegatedLease, core: LeaseCore,
                  chain: Chain) -> Optional[defer.Deferred[Any]]:
    _cancel_chain(core, chain)
    return chain.running


def _cancel_chain(core: LeaseCore, chain: Chain) -> None:
    if chain.live:
        chain.live = False
        core.chains.chain_ended()
        chain.running.cancel()


@BackingOff.upon(DelegatedLease.queue).loop()
def _merge_backing_off(lease: DelegatedLease, core: LeaseCore, backoff: Backoff,
                       heartbeat: Heartbeat) -> None:
    backoff.heartbeat = newest(backoff.heartbeat, heartbeat)


@BackingOff.upon(DelegatedLease.retry_due).loop()
def _retry_due(lease: DelegatedLease, core: LeaseCore, backoff: Backoff) -> None:
    lease._again(backoff.heartbeat)


BackingOff.upon(DelegatedLease._again, nodata=True).to(ReadyToWrite).returns(None)


@BackingOff.upon(DelegatedLease.refuse).to(Idle)
@BackingOff.upon(DelegatedLease.drop).to(Idle)
def _forget_backoff(lease: DelegatedLease, core: LeaseCore, backoff: Backoff) -> None:
    _cancel_timer(backoff)
    core.chains.released(core.key, lease)


@BackingOff.upon(DelegatedLease.stop).to(Stopped)
def _stop_backoff(lease: DelegatedLease, core: LeaseCore,
                  backoff: Backoff) -> Optional[defer.Deferred[Any]]:
    _cancel_timer(backoff)
    return None


def _cancel_timer(backoff: Backoff) -> None:
    if backoff.timer.active():
        backoff.timer.cancel()


def _report(core: LeaseCore, report: Callable[..., None], *args: Any) -> None:
    """An outcome told to the delegation: a defect in reporting is logged and stalls
    no lease."""
    try:
        report(*args)
    except Exception:
        _log.failure("reporting the outcome of the delegation of {lease} failed",
                     lease=core.key)


_machine = _builder.build()


def delegated_lease(key: str, chains: ILeaseChains, policy: RetryPolicy) -> DelegatedLease:
    """A new machine of lease ``key``, in ``Idle``; the first input says where it goes."""
    return _machine(LeaseCore(key, chains, policy))
