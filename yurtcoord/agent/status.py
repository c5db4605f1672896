"""The site of the agent's status pages (``yurtcoord.agent.statuspages``): the
connections a client may hold on the status port, and the access log.

The port is open to anything on the node, so it bounds what a client can hold:
at most ``MAX_STATUS_CONNECTIONS`` ordinary connections at once, and each request must
have arrived whole within ``STATUS_REQUEST_DEADLINE`` seconds of the connection
opening or of the previous answer (a connection idle or sending that slowly is
dropped), with at most ``MAX_STATUS_REQUEST_BODY`` bytes of body. A crowd of idle or
slow clients thus costs a few hundred descriptors at most (with the probe reserve
below) for a few seconds, and never the descriptors the agent needs for its own
connections.

That crowd must not starve the kubelet's readiness probe, which comes from the node
itself (``host: 127.0.0.1`` in the DaemonSet), on a new connection each time, and
gives up after one second. Past the ordinary connections are
``PROBE_RESERVE_CONNECTIONS`` more that only ``/healthz`` and ``/readyz`` may use: a
connection that finds no ordinary slot is taken on trial into the reserve and must
send its whole request within ``PROBE_REQUEST_DEADLINE``; once its request line is
read, a request for any other page is answered 503 and the connection closed, and a
probe gets its answer and the connection is closed. When the reserve is full, a new
connection pushes out the one in it that has waited longest (first those that have
sent part of a request: they have shown how slowly they send; one that has sent
nothing yet may be a probe whose bytes are not read yet). New connections are thus
never closed unread however many wait: a flood can only push its own connections out
of the reserve, and a probe, which sends its request at once, is answered before
``PROBE_RESERVE_CONNECTIONS`` others arrive behind it.

One client address holds at most ``MAX_STATUS_CONNECTIONS_PER_ADDRESS`` of the
ordinary connections (more go to the reserve), so that one remote client cannot take
them all from the others when the port listens beyond loopback. Loopback addresses
are not capped so: every client on the node (the kubelet, Prometheus on the node,
``kubectl port-forward``, curl) comes from them, and with the default ``listen`` of
``127.0.0.1`` they are the only clients, so capping loopback would cap the node's own
clients as one and protect nobody; the reserve, which looks at what is asked and not
at who asks, is what keeps the probes answered.

Requests are logged at debug level only (the pool page polls twice every two
seconds), at most ``ACCESS_LOG_LINES_PER_SECOND`` lines a second (then one line says
how many were dropped) with paths cut at ``ACCESS_LOG_PATH_CHARS``: a client flooding
the port with long paths costs a bounded amount of log, whatever ``[log] level`` is.
"""
import io
import ipaddress
import re
from collections.abc import Callable
from typing import Any, Optional

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.logger import Logger
from twisted.web import http, resource, server

from yurtcoord.tx.httpbody import drop_connection
from yurtcoord.tx.logs import LinesPerSecond, shown_path
from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.statuspages import PoolDocumentPage, status_resource
from yurtcoord.agent.statussources import IPoolView, IStatusSource

# Connections the kernel queues for the status port before the agent accepts them.
# Twisted's default of 50 overflows when a flood of clients connects at once, and the
# kernel then drops the kubelet's probe's connect, which it retries only a second
# later, past the probe's timeout; the kernel caps it at net.core.somaxconn.
STATUS_LISTEN_BACKLOG = 1024
# Ordinary status connections open at once (any page); more go to the probe reserve.
MAX_STATUS_CONNECTIONS = 64
# Ordinary connections one client address may hold; loopback addresses are not capped
# (every client on the node comes from them, the kubelet's probes included).
MAX_STATUS_CONNECTIONS_PER_ADDRESS = 16
# Connections past the ordinary ones that only ``PROBE_PATHS`` may use, counted once
# they have sent part of a request.
PROBE_RESERVE_CONNECTIONS = 16
# Connections past the ordinary ones held until their first bytes are read, so that
# a burst of new connections cannot push out a probe before it is read.
MAX_STATUS_UNREAD_CONNECTIONS = 256
# Seconds a connection in the probe reserve may take to send its whole request (the
# kubelet sends it at once and waits one second by default).
PROBE_REQUEST_DEADLINE = 1.0
# The pages a connection in the probe reserve may ask for.
PROBE_PATHS = frozenset({b"/healthz", b"/readyz"})
# Seconds a status connection may take to send one whole request, counted from when
# it opened or from the previous answer; then it is dropped.
STATUS_REQUEST_DEADLINE = 5.0
# Bytes of request body a status connection may send with one request (the pages take
# none); past it the connection is dropped. Bodies are kept in memory, never on disk.
MAX_STATUS_REQUEST_BODY = 64 * 1024



# The answer to a request for another page on a connection of the probe reserve.
_PROBES_ONLY_BODY = b"status connections at their limit: only /healthz and /readyz\n"
_PROBES_ONLY = (b"HTTP/1.1 503 Service Unavailable\r\n"
                b"Content-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: %d\r\nCache-Control: no-store\r\nRetry-After: 5\r\n"
                b"Connection: close\r\n\r\n%s" % (len(_PROBES_ONLY_BODY), _PROBES_ONLY_BODY))


# ``StatusChannel``'s answers at hand: the request line they answer, the longest
# request they take (twisted.web's bound on a request's headers) and the headers that
# send a request the ordinary way (a body, an upgraded connection; a ``Connection``
# header other than keep-alive, as browsers send).
_POOL_REQUEST_LINE = b"GET /pool HTTP/1.1\r\n"
_MAX_AT_HAND_REQUEST = 16384
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ORDINARY_WAY_HEADERS = frozenset((b"content-length", b"transfer-encoding", b"expect",
                                   b"upgrade", b"http2-settings"))


def is_probe_path(path: bytes) -> bool:
    """Whether a request target names a probe page (``/healthz`` or ``/readyz``, with
    or without a trailing slash or a query)."""
    path = path.split(b"?", 1)[0]
    if path.endswith(b"/") and len(path) > 1:
        path = path[:-1]
    return path in PROBE_PATHS


def is_loopback(host: Optional[str]) -> bool:
    """Whether a client address is the node itself over loopback (127.0.0.0/8, ::1,
    or an IPv4-mapped 127.x); an address that is no IP address (a UNIX socket) is
    local too."""
    if host is None:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class StatusChannel(http.HTTPChannel):
    """HTTP/1.1 of the status pages, with a deadline for every request.

    The deadline runs from the connection's start, and again from each answer, until
    the next request has arrived whole; then the connection is aborted. A client that
    sends nothing, or a byte now and then, holds its descriptor for
    ``site.request_deadline`` seconds at most (``site.probe_deadline`` in the probe
    reserve, ``reserved``).

    A connection of the probe reserve asks the site about its request line as soon as
    it is read (``site.request_line_read``) and is closed after its one answer.
    """

    site: "StatusSite"
    # In the probe reserve rather than in an ordinary slot.
    reserved = False
    # The client address counted against its share of ordinary slots (None: not counted).
    counted_host: Optional[str] = None
    # Some of a request not yet answered has arrived (a push-out prefers these).
    started_request = False
    # The connection's request is being answered or was (no push-out then).
    answering = False
    _deadline: Optional[IDelayedCall] = None
    _busy = False
    _lost = False
    _body_bytes = 0

    def connectionMade(self) -> None:
        super().connectionMade()
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.callLater(self._deadline_seconds(), self._too_slow)

    def _deadline_seconds(self) -> float:
        return self.site.probe_deadline if self.reserved else self.site.request_deadline

    def _disarm(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        self.site.log_dropped(self, f"no whole request within {self._deadline_seconds()}s")
        drop_connection(self.transport)

    def drop(self, why: str) -> None:
        """Abort the connection now, saying ``why`` in the (bounded) debug log."""
        self._disarm()
        self.site.log_dropped(self, why)
        drop_connection(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if (not self._busy and not self.started_request and not self.reserved
                and not self.requests and not self._buffer and self.line_mode
                and not self._dataBuffer and self.persistent and self._open()
                and self._answered_at_hand(data)):
            return
        starting = not self._busy and not self.started_request and bool(data)
        if starting:
            self.started_request = True
        super().dataReceived(data)
        # A probe that came whole is answered by now; one still arriving counts.
        if starting and self.reserved and not self.answering and self._open():
            self.site.reserve_started(self)

    def _answered_at_hand(self, data: bytes) -> bool:
        """Answer ``data`` at once, and say so, when it is one whole plain ``GET /pool``
        of HTTP/1.1 (no body, nothing pipelined behind it, no header that asks for
        more than an answer, such as ``Connection: close``) and the pool view's document is at hand: the answer's
        bytes are made once per document (``PoolDocumentPage.answer_at_hand``) and no
        twisted.web request is made. At 200 requests a second that request machinery
        was half of the agent's CPU for ``/pool``. Anything else takes the ordinary way."""
        page = self.site.pool_page
        if (page is None or len(data) > _MAX_AT_HAND_REQUEST
                or not data.startswith(_POOL_REQUEST_LINE) or not data.endswith(b"\r\n\r\n")):
            return False
        accept_encoding: Optional[bytes] = None
        for line in data[len(_POOL_REQUEST_LINE):-4].split(b"\r\n"):
            name, colon, value = line.partition(b":")
            # What twisted.web would refuse with a 400 (a bare LF, a NUL, a name that
            # is no token) it refuses on the ordinary way.
            if not colon or not _HEADER_NAME.fullmatch(name) or b"\n" in value \
                    or b"\r" in value or b"\0" in value:
                return False
            name = name.lower()
            if name in _ORDINARY_WAY_HEADERS or (name == b"accept-encoding"
                                                  and accept_encoding is not None):
                return False
            if name == b"connection" and value.strip().lower() != b"keep-alive":
                return False
            if name == b"accept-encoding":
                accept_encoding = value.strip()
        answer = page.answer_at_hand(accept_encoding)
        if answer is None:
            return False
        head, body = answer
        assert self.transport is not None  # _open()
        self._disarm()
        self.transport.writeSequence(
            (head, b"Date: ", self.site.http_date(), b"\r\n\r\n", body))
        self.site.log_answer(self, b"GET", b"/pool", 200)
        self._arm()
        return True

    def _open(self) -> bool:
        """Neither lost nor being closed."""
        return (not self._lost and self.transport is not None
                and not getattr(self.transport, "disconnecting", False))

    def lineReceived(self, line: bytes) -> None:
        requests = len(self.requests)
        super().lineReceived(line)
        # A new request was begun: its request line has just been parsed.
        if self.reserved and len(self.requests) > requests and self._open():
            # ``line`` was that request line: "<method> <path> <version>".
            parts = line.split(b" ")
            self.site.request_line_read(self, parts[1] if len(parts) > 1 else b"")

    def answer_probes_only(self) -> None:
        """Answer that only the probe pages are served on this connection, and close it."""
        self._disarm()
        self.answering = True
        if self.transport is not None:
            self.transport.write(_PROBES_ONLY)
            self.transport.loseConnection()

    def checkPersistence(self, request: server.Request, version: bytes) -> bool:
        """A connection of the probe reserve is closed after its answer, so that the
        slot is free for the next probe (the kubelet opens one per probe anyway)."""
        if self.reserved:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return bool(super().checkPersistence(request, version))

    def allHeadersReceived(self) -> None:
        self._body_bytes = 0
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        # The body of the request being received (later requests pipelined behind
        # one being answered are only buffered here, and counted when their turn comes).
        if not self._busy:
            self._body_bytes += len(data)
            if self._body_bytes > self.site.max_request_body:
                self.drop(f"request body larger than {self.site.max_request_body} bytes")
                return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._disarm()
        self._busy = True
        self.answering = True
        super().allContentReceived()

    def requestDone(self, request: server.Request) -> None:
        self._busy = False
        self.started_request = False
        super().requestDone(request)
        # A request pipelined behind this one may have been answered meanwhile. A
        # connection closing after its answer is armed too: a client that does not
        # read the answer would keep it open.
        if not self._busy and not self._lost and self._deadline is None:
            self._arm()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._lost = True
        self._disarm()
        self.site.channel_closed(self)
        super().connectionLost(reason)


class StatusSite(server.Site):
    """The status site: at most ``max_connections`` ordinary connections, at most
    ``max_per_address`` of them from one client address other than loopback, and
    ``probe_reserve`` more for ``PROBE_PATHS`` only (see the module docstring); each
    request due within ``request_deadline`` seconds (``probe_deadline`` in the
    reserve) with at most ``max_request_body`` bytes of body (``StatusChannel``);
    requests logged at debug, at most ``access_log.limit`` lines a second
    (``LinesPerSecond``).

    ``open_connections`` is how many are open now, ``refused`` how many were closed
    unanswered or answered only "probes only" because no ordinary slot was theirs
    (pushed out of the reserve, or asking the reserve for another page).
    """

    # Not ``log``: that is the access log method of Twisted's Site.
    logger = Logger()
    # Twisted types a site's channels as its HTTP/2-negotiating wrapper; this site
    # builds plain HTTP/1.1 ``StatusChannel``s.
    protocol: Callable[[], Any] = StatusChannel
    displayTracebacks = False
    noisy = False

    def __init__(self, root: resource.Resource, reactor: IReactorTime,
                 max_connections: int = MAX_STATUS_CONNECTIONS,
                 request_deadline: float = STATUS_REQUEST_DEADLINE,
                 max_request_body: int = MAX_STATUS_REQUEST_BODY,
                 max_per_address: int = MAX_STATUS_CONNECTIONS_PER_ADDRESS,
                 probe_reserve: int = PROBE_RESERVE_CONNECTIONS,
                 probe_deadline: float = PROBE_REQUEST_DEADLINE,
                 max_unread: int = MAX_STATUS_UNREAD_CONNECTIONS) -> None:
        # No idle timeout of Twisted's own: the request deadline covers idle clients.
        super().__init__(root, reactor=reactor, timeout=None)
        self.max_connections = max_connections
        self.request_deadline = request_deadline
        self.max_request_body = max_request_body
        self.max_per_address = max_per_address
        self.probe_reserve = probe_reserve
        self.probe_deadline = probe_deadline
        self.max_unread = max_unread
        self.refused = 0
        self._ordinary: set[StatusChannel] = set()
        # The probe reserve, oldest first (the order in which it pushes connections
        # out): those nothing was read from yet, and those that sent part of a request.
        self._unread: dict[StatusChannel, None] = {}
        self._reserve: dict[StatusChannel, None] = {}
        self._per_address: dict[str, int] = {}
        self._refusing_since: Optional[int] = None
        # Lines a client causes: the access log and dropped connections.
        self.access_log = LinesPerSecond(reactor, self._access_lines_dropped)
        # ``GET /pool``, answered at hand by the channels when its document is built.
        pool_page = root.children.get(b"pool")
        self.pool_page = pool_page if isinstance(pool_page, PoolDocumentPage) else None
        self._date: tuple[int, bytes] = (-1, b"")

    @property
    def open_connections(self) -> int:
        return len(self._ordinary) + len(self._unread) + len(self._reserve)

    @property
    def reserved_connections(self) -> int:
        """Connections open now in the probe reserve (read from or not)."""
        return len(self._unread) + len(self._reserve)

    def buildProtocol(self, addr: Optional[IAddress]) -> Any:
        """A ``StatusChannel`` in an ordinary slot when one is free for its address,
        else in the probe reserve, among the connections not read from yet (pushing
        out the oldest of those when ``max_unread`` are open). Never None: a new
        connection is not closed before it has been read."""
        host: Optional[str] = getattr(addr, "host", None)
        capped = host is not None and not is_loopback(host)
        if len(self._ordinary) < self.max_connections and not (
                capped and host is not None
                and self._per_address.get(host, 0) >= self.max_per_address):
            channel = super().buildProtocol(addr)
            self._ordinary.add(channel)
            if capped and host is not None:
                channel.counted_host = host
                self._per_address[host] = self._per_address.get(host, 0) + 1
            return channel
        if len(self._ordinary) >= self.max_connections:
            self._at_limit()
        else:
            self.log_dropped_peer(host, f"its address holds {self.max_per_address} "
                                        "ordinary status connections: probes only")
        if len(self._unread) >= self.max_unread:
            # The oldest not being answered (a probe that came whole in its first
            # bytes is, until its answer is sent).
            victim = next((waiting for waiting in self._unread if not waiting.answering),
                          None)
            if victim is not None:
                self._push_out(victim, "sent nothing while "
                                       f"{self.max_unread} newer connections arrived")
        channel = super().buildProtocol(addr)
        channel.reserved = True
        self._unread[channel] = None
        return channel

    def reserve_started(self, channel: StatusChannel) -> None:
        """``channel``, in the probe reserve, has sent part of a request and not all
        of it: it takes a place among ``probe_reserve``, pushing out the one there
        that has waited longest when they are all taken (one being answered is
        not pushed out)."""
        self._unread.pop(channel, None)
        self._reserve[channel] = None
        if len(self._reserve) <= self.probe_reserve:
            return
        victim = next((waiting for waiting in self._reserve if not waiting.answering),
                      None)
        if victim is not None:
            self._push_out(victim, f"{self.probe_reserve} newer connections of the "
                                   "probe reserve sent part of a request")

    def _push_out(self, channel: StatusChannel, why: str) -> None:
        self._unread.pop(channel, None)
        self._reserve.pop(channel, None)
        self.refused += 1
        channel.drop(f"pushed out of the probe reserve: {why}")

    def _at_limit(self) -> None:
        if self._refusing_since is None:
            self._refusing_since = self.refused
            self.logger.warn("status connections at the limit of {limit}: new ones are "
                             "answered for /healthz and /readyz only until some end",
                             limit=self.max_connections)

    def request_line_read(self, channel: StatusChannel, path: bytes) -> None:
        """The request line of a connection in the probe reserve: a probe is served,
        any other page answered 503 (and the connection closed)."""
        if is_probe_path(path):
            return
        self.refused += 1
        self.log_dropped(channel, "only /healthz and /readyz are answered while the "
                                  "ordinary status connections are taken")
        channel.answer_probes_only()

    def startFactory(self) -> None:
        """Nothing to open: the access log goes to the debug log (see ``log``), so
        Twisted's log file and its once-a-second date timer are not needed."""

    def stopFactory(self) -> None:
        """The port stopped listening: report the access log lines dropped so far,
        leaving no timer behind."""
        self.access_log.stop()

    def _access_lines_dropped(self, count: int) -> None:
        self.logger.debug("status access log: {count} lines dropped in the last second "
                          "(at most {limit} a second)", count=count,
                          limit=self.access_log.limit)

    def channel_closed(self, channel: StatusChannel) -> None:
        """Free the slot of ``channel`` (once; a pushed-out one is freed at once)."""
        self._unread.pop(channel, None)
        self._reserve.pop(channel, None)
        if channel in self._ordinary:
            self._ordinary.discard(channel)
            host = channel.counted_host
            if host is not None:
                left = self._per_address.get(host, 1) - 1
                if left > 0:
                    self._per_address[host] = left
                else:
                    self._per_address.pop(host, None)
        if self._refusing_since is not None and len(self._ordinary) < self.max_connections:
            refused = self.refused - self._refusing_since
            self._refusing_since = None
            self.logger.info("status connections below the limit of {limit} again, "
                             "{refused} refused meanwhile", limit=self.max_connections,
                             refused=refused)

    def log_dropped(self, channel: StatusChannel, why: str) -> None:
        transport = channel.transport
        peer = getattr(transport.getPeer(), "host", None) if transport is not None else None
        self.log_dropped_peer(peer, why)

    def log_dropped_peer(self, peer: Optional[str], why: str) -> None:
        """One debug line about a connection of ``peer``, within the access log's
        bound."""
        if not self.access_log.allow():
            return
        self.logger.debug("status connection from {peer} dropped: {why}",
                          peer=peer or "?", why=why)

    def getContentFile(self, length: Optional[int]) -> io.BytesIO:
        """Where a request body goes: memory (it is at most ``max_request_body``)."""
        return io.BytesIO()

    def http_date(self) -> bytes:
        """The ``Date`` header's value now, on the site's reactor, made once a second."""
        now = int(self.reactor.seconds())
        if self._date[0] != now:
            self._date = (now, http.datetimeToString(now))
        return self._date[1]

    def log_answer(self, channel: StatusChannel, method: bytes, path: bytes,
                   code: int) -> None:
        """The access log line of an answer made without a twisted.web request."""
        if not self.access_log.allow():
            return
        transport = channel.transport
        self.logger.debug("status request {method} {path} {code} from {client}",
                          method=method.decode("latin-1"), path=path.decode("latin-1"),
                          code=code, client=getattr(transport.getPeer(), "host", None)
                          if transport is not None else None)

    def log(self, request: http.Request) -> None:
        """The access log: debug only (the pool page polls twice every 2 s), and at
        most ``access_log.limit`` lines a second with paths cut short."""
        if not self.access_log.allow():
            return
        self.logger.debug(
            "status request {method} {path} {code} from {client}",
            method=shown_path(request.method.decode("latin-1")),
            path=shown_path(request.uri.decode("latin-1")),
            code=request.code, client=request.getClientAddress().host)


def status_site(source: IStatusSource, metrics: Metrics, reactor: IReactorTime,
                pool_view: Optional[IPoolView] = None) -> StatusSite:
    """A ``StatusSite`` serving ``status_resource``; no tracebacks to clients."""
    return StatusSite(status_resource(source, metrics, pool_view), reactor)
