"""Peers whose answers never end, over real sockets on loopback.

- A watch line without a newline, streamed without end: the kube client stops it at
  ``MAX_RESPONSE_BYTES`` with ``ResponseTooLarge``, drops the connection, and the
  process's peak RSS grows by at most 64 MB (measured: VmHWM after the peak was reset
  through ``/proc/self/clear_refs``, against VmRSS before). An informer on such a
  server reconnects with its backoff. Measured: 15 MB of growth for a line cut at
  16 MiB; without the bound, 160 MB for the 160 MiB the server sends.
- Plain answer bodies past the bound, from an apiserver and from etcd: the client's
  typed error and a dropped connection.
- A list whose every page carries a ``continue`` token: ``ListTooLong`` after
  ``MAX_LIST_PAGES`` pages, then the informer's backoff and a new list.

Measured figures are printed as ``HOSTILE-NET <name>=<value>`` lines.
"""

import json

from twisted.internet import defer, reactor, task
from twisted.logger import globalLogPublisher
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from yurtcoord.etcd import errors as etcd_errors
from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube import errors
from yurtcoord.tx.retry import Retries, backoff_policy
from yurtcoord.kube.client import MAX_RESPONSE_BYTES, ClientConfig, KubeClient
from yurtcoord.kube.gvr import CONFIGMAPS
from yurtcoord.kube.informer import MAX_LIST_PAGES, Informer
from yurtcoord.testing.memory import reset_peak, status_kib
from yurtcoord.testing.poll import poll_until

MB = 1024 * 1024
# What an endless line may add to the peak RSS of the process.
RSS_BOUND = 64 * MB
WRITE = b"x" * (64 * 1024)


def report(name, value):
    print(f"HOSTILE-NET {name}={value}")


def memory():
    """``{"VmRSS": bytes, "VmHWM": bytes}`` of this process."""
    return {field: status_kib(field) * 1024 for field in ("VmRSS", "VmHWM")}


class EndlessBody:
    """A pull producer writing ``prefix`` then ``WRITE`` after ``WRITE`` into ``request``
    (one chunk each, only as fast as the client reads), with no newline, up to
    ``stop_after`` bytes; then it holds the connection open without writing."""

    def __init__(self, request, prefix, stop_after):
        self.request = request
        self.stop_after = stop_after
        self.sent = 0
        self.stopped = False
        self.lost = request.notifyFinish()
        self.lost.addErrback(lambda _: None)
        request.setHeader(b"content-type", b"application/json")
        request.write(prefix)
        request.registerProducer(self, False)

    def resumeProducing(self):
        if self.stopped:
            return
        if self.sent >= self.stop_after:
            self.stopped = True
            self.request.unregisterProducer()
            return
        self.request.write(WRITE)
        self.sent += len(WRITE)

    def pauseProducing(self):
        pass

    def stopProducing(self):
        self.stopped = True

    def abort(self):
        if not self.request.finished and not self.request._disconnected:
            self.request.channel.transport.abortConnection()


class Peer(Resource):
    """An apiserver or etcd gateway answering each path with a handler(request)."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.routes = {}
        self.requests = []
        self.endless = []

    def render(self, request):
        path = request.path.decode()
        self.requests.append((path, {k.decode(): v[0].decode() for k, v in request.args.items()}))
        watch = request.args.get(b"watch") == [b"1"]
        return self.routes[(path, watch)](request)


class PeerFixture:
    def log_events(self, starting):
        """Events of the global log whose format starts with ``starting``, as they come."""
        events = []

        def observer(event):
            if (event.get("log_format") or "").startswith(starting):
                events.append(event)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        return events

    def start_peer(self):
        self.peer = Peer()
        port = reactor.listenTCP(0, Site(self.peer), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(self._abort_endless)
        return f"http://127.0.0.1:{port.getHost().port}"

    def _abort_endless(self):
        for body in self.peer.endless:
            body.abort()

    def endless(self, prefix, stop_after):
        def handler(request):
            self.peer.endless.append(EndlessBody(request, prefix, stop_after))
            return NOT_DONE_YET
        return handler

    def kube_client(self, url, **kwargs):
        client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=30.0,
                                                  **kwargs))
        self.addCleanup(client.close)
        return client


def empty_list(request):
    request.setHeader(b"content-type", b"application/json")
    return json.dumps({"kind": "ConfigMapList", "metadata": {"resourceVersion": "5"},
                       "items": []}).encode()


LINE_START = b'{"type":"ADDED","object":{"metadata":{"name":"'


class EndlessWatchLineTests(PeerFixture, unittest.TestCase):
    timeout = 120

    @defer.inlineCallbacks
    def test_endless_watch_line_stops_at_the_bound_and_rss_stays_within_64_mb(self):
        url = self.start_peer()
        # Ten times the bound: without one, the client would hold all of it.
        stop_after = 10 * MAX_RESPONSE_BYTES
        self.peer.routes[("/api/v1/namespaces/ns/configmaps", True)] = self.endless(
            LINE_START, stop_after)
        client = self.kube_client(url)
        before = memory()
        if not reset_peak():
            raise unittest.SkipTest("/proc/self/clear_refs refused: peak RSS cannot be reset")
        watch = client.watch(CONFIGMAPS, lambda kind, obj: None, namespace="ns",
                             idle_timeout=30)
        yield poll_until(lambda: watch.done.called or (
            self.peer.endless and self.peer.endless[0].stopped), 60, 0.05,
            what="the watch ending or the server sending all it has")
        peak = memory()["VmHWM"]
        growth = peak - before["VmRSS"]
        sent = self.peer.endless[0].sent
        report("endless_watch_line_bytes_sent", sent)
        report("endless_watch_line_rss_growth", f"{growth / MB:.1f}MB (bound "
                                                f"{RSS_BOUND / MB:.0f}MB)")
        if not watch.done.called:
            watch.cancel()
        failure = yield self.assertFailure(watch.done, errors.ResponseTooLarge)
        self.assertIn(f"longer than {MAX_RESPONSE_BYTES} bytes", str(failure))
        self.assertLessEqual(growth, RSS_BOUND)
        # The connection was dropped at the bound, not read to the end.
        self.assertLess(sent, stop_after)
        yield poll_until(lambda: self.peer.endless[0].lost.called, 10, 0.01,
                         what="the server seeing the connection dropped")

    @defer.inlineCallbacks
    def test_informer_reconnects_with_backoff_after_an_endless_line(self):
        url = self.start_peer()
        path = "/api/v1/namespaces/ns/configmaps"
        self.peer.routes[(path, False)] = empty_list
        self.peer.routes[(path, True)] = self.endless(LINE_START, 10 * MB)
        client = self.kube_client(url, max_response_bytes=256 * 1024)
        reconnects = self.log_events("informer reconnecting")
        backoff = Retries(backoff_policy(initial=0.05, maximum=0.2, jitter=0.0))
        informer = Informer(reactor, client, CONFIGMAPS, namespace="ns", backoff=backoff)
        informer.start()
        self.addCleanup(informer.stop)
        yield poll_until(lambda: informer.watches >= 3, 30, 0.01,
                         what="the informer watching again twice")
        self.assertTrue(informer.has_synced)
        self.assertGreaterEqual(len(reconnects), 2)
        for event in reconnects[:2]:
            self.assertIn("longer than 262144 bytes", event["reason"])
            self.assertGreater(event["delay"], 0)
        yield poll_until(lambda: all(b.lost.called for b in self.peer.endless[:2]), 10, 0.01,
                         what="the first two watch connections dropped")
        self.assertTrue(all(b.sent < 10 * MB for b in self.peer.endless[:2]))


class BoundedBodyTests(PeerFixture, unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_kube_answer_past_the_bound_is_response_too_large(self):
        url = self.start_peer()
        self.peer.routes[("/api/v1/namespaces/ns/configmaps", False)] = self.endless(
            b'{"kind":"ConfigMapList","items":["', 4 * MAX_RESPONSE_BYTES)
        client = self.kube_client(url)
        failure = yield self.assertFailure(client.list(CONFIGMAPS, "ns"),
                                           errors.ResponseTooLarge)
        self.assertIsInstance(failure, errors.KubeError)
        self.assertIn(url, str(failure))
        yield poll_until(lambda: self.peer.endless[0].lost.called, 10, 0.01,
                         what="the server seeing the connection dropped")
        self.assertLess(self.peer.endless[0].sent, 4 * MAX_RESPONSE_BYTES)

    @defer.inlineCallbacks
    def test_kube_answer_at_the_bound_is_read(self):
        url = self.start_peer()
        body = json.dumps({"kind": "ConfigMapList", "metadata": {}, "items": []}).encode()
        body += b" " * (1000 - len(body))
        self.assertEqual(len(body), 1000)
        self.peer.routes[("/api/v1/namespaces/ns/configmaps", False)] = lambda r: body
        client = self.kube_client(url, max_response_bytes=1000)
        listed = yield client.list(CONFIGMAPS, "ns")
        self.assertEqual(listed["items"], [])
        client = self.kube_client(url, max_response_bytes=999)
        yield self.assertFailure(client.list(CONFIGMAPS, "ns"), errors.ResponseTooLarge)
        # The whole answer came in one read: Twisted finishes parsing it (and pools
        # the dropped connection, skipped when asked for) after the error fired.
        yield task.deferLater(reactor, 0, lambda: None)

    @defer.inlineCallbacks
    def test_etcd_answer_past_the_bound_is_response_too_large(self):
        url = self.start_peer()
        self.peer.routes[("/v3/kv/range", False)] = self.endless(b'{"kvs":["', 64 * MB)
        etcd = EtcdClient(reactor, EtcdConfig(url=url, timeout=30.0,
                                              max_response_bytes=4 * MB))
        self.addCleanup(etcd.close)
        failure = yield self.assertFailure(etcd.range(b"/registry/"),
                                           etcd_errors.ResponseTooLarge)
        self.assertIsInstance(failure, etcd_errors.EtcdError)
        self.assertIn("longer than 4194304 bytes", str(failure))
        yield poll_until(lambda: self.peer.endless[0].lost.called, 10, 0.01,
                         what="etcd's connection dropped")
        self.assertLess(self.peer.endless[0].sent, 64 * MB)
        # One request only: an answer too large is not resent.
        self.assertEqual(len(self.peer.requests), 1)

    def test_etcd_bound_is_validated_and_above_a_range_page(self):
        self.assertGreaterEqual(EtcdConfig(url="http://127.0.0.1:1").max_response_bytes,
                                64 * MB)
        with self.assertRaises(ValueError):
            EtcdConfig(url="http://127.0.0.1:1", max_response_bytes=0)


class EndlessListTests(PeerFixture, unittest.TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def test_list_that_never_ends_fails_typed_and_the_informer_backs_off(self):
        url = self.start_peer()
        pages = []

        def endless_pages(request):
            pages.append(request.args.get(b"continue", [b""])[0].decode())
            request.setHeader(b"content-type", b"application/json")
            item = {"metadata": {"name": f"cm-{len(pages)}", "namespace": "ns",
                                 "resourceVersion": str(len(pages))}}
            return json.dumps({"kind": "ConfigMapList",
                               "metadata": {"resourceVersion": "5",
                                            "continue": f"token-{len(pages)}"},
                               "items": [item]}).encode()

        self.peer.routes[("/api/v1/namespaces/ns/configmaps", False)] = endless_pages
        client = self.kube_client(url)
        failures = self.log_events("informer list failed")
        backoff = Retries(backoff_policy(initial=0.05, maximum=0.2, jitter=0.0))
        informer = Informer(reactor, client, CONFIGMAPS, namespace="ns", backoff=backoff,
                            page_size=1, max_list_pages=25)
        informer.start()
        self.addCleanup(informer.stop)
        yield poll_until(lambda: len(failures) >= 2, 30, 0.01, what="two lists failing")
        for event in failures[:2]:
            self.assertIn("more than 25 pages", event["reason"])
            self.assertGreater(event["delay"], 0)
        self.assertFalse(informer.has_synced)
        self.assertEqual(informer.store, {})
        # Each list stopped at the bound and the next one started from the beginning.
        self.assertGreaterEqual(len(pages), 50)
        self.assertEqual(pages[0], "")
        self.assertEqual(pages[25], "")

    def test_default_bound_is_finite_and_above_the_largest_clusters(self):
        # A million objects at the default page size of 500.
        self.assertEqual(MAX_LIST_PAGES, 2000)
