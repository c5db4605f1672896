"""How ``yurtcoordctl`` reads an agent's page: one GET within one deadline, and the
answer decoded as the JSON object it must be (``fetch``), any failure one
``CtlError`` line. The agent read may be broken or hostile (it is whatever answers at
that address), so nothing it sends can hold the command past its ``--timeout`` or
make it decode without bound; ``yurtcoord.agent.ctl``'s docstring lists the rules.
"""

import http.client
import io
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Optional

# Bytes of one answer read at most; a longer one is a bad answer.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Containers nested deeper than this are a bad answer: the agent's documents are at most
# four deep, and rendering a deeper one would recurse once per level.
MAX_DEPTH = 32
# Characters of an exception's text kept in an error line (a bad status line may be
# 64 KiB long).
MAX_DETAIL = 200
# The exit statuses of yurtcoordctl.
NOT_READY, BAD_USAGE, UNREACHABLE = 1, 2, 3


class CtlError(Exception):
    """One line saying why a command could not be answered; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = UNREACHABLE) -> None:
        super().__init__(message)
        self.status = status


class _Deadline:
    """What is left of one command's ``--timeout``; ``left()`` raises ``TimeoutError``
    once nothing is."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        return remaining


class _DeadlineReader(io.RawIOBase):
    """The reading side of a socket for ``http.client``: each read waits at most what
    is left of the deadline, so a server sending a byte now and then cannot keep the
    status line, the headers or the body coming past it."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.sock.settimeout(self.deadline.left())
        return self.sock.recv_into(buffer)


class _DeadlineSocket:
    """What ``http.client.HTTPResponse`` needs of a socket: ``makefile``."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock = sock
        self.deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        assert mode == "rb", mode
        return io.BufferedReader(_DeadlineReader(self.sock, self.deadline))


def _resolve(host: str, port: int, deadline: _Deadline) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` bounded by the deadline: the lookup blocks in the C library with
    no timeout of its own, so it runs in a daemon thread the command stops waiting for."""
    found: dict[str, Any] = {}

    def lookup() -> None:
        try:
            found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            found["error"] = error

    thread = threading.Thread(target=lookup, name="yurtcoordctl-lookup", daemon=True)
    thread.start()
    thread.join(deadline.left())
    if thread.is_alive():
        raise TimeoutError("name lookup")
    if "error" in found:
        raise found["error"]
    return found["addresses"]


def _connect(host: str, port: int, deadline: _Deadline) -> socket.socket:
    """A socket connected to ``host``, trying its addresses in order within the
    deadline, directly (no proxy)."""
    last: Optional[OSError] = None
    for family, kind, proto, _name, address in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as error:
            sock.close()
            last = error
    raise last if last is not None else OSError(f"no address for {host}")


def read_answer(url: str, deadline: _Deadline) -> bytes:
    """The body of ``GET url`` (an ``http`` or ``https`` URL that ``check_server``
    accepted), at most ``MAX_ANSWER_BYTES + 1`` bytes of it, read within ``deadline``.
    Not urllib: its timeout bounds each socket wait, not the exchange, and its
    ``ProxyHandler`` sends requests, loopback ones included, to ``HTTP_PROXY``."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    assert host is not None, url
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    sock = _connect(host, port, deadline)
    try:
        if parts.scheme.lower() == "https":
            sock.settimeout(deadline.left())
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        authority = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            authority += f":{parts.port}"
        request = (f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {authority}\r\n"
                   f"Accept: application/json\r\nUser-Agent: yurtcoordctl\r\n"
                   f"Connection: close\r\n\r\n")
        sock.settimeout(deadline.left())
        sock.sendall(request.encode("ascii"))
        # HTTPResponse only calls makefile("rb") on what it is given as its socket.
        reader: Any = _DeadlineSocket(sock, deadline)
        response = http.client.HTTPResponse(reader)
        try:
            response.begin()
            if not 200 <= response.status < 300:
                raise CtlError(f"bad answer from {url}: HTTP {response.status} "
                               f"{response.reason}")
            body = response.read(MAX_ANSWER_BYTES + 1)
            # read(amt) returns what came before the connection closed, even when the
            # Content-Length promised more; a cut-short answer is no answer.
            if response.length and len(body) <= MAX_ANSWER_BYTES:
                raise CtlError(f"bad answer from {url}: cut short after {len(body)} of "
                               f"{len(body) + response.length} bytes")
            return body
        finally:
            response.close()
    finally:
        sock.close()


def _detail(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."


def fetch_body(url: str, timeout: float) -> bytes:
    """``read_answer`` within one deadline of ``timeout`` seconds, any failure a
    ``CtlError``: ``agent unreachable`` when it could not be asked or did not answer
    in time, ``bad answer`` when what it answered is not HTTP with a 2xx status."""
    try:
        return read_answer(url, _Deadline(timeout))
    except CtlError:
        raise
    except TimeoutError:
        raise CtlError(f"agent unreachable at {url}: no answer within {timeout:g}s") from None
    except http.client.HTTPException as error:
        raise CtlError(f"bad answer from {url}: not HTTP ({type(error).__name__}: "
                       f"{_detail(error)})") from None
    except (OSError, ValueError) as error:
        raise CtlError(f"agent unreachable at {url}: {_detail(error)}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number out of range {text[:40]}")
    return number


def _depth_at_most(document: Any, limit: int) -> bool:
    """Whether no list or object in ``document`` is nested more than ``limit`` deep
    (without recursing: the point is not to)."""
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return True


def decode(body: bytes, url: str) -> dict[str, Any]:
    """The agent's answer ``body`` as the JSON object it must be, or a one-line
    ``CtlError`` (``UNREACHABLE``: the answer is unreadable) for an answer larger than
    ``MAX_ANSWER_BYTES``, not UTF-8, not JSON, holding ``NaN``/``Infinity`` or a number
    too large for a float (the tables would fail on it, and it is no age), nested
    deeper than ``MAX_DEPTH``, or not an object."""
    if len(body) > MAX_ANSWER_BYTES:
        raise CtlError(f"bad answer from {url}: larger than {MAX_ANSWER_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CtlError(f"bad answer from {url}: not UTF-8 ({_detail(error)})") from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant,
                              parse_float=_finite_float)
    except RecursionError:
        raise CtlError(f"bad answer from {url}: nested deeper than {MAX_DEPTH}") from None
    except ValueError as error:
        raise CtlError(f"bad answer from {url}: not JSON ({_detail(error)})") from None
    if not isinstance(document, dict):
        raise CtlError(f"bad answer from {url}: not a JSON object")
    if not _depth_at_most(document, MAX_DEPTH):
        raise CtlError(f"bad answer from {url}: nested deeper than {MAX_DEPTH}")
    return document


def fetch(url: str, timeout: float) -> dict[str, Any]:
    """GET ``url`` within ``timeout`` seconds in all: its JSON object, or a
    ``CtlError`` naming what went wrong."""
    return decode(fetch_body(url, timeout), url)
