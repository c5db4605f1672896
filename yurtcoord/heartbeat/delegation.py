"""Heartbeat delegation: the pool leader forwards heartbeats of cut-off nodes to the cloud.

Longer than 600 lines on purpose: this is where each new state of a pool lease is
routed, and the lease informer's events, the pool's Nodes and the budget of cloud
reads decide that together; what each part does apart has a module of its own (one
lease's life ``leaselife``, the chains ``forwarding``, the cloud write ``cloudwrite``,
the refusals ``refusals``, the remembered reads ``absentnames``).

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

A refused lease is counted by reason and logged without letting made-up names flood
the log (``yurtcoord.heartbeat.refusals``); of a pool lease only its name and the
delegate annotation reach the cloud, written as ``yurtcoord.heartbeat.cloudwrite``
says; a lease created in the cloud gets an ownerReference to its Node, as the
kubelet's own lease has.

The life of one delegated lease (waiting for the Nodes' list, parked while its name
is read about, queued, written, backing off) is one Automat machine per lease,
``yurtcoord.heartbeat.leaselife``; this module holds them in one dict and decides,
from the pool's Nodes and the budget of reads, where each new state goes. How many
chains run at once follows the cloud (``yurtcoord.heartbeat.forwarding``).
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.heartbeat.absentnames import AbsentNames
from yurtcoord.heartbeat.cloudwrite import CloudLeaseWrites
from yurtcoord.heartbeat.interfaces import ICloudHealthChecker
from yurtcoord.heartbeat.forwarding import LeaseForwarding
from yurtcoord.heartbeat.leaselife import DelegatedLease, Heartbeat, delegated_lease
from yurtcoord.heartbeat.probes import NODE_LEASE_DURATION_SECONDS
from yurtcoord.heartbeat.refusals import (
    REFUSAL_REASONS, REFUSED_HOLDER_MISMATCH, REFUSED_NAMESPACE, REFUSED_NO_SUCH_NODE,
    REFUSED_NOT_POOL_MEMBER, IDelegationMetrics, Refusals,
)
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IListWatchClient, IObjectClient
from yurtcoord.kube.leasewriter import CREATED, UPDATED
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE, NODE_POOL_LABEL
from yurtcoord.pool.interfaces import IRoleComponent
from yurtcoord.tx.failures import describe_failure, is_cancellation
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.heap import QuietCollections
from yurtcoord.tx.limiter import AdaptiveLimit
from yurtcoord.tx.observers import Observers
from yurtcoord.tx.retry import DELEGATION_RETRY, RetryPolicy

# The names the agent and the tests read here, some of them defined below.
__all__ = ["DELEGATE_HEARTBEAT_ANNOTATION", "NODE_LEASE_NAMESPACE", "NODE_POOL_LABEL",
           "HeartbeatDelegation", "IDelegationMetrics", "REFUSAL_REASONS",
           "FORWARDED_OUTCOMES"]

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


@implementer(IRoleComponent)
class HeartbeatDelegation:
    """The leader's component forwarding delegated node leases to the cloud (a role
    component: ``start(store)`` and ``stop()`` as the coordinator calls them).

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
    - ``max_waiting``: how many leases may wait for the first list of the Nodes;
    - ``collections()`` → a fresh ``QuietCollections`` for each term, or None (the
      default; ``for_coordinator`` passes one): it freezes the heap once the first
      lists are in and holds full collections off while the leases renew.

    The chains in flight over all leases (others wait in a FIFO queue) start at
    ``DEFAULT_INITIAL_CONCURRENT`` and follow the cloud's latency between ``min_concurrent`` and
    ``max_concurrent`` (``concurrency_limit``); every chain that sent a request to the
    cloud is one sample of it.
    """

    _logger = Logger()

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
                 max_node_reads: int = MAX_NODE_READS, max_waiting: int = MAX_WAITING,
                 collections: Optional[Callable[[], QuietCollections]] = None) -> None:
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
        self.pool = pool
        self._retry_policy = retry_policy
        self._informer: Optional[IInformer] = None
        self._node_informer: Optional[IInformer] = None
        # The garbage collections of a term (``collections``, see ``start``).
        self._make_collections = collections
        self._collections: Optional[QuietCollections] = None
        minimum = min(min_concurrent, max_concurrent)
        limit = AdaptiveLimit(
            reactor, max(minimum, min(DEFAULT_INITIAL_CONCURRENT, max_concurrent)),
            minimum, max_concurrent, slack=LATENCY_SLACK)
        if metrics is not None:
            metrics.set_delegation_limit(limit.limit)
        self._writes = CloudLeaseWrites(
            reactor, pick_healthy_server, cloud_client_for, limit,
            lambda: self._forwarding.slots.in_flight, lease_duration_seconds, max_attempts,
            metrics)
        # Every lease that holds something, key -> its machine; a machine that holds
        # nothing any more leaves (``released``). Before the pool's Nodes are listed
        # every lease held waits, the one seen earliest first (dicts keep their order).
        self._leases: Dict[str, DelegatedLease] = {}
        self._running = False
        # The pool's Nodes by name, once the node informer listed.
        self._nodes: Dict[str, dict] = {}
        self._nodes_synced = False
        self._max_waiting = max(1, max_waiting)
        self._waiting_dropped = 0
        # Names found missing from the pool by a cloud read, and that read's budget
        # (at most ``max_node_reads`` at once).
        self._absent = AbsentNames(reactor, max(1, absent_names), absent_names_ttl)
        self._max_node_reads = max(1, max_node_reads)
        self._observers: Observers[[str, str]] = Observers(
            f"heartbeat delegations of pool {pool}")
        self._refusals = Refusals(reactor, pool, metrics, self._observers)
        self.refused = self._refusals.counts
        self._forwarding = LeaseForwarding(
            reactor, self._writes, self._nodes.get, self._count_refusal, self._released,
            heartbeat_interval, metrics, self._observers)
        self.log = self._logger

    @property
    def log(self) -> Logger:
        """Where the delegation logs, the lines of its refusals and writes too."""
        return self._log

    @log.setter
    def log(self, log: Logger) -> None:
        self._log = self._refusals.log = self._writes.log = self._forwarding.log = log

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

        options.setdefault("collections", lambda: QuietCollections(reactor))
        delegation = cls(reactor, make_informer, make_node_informer, cloud_reader,
                         cloud_health.pick_healthy_server, cloud_client_for, pool, **options)
        return delegation

    @property
    def heartbeat_interval(self) -> float:
        """A state seen longer ago (seconds) is not written any more."""
        return self._forwarding.heartbeat_interval

    @property
    def lease_duration_seconds(self) -> int:
        """The ``leaseDurationSeconds`` of the cloud leases it writes."""
        return self._writes.lease_duration_seconds

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
        return self._forwarding.delegated

    @property
    def delegated(self) -> int:
        return self._forwarding.delegated

    @property
    def created(self) -> int:
        """Cloud leases created so far."""
        return self._forwarding.created

    @property
    def skipped(self) -> int:
        """States not written because their Node left the pool meanwhile."""
        return self._forwarding.skipped

    @property
    def failures(self) -> int:
        """Failed delegations so far."""
        return self._forwarding.failures

    @property
    def running(self) -> bool:
        return self._running

    @property
    def in_flight(self) -> int:
        """How many lease delegations are running right now."""
        return self._forwarding.slots.in_flight

    @property
    def concurrency_limit(self) -> int:
        """How many lease delegations may run at once now."""
        return self._writes.limit.limit

    @property
    def queued(self) -> int:
        """How many leases wait for a free request slot."""
        return self._forwarding.slots.queued

    @property
    def leases_kept(self) -> int:
        """How many leases hold something now (waiting, parked, queued, written or
        backing off): at most one per pool member, plus the waiting and read ones."""
        return len(self._leases)

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

    # -- the role component --------------------------------------------------------

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
        if self._make_collections is not None:
            self._collections = self._make_collections()
            informer.wait_for_sync().addCallback(self._leases_listed, informer)
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
        """Cancel every chain, retry and read; returns the Deferred of the cancelled
        chains and how many there were."""
        cancelled = self._forwarding.slots.in_flight
        collections, self._collections = self._collections, None
        if collections is not None:
            collections.stop()
        leases, self._leases = self._leases, {}
        running: List[defer.Deferred[Any]] = []
        for lease in leases.values():
            chain = lease.stop()
            if chain is not None:
                running.append(chain)
        self._forwarding.stop()
        self._nodes.clear()
        self._nodes_synced = False
        self._waiting_dropped = 0
        self._absent.clear()
        self._refusals.end_term()
        chains = defer.DeferredList(running, consumeErrors=True).addCallback(lambda _: None)
        return chains, cancelled

    # -- the pool's Nodes ----------------------------------------------------------

    def _in_pool(self, node: dict) -> bool:
        return node_pool(node) == self.pool

    def _nodes_listed(self, synced: bool, informer: IInformer) -> None:
        if not synced or informer is not self._node_informer or not self._running:
            return
        self._nodes_synced = True
        self._freeze()
        # Every lease held so far waits for this list.
        waiting = [(key, lease.take()) for key, lease in list(self._leases.items())]
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
        for key, state in waiting:
            self._place(key, state)
        self._forwarding.start_chains()

    def _on_node(self, node: dict) -> None:
        if not self._running:
            return
        name = _name_of(node)
        self._nodes[name] = node
        self._absent.discard(name)
        key = f"{NODE_LEASE_NAMESPACE}/{name}"
        lease = self._leases.get(key)
        if lease is not None:
            parked = lease.delivered()
            if parked is not None:
                self._place(key, parked)
                self._forwarding.start_chains()

    def _on_node_gone(self, node: dict) -> None:
        """A pool Node deleted or moved out of the pool: its heartbeats stop here."""
        if not self._running:
            return
        name = _name_of(node)
        self._nodes.pop(name, None)
        self._absent.discard(name)
        self._refusals.forget_node(name)
        key = f"{NODE_LEASE_NAMESPACE}/{name}"
        self._writes.forget(key)
        self._drop(key)

    # -- garbage collections -----------------------------------------------------

    def _leases_listed(self, synced: bool, informer: IInformer) -> None:
        if synced and informer is self._informer and self._running:
            self._freeze()

    def _freeze(self) -> None:
        """A first list is in: what the term holds now (the pool's Nodes, the leases,
        the agent's own objects) is never walked again by a collection. A large pool
        renews its leases without pause, and the interpreter's own full collections
        would walk all of it every few seconds, each a stall of the reactor of
        hundreds of milliseconds that every heartbeat in flight waits out; the
        renewals instead hold them off (``busy``), a full collection running once
        every ``QuietCollections``' longest burst (``yurtcoord.tx.heap``)."""
        if self._collections is not None:
            self._collections.freeze()

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
        self._writes.forget(key)
        self._refusals.forget_lease(key, _name_of(lease))
        self._drop(key)

    def _offer(self, lease: dict) -> None:
        """A change of a pool lease, seen now."""
        if not self._running:
            return
        key = lease_key(lease)
        if not is_delegated(lease):
            # The node writes to the cloud itself again: an older delegated state
            # must not be forwarded any more.
            self._writes.forget(key)
            self._drop(key)
            return
        refusal = self._refusal(lease)
        if refusal is not None:
            self._refuse(key, *refusal)
            return
        if self._collections is not None:
            self._collections.busy()
        now = self._reactor.seconds()
        self._place(key, Heartbeat(lease, now, now))
        self._forwarding.start_chains()

    def _machine(self, key: str) -> DelegatedLease:
        """The machine of lease ``key``, a new one (held from now on) if it has none."""
        lease = self._leases.get(key)
        if lease is None:
            lease = self._leases[key] = delegated_lease(key, self._forwarding,
                                                        self._retry_policy)
        return lease

    def _released(self, key: str, lease: DelegatedLease) -> None:
        """``lease`` holds nothing any more: it leaves the dict."""
        if self._leases.get(key) is lease:
            del self._leases[key]

    def _drop(self, key: str) -> None:
        lease = self._leases.get(key)
        if lease is not None:
            lease.drop()

    def _place(self, key: str, state: Heartbeat) -> None:
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
        ready = Heartbeat(state.lease, state.seen, self._reactor.seconds())
        lease = self._leases.get(key)
        if lease is None and self._forwarding.slots.take_free_slot():
            lease = self._leases[key] = delegated_lease(key, self._forwarding,
                                                        self._retry_policy)
            lease.write(ready)
        else:
            self._machine(key).queue(ready)

    def _wait(self, key: str, state: Heartbeat) -> None:
        """Keep ``state`` till the Nodes are listed: the newest state per lease, of at
        most ``max_waiting`` leases. Above that, the lease renewed least recently makes
        room: its state is the first to grow older than an interval (and worthless),
        and a live node renews again within one."""
        leases = self._leases
        lease = leases.pop(key, None)
        if lease is None:
            if len(leases) >= self._max_waiting:
                leases[next(iter(leases))].drop()
                self._waiting_dropped += 1
            lease = delegated_lease(key, self._forwarding, self._retry_policy)
        leases[key] = lease  # the one renewed last goes last
        lease.wait(state)

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

    def _not_in_pool(self, key: str, name: str, state: Heartbeat) -> None:
        """A delegated lease whose name the pool's Node informer does not hold.

        Parked (its newest state) while a cloud read of the name runs, or when the
        cloud answered that the Node is in the pool and the informer has not delivered
        it yet. Otherwise refused and dropped: with the reason a cloud read gave for
        the name within ``ABSENT_NAMES_TTL``; else after a new read, if one fits the
        budget; else at once as ``not_pool_member`` (the informer is what says who is
        a member; a read would only tell whether the Node exists)."""
        lease = self._leases.get(key)
        if lease is not None and lease.not_member(state):
            return
        reason = self._absent.get(name)
        if reason is None:
            if self._forwarding.reads < self._max_node_reads and self._absent.may_read():
                self._absent.read_started()
                self._forwarding.reads += 1
                request = defer.maybeDeferred(self._node_client.get, NODES, name)
                # A read the lease's machine cancels is moot, however the client ends it.
                cancelled: list[bool] = []

                def cancel(_lookup: defer.Deferred[Any]) -> None:
                    cancelled.append(True)
                    request.cancel()

                lookup: defer.Deferred[Any] = defer.Deferred(cancel)
                request.chainDeferred(lookup)
                reading = self._machine(key)
                reading.read(state, lookup)
                lookup.addBoth(self._classified, key, name, reading, cancelled)
                return
            reason = REFUSED_NOT_POOL_MEMBER
        self._refuse(key, reason, _absent_detail(reason, name, self.pool))

    def _classified(self, result: Any, key: str, name: str, lease: DelegatedLease,
                    cancelled: list[bool]) -> None:
        if cancelled or (isinstance(result, Failure) and is_cancellation(result)):
            return None  # the read was moot (stopped, the Node delivered, the lease gone)
        if isinstance(result, Failure):
            if not result.check(NotFound):
                self.log.debug("reading node {node} failed: {error}", node=name,
                               error=describe_failure(result))
                # Not known why: dropped uncounted, the next renewal asks again.
                lease.drop()
                return None
            reason = REFUSED_NO_SUCH_NODE
        elif self._in_pool(result):
            lease.confirmed()  # in the pool, not yet seen by the informer: parked till then
            return None
        else:
            reason = REFUSED_NOT_POOL_MEMBER
        self._absent.put(name, reason)
        lease.answered()
        self._count_refusal(key, reason, _absent_detail(reason, name, self.pool))
        return None

    def _refuse(self, key: str, reason: str, detail: str) -> None:
        lease = self._leases.get(key)
        if lease is not None:
            lease.refuse()
        self._count_refusal(key, reason, detail)

    def _count_refusal(self, key: str, reason: str, detail: str) -> None:
        self._refusals.count(key, reason, detail, key.partition("/")[2] in self._nodes)


def _name_of(obj: dict) -> str:
    """``metadata.name`` of an object, "" when it has none (no lease of that name is
    ever accepted)."""
    return str((obj.get("metadata") or {}).get("name") or "")


def _absent_detail(reason: str, name: str, pool: str) -> str:
    if reason == REFUSED_NOT_POOL_MEMBER:
        return f"node {name} is not labelled {NODE_POOL_LABEL}={pool}"
    return f"the cloud has no node {name}"
