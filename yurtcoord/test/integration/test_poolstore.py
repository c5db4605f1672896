"""The pool store on a real etcd, read back with etcdctl as the independent reader: on
the preferred version, on 3.5 and 3.4 where what it sees differs, over mutual TLS, and
on an etcd started with small limits that its batches must fit. Its timing and
cancellation on a Clock are in the unit tier."""

import json
import os
import socket

from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.etcd.interfaces import IEtcdKeyValue
from yurtcoord.etcd.errors import EtcdTimeout, EtcdUnavailable, RequestRejected
from yurtcoord.kube import gvr
from yurtcoord.pool.keycache import KEY_CACHE_FILE_NAME, ComponentKeyCache
from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.keys import InvalidKey, KeyBuildInfo, ResourceId, format_rv
from yurtcoord.pool.store import (
    KeyExists, KeyNotFound, ObjectTooLarge, PoolStore, UpdateConflict, WriteOutcome, open_pool_store,
)
from yurtcoord.sim.etcd import preferred_etcd_binary
from yurtcoord.testing.etcdstore import ETCD_34, ETCD_35, EtcdStoreCase
from yurtcoord.testing.storedobjects import make_object
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.sharedetcd import use_shared_etcd


def metric_value(metrics, name, **labels):
    """A sample's value from the agent's registry, None when absent."""
    return metrics.registry.get_sample_value(name, labels)


class PoolStoreBehaviour(EtcdStoreCase):

    @defer.inlineCallbacks
    def test_create_writes_object_and_padded_mirror(self):
        pod = make_object("nginx", "default", 1234)
        node = make_object("edge-1", "", 77, kind="Node")
        yield self.store.create(self.key("pods", "nginx", "default"), pod)
        yield self.store.create(self.key("nodes", "edge-1"), node, rv=77)
        self.assertEqual(self.dump(), {"/registry/pods/default/nginx": pod,
                                       "/registry/minions/edge-1": node})
        self.assertEqual(self.mirrors(), {
            "/registry/pods/default/nginx": "0" * 28 + "1234",
            "/registry/minions/edge-1": "0" * 30 + "77",
        })
        self.assertEqual(self.cache_file(), "kubelet#_v1_nodes:/registry/minions/edge-1;"
                                            "_v1_pods:/registry/pods/default/nginx")

    @defer.inlineCallbacks
    def test_create_on_existing_key_reports_exists(self):
        key = self.key("pods", "p", "default")
        first = make_object("p", "default", 5)
        yield self.store.create(key, first)
        with self.assertRaises(KeyExists):
            yield self.store.create(key, make_object("p", "default", 9))
        self.assertEqual(self.dump(), {key.path: first})
        self.assertEqual(self.mirrors(), {key.path: format_rv(5)})

    @defer.inlineCallbacks
    def test_update_by_resource_version(self):
        key = self.key("pods", "p", "default")
        yield self.store.create(key, make_object("p", "default", 5))
        newer = make_object("p", "default", 10)
        yield self.store.update(key, newer, 10)
        self.assertEqual(self.dump(), {key.path: newer})
        self.assertEqual(self.mirrors(), {key.path: format_rv(10)})
        for stale_rv in (9, 10):
            with self.assertRaises(UpdateConflict) as ctx:
                yield self.store.update(key, make_object("p", "default", stale_rv), stale_rv)
            self.assertEqual(ctx.exception.stored, newer)
            self.assertEqual(ctx.exception.stored_rv, 10)
        self.assertEqual(self.dump(), {key.path: newer})
        self.assertEqual(self.mirrors(), {key.path: format_rv(10)})
        # Numeric, not textual, order: 9 < 10 although "9" > "10".
        yield self.store.update(key, make_object("p", "default", 100), 100)
        self.assertEqual(self.mirrors(), {key.path: format_rv(100)})
        with self.assertRaises(KeyNotFound):
            yield self.store.update(self.key("pods", "absent", "default"), newer, 11)
        self.assertNotIn("/registry/pods/default/absent", self.dump())

    @defer.inlineCallbacks
    def test_get_and_list_use_trailing_slash(self):
        objects = [
            (self.key("pods", "a", "default"), make_object("a", "default", 1)),
            (self.key("pods", "b", "default-2"), make_object("b", "default-2", 2)),
            (self.key("podsecuritypolicies", "psp", group="policy", version="v1beta1"),
             make_object("psp", "", 3)),
        ]
        yield self.create_all(objects)
        self.assertEqual((yield self.store.get(objects[0][0])), objects[0][1])
        self.assertEqual((yield self.store.get("/registry/pods/default/a")), objects[0][1])
        with self.assertRaises(KeyNotFound):
            yield self.store.get("/registry/pods/default/zz")
        self.assertEqual((yield self.store.list("/registry/pods/default/")), [objects[0][1]])
        # Key order: "default-2/" sorts before "default/".
        self.assertEqual((yield self.store.list("/registry/pods/")),
                         [objects[1][1], objects[0][1]])
        self.assertEqual((yield self.store.list_keys(self.store.keys.list_prefix("", "pods"))),
                         ["/registry/pods/default-2/b", "/registry/pods/default/a"])
        self.assertEqual((yield self.store.get_resource_version(objects[1][0])), 2)
        with self.assertRaises(ValueError):
            yield self.store.list("/registry/pods")

    @defer.inlineCallbacks
    def test_delete_removes_object_and_mirror(self):
        keep = self.key("pods", "keep", "default")
        gone = self.key("pods", "gone", "default")
        yield self.create_all([(keep, make_object("keep", "default", 1)),
                               (gone, make_object("gone", "default", 2))])
        yield self.store.delete(gone)
        yield self.store.delete(gone)
        self.assertEqual(sorted(self.dump()), [keep.path])
        self.assertEqual(sorted(self.mirrors()), [keep.path])
        self.assertEqual(self.store.list_resource_keys_of_component("kubelet", gvr.PODS),
                         [keep.path])

    @defer.inlineCallbacks
    def test_replace_component_list_touches_only_its_component_resource_namespace(self):
        setup = [
            (self.key("pods", "a", "default"), make_object("a", "default", 1)),
            (self.key("pods", "b", "default"), make_object("b", "default", 1)),
            (self.key("pods", "c", "default-2"), make_object("c", "default-2", 1)),
            (self.key("configmaps", "a", "default"), make_object("a", "default", 1)),
            (self.key("nodes", "n1"), make_object("n1", "", 1)),
            (self.key("pods", "d", "default", component="kube-proxy"),
             make_object("d", "default", 1)),
        ]
        yield self.create_all(setup)
        new_b = make_object("b", "default", 7)
        new_e = make_object("e", "default", 8)
        result = yield self.store.replace_component_list(
            "kubelet", gvr.PODS, "default", [new_b, json.loads(new_e)])
        self.assertEqual(result, (2, 1))
        dump = self.dump()
        self.assertEqual(sorted(dump), sorted([
            "/registry/pods/default/b", "/registry/pods/default/e",
            "/registry/pods/default-2/c", "/registry/configmaps/default/a",
            "/registry/minions/n1", "/registry/pods/default/d",
        ]))
        self.assertEqual(dump["/registry/pods/default/b"], new_b)
        self.assertEqual(json.loads(dump["/registry/pods/default/e"]), json.loads(new_e))
        self.assertEqual(self.mirrors()["/registry/pods/default/e"], format_rv(8))
        self.assertNotIn("/registry/pods/default/a", self.mirrors())
        self.assertEqual(self.store.list_resource_keys_of_component("kubelet", gvr.PODS),
                         ["/registry/pods/default-2/c", "/registry/pods/default/b",
                          "/registry/pods/default/e"])
        reloaded = ComponentKeyCache.in_directory(self.cache_dir).load()
        self.assertEqual(reloaded.keys("kube-proxy"), {"/registry/pods/default/d"})
        self.assertEqual(reloaded.keys("kubelet", gvr.CONFIGMAPS),
                         {"/registry/configmaps/default/a"})

    @defer.inlineCallbacks
    def test_replace_component_list_all_namespaces_and_rejects_foreign_namespace(self):
        yield self.create_all([
            (self.key("pods", "a", "ns1"), make_object("a", "ns1", 1)),
            (self.key("pods", "b", "ns2"), make_object("b", "ns2", 1)),
        ])
        with self.assertRaises(ValueError):
            yield self.store.replace_component_list(
                "kubelet", gvr.PODS, "ns1", [make_object("x", "ns2", 3)])
        self.assertEqual(sorted(self.dump()), ["/registry/pods/ns1/a", "/registry/pods/ns2/b"])
        yield self.store.replace_component_list("kubelet", gvr.PODS, None,
                                                [make_object("c", "ns3", 4)])
        self.assertEqual(sorted(self.dump()), ["/registry/pods/ns3/c"])
        self.assertEqual(sorted(self.mirrors()), ["/registry/pods/ns3/c"])

    @defer.inlineCallbacks
    def test_delete_component_resources(self):
        yield self.create_all([
            (self.key("pods", "a", "default"), make_object("a", "default", 1)),
            (self.key("nodes", "n"), make_object("n", "", 1)),
            (self.key("pods", "b", "default", component="kube-proxy"),
             make_object("b", "default", 1)),
        ])
        deleted = yield self.store.delete_component_resources("kubelet")
        self.assertEqual(deleted, 2)
        self.assertEqual(sorted(self.dump()), ["/registry/pods/default/b"])
        self.assertEqual(sorted(self.mirrors()), ["/registry/pods/default/b"])
        self.assertEqual(self.cache_file(), "kube-proxy#_v1_pods:/registry/pods/default/b")

    @defer.inlineCallbacks
    def test_key_cache_changes_only_after_etcd_accepted(self):
        yield self.create_all([(self.key("pods", "a", "default"), make_object("a", "default", 1))])
        before = self.cache_file()
        self.etcd.kill()
        with self.assertRaises(EtcdUnavailable):
            yield self.store.replace_component_list("kubelet", gvr.PODS, "default",
                                                    [make_object("b", "default", 2)])
        with self.assertRaises(EtcdUnavailable):
            yield self.store.delete_component_resources("kubelet")
        with self.assertRaises(EtcdUnavailable):
            yield self.store.create_or_update_many(
                [(self.key("pods", "c", "default"), make_object("c", "default", 3), 3)])
        self.assertEqual(self.cache_file(), before)
        self.assertEqual(self.store.list_resource_keys_of_component("kubelet", gvr.PODS),
                         ["/registry/pods/default/a"])
        self.etcd.restart()
        yield self.store.replace_component_list("kubelet", gvr.PODS, "default",
                                                [make_object("b", "default", 2)])
        self.assertEqual(self.cache_file(), "kubelet#_v1_pods:/registry/pods/default/b")
        self.assertEqual(sorted(self.dump()), ["/registry/pods/default/b"])

    @defer.inlineCallbacks
    def test_pool_scoped_keys_rebuilt_from_etcd_not_file(self):
        with open(os.path.join(self.cache_dir, KEY_CACHE_FILE_NAME), "w") as f:
            f.write("leader-yurthub#_v1_endpoints:/registry/services/endpoints/old/gone\n"
                    "kubelet#_v1_pods:/registry/pods/default/a\n")
        self.etcd.put("/registry/services/endpoints/kube-system/dns", b"{}")
        self.etcd.put("/registry/services/specs/kube-system/dns", b"{}")
        self.etcd.put("/registry/endpointslices/kube-system/dns-x", b"{}")
        cache = ComponentKeyCache.in_directory(self.cache_dir).load()
        store = self.new_store(self.client, cache)
        rebuilt = yield store.recover_pool_scoped_keys(
            [gvr.ENDPOINTS, gvr.ENDPOINTSLICES_V1])
        self.assertEqual(cache.keys("leader-yurthub", gvr.ENDPOINTS),
                         {"/registry/services/endpoints/kube-system/dns"})
        self.assertEqual(cache.keys("leader-yurthub", gvr.ENDPOINTSLICES_V1),
                         {"/registry/endpointslices/kube-system/dns-x"})
        self.assertEqual(len(rebuilt), 2)
        self.assertEqual(cache.keys("kubelet"), {"/registry/pods/default/a"})
        self.assertEqual(self.cache_file(),
                         "kubelet#_v1_pods:/registry/pods/default/a\n"
                         "leader-yurthub#_v1_endpoints:"
                         "/registry/services/endpoints/kube-system/dns;"
                         "discovery.k8s.io_v1_endpointslices:"
                         "/registry/endpointslices/kube-system/dns-x")

    @defer.inlineCallbacks
    def test_open_pool_store_rebuilds_and_starts(self):
        with open(os.path.join(self.cache_dir, KEY_CACHE_FILE_NAME), "w") as f:
            f.write("leader-yurthub#_v1_endpoints:/registry/services/endpoints/x/stale\n")
        self.etcd.put("/registry/services/endpoints/kube-system/dns", b"{}")
        store = yield open_pool_store(reactor, self.client, "/registry", self.cache_dir,
                                      [gvr.ENDPOINTS], health_interval=60.0)
        self.addCleanup(store.close)
        self.assertEqual(store.list_resource_keys_of_component("leader-yurthub", gvr.ENDPOINTS),
                         ["/registry/services/endpoints/kube-system/dns"])
        yield poll_until(lambda: store.healthy, 15.0, what="store healthy")

    @defer.inlineCallbacks
    def test_open_pool_store_with_a_check_needs_an_answering_etcd(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
        probe.close()
        nobody = EtcdClient(reactor, EtcdConfig(url=f"http://127.0.0.1:{closed_port}"))
        self.addCleanup(nobody.close)
        cache_dir = os.path.join(self.mktemp(), "cache")
        yield self.assertFailure(
            open_pool_store(reactor, nobody, "/registry", cache_dir, [], check_timeout=2.0),
            EtcdUnavailable, EtcdTimeout)
        self.assertEqual(os.listdir(cache_dir), [])
        store = yield open_pool_store(reactor, self.client, "/registry", cache_dir, [],
                                      check_timeout=2.0, health_interval=60.0)
        self.addCleanup(store.close)
        key = store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", "p"))
        yield store.create(key, make_object("p", "ns", 3))
        self.assertEqual(os.listdir(cache_dir), [KEY_CACHE_FILE_NAME])

    @defer.inlineCallbacks
    def test_open_pool_store_sets_a_corrupt_key_cache_aside(self):
        path = os.path.join(self.cache_dir, KEY_CACHE_FILE_NAME)
        with open(path, "w") as f:
            f.write("kubelet#_v1_pods:/a\nnot a cache line\n")
        store = yield open_pool_store(reactor, self.client, "/registry", self.cache_dir, [],
                                      health_interval=60.0)
        self.addCleanup(store.close)
        self.assertEqual(store.list_resource_keys_of_component("kubelet", gvr.PODS), [])
        self.assertTrue(os.path.exists(path + ".corrupt"))
        key = store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", "p"))
        yield store.create(key, make_object("p", "ns", 3))
        with open(path) as f:
            self.assertEqual("kubelet#_v1_pods:/registry/pods/ns/p", f.read())

    @defer.inlineCallbacks
    def test_create_or_update_many(self):
        older = self.key("pods", "older", "ns")
        equal = self.key("pods", "equal", "ns")
        newer_stored = self.key("pods", "newer-stored", "ns")
        yield self.create_all([(older, make_object("older", "ns", 5)),
                               (equal, make_object("equal", "ns", 5)),
                               (newer_stored, make_object("newer-stored", "ns", 50))])
        dup = self.key("pods", "dup", "ns")
        items = [(self.key("pods", f"new-{i}", "ns"), make_object(f"new-{i}", "ns", 100 + i),
                  100 + i) for i in range(3)]
        items += [(older, make_object("older", "ns", 10), 10),
                  (equal, make_object("equal", "ns", 5, padding=1), 5),
                  (newer_stored, make_object("newer-stored", "ns", 7), 7),
                  (dup, make_object("dup", "ns", 12), 12),
                  (dup, make_object("dup", "ns", 11), 11)]
        outcome = yield self.store.create_or_update_many(items)
        self.assertEqual(sorted(outcome.created),
                         ["/registry/pods/ns/dup"]
                         + [f"/registry/pods/ns/new-{i}" for i in range(3)])
        self.assertEqual(outcome.updated, [older.path])
        self.assertEqual(sorted(outcome.not_newer), [equal.path, newer_stored.path])
        dump, mirrors = self.dump(), self.mirrors()
        self.assertEqual(dump[older.path], make_object("older", "ns", 10))
        self.assertEqual(dump[equal.path], make_object("equal", "ns", 5))
        self.assertEqual(dump[newer_stored.path], make_object("newer-stored", "ns", 50))
        self.assertEqual(dump[dup.path], make_object("dup", "ns", 12))
        self.assertEqual(mirrors[dup.path], format_rv(12))
        self.assertEqual(mirrors[newer_stored.path], format_rv(50))
        self.assertEqual(len(dump), 7)
        again = yield self.store.create_or_update_many(items)
        self.assertEqual((again.created, again.updated), ([], []))
        self.assertEqual(self.dump(), dump)
        self.assertEqual((yield self.store.create_or_update(older, make_object("older", "ns", 11))),
                         "updated")

    @defer.inlineCallbacks
    def test_write_whose_answer_was_lost_counts_once(self):
        """etcd applied a batch but the connection died before the answer came back."""
        client = AnswerLosingClient(self.client)
        store = self.new_store(client, self.key_cache)
        items = [(self.key("pods", f"p{i}", "ns"), make_object(f"p{i}", "ns", 10 + i), 10 + i)
                 for i in range(5)]
        outcome = WriteOutcome()
        with self.assertRaises(EtcdUnavailable):
            yield store.create_or_update_many(items, outcome)
        self.assertEqual(len(self.dump()), 5)
        self.assertEqual(sorted(outcome.in_doubt), sorted(k.path for k, _v, _rv in items))
        yield store.create_or_update_many(items, outcome)
        self.assertEqual(sorted(outcome.created), sorted(k.path for k, _v, _rv in items))
        self.assertEqual((outcome.updated, outcome.not_newer, outcome.in_doubt), ([], [], {}))
        self.assertEqual(len(store.list_resource_keys_of_component("kubelet", gvr.PODS)), 5)

    @defer.inlineCallbacks
    def test_guarded_writes_carry_no_reads_and_a_failed_guard_reads_once(self):
        """A first upload sends only the guarded writes; when a guard fails, one read
        of the batch plans the next round, and the outcome is as before."""
        client = RecordingClient(self.client)
        verifyObject(IEtcdKeyValue, client)
        store = self.new_store(client, self.key_cache, max_ops=8)
        items = [(self.key("pods", f"p{i}", "ns"), make_object(f"p{i}", "ns", 10 + i), 10 + i)
                 for i in range(8)]
        outcome = yield store.create_or_update_many(items)
        self.assertEqual(len(outcome.created), 8)
        # Two batches of 4 objects: 4 compares and 8 puts each, no failure branch.
        self.assertEqual(client.shapes, [(4, 8, 0, True)] * 2)
        client.shapes.clear()
        # The first two one resourceVersion newer, the others as stored.
        newer = [(self.key("pods", f"p{i}", "ns"),
                  make_object(f"p{i}", "ns", 10 + i + (i < 2)), 10 + i + (i < 2))
                 for i in range(8)]
        again = yield store.create_or_update_many(newer)
        self.assertEqual(sorted(again.updated), sorted(k.path for k, _v, _rv in newer[:2]))
        self.assertEqual(len(again.not_newer), 6)
        # Batch 1: failed write, read (8 reads), a write of the 2 newer (4 compares);
        # batch 2: failed write and read, nothing newer.
        self.assertEqual(sorted(client.shapes), sorted([
            (4, 8, 0, False), (0, 8, 0, True), (4, 4, 0, True),
            (4, 8, 0, False), (0, 8, 0, True)]))
        self.assertEqual(self.mirrors()[newer[0][0].path], format_rv(11))

    @defer.inlineCallbacks
    def test_in_flight_bounds_the_transactions_of_one_call(self):
        client = RecordingClient(self.client)
        store = self.new_store(client, self.key_cache, max_ops=4, parallel_batches=4)
        items = [(self.key("pods", f"p{i}", "ns"), make_object(f"p{i}", "ns", 10 + i), 10 + i)
                 for i in range(20)]
        yield store.create_or_update_many(items[:10])
        self.assertEqual(client.most_in_flight, 4)
        client.most_in_flight = 0
        outcome = yield store.create_or_update_many(items[10:], in_flight=1)
        self.assertEqual(client.most_in_flight, 1)
        self.assertEqual(len(outcome.created), 10)
        self.assertEqual(len(self.dump()), 20)
        with self.assertRaises(ValueError):
            yield store.create_or_update_many(items, in_flight=0)

    @defer.inlineCallbacks
    def test_replace_whose_answer_was_lost_still_owns_the_keys(self):
        """etcd applied a list batch but the answer was lost; the objects are deleted
        from the source meanwhile: the next list must delete them from etcd too."""
        client = AnswerLosingClient(self.client)
        store = self.new_store(client, self.key_cache)
        endpoints = [make_object(f"svc-{i}", "default", 10 + i, kind="Endpoints")
                     for i in range(4)]
        with self.assertRaises(EtcdUnavailable):
            yield store.replace_component_list("leader-yurthub", gvr.ENDPOINTS, None, endpoints)
        self.assertEqual(len(self.dump("/registry/services/endpoints/")), 4)
        yield store.replace_component_list("leader-yurthub", gvr.ENDPOINTS, None, endpoints[:1])
        self.assertEqual(sorted(self.dump("/registry/services/endpoints/")),
                         ["/registry/services/endpoints/default/svc-0"])

    @defer.inlineCallbacks
    def test_replace_refused_before_sending_owns_nothing_new(self):
        yield self.store.replace_component_list("leader-yurthub", gvr.ENDPOINTS, None, [])
        self.etcd.kill()
        with self.assertRaises(EtcdUnavailable):
            yield self.store.replace_component_list(
                "leader-yurthub", gvr.ENDPOINTS, None,
                [make_object("svc-0", "default", 10, kind="Endpoints")])
        self.assertEqual(self.store.list_resource_keys_of_component(
            "leader-yurthub", gvr.ENDPOINTS), [])

    @defer.inlineCallbacks
    def test_concurrent_writers_never_regress(self):
        """Three agents upload overlapping versions of the same objects at once."""
        count = 150
        writers = []
        for offset in range(3):
            cache = ComponentKeyCache(os.path.join(self.cache_dir, f"w{offset}")).load()
            writers.append(self.new_store(self.new_client(), cache, max_ops=16))
        expected = {}
        batches = []
        for w, store in enumerate(writers):
            items = []
            for i in range(count):
                rv = 1000 + ((i + w) % 3) * 10 + i * 100
                key = store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", f"p{i}"))
                value = make_object(f"p{i}", "ns", rv, padding=w)
                items.append((key, value, rv))
                if rv > expected.get(key.path, (0, b""))[0]:
                    expected[key.path] = (rv, value)
            batches.append(items)
        outcomes = yield defer.gatherResults(
            [store.create_or_update_many(items) for store, items in zip(writers, batches)],
            consumeErrors=True)
        dump, mirrors = self.dump(), self.mirrors()
        self.assertEqual(dump, {path: value for path, (_rv, value) in expected.items()})
        self.assertEqual(mirrors, {path: format_rv(rv) for path, (rv, _v) in expected.items()})
        writes = sum(len(o.created) + len(o.updated) for o in outcomes)
        self.assertGreaterEqual(writes, count)
        self.assertEqual(sum(len(o.created) for o in outcomes), count)

    # -- hostile and broken data in the pool etcd ---------------------------------------

    @defer.inlineCallbacks
    def test_keys_that_are_not_utf8_are_skipped_counted_and_logged_once(self):
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        metrics = Metrics("edge-1")
        store = self.new_store(self.client, self.key_cache, metrics=metrics)
        good = "/registry/services/endpoints/kube-system/dns"
        self.etcd.put(good, b"{}")
        # Any pool member can write such keys; the gateway takes any bytes.
        for bad in (b"/registry/services/endpoints/x/\xff\xfe",
                    b"/registry/endpointslices/kube-system/\xc3(",
                    b"/registry/endpointslices/kube-system/\x80" + b"y" * 400):
            yield self.client.put(bad, b"{}")
        rebuilt = yield store.recover_pool_scoped_keys([gvr.ENDPOINTS, gvr.ENDPOINTSLICES_V1])
        self.assertEqual(rebuilt, {ResourceId.of(gvr.ENDPOINTS): {good},
                                   ResourceId.of(gvr.ENDPOINTSLICES_V1): set()})
        self.assertEqual(metric_value(metrics, "yurtcoord_pool_store_undecodable_keys_total"),
                         3.0)
        logged = [e for e in events if "not UTF-8" in e.get("log_format", "")]
        self.assertEqual(len(logged), 1)
        self.assertEqual(logged[0]["count"], 3)
        self.assertEqual(logged[0]["log_level"].name, "warn")
        self.assertEqual(logged[0]["example"], "/registry/services/endpoints/x/\\xff\\xfe")
        # Pool sync's cleanup deletes what was adopted and leaves the skipped keys.
        yield store.delete_component_resources("leader-yurthub")
        left = self.etcd.read("/registry/", prefix=True)
        self.assertEqual(len(left), 3)
        self.assertNotIn(good.encode(), left)
        self.assertEqual((yield store.list_keys("/registry/endpointslices/")), [])

    @defer.inlineCallbacks
    def test_a_list_never_regresses_a_newer_object(self):
        key = self.key("services", "dns", "kube-system", component="leader-yurthub")
        newer = make_object("dns", "kube-system", 900, kind="Service")
        yield self.store.create(key, newer)
        stale_copy = make_object("dns", "kube-system", 100, kind="Service")
        other = make_object("other", "kube-system", 50, kind="Service")
        yield self.store.replace_component_list("leader-yurthub", gvr.SERVICES, None,
                                                [stale_copy, other])
        self.assertEqual(self.dump("/registry/services/specs/")[key.path], newer)
        self.assertEqual(self.mirrors("/registry/services/specs/")[key.path], format_rv(900))
        self.assertEqual(self.store.list_resource_keys_of_component("leader-yurthub",
                                                                    gvr.SERVICES),
                         ["/registry/services/specs/kube-system/dns",
                          "/registry/services/specs/kube-system/other"])
        # A newer copy in the next list is written.
        newest = make_object("dns", "kube-system", 901, kind="Service")
        yield self.store.replace_component_list("leader-yurthub", gvr.SERVICES, None,
                                                [newest])
        self.assertEqual(self.dump("/registry/services/specs/"), {key.path: newest})

    @defer.inlineCallbacks
    def test_empty_values_and_empty_components_are_refused(self):
        key = self.key("pods", "p", "ns")
        with self.assertRaises(ValueError):
            yield self.store.create_or_update_many([(key, b"", 5)])
        with self.assertRaises(ValueError):
            yield self.store.create_or_update(key, b"", 5)
        with self.assertRaises(ValueError):
            yield self.store.create(key, b"", 5)
        with self.assertRaises(InvalidKey):
            yield self.store.replace_component_list("", gvr.PODS, None, [])
        with self.assertRaises(InvalidKey):
            yield self.store.replace_component_list("", gvr.PODS, None,
                                                    [make_object("p", "ns", 5)])
        self.assertEqual(self.dump(), {})
        self.assertEqual(self.key_cache.components(), [])

    @defer.inlineCallbacks
    def test_pool_sync_cleanup_leaves_keys_of_other_components(self):
        """kube-proxy's endpointslices uploaded from this node stay when a new leader
        rebuilds and deletes the pool-scoped keys, also after a restart (file reloaded)."""
        proxy_key = self.key("endpointslices", "web-abc", "default", component="kube-proxy",
                             group="discovery.k8s.io")
        proxy_copy = make_object("web-abc", "default", 70, kind="EndpointSlice")
        yield self.store.create(proxy_key, proxy_copy)
        leader_key = self.key("endpointslices", "old-xyz", "default",
                              component="leader-yurthub", group="discovery.k8s.io")
        yield self.store.create(leader_key, make_object("old-xyz", "default", 60,
                                                        kind="EndpointSlice"))
        # Left by an earlier leader on another node: this node's file never knew it.
        self.etcd.put("/registry/endpointslices/default/gone-1", b"{}")
        reloaded = ComponentKeyCache.in_directory(self.cache_dir).load()
        store = self.new_store(self.client, reloaded)
        rebuilt = yield store.recover_pool_scoped_keys([gvr.ENDPOINTSLICES_V1])
        self.assertEqual(rebuilt[ResourceId.of(gvr.ENDPOINTSLICES_V1)],
                         {leader_key.path, "/registry/endpointslices/default/gone-1"})
        deleted = yield store.delete_component_resources("leader-yurthub")
        self.assertEqual(deleted, 2)
        self.assertEqual(self.dump("/registry/endpointslices/"), {proxy_key.path: proxy_copy})
        self.assertEqual(self.mirrors("/registry/endpointslices/"),
                         {proxy_key.path: format_rv(70)})
        self.assertEqual(ComponentKeyCache.in_directory(self.cache_dir).load().keys(
            "kube-proxy"), {proxy_key.path})

    @defer.inlineCallbacks
    def test_delete_many_batches_and_flushes_once(self):
        objects = [(self.key("pods", f"p{i}", "ns"), make_object(f"p{i}", "ns", 10 + i))
                   for i in range(150)]
        yield self.store.create_or_update_many([(k, v, 10 + i)
                                                for i, (k, v) in enumerate(objects)])
        writes = []
        real_write = self.key_cache.write
        self.key_cache.write = lambda: (writes.append(1), real_write())
        self.addCleanup(setattr, self.key_cache, "write", real_write)
        count = yield self.store.delete_many([k for k, _v in objects[:140]],
                                             flush_key_cache=False)
        self.assertEqual(count, 140)
        self.assertEqual(writes, [])
        self.assertEqual(len(self.dump()), 10)
        self.assertEqual(len(self.mirrors()), 10)
        self.assertEqual(len(self.store.list_resource_keys_of_component("kubelet", gvr.PODS)),
                         10)
        self.store.flush_key_cache()
        self.assertEqual(writes, [1])
        yield self.store.delete_many([objects[140][0].path, "/registry/pods/ns/absent"])
        self.assertEqual(writes, [1, 1])
        self.assertEqual(len(ComponentKeyCache.in_directory(self.cache_dir).load().keys(
            "kubelet")), 9)

    @defer.inlineCallbacks
    def test_restart_between_two_checks_is_seen_as_a_new_term(self):
        store = self.new_store(self.client, self.key_cache, health_interval=3600.0)
        terms, health = [], []
        store.on_new_term(lambda: terms.append(True))
        store.on_health_change(health.append)
        store.start()
        yield poll_until(lambda: store.healthy, 15.0, what="store healthy")
        yield store.check_health()
        self.assertEqual(terms, [])
        self.etcd.kill()
        self.etcd.restart()
        yield store.check_health()
        self.assertEqual(terms, [True])
        self.assertEqual(health, [True])

    @defer.inlineCallbacks
    def test_health_follows_etcd(self):
        store = self.new_store(self.client, self.key_cache, health_interval=0.05,
                               health_timeout=3.0)
        changes = []
        store.on_health_change(changes.append)
        store.start()
        yield poll_until(lambda: store.healthy, 15.0, what="store healthy")
        self.etcd.kill()
        yield poll_until(lambda: not store.healthy, 15.0, what="store unhealthy")
        self.etcd.restart()
        yield poll_until(lambda: store.healthy, 15.0, what="store healthy")
        # Transitions alternate; a slow answer on a loaded machine may add a pair.
        self.assertEqual(changes[:2], [True, False])
        self.assertEqual(changes[-1], True)
        self.assertTrue(all(a != b for a, b in zip(changes, changes[1:])), changes)
        # The same store (and client) keeps working after the restart.
        yield self.store.create(self.key("pods", "after", "ns"), make_object("after", "ns", 1))
        self.assertEqual(list(self.dump()), ["/registry/pods/ns/after"])


class PoolStoreTests(PoolStoreBehaviour, unittest.TestCase):
    etcd_binary = preferred_etcd_binary()


class PoolStoreVersionBehaviour(EtcdStoreCase):
    """What the pool store sees differently on each etcd version."""

    @defer.inlineCallbacks
    def test_health_check_reports_the_etcd_version(self):
        """Differs by version: the health check reports the version etcd runs, and a
        release that may lose acknowledged writes on SIGKILL (3.5.0 to 3.5.2,
        etcd-io/etcd#13766) is logged as a warning, any other as info."""
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        store = self.new_store(self.client, self.key_cache, health_interval=0.05)
        store.start()
        yield poll_until(lambda: store.etcd_version is not None, 15.0, what="etcd version")
        self.assertEqual(store.etcd_version, self.etcd.version)
        logged = [e for e in events if e.get("log_format", "").startswith("pool etcd version")]
        self.assertEqual(len(logged), 1)
        if self.etcd_binary.loses_acknowledged_writes_on_kill:
            self.assertEqual(logged[0]["log_level"].name, "warn")
            self.assertIn("etcd-io/etcd#13766", logged[0]["advice"])
        else:
            self.assertEqual(logged[0]["log_level"].name, "info")


class PoolStoreVersionOnEtcd35(PoolStoreVersionBehaviour, unittest.TestCase):
    etcd_binary = ETCD_35


class PoolStoreVersionOnEtcd34(PoolStoreVersionBehaviour, unittest.TestCase):
    etcd_binary = ETCD_34


class PoolStoreOverMutualTLS(unittest.TestCase):
    """The store against an etcd that requires client certificates."""

    def setUp(self):
        binary = preferred_etcd_binary()
        if binary is None:
            raise unittest.SkipTest("no etcd installed")
        self.etcd = use_shared_etcd(self, binary, tls=True)
        ca = self.etcd.tls_ca
        self.client = EtcdClient(reactor, EtcdConfig(
            self.etcd.client_url, ca_file=ca.ca_file, cert_file=self.etcd.client_cert.cert_file,
            key_file=self.etcd.client_cert.key_file, timeout=5.0))
        self.addCleanup(self.client.close)
        cache_dir = os.path.abspath(self.mktemp())
        self.store = PoolStore(reactor, self.client, "/registry",
                               ComponentKeyCache.in_directory(cache_dir).load())
        self.addCleanup(self.store.close)

    @defer.inlineCallbacks
    def test_create_and_upload_over_tls(self):
        key = self.store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", "a"))
        yield self.store.create(key, make_object("a", "ns", 3))
        outcome = yield self.store.create_or_update_many([(key, make_object("a", "ns", 4), 4)])
        self.assertEqual(outcome.updated, [key.path])
        self.assertEqual(self.etcd.read("/registry/", prefix=True),
                         {key.path.encode(): make_object("a", "ns", 4)})


class BatchLimitsBehaviour(EtcdStoreCase):
    """etcd started with small limits proves that batches really respect them."""

    etcd_args = ("--max-txn-ops", "8", "--max-request-bytes", "65536")
    store_kwargs = {"max_ops": 8, "max_bytes": 65536}

    @defer.inlineCallbacks
    def test_batches_fit_etcd_limits(self):
        objects = [make_object(f"p{i}", "ns", 10 + i, padding=3000) for i in range(40)]
        yield self.store.replace_component_list("kubelet", gvr.PODS, "ns", objects)
        self.assertEqual(len(self.dump()), 40)
        items = [(self.key("pods", f"q{i}", "ns", component="other"),
                  make_object(f"q{i}", "ns", 5, padding=3000), 5) for i in range(60)]
        outcome = yield self.store.create_or_update_many(items)
        self.assertEqual(len(outcome.created), 60)
        self.assertEqual(len(self.mirrors()), 100)
        yield self.store.replace_component_list("kubelet", gvr.PODS, "ns", objects[:3])
        self.assertEqual(len(self.dump()), 63)
        self.assertEqual((yield self.store.delete_component_resources("kubelet")), 3)
        self.assertEqual((yield self.store.delete_component_resources("other")), 60)
        self.assertEqual(self.dump(), {})
        self.assertEqual(self.mirrors(), {})

    @defer.inlineCallbacks
    def test_etcd_really_enforces_the_limits(self):
        unbatched = self.new_store(self.client, ComponentKeyCache(
            os.path.join(self.cache_dir, "other")).load())
        objects = [make_object(f"p{i}", "ns", 10 + i) for i in range(10)]
        with self.assertRaises(RequestRejected):
            yield unbatched.replace_component_list("kubelet", gvr.PODS, "ns", objects)
        self.assertEqual(self.dump(), {})

    @defer.inlineCallbacks
    def test_key_cache_matches_etcd_after_a_batch_in_the_middle_is_rejected(self):
        """Fix 13: batches accepted before the failure are in the cache, the rest not."""
        store = self.new_store(self.client, self.key_cache, max_ops=8)  # bytes unlimited
        objects = [make_object(f"a{i:02d}", "ns", i + 1) for i in range(20)]
        objects.append(make_object("zz-too-big", "ns", 99, padding=70000))
        with self.assertRaises(RequestRejected):
            yield store.replace_component_list("kubelet", gvr.PODS, "ns", objects)
        in_etcd = set(self.dump())
        self.assertEqual(len(in_etcd), 20)
        self.assertEqual(set(self.mirrors()), in_etcd)
        self.assertEqual(set(store.list_resource_keys_of_component("kubelet", gvr.PODS)), in_etcd)
        reloaded = ComponentKeyCache.in_directory(self.cache_dir).load()
        self.assertEqual(reloaded.keys("kubelet", gvr.PODS), in_etcd)

    @defer.inlineCallbacks
    def test_single_object_larger_than_a_request(self):
        big = make_object("big", "ns", 1, padding=70000)
        with self.assertRaises(ObjectTooLarge):
            yield self.store.create_or_update(self.key("pods", "big", "ns"), big)
        with self.assertRaises(ObjectTooLarge):
            yield self.store.create(self.key("pods", "big", "ns"), big)
        outcome = yield self.store.create_or_update_many(
            [(self.key("pods", "big", "ns"), big, 1),
             (self.key("pods", "small", "ns"), make_object("small", "ns", 1), 1)])
        self.assertEqual((outcome.too_large, outcome.created),
                         (["/registry/pods/ns/big"], ["/registry/pods/ns/small"]))
        self.assertEqual(list(self.dump()), ["/registry/pods/ns/small"])


class BatchLimitsTests(BatchLimitsBehaviour, unittest.TestCase):
    etcd_binary = preferred_etcd_binary()


class AnswerLosingClient:
    """Passes requests to a real client; the first transaction's answer is lost."""

    def __init__(self, client):
        self.client = client
        self.lost = False

    def submit(self, txn, raise_on_failure=True):
        d = self.client.submit(txn, raise_on_failure=raise_on_failure)
        if not self.lost:
            self.lost = True

            def lose(_result):
                error = EtcdUnavailable("connection lost before the answer")
                error.maybe_applied = True
                raise error

            d.addCallback(lose)
        return d

    def __getattr__(self, name):
        return getattr(self.client, name)


@implementer(IEtcdKeyValue)
class RecordingClient:
    """Passes requests to a real client; records each transaction's shape
    ``(compares, success operations, failure operations, succeeded)`` in ``shapes``
    and the most transactions in flight at once in ``most_in_flight``."""

    def __init__(self, client):
        self.client = client
        self.shapes = []
        self.in_flight = 0
        self.most_in_flight = 0

    def submit(self, txn, raise_on_failure=True, timeout=None):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        d = self.client.submit(txn, raise_on_failure=raise_on_failure, timeout=timeout)

        def answered(result):
            self.in_flight -= 1
            self.shapes.append((len(txn.compare or ()), len(txn.success or ()),
                                len(txn.failure or ()), result.succeeded))
            return result

        def failed(failure):
            self.in_flight -= 1
            return failure

        d.addCallbacks(answered, failed)
        return d

    def __getattr__(self, name):
        return getattr(self.client, name)
