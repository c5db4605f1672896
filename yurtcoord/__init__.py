"""yurtcoord: the pool coordinator agent of an edge Kubernetes node pool."""

__version__ = "0.1.0"
