"""Garbage collection while pool sync holds the pool's objects (and while the
heartbeat delegation forwards the renewals of a large pool, which never pause).

A leader's informers hold every pool-scoped object: 100k endpointslices are about
700,000 containers, and a full collection of the interpreter walks every container
it tracks. Two things keep such collections short and away from bursts of changes:

- Once the first lists are in, the heap is frozen (``gc.freeze``): the objects held
  then are never walked again (they are still freed by reference counting when an
  update replaces them). Thawing on stop lets garbage frozen with them be collected.
- The objects a burst of changes brings (10,000 updated endpointslices are some
  60,000 containers) are not frozen, and the interpreter's own full collections
  would walk them several times during the burst, each time a stall of the reactor
  of tens of milliseconds on a loaded machine. While changes arrive, automatic full
  collections are held off, and (unless a burst's objects do not stay, as an
  upload's) so are those of the middle generation: during a
  burst it fills with the objects the informers keep, and each of its collections
  walks everything the last ten young collections left behind once more, only to
  find it still held (some 8% of the CPU time of an informer draining a backlog).
  Cyclic garbage that outlives a young collection then waits for the end of the
  burst, as that of the oldest generation already does. Once no change arrived for
  ``quiet`` seconds, one full collection runs if the objects that outlived a young
  collection grew by a quarter (and by at least ``MIN_GROWTH``) since the last one,
  the interpreter's own rule for full collections, and the interpreter's thresholds
  apply again until the next change. Under changes that never stop, a full
  collection runs every ``longest`` seconds, so cyclic garbage cannot grow without
  bound.

The thresholds are the interpreter's, shared by the whole process: they are raised
while any ``QuietCollections`` holds them and put back when the last one lets go.
Young collections are left alone: they walk only the objects allocated since the
last one, and free the garbage of every change (its event, its decoded read).
"""

import gc
import time
from typing import Dict, Optional, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

DEFAULT_QUIET = 1.0
DEFAULT_LONGEST = 120.0
# Long-lived objects a burst must add before its end is worth a full collection: fewer
# are walked quickly whenever the interpreter's own thresholds start one.
MIN_GROWTH = 10_000
# A threshold never reached (the middle generation's counts young collections, the
# oldest's counts middle ones).
_NEVER = 1 << 30

log = Logger()

# The collectors holding automatic collections off (each: whether it holds the middle
# generation's too), and the thresholds to restore.
_holders: Dict[object, bool] = {}
_saved_threshold: Optional[Tuple[int, int, int]] = None


def _apply_holds() -> None:
    assert _saved_threshold is not None
    young, middle, _ = _saved_threshold
    gc.set_threshold(young, _NEVER if any(_holders.values()) else middle, _NEVER)


def hold_collections(holder: object, middle: bool) -> None:
    """Hold the interpreter's automatic full collections off, and its middle ones too
    with ``middle``, until ``holder`` lets go (``release_collections``); the
    thresholds of the process are those of the holders taken together."""
    global _saved_threshold
    if not _holders:
        _saved_threshold = gc.get_threshold()
    _holders[holder] = middle
    _apply_holds()


def release_collections(holder: object) -> None:
    """``holder`` lets go; the last one to let go puts the thresholds back."""
    global _saved_threshold
    if holder not in _holders:
        return
    del _holders[holder]
    if _holders:
        _apply_holds()
    elif _saved_threshold is not None:
        gc.set_threshold(*_saved_threshold)
        _saved_threshold = None


def _long_lived() -> int:
    """Objects tracked in the middle and oldest generations (not frozen): those that
    outlived a young collection."""
    return len(gc.get_objects(1)) + len(gc.get_objects(2))


class QuietCollections:
    """Freezes the synced heap and moves full collections out of bursts of changes.

    ``busy()`` is called for every change (cheap: a time stamp and, once per burst,
    a timer on the injected ``reactor``); ``freeze()`` once the lists are in;
    ``stop()`` puts the interpreter back as it found it. ``hold_middle=False`` leaves
    the middle generation's collections running during a burst: for bursts whose
    objects do not stay (an upload reads, sends and drops every file), holding them
    only lets the garbage that outlived a young collection pile up until the end.
    """

    def __init__(self, reactor: IReactorTime, quiet: float = DEFAULT_QUIET,
                 longest: float = DEFAULT_LONGEST, hold_middle: bool = True) -> None:
        self.reactor = reactor
        self.hold_middle = hold_middle
        self.quiet = quiet
        self.longest = longest
        self.frozen = False
        # Full collections this object ran.
        self.collections = 0
        self._last_change: Optional[float] = None
        # When the current burst began, or when it last had a full collection.
        self._since: Optional[float] = None
        # Objects that outlived a young collection (generations 1 and 2, not frozen)
        # after the last full collection.
        self._long_lived = 0
        self._check: Optional[IDelayedCall] = None
        self._stopped = False

    @property
    def holding(self) -> bool:
        """Automatic full collections (and middle ones, with ``hold_middle``) are held
        off for a burst of changes."""
        return self._since is not None

    def freeze(self) -> None:
        """Freeze everything the interpreter tracks now (the informers' objects)."""
        gc.freeze()
        self.frozen = True
        self._long_lived = 0

    def busy(self) -> None:
        """A change arrived: hold full collections off until the burst is over."""
        if self._stopped:
            return
        now = self.reactor.seconds()
        self._last_change = now
        if self._since is None:
            self._since = now
            hold_collections(self, self.hold_middle)
        if self._check is None:
            self._check = self.reactor.callLater(self.quiet, self._check_burst)

    def _check_burst(self) -> None:
        self._check = None
        # Only busy() schedules this check, and it sets both first.
        assert self._last_change is not None and self._since is not None
        now = self.reactor.seconds()
        quiet_for = now - self._last_change
        if quiet_for >= self.quiet:
            long_lived = _long_lived()
            if long_lived - self._long_lived >= max(MIN_GROWTH, self._long_lived // 4):
                self._collect("after a burst of changes")
            self._since = None
            release_collections(self)
            return
        if now - self._since >= self.longest:
            self._collect("during a long burst of changes")
            self._since = now
        self._check = self.reactor.callLater(
            min(self.quiet - quiet_for, self._since + self.longest - now), self._check_burst)

    def _collect(self, why: str) -> None:
        started = time.perf_counter()
        found = gc.collect()
        self.collections += 1
        self._long_lived = _long_lived()
        log.debug("full garbage collection {why}: {found} objects unreachable, "
                  "{long_lived} long-lived objects left, {ms:.1f} ms", why=why, found=found,
                  long_lived=self._long_lived, ms=1000 * (time.perf_counter() - started))

    def stop(self) -> None:
        """Cancel the timer, give the thresholds back and thaw the heap."""
        self._stopped = True
        if self._check is not None and self._check.active():
            self._check.cancel()
        self._check = None
        self._since = None
        release_collections(self)
        if self.frozen:
            self.frozen = False
            gc.unfreeze()
