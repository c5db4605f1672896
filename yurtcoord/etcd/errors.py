"""Typed etcd failures, so callers decide retry/backoff/report by type instead of by text.

``EtcdUnavailable`` and ``EtcdTimeout`` are worth retrying later (etcd down, restarting,
slow). ``TransactionFailed`` is a compare that did not hold: an answer, not an outage.
``RequestRejected`` is etcd refusing the request itself (too large, too many
operations, invalid): retrying the same request will not help. ``BadResponse`` means
whatever answered did not speak the etcd gateway's JSON.
"""

from yurtcoord.tx.tlsreload import TLSConfigError

__all__ = ["EtcdError", "EtcdUnavailable", "NoLeader", "EtcdTimeout", "RequestCancelled",
           "ClientClosed", "TLSConfigError", "EtcdTLSConfigError", "BadResponse",
           "ResponseTooLarge", "RequestRejected", "RequestTooLarge", "TooManyOperations",
           "TransactionFailed"]


class EtcdError(Exception):
    """Base of every error the etcd adapter raises.

    ``maybe_applied`` is True when a write may have been applied although no answer
    came back (the connection died after the request was sent, or it timed out):
    callers that keep their own record of what etcd holds must allow for both.
    """

    maybe_applied = False


class EtcdUnavailable(EtcdError):
    """etcd could not be reached or dropped the connection (refused, reset, TLS refused, 503)."""


class NoLeader(EtcdUnavailable):
    """The member refused the request at once because it has no raft leader.

    The client marks every request as requiring a leader (gRPC metadata ``hasleader:
    true``, sent through the gateway as the ``Grpc-Metadata-hasleader`` header). A
    member's gRPC server checks that mark before it hands the request to its key-value
    server and answers ``etcdserver: no leader`` (code 14, HTTP 503) while it knows of
    no leader: the request was never proposed to raft, so a write refused this way
    was surely not applied and may be sent to another member. etcd's key-value,
    transaction, compaction and status handlers never answer with this message
    themselves (only its lease handlers do, which this client does not call), so it
    always means that refusal.

    A member that still believes in a leader that has just died takes writes in and
    forwards them to it: those wait for an answer that does not come (``EtcdTimeout``,
    in doubt). The refusal only shortens the wait on a member that already noticed
    it has no leader (it lost its quorum or its peers, or an election is under way).
    """

    maybe_applied = False


class EtcdTimeout(EtcdError):
    """No complete answer within the request timeout."""

    maybe_applied = True


class RequestCancelled(EtcdError):
    """The caller cancelled the request before its answer came (it stopped what it
    was doing). Nothing is known of the member: it is not skipped. A write may have
    been applied."""

    maybe_applied = True


class ClientClosed(EtcdError):
    """The client was closed; requests in flight at that moment end with this too."""


class EtcdTLSConfigError(EtcdUnavailable, TLSConfigError):
    """The CA, certificate or key files of the etcd client could not be read or
    parsed: the one ``TLSConfigError`` (``yurtcoord.tx.tlsreload``), and to the callers
    that retry etcd an outage like any other (``EtcdUnavailable``)."""


class BadResponse(EtcdError):
    """The answer was not JSON or not the shape the etcd gateway returns."""

    def __init__(self, message, status=None, body=b""):
        super().__init__(message)
        self.status = status
        self.body = body[:512]


class ResponseTooLarge(BadResponse):
    """The answer grew past the client's bound (``max_response_bytes``); the connection
    was dropped without reading the rest. A write may have been applied."""

    maybe_applied = True


class RequestRejected(EtcdError):
    """etcd answered with an error for this request (gRPC ``code`` and ``message``)."""

    def __init__(self, message, code=None, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class RequestTooLarge(RequestRejected):
    """The request exceeds etcd's request size limit (``--max-request-bytes``, 1.5 MiB default)."""


class TooManyOperations(RequestRejected):
    """The transaction has more operations than ``--max-txn-ops`` (128 default)."""


class TransactionFailed(EtcdError):
    """A transaction's compare did not hold; ``responses`` are those of its failure branch.

    ``revision`` is the store revision at which the compare was evaluated.
    """

    def __init__(self, revision, responses):
        super().__init__(f"transaction compare failed at revision {revision}")
        self.revision = revision
        self.responses = responses
