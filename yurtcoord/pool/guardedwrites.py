"""The pool store's guarded writes of many objects, in batches of transactions.

Every change touching several keys goes to etcd as transactions, split into batches of
at most ``max_ops`` operations and ``max_bytes`` of request (etcd's limits). An older
object never overwrites a newer one: every write of an object is guarded by compares
on its key and its mirror rv key (absent for a create; present, with a lower stored
resourceVersion, for an update), so concurrent writers (several agents uploading the
same objects, pool sync writing a list while a watch event landed) cannot regress a
value. A batch whose guard fails is planned again from fresh reads (see
``GuardedWriter._write_batch``). The component key cache is changed only after etcd
accepted a batch, or when a batch may have landed (cancelled or cut off in flight).
"""

from typing import Any, Callable, Generator, Iterable, Iterator, List, Optional, Tuple

from twisted.internet import defer
from twisted.internet.defer import inlineCallbacks
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.etcd import transactions as etcdtx
from yurtcoord.etcd.errors import EtcdError
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keys import ResourceId, mirror_rv_key
from yurtcoord.pool.storeobjects import (
    OP_OVERHEAD, ConflictRetriesExhausted, WriteItem, WriteOutcome, rv_or_none,
)

__all__ = ["GuardedWriter", "REQUEST_OVERHEAD", "MAX_CONFLICT_ROUNDS", "put_ops",
           "delete_ops"]

log = Logger()

# Bytes reserved per request for protobuf framing beyond its operations.
REQUEST_OVERHEAD = 4096
# Guarded write rounds for one batch before giving up. A round planned from fresh
# reads fails only if another writer changed one of the batch's keys in between, and
# each writer changes a key at most once per version it holds, so this is never hit
# by a handful of agents uploading the same objects.
MAX_CONFLICT_ROUNDS = 32

# What an inlineCallbacks generator of this module yields and returns.
Steps = Generator[defer.Deferred[Any], Any, Any]
# One thing to batch: (kind, what, bytes it adds to a request).
Entry = Tuple[str, Any, int]


def put_ops(item: WriteItem) -> List[Any]:
    """The two puts of an object: its key and its mirror rv."""
    return [etcdtx.put(item.path_bytes, item.value),
            etcdtx.put(item.mirror_bytes, item.rv_bytes)]

def delete_ops(path: str) -> List[Any]:
    """The two deletes of an object: its key and its mirror rv."""
    return [etcdtx.delete(path.encode("utf-8")),
            etcdtx.delete(mirror_rv_key(path).encode("utf-8"))]


class GuardedWriter:
    """Guarded writes and batched deletes of many objects for one pool store.

    :param submit: ``submit(op, transaction, raise_on_failure=True)``, the store's
        timed ``EtcdClient.submit`` (``op`` names the request in the metrics).
    :param key_cache: the store's ``ComponentKeyCache``, told of every key written.
    :param max_ops: operations (and compares) per transaction.
    :param max_bytes: bytes per request.
    :param parallel_batches: batches of one write in flight at once.
    """

    def __init__(self, submit: Callable[..., defer.Deferred[Any]],
                 key_cache: ComponentKeyCache, max_ops: int, max_bytes: int,
                 parallel_batches: int) -> None:
        if parallel_batches < 1:
            raise ValueError(f"parallel_batches must be >= 1, got {parallel_batches}")
        if max_ops < 2:
            raise ValueError(f"max_ops must be at least 2, got {max_ops}")
        if max_bytes <= REQUEST_OVERHEAD + 2 * OP_OVERHEAD:
            raise ValueError(f"max_bytes too small: {max_bytes}")
        self._submit = submit
        self.key_cache = key_cache
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.parallel_batches = parallel_batches
        # Rounds whose guarded write, planned from fresh reads, still lost to a
        # concurrent writer (observability of contention between agents).
        self.lost_races = 0

    @property
    def byte_budget(self) -> int:
        """Bytes of operations one request may carry."""
        return self.max_bytes - REQUEST_OVERHEAD

    @inlineCallbacks
    def write(self, items: List[WriteItem], outcome: WriteOutcome,
              in_flight: Optional[int] = None) -> Steps:
        """Write ``items`` (keys disjoint) in batches, up to ``in_flight`` (else
        ``parallel_batches``) at once, recording in ``outcome``; fails with the first
        batch's error once every batch in flight has ended."""
        entries = [("item", item, item.size) for item in items]
        batches = iter(self.batches(entries, ops_per_entry=2))
        errors: List[Failure] = []

        @inlineCallbacks
        def worker():
            for batch in batches:
                if errors:
                    return
                try:
                    yield self._write_batch([item for _k, item, _s in batch],
                                                       outcome)
                except Exception:
                    errors.append(Failure())
                    return

        # Every worker finishes (or stops at the first error) before this call
        # returns, so a retry with the same outcome never races a leftover batch.
        yield defer.DeferredList([worker() for _ in range(in_flight or self.parallel_batches)])
        if errors:
            errors[0].raiseException()

    @inlineCallbacks
    def _write_batch(self, items, outcome):
        """Write one batch in rounds of one transaction each.

        A round writes its plan guarded by compares (key absent for creates; key
        present and stored rv lower for updates). If a guard fails nothing is written,
        and a read of the batch's keys and mirror rvs (one transaction, no disk sync)
        gives the next round's plan. The first round assumes every key is absent, so
        a first upload into an empty pool costs one request per batch and a repeated
        upload a failed write and a read per batch. The reads are not the write's
        failure branch: carried by every write, they cost etcd and the agent as much
        CPU again as the compares (their operations are parsed and encoded whether
        the guard holds or not), for a first upload that never uses them.
        """
        plan = [("created", item) for item in items]
        derived_from_reads = False
        for _round in range(MAX_CONFLICT_ROUNDS):
            compares, writes, previous_doubt = [], [], {}
            for kind, item in plan:
                if kind == "created":
                    compares.append(etcdtx.key_absent(item.path_bytes))
                else:
                    compares.append(etcdtx.key_present(item.path_bytes))
                    compares.append(etcdtx.value_below(item.mirror_bytes, item.rv_bytes))
                writes.extend(put_ops(item))
                previous_doubt[item.path] = outcome.in_doubt.get(item.path)
                # Until etcd answers, this write may or may not land.
                outcome.in_doubt[item.path] = (kind, item.rv)
            try:
                result = yield self._submit("write_rv", etcdtx.transaction(
                    compare=compares, success=writes), raise_on_failure=False)
            except EtcdError as error:
                if error.maybe_applied:
                    # As for lists: a write cancelled or cut off in flight may have
                    # landed, and a caller that gives up now (a role change cancels an
                    # upload) never settles its doubt. Owning a key that does not exist
                    # costs one useless delete later; forgetting one that does would
                    # leave it in the pool for good.
                    self.remember_keys([item for _kind, item in plan])
                raise
            if result.succeeded:
                for kind, item in plan:
                    outcome._decide(outcome.created if kind == "created" else outcome.updated,
                                    item.path)
                self.remember_keys([item for _kind, item in plan])
                return
            # Nothing of this round was written: forget its doubts, keep older ones.
            for path, doubt in previous_doubt.items():
                if doubt is None:
                    outcome.in_doubt.pop(path, None)
                else:
                    outcome.in_doubt[path] = doubt
            if derived_from_reads:
                self.lost_races += 1
                log.debug("pool store batch of {count} lost a race, planning again",
                               count=len(plan))
            planned_items = [item for _kind, item in plan]
            reads = []
            for item in planned_items:
                reads.append(etcdtx.get(item.path_bytes, keys_only=True))
                reads.append(etcdtx.get(item.mirror_bytes))
            stored = yield self._submit("read_rv", etcdtx.transaction(success=reads))
            results = etcdtx.range_results(stored.responses, 2 * len(planned_items))
            plan = []
            for index, item in enumerate(planned_items):
                key_kvs = results[2 * index]
                mirror_kvs = results[2 * index + 1]
                stored_rv = rv_or_none(mirror_kvs[0].value) if mirror_kvs else None
                if not key_kvs:
                    plan.append(("created", item))
                elif stored_rv is not None and stored_rv < item.rv:
                    plan.append(("updated", item))
                else:
                    self._settle_not_newer(item, stored_rv, outcome)
            if not plan:
                return
            derived_from_reads = True
        raise ConflictRetriesExhausted(
            f"{len(plan)} keys kept changing under {MAX_CONFLICT_ROUNDS} rounds")

    def _settle_not_newer(self, item, stored_rv, outcome):
        doubt = outcome.in_doubt.get(item.path)
        if doubt is not None and stored_rv == item.rv:
            # Our earlier write landed although its answer was lost.
            kind, _rv = doubt
            outcome._decide(outcome.created if kind == "created" else outcome.updated,
                            item.path)
            self.remember_keys([item])
            return
        outcome._decide(outcome.not_newer, item.path)
        if stored_rv is not None:
            # The component holds this object too; remember it so that its cleanup and
            # a re-upload after a crash know the key.
            self.remember_keys([item])

    def remember_keys(self, items: List[WriteItem]) -> None:
        """Record the keys of ``items`` in the key cache, each for its component."""
        by_owner: dict[tuple[str, ResourceId], List[str]] = {}
        for item in items:
            by_owner.setdefault((item.key.component, item.key.resource), []).append(item.path)
        for (component, resource), paths in by_owner.items():
            self.key_cache.add(component, resource, paths)

    @inlineCallbacks
    def delete(self, op: str, paths: List[str],
               deleted: Callable[[List[str]], object]) -> Steps:
        """Delete ``paths`` (and their mirror rvs) in transactions of at most
        ``max_ops``/``max_bytes``; ``deleted(batch_paths)`` after each accepted one."""
        entries = [("del", p, 2 * len(p.encode()) + 16 + 2 * OP_OVERHEAD) for p in paths]
        for batch in self.batches(entries, ops_per_entry=2):
            ops, batch_paths = [], []
            for _kind, path, _size in batch:
                ops.extend(delete_ops(path))
                batch_paths.append(path)
            yield self._submit(op, etcdtx.transaction(success=ops))
            deleted(batch_paths)

    def batches(self, entries: Iterable[Entry], ops_per_entry: int) -> Iterator[List[Entry]]:
        """Group ``(kind, what, size)`` entries so each group fits max_ops and max_bytes."""
        per_batch = max(1, self.max_ops // ops_per_entry)
        budget = self.byte_budget
        batch: List[Any] = []
        size = 0
        for entry in entries:
            entry_size = entry[2]
            if batch and (len(batch) >= per_batch or size + entry_size > budget):
                yield batch
                batch, size = [], 0
            batch.append(entry)
            size += entry_size
        if batch:
            yield batch
