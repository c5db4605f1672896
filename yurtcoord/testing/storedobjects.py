"""Objects as the pool store holds them: the compact JSON bytes of a Kubernetes-like
object, which the store must write and etcd hold byte for byte."""

import json
from typing import Any, Dict, Optional


def make_object(name: str, namespace: Optional[str], rv: int | str, kind: str = "Pod",
                padding: int = 0) -> bytes:
    """Compact JSON bytes of a Kubernetes-like object (exact bytes are what etcd must hold)."""
    metadata = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        metadata["namespace"] = namespace
    obj: Dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
    if padding:
        obj["spec"] = {"padding": "x" * padding}
    return json.dumps(obj, separators=(",", ":")).encode()
