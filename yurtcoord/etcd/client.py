"""A thin adapter that makes txaioetcd's Twisted client usable against etcd 3.4 and 3.5.

txaioetcd keeps its client and its types here (``KeySet``, ``KeyValue``,
``Transaction``, ``OpGet``/``OpSet``/``OpDel``, ``CompVersion``/``CompValue`` ...); the
adapter fixes what it lacks:

- the gateway path: txaioetcd hard-codes ``/v3alpha/`` which etcd 3.4/3.5 answer with
  404. Requests go to ``EtcdConfig.gateway_prefix`` (``/v3`` by default, which both
  serve); ``"auto"`` probes ``/v3``, ``/v3beta``, ``/v3alpha`` once and keeps the first
  that answers.
- its single HTTP call (which ignores the pool and agent it was given; see
  ``yurtcoord.etcd.txaioetcd_private``) is routed through one
  ``twisted.web.client.Agent`` with its own ``HTTPConnectionPool``; at most
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
- typed errors (``yurtcoord.etcd.errors``) instead of raw Twisted failures.
- ``range`` honours ``limit``, ``keys_only`` and ``revision`` (txaioetcd's ``get`` drops
  them) and prefix ends are computed correctly for keys ending in ``0xff``.

Members named by a DNS name are resolved by the ``name_resolver`` given to the client
(``yurtcoord.tx.resolver.RememberingResolver`` keeps the pool etcd reachable while DNS
fails), else by the reactor's.

Several members of one etcd cluster (``EtcdConfig.more_urls``): requests go to one
member at a time and move on to the next when it fails to serve (no connection, no
answer in time, no leader or a lost one); a skipped member comes back once its
``/health`` answers (``yurtcoord.etcd.members``). A read, or any request that surely
never reached the member, is resent on the next member; a write that reached a member
is never resent elsewhere: its failure carries ``maybe_applied`` and the caller
resolves the doubt, as with one member. One TLS policy serves every member.

Every request, watches included, requires a leader (``REQUIRE_LEADER_HEADER``): a
member that knows it has none refuses it at once with ``NoLeader`` instead of holding
it until the request timeout, and since that refusal comes before the request is
proposed, a write refused so is resent on the next member like a read. etcd also ends
a watch stream whose member has been without a leader for three election timeouts:
the watch fails with ``EtcdUnavailable`` and its owner starts it again, instead of
waiting on a stream that no longer moves. A member that still believes in a leader
that has just died is no help: it forwards a write to that leader and holds it until
the request timeout (``EtcdTimeout``, in doubt), as before.

Reconnecting needs nothing special: a connection etcd closed is dropped from the pool,
and before an idle connection is reused its socket is peeked, so one closed while the
reactor was not looking is dropped too. A request on a connection at the moment etcd
died fails with ``EtcdUnavailable`` and the next request dials again. Reads (range,
status) and requests that provably never reached etcd are resent once (to the next
member when there are several, each member once); writes are not (etcd may have
applied them).
Watches go over the gateway's watch stream with the project's own line reader
(``yurtcoord.etcd.watch``; txaioetcd's watch receiver loses JSON split across reads).
Not offered: leases (txaioetcd's ``Lease`` methods post with treq to ``/v3alpha`` directly).
"""

import json
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional, Union

from OpenSSL import SSL
from twisted.internet import defer, error as net_error, tcp
from twisted.internet.interfaces import IHostnameResolver, IReactorTime
from twisted.internet.defer import Deferred, DeferredSemaphore, inlineCallbacks
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import client as web_client
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from yurtcoord.etcd.members import MemberSet
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.etcd.txaioetcd_private import (
    GatewayClient,
    marshal_range_request,
    parse_key_value,
    parse_status,
    txaioetcd,
)
from yurtcoord.tx import httpbody
from yurtcoord.tx.resolver import ResolverReactor
from yurtcoord.tx.tlsreload import PEMSource, ReloadingTLSPolicy
from yurtcoord.tx.twisted_private import ParseError, QuietHTTPConnectionPool
from yurtcoord.tx.failures import causes, describe_failure, is_cancellation
from yurtcoord.etcd.errors import (
    BadResponse,
    ClientClosed,
    EtcdError,
    EtcdTimeout,
    EtcdUnavailable,
    NoLeader,
    RequestCancelled,
    RequestRejected,
    RequestTooLarge,
    ResponseTooLarge,
    EtcdTLSConfigError,
    TooManyOperations,
    TransactionFailed,
)
from yurtcoord.tx.inflight import InFlight, cancellable_sleep

__all__ = ["EtcdConfig", "EtcdClient", "RangePage", "TransactionResult", "prefix_range_end",
           "prefix_keyset", "REQUIRE_LEADER_HEADER"]

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
_PARSE_ERRORS = (LookupError, ValueError, TypeError, AttributeError, ArithmeticError,
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
# Failures where etcd certainly never saw a complete request: safe to resend anything.
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


@dataclass
class RangePage:
    """One range answer: ``kvs`` (``txaioetcd.KeyValue``), whether ``more`` keys exist
    beyond ``limit``, the total ``count`` in the range and the store ``revision``."""

    kvs: list[Any]
    more: bool
    count: int
    revision: Optional[int]


@dataclass
class TransactionResult:
    """What a transaction did: which branch ran, at which revision, and its op responses
    (``txaioetcd.Revision`` for puts, ``Deleted`` for deletes, ``Range`` for gets)."""

    succeeded: bool
    revision: Optional[int]
    responses: list[Any] = field(default_factory=list)


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd ``range_end`` covering every key that starts with ``prefix``.

    Trailing ``0xff`` bytes cannot be incremented and are dropped first; an empty or
    all-``0xff`` prefix means "to the end of the keyspace" (``b"\\0"``).
    """
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\x00"
    end[-1] += 1
    return bytes(end)


def prefix_keyset(prefix: bytes) -> txaioetcd.KeySet:
    """A ``txaioetcd.KeySet`` for all keys under ``prefix`` (correct for any last byte)."""
    if not prefix:
        return txaioetcd.KeySet(b"\x00", range_end=b"\x00")
    return txaioetcd.KeySet(prefix, range_end=prefix_range_end(prefix))


def _as_keyset(key_or_prefix: Union[bytes, txaioetcd.KeySet]) -> txaioetcd.KeySet:
    if isinstance(key_or_prefix, txaioetcd.KeySet):
        return key_or_prefix
    if isinstance(key_or_prefix, bytes):
        return prefix_keyset(key_or_prefix)
    raise TypeError(f"expected bytes prefix or KeySet, got {type(key_or_prefix).__name__}")


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


def _error_text(value: object) -> str:
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


def _grpc_error(status: int, obj: dict[str, Any]) -> EtcdError:
    """Map an etcd gateway error body to a typed error (any field of any JSON type)."""
    message = (_error_text(obj.get("message")) or _error_text(obj.get("error"))
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


class _Transport:
    """POSTs JSON to the etcd gateway through one Agent and pool; the only network code."""

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
             idempotent: bool = False) -> "Deferred[tuple[int, bytes]]":
        """POST ``payload`` as JSON to ``<prefix><path>``; fires with ``(status, body)``."""
        return self.post_body(path, json.dumps(payload).encode("utf-8"), timeout, idempotent)

    def post_body(self, path: str, body: bytes, timeout: Optional[float] = None,
                  idempotent: bool = False) -> "Deferred[tuple[int, bytes]]":
        """``post`` of a body already encoded as JSON."""
        if self.closed:
            return defer.fail(ClientClosed("etcd client closed"))
        if self._prefix is None:
            return self._detect_prefix().addCallback(
                lambda _: self.post_body(path, body, timeout, idempotent))
        return self._slots.run(self._send_with_retry, self._prefix, path, body, timeout,
                               idempotent)

    def _member(self) -> str:
        """The member for the next request; EtcdUnavailable at once when none serves."""
        base = self.members.pick()
        if base is None:
            raise EtcdUnavailable(f"no etcd member serves (each is skipped until its "
                                  f"/health answers): {self.members.no_member_reason()}")
        return base

    @inlineCallbacks
    def _send_with_retry(self, prefix: str, path: str, body: bytes, timeout: Optional[float],
                         idempotent: bool) -> Generator["Deferred[Any]", Any, tuple[int, bytes]]:
        """Send on the current member. A connection failure is resent (when the request
        is idempotent or surely never arrived) on the next member, or once on the only
        one; a gateway answer saying the member cannot serve is resent on the next
        member when idempotent or when it is ``NoLeader`` (refused before it was
        proposed), else returned for ``parse`` to raise."""
        several = len(self.members.urls) > 1
        sends_left = len(self.members.urls) if several else 2
        while True:
            base = self._member()
            sends_left -= 1
            try:
                result = yield self._send(base, prefix, path, body, timeout)
            except _Resendable as e:
                self.members.failed(base, str(e.error))
                if self.closed or not (idempotent or e.not_delivered) or sends_left <= 0:
                    raise e.error
                self.log.debug("etcd request {path} failed on a connection, resending: "
                               "{error}", path=path, error=str(e.error))
                continue
            except EtcdTimeout as e:
                self.members.failed(base, str(e))
                raise
            refusal = self._refusal(base, path, result) if several else None
            if refusal is not None:
                self.members.failed(base, str(refusal))
                resendable = idempotent or isinstance(refusal, NoLeader)
                if resendable and sends_left > 0 and not self.closed:
                    self.log.debug("etcd request {path} refused by {url}, resending on "
                                   "the next member: {error}", path=path, url=base,
                                   error=str(refusal))
                    continue
                if result[0] == 200:
                    raise refusal
            return result

    def _refusal(self, base: str, path: str,
                 status_and_body: tuple[int, bytes]) -> Optional[EtcdError]:
        """The error of a gateway answer that says its member cannot serve now (no
        leader, leader changed, timed out, unavailable), None for any other answer.
        A member's status answers without a leader too: then the member is as good as
        unavailable for everything else, and its status says so."""
        status, body = status_and_body
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
            self.parse(status_and_body)
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
        answered: Deferred[tuple[int, bytes]] = self._agent.request(
            b"GET", (base + "/health").encode("utf-8")).addCallback(
                _read_response, _HEALTH_BYTES, "/health")
        answered.addTimeout(self._config.timeout, self._reactor)

        def healthy(status_and_body: tuple[int, bytes]) -> bool:
            try:
                obj = json.loads(status_and_body[1])
            except (ValueError, RecursionError):
                return False
            return isinstance(obj, dict) and obj.get("health") in ("true", True)

        verdict: Deferred[bool] = answered.addCallback(healthy)
        return self._in_flight.track(verdict)

    def _send(self, base: str, prefix: str, path: str, body: bytes,
              timeout: Optional[float]) -> "Deferred[tuple[int, bytes]]":
        if self.closed:
            return defer.fail(ClientClosed("etcd client closed"))
        timeout = timeout or self._config.timeout
        if self.tls is not None:
            # Files changed since the last request: the Agent is replaced first.
            self.tls.refresh()
        url = (base + prefix + path).encode("utf-8")
        headers = _request_headers()
        answered: Deferred[tuple[int, bytes]] = self._agent.request(
            b"POST", url, headers, httpbody.BytesBody(body)).addCallback(
                _read_response, self._config.max_response_bytes, path)
        answered.addTimeout(timeout, self._reactor, onTimeoutCancel=_timed_out)
        answered.addErrback(self._translate, base, path, timeout)
        return self._in_flight.track(answered)

    def _translate(self, failure: Failure, base: str, path: str, timeout: float) -> Failure:
        if failure.check(EtcdError):
            return failure
        reasons = causes(failure)
        cancelled = is_cancellation(failure)
        if self.closed and cancelled:
            raise ClientClosed("etcd client closed")
        if failure.check(defer.TimeoutError, net_error.TimeoutError):
            raise EtcdTimeout(f"etcd at {base} did not answer {path} within {timeout}s")
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
            raise _Resendable(error, not_delivered=not_delivered)
        self.log.error("etcd request {path} failed unexpectedly: {error}", path=path,
                       error=describe_failure(failure))
        raise EtcdError(f"etcd request {path} failed: {describe_failure(failure)}")

    def parse(self, status_and_body: tuple[int, bytes]) -> dict[str, Any]:
        """The JSON object of a 200 answer, else the typed error the answer means."""
        status, body = status_and_body
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
            raise _grpc_error(status, obj)
        if status in (502, 503):
            raise EtcdUnavailable(f"etcd unavailable: HTTP {status}")
        if status == 504:
            raise EtcdTimeout("etcd gateway timeout: HTTP 504")
        raise BadResponse(f"etcd answered HTTP {status} with an unexpected body", status, body)

    def _detect_prefix(self) -> "Deferred[str]":
        """Find the gateway prefix once; concurrent callers wait for the same probe."""
        waiter: Deferred[str] = Deferred()
        self._probe_waiters.append(waiter)
        if len(self._probe_waiters) == 1:
            probe = defer.ensureDeferred(self._probe_prefixes())
            probe.addBoth(self._probe_done)
        return waiter

    def _probe_done(self, result: "str | Failure") -> None:
        waiters, self._probe_waiters = self._probe_waiters, []
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    def _unanswered(self, base: str, error: "_Resendable | EtcdTimeout") -> EtcdError:
        """The error of a request to ``base`` that got no answer (no connection, or
        none in time); ``base`` is skipped from now on, until its ``/health`` answers."""
        reported = error.error if isinstance(error, _Resendable) else error
        self.members.failed(base, str(reported))
        return reported

    async def _probe_prefixes(self) -> str:
        base = self._member()
        for prefix in GATEWAY_PREFIXES:
            try:
                answer = await self._slots.run(self._send, base, prefix,
                                               "/maintenance/status", b"{}", None)
            except (_Resendable, EtcdTimeout) as e:
                raise self._unanswered(base, e) from None
            if answer[0] == 404:
                continue
            self.parse(answer)
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
        try:
            base = self._member()
        except EtcdUnavailable:
            return defer.fail()
        timeout = timeout or self._config.timeout
        if self.tls is not None:
            self.tls.refresh()
        url = (base + self._prefix + path).encode("utf-8")
        headers = _request_headers()
        body = json.dumps(payload).encode("utf-8")
        d: Deferred[IResponse] = self._agent.request(b"POST", url, headers, httpbody.BytesBody(body))
        d.addTimeout(timeout, self._reactor, onTimeoutCancel=_timed_out)

        def translate(failure: Failure) -> Failure:
            try:
                self._translate(failure, base, path, timeout)
            except (_Resendable, EtcdTimeout) as e:
                raise self._unanswered(base, e) from None
            return failure

        d.addErrback(translate)
        return self._in_flight.track(d)


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


class _Resendable(Exception):
    """Internal: a connection-level failure, with whether the request surely never arrived."""

    def __init__(self, error: EtcdError, not_delivered: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.not_delivered = not_delivered


def _read_response(response: IResponse, limit: int,
                   path: str) -> "Deferred[tuple[int, bytes]]":
    """``(status, body)``; a body ended by connection close (no length) still counts."""
    return httpbody.read_body(response, limit, lambda limit: ResponseTooLarge(
        f"etcd answer to {path} longer than {limit} bytes, connection dropped",
        response.code)).addCallback(lambda body: (response.code, body))


class EtcdClient:
    """etcd through txaioetcd, on the 3.4/3.5 gateway, with TLS, timeouts and typed errors.

    Every method returns a Deferred and accepts ``timeout=`` (seconds) overriding the
    configured one. Errors are ``yurtcoord.etcd.errors.EtcdError`` subclasses.
    ``txaioetcd`` is the underlying client (for anything not wrapped here; its ``watch``
    must not be used).
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, config: EtcdConfig,
                 name_resolver: Optional[IHostnameResolver] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self.config = config
        self._reactor = reactor
        # ``loop_errors`` counts the errors of the member probe chain (the agent's
        # metrics; optional for tools and tests).
        self._transport = _Transport(reactor, config, name_resolver, loop_errors)
        self.txaioetcd = GatewayClient(reactor, config.url.rstrip("/"),
                                       _TxaioetcdTransport(self._transport), _refuse)

    @property
    def gateway_prefix(self) -> Optional[str]:
        return self._transport.gateway_prefix

    @property
    def member(self) -> Optional[str]:
        """The URL of the etcd member requests go to now; None while no member serves."""
        return self._transport.members.current

    def member_health(self) -> dict[str, bool]:
        """``{member URL: usable}``: False while the member is skipped (a request to it
        failed and its ``/health`` has not answered since)."""
        members = self._transport.members
        skipped = members.skipped()
        return {url: url not in skipped for url in members.urls}

    def _call(self, path: str, payload: Any, timeout: Optional[float] = None,
              idempotent: bool = False) -> "Deferred[dict[str, Any]]":
        d = self._transport.post(path, payload, timeout, idempotent)
        return d.addCallback(self._transport.parse)

    # -- reads -------------------------------------------------------------------

    def range_page(self, keys: Union[bytes, txaioetcd.KeySet], keys_only: bool = False,
                   limit: Optional[int] = None, revision: Optional[int] = None,
                   count_only: bool = False, serializable: bool = False,
                   timeout: Optional[float] = None) -> "Deferred[RangePage]":
        """One range request over ``keys`` (bytes prefix or ``KeySet``) → ``RangePage``.

        ``limit`` caps the keys returned (``more`` tells whether there were more);
        ``keys_only`` returns keys without values; ``revision`` reads at that revision.
        """
        op = txaioetcd.OpGet(_as_keyset(keys), count_only=count_only or None,
                             keys_only=keys_only or None, limit=limit or None,
                             revision=revision or None, serializable=serializable or None)
        d = self._call("/kv/range", marshal_range_request(op), timeout, idempotent=True)
        return d.addCallback(_parse_range)

    def range(self, keys: Union[bytes, txaioetcd.KeySet], keys_only: bool = False,
              limit: Optional[int] = None, revision: Optional[int] = None,
              timeout: Optional[float] = None) -> "Deferred[list[Any]]":
        """``KeyValue``s under a prefix (bytes) or in a ``KeySet``, ordered by key.

        The bytes form is a prefix: pass ``b"/registry/pods/"`` with its trailing
        slash to avoid matching ``/registry/podsecuritypolicy``.
        """
        d = self.range_page(keys, keys_only=keys_only, limit=limit, revision=revision,
                            timeout=timeout)
        return d.addCallback(lambda page: page.kvs)

    def get(self, key: bytes, timeout: Optional[float] = None) -> "Deferred[Any]":
        """The ``KeyValue`` stored at ``key``, or None."""
        _require_bytes(key=key)
        d = self.range_page(txaioetcd.KeySet(key), timeout=timeout)
        d.addCallback(lambda page: page.kvs[0] if page.kvs else None)
        return d

    def status(self, timeout: Optional[float] = None) -> "Deferred[Any]":
        """etcd's ``txaioetcd.Status`` (version, db size, leader): a cheap health probe."""
        d = self._call("/maintenance/status", {}, timeout, idempotent=True)
        d.addCallback(_guard_parse(parse_status))
        return d

    # -- writes (through txaioetcd's own methods) --------------------------------

    def put(self, key: bytes, value: bytes,
            timeout: Optional[float] = None) -> "Deferred[Optional[int]]":
        """Store ``value`` at ``key``; fires with the new store revision."""
        _require_bytes(key=key, value=value)
        d = _guarded(self.txaioetcd.set(key, value, timeout=timeout))
        d.addCallback(lambda rev: rev.header.revision if rev.header else None)
        return d

    def delete(self, key: bytes, timeout: Optional[float] = None) -> "Deferred[int]":
        """Delete one key; fires with the number deleted (0 or 1)."""
        _require_bytes(key=key)
        d = _guarded(self.txaioetcd.delete(txaioetcd.KeySet(key), timeout=timeout))
        d.addCallback(lambda deleted: deleted.deleted)
        return d

    def delete_prefix(self, prefix: bytes, timeout: Optional[float] = None) -> "Deferred[int]":
        """Delete every key under ``prefix`` (bytes); fires with the number deleted."""
        _require_bytes(prefix=prefix)
        d = _guarded(self.txaioetcd.delete(prefix_keyset(prefix), timeout=timeout))
        d.addCallback(lambda deleted: deleted.deleted)
        return d

    def submit(self, txn: txaioetcd.Transaction, raise_on_failure: bool = True,
               timeout: Optional[float] = None) -> "Deferred[TransactionResult]":
        """Run a ``txaioetcd.Transaction``; fires with a ``TransactionResult``.

        When the compare fails: ``TransactionFailed`` (carrying the failure branch's
        responses) if ``raise_on_failure``, else a result with ``succeeded=False``.
        """
        d = _guarded(self.txaioetcd.submit(txn, timeout=timeout))

        def succeeded(success: Any) -> TransactionResult:
            header = success.header
            return TransactionResult(True, header.revision if header else None,
                                     list(success.responses))

        def failed(failure: Failure) -> TransactionResult:
            failure.trap(txaioetcd.Failed)
            failed_txn: txaioetcd.Failed = failure.value
            header = failed_txn.header
            revision = header.revision if header else None
            responses = list(failed_txn.responses)
            if raise_on_failure:
                raise TransactionFailed(revision, responses)
            return TransactionResult(False, revision, responses)

        d.addCallbacks(succeeded, failed)
        return d

    # -- watches and compaction -----------------------------------------------------

    def watch(self, keys: Union[bytes, txaioetcd.KeySet], on_response: Callable[[Any], object],
              start_revision: Optional[int] = None, prev_kv: bool = False,
              timeout: Optional[float] = None) -> "Deferred[Any]":
        """Watch ``keys`` (bytes prefix or ``KeySet``) from ``start_revision`` (None:
        from now) over the gateway's watch stream; ``on_response`` gets every
        ``yurtcoord.etcd.watch.WatchResponse``. Fires with the running
        ``yurtcoord.etcd.watch.EtcdWatch`` once etcd accepted the stream; the stream
        keeps its own connection until the watch is cancelled (``close()`` does not
        end it) or etcd ends it."""
        from yurtcoord.etcd.watch import EtcdWatch, watch_request

        keyset = _as_keyset(keys)
        payload = watch_request(keyset.key, keyset.range_end, start_revision,
                                prev_kv)
        watch = EtcdWatch(on_response)

        def answered(response: IResponse) -> Any:
            if response.code != 200:
                return _read_response(response, 64 * 1024, "/watch").addCallback(
                    self._transport.parse).addCallback(
                        lambda _: defer.fail(BadResponse(
                            f"etcd answered a watch with HTTP {response.code}", response.code)))
            response.deliverBody(watch.protocol)
            return watch

        return self._transport.stream("/watch", payload, timeout).addCallback(answered)

    def compact(self, revision: int, physical: bool = True,
                timeout: Optional[float] = None) -> "Deferred[Any]":
        """Compact etcd's history up to ``revision``: reads and watches of older
        revisions fail from then on."""
        return self._call("/kv/compaction", {"revision": revision, "physical": physical},
                          timeout)

    def close(self) -> "Deferred[Any]":
        """Cancel requests in flight (they fail with ``ClientClosed``) and close connections."""
        d = self._transport.close()
        # Aborted connections finish closing on the next reactor turn.
        d.addCallback(lambda _: cancellable_sleep(self._reactor, 0))
        return d


def _refuse(message: str) -> "Deferred[Any]":
    return defer.fail(EtcdError(message))


class _TxaioetcdTransport:
    """The transport as txaioetcd's client sees it: JSON in, parsed JSON out."""

    def __init__(self, transport: _Transport) -> None:
        self._transport = transport

    def post(self, path: str, data: dict[str, Any],
             timeout: Optional[float]) -> "Deferred[dict[str, Any]]":
        d = self._transport.post(path, data, timeout, idempotent=False)
        return d.addCallback(self._transport.parse)

    def post_body(self, path: str, body: bytes,
                  timeout: Optional[float]) -> "Deferred[dict[str, Any]]":
        d = self._transport.post_body(path, body, timeout, idempotent=False)
        return d.addCallback(self._transport.parse)


def _require_bytes(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, bytes):
            raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def _guard_parse(parse: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    def guarded(obj: dict[str, Any]) -> Any:
        try:
            return parse(obj)
        except _PARSE_ERRORS as e:
            raise BadResponse(f"unexpected etcd answer shape: {type(e).__name__}: "
                              f"{_error_text(str(e))}") from e

    return guarded


def _guarded(d: "Deferred[Any]") -> "Deferred[Any]":
    """Turn txaioetcd's own parsing failures (on a malformed answer) into BadResponse."""

    def translate(failure: Failure) -> Failure:
        if failure.check(EtcdError, txaioetcd.Failed):
            return failure
        if failure.check(txaioetcd.Error):
            err: txaioetcd.Error = failure.value
            raise _grpc_error(200, {"code": err.code, "message": err.message or ""})
        if failure.type is Exception or failure.check(*_PARSE_ERRORS):
            raise BadResponse(f"unexpected etcd answer shape: {type(failure.value).__name__}: "
                              f"{_error_text(failure.getErrorMessage())}")
        return failure

    d.addErrback(translate)
    return d


def _parse_range(obj: dict[str, Any]) -> RangePage:
    """A range answer as a ``RangePage``. Every field is checked for its JSON type:
    ``bool([False])`` is true and a kv without a key has the key None, and either
    would reach the store's paging as a page that goes on or a key it cannot extend."""
    try:
        raw_kvs = obj.get("kvs", [])
        if not isinstance(raw_kvs, list):
            raise TypeError(f"kvs is a {type(raw_kvs).__name__}, not a list")
        kvs = []
        for raw in raw_kvs:
            if not isinstance(raw, dict) or not isinstance(raw.get("key"), str):
                raise TypeError("a kv without a key")
            if "value" in raw and not isinstance(raw["value"], str):
                raise TypeError("a kv whose value is not a string")
            kvs.append(parse_key_value(raw))
        header = obj.get("header") or {}
        if not isinstance(header, dict):
            raise TypeError(f"header is a {type(header).__name__}, not an object")
        more = obj.get("more", False)
        if not isinstance(more, bool):
            raise TypeError(f"more is a {type(more).__name__}, not a boolean")
        revision = int(header["revision"]) if "revision" in header else None
        return RangePage(kvs=kvs, more=more, count=int(obj.get("count", 0)),
                         revision=revision)
    except _PARSE_ERRORS as e:
        raise BadResponse(f"unexpected etcd range answer: {type(e).__name__}: "
                          f"{_error_text(str(e))}") from e
