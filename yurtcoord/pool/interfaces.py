"""The contract between the pool's writers and the pool store.

The leader's pool sync and the local cache uploader write the pool's objects
through an ``IPoolStore``: the real ``yurtcoord.pool.store.PoolStore`` on etcd, or
the in-memory fake of the unit tests. Both are checked against it with
``verifyObject``, so the writers call these members without probing for them.
"""

from zope.interface import Attribute, Interface


class IPoolStore(Interface):
    """Keys and batched writes of the pool's objects, with observers of the store's
    health and of etcd terms (a new term may have lost acknowledged writes)."""

    reactor = Attribute("The reactor (or clock) the store's timers run on.")

    def key_func(info):
        """The pool key of the object described by a ``KeyBuildInfo``; raises
        ``InvalidKey`` for names that cannot be keys."""

    def create_or_update_many(items, outcome=None, flush_key_cache=True):
        """Write ``(key, value, rv)`` items, each only if newer than what is stored;
        fires with a ``WriteOutcome``."""

    def replace_component_list(component, gvr, namespace, objects):
        """Make the keys of ``component``'s ``gvr`` in ``namespace`` exactly
        ``objects``; fires with (written, deleted)."""

    def delete_many(keys, flush_key_cache=True):
        """Delete ``keys``; fires with the number deleted."""

    def delete_component_resources(component):
        """Delete every key of ``component``; fires with the number deleted."""

    def recover_pool_scoped_keys(resources, component=None):
        """Rebuild the key cache of ``resources`` from what etcd holds."""

    def flush_key_cache():
        """Write the key cache now."""

    def flush_key_cache_soon():
        """Write the key cache after the writes in progress."""

    def on_health_change(observer):
        """Call ``observer(healthy)`` whenever the store's health flips."""

    def remove_health_observer(observer):
        """Stop calling ``observer`` on health changes."""

    def on_new_term(observer):
        """Call ``observer()`` when etcd reports a new raft term."""

    def remove_new_term_observer(observer):
        """Stop calling ``observer`` on new terms."""

    def close():
        """Stop the store's timers; the store is not used afterwards."""
