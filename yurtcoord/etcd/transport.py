"""The HTTP side of the pool etcd client: POSTs of JSON to the etcd gateway and their
answers, typed.

- the gateway path: txaioetcd hard-codes ``/v3alpha/`` which etcd 3.4/3.5 answer with
  404. Requests go to ``EtcdConfig.gateway_prefix`` (``/v3`` by default, which both
  serve); ``"auto"`` probes ``/v3``, ``/v3beta``, ``/v3alpha`` once and keeps the first
  that answers.
- one ``twisted.web.client.Agent`` with its own ``HTTPConnectionPool``; at most
  ``max_connections`` requests are in flight, the rest queue.
- mutual TLS (CA, client certificate, key), re-read when the files change
  (``yurtcoord.tx.tlsreload``). A rotation replaces the Agent and its pool: the old
  pool's idle connections are closed at once and its busy ones as soon as their request
  ends, so every request after a certificate rotation handshakes with the new files.
- per-request timeouts, covering connect, send and the whole response body.
- a bound on every answer: a body longer than ``MAX_RESPONSE_BYTES`` (64 MiB,
  ``EtcdConfig.max_response_bytes``) fails with ``ResponseTooLarge`` and its connection
  is dropped at that point, so an etcd (or whatever answers in its place) that never
  ends an answer costs at most that much memory. The bound is above a range page of a
  thousand objects of several KiB each, as the pool store reads them.
- typed errors (``yurtcoord.etcd.errors``) instead of raw Twisted failures; a request
  its member did not answer is ``yurtcoord.etcd.resend.Unanswered``, which the resend
  policy judges (which member, resent or not: ``yurtcoord.etcd.resend``).

Members named by a DNS name are resolved by the ``name_resolver`` given to the client
(``yurtcoord.tx.resolver.RememberingResolver`` keeps the pool etcd reachable while DNS
fails), else by the reactor's. One TLS policy serves every member.

Reconnecting needs nothing special: a connection etcd closed is dropped from the pool,
and before an idle connection is reused its socket is peeked, so one closed while the
reactor was not looking is dropped too. A request on a connection at the moment etcd
died fails with ``EtcdUnavailable`` and the next request dials again.
"""

import json
import socket
from dataclasses import dataclass
from typing import Any, Generator, Optional

from OpenSSL import SSL
from twisted.internet import defer, error as net_error, tcp
from twisted.internet.defer import Deferred, DeferredSemaphore, inlineCallbacks
from twisted.internet.interfaces import IHostnameResolver, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import client as web_client
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from yurtcoord.etcd.errors import (
    BadResponse, ClientClosed, EtcdError, EtcdTimeout, EtcdTLSConfigError, EtcdUnavailable,
    NoLeader, RequestCancelled, RequestRejected, RequestTooLarge, ResponseTooLarge,
    TooManyOperations,
)
from yurtcoord.etcd.members import MemberSet
from yurtcoord.etcd.resend import Sends, Unanswered
from yurtcoord.tx import httpbody
from yurtcoord.tx.failures import causes, describe_failure, is_cancellation
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.resolver import ResolverReactor
from yurtcoord.tx.tlsreload import PEMSource, ReloadingTLSPolicy
from yurtcoord.tx.twisted_private import ParseError, QuietHTTPConnectionPool

__all__ = ["EtcdConfig", "Transport", "GATEWAY_PREFIXES", "MAX_RESPONSE_BYTES",
           "REQUIRE_LEADER_HEADER", "PARSE_ERRORS", "error_text", "grpc_error",
           "read_response"]

Answer = tuple[int, bytes]

GATEWAY_PREFIXES = ("/v3", "/v3beta", "/v3alpha")
# Bytes of one answer read at most (see the module doc).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024

# The gateway passes ``Grpc-Metadata-<key>`` headers on as gRPC metadata; etcd's
# ``hasleader: true`` makes a member refuse the request while it has no leader
# (``NoLeader``).
REQUIRE_LEADER_HEADER = (b"Grpc-Metadata-hasleader", b"true")
# The message of that refusal.
_NO_LEADER_MESSAGE = "etcdserver: no leader"

# gRPC status codes the etcd gateway puts in its error bodies.
_GRPC_DEADLINE_EXCEEDED = 4
_GRPC_RESOURCE_EXHAUSTED = 8
_GRPC_UNAVAILABLE = 14
# Bytes of a member's /health answer read at most.
_HEALTH_BYTES = 64 * 1024
# Characters of an error message kept in a typed error (a peer may send megabytes).
_MESSAGE_CHARS = 1024
# What parsing a malformed answer can raise: wrong types and missing fields, numbers
# out of range (``1e999`` is infinity, which is no integer), nesting deeper than the
# interpreter's recursion limit, bad base64 (a ValueError).
PARSE_ERRORS = (LookupError, ValueError, TypeError, AttributeError, ArithmeticError,
                RecursionError)

# Failures meaning "the connection went away", whatever the layer that noticed.
_CONNECTION_FAILURES = (
    net_error.ConnectError,
    net_error.ConnectionLost,
    net_error.ConnectionDone,
    net_error.ConnectionClosed,
    web_client.ResponseFailed,
    web_client.ResponseNeverReceived,
    web_client.RequestTransmissionFailed,
    web_client.RequestNotSent,
    SSL.Error,
    OSError,
)
# Surely never reached etcd: no connection was made, or the request was not sent.
_NOT_DELIVERED = (net_error.ConnectError, web_client.RequestNotSent,
                  web_client.RequestTransmissionFailed)



@dataclass(frozen=True)
class EtcdConfig:
    """Where etcd is and how to talk to it.

    :param url: ``http://host:port`` or ``https://host:port``: the (first) etcd member.
    :param more_urls: the other members of the same etcd cluster, same scheme, tried in
        this order after ``url`` (see the module doc).
    :param ca_file: PEM CA bundle verifying etcd's server certificate (https).
    :param cert_file: PEM client certificate (optionally followed by its chain).
    :param key_file: PEM private key of ``cert_file``.
    :param timeout: seconds for one request, from sending to the end of the body.
    :param gateway_prefix: ``"/v3"`` (etcd >= 3.4), ``"/v3beta"``, ``"/v3alpha"`` or ``"auto"``.
    :param max_connections: requests in flight (and idle connections kept) at once.
    :param idle_connection_timeout: seconds an idle pooled connection is kept open.
    :param max_response_bytes: bytes of one answer read at most (``ResponseTooLarge``).
    """

    url: str
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    timeout: float = 5.0
    gateway_prefix: str = "/v3"
    max_connections: int = 16
    idle_connection_timeout: int = 60
    max_response_bytes: int = MAX_RESPONSE_BYTES
    more_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.url.startswith("http://") or self.url.startswith("https://")):
            raise ValueError(f"etcd url must start with http:// or https://: {self.url!r}")
        scheme = self.url.split(":", 1)[0]
        for url in self.more_urls:
            if not url.startswith(scheme + "://"):
                raise ValueError(f"every etcd member url must start with {scheme}:// "
                                 f"as {self.url!r} does: {url!r}")
        bases = [url.rstrip("/") for url in self.urls]
        for url in bases:
            if bases.count(url) > 1:
                raise ValueError(f"etcd member url appears twice: {url!r}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.gateway_prefix != "auto" and self.gateway_prefix not in GATEWAY_PREFIXES:
            raise ValueError(f"gateway_prefix must be one of {GATEWAY_PREFIXES} or 'auto'")
        if self.timeout <= 0 or self.max_connections < 1:
            raise ValueError("timeout must be > 0 and max_connections >= 1")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be >= 1")

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    @property
    def urls(self) -> tuple[str, ...]:
        """Every member's URL, ``url`` first."""
        return (self.url,) + tuple(self.more_urls)



class _PeekingPool(QuietHTTPConnectionPool):
    """A connection pool that never hands out an idle connection whose peer has
    already closed it: the reactor may not have seen yet that etcd closed an idle
    connection (it died, restarted, and nothing ran in between), and a write sent on
    it would fail as "maybe applied"."""

    def getConnection(self, key: Any, endpoint: Any) -> "Deferred[Any]":
        d = super().getConnection(key, endpoint)
        # Each cached connection is looked at once at most.
        d.addCallback(self._unless_closed, key, endpoint, self.maxPersistentPerHost)
        return d

    def _unless_closed(self, connection: Any, key: Any, endpoint: Any,
                       tries: int) -> Any:
        if tries <= 0 or not _peer_has_closed(connection):
            return connection
        connection.transport.abortConnection()
        d = super().getConnection(key, endpoint)
        d.addCallback(self._unless_closed, key, endpoint, tries - 1)
        return d


def _peer_has_closed(connection: Any) -> bool:
    """True when the socket under a pooled connection shows EOF or an error (no read)."""
    transport = connection.transport
    if not isinstance(transport, tcp.Connection):
        return False  # a TLS connection: its bytes are not ours to peek at
    sock = transport.getHandle()
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return data == b""


def error_text(value: object) -> str:
    """An error body's message as bounded text, whatever JSON type the peer sent."""
    if isinstance(value, str):
        text = value
    elif value is None or value == "":
        return ""
    else:
        text = f"(malformed {type(value).__name__} message)"
    if len(text) > _MESSAGE_CHARS:
        text = text[:_MESSAGE_CHARS] + f"... ({len(text)} characters)"
    return text


def _error_code(value: object) -> Optional[int]:
    """The gRPC code of an error body, None when it is not a plain integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        return int(value)
    return None


def grpc_error(status: int, obj: dict[str, Any]) -> EtcdError:
    """Map an etcd gateway error body to a typed error (any field of any JSON type)."""
    message = (error_text(obj.get("message")) or error_text(obj.get("error"))
               or f"HTTP {status}")
    code = _error_code(obj.get("code"))
    if code == _GRPC_UNAVAILABLE and message == _NO_LEADER_MESSAGE:
        return NoLeader(f"etcd unavailable: {message}")
    if code == _GRPC_UNAVAILABLE or status == 503:
        unavailable = EtcdUnavailable(f"etcd unavailable: {message}")
        # "etcdserver: request timed out[, possibly due to ...]": the write was proposed
        # and may still be committed.
        unavailable.maybe_applied = "timed out" in message
        return unavailable
    if code == _GRPC_DEADLINE_EXCEEDED or status == 504 or message == "context deadline exceeded":
        # etcd answers a write it proposed but could not commit in time (no quorum)
        # with "context deadline exceeded" (gRPC code 2, HTTP 500): it may still land.
        return EtcdTimeout(f"etcd deadline exceeded: {message}")
    if "request is too large" in message or (
            code == _GRPC_RESOURCE_EXHAUSTED and "larger than max" in message):
        return RequestTooLarge(message, code, status)
    if "too many operations" in message:
        return TooManyOperations(message, code, status)
    return RequestRejected(message, code, status)


class Transport:
    """POSTs JSON to the etcd gateway through one Agent and pool; the only network code.
    Which member a request goes to, and whether it is sent again, is ``Sends``'s."""

    log = Logger()

    def __init__(self, reactor: IReactorTime, config: EtcdConfig,
                 name_resolver: Optional[IHostnameResolver] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._config = config
        # What the Agent's endpoints take their resolver from.
        self._resolving_reactor: Any = (
            reactor if name_resolver is None else ResolverReactor(reactor, name_resolver))
        self.members = MemberSet(reactor, [url.rstrip("/") for url in config.urls],
                                 self.probe_health, loop_errors=loop_errors)
        self._prefix = None if config.gateway_prefix == "auto" else config.gateway_prefix
        self._probe_waiters: list[Deferred[str]] = []
        self.tls: Optional[ReloadingTLSPolicy] = None
        if config.tls:
            self.tls = ReloadingTLSPolicy(
                PEMSource(config.ca_file), PEMSource(config.cert_file),
                PEMSource(config.key_file), error=EtcdTLSConfigError,
                on_change=self._replace_pool, name=f"etcd {', '.join(self.members.urls)}")
        self.pool, self._agent = self._new_pool()
        self._slots = DeferredSemaphore(config.max_connections)
        self._in_flight = InFlight()
        self.closed = False

    @property
    def gateway_prefix(self) -> Optional[str]:
        """The prefix in use (None while "auto" has not probed yet)."""
        return self._prefix

    def _is_closed(self) -> bool:
        return self.closed

    def _replace_pool(self) -> None:
        """A new Agent on a new pool; the old pool (if any) closes its idle connections
        now and each busy one when its request ends, so no connection handshaken with
        older certificate files is used again."""
        old = self.pool
        self.pool, self._agent = self._new_pool()
        old.cachedConnectionTimeout = 0
        old.closeCachedConnections()

    def _new_pool(self) -> tuple[_PeekingPool, web_client.Agent]:
        pool = _PeekingPool(self._reactor, persistent=True)
        pool.maxPersistentPerHost = self._config.max_connections
        pool.cachedConnectionTimeout = self._config.idle_connection_timeout
        pool.retryAutomatically = False
        kwargs = {"contextFactory": self.tls} if self.tls is not None else {}
        agent = web_client.Agent(self._resolving_reactor, connectTimeout=self._config.timeout,
                                 pool=pool, **kwargs)
        return pool, agent

    def post(self, path: str, payload: Any, timeout: Optional[float] = None,
             idempotent: bool = False) -> "Deferred[Answer]":
        """POST ``payload`` as JSON to ``<prefix><path>``; fires with ``(status, body)``."""
        return self.post_body(path, json.dumps(payload).encode("utf-8"), timeout, idempotent)

    def post_body(self, path: str, body: bytes, timeout: Optional[float] = None,
                  idempotent: bool = False) -> "Deferred[Answer]":
        """``post`` of a body already encoded as JSON, sent and resent as ``Sends``
        decides (``idempotent``: a read, safe to send again)."""
        if self.closed:
            return defer.fail(ClientClosed("etcd client closed"))
        if self._prefix is None:
            return self._detect_prefix().addCallback(
                lambda _: self.post_body(path, body, timeout, idempotent))
        prefix = self._prefix
        sends: Sends[Answer] = Sends(
            self.members, lambda base: self._send(base, prefix, path, body, timeout),
            path, idempotent, self._is_closed,
            lambda base, answer: self._refusal(base, path, answer))
        return self._slots.run(sends.run, self._reactor)

    def _refusal(self, base: str, path: str, answer: Answer) -> Optional[EtcdError]:
        """The error of a gateway answer that says its member cannot serve now (no
        leader, leader changed, timed out, unavailable), None for any other answer.
        A member's status answers without a leader too: then the member is as good as
        unavailable for everything else, and its status says so."""
        status, body = answer
        if status == 200:
            if path != "/maintenance/status":
                return None
            try:
                leader = json.loads(body).get("leader")
            except (ValueError, RecursionError, AttributeError):
                return None
            if leader in (None, "0", 0):
                return EtcdUnavailable(f"etcd member at {base} has no raft leader")
            return None
        try:
            parse_answer(answer)
        except (EtcdUnavailable, EtcdTimeout) as e:
            return e
        except EtcdError:
            return None
        return None

    def probe_health(self, base: str) -> "Deferred[bool]":
        """True when the member at ``base`` answers ``/health`` with ``"health": "true"``
        within the request timeout (through the same TLS policy as every request)."""
        if self.closed:
            return defer.succeed(False)
        if self.tls is not None:
            self.tls.refresh()
        answered: Deferred[Answer] = self._agent.request(
            b"GET", (base + "/health").encode("utf-8")).addCallback(
                read_response, _HEALTH_BYTES, "/health")
        answered.addTimeout(self._config.timeout, self._reactor)

        def healthy(answer: Answer) -> bool:
            try:
                obj = json.loads(answer[1])
            except (ValueError, RecursionError):
                return False
            return isinstance(obj, dict) and obj.get("health") in ("true", True)

        verdict: Deferred[bool] = answered.addCallback(healthy)
        return self._in_flight.track(verdict)

    def _send(self, base: str, prefix: str, path: str, body: bytes,
              timeout: Optional[float]) -> "Deferred[Answer | Unanswered]":
        """One POST to ``base``: its answer, ``Unanswered``, or a typed error."""
        if self.closed:
            return defer.fail(ClientClosed("etcd client closed"))
        timeout = timeout or self._config.timeout
        if self.tls is not None:
            # Files changed since the last request: the Agent is replaced first.
            self.tls.refresh()
        url = (base + prefix + path).encode("utf-8")
        answered: Deferred[Any] = self._agent.request(
            b"POST", url, _request_headers(), httpbody.BytesBody(body)).addCallback(
                read_response, self._config.max_response_bytes, path)
        answered.addTimeout(timeout, self._reactor, onTimeoutCancel=_timed_out)
        answered.addErrback(self._translate, base, path, timeout)
        return self._in_flight.track(answered)

    def _translate(self, failure: Failure, base: str, path: str,
                   timeout: float) -> "Failure | Unanswered":
        """A failed send as the resend policy judges it: ``Unanswered`` when the
        member did not answer (no connection, the connection lost, no answer in
        time), else the typed error."""
        if failure.check(EtcdError):
            return failure
        reasons = causes(failure)
        cancelled = is_cancellation(failure)
        if self.closed and cancelled:
            raise ClientClosed("etcd client closed")
        if failure.check(defer.TimeoutError, net_error.TimeoutError):
            return Unanswered(EtcdTimeout(f"etcd at {base} did not answer {path} within "
                                          f"{timeout}s"), not_delivered=False)
        if cancelled:
            # The caller gave up (a role change stops pool sync): says nothing of the
            # member, which is not skipped for it.
            raise RequestCancelled(f"etcd request {path} to {base} cancelled by its caller")
        if any(r.check(ParseError) for r in reasons):
            raise BadResponse(f"etcd answered {path} with something that is not HTTP: "
                              f"{describe_failure(failure)}")
        if failure.check(*_CONNECTION_FAILURES):
            not_delivered = bool(failure.check(*_NOT_DELIVERED))
            error = EtcdUnavailable(f"etcd unreachable at {base}: {describe_failure(failure)}")
            error.maybe_applied = not not_delivered
            return Unanswered(error, not_delivered)
        self.log.error("etcd request {path} failed unexpectedly: {error}", path=path,
                       error=describe_failure(failure))
        raise EtcdError(f"etcd request {path} failed: {describe_failure(failure)}")

    def _detect_prefix(self) -> "Deferred[str]":
        """Find the gateway prefix once; concurrent callers wait for the same probe."""
        waiter: Deferred[str] = Deferred()
        self._probe_waiters.append(waiter)
        if len(self._probe_waiters) == 1:
            self._probe_prefixes().addBoth(self._probe_done)
        return waiter

    def _probe_done(self, result: "str | Failure") -> None:
        waiters, self._probe_waiters = self._probe_waiters, []
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    @inlineCallbacks
    def _probe_prefixes(self) -> Generator["Deferred[Any]", Any, str]:
        """The first gateway prefix the current member answers, each sent once."""
        base = ""
        for prefix in GATEWAY_PREFIXES:
            def send(base: str, prefix: str = prefix) -> "Deferred[Answer | Unanswered]":
                return self._send(base, prefix, "/maintenance/status", b"{}", None)
            sends: Sends[Answer] = Sends(self.members, send, "/maintenance/status", False,
                                         self._is_closed)
            answer = yield self._slots.run(sends.run, self._reactor, 1)
            base = sends.base
            if answer[0] == 404:
                continue
            parse_answer(answer)
            self._prefix = prefix
            self.log.info("etcd gateway prefix detected: {prefix} at {url}", prefix=prefix,
                          url=base)
            return prefix
        raise BadResponse(f"no etcd gateway at {base} (tried {', '.join(GATEWAY_PREFIXES)})")

    def close(self) -> "Deferred[Any]":
        self.closed = True
        self.members.close()
        self._in_flight.cancel_all()
        return self.pool.closeCachedConnections()

    def stream(self, path: str, payload: Any,
               timeout: Optional[float] = None) -> "Deferred[IResponse]":
        """POST ``payload`` to the current member and fire with the response once its
        headers arrived, its body unread: for answers that stream (watches). Outside
        the request slots, since a stream stays open; ``timeout`` bounds only the wait
        for the headers. A member that cannot be reached is skipped from then on, as
        for every request, so the caller's next attempt goes to the next member."""
        if self.closed:
            return defer.fail(ClientClosed("etcd client closed"))
        if self._prefix is None:
            return self._detect_prefix().addCallback(
                lambda _: self.stream(path, payload, timeout))
        prefix, body = self._prefix, json.dumps(payload).encode("utf-8")
        wait = timeout or self._config.timeout

        def send(base: str) -> "Deferred[IResponse | Unanswered]":
            if self.tls is not None:
                self.tls.refresh()
            url = (base + prefix + path).encode("utf-8")
            d: Deferred[Any] = self._agent.request(b"POST", url, _request_headers(),
                                                   httpbody.BytesBody(body))
            d.addTimeout(wait, self._reactor, onTimeoutCancel=_timed_out)
            d.addErrback(self._translate, base, path, wait)
            return self._in_flight.track(d)

        sends: Sends[IResponse] = Sends(self.members, send, path, False, self._is_closed)
        return sends.run(self._reactor, 1)


def parse_answer(answer: Answer) -> dict[str, Any]:
    """The JSON object of a 200 answer, else the typed error the answer means."""
    status, body = answer
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        # Not JSON, or nested deeper than any etcd answer is.
        obj = None
    if status == 200:
        if not isinstance(obj, dict):
            raise BadResponse("etcd answered HTTP 200 with a body that is not a JSON object",
                              status, body)
        return obj
    if isinstance(obj, dict) and ("error" in obj or "message" in obj or "code" in obj):
        raise grpc_error(status, obj)
    if status in (502, 503):
        raise EtcdUnavailable(f"etcd unavailable: HTTP {status}")
    if status == 504:
        raise EtcdTimeout("etcd gateway timeout: HTTP 504")
    raise BadResponse(f"etcd answered HTTP {status} with an unexpected body", status, body)


def _timed_out(result: object, timeout: float) -> Failure:
    """What a request the client's own timer cancelled fails with: a
    ``defer.TimeoutError``, whatever layer reported the cancellation (the HTTP client
    wraps it once the request is sent), so that it is told apart from a caller's
    cancellation."""
    return Failure(defer.TimeoutError(f"no answer within {timeout}s"))


def _request_headers() -> Headers:
    """The headers of every request to the gateway: JSON, and a leader required."""
    name, value = REQUIRE_LEADER_HEADER
    return Headers({b"Content-Type": [b"application/json"], name: [value]})


def read_response(response: IResponse, limit: int, path: str) -> "Deferred[Answer]":
    """``(status, body)``; a body ended by connection close (no length) still counts."""
    return httpbody.read_body(response, limit, lambda limit: ResponseTooLarge(
        f"etcd answer to {path} longer than {limit} bytes, connection dropped",
        response.code)).addCallback(lambda body: (response.code, body))
