"""A Kubernetes API client on Twisted's HTTP client: CRUD and watch for any resource,
objects as dicts.

One ``KubeClient`` per apiserver. It owns a persistent ``HTTPConnectionPool`` sized
for concurrency (Twisted's default allows only two connections per host), so many
requests and long-running watches to the same server do not queue behind each other.

Reads (GET and HEAD) go straight to Twisted's ``Agent``, follow redirects and accept
gzip answers, decoded, as client-go's HTTP transport does; writes go to a connection of
the same pool directly, the server's URL parsed and its Host header made once (a write
is never redirected, and its answer is one object). No
general-purpose request layer sits between: the pool leader forwards a thousand
heartbeats a second through this client, and URL re-parsing, IDNA checks, a cookie
jar and a cooperator round trip per body cost it more than the request itself. The
server URL is converted to a request target once (IDNA host included); paths and
queries, built here from quoted names, are percent-encoded where needed.

Errors are the typed exceptions of ``yurtcoord.kube.errors``:
- an answer with an error code → the type its HTTP code and ``Status`` reason name
  (``error_for_response``), whatever the body holds: no Status, a Status with fields
  of the wrong type, bytes that are not JSON or not UTF-8, nesting too deep to parse;
- 5xx without a Status, or a successful answer that is not a JSON object → ``ServerError``;
- refused, reset or unreachable, TLS handshake failures → ``ConnectionFailed``;
- no complete answer within ``timeout`` → ``Timeout`` (the connection is aborted);
- an answer body, or one line of a watch, longer than ``MAX_RESPONSE_BYTES`` (16 MiB,
  ``ClientConfig.max_response_bytes``) → ``ResponseTooLarge``: the connection is
  dropped at that point, so a peer that never ends an answer costs at most that much
  memory.

Watches: ``watch()`` returns a ``Watch`` at once. Its ``done`` Deferred fires with
None when the server ends the stream or the watch is cancelled with ``cancel()``,
and fails with the typed error otherwise (``Gone`` for an ERROR event with code 410,
``ConnectionFailed`` when the connection is cut). ``done`` fires only after the
connection is closed, so nothing is left open once it has fired. The ``timeout``
bounds the wait for the response headers of a watch, not the stream itself;
``idle_timeout`` ends a stream on which nothing arrived for that long (``Timeout``).
``close()`` cancels running watches and requests and closes pooled connections.

``name_resolver``, when given, resolves the server's host name instead of the
reactor's resolver (``yurtcoord.tx.resolver.RememberingResolver`` keeps a coordinator
apiserver reachable while DNS fails); an IP address is connected to directly either way.

``insecure`` allows plain http and skips server verification on https (testing
only). Construction fails with ``TLSConfigError`` when CA, certificate or key
files do not load; later changes that do not load are logged and ignored.

Credentials: the bearer token (``token`` or ``token_file``, re-read when the file
changes) goes into the Authorization header and is never logged. TLS material is
re-read when its files change; see ``yurtcoord.kube.tls``.
"""

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional
from urllib.parse import quote, urlencode, urlsplit

from hyperlink import EncodedURL
from twisted.internet import defer
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import (
    HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS,
)
from twisted.internet.interfaces import IHostnameResolver, IReactorTime, IStreamClientEndpoint
from twisted.internet.error import ConnectError, ConnectionLost, DNSLookupError
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent, ContentDecoderAgent, GzipDecoder, RedirectAgent, RequestTransmissionFailed,
    ResponseFailed, ResponseNeverReceived,
)
from twisted.web.client import URI
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IResponse
from zope.interface import implementer

from yurtcoord.tx import httpbody
from yurtcoord.tx.failures import describe_failure, is_cancellation
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.resolver import ResolverReactor
from yurtcoord.tx.tlsreload import ReloadingTLSPolicy
from yurtcoord.tx.twisted_private import (
    ChunkedBodyBatcher, QuietHTTPConnectionPool, Request, batch_chunked_body,
)
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.errors import (
    ConnectionFailed, KubeError, ResponseTooLarge, ServerError, Timeout, decode_json,
    error_for_response,
)
from yurtcoord.kube.interfaces import IListWatchClient, IObjectClient
from yurtcoord.kube.kubeconfig import load_kubeconfig
from yurtcoord.kube.tls import tls_policy
from yurtcoord.kube.watch import IdleWatchdog, WatchStreamProtocol

DEFAULT_MAX_CONNECTIONS_PER_HOST = 16
# Bytes of one answer body, and of one watch line (one event), read at most: far above
# the largest object etcd stores (1.5 MiB by default) and a list page of them, far
# below what would hurt an edge node. Past it: ResponseTooLarge, the connection dropped.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# What a request target's path and query keep as they are: RFC 3986's reserved and
# unreserved characters, and ``%`` of the escapes already made.
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"
# A request body as compact JSON: one encoder for every request (``json.dumps`` with
# separators of its own makes an encoder per call).
_encode_json = json.JSONEncoder(separators=(",", ":")).encode
# Whether a path and query need no escape at all (what ``quote`` keeps as it is): then
# they are sent as they are, without a pass of ``quote``.
_PLAIN_TARGET = re.compile(r"[A-Za-z0-9_.\-~!#$%&'()*+,/:;=?@\[\]]*").fullmatch


@dataclass
class ClientConfig:
    """Where an apiserver is and how to authenticate to it.

    ``ca_data``/``cert_data``/``key_data`` are inline PEM (from a kubeconfig); the
    ``*_file`` fields are paths, re-read when they change on disk.
    """

    server: str
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    token: Optional[str] = field(default=None, repr=False)
    token_file: Optional[str] = None
    insecure: bool = False
    timeout: float = 10.0
    ca_data: Optional[bytes] = field(default=None, repr=False)
    cert_data: Optional[bytes] = field(default=None, repr=False)
    key_data: Optional[bytes] = field(default=None, repr=False)
    max_connections_per_host: int = DEFAULT_MAX_CONNECTIONS_PER_HOST
    user_agent: str = "yurtcoord"
    max_response_bytes: int = MAX_RESPONSE_BYTES

    @classmethod
    def from_kubeconfig(cls, path: str, context: Optional[str] = None,
                        allow_insecure: bool = True, **overrides: Any) -> "ClientConfig":
        """Server, CA, client certificate and token of the kubeconfig's current context;
        ``allow_insecure`` as ``load_kubeconfig`` takes it."""
        creds = load_kubeconfig(path, context, allow_insecure=allow_insecure)
        values: dict[str, Any] = dict(
            server=creds.server, ca_file=creds.ca_file, ca_data=creds.ca_data,
            cert_file=creds.cert_file, cert_data=creds.cert_data,
            key_file=creds.key_file, key_data=creds.key_data,
            token=creds.token, token_file=creds.token_file, insecure=creds.insecure,
        )
        values.update(overrides)
        return cls(**values)


@implementer(IStreamClientEndpoint)
class _ServerEndpoint:
    """The endpoint of one server, made anew for each connection as the ``Agent`` makes
    it (TLS material reloaded since applies to the next connection)."""

    def __init__(self, uri: URI, endpoints: "_EndpointFactory") -> None:
        self._uri = uri
        self._endpoints = endpoints

    def connect(self, protocolFactory: Any) -> "defer.Deferred[Any]":
        return self._endpoints.endpointForURI(self._uri).connect(protocolFactory)


class _WriteRoute:
    """Where a write goes, as the ``Agent`` would take it from the server's URL: the
    connection pool's key, the endpoint, the Host header and the path before the API's."""

    def __init__(self, uri: URI, endpoints: "_EndpointFactory") -> None:
        self.key = (uri.scheme, uri.host, uri.port)
        self.endpoint = _ServerEndpoint(uri, endpoints)
        default_port = (uri.scheme, uri.port) in ((b"http", 80), (b"https", 443))
        self.host = uri.host if default_port else b"%b:%d" % (uri.host, uri.port)
        # The server URL's own path ("" or "/prefix": it never ends with "/").
        self.path = uri.path.rstrip(b"/")


@implementer(IAgentEndpointFactory)
class _EndpointFactory:
    """TCP (and TLS for https) endpoints for the Agent. An IP address is connected
    to directly: ``HostnameEndpoint`` reports a refused connection only after its
    0.3 s attempt delay, which would slow every reconnect to a server that is down.
    A host name is resolved by ``name_resolver`` when given, else by the reactor's."""

    def __init__(self, reactor: IReactorTime, tls_policy: Optional[ReloadingTLSPolicy],
                 connect_timeout: float,
                 name_resolver: Optional[IHostnameResolver] = None) -> None:
        self._reactor = reactor
        self._tls_policy = tls_policy
        self._timeout = connect_timeout
        # What HostnameEndpoint takes its resolver from.
        self._resolving_reactor: Any = (
            reactor if name_resolver is None else ResolverReactor(reactor, name_resolver))

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        host = uri.host.decode("ascii")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        endpoint: IStreamClientEndpoint
        if isIPAddress(host):
            endpoint = TCP4ClientEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
        else:
            endpoint = HostnameEndpoint(self._resolving_reactor, host, uri.port,
                                        timeout=self._timeout)
        if uri.scheme == b"https":
            if self._tls_policy is None:
                raise ValueError(f"https URL {uri.toBytes()!r} on a client without TLS")
            return wrapClientTLS(self._tls_policy.creatorForNetloc(uri.host, uri.port), endpoint)
        return endpoint


class _BearerToken:
    """The token header value; a token file is re-read when its mtime changes."""

    def __init__(self, token: Optional[str] = None, token_file: Optional[str] = None) -> None:
        self._token = token.strip() if token else None
        self._file = token_file or None
        self._stamp: Optional[tuple[int, int]] = None
        self._value: Optional[str] = None

    def header(self) -> Optional[bytes]:
        if self._file:
            try:
                st = os.stat(self._file)
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self._stamp:
                    with open(self._file, "r", encoding="utf-8") as f:
                        self._value = f.read().strip() or None
                    self._stamp = stamp
            except OSError:
                # Keep the last token read; the server's 401 reports the problem.
                self._stamp = None
            token = self._value or self._token
        else:
            token = self._token
        return f"Bearer {token}".encode("ascii") if token else None


def _connection_error(failure: Failure, url: str) -> Optional[ConnectionFailed]:
    """The typed error for a transport-level failure, or None if it is not one."""
    if failure.check(ConnectError, DNSLookupError, ConnectionLost):
        return ConnectionFailed(f"cannot reach {url}: {failure.getErrorMessage()}")
    if failure.check(ResponseNeverReceived, ResponseFailed, RequestTransmissionFailed):
        detail = describe_failure(failure)
        return ConnectionFailed(f"connection to {url} failed: {detail}")
    return None


def _decode_json(body: bytes, url: str) -> dict[str, Any]:
    """A successful answer: every object the API returns is a JSON object."""
    try:
        obj = decode_json(body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        snippet = body[:120].decode("utf-8", "replace")
        raise ServerError(f"not JSON from {url}: {snippet!r}")
    return obj


def read_body(response: IResponse, limit: int, url: str) -> "defer.Deferred[bytes]":
    """The whole body of ``response``, at most ``limit`` bytes (past that,
    ``ResponseTooLarge`` and the connection is dropped); cancellable (drops it too)."""
    return httpbody.read_body(response, limit, lambda limit: ResponseTooLarge(
        f"answer from {url} longer than {limit} bytes, connection dropped"))


class Watch:
    """A running watch. ``done`` fires once the connection is closed (see module doc)."""

    def __init__(self, url: str, on_close: Callable[["Watch"], object]) -> None:
        self.url = url
        self.done: defer.Deferred[None] = defer.Deferred()
        self.cancelled = False
        self._request: Optional[defer.Deferred[Any]] = None
        self._stream: Optional[WatchStreamProtocol] = None
        self._body_batcher: Optional[ChunkedBodyBatcher] = None
        self._on_close = on_close

    @property
    def events(self) -> int:
        """How many events were delivered so far."""
        return self._stream.events if self._stream is not None else 0

    def cancel(self) -> None:
        """Close the connection; ``done`` then fires with None."""
        if self.done.called or self.cancelled:
            return
        self.cancelled = True
        if self._stream is not None:
            self._stream.cancel()
        elif self._request is not None:
            self._request.cancel()

    def _finish(self, result: object) -> None:
        if self.done.called:
            return
        self._on_close(self)
        if isinstance(result, Failure):
            if self.cancelled and is_cancellation(result):
                self.done.callback(None)
            else:
                self.done.errback(result)
        else:
            self.done.callback(None)


@implementer(IObjectClient, IListWatchClient)
class KubeClient:
    """get / list / create / update / delete / watch against one apiserver.

    ``loop_errors`` counts the unexpected errors of the idle check of every watch
    with an ``idle_timeout`` (loop ``watch-idle``, the agent's metrics); without it
    they are only logged.
    """

    def __init__(self, reactor: IReactorTime, config: ClientConfig,
                 pool: Optional[QuietHTTPConnectionPool] = None,
                 name_resolver: Optional[IHostnameResolver] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        parts = urlsplit(config.server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"apiserver URL must be http(s)://host[:port], got {config.server!r}")
        if parts.scheme == "http" and not config.insecure:
            raise ValueError(f"plain http to {config.server} needs insecure = true")
        self.reactor = reactor
        self.config = config
        self.loop_errors = loop_errors
        self.server = config.server.rstrip("/")
        self.timeout = config.timeout
        if pool is None:
            pool = QuietHTTPConnectionPool(reactor, persistent=True)
            pool.maxPersistentPerHost = config.max_connections_per_host
            pool.cachedConnectionTimeout = 90
        self.pool = pool
        self.tls: Optional[ReloadingTLSPolicy] = None
        if parts.scheme == "https":
            self.tls = tls_policy(
                ca_file=config.ca_file, ca_data=config.ca_data,
                cert_file=config.cert_file, cert_data=config.cert_data,
                key_file=config.key_file, key_data=config.key_data,
                insecure=config.insecure, name=f"apiserver {self.server}",
            )
        endpoints = _EndpointFactory(reactor, self.tls, config.timeout, name_resolver)
        self._agent: IAgent = ContentDecoderAgent(
            RedirectAgent(Agent.usingEndpointFactory(reactor, endpoints, pool)),
            [(b"gzip", GzipDecoder)])
        # The headers of each kind of request, made once per bearer token (the Agent
        # copies them before it adds its own).
        self._made_headers: dict[tuple[bool, Optional[bytes], Optional[bytes]], Headers] = {}
        self._server_target = EncodedURL.from_text(self.server).to_uri().to_text().encode("ascii")
        self._writes = _WriteRoute(URI.fromBytes(self._server_target), endpoints)
        self._user_agent = config.user_agent.encode()
        self._token = _BearerToken(config.token, config.token_file)
        self._watches: set[Watch] = set()
        self._requests = InFlight()
        self._closed = False

    # -- plumbing ---------------------------------------------------------

    def _url(self, path: str, params: Optional[dict[str, Any]] = None) -> str:
        if params:
            query = urlencode([(k, v) for k, v in params.items() if v is not None])
            if query:
                return f"{self.server}{path}?{query}"
        return f"{self.server}{path}"

    def _target(self, url: str) -> bytes:
        """The request target of ``url`` (one ``_url`` made): the server's, converted
        once, and the path and query percent-encoded where they need it."""
        return self._server_target + self._path_and_query(url)

    def _path_and_query(self, url: str) -> bytes:
        """What ``url`` (one ``_url`` made) adds to the server's URL, percent-encoded
        where it needs it."""
        rest = url[len(self.server):]
        if _PLAIN_TARGET(rest) is None:
            rest = quote(rest, safe=_TARGET_SAFE)
        return rest.encode("ascii")

    def _headers(self, has_body: bool = False, host: Optional[bytes] = None) -> Headers:
        """The request headers, the same object for every request of a kind while the
        bearer token stays the same: nothing that sends them changes them. ``host``:
        the Host header, for a request that goes to a connection without the Agent."""
        auth = self._token.header()
        made = self._made_headers.get((has_body, host, auth))
        if made is None:
            if len(self._made_headers) >= 8:
                self._made_headers.clear()  # tokens gone by
            made = self._made_headers[(has_body, host, auth)] = self._new_headers(
                has_body, host, auth)
        return made

    def _new_headers(self, has_body: bool, host: Optional[bytes],
                     auth: Optional[bytes]) -> Headers:
        headers = Headers()
        if host is not None:
            headers.setRawHeaders(b"Host", [host])
        headers.setRawHeaders(b"Accept", [b"application/json"])
        headers.setRawHeaders(b"User-Agent", [self._user_agent])
        if has_body:
            headers.setRawHeaders(b"Content-Type", [b"application/json"])
        if auth:
            headers.setRawHeaders(b"Authorization", [auth])
        return headers

    def _start(self, method: str, url: str, body: Any = None) -> "defer.Deferred[Any]":
        if self._closed:
            return defer.fail(ConnectionFailed(f"client for {self.server} is closed"))
        producer = None
        if body is not None:
            producer = httpbody.BytesBody(_encode_json(body).encode())
        if method in ("GET", "HEAD"):
            return self._agent.request(method.encode("ascii"), self._target(url),
                                       self._headers(producer is not None), producer)
        return self._write(method.encode("ascii"), url, producer)

    def _write(self, method: bytes, url: str,
               producer: Optional[httpbody.BytesBody]) -> "defer.Deferred[Any]":
        """A write, handed to a pooled connection of the server as the ``Agent`` would
        (the same pool key, endpoint and Host header), but with the server's URL parsed
        and its Host header made once: a write is never redirected, and the apiserver
        compresses only answers far larger than one written object's. The pool leader
        sends a thousand lease updates a second through here."""
        route = self._writes
        path = route.path + self._path_and_query(url)
        headers = self._headers(producer is not None, route.host)
        persistent = self.pool.persistent
        connected = self.pool.getConnection(route.key, route.endpoint)
        return connected.addCallback(
            lambda connection: connection.request(
                Request(method, path, headers, producer, persistent=persistent)))

    def _arm_timeout(self, d: "defer.Deferred[Any]", url: str, what: str) -> "defer.Deferred[Any]":
        """Fail ``d`` with Timeout (aborting its connection) after the client timeout."""

        def timed_out(result: object, timeout: float) -> object:
            if isinstance(result, Failure) and is_cancellation(result):
                raise Timeout(f"no complete answer to {what} {url} within {timeout}s")
            return result

        return d.addTimeout(self.timeout, self.reactor, onTimeoutCancel=timed_out)

    def request(self, method: str, path: str, params: Optional[dict[str, Any]] = None,
                body: Any = None, allow_empty: bool = False) -> "defer.Deferred[Any]":
        """One API call; the decoded JSON answer (None for an empty body if allowed)."""
        url = self._url(path, params)
        d = self._start(method, url, body)

        def got_response(response: IResponse) -> "defer.Deferred[tuple[int, bytes]]":
            return read_body(response, self.config.max_response_bytes, url).addCallback(
                lambda raw: (response.code, raw))

        def got_body(result: tuple[int, bytes]) -> Optional[dict[str, Any]]:
            code, raw = result
            if code >= 300:
                raise error_for_response(code, raw, url)
            if not raw.strip():
                if allow_empty:
                    return None
                raise ServerError(f"not JSON from {url}: empty body", code=code)
            return _decode_json(raw, url)

        d.addCallback(got_response)
        self._arm_timeout(d, url, method)
        d.addCallback(got_body)
        d.addErrback(self._map_failure, url)
        return self._requests.track(d)

    def _map_failure(self, failure: Failure, url: str) -> Failure:
        if failure.check(KubeError):
            return failure
        if is_cancellation(failure):
            if self._closed:
                return Failure(ConnectionFailed(f"client closed during the request to {url}"))
            # Cancelled by the caller (a timeout has already become Timeout).
            return Failure(defer.CancelledError(f"request to {url} cancelled"))
        error = _connection_error(failure, url)
        if error is not None:
            return Failure(error)
        return failure

    # -- the API ----------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: Optional[str] = None) -> "defer.Deferred[Any]":
        return self.request("GET", gvr.object_path(name, namespace))

    def list(self, gvr: GroupVersionResource, namespace: Optional[str] = None,
             label_selector: Optional[str] = None, field_selector: Optional[str] = None,
             resource_version: Optional[str] = None, limit: Optional[int] = None,
             continue_token: Optional[str] = None) -> "defer.Deferred[Any]":
        params = {
            "labelSelector": label_selector, "fieldSelector": field_selector,
            "resourceVersion": resource_version, "limit": limit, "continue": continue_token,
        }
        return self.request("GET", gvr.collection_path(namespace), params)

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: Optional[str] = None) -> "defer.Deferred[Any]":
        namespace = namespace or (obj.get("metadata") or {}).get("namespace")
        return self.request("POST", gvr.collection_path(namespace if gvr.namespaced else None),
                            body=obj)

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: Optional[str] = None) -> "defer.Deferred[Any]":
        meta = obj.get("metadata") or {}
        namespace = namespace or meta.get("namespace")
        return self.request("PUT", gvr.object_path(meta["name"], namespace), body=obj)

    def delete(self, gvr: GroupVersionResource, name: str,
               namespace: Optional[str] = None) -> "defer.Deferred[Any]":
        return self.request("DELETE", gvr.object_path(name, namespace), allow_empty=True)

    def watch(self, gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
              namespace: Optional[str] = None, resource_version: Optional[str] = None,
              label_selector: Optional[str] = None, field_selector: Optional[str] = None,
              allow_bookmarks: bool = True, timeout_seconds: Optional[int] = None,
              idle_timeout: Optional[float] = None) -> Watch:
        """Start a watch; ``on_event(type, obj)`` for ADDED/MODIFIED/DELETED/BOOKMARK.

        ``timeout_seconds`` asks the server to end the stream after that long;
        ``idle_timeout`` ends it here with ``Timeout`` (closing the connection) when
        nothing arrived for that long, which detects a silently dead connection.
        """
        params = {
            "watch": "1", "resourceVersion": resource_version,
            "labelSelector": label_selector, "fieldSelector": field_selector,
            "allowWatchBookmarks": "true" if allow_bookmarks else None,
            "timeoutSeconds": timeout_seconds,
        }
        url = self._url(gvr.collection_path(namespace), params)
        watch = Watch(url, self._watches.discard)
        self._watches.add(watch)
        d = self._start("GET", url)

        def failed(failure: Failure) -> None:
            if watch.cancelled and is_cancellation(failure):
                watch._finish(None)
            else:
                watch._finish(self._map_failure(failure, url))

        def got_response(response: IResponse) -> None:
            watch._request = None
            if response.code != 200:
                body_d = read_body(response, self.config.max_response_bytes, url)
                watch._request = body_d
                body_d.addCallback(lambda raw: Failure(error_for_response(response.code, raw, url)))
                body_d.addErrback(failed)
                return None
            stream = WatchStreamProtocol(on_event, url, clock=self.reactor if idle_timeout else None,
                                         max_line=self.config.max_response_bytes)
            watch._stream = stream
            # Events of one read arrive together instead of one call per chunk.
            watch._body_batcher = batch_chunked_body(response)
            response.deliverBody(stream)
            if idle_timeout:
                watchdog = IdleWatchdog(self.reactor, idle_timeout, stream, self.loop_errors)
                def stop_watchdog(result: object) -> object:
                    watchdog.stop()
                    return result

                stream.finished.addBoth(stop_watchdog)
            if watch.cancelled:
                stream.cancel()
            stream.finished.addBoth(watch._finish)
            return None

        watch._request = d
        self._arm_timeout(d, url, "WATCH")
        d.addCallbacks(got_response, failed)
        return watch

    def drop_connections(self) -> "defer.Deferred[Any]":
        """Close idle pooled connections, so the next requests reconnect (new certs)."""
        return self.pool.closeCachedConnections()

    @defer.inlineCallbacks
    def close(self) -> Generator["defer.Deferred[Any]", Any, None]:
        """Cancel running watches and requests (they fail with ConnectionFailed) and
        close every pooled connection. Requests made afterwards fail at once."""
        self._closed = True
        self._requests.cancel_all()
        watches = list(self._watches)
        for watch in watches:
            watch.cancel()
        yield defer.DeferredList([w.done for w in watches], consumeErrors=True)
        yield self.pool.closeCachedConnections()
