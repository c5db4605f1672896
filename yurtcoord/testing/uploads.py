"""What the tests of the local cache upload share: the resources uploaded from the
node's yurthub cache, a cache file written where yurthub would put it, and retry
pauses a test can count on."""

import os

from yurtcoord.agent.config import UploadResource
from yurtcoord.tx.retry import Retries, backoff_policy

PODS = UploadResource("kubelet", "pods", "v1")
NODES = UploadResource("kubelet", "nodes", "v1")
# The group, version and resource of the pods uploaded, as the pool store's keys name them.
PODS_GVR = ("", "v1", "pods")


def write_file(path: str, data: bytes) -> None:
    """Write a cache file, making its directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def steady_backoff(initial: float = 1.0, maximum: float = 30.0) -> Retries:
    """Retry pauses without jitter, so a Clock test knows each one."""
    return Retries(backoff_policy(initial=initial, maximum=maximum, jitter=0.0))
