"""LIST answers, whole or in pages (``limit`` / ``continue``).

As kube-apiserver does, the continue token carries the revision of the first page
and the key of the last object sent: every later page is listed from the storage at
that revision, after that key, so all pages of one list show one snapshot, and a
token whose revision is no longer kept gets 410. Objects come in key order
(``namespace/name``), the order of the keys in etcd.
"""

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Generator

from twisted.internet import defer
from twisted.internet.defer import Deferred

from yurtcoord.kube.errors import Gone
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.sim.apiserver import status
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.storage import IObjectStorage

Items = list[dict[str, Any]]

_TOO_OLD = ("The provided continue parameter is too old to display a consistent list "
            "result. You can start a new list without the continue parameter.")


@dataclass
class ListPage:
    """One answer: its items, the revision they were listed at, the token of the next
    page (None on the last) and how many objects remain after this page."""

    items: Items
    revision: int
    token: str | None = None
    remaining: int = 0


def position(obj: dict[str, Any]) -> str:
    """The object's place in a list: its key below the resource, ``namespace/name``."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def _encode(revision: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        decoded = json.loads(raw)
        revision, start = decoded["rv"], decoded["start"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise status.error(410, _TOO_OLD)
    if type(revision) is not int or revision < 1 or not isinstance(start, str):
        raise status.error(410, _TOO_OLD)
    return revision, start


class ListPages:
    """Answers LIST requests from an ``IObjectStorage``."""

    def __init__(self, storage: IObjectStorage) -> None:
        self._storage = storage

    @defer.inlineCallbacks
    def page(self, gvr: GroupVersionResource, namespace: str | None,
             object_filter: ObjectFilter, limit: int | None,
             token: str | None = None,
             revision: int | None = None) -> Generator[Deferred[Any], Any, ListPage]:
        """The first page (``token`` None) or the page a continue token names; the
        first page as of now, or as of ``revision`` when given."""
        start = None
        if token:
            revision, start = _decode(token)
        try:
            items, revision = yield self._storage.list(gvr, namespace, revision)
        except Gone:
            if token:
                raise status.error(410, _TOO_OLD)
            raise
        keyed = sorted(((position(item), item) for item in items
                        if object_filter.matches(item)), key=lambda pair: pair[0])
        if start is not None:
            keyed = [pair for pair in keyed if pair[0] > start]
        if not limit or len(keyed) <= limit:
            return ListPage([item for _, item in keyed], revision)
        sent = keyed[:limit]
        return ListPage([item for _, item in sent], revision,
                        _encode(revision, sent[-1][0]), len(keyed) - limit)

    @staticmethod
    def parse_limit(raw: str | None) -> int | None:
        if raw in (None, ""):
            return None
        try:
            limit = int(raw)
        except ValueError:
            raise status.bad_request(f"invalid limit {raw!r}: must be an integer")
        if limit < 0:
            raise status.bad_request(f"invalid limit {raw!r}: must not be negative")
        return limit or None
