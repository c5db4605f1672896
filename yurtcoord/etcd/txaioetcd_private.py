"""Every use of txaioetcd's private names, in one place.

txaioetcd builds its request bodies with ``_marshal()`` methods, parses answers with
``_parse()`` static methods and sends every request through ``Client._post(url, data,
timeout)`` to ``Client._url`` + ``/v3alpha/...``. The adapter in
``yurtcoord.etcd.client`` reuses the first two and routes the third through its own
transport. ``setup.py`` bounds txaioetcd to the versions
``yurtcoord.test.test_private_canaries`` was run on, and those canaries fail with a
message naming what changed when a release moves one of them. Nothing else in the agent
touches a private txaioetcd name (a test scans for it).
"""

from typing import Any, Callable, Protocol

import txaioetcd
from twisted.internet.defer import Deferred

from yurtcoord.tx.twisted_private import QuietHTTPConnectionPool

__all__ = ["GatewayClient", "JSONPoster", "marshal_range_request", "parse_key_value",
           "parse_status", "TXAIOETCD_PREFIX"]

# The gateway prefix txaioetcd puts in front of every path.
TXAIOETCD_PREFIX = "/v3alpha"


class JSONPoster(Protocol):
    """Where ``GatewayClient`` sends txaioetcd's requests: a path under the gateway
    prefix and a JSON-able body in, the parsed JSON answer out."""

    def post(self, path: str, data: dict, timeout: Any) -> Deferred: ...


def marshal_range_request(op: txaioetcd.OpGet) -> dict:
    """The JSON body of a range request for ``op`` (its ``request_range`` part)."""
    return op._marshal()["request_range"]


def parse_key_value(obj: dict) -> txaioetcd.KeyValue:
    """One ``kvs`` entry of a range answer as a ``txaioetcd.KeyValue``."""
    return txaioetcd.KeyValue._parse(obj)


def parse_status(obj: dict) -> txaioetcd.Status:
    """A ``/maintenance/status`` answer as a ``txaioetcd.Status``."""
    return txaioetcd.Status._parse(obj)


class GatewayClient(txaioetcd.Client):
    """txaioetcd's client with its one HTTP call sent through ``transport``.

    txaioetcd's own ``_post`` ignores the pool and agent it was given and posts with
    treq's global pool to ``/v3alpha``; here the path is cut from the URL and handed
    to the transport, which knows the gateway prefix etcd serves.

    txaioetcd's constructor builds an Agent nothing here uses on the pool it is given
    and sets ``noisy`` on that pool's factory class: the pool given is a
    ``QuietHTTPConnectionPool``, whose factory class is the agent's own, so no class
    of Twisted is changed.

    :param refuse: makes the failed Deferred a refused call (``watch``) returns.
    """

    def __init__(self, reactor: Any, url: str, transport: JSONPoster,
                 refuse: Callable[[str], Deferred]):
        txaioetcd.Client.__init__(self, reactor, url=url,
                                  pool=QuietHTTPConnectionPool(reactor, persistent=False))
        self._transport = transport
        self._refuse = refuse

    def _post(self, url: bytes, data: dict, timeout: Any) -> Deferred:
        path = url.decode("utf-8")[len(self._url):]
        if path.startswith(TXAIOETCD_PREFIX + "/"):
            path = path[len(TXAIOETCD_PREFIX):]
        return self._transport.post(path, data, timeout)

    def watch(self, keys: Any, on_watch: Any, filters: Any = None,
              start_revision: Any = None, return_previous: Any = None) -> Deferred:
        """Refused: txaioetcd's watch bypasses the transport and drops split JSON lines."""
        return self._refuse("watch is not supported through this adapter")
