"""Reader of the node's yurthub disk cache, for uploading it to the pool store.

Layouts (yurthub writes the first; older yurthubs wrote the second)::

    <dir>/<component>/<resource>.<version>.<group|core>/<namespace>/<name>
    <dir>/<component>/<resource>/<namespace>/<name>

Cluster-scoped objects have no namespace directory.  Inside a resource directory a
file is a cluster-scoped object and a directory is a namespace, except for resources
known to be cluster-scoped, where a directory is a misplaced entry.  The legacy layout
does not record version and group: the upload resource's are used.

Reading is synchronous file I/O, bounded: ``chunks()`` is a generator that reads at
most ``chunk_size`` files per step, so a caller that uploads a chunk before pulling
the next one never holds the whole cache in memory and never blocks the reactor for
longer than reading one chunk of small files takes.  Directory listings are streamed
with ``os.scandir``.  Entries yurthub is still writing (``tmp_`` prefix) and hidden
entries are not objects and are passed over.
"""

import os
import stat
from dataclasses import dataclass

DEFAULT_CHUNK_SIZE = 500
MAX_OBJECT_BYTES = 16 * 1024 * 1024

# Resources kube-apiserver serves cluster-scoped, as far as a node cache holds them.
CLUSTER_SCOPED_RESOURCES = frozenset({
    "nodes", "namespaces", "persistentvolumes", "csinodes", "csidrivers",
    "storageclasses", "runtimeclasses", "priorityclasses", "clusterroles",
    "clusterrolebindings", "customresourcedefinitions", "ingressclasses",
    "mutatingwebhookconfigurations", "validatingwebhookconfigurations",
    "apiservices", "volumeattachments", "certificatesigningrequests",
})


@dataclass(frozen=True)
class CachedObjectPath:
    """Where one cached object lives and what its path says about it."""

    path: str
    component: str
    group: str
    version: str
    resource: str
    namespace: str
    name: str


@dataclass(frozen=True)
class CachedObject:
    """A cached object's path information and raw bytes."""

    location: CachedObjectPath
    data: bytes


@dataclass(frozen=True)
class BadCacheEntry:
    """A cache entry that cannot be an object (unreadable, a directory...), and why."""

    path: str
    reason: str


def parse_resource_dir_name(name):
    """``pods.v1.core`` → ("", "v1", "pods"); ``endpointslices.v1.discovery.k8s.io`` →
    ("discovery.k8s.io", "v1", "endpointslices"); a legacy ``pods`` → None."""
    parts = name.split(".", 2)
    if len(parts) != 3 or not all(parts):
        return None
    resource, version, group = parts
    return ("" if group == "core" else group), version, resource


def parse_cache_path(cache_dir, path, default_version="", default_group=""):
    """Extract component, group, version, resource, namespace and name from a cache path.

    Raises ValueError when the path is not ``<component>/<resource-dir>/[<ns>/]<name>``
    under ``cache_dir``.
    """
    rel = os.path.relpath(path, cache_dir)
    parts = rel.split(os.sep)
    if rel.startswith("..") or len(parts) not in (3, 4):
        raise ValueError(f"{path} is not <component>/<resource>/[<namespace>/]<name> "
                         f"under {cache_dir}")
    component, resource_dir = parts[0], parts[1]
    parsed = parse_resource_dir_name(resource_dir)
    if parsed is None:
        group, version, resource = default_group, default_version, resource_dir
    else:
        group, version, resource = parsed
    namespace = parts[2] if len(parts) == 4 else ""
    return CachedObjectPath(path, component, group, version, resource, namespace, parts[-1])


def _skipped_name(name):
    return name.startswith(".") or name.startswith("tmp_")


class LocalCacheReader:
    """Streams cached objects of the upload resources from ``cache_dir``."""

    def __init__(self, cache_dir, chunk_size=DEFAULT_CHUNK_SIZE,
                 max_object_bytes=MAX_OBJECT_BYTES):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.cache_dir = cache_dir
        self.chunk_size = chunk_size
        self.max_object_bytes = max_object_bytes

    def resource_dirs(self, upload_resource):
        """The existing directories holding an upload resource: new layout, then legacy."""
        group = upload_resource.group or "core"
        component_dir = os.path.join(self.cache_dir, upload_resource.component)
        candidates = [
            os.path.join(component_dir, f"{upload_resource.resource}."
                                        f"{upload_resource.version}.{group}"),
            os.path.join(component_dir, upload_resource.resource),
        ]
        return [d for d in candidates if os.path.isdir(d)]

    def entries(self, upload_resource):
        """Yield a CachedObjectPath or BadCacheEntry for every entry, lazily."""
        cluster_scoped = upload_resource.resource in CLUSTER_SCOPED_RESOURCES
        for resource_dir in self.resource_dirs(upload_resource):
            yield from self._resource_dir_entries(resource_dir, upload_resource, cluster_scoped)

    def _resource_dir_entries(self, resource_dir, upload_resource, cluster_scoped):
        try:
            top = os.scandir(resource_dir)
        except OSError as e:
            yield BadCacheEntry(resource_dir, f"cannot list directory: {e.strerror or e}")
            return
        with top:
            for entry in top:
                if _skipped_name(entry.name):
                    continue
                kind = _entry_kind(entry)
                if kind == "file":
                    yield self._location(entry.path, upload_resource, resource_dir, "")
                elif kind == "dir" and not cluster_scoped:
                    yield from self._namespace_entries(resource_dir, entry.path,
                                                       upload_resource)
                elif kind == "dir":
                    yield BadCacheEntry(entry.path, "a directory where an object file "
                                                    "should be")
                else:
                    yield BadCacheEntry(entry.path, kind)

    def _namespace_entries(self, resource_dir, namespace_dir, upload_resource):
        try:
            listing = os.scandir(namespace_dir)
        except OSError as e:
            yield BadCacheEntry(namespace_dir, f"cannot list directory: {e.strerror or e}")
            return
        with listing:
            for entry in listing:
                if _skipped_name(entry.name):
                    continue
                kind = _entry_kind(entry)
                if kind == "file":
                    yield self._location(entry.path, upload_resource, resource_dir,
                                         os.path.basename(namespace_dir))
                elif kind == "dir":
                    yield BadCacheEntry(entry.path, "a directory where an object file "
                                                    "should be")
                else:
                    yield BadCacheEntry(entry.path, kind)

    @staticmethod
    def _location(path, upload_resource, resource_dir, namespace):
        """What a path says, from the walk that found it (cheaper than re-parsing it)."""
        parsed = parse_resource_dir_name(os.path.basename(resource_dir))
        if parsed is None:
            group, version, resource = (upload_resource.group, upload_resource.version,
                                        upload_resource.resource)
        else:
            group, version, resource = parsed
        return CachedObjectPath(path, upload_resource.component, group, version, resource,
                                namespace, os.path.basename(path))

    def read(self, location):
        """The object at a location, or a BadCacheEntry saying why it cannot be read."""
        try:
            with open(location.path, "rb") as f:
                data = f.read(self.max_object_bytes + 1)
        except OSError as e:
            return BadCacheEntry(location.path, f"unreadable: {e.strerror or e}")
        if len(data) > self.max_object_bytes:
            return BadCacheEntry(location.path,
                                 f"larger than {self.max_object_bytes} bytes")
        return CachedObject(location, data)

    def chunks(self, upload_resources):
        """Yield lists of CachedObject/BadCacheEntry, each reading at most chunk_size files."""
        chunk = []
        for upload_resource in upload_resources:
            for entry in self.entries(upload_resource):
                if isinstance(entry, CachedObjectPath):
                    entry = self.read(entry)
                chunk.append(entry)
                if len(chunk) >= self.chunk_size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk


def _entry_kind(entry):
    """"file", "dir", or a reason why the entry is neither (broken link, socket...)."""
    try:
        mode = entry.stat().st_mode
    except OSError as e:
        return f"cannot stat: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "not a regular file"
