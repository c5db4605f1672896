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
from yurtcoord.sim.apiserver.storage import IObjectStorage, position

Items = list[dict[str, Any]]

_TOO_OLD = ("The provided continue parameter is too old to display a consistent list "
            "result. You can start a new list without the continue parameter.")


@dataclass
class ListPage:
    """One answer: its items, the revision they were listed at, the token of the next
    page (None on the last) and how many objects of the range remain after this page
    (whether or not they match the selectors)."""

    items: Items
    revision: int
    token: str | None = None
    remaining: int = 0


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
        first page as of now, or as of ``revision`` when given. The storage is read
        ``limit`` objects at a time until ``limit`` of them match the filter."""
        after = None
        if token:
            revision, after = _decode(token)
        items: Items = []
        while True:
            try:
                read = yield self._storage.list_page(gvr, namespace, revision, after, limit)
            except Gone:
                if token:
                    raise status.error(410, _TOO_OLD)
                raise
            revision = read.revision
            for index, item in enumerate(read.items):
                after = position(item)
                if object_filter.matches(item):
                    items.append(item)
                    if limit and len(items) == limit:
                        remaining = read.remaining + len(read.items) - index - 1
                        if not remaining:
                            return ListPage(items, revision)
                        return ListPage(items, revision, _encode(revision, after), remaining)
            if not limit or not read.remaining or not read.items:
                return ListPage(items, revision)

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
