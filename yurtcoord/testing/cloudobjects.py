"""Numbered cloud objects of services, many of which make a big pool to mirror, and the
cloud seeded with them."""

from typing import TYPE_CHECKING, Any

from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.server import KubeAPIServer

# The namespaces the seeded objects are spread over.
NAMESPACES = ("default", "kube-system", "team-a")


def make_endpoints(i: int, namespace: str) -> dict[str, Any]:
    """Endpoints ``svc-i`` of one address and port."""
    return {"metadata": {"name": f"svc-{i}", "namespace": namespace,
                         "labels": {"app": f"app-{i % 7}"}},
            "subsets": [{"addresses": [{"ip": f"10.{i // 250}.{i % 250}.1"}],
                         "ports": [{"port": 8080, "protocol": "TCP"}]}]}


def make_slice(i: int, namespace: str) -> dict[str, Any]:
    """The EndpointSlice of ``svc-i``: one ready address, one port."""
    return {"metadata": {"name": f"svc-{i}-abcde", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [f"10.{i // 250}.{i % 250}.1"],
                           "conditions": {"ready": True}}],
            "ports": [{"port": 8080, "protocol": "TCP"}]}


def seed_cloud(cloud: "KubeAPIServer", count: int) -> None:
    """``count`` endpoints and ``count`` endpointslices spread over three namespaces."""
    for i in range(count):
        namespace = NAMESPACES[i % len(NAMESPACES)]
        cloud.store.create(ENDPOINTS, make_endpoints(i, namespace))
        cloud.store.create(ENDPOINTSLICES_V1, make_slice(i, namespace))
