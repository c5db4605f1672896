"""The compares, operations and transactions of etcd, for callers outside ``etcd/``.

txaioetcd's request types come from ``yurtcoord.etcd.txaioetcd_private`` (which loads
the package without its database layer and holds the compare ``KeyAbsent`` that the
client's fast encoder knows); only modules of ``etcd/`` import that layer. A writer
of the pool (the pool store) builds its guarded transactions with the functions here
and hands them to ``EtcdClient.submit``, and reads the answer of a transaction of
reads with ``range_results``.
"""

from typing import Any, Iterable, List, Sequence

from yurtcoord.etcd.errors import BadResponse
from yurtcoord.etcd.txaioetcd_private import KeyAbsent, txaioetcd

__all__ = ["Transaction", "Compare", "Operation", "KeyRange", "transaction", "key_absent",
           "key_present", "value_below", "put", "delete", "get", "key_range",
           "range_results"]

# txaioetcd carries no type information, so its classes are ``Any`` to mypy; the
# names below are for isinstance checks and for readers. A transaction for
# ``EtcdClient.submit``: compares, then the operations of the branch they choose.
Transaction: Any = txaioetcd.Transaction
# One compare of a transaction (``key_absent``, ``key_present``, ``value_below``).
Compare: Any = txaioetcd.Comp
# One operation of a transaction (``put``, ``delete``, ``get``).
Operation: Any = txaioetcd.Op
# The keys of a range request (``key_range``), for ``EtcdClient.range_page``.
KeyRange: Any = txaioetcd.KeySet


def transaction(compare: Iterable[Any] = (), success: Iterable[Any] = (),
                failure: Iterable[Any] = ()) -> Any:
    """A transaction: ``success`` when every compare holds (or there is none), else
    ``failure``."""
    return txaioetcd.Transaction(compare=list(compare), success=list(success),
                                 failure=list(failure))


def key_absent(key: bytes) -> Any:
    """Holds while ``key`` does not exist (the shortest form etcd reads as version 0)."""
    return KeyAbsent(key)


def key_present(key: bytes) -> Any:
    """Holds while ``key`` exists (its version is above 0)."""
    return txaioetcd.CompVersion(key, ">", 0)


def value_below(key: bytes, value: bytes) -> Any:
    """Holds while the value stored at ``key`` sorts below ``value`` as bytes (an
    absent key holds no value and fails it)."""
    return txaioetcd.CompValue(key, "<", value)


def put(key: bytes, value: bytes) -> Any:
    """Store ``value`` at ``key`` (no lease, previous value not returned)."""
    return txaioetcd.OpSet(key, value)


def delete(key: bytes) -> Any:
    """Delete ``key`` (an absent key is no error)."""
    return txaioetcd.OpDel(key)


def get(key: bytes, keys_only: bool = False) -> Any:
    """Read ``key`` (its key and version only with ``keys_only``)."""
    return txaioetcd.OpGet(key, keys_only=keys_only)


def key_range(start: bytes, end: bytes) -> Any:
    """The keys from ``start`` up to, not including, ``end``."""
    return txaioetcd.KeySet(start, range_end=end)


def range_results(responses: Sequence[Any], count: int) -> List[List[Any]]:
    """The ``kvs`` of a transaction's ``count`` reads (``get``), in order;
    ``BadResponse`` when etcd's answer does not hold exactly that many range results
    (whatever answered is no etcd)."""
    if len(responses) != count or not all(isinstance(r, txaioetcd.Range) for r in responses):
        raise BadResponse(f"etcd answered {count} reads of a transaction with "
                          f"{len(responses)} results of types "
                          f"{sorted({type(r).__name__ for r in responses})}")
    return [r.kvs for r in responses]
