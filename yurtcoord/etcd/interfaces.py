"""The contract between the pool store and its etcd client.

The pool store (``yurtcoord.pool.store``) reads and writes the pool etcd through these
calls of ``yurtcoord.etcd.client.EtcdClient``; the unit tests' clients provide the
same interface and are checked with ``verifyObject``.
"""

from typing import Any, Optional

from twisted.internet.defer import Deferred
from zope.interface import Interface


class IEtcdKeyValue(Interface):
    """The key-value calls of an etcd client. Each returns a Deferred that fails with
    a ``yurtcoord.etcd.errors`` type when etcd cannot answer."""

    def get(key: bytes, timeout: Optional[float] = None) -> Deferred[Any]:
        """The ``KeyValue`` stored at ``key``, or None."""

    def range_page(keys: Any, keys_only: bool = False, limit: Optional[int] = None,
                   revision: Optional[int] = None, count_only: bool = False,
                   serializable: bool = False,
                   timeout: Optional[float] = None) -> Deferred[Any]:
        """One page of the keys ``keys`` names (a key or a ``KeySet``)."""

    def submit(txn: Any, raise_on_failure: bool = True,
               timeout: Optional[float] = None) -> Deferred[Any]:
        """Run a transaction; fires with its ``TransactionResult``."""

    def status(timeout: Optional[float] = None) -> Deferred[Any]:
        """etcd's status (version, raft term): a cheap health probe."""

    def close() -> Deferred[Any]:
        """Cancel requests in flight and close the connections."""
