"""Leases of the pool on the coordinator apiserver, as the agents read them: node
leases and the election lease whose renewTime names a given number of seconds before
now (wall clock), and whose delegation annotation gives a member's heartbeat path in the
pool view (which dates a renewal from when it sees renewTime change, not from the time
renewTime names); and the informer sync lease, whose renewals tell that the pool cache
is synced."""

import time
from typing import Any, Optional

from yurtcoord.kube.lease import LeaseRecord, build_lease, format_micro_time
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE


def lease(name: str, age: float, namespace: str = NODE_LEASE_NAMESPACE,
          delegated: bool = False, holder: Optional[str] = None,
          duration: int = 40) -> dict[str, Any]:
    """The lease ``name`` renewed ``age`` seconds ago by ``holder`` (by default the node
    of that name), annotated as a delegated heartbeat if ``delegated``."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if delegated:
        metadata["annotations"] = {DELEGATE_HEARTBEAT_ANNOTATION: "true"}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder or name, "leaseDurationSeconds": duration,
                     "renewTime": format_micro_time(time.time() - age)}}


def sync_lease(renewed: float, rv: str = "1", name: str = "leader-informer-sync",
               namespace: str = "kube-system") -> dict[str, Any]:
    """The informer sync lease renewed at ``renewed`` (POSIX seconds), of
    resourceVersion ``rv``."""
    lease = build_lease(name, namespace, LeaseRecord("edge-1", 10, renewed, renewed))
    lease["metadata"]["resourceVersion"] = rv
    return lease
