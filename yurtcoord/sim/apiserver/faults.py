"""Fault knobs tests turn on the API server: refuse connections, drop them,
slow down, fail, garble or never answer the next requests, and cut or stall
open watch streams."""

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from twisted.logger import Logger

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.server import KubeAPIServer

GARBAGE = b"<html>this is not JSON {\"kind\": "


class FaultInjector:
    """Per-server fault state. ``latency`` (seconds) delays every answer;
    queued faults (fail/garbage/hang) are consumed one per matching request,
    in the order they were queued."""

    log = Logger()

    def __init__(self, server: "KubeAPIServer") -> None:
        self._server = server
        self.latency = 0.0
        self._queued: deque[tuple[str, int, str | None, str | None, str | None]] = deque()

    def down(self) -> Deferred[Any]:
        """Stop listening (connections are refused) and drop open connections.
        Returns a Deferred that fires once the port is closed."""
        self.log.info("fault: apiserver down")
        return self._server._go_down()

    def up(self) -> Deferred[Any]:
        """Listen again on the same port number. Returns a Deferred."""
        self.log.info("fault: apiserver up")
        return self._server._come_up()

    def fail_next(self, n: int, code: int = 500, method: str | None = None,
                  path: str | None = None, query: str | None = None) -> None:
        """Answer the next ``n`` requests with a Failure Status of ``code``.
        ``method`` (e.g. "PUT"), ``path`` (a substring of the URL path) and
        ``query`` (a substring of the query string, e.g. "limit=" for lists and
        not watches) narrow which requests count; others pass untouched."""
        self._queued.extend([("fail", int(code), method, path, query)] * int(n))

    def garbage_next(self, n: int, method: str | None = None, path: str | None = None,
                     query: str | None = None) -> None:
        """Answer the next ``n`` requests 200 with a body that is not JSON."""
        self._queued.extend([("garbage", 200, method, path, query)] * int(n))

    def hang_next(self, n: int, method: str | None = None, path: str | None = None,
                  query: str | None = None) -> None:
        """Never answer the next ``n`` requests (they stay open until the
        client gives up, or down()/stop() drops the connection)."""
        self._queued.extend([("hang", 0, method, path, query)] * int(n))

    @property
    def queued(self) -> int:
        """How many queued faults (fail/garbage/hang) no request has met yet."""
        return len(self._queued)

    def stall_watches(self) -> None:
        """Open watch streams go silent (no events, no bookmarks) but stay
        connected, like a half-open connection; new watches are unaffected."""
        self.log.info("fault: stalling open watches")
        return self._server._stall_watches()

    def drop_connections(self) -> Deferred[Any]:
        """Abort every open connection but keep listening (a network blip).
        Returns a Deferred that fires once they are gone."""
        self.log.info("fault: dropping all apiserver connections")
        return self._server._drop_connections()

    def cut_watches(self, mid_line: bool = False) -> None:
        """Close the connections of open watch streams; with ``mid_line`` the
        client first receives half of a JSON event line."""
        self.log.info("fault: cutting watches mid_line={mid_line}", mid_line=mid_line)
        return self._server._cut_watches(mid_line)

    def end_watches(self) -> None:
        """Finish open watch streams cleanly, as a server-side timeout does."""
        return self._server._end_watches()

    def clear(self) -> None:
        """Drop queued failures and latency."""
        self._queued.clear()
        self.latency = 0.0

    def take(self, method: str, path: str, query: str = "") -> tuple[str, int] | None:

        """The fault for the request arriving now: None or (kind, code)."""
        for index, (kind, code, want_method, want_path, want_query) in enumerate(self._queued):
            if want_method is not None and want_method.upper() != method:
                continue
            if want_path is not None and want_path not in path:
                continue
            if want_query is not None and want_query not in query:
                continue
            del self._queued[index]
            return kind, code
        return None
