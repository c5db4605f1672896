"""The one reader of an agent's HTTP surface: its ``/status``, ``/metrics`` and other
pages, one agent or a whole pool at a time.

Both pool worlds read their agents with it: ``inprocess.PoolWorld`` (agents built in
the test process) and ``world.ProcessWorld`` (agents as ``twistd`` children, on
loopback or, in ``partitionworld.PartitionWorld``, inside network namespaces, which is
why the HTTP client can be passed in). So do the tests of the sandbox, whose agents
print their page URLs.
"""

import json
from typing import Any, Callable, Dict, Generator, Mapping, Optional, Tuple

import treq.client
from twisted.internet import defer
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool

from yurtcoord.testing.poll import PollTimeout, poll_until

# Seconds a page read through the default client may take to connect.
CONNECT_TIMEOUT = 2

Statuses = Dict[str, Any]


def parse_metrics(text: str) -> Dict[str, float]:
    """``{name or name{labels}: value}`` of a Prometheus text page."""
    samples: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


class StatusReader:
    """GETs agents' pages: through ``http`` when given, else through a client of its
    own over a non-persistent pool (no idle sockets left behind). ``timeout`` bounds
    each request (None: no bound)."""

    def __init__(self, http: Optional[treq.client.HTTPClient] = None, reactor: Any = None,
                 timeout: Optional[float] = None) -> None:
        if http is None:
            if reactor is None:
                from twisted.internet import reactor as default_reactor
                reactor = default_reactor
            pool = HTTPConnectionPool(reactor, persistent=False)
            http = treq.client.HTTPClient(HTTPAgent(reactor, pool=pool,
                                                    connectTimeout=CONNECT_TIMEOUT))
        self.http = http
        self.timeout = timeout

    @defer.inlineCallbacks
    def get(self, base_url: str, page: str) -> Generator[Any, Any, Tuple[int, bytes]]:
        """``(code, body bytes)`` of ``base_url/page``."""
        response = yield self.http.get(f"{base_url}/{page}", timeout=self.timeout)
        body = yield response.content()
        return response.code, body

    @defer.inlineCallbacks
    def status(self, base_url: str) -> Generator[Any, Any, Any]:
        """The ``/status`` document; an answer other than 200 fails the read."""
        code, body = yield self.get(base_url, "status")
        if code != 200:
            raise AssertionError(f"{base_url}/status answered {code}: {body!r}")
        return json.loads(body)

    @defer.inlineCallbacks
    def metrics(self, base_url: str) -> Generator[Any, Any, Dict[str, float]]:
        """The samples of ``/metrics`` (see ``parse_metrics``)."""
        code, body = yield self.get(base_url, "metrics")
        if code != 200:
            raise AssertionError(f"{base_url}/metrics answered {code}")
        return parse_metrics(body.decode("utf-8"))

    @defer.inlineCallbacks
    def statuses(self, urls: Mapping[str, str]) -> Generator[Any, Any, Statuses]:
        """``{node: /status document}`` of every ``{node: base URL}``, read one by one."""
        documents = {}
        for node, url in urls.items():
            documents[node] = yield self.status(url)
        return documents


@defer.inlineCallbacks
def wait_for_statuses(read: Callable[[], "defer.Deferred[Statuses]"], what: str,
                      predicate: Callable[[Statuses], object], timeout: float, reactor: Any,
                      interval: float = 0.05, details: Callable[[], str] = lambda: "",
                      ) -> Generator[Any, Any, Statuses]:
    """Poll ``read()`` (``{node: /status document}``) until ``predicate`` holds of it;
    the documents.

    On timeout the ``PollTimeout`` names ``what``, the last (role, leader, ready) of
    each agent and ``details()`` (e.g. the agents' log tails).
    """
    seen: Dict[str, Statuses] = {}

    @defer.inlineCallbacks
    def check() -> Generator[Any, Any, object]:
        seen["statuses"] = yield read()
        return predicate(seen["statuses"])

    try:
        yield poll_until(check, timeout, interval, reactor, what=what)
    except PollTimeout as e:
        summary = {n: (s["role"], s["leader"], s["ready"])
                   for n, s in (seen.get("statuses") or {}).items()}
        extra = details()
        raise PollTimeout(f"{e}; last (role, leader, ready): {summary}"
                          + (f"\n{extra}" if extra else "")) from None
    return seen["statuses"]
