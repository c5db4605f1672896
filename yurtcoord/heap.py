"""Garbage collection while pool sync holds the pool's objects.

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
  collections are held off; one full collection runs once no change arrived for
  ``quiet`` seconds, or at the latest ``longest`` seconds after the last one (so
  cyclic garbage cannot grow without bound under an endless stream of changes).
  Then the interpreter's own thresholds apply again until the next change.

The thresholds are the interpreter's, shared by the whole process: they are raised
while any ``QuietCollections`` holds them and put back when the last one lets go.
Young collections are left alone: they walk only recent objects.
"""

import gc
import time

from twisted.logger import Logger

DEFAULT_QUIET = 1.0
DEFAULT_LONGEST = 30.0
# A threshold for full collections that is never reached (it counts young collections).
_NEVER = 1 << 30

log = Logger()

# The collectors holding automatic full collections off, and the thresholds to restore.
_holders = set()
_saved_threshold = None


def _hold(holder: object) -> None:
    global _saved_threshold
    if not _holders:
        _saved_threshold = gc.get_threshold()
        gc.set_threshold(_saved_threshold[0], _saved_threshold[1], _NEVER)
    _holders.add(holder)


def _release(holder: object) -> None:
    global _saved_threshold
    if holder not in _holders:
        return
    _holders.discard(holder)
    if not _holders and _saved_threshold is not None:
        gc.set_threshold(*_saved_threshold)
        _saved_threshold = None


class QuietCollections:
    """Freezes the synced heap and moves full collections out of bursts of changes.

    ``busy()`` is called for every change (cheap: a time stamp and, once per burst,
    a timer on the injected ``reactor``); ``freeze()`` once the lists are in;
    ``stop()`` puts the interpreter back as it found it.
    """

    def __init__(self, reactor, quiet: float = DEFAULT_QUIET,
                 longest: float = DEFAULT_LONGEST) -> None:
        self.reactor = reactor
        self.quiet = quiet
        self.longest = longest
        self.frozen = False
        # Full collections this object ran.
        self.collections = 0
        self._burst_began = None
        self._last_change = None
        self._last_collection = None
        self._check = None
        self._stopped = False

    @property
    def holding(self) -> bool:
        """Automatic full collections are held off for a burst of changes."""
        return self._burst_began is not None

    def freeze(self) -> None:
        """Freeze everything the interpreter tracks now (the informers' objects)."""
        gc.freeze()
        self.frozen = True

    def busy(self) -> None:
        """A change arrived: hold full collections off until the burst is over."""
        if self._stopped:
            return
        now = self.reactor.seconds()
        self._last_change = now
        if self._burst_began is None:
            self._burst_began = now
            _hold(self)
        if self._check is None:
            self._check = self.reactor.callLater(self.quiet, self._collect_when_quiet)

    def _collect_when_quiet(self) -> None:
        self._check = None
        now = self.reactor.seconds()
        since = self._last_collection if self._last_collection is not None \
            else self._burst_began
        quiet_for = now - self._last_change
        if quiet_for < self.quiet and now - since < self.longest:
            self._check = self.reactor.callLater(
                min(self.quiet - quiet_for, since + self.longest - now),
                self._collect_when_quiet)
            return
        self._collect(now, ended=quiet_for >= self.quiet)

    def _collect(self, now: float, ended: bool) -> None:
        started = time.perf_counter()
        found = gc.collect()
        self.collections += 1
        self._last_collection = now
        log.debug("full garbage collection {why}: {found} objects unreachable, "
                  "{ms:.1f} ms", why="after a burst of changes" if ended
                  else "during a long burst of changes", found=found,
                  ms=1000 * (time.perf_counter() - started))
        if ended:
            self._burst_began = None
            self._last_collection = None
            _release(self)
        else:
            self._check = self.reactor.callLater(self.quiet, self._collect_when_quiet)

    def stop(self) -> None:
        """Cancel the timer, give the thresholds back and thaw the heap."""
        self._stopped = True
        if self._check is not None and self._check.active():
            self._check.cancel()
        self._check = None
        self._burst_began = None
        _release(self)
        if self.frozen:
            self.frozen = False
            gc.unfreeze()
