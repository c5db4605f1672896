"""Local disk cache reader: both layouts, path parsing, bad entries, bounded chunks,
links never followed, sizes checked before reading."""

import os
import tracemalloc

from twisted.trial import unittest

from yurtcoord.agent.config import UploadResource
from yurtcoord.pool.localcache import (
    BadCacheEntry, CachedObject, CachedObjectPath, LocalCacheReader, parse_cache_path,
    parse_resource_dir_name, read_at_most,
)
from yurtcoord.pool.store import DEFAULT_MAX_BYTES

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
        self.assertIn("symbolic link", reasons["dangling"])

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


def peak_allocation(function, *args):
    """``(result, peak bytes Python allocated while function ran)``."""
    tracemalloc.start()
    try:
        result = function(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class BoundsAndLinksTests(unittest.TestCase):
    """Sizes are checked before a file is read, and no link is ever followed."""

    def setUp(self):
        self.dir = os.path.abspath(self.mktemp())
        self.outside = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        os.makedirs(self.outside)
        self.secret = os.path.join(self.outside, "secret")
        write(self.secret, b'{"kind":"Secret","data":{"token":"c2VjcmV0"}}')

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def entries(self, reader, resources=(PODS,)):
        return [e for chunk in reader.chunks(list(resources)) for e in chunk]

    def bad(self, entries):
        return {e.path: e for e in entries if isinstance(e, BadCacheEntry)}

    def test_default_cap_is_what_one_pool_store_request_holds(self):
        self.assertEqual(LocalCacheReader(self.dir).max_object_bytes, DEFAULT_MAX_BYTES)

    def test_too_large_file_is_refused_from_its_size_without_reading_it(self):
        big = self.path("kubelet", "pods.v1.core", "default", "big")
        write(big, b"{")
        os.truncate(big, 16 * 1024 * 1024)  # sparse: costs no disk
        write(self.path("kubelet", "pods.v1.core", "default", "small"), b"S")
        entries, peak = peak_allocation(self.entries, LocalCacheReader(self.dir))
        bad = self.bad(entries)
        self.assertEqual(list(bad), [big])
        self.assertEqual(bad[big].category, "too_large")
        self.assertIn(f"16777216 bytes, larger than one request to the pool store "
                      f"({DEFAULT_MAX_BYTES} bytes)", bad[big].reason)
        self.assertEqual([e.data for e in entries if isinstance(e, CachedObject)], [b"S"])
        self.assertLess(peak, 1024 * 1024)

    def test_file_growing_after_its_size_was_checked_is_read_to_the_limit_only(self):
        path = self.path("kubelet", "pods.v1.core", "default", "growing")
        write(path, b"x" * (5 * 1024 * 1024))
        real_fstat = os.fstat

        def fstat_before_growth(fd):
            # What fstat said an instant before the writer appended 5 MB.
            info = list(real_fstat(fd))
            info[6] = 10
            return os.stat_result(info)

        self.patch(os, "fstat", fstat_before_growth)
        reader = LocalCacheReader(self.dir, max_object_bytes=1000)
        result, peak = peak_allocation(reader.read, parse_cache_path(self.dir, path))
        self.assertIsInstance(result, BadCacheEntry)
        self.assertEqual(result.category, "too_large")
        self.assertIn("grew past 1000 bytes", result.reason)
        self.assertLess(peak, 64 * 1024)

    def test_file_of_the_size_fstat_gave_is_read_with_one_read(self):
        path = self.path("kubelet", "pods.v1.core", "default", "p")
        write(path, b"p" * 3000)
        reads = []
        real_read = os.read

        def counted_read(fd, n):
            reads.append(n)
            return real_read(fd, n)

        self.patch(os, "read", counted_read)
        result = LocalCacheReader(self.dir).read(parse_cache_path(self.dir, path))
        self.assertEqual(result.data, b"p" * 3000)
        self.assertEqual(reads, [3001])

    def test_short_reads_and_a_wrong_size_are_read_on_to_the_end(self):
        path = self.path("kubelet", "pods.v1.core", "default", "p")
        write(path, b"q" * 3000)
        real_read, real_fstat = os.read, os.fstat

        def short_read(fd, n):
            # A file system that answers with fewer bytes than asked (FUSE may).
            return real_read(fd, min(n, 700))

        def larger_size(fd):
            info = list(real_fstat(fd))
            info[6] = 5000
            return os.stat_result(info)

        self.patch(os, "read", short_read)
        reader = LocalCacheReader(self.dir)
        self.assertEqual(reader.read(parse_cache_path(self.dir, path)).data, b"q" * 3000)
        self.patch(os, "fstat", larger_size)
        self.assertEqual(reader.read(parse_cache_path(self.dir, path)).data, b"q" * 3000)

    def test_read_at_most_stops_at_the_limit_of_an_endless_stream(self):
        read_end, write_end = os.pipe()
        self.addCleanup(os.close, read_end)
        os.write(write_end, b"y" * 50000)
        self.assertEqual(read_at_most(read_end, 30001), b"y" * 30001)
        os.close(write_end)
        self.assertEqual(len(read_at_most(read_end, 30001)), 19999)

    def test_chunks_end_once_they_hold_chunk_bytes(self):
        for i in range(10):
            write(self.path("kubelet", "pods.v1.core", "ns", f"p{i}"), b"z" * 100)
        reader = LocalCacheReader(self.dir, chunk_size=500, chunk_bytes=250)
        chunks = list(reader.chunks([PODS]))
        self.assertEqual([len(c) for c in chunks], [3, 3, 3, 1])
        self.assertEqual(sum(len(e.data) for c in chunks for e in c), 1000)

    def test_links_are_reported_never_followed(self):
        pods = self.path("kubelet", "pods.v1.core")
        write(os.path.join(pods, "default", "good"), b"G")
        os.symlink(self.secret, os.path.join(pods, "default", "to-secret"))
        os.symlink(os.path.join(pods, "default", "good"), os.path.join(pods, "default", "inner"))
        os.symlink(self.path("nowhere"), os.path.join(pods, "default", "dangling"))
        # A namespace, a legacy resource directory and a component that are links.
        write(os.path.join(self.outside, "ns", "pod"), b"OUTSIDE")
        os.symlink(os.path.join(self.outside, "ns"), os.path.join(pods, "linked-ns"))
        os.symlink(os.path.join(self.outside), self.path("kubelet", "pods"))
        os.symlink(os.path.join(self.outside), self.path("kubelet", "nodes.v1.core"))
        os.makedirs(self.path("elsewhere", "pods.v1.core", "ns"))
        write(self.path("elsewhere", "pods.v1.core", "ns", "p"), b"LINKED COMPONENT")
        os.symlink(self.path("elsewhere"), self.path("kube-proxy"))
        proxy_pods = UploadResource("kube-proxy", "pods", "v1")
        entries = self.entries(LocalCacheReader(self.dir), (PODS, NODES, proxy_pods))
        self.assertEqual([e.data for e in entries if isinstance(e, CachedObject)], [b"G"])
        bad = self.bad(entries)
        self.assertEqual(sorted(bad), sorted([
            os.path.join(pods, "default", "to-secret"), os.path.join(pods, "default", "inner"),
            os.path.join(pods, "default", "dangling"), os.path.join(pods, "linked-ns"),
            self.path("kubelet", "pods"), self.path("kubelet", "nodes.v1.core"),
            self.path("kube-proxy")]))
        for entry in bad.values():
            self.assertEqual(entry.category, "symlink", entry)
            self.assertIn("symbolic link", entry.reason)

    def test_link_swapped_in_after_the_listing_is_refused(self):
        namespace = self.path("kubelet", "pods.v1.core", "default")
        for name in ("a", "b"):
            write(os.path.join(namespace, name), b"{}")
        locations = [e for e in LocalCacheReader(self.dir).entries(PODS)]
        self.assertEqual(len(locations), 2)
        reader = LocalCacheReader(self.dir)
        # The file becomes a link to the Secret...
        os.unlink(os.path.join(namespace, "a"))
        os.symlink(self.secret, os.path.join(namespace, "a"))
        by_name = {loc.name: loc for loc in locations}
        result = reader.read(by_name["a"])
        self.assertIsInstance(result, BadCacheEntry)
        self.assertEqual(result.category, "symlink")
        # ...and the namespace directory a link to a directory holding it.
        os.makedirs(os.path.join(self.outside, "ns"))
        os.symlink(self.secret, os.path.join(self.outside, "ns", "b"))
        write(os.path.join(self.outside, "ns", "b2"), b"OUTSIDE")
        os.rename(namespace, self.path("moved-away"))
        os.symlink(os.path.join(self.outside, "ns"), namespace)
        result = reader.read(by_name["b"])
        self.assertIsInstance(result, BadCacheEntry)
        self.assertEqual(result.category, "symlink")
        self.assertIn(namespace, result.reason)
        self.assertIsInstance(reader.read(parse_cache_path(
            self.dir, os.path.join(namespace, "b2"))), BadCacheEntry)

    def test_fifo_swapped_in_after_the_listing_is_not_waited_on(self):
        path = self.path("kubelet", "pods.v1.core", "default", "f")
        write(path, b"{}")
        [location] = list(LocalCacheReader(self.dir).entries(PODS))
        os.unlink(path)
        os.mkfifo(path)
        # Opened without O_NONBLOCK, a FIFO with no writer would block the reactor.
        result = LocalCacheReader(self.dir).read(location)
        self.assertIsInstance(result, BadCacheEntry)
        self.assertIn("not a regular file", result.reason)

    def test_names_that_are_not_utf8_are_invalid_names(self):
        namespace = os.fsencode(self.path("kubelet", "pods.v1.core", "default"))
        os.makedirs(namespace)
        with open(os.path.join(namespace, b"bad-\xff"), "wb") as f:
            f.write(b"{}")
        bad_namespace = os.fsencode(self.path("kubelet", "pods.v1.core")) + b"/ns-\xfe"
        os.makedirs(bad_namespace)
        with open(bad_namespace + b"/p", "wb") as f:
            f.write(b"{}")
        entries = self.entries(LocalCacheReader(self.dir))
        self.assertEqual(sorted((os.fsencode(e.path), e.category) for e in entries), [
            (namespace + b"/bad-\xff", "invalid_name"),
            (bad_namespace, "invalid_name"),
        ])
