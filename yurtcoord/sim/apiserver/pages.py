"""Paginated LIST (``limit`` / ``continue``): every page of one list comes
from the snapshot taken by its first request, as etcd-backed lists do, and a
continue token whose snapshot is older than the retained history gets 410."""

import secrets
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from yurtcoord.sim.apiserver import status

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.store import ObjectStore

Items = list[dict[str, Any]]


class ListPages:
    """Snapshots of the remaining items of paginated lists, keyed by token."""

    def __init__(self, store: "ObjectStore", keep: int = 256) -> None:
        self._store = store
        self._keep = keep
        self._pages: OrderedDict[str, tuple[Items, int]] = OrderedDict()

    def first(self, items: Items, resource_version: int,
              limit: int | None) -> tuple[Items, str | None]:
        """The first page and the continue token (None when nothing remains)."""
        return self._page(items, resource_version, limit)

    def next(self, token: str, limit: int | None) -> tuple[Items, int, str | None]:
        """(items, resourceVersion, next token) for a continue token."""
        saved = self._pages.pop(token, None)
        if saved is None or saved[1] < self._store.oldest_watchable:
            raise status.error(
                410, "The provided continue parameter is too old to display a consistent "
                     "list result. You can start a new list without the continue parameter.")
        items, resource_version = saved
        page, next_token = self._page(items, resource_version, limit)
        return page, resource_version, next_token

    def _page(self, items: Items, resource_version: int,
              limit: int | None) -> tuple[Items, str | None]:
        if not limit or len(items) <= limit:
            return items, None
        token = secrets.token_urlsafe(12)
        self._pages[token] = (items[limit:], resource_version)
        while len(self._pages) > self._keep:
            self._pages.popitem(last=False)
        return items[:limit], token

    def remaining(self, token: str) -> int:
        saved = self._pages.get(token)
        return len(saved[0]) if saved else 0

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
