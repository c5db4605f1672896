"""One watch stream: a chunked HTTP response carrying one JSON event per line,
fed by a storage watch, with periodic bookmarks and the client's timeout; it ends
when the storage ends the watch."""

import json

from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.kube.errors import KubeError
from yurtcoord.sim.apiserver import status
from yurtcoord.sim.apiserver.storage import IStorageWatch


def encode_event(event_type: str, obj: object) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


class WatchStream:
    """Streams store events for one watch request until the client leaves,
    ``timeout`` seconds pass (clean end), or the server cuts it."""

    log = Logger()

    def __init__(self, request, clock, store, resource_type, object_filter, since,
                 bookmarks=False, bookmark_interval=1.0, timeout=None, encoder=None,
                 on_close=None):
        self._request = request
        self._clock = clock
        self._store = store
        self._type = resource_type
        self._filter = object_filter
        self._since = since
        self._bookmarks = bookmarks
        self._bookmark_interval = bookmark_interval
        self._timeout = timeout
        self._encoder = encoder or (lambda obj: obj)
        self._on_close = on_close
        self._watcher = None
        self._bookmark_loop = None
        self._timeout_call = None
        self.closed = False
        self.stalled = False
        self.events_sent = 0

    def start(self) -> None:
        request = self._request
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-cache, private")
        request.notifyFinish().addBoth(self._finished)
        request.write(b"")
        self._store.watch(self._type.gvr, self._filter, self._since, self._send).addCallbacks(
            self._watching, self._failed)

    def _failed(self, failure: Failure) -> None:
        """The storage refused or ended the watch: a KubeError is sent as an ERROR
        event (410 when the revision is gone) before the stream ends."""
        if self.closed:
            return
        if isinstance(failure.value, KubeError):
            self._write(encode_event("ERROR", status.status_of(failure.value)))
        else:
            self.log.failure("watch of {resource} failed", failure,
                             resource=self._type.gvr.resource)
            self._write(encode_event("ERROR", status.failure(500, "watch failed")))
        self.end()

    def _ended(self, result: object) -> None:
        if not self.closed:
            self.end()

    def _watching(self, watcher: IStorageWatch) -> None:
        if self.closed:
            watcher.cancel()
            return
        self._watcher = watcher
        watcher.ended.addCallbacks(self._ended, self._failed)
        if self._bookmarks and self._bookmark_interval:
            self._bookmark_loop = LoopingCall(self._send_bookmark)
            self._bookmark_loop.clock = self._clock
            self._bookmark_loop.start(self._bookmark_interval, now=False)
        if self._timeout:
            self._timeout_call = self._clock.callLater(self._timeout, self.end)

    def _write(self, data):
        if not self.closed and not self.stalled:
            self._request.write(data)

    def stall(self) -> None:
        """Stop writing anything while staying connected."""
        self.stalled = True

    def _send(self, event_type, obj):
        self.events_sent += 1
        self._write(encode_event(event_type, self._encoder(obj)))

    def bookmark_line(self) -> bytes:

        return encode_event("BOOKMARK", {
            "kind": self._type.kind,
            "apiVersion": self._type.api_version,
            "metadata": {"resourceVersion": str(
                self._watcher.resource_version if self._watcher is not None else 0)},
        })

    def _send_bookmark(self):
        self._write(self.bookmark_line())

    def end(self) -> None:
        """Finish the response cleanly (terminating chunk; connection stays usable)."""
        if self.closed:
            return
        self._stop()
        self._request.finish()

    def cut(self, mid_line: bool = False) -> None:
        """Close the connection under the stream; optionally after half an event line."""
        if self.closed:
            return
        if mid_line and not self.stalled:
            line = self.bookmark_line()
            self._request.write(line[:len(line) // 2])
        transport = self._request.channel.transport if self._request.channel else None
        self._stop()
        if transport is not None:
            transport.loseConnection()

    def _stop(self):
        if self.closed:
            return
        self.closed = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._bookmark_loop is not None and self._bookmark_loop.running:
            self._bookmark_loop.stop()
        if self._timeout_call is not None and self._timeout_call.active():
            self._timeout_call.cancel()
        if self._on_close is not None:
            self._on_close(self)

    def _finished(self, result):
        self._stop()
        return None
