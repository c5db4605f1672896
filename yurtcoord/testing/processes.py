"""Child processes in tests: their output, collected until they end."""

from twisted.internet import defer, protocol


class CollectingProcess(protocol.ProcessProtocol):
    """Keeps a child's stdout in ``out`` and stderr in ``err``; ``ended`` fires with
    the reason it ended (``ProcessDone`` or ``ProcessTerminated``)."""

    def __init__(self):
        self.out = b""
        self.err = b""
        self.ended = defer.Deferred()

    def outReceived(self, data):
        self.out += data

    def errReceived(self, data):
        self.err += data

    def processEnded(self, reason):
        self.ended.callback(reason.value)
