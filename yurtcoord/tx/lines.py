"""Newline-delimited streams: the one splitter of a streamed body into lines.

Both streams the project reads line by line come through here: the Kubernetes watch
(``yurtcoord.kube.watch``) and the etcd gateway's watch (``yurtcoord.etcd.watch``),
each a JSON object per line. Reads do not respect lines: one read may end in the
middle of a line and another may carry many lines, so the unfinished tail of a read
is kept until its newline arrives. A line longer than ``max_line`` bytes calls
``too_long()`` instead of growing without bound: a peer that streams a line without
end costs at most that much memory.
"""

from typing import Optional

from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from yurtcoord.tx.failures import describe_failure


class LineStreamProtocol(Protocol):
    """Hands the complete lines of every read to ``lines(block)``, which by default
    hands each (without its newline) to ``line(bytes)``.

    Subclasses implement ``line`` and ``too_long`` and say through ``stopped`` when
    no more lines are wanted (the stream failed or was cancelled); ``pending`` holds
    the unfinished tail, ``pending_bytes`` its length.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._pending: list[bytes] = []
        # Bytes held in _pending: the unfinished line, never more than max_line.
        self.pending_bytes = 0

    def line(self, line: bytes) -> None:
        raise NotImplementedError

    def too_long(self) -> None:
        raise NotImplementedError

    def stopped(self) -> bool:
        """True once lines are no longer wanted."""
        return False

    def stream_ended(self, reason: Optional[Failure]) -> Optional[str]:
        """How the body ended, for ``connectionLost``: None when it ended cleanly (the
        body was complete, or ended by a clean close), else why it did not: cut in the
        middle of a line (whose bytes are discarded), or the connection lost. The
        unfinished tail is forgotten either way."""
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
        ``stopped``, and ``too_long()`` ends the stream at the first line past
        ``max_line``. A subclass that can take a run of lines at once overrides this;
        it is handed only blocks within ``max_line`` (longer ones take this default,
        which checks each line on its own)."""
        max_line, handle, stopped = self.max_line, self.line, self.stopped
        for line in block.split(b"\n"):
            if len(line) > max_line:
                self.too_long()
                return
            handle(line)
            if stopped():
                return

    def dataReceived(self, data: bytes) -> None:
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
        if self.stopped():
            return
        if end + 1 < len(data):
            tail = data[end + 1:]
            if len(tail) > self.max_line:
                self.too_long()
                return
            self._pending.append(tail)
            self.pending_bytes = len(tail)
