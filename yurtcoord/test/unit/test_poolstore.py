"""The pool store without an etcd: the key cache file flushed at most once per interval
and the health loop on a Clock (unreachable after two failed checks, the etcd version
and a new raft term reported) against a status client the test answers; every
operation cancelled while its etcd request hangs, and what the store reads off an
object's metadata. The store on a real etcd is in the integration tier."""

import os

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.etcd.errors import EtcdUnavailable
from yurtcoord.etcd.interfaces import IEtcdKeyValue
from yurtcoord.kube import gvr
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keys import KeyBuildInfo
from yurtcoord.pool.store import PoolStore, object_metadata
from yurtcoord.testing.hangingetcd import HangingClient
from yurtcoord.testing.storedobjects import make_object


class Status:
    """What the fake etcd's status answers with: a version and a raft term."""

    def __init__(self, version, raft_term=None):
        self.version = version
        self.raft_term = raft_term


@implementer(IEtcdKeyValue)
class FakeStatusClient:
    """Answers ``status()`` with Deferreds the test fires; the tests that use it
    read and write nothing, so every other call fails."""

    def __init__(self):
        self.pending = []

    def status(self, timeout=None):
        d = defer.Deferred()
        self.pending.append(d)
        return d

    def get(self, key, timeout=None):
        return defer.fail(AssertionError(f"unexpected read of {key!r}"))

    def range_page(self, keys, keys_only=False, limit=None, revision=None,
                   count_only=False, serializable=False, timeout=None):
        return defer.fail(AssertionError(f"unexpected read of {keys!r}"))

    def submit(self, txn, raise_on_failure=True, timeout=None):
        return defer.fail(AssertionError("unexpected transaction"))

    def close(self):
        return defer.succeed(None)


class KeyCacheFlushTimingTests(unittest.TestCase):
    """``flush_key_cache_soon`` on an injected clock: one file write per interval."""

    def test_writes_at_most_once_per_interval_and_close_writes_the_rest(self):
        clock = Clock()
        clock.advance(100)
        cache = ComponentKeyCache.in_directory(self.mktemp()).load()
        writes = []
        real_write = cache.write
        cache.write = lambda: (writes.append(clock.seconds()), real_write())
        store = PoolStore(clock, FakeStatusClient(), "/registry", cache,
                          key_cache_flush_interval=1.0)
        for i in range(50):
            cache.add("leader-yurthub", gvr.PODS, [f"/registry/pods/ns/p{i}"])
            store.flush_key_cache_soon()
            clock.advance(0.25)
        self.assertEqual(writes, [100.0 + i for i in range(13)])
        self.assertTrue(cache.dirty)
        store.flush_key_cache_soon()
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        self.successResultOf(store.close())
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertEqual(len(writes), 14)
        # After close no timer is started: a late change is written at once.
        cache.add("leader-yurthub", gvr.PODS, ["/registry/pods/ns/late"])
        store.flush_key_cache_soon()
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertEqual(len(writes), 15)
        self.assertEqual(len(ComponentKeyCache(cache.path, rebuilt_components=()).load()
                             .keys("leader-yurthub")), 51)


class HealthLoopTests(unittest.TestCase):
    def test_loop_on_injected_clock(self):
        clock = Clock()
        client = FakeStatusClient()
        verifyObject(IEtcdKeyValue, client)
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=5.0)
        seen = []
        store.on_health_change(seen.append)
        store.start()
        self.assertEqual(len(client.pending), 1)
        client.pending[0].callback(Status("3.5.1"))
        self.assertTrue(store.healthy)
        clock.advance(4.9)
        self.assertEqual(len(client.pending), 1)
        clock.advance(0.1)
        self.assertEqual(len(client.pending), 2)
        client.pending[1].errback(EtcdUnavailable("gone"))
        self.assertFalse(store.healthy)
        clock.advance(5)
        self.assertEqual(len(client.pending), 3)
        store.close()
        self.assertTrue(client.pending[2].called)
        self.assertEqual(seen, [True, False])
        self.assertFalse(clock.getDelayedCalls())

    def test_unreachable_after_two_failed_checks_in_a_row_and_until_a_good_one(self):
        """One failed check (a timeout on a busy machine, a member mid-election) leaves
        readiness alone; the second in a row makes the pool etcd unreachable, with the
        latest reason; the next good check ends it."""
        clock = Clock()
        client = FakeStatusClient()
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=5.0)
        seen = []
        store.on_unreachable_change(seen.append)
        store.start()
        client.pending[0].callback(Status("3.5.1"))
        clock.advance(5)
        client.pending[1].errback(EtcdUnavailable("first"))
        self.assertFalse(store.healthy)
        self.assertIsNone(store.unreachable)
        clock.advance(5)
        client.pending[2].callback(Status("3.5.1"))
        clock.advance(5)
        client.pending[3].errback(EtcdUnavailable("one"))
        self.assertEqual(seen, [])
        clock.advance(5)
        client.pending[4].errback(EtcdUnavailable("two"))
        self.assertEqual(store.unreachable, "two")
        clock.advance(5)
        client.pending[5].errback(EtcdUnavailable("three"))
        self.assertEqual(store.unreachable, "three")
        clock.advance(5)
        client.pending[6].callback(Status("3.5.1"))
        self.assertIsNone(store.unreachable)
        self.assertEqual(seen, ["two", None])
        store.close()

    def test_close_cancels_every_health_check_still_waiting(self):
        clock = Clock()
        client = FakeStatusClient()
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=5.0)
        store.start()  # the loop's check is under way
        asked = store.check_health()  # and one more, asked from outside the loop
        self.assertEqual(len(client.pending), 2)
        store.close()
        self.assertTrue(all(d.called for d in client.pending))
        self.assertIsNone(self.successResultOf(asked))
        self.assertFalse(store.healthy)

    def test_etcd_version_logged_once_and_bad_releases_warned(self):
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        clock = Clock()
        client = FakeStatusClient()
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=1.0)
        store.start()
        for version in ("3.4.23", "3.4.23", "3.5.1", "3.5.1", "3.5.3"):
            client.pending[-1].callback(Status(version))
            clock.advance(1.0)
        store.close()
        logged = [(e["log_level"].name, e["version"]) for e in events
                  if e.get("log_format", "").startswith("pool etcd version")]
        self.assertEqual(logged, [("info", "3.4.23"), ("warn", "3.5.1"), ("info", "3.5.3")])
        self.assertEqual(store.etcd_version, "3.5.3")

    def test_new_raft_term_between_two_reachable_checks_is_reported(self):
        clock = Clock()
        client = FakeStatusClient()
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=1.0)
        terms, health = [], []
        store.on_new_term(lambda: terms.append(clock.seconds()))
        store.on_health_change(health.append)
        store.start()
        for answer in (2, 2, 3, 3, "down", 4, 4, 5):
            if answer == "down":
                client.pending[-1].errback(EtcdUnavailable("gone"))
            else:
                client.pending[-1].callback(Status("3.5.1", raft_term=answer))
            clock.advance(1.0)
        store.close()
        # Term 3 was found between two reachable checks, and so was term 5; term 4
        # came after an outage, which the health observers heard of.
        self.assertEqual(terms, [2.0, 7.0])
        self.assertEqual(health, [True, False, True])


    def test_observers_are_told_in_order_past_one_that_raises_and_removed_ones_are_not(self):
        """The three kinds of change each go to their ``Observers``: an observer that
        raises is logged and the ones after it are still told; a removed one is not."""
        clock = Clock()
        client = FakeStatusClient()
        store = PoolStore(clock, client, "/registry", ComponentKeyCache(self.mktemp()),
                          health_interval=1.0)
        told = []

        def broken(*args):
            raise RuntimeError("broken observer")

        def removed(*args):
            told.append("removed")

        for add, remove, name in [
                (store.on_health_change, store.remove_health_observer, "health"),
                (store.on_unreachable_change, store.remove_unreachable_observer,
                 "unreachable"),
                (store.on_new_term, store.remove_new_term_observer, "term")]:
            add(broken)
            add(removed)
            add(lambda *args, name=name: told.append((name,) + args))
            remove(removed)
            remove(removed)  # not registered any more: nothing
        store.start()
        for answer in (2, 3, "down", "down"):
            if answer == "down":
                client.pending[-1].errback(EtcdUnavailable("gone"))
            else:
                client.pending[-1].callback(Status("3.5.1", raft_term=answer))
            clock.advance(1.0)
        store.close()
        self.assertEqual(told, [("health", True), ("term",), ("health", False),
                                ("unreachable", "gone")])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 4)


class CancellationTests(unittest.TestCase):
    def setUp(self):
        self.store = PoolStore(Clock(), HangingClient(), "/registry",
                               ComponentKeyCache(os.path.join(self.mktemp(), "cache")))
        self.key = self.store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", "a"))

    def test_cancelled_operations_end_with_cancelled_error(self):
        value = make_object("a", "ns", 1)
        operations = [
            lambda: self.store.create_or_update_many([(self.key, value, 1)]),
            lambda: self.store.create_or_update(self.key, value),
            lambda: self.store.create(self.key, value),
            lambda: self.store.update(self.key, value, 1),
            lambda: self.store.get(self.key),
            lambda: self.store.delete(self.key),
            lambda: self.store.list("/registry/pods/"),
            lambda: self.store.replace_component_list("kubelet", gvr.PODS, "ns", [value]),
            lambda: self.store.recover_pool_scoped_keys([gvr.ENDPOINTS]),
        ]
        for operation in operations:
            d = operation()
            self.assertNoResult(d)
            d.cancel()
            self.failureResultOf(d, defer.CancelledError)
        # A list write cancelled in flight may have been applied: its key is owned
        # (at worst one useless delete later), nothing else is.
        self.assertEqual(self.store.key_cache.components(), ["kubelet"])
        self.assertEqual(self.store.list_resource_keys_of_component("kubelet", gvr.PODS),
                         [self.key.path])

    def test_cancelled_batched_write_owns_its_keys(self):
        """A create-or-update cancelled in flight (a role change cancelling an upload)
        may have landed; nobody settles that doubt later, so its keys are owned, and
        the key cache file says so."""
        other = self.store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", "b"))
        d = self.store.create_or_update_many([(self.key, make_object("a", "ns", 1), 1),
                                              (other, make_object("b", "ns", 1), 1)])
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(self.store.list_resource_keys_of_component("kubelet", gvr.PODS),
                         sorted([self.key.path, other.path]))
        on_disk = ComponentKeyCache(self.store.key_cache.path).load()
        self.assertEqual(sorted(on_disk.keys("kubelet", gvr.PODS)),
                         sorted([self.key.path, other.path]))

    def test_bad_arguments_fail_the_deferred(self):
        self.failureResultOf(self.store.list("/registry/pods"), ValueError)
        self.failureResultOf(self.store.create("/registry/pods/ns/a", b"{}"), TypeError)
        self.failureResultOf(self.store.replace_component_list(
            "kubelet", gvr.PODS, "ns", [b"not json"]), ValueError)


class ObjectMetadataTests(unittest.TestCase):
    def test_reasons(self):
        self.assertEqual(object_metadata(make_object("a", "b", 12)), ("a", "b", 12))
        # The largest resourceVersion a mirror rv holds, with leading zeros too.
        largest = b'{"metadata":{"name":"a","resourceVersion":"00%s"}}' % (b"9" * 32)
        self.assertEqual(object_metadata(largest), ("a", "", 10 ** 32 - 1))
        for data, reason in [(b"{", "not JSON"), (b"[]", "metadata"),
                             (b'{"metadata":{}}', "no resourceVersion"),
                             (b'{"metadata":{"resourceVersion":"abc"}}', "not a number"),
                             (b'{"metadata":{"resourceVersion":12}}', "no resourceVersion"),
                             (b'{"metadata":{"resourceVersion":"1%s"}}' % (b"0" * 32),
                              "not a number"),
                             (b"\xff\xfe", "not JSON")]:
            with self.assertRaises(ValueError) as ctx:
                object_metadata(data)
            self.assertIn(reason, str(ctx.exception))
