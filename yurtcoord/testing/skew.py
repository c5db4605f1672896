"""Agents whose clocks are off: libfaketime preloaded into one ``twistd`` process.

Edge nodes cut off from the cloud lose NTP and drift, and devices without a
battery-backed clock boot minutes off. The end-to-end tests reproduce that per agent:
``skewed_clock_environment(120)`` is the environment that shifts the wall clock of the
process it is given to by +120 s (``LD_PRELOAD`` of ``libfaketime.so.1`` with
``FAKETIME``), the process itself, not a ``faketime`` wrapper that forks, so that the
signals a test sends reach the agent. The monotonic clock is left alone: only the time
that other machines see in the leases an agent writes is off.

``CloudRenewals`` judges a node's heartbeat as the node lifecycle controller does: it
stamps its own clock whenever the cloud lease's renewTime increases, and never
compares renewTime with its clock; a node is alive while the gaps between those
observed increases stay short.
"""

import glob
import os
from typing import Dict, Iterable, List, Optional, Tuple

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime

from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import renew_time
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.sim.apiserver import KubeAPIServer

# Where Debian's faketime package puts the library, per architecture.
LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def libfaketime_path() -> Optional[str]:
    """The libfaketime to preload, None when the faketime package is not installed."""
    found = sorted(glob.glob(LIBFAKETIME_GLOB))
    return found[0] if found else None


def skewed_clock_environment(offset: float) -> Dict[str, str]:
    """Variables that shift a process's wall clock by ``offset`` seconds (whole
    seconds; negative for a clock behind). Raises RuntimeError without libfaketime."""
    library = libfaketime_path()
    if library is None:
        raise RuntimeError(f"no libfaketime at {LIBFAKETIME_GLOB} (Debian package faketime)")
    preload = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
    return {"LD_PRELOAD": preload, "FAKETIME": f"{int(offset):+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"}


class CloudRenewals:
    """Samples the cloud node leases of ``nodes`` every ``every`` seconds and records,
    on the test's clock, each moment a node's renewTime was seen to increase."""

    def __init__(self, server: KubeAPIServer, nodes: Iterable[str], clock: IReactorTime,
                 every: float = 0.05) -> None:
        self.server = server
        self.nodes = list(nodes)
        # node -> [(seen at, renewTime)] of each increase seen.
        self.increases: Dict[str, List[Tuple[float, float]]] = {n: [] for n in self.nodes}
        self._last: Dict[str, Optional[float]] = dict.fromkeys(self.nodes)
        self._clock = clock
        self._loop = task.LoopingCall(self.sample)
        self._loop.clock = clock
        self._loop.start(every, now=True)

    def sample(self) -> None:
        now = self._clock.seconds()
        for node in self.nodes:
            lease = self.server.store.get(LEASES, node, NODE_LEASE_NAMESPACE)
            renewed = renew_time(lease) if lease else None
            if renewed is None:
                continue
            last = self._last[node]
            if last is None or renewed > last:
                if last is not None:
                    self.increases[node].append((now, renewed))
                self._last[node] = renewed

    def seen_increasing(self, node: str, since: float) -> int:
        """How many increases of ``node``'s renewTime were seen after ``since``."""
        return sum(1 for at, _ in self.increases[node] if at >= since)

    def longest_gap(self, node: str, since: float, until: float) -> float:
        """The longest time in [since, until] without an observed increase of
        ``node``'s renewTime: what the node lifecycle controller would count."""
        moments = [at for at, _ in self.increases[node] if since <= at <= until]
        edges = [since] + moments + [until]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def last_increase(self, node: str) -> Optional[float]:
        """When ``node``'s renewTime was last seen to increase (test clock)."""
        return self.increases[node][-1][0] if self.increases[node] else None

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
