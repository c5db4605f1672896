"""What the end-to-end tests see of the node leases in the cloud API test server.

``CloudLeaseChanges`` logs every write of a lease as it happens (a watch on the
server's store); ``CloudLeaseSampler`` reads the leases of some nodes every few
milliseconds, which tells how old a node's renewTime got at any moment, the number
the heartbeat bounds are about.
"""

from typing import Any, Dict, Iterable, List, Optional, Tuple

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime

from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import renew_time
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.selectors import ObjectFilter


class CloudLeaseChanges:
    """Every change of the cloud's leases, in any namespace, as it happens:
    ``changes`` = [(seconds, namespace/name, renewTime seconds, delegate annotation)]."""

    def __init__(self, server: KubeAPIServer, clock: IReactorTime) -> None:
        self.changes: List[Tuple[float, str, Optional[float], Optional[str]]] = []
        self._clock = clock
        self._watcher = server.store.watch(LEASES, ObjectFilter(), None, self._event)

    def _event(self, event_type: str, lease: Dict[str, Any]) -> None:
        metadata = lease["metadata"]
        self.changes.append((self._clock.seconds(),
                             f"{metadata['namespace']}/{metadata['name']}",
                             renew_time(lease),
                             (metadata.get("annotations") or {}).get(
                                 DELEGATE_HEARTBEAT_ANNOTATION)))

    def delegated(self, name: str, since: float) -> List[float]:
        """Distinct renewTimes of ``kube-node-lease/name`` written with the delegate
        annotation after ``since``."""
        key = f"{NODE_LEASE_NAMESPACE}/{name}"
        return sorted({renewed for at, changed, renewed, annotation in self.changes
                       if changed == key and at >= since and annotation == "true"
                       and renewed is not None})


    def keys(self, since: float = 0.0) -> set:
        return {key for at, key, _, _ in self.changes if at >= since}

    def stop(self) -> None:
        self._watcher.cancel()


class CloudLeaseSampler:
    """Reads the cloud node leases of ``nodes`` every ``every`` seconds.

    ``seen[node]`` lists (first seen at, renewTime) of each distinct renewTime;
    ``ages[node]`` lists (at, age of the renewTime then) of every sample, which holds
    for writers whose clocks are true; ``increases[node]`` lists (seen at, renewTime)
    of each increase of the renewTime, which is how the node lifecycle controller
    judges a node whatever the writers' clocks: it stamps its own clock whenever the
    renewTime increases and never compares renewTime with its clock
    (``longest_gap``)."""

    def __init__(self, server: KubeAPIServer, nodes: Iterable[str], clock: IReactorTime,
                 every: float = 0.02) -> None:
        self.server = server
        self.nodes = list(nodes)
        self.seen: Dict[str, List[Tuple[float, float]]] = {node: [] for node in self.nodes}
        self.ages: Dict[str, List[Tuple[float, float]]] = {node: [] for node in self.nodes}
        self.increases: Dict[str, List[Tuple[float, float]]] = {n: [] for n in self.nodes}
        self._highest: Dict[str, Optional[float]] = dict.fromkeys(self.nodes)

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
            self.ages[node].append((now, now - renewed))
            history = self.seen[node]
            if not history or history[-1][1] != renewed:
                history.append((now, renewed))
            highest = self._highest[node]
            if highest is None or renewed > highest:
                if highest is not None:
                    self.increases[node].append((now, renewed))
                self._highest[node] = renewed

    def last(self, node: str) -> Optional[float]:
        """The newest renewTime of ``node``."""
        return self.seen[node][-1][1] if self.seen[node] else None

    def renewals_after(self, node: str, seconds: float) -> List[float]:
        """renewTimes of ``node`` later than ``seconds``."""
        return [renewed for _, renewed in self.seen[node] if renewed > seconds]

    def oldest(self, node: str, since: float = 0.0) -> Tuple[float, Optional[float]]:
        """(age, at) of the oldest renewTime of ``node`` sampled after ``since``."""
        return max(((age, at) for at, age in self.ages[node] if at >= since),
                   default=(0.0, None))

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
        """When ``node``'s renewTime was last seen to increase (the sampler's clock)."""
        return self.increases[node][-1][0] if self.increases[node] else None

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
