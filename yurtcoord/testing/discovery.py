"""A cloud's API discovery and pool scope ConfigMap, scripted for unit tests of the
pool scope and of pool sync, and the pool-scoped resources by id, as the tests of the
pool scope compare them."""

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from twisted.internet import defer
from zope.interface import implementer

from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.interfaces import IAPIRequests
from yurtcoord.pool.scope import DEFAULT_POOL_SCOPE_RESOURCES

SERVICES_ENTRY = '[{"group":"","version":"v1","resource":"services"}]'


def resource_ids(resources: Iterable[GroupVersionResource]) -> List[Tuple[str, str, str]]:
    """``(group, version, resource)`` of each of ``resources``, in order."""
    return [(g.group, g.version, g.resource) for g in resources]


DEFAULT_IDS = resource_ids(DEFAULT_POOL_SCOPE_RESOURCES)


@implementer(IAPIRequests)
class ScriptedDiscovery:
    """``request("GET", path)``: answers from ``served`` ({path: [(resource, namespaced)]}),
    404 for other paths; ``fail[path]`` errors are raised first, one per call."""

    def __init__(self, served: Mapping[str, List[Tuple[str, bool]]]) -> None:
        self.served = served
        self.fail: Dict[str, List[BaseException]] = {}
        self.calls: List[Tuple[str, str]] = []

    def request(self, method: str, path: str, params: Optional[Dict[str, Any]] = None,
                body: Any = None, allow_empty: bool = False) -> defer.Deferred[Any]:
        self.calls.append((method, path))
        queued = self.fail.get(path)
        if queued:
            return defer.fail(queued.pop(0))
        if path not in self.served:
            return defer.fail(NotFound("the server could not find the requested resource"))
        return defer.succeed({"kind": "APIResourceList", "resources": [
            {"name": name, "namespaced": namespaced, "kind": name.title()}
            for name, namespaced in self.served[path]]})


def cloud_discovery() -> ScriptedDiscovery:
    """The discovery answers of a cloud serving the default pool-scoped resources."""
    return ScriptedDiscovery({
        "/api/v1": [("endpoints", True), ("services", True), ("services/status", True),
                    ("nodes", False)],
        "/apis/discovery.k8s.io/v1": [("endpointslices", True)],
        "/apis/discovery.k8s.io/v1beta1": [("endpointslices", True)],
    })


def configmap(value: str, rv: str = "1") -> Dict[str, Any]:
    """The yurt-hub-cfg ConfigMap with ``pool_scope_resources`` set to ``value``."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "yurt-hub-cfg", "namespace": "kube-system",
                         "resourceVersion": rv},
            "data": {"pool_scope_resources": value}}
