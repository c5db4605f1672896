"""The informer against the Kubernetes API test server over real sockets: pages of a
large list, an expired continue token, cuts mid-line, 410, garbage answers and the
server down and back."""

from twisted.internet import defer
from twisted.trial import unittest

from yurtcoord.tx.retry import Retries, backoff_policy
from yurtcoord.kube.gvr import CONFIGMAPS
from yurtcoord.kube.informer import Informer, object_key
from yurtcoord.sim.apiserver.clients import start_server_with_client
from yurtcoord.testing.informerrecorder import Recorder
from yurtcoord.testing.poll import poll_until


class InformerAgainstTestServerTests(unittest.TestCase):
    """Real sockets: the informer against the Kubernetes API test server."""

    timeout = 60

    @defer.inlineCallbacks
    def setUp(self):
        from twisted.internet import reactor
        self.reactor = reactor
        self.server, self.client = yield start_server_with_client(
            self, reactor, client_timeout=2.0, history=1000, bookmark_interval=0.2)
        self.informer = Informer(
            reactor, self.client, CONFIGMAPS, namespace="ns",
            backoff=Retries(backoff_policy(initial=0.05, maximum=0.4, jitter=0.5)))
        self.addCleanup(self.informer.stop)
        self.recorder = Recorder(self)
        self.informer.add_handler(self.recorder.on_add, self.recorder.on_update,
                                  self.recorder.on_delete)

    def server_state(self):
        return {object_key(o): o for o in self.server.store.list(CONFIGMAPS, namespace="ns")}

    def converged(self):
        return self.informer.store == self.server_state()

    def mutate(self, round_number, count=30):
        """Creates, updates and deletes in namespace ns (and noise in another one)."""
        store = self.server.store
        for i in range(count):
            name = f"cm-{round_number}-{i}"
            store.create(CONFIGMAPS, {"metadata": {"name": name, "namespace": "ns"},
                                      "data": {"v": "0"}})
            store.create(CONFIGMAPS, {"metadata": {"name": name, "namespace": "other"}})
        for i in range(0, count, 2):
            obj = store.get(CONFIGMAPS, f"cm-{round_number}-{i}", "ns")
            obj["data"]["v"] = "1"
            store.update(CONFIGMAPS, obj)
        for i in range(0, count, 3):
            store.delete(CONFIGMAPS, f"cm-{round_number}-{i}", "ns")
        if round_number > 0:
            for i in range(1, count, 3):
                store.delete(CONFIGMAPS, f"cm-{round_number - 1}-{i}", "ns")

    def assert_consistent(self):
        state = self.server_state()
        self.assertEqual(self.informer.store, state)
        self.assertEqual(self.recorder.state, state)

    def list_requests(self):
        return [query for method, path, query in self.server.requests
                if method == "GET" and path.endswith("/configmaps") and "watch" not in query]

    def create_many(self, count, prefix="big"):
        for i in range(count):
            self.server.store.create(CONFIGMAPS, {"metadata": {
                "name": f"{prefix}-{i:04d}", "namespace": "ns"}})

    @defer.inlineCallbacks
    def test_large_list_arrives_in_pages(self):
        self.create_many(1201)
        self.informer.start()
        yield self.informer.wait_for_sync()
        self.assert_consistent()
        queries = self.list_requests()
        self.assertEqual([q.get("limit") for q in queries], ["500"] * 3)
        self.assertEqual([bool(q.get("continue")) for q in queries], [False, True, True])

    @defer.inlineCallbacks
    def test_expired_continue_token_lists_again_in_one_request(self):
        self.create_many(700)
        server = self.server

        class ChangesAfterFirstPage:
            """The client, but the server changes and compacts after the first page."""

            def __init__(self, client):
                self.client = client
                self.pages = 0

            def __getattr__(self, name):
                return getattr(self.client, name)

            def list(self, gvr, **params):
                d = self.client.list(gvr, **params)
                self.pages += 1
                if self.pages == 1:
                    def change(result):
                        server.store.delete(CONFIGMAPS, "big-0600", "ns")
                        server.store.create(CONFIGMAPS, {"metadata": {
                            "name": "late", "namespace": "ns"}})
                        server.store.compact()
                        return result
                    d.addCallback(change)
                return d

        informer = Informer(self.reactor, ChangesAfterFirstPage(self.client), CONFIGMAPS,
                            namespace="ns",
                            backoff=Retries(backoff_policy(initial=0.05, maximum=0.4)))
        self.addCleanup(informer.stop)
        informer.start()
        yield informer.wait_for_sync()
        self.assertEqual(informer.store, self.server_state())
        self.assertIn("ns/late", informer.store)
        self.assertNotIn("ns/big-0600", informer.store)
        queries = self.list_requests()
        self.assertEqual([(q.get("limit"), bool(q.get("continue"))) for q in queries],
                         [("500", False), ("500", True), (None, False)])
        self.assertEqual(informer.lists, 1)

    @defer.inlineCallbacks
    def test_store_survives_cut_mid_line_410_and_server_down(self):
        self.mutate(0)
        self.informer.start()
        yield self.informer.wait_for_sync()
        self.assert_consistent()
        self.assertEqual(self.informer.lists, 1)

        # Changes over a live watch.
        self.mutate(1)
        yield poll_until(self.converged)
        self.assert_consistent()

        # A watch cut in the middle of a line resumes from the last seen version.
        yield poll_until(lambda: self.server.open_watches == 1)
        self.server.faults.cut_watches(mid_line=True)
        self.mutate(2)
        yield poll_until(lambda: self.converged() and self.server.open_watches == 1)
        self.assert_consistent()
        self.assertEqual(self.informer.lists, 1)

        # A cut, changes the informer has not seen, then compaction (all in one
        # reactor turn, so the informer cannot reconnect in between): its resume
        # version is gone, the watch gets 410, the informer relists.
        self.server.faults.cut_watches(mid_line=True)
        self.mutate(3)
        self.server.store.compact()
        yield poll_until(lambda: self.informer.lists == 2)
        yield poll_until(self.converged)
        self.assert_consistent()

        # Down for 5 s while objects change, then back.
        yield poll_until(lambda: self.server.open_watches == 1)
        watches_before = self.informer.watches
        yield self.server.faults.down()
        self.mutate(4)
        back = []
        call = self.reactor.callLater(5.0, lambda: self.server.faults.up().addCallback(back.append))
        self.addCleanup(lambda: call.cancel() if call.active() else None)
        yield poll_until(lambda: back, timeout=15)
        self.assertGreater(self.informer.watches - watches_before, 3)  # kept retrying
        yield poll_until(self.converged, timeout=10)
        self.assert_consistent()
        # 410 aside, everything was resumed rather than relisted.
        self.assertEqual(self.informer.lists, 2)

        yield self.informer.stop()
        self.assertFalse(self.informer.running)
        yield poll_until(lambda: self.server.open_watches == 0)

    @defer.inlineCallbacks
    def test_500_and_garbage_answers_are_retried_until_synced(self):
        self.mutate(0, count=10)
        self.server.faults.fail_next(2, code=500)
        self.server.faults.garbage_next(1)
        self.informer.start()
        yield self.informer.wait_for_sync()
        self.assert_consistent()
        self.assertEqual(self.informer.lists, 1)
        # A watch answered with garbage is retried from the same version.
        yield poll_until(lambda: self.server.open_watches == 1)
        self.server.faults.garbage_next(1)
        self.server.faults.cut_watches()
        self.mutate(1, count=10)
        yield poll_until(lambda: self.converged() and self.server.open_watches == 1)
        self.assert_consistent()
        self.assertEqual(self.informer.lists, 1)

    @defer.inlineCallbacks
    def test_bookmarks_advance_the_resume_version(self):
        self.informer.start()
        yield self.informer.wait_for_sync()
        listed_rv = self.informer.resource_version
        # Changes elsewhere move the global version; only bookmarks tell the informer.
        self.server.store.create(CONFIGMAPS, {"metadata": {"name": "x", "namespace": "other"}})
        target = str(self.server.store.resource_version)
        yield poll_until(lambda: self.informer.resource_version == target)
        self.assertNotEqual(listed_rv, target)
        self.assertEqual(self.informer.store, {})

    @defer.inlineCallbacks
    def test_stop_while_the_server_is_down_leaves_nothing_behind(self):
        self.informer.start()
        yield self.informer.wait_for_sync()
        watches = self.informer.watches
        yield self.server.faults.down()
        yield poll_until(lambda: self.informer.watches >= watches + 2)
        yield self.informer.stop()
        self.assertFalse(self.informer.running)
        self.assertEqual(self.reactor.getDelayedCalls() and
                         [c for c in self.reactor.getDelayedCalls()
                          if "informer" in repr(c.func).lower()], [])
