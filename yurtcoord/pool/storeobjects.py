"""What the pool store writes and answers with: the objects' metadata it reads, one
object to write with its keys worked out once, the outcome of a write of many, and the
store's own errors.

Every object key has a companion ``/mirror/rv<key>`` holding its resourceVersion padded
to 32 digits (``yurtcoord.pool.keys.format_rv``); a ``WriteItem`` carries both, as
bytes, for the guarded writes of ``yurtcoord.pool.guardedwrites``.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from yurtcoord.pool.keys import PoolKey, format_rv, parse_rv, rv_in_range

__all__ = [
    "PoolStoreError", "KeyExists", "KeyNotFound", "UpdateConflict", "ObjectTooLarge",
    "ConflictRetriesExhausted", "object_metadata", "metadata_of", "WriteOutcome",
    "WriteItem", "rv_or_none", "OP_OVERHEAD",
]

# Bytes reserved per operation for protobuf framing beyond keys and values.
OP_OVERHEAD = 64


class PoolStoreError(Exception):
    """Base of the store's own (non-etcd) errors."""


class KeyExists(PoolStoreError):
    """create() found the key already present."""

    def __init__(self, key):
        super().__init__(f"key already exists: {key}")
        self.key = str(key)


class KeyNotFound(PoolStoreError):
    def __init__(self, key):
        super().__init__(f"key not found: {key}")
        self.key = str(key)


class UpdateConflict(PoolStoreError):
    """update() lost: the stored object is not older. Carries the stored object."""

    def __init__(self, key, stored, stored_rv):
        super().__init__(f"update of {key} conflicts with stored resourceVersion {stored_rv}")
        self.key = str(key)
        self.stored = stored
        self.stored_rv = stored_rv


class ObjectTooLarge(PoolStoreError):
    def __init__(self, key, size, limit):
        super().__init__(f"object {key} needs {size} bytes, more than one request ({limit})")
        self.key = str(key)
        self.size = size


class ConflictRetriesExhausted(PoolStoreError):
    """Concurrent writers kept changing the same keys; the batch never got through."""


def object_metadata(value: bytes | str) -> tuple[str, str, int]:
    """``(name, namespace, resourceVersion)`` of an object's JSON bytes.

    Raises ValueError with a short reason: not JSON, not an object, no metadata, or no
    numeric resourceVersion.
    """
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    return metadata_of(obj)


def metadata_of(obj: Any) -> tuple[str, str, int]:
    """``(name, namespace, resourceVersion)`` of an object already parsed from JSON
    (``object_metadata`` without the parsing, for a caller that needs the object
    itself too); ValueError as there."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise ValueError("not an object with metadata")
    metadata = obj["metadata"]
    rv = metadata.get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("no resourceVersion")
    try:
        rv_number = parse_rv(rv)
    except ValueError:
        rv_number = None
    # Checked against the bound rather than formatted: the store formats it once,
    # when it writes the object.
    if rv_number is None or not rv_in_range(rv_number):
        raise ValueError(f"resourceVersion {rv!r} is not a number")
    name = metadata.get("name")
    namespace = metadata.get("namespace") or ""
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise ValueError("name or namespace is not a string")
    return name, namespace, rv_number


@dataclass
class WriteOutcome:
    """Progress of a create-or-update of many objects; survives retries of the same call.

    ``created``/``updated``/``not_newer`` hold key paths; ``decided`` is every path
    with a final answer; ``in_doubt`` maps paths whose write may or may not have
    landed (connection lost mid-request) to (kind, resourceVersion).
    """

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    not_newer: list[str] = field(default_factory=list)
    too_large: list[str] = field(default_factory=list)
    decided: set[str] = field(default_factory=set)
    in_doubt: dict[str, tuple[str, int]] = field(default_factory=dict)

    def _decide(self, bucket: list[str], path: str) -> None:
        self.decided.add(path)
        self.in_doubt.pop(path, None)
        bucket.append(path)


class WriteItem:
    """One object to write, with its keys as bytes, its mirror value and its size
    worked out once: a batch of a large upload builds its compares and puts from
    them, and sizing, batching and building a transaction each read them again."""

    __slots__ = ("key", "value", "rv", "path", "path_bytes", "mirror_bytes", "rv_bytes",
                 "size")

    def __init__(self, key: PoolKey, value: bytes, rv: int) -> None:
        if not value:
            # An empty value is no object: the coordinator apiserver could not decode it.
            raise ValueError(f"empty value for {key.path}: an object is never stored empty")
        self.key = key
        self.value = value
        self.rv = rv
        self.path = key.path
        self.path_bytes = self.path.encode("utf-8")
        self.mirror_bytes = key.mirror_rv_path.encode("utf-8")
        self.rv_bytes = format_rv(rv).encode()
        # Bytes this item adds to a guarded write (compares, two puts) or to the read
        # after a failed guard (two reads), whichever request it is in.
        self.size = (3 * len(self.path_bytes) + 3 * len(self.mirror_bytes) + len(value)
                     + 2 * 32 + 6 * OP_OVERHEAD)


def rv_or_none(value: Any) -> int | None:
    """The resourceVersion a mirror rv key holds, or None when it holds none."""
    try:
        return parse_rv(value)
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError):
        return None
