"""Pool store keys in the coordinator apiserver's own etcd layout.

The coordinator apiserver serves what the agents write, so a key must be exactly the
key kube-apiserver would use for the object: ``<prefix>/<resource>/<namespace>/<name>``
(no namespace for cluster-scoped objects) with kube-apiserver's special resource
prefixes.  Beside every object key, ``/mirror/rv<key>`` holds the object's
resourceVersion zero-padded to 32 digits, so that etcd can compare versions as bytes.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from yurtcoord.kube.gvr import GroupVersionResource

# kube-apiserver's SpecialDefaultResourcePrefixes, keyed by (group, resource).
SPECIAL_RESOURCE_PREFIXES = {
    ("", "replicationcontrollers"): "controllers",
    ("", "endpoints"): "services/endpoints",
    ("", "nodes"): "minions",
    ("", "services"): "services/specs",
    ("extensions", "ingresses"): "ingress",
    ("networking.k8s.io", "ingresses"): "ingress",
    ("extensions", "podsecuritypolicies"): "podsecuritypolicy",
    ("policy", "podsecuritypolicies"): "podsecuritypolicy",
}

MIRROR_RV_PREFIX = "/mirror/rv"
RV_DIGITS = 32
# The largest resourceVersion a mirror rv holds (RV_DIGITS nines).
MAX_RV = 10 ** RV_DIGITS - 1


class InvalidKey(ValueError):
    """A key could not be built: empty component/resource or a name etcd paths cannot hold."""


@dataclass(frozen=True)
class ResourceId:
    """Group, version and resource of a key's type, without scope information.

    The component key cache file records types as ``group_version_resource``; it does
    not know whether a type is namespaced, so neither does this identity.
    """

    group: str
    version: str
    resource: str

    @classmethod
    def of(cls, gvr: "ResourceLike") -> "ResourceId":
        """Accept a ResourceId, a GroupVersionResource or a (group, version, resource) tuple."""
        if isinstance(gvr, ResourceId):
            return gvr
        if isinstance(gvr, tuple):
            group, version, resource = gvr
            return cls(group, version, resource)
        return cls(gvr.group, gvr.version, gvr.resource)

    def __str__(self) -> str:
        return f"{self.group}_{self.version}_{self.resource}"


# What names a resource type where a ResourceId is expected.
ResourceLike = Union[ResourceId, "GroupVersionResource", tuple[str, str, str]]


@dataclass(frozen=True)
class KeyBuildInfo:
    """Everything needed to place one object (or, without a name, a list) in the store."""

    component: str
    resources: str
    group: str = ""
    version: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_id(self) -> ResourceId:
        return ResourceId(self.group, self.version, self.resources)


@dataclass(frozen=True)
class PoolKey:
    """An object key in the pool etcd with the component that owns it and its type."""

    path: str
    component: str
    resource: ResourceId

    @property
    def mirror_rv_path(self) -> str:
        return mirror_rv_key(self.path)

    def __str__(self) -> str:
        return self.path


def validate_path_segment(kind: str, value: str) -> None:
    """Reject names that would break the key layout; keep everything else (``:``, ``%``...)."""
    if not value:
        raise InvalidKey(f"{kind} must not be empty")
    if value in (".", ".."):
        raise InvalidKey(f"{kind} may not be {value!r}")
    if "/" in value:
        raise InvalidKey(f"{kind} may not contain '/': {value!r}")
    if "\x00" in value or "\n" in value:
        raise InvalidKey(f"{kind} may not contain control characters: {value!r}")


def normalize_prefix(prefix: str | None) -> str:
    """``registry``, ``/registry/`` → ``/registry``, as kube-apiserver joins its --etcd-prefix."""
    stripped = (prefix or "").strip("/")
    return "/" + stripped if stripped else ""


def resource_prefix(group: str, resource: str) -> str:
    """The path element kube-apiserver uses for a resource (special prefixes applied)."""
    return SPECIAL_RESOURCE_PREFIXES.get((group, resource), resource)


# Directories (component, type, namespace) whose checked path a PoolKeyBuilder keeps.
DIRECTORIES_KEPT = 1024


class PoolKeyBuilder:
    """Builds object keys and list prefixes under one storage prefix.

    Objects come in runs of one directory (a namespace of one type, read from the
    local cache or listed from the cloud), so the part of a key before the name and
    the key's ResourceId are worked out, checked and kept once per directory, for at
    most ``DIRECTORIES_KEPT`` directories (all of them are forgotten when more come).
    """

    def __init__(self, prefix: str | None) -> None:
        self.prefix = normalize_prefix(prefix)
        self._directories: dict[tuple[str, str, str, str, str], tuple[str, ResourceId]] = {}

    def object_key(self, info: KeyBuildInfo) -> PoolKey:
        """The key of one object; ``info.name`` is required."""
        directory = (info.component, info.group, info.version, info.resources, info.namespace)
        known = self._directories.get(directory)
        if known is not None:
            validate_path_segment("name", info.name)
            return PoolKey(known[0] + info.name, info.component, known[1])
        if not info.component:
            raise InvalidKey("component must not be empty")
        if not info.resources:
            raise InvalidKey("resource must not be empty")
        validate_path_segment("name", info.name)
        if info.namespace:
            validate_path_segment("namespace", info.namespace)
        parts = [self.prefix, resource_prefix(info.group, info.resources)]
        if info.namespace:
            parts.append(info.namespace)
        known = ("/".join(parts) + "/", info.resource_id)
        if len(self._directories) >= DIRECTORIES_KEPT:
            self._directories.clear()
        self._directories[directory] = known
        return PoolKey(known[0] + info.name, info.component, known[1])

    def list_prefix(self, group: str, resource: str, namespace: str | None = None) -> str:
        """Prefix of all keys of a resource (optionally one namespace); always ends in ``/``.

        The trailing ``/`` keeps ``pods/`` from matching ``podsecuritypolicy/...`` and
        ``default/`` from matching ``default-2/``.
        """
        if not resource:
            raise InvalidKey("resource must not be empty")
        parts = [self.prefix, resource_prefix(group, resource)]
        if namespace:
            validate_path_segment("namespace", namespace)
            parts.append(namespace)
        return "/".join(parts) + "/"

    def list_prefix_for(self, info: KeyBuildInfo) -> str:
        return self.list_prefix(info.group, info.resources, info.namespace or None)


def mirror_rv_key(path: object) -> str:
    """``/mirror/rv<key>``: where the resourceVersion of the object at ``path`` lives."""
    return MIRROR_RV_PREFIX + str(path)


def rv_in_range(rv: int) -> bool:
    """A mirror rv can hold ``rv`` (0 to ``MAX_RV``)."""
    return 0 <= rv <= MAX_RV


def format_rv(rv: int | str) -> str:
    """resourceVersion as 32 zero-padded digits, so byte order equals numeric order."""
    rv = int(rv)
    if not rv_in_range(rv):
        raise ValueError(f"resourceVersion out of range: {rv}")
    return f"{rv:0{RV_DIGITS}d}"


def parse_rv(value: str | bytes) -> int:

    """Inverse of format_rv; accepts bytes or str."""
    if isinstance(value, bytes):
        value = value.decode("ascii")
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"not a resourceVersion: {value!r}")
    return int(value)
