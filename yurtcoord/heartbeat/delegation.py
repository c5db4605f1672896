"""Heartbeat delegation: the pool leader forwards heartbeats of cut-off nodes to the cloud.

A node that lost the cloud but still reaches its pool writes its lease
``kube-node-lease/<node>`` to the coordinator apiserver with annotation
``openyurt.io/delegate-heartbeat: "true"``. The leader watches those leases and, each
time it sees one of them change, renews that node's lease in the cloud, so the cloud
does not declare the node dead.

No clock but the leader's own decides anything here (docs/design.md, "Clocks"). Edge
nodes cut off from the cloud lose NTP and drift, and some boot minutes or years off,
so the renewTime a node writes cannot be compared with the leader's clock. The leader
judges a pool lease as the node lifecycle controller judges a cloud lease and
client-go's leader election its lease, by seeing it change:

- a change is an event of the lease informer whose renewTime or resourceVersion
  differs from the state the leader saw last (a lease created while it watches is
  one). The leases it lists as its term starts are not changes it saw, and are not
  forwarded until they change: a live node renews within one interval;
- the heartbeat is the moment the leader saw the change, so the cloud lease gets the
  leader's time: ``renewTime = max(leader's now, cloud renewTime + 1 µs)``. The cloud's
  renewTime strictly increases however far apart the clocks of the node, this leader
  and earlier leaders are, and the node lifecycle controller counts a renewal only
  when it does. ``leaseDurationSeconds`` is the agent's own node lease duration
  (``NODE_LEASE_DURATION_SECONDS``) and ``holderIdentity`` the node's name (the holder
  check below makes it the lease's holder); no value of the pool lease's spec reaches
  the cloud;
- a state the leader saw more than ``heartbeat_interval`` ago by its own clock is not
  written (reason ``expired``): a live node renews at least once an interval, and a
  newer state would have replaced it, so the node stopped renewing (e.g. a state held
  back while the cloud was unreachable, or retried after a backoff). A node whose
  kubelet dies stops renewing its pool lease after the kubelet grace period, so its
  cloud renewTime stops increasing within that grace plus one interval.

Only real pool members are kept alive. Each agent writes to the coordinator
apiserver as its node (the kubelet's certificate), and the coordinator lets a node
write only its own lease (the Node authorizer and NodeRestriction): that is the
first line. The leader's checks are the second, for what reaches the pool's store
around that rule (a coordinator run without it, a write straight into the pool
etcd). A delegated lease is forwarded only when

- it lives in ``kube-node-lease`` (reason ``namespace`` otherwise);
- it has a name and its ``holderIdentity`` is that name (``holder_mismatch``);
- its name is a cloud Node labelled ``apps.openyurt.io/nodepool=<pool>``. The leader
  keeps a label-selected informer of its pool's Nodes for this; until it has listed
  once, leases wait (they are not refused): the newest state of each, of at most
  ``MAX_WAITING`` leases; above that, the lease renewed least recently makes room
  (uncounted, its number logged once the list is in), as its state is the first to
  grow too old to write and a live node renews again within one interval. A lease
  whose name the informer does not hold is counted (``not_pool_member``, or
  ``no_such_node`` when a cloud read found no such Node) and dropped, not kept for
  a later join: should the Node join the pool, its next change is forwarded. A
  Node deleted or moved out of the pool stops the forwarding.

Anyone who may write leases to the coordinator apiserver can make up names by the
ten thousand, so what such a name costs is bounded whatever their number. The
cloud is read about names the informer does not hold (to tell a Node of another
pool from none, and to catch a pool Node the informer has not delivered yet) at most
``ABSENT_NAMES`` times per ``ABSENT_NAMES_TTL`` and ``MAX_NODE_READS`` at once; an
answer is remembered for ``ABSENT_NAMES_TTL`` (at most ``ABSENT_NAMES`` names, least
recently used first out), and a remembered name is dropped without a read. A name
beyond that budget is dropped without a read as ``not_pool_member``. Parked, that
is kept until the informer delivers its Node, is only the newest state of a lease
whose read runs, or whose Node the cloud answered is in the pool: at most one per
pool member, plus one per read in flight.

A refused lease is counted by reason. One whose name is a Node of the pool is
logged once per lease and reason; the others are logged together (how many, by
reason, and a few of the leases), at most once per ``SUMMARY_PERIOD``. Of a pool
lease only its name and the delegate annotation reach the cloud; a lease created in
the cloud gets an ownerReference to its Node, as the kubelet's own lease has.

Per delegation (one pool lease state to the cloud), through ``LeaseWriter``:

- a healthy cloud server is picked for every delegation and the write goes through
  that server's node-lease-proxy client; one writer per lease and server remembers the
  cloud lease it wrote last, so a renewal is one update;
- absent: the lease is created; present: renewTime, holderIdentity,
  leaseDurationSeconds and the delegate annotation are set on it (other cloud
  annotations stay) and it is updated under its resourceVersion. The renewTime is
  stamped by the attempt that writes, from the cloud lease that attempt read, so it
  also exceeds a renewal the node or another leader wrote meanwhile;
- a conflict is re-read and retried, at most ``MAX_ATTEMPTS`` attempts in all.

Concurrency: leases of different nodes are delegated concurrently, but at most one
request chain per lease is in flight. How many chains run at once over all leases
follows the cloud's latency (``yurtcoord.tx.limiter.AdaptiveLimit``): it grows while
the chains finish about as fast as the fastest seen lately and more leases wait, and
shrinks when they fail or stay slow (not for one stall), between ``min_concurrent`` and
``max_concurrent``. A pool of 5,000 nodes renewing every 5 s offers 1,000 delegations
a second: a fixed bound of 16 chains holds that only while a chain takes under 16 ms.
Changes seen meanwhile only replace the remembered pending state of that lease (the
one seen last wins), which runs when the chain finishes. A failed delegation (no
healthy cloud server, the cloud answering errors, conflicts to the end) is counted and
the newest state of that lease is retried after a capped backoff while it is fresh, so
a heartbeat is not lost until the next renewal.
"""

from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

from yurtcoord.agent.config import format_duration
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.limiter import AdaptiveLimit
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.retry import DELEGATION_RETRY, RetryPolicy
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker
from yurtcoord.heartbeat.probes import NODE_LEASE_DURATION_SECONDS
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IListWatchClient, IObjectClient
from yurtcoord.kube.lease import owner_reference_to_node, stamped_renew_time
from yurtcoord.kube.leasewriter import CREATED, UNCHANGED, UPDATED, LeaseWriter
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE, NODE_POOL_LABEL
from yurtcoord.role.roles import IRoleComponent
from yurtcoord.tx.observers import Observers
from yurtcoord.tx.workqueue import WorkQueue

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
# The spec fields the leader sets on a cloud lease; their values are its own.
CLOUD_SPEC_FIELDS = ("holderIdentity", "leaseDurationSeconds", "renewTime")

# Why a delegated lease is not forwarded (label ``reason`` of the refused counter).
REFUSED_NAMESPACE = "namespace"
REFUSED_NOT_POOL_MEMBER = "not_pool_member"
REFUSED_NO_SUCH_NODE = "no_such_node"
REFUSED_HOLDER_MISMATCH = "holder_mismatch"
REFUSED_EXPIRED = "expired"
REFUSAL_REASONS = (REFUSED_NAMESPACE, REFUSED_NOT_POOL_MEMBER, REFUSED_NO_SUCH_NODE,
                   REFUSED_HOLDER_MISMATCH, REFUSED_EXPIRED)
# The outcomes of a forwarded heartbeat a delegation observer is told (``LeaseWriter``'s);
# a refused one is told its reason, one of ``REFUSAL_REASONS``.
FORWARDED_OUTCOMES = (CREATED, UPDATED)
# The agents' ``[heartbeat] interval`` unless the caller names it.
DEFAULT_HEARTBEAT_INTERVAL = 10.0

# What a delegated lease whose name is not a Node of the pool may cost the leader,
# whatever the number of such names (anyone writing to the coordinator apiserver can
# make up as many as it likes). The cloud is read about such names at most
# ABSENT_NAMES times per ABSENT_NAMES_TTL, MAX_NODE_READS at once; each answer is
# remembered for ABSENT_NAMES_TTL (at most ABSENT_NAMES of them, least recently used
# forgotten first), and a name remembered is dropped without a read. A misconfigured
# node renewing every interval costs one cloud read a minute.
ABSENT_NAMES = 512
ABSENT_NAMES_TTL = 60.0
MAX_NODE_READS = 4
# Delegated leases waiting for the first list of the pool's Nodes: the newest state
# of at most this many names (a pool of 5,000 nodes twice over); above it, a new name
# pushes out the name whose newest state the leader saw earliest.
MAX_WAITING = 10_000
# Refusals of leases whose names are not known Nodes of the pool are logged together,
# at most once per SUMMARY_PERIOD, naming at most SUMMARY_EXAMPLES of the leases.
SUMMARY_PERIOD = 60.0
SUMMARY_EXAMPLES = 5


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


def node_pool(node: dict) -> Optional[str]:
    """The pool a Node is labelled with, or None."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(NODE_POOL_LABEL)


def seen_state(lease: Optional[dict]) -> Tuple[Any, Any]:
    """What tells two states of a pool lease apart: its renewTime, as written, and its
    resourceVersion. States are only compared with each other, never with a clock."""
    lease = lease or {}
    return ((lease.get("spec") or {}).get("renewTime"),
            (lease.get("metadata") or {}).get("resourceVersion"))




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


class NoHealthyCloudServer(Exception):
    """No cloud server is healthy: the heartbeat cannot be forwarded now."""


class _Heartbeat:
    """One state of a pool lease on its way to the cloud: when the leader saw it (its
    own clock: the moment of the heartbeat, which bounds how late it may still be
    written), and since when the oldest state it replaced has been waiting (for the
    latency metric)."""

    __slots__ = ("lease", "seen", "since")

    def __init__(self, lease: dict, seen: float, since: float) -> None:
        self.lease = lease
        self.seen = seen
        self.since = since


class _AbsentNames:
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


def _newest(old: _Heartbeat, new: _Heartbeat) -> _Heartbeat:
    """The state to forward of two states of one lease: the one seen last, waiting
    since the older of the two."""
    return _Heartbeat(new.lease, max(old.seen, new.seen), min(old.since, new.since))


@implementer(IRoleComponent)
class HeartbeatDelegation:
    """The leader's component forwarding delegated node leases to the cloud.

    Collaborators, all passed in:

    - ``make_informer()`` → a fresh informer of the leases in ``kube-node-lease`` on the
      coordinator apiserver, with ``add_handler(on_add, on_update, on_delete)``,
      ``has_synced`` (what it delivers before is its first list: where the term
      starts, no change), ``start()`` and ``stop()`` (a new one per leadership term);
    - ``make_node_informer(label_selector)`` → a fresh informer of the cloud's Nodes
      matching ``label_selector``, with ``add_handler``, ``wait_for_sync()``,
      ``start()`` and ``stop()``;
    - ``node_client``: reads one cloud Node (``get(NODES, name)``), to tell why a
      name is not a pool member (``absent_names`` reads per ``absent_names_ttl``
      seconds at most, ``max_node_reads`` at once; each answer remembered as long);
    - ``pick_healthy_server()`` → a healthy cloud server URL or None (the cloud
      health checker's), called for every delegation;
    - ``cloud_client_for(url)`` → the client of that cloud server using the
      node-lease-proxy certificate. Clients are borrowed: the caller owns and
      closes them;
    - ``pool``: the agent's ``[node] pool``;
    - ``heartbeat_interval``: the pool's ``[heartbeat] interval`` in seconds: a state
      seen longer ago is not written any more;
    - ``lease_duration_seconds``: the ``leaseDurationSeconds`` of the cloud leases it
      writes, the agents' own node lease duration unless named;
    - ``metrics``: optional, an ``IDelegationMetrics``;
    - ``retry_policy``: the pauses between the retries of one lease (``yurtcoord.tx.retry``);
    - ``max_waiting``: how many leases may wait for the first list of the Nodes.

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
                 pool: str, metrics: Optional[IDelegationMetrics] = None,
                 retry_policy: RetryPolicy = DELEGATION_RETRY,
                 max_attempts: int = MAX_ATTEMPTS,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
                 min_concurrent: int = DEFAULT_MIN_CONCURRENT,
                 lease_duration_seconds: int = NODE_LEASE_DURATION_SECONDS,
                 absent_names: int = ABSENT_NAMES, absent_names_ttl: float = ABSENT_NAMES_TTL,
                 max_node_reads: int = MAX_NODE_READS, max_waiting: int = MAX_WAITING) -> None:
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
        self.heartbeat_interval = heartbeat_interval
        self.lease_duration_seconds = lease_duration_seconds
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
            retry_policy,
            max_concurrent=self._limit, on_success=self._delegated,
            on_failure=self._delegation_failed, loop_errors=ILoopErrors(metrics, None))
        # key -> (server, LeaseWriter): the writer of each lease on its last server.
        self._writers: Dict[str, Tuple[str, LeaseWriter]] = {}
        self._cloud_unavailable = False
        self._running = False
        # The pool's Nodes by name, once the node informer listed; states seen
        # before that wait in ``_waiting`` (key -> the state seen last, the one seen
        # earliest first), at most ``max_waiting`` keys.
        self._nodes: Dict[str, dict] = {}
        self._nodes_synced = False
        self._waiting: "OrderedDict[str, _Heartbeat]" = OrderedDict()
        self._max_waiting = max(1, max_waiting)
        self._waiting_dropped = 0
        # Names found missing from the pool by a cloud read, and that read's budget;
        # name -> Deferred of such a read while it runs, at most ``max_node_reads``.
        self._absent = _AbsentNames(reactor, max(1, absent_names), absent_names_ttl)
        self._classifying: Dict[str, defer.Deferred[Any]] = {}
        self._max_node_reads = max(1, max_node_reads)
        # Node name -> the state seen last of a delegated lease whose name the Node
        # informer does not hold, while a cloud read of that name runs or after the
        # cloud answered that the Node is in the pool (the informer lags): forwarded
        # when the informer delivers the Node (if the state is still fresh then). At
        # most one per Node of the pool, plus one per read in flight.
        self._parked: Dict[str, _Heartbeat] = {}
        # Refusals logged of leases whose names are Nodes of the pool: name ->
        # {(key, reason)}, each logged once. Refusals of other names are summed up
        # in ``_dropped`` (reason -> count) with a few of their keys, and logged at
        # most once per ``SUMMARY_PERIOD``.
        self._logged: Dict[str, Set[Tuple[str, str]]] = {}
        self._dropped: Dict[str, int] = {}
        self._dropped_examples: List[str] = []
        self._last_summary: Optional[float] = None
        self._summary_call: Optional[IDelayedCall] = None
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
                        loop_errors: Optional[ILoopErrors] = None,
                        **options: Any) -> "HeartbeatDelegation":
        """The delegation as an agent runs it: an ``Informer`` of the leases on the
        coordinator apiserver, an ``Informer`` of the pool's Nodes read through
        ``cloud_reader`` (a client of whichever cloud server is healthy), and the
        cloud health checker's pick. Both informers count their loop's unexpected
        errors in ``loop_errors``. The lease informer stores only the leases of pool
        members (``keeps_lease``)."""
        def make_informer() -> IInformer:
            # Node leases only: the coordinator's Roles let a node list and watch
            # leases in kube-node-lease, nothing cluster-wide.
            return Informer(reactor, coordinator_client, LEASES,
                            namespace=NODE_LEASE_NAMESPACE, loop_errors=loop_errors,
                            keep=delegation.keeps_lease)

        def make_node_informer(label_selector: str) -> IInformer:
            return Informer(reactor, cloud_reader, NODES, label_selector=label_selector,
                            loop_errors=loop_errors)

        delegation = cls(reactor, make_informer, make_node_informer, cloud_reader,
                         cloud_health.pick_healthy_server, cloud_client_for, pool, **options)
        return delegation

    def keeps_lease(self, lease: dict) -> bool:
        """Whether the lease informer should hold ``lease``: only when its name is a
        Node of the pool as listed. Every other lease still reaches the handlers, one
        event at a time, to be counted and refused, but is not held: names that are no
        member, made up by the ten thousand, cost no memory each. A member's lease
        seen before the Nodes were listed is held from its next renewal on."""
        return _name_of(lease) in self._nodes

    # -- observers ---------------------------------------------------------------

    def add_delegation_observer(self, observer: Callable[[str, str], object]) -> None:
        """Call ``observer(node, outcome)`` once for each delegated heartbeat of
        ``node`` written to the cloud (outcome ``created`` or ``updated``, see
        ``FORWARDED_OUTCOMES``) and once for each one refused (outcome the reason, one
        of ``REFUSAL_REASONS``), in the turn it happens. A state not written because
        its Node left the pool meanwhile (``skipped``) is neither. A failing observer
        is logged and changes nothing."""
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

    @property
    def pool_leases_listed(self) -> bool:
        """Whether this term's informer of the pool leases has listed once: from then
        on every change of a lease is one this leader sees."""
        return self._running and not self._listing()

    @property
    def leases_held(self) -> int:
        """How many pool leases this term's informer holds: those of pool members only
        (``keeps_lease``), whatever else the coordinator has."""
        informer = self._informer
        return len(informer.list()) if informer is not None else 0

    # -- IRoleComponent ----------------------------------------------------------

    def start(self, store: object = None) -> defer.Deferred[None]:
        """Watch the pool's Nodes in the cloud and the leases on the coordinator. What
        the lease informer lists first is where this term starts from, not a change
        this leader saw: each lease is forwarded when it next changes (once the Nodes
        are listed). The pool store is not used."""
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
        self._waiting_dropped = 0
        self._absent.clear()
        self._parked.clear()
        self._logged.clear()
        classifying, self._classifying = self._classifying, {}
        for lookup in classifying.values():
            lookup.cancel()
        # What the summary holds is told now rather than a minute after the term.
        self._log_summary()
        return chains, cancelled

    # -- the pool's Nodes ----------------------------------------------------------

    def _in_pool(self, node: dict) -> bool:
        return node_pool(node) == self.pool

    def _nodes_listed(self, synced: bool, informer: IInformer) -> None:
        if not synced or informer is not self._node_informer or not self._running:
            return
        self._nodes_synced = True
        waiting, self._waiting = self._waiting, OrderedDict()
        dropped, self._waiting_dropped = self._waiting_dropped, 0
        self.log.info("heartbeat delegation: {count} nodes in pool {pool}, "
                      "{waiting} delegated leases waited for the list",
                      count=len(self._nodes), pool=self.pool, waiting=len(waiting))
        if dropped:
            self.log.warn("heartbeat delegation: {dropped} delegated leases did not wait "
                          "for the list of pool {pool}'s Nodes: at most {cap} leases wait, "
                          "and those renewed least recently made room; each is forwarded "
                          "at its next renewal if its name is a Node of the pool",
                          dropped=dropped, pool=self.pool, cap=self._max_waiting)
        for key, state in waiting.items():
            self._place(key, state)

    def _on_node(self, node: dict) -> None:
        if not self._running:
            return
        name = _name_of(node)
        self._nodes[name] = node
        self._absent.discard(name)
        parked = self._parked.pop(name, None)
        if parked is not None and self._nodes_synced:
            self._place(lease_key(parked.lease), parked)

    def _on_node_gone(self, node: dict) -> None:
        """A pool Node deleted or moved out of the pool: its heartbeats stop here."""
        if not self._running:
            return
        name = _name_of(node)
        self._nodes.pop(name, None)
        self._absent.discard(name)
        self._parked.pop(name, None)
        self._logged.pop(name, None)
        key = f"{NODE_LEASE_NAMESPACE}/{name}"
        self._writers.pop(key, None)
        self._forget_pending(key)
        self._waiting.pop(key, None)

    # -- informer events ---------------------------------------------------------

    def _listing(self) -> bool:
        """Whether the lease informer is still at its first list of this term (or
        handing over what it holds as a handler is added): what it delivers then is
        where the term starts from, not a change this leader saw."""
        informer = self._informer
        return informer is None or not informer.has_synced

    def _on_add(self, lease: dict) -> None:
        # After the first list, an add is a lease created while this leader watched
        # (or, in a relist, meanwhile): a change it saw.
        if not self._listing():
            self._offer(lease)

    def _on_update(self, old: dict, new: dict) -> None:
        if not self._listing() and seen_state(new) != seen_state(old):
            self._offer(new)

    def _on_delete(self, lease: dict) -> None:
        if not self._running:
            return
        key = lease_key(lease)
        self._writers.pop(key, None)
        self._waiting.pop(key, None)
        self._unpark(lease)
        logged = self._logged.get(_name_of(lease))
        if logged:
            logged.difference_update({entry for entry in logged if entry[0] == key})
        self._forget_pending(key)

    def _offer(self, lease: dict) -> None:
        """A change of a pool lease, seen now."""
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
        refusal = self._refusal(lease)
        if refusal is not None:
            self._refuse(key, *refusal)
            return
        now = self._reactor.seconds()
        self._place(key, _Heartbeat(lease, now, now))

    def _place(self, key: str, state: _Heartbeat) -> None:
        """A state that passed the checks of the lease itself: it waits for the Nodes'
        list, goes to the queue when its name is a Node of the pool, or else is
        refused and dropped (or parked, see ``_not_in_pool``)."""
        if not self._nodes_synced:
            self._wait(key, state)
            return
        name = state.lease["metadata"]["name"]
        if name not in self._nodes:
            self._not_in_pool(key, name, state)
            return
        self._parked.pop(name, None)
        self._queue.add(key, _Heartbeat(state.lease, state.seen, self._reactor.seconds()))

    def _wait(self, key: str, state: _Heartbeat) -> None:
        """Keep ``state`` till the Nodes are listed: the newest state per lease, of at
        most ``max_waiting`` leases. Above that, the lease renewed least recently makes
        room: its state is the first to grow older than an interval (and worthless),
        and a live node renews again within one."""
        waiting = self._waiting
        if key not in waiting and len(waiting) >= self._max_waiting:
            waiting.popitem(last=False)
            self._waiting_dropped += 1
        waiting[key] = state
        waiting.move_to_end(key)

    def _unpark(self, lease: dict) -> None:
        """Forget the parked state of ``lease``'s name if it is this lease's."""
        name = _name_of(lease)
        parked = self._parked.get(name)
        if parked is not None and lease_key(parked.lease) == lease_key(lease):
            del self._parked[name]

    def _refusal(self, lease: dict) -> Optional[Tuple[str, str]]:
        """(reason, detail) when the lease itself says it must not be forwarded."""
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
        return None

    def _not_in_pool(self, key: str, name: str, state: _Heartbeat) -> None:
        """A delegated lease whose name the pool's Node informer does not hold.

        Parked (its newest state) while a cloud read of the name runs, or when the
        cloud answered that the Node is in the pool and the informer has not delivered
        it yet. Otherwise refused and dropped: with the reason a cloud read gave for
        the name within ``ABSENT_NAMES_TTL``; else after a new read, if one fits the
        budget; else at once as ``not_pool_member`` (the informer is what says who is
        a member; a read would only tell whether the Node exists)."""
        self._forget_pending(key)
        if name in self._parked:
            self._parked[name] = state
            return
        reason = self._absent.get(name)
        if reason is None:
            if len(self._classifying) < self._max_node_reads and self._absent.may_read():
                self._parked[name] = state
                self._absent.read_started()
                lookup = defer.maybeDeferred(self._node_client.get, NODES, name)
                self._classifying[name] = lookup
                lookup.addBoth(self._classified, name, lookup)
                return
            reason = REFUSED_NOT_POOL_MEMBER
        self._refuse(key, reason, _absent_detail(reason, name, self.pool))

    def _classified(self, result: Any, name: str, lookup: defer.Deferred[Any]) -> None:
        if self._classifying.get(name) is not lookup:
            return None  # stopped meanwhile
        del self._classifying[name]
        if name in self._nodes:
            return None  # listed meanwhile (the parked lease was offered again)
        if isinstance(result, Failure):
            if not result.check(NotFound):
                self.log.debug("reading node {node} failed: {error}", node=name,
                               error=describe_failure(result))
                # Not known why: dropped uncounted, the next renewal asks again.
                self._parked.pop(name, None)
                return None
            reason = REFUSED_NO_SUCH_NODE
        elif self._in_pool(result):
            return None  # in the pool, not yet seen by the informer: parked till then
        else:
            reason = REFUSED_NOT_POOL_MEMBER
        self._absent.put(name, reason)
        state = self._parked.pop(name, None)
        if state is not None:  # not deleted meanwhile
            self._refuse(lease_key(state.lease), reason, _absent_detail(reason, name, self.pool))
        return None

    def _refuse(self, key: str, reason: str, detail: str) -> None:
        self._forget_pending(key)
        self._count_refusal(key, reason, detail)

    def _count_refusal(self, key: str, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        if self._metrics is not None:
            self._metrics.count_delegation_refused(reason)
        name = key.partition("/")[2]
        self._observers.notify(name, reason)
        if name not in self._nodes:
            self._summarize(key, reason)
            return
        logged = self._logged.setdefault(name, set())
        if (key, reason) not in logged:
            logged.add((key, reason))
            self.log.warn("heartbeat lease {lease} not forwarded to the cloud "
                          "(reason={reason}): {detail}", lease=key, reason=reason,
                          detail=detail)

    def _summarize(self, key: str, reason: str) -> None:
        """A refusal of a lease whose name is not a known Node of the pool: such names
        may be made up by the thousand, so they are logged together, at most once
        per ``SUMMARY_PERIOD`` (the first at once)."""
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        examples = self._dropped_examples
        if len(examples) < SUMMARY_EXAMPLES and key not in examples:
            examples.append(key)
        if self._summary_call is not None:
            return
        now = self._reactor.seconds()
        due = now if self._last_summary is None else self._last_summary + SUMMARY_PERIOD
        if due <= now:
            self._log_summary()
        else:
            self._summary_call = self._reactor.callLater(due - now, self._log_summary)

    def _log_summary(self) -> None:
        call, self._summary_call = self._summary_call, None
        if call is not None and call.active():
            call.cancel()
        dropped, self._dropped = self._dropped, {}
        examples, self._dropped_examples = self._dropped_examples, []
        if not dropped:
            return
        self._last_summary = self._reactor.seconds()
        self.log.warn(
            "heartbeat leases not forwarded to the cloud, their names not known as Nodes "
            "of pool {pool}: {count} renewals dropped ({reasons}), e.g. {examples}; "
            "logged together at most once every {period}",
            count=sum(dropped.values()), pool=self.pool,
            reasons=", ".join(f"{reason}={count}" for reason, count in sorted(dropped.items())),
            examples=", ".join(examples), period=format_duration(SUMMARY_PERIOD))

    def _forget_pending(self, key: str) -> None:
        self._queue.forget(key)

    # -- one chain per lease (the queue runs them) ---------------------------------

    def _delegate_state(self, key: str, state: _Heartbeat
                        ) -> defer.Deferred[Tuple[str, Optional[str]]]:
        return self._delegate(key, state)

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

    def _delegate(self, key: str, state: _Heartbeat
                  ) -> defer.Deferred[Tuple[str, Optional[str]]]:
        """One delegation of the pool lease state ``state``; fires with (outcome,
        server), outcome being ``LeaseWriter``'s created or updated, or unchanged when
        nothing was written."""
        pool_lease = state.lease
        node = self._nodes.get(pool_lease["metadata"]["name"])
        if node is None:
            return defer.succeed((UNCHANGED, None))
        age = self._reactor.seconds() - state.seen
        if age > self.heartbeat_interval:
            # Held back (the cloud unreachable, a retry's backoff) and no change of
            # the lease seen since. The chain ends as a no-op; a newer state of the
            # lease (if any) runs after it.
            self._count_refusal(key, REFUSED_EXPIRED, (
                f"this leader saw that state {age:.1f}s ago and no change since, more "
                f"than the heartbeat interval {format_duration(self.heartbeat_interval)}: "
                "the node stopped renewing its pool lease"))
            return defer.succeed((UNCHANGED, None))
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


def _absent_detail(reason: str, name: str, pool: str) -> str:
    if reason == REFUSED_NOT_POOL_MEMBER:
        return f"node {name} is not labelled {NODE_POOL_LABEL}={pool}"
    return f"the cloud has no node {name}"
