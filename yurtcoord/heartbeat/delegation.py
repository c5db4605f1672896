"""Heartbeat delegation: the pool leader forwards heartbeats of cut-off nodes to the cloud.

A node that lost the cloud but still reaches its pool writes its lease
``kube-node-lease/<node>`` to the coordinator apiserver with annotation
``openyurt.io/delegate-heartbeat: "true"``. The leader watches those leases and writes
each one to the cloud, so the cloud does not declare the node dead.

Only real pool members are kept alive. Every agent of a pool writes to the
coordinator apiserver with the same client certificate, so the coordinator cannot
tell who wrote a lease: the leader is the only place that can check it. A delegated
lease is forwarded only when

- it lives in ``kube-node-lease`` (reason ``namespace`` otherwise);
- it has a name and its ``holderIdentity`` is that name (``holder_mismatch``);
- its renewTime is at most ``max_clock_skew`` ahead of the leader's clock
  (``renew_time_in_future``): a renewTime an hour ahead would otherwise stay in the
  cloud and hide the node's death for that hour;
- its renewTime is at most ``heartbeat_interval`` + ``max_clock_skew`` old when it is
  written to the cloud (``stale``). The cloud takes a lease whose renewTime moved as a
  heartbeat seen at that moment, whatever time it names; a live node renews at least
  once an interval, so an older renewal means the node stopped renewing, and
  forwarding it late (a state queued while the cloud was unreachable, or an old
  lease a new leader lists) would keep a dead node alive for one more grace period.
  It is judged when the lease arrives and again before every write;
- its name is a cloud Node labelled ``apps.openyurt.io/nodepool=<pool>``. The leader
  keeps a label-selected informer of its pool's Nodes for this; until it has listed
  once, leases wait (they are not refused). A name missing from it is looked up once
  in the cloud to tell ``not_pool_member`` (a Node of another pool) from
  ``no_such_node``; should the Node join the pool later, its newest lease is
  forwarded then. A Node deleted or moved out of the pool stops the forwarding.

A refused lease is counted by reason and logged once per lease and reason. Only
``renewTime``, ``holderIdentity``, ``leaseDurationSeconds`` and the delegate annotation
of a pool lease ever reach the cloud; a lease created in the cloud gets an
ownerReference to its Node, as the kubelet's own lease has.

Per delegation (one pool lease state to the cloud), through ``LeaseWriter``:

- a healthy cloud server is picked for every delegation and the write goes through
  that server's node-lease-proxy client; one writer per lease and server remembers the
  cloud lease it wrote last, so a renewal is one update;
- absent: the lease is created; present: the pool's fields are set on it (other cloud
  annotations stay) and it is updated under its resourceVersion;
- a cloud renewTime at or after the pool's is left alone: a delegation never moves a
  cloud lease backwards, e.g. when the node already renewed it directly. That holds
  for plausible times only: a cloud renewTime beyond the leader's now plus
  ``max_clock_skew`` (left by an earlier forged forward) is overwritten;
- a conflict is re-read and retried, at most ``MAX_ATTEMPTS`` attempts in all.

Concurrency: leases of different nodes are delegated concurrently, but at most one
request chain per lease is in flight. How many chains run at once over all leases
follows the cloud's latency (``yurtcoord.tx.limiter.AdaptiveLimit``): it grows while
the chains finish about as fast as the fastest seen lately and more leases wait, and
shrinks when they fail or stay slow (not for one stall), between ``min_concurrent`` and
``max_concurrent``. A pool of 5,000 nodes renewing every 5 s offers 1,000 delegations
a second: a fixed bound of 16 chains holds that only while a chain takes under 16 ms.
Events arriving meanwhile only replace the remembered pending state of that lease
(newest renewTime wins), which runs when the chain finishes. A failed delegation (no
healthy cloud server, the cloud answering errors, conflicts to the end) is counted and
the newest state of that lease is retried after a capped backoff, so a heartbeat is not
lost until the next renewal.
"""

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

from yurtcoord.agent.config import format_duration
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.limiter import AdaptiveLimit
from yurtcoord.tx.retry import DELEGATION_RETRY, Retries
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IListWatchClient, IObjectClient
from yurtcoord.kube.lease import format_micro_time, owner_reference_to_node, parse_micro_time
from yurtcoord.kube.leasewriter import CREATED, UNCHANGED, UPDATED, LeaseWriter
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE, NODE_POOL_LABEL
from yurtcoord.role.roles import IRoleComponent
from yurtcoord.tx.observers import Observers
from yurtcoord.tx.workqueue import RetryPolicy, WorkQueue

MAX_ATTEMPTS = 5
# Chains in flight over all leases: they start at 16 and move with the cloud's latency
# between the bounds (the agent's cloud clients keep a connection for each chain up to
# the highest). The floor is that start: a chain's latency includes the leader's own
# reactor, which a burst of 5,000 listed leases keeps busy for seconds, and a bound
# that shrank below 16 for that made the initial burst 2-3x slower than a fixed 16 did.
DEFAULT_INITIAL_CONCURRENT = 16
DEFAULT_MIN_CONCURRENT = 16
DEFAULT_MAX_CONCURRENT = 128
# How much longer than twice the fastest chain of late a chain may take before the
# cloud counts as slowing down: a busy leader or cloud machine delays single answers
# by tens of milliseconds without the cloud being overloaded, and a bound that shrank
# on each of those would starve a large pool. Well within a heartbeat interval.
LATENCY_SLACK = 0.25
# How far ahead of the leader's clock a forwarded renewTime may be.
DEFAULT_MAX_CLOCK_SKEW = 5.0
# The only spec fields a pool lease gives its cloud lease.
FORWARDED_SPEC_FIELDS = ("holderIdentity", "leaseDurationSeconds", "renewTime")

# Why a delegated lease is not forwarded (label ``reason`` of the refused counter).
REFUSED_NAMESPACE = "namespace"
REFUSED_NOT_POOL_MEMBER = "not_pool_member"
REFUSED_NO_SUCH_NODE = "no_such_node"
REFUSED_HOLDER_MISMATCH = "holder_mismatch"
REFUSED_RENEW_TIME_IN_FUTURE = "renew_time_in_future"
REFUSED_STALE = "stale"
REFUSAL_REASONS = (REFUSED_NAMESPACE, REFUSED_NOT_POOL_MEMBER, REFUSED_NO_SUCH_NODE,
                   REFUSED_HOLDER_MISMATCH, REFUSED_RENEW_TIME_IN_FUTURE, REFUSED_STALE)
# The outcomes of a forwarded heartbeat a delegation observer is told (``LeaseWriter``'s);
# a refused one is told its reason, one of ``REFUSAL_REASONS``.
FORWARDED_OUTCOMES = (CREATED, UPDATED)
# The agents' ``[heartbeat] interval`` unless the caller names it.
DEFAULT_HEARTBEAT_INTERVAL = 10.0


class IDelegationMetrics(Interface):
    """What the delegation reports to the agent's metrics."""

    def observe_delegation(seconds: float, succeeded: bool) -> None:
        """One finished delegation, ``seconds`` after its pool event."""

    def count_delegation_refused(reason: str) -> None:
        """One delegated pool lease state not forwarded, for ``reason``."""

    def set_delegation_limit(limit: int) -> None:
        """How many delegations may run at once now (the bound follows the cloud)."""


def is_delegated(lease: Optional[dict]) -> bool:
    """Whether a pool lease asks the leader to forward it to the cloud."""
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true"


def lease_key(lease: Optional[dict]) -> str:
    """``namespace/name`` of a lease dict."""
    metadata = (lease or {}).get("metadata") or {}
    return f"{metadata.get('namespace') or NODE_LEASE_NAMESPACE}/{metadata.get('name')}"


def renew_time_of(lease: Optional[dict]) -> Optional[float]:
    """``spec.renewTime`` in POSIX seconds; None when absent or malformed."""
    value = ((lease or {}).get("spec") or {}).get("renewTime")
    if not value:
        return None
    try:
        return parse_micro_time(value)
    except (TypeError, ValueError):
        return None


def node_pool(node: dict) -> Optional[str]:
    """The pool a Node is labelled with, or None."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(NODE_POOL_LABEL)


def _forwarded_annotation(pool_lease: dict) -> Optional[str]:
    return ((pool_lease.get("metadata") or {}).get("annotations") or {}).get(
        DELEGATE_HEARTBEAT_ANNOTATION)


def lease_for_create(pool_lease: dict, node: Optional[dict] = None) -> dict:
    """The cloud lease to create for a pool lease: its name, the forwarded spec
    fields, the delegate annotation, and an ownerReference to ``node``."""
    source = pool_lease.get("metadata") or {}
    metadata = {"name": source["name"],
                "namespace": source.get("namespace") or NODE_LEASE_NAMESPACE,
                "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: _forwarded_annotation(pool_lease)}}
    owner = owner_reference_to_node(node)
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    spec = pool_lease.get("spec") or {}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {field: spec[field] for field in FORWARDED_SPEC_FIELDS if field in spec}}


def merged_cloud_lease(cloud_lease: dict, pool_lease: dict) -> dict:
    """The cloud lease carrying the pool lease's forwarded spec fields and delegate
    annotation; everything else of the cloud lease stays, its resourceVersion too, so
    the update is optimistic."""
    metadata = dict(cloud_lease.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations[DELEGATE_HEARTBEAT_ANNOTATION] = _forwarded_annotation(pool_lease)
    metadata["annotations"] = annotations
    spec = dict(cloud_lease.get("spec") or {})
    pool_spec = pool_lease.get("spec") or {}
    for field in FORWARDED_SPEC_FIELDS:
        if field in pool_spec:
            spec[field] = pool_spec[field]
    lease = dict(cloud_lease)
    lease["metadata"] = metadata
    lease["spec"] = spec
    return lease


class NoHealthyCloudServer(Exception):
    """No cloud server is healthy: the heartbeat cannot be forwarded now."""


class _Heartbeat:
    """One pool state of a lease waiting to be delegated, and since when the oldest
    state it replaced has been waiting (for the latency metric)."""

    __slots__ = ("lease", "renew_time", "since")

    def __init__(self, lease: dict, since: float, renew_time: Optional[float]) -> None:
        self.lease = lease
        # ``renew_time_of(lease)``, parsed once when the state arrived.
        self.renew_time = renew_time
        self.since = since


def _newest(old: _Heartbeat, new: _Heartbeat) -> _Heartbeat:
    """The state to forward of two states of one lease: ``new`` unless it renews
    earlier than ``old`` (a delegation never moves a lease backwards), waiting
    since the older of the two."""
    since = min(old.since, new.since)
    if old.renew_time is not None and (new.renew_time is None
                                       or new.renew_time < old.renew_time):
        return _Heartbeat(old.lease, since, old.renew_time)
    return _Heartbeat(new.lease, since, new.renew_time)


@implementer(IRoleComponent)
class HeartbeatDelegation:
    """The leader's component forwarding delegated node leases to the cloud.

    Collaborators, all passed in:

    - ``make_informer()`` → a fresh informer of the leases (all namespaces) on the
      coordinator apiserver, with ``add_handler(on_add, on_update, on_delete)``,
      ``start()`` and ``stop()`` (a new one per leadership term);
    - ``make_node_informer(label_selector)`` → a fresh informer of the cloud's Nodes
      matching ``label_selector``, with ``add_handler``, ``wait_for_sync()``,
      ``start()`` and ``stop()``;
    - ``node_client``: reads one cloud Node (``get(NODES, name)``), to tell why a
      name is not a pool member;
    - ``pick_healthy_server()`` → a healthy cloud server URL or None (the cloud
      health checker's), called for every delegation;
    - ``cloud_client_for(url)`` → the client of that cloud server using the
      node-lease-proxy certificate. Clients are borrowed: the caller owns and
      closes them;
    - ``pool``: the agent's ``[node] pool``; ``max_clock_skew``: seconds;
    - ``heartbeat_interval``: the pool's ``[heartbeat] interval`` in seconds; with
      ``max_clock_skew`` it bounds the age of a renewal that is still forwarded;
    - ``metrics``: optional, an ``IDelegationMetrics``;
    - ``make_backoff()`` → a ``yurtcoord.tx.retry.Retries`` for the retries of one lease.

    The chains in flight over all leases (others wait in a FIFO queue) start at
    ``DEFAULT_INITIAL_CONCURRENT`` and follow the cloud's latency between ``min_concurrent`` and
    ``max_concurrent`` (``concurrency_limit``); every chain that sent a request to the
    cloud is one sample of it.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, make_informer: Callable[[], IInformer],
                 make_node_informer: Callable[[str], IInformer], node_client: IObjectClient,
                 pick_healthy_server: Callable[[], Optional[str]],
                 cloud_client_for: Callable[[str], IObjectClient],
                 pool: str, max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
                 metrics: Optional[IDelegationMetrics] = None,
                 make_backoff: Optional[Callable[[], RetryPolicy]] = None,
                 max_attempts: int = MAX_ATTEMPTS,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
                 min_concurrent: int = DEFAULT_MIN_CONCURRENT) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if min_concurrent < 1:
            raise ValueError("min_concurrent must be at least 1")
        if not pool:
            raise ValueError("heartbeat delegation needs the name of its node pool")
        self._reactor = reactor
        self._make_informer = make_informer
        self._make_node_informer = make_node_informer
        self._node_client = node_client
        self._pick_healthy_server = pick_healthy_server
        self._cloud_client_for = cloud_client_for
        self.pool = pool
        self.max_clock_skew = max_clock_skew
        self.heartbeat_interval = heartbeat_interval
        self._metrics = metrics
        self._max_attempts = max_attempts
        self._informer: Optional[IInformer] = None
        self._node_informer: Optional[IInformer] = None
        minimum = min(min_concurrent, max_concurrent)
        self._limit = AdaptiveLimit(
            reactor, max(minimum, min(DEFAULT_INITIAL_CONCURRENT, max_concurrent)),
            minimum, max_concurrent, slack=LATENCY_SLACK)
        if metrics is not None:
            metrics.set_delegation_limit(self._limit.limit)
        # One chain per lease, the newest state pending, per-lease backoff.
        self._queue: WorkQueue[str, _Heartbeat] = WorkQueue(
            reactor, self._delegate_state, _newest,
            make_backoff or (lambda: Retries(DELEGATION_RETRY)),
            max_concurrent=self._limit, on_success=self._delegated,
            on_failure=self._delegation_failed)
        # key -> (server, LeaseWriter): the writer of each lease on its last server.
        self._writers: Dict[str, Tuple[str, LeaseWriter]] = {}
        self._cloud_unavailable = False
        self._running = False
        # The pool's Nodes by name, once the node informer listed; leases offered
        # before that wait in ``_waiting`` (key -> newest lease).
        self._nodes: Dict[str, dict] = {}
        self._nodes_synced = False
        self._waiting: Dict[str, dict] = {}
        # Node name -> reason, for names found missing from the pool by a cloud read;
        # name -> Deferred of that read while it runs.
        self._absent: Dict[str, str] = {}
        self._classifying: Dict[str, defer.Deferred[Any]] = {}
        # Node name -> the newest delegated lease refused because its Node was not
        # in the pool: forwarded if the Node shows up in the pool after all.
        self._parked: Dict[str, dict] = {}
        # (key, reason) pairs already logged.
        self._logged: Set[Tuple[str, str]] = set()
        # Counters for /status and tests; they survive leadership terms.
        self.delegated = 0
        self.created = 0
        self.skipped = 0
        self.failures = 0
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self._observers: Observers[[str, str]] = Observers(
            f"heartbeat delegations of pool {pool}")

    @classmethod
    def for_coordinator(cls, reactor: IReactorTime, coordinator_client: IListWatchClient,
                        cloud_reader: Any, cloud_health: ICloudHealthChecker,
                        cloud_client_for: Callable[[str], IObjectClient], pool: str,
                        **options: Any) -> "HeartbeatDelegation":
        """The delegation as an agent runs it: an ``Informer`` of the leases on the
        coordinator apiserver, an ``Informer`` of the pool's Nodes read through
        ``cloud_reader`` (a client of whichever cloud server is healthy), and the
        cloud health checker's pick."""
        def make_informer() -> IInformer:
            return Informer(reactor, coordinator_client, LEASES)

        def make_node_informer(label_selector: str) -> IInformer:
            return Informer(reactor, cloud_reader, NODES, label_selector=label_selector)

        return cls(reactor, make_informer, make_node_informer, cloud_reader,
                   cloud_health.pick_healthy_server, cloud_client_for, pool, **options)

    # -- observers ---------------------------------------------------------------

    def add_delegation_observer(self, observer: Callable[[str, str], object]) -> None:
        """Call ``observer(node, outcome)`` once for each delegated heartbeat of
        ``node`` written to the cloud (outcome ``created`` or ``updated``, see
        ``FORWARDED_OUTCOMES``) and once for each one refused (outcome the reason, one
        of ``REFUSAL_REASONS``), in the turn it happens. A state the cloud already had
        (``skipped``) is neither. A failing observer is logged and changes nothing."""
        self._observers.add(observer)

    # -- what /status reads ------------------------------------------------------

    @property
    def delegated_heartbeats(self) -> int:
        """Heartbeats written to the cloud (created or updated) so far."""
        return self.delegated

    @property
    def running(self) -> bool:
        return self._running

    @property
    def in_flight(self) -> int:
        """How many lease delegations are running right now."""
        return self._queue.in_flight

    @property
    def concurrency_limit(self) -> int:
        """How many lease delegations may run at once now."""
        return self._limit.limit

    @property
    def queued(self) -> int:
        """How many leases wait for a free request slot."""
        return self._queue.queued

    @property
    def pool_nodes_listed(self) -> bool:
        """Whether this term's informer of the pool's Nodes has listed once."""
        return self._nodes_synced

    # -- IRoleComponent ----------------------------------------------------------

    def start(self, store: object = None) -> defer.Deferred[None]:
        """Watch the pool's Nodes in the cloud and the leases on the coordinator; the
        lease informer's initial list offers every currently delegated lease at once
        (forwarded once the Nodes are listed). The pool store is not used."""
        if self._running:
            return defer.succeed(None)
        self._running = True
        nodes = self._make_node_informer(f"{NODE_POOL_LABEL}={self.pool}")
        nodes.add_handler(self._on_node, lambda _old, new: self._on_node(new),
                          self._on_node_gone, filter=self._in_pool)
        self._node_informer = nodes
        nodes.wait_for_sync().addCallback(self._nodes_listed, nodes)
        informer = self._make_informer()
        informer.add_handler(self._on_add, self._on_update, self._on_delete)
        self._informer = informer
        self.log.info("heartbeat delegation started for pool {pool}", pool=self.pool)
        started = defer.maybeDeferred(nodes.start)
        started.addCallback(lambda _: informer.start())
        started.addErrback(self._start_failed, informer)
        return started

    def _start_failed(self, failure: Failure, informer: IInformer) -> Failure:
        if informer is self._informer:
            self._running = False
            self._informer = None
            nodes, self._node_informer = self._node_informer, None
            if nodes is not None:
                defer.maybeDeferred(nodes.stop).addErrback(lambda _: None)
            self._cancel_all()
        self.log.warn("heartbeat delegation could not start: {error}",
                      error=failure.getErrorMessage())
        return failure

    def stop(self) -> defer.Deferred[None]:
        """Stop watching and cancel every request and timer, in this reactor turn."""
        self._running = False
        informers = [self._informer, self._node_informer]
        self._informer = self._node_informer = None
        chains, cancelled = self._cancel_all()
        waits: List[defer.Deferred[Any]] = []
        for informer in informers:
            if informer is not None:
                stopped = defer.maybeDeferred(informer.stop)
                stopped.addErrback(lambda f: self.log.warn(
                    "stopping an informer of the heartbeat delegation failed: {error}",
                    error=f.getErrorMessage()))
                waits.append(stopped)
        self.log.info("heartbeat delegation stopped, cancelled={cancelled}", cancelled=cancelled)
        return defer.DeferredList(waits + [chains], consumeErrors=True).addCallback(lambda _: None)

    def _cancel_all(self) -> Tuple[defer.Deferred[None], int]:
        """Cancel every chain, retry and lookup; returns the Deferred of the
        cancelled chains and how many there were."""
        cancelled = self._queue.in_flight
        chains = self._queue.stop()
        # A new term starts from what the cloud says, not from what we wrote before.
        self._writers.clear()
        self._nodes.clear()
        self._nodes_synced = False
        self._waiting.clear()
        self._absent.clear()
        self._parked.clear()
        self._logged.clear()
        classifying, self._classifying = self._classifying, {}
        for lookup in classifying.values():
            lookup.cancel()
        return chains, cancelled

    # -- the pool's Nodes ----------------------------------------------------------

    def _in_pool(self, node: dict) -> bool:
        return node_pool(node) == self.pool

    def _nodes_listed(self, synced: bool, informer: IInformer) -> None:
        if not synced or informer is not self._node_informer or not self._running:
            return
        self._nodes_synced = True
        waiting, self._waiting = self._waiting, {}
        self.log.info("heartbeat delegation: {count} nodes in pool {pool}, "
                      "{waiting} delegated leases waited for the list",
                      count=len(self._nodes), pool=self.pool, waiting=len(waiting))
        for lease in waiting.values():
            self._offer(lease)

    def _on_node(self, node: dict) -> None:
        if not self._running:
            return
        name = _name_of(node)
        self._nodes[name] = node
        self._absent.pop(name, None)
        parked = self._parked.pop(name, None)
        if parked is not None and self._nodes_synced:
            self._offer(parked)

    def _on_node_gone(self, node: dict) -> None:
        """A pool Node deleted or moved out of the pool: its heartbeats stop here."""
        if not self._running:
            return
        name = _name_of(node)
        self._nodes.pop(name, None)
        self._absent.pop(name, None)
        key = f"{NODE_LEASE_NAMESPACE}/{name}"
        self._writers.pop(key, None)
        self._forget_pending(key)
        self._waiting.pop(key, None)

    # -- informer events ---------------------------------------------------------

    def _on_add(self, lease: dict) -> None:
        self._offer(lease)

    def _on_update(self, old: dict, new: dict) -> None:
        self._offer(new)

    def _on_delete(self, lease: dict) -> None:
        if not self._running:
            return
        key = lease_key(lease)
        self._writers.pop(key, None)
        self._waiting.pop(key, None)
        self._unpark(lease)
        self._logged = {logged for logged in self._logged if logged[0] != key}
        self._forget_pending(key)

    def _offer(self, lease: dict) -> None:
        if not self._running:
            return
        key = lease_key(lease)
        if not is_delegated(lease):
            # The node writes to the cloud itself again: an older delegated state
            # must not be forwarded any more.
            self._writers.pop(key, None)
            self._waiting.pop(key, None)
            self._unpark(lease)
            self._forget_pending(key)
            return
        renewed = renew_time_of(lease)
        refusal = self._refusal(lease, renewed)
        if refusal is not None:
            self._refuse(key, *refusal)
            return
        if not self._nodes_synced:
            waiting = self._waiting.get(key)
            if waiting is None or _newer_or_equal(lease, waiting):
                self._waiting[key] = lease
            return
        name = lease["metadata"]["name"]
        if name not in self._nodes:
            parked = self._parked.get(name)
            if parked is None or _newer_or_equal(lease, parked):
                self._parked[name] = lease
            self._not_in_pool(key, name)
            return
        self._parked.pop(name, None)
        self._accept(key, lease, renewed)

    def _unpark(self, lease: dict) -> None:
        """Forget the parked state of ``lease``'s name if it is this lease's."""
        name = _name_of(lease)
        parked = self._parked.get(name)
        if parked is not None and lease_key(parked) == lease_key(lease):
            del self._parked[name]

    def _refusal(self, lease: dict, renewed: Optional[float]) -> Optional[Tuple[str, str]]:
        """(reason, detail) when the lease itself says it must not be forwarded;
        ``renewed``: its renewTime (``renew_time_of``)."""
        metadata = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        namespace = metadata.get("namespace")
        if namespace != NODE_LEASE_NAMESPACE:
            return REFUSED_NAMESPACE, f"namespace {namespace!r} is not {NODE_LEASE_NAMESPACE}"
        holder = spec.get("holderIdentity")
        name = metadata.get("name")
        if not name:
            # Names no node; an absent holderIdentity would otherwise equal it.
            return REFUSED_HOLDER_MISMATCH, "the lease has no name"
        if holder != name:
            return REFUSED_HOLDER_MISMATCH, f"holderIdentity {holder!r} is not the lease's name"
        ahead = None if renewed is None else renewed - self._reactor.seconds()
        if ahead is not None and ahead > self.max_clock_skew:
            return REFUSED_RENEW_TIME_IN_FUTURE, (
                f"renewTime {spec.get('renewTime')} is {ahead:.1f}s ahead of this leader's "
                f"clock (max_clock_skew {format_duration(self.max_clock_skew)})")
        return self._staleness(lease, renewed)

    def _staleness(self, lease: dict, renewed: Optional[float]) -> Optional[Tuple[str, str]]:
        """(reason, detail) when the lease's renewTime, ``renewed``, is too old to be
        forwarded now."""
        if renewed is None:
            return None
        age = self._reactor.seconds() - renewed
        limit = self.heartbeat_interval + self.max_clock_skew
        if age <= limit:
            return None
        return REFUSED_STALE, (
            f"renewTime {lease['spec'].get('renewTime')} is {age:.1f}s old, more than the "
            f"heartbeat interval {format_duration(self.heartbeat_interval)} + max_clock_skew "
            f"{format_duration(self.max_clock_skew)}: the node stopped renewing")

    def _not_in_pool(self, key: str, name: str) -> None:
        """A delegated lease whose name is not a Node of the pool: refused; a cloud
        read of the Node, once per name, says why."""
        self._forget_pending(key)
        reason = self._absent.get(name)
        if reason is not None:
            self._refuse(key, reason, _absent_detail(reason, name, self.pool))
            return
        if name in self._classifying:
            return
        lookup = defer.maybeDeferred(self._node_client.get, NODES, name)
        self._classifying[name] = lookup
        lookup.addBoth(self._classified, key, name, lookup)

    def _classified(self, result: Any, key: str, name: str,
                    lookup: defer.Deferred[Any]) -> None:
        if self._classifying.get(name) is not lookup:
            return None  # stopped meanwhile
        del self._classifying[name]
        if name in self._nodes:
            return None  # listed meanwhile (the parked lease was offered again)
        if isinstance(result, Failure):
            if not result.check(NotFound):
                self.log.debug("reading node {node} failed: {error}", node=name,
                               error=describe_failure(result))
                return None  # not known why: the next renewal asks again
            reason = REFUSED_NO_SUCH_NODE
        elif self._in_pool(result):
            return None  # in the pool, not yet seen by the informer: parked till then
        else:
            reason = REFUSED_NOT_POOL_MEMBER
        self._absent[name] = reason
        self._refuse(key, reason, _absent_detail(reason, name, self.pool))
        return None

    def _refuse(self, key: str, reason: str, detail: str) -> None:
        self._forget_pending(key)
        self._count_refusal(key, reason, detail)

    def _count_refusal(self, key: str, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        if self._metrics is not None:
            self._metrics.count_delegation_refused(reason)
        self._observers.notify(key.partition("/")[2], reason)
        if (key, reason) not in self._logged:
            self._logged.add((key, reason))
            self.log.warn("heartbeat lease {lease} not forwarded to the cloud "
                          "(reason={reason}): {detail}", lease=key, reason=reason,
                          detail=detail)

    def _accept(self, key: str, lease: dict, renewed: Optional[float]) -> None:
        self._queue.add(key, _Heartbeat(lease, self._reactor.seconds(), renewed))

    def _forget_pending(self, key: str) -> None:
        self._queue.forget(key)

    # -- one chain per lease (the queue runs them) ---------------------------------

    def _delegate_state(self, key: str, state: _Heartbeat
                        ) -> defer.Deferred[Tuple[str, Optional[str]]]:
        return self._delegate(key, state.lease, state.renew_time)

    def _delegated(self, key: str, state: _Heartbeat, result: Tuple[str, Optional[str]],
                   failures: int) -> None:
        seconds = max(0.0, self._reactor.seconds() - state.since)
        if self._metrics is not None:
            self._metrics.observe_delegation(seconds, True)
        outcome, server = result
        if self._cloud_unavailable:
            self._cloud_unavailable = False
            self.log.info("heartbeat delegations reach the cloud again via {server}",
                          server=server)
        if failures:
            self.log.info("heartbeat delegation of {lease} recovered after {failures} failures",
                          lease=key, failures=failures)
        if outcome == UNCHANGED:
            self.skipped += 1
        else:
            self.delegated += 1
            if outcome == CREATED:
                self.created += 1
            self._observers.notify(key.partition("/")[2], outcome)
        # No log event per forwarded heartbeat: a large pool forwards a thousand a
        # second, and the metrics count and time each one.

    def _delegation_failed(self, key: str, state: _Heartbeat, failure: Failure,
                           failures: int, delay: float) -> None:
        """Counted; the queue retries the newest state of the lease after ``delay``."""
        self.failures += 1
        if self._metrics is not None:
            self._metrics.observe_delegation(
                max(0.0, self._reactor.seconds() - state.since), False)
        # One line per outage, not one per node and retry: a cut cloud fails every
        # lease every few seconds.
        if failure.check(NoHealthyCloudServer) and not self._cloud_unavailable:
            self._cloud_unavailable = True
            self.log.warn("no healthy cloud server: heartbeat delegations wait and retry")
        if failures == 1 and not failure.check(NoHealthyCloudServer):
            self.log.warn("heartbeat delegation of {lease} failed: {error}; retry in {delay:.2f}s",
                          lease=key, error=describe_failure(failure), delay=delay)
        else:
            self.log.debug("heartbeat delegation of {lease} failed again: {error}; "
                           "retry in {delay:.2f}s", lease=key, error=describe_failure(failure),
                           delay=delay)

    def _delegate(self, key: str, pool_lease: dict, pool_renewed: Optional[float]
                  ) -> defer.Deferred[Tuple[str, Optional[str]]]:
        """One delegation of ``pool_lease``, renewed at ``pool_renewed``; fires with
        (outcome, server), outcome being ``LeaseWriter``'s created, updated or
        unchanged."""
        node = self._nodes.get(pool_lease["metadata"]["name"])
        if pool_renewed is None or node is None:
            return defer.succeed((UNCHANGED, None))
        stale = self._staleness(pool_lease, pool_renewed)
        if stale is not None:
            # Queued while the cloud was unreachable, and too old by now. The chain
            # ends as a no-op; a newer state of the lease (if any) runs after it.
            self._count_refusal(key, *stale)
            return defer.succeed((UNCHANGED, None))
        server = self._pick_healthy_server()
        if server is None:
            return defer.fail(NoHealthyCloudServer("no healthy cloud server"))
        try:
            writer = self._writer(key, server)
        except Exception as error:
            return defer.fail(error)

        def change(current: Optional[dict]) -> Optional[dict]:
            if current is None:
                return lease_for_create(pool_lease, node)
            cloud_renewed = renew_time_of(current)
            if cloud_renewed is not None and cloud_renewed >= pool_renewed:
                if cloud_renewed <= self._reactor.seconds() + self.max_clock_skew:
                    return None  # never backwards
                self.log.info("cloud lease {lease} had renewTime {renew_time}, beyond this "
                              "leader's clock; replaced by {pool_renew_time}", lease=key,
                              renew_time=format_micro_time(cloud_renewed),
                              pool_renew_time=format_micro_time(pool_renewed))
            return merged_cloud_lease(current, pool_lease)

        started = self._reactor.seconds()
        written = writer.write(change)
        written.addBoth(self._sampled, started)
        return written.addCallback(lambda write: (write.outcome, server))

    def _sampled(self, result: Any, started: float) -> Any:
        """One sample of the cloud's latency for the bound on chains in flight (this
        chain still counts as in flight); a cancelled chain (the delegation stopping)
        says nothing of the cloud."""
        if not (isinstance(result, Failure) and result.check(defer.CancelledError)):
            before = self._limit.limit
            self._limit.sample(started, self._queue.in_flight,
                               not isinstance(result, Failure))
            if self._limit.limit != before:
                if self._metrics is not None:
                    self._metrics.set_delegation_limit(self._limit.limit)
                self.log.debug("heartbeat delegation: at most {limit} chains in flight "
                               "(was {before}), last chain {seconds:.3f}s, fastest of late "
                               "{baseline:.3f}s", limit=self._limit.limit, before=before,
                               seconds=self._reactor.seconds() - started,
                               baseline=self._limit.baseline)
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


def _name_of(obj: dict) -> str:
    """``metadata.name`` of an object, "" when it has none (no lease of that name is
    ever accepted)."""
    return str((obj.get("metadata") or {}).get("name") or "")


def _newer_or_equal(lease: dict, than: dict) -> bool:
    renewed, other = renew_time_of(lease), renew_time_of(than)
    return other is None or (renewed is not None and renewed >= other)


def _absent_detail(reason: str, name: str, pool: str) -> str:
    if reason == REFUSED_NOT_POOL_MEMBER:
        return f"node {name} is not labelled {NODE_POOL_LABEL}={pool}"
    return f"the cloud has no node {name}"
