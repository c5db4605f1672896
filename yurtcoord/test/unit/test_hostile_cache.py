"""Hostile local cache trees (``yurtcoord.testing.hostiletrees``) fed to the local cache
reader alone.

Whatever the tree, the reader ends with every entry either read into an object or
skipped under one of the documented reasons: no exception, no link followed, no read
beyond the size bound, and no more held at once than one chunk. The uploader on a real
etcd meets the same trees in the integration tier.
"""

import os
import shutil
import tracemalloc

from hypothesis import given, settings
from twisted.trial import unittest

from yurtcoord.pool.localcache import BadCacheEntry, CachedObject, LocalCacheReader
from yurtcoord.pool.uploader import SKIP_REASONS
from yurtcoord.testing.hostiletrees import HYPOTHESIS, SECRET_MARKER, tree_on_disk, trees, utf8
from yurtcoord.testing.uploads import NODES, PODS


class HostileTreeReaderTests(unittest.TestCase):
    """The reader alone, with small bounds so that exceeding them would show."""

    MAX_OBJECT = 64 * 1024
    CHUNK_BYTES = 256 * 1024
    CHUNK_SIZE = 5

    @settings(max_examples=80, **HYPOTHESIS)
    @given(trees)
    def test_any_tree_reads_into_objects_and_counted_skips(self, tree):
        workdir, hostile = tree_on_disk(tree, self.MAX_OBJECT)
        try:
            self.check_read(hostile)
        finally:
            shutil.rmtree(workdir)

    def check_read(self, hostile):
        root = os.fsdecode(hostile.root)
        reader = LocalCacheReader(root, chunk_size=self.CHUNK_SIZE,
                                  max_object_bytes=self.MAX_OBJECT,
                                  chunk_bytes=self.CHUNK_BYTES)
        tracemalloc.start()
        try:
            chunks = list(reader.chunks([PODS, NODES]))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # Held at once: one chunk (it ends past chunk_bytes by at most one object) and
        # the object being read; a huge file read whole would be megabytes.
        self.assertLess(peak, self.CHUNK_BYTES + 4 * self.MAX_OBJECT + 512 * 1024)
        reasons = set(SKIP_REASONS)
        seen = {}
        for chunk in chunks:
            self.assertLessEqual(len(chunk), self.CHUNK_SIZE)
            held = [len(e.data) for e in chunk if isinstance(e, CachedObject)]
            self.assertLess(sum(held) - (held[-1] if held else 0), self.CHUNK_BYTES)
            for entry in chunk:
                if isinstance(entry, CachedObject):
                    self.assertLessEqual(len(entry.data), self.MAX_OBJECT)
                    self.assertNotIn(SECRET_MARKER.encode(), entry.data, entry.location.path)
                    self.assertEqual(os.path.realpath(entry.location.path),
                                     os.path.join(os.path.realpath(root),
                                                  os.path.relpath(entry.location.path, root)))
                    seen[os.fsencode(entry.location.path)] = "read"
                else:
                    self.assertIsInstance(entry, BadCacheEntry)
                    self.assertIn(entry.category, reasons)
                    seen[os.fsencode(entry.path)] = entry.category
        for path, reason in hostile.skips.items():
            # The reader refuses links, sizes, non-files and names that are not UTF-8;
            # the rest (bad bytes, wrong kinds, names etcd keys cannot hold) it reads,
            # and the uploader judges.
            if reason in ("symlink", "too_large", "unreadable") or (
                    reason == "invalid_name" and not utf8(path)):
                self.assertEqual(seen.get(path), reason, path)
            else:
                self.assertEqual(seen.get(path), "read", path)
