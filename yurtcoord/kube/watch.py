"""The watch stream of the Kubernetes API: newline-delimited JSON events.

``WatchStreamProtocol`` receives the body of a ``?watch=1`` response. Events arrive
as one JSON object per line, split into lines by ``yurtcoord.tx.lines``, which keeps
the unfinished tail of a read until its newline arrives. When the stream ends with an unfinished
line, the connection was cut: that tail is discarded and the stream fails with
``ConnectionFailed``. An ``ERROR`` event carries a ``Status``; it becomes the typed
error (410 → ``Gone``) and the connection is closed.

A line (one event) longer than ``max_line`` bytes ends the stream with
``ResponseTooLarge`` and drops the connection: a peer that streams a line without
end (bytes keep arriving, so ``IdleWatchdog`` never fires) costs at most that much
memory. Anything that is not a watch event (not JSON, nested deeper than the decoder
goes, not an object, a type that is not a string, an event whose object is not an
object) is ``ServerError``; nothing a peer sends raises anything untyped.

The decoder is ``yurtcoord.tx.jsondecode``'s: JSON as RFC 8259 defines it, no
more (``NaN``, ``Infinity``, a number beyond a double's range and a lone surrogate
escape make a line that is not JSON; the apiserver never sends them).

``finished`` fires exactly once, when the connection is gone: with None when the
server ended the stream cleanly or the watch was cancelled, with the typed error
otherwise (the end-of-stream machine of ``yurtcoord.tx.lines``, as for etcd's watch).

The client puts ``yurtcoord.tx.twisted_private.batch_chunked_body`` under a watch
response, so all the events of one read arrive together: the apiserver sends every
event as its own HTTP chunk, and Twisted's decoder calls up through the response once
per chunk.

``IdleWatchdog`` ends a stream on which nothing arrived for a while with ``Timeout``:
a connection that died without a FIN or RST (a NAT or an edge link dropping it)
would otherwise leave a watch waiting forever. Its check is guarded (loop
``watch-idle`` of ``yurtcoord.tx.guardedloop``): a check that raises is logged and
counted in ``loop_errors`` and the check is armed again, since a watchdog whose timer
is gone leaves its watch without an idle timeout, as if none had been asked for.
"""

from typing import Any, Callable, Optional, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.jsondecode import decode_json
from yurtcoord.tx.lines import LineStreamProtocol
from yurtcoord.kube.errors import (
    ConnectionFailed, ResponseTooLarge, ServerError, Timeout, error_from_status,
)

WATCH_EVENT_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK"))
_MISSING = object()
_EMPTY: dict[str, Any] = {}

# (A module name of its own: bench/decoders.py puts other decoders in its place.)
_decode_json: Callable[[bytes], Any] = decode_json


class WatchStreamProtocol(LineStreamProtocol):
    """Splits a watch body into events and hands each to ``on_event(type, obj)``.

    An exception raised by ``on_event`` ends the watch with that exception.
    """

    log = Logger()

    def __init__(self, on_event: Callable[[str, dict[str, Any]], object], url: str = "watch",
                 clock: Any = None, *, max_line: int) -> None:
        super().__init__(max_line)
        self._on_event = on_event
        self.url = url
        self._clock = clock
        self.finished: Deferred[BaseException | None] = Deferred()
        self.events = 0
        self.last_activity = clock.seconds() if clock is not None else None

    def expire(self, error: BaseException) -> None:
        """End the watch with ``error`` (e.g. nothing received for too long)."""
        self.fail(error)

    def too_long(self) -> None:
        self.fail(ResponseTooLarge(
            f"watch line from {self.url} longer than {self.max_line} bytes, "
            f"connection dropped"))

    def broken(self, why: str) -> BaseException:
        return ConnectionFailed(f"watch stream from {self.url} {why}")

    def ended(self, error: BaseException | None) -> None:
        if error is None:
            self.finished.callback(None)
        else:
            self.finished.errback(Failure(error))

    def dataReceived(self, data: bytes) -> None:
        if self.streaming and self._clock is not None:
            self.last_activity = self._clock.seconds()
        super().dataReceived(data)

    def _not_an_event(self, line, why):
        self.fail(ServerError(f"{why} from {self.url}: {line[:200]!r}"))

    def line(self, line: bytes) -> None:
        try:
            event = _decode_json(line)
        except ValueError:
            # Blank lines (a keep-alive) are skipped, whatever else is not JSON is not.
            if line.strip():
                self._not_an_event(line, "not a JSON watch event")
            return
        except RecursionError:
            self._not_an_event(line, "watch event nested too deeply")
            return
        self._take((event,), line)

    def lines(self, block: bytes) -> None:
        """The complete lines of one read decoded together, as one JSON list: one
        decoder call for a hundred events or more.
        Unless that gives exactly one value per line, the lines are decoded one by one
        (``line``), so blank lines, whitespace and every line that is not an event are
        judged as alone. Lines that are each not one value but together make as many
        events are taken as those events: only a peer crafting them would send them,
        and it could send the same events well formed.

        The first line of a stream is decoded and handed on alone, before the rest
        of its read: a watch that resumes on a backlog gets a first read of a hundred
        events or more, and its first event need not wait for all of them to be
        decoded (the official client hands on each event as its line is decoded)."""
        if not self.events:
            first = block.find(b"\n")
            if first >= 0:
                self.line(block[:first])
                if not self.streaming:
                    return
                block = block[first + 1:]
        listed = block.replace(b"\n", b",\n")
        # Each newline became two bytes: the lines counted without another pass over
        # the read (``bytes.count`` walks it byte by byte, slower than this replace,
        # the join and the decode below together).
        count = len(listed) - len(block) + 1
        if count == 1:
            self.line(block)
            return
        try:
            events = _decode_json(b"".join((b"[", listed, b"]")))
        except (ValueError, RecursionError):
            events = None
        if type(events) is not list or len(events) != count:
            super().lines(block)
            return
        self._take(events, block)

    def _take(self, events: Sequence[Any], block: bytes) -> None:
        """Hand ``events``, decoded from the lines of ``block`` in order, to
        ``on_event``; the first one that is not a watch event with an object (an
        ``ERROR`` among them) ends the stream as ``_reject`` says."""
        on_event = self._on_event
        for i, event in enumerate(events):
            # Every field is checked before use: a peer may send any JSON at all.
            if type(event) is dict:
                kind = event.get("type")
                obj = event.get("object", _MISSING)
                if (type(kind) is str and kind in WATCH_EVENT_TYPES and type(obj) is dict
                        and type(obj.get("metadata", _EMPTY)) is dict):
                    self.events += 1
                    try:
                        on_event(kind, obj)
                    except Exception as e:  # the consumer's failure ends this watch, typed as it was
                        self.fail(e)
                        return
                    if not self.streaming:
                        return
                    continue
            self._reject(event, block.split(b"\n")[i] if len(events) > 1 else block)
            return

    def _reject(self, event: Any, line: bytes) -> None:
        """End the stream for a decoded ``line`` that is not a watch event to hand on."""
        if type(event) is not dict:
            self._not_an_event(line, "not a JSON watch event")
            return
        kind = event.get("type")
        obj = event.get("object", _MISSING)
        if type(kind) is str and kind in WATCH_EVENT_TYPES:
            self._not_an_event(line, f"watch event {kind} without an object")
        elif obj is _MISSING:
            self._not_an_event(line, "not a JSON watch event")
        elif kind == "ERROR":
            # No HTTP code belongs to an ERROR event: its Status names the error, and
            # one without a usable code is a server error.
            self.fail(error_from_status(0, obj if type(obj) is dict else None))
        elif type(kind) is not str:
            self._not_an_event(line, "watch event without a type")
        else:
            self.fail(ServerError(f"unknown watch event type {kind[:100]!r} from {self.url}"))


class IdleWatchdog:
    """Expires ``stream`` with ``Timeout`` when no bytes arrived for ``seconds``.

    One timer at a time, re-armed for the remaining time when data came meanwhile,
    so busy streams cost one clock read per read, not a timer reset per event.
    The check runs guarded (loop ``watch-idle``): an error of it is counted in
    ``loop_errors`` and the check runs again ``seconds`` later.
    """

    def __init__(self, clock: Any, seconds: float, stream: WatchStreamProtocol,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._stream = stream
        self._stopped = False
        self._checked = guarded("watch-idle", self._check, loop_errors, self._rearm)
        self._call: Any = clock.callLater(seconds, self._checked)

    def _check(self) -> None:
        self._call = None
        if not self._stream.streaming:
            return  # ending already (or ended before its owner stopped this watchdog)
        idle = self._clock.seconds() - self._stream.last_activity
        if idle >= self._seconds:
            self._stream.expire(Timeout(
                f"nothing received on watch {self._stream.url} for {idle:.1f}s"))
        else:
            self._call = self._clock.callLater(self._seconds - idle, self._checked)

    def _rearm(self, _failure: Failure) -> None:
        """After a check that raised: check again a whole ``seconds`` later, unless
        the watch ended meanwhile (``stop``) or a timer is armed already."""
        if not self._stopped and self._call is None:
            self._call = self._clock.callLater(self._seconds, self._checked)

    def stop(self) -> None:
        self._stopped = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
