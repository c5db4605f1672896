"""Group/version/resource names and the URL paths the Kubernetes API serves them at."""

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class GroupVersionResource:
    """One resource type of the Kubernetes API.

    ``group`` is ``""`` for the core group (served under ``/api/v1``).
    ``namespaced`` says whether objects live in a namespace.
    """

    group: str
    version: str
    resource: str
    namespaced: bool = True

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def api_prefix(self) -> str:
        """``/api/v1`` or ``/apis/<group>/<version>``."""
        if self.group:
            return f"/apis/{self.group}/{self.version}"
        return f"/api/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        """Path of the collection; all namespaces when ``namespace`` is None."""
        if self.namespaced and namespace:
            return f"{self.api_prefix}/namespaces/{quote(namespace, safe='')}/{self.resource}"
        return f"{self.api_prefix}/{self.resource}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self} is namespaced: a namespace is required for {name!r}")
        return f"{self.collection_path(namespace)}/{quote(name, safe='')}"

    def __str__(self) -> str:

        return f"{self.group or 'core'}/{self.version}/{self.resource}"


LEASES = GroupVersionResource("coordination.k8s.io", "v1", "leases")
ENDPOINTS = GroupVersionResource("", "v1", "endpoints")
PODS = GroupVersionResource("", "v1", "pods")
NODES = GroupVersionResource("", "v1", "nodes", namespaced=False)
SECRETS = GroupVersionResource("", "v1", "secrets")
CONFIGMAPS = GroupVersionResource("", "v1", "configmaps")
SERVICES = GroupVersionResource("", "v1", "services")
NAMESPACES = GroupVersionResource("", "v1", "namespaces", namespaced=False)
ENDPOINTSLICES_V1 = GroupVersionResource("discovery.k8s.io", "v1", "endpointslices")
ENDPOINTSLICES_V1BETA1 = GroupVersionResource("discovery.k8s.io", "v1beta1", "endpointslices")
