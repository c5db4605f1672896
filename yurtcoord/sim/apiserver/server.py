"""KubeAPIServer: the store, the HTTP resource and the fault knobs put
together on a real listening socket (plain HTTP, or TLS that requires a
client certificate signed by the server's CA)."""

import os
import weakref
from typing import IO, Any, Callable, Generator

from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import (
    IDelayedCall, IListeningPort, IOpenSSLContextFactory, IProtocolNegotiationFactory)
from twisted.internet.protocol import connectionDone

from twisted.logger import Logger
from twisted.protocols import policies
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.server import Request, Site

from zope.interface import implementer

from yurtcoord.sim.apiserver.authz import IAuthorizer, User
from yurtcoord.sim.apiserver.catalog import Catalog
from yurtcoord.sim.apiserver.faults import FaultInjector
from yurtcoord.sim.apiserver.pages import ListPages
from yurtcoord.sim.apiserver.requestlog import (
    REQUEST_LOG_LIMIT, LoggedRequest, json_line, logged_request)
from yurtcoord.sim.apiserver.resource import KubeAPIResource
from yurtcoord.sim.apiserver.storage import IObjectStorage, MemoryStorage
from yurtcoord.sim.apiserver.store import ObjectStore


class _TrackedConnection(policies.ProtocolWrapper):
    """Lets the wrapped HTTP channel clean up before the connection is forgotten."""

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        try:
            self.wrappedProtocol.connectionLost(reason)
        finally:
            self.factory.unregisterProtocol(self)


@implementer(IProtocolNegotiationFactory)
class _ConnectionTracker(policies.WrappingFactory):
    """Knows every open connection so that stop() and down() can drop them.

    Passes the site's ALPN protocols through: without them TLS clients that
    offer ALPN (curl, Go, Python) get an internal-error alert."""

    protocol = _TrackedConnection

    def __init__(self, wrapped: Site) -> None:
        super().__init__(wrapped)
        self._idle_waiters: list[defer.Deferred[None]] = []

    def acceptableProtocols(self) -> list[bytes]:
        return self.wrappedFactory.acceptableProtocols()

    def unregisterProtocol(self, p: policies.ProtocolWrapper) -> None:
        super().unregisterProtocol(p)
        if not self.protocols:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                waiter.callback(None)

    def drop_all(self) -> defer.Deferred[None]:
        """Abort every connection; the Deferred fires once all are gone."""
        if not self.protocols:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._idle_waiters.append(waiter)
        for protocol in list(self.protocols):
            if protocol.transport is not None:
                protocol.transport.abortConnection()
        return waiter


def subject_of(x509: Any) -> str:
    """RFC 4514 subject of a pyOpenSSL certificate, e.g. ``CN=a,O=b``."""
    return x509.to_cryptography().subject.rfc4514_string()


def user_of(x509: Any) -> User | None:
    """The user a pyOpenSSL client certificate authenticates (see ``authz.User``)."""
    subject = x509.to_cryptography().subject
    return User.from_subject(
        [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)],
        [str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)])


@implementer(IOpenSSLContextFactory)
class ClientCertTLSContext:
    """Server TLS (1.2+) that requires a client certificate signed by the CA.

    Built from the PEM files directly so that no pyOpenSSL certificate objects
    are handed around (deprecated); clients that offer ALPN get no protocol
    selected and speak HTTP/1.1.
    """

    def __init__(self, ca_file: str, cert_file: str, key_file: str) -> None:
        context = SSL.Context(SSL.TLS_SERVER_METHOD)
        context.set_min_proto_version(SSL.TLS1_2_VERSION)
        context.use_certificate_chain_file(cert_file)
        context.use_privatekey_file(key_file)
        context.check_privatekey()
        context.load_verify_locations(ca_file)
        context.load_client_ca(ca_file.encode())
        context.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT)
        # OpenSSL needs a session id context to resume sessions of verified clients.
        context.set_session_id(b"yurtcoord-test-apiserver")
        self._context = context

    def getContext(self) -> SSL.Context:
        return self._context


def tls_options(tls_dir: str) -> ClientCertTLSContext:
    """Server TLS from ``tls_dir`` (created with a throwaway CA if absent)
    that requires a client certificate signed by ``tls_dir/ca.crt``."""
    ca_file = os.path.join(tls_dir, "ca.crt")
    cert_file = os.path.join(tls_dir, "server.crt")
    key_file = os.path.join(tls_dir, "server.key")
    if not all(os.path.exists(p) for p in (ca_file, cert_file, key_file)):
        # The CA key lives only in memory, so issue a client pair now
        # (client.crt/client.key, CN=admin, O=system:masters) for later use.
        from yurtcoord.sim.pki import TestCA
        ca = TestCA(tls_dir)
        ca.server_pair("server")
        ca.client_pair("client", "admin", ["system:masters"])
    return ClientCertTLSContext(ca_file, cert_file, key_file)


class _APISite(Site):
    """Writes one debug event per answered request instead of an access log."""

    _access = Logger()

    def log(self, request: http.Request) -> None:
        self._access.debug("apiserver {method} {uri} -> {code}",
                           method=request.method.decode(), code=request.code,
                           uri=request.uri.decode("utf-8", "replace"))


class KubeAPIServer:
    """A Kubernetes API server for tests.

    ``start(port, interface)`` fires with the base URL (also ``url``,
    ``port_number``); ``stop()`` closes the port and every connection.
    ``storage`` is where the objects live (an ``IObjectStorage``: in memory by
    default, or the one given, e.g. an ``EtcdStorage``); ``store`` is the in-memory
    ObjectStore behind the default storage, for tests that write and read
    synchronously (direct writes emit watch events like HTTP writes); ``faults`` the FaultInjector; ``requests`` lists (method, path,
    query) of every request, ``answers`` (at, method, path, code) of every answer
    sent in full (reactor time, in the order they finished; a request left
    unanswered or whose connection broke has none), ``request_log`` the same
    answers as ``LoggedRequest`` records with the client's address, the query
    and, for Lease writes, the lease as answered (the newest ``request_log_limit`` of them, a tenth
    more between trims; ``request_log_dropped`` counts the older ones let go; with
    ``request_log_path`` each is also appended to that file as a JSON line, none
    dropped), and
    ``client_subjects`` the
    RFC 4514 subjects of TLS client certificates, in order. With ``authorizer`` (an
    ``authz.IAuthorizer``, e.g. ``PoolCoordinatorAuthorizer()``) every request must
    come with a client certificate (plain HTTP is answered 401) and is served only if
    the authorizer allows it for the certificate's user, refused before any object is
    read; each logged record names that user (``LoggedRequest.user``), with or
    without an authorizer. ``history`` bounds the
    watch replay window; ``bookmark_interval`` is the seconds between BOOKMARK
    events on watches that allow them. With ``store`` (another server's ``store``)
    both servers serve that one store, as two apiservers serve one etcd: a write
    through either is seen, and watched, through both, with the same
    resourceVersions; each keeps its own port, faults and logs.
    """

    log = Logger()

    def __init__(self, reactor: Any, tls_dir: str | None = None, history: int = 1000,
                 bookmark_interval: float = 1.0, catalog: Catalog | None = None,
                 request_log_path: str | None = None,
                 storage: IObjectStorage | None = None,
                 authorizer: IAuthorizer | None = None) -> None:
        self.reactor = reactor
        self.tls_dir = tls_dir
        self.authorizer = authorizer
        self._store: ObjectStore | None = None
        if storage is None:
            self.catalog = catalog or Catalog()
            self._store = ObjectStore(self.catalog, reactor, history)
            storage = MemoryStorage(self._store)
        else:
            self.catalog = storage.catalog
            if isinstance(storage, MemoryStorage):
                # Several servers over one in-memory store (replicas of one apiserver)
                # keep the synchronous accessors of that store.
                self._store = storage.store
        self.storage: IObjectStorage = storage
        self.faults = FaultInjector(self)
        self.list_pages = ListPages(storage)
        self.bookmark_interval = bookmark_interval
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.answers: list[tuple[float, str, str, int]] = []
        self.request_log: list[LoggedRequest] = []
        self.request_log_limit = REQUEST_LOG_LIMIT
        self.request_log_dropped = 0
        self.request_log_path = request_log_path
        self._request_log_file: IO[str] | None = None
        self.client_subjects: list[str] = []
        self.port_number: int | None = None
        self.url: str | None = None
        self._interface = "127.0.0.1"
        self._port: IListeningPort | None = None
        self._port_closing: defer.Deferred[Any] | None = None
        self._tls_options: ClientCertTLSContext | None = None
        self._watches: set[Any] = set()
        self._delayed: set[IDelayedCall] = set()
        # The JSON object answered to a request still being sent, for request_log.
        self._answered_bodies: weakref.WeakKeyDictionary[Request, Any] = (
            weakref.WeakKeyDictionary())
        # The user of each connection's client certificate, read once per connection.
        self._users: weakref.WeakKeyDictionary[Any, User | None] = weakref.WeakKeyDictionary()
        site = _APISite(KubeAPIResource(self), reactor=reactor, parsePOSTFormSubmission=False)
        site.displayTracebacks = False
        site.noisy = False
        self._site = site
        self._connections = _ConnectionTracker(site)
        self._connections.noisy = False

    @property
    def store(self) -> ObjectStore:
        """The in-memory store, for tests that write and read synchronously."""
        if self._store is None:
            raise AttributeError(
                "this API server keeps its objects in etcd and has no synchronous store: "
                "use server.storage (every call answers with a Deferred)")
        return self._store

    # -- lifecycle -----------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self._interface}:{self.port_number}"

    def _listen(self, port: int | None) -> IListeningPort:
        if self.tls_dir is not None:
            if self._tls_options is None:
                self._tls_options = tls_options(self.tls_dir)
            return self.reactor.listenSSL(port, self._connections, self._tls_options,
                                          interface=self._interface)
        return self.reactor.listenTCP(port, self._connections, interface=self._interface)

    def start(self, port: int = 0, interface: str = "127.0.0.1") -> defer.Deferred[str]:
        """Listen; the Deferred fires with the base URL."""
        self._interface = interface
        try:
            self._port = self._listen(port)
        except Exception:
            return defer.fail()
        address = self._port.getHost()
        assert isinstance(address, (IPv4Address, IPv6Address))
        self.port_number = address.port
        scheme = "https" if self.tls_dir is not None else "http"
        host = f"[{interface}]" if ":" in interface else interface
        url = self.url = f"{scheme}://{host}:{self.port_number}"
        self.log.info("apiserver listening url={url}", url=url)
        return defer.succeed(url)

    @defer.inlineCallbacks
    def stop(self) -> Generator[defer.Deferred[Any], Any, None]:
        """Close the listening port and every open connection, watches included."""
        yield self._go_down()
        self.faults.clear()
        yield self.storage.close()
        if self._request_log_file is not None:
            log_file, self._request_log_file = self._request_log_file, None
            log_file.close()

    def _stop_listening(self):
        if self._port is not None:
            port, self._port = self._port, None
            self._port_closing = defer.maybeDeferred(port.stopListening)
        if self._port_closing is None:
            return defer.succeed(None)
        closing: defer.Deferred[None] = defer.Deferred()

        def closed(result: object) -> object:
            closing.callback(None)
            return result
        self._port_closing.addBoth(closed)
        return closing

    @defer.inlineCallbacks
    def _go_down(self):
        stopped = self._stop_listening()
        for call in list(self._delayed):
            if call.active():
                call.cancel()
        self._delayed.clear()
        for stream in list(self._watches):
            stream._stop()
        yield self._connections.drop_all()
        yield stopped

    @defer.inlineCallbacks
    def _come_up(self):
        if self._port_closing is not None:
            yield self._port_closing
        if self._port is None:
            self._port = self._listen(self.port_number)

    # -- hooks used by the HTTP resource -------------------------------------

    def _note_request(self, request):
        path = request.path.decode("utf-8", "replace")
        query = {k.decode("utf-8", "replace"): v[-1].decode("utf-8", "replace")
                 for k, v in (request.args or {}).items()}
        method = request.method.decode()
        self.requests.append((method, path, query))
        raw_query = request.uri.partition(b"?")[2].decode("utf-8", "replace")
        address = request.getClientAddress()
        peer = address.host if isinstance(address, (IPv4Address, IPv6Address)) else ""
        user = self.user_of(request)

        def answered(_):
            at = self.reactor.seconds()
            self.answers.append((at, method, path, request.code))
            record = logged_request(at, peer, method, path, request.code,
                                    self._answered_bodies.pop(request, None), raw_query,
                                    user.name if user is not None else "")
            self.request_log.append(record)
            self._trim_request_log()
            self._write_request_log(record)

        def broken(_failure):
            self._answered_bodies.pop(request, None)

        request.notifyFinish().addCallbacks(answered, broken)
        if request.isSecure():
            certificate = request.channel.transport.getPeerCertificate()
            if certificate is not None:
                self.client_subjects.append(subject_of(certificate))

    def user_of(self, request: Request) -> User | None:
        """The user ``request``'s connection authenticated as with its TLS client
        certificate; None over plain HTTP or when the certificate names no user."""
        channel = request.channel
        if channel in self._users:
            return self._users[channel]
        user = None
        transport: Any = channel.transport
        if request.isSecure() and transport is not None:
            certificate = transport.getPeerCertificate()
            if certificate is not None:
                user = user_of(certificate)
        self._users[channel] = user
        return user

    def _write_request_log(self, record):
        if self.request_log_path is None:
            return
        if self._request_log_file is None:
            self._request_log_file = open(self.request_log_path, "a", encoding="utf-8")
        # Flushed per record: the file must hold every answer even if the process is
        # killed, since the checks read it after the run.
        self._request_log_file.write(json_line(record))
        self._request_log_file.flush()

    def _trim_request_log(self):
        # Trimmed a tenth at a time, so that a full log costs no copy per request.
        excess = len(self.request_log) - self.request_log_limit
        if excess >= max(1, self.request_log_limit // 10):
            del self.request_log[:excess]
            self.request_log_dropped += excess

    def _note_answer_body(self, request: Request, body: object) -> None:
        """``body`` is the JSON object being answered to ``request``."""
        self._answered_bodies[request] = body

    def _delay(self, seconds: float, function: Callable[..., object], *args: object) -> None:
        def run() -> None:
            self._delayed.discard(call)
            function(*args)
        call = self.reactor.callLater(seconds, run)
        self._delayed.add(call)

    def _watch_opened(self, stream):
        self._watches.add(stream)

    def _watch_closed(self, stream):
        self._watches.discard(stream)

    def _drop_connections(self):
        for stream in list(self._watches):
            stream._stop()
        return self._connections.drop_all()

    def _stall_watches(self):
        for stream in list(self._watches):
            stream.stall()

    def _cut_watches(self, mid_line):
        for stream in list(self._watches):
            stream.cut(mid_line)

    def _end_watches(self):
        for stream in list(self._watches):
            stream.end()

    @property
    def open_watches(self) -> int:

        """How many watch streams are open right now."""
        return len(self._watches)
