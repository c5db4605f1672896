"""The pool as one agent sees it: the document of ``GET /pool``.

``/status`` tells what this agent is; ``/pool`` tells what the pool is, read through
the coordinator apiserver and the pool etcd and, while a cloud server is healthy,
the cloud:

- members: the cloud Nodes labelled with the pool and the node leases on the coordinator
  apiserver, each with the age of its node lease and its heartbeat path. Ages are this
  agent's own (docs/design.md, "Clocks"): a renewTime was written by another machine's
  clock, minutes off this one maybe, so it is never compared with the local clock. The
  view remembers, per lease, the renewTime it last read and the local time at which it
  read a different one (``RenewalsSeen``); a lease's age is the time since then, and a
  lease whose renewTime was seen to change within ``stale_after`` is fresh (the
  composition root gives two heartbeat intervals: a live node's lease changes at least
  once an interval). A lease read for the first time counts as changed at that moment,
  as client-go counts a lease it sees first: the first document after a start calls a
  dead node fresh for one ``stale_after``, and a view asked rarely dates a change from
  the document that first showed it. The lease that decides is the cloud's when the
  cloud was read, otherwise the coordinator's. Fresh and marked with the delegation
  annotation (which the leader copies into the cloud lease while it forwards, and a node
  writing the cloud directly removes) is ``delegated``, fresh without it is ``direct``,
  anything else ``stale``. Each member also shows the pool etcd member and the
  coordinator apiserver its agent uses, as its agent last wrote them on its node lease
  on the coordinator apiserver (null when that lease says nothing: no lease, an agent
  without a pool store open, or one that predates them);
- the leader and the election lease, from the agent's ``ElectionLeader``
  (``yurtcoord.role.leadersource``): the lease as last read from the coordinator
  apiserver whether or not this agent takes part in the election (a follower cut
  off from the cloud does not, yet the coordinator still names the leader), expired
  once its renewTime was not seen to change for its ``leaseDurationSeconds`` (as the
  elector judges it). Each build reads the lease too and feeds what it read in, so
  ``/status`` and ``/pool`` name the same leader;
- the last ``LEADER_CHANGES_KEPT`` leader changes this agent learned of, from the
  same ``ElectionLeader``, each dated by the lease's acquireTime where it has one;
- the pool cache: keys per pool-scoped resource in the pool etcd (a count, no values)
  and the age of the leader's informer sync lease (since its renewTime was seen to
  change);
- the upload state of this agent's own node (the only member whose upload it knows).

Every read is bounded by ``POOL_READ_TIMEOUT`` (on top of the clients' own bounds) and
a read that fails leaves its part empty and names itself under ``errors``: the
document is always built. A document is served again for ``POOL_VIEW_TTL`` seconds
and requests arriving while one is being built share it, so a flood of ``/pool``
requests costs one round of reads per ``POOL_VIEW_TTL``.

The cloud is not read per document: the pool's Nodes (label-selected) and the node
leases of ``kube-node-lease`` (which a label cannot select by pool: they are filtered
to the members here) are watched, by two informers started when a document is first
asked for and stopped once none was for ``POOL_WATCH_IDLE`` seconds. While someone
reads ``/pool`` the cloud thus serves two watches (and their list when they start or
after a 410), whatever the number of readers or of members, instead of two paged
lists per document: one open pool page on a 1,000-member pool made four cloud
requests a second, and a document's decoding of those pages was most of its CPU. A
cloud lease's renewTime is seen to change when its event arrives, which dates a
renewal more closely than a list a second. A document reads the watched copies only
once both informers have listed (the first document waits up to ``read_timeout`` for
it, and names the one that has not) and while a cloud server is healthy; a watch that
is cut and not yet resumed leaves the copies as they were, so their leases only age:
a member may show stale late, never fresh wrongly. The coordinator apiserver, which
is the pool's own, is read as before: its node leases in one paged list a document,
in pages of ``MEMBER_LIST_LIMIT`` objects, at most ``MEMBER_LIST_PAGES`` of them, all
pages within one ``read_timeout``.

Longer than 600 lines on purpose: it builds one document; the reads, their paging and
the build share the view's memory of renewals and its list of failed reads, which
apart would be passed back and forth. Its page is ``yurtcoord.agent.poolpage``.
"""

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generator, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.agent.statussources import IPoolView, IStatusSource, rfc3339
from yurtcoord.heartbeat.delegation import is_delegated
from yurtcoord.heartbeat.probes import servers_in_use
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import LEASES, NODES, GroupVersionResource
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IInformer, IListWatchClient
from yurtcoord.kube.lease import holder_identity
from yurtcoord.kube.renewals import RenewalsSeen
from yurtcoord.names import (
    INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE,
    NODE_POOL_LABEL,
)
from yurtcoord.pool.keys import PoolKeyBuilder
# Leader changes a document lists: the ``ElectionLeader``'s history.
from yurtcoord.role.leadersource import LEADER_CHANGES_KEPT as LEADER_CHANGES_KEPT
from yurtcoord.role.leadersource import ElectionLeader
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.guardedloop import ILoopErrors

# Seconds a built document is served again before the next one is built.
POOL_VIEW_TTL = 1.0
# Seconds one read of a ``/pool`` document may take; it then counts as failed.
POOL_READ_TIMEOUT = 3.0
# Seconds without a document asked for after which the watches of the cloud stop (the
# pool page asks every two seconds while open).
POOL_WATCH_IDLE = 60.0
# Objects one page of a list of Nodes or node leases holds (client-go's default).
MEMBER_LIST_LIMIT = 500
# Pages one list may take; objects beyond them are left out and ``errors`` says so
# (a kube-node-lease of more than 10,000 leases, all pools together).
MEMBER_LIST_PAGES = 20
DIRECT, DELEGATED, STALE = "direct", "delegated", "stale"
# Key of the informer sync lease in ``PoolView``'s ``RenewalsSeen``.
INFORMER_SYNC_KEY = "informer sync"


def heartbeat_path(lease: Optional[Mapping[str, Any]], changed_at: Optional[float],
                   now: float, stale_after: float) -> tuple[str, Optional[float]]:
    """``(path, lease age in seconds)`` of one node lease at ``now``, all on the local
    clock: ``changed_at`` is when its renewTime was last seen to change (None: no
    renewTime seen). ``stale`` when absent, without a renewTime, or not seen to change
    for more than ``stale_after``; else ``delegated`` when it carries the delegation
    annotation and ``direct`` when not. The age is ``now - changed_at``."""
    if lease is None or changed_at is None:
        return STALE, None
    age = max(0.0, now - changed_at)
    if age > stale_after:
        return STALE, age
    return (DELEGATED if is_delegated(dict(lease)) else DIRECT), age


def _age(changed_at: Optional[float], now: float) -> Optional[float]:
    return None if changed_at is None else max(0.0, now - changed_at)


def resource_name(gvr: GroupVersionResource) -> str:
    """``endpoints`` / ``endpointslices.discovery.k8s.io``: one name per stored resource
    (versions of a resource share their keys in the pool etcd)."""
    return f"{gvr.resource}.{gvr.group}" if gvr.group else gvr.resource


def _rounded(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds, 1)


def _name(obj: Any) -> Optional[str]:
    if not isinstance(obj, Mapping):
        return None
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and name else None


def _items(answer: Any) -> list[Any]:
    items = answer.get("items") if isinstance(answer, Mapping) else None
    return list(items) if isinstance(items, list) else []


def _continue_token(answer: Any) -> Optional[str]:
    metadata = answer.get("metadata") if isinstance(answer, Mapping) else None
    token = metadata.get("continue") if isinstance(metadata, Mapping) else None
    return token if isinstance(token, str) and token else None


class Listed:
    """The objects of one paged list; ``complete`` unless pages were left out after
    ``MEMBER_LIST_PAGES`` (then a lease missing from ``items`` may still exist)."""

    def __init__(self, items: list[Any], complete: bool) -> None:
        self.items = items
        self.complete = complete

    def named(self) -> dict[str, Any]:
        """The listed objects by name (those without one left out)."""
        by_name = {}
        for obj in self.items:
            name = _name(obj)
            if name is not None:
                by_name[name] = obj
        return by_name


@defer.inlineCallbacks
def list_pages(client: Any, gvr: GroupVersionResource, namespace: Optional[str] = None,
               label_selector: Optional[str] = None, limit: Optional[int] = None,
               pages: Optional[int] = None
               ) -> Generator["defer.Deferred[Any]", Any, Listed]:
    """One list of ``gvr`` read page by page (``limit`` / ``continue``, as kube-apiserver
    pages it: one snapshot), at most ``pages`` requests (by default
    ``MEMBER_LIST_LIMIT`` objects a page, ``MEMBER_LIST_PAGES`` pages). A failed page
    fails the list (a continue token gone stale is a 410); cancelling cancels the page
    in flight."""
    limit = MEMBER_LIST_LIMIT if limit is None else limit
    pages = MEMBER_LIST_PAGES if pages is None else pages
    items: list[Any] = []
    token: Optional[str] = None
    for _ in range(pages):
        answer = yield client.list(gvr, namespace=namespace, label_selector=label_selector,
                                   limit=limit, continue_token=token)
        items.extend(_items(answer))
        token = _continue_token(answer)
        if token is None:
            return Listed(items, True)
    return Listed(items, False)


@implementer(IListWatchClient)
class ListFailures:
    """A list-and-watch client that remembers why the last list of each resource
    failed (``failed[resource]``, gone once a list answers): what a document names
    while an informer over it has not listed, the informer itself only logging it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.failed: dict[str, str] = {}

    def list(self, gvr: GroupVersionResource, namespace: Optional[str] = None,
             label_selector: Optional[str] = None, field_selector: Optional[str] = None,
             resource_version: Optional[str] = None, limit: Optional[int] = None,
             continue_token: Optional[str] = None) -> "defer.Deferred[Any]":
        def answered(answer: Any) -> Any:
            self.failed.pop(gvr.resource, None)
            return answer

        def failed(failure: Failure) -> Failure:
            self.failed[gvr.resource] = describe_failure(failure)
            return failure

        return self._client.list(
            gvr, namespace=namespace, label_selector=label_selector,
            field_selector=field_selector, resource_version=resource_version,
            limit=limit, continue_token=continue_token).addCallbacks(answered, failed)

    def watch(self, gvr: GroupVersionResource, on_event: Callable[[str, Any], object],
              namespace: Optional[str] = None, resource_version: Optional[str] = None,
              label_selector: Optional[str] = None, field_selector: Optional[str] = None,
              allow_bookmarks: bool = True, timeout_seconds: Optional[int] = None,
              idle_timeout: Optional[float] = None) -> Any:
        return self._client.watch(
            gvr, on_event, namespace=namespace, resource_version=resource_version,
            label_selector=label_selector, field_selector=field_selector,
            allow_bookmarks=allow_bookmarks, timeout_seconds=timeout_seconds,
            idle_timeout=idle_timeout)


@implementer(IPoolView)
class PoolView:
    """Builds the ``/pool`` document of one agent (see the module doc).

    :param status: the agent's status source (role, readiness, its own upload).
    :param coordinator_client: client of the coordinator apiserver (``get``, ``list``).
    :param cloud_client: client of whichever cloud server is healthy (``list``, ``watch``).
    :param cloud_healthy: whether a cloud server is healthy now; the cloud is read only then.
    :param count_keys: ``count_keys(prefix)`` → Deferred number of pool etcd keys
        under ``prefix`` (bytes).
    :param pool_resources: the pool-scoped resources now.
    :param election_lease: ``(namespace, name)`` of the election Lease.
    :param stale_after: seconds (local clock) without a change of its renewTime seen
        after which a node lease is stale.
    :param leader: the agent's ``ElectionLeader``: each build feeds its read of the
        election lease in and takes the leader, the election and the history from it.
    :param make_informer: ``(reactor, client, gvr, namespace=, label_selector=,
        page_size=, loop_errors=)`` → an ``IInformer``; the watches of the cloud's pool
        Nodes and node leases (the real ``Informer`` by default).
    :param idle_after: seconds without a document asked for after which those
        watches stop (``stop()`` stops them at once).
    :param loop_errors: where the informers count an unexpected error of their loop.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, status: IStatusSource, node: str, pool: str,
                 coordinator_client: Any, cloud_client: Any,
                 cloud_healthy: Callable[[], bool],
                 count_keys: Callable[[bytes], "defer.Deferred[int]"],
                 storage_prefix: str,
                 pool_resources: Callable[[], Iterable[GroupVersionResource]],
                 election_lease: tuple[str, str], stale_after: float,
                 leader: ElectionLeader, ttl: float = POOL_VIEW_TTL,
                 read_timeout: float = POOL_READ_TIMEOUT,
                 make_informer: Callable[..., IInformer] = Informer,
                 idle_after: float = POOL_WATCH_IDLE,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._status = status
        self.node = node
        self.pool = pool
        self._coordinator = coordinator_client
        self._cloud = ListFailures(cloud_client)
        self._cloud_healthy = cloud_healthy
        self._count_keys = count_keys
        self._keys = PoolKeyBuilder(storage_prefix)
        self._pool_resources = pool_resources
        self._election_lease = election_lease
        self.stale_after = stale_after
        self.leader = leader
        # When this view saw each lease's renewTime change: the members' node leases
        # in the cloud and on the coordinator by node name, and the informer sync
        # lease (the election lease's are the ``ElectionLeader``'s).
        self._cloud_renewals = RenewalsSeen(reactor)
        self._pool_renewals = RenewalsSeen(reactor)
        self._lease_renewals = RenewalsSeen(reactor)
        self.ttl = ttl
        self.read_timeout = read_timeout
        self._make_informer = make_informer
        self.idle_after = idle_after
        self._loop_errors = loop_errors
        # The watches of the cloud (None while stopped) and the timer that stops them.
        self._cloud_nodes: Optional[IInformer] = None
        self._cloud_leases: Optional[IInformer] = None
        self._idle: Optional[IDelayedCall] = None
        self.last_document: Optional[dict[str, Any]] = None
        self.builds = 0
        self._built_at: Optional[float] = None
        self._waiting: Optional[list[defer.Deferred[dict[str, Any]]]] = None

    # -- serving -------------------------------------------------------------------

    def document(self) -> "defer.Deferred[dict[str, Any]]":
        """The current document: the last one while younger than ``ttl``, else the one
        being built (shared by every caller meanwhile). Never fails."""
        now = self._reactor.seconds()
        if (self.last_document is not None and self._built_at is not None
                and now - self._built_at < self.ttl):
            return defer.succeed(self.last_document)
        answer: defer.Deferred[dict[str, Any]] = defer.Deferred()
        if self._waiting is not None:
            self._waiting.append(answer)
            return answer
        self._waiting = [answer]
        self._build().addBoth(self._built)
        return answer

    def _built(self, result: object) -> None:
        if isinstance(result, Failure):
            # Only a defect of this module gets here: show it, never fail the page.
            self.log.failure("building the pool view failed", result)
            result = self._base({"pool view": describe_failure(result)})
        assert isinstance(result, dict)
        self.builds += 1
        self.last_document = result
        self._built_at = self._reactor.seconds()
        waiting, self._waiting = self._waiting or [], None
        for answer in waiting:
            answer.callback(result)

    # -- watching the cloud ---------------------------------------------------------

    @property
    def watching(self) -> bool:
        """Whether the watches of the cloud's pool Nodes and node leases run."""
        return self._cloud_leases is not None

    def _asked(self) -> None:
        """A document is being built: the watches stop ``idle_after`` from now,
        unless another is asked for meanwhile."""
        if self._idle is not None and self._idle.active():
            self._idle.reset(self.idle_after)
        elif self.watching:
            self._idle = self._reactor.callLater(self.idle_after, self._went_idle)

    def _watches(self) -> tuple[IInformer, IInformer]:
        """The informers of the cloud's pool Nodes and node leases, started on first
        use (and stopped once no document was asked for ``idle_after``)."""
        if self._idle is None or not self._idle.active():
            self._idle = self._reactor.callLater(self.idle_after, self._went_idle)
        if self._cloud_nodes is None or self._cloud_leases is None:
            nodes = self._make_informer(
                self._reactor, self._cloud, NODES,
                label_selector=f"{NODE_POOL_LABEL}={self.pool}",
                page_size=MEMBER_LIST_LIMIT, loop_errors=self._loop_errors)
            leases = self._make_informer(
                self._reactor, self._cloud, LEASES, namespace=NODE_LEASE_NAMESPACE,
                page_size=MEMBER_LIST_LIMIT, loop_errors=self._loop_errors)
            # A renewal is seen when its event arrives; the renewals of leases gone
            # while nothing watched are forgotten once the new list is in.
            leases.add_handler(self._cloud_lease_seen,
                               lambda _old, new: self._cloud_lease_seen(new),
                               self._cloud_lease_gone)
            leases.wait_for_sync().addCallback(self._cloud_leases_listed, leases)
            self._cloud_nodes, self._cloud_leases = nodes, leases
            self.log.info("pool view: watching the pool's Nodes and node leases in the "
                          "cloud")
            nodes.start()
            leases.start()
        return self._cloud_nodes, self._cloud_leases

    def _cloud_lease_seen(self, lease: Any) -> None:
        name = _name(lease)
        if name is not None:
            self._cloud_renewals.observe(name, lease)

    def _cloud_lease_gone(self, lease: Any) -> None:
        name = _name(lease)
        if name is not None:
            self._cloud_renewals.forget(name)

    def _cloud_leases_listed(self, synced: bool, leases: IInformer) -> None:
        if synced and leases is self._cloud_leases:
            self._cloud_renewals.retain({_name(lease) for lease in leases.list()})

    def _went_idle(self) -> None:
        self._idle = None
        self.log.info("pool view: no document asked for {idle:g}s, the watches of the "
                      "cloud stop", idle=self.idle_after)
        self._stop_watches()

    def _stop_watches(self) -> "defer.Deferred[None]":
        informers = [i for i in (self._cloud_nodes, self._cloud_leases) if i is not None]
        self._cloud_nodes = self._cloud_leases = None
        stopped = [defer.maybeDeferred(informer.stop) for informer in informers]
        done = defer.gatherResults(stopped, consumeErrors=True)
        done.addErrback(lambda failure: self.log.failure(
            "pool view: stopping a watch of the cloud failed", failure))
        return done.addCallback(lambda _: None)

    def stop(self) -> "defer.Deferred[None]":
        """Stop the watches of the cloud (the agent stops); the Deferred fires once
        nothing of them is left. A document asked for later starts them again."""
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None
        return self._stop_watches()

    def _synced(self, what: str, errors: dict[str, str], informer: IInformer,
                resource: str) -> "defer.Deferred[Any]":
        """True once ``informer`` (of ``resource``) has listed. Until then: why its
        last list failed, named under ``what`` at once; or, before any failed, a
        wait for its list within ``read_timeout`` (the first document of a watch)."""
        if informer.has_synced:
            return defer.succeed(True)
        failed = self._cloud.failed.get(resource)
        if failed is not None:
            errors[what] = failed
            return defer.succeed(False)

        def listed(synced: Any) -> bool:
            if synced is not True and what in errors:
                # Timed out: why, if a list failed meanwhile.
                errors[what] = self._cloud.failed.get(resource, errors[what])
            elif synced is not True:
                errors[what] = "watch stopped before its list was in"
            return synced is True

        return self._bounded(what, errors, informer.wait_for_sync).addCallback(listed)

    # -- reading -------------------------------------------------------------------

    def _bounded(self, what: str, errors: dict[str, str],
                 read: Callable[[], "defer.Deferred[Any]"],
                 timeout: Optional[float] = None,
                 absent_ok: bool = False) -> "defer.Deferred[Any]":
        """``read()`` within ``timeout`` (default ``read_timeout``); a failure is noted
        under ``what`` in ``errors`` and gives None. With ``absent_ok`` a NotFound is
        no failure: it gives None (a lease nobody wrote yet)."""
        timeout = self.read_timeout if timeout is None else timeout
        d = defer.maybeDeferred(read)
        d.addTimeout(timeout, self._reactor)

        def failed(failure: Failure) -> None:
            if absent_ok and failure.check(NotFound):
                return None
            if failure.check(defer.TimeoutError):
                errors[what] = f"no answer within {timeout:g}s"
            else:
                errors[what] = describe_failure(failure)
            return None

        return d.addErrback(failed)

    def _base(self, errors: dict[str, str]) -> dict[str, Any]:
        status = self._status.status()
        return {
            "node": self.node,
            "pool": self.pool,
            "role": status.get("role"),
            "ready": bool(status.get("ready")),
            "generated": rfc3339(self._reactor.seconds()),
            "generated_at": round(self._reactor.seconds(), 3),
            "stale_after_seconds": self.stale_after,
            "cloud_read": False,
            "leader": self.leader.leader,
            "election": self.leader.election(),
            "members": [],
            "leader_changes": self.leader.changes(),
            "cache": {"synced": bool(status.get("pool_cache_synced")),
                      "informer_sync_lease_age": None, "informer_sync_holder": None,
                      "resources": {}},
            "errors": dict(errors),
        }

    def _listed(self, what: str, errors: dict[str, str], client: Any,
                gvr: GroupVersionResource, **options: Any) -> "defer.Deferred[Any]":
        """``list_pages`` of ``gvr`` within one ``read_timeout``: a ``Listed``, or None
        when it failed (named under ``what`` in ``errors``). A list cut after
        ``MEMBER_LIST_PAGES`` pages is named too, and still gives its objects."""
        def cut(listed: Optional[Listed]) -> Optional[Listed]:
            if listed is not None and not listed.complete:
                errors[what] = (f"more than {MEMBER_LIST_PAGES * MEMBER_LIST_LIMIT}; "
                                "the rest left out")
            return listed

        return self._bounded(what, errors, lambda: list_pages(client, gvr, **options)
                             ).addCallback(cut)

    @defer.inlineCallbacks
    def _build(self) -> Generator["defer.Deferred[Any]", Any, dict[str, Any]]:
        errors: dict[str, str] = {}
        coordinator = self._coordinator
        cloud_read = bool(self._cloud_healthy())
        namespace, name = self._election_lease
        reads: dict[str, defer.Deferred[Any]] = {
            "election lease": self._bounded(
                "election lease", errors, lambda: coordinator.get(LEASES, name, namespace),
                absent_ok=True),
            "pool node leases": self._listed(
                "pool node leases", errors, coordinator, LEASES,
                namespace=NODE_LEASE_NAMESPACE),
            "informer sync lease": self._bounded(
                "informer sync lease", errors,
                lambda: coordinator.get(LEASES, INFORMER_SYNC_LEASE_NAME,
                                        INFORMER_SYNC_LEASE_NAMESPACE),
                absent_ok=True),
        }
        # Watched from the first document with a cloud server healthy, and while
        # documents are asked for, healthy or not (so that the copies are current
        # when one is again); read only while one is.
        self._asked()
        if cloud_read:
            node_watch, lease_watch = self._watches()
            reads["cloud nodes"] = self._synced(
                "cloud nodes", errors, node_watch, NODES.resource)
            reads["cloud node leases"] = self._synced(
                "cloud node leases", errors, lease_watch, LEASES.resource)
        counts: dict[str, defer.Deferred[Any]] = {}
        for gvr in self._pool_resources():
            resource = resource_name(gvr)
            if resource not in counts:
                prefix = self._keys.list_prefix(gvr.group, gvr.resource).encode("utf-8")
                counts[resource] = self._bounded(
                    f"pool cache {resource}", errors,
                    functools.partial(self._count_keys, prefix))
        answers = {}
        for what, d in reads.items():
            answers[what] = yield d
        resources = {}
        for resource, d in counts.items():
            resources[resource] = yield d

        pool_list: Optional[Listed] = answers["pool node leases"]
        pool_leases = pool_list.named() if pool_list is not None else {}
        # A complete list: a lease no longer in it is gone.
        pool_listed = pool_list is not None and pool_list.complete
        members = set(pool_leases) | {self.node}
        cloud_leases: dict[str, Any] = {}
        nodes_listed = cloud_read and answers.get("cloud nodes") is True
        if nodes_listed:
            members |= {name for name in map(_name, node_watch.list()) if name}
        if nodes_listed and answers.get("cloud node leases") is True:
            # A member the watched copy does not hold has no cloud lease (None).
            cloud_leases = {member: lease_watch.get(f"{NODE_LEASE_NAMESPACE}/{member}")
                            for member in members}
        else:
            cloud_read = False

        document = self._base(errors)
        now = self._reactor.seconds()
        # Every pool lease read for this document is seen now, the moment of the
        # document; the cloud's were seen as their events came.
        for lease_name, lease in pool_leases.items():
            self._pool_renewals.observe(lease_name, lease)
        if pool_listed:
            self._pool_renewals.retain(pool_leases)
        document["cloud_read"] = cloud_read
        election = answers["election lease"]
        if "election lease" in errors:
            self.leader.read_failed(errors["election lease"])
        else:
            self.leader.observe(election if isinstance(election, Mapping) else None)
        holder = self.leader.leader
        document["leader"] = holder
        document["election"] = self.leader.election()
        document["leader_changes"] = self.leader.changes()
        document["members"] = [
            self._member(member, cloud_leases.get(member), pool_leases.get(member),
                         cloud_read and member in cloud_leases, holder, now)
            for member in sorted(members)]
        sync_lease = answers["informer sync lease"]
        if isinstance(sync_lease, Mapping):
            document["cache"]["informer_sync_lease_age"] = _rounded(
                _age(self._lease_renewals.observe(INFORMER_SYNC_KEY, sync_lease), now))
            identity = holder_identity(sync_lease)
            document["cache"]["informer_sync_holder"] = (
                identity if isinstance(identity, str) and identity else None)
        elif "informer sync lease" not in errors:
            self._lease_renewals.forget(INFORMER_SYNC_KEY)
        document["cache"]["resources"] = resources
        document["errors"] = dict(sorted(errors.items()))
        return document

    def _member(self, member: str, cloud_lease: Any, pool_lease: Any, cloud_read: bool,
                leader: Optional[str], now: float) -> dict[str, Any]:
        cloud_lease = cloud_lease if isinstance(cloud_lease, Mapping) else None
        pool_lease = pool_lease if isinstance(pool_lease, Mapping) else None
        # Judged on the cloud lease when the cloud answered for this member.
        pool_changed = None if pool_lease is None else self._pool_renewals.changed_at(member)
        cloud_changed = (None if cloud_lease is None
                         else self._cloud_renewals.changed_at(member))
        if cloud_read:
            path, age = heartbeat_path(cloud_lease, cloud_changed, now, self.stale_after)
        else:
            path, age = heartbeat_path(pool_lease, pool_changed, now, self.stale_after)
        pool_age = _age(pool_changed, now)
        cloud_age = _age(cloud_changed, now) if cloud_read else None
        etcd_member, coordinator_server = servers_in_use(pool_lease)
        upload = None
        if member == self.node:
            status = self._status.status()
            upload = {"uploaded": bool(status.get("local_cache_uploaded")),
                      "objects": status.get("uploaded_objects")}
        return {
            "node": member,
            "heartbeat": path,
            "stale": path == STALE,
            "lease_age": _rounded(age),
            "cloud_lease_age": _rounded(cloud_age),
            "pool_lease_age": _rounded(pool_age),
            "leader": leader is not None and member == leader,
            "this_agent": member == self.node,
            "etcd_member": etcd_member,
            "coordinator_server": coordinator_server,
            "upload": upload,
        }
