"""The Kubernetes API test server over real sockets with a treq client, for the
test modules that check it over HTTP: in memory, or (``make_storage``) on etcd."""

import json
import shutil
import tempfile
from typing import Any, Callable, Generator

import treq
from twisted.internet import defer, reactor
from twisted.python.failure import Failure
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse

from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.storage import IObjectStorage
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.poll import poll_until

CM = "/api/v1/namespaces/default/configmaps"


def configmap(name: str, labels: dict[str, str] | None = None,
              data: dict[str, str] | None = None,
              namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data or {}}


class WatchReader:
    """Collects the lines of a streaming response as they arrive."""

    def __init__(self, response: IResponse) -> None:
        self.response = response
        self.lines: list[dict[str, Any]] = []
        self.partial = b""
        self.done: defer.Deferred[Any] = treq.collect(response, self._data)
        self.ended: str | Failure | None = None
        self.done.addCallbacks(self._ok, self._failed)

    def _data(self, data: bytes) -> None:
        self.partial += data
        while b"\n" in self.partial:
            line, self.partial = self.partial.split(b"\n", 1)
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"type": "UNPARSEABLE", "raw": line})

    def _ok(self, _: object) -> None:
        self.ended = "clean"

    def _failed(self, failure: Failure) -> None:
        self.ended = failure

    def types(self) -> list[str]:
        return [event["type"] for event in self.lines]


class ServerTestCase(unittest.TestCase):
    """Starts a plain-HTTP server and a non-persistent treq client per test."""

    tls = False
    history = 1000

    def setUp(self) -> Any:
        # trial waits for the Deferred a setUp returns.
        return self._start()

    @defer.inlineCallbacks
    def _start(self) -> Generator[defer.Deferred[Any], Any, None]:
        tls_dir = None
        if self.tls:
            tls_dir = tempfile.mkdtemp(prefix="apiserver-tls-")
            self.addCleanup(shutil.rmtree, tls_dir, True)
            self.ca = TestCA(tls_dir)
            self.ca.server_pair("server")
        self.server = KubeAPIServer(reactor, tls_dir=tls_dir, history=self.history,
                                    bookmark_interval=0.05, storage=self.make_storage())
        self.url = yield self.server.start()
        self.readers: list[WatchReader] = []
        self.addCleanup(self._stop_server)
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.http = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    def make_storage(self) -> IObjectStorage | None:
        """Where the server keeps its objects: None for the in-memory store."""
        return None

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                **kwargs: Any) -> defer.Deferred[Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = kwargs.pop("headers", {b"Content-Type": [b"application/json"]})
        return self.http.request(method, self.url + path, data=data, headers=headers, **kwargs)

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
             **kwargs: Any) -> Generator[defer.Deferred[Any], Any, tuple[int, Any]]:
        response = yield self.request(method, path, body, raw, **kwargs)
        content = yield response.content()
        try:
            decoded = json.loads(content)
        except ValueError:
            decoded = content
        return response.code, decoded

    @defer.inlineCallbacks
    def open_watch(self, path: str) -> Generator[defer.Deferred[Any], Any, WatchReader]:
        response = yield self.request("GET", path)
        self.assertEqual(response.code, 200)
        reader = WatchReader(response)
        self.readers.append(reader)
        return reader

    @defer.inlineCallbacks
    def _stop_server(self) -> Generator[defer.Deferred[Any], Any, None]:
        yield self.server.stop()
        for reader in self.readers:
            yield reader.done

    def wait(self, condition: Callable[[], object], message: str = "condition",
             timeout: float = 10.0) -> defer.Deferred[Any]:
        return poll_until(condition, timeout=timeout, what=message)

    def assertStatus(self, body: dict[str, Any], code: int, reason: str) -> None:
        self.assertEqual(body["kind"], "Status")
        self.assertEqual(body["apiVersion"], "v1")
        self.assertEqual(body["status"], "Failure")
        self.assertEqual(body["code"], code)
        self.assertEqual(body["reason"], reason)
        self.assertTrue(body["message"])
