"""The resource types the test API server serves, and the discovery documents
clients (client-go, kubectl, the Python client) read to find them."""

from dataclasses import dataclass
from typing import Any, Iterable

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.gvr import GroupVersionResource

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ResourceType:
    """One served resource: its GVR plus the names clients expect in discovery."""

    gvr: GroupVersionResource
    kind: str
    singular: str
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def api_version(self) -> str:
        return self.gvr.group_version

    @property
    def qualified_name(self) -> str:
        """``leases.coordination.k8s.io`` or ``pods``: the name used in error messages."""
        if self.gvr.group:
            return f"{self.gvr.resource}.{self.gvr.group}"
        return self.gvr.resource

    def discovery_entries(self) -> list[dict[str, Any]]:
        entry: dict[str, Any] = {
            "name": self.gvr.resource,
            "singularName": self.singular,
            "namespaced": self.gvr.namespaced,
            "kind": self.kind,
            "verbs": list(VERBS),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        entries = [entry]
        for sub in self.subresources:
            entries.append({
                "name": f"{self.gvr.resource}/{sub}",
                "singularName": "",
                "namespaced": self.gvr.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            })
        return entries


DEFAULT_TYPES = (
    ResourceType(gvrs.LEASES, "Lease", "lease"),
    ResourceType(gvrs.ENDPOINTS, "Endpoints", "endpoints", ("ep",)),
    ResourceType(gvrs.PODS, "Pod", "pod", ("po",), ("status",)),
    ResourceType(gvrs.NODES, "Node", "node", ("no",), ("status",)),
    ResourceType(gvrs.SECRETS, "Secret", "secret"),
    ResourceType(gvrs.CONFIGMAPS, "ConfigMap", "configmap", ("cm",)),
    ResourceType(gvrs.SERVICES, "Service", "service", ("svc",), ("status",)),
    ResourceType(gvrs.NAMESPACES, "Namespace", "namespace", ("ns",), ("status",)),
    ResourceType(gvrs.ENDPOINTSLICES_V1, "EndpointSlice", "endpointslice"),
    ResourceType(gvrs.ENDPOINTSLICES_V1BETA1, "EndpointSlice", "endpointslice"),
)


class Catalog:
    """Lookup of served resource types by group, version and resource name."""

    def __init__(self, types: Iterable[ResourceType] = DEFAULT_TYPES) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for resource_type in types:
            self.add(resource_type)

    def add(self, resource_type: ResourceType) -> None:
        gvr = resource_type.gvr
        self._types[(gvr.group, gvr.version, gvr.resource)] = resource_type

    def remove(self, gvr: GroupVersionResource) -> None:
        """Stop serving a type (discovery then answers 404 for an emptied
        group/version); its stored objects become unreachable."""
        self._types.pop((gvr.group, gvr.version, gvr.resource), None)

    def find(self, group: str, version: str, resource: str) -> ResourceType | None:
        return self._types.get((group, version, resource))

    def type_of(self, gvr: GroupVersionResource) -> ResourceType:
        """The served type for ``gvr``; raises KeyError for a type not served."""
        found = self.find(gvr.group, gvr.version, gvr.resource)
        if found is None:
            raise KeyError(f"resource {gvr} is not served")
        return found

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def group_versions(self) -> dict[str, list[str]]:
        """``{group: [version, ...]}`` in registration order (preferred first)."""
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._types:
            versions = groups.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return groups

    def api_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": self.group_versions().get("", []),
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address},
            ],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not group or not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [group for group in map(self.api_group, self.group_versions())
                  if group is not None]

        for group in groups:
            del group["kind"], group["apiVersion"]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        """The APIResourceList of one group/version, or None if it is not served."""
        entries: list[dict[str, Any]] = []

        for (g, v, _), resource_type in self._types.items():
            if g == group and v == version:
                entries.extend(resource_type.discovery_entries())
        if not entries:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }
