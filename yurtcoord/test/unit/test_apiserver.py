"""The Kubernetes API test server without a socket: its selectors, its store and watch
streams on a Clock, and property tests of bad input (over its HTTP stack in memory)
and of the store."""

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial import unittest
from twisted.web.test.requesthelper import DummyRequest
from zope.interface.verify import verifyObject

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.errors import AlreadyExists, Conflict, Gone, NotFound
from yurtcoord.sim.apiserver import Catalog, ObjectStore
from yurtcoord.sim.apiserver.selectors import (
    FieldSelector, LabelSelector, ObjectFilter, SelectorError)
from yurtcoord.sim.apiserver.storage import IObjectStorage, MemoryStorage
from yurtcoord.sim.apiserver.watch import REPLAY_BATCH, WatchStream, encode_event
from yurtcoord.testing.apiservercase import configmap
from yurtcoord.testing.inmemoryhttp import InMemoryHTTP

# Property tests run a fixed example set by default (stable CI); set
# YURTCOORD_HYPOTHESIS_EXAMPLES to search more widely with fresh randomness.
EXAMPLES = int(os.environ.get("YURTCOORD_HYPOTHESIS_EXAMPLES", "200"))
DERANDOMIZE = "YURTCOORD_HYPOTHESIS_EXAMPLES" not in os.environ


class SelectorUnitTests(unittest.TestCase):

    def test_label_selector_parse_and_match(self):
        selector = LabelSelector("a in (x, y),b!=z,!c,d")
        self.assertTrue(selector.matches({"a": "x", "d": ""}))
        self.assertFalse(selector.matches({"a": "x", "b": "z", "d": ""}))
        self.assertFalse(selector.matches({"a": "x", "c": "1", "d": ""}))
        self.assertFalse(selector.matches({"a": "q", "d": ""}))
        self.assertTrue(LabelSelector("").matches({}))
        for bad in ("a in (x", "a in ()", "=x", "a=b c", "a notin x)"):
            self.assertRaises(SelectorError, LabelSelector, bad)

    def test_field_selector(self):
        obj = {"metadata": {"name": "n", "namespace": "ns"}, "spec": {"nodeName": "e1"}}
        self.assertTrue(FieldSelector("metadata.name=n,metadata.namespace!=x").matches(obj))
        self.assertFalse(FieldSelector("metadata.name==m").matches(obj))
        self.assertTrue(FieldSelector("spec.nodeName=e1").matches(obj))
        self.assertRaises(SelectorError, FieldSelector, "metadata.name")


class StoreUnitTests(unittest.TestCase):
    """The store alone, on a fake clock."""

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1700000000)
        self.store = ObjectStore(Catalog(), self.clock, history=3)

    def test_typed_errors(self):
        self.store.create(gvrs.LEASES, {"metadata": {"name": "l", "namespace": "ns"}})
        self.assertRaises(AlreadyExists, self.store.create, gvrs.LEASES,
                          {"metadata": {"name": "l", "namespace": "ns"}})
        self.assertRaises(NotFound, self.store.delete, gvrs.LEASES, "x", "ns")
        self.assertRaises(Conflict, self.store.update, gvrs.LEASES,
                          {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"}})
        lease = self.store.get(gvrs.LEASES, "l", "ns")
        self.assertEqual(lease["metadata"]["creationTimestamp"], "2023-11-14T22:13:20Z")
        self.assertEqual(self.store.list(gvrs.LEASES, "other"), [])
        self.assertEqual(len(self.store.list(gvrs.LEASES)), 1)

    def test_watch_replay_and_expiry(self):
        events = []
        for name in "abcde":
            self.store.create(gvrs.PODS, {"metadata": {"name": name}})
        self.assertRaises(Gone, self.store.watch, gvrs.PODS, ObjectFilter(), 1,
                          lambda t, o: events.append(t))
        watcher = self.store.watch(gvrs.PODS, ObjectFilter(), 3,
                                   lambda t, o: events.append(o["metadata"]["name"]))
        self.assertEqual(events, ["d", "e"])
        self.store.create(gvrs.CONFIGMAPS, {"metadata": {"name": "x"}})
        self.store.create(gvrs.PODS, {"metadata": {"name": "f"}})
        watcher.cancel()
        self.store.create(gvrs.PODS, {"metadata": {"name": "g"}})
        self.assertEqual(events, ["d", "e", "f"])
        self.store.compact()
        self.assertRaises(Gone, self.store.watch, gvrs.PODS, ObjectFilter(),
                          self.store.resource_version - 1, lambda t, o: None)
        self.assertEqual(self.store.watcher_count(), 0)

    def test_a_lazy_replay_hands_on_events_only_when_asked(self):
        self.store = ObjectStore(Catalog(), self.clock, history=100)
        # As kube-apiserver's watch cache hands a new watcher its interval: nothing
        # of the history is looked at within the call, changes wait behind it.
        for name in "abc":
            self.store.create(gvrs.PODS, {"metadata": {"name": name, "namespace": "x"}})
        since = self.store.resource_version
        self.store.create(gvrs.CONFIGMAPS, {"metadata": {"name": "cm", "namespace": "x"}})
        self.store.create(gvrs.PODS, {"metadata": {"name": "other", "namespace": "y"}})
        for name in "def":
            self.store.create(gvrs.PODS, {"metadata": {"name": name, "namespace": "x"}})
        events = []
        watcher = self.store.watch(gvrs.PODS, ObjectFilter("x"), since,
                                   lambda t, o: events.append(o["metadata"]["name"]),
                                   lazy=True)
        self.assertEqual(events, [])
        self.assertTrue(watcher.replaying)
        self.assertEqual(watcher.replayed_to, since)
        self.store.create(gvrs.PODS, {"metadata": {"name": "late", "namespace": "x"}})
        # The ConfigMap and the pod of another namespace do not count.
        watcher.replay(2)
        self.assertEqual(events, ["d", "e"])
        self.assertEqual(watcher.replayed_to, since + 4)
        watcher.replay(5)
        self.assertEqual(events, ["d", "e", "f", "late"])
        self.assertFalse(watcher.replaying)
        self.store.create(gvrs.PODS, {"metadata": {"name": "live", "namespace": "x"}})
        self.assertEqual(events[-1], "live")

    def test_a_retained_event_keeps_its_objects_json_until_it_leaves_the_history(self):
        # (history=3.) The JSON is encoded once, when the change is recorded.
        objects = []
        self.store.watch(gvrs.PODS, ObjectFilter(), None, lambda t, o: objects.append(o))
        for name in "abc":
            self.store.create(gvrs.PODS, {"metadata": {"name": name}, "spec": {"n": 1}})
        for obj in objects:
            self.assertEqual(self.store.encoded(obj), json.dumps(obj, separators=(",", ":")))
        # Only the event's own object: an equal copy is not it.
        self.assertIsNone(self.store.encoded(dict(objects[0])))
        self.store.create(gvrs.PODS, {"metadata": {"name": "d"}})
        self.assertIsNone(self.store.encoded(objects[0]))
        self.assertIsNotNone(self.store.encoded(objects[1]))
        self.store.compact()
        self.assertEqual([self.store.encoded(obj) for obj in objects], [None] * 4)
        self.store.create(gvrs.PODS, {"metadata": {"name": "e"}})
        self.assertIsNotNone(self.store.encoded(objects[-1]))
        # A store that keeps no history encodes nothing.
        store = ObjectStore(Catalog(), self.clock, history=0)
        kept = []
        store.watch(gvrs.PODS, ObjectFilter(), None, lambda t, o: kept.append(o))
        store.create(gvrs.PODS, {"metadata": {"name": "a"}})
        self.assertIsNone(store.encoded(kept[0]))

    def test_a_cancelled_lazy_replay_hands_on_nothing_more(self):
        self.store = ObjectStore(Catalog(), self.clock, history=100)
        for name in "abc":
            self.store.create(gvrs.PODS, {"metadata": {"name": name}})
        events = []
        watcher = self.store.watch(gvrs.PODS, ObjectFilter(), 1,
                                   lambda t, o: events.append(o["metadata"]["name"]),
                                   lazy=True)
        watcher.cancel()
        watcher.replay(10)
        self.assertEqual(events, [])
        self.assertFalse(watcher.replaying)
        self.assertEqual(self.store.watcher_count(), 0)


class _MarkingStorage(MemoryStorage):
    """The in-memory storage, its kept JSON of an object marked with ``"marked": true``."""

    def encoded(self, obj):
        text = super().encoded(obj)
        return None if text is None else text[:-1] + ',"marked":true}'


class WatchStreamClockTests(unittest.TestCase):
    """Bookmark and timeout timing of one stream, on a fake clock."""

    def setUp(self):
        self.clock = Clock()
        self.store = ObjectStore(Catalog(), self.clock)
        self.request = DummyRequest([b""])
        self.closed = []

    def stream(self, since=None, storage=None, object_filter=None, **kwargs):
        resource_type = Catalog().type_of(gvrs.CONFIGMAPS)
        stream = WatchStream(self.request, self.clock, storage or MemoryStorage(self.store),
                             resource_type, object_filter or ObjectFilter("default"), since,
                             on_close=self.closed.append, **kwargs)
        stream.start()
        return stream

    def events(self):
        # A replay's chunks are cut by size, not by line.
        return [json.loads(line) for line in b"".join(self.request.written).splitlines()
                if line]

    def test_bookmarks_every_interval_and_clean_timeout(self):
        stream = self.stream(bookmarks=True, bookmark_interval=1.0, timeout=5)
        self.clock.advance(0.99)
        self.assertEqual(self.events(), [])
        self.store.create(gvrs.CONFIGMAPS, configmap("a"))
        self.clock.advance(0.01)
        self.assertEqual([e["type"] for e in self.events()], ["ADDED", "BOOKMARK"])
        self.assertEqual(self.events()[1]["object"]["metadata"], {"resourceVersion": "1"})
        self.clock.pump([1.0, 1.0])
        self.assertEqual([e["type"] for e in self.events()].count("BOOKMARK"), 3)
        self.assertEqual(self.request.finished, 0)
        self.clock.pump([1.0, 1.0])
        self.assertEqual(self.request.finished, 1)
        self.assertEqual(self.closed, [stream])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.store.watcher_count(), 0)

    def test_client_going_away_stops_timers_and_watcher(self):
        self.stream(bookmarks=True, bookmark_interval=1.0, timeout=30)
        self.assertEqual(self.store.watcher_count(), 1)
        self.request.processingFailed(Exception("client went away"))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.store.watcher_count(), 0)


    def test_a_replay_is_written_a_batch_a_turn_with_later_events_behind_it(self):
        # As kube-apiserver streams a watch: the first events leave before the rest
        # are encoded; an event that comes meanwhile, and the bookmarks, wait for the
        # replay, so nothing arrives out of order or names a version not yet sent.
        count = 2 * REPLAY_BATCH + 10
        for i in range(count):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}"))
        self.stream(bookmarks=True, bookmark_interval=1.0)
        self.assertEqual(len(self.events()), REPLAY_BATCH)
        self.store.create(gvrs.CONFIGMAPS, configmap("late"))
        self.assertEqual(len(self.events()), REPLAY_BATCH)
        self.assertEqual(sorted(call.getTime() for call in self.clock.getDelayedCalls()),
                         [0, 1.0])
        # (A Clock runs the calls each batch schedules for the same time at once.)
        self.clock.advance(0)
        names = [e["object"]["metadata"]["name"] for e in self.events()]
        self.assertEqual(names, [f"cm-{i:04d}" for i in range(count)] + ["late"])
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 1.0)
        self.clock.advance(1.0)
        self.assertEqual(self.events()[-1]["type"], "BOOKMARK")
        self.assertEqual(self.events()[-1]["object"]["metadata"]["resourceVersion"],
                         str(count + 1))

    def test_a_replay_from_a_version_takes_a_batch_a_turn_from_the_store(self):
        # The first batch leaves before the store's history beyond it is looked at:
        # the time to the first event does not grow with the backlog. A bookmark
        # waits until the replay is written.
        self.store.create(gvrs.CONFIGMAPS, configmap("before"))
        since = self.store.resource_version
        count = 3 * REPLAY_BATCH
        for i in range(count):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}"))
        stream = self.stream(since=since, bookmarks=True, bookmark_interval=0.5)
        self.assertEqual(len(self.events()), REPLAY_BATCH)
        watcher = stream._watcher
        self.assertTrue(watcher.replaying)
        self.assertEqual(watcher.resource_version, since + REPLAY_BATCH)
        self.store.create(gvrs.CONFIGMAPS, configmap("late"))
        self.clock.advance(0)
        names = [e["object"]["metadata"]["name"] for e in self.events()]
        self.assertEqual(names, [f"cm-{i:04d}" for i in range(count)] + ["late"])
        self.assertFalse(watcher.replaying)
        self.clock.advance(0.5)
        self.assertEqual(self.events()[-1]["type"], "BOOKMARK")
        self.assertEqual(self.events()[-1]["object"]["metadata"]["resourceVersion"],
                         str(since + count + 1))

    def test_an_event_is_written_as_the_storage_keeps_its_object_encoded(self):
        # The storage's JSON of an event's object is what the stream writes (marked
        # here, so that it shows), in a replay and live; an object the storage keeps
        # no JSON of (one leaving the selection, stamped anew) is encoded by the stream.
        storage = _MarkingStorage(self.store)
        self.assertTrue(verifyObject(IObjectStorage, storage))
        self.store.create(gvrs.CONFIGMAPS, configmap("before", labels={"app": "x"}))
        since = self.store.resource_version
        for i in range(REPLAY_BATCH + 1):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}", labels={"app": "x"}))
        self.stream(since=since, storage=storage,
                    object_filter=ObjectFilter("default", "app=x"))
        self.clock.advance(0)
        self.assertEqual(len(self.events()), REPLAY_BATCH + 1)
        self.assertTrue(all(e["object"]["marked"] for e in self.events()))
        left = self.store.get(gvrs.CONFIGMAPS, "cm-0000", "default")
        left["metadata"]["labels"] = {"app": "y"}
        self.store.update(gvrs.CONFIGMAPS, left)
        self.store.create(gvrs.CONFIGMAPS, configmap("live", labels={"app": "x"}))
        gone, live = self.events()[-2:]
        self.assertEqual((gone["type"], gone["object"]["metadata"]["name"]),
                         ("DELETED", "cm-0000"))
        self.assertNotIn("marked", gone["object"])
        self.assertEqual((live["type"], live["object"]["marked"]), ("ADDED", True))

    def test_a_bookmark_never_names_a_version_the_replay_has_not_reached(self):
        self.store.create(gvrs.CONFIGMAPS, configmap("before"))
        since = self.store.resource_version
        for i in range(2 * REPLAY_BATCH):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}"))
        stream = self.stream(since=since, bookmarks=True, bookmark_interval=0.5)
        stream._send_bookmark()
        self.assertNotIn("BOOKMARK", [e["type"] for e in self.events()])
        self.assertEqual(stream.bookmark_line(), encode_event("BOOKMARK", {
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"resourceVersion": str(since + REPLAY_BATCH)}}))

    def test_a_stream_ending_mid_replay_from_a_version_writes_the_rest_first(self):
        self.store.create(gvrs.CONFIGMAPS, configmap("before"))
        since = self.store.resource_version
        for i in range(2 * REPLAY_BATCH + 1):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}"))
        stream = self.stream(since=since)
        stream.end()
        self.assertEqual(len(self.events()), 2 * REPLAY_BATCH + 1)
        self.assertEqual(self.request.finished, 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_stream_ending_mid_replay_writes_the_rest_first(self):
        for i in range(REPLAY_BATCH + 1):
            self.store.create(gvrs.CONFIGMAPS, configmap(f"cm-{i:04d}"))
        stream = self.stream()
        stream.end()
        self.assertEqual(len(self.events()), REPLAY_BATCH + 1)
        self.assertEqual(self.request.finished, 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class BadInputPropertyTests(unittest.TestCase):
    """Whatever the body, the answer is a proper status: never a 500."""

    def test_random_bodies_never_500(self):
        http = InMemoryHTTP()
        http.server.store.create(gvrs.CONFIGMAPS, configmap("a"))
        json_values = st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(
                ["metadata", "name", "namespace", "kind", "apiVersion", "labels",
                 "annotations", "resourceVersion", "generateName", "uid", "data", "status",
                 "spec", "preconditions", "op", "path", "value", "from", "x"]),
                inner, max_size=4),
            max_leaves=12)
        bodies = st.one_of(
            st.binary(max_size=40),
            json_values.map(lambda v: json.dumps(v).encode()),
        )
        targets = st.sampled_from([
            (b"POST", b"/api/v1/namespaces/default/configmaps"),
            (b"PUT", b"/api/v1/namespaces/default/configmaps/a"),
            (b"PUT", b"/api/v1/nodes/n/status"),
            (b"PATCH", b"/api/v1/namespaces/default/configmaps/a"),
            (b"DELETE", b"/api/v1/namespaces/default/configmaps/zz"),
            (b"DELETE", b"/api/v1/namespaces/default/configmaps/a"),
            (b"DELETE", b"/api/v1/namespaces/default/configmaps"),
            (b"PATCH", b"/api/v1/nodes/n/status"),
            (b"POST", b"/api/v1/nodes"),
            (b"GET", b"/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b"),
            (b"POST", b"/apis/coordination.k8s.io/v1/namespaces/x/leases"),
        ])
        content_types = st.sampled_from([
            b"application/json", b"application/merge-patch+json",
            b"application/json-patch+json", b"application/yaml"])

        seen = set()

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(targets, bodies, content_types)
        def check(target, body, content_type):
            method, path = target
            for gvr, obj in ((gvrs.CONFIGMAPS, configmap("a")),
                             (gvrs.NODES, {"metadata": {"name": "n"}})):
                name = obj["metadata"]["name"]
                if http.server.store.get(gvr, name, "default") is None:
                    http.server.store.create(gvr, obj)
            code, raw = http.request(method, path, body, content_type)
            seen.add(code)
            self.assertLess(code, 500, (method, path, body, raw))
            if code >= 400:
                answer = json.loads(raw)
                self.assertEqual(answer["kind"], "Status")
                self.assertEqual(answer["code"], code)

        check()
        self.assertTrue(seen)
        code, _ = http.request(b"POST", b"/api/v1/namespaces/default/configmaps",
                               json.dumps(configmap("valid-one")).encode())
        self.assertEqual(code, 201)
        code, _ = http.request(b"POST", b"/api/v1/namespaces/default/configmaps", b"{")
        self.assertEqual(code, 400)
        self.assertEqual(http.clock.getDelayedCalls(), [])


class StorePropertyTests(unittest.TestCase):
    """Any sequence of writes: a watcher's events rebuild exactly what a list
    shows (also through a label selector), and replay from any retained
    resourceVersion rebuilds the same state from that version's snapshot."""

    def test_watch_events_rebuild_list(self):
        operations = st.lists(st.tuples(
            st.sampled_from(["create", "update", "delete"]),
            st.sampled_from(["a", "b", "c", "d"]),
            st.sampled_from(["x", "y", None])), max_size=30)

        def apply(state, event_type, obj):
            key = obj["metadata"]["name"]
            if event_type == "DELETED":
                del state[key]
            else:
                self.assertEqual(event_type == "ADDED", key not in state)
                state[key] = obj

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE)
        @given(operations, st.data())
        def check(ops, data):
            store = ObjectStore(Catalog(), Clock(), history=1000)
            everything, selected = {}, {}
            store.watch(gvrs.PODS, ObjectFilter("default"), None,
                        lambda t, o: apply(everything, t, o))
            store.watch(gvrs.PODS, ObjectFilter("default", "app=x"), None,
                        lambda t, o: apply(selected, t, o))
            snapshots = {0: {}}
            for op, name, app in ops:
                pod = {"metadata": {"name": name, "labels": {"app": app} if app else {}},
                       "spec": {"n": len(snapshots)}}
                try:
                    if op == "create":
                        store.create(gvrs.PODS, pod)
                    elif op == "update":
                        store.update(gvrs.PODS, pod)
                    else:
                        store.delete(gvrs.PODS, name, "default")
                except (AlreadyExists, NotFound):
                    continue
                snapshots[store.resource_version] = {
                    o["metadata"]["name"]: o for o in store.list(gvrs.PODS)}
            final = {o["metadata"]["name"]: o for o in store.list(gvrs.PODS)}
            self.assertEqual(everything, final)
            self.assertEqual(selected, {o["metadata"]["name"]: o
                                        for o in store.list(gvrs.PODS, label_selector="app=x")})
            versions = sorted(v for v in snapshots if v)
            if versions:
                since = data.draw(st.sampled_from(versions))
                replayed = dict(snapshots[since])
                store.watch(gvrs.PODS, ObjectFilter(), since,
                            lambda t, o: apply(replayed, t, o))
                self.assertEqual(replayed, final)

        check()
