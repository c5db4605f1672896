"""Watches of the test API server's in-memory store: the events it records, how
one change looks through a watch's filter, and a registered watch with the replay it
hands on.

An event the store retains carries its object's JSON, encoded once when the change
was recorded: every watch stream that sends the event writes that text
(``ObjectStore.encoded``) instead of encoding the object again, as kube-apiserver's
watch cache keeps one serialization of an object for all its watchers. A replay is
then a copy of text, so the server streams a backlog faster than any consumer
decodes it, as kube-apiserver does; encoding each event as it streamed took this
server longer than yurtcoord's informer takes to decode it.
"""

import copy
import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from yurtcoord.sim.apiserver.selectors import ObjectFilter

__all__ = ["WatchEvent", "Watcher", "deliver", "encode_object"]

# One encoder for every object (``json.dumps`` with separators builds one a call).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_object(obj: object) -> str:
    """An object as a watch line carries it: compact JSON, ASCII."""
    return _ENCODER.encode(obj)


@dataclass(frozen=True)
class WatchEvent:
    """One change. ``old`` is the object before a MODIFIED, so that selector
    watches can turn it into ADDED/DELETED when the object enters/leaves.
    ``encoded`` is ``object``'s JSON (``encode_object``) when the store retains the
    event, else None."""

    type: str
    resource_version: int
    key: tuple[Any, ...]
    object: dict[str, Any]
    old: dict[str, Any] | None = None
    encoded: str | None = None


def deliver(object_filter: ObjectFilter, callback: Callable[[str, dict[str, Any]], object],
            event_type: str, obj: dict[str, Any], old: dict[str, Any] | None,
            resource_version: int) -> bool:
    """Hand one change to ``callback`` as a watch with ``object_filter`` sees it:
    ADDED/DELETED when the object enters/leaves the selection, nothing when it is
    outside before and after. ``old`` is the object before a MODIFIED. True when an
    event was handed on."""
    matches_new = object_filter.matches(obj)
    if event_type != "MODIFIED":
        if matches_new:
            callback(event_type, obj)
        return matches_new
    matches_old = old is not None and object_filter.matches(old)
    if matches_new:
        callback("MODIFIED" if matches_old else "ADDED", obj)
        return True
    if not matches_old:
        return False
    # As the watch cache does: the object as it was when it still matched, stamped
    # with the resourceVersion of the change.
    assert old is not None
    gone = copy.deepcopy(old)
    gone["metadata"]["resourceVersion"] = str(resource_version)
    callback("DELETED", gone)
    return True


class Watcher:
    """A registered watch; ``cancel()`` stops delivery.

    A watch made with a lazy replay holds the retained events it is to replay (its
    ``backlog``) and hands them on only when asked, ``replay(count)`` at a time, as
    kube-apiserver's watch cache hands a new watcher the events of its interval one
    by one: the first events leave before the last are looked at. Changes that come
    meanwhile join the backlog behind them, so nothing is delivered out of order.
    """

    def __init__(self, on_cancel: "Callable[[Watcher], object]",
                 type_key: tuple[str, str, str], object_filter: ObjectFilter,
                 callback: Callable[[str, dict[str, Any]], object]) -> None:
        self._on_cancel = on_cancel
        self.type_key = type_key
        self.filter = object_filter
        self._callback = callback
        self.active = True
        self._backlog: deque[WatchEvent] = deque()
        # The resourceVersion of the last event taken from the backlog.
        self.replayed_to = 0

    @property
    def replaying(self) -> bool:
        """Events of a lazy replay (or changes behind them) are still to be handed on."""
        return self.active and bool(self._backlog)

    def offer(self, event: WatchEvent) -> None:
        """Deliver ``event`` translated through the filter (behind the backlog of a
        lazy replay); events of other types are dropped."""
        if not self.active or event.key[0] != self.type_key:
            return
        if self._backlog:
            self._backlog.append(event)
            return
        deliver(self.filter, self._callback, event.type, event.object, event.old,
                event.resource_version)

    def hold(self, events: Iterable[WatchEvent], since: int) -> None:
        """Take the retained ``events`` after ``since`` as the backlog to replay."""
        self._backlog.extend(events)
        self.replayed_to = since

    def replay(self, count: int) -> None:
        """Hand on events of the backlog until ``count`` were delivered (those the
        filter leaves out do not count) or the backlog is empty."""
        delivered = 0
        backlog, callback, object_filter = self._backlog, self._callback, self.filter
        while backlog and delivered < count and self.active:
            event = backlog.popleft()
            self.replayed_to = event.resource_version
            if event.key[0] == self.type_key and deliver(
                    object_filter, callback, event.type, event.object, event.old,
                    event.resource_version):
                delivered += 1

    def cancel(self) -> None:
        if self.active:
            self.active = False
            self._backlog.clear()
            self._on_cancel(self)
