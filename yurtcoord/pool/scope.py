"""The pool-scoped resources: which resources the leader mirrors into the pool store.

The set is the defaults (``v1 endpoints``, ``discovery.k8s.io/v1`` and ``v1beta1
endpointslices``) plus the entries of ConfigMap ``kube-system/yurt-hub-cfg``, key
``pool_scope_resources``: a JSON list of ``{"group", "version", "resource"}`` whose
field names match case-insensitively. A value that is not such a list is
reported once per change, naming the ConfigMap and key, and only the defaults are kept.

A resource is kept only when the cloud's discovery (``/api/v1`` or
``/apis/<group>/<version>``) serves it: a 404, or a listing without it, drops it with
a warning naming it. Any other error is retried (3 times, 5 s apart, on the injected
clock, by ``yurtcoord.tx.retry.retrying``); if discovery still cannot answer, a resource that was already kept stays kept
(a short cloud hiccup must not stop a running sync) and a new one is left out until
the next change. Discovery also says whether a resource is namespaced.

The ConfigMap is watched by an informer, so an edit takes effect without a restart:
listeners get the new set whenever it changes.
"""

import json
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from twisted.python.failure import Failure

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.names import (
    POOL_SCOPE_CONFIGMAP_KEY, POOL_SCOPE_CONFIGMAP_NAME, POOL_SCOPE_CONFIGMAP_NAMESPACE,
)
from yurtcoord.pool.keys import ResourceId
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.observers import Observers
from yurtcoord.tx.retry import backoff_policy, retrying

DEFAULT_POOL_SCOPE_RESOURCES = (
    gvrs.ENDPOINTS,
    gvrs.ENDPOINTSLICES_V1,
    gvrs.ENDPOINTSLICES_V1BETA1,
)

# Told the resolved resources after every change of the set.
Listener = Callable[[tuple[GroupVersionResource, ...]], object]

DISCOVERY_RETRIES = 3

DISCOVERY_RETRY_INTERVAL = 5.0


def describe(gvr: GroupVersionResource) -> str:
    """``endpoints.v1`` / ``endpointslices.v1.discovery.k8s.io``: a name for logs."""
    group, version, resource = gvr.group, gvr.version, gvr.resource
    return f"{resource}.{version}.{group}" if group else f"{resource}.{version}"


def parse_pool_scope_resources(text: str) -> list[GroupVersionResource]:
    """The GroupVersionResources listed in the ConfigMap value ``text``.

    Raises ValueError saying what is wrong: not JSON, not a list, an entry that is
    not an object, or an entry without a version or resource.
    """
    try:
        entries = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(entries, list):
        raise ValueError(f"expected a JSON list, got {type(entries).__name__}")
    found = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {index} is not an object: {entry!r}")
        fields = {str(k).lower(): v for k, v in entry.items()}
        group = fields.get("group") or ""
        version = fields.get("version")
        resource = fields.get("resource")
        if not all(isinstance(v, str) for v in (group, version, resource)) \
                or not version or not resource:
            raise ValueError(f"entry {index} needs string version and resource: {entry!r}")
        found.append(GroupVersionResource(group.strip(), version.strip(), resource.strip()))
    return found


def merge_resources(defaults: Iterable[GroupVersionResource],
                    extra: Iterable[GroupVersionResource]) -> list[GroupVersionResource]:
    """``defaults`` then ``extra``, each (group, version, resource) once, order kept."""
    merged: list[GroupVersionResource] = []
    seen: set[ResourceId] = set()
    for gvr in list(defaults) + list(extra):
        if ResourceId.of(gvr) not in seen:
            seen.add(ResourceId.of(gvr))
            merged.append(gvr)
    return merged


class HealthyCloudClient(PickedServerClient):
    """A client for "whichever cloud server is healthy now".

    Every call asks ``pick_healthy_server()`` for a server URL and sends the request
    through ``client_for(url)`` (a ``KubeClient``; the caller owns and closes them),
    so an informer that reconnects after a failure moves on to a healthy server.
    Cloud apiservers share one etcd, so resourceVersions carry over between them.
    """

    def __init__(self, pick_healthy_server: Callable[[], str | None],
                 client_for: Callable[[str], Any]) -> None:
        super().__init__(pick_healthy_server, client_for, what="healthy cloud server")


class PoolScopeResources:
    """The served pool-scoped resources, kept current from the ConfigMap.

    :param reactor: clock for the discovery retries.
    :param cloud_client: a ``KubeClient`` or ``HealthyCloudClient`` of the cloud.
    :param informer_factory: ``(reactor, client, gvr, namespace=, field_selector=)`` →
        an informer; the real ``Informer`` by default.

    ``resources`` is None until the first resolution, then a tuple of
    GroupVersionResources (with discovery's ``namespaced``). ``add_listener(fn)``:
    ``fn(resources)`` after every change of the set.
    """

    log = Logger()

    def __init__(self, reactor: Any, cloud_client: Any,
                 defaults: Iterable[GroupVersionResource] = DEFAULT_POOL_SCOPE_RESOURCES,
                 retries: int = DISCOVERY_RETRIES,
                 retry_interval: float = DISCOVERY_RETRY_INTERVAL,
                 informer_factory: Callable[..., Any] = Informer) -> None:
        self.reactor = reactor
        self.cloud_client = cloud_client
        self.defaults = tuple(defaults)
        self.retries = retries
        self.retry_interval = retry_interval
        # The same pause before every retry of a discovery request.
        self._retry_policy = backoff_policy(initial=retry_interval, maximum=retry_interval,
                                            factor=1.0, jitter=0.0)
        self._informer_factory = informer_factory
        self.resources: tuple[GroupVersionResource, ...] | None = None
        self.configured = list(self.defaults)
        self.kinds: dict[ResourceId, str] = {}
        self._listeners: Observers[[tuple[GroupVersionResource, ...]]] = Observers(
            "pool-scoped resources change")
        self._informer: Any = None
        self._sync_wait: defer.Deferred[Any] | None = None
        self._resolving: defer.Deferred[Any] | None = None
        self._in_flight = InFlight()
        self._dirty = False
        self._running = False

    # -- public ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def add_listener(self, listener: "Listener") -> None:
        self._listeners.add(listener)

    def remove_listener(self, listener: "Listener") -> None:
        self._listeners.remove(listener)

    def start(self) -> None:
        """Watch the ConfigMap; the first resolution runs once its first list is in."""
        if self._running:
            return
        self._running = True
        self._informer = self._informer_factory(
            self.reactor, self.cloud_client, gvrs.CONFIGMAPS,
            namespace=POOL_SCOPE_CONFIGMAP_NAMESPACE,
            field_selector=f"metadata.name={POOL_SCOPE_CONFIGMAP_NAME}")
        self._sync_wait = self._informer.wait_for_sync()
        self._informer.add_handler(
            on_add=self._configmap_changed,
            on_update=lambda _old, new: self._configmap_changed(new),
            on_delete=lambda _obj: self._configmap_changed(None),
            filter=_is_pool_scope_configmap)
        self._sync_wait.addCallback(self._first_sync)
        self._informer.start()

    def stop(self) -> defer.Deferred[None]:
        """Stop watching and cancel discovery; fires when nothing is left running."""
        if not self._running:
            return defer.succeed(None)
        self._running = False
        self._dirty = False
        informer, self._informer = self._informer, None
        self._in_flight.cancel_all()
        resolving = self._resolving
        waits = [informer.stop()]
        if resolving is not None:
            waits.append(resolving)
        return defer.DeferredList(waits, consumeErrors=True).addCallback(lambda _: None)

    def kind_of(self, gvr: GroupVersionResource) -> str | None:
        """The kind discovery reported for ``gvr``, or None."""
        return self.kinds.get(ResourceId.of(gvr))

    def resolve_now(self) -> defer.Deferred[Any]:
        """Resolve the configured set against discovery now; fires with the result."""
        self._dirty = True
        return self._kick()

    # -- ConfigMap ---------------------------------------------------------------------

    def _configmap_changed(self, configmap: dict[str, Any] | None) -> None:
        extra: list[GroupVersionResource] = []
        if configmap is not None:
            value = (configmap.get("data") or {}).get(POOL_SCOPE_CONFIGMAP_KEY)
            if value is not None:
                try:
                    extra = parse_pool_scope_resources(value)
                except ValueError as e:
                    self.log.warn(
                        "ignoring key {key} of ConfigMap {namespace}/{name}: {error}; "
                        "only the default pool-scoped resources are used",
                        key=POOL_SCOPE_CONFIGMAP_KEY, namespace=POOL_SCOPE_CONFIGMAP_NAMESPACE,
                        name=POOL_SCOPE_CONFIGMAP_NAME, error=str(e))
        configured = merge_resources(self.defaults, extra)
        if [ResourceId.of(g) for g in configured] == [ResourceId.of(g) for g in self.configured] \
                and self.resources is not None:
            return
        self.configured = configured
        self.log.info("pool-scoped resources configured: {resources}",
                      resources=", ".join(describe(g) for g in configured))
        if self._sync_wait is None or self._sync_wait.called:
            self.resolve_now()

    def _first_sync(self, synced):
        if synced and self._running:
            self.resolve_now()

    # -- resolution ---------------------------------------------------------------------

    def _kick(self) -> defer.Deferred[Any]:
        if self._resolving is None:
            self._resolving = self._resolve_loop()
            if self._resolving.called:
                result, self._resolving = self._resolving, None
                return result
            return self._resolving
        waiter: defer.Deferred[Any] = defer.Deferred()

        def resolved(result: object) -> object:
            waiter.callback(self.resources)
            return result
        self._resolving.addBoth(resolved)
        return waiter

    @defer.inlineCallbacks
    def _resolve_loop(self):
        try:
            while self._dirty and self._running:
                self._dirty = False
                try:
                    kept = yield self._resolve(list(self.configured))
                except Exception:
                    self.log.failure("resolving pool-scoped resources failed")
                    break
                if not self._running:
                    break
                self._publish(tuple(kept))
        finally:
            self._resolving = None
        return self.resources

    @defer.inlineCallbacks
    def _resolve(self, configured):
        previous = {ResourceId.of(g): g for g in (self.resources or ())}
        listings: dict[tuple[str, str], Any] = {}
        kept: list[GroupVersionResource] = []
        for gvr in configured:
            group_version = (gvr.group, gvr.version)
            if group_version not in listings:
                listings[group_version] = yield self._discover(gvr)
                if not self._running:
                    return kept
            listing = listings[group_version]
            if listing is _UNKNOWN:
                if ResourceId.of(gvr) in previous:
                    self.log.warn("discovery of {resource} unavailable; keeping it",
                                  resource=describe(gvr))
                    kept.append(previous[ResourceId.of(gvr)])
                else:
                    self.log.warn("pool-scoped resource {resource} left out: discovery "
                                  "did not answer", resource=describe(gvr))
                continue
            served = listing.get(gvr.resource) if listing is not None else None
            if served is None:
                self.log.warn("pool-scoped resource {resource} dropped: the cloud does not "
                              "serve it", resource=describe(gvr))
                continue
            namespaced, kind = served
            if kind:
                self.kinds[ResourceId.of(gvr)] = kind
            kept.append(GroupVersionResource(gvr.group, gvr.version, gvr.resource,
                                             namespaced=namespaced))
        return kept

    @defer.inlineCallbacks
    def _discover(self, gvr):
        """``{resource: (namespaced, kind)}`` of the group/version, None if not served (404),
        ``_UNKNOWN`` if discovery kept failing."""
        path = gvr.api_prefix
        attempts = self.retries + 1

        def failed(failure: Failure, attempt: int) -> None:
            self.log.warn("discovery {path} failed (attempt {attempt} of {attempts}): "
                          "{error}", path=path, attempt=attempt, attempts=attempts,
                          error=str(failure.value) or type(failure.value).__name__)

        try:
            listing = yield self._in_flight.track(retrying(
                self.reactor, lambda: self.cloud_client.request("GET", path),
                self._retry_policy, attempts,
                retryable=lambda failure: self._running and not failure.check(NotFound),
                on_failure=failed))
        except NotFound:
            return None
        except Exception:
            return _UNKNOWN
        return _served_resources(listing)

    def _publish(self, kept):
        before = self.resources
        self.resources = kept
        if before is not None and [(ResourceId.of(g), g.namespaced) for g in before] == \
                [(ResourceId.of(g), g.namespaced) for g in kept]:
            return
        self.log.info("pool-scoped resources in use: {resources}",
                      resources=", ".join(describe(g) for g in kept) or "none")
        self._listeners.notify(kept)


_UNKNOWN = object()


def _served_resources(listing):
    """``{resource: (namespaced, kind)}`` from an APIResourceList (no subresources)."""
    served = {}
    entries = listing.get("resources") if isinstance(listing, dict) else None
    for entry in entries or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and "/" not in name:
            kind = entry.get("kind")
            served[name] = (bool(entry.get("namespaced", True)),
                            kind if isinstance(kind, str) else None)
    return served


def _is_pool_scope_configmap(obj):
    meta = obj.get("metadata") or {}
    return (meta.get("name") == POOL_SCOPE_CONFIGMAP_NAME
            and meta.get("namespace") == POOL_SCOPE_CONFIGMAP_NAMESPACE)
