"""Child processes in tests: their output, collected until they end."""

from twisted.internet import defer, protocol
from twisted.python.failure import Failure


class CollectingProcess(protocol.ProcessProtocol):
    """Keeps a child's stdout in ``out`` and stderr in ``err``; ``ended`` fires with
    the reason it ended (``ProcessDone`` or ``ProcessTerminated``)."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.ended: defer.Deferred[BaseException | None] = defer.Deferred()


    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def processEnded(self, reason: Failure) -> None:

        self.ended.callback(reason.value)
