"""Every use of Twisted's private names, in one place.

Twisted does not promise these names across releases; ``setup.py`` bounds Twisted to
the versions ``yurtcoord.test.integration.test_private_canaries`` was run on, and those canaries
fail with a message naming what changed when a release moves one of them. Nothing
else in the agent imports a private Twisted name (a test scans for it).

- ``ParseError``: what the HTTP client reports when a peer answers with something
  that is not HTTP (the etcd client turns it into ``BadResponse``).
- ``Request``: the request a pooled ``HTTP11ClientProtocol`` sends; the kube client
  hands its writes to a pooled connection itself, without the ``Agent`` parsing the
  URL and making an endpoint for each one.
- ``TransportProxyProducer``: the proxy a body protocol is given instead of the
  connection; ``proxied_transport`` looks through it so a body reader can abort
  the connection rather than close it gracefully.
- ``QuietHTTPConnectionPool``: an ``HTTPConnectionPool`` whose per-connection
  factories do not log "Starting factory" and "Stopping factory" for every
  connection. The pool builds them from its ``_factory`` attribute; this subclass
  points it at a factory class of its own, so no class of Twisted is changed.
- ``ChunkedBodyBatcher``: takes over the chunked framing of a response body from
  Twisted's ``_ChunkedTransferDecoder`` and delivers the payloads of all chunks of one
  socket read in one call. A watch sends one chunk per event; handing each event to
  the body protocol separately costs more than decoding it.
"""

import re
from typing import Any, Callable, Optional

from twisted.web import http as twisted_http
from twisted.web._newclient import ParseError, Request, TransportProxyProducer
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

__all__ = ["ChunkedBodyBatcher", "ParseError", "QuietHTTPConnectionPool", "Request",
           "TransportProxyProducer", "batch_chunked_body", "proxied_transport"]


def proxied_transport(transport: Any) -> Any:
    """The connection behind a body protocol's transport: the proxy's producer
    while the response is running, None once it is over; anything else as given."""
    if isinstance(transport, TransportProxyProducer):
        return transport._producer
    return transport


class _QuietHTTP11ClientFactory(_HTTP11ClientFactory):
    """The pool's per-connection factory, without a log event per connection."""

    noisy = False


class QuietHTTPConnectionPool(HTTPConnectionPool):
    """``HTTPConnectionPool`` whose connections are made without factory log noise."""

    _factory = _QuietHTTP11ClientFactory


_HEX_DIGITS = b"0123456789abcdefABCDEF"
_CHUNKED_DECODER = twisted_http._ChunkedTransferDecoder
_MAX_CHUNK_SIZE_LINE: int = twisted_http.maxChunkSizeLineLength
# Decoder states in which the batcher can take over.
_TAKE_OVER_STATES = ("CHUNK_LENGTH", "BODY", "CRLF")
# The end of a chunk's payload and the size line of the next, without extensions:
# hex digits, fewer than Twisted's decoder allows.
_NEXT_SIZE_LINE = re.compile(
    rb"\r\n([0-9a-fA-F]{1,%d})\r\n" % (_MAX_CHUNK_SIZE_LINE - 1)).match


class ChunkedBodyBatcher:
    """Takes over the chunked framing of a body from Twisted's decoder and delivers
    the payloads of all chunks of one read in one call.

    Only plain data chunks are decoded here. The last chunk, trailers, chunk
    extensions and anything malformed are handed back to Twisted's decoder, with
    the bytes not yet consumed, so endings and errors are exactly Twisted's.
    """

    def __init__(self, original: Any):
        self._original = original
        self._deliver: Callable[[bytes], object] = original.dataCallback
        state = original.state
        self._buffer = bytes(original._buffer)
        self._remaining = original.length if state == "BODY" else 0
        self._expect_crlf = state == "CRLF"
        self.handed_back = False
        self.reads = 0

    def dataReceived(self, data: bytes) -> None:
        if self.handed_back:
            self._original.dataReceived(data)
            return
        self.reads += 1
        buf = self._buffer + data if self._buffer else data
        size = len(buf)
        pos = 0
        # The framing state in locals while the read is taken apart: a watch read
        # is a hundred chunks or more, and this loop runs once for each.
        remaining = self._remaining
        expect_crlf = self._expect_crlf
        # Payloads as views of the read, copied once, by the join.
        view = memoryview(buf)
        payloads: list[memoryview] = []
        append = payloads.append
        next_size = _NEXT_SIZE_LINE
        rest_state = None
        while pos < size:
            if remaining:
                end = pos + remaining
                if end > size:
                    append(view[pos:])
                    remaining = end - size
                    pos = size
                    break
                append(view[pos:end])
                pos = end
                # What nearly always follows a payload: its CRLF and the size line of
                # the next chunk, plain hex. Anything else (the last chunk, extensions,
                # a read ending here, malformed framing) takes the steps below.
                remaining = 0
                line = next_size(buf, pos)
                if line is not None:
                    remaining = int(line[1], 16)
                    if remaining:
                        pos = line.end()
                        continue
                expect_crlf = True
            if expect_crlf:
                if size - pos < 2:
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    rest_state = "CRLF"
                    break
                pos += 2
                expect_crlf = False
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if size - pos >= _MAX_CHUNK_SIZE_LINE:
                    rest_state = "CHUNK_LENGTH"
                break
            field = buf[pos:eol]
            if (not field or eol - pos >= _MAX_CHUNK_SIZE_LINE
                    or field.translate(None, _HEX_DIGITS)):
                # Extensions, an over-long or bad size line: Twisted's decoder decides.
                rest_state = "CHUNK_LENGTH"
                break
            length = int(field, 16)
            if length == 0:
                rest_state = "CHUNK_LENGTH"
                break
            pos = eol + 2
            remaining = length
        if rest_state is None:
            self._buffer = buf[pos:] if pos < size else b""
            self._remaining = remaining
            self._expect_crlf = expect_crlf
        else:
            self._buffer = b""
            self._remaining = 0
            self._expect_crlf = False
            self.handed_back = True
            original = self._original
            original.state = rest_state
            original._buffer = bytearray(buf[pos:])
            original._start = 0
        if payloads:
            self._deliver(b"".join(payloads))
        if rest_state is not None:
            self._original.dataReceived(b"")

    def noMoreData(self) -> None:
        # Until the last chunk was handed back, the original is not FINISHED and
        # reports the lost data as it would have.
        self._original.noMoreData()


def _http_parser(response: Any) -> Any:
    """The HTTP client protocol's parser of ``response`` (Twisted's or treq's), found
    under the endpoint's and TLS's wrapping protocols; None when it is not there."""
    response = getattr(response, "original", response)
    transport = proxied_transport(getattr(response, "_transport", None))
    protocol = getattr(transport, "wrappedProtocol", None) or getattr(transport, "protocol", None)
    for _ in range(4):
        if protocol is None or hasattr(protocol, "_parser"):
            break
        protocol = (getattr(protocol, "_wrappedProtocol", None)
                    or getattr(protocol, "wrappedProtocol", None))
    parser = getattr(protocol, "_parser", None)
    if parser is None or getattr(parser, "response", None) is not response:
        return None
    return parser


def batch_chunked_body(response: Any) -> Optional[ChunkedBodyBatcher]:
    """Put a ``ChunkedBodyBatcher`` under ``response`` (Twisted's or treq's) before
    its body is delivered. Returns the batcher, or None when the response is not
    one being decoded by Twisted's chunked decoder in a state known here; the
    body is then delivered per chunk as usual."""
    parser = _http_parser(response)
    decoder = getattr(parser, "bodyDecoder", None)
    if (type(decoder) is not _CHUNKED_DECODER
            or decoder.state not in _TAKE_OVER_STATES
            or not callable(decoder.dataCallback)
            or not isinstance(decoder._buffer, bytearray)):
        return None
    batcher = ChunkedBodyBatcher(decoder)
    parser.bodyDecoder = batcher
    return batcher
