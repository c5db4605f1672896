"""Whether a lease another machine writes is being renewed, judged on this agent's own
clock (docs/design.md, "Clocks").

A renewTime says what the writer's clock read when it wrote, and the clocks of edge
nodes are minutes off each other (no NTP while cut off, no battery-backed clock), so
comparing another machine's renewTime with the local clock says nothing about whether
that machine is alive: a follower 120 s ahead of the leader would call every renewal
stale, one 120 s behind would call a dead leader's lease fresh for two minutes. What
does say so is that the renewTime CHANGES: ``RenewalsSeen`` remembers, per lease, the
renewTime it last saw and the local time it saw it change, and a lease counts as
renewed within a window when that local time is within the window. This is how
client-go's leader election judges a lease (the local time it last saw the record
change) and how the node lifecycle controller judges node leases.

A lease seen for the first time counts as changed at that moment, as in client-go: an
agent that just started (or a view that was not asked for a while) gives every lease
one window before it can call it stale. Two renewTimes are only ever compared with
each other, for equality; neither is compared with the local clock.
"""

from collections.abc import Collection, Hashable, Mapping
from typing import Any, Optional

from twisted.internet.interfaces import IReactorTime

from yurtcoord.kube.lease import renew_time


def renew_mark(lease: object) -> Optional[float]:
    """The renewTime of ``lease`` (POSIX seconds, the writer's clock) as a value to
    compare with another renewTime of the same lease; None when ``lease`` is not a
    Lease with a readable renewTime (anything a peer wrote is read safely)."""
    if not isinstance(lease, Mapping):
        return None
    try:
        return renew_time(lease)
    except (TypeError, ValueError, AttributeError):
        return None


def _written_renew_time(lease: Mapping[str, Any]) -> Optional[str]:
    """``spec.renewTime`` as written (the text), None when it is no text."""
    spec = lease.get("spec")
    written = spec.get("renewTime") if isinstance(spec, Mapping) else None
    return written if isinstance(written, str) else None


class RenewalsSeen:
    """Per lease (any hashable key the caller chooses), the renewTime last seen and the
    local time, on ``clock``, at which it was seen to change.

    ``observe(key, lease)`` is called with every read of the lease (a get, a list, an
    informer event); an observation whose renewTime equals the last one seen changes
    nothing, so a relist, a resync or a write of other fields never extends freshness.
    A renewTime written as the same text as the last one seen is that one without
    being parsed again (a view reading a thousand unchanged leases a second parses
    none of them).
    """

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        # key -> (renewTime last seen, local time it was seen to change, its text)
        self._seen: dict[Hashable, tuple[float, float, Optional[str]]] = {}

    def observe(self, key: Hashable, lease: Optional[Mapping[str, Any]]) -> Optional[float]:
        """Note that ``lease`` is what ``key`` holds now. Returns the local time its
        renewTime was last seen to change: now when it differs from the one seen
        before or none was seen before. None (and ``key`` forgotten) when ``lease``
        is None or carries no readable renewTime: no lease, no heartbeat."""
        previous = self._seen.get(key)
        written = _written_renew_time(lease) if isinstance(lease, Mapping) else None
        if previous is not None and written is not None and previous[2] == written:
            return previous[1]
        mark = renew_mark(lease)
        if mark is None:
            self._seen.pop(key, None)
            return None
        if previous is not None and previous[0] == mark:
            # The same time written otherwise: no change.
            self._seen[key] = (mark, previous[1], written)
            return previous[1]
        now = self._clock.seconds()
        self._seen[key] = (mark, now, written)
        return now

    def changed_at(self, key: Hashable) -> Optional[float]:
        """The local time ``key``'s renewTime was last seen to change; None when no
        renewTime of it is remembered."""
        seen = self._seen.get(key)
        return None if seen is None else seen[1]

    def age(self, key: Hashable) -> Optional[float]:
        """Seconds on the local clock since ``key``'s renewTime was last seen to
        change; None when no renewTime of it is remembered."""
        changed = self.changed_at(key)
        return None if changed is None else max(0.0, self._clock.seconds() - changed)

    def forget(self, key: Hashable) -> None:
        """Drop what is remembered of ``key`` (the lease was deleted): if it comes
        back it counts as seen for the first time."""
        self._seen.pop(key, None)

    def retain(self, keys: Collection[Hashable]) -> None:
        """Forget every key not in ``keys`` (leases no longer there), so that what
        is remembered stays as large as what exists."""
        for key in [key for key in self._seen if key not in keys]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)
