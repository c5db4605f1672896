"""The status pages' resource tree: ``/`` (the pool page), ``/healthz``, ``/readyz``,
``/status``, ``/pool`` and ``/metrics``, each read from a status source
(``yurtcoord.agent.statussources``). A source that raises gives a 500 and one log
line; it never takes the HTTP server down. The site that serves the tree, and bounds
what its clients may hold, is ``yurtcoord.agent.status``.

A server URL never shows its credentials (``user:password@``) on these pages or in
metric labels: configuration refuses them, and what is shown is masked anyway.
"""
import gzip
import json
from typing import Any, Optional

from twisted.python.failure import Failure
from twisted.logger import Logger
from twisted.web import pages, resource, server

from yurtcoord.tx.credentials import mask_url_credentials
from yurtcoord.agent.metrics import METRICS_CONTENT_TYPE, Metrics
from yurtcoord.agent.poolpage import pool_page
from yurtcoord.agent.statussources import IPoolView, IStatusSource, NoPoolView, PageRenderer

NOT_FOUND = pages.notFound("No such page",
                           "Pages: / /healthz /readyz /status /pool /metrics")
# gzip level of /pool answers: 6 compresses a 1,000-member document about tenfold in a
# few milliseconds, once per build.
POOL_GZIP_LEVEL = 6


class SourcePage(resource.Resource):
    """A leaf page rendered by ``render_page(source)`` → (code, content type, body bytes).

    A failing source gives a 500 and one log line.
    """

    isLeaf = True
    log = Logger()

    def __init__(self, source: IStatusSource, render_page: PageRenderer) -> None:
        super().__init__()
        self.source = source
        self.render_page = render_page

    def render_GET(self, request: server.Request) -> object:
        if request.postpath not in ([], [b""]):
            return NOT_FOUND.render(request)
        try:
            code, content_type, body = self.render_page(self.source)
        except Exception:
            self.log.failure("status page {path} failed to read the agent status",
                             path=request.path.decode("latin-1"))
            code, content_type, body = 500, "text/plain; charset=utf-8", b"internal error\n"
        request.setResponseCode(code)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return body


def _text(code: int, text: str) -> tuple[int, str, bytes]:
    return code, "text/plain; charset=utf-8", text.encode("utf-8")


def healthz_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """200 ``ok`` when the coordinator is healthy (leader or follower), else 503."""
    if source.healthy:
        return _text(200, "ok\n")
    return _text(503, f"not healthy: role {source.role}\n")


def readyz_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """200 ``ok`` when ready, else 503 naming each failing condition on its own line."""
    if source.ready:
        return _text(200, "ok\n")
    failures = list(source.readiness_failures()) or ["not ready"]
    return _text(503, "".join(f"not ready: {failure}\n" for failure in failures))


def status_page(source: IStatusSource) -> tuple[int, str, bytes]:
    """The ``/status`` JSON document of ``source``, URLs without credentials."""
    body = mask_url_credentials(json.dumps(source.status(), indent=2)) + "\n"
    return 200, "application/json", body.encode("utf-8")


def metrics_page(metrics: Metrics) -> PageRenderer:
    """Prometheus text; refreshes the role/health/readiness/server gauges from the source
    first, so a scrape never shows older values than the status pages."""

    def render(source: IStatusSource) -> tuple[int, str, bytes]:
        metrics.set_role(source.role)
        metrics.set_healthy(source.healthy)
        metrics.set_ready(source.ready)
        for server_url, healthy in (source.status().get("cloud") or {}).items():
            # Not probed (null, the kubelet dead): the gauge keeps what was probed.
            if healthy is not None:
                metrics.set_server_healthy(server_url, bool(healthy))
        return 200, METRICS_CONTENT_TYPE, metrics.render()

    return render


def accepts_gzip(accept_encoding: Optional[bytes]) -> bool:
    """Whether an ``Accept-Encoding`` header value accepts gzip: listed (or ``*``)
    without ``q=0``."""
    if not accept_encoding:
        return False
    accepted: dict[str, bool] = {}
    for item in accept_encoding.decode("latin-1").split(","):
        name, _, parameters = item.strip().partition(";")
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        accepted[name.strip().lower()] = quality > 0
    return accepted.get("gzip", accepted.get("*", False))


class PoolDocumentPage(resource.Resource):
    """``GET /pool``: the pool view's JSON document, answered once it is built (the
    view bounds every read it makes). A client gone meanwhile gets nothing; a defect
    of the view gives a 500 and one log line, as the other pages.

    A document is encoded once: the view answers with the same document until its
    next build, and every request for it gets the bytes encoded for the first (a
    document of a 1,000-member pool is milliseconds of CPU to encode). A client that
    accepts gzip (the pool page's browser, most tools) gets those bytes compressed,
    also once per document: sending the ~200 kB of a 1,000-member pool's document to
    each of many readers cost the agent more CPU than building it. The answer carries
    its length (no chunked framing around the body), and a document at hand is
    answered at once, without waiting on the client's end."""

    isLeaf = True
    log = Logger()

    def __init__(self, view: IPoolView) -> None:
        super().__init__()
        self.view = view
        # The document last encoded, its bytes, and those compressed (once asked).
        self._encoded: Optional[tuple[dict[str, Any], bytes]] = None
        self._compressed: Optional[tuple[dict[str, Any], bytes]] = None
        # The answers made by ``answer_at_hand``: gzipped or not -> (document, head, body).
        self._answers: dict[bool, tuple[dict[str, Any], bytes, bytes]] = {}

    def encoded(self, document: dict[str, Any]) -> bytes:
        """The JSON bytes of ``document``, encoded once per document."""
        if self._encoded is not None and self._encoded[0] is document:
            return self._encoded[1]
        # Compact: the C encoder (an indented document is encoded in Python, ten
        # times slower) and a quarter fewer bytes to send per request.
        body = (json.dumps(document, separators=(",", ":")) + "\n").encode("utf-8")
        self._encoded = (document, body)
        return body

    def compressed(self, document: dict[str, Any]) -> bytes:
        """``encoded(document)`` gzipped, once per document."""
        if self._compressed is not None and self._compressed[0] is document:
            return self._compressed[1]
        body = gzip.compress(self.encoded(document), compresslevel=POOL_GZIP_LEVEL, mtime=0)
        self._compressed = (document, body)
        return body

    def answer_at_hand(self, accept_encoding: Optional[bytes]) -> Optional[tuple[bytes, bytes]]:
        """The answer to a ``GET /pool`` whose ``Accept-Encoding`` is ``accept_encoding``
        when the view has its document at hand: the head (status line and headers,
        without ``Date`` and the blank line that ends it) and the body, the same as
        ``render_GET`` gives, made once per document and encoding. None while the
        document is being built: the request then takes the ordinary way and waits."""
        built = self.view.document()
        if not built.called:
            return None
        result: list[object] = []

        def seen(answer: object) -> object:
            result.append(answer)
            return answer

        # Read without taking the result from the Deferred (it may not be ours alone);
        # a failure is the ordinary way's to answer, and is handled there.
        built.addBoth(seen)
        document = result[0]
        if not isinstance(document, dict):
            built.addErrback(lambda _failure: None)
            return None
        compressed = accepts_gzip(accept_encoding)
        made = self._answers.get(compressed)
        if made is not None and made[0] is document:
            return made[1], made[2]
        body = self.compressed(document) if compressed else self.encoded(document)
        head = b"".join((
            b"HTTP/1.1 200 OK\r\nServer: ", server.version,
            b"\r\nVary: accept-encoding\r\n",
            b"Content-Encoding: gzip\r\n" if compressed else b"",
            b"Content-Type: application/json\r\nCache-Control: no-store\r\n",
            b"Content-Length: %d\r\n" % len(body)))
        self._answers[compressed] = (document, head, body)
        return head, body

    def render_GET(self, request: server.Request) -> object:
        if request.postpath not in ([], [b""]):
            return NOT_FOUND.render(request)
        gone: list[bool] = []
        built = self.view.document()
        if not built.called:
            # Answered once built: unless the client is gone by then.
            request.notifyFinish().addErrback(lambda _failure: gone.append(True))

        def answer(document: dict[str, Any]) -> None:
            request.setHeader(b"vary", b"accept-encoding")
            if accepts_gzip(request.getHeader(b"accept-encoding")):
                request.setHeader(b"content-encoding", b"gzip")
                self._finish(request, gone, 200, "application/json", self.compressed(document))
            else:
                self._finish(request, gone, 200, "application/json", self.encoded(document))

        def failed(failure: Failure) -> None:
            self.log.failure("status page /pool failed to read the pool view", failure)
            self._finish(request, gone, 500, "text/plain; charset=utf-8", b"internal error\n")

        built.addCallback(answer).addErrback(failed)
        return server.NOT_DONE_YET

    @staticmethod
    def _finish(request: server.Request, gone: list[bool], code: int, content_type: str,
                body: bytes) -> None:
        if gone:
            return
        request.setResponseCode(code)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()


class StatusRoot(resource.Resource):
    """Root of the status pages; any other path is a plain 404."""

    def getChild(self, path: bytes, request: server.Request) -> resource.IResource:
        return NOT_FOUND


def status_resource(source: IStatusSource, metrics: Metrics,
                    pool_view: Optional[IPoolView] = None) -> StatusRoot:
    """The resource tree: the pool page at ``/`` and the five pages beside it;
    ``/pool`` serves ``pool_view`` (``NoPoolView`` without one)."""
    view = pool_view if pool_view is not None else NoPoolView(source)
    root = StatusRoot()
    root.putChild(b"", SourcePage(source, pool_page(view)))
    root.putChild(b"healthz", SourcePage(source, healthz_page))
    root.putChild(b"readyz", SourcePage(source, readyz_page))
    root.putChild(b"status", SourcePage(source, status_page))
    root.putChild(b"pool", PoolDocumentPage(view))
    root.putChild(b"metrics", SourcePage(source, metrics_page(metrics)))
    return root
