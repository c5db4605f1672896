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
    ``ages[node]`` lists (at, age of the renewTime then) of every sample."""

    def __init__(self, server: KubeAPIServer, nodes: Iterable[str], clock: IReactorTime,
                 every: float = 0.02) -> None:
        self.server = server
        self.nodes = list(nodes)
        self.seen: Dict[str, List[Tuple[float, float]]] = {node: [] for node in self.nodes}
        self.ages: Dict[str, List[Tuple[float, float]]] = {node: [] for node in self.nodes}

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

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
