"""The node's heartbeat lease as a probe writes it, and the timings of a probe.

A server is judged by writing something that matters: the node's own heartbeat
lease ``kube-node-lease/<node>``. A probe survives what a single request may meet on
a busy link: it is one lease write tried up to ``failed_retry`` times
(``probe_retry_policy`` says when), and only a probe whose every attempt failed turns
a server unhealthy (``yurtcoord.heartbeat.serverset``). ``NodeLeaseWriter`` is that
write; ``published_url`` and ``servers_in_use`` are what a coordinator lease says of
the pool servers its agent uses (``yurtcoord.heartbeat.probes``).
"""

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generator, Optional, Protocol, Union
from urllib.parse import urlsplit, urlunsplit

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import node_owner_reference, stamped_renew_time
from yurtcoord.kube.leasewriter import LeaseWriter
from yurtcoord.names import (
    COORDINATOR_SERVER_ANNOTATION, ETCD_MEMBER_ANNOTATION, NODE_LEASE_NAMESPACE,
)
from yurtcoord.tx.retry import RetryPolicy, backoff_policy

NODE_LEASE_DURATION_SECONDS = 40
# While a node lease has no owner, seconds between reads of the Node to name it owner.
OWNER_READ_INTERVAL = 60.0
def probe_retry_policy(interval: float, timeout: float, failed_retry: int) -> RetryPolicy:
    """The pauses between the attempts of one probe: d, 2d, 4d, ... with
    ``d = slack / 2 ** (failed_retry - 1)`` and ``slack = interval - failed_retry *
    timeout``.

    Why: a probe has ``interval`` in all (the next one is due then, and the whole
    probe is cancelled at that point) and each of its ``failed_retry`` attempts up to
    ``timeout``. The pauses share what the attempts leave, doubling as backoff does,
    and add up to ``slack - d``: even a probe whose every attempt timed out ends ``d``
    before the next probe is due, so no probe is cut short. With the defaults (10 s,
    2 s, 3) the pauses are 1 s and 2 s: a server that failed twice and answers the
    third time is still healthy 3 s later, and one that never answers is unhealthy
    after 9 s. When the attempts alone fill the interval (``slack <= 0``) the retries
    follow at once and the interval cuts the probe short.
    """
    if failed_retry < 1:
        raise ValueError(f"failed_retry must be at least 1, got {failed_retry}")
    slack = max(0.0, interval - failed_retry * timeout)
    first = slack / 2 ** (failed_retry - 1)
    # The last pause (before attempt failed_retry) is slack / 2: the cap never binds.
    return backoff_policy(initial=first, maximum=slack, factor=2.0, jitter=0.0)


@dataclass(frozen=True)
class ProbeSettings:
    """The ``[heartbeat]`` timings shared by all probers of an agent.

    Any object with these four attributes will do (``config.HeartbeatConfig`` has them).
    """

    interval: float = 10.0
    timeout: float = 2.0
    failed_retry: int = 3
    healthy_threshold: int = 2


class Settings(Protocol):
    """The timings a prober is given: ``ProbeSettings``, or the agent's ``[heartbeat]``
    section, which the heartbeat does not import (it sits above it)."""

    @property
    def interval(self) -> float: ...

    @property
    def timeout(self) -> float: ...

    @property
    def failed_retry(self) -> int: ...

    @property
    def healthy_threshold(self) -> int: ...
# The annotations a node lease writer sets, None meaning "remove".
Annotations = Mapping[str, Optional[str]]


def published_url(url: object) -> Optional[str]:
    """``url`` as an agent may show it to its pool: scheme, host, port and path only.

    Userinfo (``user:password@``), query and fragment are dropped, since they may carry
    credentials and what a node lease says every member of the pool reads. None when
    ``url`` is not an http(s) URL with a host: a value read from a peer's lease may be
    anything."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
        parts.port  # raises on a port that is not a number
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def servers_in_use(lease: object) -> tuple[Optional[str], Optional[str]]:
    """``(pool etcd member, coordinator apiserver)`` a node lease on the coordinator
    apiserver says its agent uses (see ``CoordinatorHealthChecker``); None for what it
    does not say, or says in anything but an http(s) URL (anything a peer wrote is
    read safely, and shown without credentials)."""
    metadata = lease.get("metadata") if isinstance(lease, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None, None
    return (published_url(annotations.get(ETCD_MEMBER_ANNOTATION)),
            published_url(annotations.get(COORDINATOR_SERVER_ANNOTATION)))


class NodeLeaseWriter:
    """Renews ``kube-node-lease/<node>`` on one apiserver through a ``LeaseWriter``.

    One renewal is tried up to ``failed_retry`` times: any error is retried after the
    pause of ``probe_retry_policy``, a conflict is read again at once, and each
    attempt is bounded by ``timeout``. ``annotations`` is an optional callable
    returning ``{name: value}`` to set on every write, a value of None meaning
    "remove this annotation".

    A lease this writer creates holds ``leaseDurationSeconds`` 40; a renewal keeps the
    duration the lease already has. As the kubelet does, the lease names its Node as
    owner (so it goes when the Node goes), and a lease without an owner gets it at a
    renewal: the server may not have had the Node yet when the lease was created (a
    node registering, a coordinator apiserver before the node's upload), and a Node
    read that failed must not keep the heartbeat from being written. The Node is read
    only while the lease has no owner, and then at most once per
    ``OWNER_READ_INTERVAL``: a renewal of a lease that has its owner stays one
    request, and a server that has no such Node is not asked on every renewal. A Node
    read that fails or hangs leaves the lease without an owner for that write (a hung
    read costs that attempt only: the next one, within the interval, does not read).

    Every write's renewTime is local now, or 1 µs past the renewTime the lease holds
    when that is later (``_renewed``): the lease's renewTime only moves forward,
    whoever wrote it last and with whatever clock.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, client: IObjectClient, node_name: str,
                 settings: Settings,
                 annotations: Optional[Callable[[], Annotations]] = None) -> None:
        self._clock = clock
        self._client = client
        self._node = node_name
        self._annotations = annotations or (lambda: {})
        # When the Node was last read for the lease's owner (local clock), or None.
        self._owner_read_at: Optional[float] = None
        self._writer = LeaseWriter(
            clock, client, NODE_LEASE_NAMESPACE, node_name,
            attempts=settings.failed_retry, retry_errors=True,
            retry_policy=probe_retry_policy(settings.interval, settings.timeout,
                                            settings.failed_retry),
            attempt_timeout=settings.timeout)

    def renew(self) -> defer.Deferred[Optional[dict]]:
        """Write a fresh renewTime. Fires with the written lease; fails with
        ``LeaseWriteFailed`` when the last attempt still conflicted, or with the last
        attempt's error."""
        return self._writer.write(self._change).addCallback(lambda result: result.lease)

    def read(self) -> defer.Deferred[Optional[dict]]:
        """Read the lease, with the same attempts, pauses and timeouts as a renewal
        (a server is checked without writing). Fires with the lease, None when the
        server has none."""
        self._writer.forget()
        return self._writer.write(lambda current: None).addCallback(
            lambda result: result.lease)

    def forget(self) -> None:
        """Read the lease before the next write: another writer may have renewed it."""
        self._writer.forget()

    def _change(self, current: Optional[dict]) -> Union[dict, defer.Deferred[dict]]:
        if current is None:
            return self._fresh_lease()
        if not _has_owner(current) and self._owner_read_due():
            return self._with_owner(current).addCallback(self._renewed)
        return self._renewed(current)

    def _apply_annotations(self, metadata: dict) -> None:
        annotations = dict(metadata.get("annotations") or {})
        for name, value in self._annotations().items():
            if value is None:
                annotations.pop(name, None)
            else:
                annotations[name] = value
        if annotations:
            metadata["annotations"] = annotations
        else:
            metadata.pop("annotations", None)

    def _fresh_lease(self) -> Union[dict, defer.Deferred[dict]]:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"leaseDurationSeconds": NODE_LEASE_DURATION_SECONDS},
        }
        if not self._owner_read_due():
            return self._renewed(lease)
        return self._with_owner(lease).addCallback(self._renewed)

    def _owner_read_due(self) -> bool:
        return (self._owner_read_at is None
                or self._clock.seconds() - self._owner_read_at >= OWNER_READ_INTERVAL)

    @defer.inlineCallbacks
    def _with_owner(self, lease: dict) -> Generator[Any, Any, dict]:
        """``lease`` naming the Node as owner when the server shows the Node; as it is
        when it does not, or when the read failed (logged)."""
        self._owner_read_at = self._clock.seconds()
        try:
            owner = yield node_owner_reference(self._client, self._node)
        except defer.CancelledError:
            raise
        except Exception as error:
            self.log.warn(
                "node lease {node}: cannot read Node {node} to name it owner ({error}); "
                "the lease is written without an owner, which a renewal adds later",
                node=self._node, error=error)
            return lease
        if owner is None:
            return lease
        lease = copy.deepcopy(lease)
        lease.setdefault("metadata", {})["ownerReferences"] = [owner]
        return lease

    def _renewed(self, lease: dict) -> dict:
        """``lease`` renewed by this node: holder, duration, annotations, and a
        renewTime of local now, or 1 µs past the renewTime the lease holds when that
        is not before now (docs/design.md, "Clocks"). So the renewTime this node
        writes moves forward whoever wrote last: the pool leader that forwarded this
        node's heartbeat while the cloud was cut off stamped its own clock, which may
        be minutes ahead of this one, and the node lifecycle controller counts a node
        as renewing only when the renewTime it sees moves forward. Nothing is judged
        fresh or stale here: the larger of the two times is written, that is all."""
        lease = copy.deepcopy(lease)
        self._apply_annotations(lease.setdefault("metadata", {}))
        spec = lease.setdefault("spec", {})
        spec["holderIdentity"] = self._node
        if not spec.get("leaseDurationSeconds"):
            spec["leaseDurationSeconds"] = NODE_LEASE_DURATION_SECONDS
        spec["renewTime"] = stamped_renew_time(self._clock.seconds(), spec.get("renewTime"))
        return lease


def _has_owner(lease: Mapping[str, Any]) -> bool:
    """Whether a lease names any owner: the kubelet, too, adds its Node as owner only
    to a lease that has none."""
    metadata = lease.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("ownerReferences"))
