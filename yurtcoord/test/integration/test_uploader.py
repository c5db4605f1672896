"""The local cache upload to a pool store on a real etcd, read back with etcdctl: good
objects uploaded and bad files counted, older local objects never overwriting newer
ones, etcd killed mid-upload or losing writes in an outage, and the memory an upload of
huge files takes, measured in a process of its own. Its timing and cancellation on a
Clock are in the unit tier.
"""

import json
import os
import sys

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessDone
from twisted.logger import Logger, globalLogPublisher
from twisted.trial import unittest

from yurtcoord.etcd.errors import EtcdUnavailable
from yurtcoord.pool.localcache import LocalCacheReader
from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keys import format_rv
from yurtcoord.sim.etcd import preferred_etcd_binary
from yurtcoord.testing.etcdstore import EtcdStoreCase
from yurtcoord.testing.storedobjects import make_object
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess
from yurtcoord.testing.uploads import NODES, PODS, PODS_GVR, steady_backoff, write_file
from yurtcoord.pool.uploader import LocalCacheUploader, UploadCounts, UploadFailed


def quick_backoff():
    """Short pauses, so that an upload waiting for etcd to come back retries often."""
    return steady_backoff(initial=0.05, maximum=0.5)


class UploadBehaviour(EtcdStoreCase):

    def setUp(self):
        super().setUp()
        self.local = os.path.abspath(self.mktemp())
        os.makedirs(self.local)
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def pod_path(self, namespace, name, legacy=False):
        resource_dir = "pods" if legacy else "pods.v1.core"
        return os.path.join(self.local, "kubelet", resource_dir, namespace, name)

    def uploader(self, chunk_size=500, **kwargs):
        kwargs.setdefault("backoff", quick_backoff())
        return LocalCacheUploader(self.store, LocalCacheReader(self.local, chunk_size=chunk_size),
                                  [PODS, NODES], **kwargs)

    def skipped_paths(self):
        return [e.get("path") for e in self.events
                if e.get("log_format", "").startswith("local cache file skipped")]

    @defer.inlineCallbacks
    def test_good_objects_uploaded_and_bad_files_counted(self):
        good = {}
        for i in range(5):
            data = make_object(f"p{i}", "default", 100 + i)
            write_file(self.pod_path("default", f"p{i}"), data)
            good[f"/registry/pods/default/p{i}"] = data
        legacy = make_object("old", "kube-system", 7)
        write_file(self.pod_path("kube-system", "old", legacy=True), legacy)
        good["/registry/pods/kube-system/old"] = legacy
        node = make_object("edge-1", "", 9, kind="Node")
        write_file(os.path.join(self.local, "kubelet", "nodes.v1.core", "edge-1"), node)
        good["/registry/minions/edge-1"] = node
        bad = {
            "truncated": make_object("truncated", "default", 1)[:-5],
            "no-rv": b'{"metadata":{"name":"no-rv","namespace":"default"}}',
            "rv-abc": (b'{"metadata":{"name":"rv-abc","namespace":"default",'
                       b'"resourceVersion":"abc"}}'),
            "not-json": b"\x00\x01binary",
            "other-name": make_object("someone-else", "default", 3),
        }
        for name, data in bad.items():
            write_file(self.pod_path("default", name), data)
        os.makedirs(self.pod_path("default", "a-directory"))
        os.symlink("/nonexistent/target", self.pod_path("default", "dangling"))
        unreadable = self.pod_path("default", "unreadable")
        write_file(unreadable, make_object("unreadable", "default", 4))
        os.chmod(unreadable, 0)
        unreadable_is_bad = os.geteuid() != 0  # root reads mode-0 files anyway
        if not unreadable_is_bad:
            good["/registry/pods/default/unreadable"] = make_object("unreadable", "default", 4)
        bad_count = len(bad) + 2 + (1 if unreadable_is_bad else 0)

        metrics = Metrics("edge-1")
        counts = yield self.uploader(chunk_size=3, metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(len(good), 0, 0, bad_count))
        self.assertEqual(self.dump(), good)
        self.assertEqual(set(self.mirrors()), set(good))
        self.assertEqual(self.mirrors()["/registry/pods/default/p3"], format_rv(103))
        skipped = self.skipped_paths()
        self.assertEqual(len(skipped), bad_count)
        for name in list(bad) + ["a-directory", "dangling"]:
            self.assertIn(self.pod_path("default", name), skipped)
        registry = metrics.registry
        self.assertEqual(registry.get_sample_value("yurtcoord_uploaded_objects_total"), len(good))
        self.assertEqual(registry.get_sample_value("yurtcoord_skipped_objects_total",
                                                   {"reason": "bad_object"}), 4)
        self.assertEqual(registry.get_sample_value("yurtcoord_skipped_objects_total",
                                                   {"reason": "invalid_name"}), 1)

        # The key cache (memory and file) now knows what kubelet owns.
        self.assertEqual(set(self.store.list_resource_keys_of_component("kubelet", PODS_GVR)),
                         {k for k in good if k.startswith("/registry/pods/")})
        self.assertEqual(ComponentKeyCache.in_directory(self.cache_dir).load().keys("kubelet"),
                         set(good))

        # Twice: nothing changes the second time.
        self.events.clear()
        again = yield self.uploader().upload()
        self.assertEqual(again, UploadCounts(0, 0, len(good), bad_count))
        self.assertEqual(self.dump(), good)

    @defer.inlineCallbacks
    def test_older_local_objects_never_overwrite_newer(self):
        newer_in_etcd = make_object("a", "ns", 50)
        older_in_etcd = make_object("b", "ns", 5)
        yield self.store.create(self.key("pods", "a", "ns"), newer_in_etcd)
        yield self.store.create(self.key("pods", "b", "ns"), older_in_etcd)
        write_file(self.pod_path("ns", "a"), make_object("a", "ns", 40))
        local_b = make_object("b", "ns", 6)
        write_file(self.pod_path("ns", "b"), local_b)
        counts = yield self.uploader().upload()
        self.assertEqual(counts, UploadCounts(0, 1, 1, 0))
        self.assertEqual(self.dump(), {"/registry/pods/ns/a": newer_in_etcd,
                                       "/registry/pods/ns/b": local_b})
        self.assertEqual(self.mirrors(), {"/registry/pods/ns/a": format_rv(50),
                                          "/registry/pods/ns/b": format_rv(6)})

    @defer.inlineCallbacks
    def test_same_object_in_both_layouts_written_once_at_newest(self):
        newest = make_object("p", "ns", 20)
        write_file(self.pod_path("ns", "p"), make_object("p", "ns", 10))
        write_file(self.pod_path("ns", "p", legacy=True), newest)
        write_file(self.pod_path("ns", "q", legacy=True), make_object("q", "ns", 5))
        counts = yield self.uploader().upload()
        self.assertEqual(counts, UploadCounts(2, 0, 1, 0))
        self.assertEqual(self.dump(), {"/registry/pods/ns/p": newest,
                                       "/registry/pods/ns/q": make_object("q", "ns", 5)})
        # Split across chunks, the older copy is simply not newer.
        again = yield self.uploader(chunk_size=1).upload()
        self.assertEqual(again, UploadCounts(0, 0, 3, 0))

    @defer.inlineCallbacks
    def test_etcd_killed_mid_upload_and_restarted(self):
        total = 10000
        expected = {}
        for i in range(total):
            name = f"pod-{i:05d}"
            data = make_object(name, f"ns-{i % 7}", 1000 + i, padding=2900)
            write_file(self.pod_path(f"ns-{i % 7}", name), data)
            expected[f"/registry/pods/ns-{i % 7}/{name}"] = (1000 + i, data)
        # Some objects already in the pool: 200 newer than the local ones, 200 older.
        preexisting = []
        for i in range(400):
            name = f"pod-{i:05d}"
            rv = 1000 + i + (5000 if i < 200 else -500)
            data = make_object(name, f"ns-{i % 7}", rv)
            preexisting.append((self.key("pods", name, f"ns-{i % 7}", component="other"),
                                data, rv))
            if i < 200:
                expected[f"/registry/pods/ns-{i % 7}/{name}"] = (rv, data)
        yield self.store.create_or_update_many(preexisting)

        uploader = self.uploader(backoff=quick_backoff(), max_attempts=200)
        upload = uploader.upload()
        yield poll_until(lambda: uploader.files_seen >= 3000, timeout=60)
        self.etcd.kill()
        yield poll_until(lambda: uploader.retries >= 2, timeout=30)
        self.assertFalse(upload.called)
        self.etcd.restart()
        counts = yield upload
        self.assertEqual(counts, UploadCounts(total - 400, 200, 200, 0))
        dump = self.dump("/registry/pods/")
        self.assertEqual(len(dump), total)
        for path, (_rv, data) in expected.items():
            self.assertEqual(dump[path], data, path)
        mirrors = self.mirrors("/registry/pods/")
        self.assertEqual(mirrors, {path: format_rv(rv) for path, (rv, _d) in expected.items()})

    @defer.inlineCallbacks
    def test_writes_etcd_lost_in_an_outage_are_written_again(self):
        expected = {}
        for i in range(300):
            name = f"pod-{i:03d}"
            data = make_object(name, "ns", 100 + i)
            write_file(self.pod_path("ns", name), data)
            expected[f"/registry/pods/ns/{name}"] = data
        losing = EtcdForgetsOnce(self.store, lose_at=3)
        uploader = LocalCacheUploader(losing, LocalCacheReader(self.local, chunk_size=100),
                                      [PODS], backoff=quick_backoff(), max_in_flight=1)
        counts = yield uploader.upload()
        self.assertEqual(len(losing.forgotten), 100)
        self.assertEqual(counts, UploadCounts(300, 0, 0, 0))
        self.assertEqual(uploader.rewritten, 100)
        self.assertEqual(self.dump(), expected)
        self.assertEqual(set(self.mirrors()), set(expected))
        warnings = [e for e in self.events
                    if e.get("log_format", "").startswith("local cache checked again")]
        self.assertEqual([(e["rewritten"], e["checked"]) for e in warnings], [(100, 300)])

    @defer.inlineCallbacks
    def test_upload_without_outage_reads_the_cache_once(self):
        for i in range(3):
            write_file(self.pod_path("ns", f"p{i}"), make_object(f"p{i}", "ns", 1 + i))
        counting = EtcdForgetsOnce(self.store, lose_at=None)
        uploader = LocalCacheUploader(counting, LocalCacheReader(self.local, chunk_size=1),
                                      [PODS], backoff=quick_backoff(), max_in_flight=1)
        counts = yield uploader.upload()
        self.assertEqual(counts, UploadCounts(3, 0, 0, 0))
        self.assertEqual(counting.calls, 3)
        self.assertEqual(uploader.rewritten, 0)

    @defer.inlineCallbacks
    def test_upload_fails_when_etcd_stays_down(self):
        write_file(self.pod_path("ns", "a"), make_object("a", "ns", 1))
        self.etcd.kill()
        uploader = self.uploader(max_attempts=3)
        with self.assertRaises(UploadFailed) as ctx:
            yield uploader.upload()
        self.assertIsInstance(ctx.exception.cause, EtcdUnavailable)
        self.assertEqual(ctx.exception.counts, UploadCounts())
        self.assertEqual(uploader.retries, 2)


    def skipped_count(self, metrics, reason):
        return metrics.registry.get_sample_value("yurtcoord_skipped_objects_total",
                                                 {"reason": reason})

    def write_good_pods(self, count, namespace="default"):
        good = {}
        for i in range(count):
            data = make_object(f"good-{i}", namespace, 10 + i)
            write_file(self.pod_path(namespace, f"good-{i}"), data)
            good[f"/registry/pods/{namespace}/good-{i}"] = data
        return good

    @defer.inlineCallbacks
    def test_deeply_nested_json_is_a_bad_object_and_the_rest_is_uploaded(self):
        good = self.write_good_pods(6)
        nested = b'{"metadata":' * 1000 + b"{}" + b"}" * 1000
        self.assertLess(len(nested), 16 * 1024)
        write_file(self.pod_path("default", "nested"), nested)
        write_file(self.pod_path("default", "nested-list"), b"[" * 2000 + b"]" * 2000)
        metrics = Metrics("edge-1")
        counts = yield self.uploader(chunk_size=4, metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(6, 0, 0, 2))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "bad_object"), 2)
        self.assertIn(self.pod_path("default", "nested"), self.skipped_paths())

    @defer.inlineCallbacks
    def test_json_not_in_utf8_is_a_bad_object_and_never_stored(self):
        """Kubernetes objects are UTF-8 JSON; the coordinator apiserver reading the pool
        store could not decode a copy in UTF-16 or with a byte order mark."""
        good = self.write_good_pods(2)
        pod = make_object("wide", "default", 20).decode("utf-8")
        write_file(self.pod_path("default", "wide"), pod.encode("utf-16"))
        write_file(self.pod_path("default", "wide-be"), pod.encode("utf-32-be"))
        write_file(self.pod_path("default", "marked"),
                   make_object("marked", "default", 21).decode("utf-8").encode("utf-8-sig"))
        metrics = Metrics("edge-1")
        counts = yield self.uploader(chunk_size=2, metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(2, 0, 0, 3))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "bad_object"), 3)
        self.assertEqual(sorted(self.skipped_paths()),
                         sorted(self.pod_path("default", n) for n in ("wide", "wide-be", "marked")))

    @defer.inlineCallbacks
    def test_json_beyond_rfc_8259_is_a_bad_object_and_never_stored(self):
        """What Python's own decoder would take and the coordinator apiserver could not
        read back: NaN, Infinity, a number beyond a double's range, a lone surrogate."""
        good = self.write_good_pods(2)
        values = {"nan": b"NaN", "inf": b"-Infinity", "huge": b"1e400",
                  "surrogate": b'"\\ud800"'}
        for name, value in values.items():
            pod = make_object(name, "default", 20)
            write_file(self.pod_path("default", name),
                       pod[:-1] + b',"spec":{"value":' + value + b"}}")
        metrics = Metrics("edge-1")
        counts = yield self.uploader(chunk_size=2, metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(2, 0, 0, 4))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "bad_object"), 4)
        self.assertEqual(sorted(self.skipped_paths()),
                         sorted(self.pod_path("default", name) for name in values))

    @defer.inlineCallbacks
    def test_links_are_skipped_and_what_they_point_to_never_uploaded(self):
        good = self.write_good_pods(2)
        outside = os.path.abspath(self.mktemp())
        # Valid pods, as far as their content goes: following a link would upload them.
        secret = make_object("stolen", "default", 5, kind="Pod", padding=10)
        write_file(os.path.join(outside, "secret"), secret)
        write_file(os.path.join(outside, "ns", "linked-ns-pod"),
                   make_object("linked-ns-pod", "linked", 6))
        write_file(os.path.join(outside, "legacy", "default", "legacy-pod"),
                   make_object("legacy-pod", "default", 7))
        os.symlink(os.path.join(outside, "secret"), self.pod_path("default", "stolen"))
        os.symlink(os.path.join(outside, "ns"),
                   os.path.join(self.local, "kubelet", "pods.v1.core", "linked"))
        os.symlink(os.path.join(outside, "legacy"), os.path.join(self.local, "kubelet", "pods"))
        metrics = Metrics("edge-1")
        counts = yield self.uploader(metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(2, 0, 0, 3))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "symlink"), 3)
        self.assertEqual(self.skipped_count(metrics, "unreadable"), 0)
        lines = [e for e in self.events
                 if e.get("log_format", "").startswith("local cache file skipped")]
        self.assertEqual(sorted(e["category"] for e in lines), ["symlink"] * 3)

    @defer.inlineCallbacks
    def test_objects_of_another_kind_are_skipped(self):
        good = self.write_good_pods(2)
        secret = (b'{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s",'
                  b'"namespace":"default","resourceVersion":"3"},"data":{"k":"dg=="}}')
        write_file(self.pod_path("default", "s"), secret)
        write_file(self.pod_path("default", "legacy-secret", legacy=True),
                   secret.replace(b'"name":"s"', b'"name":"legacy-secret"'))
        write_file(self.pod_path("default", "apps-pod"),
                   make_object("apps-pod", "default", 4).replace(b'"apiVersion":"v1"',
                                                                 b'"apiVersion":"apps/v1"'))
        write_file(self.pod_path("default", "no-kind"),
                   b'{"apiVersion":"v1","metadata":{"name":"no-kind","namespace":"default",'
                   b'"resourceVersion":"5"}}')
        write_file(os.path.join(self.local, "kubelet", "nodes.v1.core", "edge-1"),
                   make_object("edge-1", "", 9, kind="Pod"))
        node = make_object("edge-2", "", 9, kind="Node")
        write_file(os.path.join(self.local, "kubelet", "nodes", "edge-2"), node)
        good["/registry/minions/edge-2"] = node
        metrics = Metrics("edge-1")
        counts = yield self.uploader(metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(3, 0, 0, 5))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "wrong_kind"), 5)
        reasons = {e["path"]: e["reason"] for e in self.events
                   if e.get("log_format", "").startswith("local cache file skipped")}
        self.assertEqual(reasons[self.pod_path("default", "s")],
                         "a 'Secret' of 'v1' where pods of v1 belong")
        self.assertEqual(reasons[self.pod_path("default", "apps-pod")],
                         "a 'Pod' of 'apps/v1' where pods of v1 belong")
        self.assertEqual(reasons[self.pod_path("default", "no-kind")], "no kind")

    @defer.inlineCallbacks
    def test_names_that_are_not_utf8_are_invalid_names(self):
        good = self.write_good_pods(2)
        directory = os.fsencode(os.path.dirname(self.pod_path("default", "x")))
        # The JSON escape \udcff is what Python makes of the file name byte 0xff.
        with open(directory + b"/bad-\xff", "wb") as f:
            f.write(b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad-\\udcff",'
                    b'"namespace":"default","resourceVersion":"3"}}')
        metrics = Metrics("edge-1")
        counts = yield self.uploader(metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(2, 0, 0, 1))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "invalid_name"), 1)
        [line] = [e for e in self.events
                  if e.get("log_format", "").startswith("local cache file skipped")]
        self.assertTrue(line["path"].endswith("/default/bad-\\xff"), line["path"])

    @defer.inlineCallbacks
    def test_oversized_files_are_too_large_without_being_read(self):
        good = self.write_good_pods(2)
        big = self.pod_path("default", "big")
        write_file(big, make_object("big", "default", 3)[:-1])
        os.truncate(big, 4 * 1024 * 1024)
        metrics = Metrics("edge-1")
        counts = yield self.uploader(metrics=metrics).upload()
        self.assertEqual(counts, UploadCounts(2, 0, 0, 1))
        self.assertEqual(self.dump(), good)
        self.assertEqual(self.skipped_count(metrics, "too_large"), 1)
        self.assertEqual(self.skipped_count(metrics, "unreadable"), 0)


class UploadTests(UploadBehaviour, unittest.TestCase):
    """On the preferred etcd: an upload proves the same on 3.4 and 3.5 (writes an etcd
    3.5.0 to 3.5.2 loses on SIGKILL are checked and written again like any other)."""

    etcd_binary = preferred_etcd_binary()


class UploadMemoryTests(EtcdStoreCase, unittest.TestCase):
    """The memory an upload takes is bounded by what it may hold, not by the files."""

    etcd_binary = preferred_etcd_binary()
    log = Logger()

    @defer.inlineCallbacks
    def test_cache_of_huge_sparse_files_costs_little_memory(self):
        """Peak RSS growth of the uploading process stays within 64 MB.

        Measured: 0.7 MB (672 KiB); a reader that read each file whole, up to 16 MiB,
        grew by 656 MB on the same cache.
        """
        local = os.path.abspath(self.mktemp())
        good = {}
        for i in range(40):
            path = os.path.join(local, "kubelet", "pods.v1.core", "default", f"huge-{i}")
            write_file(path, make_object(f"huge-{i}", "default", 1)[:-1])
            os.truncate(path, 16 * 1024 * 1024)  # sparse: 640 MB that cost no disk
        for i in range(30):
            data = make_object(f"pod-{i}", "default", 100 + i, padding=2000)
            write_file(os.path.join(local, "kubelet", "pods.v1.core", "default", f"pod-{i}"),
                       data)
            good[f"/registry/pods/default/pod-{i}"] = data
        child = CollectingProcess()
        reactor.spawnProcess(
            child, sys.executable,
            [sys.executable, "-m", "yurtcoord.testing.uploadmemory", self.etcd.client_url,
             local, os.path.abspath(self.mktemp())],
            env=dict(os.environ))
        ended = yield child.ended
        self.assertIsInstance(ended, ProcessDone, child.err.decode(errors="replace"))
        report = json.loads(child.out.decode().strip().splitlines()[-1])
        self.log.info("peak RSS growth of an upload of 40 sparse 16 MiB files and 30 pods: "
                      "{growth} KiB (peak reset: {reset})", growth=report["growth_kib"],
                      reset=report["peak_reset"])
        self.assertLessEqual(report["growth_kib"], 64 * 1024, report)
        self.assertEqual(report["counts"], UploadCounts(30, 0, 0, 40)._asdict())
        self.assertEqual(report["skipped"]["too_large"], 40)
        self.assertEqual(self.dump(), good)


class EtcdForgetsOnce:
    """Wraps a real PoolStore: call ``lose_at`` first deletes from etcd every key written
    by the call before it (value and mirror rv), then fails with EtcdUnavailable; what
    etcd 3.5.0 to 3.5.2 can do to writes acknowledged just before it was killed."""

    # Calls one at a time (the uploader given max_in_flight=1 as well), so that "the
    # call before" is the one answered last.
    parallel_batches = 1

    def __init__(self, store, lose_at):
        self.store = store
        self.lose_at = lose_at
        self.calls = 0
        self.forgotten = []
        self._last_written = []

    def __getattr__(self, name):
        return getattr(self.store, name)

    @defer.inlineCallbacks
    def create_or_update_many(self, items, outcome=None, flush_key_cache=True,
                              in_flight=None):
        self.calls += 1
        if self.calls == self.lose_at:
            for path in self._last_written:
                yield self.store.etcd.delete(path.encode())
                yield self.store.etcd.delete(f"/mirror/rv{path}".encode())
            self.forgotten = self._last_written
            raise EtcdUnavailable("etcd restarted")
        items = list(items)
        result = yield self.store.create_or_update_many(items, outcome, flush_key_cache,
                                                        in_flight)
        self._last_written = list(result.created) + list(result.updated)
        return result
