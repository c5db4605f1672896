"""What the pool store reads from etcd: one object, every object or key under a prefix
(page by page, at one revision), and the keys the pool-scoped component holds.

Which component owns a key: etcd records no owner. A key's path names the object, not
who wrote it, and several writers may hold the same object (pool sync mirrors
endpointslices from the cloud, kube-proxy's cached endpointslices are uploaded from
each node). Ownership is kept in the node's component key cache file; only the
pool-scoped component (``leader-yurthub``) is rebuilt from etcd, because another node
may have been leader since this node wrote its file. The rebuild
(``PoolStore.recover_pool_scoped_keys``, with ``StoreReader.keys_under``) adopts every
key under the pool-scoped prefixes except the keys this node's file records for
another component: those stay theirs, and neither the rebuild nor pool sync's cleanup
at start deletes them. When the file is missing, etcd alone cannot tell the writers
apart, so every key under the prefixes is adopted; an object another component
uploaded there and pool sync then deletes is written again by pool sync's first list
if the cloud still holds it, and by that component's next upload otherwise. Keys under
a pool-scoped prefix that are not UTF-8 (any pool member can write one) name no object
the store could have written: they are skipped, counted
(``yurtcoord_pool_store_undecodable_keys_total``) and logged once per rebuild, never
adopted and never fatal.
"""

from typing import Any, Callable, Generator, Iterable, List, Optional, Set, Tuple

from twisted.internet import defer
from twisted.internet.defer import inlineCallbacks
from twisted.logger import Logger

from yurtcoord.etcd import transactions as etcdtx
from yurtcoord.etcd.client import prefix_range_end
from yurtcoord.pool.keys import PoolKeyBuilder, ResourceId, mirror_rv_key
from yurtcoord.pool.storeobjects import KeyNotFound, rv_or_none

__all__ = ["StoreReader", "LIST_PAGE_SIZE"]

# Keys per page of a list.
LIST_PAGE_SIZE = 1000
# Characters of an undecodable key shown in the log line that reports it.
_KEY_EXAMPLE_CHARS = 200

# What an inlineCallbacks generator of this module yields and returns.
Steps = Generator[defer.Deferred[Any], Any, Any]


class StoreReader:
    """The pool store's reads of its etcd.

    :param etcd: the store's etcd client.
    :param timed: ``timed(op, deferred)``, the store's timing of a request in its
        metrics (``op`` names the request).
    :param keys: the store's key layout.
    :param metrics: counts the keys that are not UTF-8 (``count_undecodable_keys``), or
        None.
    """

    log = Logger()

    def __init__(self, etcd: Any,
                 timed: Callable[[str, defer.Deferred[Any]], defer.Deferred[Any]],
                 keys: PoolKeyBuilder, metrics: Optional[Any] = None) -> None:
        self.etcd = etcd
        self._timed = timed
        self.keys = keys
        self.metrics = metrics

    @inlineCallbacks
    def get(self, path: str) -> Steps:
        """The stored bytes at ``path``; KeyNotFound if absent."""
        kv = yield self._timed("get", self.etcd.get(path.encode("utf-8")))
        if kv is None:
            raise KeyNotFound(path)
        return kv.value

    @inlineCallbacks
    def get_resource_version(self, path: str) -> Steps:
        """The stored mirror resourceVersion of ``path``, or None."""
        kv = yield self._timed("get", self.etcd.get(mirror_rv_key(path).encode()))
        return rv_or_none(kv.value) if kv is not None else None

    def list(self, prefix: str) -> defer.Deferred[List[bytes]]:
        """Values of every object under ``prefix`` (which must end in ``/``), by key order."""
        d = self.range_all(_checked_prefix(prefix), keys_only=False)
        d.addCallback(lambda kvs: [kv.value for kv in kvs])
        return d

    def list_keys(self, prefix: str) -> defer.Deferred[List[str]]:
        """Key paths under ``prefix`` (which must end in ``/``), in key order; keys that
        are not UTF-8 are left out (and reported)."""
        d = self.range_all(_checked_prefix(prefix), keys_only=True)

        def paths(kvs: List[Any]) -> List[str]:
            found, undecodable = [], []
            for kv in kvs:
                try:
                    found.append(kv.key.decode("utf-8"))
                except UnicodeDecodeError:
                    undecodable.append(kv.key)
            if undecodable:
                self.report_undecodable(undecodable, prefix)
            return found

        d.addCallback(paths)
        return d

    @inlineCallbacks
    def keys_under(self, resources: Iterable[Any], others: Set[str]) -> Steps:
        """``(keys by ResourceId, count left)``: the keys under each resource's prefix,
        except those in ``others`` (counted as left) and those that are not UTF-8
        (reported once for all the resources)."""
        rebuilt, left, undecodable = {}, 0, []
        for gvr in resources:
            resource = ResourceId.of(gvr)
            prefix = self.keys.list_prefix(resource.group, resource.resource)
            kvs = yield self.range_all(prefix, keys_only=True)
            paths = set()
            for kv in kvs:
                try:
                    path = kv.key.decode("utf-8")
                except UnicodeDecodeError:
                    undecodable.append(kv.key)
                    continue
                if path in others:
                    left += 1
                else:
                    paths.add(path)
            rebuilt[resource] = paths
        if undecodable:
            self.report_undecodable(undecodable, "pool-scoped prefixes")
        result: Tuple[dict, int] = (rebuilt, left)
        return result

    @inlineCallbacks
    def range_all(self, prefix: str, keys_only: bool) -> Steps:
        """Every KeyValue under a prefix, page by page at one revision."""
        start = prefix.encode("utf-8")
        end = prefix_range_end(start)
        revision = None
        found = []
        while True:
            page = yield self._timed("list", self.etcd.range_page(
                etcdtx.key_range(start, end), keys_only=keys_only,
                limit=LIST_PAGE_SIZE, revision=revision))
            revision = revision or page.revision
            found.extend(page.kvs)
            if not page.more or not page.kvs:
                return found
            start = page.kvs[-1].key + b"\x00"

    def report_undecodable(self, keys: List[bytes], where: str) -> None:
        """Log (once, with an example) and count keys that are not UTF-8."""
        example = keys[0].decode("utf-8", "backslashreplace")
        if len(example) > _KEY_EXAMPLE_CHARS:
            example = example[:_KEY_EXAMPLE_CHARS] + "..."
        self.log.warn("pool etcd holds {count} keys under {where} that are not UTF-8, "
                      "skipped: for example {example}", count=len(keys), where=where,
                      example=example)
        if self.metrics is not None:
            self.metrics.count_undecodable_keys(len(keys))


def _checked_prefix(prefix: str) -> str:
    prefix = str(prefix)
    if not prefix.endswith("/"):
        # Without it "pods" would match "podsecuritypolicy" and "default" "default-2".
        raise ValueError(f"list prefix must end with '/': {prefix!r}")
    return prefix
