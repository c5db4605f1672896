"""A thin adapter that makes txaioetcd's Twisted client usable against etcd 3.4 and 3.5.

txaioetcd keeps its client and its types here (``KeySet``, ``KeyValue``,
``Transaction``, ``OpGet``/``OpSet``/``OpDel``, ``CompVersion``/``CompValue`` ...); the
adapter fixes what it lacks:

- its single HTTP call (which ignores the pool and agent it was given; see
  ``yurtcoord.etcd.txaioetcd_private``) is routed through the client's own transport
  (``yurtcoord.etcd.transport``: the gateway path ``/v3`` instead of txaioetcd's
  ``/v3alpha``, one Agent and pool, mutual TLS re-read when the files change,
  per-request timeouts, a bound on every answer).
- typed errors (``yurtcoord.etcd.errors``) instead of raw Twisted failures, and every
  field of an answer checked before use.
- ``range`` honours ``limit``, ``keys_only`` and ``revision`` (txaioetcd's ``get`` drops
  them) and prefix ends are computed correctly for keys ending in ``0xff``.

Several members of one etcd cluster (``EtcdConfig.more_urls``): requests go to one
member at a time and move on to the next when it fails to serve (no connection, no
answer in time, no leader or a lost one); a skipped member comes back once its
``/health`` answers (``yurtcoord.etcd.members``). A read, or any request that surely
never reached the member, is resent on the next member; a write that reached a member
is never resent elsewhere: its failure carries ``maybe_applied`` and the caller
resolves the doubt, as with one member. With one member, reads and requests that
provably never reached it are resent once. ``yurtcoord.etcd.resend`` is that policy's
one home.

Every request, watches included, requires a leader (``REQUIRE_LEADER_HEADER``): a
member that knows it has none refuses it at once with ``NoLeader`` instead of holding
it until the request timeout, and since that refusal comes before the request is
proposed, a write refused so is resent on the next member like a read. etcd also ends
a watch stream whose member has been without a leader for three election timeouts:
the watch fails with ``EtcdUnavailable`` and its owner starts it again, instead of
waiting on a stream that no longer moves. A member that still believes in a leader
that has just died is no help: it forwards a write to that leader and holds it until
the request timeout (``EtcdTimeout``, in doubt), as before.

Watches go over the gateway's watch stream with the project's own line reader
(``yurtcoord.etcd.watch``; txaioetcd's watch receiver loses JSON split across reads).
Not offered: leases (txaioetcd's ``Lease`` methods post with treq to ``/v3alpha`` directly).
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from twisted.internet import defer
from twisted.internet.interfaces import IHostnameResolver, IReactorTime
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse

from yurtcoord.etcd.errors import BadResponse, EtcdError, TransactionFailed
from yurtcoord.etcd.transport import (
    GATEWAY_PREFIXES,
    MAX_RESPONSE_BYTES,
    PARSE_ERRORS,
    REQUIRE_LEADER_HEADER,
    EtcdConfig,
    Transport,
    error_text,
    grpc_error,
    parse_answer,
    read_response,
)
from yurtcoord.etcd.txaioetcd_private import (
    GatewayClient,
    marshal_range_request,
    parse_key_value,
    parse_status,
    txaioetcd,
)
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.inflight import cancellable_sleep

__all__ = ["EtcdConfig", "EtcdClient", "RangePage", "TransactionResult", "prefix_range_end",
           "prefix_keyset", "REQUIRE_LEADER_HEADER", "GATEWAY_PREFIXES", "MAX_RESPONSE_BYTES"]


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
        self._transport = Transport(reactor, config, name_resolver, loop_errors)
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
        return d.addCallback(parse_answer)

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
                return read_response(response, 64 * 1024, "/watch").addCallback(
                    parse_answer).addCallback(
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

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def post(self, path: str, data: dict[str, Any],
             timeout: Optional[float]) -> "Deferred[dict[str, Any]]":
        d = self._transport.post(path, data, timeout, idempotent=False)
        return d.addCallback(parse_answer)

    def post_body(self, path: str, body: bytes,
                  timeout: Optional[float]) -> "Deferred[dict[str, Any]]":
        d = self._transport.post_body(path, body, timeout, idempotent=False)
        return d.addCallback(parse_answer)


def _require_bytes(**values: object) -> None:
    for name, value in values.items():
        if not isinstance(value, bytes):
            raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def _guard_parse(parse: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    def guarded(obj: dict[str, Any]) -> Any:
        try:
            return parse(obj)
        except PARSE_ERRORS as e:
            raise BadResponse(f"unexpected etcd answer shape: {type(e).__name__}: "
                              f"{error_text(str(e))}") from e

    return guarded


def _guarded(d: "Deferred[Any]") -> "Deferred[Any]":
    """Turn txaioetcd's own parsing failures (on a malformed answer) into BadResponse."""

    def translate(failure: Failure) -> Failure:
        if failure.check(EtcdError, txaioetcd.Failed):
            return failure
        if failure.check(txaioetcd.Error):
            err: txaioetcd.Error = failure.value
            raise grpc_error(200, {"code": err.code, "message": err.message or ""})
        if failure.type is Exception or failure.check(*PARSE_ERRORS):
            raise BadResponse(f"unexpected etcd answer shape: {type(failure.value).__name__}: "
                              f"{error_text(failure.getErrorMessage())}")
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
    except PARSE_ERRORS as e:
        raise BadResponse(f"unexpected etcd range answer: {type(e).__name__}: "
                          f"{error_text(str(e))}") from e
