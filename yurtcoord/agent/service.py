"""Composition root: builds one agent from its ``Config`` and runs it.

``make_service`` is the only place that decides which parts exist and how they are
wired; every part gets what it needs passed in (config values, the reactor, metrics,
clients, callbacks). Nothing here implements behaviour of its own beyond starting and
stopping the parts in the right order.

The parts of an agent with ``[coordinator] enabled = true``:

- one ``KubeClient`` per cloud server, and one per coordinator apiserver; the
  elector, pool sync, delegation and the synced detector reach the coordinator
  through one client that sends each request to the server the coordinator health
  checker picks (a healthy one), so they fail over between coordinator apiservers
  as the cloud parts do between cloud servers;
- the cloud health checker (one lease prober per cloud server), the coordinator
  health checker (one lease prober per coordinator apiserver) and, unless ``kubelet_healthz_url = off``, the kubelet liveness checker
  that every probe consults;
- with TLS to the coordinator (``insecure = false``): the certificate manager that
  writes the certs Secret into ``pki_dir``;
- the etcd client of the pool etcd; the pool store is opened per role by the
  coordinator and closed when it drops it;
- the resolver of the coordinator apiservers' and the pool etcd's host names, which
  remembers what they resolved to (in memory and in ``pki_dir``, the agent's state
  directory) and uses it while DNS fails (``yurtcoord.tx.resolver``);
- the coordinator with pool sync, heartbeat delegation, the synced detector and the
  local cache upload;
- the hub elector, electing on the coordinator's Lease with identity = node name;
- the status pages, served from an ``AgentStatus`` over the coordinator; the
  metrics' role and readiness gauges follow the coordinator's observers;
- the pool view of ``/pool`` (``PoolView``), reading through the clients above and
  following the hub elector's and the coordinator's leader observers.

With ``[coordinator] enabled = false`` the agent only probes the cloud (renewing its
node lease there) and serves its status pages: the role stays ``init`` (never healthy
nor ready: it takes no part in the pool), ``/status`` shows the live cloud health.

Start order: status pages, the reactor lag probe, clients (nothing to start), probes,
coordinator, hub elector (its first check waits until every probe answered once, so
that role ``init`` lasts until health is known). Stop order is the exact reverse and
sequential, each stage waiting for the previous one: the hub elector stops first (a
leader releases its lease), then the coordinator stops its components and drops the
pool store, then the probes stop, then every client closes its connections, then the
reactor lag probe stops, and the status pages stop listening last. Each stage is
bounded by ``STOP_TIMEOUT`` so that an agent whose peers are down still stops.

Longer than 600 lines on purpose: it is the composition root, and wiring every part
in one place is its one job; split, the order in which the parts are built, started
and stopped would be spread over several modules.
"""

import contextlib
import functools
from typing import Any, Callable, Generator, Iterator, Mapping, Optional, Protocol, TypeVar

import treq.client
from twisted.application import service
from twisted.internet import defer, tcp
from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent as HTTPAgent

from yurtcoord.agent.certs import (
    CertificateClient, CertManager, CertPair, check_node_certificate)
from yurtcoord.agent.config import Config, ConfigError, ListenAddress
from yurtcoord.agent.causes import AgentCauses
from yurtcoord.agent.poolview import POOL_READ_TIMEOUT, PoolView
from yurtcoord.role.coordinator import Coordinator
from yurtcoord.heartbeat.delegation import (
    DEFAULT_MAX_CONCURRENT, FORWARDED_OUTCOMES, HeartbeatDelegation,
)
from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.heartbeat.probes import CloudHealthChecker, CoordinatorHealthChecker, KubeletHealthChecker
from yurtcoord.role.hubelector import HubElector
from yurtcoord.role.leadersource import ElectionLeader, ElectionLeaseReader
from yurtcoord.tx.reactorlag import ReactorLagProbe
from yurtcoord.tx.retry import ROLE_RETRY
from yurtcoord.tx.credentials import readable_by_others
from yurtcoord.tx.resolver import remembering_resolver
from yurtcoord.tx.twisted_private import QuietHTTPConnectionPool
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.kubeconfig import load_kubeconfig
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.leaderelection import LeaderElector
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.pool.localcache import LocalCacheReader
from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.scope import HealthyCloudClient, PoolScopeResources
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.store import PoolStore, open_pool_store
from yurtcoord.pool.sync import PoolSyncManager
from yurtcoord.agent.status import STATUS_LISTEN_BACKLOG, StatusSite, status_site
from yurtcoord.agent.statussources import AgentStatus, CloudOnlyStatus
from yurtcoord.pool.synced import PoolCacheSyncedDetector
from yurtcoord.pool.uploader import LocalCacheUploader, UploadCounts

# Seconds one request to an apiserver may take (probes and elections bound theirs
# tighter with their own timeouts).
REQUEST_TIMEOUT = 10.0
# Seconds each stop stage may take before the agent moves on to the next one.
STOP_TIMEOUT = 30.0
# Seconds the health check of a freshly opened pool store may take.
STORE_CHECK_TIMEOUT = 5.0
# The hub elector's first check waits for every prober's first answer, at the latest
# this long after the probes' own timeout.
FIRST_PROBE_SLACK = 0.5


class _SupportsClose(Protocol):
    def close(self) -> object: ...


_Closeable = TypeVar("_Closeable", bound=_SupportsClose)


# What the probes stage starts and stops besides the kubelet checker.
_Prober = CloudHealthChecker | CoordinatorHealthChecker | CertManager


class StatusHTTPService(service.Service):
    """Listens on ``[server] listen`` with the status site; stops listening on stop.

    ``port`` is the listening port while running (its ``getHost().port`` is the real
    port when 0 was configured); ``url`` is the base URL of the pages.
    """

    log = Logger()

    def __init__(self, listen: ListenAddress, site: StatusSite, reactor: Any) -> None:
        self.listen = listen
        self.site = site
        self.reactor = reactor
        self.port: Optional[tcp.Port] = None

    @property
    def url(self) -> Optional[str]:
        if self.port is None:
            return None
        return self.listen.url(self.port.getHost().port)

    def _endpoint(self) -> TCP4ServerEndpoint | TCP6ServerEndpoint:
        endpoint_class = TCP6ServerEndpoint if self.listen.is_ipv6 else TCP4ServerEndpoint
        return endpoint_class(self.reactor, self.listen.port, backlog=STATUS_LISTEN_BACKLOG,
                              interface=self.listen.host)

    def startService(self) -> None:
        """Listen now; a port that cannot be bound fails the start (raises)."""
        super().startService()
        # TCP endpoints listen synchronously: the Deferred has fired when listen returns.
        outcome: list[Any] = []
        self._endpoint().listen(self.site).addBoth(outcome.append)
        if isinstance(outcome[0], Failure):
            self.running = 0
            outcome[0].raiseException()
        self.port = outcome[0]
        self.log.info("status pages listening on {url}", url=self.url)

    def stopService(self) -> Optional[defer.Deferred[Any]]:
        super().stopService()
        port, self.port = self.port, None
        if port is None:
            return None
        return port.stopListening()


class StageService(service.Service):
    """One start/stop stage of the agent: ``start()`` runs when the stage starts,
    ``stop()`` (may return a Deferred) when it stops."""

    def __init__(self, name: str, start: Optional[Callable[[], object]] = None,
                 stop: Optional[Callable[[], Optional[defer.Deferred[Any]]]] = None) -> None:
        self.setName(name)
        self._start = start
        self._stop = stop

    def startService(self) -> None:
        super().startService()
        if self._start is not None:
            self._start()

    def stopService(self) -> Optional[defer.Deferred[Any]]:
        super().stopService()
        if self._stop is None:
            return None
        return self._stop()


class Agent(service.MultiService):
    """One yurtcoord agent: its config, metrics, parts and their start/stop stages.

    Attributes for tests and the sandbox: ``metrics``, ``reactor_lag``,
    ``status_source``, ``status_http`` (``.url``), ``cloud_clients`` ({url: KubeClient}),
    ``cloud_heartbeat_clients`` ({url: client} the node's own cloud lease is written
    with: as the node over TLS, else ``cloud_clients``),
    ``cloud_checker``, ``kubelet_checker`` (None with ``kubelet_healthz_url = off``);
    ``coordinator``, ``hub_elector``, ``delegation`` and ``pool_view`` (None with the
    coordinator disabled); with the coordinator enabled also ``coordinator_clients``
    ({url: client}, as the node: its own node lease), ``pool_agent_clients`` ({url:
    client}, as the pool's agent: everything else), ``coordinator_client`` (the one
    that picks among the latter),
    ``coordinator_checker``, ``etcd``, ``pool_sync``, ``synced_detector``,
    ``cert_manager`` (None with ``insecure``).
    """

    log = Logger()

    def __init__(self, config: Config, reactor: Any, stop_timeout: float = STOP_TIMEOUT) -> None:
        super().__init__()
        self.config = config
        self.reactor = reactor
        self.stop_timeout = stop_timeout
        self.metrics = Metrics(config.node.name, config.node.pool, clock=reactor.seconds)
        self._closers: list[_SupportsClose] = []
        self.cert_manager: Optional[CertManager] = None

        with self._section("cloud"):
            self._warn_of_readable_secrets()
            self.cloud_clients = {
                url: self._own(KubeClient(reactor, self._cloud_client_config(url),
                                          loop_errors=self.metrics))
                for url in config.cloud.servers}
            self.cloud_heartbeat_clients = self._cloud_heartbeat_clients()
        self.kubelet_checker: Optional[KubeletHealthChecker] = self._build_kubelet_checker()
        self.cloud_checker = CloudHealthChecker.for_servers(
            reactor, self.cloud_heartbeat_clients, config.node.name, config.heartbeat,
            kubelet=self.kubelet_checker, metrics=self.metrics)
        self.cloud_checker.add_write_listener(
            lambda _server: self.metrics.note_cloud_heartbeat(config.node.name))
        if self.kubelet_checker is not None:
            self.metrics.follow_kubelet(self.kubelet_checker)

        # The parts of an agent with the coordinator enabled; None without it.
        self.coordinator: Optional[Coordinator] = None
        self.hub_elector: Optional[HubElector] = None
        self.delegation: Optional[HeartbeatDelegation] = None
        self.pool_view: Optional[PoolView] = None
        self.leader: Optional[ElectionLeader] = None
        self.status_source: AgentStatus | CloudOnlyStatus
        if config.coordinator.enabled:
            with self._section("coordinator"):
                self._build_coordinator()
        else:
            self.status_source = CloudOnlyStatus(
                config.node.name, config.node.pool, self.cloud_checker.servers,
                reactor.seconds())

        self.status_http = StatusHTTPService(
            config.server.listen,
            status_site(self.status_source, self.metrics, reactor, self.pool_view), reactor)
        self.status_http.setName("status-http")
        self.status_http.setServiceParent(self)
        # Measures, from the moment the status pages listen, how late timers run.
        self.reactor_lag = ReactorLagProbe(reactor, warn_after=config.heartbeat.timeout,
                                           loop_errors=self.metrics)
        self.reactor_lag.add_observer(self.metrics.observe_reactor_lag)
        StageService("reactor-lag", self.reactor_lag.start,
                     self._stop_reactor_lag).setServiceParent(self)
        # Nothing to start: its stop closes every client, after every stage that
        # uses them and before the status pages stop listening.
        StageService("clients", None, self._close_clients).setServiceParent(self)
        StageService("probes", self._start_probes, self._stop_probes).setServiceParent(self)
        coordinator, hub_elector = self.coordinator, self.hub_elector
        if self.pool_view is not None:
            # Its watches of the cloud (while /pool is read) stop before the clients close.
            StageService("pool-view", None, self.pool_view.stop).setServiceParent(self)
        if coordinator is not None and hub_elector is not None:
            # The coordinator cancels its current step when it stops: opening the
            # store or uploading could otherwise retry for long against a dead etcd.
            StageService("coordinator", None, coordinator.stop).setServiceParent(self)
            StageService("election-lease-reader", self.leader_reader.start,
                         self.leader_reader.stop).setServiceParent(self)
            StageService("hub-elector", functools.partial(self._start_hub_elector, hub_elector),
                         hub_elector.stop).setServiceParent(self)

    # -- building ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _section(self, section: str) -> Iterator[None]:
        """Credentials that do not load (unreadable CA, broken kubeconfig) are a
        configuration error of ``section``, reported as one line, not a traceback."""
        try:
            yield
        except (ValueError, OSError) as error:
            raise ConfigError(self.config.source, f"cannot build the clients: {error}",
                              section=section) from None

    def _own(self, closeable: _Closeable) -> _Closeable:
        """Remember ``closeable`` for the last stop stage (``close()`` it)."""
        self._closers.append(closeable)
        return closeable

    def _cloud_client_config(self, url: str,
                             cert_pair: Optional[CertPair] = None) -> ClientConfig:
        """Client config for cloud server ``url``; with ``cert_pair`` its client
        certificate replaces the configured cloud credentials (node-lease-proxy).

        The pool keeps a connection for each heartbeat delegation the leader may run
        at once: with fewer, the connections past that number would be closed after
        each answer and opened again (a TLS handshake each) for the next ones."""
        cloud = self.config.cloud
        overrides: dict[str, Any] = {"max_connections_per_host": DEFAULT_MAX_CONCURRENT}
        if cert_pair is not None:
            overrides.update(cert_file=cert_pair.cert_file, key_file=cert_pair.key_file,
                             cert_data=None, key_data=None, token=None, token_file=None)
        if cloud.kubeconfig is not None:
            if cloud.insecure:
                overrides["insecure"] = True
            # The kubeconfig's insecure-skip-tls-verify only with [cloud] insecure = true.
            return ClientConfig.from_kubeconfig(cloud.kubeconfig, server=url,
                                                timeout=REQUEST_TIMEOUT,
                                                allow_insecure=cloud.insecure, **overrides)
        values: dict[str, Any] = dict(
            server=url, ca_file=cloud.ca_file, cert_file=cloud.cert_file,
            key_file=cloud.key_file, token_file=cloud.token_file,
            insecure=cloud.insecure, timeout=REQUEST_TIMEOUT)
        values.update(overrides)
        return ClientConfig(**values)

    def _cloud_heartbeat_clients(self) -> Mapping[str, KubeClient | CertificateClient]:
        """The clients the cloud prober writes the node's own lease with. Over TLS they
        are the node itself (the kubelet's certificate, ``[node] kubelet_client_cert``,
        checked to name this node): the cloud's Node authorizer lets a node renew its
        own lease and no other, so the agent's cloud credentials (a ServiceAccount's,
        shared by every agent) need no right to write any lease. With ``[cloud]
        insecure = true`` (plain http test setups) the cloud clients themselves."""
        cloud = self.config.cloud
        if cloud.insecure:
            return self.cloud_clients
        node_cert = self.config.node.kubelet_client_cert
        check_node_certificate(node_cert, self.config.node.name)
        pair = CertPair(node_cert, node_cert)
        return {url: self._own(CertificateClient(
                    self.reactor, functools.partial(self._cloud_client_config, url, pair),
                    (node_cert,), loop_errors=self.metrics))
                for url in cloud.servers}

    def _secret_files(self) -> list[tuple[str, str]]:
        """(path, what it holds) of every file of the cloud credentials that must be
        the agent's alone: the client key and token files, named in the ini or in the
        kubeconfig, and the kubeconfig itself when it holds a key or a token."""
        cloud = self.config.cloud
        files = [(cloud.key_file, "[cloud] key_file"), (cloud.token_file, "[cloud] token_file")]
        coordinator = self.config.coordinator
        if not cloud.insecure or (coordinator.enabled and not coordinator.insecure):
            files.append((self.config.node.kubelet_client_cert, "[node] kubelet_client_cert"))
        if cloud.kubeconfig is not None:
            creds = load_kubeconfig(cloud.kubeconfig, allow_insecure=cloud.insecure)
            files += [(creds.key_file, f"client-key of {cloud.kubeconfig}"),
                      (creds.token_file, f"tokenFile of {cloud.kubeconfig}")]
            if creds.key_data is not None or creds.token is not None:
                files.append((cloud.kubeconfig, "[cloud] kubeconfig, with a key or token"))
        return [(path, what) for path, what in files if path is not None]

    def _warn_of_readable_secrets(self) -> None:
        """One warning per key or token file that its group or others may read, at
        start: whoever else reads it can act as this node. Neither stops the agent (a
        deployment may share a group on purpose); the file's content is never logged."""
        for path, what in self._secret_files():
            mode = readable_by_others(path)
            if mode is not None:
                self.log.warn("{path} ({what}) is readable by group or others (mode "
                              "{mode}): only the agent's user should read it (chmod 600)",
                              path=path, what=what, mode=f"{mode:04o}")

    def _build_kubelet_checker(self) -> Optional[KubeletHealthChecker]:
        """The kubelet liveness gate of every probe; None with ``kubelet_healthz_url =
        off`` (a node with no kubelet)."""
        heartbeat = self.config.heartbeat
        if heartbeat.kubelet_healthz_url is None:
            return None
        # Quiet: a probe is a new connection, and Twisted's factory would log two info
        # lines for each ("Starting factory", "Stopping factory").
        pool = QuietHTTPConnectionPool(self.reactor, persistent=False)
        http = treq.client.HTTPClient(HTTPAgent(self.reactor, pool=pool,
                                                connectTimeout=heartbeat.timeout))
        checker = KubeletHealthChecker(
            self.reactor, http.get, heartbeat.kubelet_healthz_url,
            heartbeat.kubelet_grace_period, interval=heartbeat.interval,
            timeout=heartbeat.timeout, loop_errors=self.metrics)
        checker.add_listener(self._kubelet_changed)
        return checker

    def _kubelet_changed(self, alive: bool) -> None:
        """A kubelet that answers again gets its node renewed at once, not at the next
        slot of each prober; a dead one is refused by the next probe anyway."""
        if not alive:
            return
        self.cloud_checker.restart()
        if self.coordinator is not None:
            self.coordinator_checker.restart()

    def _build_coordinator(self) -> None:
        config, reactor, node = self.config, self.reactor, self.config.node.name
        coordinator_config = config.coordinator
        pool_cache = config.pool_cache

        healthy_cloud = HealthyCloudClient(self.cloud_checker.pick_healthy_server,
                                           self.cloud_clients.__getitem__)
        # The coordinator apiservers and the pool etcd are reached at the addresses
        # their names last resolved to while DNS fails (it may fail with the cloud);
        # the file of them is kept beside the certificates, in the state directory.
        self.coordinator_resolver = remembering_resolver(reactor, coordinator_config.pki_dir)
        # Plain clients without TLS; with it, clients that reload their certificates.
        self.coordinator_clients: Mapping[str, KubeClient | CertificateClient]
        self.pool_agent_clients: Mapping[str, KubeClient | CertificateClient]
        self.lease_proxy_clients: Mapping[str, KubeClient | CertificateClient]
        if coordinator_config.insecure:
            self.coordinator_clients = {
                url: self._own(KubeClient(reactor, ClientConfig(
                    server=url, insecure=True, timeout=REQUEST_TIMEOUT),
                    name_resolver=self.coordinator_resolver, loop_errors=self.metrics))
                for url in coordinator_config.server}
            # No identities without TLS: one client per server for both.
            self.pool_agent_clients = self.coordinator_clients
            etcd_config = EtcdConfig(url=coordinator_config.storage[0],
                                     more_urls=coordinator_config.storage[1:])
            # No node-lease-proxy certificate without TLS: delegated heartbeats go
            # through the cloud clients and their configured credentials.
            self.lease_proxy_clients = self.cloud_clients
        else:
            cert_manager = self._build_certificate_clients(healthy_cloud)
            pair = cert_manager.yurthub_client_pair
            etcd_config = EtcdConfig(url=coordinator_config.storage[0],
                                     more_urls=coordinator_config.storage[1:],
                                     ca_file=cert_manager.ca_file,
                                     cert_file=pair.cert_file, key_file=pair.key_file)
        self.etcd = self._own(EtcdClient(reactor, etcd_config,
                                         name_resolver=self.coordinator_resolver,
                                         loop_errors=self.metrics))

        election = config.leader_election
        self.coordinator_checker = CoordinatorHealthChecker(
            reactor, self.coordinator_clients, node, self.cloud_checker, config.heartbeat,
            kubelet=self.kubelet_checker, metrics=self.metrics,
            takeover=election.lease_duration + election.retry_period,
            etcd_member=self._etcd_member_in_use)
        # What the pool shares (the election, pool sync, the delegation's reads, the
        # synced detector, the pool view) goes as the pool's agent; only the node's own
        # lease (the coordinator prober's) as the node.
        self.coordinator_client = PickedServerClient(
            self.coordinator_checker.pick_server, self.pool_agent_clients.__getitem__,
            what="coordinator apiserver", on_unreachable=self.coordinator_checker.suspect)

        # Every informer counts its loop's unexpected errors in the agent's metrics.
        informer = functools.partial(Informer, loop_errors=self.metrics)
        self.pool_scope = PoolScopeResources(reactor, healthy_cloud, informer_factory=informer)
        self.pool_sync = PoolSyncManager(
            reactor, node, self.coordinator_client, healthy_cloud, self.pool_scope,
            informer_lease_renew=pool_cache.informer_lease_renew, metrics=self.metrics,
            informer_factory=informer)
        self.delegation = delegation = HeartbeatDelegation.for_coordinator(
            reactor, self.coordinator_client, healthy_cloud, self.cloud_checker,
            self.lease_proxy_clients.__getitem__, config.node.pool,
            heartbeat_interval=config.heartbeat.interval, metrics=self.metrics,
            loop_errors=self.metrics)
        delegation.add_delegation_observer(self._delegation_observed)
        self.metrics.follow_etcd_members(self.etcd.member_health)
        self.synced_detector = PoolCacheSyncedDetector(
            reactor, self.coordinator_client, pool_cache.stale_timeout,
            on_synced_change=self._pool_cache_synced_changed, informer_factory=informer)

        self.coordinator = coordinator = Coordinator(
            reactor, node, self._open_pool_store, self.pool_sync, delegation,
            self.synced_detector, self._upload_local_cache,
            retry_delay=ROLE_RETRY, loop_errors=self.metrics)
        self.metrics.follow(coordinator)

        self.election_config = election.election(node)
        self.hub_elector = hub_elector = HubElector(
            reactor, self.cloud_checker, self.coordinator_checker, self._make_elector,
            election.check_interval, on_role=coordinator.set_role, loop_errors=self.metrics)
        # The one place every surface takes the pool's leader from: the election lease
        # as last read, read every retry_period whatever this agent's role (one that
        # does not elect still learns of each new leader), and at once when the
        # elector sees a new holder or this agent's role changes.
        self.leader = leader = ElectionLeader(reactor)
        self.leader_reader = ElectionLeaseReader(
            reactor, self.coordinator_client, (election.lease_namespace, election.lease_name),
            leader, interval=election.retry_period, timeout=POOL_READ_TIMEOUT,
            loop_errors=self.metrics)
        hub_elector.add_leader_observer(self.leader_reader.read_now)
        coordinator.add_role_observer(self.leader_reader.read_now)
        self.causes = AgentCauses(
            self.kubelet_checker, self.cloud_checker, self.coordinator_checker,
            etcd_unreachable=self._etcd_unreachable,
            pool_cache_synced=lambda: coordinator.pool_cache_synced)
        self.status_source = AgentStatus(
            coordinator, config.node.pool, reactor, self.cloud_checker,
            self.coordinator_checker, self.leader, delegation,
            etcd_member=lambda: self.etcd.member, causes=self.causes)
        self.pool_view = self._build_pool_view(healthy_cloud)

    def _etcd_unreachable(self) -> Optional[str]:
        """Why the open pool store cannot reach the pool etcd; None when it can or
        none is open."""
        store = self.coordinator.store if self.coordinator is not None else None
        return None if store is None else store.unreachable

    def _delegation_observed(self, node: str, outcome: str) -> None:
        """A pool member's heartbeat forwarded to the cloud: its age restarts."""
        if outcome in FORWARDED_OUTCOMES:
            self.metrics.note_cloud_heartbeat(node)

    def _etcd_member_in_use(self) -> Optional[str]:
        """The pool etcd member this agent's pool store uses now, as its node lease
        tells the pool; None while it has no pool store open (its etcd client's
        current member then serves nothing of the pool)."""
        if self.coordinator is None or self.coordinator.store is None:
            return None
        return self.etcd.member

    def _build_pool_view(self, healthy_cloud: HealthyCloudClient) -> PoolView:
        """The ``/pool`` document's builder, over the clients built above; it takes
        the leader and its history from ``leader``, and feeds its own reads of the
        election lease in."""
        config, node = self.config, self.config.node.name
        election, heartbeat = config.leader_election, config.heartbeat
        leader = self.leader
        assert leader is not None, "the pool view is built after the leader source"

        def pool_resources() -> tuple[Any, ...]:
            return self.pool_scope.resources or self.pool_scope.defaults

        return PoolView(
            self.reactor, self.status_source, node, config.node.pool,
            self.coordinator_client, healthy_cloud,
            lambda: bool(self.cloud_checker.healthy), self._count_pool_keys,
            config.coordinator.storage_prefix, pool_resources,
            (election.lease_namespace, election.lease_name),
            # Two heartbeat intervals on this agent's clock since a lease was seen to
            # change: a live node's lease changes once an interval, one late or lost
            # renewal is no death, and no other clock's offset enters the window.
            stale_after=2 * heartbeat.interval, leader=leader, loop_errors=self.metrics)

    def _count_pool_keys(self, prefix: bytes) -> defer.Deferred[int]:
        """How many keys the pool etcd holds under ``prefix`` (a count, no values)."""
        d = self.etcd.range_page(prefix, count_only=True, serializable=True,
                                 timeout=POOL_READ_TIMEOUT)
        return d.addCallback(lambda page: page.count)

    def _build_certificate_clients(self, healthy_cloud: HealthyCloudClient) -> CertManager:
        """Clients whose certificates the certificate manager fetches from the cloud;
        returns that certificate manager (also ``cert_manager``)."""
        reactor, coordinator_config = self.reactor, self.config.coordinator
        self.cert_manager = CertManager(
            reactor, healthy_cloud, coordinator_config.pki_dir,
            coordinator_config.secret_namespace, on_change=self._certificates_changed,
            loop_errors=self.metrics)
        ca_file = self.cert_manager.ca_file
        # Two identities on every coordinator apiserver. As its node (the kubelet's
        # certificate, re-read when the kubelet rotates it) the agent writes its own
        # node lease, and may write no other (the Node authorizer, NodeRestriction).
        # As the pool's agent (the certs Secret's pair, which names no node) it does
        # what the pool shares: the election and informer sync leases, which
        # NodeRestriction refuses any node outside kube-node-lease, and the reads of
        # the pool's node leases; the coordinator's Roles let it write no node lease.
        # Until both files exist the coordinator is unhealthy. See docs/design.md,
        # "Identities".
        self.pool_agent_clients = self._coordinator_clients_as(
            ca_file, self.cert_manager.yurthub_client_pair)
        node_cert = self.config.node.kubelet_client_cert
        check_node_certificate(node_cert, self.config.node.name)
        self.coordinator_clients = self._coordinator_clients_as(
            ca_file, CertPair(node_cert, node_cert))
        proxy_pair = self.cert_manager.node_lease_proxy_pair
        self.lease_proxy_clients = {
            url: self._own(CertificateClient(
                reactor, functools.partial(self._cloud_client_config, url, proxy_pair),
                (proxy_pair.cert_file, proxy_pair.key_file), loop_errors=self.metrics))
            for url in self.config.cloud.servers}
        return self.cert_manager

    def _coordinator_clients_as(self, ca_file: str, pair: CertPair,
                                ) -> dict[str, KubeClient | CertificateClient]:
        """One client per coordinator apiserver presenting ``pair``, built once its
        files (and the CA) exist."""
        return {
            url: self._own(CertificateClient(
                self.reactor,
                functools.partial(ClientConfig, server=url, ca_file=ca_file,
                                  cert_file=pair.cert_file, key_file=pair.key_file,
                                  timeout=REQUEST_TIMEOUT),
                tuple(dict.fromkeys((ca_file, pair.cert_file, pair.key_file))),
                name_resolver=self.coordinator_resolver, loop_errors=self.metrics))
            for url in self.config.coordinator.server}

    def _make_elector(self, started_leading: Callable[..., None],
                      stopped_leading: Callable[..., None],
                      new_leader: Callable[..., None]) -> LeaderElector:
        return LeaderElector(self.reactor, self.coordinator_client, self.election_config,
                             started_leading, stopped_leading, new_leader,
                             loop_errors=self.metrics)

    def _pool_cache_synced_changed(self, synced: bool) -> None:
        if self.coordinator is not None:
            self.coordinator.set_pool_cache_synced(synced)

    def _certificates_changed(self) -> None:
        """New certificate files: idle connections still use the old ones, drop them."""
        for client in {*self.coordinator_clients.values(), *self.pool_agent_clients.values(),
                       *self.lease_proxy_clients.values()}:
            client.drop_connections()

    # -- what the coordinator calls ----------------------------------------------------------

    def _open_pool_store(self) -> defer.Deferred[PoolStore]:
        """A started pool store over the agent's etcd client, once etcd answered.

        Cancelled (a role change, the agent stopping), it leaves nothing open."""
        coordinator_config, pool_cache = self.config.coordinator, self.config.pool_cache
        # Pool-scoped keys are rebuilt by pool sync when it starts (leader only).
        return open_pool_store(
            self.reactor, self.etcd, coordinator_config.storage_prefix,
            pool_cache.local_cache_dir, pool_scoped_resources=(),
            check_timeout=STORE_CHECK_TIMEOUT, metrics=self.metrics, close_client=False)

    def _upload_local_cache(self, store: IPoolStore) -> defer.Deferred[UploadCounts]:
        pool_cache = self.config.pool_cache
        uploader = LocalCacheUploader(
            store, LocalCacheReader(pool_cache.local_cache_dir),
            pool_cache.upload_resources, metrics=self.metrics, reactor=self.reactor)
        return uploader.upload()

    # -- starting and stopping ----------------------------------------------------------

    def _probers(self) -> list["_Prober"]:
        probers: list[_Prober] = [self.cloud_checker]
        if self.coordinator is not None:
            probers.append(self.coordinator_checker)
            if self.cert_manager is not None:
                probers.append(self.cert_manager)
        return probers

    def _start_probes(self) -> None:
        if self.kubelet_checker is not None:
            self.kubelet_checker.start()
        else:
            self.log.info("kubelet liveness check off (kubelet_healthz_url = off): the node "
                          "{node} is renewed without asking a kubelet",
                          node=self.config.node.name)
        for prober in self._probers():
            # A prober that cannot start (pki_dir not writable) leaves the coordinator
            # unhealthy, which /status and /healthz show; the agent keeps serving.
            defer.maybeDeferred(prober.start).addErrback(self._prober_not_started, prober)

    def _prober_not_started(self, failure: Failure, prober: "_Prober") -> None:
        self.log.error("cannot start {prober} on node {node}: {error}",
                       prober=type(prober).__name__, node=self.config.node.name,
                       error=failure.getErrorMessage())

    def _stop_probes(self) -> defer.Deferred[Any]:
        stops = [defer.maybeDeferred(p.stop) for p in reversed(self._probers())]
        if self.kubelet_checker is not None:
            stops.append(self.kubelet_checker.stop())
        return defer.gatherResults(stops, consumeErrors=True)

    def _start_hub_elector(self, hub_elector: HubElector) -> None:
        """Start the hub elector; its first check waits until every prober has
        answered once (a probe with its retries ends within ``[heartbeat] interval``,
        and the wait ends at the latest ``FIRST_PROBE_SLACK`` later): role ``init``
        means "no health check decided yet", and an elector checking before any
        probe answered would call every starting agent ``pending`` first."""
        probers = [*self.cloud_checker.probers, *self.coordinator_checker.probers]
        answered = defer.DeferredList([p.when_answered() for p in probers],
                                      fireOnOneErrback=True, consumeErrors=True)
        answered.addTimeout(self.config.heartbeat.interval + FIRST_PROBE_SLACK, self.reactor)
        answered.addErrback(lambda failure: failure.trap(defer.TimeoutError))
        hub_elector.start(health_known=answered)

    def _stop_reactor_lag(self) -> None:
        self.reactor_lag.stop()

    def _close_clients(self) -> defer.Deferred[Any]:
        return defer.gatherResults([defer.maybeDeferred(c.close) for c in self._closers],
                                   consumeErrors=True)

    def startService(self) -> None:
        self.log.info("agent {node} of pool {pool} starting (coordinator {enabled})",
                      node=self.config.node.name, pool=self.config.node.pool,
                      enabled="enabled" if self.config.coordinator.enabled else "disabled")
        super().startService()

    @defer.inlineCallbacks
    def stopService(self) -> Generator[defer.Deferred[Any], Any, None]:
        """Stop the stages that started one after the other, in reverse start order:
        the clients close after every stage that uses them, the status pages last."""
        service.Service.stopService(self)
        for stage in reversed(list(self)):
            if stage.running:
                yield self._stop_stage(stage)
        self.log.info("agent {node} stopped", node=self.config.node.name)

    def _stop_stage(self, stage: service.IService) -> defer.Deferred[Any]:
        d = defer.maybeDeferred(stage.stopService)
        d.addTimeout(self.stop_timeout, self.reactor)

        def failed(failure: Failure) -> None:
            self.log.warn("stopping {stage} of agent {node} failed: {error}",
                          stage=stage.name, node=self.config.node.name,
                          error=failure.getErrorMessage() or type(failure.value).__name__)

        return d.addErrback(failed)


def make_service(config: Config, reactor: Any) -> Agent:
    """The agent's root ``MultiService`` for ``config``, using ``reactor`` for all I/O."""
    agent = Agent(config, reactor)
    agent.setName(f"yurtcoord-{config.node.name}")
    return agent
