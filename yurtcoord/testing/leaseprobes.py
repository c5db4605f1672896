"""A node lease prober on a ``Clock`` writing to the fake apiserver, built as the
heartbeat unit tests build it."""

from typing import Any, Optional

from twisted.internet.task import Clock

from yurtcoord.heartbeat.probes import (
    NODE_LEASE_NAMESPACE, LeaseProber, NodeLeaseWriter, ProbeSettings,
)
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.testing.fakekube import FakeKube

NODE = "edge-1"
START = 1_700_000_000.0
DEFAULTS = ProbeSettings(interval=10, timeout=2, failed_retry=3, healthy_threshold=2)


def make_clock() -> Clock:
    """A Clock at ``START``."""
    clock = Clock()
    clock.advance(START)
    return clock


def make_prober(clock: Clock, client: IObjectClient, settings: Optional[ProbeSettings] = None,
                **kwargs: Any) -> LeaseProber:
    """A prober of ``https://cloud-1`` writing ``NODE``'s lease through ``client``."""
    settings = settings or DEFAULTS
    writer = NodeLeaseWriter(clock, client, NODE, settings)
    return LeaseProber(clock, writer, "https://cloud-1", settings, **kwargs)


def node_lease(client: FakeKube) -> Optional[dict[str, Any]]:
    """``NODE``'s lease as ``client`` holds it, or None."""
    return client.peek(LEASES, NODE, NODE_LEASE_NAMESPACE)
