"""Names a cloud read found not to be Nodes of the pool, and the budget of those reads.

Anyone who may write leases to the coordinator apiserver can make up names by the ten
thousand; the leader's heartbeat delegation reads the cloud about a name its Node
informer does not hold only within this budget, and remembers each answer for a
while, so what such names cost is bounded whatever their number.
"""

from collections import OrderedDict, deque
from typing import Deque, Optional, Tuple

from twisted.internet.interfaces import IReactorTime


class AbsentNames:
    """Names a cloud read found not to be Nodes of the pool, with the reason, each for
    ``ttl`` seconds, at most ``size`` of them (the least recently used forgotten
    first); and the budget of those reads: at most ``size`` started per ``ttl``, so no
    answer is forgotten early for room, and made-up names cost the cloud at most
    ``size`` reads per ``ttl`` however many there are."""

    def __init__(self, reactor: IReactorTime, size: int, ttl: float) -> None:
        self._reactor = reactor
        self.size = size
        self.ttl = ttl
        # name -> (reason, until when it is remembered), least recently used first.
        self._names: "OrderedDict[str, Tuple[str, float]]" = OrderedDict()
        # When each read of the last ``ttl`` seconds started, oldest first.
        self._reads: Deque[float] = deque()

    def __len__(self) -> int:
        return len(self._names)

    @property
    def reads_remembered(self) -> int:
        """How many read starts the budget still counts."""
        return len(self._reads)

    def get(self, name: str) -> Optional[str]:
        """The reason remembered for ``name``, or None (unknown or forgotten)."""
        entry = self._names.get(name)
        if entry is None:
            return None
        if self._reactor.seconds() >= entry[1]:
            del self._names[name]
            return None
        self._names.move_to_end(name)
        return entry[0]

    def put(self, name: str, reason: str) -> None:
        self._names[name] = (reason, self._reactor.seconds() + self.ttl)
        self._names.move_to_end(name)
        while len(self._names) > self.size:
            self._names.popitem(last=False)

    def discard(self, name: str) -> None:
        self._names.pop(name, None)

    def may_read(self) -> bool:
        """Whether one more cloud read fits the budget now."""
        since = self._reactor.seconds() - self.ttl
        reads = self._reads
        while reads and reads[0] <= since:
            reads.popleft()
        return len(reads) < self.size

    def read_started(self) -> None:
        self._reads.append(self._reactor.seconds())

    def clear(self) -> None:
        """Forget the answers (a new term asks again); the budget spent stays spent."""
        self._names.clear()
