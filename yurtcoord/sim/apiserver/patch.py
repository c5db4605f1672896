"""PATCH bodies: JSON merge patch (RFC 7386; also used for strategic merge
patch, whose list-merge keys this server does not model) and JSON patch (RFC 6902)."""

import copy
from typing import Any


class PatchError(ValueError):
    """The patch cannot be applied; the server answers 422 or 400."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc, parts):
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            try:
                node = node[int(part)]
            except (ValueError, IndexError):
                raise PatchError(f"path element {part!r} not found")
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise PatchError(f"path element {part!r} not found")
    return node


def _get(doc, parts):
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, list):
        try:
            return parent[int(last)]
        except (ValueError, IndexError):
            raise PatchError(f"index {last!r} not found")
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    raise PatchError(f"key {last!r} not found")


def _remove(doc, parts):
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, list):
        try:
            return parent.pop(int(last))
        except (ValueError, IndexError):
            raise PatchError(f"index {last!r} not found")
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    raise PatchError(f"key {last!r} not found")


def _add(doc, parts, value, replace=False):
    if not parts:
        raise PatchError("cannot replace the whole document")
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
            return
        try:
            index = int(last)
        except ValueError:
            raise PatchError(f"invalid index {last!r}")
        if replace:
            if not 0 <= index < len(parent):
                raise PatchError(f"index {index} out of range")
            parent[index] = value
        else:
            if not 0 <= index <= len(parent):
                raise PatchError(f"index {index} out of range")
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"key {last!r} not found")
        parent[last] = value
    else:
        raise PatchError(f"cannot add to {type(parent).__name__}")


def json_patch(target: Any, operations: Any) -> Any:

    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid operation {op!r}")
        parts = _pointer(op["path"])
        kind = op["op"]
        if kind == "add":
            _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            _add(doc, parts, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise PatchError(f"test failed at {op['path']}")
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            _add(doc, parts, value)
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc
