"""Local disk cache reader: both layouts, path parsing, bad entries, bounded chunks."""

import os

from twisted.trial import unittest

from yurtcoord.config import UploadResource
from yurtcoord.localcache import (
    BadCacheEntry, CachedObject, CachedObjectPath, LocalCacheReader, parse_cache_path,
    parse_resource_dir_name,
)

PODS = UploadResource("kubelet", "pods", "v1")
NODES = UploadResource("kubelet", "nodes", "v1")
SLICES = UploadResource("kube-proxy", "endpointslices", "v1", "discovery.k8s.io")


def write(path, data=b"{}"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


class PathParsingTests(unittest.TestCase):
    def test_resource_dir_names(self):
        self.assertEqual(parse_resource_dir_name("pods.v1.core"), ("", "v1", "pods"))
        self.assertEqual(parse_resource_dir_name("endpointslices.v1.discovery.k8s.io"),
                         ("discovery.k8s.io", "v1", "endpointslices"))
        self.assertIsNone(parse_resource_dir_name("pods"))
        self.assertIsNone(parse_resource_dir_name("pods.v1"))

    def test_new_layout_namespaced(self):
        loc = parse_cache_path("/c", "/c/kubelet/pods.v1.core/default/nginx")
        self.assertEqual(loc, CachedObjectPath("/c/kubelet/pods.v1.core/default/nginx",
                                               "kubelet", "", "v1", "pods", "default", "nginx"))

    def test_new_layout_group_with_dots_and_cluster_scoped(self):
        loc = parse_cache_path("/c", "/c/kube-proxy/endpointslices.v1.discovery.k8s.io/ns/s")
        self.assertEqual((loc.group, loc.version, loc.resource, loc.namespace, loc.name),
                         ("discovery.k8s.io", "v1", "endpointslices", "ns", "s"))
        node = parse_cache_path("/c", "/c/kubelet/nodes.v1.core/edge-1")
        self.assertEqual((node.resource, node.namespace, node.name), ("nodes", "", "edge-1"))

    def test_legacy_layout_takes_version_and_group_given(self):
        loc = parse_cache_path("/c", "/c/kubelet/pods/default/nginx", "v1", "")
        self.assertEqual((loc.component, loc.group, loc.version, loc.resource, loc.namespace,
                          loc.name), ("kubelet", "", "v1", "pods", "default", "nginx"))

    def test_other_paths_rejected(self):
        self.assertRaises(ValueError, parse_cache_path, "/c", "/c/kubelet/pods.v1.core")
        self.assertRaises(ValueError, parse_cache_path, "/c", "/c/a/b/c/d/e")
        self.assertRaises(ValueError, parse_cache_path, "/c", "/elsewhere/kubelet/pods/n/p")


class ReaderTests(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def collect(self, reader, resources):
        chunks = list(reader.chunks(resources))
        return chunks, [e for c in chunks for e in c]

    def test_both_layouts_and_scopes(self):
        write(self.path("kubelet", "pods.v1.core", "default", "a"), b"A")
        write(self.path("kubelet", "pods", "kube-system", "b"), b"B")
        write(self.path("kubelet", "pods", "pods", "c"), b"C")  # a namespace named "pods"
        write(self.path("kubelet", "nodes.v1.core", "edge-1"), b"N")
        write(self.path("kube-proxy", "endpointslices.v1.discovery.k8s.io", "d", "s"), b"S")
        write(self.path("kubelet", "configmaps.v1.core", "default", "ignored"), b"X")
        reader = LocalCacheReader(self.dir)
        _chunks, entries = self.collect(reader, [PODS, NODES, SLICES])
        self.assertTrue(all(isinstance(e, CachedObject) for e in entries))
        got = sorted((e.location.component, e.location.group, e.location.version,
                      e.location.resource, e.location.namespace, e.location.name, e.data)
                     for e in entries)
        self.assertEqual(got, [
            ("kube-proxy", "discovery.k8s.io", "v1", "endpointslices", "d", "s", b"S"),
            ("kubelet", "", "v1", "nodes", "", "edge-1", b"N"),
            ("kubelet", "", "v1", "pods", "default", "a", b"A"),
            ("kubelet", "", "v1", "pods", "kube-system", "b", b"B"),
            ("kubelet", "", "v1", "pods", "pods", "c", b"C"),
        ])

    def test_missing_directories_yield_nothing(self):
        self.assertEqual(self.collect(LocalCacheReader(self.dir), [PODS])[1], [])
        self.assertEqual(self.collect(LocalCacheReader(self.path("absent")), [PODS])[1], [])

    def test_chunks_are_bounded(self):
        for i in range(23):
            write(self.path("kubelet", "pods.v1.core", "ns", f"p{i}"))
        chunks, entries = self.collect(LocalCacheReader(self.dir, chunk_size=5), [PODS])
        self.assertEqual([len(c) for c in chunks], [5, 5, 5, 5, 3])
        self.assertEqual(sorted(e.location.name for e in entries),
                         sorted(f"p{i}" for i in range(23)))

    def test_chunks_are_lazy(self):
        for i in range(10):
            write(self.path("kubelet", "pods.v1.core", "ns", f"p{i}"), b"old")
        chunks = LocalCacheReader(self.dir, chunk_size=4).chunks([PODS])
        first = next(chunks)
        self.assertEqual([e.data for e in first], [b"old"] * 4)
        # Files are read only when their chunk is asked for: nothing was read ahead.
        for i in range(10):
            write(self.path("kubelet", "pods.v1.core", "ns", f"p{i}"), b"new")
        rest = [e for c in chunks for e in c]
        self.assertEqual([e.data for e in rest], [b"new"] * 6)

    def test_bad_entries_reported_not_raised(self):
        write(self.path("kubelet", "pods.v1.core", "default", "good"), b"G")
        os.makedirs(self.path("kubelet", "pods.v1.core", "default", "a-directory"))
        os.makedirs(self.path("kubelet", "nodes.v1.core", "dir-instead-of-node"))
        unreadable = self.path("kubelet", "pods.v1.core", "default", "unreadable")
        write(unreadable, b"secret")
        os.chmod(unreadable, 0)
        os.symlink(self.path("nowhere"),
                   self.path("kubelet", "pods.v1.core", "default", "dangling"))
        write(self.path("kubelet", "pods.v1.core", "default", "tmp_partial"), b"{")
        _chunks, entries = self.collect(LocalCacheReader(self.dir), [PODS, NODES])
        good = [e for e in entries if isinstance(e, CachedObject)]
        bad = sorted((os.path.basename(e.path), e.reason) for e in entries
                     if isinstance(e, BadCacheEntry))
        if os.geteuid() == 0:
            # root reads mode-0 files anyway.
            self.assertEqual(sorted(e.location.name for e in good), ["good", "unreadable"])
        else:
            self.assertEqual([e.location.name for e in good], ["good"])
            self.assertIn("unreadable", [b[0] for b in bad])
        names = [b[0] for b in bad]
        self.assertIn("a-directory", names)
        self.assertIn("dir-instead-of-node", names)
        self.assertIn("dangling", names)
        self.assertNotIn("tmp_partial", names + [e.location.name for e in good])
        reasons = dict(bad)
        self.assertIn("directory where an object file should be", reasons["a-directory"])
        self.assertIn("cannot stat", reasons["dangling"])

    def test_unreadable_file_via_open_failure(self):
        path = self.path("kubelet", "pods.v1.core", "default", "gone")
        write(path)
        reader = LocalCacheReader(self.dir)
        location = parse_cache_path(self.dir, path)
        os.unlink(path)
        result = reader.read(location)
        self.assertIsInstance(result, BadCacheEntry)
        self.assertIn("unreadable", result.reason)

    def test_oversized_file_is_bad(self):
        path = self.path("kubelet", "pods.v1.core", "default", "big")
        write(path, b"x" * 101)
        reader = LocalCacheReader(self.dir, max_object_bytes=100)
        result = reader.read(parse_cache_path(self.dir, path))
        self.assertIsInstance(result, BadCacheEntry)
