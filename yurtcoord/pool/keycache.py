"""The component key cache: which pool store keys each component owns.

The pool store needs to know which keys a component wrote to replace its lists and to
delete its resources, without listing the whole etcd.  The knowledge is kept in
``<local_cache_dir>/component-key-cache``, one line per component::

    component#group_version_resource:key1,key2;group_version_resource:key3

(yurthub's own format, so a file written by yurthub reads here and the other way
round).  yurthub's reader splits the whole file on line breaks and requires every
piece to hold exactly one ``#``: a trailing line break or a blank line makes it fail
the whole file. So lines are joined by a single line break, with none after the last,
and an empty cache is an empty file. Reading is more lenient: blank lines and a
trailing line break (files written by earlier releases) are accepted.

Names Kubernetes allows may contain the separators (``system:node``), so ``%``,
``#``, ``:``, ``,``, ``;`` and line breaks inside a field are percent-encoded, and
``_`` too inside the group/version/resource fields; a file without such characters is
byte-for-byte what yurthub writes (yurthub keeps an encoded name as its literal text).

Changes are made in memory and written by ``flush()`` atomically: a temp file in the
same directory is written and fsynced, renamed over the real file, and the directory
is fsynced, so a crash leaves either the old or the new file, never a half-written one.
A leftover temp file from such a crash is removed on load.

Entries of the pool-scoped component (``leader-yurthub``) are not trusted from the
file: the pool store rebuilds them from etcd.  Reads and writes are local file I/O done
synchronously, once per store operation or drained batch of changes, never per key
(at 100k keys one write takes tens of milliseconds); ``snapshot_for_writing`` and
``write_snapshot`` split a write so that it can run in a thread: the snapshot only
copies the key sets (about a millisecond at 100k keys), and the file's text is made
from that copy by ``write_snapshot``, in pieces of ``KEYS_PER_PIECE`` keys, so a
thread making it gives the interpreter back to the reactor between two pieces instead
of holding it for the tens of milliseconds one join of 100k keys takes.
"""

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Container, Iterable, Iterator, Mapping

from twisted.logger import Logger

from yurtcoord.pool.keys import ResourceId, ResourceLike

# ``{component: {resource: keys}}``, what the file holds.
KeyCache = dict[str, dict[ResourceId, set[str]]]
# The same with any collection of keys, e.g. a snapshot's lists.
KeyCacheLike = Mapping[str, Mapping[ResourceId, Iterable[str]]]
# A numbered copy of the cache, made by ``snapshot_for_writing``.
Snapshot = tuple[int, dict[str, dict[ResourceId, list[str]]]]

POOL_SCOPED_COMPONENT = "leader-yurthub"
KEY_CACHE_FILE_NAME = "component-key-cache"
_TEMP_PREFIX = "." + KEY_CACHE_FILE_NAME + "."
_TEMP_SUFFIX = ".tmp"

_SEPARATORS = frozenset("%#:,;\n\r")
_GVR_SEPARATORS = _SEPARATORS | {"_"}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
# Separators other than ",": found in ",".join(keys), one of them means some key needs
# encoding (a "," inside a key shows as one "," too many).
_RESERVED_BUT_COMMA = re.compile("[" + re.escape("".join(sorted(_SEPARATORS - {","}))) + "]")
# Keys of one resource up to this many are written sorted (stable, diffable files);
# sorting 100k keys costs about 50 ms of the reactor on every write, so larger sets
# are written in memory order (yurthub writes its keys in map order, unsorted).
SORTED_KEYS_LIMIT = 10_000
# Keys joined at once when the file's text is made (see the module docstring).
KEYS_PER_PIECE = 4096

log = Logger()


class KeyCacheCorrupt(ValueError):
    """The key cache file cannot be parsed; the message names the file and line."""

    def __init__(self, path: str, line_number: int, reason: str) -> None:
        super().__init__(f"{path}:{line_number}: malformed component key cache line: {reason}")
        self.path = path
        self.line_number = line_number
        self.reason = reason


def encode_field(text: str, reserved: Container[str] = _SEPARATORS) -> str:
    """Percent-encode the characters the line format uses as separators."""
    if not any(c in reserved for c in text):
        return text
    return "".join(f"%{ord(c):02X}" if c in reserved else c for c in text)


def decode_field(text: str) -> str:
    """Inverse of encode_field; a ``%`` not followed by two hex digits is an error."""
    if "%" not in text:
        return text
    out = []
    position = 0
    while True:
        index = text.find("%", position)
        if index < 0:
            out.append(text[position:])
            return "".join(out)
        match = _ESCAPE.match(text, index)
        if match is None:
            raise ValueError(f"bad percent escape at offset {index} in {text!r}")
        out.append(text[position:index])
        out.append(chr(int(match.group(1), 16)))
        position = match.end()


def encode_resource(resource: ResourceId) -> str:
    return "_".join(encode_field(part, _GVR_SEPARATORS)
                    for part in (resource.group, resource.version, resource.resource))


def decode_resource(text: str) -> ResourceId:
    parts = text.split("_")
    if len(parts) != 3:
        raise ValueError(f"resource {text!r} is not group_version_resource")
    group, version, resource = (decode_field(p) for p in parts)
    if not resource:
        raise ValueError(f"resource {text!r} has an empty resource name")
    return ResourceId(group, version, resource)


def format_lines(cache: KeyCacheLike) -> str:
    """The file text for ``{component: {ResourceId: keys}}``; components, resources and
    (up to ``SORTED_KEYS_LIMIT`` per resource) keys sorted.

    No line break after the last line: yurthub's reader rejects the empty line after it.
    """
    return "".join(format_pieces(cache))


def format_pieces(cache: KeyCacheLike) -> Iterator[str]:
    """``format_lines(cache)`` as consecutive pieces of text, none holding more than
    ``KEYS_PER_PIECE`` keys (see the module docstring for why)."""
    first_line = True
    for component in sorted(cache):
        if not first_line:
            yield "\n"
        first_line = False
        yield f"{encode_field(component)}#"
        resources = cache[component]
        first_group = True
        for resource in sorted(resources, key=lambda r: (r.group, r.version, r.resource)):
            yield f"{'' if first_group else ';'}{encode_resource(resource)}:"
            first_group = False
            yield from _encode_keys(resources[resource])


def _encode_keys(keys):
    """``,``-joined and encoded keys, piece by piece; a pool of 100k keys takes tens of
    milliseconds, so the usual case (nothing to encode) is found with one scan of each
    piece's joined text instead of one check per key."""
    ordered = sorted(keys) if len(keys) <= SORTED_KEYS_LIMIT else list(keys)
    for start in range(0, len(ordered), KEYS_PER_PIECE):
        piece = ordered[start:start + KEYS_PER_PIECE]
        joined = ",".join(piece)
        if (_RESERVED_BUT_COMMA.search(joined) is not None
                or joined.count(",") != len(piece) - 1):
            joined = ",".join(encode_field(k) for k in piece)
        yield joined if start == 0 else "," + joined


def parse_lines(text: str, path: str = "<memory>") -> KeyCache:
    """Parse file text into ``{component: {ResourceId: set(paths)}}``; blank lines are skipped."""
    cache: KeyCache = {}
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line:
            continue
        try:
            component, resources = _parse_line(line)
        except ValueError as e:
            raise KeyCacheCorrupt(path, number, str(e)) from None
        merged = cache.setdefault(component, {})
        for resource, keys in resources.items():
            merged.setdefault(resource, set()).update(keys)
    return cache


def _parse_line(line: str) -> tuple[str, dict[ResourceId, set[str]]]:
    fields = line.split("#")
    if len(fields) != 2:
        raise ValueError("expected exactly one '#' between component and resources")
    component = decode_field(fields[0])
    if not component:
        raise ValueError("empty component name")
    resources: dict[ResourceId, set[str]] = {}
    if fields[1]:
        for group in fields[1].split(";"):
            parts = group.split(":")
            if len(parts) != 2:
                raise ValueError(f"expected 'group_version_resource:keys', got {group!r}")
            resource = decode_resource(parts[0])
            keys = resources.setdefault(resource, set())
            if parts[1]:
                for key in parts[1].split(","):
                    if not key:
                        raise ValueError(f"empty key in {group!r}")
                    keys.add(decode_field(key))
    return component, resources


class ComponentKeyCache:
    """In-memory map component → resource → keys, persisted to one file on ``flush()``.

    :param path: the cache file, usually ``<local_cache_dir>/component-key-cache``.
    :param rebuilt_components: components whose file entries are ignored on load
        because the pool store rebuilds them from etcd.
    """

    def __init__(self, path: str, rebuilt_components: Iterable[str] = (POOL_SCOPED_COMPONENT,),
                 ) -> None:
        self.path = path
        self.rebuilt_components = frozenset(rebuilt_components)
        self._cache: KeyCache = {}
        self.dirty = False
        # Snapshots are numbered; a file is only replaced by a newer snapshot, so a
        # write finishing late (in a thread) never puts back older contents.
        self._snapshots = 0
        self._written = 0
        self._replace_lock = threading.Lock()

    @classmethod
    def in_directory(cls, directory: str, **kwargs: Iterable[str]) -> "ComponentKeyCache":
        return cls(os.path.join(directory, KEY_CACHE_FILE_NAME), **kwargs)

    # -- load / save -------------------------------------------------------------

    def load(self) -> "ComponentKeyCache":
        """Read the file (absent file → empty cache); remove temp files a crash left behind.

        Raises KeyCacheCorrupt naming the file and line when the file is malformed.
        """
        self._remove_leftover_temp_files()
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[:e.start].count(b"\n") + 1
            raise KeyCacheCorrupt(self.path, line, "not UTF-8") from None
        cache = parse_lines(text, self.path)
        for component in self.rebuilt_components:
            cache.pop(component, None)
        self._cache = cache
        self.dirty = False
        log.info("component key cache loaded from {path}: {components} components",
                 path=self.path, components=len(cache))
        return self

    def load_or_set_aside(self) -> "ComponentKeyCache":
        """``load()``, but a malformed file does not stop the agent.

        A corrupt file never mends itself, so retrying would keep the pool store
        closed for good. Instead the file is renamed to ``<path>.corrupt`` for the
        operator (logged with the file and line at fault) and the cache starts empty:
        the pool-scoped entries are rebuilt from etcd anyway, and the next upload
        records this node's keys again. Only keys of objects removed from the node
        while the file was unreadable are no longer known.
        """
        try:
            return self.load()
        except KeyCacheCorrupt as error:
            aside = self.path + ".corrupt"
            os.replace(self.path, aside)
            log.error("{error}; set aside as {aside}, starting with an empty key cache",
                      error=error, aside=aside)
            self._cache = {}
            self.dirty = True
            return self

    def _remove_leftover_temp_files(self):
        directory = os.path.dirname(self.path) or "."
        base = os.path.basename(self.path)
        prefix = "." + base + "."
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(prefix) and name.endswith(_TEMP_SUFFIX):
                leftover = os.path.join(directory, name)
                try:
                    os.unlink(leftover)
                    log.warn("removed leftover key cache temp file {path}", path=leftover)
                except OSError as e:
                    log.warn("cannot remove leftover key cache temp file {path}: {error}",
                             path=leftover, error=e)

    def flush(self) -> None:
        """Write the cache atomically if it changed since the last write."""
        if not self.dirty:
            return
        self.write()

    def write(self) -> None:
        """Write the whole cache: temp file, fsync, rename over the file, fsync the directory."""
        snapshot = self.snapshot_for_writing()
        try:
            self.write_snapshot(snapshot)
        except BaseException:
            self.dirty = True
            raise

    def snapshot_for_writing(self) -> Snapshot:
        """The cache as of now, numbered, for ``write_snapshot``: a copy of the key sets,
        not yet the file's text (made by ``write_snapshot``, possibly in a thread). The
        cache counts as written from here (set ``dirty`` again if ``write_snapshot``
        fails)."""
        self._snapshots += 1
        self.dirty = False
        copy = {component: {resource: list(keys) for resource, keys in resources.items()}
                for component, resources in self._cache.items()}
        return self._snapshots, copy

    def write_snapshot(self, snapshot: Snapshot) -> None:
        """Write a ``snapshot_for_writing()`` atomically; safe in a thread (it reads only
        the snapshot, and the rename is skipped when a newer snapshot was written
        meanwhile)."""
        number, cache = snapshot
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        base = os.path.basename(self.path)
        fd, temp_path = tempfile.mkstemp(prefix="." + base + ".", suffix=_TEMP_SUFFIX,
                                         dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                for piece in format_pieces(cache):
                    f.write(piece.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            with self._replace_lock:
                if number > self._written:
                    os.replace(temp_path, self.path)
                    self._written = number
                else:
                    os.unlink(temp_path)
        except BaseException:
            # Leave no temp file behind; the real file is untouched.
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- queries -----------------------------------------------------------------

    def components(self) -> list[str]:
        return sorted(self._cache)

    def resources(self, component: str) -> list[ResourceId]:
        return sorted(self._cache.get(component, {}),
                      key=lambda r: (r.group, r.version, r.resource))

    def keys(self, component: str, resource: ResourceLike | None = None) -> frozenset[str]:
        """Keys of a component, of one resource or of all its resources."""
        resources = self._cache.get(component, {})
        if resource is not None:
            return frozenset(resources.get(ResourceId.of(resource), ()))
        found: set[str] = set()
        for keys in resources.values():
            found.update(keys)
        return frozenset(found)

    def snapshot(self) -> KeyCache:
        """A deep copy, for tests and status pages."""
        return {c: {r: set(k) for r, k in res.items()} for c, res in self._cache.items()}

    # -- changes (call flush() afterwards) --------------------------------------

    def add(self, component: str, resource: ResourceLike, keys: Iterable[str]) -> None:
        added = set(keys)
        if not added:
            return
        bucket = self._cache.setdefault(component, {}).setdefault(ResourceId.of(resource), set())
        if not added <= bucket:
            bucket.update(added)
            self.dirty = True

    def discard(self, component: str, resource: ResourceLike, keys: Iterable[str]) -> None:
        bucket = self._cache.get(component, {}).get(ResourceId.of(resource))
        if bucket is None:
            return
        before = len(bucket)
        bucket.difference_update(keys)
        if len(bucket) != before:
            self.dirty = True

    def set_resource(self, component: str, resource: ResourceLike, keys: Iterable[str]) -> None:
        resource_id = ResourceId.of(resource)
        wanted = set(keys)
        current = self._cache.setdefault(component, {})
        if current.get(resource_id) != wanted:
            current[resource_id] = wanted
            self.dirty = True

    def set_component(self, component: str,
                      resources: Mapping[ResourceLike, Iterable[str]]) -> None:
        """Replace everything known about a component (``{resource: keys}``)."""
        self._cache[component] = {ResourceId.of(r): set(k) for r, k in resources.items()}
        self.dirty = True

    def drop(self, component: str) -> None:

        if self._cache.pop(component, None) is not None:
            self.dirty = True
