"""What the leader's heartbeat delegation reads: the node leases of the pool on the
coordinator apiserver, with the fields a server adds, and the cloud Nodes of the pool
as its Node informer delivers them."""

from typing import Any, Mapping, Optional

from yurtcoord.heartbeat.delegation import (
    DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.kube.lease import format_micro_time

POOL = "pool-a"


def pool_lease(name: str, renewed: float, delegated: bool = True,
               annotations: Optional[Mapping[str, str]] = None,
               labels: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """A node lease as the coordinator apiserver holds it, server fields included."""
    notes = dict(annotations or {})
    if delegated:
        notes[DELEGATE_HEARTBEAT_ANNOTATION] = "true"
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NODE_LEASE_NAMESPACE,
            "resourceVersion": "4711",
            "uid": "pool-uid-" + name,
            "creationTimestamp": "2027-01-15T08:00:00Z",
            "generation": 3,
            "selfLink": f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}",
            "managedFields": [{"manager": "yurthub", "operation": "Update"}],
            "labels": dict(labels or {"node.openyurt.io/pool": "pool-a"}),
            "annotations": notes,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                 "uid": "node-uid-" + name}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": format_micro_time(renewed),
        },
    }


def pool_node(name: str, pool: str = POOL) -> dict[str, Any]:
    """A cloud Node as the pool's Node informer delivers it."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": "node-uid-" + name, "resourceVersion": "7",
                         "labels": {NODE_POOL_LABEL: pool}}}
