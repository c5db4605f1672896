"""Newline-delimited streams: the one splitter of a streamed body into lines, and the
one end-of-stream handling of such a stream.

Both streams the project reads line by line come through here: the Kubernetes watch
(``yurtcoord.kube.watch``) and the etcd gateway's watch (``yurtcoord.etcd.watch``),
each a JSON object per line. Reads do not respect lines: one read may end in the
middle of a line and another may carry many lines, so the unfinished tail of a read
is kept until its newline arrives. A line longer than ``max_line`` bytes calls
``too_long()`` instead of growing without bound: a peer that streams a line without
end costs at most that much memory.

How such a stream ends is one machine (Automat), the same for both watches:
``streaming`` until the reader gives up on it (``fail(error)``: a line it cannot use,
its consumer's error, a timeout; ``failing`` holds that error), the owner cancels it
(``cancelling``), or the connection is gone (``ended``). Failing and cancelling drop
the connection and wait for it to be gone; only then does ``ended(error)`` run, once:
with None after a cancel or a clean end of the body, with the failure's error, or with
``broken(why)`` for a body cut short (in the middle of a line, or the connection
lost). The machine takes an input per change of the stream's state, never per line:
the lines' loop reads ``streaming``, which only the machine's transitions write.
"""

from typing import Optional, Protocol as TypingProtocol

from automat import TypeMachineBuilder
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.httpbody import drop_connection

__all__ = ["LineStreamProtocol", "StreamEnd"]


class StreamEnd(TypingProtocol):
    """The inputs of a line stream's end-of-stream machine (see the module doc)."""

    def fail(self, error: BaseException) -> None:
        """The reader gives up on the stream: it ends with ``error``."""

    def cancel(self) -> None:
        """The owner does not want the stream any more: it ends with None."""

    def lost(self, reason: Optional[Failure]) -> None:
        """The body ended (``connectionLost``)."""


class LineStreamProtocol(Protocol):
    """Hands the complete lines of every read to ``lines(block)``, which by default
    hands each (without its newline) to ``line(bytes)``, while ``streaming``.

    Subclasses implement ``line``, ``too_long`` (which usually calls ``fail``),
    ``broken`` (the error of a body cut short) and ``ended`` (how the stream ended,
    called once); ``pending_bytes`` is the length of the unfinished tail.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._pending: list[bytes] = []
        # Bytes held in _pending: the unfinished line, never more than max_line.
        self.pending_bytes = 0
        # Lines are wanted: the machine is in "streaming". Read per line, so a plain
        # attribute; written only by the machine's transitions.
        self.streaming = True
        self._end: StreamEnd = _StreamEndMachine(self)

    def line(self, line: bytes) -> None:
        raise NotImplementedError

    def too_long(self) -> None:
        raise NotImplementedError

    def broken(self, why: str) -> BaseException:
        """The error of a body that ended unexpectedly; ``why`` says how ("cut in the
        middle of a line (...)", "lost: ...")."""
        raise NotImplementedError

    def ended(self, error: Optional[BaseException]) -> None:
        """The stream is gone: with None after ``cancel`` or a clean end, else with
        the error that ended it. Called once."""
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error``: the connection is dropped and its unfinished
        tail forgotten; the first error wins, and a cancelled stream stays cancelled."""
        self._end.fail(error)

    def cancel(self) -> None:
        """End the stream with None: the connection is dropped."""
        self._end.cancel()

    def connectionLost(self, reason: Optional[Failure] = None) -> None:
        self._end.lost(reason)

    def cut_short(self, reason: Optional[Failure]) -> Optional[str]:
        """How the body ended, when it ended while still wanted: None when it ended
        cleanly (the body was complete, or ended by a clean close), else why it did
        not: cut in the middle of a line (whose bytes are discarded), or the
        connection lost. The unfinished tail is forgotten either way."""
        partial = len(self.take_pending().strip())
        if partial:
            return f"cut in the middle of a line ({partial} bytes discarded)"
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            return None
        return f"lost: {describe_failure(reason)}"

    def take_pending(self) -> bytes:
        """The unfinished tail, which is then forgotten (at the end of the stream)."""
        tail = b"".join(self._pending)
        self._pending = []
        self.pending_bytes = 0
        return tail

    def lines(self, block: bytes) -> None:
        """All complete lines of one read, in order: ``block`` is those lines joined by
        newlines (without the last one). By default every line goes to ``line`` until
        the stream stops ``streaming``, and ``too_long()`` ends the stream at the first line past
        ``max_line``. A subclass that can take a run of lines at once overrides this;
        it is handed only blocks within ``max_line`` (longer ones take this default,
        which checks each line on its own)."""
        max_line, handle = self.max_line, self.line
        for line in block.split(b"\n"):
            if len(line) > max_line:
                self.too_long()
                return
            handle(line)
            if not self.streaming:
                return

    def dataReceived(self, data: bytes) -> None:
        if not self.streaming:
            return
        # One search for the last newline per read (a batched read carries a hundred
        # lines or more): everything before it is complete lines, handed on as one
        # block, and the piece after it is the unfinished tail.
        end = data.rfind(b"\n")
        if end < 0:
            self._pending.append(data)
            self.pending_bytes += len(data)
            if self.pending_bytes > self.max_line:
                self.too_long()
            return
        if self._pending:
            if self.pending_bytes + data.find(b"\n") > self.max_line:
                self.too_long()
                return
            self._pending.append(data[:end])
            block = self.take_pending()
        else:
            block = data[:end]
        if len(block) > self.max_line:
            LineStreamProtocol.lines(self, block)
        else:
            self.lines(block)
        if not self.streaming:
            return
        if end + 1 < len(data):
            tail = data[end + 1:]
            if len(tail) > self.max_line:
                self.too_long()
                return
            self._pending.append(tail)
            self.pending_bytes = len(tail)


# -- the end-of-stream machine ------------------------------------------------------------

_builder = TypeMachineBuilder(StreamEnd, LineStreamProtocol)
_streaming = _builder.state("streaming")
_cancelling = _builder.state("cancelling")
_ended = _builder.state("ended")


def _failing_error(inputs: StreamEnd, stream: LineStreamProtocol,
                   error: BaseException) -> BaseException:
    return error


# The failing state holds the error that ends the stream, until the connection is gone.
_failing = _builder.state("failing", _failing_error)


@_streaming.upon(StreamEnd.fail).to(_failing)
def _give_up(inputs: StreamEnd, stream: LineStreamProtocol, error: BaseException) -> None:
    stream.streaming = False
    stream.take_pending()
    drop_connection(stream.transport)


@_streaming.upon(StreamEnd.cancel).to(_cancelling)
def _drop(inputs: StreamEnd, stream: LineStreamProtocol) -> None:
    stream.streaming = False
    drop_connection(stream.transport)


@_streaming.upon(StreamEnd.lost).to(_ended)
def _end_while_streaming(inputs: StreamEnd, stream: LineStreamProtocol,
                         reason: Optional[Failure]) -> None:
    stream.streaming = False
    why = stream.cut_short(reason)
    stream.ended(None if why is None else stream.broken(why))


@_failing.upon(StreamEnd.lost).to(_ended)
def _end_failed(inputs: StreamEnd, stream: LineStreamProtocol, error: BaseException,
                reason: Optional[Failure]) -> None:
    stream.take_pending()
    stream.ended(error)


@_cancelling.upon(StreamEnd.lost).to(_ended)
def _end_cancelled(inputs: StreamEnd, stream: LineStreamProtocol,
                   reason: Optional[Failure]) -> None:
    stream.take_pending()
    stream.ended(None)


# A later error or cancel does not change how a stream that is already ending ends.
_failing.upon(StreamEnd.fail).loop().returns(None)
_failing.upon(StreamEnd.cancel).loop().returns(None)
_cancelling.upon(StreamEnd.fail).loop().returns(None)
_cancelling.upon(StreamEnd.cancel).loop().returns(None)
# Cancelling a stream that ended is harmless (an owner cancels what it no longer
# wants, whether or not it ended meanwhile), and so is a second report of its end.
# A failure after the end is a defect: its error would go nowhere (``fail`` raises).
_ended.upon(StreamEnd.cancel).loop().returns(None)
_ended.upon(StreamEnd.lost).loop().returns(None)

_StreamEndMachine = _builder.build()
