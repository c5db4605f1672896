"""Leases as the pool view reads them off the coordinator apiserver, renewed a given
number of seconds before now (wall clock): node leases whose age and delegation
annotation give a member's heartbeat path, and the election lease."""

import time
from typing import Any, Optional

from yurtcoord.kube.lease import format_micro_time
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
