"""The write of one delegated pool lease state to the cloud, and the cloud lease it
writes.

Per delegation (one pool lease state to the cloud), through ``LeaseWriter``:

- a healthy cloud server is picked for every delegation and the write goes through
  that server's node-lease-proxy client; one writer per lease and server remembers the
  cloud lease it wrote last, so a renewal is one update;
- absent: the lease is created; present: renewTime, holderIdentity,
  leaseDurationSeconds and the delegate annotation are set on it (other cloud
  annotations stay) and it is updated under its resourceVersion. The renewTime is
  stamped by the attempt that writes, from the cloud lease that attempt read, so it
  also exceeds a renewal the node or another leader wrote meanwhile (docs/design.md,
  "Clocks");
- a conflict is re-read and retried, at most ``max_attempts`` attempts in all.

Every write that sent a request is one sample of the cloud's latency for the bound on
chains in flight (``yurtcoord.tx.limiter.AdaptiveLimit``).
"""

from typing import Any, Callable, Dict, Optional, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.heartbeat.refusals import IDelegationMetrics
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import owner_reference_to_node, stamped_renew_time
from yurtcoord.kube.leasewriter import LeaseWriter
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.tx.limiter import AdaptiveLimit

# The spec fields the leader sets on a cloud lease; their values are its own.
CLOUD_SPEC_FIELDS = ("holderIdentity", "leaseDurationSeconds", "renewTime")


class NoHealthyCloudServer(Exception):
    """No cloud server is healthy: the heartbeat cannot be forwarded now."""


def _delegate_annotation(pool_lease: dict) -> Optional[str]:
    return ((pool_lease.get("metadata") or {}).get("annotations") or {}).get(
        DELEGATE_HEARTBEAT_ANNOTATION)


def cloud_lease_spec(name: str, renew_time: str, lease_duration_seconds: int) -> dict:
    """The spec fields (``CLOUD_SPEC_FIELDS``) a delegation sets on the cloud lease of
    node ``name``: all of them the leader's, none the pool lease's."""
    return {"holderIdentity": name, "leaseDurationSeconds": lease_duration_seconds,
            "renewTime": renew_time}


def lease_for_create(pool_lease: dict, renew_time: str, lease_duration_seconds: int,
                     node: Optional[dict] = None) -> dict:
    """The cloud lease to create for a pool lease: its name, the delegate annotation,
    the leader's spec (``cloud_lease_spec``) and an ownerReference to ``node``."""
    source = pool_lease.get("metadata") or {}
    metadata = {"name": source["name"],
                "namespace": source.get("namespace") or NODE_LEASE_NAMESPACE,
                "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: _delegate_annotation(pool_lease)}}
    owner = owner_reference_to_node(node)
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": cloud_lease_spec(source["name"], renew_time, lease_duration_seconds)}


def merged_cloud_lease(cloud_lease: dict, pool_lease: dict, renew_time: str,
                       lease_duration_seconds: int) -> dict:
    """The cloud lease with the leader's spec (``cloud_lease_spec``) and the pool
    lease's delegate annotation; everything else of the cloud lease stays, its
    resourceVersion too, so the update is optimistic."""
    metadata = dict(cloud_lease.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations[DELEGATE_HEARTBEAT_ANNOTATION] = _delegate_annotation(pool_lease)
    metadata["annotations"] = annotations
    spec = dict(cloud_lease.get("spec") or {})
    spec.update(cloud_lease_spec(pool_lease["metadata"]["name"], renew_time,
                                 lease_duration_seconds))
    lease = dict(cloud_lease)
    lease["metadata"] = metadata
    lease["spec"] = spec
    return lease


class CloudLeaseWrites:
    """The leader's writes of pool lease states to the cloud leases, see the module
    docstring.

    :param pick_healthy_server: ``()`` → a healthy cloud server URL or None, asked for
        every write.
    :param cloud_client_for: ``(url)`` → the node-lease-proxy client of that server
        (borrowed: the caller owns and closes it).
    :param limit: the bound on chains in flight, sampled by every write that sent a
        request; ``in_flight()`` → the chains in flight now (the sampled one too).
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, pick_healthy_server: Callable[[], Optional[str]],
                 cloud_client_for: Callable[[str], IObjectClient], limit: AdaptiveLimit,
                 in_flight: Callable[[], int], lease_duration_seconds: int,
                 max_attempts: int, metrics: Optional[IDelegationMetrics]) -> None:
        self._reactor = reactor
        self._pick_healthy_server = pick_healthy_server
        self._cloud_client_for = cloud_client_for
        self.limit = limit
        self._in_flight = in_flight
        self.lease_duration_seconds = lease_duration_seconds
        self._max_attempts = max_attempts
        self._metrics = metrics
        # key -> (server, LeaseWriter): the writer of each lease on its last server.
        self._writers: Dict[str, Tuple[str, LeaseWriter]] = {}

    def __len__(self) -> int:
        return len(self._writers)

    def forget(self, key: str) -> None:
        """Lease ``key`` is not written for now: its next write reads the cloud first."""
        self._writers.pop(key, None)

    def clear(self) -> None:
        """A new term starts from what the cloud says, not from what was written before."""
        self._writers.clear()

    def write(self, key: str, pool_lease: dict,
              node: dict) -> defer.Deferred[Tuple[str, Optional[str]]]:
        """Write the cloud lease of ``pool_lease`` (key ``key``), owned by ``node``;
        fires with (``LeaseWriter``'s outcome, the server written to)."""
        server = self._pick_healthy_server()
        if server is None:
            return defer.fail(NoHealthyCloudServer("no healthy cloud server"))
        try:
            writer = self._writer(key, server)
        except Exception as error:
            return defer.fail(error)

        def change(current: Optional[dict]) -> dict:
            return self._cloud_lease_from(current, pool_lease, node)

        started = self._reactor.seconds()
        written = writer.write(change)
        written.addBoth(self._sampled, started)
        return written.addCallback(lambda write: (write.outcome, server))

    def _cloud_lease_from(self, current: Optional[dict], pool_lease: dict,
                          node: dict) -> dict:
        """The cloud lease one attempt of a delegation writes, over ``current`` (as
        read or last written; None: absent), stamped with this leader's time now: a
        conflict re-reads, and the next attempt exceeds, a renewTime someone else
        wrote meanwhile."""
        renew_time = stamped_renew_time(
            self._reactor.seconds(), ((current or {}).get("spec") or {}).get("renewTime"))
        if current is None:
            return lease_for_create(pool_lease, renew_time, self.lease_duration_seconds, node)
        return merged_cloud_lease(current, pool_lease, renew_time, self.lease_duration_seconds)

    def _sampled(self, result: Any, started: float) -> Any:
        """One sample of the cloud's latency for the bound on chains in flight (this
        chain still counts as in flight); a cancelled chain (the delegation stopping)
        says nothing of the cloud."""
        if not (isinstance(result, Failure) and result.check(defer.CancelledError)):
            limit = self.limit
            before = limit.limit
            limit.sample(started, self._in_flight(), not isinstance(result, Failure))
            if limit.limit != before:
                if self._metrics is not None:
                    self._metrics.set_delegation_limit(limit.limit)
                self.log.debug("heartbeat delegation: at most {limit} chains in flight "
                               "(was {before}), last chain {seconds:.3f}s, fastest of late "
                               "{baseline:.3f}s", limit=limit.limit, before=before,
                               seconds=self._reactor.seconds() - started,
                               baseline=limit.baseline)
        return result

    def _writer(self, key: str, server: str) -> LeaseWriter:
        """The lease writer of ``key`` on ``server``; a new one when the server changed."""
        known = self._writers.get(key)
        if known is not None and known[0] == server:
            return known[1]
        namespace, name = key.split("/", 1)
        writer = LeaseWriter(self._reactor, self._cloud_client_for(server), namespace, name,
                             attempts=self._max_attempts)
        self._writers[key] = (server, writer)
        return writer
