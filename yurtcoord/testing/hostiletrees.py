"""Local cache trees a hostile or broken node may hold, as hypothesis strategies, and
their building on disk with what reading and uploading each tree must end with.

The node's yurthub cache is written by other processes, so any tree may be found there:
odd names (spaces, newlines, bytes that are not UTF-8, ``tmp_`` and hidden ones), links
to files and directories outside the cache, sparse files far larger than one pool store
request, deeply nested JSON, garbage, objects of another kind, FIFOs and directories
where files belong. The local cache reader is fed these trees alone, and the uploader
on a real etcd; each entry must end read (and uploaded, when valid) or skipped under
one of the documented reasons."""

import json
import os
import stat
import tempfile
from typing import Any, Dict, Optional, Tuple

from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

# In files reachable only through links; and in objects of the wrong kind.
SECRET_MARKER = "TOP-SECRET-NEVER-UPLOADED"
WRONG_KIND_MARKER = "WRONG-KIND-NEVER-UPLOADED"

# (resource directory, resource, namespaced)
LAYOUTS = ((b"pods.v1.core", "pods", True), (b"pods", "pods", True),
           (b"nodes.v1.core", "nodes", False), (b"nodes", "nodes", False))
KIND_OF = {"pods": "Pod", "nodes": "Node"}
KEY_PREFIX_OF = {"pods": "pods", "nodes": "minions"}

# One entry of a tree: (index in LAYOUTS, namespace, name, (content, its parameter)).
Entry = Tuple[int, bytes, bytes, Tuple[str, Any]]

NAME_PIECES = [b"a", b"b", b"z", b"0", b"7", b"-", b"_", b".", b" ", b"%", b":", b"\n",
               b"\t", "\u00e9".encode(), "\u65e5".encode(), "\u200b".encode(), b"\xff",
               b"\xfe", b"tmp_", b"~"]
odd_names: SearchStrategy[bytes] = (
    st.lists(st.sampled_from(NAME_PIECES), min_size=1, max_size=6)
    .map(b"".join).filter(lambda n: n not in (b".", b"..")))
plain_names: SearchStrategy[bytes] = st.sampled_from(
    [b"default", b"kube-system", b"web-0", b"web-1", b"edge-1", b"coredns-5d78c9869d-x2x7q"])
names: SearchStrategy[bytes] = st.one_of(plain_names, odd_names)

valid_objects: SearchStrategy[Tuple[str, Any]] = st.tuples(
    st.just("object"), st.integers(min_value=1, max_value=10 ** 6))
contents: SearchStrategy[Tuple[str, Any]] = st.one_of(
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
entries: SearchStrategy[Entry] = st.tuples(
    st.sampled_from(range(len(LAYOUTS))), names, names, contents)
trees: SearchStrategy[list[Entry]] = st.lists(entries, max_size=14)

# Derandomized (the same trees on every run) and few examples, so the suite stays quick
# and a failure reproduces.
HYPOTHESIS: Dict[str, Any] = dict(
    deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def utf8(name: bytes) -> bool:
    """Whether a name read off the disk is UTF-8 (a pool store key must be)."""
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def visible(name: bytes) -> bool:
    """Whether the reader lists a name at all: hidden and ``tmp_`` files are yurthub's
    writes in progress."""
    return not (name.startswith(b".") or name.startswith(b"tmp_"))


def object_bytes(kind: str, name: str, namespace: Optional[str], rv: int,
                 api_version: str = "v1", extra: Optional[Dict[str, Any]] = None) -> bytes:
    """A cached object as yurthub writes one; ``name``/``namespace`` are str."""
    metadata = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        metadata["namespace"] = namespace
    obj: Dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    if extra:
        obj["data"] = extra
    return json.dumps(obj, separators=(",", ":")).encode()


def write(path: bytes, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


class HostileTree:
    """A generated tree on disk and what an upload of it must end with.

    ``expected``: ``{pool store key below the prefix: bytes}`` of the valid objects (the
    newest of two copies of one object); ``skips``: ``{path: skip reason}`` of every
    entry whose reason is known from the tree alone.
    """

    def __init__(self, root: bytes, outside: bytes, max_object_bytes: int) -> None:
        self.root = root
        self.outside = outside
        self.max_object_bytes = max_object_bytes
        self.expected: Dict[str, bytes] = {}
        self.skips: Dict[bytes, str] = {}
        self._counter = 0

    def build(self, tree: list[Entry]) -> None:
        for layout_index, namespace, name, (content, param) in tree:
            resource_dir, resource, namespaced = LAYOUTS[layout_index]
            base = os.path.join(self.root, b"kubelet", resource_dir)
            os.makedirs(base, exist_ok=True)
            if content == "namespace_link":
                if namespaced:
                    self._namespace_link(base, namespace, resource)
                continue
            entry_namespace: Optional[bytes] = namespace
            if namespaced:
                directory = os.path.join(base, namespace)
                if not self._real_directory(directory):
                    continue
            else:
                entry_namespace, directory = None, base
            path = os.path.join(directory, name)
            if os.path.lexists(path):
                continue
            self._entry(path, resource, entry_namespace, name, content, param)

    def _real_directory(self, directory: bytes) -> bool:
        """Make (or find) a real directory; False when something else is in the way."""
        try:
            mode = os.lstat(directory).st_mode
        except FileNotFoundError:
            os.mkdir(directory)
            return True
        return stat.S_ISDIR(mode)

    def _reported(self, path: bytes, namespace: Optional[bytes], name: bytes) -> bool:
        """Whether the reader looks at this file at all (and under which reason if its
        name cannot be a key)."""
        if namespace is not None and not (visible(namespace) and utf8(namespace)):
            if visible(namespace):
                self.skips[os.path.dirname(path)] = "invalid_name"
            return False
        return visible(name)

    def _entry(self, path: bytes, resource: str, namespace: Optional[bytes], name: bytes,
               content: str, param: Any) -> None:
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

    def _namespace_link(self, base: bytes, namespace: bytes, resource: str) -> None:
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

    def _expect(self, resource: str, namespace: Optional[bytes], name: bytes, rv: int) -> None:
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


def tree_on_disk(tree: list[Entry], max_object_bytes: int) -> Tuple[str, HostileTree]:
    """Build ``tree`` in a new temporary directory: the cache below it, link targets
    beside it; the caller removes the directory."""
    workdir = tempfile.mkdtemp(prefix="hostile-cache-")
    root = os.path.join(os.fsencode(workdir), b"cache")
    outside = os.path.join(os.fsencode(workdir), b"outside")
    os.makedirs(root)
    os.makedirs(outside)
    hostile = HostileTree(root, outside, max_object_bytes)
    hostile.build(tree)
    return workdir, hostile
