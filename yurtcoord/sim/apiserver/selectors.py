"""Label and field selectors, parsed the way kube-apiserver reads the
``labelSelector`` and ``fieldSelector`` query parameters."""

import re
from typing import Any

_KEY = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    """The selector text does not parse; the server answers 400."""


def _split_top_level(text):
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parenthesis in {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise SelectorError(f"unbalanced parenthesis in {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _check_key(key):
    if not _KEY.match(key):
        raise SelectorError(f"invalid label key {key!r}")
    return key


def _check_value(value):
    if not _VALUE.match(value) or len(value) > 63:
        raise SelectorError(f"invalid label value {value!r}")
    return value


_SET_RE = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")


def _parse_requirement(text):
    match = _SET_RE.match(text)
    if match:
        key, op, values = match.groups()
        members = frozenset(_check_value(v.strip()) for v in values.split(",") if v.strip())
        if not members:
            raise SelectorError(f"empty value set in {text!r}")
        return (_check_key(key), op, members)
    if text.startswith("!"):
        return (_check_key(text[1:].strip()), "!exists", None)
    for op in ("==", "!=", "="):
        if op in text:
            key, value = text.split(op, 1)
            op = "=" if op == "==" else op
            return (_check_key(key.strip()), op, _check_value(value.strip()))
    return (_check_key(text), "exists", None)


class LabelSelector:
    """All requirements must hold (they are ANDed, as in Kubernetes)."""

    def __init__(self, text: str = "") -> None:
        self.text = text or ""
        self.requirements = [_parse_requirement(p) for p in _split_top_level(self.text)]

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        for key, op, value in self.requirements:
            present = key in labels
            actual = labels.get(key)
            if op == "=" and actual != value:
                return False
            if op == "!=" and present and actual == value:
                return False
            if op == "in" and actual not in value:
                return False
            if op == "notin" and present and actual in value:
                return False
            if op == "exists" and not present:
                return False
            if op == "!exists" and present:
                return False
        return True


def _field_value(obj, path):
    value = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class FieldSelector:
    """``=``, ``==`` and ``!=`` on dotted fields (``metadata.name``,
    ``metadata.namespace``, and any other dotted path of the object)."""

    def __init__(self, text: str = "") -> None:
        self.text = text or ""
        self.requirements: list[tuple[str, str, str]] = []
        for part in _split_top_level(self.text):
            for op in ("!=", "==", "="):
                if op in part:
                    field, value = part.split(op, 1)
                    field = field.strip()
                    if not field:
                        raise SelectorError(f"invalid field selector {part!r}")
                    self.requirements.append((field, "!=" if op == "!=" else "=", value.strip()))
                    break
            else:
                raise SelectorError(f"invalid field selector: {part!r}: expected field=value")

    def matches(self, obj: dict[str, Any]) -> bool:
        for field, op, value in self.requirements:
            actual = _field_value(obj, field)
            if (actual == value) != (op == "="):
                return False
        return True


class ObjectFilter:
    """What a list or watch asks for: a namespace (None = all) and selectors."""

    def __init__(self, namespace: str | None = None, label_selector: str = "",
                 field_selector: str = "") -> None:
        self.namespace = namespace
        self.labels = LabelSelector(label_selector)
        self.fields = FieldSelector(field_selector)
        # No selector: the namespace alone decides (a watch's every event asks).
        self._namespace_only = not self.labels.requirements and not self.fields.requirements

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        metadata = obj.get("metadata") or {}
        if self.namespace is not None and metadata.get("namespace", "") != self.namespace:
            return False
        if self._namespace_only:
            return True
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(obj)
