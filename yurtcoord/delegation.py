"""Heartbeat delegation: the pool leader forwards heartbeats of cut-off nodes to the cloud.

A node that lost the cloud but still reaches its pool writes its lease
``kube-node-lease/<node>`` to the coordinator apiserver with annotation
``openyurt.io/delegate-heartbeat: "true"`` (SPEC §6.5). The leader watches those
leases and writes each one to the cloud, so the cloud does not declare the node dead.

Per delegation (one pool lease state → the cloud):

- a healthy cloud server is picked for every delegation (fix 14), and the write goes
  through that server's node-lease-proxy client;
- get the cloud lease (a renewal reuses the lease this leader wrote last instead,
  see ``HeartbeatDelegation``); absent → create it from the pool lease without the fields a
  server sets (fix 1: the seed created an empty object); present → merge the pool
  lease's annotations into it (pool values win, other cloud annotations stay; fix 14)
  and set its renewTime, then update;
- a cloud renewTime at or after the pool's is left alone: a delegation never moves a
  cloud lease backwards (fix 6), e.g. when the node already renewed it directly;
- a conflict is re-read and retried, at most ``MAX_ATTEMPTS`` attempts in all; a
  delegation whose last attempt conflicted is a failure.

Concurrency: leases of different nodes are delegated concurrently, but at most one
request chain per lease is in flight. Events arriving meanwhile only replace the
remembered pending state of that lease (newest renewTime wins), which runs when the
chain finishes. A failed delegation (no healthy cloud server, the cloud answering
errors, conflicts to the end) is counted and the newest state of that lease is
retried after a capped backoff, so a heartbeat is not lost until the next renewal.
"""

import copy
from collections import deque

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.health import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.backoff import Backoff
from yurtcoord.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.lease import parse_micro_time
from yurtcoord.roles import IRoleComponent

MAX_ATTEMPTS = 5
# Chains in flight over all leases: the cloud client's persistent connections.
DEFAULT_MAX_CONCURRENT = 16

# Metadata a server sets on its own objects; a lease created in the cloud from a
# pool lease must not carry the pool apiserver's values.
SERVER_SET_METADATA = (
    "resourceVersion", "uid", "creationTimestamp", "managedFields", "selfLink",
    "generation", "deletionTimestamp", "deletionGracePeriodSeconds",
)


def is_delegated(lease):
    """Whether a pool lease asks the leader to forward it to the cloud."""
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true"


def lease_key(lease):
    """``namespace/name`` of a lease dict."""
    metadata = (lease or {}).get("metadata") or {}
    return f"{metadata.get('namespace') or NODE_LEASE_NAMESPACE}/{metadata.get('name')}"


def renew_time_of(lease):
    """``spec.renewTime`` in POSIX seconds; None when absent or malformed."""
    value = ((lease or {}).get("spec") or {}).get("renewTime")
    if not value:
        return None
    try:
        return parse_micro_time(value)
    except ValueError:
        return None


def lease_for_create(pool_lease):
    """The cloud lease to create from a pool lease: everything but server-set metadata."""
    lease = copy.deepcopy(pool_lease)
    lease.setdefault("apiVersion", "coordination.k8s.io/v1")
    lease.setdefault("kind", "Lease")
    metadata = lease.setdefault("metadata", {})
    for field in SERVER_SET_METADATA:
        metadata.pop(field, None)
    lease.pop("status", None)
    return lease


def merged_cloud_lease(cloud_lease, pool_lease):
    """The cloud lease carrying the pool lease's annotations and renewTime.

    Annotations are merged: the pool's values win, annotations only the cloud lease
    has are kept. The cloud lease's resourceVersion stays, so the update is optimistic.
    """
    lease = copy.deepcopy(cloud_lease)
    metadata = lease.setdefault("metadata", {})
    pool_annotations = (pool_lease.get("metadata") or {}).get("annotations") or {}
    annotations = dict(metadata.get("annotations") or {})
    annotations.update(pool_annotations)
    if annotations:
        metadata["annotations"] = annotations
    lease.setdefault("spec", {})["renewTime"] = pool_lease["spec"]["renewTime"]
    return lease


class NoHealthyCloudServer(Exception):
    """No cloud server is healthy: the heartbeat cannot be forwarded now."""


class DelegationConflicted(Exception):
    """Every attempt to write the cloud lease ended in a conflict."""


class _Pending:
    """The newest pool state of one lease waiting to be delegated, and since when
    the oldest state it replaced has been waiting (for the latency metric)."""

    __slots__ = ("lease", "renew_time", "since")

    def __init__(self, lease, since):
        self.lease = lease
        self.renew_time = renew_time_of(lease)
        self.since = since

    def offer(self, lease):
        """Keep ``lease`` unless it renews earlier than the state already pending."""
        renewed = renew_time_of(lease)
        if self.renew_time is not None and (renewed is None or renewed < self.renew_time):
            return
        self.lease = lease
        self.renew_time = renewed


class _LeaseSlot:
    """Delegation state of one pool lease: pending state, running chain, retry timer,
    and whether it waits in the queue for a free request slot."""

    __slots__ = ("pending", "chain", "retry_call", "backoff", "queued")

    def __init__(self, backoff):
        self.pending = None
        self.chain = None
        self.retry_call = None
        self.backoff = backoff
        self.queued = False

    @property
    def idle(self):
        return self.pending is None and self.chain is None and self.retry_call is None


@implementer(IRoleComponent)
class HeartbeatDelegation:
    """The leader's component forwarding delegated node leases to the cloud.

    Collaborators, all passed in:

    - ``make_informer()`` → a fresh informer of ``kube-node-lease`` leases on the
      coordinator apiserver, with ``add_handler(on_add, on_update, on_delete)``,
      ``start()`` and ``stop()`` (a new one per leadership term);
    - ``pick_healthy_server()`` → a healthy cloud server URL or None (the cloud
      health checker's), called for every delegation;
    - ``cloud_client_for(url)`` → the client of that cloud server using the
      node-lease-proxy certificate. Clients are borrowed: the caller owns and
      closes them;
    - ``metrics``: optional, ``observe_delegation(seconds, succeeded)``;
    - ``make_backoff()`` → a ``Backoff`` for the retries of one lease.

    ``max_concurrent`` bounds the chains in flight over all leases (others wait in
    a FIFO queue): as many as the cloud client keeps persistent connections, so a
    burst of delegations reuses connections instead of opening one per node.

    The cloud lease written last for each node is remembered (per server), so a
    renewal is one update; the get happens only on a conflict, which also catches
    a newer renewal written meanwhile (so the cloud is still never moved back).
    """

    log = Logger()

    def __init__(self, reactor, make_informer, pick_healthy_server, cloud_client_for,
                 metrics=None, make_backoff=None, max_attempts=MAX_ATTEMPTS,
                 max_concurrent=DEFAULT_MAX_CONCURRENT):
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self._reactor = reactor
        self._make_informer = make_informer
        self._pick_healthy_server = pick_healthy_server
        self._cloud_client_for = cloud_client_for
        self._metrics = metrics
        self._make_backoff = make_backoff or (lambda: Backoff(initial=0.5, maximum=5.0))
        self._max_attempts = max_attempts
        self._max_concurrent = max_concurrent
        self._informer = None
        self._slots = {}
        self._ready = deque()
        self._active = 0
        self._pumping = False
        self._cloud_leases = {}
        self._cloud_unavailable = False
        self._running = False
        # Counters for /status and tests; they survive leadership terms.
        self.delegated = 0
        self.created = 0
        self.skipped = 0
        self.failures = 0

    @classmethod
    def for_coordinator(cls, reactor, coordinator_client, cloud_health, cloud_client_for,
                        metrics=None, **options):
        """The delegation as an agent runs it: an ``Informer`` of ``kube-node-lease``
        leases on the coordinator apiserver and the cloud health checker's pick."""
        def make_informer():
            return Informer(reactor, coordinator_client, LEASES, namespace=NODE_LEASE_NAMESPACE)

        return cls(reactor, make_informer, cloud_health.pick_healthy_server, cloud_client_for,
                   metrics=metrics, **options)

    # -- what /status reads ------------------------------------------------------

    @property
    def delegated_heartbeats(self):
        """Heartbeats written to the cloud (created or updated) so far."""
        return self.delegated

    @property
    def running(self):
        return self._running

    @property
    def in_flight(self):
        """How many lease delegations are running right now."""
        return self._active

    @property
    def queued(self):
        """How many leases wait for a free request slot."""
        return sum(1 for slot in self._slots.values() if slot.queued)

    # -- IRoleComponent ----------------------------------------------------------

    def start(self, store=None):
        """Watch the pool's node leases; the informer's initial list forwards every
        currently delegated lease at once. The pool store is not used."""
        if self._running:
            return defer.succeed(None)
        informer = self._make_informer()
        informer.add_handler(self._on_add, self._on_update, self._on_delete)
        self._informer = informer
        self._running = True
        self.log.info("heartbeat delegation started")
        started = defer.maybeDeferred(informer.start)
        started.addErrback(self._start_failed, informer)
        return started

    def _start_failed(self, failure, informer):
        if informer is self._informer:
            self._running = False
            self._informer = None
            self._cancel_all()
        self.log.warn("heartbeat delegation could not start: {error}",
                      error=failure.getErrorMessage())
        return failure

    def stop(self):
        """Stop watching and cancel every request and timer, in this reactor turn."""
        self._running = False
        informer, self._informer = self._informer, None
        chains = self._cancel_all()
        stopped = defer.succeed(None)
        if informer is not None:
            stopped = defer.maybeDeferred(informer.stop)
            stopped.addErrback(lambda f: self.log.warn(
                "stopping the node lease informer failed: {error}", error=f.getErrorMessage()))
        self.log.info("heartbeat delegation stopped, cancelled={cancelled}", cancelled=len(chains))
        waits = [stopped] + chains
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    def _cancel_all(self):
        slots, self._slots = self._slots, {}
        self._ready.clear()
        self._active = 0
        # A new term starts from what the cloud says, not from what we wrote before.
        self._cloud_leases.clear()
        chains = []
        for slot in slots.values():
            if slot.retry_call is not None and slot.retry_call.active():
                slot.retry_call.cancel()
            slot.retry_call = None
            slot.pending = None
            slot.queued = False
            if slot.chain is not None:
                chain, slot.chain = slot.chain, None
                chain.cancel()
                chains.append(chain)
        return chains

    # -- informer events ---------------------------------------------------------

    def _on_add(self, lease):
        self._offer(lease)

    def _on_update(self, old, new):
        self._offer(new)

    def _on_delete(self, lease):
        if not self._running:
            return
        key = lease_key(lease)
        self._cloud_leases.pop(key, None)
        self._forget_pending(key)

    def _offer(self, lease):
        if not self._running:
            return
        key = lease_key(lease)
        if not is_delegated(lease):
            # The node writes to the cloud itself again: an older delegated state
            # must not be forwarded any more.
            self._cloud_leases.pop(key, None)
            self._forget_pending(key)
            return
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _LeaseSlot(self._make_backoff())
        if slot.pending is None:
            slot.pending = _Pending(lease, self._reactor.seconds())
        else:
            slot.pending.offer(lease)
        self._enqueue(key, slot)

    def _forget_pending(self, key):
        slot = self._slots.get(key)
        if slot is None:
            return
        slot.pending = None
        if slot.retry_call is not None:
            if slot.retry_call.active():
                slot.retry_call.cancel()
            slot.retry_call = None
        if slot.idle:
            slot.queued = False
            del self._slots[key]

    # -- the queue and one chain per lease ---------------------------------------

    def _enqueue(self, key, slot):
        """Queue a lease with a pending state, unless it is running, waiting for a
        retry or already queued; then start what the concurrency bound allows."""
        if slot.pending is not None and slot.chain is None and slot.retry_call is None \
                and not slot.queued:
            slot.queued = True
            self._ready.append(key)
        self._pump()

    def _pump(self):
        if self._pumping:
            return  # the outer loop picks up what was queued meanwhile
        self._pumping = True
        try:
            while self._ready and self._active < self._max_concurrent:
                key = self._ready.popleft()
                slot = self._slots.get(key)
                if slot is None or not slot.queued:
                    continue
                slot.queued = False
                self._run(key, slot)
        finally:
            self._pumping = False

    def _run(self, key, slot):
        pending, slot.pending = slot.pending, None
        if pending is None:
            if slot.idle:
                self._slots.pop(key, None)
            return
        self._active += 1
        chain = slot.chain = self._delegate(key, pending.lease)
        # May run at once when the chain finished synchronously (no healthy server).
        chain.addBoth(self._finished, key, slot, pending)

    def _finished(self, result, key, slot, pending):
        if self._slots.get(key) is not slot or slot.chain is None:
            return None  # stopped meanwhile: nothing of this chain is reported
        slot.chain = None
        self._active -= 1
        seconds = max(0.0, self._reactor.seconds() - pending.since)
        ok = not isinstance(result, Failure)
        if self._metrics is not None:
            self._metrics.observe_delegation(seconds, ok)
        if ok:
            outcome, server, written = result
            if written is not None:
                self._cloud_leases[key] = (server, written)
            if self._cloud_unavailable:
                self._cloud_unavailable = False
                self.log.info("heartbeat delegations reach the cloud again via {server}",
                              server=server)
            if slot.backoff.failures:
                self.log.info("heartbeat delegation of {lease} recovered after {failures} failures",
                              lease=key, failures=slot.backoff.failures)
            slot.backoff.reset()
            if outcome == "skipped":
                self.skipped += 1
            else:
                self.delegated += 1
                if outcome == "created":
                    self.created += 1
            self.log.debug("delegated heartbeat {lease} outcome={outcome} seconds={seconds:.3f}",
                           lease=key, outcome=outcome, seconds=seconds)
            if slot.idle:
                self._slots.pop(key, None)
            self._enqueue(key, slot)
            return None
        self.failures += 1
        self._cloud_leases.pop(key, None)
        if slot.pending is None:
            # Retry this state unless a newer one arrived meanwhile.
            slot.pending = pending
        delay = slot.backoff.next_delay()
        # One line per outage, not one per node and retry: a cut cloud fails every
        # lease every few seconds.
        if result.check(NoHealthyCloudServer) and not self._cloud_unavailable:
            self._cloud_unavailable = True
            self.log.warn("no healthy cloud server: heartbeat delegations wait and retry")
        if slot.backoff.failures == 1 and not result.check(NoHealthyCloudServer):
            self.log.warn("heartbeat delegation of {lease} failed: {error}; retry in {delay:.2f}s",
                          lease=key, error=_describe(result), delay=delay)
        else:
            self.log.debug("heartbeat delegation of {lease} failed again: {error}; "
                           "retry in {delay:.2f}s", lease=key, error=_describe(result), delay=delay)
        slot.retry_call = self._reactor.callLater(delay, self._retry, key, slot)
        self._pump()
        return None

    def _retry(self, key, slot):
        slot.retry_call = None
        if self._slots.get(key) is slot:
            self._enqueue(key, slot)

    def _delegate(self, key, pool_lease):
        """One delegation of ``pool_lease``; fires with (outcome, server, cloud
        lease written or None), outcome being created, updated or skipped."""
        if renew_time_of(pool_lease) is None:
            return defer.succeed(("skipped", None, None))
        server = self._pick_healthy_server()
        if server is None:
            return defer.fail(NoHealthyCloudServer("no healthy cloud server"))
        try:
            client = self._cloud_client_for(server)
        except Exception as error:
            return defer.fail(error)
        known_server, known = self._cloud_leases.get(key, (None, None))
        return self._write(client, server, pool_lease, known if known_server == server else None)

    @defer.inlineCallbacks
    def _write(self, client, server, pool_lease, cloud_lease):
        """get (unless ``cloud_lease`` is what this server held last), then create or
        update; a conflict re-reads. At most ``max_attempts`` writes."""
        metadata = pool_lease["metadata"]
        name = metadata["name"]
        namespace = metadata.get("namespace") or NODE_LEASE_NAMESPACE
        pool_renewed = renew_time_of(pool_lease)
        for _attempt in range(self._max_attempts):
            if cloud_lease is None:
                try:
                    cloud_lease = yield client.get(LEASES, name, namespace=namespace)
                except NotFound:
                    try:
                        created = yield client.create(
                            LEASES, lease_for_create(pool_lease), namespace=namespace)
                    except AlreadyExists:
                        continue  # created meanwhile (the node itself): read it next attempt
                    return ("created", server, created)
            cloud_renewed = renew_time_of(cloud_lease)
            if cloud_renewed is not None and cloud_renewed >= pool_renewed:
                return ("skipped", server, cloud_lease)
            try:
                updated = yield client.update(
                    LEASES, merged_cloud_lease(cloud_lease, pool_lease), namespace=namespace)
            except (Conflict, NotFound):
                cloud_lease = None  # changed or deleted since read: read again
                continue
            return ("updated", server, updated)
        raise DelegationConflicted(
            f"lease {namespace}/{name} still conflicted after {self._max_attempts} attempts")


def _describe(failure):
    error = failure.value
    if isinstance(error, KubeError):
        return str(error)
    return f"{failure.type.__name__}: {failure.getErrorMessage()}"
