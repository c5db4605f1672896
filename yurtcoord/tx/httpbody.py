"""Reading the body of an HTTP answer from a peer, bounded.

Both clients of the agent (``yurtcoord.kube.client`` for apiservers and
``yurtcoord.etcd.client`` for the pool etcd) read whole answers into memory before
decoding them. A broken or hostile peer could send an answer that never ends, and a
reader without a bound would hold all of it. ``read_body`` stops at ``limit`` bytes:
it drops the connection at once (``drop_connection``, an abort, not a graceful close
that would wait on the peer) and fails with the error the caller's ``too_large`` makes,
so each client reports it with its own typed error.

A body that ends when the connection closes (no length, no chunking) is complete
when the close is clean (``PotentialDataLoss``), as HTTP/1.0 servers end answers.
Cancelling the returned Deferred drops the connection too.

``BytesBody`` is the other direction: a request body already in memory, written to
the connection at once (Twisted's ``FileBodyProducer`` goes through a cooperator and
costs a reactor round trip per request).
"""

from typing import Any, Callable, List

from twisted.internet import defer
from twisted.internet.interfaces import IConsumer, ITCPTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IBodyProducer, IResponse
from zope.interface import implementer

from yurtcoord.tx.twisted_private import proxied_transport


def drop_connection(transport: object) -> None:
    """Abort the connection under ``transport`` now (an RST, no waiting on the peer).

    A body protocol is given Twisted's proxy of the connection, which can only close it
    gracefully; the connection it stands for is aborted instead. Anything else that is
    not a TCP or TLS transport is closed with ``loseConnection``.
    """
    # The proxy forwards to the connection until the response is over, then holds
    # None: nothing is left to drop.
    connection = proxied_transport(transport)
    if ITCPTransport.providedBy(connection):
        connection.abortConnection()
    elif connection is not None:
        connection.loseConnection()


class BoundedBodyReader(Protocol):
    """Collects a response body of at most ``limit`` bytes.

    Past ``limit`` the connection is dropped and ``deferred`` fails with
    ``too_large(limit)``; the later ``connectionLost`` is then ignored. Cancelling
    ``deferred`` drops the connection and fails it at once.
    """

    def __init__(self, limit: int, too_large: Callable[[int], Exception]) -> None:
        self.limit = limit
        self._too_large = too_large
        self._chunks: List[bytes] = []
        self.size = 0
        self.deferred: defer.Deferred[bytes] = defer.Deferred(self._cancel)

    def _cancel(self, deferred: defer.Deferred[Any]) -> None:
        drop_connection(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.deferred.called:
            return
        self.size += len(data)
        if self.size > self.limit:
            self._chunks = []
            drop_connection(self.transport)
            if not self.deferred.called:
                self.deferred.errback(self._too_large(self.limit))
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.deferred.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            body, self._chunks = b"".join(self._chunks), []
            self.deferred.callback(body)
        else:
            self._chunks = []
            self.deferred.errback(reason)


def read_body(response: IResponse, limit: int,
              too_large: Callable[[int], Exception]) -> defer.Deferred[bytes]:
    """The whole body of ``response`` (bytes), at most ``limit`` bytes; see the module
    doc. Cancellable: cancelling drops the connection."""
    reader = BoundedBodyReader(limit, too_large)
    response.deliverBody(reader)
    return reader.deferred


@implementer(IBodyProducer)
class BytesBody:
    """A request body already in memory (no cooperator round trips)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> "defer.Deferred[None]":
        consumer.write(self._data)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        return None

    def resumeProducing(self) -> None:
        return None

    def stopProducing(self) -> None:
        return None
