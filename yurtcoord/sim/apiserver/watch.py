"""One watch stream: a chunked HTTP response carrying one JSON event per line,
fed by a storage watch, with periodic bookmarks and the client's timeout; it ends
when the storage ends the watch.

A watch that starts with a replay (every object, or the events after its
resourceVersion) gets them as kube-apiserver streams them: a batch of events taken
from the storage, encoded and written per reactor turn, so that the first ones are on
their way while the rest are still to be looked at, not all of them gone through
before the first byte leaves. Events that come while a replay is still being written
queue behind it, in order. An object the storage keeps encoded (``encoded``: the
in-memory store's retained events) is written as that text, not encoded again.
"""

import collections
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.kube.errors import KubeError
from yurtcoord.sim.apiserver import status
from yurtcoord.sim.apiserver.storage import IStorageWatch
from yurtcoord.sim.apiserver.watchers import encode_object


# Events of a replay encoded and written in one reactor turn: the first batch leaves
# within milliseconds of the request, and the client decodes while the server encodes.
REPLAY_BATCH = 256
# Bytes a chunk of a replay: the buffer Go's HTTP server fills before it writes a
# chunk (``bufferBeforeChunkingSize``), while a watch has more events to send.
REPLAY_CHUNK = 2048


def _line(event_type: str, object_json: str) -> str:
    return f'{{"type":{encode_object(event_type)},"object":{object_json}}}\n'


def encode_event(event_type: str, obj: object) -> bytes:
    """One line of a watch stream: ``{"type":...,"object":...}`` and a newline."""
    return _line(event_type, encode_object(obj)).encode()


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
        self._encoder = encoder
        self._on_close = on_close
        self._watcher = None
        self._bookmark_loop = None
        self._timeout_call = None
        # Events not yet encoded: those of the replay, and any that came after them
        # while the replay was still being written; ``_flush_call`` writes the next
        # batch, and exists only while the queue, or a replay the storage holds back
        # (``IStorageWatch.replaying``), does.
        self._queue: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        # Set while a storage hands on replayed events: they queue, whatever the queue
        # holds.
        self._taking_replay = False
        self._flush_call: IDelayedCall | None = None
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
        # A storage that replays at once (the in-memory store) does so within this call.
        self._taking_replay = True
        try:
            watching = self._store.watch(self._type.gvr, self._filter, self._since, self._send)
        finally:
            self._taking_replay = False
        if self._queue:
            self._flush()
        watching.addCallbacks(self._watching, self._failed)

    def _failed(self, failure: Failure) -> None:
        """The storage refused or ended the watch: a KubeError is sent as an ERROR
        event (410 when the revision is gone) before the stream ends."""
        if self.closed:
            return
        self._write_queue()
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
        if self._flush_call is None and watcher.replaying:
            self._flush()

    def _write(self, data):
        if not self.closed and not self.stalled:
            self._request.write(data)

    def stall(self) -> None:
        """Stop writing anything while staying connected."""
        self.stalled = True

    def _send(self, event_type, obj):
        self.events_sent += 1
        if self._taking_replay or self._queue:
            self._queue.append((event_type, obj))
            return
        self._write(_line(event_type, self._object_json(obj)).encode())

    def _object_json(self, obj: dict[str, Any]) -> str:
        """``obj`` as its event carries it: through the stream's encoder if it has
        one, else as the storage keeps it encoded, else encoded here."""
        if self._encoder is not None:
            return encode_object(self._encoder(obj))
        stored = self._store.encoded(obj)
        return stored if stored is not None else encode_object(obj)

    def _write_queued(self, count: int) -> None:
        """Encode and write the first ``count`` queued events in chunks of
        ``REPLAY_CHUNK`` bytes, cut wherever the size falls, as kube-apiserver's
        response writer cuts a replay (a live event, written alone, is a chunk)."""
        queue, object_json = self._queue, self._object_json
        popleft = queue.popleft
        taken = [popleft() for _ in range(min(count, len(queue)))]
        # ASCII (the encoder escapes the rest): one conversion to bytes per batch.
        data = "".join([_line(event_type, object_json(obj))
                        for event_type, obj in taken]).encode()
        for start in range(0, len(data), REPLAY_CHUNK):
            self._write(data[start:start + REPLAY_CHUNK])

    @property
    def _replay_held(self) -> bool:
        """The storage still holds back part of this watch's replay."""
        return self._watcher is not None and self._watcher.replaying

    def _take_replay(self, count: int) -> None:
        """Queue up to ``count`` more events of the replay the storage holds back."""
        watcher = self._watcher
        if count <= 0 or watcher is None or not watcher.replaying:
            return
        self._taking_replay = True
        try:
            watcher.replay(count)
        finally:
            self._taking_replay = False

    def _flush(self) -> None:
        """Write the next batch of the replay; the rest waits for the next turn."""
        self._flush_call = None
        if self.closed:
            self._queue.clear()
            return
        self._take_replay(REPLAY_BATCH - len(self._queue))
        self._write_queued(REPLAY_BATCH)
        if self._queue or self._replay_held:
            self._flush_call = self._clock.callLater(0, self._flush)

    def _write_queue(self) -> None:
        """Write the whole replay and every queued event now (the stream is about to
        end)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        self._write_queued(len(self._queue))
        while self._replay_held and not self.closed:
            self._take_replay(REPLAY_BATCH)
            self._write_queued(len(self._queue))

    def bookmark_line(self) -> bytes:

        return encode_event("BOOKMARK", {
            "kind": self._type.kind,
            "apiVersion": self._type.api_version,
            "metadata": {"resourceVersion": str(
                self._watcher.resource_version if self._watcher is not None else 0)},
        })

    def _send_bookmark(self):
        # A bookmark names the store's resourceVersion: not while events before it
        # are still queued or held back.
        if not self._queue and not self._replay_held:
            self._write(self.bookmark_line())

    def end(self) -> None:
        """Finish the response cleanly (terminating chunk; connection stays usable)."""
        if self.closed:
            return
        self._write_queue()
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
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        self._queue.clear()
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
