"""etcd watches over the gateway's ``/v3/watch`` stream.

The gateway answers a watch request with one chunked response that never ends on its
own: one JSON object per line, each ``{"result": WatchResponse}`` (or ``{"error":
...}``). The lines are split by ``yurtcoord.tx.lines`` (a message split across reads
is kept until its newline arrives, which txaioetcd's own watch loses), whose machine
ends the stream. Every field a
peer sends is checked before use; anything that is not a watch answer ends the watch
with ``BadResponse``.

A watch whose start revision was compacted is cancelled by etcd with its
``compact_revision``: the watch ends with ``WatchCompacted``.
"""

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from yurtcoord.etcd.errors import BadResponse, EtcdError, EtcdUnavailable, RequestRejected
from yurtcoord.tx.lines import LineStreamProtocol

__all__ = ["KeyEvent", "WatchResponse", "WatchCompacted", "EtcdWatch", "MAX_WATCH_LINE"]

# Bytes of one watch answer at most: a batch of events carries many values of up to
# etcd's request limit (1.5 MiB by default) each.
MAX_WATCH_LINE = 64 * 1024 * 1024


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted; ``compact_revision`` is the oldest
    revision a watch may start from now."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch start revision compacted (compact revision "
                         f"{compact_revision})")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class KeyEvent:
    """One change of one key: ``type`` ``PUT`` or ``DELETE``; ``mod_revision`` is the
    revision of the change, ``create_revision`` that of the key's creation (0 for a
    delete); ``prev_value`` the value before (None when etcd sent none)."""

    type: str
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    prev_value: bytes | None = None


@dataclass(frozen=True)
class WatchResponse:
    """One answer on the stream: the store ``revision`` when it was sent (0 when
    etcd sent none) and the ``events`` it carries, in revision order."""

    revision: int
    events: list[KeyEvent] = field(default_factory=list)
    created: bool = False


def _int(value: object, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} is a {type(value).__name__}")
    number = int(value)
    if number < 0:
        raise ValueError(f"{what} is negative")
    return number


def _bytes(value: object, what: str) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}")
    return base64.b64decode(value, validate=True)


def _key_event(raw: object) -> KeyEvent:
    if not isinstance(raw, dict):
        raise TypeError("an event is not an object")
    kind = raw.get("type", "PUT")
    if kind not in ("PUT", "DELETE"):
        raise ValueError(f"unknown event type {str(kind)[:40]!r}")
    kv = raw.get("kv")
    if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
        raise TypeError("an event without a key")
    prev = raw.get("prev_kv")
    if prev is not None and not isinstance(prev, dict):
        raise TypeError("prev_kv is not an object")
    return KeyEvent(kind, _bytes(kv["key"], "key"), _bytes(kv.get("value"), "value"),
                    _int(kv.get("create_revision"), "create_revision"),
                    _int(kv.get("mod_revision"), "mod_revision"),
                    _bytes(prev.get("value"), "prev value") if prev is not None else None)


class _WatchProtocol(LineStreamProtocol):
    """Parses the gateway's watch lines into ``WatchResponse``s for ``on_response``;
    how the stream ends is ``LineStreamProtocol``'s machine."""

    def __init__(self, watch: "EtcdWatch", on_response: Callable[[WatchResponse], object],
                 max_line: int) -> None:
        super().__init__(max_line)
        self._watch = watch
        self._on_response = on_response

    def too_long(self) -> None:
        self.fail(BadResponse(f"etcd watch answer longer than {self.max_line} bytes"))

    def line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            if "error" in message:
                self.fail(_stream_error(message["error"]))
                return
            result = message.get("result")
            if not isinstance(result, dict):
                raise TypeError("no result")
            header = result.get("header")
            header = {} if header is None else header
            if not isinstance(header, dict):
                raise TypeError("header is not an object")
            revision = _int(header.get("revision"), "revision")
            compacted = _int(result.get("compact_revision"), "compact_revision")
            raw_events = result.get("events")
            raw_events = [] if raw_events is None else raw_events
            if not isinstance(raw_events, list):
                raise TypeError("events is not a list")
            events = [_key_event(raw) for raw in raw_events]
        except (ValueError, TypeError, RecursionError, binascii.Error) as e:
            self.fail(BadResponse(f"unexpected etcd watch answer: {type(e).__name__}: "
                                  f"{str(e)[:200]}; {line[:200]!r}"))
            return
        if compacted:
            self.fail(WatchCompacted(compacted))
            return
        if result.get("canceled") is True:
            reason = result.get("cancel_reason")
            self.fail(EtcdUnavailable(f"etcd cancelled the watch: "
                                      f"{str(reason)[:200] if reason else 'no reason given'}"))
            return
        try:
            self._on_response(WatchResponse(revision, events, result.get("created") is True))
        except Exception as e:  # the consumer's failure ends the watch, as it was
            self.fail(e)

    def broken(self, why: str) -> BaseException:
        return EtcdUnavailable(f"etcd watch stream {why}")

    def ended(self, error: BaseException | None) -> None:
        self._watch._finish(error)


def _stream_error(raw: object) -> EtcdError:
    if not isinstance(raw, dict):
        return BadResponse(f"etcd watch error of unexpected shape: {str(raw)[:200]}")
    message = str(raw.get("message") or raw.get("error") or "no message")[:1024]
    code = raw.get("grpc_code", raw.get("code"))
    if code == 14:
        return EtcdUnavailable(f"etcd watch: {message}")
    return RequestRejected(f"etcd watch: {message}", code if isinstance(code, int) else None)


class EtcdWatch:
    """A running watch. ``finished`` fires once, when the stream is gone: with None
    after ``cancel()`` or a clean end of the stream, else failing with the
    ``EtcdError`` that ended it (``WatchCompacted``, ``EtcdUnavailable`` when the
    connection was lost, ``BadResponse``) or the exception ``on_response`` raised."""

    def __init__(self, on_response: Callable[[WatchResponse], object],
                 max_line: int = MAX_WATCH_LINE) -> None:
        self.finished: Deferred[None] = Deferred()
        self.protocol = _WatchProtocol(self, on_response, max_line)

    def cancel(self) -> None:
        """Close the stream; ``finished`` then fires with None."""
        self.protocol.cancel()

    def _finish(self, error: BaseException | None) -> None:
        """The stream is gone (once, by the stream's machine)."""
        if error is None:
            self.finished.callback(None)
        else:
            self.finished.errback(Failure(error))


def watch_request(key: bytes, range_end: bytes | None, start_revision: int | None,
                  prev_kv: bool) -> dict[str, Any]:
    """The JSON body that creates a watch over ``[key, range_end)`` (``key`` alone
    when ``range_end`` is None)."""
    request: dict[str, Any] = {"key": base64.b64encode(key).decode()}
    if range_end is not None:
        request["range_end"] = base64.b64encode(range_end).decode()
    if start_revision:
        request["start_revision"] = start_revision
    if prev_kv:
        request["prev_kv"] = True
    return {"create_request": request}
