"""Composition root: builds one agent's services from its ``Config``.

``make_service`` is the only place that decides which parts exist and how they are
wired; each part gets what it needs passed in (config values, the reactor, metrics,
the status source). Today the agent serves its status pages with ``InitialStatus``;
the coordinator becomes another child service and the status source of those pages.
"""

from twisted.application import service
from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.metrics import Metrics
from yurtcoord.status import InitialStatus, status_site


class StatusHTTPService(service.Service):
    """Listens on ``[server] listen`` with the status site; stops listening on stop.

    ``port`` is the listening port while running (its ``getHost().port`` is the real
    port when 0 was configured); ``url`` is the base URL of the pages.
    """

    log = Logger()

    def __init__(self, listen, site, reactor):
        self.listen = listen
        self.site = site
        self.reactor = reactor
        self.port = None

    @property
    def url(self):
        if self.port is None:
            return None
        return self.listen.url(self.port.getHost().port)

    def _endpoint(self):
        endpoint_class = TCP6ServerEndpoint if self.listen.is_ipv6 else TCP4ServerEndpoint
        return endpoint_class(self.reactor, self.listen.port, interface=self.listen.host)

    def startService(self):
        """Listen now; a port that cannot be bound fails the start (raises)."""
        super().startService()
        # TCP endpoints listen synchronously: the Deferred has fired when listen returns.
        outcome = []
        self._endpoint().listen(self.site).addBoth(outcome.append)
        if isinstance(outcome[0], Failure):
            self.running = 0
            outcome[0].raiseException()
        self.port = outcome[0]
        self.log.info("status pages listening on {url}", url=self.url)

    def stopService(self):
        super().stopService()
        port, self.port = self.port, None
        if port is None:
            return None
        return port.stopListening()


class Agent(service.MultiService):
    """One yurtcoord agent: its config, metrics, status source and child services."""

    def __init__(self, config, reactor):
        super().__init__()
        self.config = config
        self.reactor = reactor
        self.metrics = Metrics(config.node.name, config.node.pool)
        self.status_source = InitialStatus(
            config.node.name, config.node.pool, config.cloud.servers,
            since=reactor.seconds())
        self.status_http = StatusHTTPService(
            config.server.listen,
            status_site(self.status_source, self.metrics, reactor),
            reactor)
        self.status_http.setName("status-http")
        self.status_http.setServiceParent(self)


def make_service(config, reactor):
    """The agent's root ``MultiService`` for ``config``, using ``reactor`` for all I/O."""
    agent = Agent(config, reactor)
    agent.setName(f"yurtcoord-{config.node.name}")
    return agent
