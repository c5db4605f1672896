"""Reader of the node's yurthub disk cache, for uploading it to the pool store.

Layouts (yurthub writes the first; older yurthubs wrote the second)::

    <dir>/<component>/<resource>.<version>.<group|core>/<namespace>/<name>
    <dir>/<component>/<resource>/<namespace>/<name>

Cluster-scoped objects have no namespace directory.  Inside a resource directory a
file is a cluster-scoped object and a directory is a namespace, except for resources
known to be cluster-scoped, where a directory is a misplaced entry.  The legacy layout
does not record version and group: the upload resource's are used.

Reading is synchronous file I/O, bounded: ``chunks()`` is a generator that reads at
most ``chunk_size`` files and about ``chunk_bytes`` of data per step, so a caller that
uploads a chunk before pulling the next one never holds the whole cache in memory and
never blocks the reactor for longer than reading one chunk takes.  A file larger than
``max_object_bytes`` (what one request to the pool store can carry) is refused from its
size before it is read, and no read takes more than ``max_object_bytes + 1`` bytes of
it, however much it grows meanwhile.  Directory listings are streamed with
``os.scandir``.  Entries yurthub is still writing (``tmp_`` prefix) and hidden entries
are not objects and are passed over.

The cache is readable by every process that writes into it, so nothing in it is
trusted: symbolic links are never followed (a link to a file elsewhere, a Secret for
instance, would hand that file to every member of the pool).  Every directory below
``cache_dir`` is opened relative to its parent with ``O_NOFOLLOW`` and every file with
``O_NOFOLLOW | O_NONBLOCK``, so a link, FIFO or device swapped in between the listing
and the read is refused as well.  ``cache_dir`` itself is configuration and may be a
link.

Every entry that is not read becomes a ``BadCacheEntry`` whose ``category`` is the
reason label of ``yurtcoord_skipped_objects_total``: ``unreadable``, ``too_large``,
``symlink`` or ``invalid_name`` (a file or namespace name that is not UTF-8 cannot be
a key in the pool store).
"""

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Union

from yurtcoord.pool.store import DEFAULT_MAX_BYTES, DEFAULT_MAX_OPS

@dataclass(frozen=True)
class UploadResource:
    """One entry of ``upload_resources``: which component's cached objects to upload.

    ``group`` is ``""`` for the core API group. The local cache directory of the
    resource is ``<component>/<resource>.<version>.<group or core>``.
    """

    component: str
    resource: str
    version: str
    group: str = ""

    @property
    def cache_dir_name(self) -> str:
        return f"{self.resource}.{self.version}.{self.group or 'core'}"

    def __str__(self):
        base = f"{self.component}/{self.resource}/{self.version}"
        return f"{base}/{self.group}" if self.group else base


# One chunk is one transaction of the pool store (an object and its mirror rv are two
# operations): an uploader reading a chunk between two of its writes holds the
# reactor no longer than building one transaction takes, so the answers of the
# other writes in flight are not left waiting behind hundreds of files.
DEFAULT_CHUNK_SIZE = DEFAULT_MAX_OPS // 2
# One object must fit one etcd request of the pool store.
MAX_OBJECT_BYTES = DEFAULT_MAX_BYTES
# Data read per chunk, beyond which a chunk ends early (a chunk of large objects).
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_STEP = 256 * 1024

# Resources kube-apiserver serves cluster-scoped, as far as a node cache holds them.
CLUSTER_SCOPED_RESOURCES = frozenset({
    "nodes", "namespaces", "persistentvolumes", "csinodes", "csidrivers",
    "storageclasses", "runtimeclasses", "priorityclasses", "clusterroles",
    "clusterrolebindings", "customresourcedefinitions", "ingressclasses",
    "mutatingwebhookconfigurations", "validatingwebhookconfigurations",
    "apiservices", "volumeattachments", "certificatesigningrequests",
})

SYMLINK_REASON = "a symbolic link (links in the local cache are not followed)"


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
    """A cache entry that cannot be an object (unreadable, a directory, a link...), why,
    and the skip reason it is counted under."""

    path: str
    reason: str
    category: str = "unreadable"


# What reading one entry of the cache gives.
ReadEntry = Union[CachedObject, BadCacheEntry]


def printable_path(path: str) -> str:
    """``path`` as it can be logged: bytes that are not UTF-8 as ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_resource_dir_name(name: str) -> tuple[str, str, str] | None:
    """``pods.v1.core`` → ("", "v1", "pods"); ``endpointslices.v1.discovery.k8s.io`` →
    ("discovery.k8s.io", "v1", "endpointslices"); a legacy ``pods`` → None."""
    parts = name.split(".", 2)
    if len(parts) != 3 or not all(parts):
        return None
    resource, version, group = parts
    return ("" if group == "core" else group), version, resource


def parse_cache_path(cache_dir: str, path: str, default_version: str = "",
                     default_group: str = "") -> CachedObjectPath:
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

    def __init__(self, cache_dir: str, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 max_object_bytes: int = MAX_OBJECT_BYTES,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if max_object_bytes < 1:
            raise ValueError(f"max_object_bytes must be positive, got {max_object_bytes}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.cache_dir = cache_dir
        self.chunk_size = chunk_size
        self.max_object_bytes = max_object_bytes
        self.chunk_bytes = chunk_bytes

    @staticmethod
    def resource_dir_names(upload_resource: UploadResource) -> list[str]:
        """Directory names that may hold an upload resource: new layout, then legacy."""
        group = upload_resource.group or "core"
        return [f"{upload_resource.resource}.{upload_resource.version}.{group}",
                upload_resource.resource]

    def entries(self, upload_resource: UploadResource,
                ) -> Iterator[CachedObjectPath | BadCacheEntry]:
        """Yield a CachedObjectPath or BadCacheEntry for every entry, lazily."""
        for listed, _dir_fd in self._walk(upload_resource):
            yield listed

    def _walk(self, upload_resource):
        """``(entry, dir_fd)`` for every entry: ``dir_fd`` is the directory holding a
        file entry, open (no link followed) until the walk moves on, or None."""
        cluster_scoped = upload_resource.resource in CLUSTER_SCOPED_RESOURCES
        component = upload_resource.component
        try:
            component_fd = self._open_dirs([component])
        except OSError as e:
            if e.errno != errno.ENOENT and not _is_regular_file(e.filename):
                yield _refused_dir(e.filename, e), None
            return
        try:
            for name in self.resource_dir_names(upload_resource):
                resource_dir = os.path.join(self.cache_dir, component, name)
                try:
                    fd = _open_dir(name, component_fd)
                except OSError as e:
                    if e.errno != errno.ENOENT and not _is_regular_file(resource_dir):
                        yield _refused_dir(resource_dir, e), None
                    continue
                try:
                    yield from self._resource_dir_entries(fd, resource_dir, upload_resource,
                                                          cluster_scoped)
                finally:
                    os.close(fd)
        finally:
            os.close(component_fd)

    def _resource_dir_entries(self, fd, resource_dir, upload_resource, cluster_scoped):
        gvr: tuple[str, str, str] = self._group_version_resource(resource_dir, upload_resource)
        for name, kind in _listing(fd, resource_dir):
            path = os.path.join(resource_dir, name)
            if isinstance(kind, BadCacheEntry):
                yield kind, None
            elif kind == "file":
                yield CachedObjectPath(path, upload_resource.component, *gvr, "", name), fd
            elif kind == "dir" and cluster_scoped:
                yield BadCacheEntry(path, "a directory where an object file should be"), None
            elif kind == "dir" and not _utf8(name):
                yield BadCacheEntry(path, "namespace is not UTF-8", "invalid_name"), None
            else:
                try:
                    namespace_fd = _open_dir(name, fd)
                except OSError as e:
                    yield _refused_dir(path, e), None
                    continue
                try:
                    yield from self._namespace_entries(namespace_fd, path, upload_resource,
                                                       gvr)
                finally:
                    os.close(namespace_fd)

    def _namespace_entries(self, fd: int, namespace_dir: str,
                           upload_resource: UploadResource, gvr: tuple[str, str, str],
                           ) -> Iterator[tuple[CachedObjectPath | BadCacheEntry, int | None]]:
        namespace = os.path.basename(namespace_dir)
        for name, kind in _listing(fd, namespace_dir):
            path = os.path.join(namespace_dir, name)
            if isinstance(kind, BadCacheEntry):
                yield kind, None
            elif kind == "file":
                yield CachedObjectPath(path, upload_resource.component, *gvr, namespace,
                                       name), fd
            else:
                yield BadCacheEntry(path, "a directory where an object file should be"), None

    @staticmethod
    def _group_version_resource(resource_dir: str, upload_resource: UploadResource,
                                ) -> tuple[str, str, str]:
        """What a resource directory's name says (the legacy layout says only the
        resource: the upload resource's group and version are used)."""
        parsed = parse_resource_dir_name(os.path.basename(resource_dir))
        if parsed is None:
            return upload_resource.group, upload_resource.version, upload_resource.resource
        return parsed

    def _open_dirs(self, parts):
        """A descriptor of ``cache_dir/<parts...>``, no link followed below ``cache_dir``.

        An OSError names (``filename``) the directory that could not be opened.
        """
        fd = os.open(self.cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for depth, part in enumerate(parts, start=1):
                try:
                    next_fd = _open_dir(part, fd)
                except OSError as e:
                    e.filename = os.path.join(self.cache_dir, *parts[:depth])
                    raise
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, location: CachedObjectPath) -> ReadEntry:
        """The object at a location, or a BadCacheEntry saying why it cannot be read."""
        path = location.path
        if not (_utf8(location.name) and _utf8(location.namespace)):
            return BadCacheEntry(path, "name or namespace is not UTF-8", "invalid_name")
        rel = os.path.relpath(path, self.cache_dir)
        parts = rel.split(os.sep)
        if rel.startswith(os.pardir) or os.path.isabs(rel) or len(parts) < 2:
            return BadCacheEntry(path, f"not a file under {self.cache_dir}")
        try:
            parent = self._open_dirs(parts[:-1])
        except OSError as e:
            refused = _refused_dir(e.filename, e)
            if refused.category == "symlink":
                return BadCacheEntry(path, f"{printable_path(e.filename)} is {SYMLINK_REASON}",
                                     "symlink")
            return BadCacheEntry(path, f"unreadable: {e.strerror or e}")
        try:
            return self._read_in(parent, parts[-1], location)
        finally:
            os.close(parent)

    def _read_in(self, dir_fd: int, name: str, location: CachedObjectPath) -> ReadEntry:
        """The file ``name`` of the directory open at ``dir_fd``, read as ``location``."""
        path = location.path
        if not (_utf8(location.name) and _utf8(location.namespace)):
            return BadCacheEntry(path, "name or namespace is not UTF-8", "invalid_name")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return BadCacheEntry(path, SYMLINK_REASON, "symlink")
            return BadCacheEntry(path, f"unreadable: {e.strerror or e}")
        try:
            return self._read_open_file(fd, location)
        except OSError as e:
            return BadCacheEntry(path, f"unreadable: {e.strerror or e}")
        finally:
            os.close(fd)

    def _read_open_file(self, fd: int, location: CachedObjectPath) -> ReadEntry:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return BadCacheEntry(location.path, "not a regular file")
        limit = self.max_object_bytes
        if info.st_size > limit:
            return BadCacheEntry(location.path, f"{info.st_size} bytes, larger than one "
                                                f"request to the pool store ({limit} bytes)",
                                 "too_large")
        data = read_at_most(fd, limit + 1, info.st_size)
        if len(data) > limit:
            return BadCacheEntry(location.path, f"grew past {limit} bytes while read, larger "
                                                f"than one request to the pool store",
                                 "too_large")
        return CachedObject(location, data)

    def chunks(self, upload_resources: Iterable[UploadResource],
               ) -> Iterator[list[ReadEntry]]:
        """Yield lists of CachedObject/BadCacheEntry, each reading at most chunk_size files
        and ending early once it holds ``chunk_bytes`` of data.

        A directory refused for several upload resources (a component directory that is
        a link) is reported once.
        """
        chunk: list[ReadEntry] = []
        held = 0
        refused_dirs: set[str] = set()
        for upload_resource in upload_resources:
            # Each file is opened in the directory the walk holds open: what ``read``
            # checks, without opening every directory above it again.
            for listed, dir_fd in self._walk(upload_resource):
                entry: ReadEntry
                if isinstance(listed, CachedObjectPath):
                    entry = self._read_in(dir_fd, listed.name, listed)
                    if isinstance(entry, CachedObject):
                        held += len(entry.data)
                elif listed.path in refused_dirs:
                    continue
                else:
                    refused_dirs.add(listed.path)
                    entry = listed
                chunk.append(entry)

                if len(chunk) >= self.chunk_size or held >= self.chunk_bytes:
                    yield chunk
                    chunk, held = [], 0
        if chunk:
            yield chunk


def read_at_most(fd: int, limit: int, size: int | None = None) -> bytes:
    """At most ``limit`` bytes from ``fd``: up to end of file or ``limit``, whichever
    comes first, never more, whatever the file's size says.

    ``size`` is what fstat reported for a regular file: the first read asks for one
    byte more, and when it brings exactly ``size`` bytes the file is taken as read,
    without a second read to see its end. Bytes appended after that read are no part
    of it, as bytes appended after the last read of a longer loop would not be; a
    file system that answers with fewer bytes (a short read of FUSE) or more (a file
    that grew since fstat) is read on to its end or ``limit`` as any stream is.
    """
    parts: list[bytes] = []
    total = 0
    step = _READ_STEP if size is None else size + 1
    while total < limit:
        data = os.read(fd, min(limit - total, step))
        if not data:
            break
        if not parts and len(data) == size:
            return data
        step = _READ_STEP
        parts.append(data)
        total += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _open_dir(name, parent_fd):
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def _refused_dir(path, error):
    """Why a directory could not be opened: it is a link, or the OS error.

    Opening refused it already; looking at what it is only picks the reason.
    """
    if error.errno == errno.ELOOP or os.path.islink(path):
        return BadCacheEntry(path, SYMLINK_REASON, "symlink")
    return BadCacheEntry(path, f"cannot list directory: {error.strerror or error}")


def _is_regular_file(path):
    """A plain file where a component or resource directory may be holds no objects and
    is passed over silently."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _listing(fd, directory):
    """``(name, kind)`` of a directory open at ``fd``; kind is "file", "dir" or a
    BadCacheEntry.  Entries are looked at without following links."""
    try:
        listing = os.scandir(fd)
    except OSError as e:
        yield directory, BadCacheEntry(directory, f"cannot list directory: {e.strerror or e}")
        return
    with listing:
        for entry in listing:
            if _skipped_name(entry.name):
                continue
            yield entry.name, _entry_kind(entry, directory)


def _entry_kind(entry, directory):
    """"file", "dir", or a BadCacheEntry saying why the entry of ``directory`` is
    neither (its path is joined only then: the caller joins a good entry's once)."""
    # The listing's file types (no stat call where the file system gives them); what
    # a file is when it is opened is checked again there (O_NOFOLLOW, fstat).
    try:
        if entry.is_symlink():
            return BadCacheEntry(os.path.join(directory, entry.name), SYMLINK_REASON,
                                 "symlink")
        if entry.is_file(follow_symlinks=False):
            return "file"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
    except OSError as e:
        return BadCacheEntry(os.path.join(directory, entry.name),
                             f"cannot stat: {e.strerror or e}")
    return BadCacheEntry(os.path.join(directory, entry.name), "not a regular file")
