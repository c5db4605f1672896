"""Hostile local cache trees, fed to the real reader and to the uploader on a real etcd.

The node's yurthub cache is written by other processes, so any tree may be found there:
odd names (spaces, newlines, bytes that are not UTF-8, ``tmp_`` and hidden ones), links
to files and directories outside the cache, sparse files far larger than one pool store
request, deeply nested JSON, garbage, objects of another kind, FIFOs and directories
where files belong.  Whatever the tree, reading and uploading it ends with every entry
either uploaded or skipped under one of the documented reasons: no exception, no link
followed, no read beyond the size bound, and every valid object in the pool store with
its exact bytes.

Examples are derandomized (the same trees on every run) and few, so the suite stays
quick and a failure reproduces.
"""

import json
import os
import shutil
import stat
import tempfile
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from yurtcoord.agent.config import UploadResource
from yurtcoord.pool.localcache import BadCacheEntry, CachedObject, LocalCacheReader
from yurtcoord.pool.uploader import SKIP_REASONS

PODS = UploadResource("kubelet", "pods", "v1")
NODES = UploadResource("kubelet", "nodes", "v1")
# In files reachable only through links; and in objects of the wrong kind.
SECRET_MARKER = "TOP-SECRET-NEVER-UPLOADED"
WRONG_KIND_MARKER = "WRONG-KIND-NEVER-UPLOADED"

# (resource directory, resource, namespaced)
LAYOUTS = ((b"pods.v1.core", "pods", True), (b"pods", "pods", True),
           (b"nodes.v1.core", "nodes", False), (b"nodes", "nodes", False))
KIND_OF = {"pods": "Pod", "nodes": "Node"}
KEY_PREFIX_OF = {"pods": "pods", "nodes": "minions"}

NAME_PIECES = [b"a", b"b", b"z", b"0", b"7", b"-", b"_", b".", b" ", b"%", b":", b"\n",
               b"\t", "\u00e9".encode(), "\u65e5".encode(), "\u200b".encode(), b"\xff",
               b"\xfe", b"tmp_", b"~"]
odd_names = (st.lists(st.sampled_from(NAME_PIECES), min_size=1, max_size=6)
             .map(b"".join).filter(lambda n: n not in (b".", b"..")))
plain_names = st.sampled_from([b"default", b"kube-system", b"web-0", b"web-1", b"edge-1",
                               b"coredns-5d78c9869d-x2x7q"])
names = st.one_of(plain_names, odd_names)

valid_objects = st.tuples(st.just("object"), st.integers(min_value=1, max_value=10 ** 6))
contents = st.one_of(
    valid_objects, valid_objects, valid_objects,
    st.tuples(st.just("garbage"), st.binary(max_size=200)),
    st.tuples(st.just("nested"), st.integers(min_value=200, max_value=4000)),
    st.tuples(st.just("wrong_kind"), st.sampled_from(["Secret", "ConfigMap", "Pod", "Node"])),
    st.tuples(st.just("huge"), st.integers(min_value=1, max_value=48)),
    st.tuples(st.just("link_outside"), st.none()),
    st.tuples(st.just("link_inside"), st.none()),
    st.tuples(st.just("dangling"), st.none()),
    st.tuples(st.just("fifo"), st.none()),
    st.tuples(st.just("directory"), st.integers(min_value=1, max_value=4)),
    st.tuples(st.just("namespace_link"), st.none()),
)
entries = st.tuples(st.sampled_from(range(len(LAYOUTS))), names, names, contents)
trees = st.lists(entries, max_size=14)

HYPOTHESIS = dict(deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def utf8(name):
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def visible(name):
    return not (name.startswith(b".") or name.startswith(b"tmp_"))


def object_bytes(kind, name, namespace, rv, api_version="v1", extra=None):
    """A cached object as yurthub writes one; ``name``/``namespace`` are str."""
    metadata = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        metadata["namespace"] = namespace
    obj = {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    if extra:
        obj["data"] = extra
    return json.dumps(obj, separators=(",", ":")).encode()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


class HostileTree:
    """A generated tree on disk and what an upload of it must end with.

    ``expected``: ``{pool store key below the prefix: bytes}`` of the valid objects (the
    newest of two copies of one object); ``skips``: ``{path: skip reason}`` of every
    entry whose reason is known from the tree alone.
    """

    def __init__(self, root, outside, max_object_bytes):
        self.root = root
        self.outside = outside
        self.max_object_bytes = max_object_bytes
        self.expected = {}
        self.skips = {}
        self.links = 0
        self._counter = 0

    def build(self, tree):
        for layout_index, namespace, name, (content, param) in tree:
            resource_dir, resource, namespaced = LAYOUTS[layout_index]
            base = os.path.join(self.root, b"kubelet", resource_dir)
            os.makedirs(base, exist_ok=True)
            if content == "namespace_link":
                if namespaced:
                    self._namespace_link(base, namespace, resource)
                continue
            if namespaced:
                directory = os.path.join(base, namespace)
                if not self._real_directory(directory):
                    continue
            else:
                namespace, directory = None, base
            path = os.path.join(directory, name)
            if os.path.lexists(path):
                continue
            self._entry(path, resource, namespace, name, content, param)

    def _real_directory(self, directory):
        """Make (or find) a real directory; False when something else is in the way."""
        try:
            mode = os.lstat(directory).st_mode
        except FileNotFoundError:
            os.mkdir(directory)
            return True
        return stat.S_ISDIR(mode)

    def _reported(self, path, namespace, name):
        """Whether the reader looks at this file at all (and under which reason if its
        name cannot be a key)."""
        if namespace is not None and not (visible(namespace) and utf8(namespace)):
            if visible(namespace):
                self.skips[os.path.dirname(path)] = "invalid_name"
            return False
        return visible(name)

    def _entry(self, path, resource, namespace, name, content, param):
        reported = self._reported(path, namespace, name)
        kind = KIND_OF[resource]
        text_name = name.decode("utf-8", "replace")
        text_ns = namespace.decode("utf-8", "replace") if namespace else ""
        if content in ("link_outside", "link_inside", "dangling"):
            self._counter += 1
            if content == "link_outside":
                target = os.path.join(self.outside, b"secret-%d" % self._counter)
                write(target, object_bytes(kind, text_name, text_ns, 1,
                                           extra={"token": SECRET_MARKER}))
            elif content == "link_inside":
                # In the cache, outside the upload resources: never read as itself.
                target = os.path.join(self.root, b"kubelet", b"inside-%d" % self._counter)
                write(target, object_bytes(kind, text_name, text_ns, 2,
                                           extra={"token": SECRET_MARKER}))
            else:
                target = os.path.join(self.root, b"nowhere")
            os.symlink(target, path)
            if reported:
                self.skips[path] = "symlink"
            return
        if content == "object":
            write(path, object_bytes(kind, text_name, text_ns, param))
            if reported and utf8(name):
                if b"\n" in name or (namespace is not None and b"\n" in namespace):
                    self.skips[path] = "invalid_name"
                else:
                    self._expect(resource, namespace, name, param)
            elif reported:
                self.skips[path] = "invalid_name"
            return
        if content == "garbage":
            write(path, param)
            reason = "bad_object"
        elif content == "nested":
            write(path, b"[" * param + b"]" * param)
            reason = "bad_object"
        elif content == "wrong_kind":
            wrong = "Secret" if param == kind else param
            write(path, object_bytes(wrong, text_name, text_ns, 3,
                                     extra={"token": WRONG_KIND_MARKER}))
            reason = "wrong_kind"
        elif content == "huge":
            write(path, object_bytes(kind, text_name, text_ns, 4)[:-1])
            os.truncate(path, self.max_object_bytes + param * 1024 * 1024)
            reason = "too_large"
        elif content == "fifo":
            os.mkfifo(path)
            reason = "unreadable"
        else:  # a directory, nested, where a file belongs
            inner = os.path.join(path, *[b"d"] * param)
            os.makedirs(inner)
            write(os.path.join(inner, b"f"), b"{}")
            reason = "unreadable"
        if reported:
            # A FIFO or directory is refused from the listing, before its name is read.
            if not utf8(name) and content not in ("fifo", "directory"):
                reason = "invalid_name"
            self.skips[path] = reason

    def _namespace_link(self, base, namespace, resource):
        path = os.path.join(base, namespace)
        if os.path.lexists(path):
            return
        self._counter += 1
        target = os.path.join(self.outside, b"ns-%d" % self._counter)
        os.makedirs(target)
        text_ns = namespace.decode("utf-8", "replace")
        write(os.path.join(target, b"pod"), object_bytes(
            KIND_OF[resource], "pod", text_ns, 5, extra={"token": SECRET_MARKER}))
        os.symlink(target, path)
        if visible(namespace):
            self.skips[path] = "symlink"

    def _expect(self, resource, namespace, name, rv):
        parts = [KEY_PREFIX_OF[resource]]
        if namespace is not None:
            parts.append(namespace.decode("utf-8"))
        parts.append(name.decode("utf-8"))
        key = "/" + "/".join(parts)
        text_ns = namespace.decode("utf-8") if namespace is not None else ""
        data = object_bytes(KIND_OF[resource], name.decode("utf-8"), text_ns, rv)
        previous = self.expected.get(key)
        if previous is None or int(json.loads(previous)["metadata"]["resourceVersion"]) < rv:
            self.expected[key] = data


def tree_on_disk(tree, max_object_bytes):
    workdir = tempfile.mkdtemp(prefix="hostile-cache-")
    root = os.path.join(os.fsencode(workdir), b"cache")
    outside = os.path.join(os.fsencode(workdir), b"outside")
    os.makedirs(root)
    os.makedirs(outside)
    hostile = HostileTree(root, outside, max_object_bytes)
    hostile.build(tree)
    return workdir, hostile


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
