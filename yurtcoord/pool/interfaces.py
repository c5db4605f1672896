"""The contracts of the pool package: with the pool store, and with the layers above.

The leader's pool sync and the local cache uploader write the pool's objects
through an ``IPoolStore``: the real ``yurtcoord.pool.store.PoolStore`` on etcd, or
the in-memory fake of the unit tests. Both are checked against it with
``verifyObject``, so the writers call these members without probing for them.

What the pool needs of the layers above it is declared here too, so that ``pool/``
imports nothing from ``role/`` or ``agent/`` and the packages depend one way: the
coordinator (``yurtcoord.role``) starts and stops an ``IRoleComponent`` such as the
pool sync, and the agent's metrics count the pool sync's events as an
``IPoolSyncMetrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

from twisted.internet import defer
from zope.interface import Attribute, Interface

from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import KeyBuildInfo, PoolKey
from yurtcoord.tx.guardedloop import ILoopErrors

if TYPE_CHECKING:
    from yurtcoord.pool.store import WriteOutcome


class IPoolStore(Interface):
    """Keys and batched writes of the pool's objects, with observers of the store's
    health and of etcd terms (a new term may have lost acknowledged writes)."""

    reactor = Attribute("The reactor (or clock) the store's timers run on.")
    parallel_batches = Attribute("How many transactions the store keeps in flight for "
                                 "one create_or_update_many; a writer running several "
                                 "calls at once keeps this many in all (the local cache "
                                 "upload more, up to its max_in_flight, while etcd "
                                 "answers as quickly).")
    unreachable = Attribute("None while etcd answers the store's health checks; else why "
                            "the last check failed (for a cluster: each member and its "
                            "failure).")

    def key_func(info: KeyBuildInfo) -> PoolKey:
        """The pool key of the object described by a ``KeyBuildInfo``; raises
        ``InvalidKey`` for names that cannot be keys."""

    def create_or_update_many(items: Iterable[Tuple[PoolKey, bytes, Union[int, str]]],
                              outcome: Optional[WriteOutcome] = None,
                              flush_key_cache: bool = True,
                              in_flight: Optional[int] = None) -> defer.Deferred[WriteOutcome]:
        """Write ``(key, value, rv)`` items, each only if newer than what is stored;
        fires with a ``WriteOutcome``. At most ``in_flight`` transactions of this call
        are in flight at once (default ``parallel_batches``)."""

    def replace_component_list(component: str, gvr: GroupVersionResource,
                               namespace: Optional[str],
                               objects: Iterable[Union[bytes, dict[str, Any]]],
                               ) -> defer.Deferred[Tuple[int, int]]:
        """Make the keys of ``component``'s ``gvr`` in ``namespace`` exactly
        ``objects``; fires with (written, deleted)."""

    def delete_many(keys: Iterable[Union[PoolKey, str]],
                    flush_key_cache: bool = True) -> defer.Deferred[int]:
        """Delete ``keys``; fires with the number deleted."""

    def delete_component_resources(component: str) -> defer.Deferred[int]:
        """Delete every key of ``component``; fires with the number deleted."""

    def recover_pool_scoped_keys(resources: Iterable[Any],
                                 component: str = POOL_SCOPED_COMPONENT) -> defer.Deferred[Any]:
        """Rebuild the key cache of ``resources`` from what etcd holds."""

    def flush_key_cache() -> None:
        """Write the key cache now."""

    def flush_key_cache_soon() -> None:
        """Write the key cache after the writes in progress."""

    def on_health_change(observer: Callable[[bool], object]) -> None:
        """Call ``observer(healthy)`` whenever the store's health flips."""

    def remove_health_observer(observer: Callable[[bool], object]) -> None:
        """Stop calling ``observer`` on health changes."""

    def on_unreachable_change(observer: Callable[[Optional[str]], object]) -> None:
        """Call ``observer(reason or None)`` when the store starts or stops counting
        the pool etcd as unreachable."""

    def remove_unreachable_observer(observer: Callable[[Optional[str]], object]) -> None:
        """Stop calling ``observer`` on unreachable changes."""

    def on_new_term(observer: Callable[[], object]) -> None:
        """Call ``observer()`` when etcd reports a new raft term."""

    def remove_new_term_observer(observer: Callable[[], object]) -> None:
        """Stop calling ``observer`` on new terms."""

    def close() -> defer.Deferred[Any]:
        """Stop the store's timers; the store is not used afterwards."""


class IRoleComponent(Interface):
    """A piece of work that runs only in some roles (pool sync, heartbeat
    delegation, pool-cache-synced detection).

    The coordinator calls ``start`` and ``stop`` alternately and never calls one
    before the Deferred of the previous call has fired, so a component need not
    guard against overlapping calls.
    """

    def start(store: IPoolStore) -> defer.Deferred[None]:
        """Begin working against the open pool ``store``.

        Returns a Deferred that fires once the component runs, or errbacks if it
        could not start (the coordinator then retries the role's steps). A role
        change cancels a start still in progress: like a failed start, it must
        leave nothing of the component running.
        """

    def stop() -> defer.Deferred[Any]:
        """Stop all work: watches, timers and requests of this component.

        Returns a Deferred that fires when nothing of the component is left
        running; after it fired the component calls none of its callbacks.
        The coordinator never cancels it. Requests and timers are cancelled within
        this call, so that an agent that stops leading stops writing at once; the
        Deferred may fire later.
        """


class IPoolSyncMetrics(ILoopErrors):
    """What the pool sync counts: the events of each mirrored resource, and the
    errors of its guarded lease loop and write retries (``ILoopErrors``)."""

    def count_pool_sync_event(resource: str, event_type: str) -> None:
        """Count one event of ``resource`` (ADDED, MODIFIED, DELETED, or LIST for a
        whole list written)."""
