"""The watch stream of the Kubernetes API: newline-delimited JSON events.

``WatchStreamProtocol`` receives the body of a ``?watch=1`` response. Events arrive
as one JSON object per line, but reads do not respect lines: one read may end in the
middle of a line and another may carry many lines. The protocol keeps the unfinished
tail of a read until its newline arrives. When the stream ends with an unfinished
line, the connection was cut: that tail is discarded and the stream fails with
``ConnectionFailed``. An ``ERROR`` event carries a ``Status``; it becomes the typed
error (410 → ``Gone``) and the connection is closed.

``finished`` fires exactly once, when the connection is gone: with None when the
server ended the stream cleanly or the watch was cancelled, with the typed error
otherwise.

``IdleWatchdog`` ends a stream on which nothing arrived for a while with ``Timeout``:
a connection that died without a FIN or RST (a NAT or an edge link dropping it)
would otherwise leave a watch waiting forever.
"""

import json

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from yurtcoord.kube.errors import ConnectionFailed, ServerError, Timeout, error_from_status

WATCH_EVENT_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK"))

# The decoder itself: json.loads on bytes would sniff the encoding of every line.
_decode_json = json.JSONDecoder().decode


def describe(failure):
    """A short reason for a lost connection; unwraps ResponseFailed's list of causes."""
    reasons = getattr(failure.value, "reasons", None)
    if isinstance(reasons, (list, tuple)) and reasons:
        return "; ".join(r.getErrorMessage() if isinstance(r, Failure) else str(r)
                         for r in reasons)
    return failure.getErrorMessage()


class WatchStreamProtocol(Protocol):
    """Splits a watch body into events and hands each to ``on_event(type, obj)``.

    An exception raised by ``on_event`` ends the watch with that exception.
    """

    log = Logger()

    def __init__(self, on_event, url="watch", clock=None):
        self._on_event = on_event
        self.url = url
        self._clock = clock
        self.finished = Deferred()
        self.events = 0
        self.last_activity = clock.seconds() if clock is not None else None
        self._pending = []
        self._error = None
        self._cancelled = False
        self._ended = False

    def cancel(self):
        """Close the connection; ``finished`` then fires with None."""
        if self._ended or self._cancelled:
            return
        self._cancelled = True
        self._abort()

    def _abort(self):
        transport = self.transport
        if transport is None:
            return
        abort = getattr(transport, "abortConnection", None)
        if abort is None:
            # Body transports from older Agents expose only stopProducing.
            abort = getattr(transport, "stopProducing", None) or transport.loseConnection
        abort()

    def expire(self, error):
        """End the watch with ``error`` (e.g. nothing received for too long)."""
        self._fail(error)

    def _fail(self, error):
        if self._error is None and not self._cancelled:
            self._error = error
            self._abort()

    def dataReceived(self, data):
        if self._error is not None or self._cancelled or self._ended:
            return
        if self._clock is not None:
            self.last_activity = self._clock.seconds()
        newline = data.find(b"\n")
        if newline < 0:
            self._pending.append(data)
            return
        if self._pending:
            self._pending.append(data[:newline])
            line = b"".join(self._pending)
            self._pending = []
        else:
            line = data[:newline]
        self._line(line)
        start = newline + 1
        while self._error is None and not self._cancelled:
            newline = data.find(b"\n", start)
            if newline < 0:
                break
            self._line(data[start:newline])
            start = newline + 1
        else:
            return
        if start < len(data):
            self._pending.append(data[start:])

    def _line(self, line):
        if not line.strip():
            return
        try:
            event = _decode_json(line.decode("utf-8"))
            kind = event["type"]
            obj = event["object"]
        except (ValueError, TypeError, KeyError):
            self._fail(ServerError(f"not a JSON watch event from {self.url}: {line[:200]!r}"))
            return
        if kind in WATCH_EVENT_TYPES:
            self.events += 1
            try:
                self._on_event(kind, obj)
            except Exception as e:  # the consumer's failure ends this watch, typed as it was
                self._fail(e)
        elif kind == "ERROR":
            code = obj.get("code", 500) if isinstance(obj, dict) else 500
            self._fail(error_from_status(code, obj if isinstance(obj, dict) else None))
        else:
            self._fail(ServerError(f"unknown watch event type {kind!r} from {self.url}"))

    def connectionLost(self, reason=None):
        if self._ended:
            return
        self._ended = True
        partial = len(b"".join(self._pending).strip())
        self._pending = []
        if self._error is not None:
            result = self._error
        elif self._cancelled:
            result = None
        elif partial:
            result = ConnectionFailed(
                f"watch stream from {self.url} cut in the middle of an event "
                f"({partial} bytes discarded)"
            )
        elif reason is None or reason.check(ResponseDone, PotentialDataLoss):
            result = None
        else:
            result = ConnectionFailed(f"watch stream from {self.url} lost: {describe(reason)}")
        if result is None:
            self.finished.callback(None)
        else:
            self.finished.errback(Failure(result))


class IdleWatchdog:
    """Expires ``stream`` with ``Timeout`` when no bytes arrived for ``seconds``.

    One timer at a time, re-armed for the remaining time when data came meanwhile,
    so busy streams cost one clock read per read, not a timer reset per event.
    """

    def __init__(self, clock, seconds, stream):
        self._clock = clock
        self._seconds = seconds
        self._stream = stream
        self._call = clock.callLater(seconds, self._check)

    def _check(self):
        idle = self._clock.seconds() - self._stream.last_activity
        if idle >= self._seconds:
            self._call = None
            self._stream.expire(Timeout(
                f"nothing received on watch {self._stream.url} for {idle:.1f}s"))
        else:
            self._call = self._clock.callLater(self._seconds - idle, self._check)

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
