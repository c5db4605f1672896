"""Writing the component key cache file at most once per interval, in a thread.

The pool store changes its key cache with every accepted batch. A caller making a
stream of small operations (pool sync draining watch events) asks for the file with
``flush_soon()``: at 100k keys one write takes tens of milliseconds, so a write per
operation would keep the reactor busy. The file is written now, or, when the last write
is more recent than the interval, once the interval has passed since it. When the
reactor has a thread pool, only a copy of the key sets is taken on the reactor
(``ComponentKeyCache.snapshot_for_writing``); the file's text is made from it and
written (two fsyncs, which wait for a disk shared with etcd) in a thread. Every
store operation ends with ``flush_now()``, which writes on the reactor whatever changed,
and ``close()`` does the same, then waits for a write still running in its thread.

The flusher is a state machine whose states own their data:

- ``idle``: no timer, no write running;
- ``waiting``: the timer that ends the interval (only this state holds it);
- ``writing``: the write running in a thread (only this state holds it), and whether
  another ``flush_soon()`` came in meanwhile, to be served once it ends;
- ``closed``: no timers or threads any more; every request writes on the reactor.

An input a state does not expect (the timer in ``idle``, the end of a thread write in
``waiting``) is a defect and raises ``automat.NoTransition``.
"""

from typing import Any, Optional, Protocol

from automat import TypeMachineBuilder
from twisted.internet import defer, threads
from twisted.internet.interfaces import IDelayedCall, IReactorThreads, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.pool.keycache import ComponentKeyCache

__all__ = ["KeyCacheFlusher", "key_cache_flusher"]

log = Logger()


class KeyCacheFlusher(Protocol):
    """When the component key cache file is written (the module docstring says why)."""

    def flush_soon(self) -> None:
        """Write the file now, or once the interval since the last write has passed."""

    def flush_now(self) -> None:
        """Write the file now on the reactor if the cache changed; a timer still
        waiting is cancelled (this write serves it)."""

    def close(self) -> defer.Deferred[None]:
        """Write what changed and start no timers or threads any more; fires once a
        write still running in its thread is over."""

    def _wait(self) -> None:
        """The last write is too recent: arm the timer that ends the interval."""

    def _interval_passed(self) -> None:
        """The timer fired."""

    def _write_in_thread(self) -> None:
        """The cache changed and the reactor has threads: write it in one."""

    def _written(self) -> None:
        """The write in a thread is over (written or failed)."""


class _Core:
    """What every state shares: the cache, the clock and the time of the last write."""

    def __init__(self, clock: IReactorTime, key_cache: ComponentKeyCache,
                 interval: float) -> None:
        self.clock = clock
        self.key_cache = key_cache
        self.interval = interval
        # When the file was last written (on the reactor or in a thread); None before.
        self.last_write: Optional[float] = None

    def due(self) -> bool:
        return (self.last_write is None
                or self.clock.seconds() - self.last_write >= self.interval)

    def write_here(self) -> None:
        """Write the file on the reactor if the cache changed (errors are logged)."""
        if not self.key_cache.dirty:
            return
        self.last_write = self.clock.seconds()
        try:
            self.key_cache.flush()
        except OSError as e:
            log.error("cannot write component key cache {path}: {error}",
                      path=self.key_cache.path, error=e)

    def write_due(self, flusher: KeyCacheFlusher) -> None:
        """The interval is over: write the changes, in a thread where there is one."""
        if not self.key_cache.dirty:
            return
        if not IReactorThreads.providedBy(self.clock):
            self.write_here()
            return
        flusher._write_in_thread()


class _ThreadWrite:
    """The write running in a thread, and whether to write again once it is over."""

    def __init__(self, running: defer.Deferred[None]) -> None:
        self.running = running
        self.again = False

    def over(self) -> defer.Deferred[None]:
        """Fires with None once the write is over, however it ended."""
        ended: defer.Deferred[None] = defer.Deferred()
        self.running.addBoth(lambda _: ended.callback(None))
        return ended


def _arm_timer(flusher: KeyCacheFlusher, core: _Core) -> IDelayedCall:
    assert core.last_write is not None
    return core.clock.callLater(core.last_write + core.interval - core.clock.seconds(),
                                flusher._interval_passed)


def _start_thread_write(flusher: KeyCacheFlusher, core: _Core) -> _ThreadWrite:
    core.last_write = core.clock.seconds()
    cache = core.key_cache
    snapshot = cache.snapshot_for_writing()
    reactor: Any = core.clock
    running: defer.Deferred[None] = threads.deferToThreadPool(
        reactor, reactor.getThreadPool(), cache.write_snapshot, snapshot)

    def failed(failure: Failure) -> None:
        cache.dirty = True
        log.error("cannot write component key cache {path}: {error}", path=cache.path,
                  error=failure.getErrorMessage())

    running.addErrback(failed)
    running.addBoth(lambda _: flusher._written())
    return _ThreadWrite(running)


def _build() -> Any:
    builder = TypeMachineBuilder(KeyCacheFlusher, _Core)
    idle = builder.state("idle")
    waiting = builder.state("waiting", _arm_timer)
    writing = builder.state("writing", _start_thread_write)
    closed = builder.state("closed")

    @idle.upon(KeyCacheFlusher.flush_soon).loop()
    def _idle_soon(flusher: KeyCacheFlusher, core: _Core) -> None:
        if core.due():
            core.write_due(flusher)
        else:
            flusher._wait()

    idle.upon(KeyCacheFlusher._wait).to(waiting).returns(None)
    idle.upon(KeyCacheFlusher._write_in_thread).to(writing).returns(None)

    @idle.upon(KeyCacheFlusher.flush_now).loop()
    def _idle_now(flusher: KeyCacheFlusher, core: _Core) -> None:
        core.write_here()

    @idle.upon(KeyCacheFlusher.close).to(closed)
    def _idle_close(flusher: KeyCacheFlusher, core: _Core) -> defer.Deferred[None]:
        core.write_here()
        return defer.succeed(None)

    waiting.upon(KeyCacheFlusher.flush_soon).loop().returns(None)

    @waiting.upon(KeyCacheFlusher._interval_passed).to(idle)
    def _waited(flusher: KeyCacheFlusher, core: _Core, timer: IDelayedCall) -> None:
        core.write_due(flusher)

    @waiting.upon(KeyCacheFlusher.flush_now).to(idle)
    def _waiting_now(flusher: KeyCacheFlusher, core: _Core, timer: IDelayedCall) -> None:
        timer.cancel()
        core.write_here()

    @waiting.upon(KeyCacheFlusher.close).to(closed)
    def _waiting_close(flusher: KeyCacheFlusher, core: _Core,
                       timer: IDelayedCall) -> defer.Deferred[None]:
        timer.cancel()
        core.write_here()
        return defer.succeed(None)

    @writing.upon(KeyCacheFlusher.flush_soon).loop()
    def _writing_soon(flusher: KeyCacheFlusher, core: _Core, write: _ThreadWrite) -> None:
        write.again = True

    @writing.upon(KeyCacheFlusher.flush_now).loop()
    def _writing_now(flusher: KeyCacheFlusher, core: _Core, write: _ThreadWrite) -> None:
        # The cache numbers its snapshots: the thread's older one never replaces this.
        core.write_here()

    @writing.upon(KeyCacheFlusher._written).to(idle)
    def _thread_done(flusher: KeyCacheFlusher, core: _Core, write: _ThreadWrite) -> None:
        if write.again:
            flusher.flush_soon()

    @writing.upon(KeyCacheFlusher.close).to(closed)
    def _writing_close(flusher: KeyCacheFlusher, core: _Core,
                       write: _ThreadWrite) -> defer.Deferred[None]:
        core.write_here()
        return write.over()

    @closed.upon(KeyCacheFlusher.flush_soon).loop()
    def _closed_soon(flusher: KeyCacheFlusher, core: _Core) -> None:
        # No timers or threads after close(); a change arriving late is written now.
        core.write_here()

    @closed.upon(KeyCacheFlusher.flush_now).loop()
    def _closed_now(flusher: KeyCacheFlusher, core: _Core) -> None:
        core.write_here()

    @closed.upon(KeyCacheFlusher.close).loop()
    def _closed_close(flusher: KeyCacheFlusher, core: _Core) -> defer.Deferred[None]:
        return defer.succeed(None)

    # A thread write started before close() ends after it.
    closed.upon(KeyCacheFlusher._written).loop().returns(None)
    return builder.build()


_KeyCacheFlusherMachine = _build()


def key_cache_flusher(clock: IReactorTime, key_cache: ComponentKeyCache,
                      interval: float) -> KeyCacheFlusher:
    """A flusher of ``key_cache`` writing at most once per ``interval`` seconds on
    ``flush_soon()``; the writes run in a thread of ``clock``'s pool when it provides
    ``IReactorThreads``, else on the reactor."""
    flusher: KeyCacheFlusher = _KeyCacheFlusherMachine(_Core(clock, key_cache, interval))
    return flusher
