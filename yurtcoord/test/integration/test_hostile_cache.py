"""Hostile local cache trees (``yurtcoord.testing.hostiletrees``) uploaded by the local
cache reader and the uploader to a pool store on a real etcd.

Whatever the tree, the upload completes with every valid object in the pool store with
its exact bytes and every other entry skipped, counted and logged under one of the
documented reasons; nothing reached through a link and no object of another kind is
ever uploaded. ``@given`` cannot wait for a Deferred, so the examples run in a thread
that blocks on each upload in the reactor.
"""

import os
import shutil

from hypothesis import given, settings
from twisted.internet import reactor, threads
from twisted.internet.defer import inlineCallbacks
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.localcache import LocalCacheReader
from yurtcoord.pool.store import PoolStore
from yurtcoord.pool.uploader import SKIP_REASONS, LocalCacheUploader
from yurtcoord.sim.etcd import preferred_etcd_binary
from yurtcoord.testing.etcdstore import EtcdStoreCase
from yurtcoord.testing.hostiletrees import (
    HYPOTHESIS, SECRET_MARKER, WRONG_KIND_MARKER, tree_on_disk, trees, utf8,
)
from yurtcoord.testing.uploads import NODES, PODS


class HostileTreeUploadTests(EtcdStoreCase, unittest.TestCase):
    """Reader and uploader on a real etcd: valid objects uploaded exactly, all else
    skipped under the reason the tree calls for, and the upload always completes."""

    etcd_binary = preferred_etcd_binary()

    def setUp(self):
        super().setUp()
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.examples = 0
        self.uploaded = 0
        self.reasons_seen = set()

    @inlineCallbacks
    def upload(self, hostile, prefix, key_cache_dir):
        store = PoolStore(reactor, self.client, prefix,
                          ComponentKeyCache.in_directory(key_cache_dir).load())
        metrics = Metrics("edge-1")
        uploader = LocalCacheUploader(store, LocalCacheReader(os.fsdecode(hostile.root)),
                                      [PODS, NODES], metrics=metrics)
        try:
            counts = yield uploader.upload()
        finally:
            store.close()
        return counts, metrics

    def run_example(self, tree):
        self.examples += 1
        prefix = f"/example-{self.examples}"
        workdir, hostile = tree_on_disk(tree, 1536 * 1024)
        try:
            del self.events[:]
            counts, metrics = threads.blockingCallFromThread(
                reactor, self.upload, hostile, prefix, os.path.join(workdir, "keys"))
            stored = {k.decode()[len(prefix):]: v
                      for k, v in self.etcd.read(prefix + "/", prefix=True).items()}
            for value in stored.values():
                self.assertNotIn(SECRET_MARKER.encode(), value)
                self.assertNotIn(WRONG_KIND_MARKER.encode(), value)
            self.assertEqual(stored, hostile.expected)
            self.assertEqual(counts.created, len(hostile.expected))
            skipped = {reason: metrics.registry.get_sample_value(
                "yurtcoord_skipped_objects_total", {"reason": reason})
                for reason in SKIP_REASONS}
            self.assertEqual(sum(v for r, v in skipped.items() if r != "not_newer"),
                             counts.skipped_bad)
            lines = [e for e in self.events
                     if e.get("log_format", "").startswith("local cache file skipped")]
            self.assertEqual(len(lines), counts.skipped_bad)
            # Paths that are not UTF-8 are logged escaped; the others as they are.
            logged = {os.fsencode(e["path"]): e["category"] for e in lines}
            for path, reason in hostile.skips.items():
                if utf8(path):
                    self.assertEqual(logged.get(path), reason, path)
            self.uploaded += len(stored)
            self.reasons_seen.update(r for r, v in skipped.items() if v)
        finally:
            shutil.rmtree(workdir)

    def test_any_tree_uploads_its_valid_objects_and_counts_the_rest(self):
        @settings(max_examples=30, **HYPOTHESIS)
        @given(trees)
        def property_(tree):
            self.run_example(tree)

        d = threads.deferToThread(property_)

        def exercised(_):
            self.assertEqual(self.examples, 30)
            # The examples did hold valid objects and every kind of bad entry.
            self.assertGreaterEqual(self.uploaded, 10, self.reasons_seen)
            self.assertEqual(self.reasons_seen, set(SKIP_REASONS) - {"not_newer"})

        return d.addCallback(exercised)

    test_any_tree_uploads_its_valid_objects_and_counts_the_rest.timeout = 600
