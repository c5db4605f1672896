"""The informer on a Clock with a scripted client: lists in pages, watches from the
list's version, resumes after a cut, relists after 410, backs off with jitter,
turns filter transitions into adds and deletes, and stops cleanly in every state."""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.kube import errors
from yurtcoord.tx.retry import Retries, backoff_policy
from yurtcoord.kube.gvr import CONFIGMAPS, NODES
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IListWatchClient, IWatch
from yurtcoord.testing.informerrecorder import Recorder


def cm(name, rv, ns="ns", **labels):
    return {"kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv),
                         "labels": labels}}


@implementer(IWatch)
class ScriptedWatch:
    def __init__(self, on_event, params):
        self.on_event = on_event
        self.params = params
        self.done = defer.Deferred()
        self.events = 0
        self.cancelled = False

    def send(self, kind, obj):
        self.events += 1
        self.on_event(kind, obj)

    def cancel(self):
        if not self.done.called:
            self.cancelled = True
            self.done.callback(None)


@implementer(IListWatchClient)
class ScriptedClient:
    """list() and watch() calls the test answers by hand."""

    def __init__(self):
        self.list_calls = []
        self.watches = []

    def list(self, gvr, namespace=None, label_selector=None, field_selector=None,
             resource_version=None, limit=None, continue_token=None):
        d = defer.Deferred()
        self.list_calls.append((dict(
            namespace=namespace, label_selector=label_selector,
            field_selector=field_selector, resource_version=resource_version, limit=limit,
            continue_token=continue_token), d))
        return d

    def watch(self, gvr, on_event, namespace=None, resource_version=None,
              label_selector=None, field_selector=None, allow_bookmarks=True,
              timeout_seconds=None, idle_timeout=None):
        w = ScriptedWatch(on_event, dict(
            namespace=namespace, resource_version=resource_version,
            label_selector=label_selector, field_selector=field_selector,
            allow_bookmarks=allow_bookmarks, timeout_seconds=timeout_seconds,
            idle_timeout=idle_timeout))
        self.watches.append(w)
        return w

    def answer_list(self, rv, items, continue_token=None):
        params, d = self.list_calls[-1]
        metadata = {"resourceVersion": str(rv)}
        if continue_token:
            metadata["continue"] = continue_token
        d.callback({"kind": "List", "metadata": metadata, "items": items})


class ScriptedClientTests(unittest.TestCase):
    def test_the_scripted_client_and_its_watches_fit_the_contract(self):
        client = ScriptedClient()
        self.assertTrue(verifyObject(IListWatchClient, client))
        self.assertTrue(verifyObject(IWatch, client.watch(CONFIGMAPS, lambda *_: None)))
        self.assertTrue(verifyObject(IWatch, ScriptedWatch(lambda *_: None, {})))


class InformerUnitTests(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.client = ScriptedClient()
        self.backoff = Retries(backoff_policy(initial=1.0, maximum=8.0, jitter=0.5,
                                             random=lambda: 0.0))
        self.informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns",
                                 label_selector="app=x", backoff=self.backoff,
                                 watch_timeout_seconds=60)
        self.recorder = Recorder(self)
        self.informer.add_handler(self.recorder.on_add, self.recorder.on_update,
                                  self.recorder.on_delete)

    def tearDown(self):
        d = self.informer.stop()
        self.assertTrue(d.called)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def started_and_listed(self, rv=10, items=()):
        synced = self.informer.wait_for_sync()
        self.informer.start()
        self.assertFalse(self.informer.has_synced)
        self.client.answer_list(rv, list(items))
        self.assertTrue(self.informer.has_synced)
        self.assertEqual(self.successResultOf(synced), True)
        return self.client.watches[-1]

    def test_lists_then_watches_from_the_list_version(self):
        watch = self.started_and_listed(10, [cm("a", 5), cm("b", 9)])
        self.assertEqual(self.client.list_calls[0][0]["label_selector"], "app=x")
        self.assertEqual(watch.params["resource_version"], "10")
        self.assertEqual(watch.params["namespace"], "ns")
        self.assertEqual(watch.params["timeout_seconds"], 60)
        self.assertEqual(watch.params["idle_timeout"], 120)
        self.assertTrue(watch.params["allow_bookmarks"])
        watch.send("ADDED", cm("c", 11))
        watch.send("MODIFIED", cm("a", 12))
        watch.send("DELETED", cm("b", 13))
        watch.send("DELETED", cm("never-seen", 14))
        self.assertEqual(sorted(self.informer.store), ["ns/a", "ns/c"])
        self.assertEqual(self.informer.store["ns/a"]["metadata"]["resourceVersion"], "12")
        self.assertEqual(self.informer.resource_version, "14")
        self.assertEqual(self.recorder.state, self.informer.store)
        self.assertEqual(self.recorder.calls, [
            ("add", "ns/a"), ("add", "ns/b"), ("add", "ns/c"), ("update", "ns/a"),
            ("delete", "ns/b")])

    def test_list_is_fetched_in_pages(self):
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns", page_size=2)
        self.addCleanup(informer.stop)
        synced = informer.wait_for_sync()
        informer.start()
        self.client.answer_list(10, [cm("a", 5), cm("b", 9)], continue_token="t1")
        self.assertNoResult(synced)
        self.client.answer_list(10, [cm("c", 7)])
        self.assertEqual(self.successResultOf(synced), True)
        self.assertEqual([(p["limit"], p["continue_token"]) for p, _d in self.client.list_calls],
                         [(2, None), (2, "t1")])
        self.assertEqual(sorted(informer.store), ["ns/a", "ns/b", "ns/c"])
        self.assertEqual(informer.lists, 1)
        self.assertEqual(self.client.watches[-1].params["resource_version"], "10")

    def test_expired_continue_lists_again_in_one_request(self):
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns", page_size=2)
        self.addCleanup(informer.stop)
        informer.start()
        self.client.answer_list(10, [cm("a", 5), cm("b", 9)], continue_token="t1")
        self.client.list_calls[-1][1].errback(errors.Gone("continue too old"))
        self.client.answer_list(20, [cm("b", 15), cm("d", 19), cm("e", 20)])
        self.assertEqual([(p["limit"], p["continue_token"]) for p, _d in self.client.list_calls],
                         [(2, None), (2, "t1"), (None, None)])
        self.assertEqual(sorted(informer.store), ["ns/b", "ns/d", "ns/e"])
        self.assertEqual(informer.store["ns/b"]["metadata"]["resourceVersion"], "15")
        self.assertTrue(informer.has_synced)
        self.assertEqual(self.client.watches[-1].params["resource_version"], "20")

    def test_page_too_large_is_asked_for_again_in_smaller_pages(self):
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns", page_size=8)
        self.addCleanup(informer.stop)
        informer.start()
        self.client.answer_list(10, [cm("a", 5)], continue_token="t1")
        for _ in range(2):
            self.client.list_calls[-1][1].errback(errors.ResponseTooLarge("page too large"))
        self.client.answer_list(10, [cm("b", 6)], continue_token="t2")
        self.client.answer_list(10, [cm("c", 7)])
        self.assertEqual([(p["limit"], p["continue_token"]) for p, _d in self.client.list_calls],
                         [(8, None), (8, "t1"), (4, "t1"), (2, "t1"), (2, "t2")])
        self.assertEqual(sorted(informer.store), ["ns/a", "ns/b", "ns/c"])
        self.assertTrue(informer.has_synced)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_one_object_too_large_fails_the_list_and_backs_off(self):
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns", page_size=2,
                            backoff=Retries(backoff_policy(initial=1.0, maximum=8.0, jitter=0.0)))
        self.addCleanup(informer.stop)
        informer.start()
        self.client.list_calls[-1][1].errback(errors.ResponseTooLarge("page too large"))
        self.client.list_calls[-1][1].errback(errors.ResponseTooLarge("object too large"))
        self.assertEqual([p["limit"] for p, _d in self.client.list_calls], [2, 1])
        self.assertFalse(informer.has_synced)
        self.clock.advance(0.9)
        self.assertEqual(len(self.client.list_calls), 2)
        self.clock.advance(0.2)
        self.assertEqual([p["limit"] for p, _d in self.client.list_calls], [2, 1, 2])

    def test_list_answers_of_the_wrong_shape_are_server_errors_and_back_off(self):
        failures = []

        def observer(event):
            if event.get("log_format", "").startswith("informer list failed"):
                failures.append(event["reason"])
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns",
                            backoff=Retries(backoff_policy(initial=1.0, maximum=1.0, jitter=0.0)))
        self.addCleanup(informer.stop)
        informer.start()
        shapes = [{"items": "abc"}, {"items": [1]}, {"items": [{"metadata": []}]},
                  {"metadata": [1]}, {"metadata": {"continue": 5}},
                  {"metadata": {"resourceVersion": {"a": 1}}}, ["not", "an", "object"]]
        for shape in shapes:
            self.client.list_calls[-1][1].callback(shape)
            self.clock.advance(1.0)
        self.assertEqual(len(failures), len(shapes))
        self.assertTrue(all("is not" in reason or "that is not" in reason
                            for reason in failures), failures)
        self.assertEqual(informer.store, {})
        self.client.answer_list(10, [cm("a", 5)])
        self.assertTrue(informer.has_synced)

    def test_event_with_a_resource_version_that_is_not_a_string_ends_the_watch(self):
        watch = self.started_and_listed(10, [cm("a", 5)])
        bad = cm("b", 6)
        bad["metadata"]["resourceVersion"] = ["6"]
        with self.assertRaises(errors.ServerError):
            watch.send("ADDED", bad)
        self.assertEqual(sorted(self.informer.store), ["ns/a"])
        self.assertEqual(self.informer.resource_version, "10")

    def test_page_size_must_be_positive(self):
        with self.assertRaises(ValueError):
            Informer(self.clock, self.client, CONFIGMAPS, page_size=0)

    def test_cut_resumes_from_last_seen_version_including_bookmarks(self):
        watch = self.started_and_listed(10)
        watch.send("ADDED", cm("a", 11))
        watch.send("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "20"}})
        self.assertNotIn("", self.informer.store)
        watch.done.errback(errors.ConnectionFailed("cut"))
        # The watch delivered events, so backoff restarted at its initial delay.
        self.assertEqual(len(self.client.watches), 1)
        self.clock.advance(0.99)
        self.assertEqual(len(self.client.watches), 1)
        self.clock.advance(0.01)
        self.assertEqual(len(self.client.watches), 2)
        self.assertEqual(self.client.watches[1].params["resource_version"], "20")
        self.assertEqual(len(self.client.list_calls), 1)

    def test_gone_relists_and_delivers_the_difference(self):
        watch = self.started_and_listed(10, [cm("a", 1), cm("b", 2), cm("c", 3)])
        watch.send("MODIFIED", cm("c", 11))
        watch.done.errback(errors.Gone("too old", code=410))
        self.assertEqual(len(self.client.list_calls), 2)
        self.client.answer_list(30, [cm("a", 25), cm("c", 11), cm("d", 26)])
        self.assertEqual(sorted(self.informer.store), ["ns/a", "ns/c", "ns/d"])
        self.assertEqual(self.recorder.state, self.informer.store)
        self.assertEqual(self.recorder.calls[4:], [
            ("delete", "ns/b"), ("update", "ns/a"), ("add", "ns/d")])
        self.assertEqual(self.client.watches[-1].params["resource_version"], "30")

    def test_gone_right_after_a_list_waits_before_relisting(self):
        watch = self.started_and_listed(10)
        watch.done.errback(errors.Gone("too old", code=410))
        self.assertEqual(len(self.client.list_calls), 1)
        self.clock.advance(1.0)
        self.assertEqual(len(self.client.list_calls), 2)

    def test_failed_lists_back_off_exponentially_up_to_the_cap_then_reset(self):
        self.informer.start()
        delays = []
        for _ in range(6):
            before = len(self.client.list_calls)
            self.client.list_calls[-1][1].errback(errors.ServerError("down"))
            waited = 0.0
            while len(self.client.list_calls) == before:
                self.clock.advance(0.25)
                waited += 0.25
            delays.append(waited)
        self.assertEqual(delays, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0])
        self.client.answer_list(5, [])
        self.assertEqual(self.backoff.failures, 0)
        self.assertTrue(self.informer.has_synced)

    def test_jitter_shrinks_delays_within_bounds(self):
        backoff = Retries(backoff_policy(initial=1.0, maximum=8.0, jitter=0.5, random=lambda: 1.0))
        self.assertEqual([backoff.next_delay() for _ in range(5)], [0.5, 1.0, 2.0, 4.0, 4.0])
        backoff.reset()
        self.assertEqual(backoff.next_delay(), 0.5)
        with self.assertRaises(ValueError):
            Retries(backoff_policy(initial=2.0, maximum=1.0))

    def test_watch_ending_at_once_without_events_backs_off(self):
        watch = self.started_and_listed(10)
        watch.done.callback(None)
        self.assertEqual(len(self.client.watches), 1)
        self.clock.advance(1.0)
        self.assertEqual(len(self.client.watches), 2)
        self.clock.advance(5.0)
        self.client.watches[-1].done.callback(None)
        # That one lasted long enough: immediate rewatch.
        self.assertEqual(len(self.client.watches), 3)

    def test_filter_transitions_become_add_and_delete(self):
        calls = []
        self.informer.add_handler(
            lambda o: calls.append(("add", o["metadata"]["name"], o["metadata"]["resourceVersion"])),
            lambda old, new: calls.append(("update", new["metadata"]["name"], new["metadata"]["resourceVersion"])),
            lambda o: calls.append(("delete", o["metadata"]["name"], o["metadata"]["resourceVersion"])),
            filter=lambda o: o["metadata"]["labels"].get("keep") == "yes")
        watch = self.started_and_listed(10, [cm("a", 1, keep="yes"), cm("b", 2)])
        watch.send("MODIFIED", cm("a", 11, keep="yes"))
        watch.send("MODIFIED", cm("a", 12, keep="no"))
        watch.send("MODIFIED", cm("b", 13, keep="yes"))
        watch.send("DELETED", cm("a", 14, keep="no"))
        watch.send("DELETED", cm("b", 15, keep="yes"))
        self.assertEqual(calls, [
            ("add", "a", "1"), ("update", "a", "11"), ("delete", "a", "11"),
            ("add", "b", "13"), ("delete", "b", "15")])

    def keeping(self, wanted):
        """An informer that stores only the ConfigMaps named in ``wanted`` (a set the
        test may change), and the (event, name, rv) its handler saw."""
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns",
                            backoff=self.backoff,
                            keep=lambda o: o["metadata"]["name"] in wanted)
        self.addCleanup(informer.stop)
        calls = []

        def name_rv(o):
            return o["metadata"]["name"], o["metadata"]["resourceVersion"]
        informer.add_handler(lambda o: calls.append(("add", *name_rv(o))),
                             lambda _old, new: calls.append(("update", *name_rv(new))),
                             lambda o: calls.append(("delete", *name_rv(o))))
        informer.start()
        return informer, calls

    def test_objects_not_kept_are_told_as_they_come_but_never_stored(self):
        wanted = {"a"}
        informer, calls = self.keeping(wanted)
        self.client.answer_list(10, [cm("a", 1), cm("x", 2)])
        self.assertEqual(sorted(informer.store), ["ns/a"])
        watch = self.client.watches[-1]
        watch.send("MODIFIED", cm("x", 11))
        watch.send("MODIFIED", cm("x", 12))
        watch.send("MODIFIED", cm("a", 13))
        watch.send("DELETED", cm("x", 14))
        self.assertEqual(sorted(informer.store), ["ns/a"])
        self.assertEqual(calls, [("add", "a", "1"), ("add", "x", "11"), ("add", "x", "12"),
                                 ("update", "a", "13"), ("delete", "x", "14")])
        self.assertEqual(informer.resource_version, "14")

    def test_an_object_that_stops_being_kept_leaves_the_store_and_one_that_starts_enters(self):
        wanted = {"a"}
        informer, calls = self.keeping(wanted)
        self.client.answer_list(10, [cm("a", 1), cm("b", 2)])
        watch = self.client.watches[-1]
        wanted.discard("a")
        wanted.add("b")
        watch.send("MODIFIED", cm("a", 11))
        watch.send("MODIFIED", cm("b", 12))
        watch.send("MODIFIED", cm("b", 13))
        self.assertEqual(sorted(informer.store), ["ns/b"])
        self.assertEqual(calls, [("add", "a", "1"), ("delete", "a", "1"), ("add", "a", "11"),
                                 ("add", "b", "12"), ("update", "b", "13")])

    def test_a_relist_drops_what_is_not_kept_page_by_page(self):
        wanted = {"a", "c"}
        informer, calls = self.keeping(wanted)
        self.client.answer_list(10, [cm("a", 1), cm("c", 3)])
        self.client.watches[-1].done.errback(errors.Gone("too old", code=410))
        self.clock.advance(1.0)
        self.client.answer_list(30, [cm("a", 25), cm("x", 26), cm("y", 27)])
        self.assertEqual(sorted(informer.store), ["ns/a"])
        self.assertEqual(calls[2:], [("delete", "c", "3"), ("update", "a", "25")])

    def test_a_keep_that_raises_keeps_the_object(self):
        def broken(obj):
            raise RuntimeError("keep bug")
        informer = Informer(self.clock, self.client, CONFIGMAPS, namespace="ns", keep=broken)
        self.addCleanup(informer.stop)
        informer.start()
        self.client.answer_list(10, [cm("a", 1)])
        self.assertEqual(sorted(informer.store), ["ns/a"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_handler_that_raises_is_logged_and_others_still_run(self):
        def broken(obj):
            raise RuntimeError("handler bug")
        self.informer.add_handler(on_add=broken)
        watch = self.started_and_listed(10, [cm("a", 1)])
        watch.send("ADDED", cm("b", 11))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)
        self.assertEqual(sorted(self.recorder.state), ["ns/a", "ns/b"])
        self.assertFalse(watch.done.called)

    def test_handler_added_late_gets_the_store_as_adds(self):
        self.started_and_listed(10, [cm("a", 1), cm("b", 2)])
        late = Recorder(self)
        registration = self.informer.add_handler(late.on_add, late.on_update, late.on_delete)
        self.assertEqual(late.state, self.informer.store)
        registration.remove()
        self.client.watches[-1].send("ADDED", cm("c", 11))
        self.assertNotIn("ns/c", late.state)

    def test_stop_while_watching_cancels_the_watch(self):
        watch = self.started_and_listed(10)
        d = self.informer.stop()
        self.assertTrue(watch.cancelled)
        self.assertIsNone(self.successResultOf(d))
        self.assertFalse(self.informer.running)

    def test_stop_while_listing_cancels_the_list(self):
        self.informer.start()
        synced = self.informer.wait_for_sync()
        list_d = self.client.list_calls[-1][1]
        d = self.informer.stop()
        self.assertTrue(list_d.called)
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.successResultOf(synced), False)
        self.assertEqual(self.client.watches, [])

    def test_stop_while_backing_off_cancels_the_timer(self):
        watch = self.started_and_listed(10)
        watch.done.errback(errors.ConnectionFailed("cut"))
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        d = self.informer.stop()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(100)
        self.assertEqual(len(self.client.watches), 1)

    def test_restart_after_stop(self):
        self.started_and_listed(10, [cm("a", 1)])
        self.successResultOf(self.informer.stop())
        self.informer.start()
        self.client.answer_list(20, [cm("a", 1), cm("b", 2)])
        self.assertEqual(self.recorder.calls, [("add", "ns/a"), ("add", "ns/b")])

    def test_cluster_scoped_objects_are_keyed_by_name(self):
        informer = Informer(self.clock, self.client, NODES, backoff=self.backoff)
        informer.start()
        self.addCleanup(informer.stop)
        self.client.answer_list(3, [{"metadata": {"name": "n1", "resourceVersion": "3"}}])
        self.assertEqual(list(informer.store), ["n1"])
