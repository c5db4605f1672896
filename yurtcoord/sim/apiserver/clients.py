"""Helpers for tests that talk to the test API server: a kubeconfig for
kubectl and client-go style clients, and the server with a ``KubeClient`` on it."""

from typing import Any

import yaml
from twisted.internet import defer

from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.sim.apiserver.server import KubeAPIServer
from yurtcoord.sim.pki import CertPair


def write_kubeconfig(path: str, url: str, ca_file: str | None = None,
                     client_pair: CertPair | None = None, namespace: str = "default") -> str:
    """Write a kubeconfig pointing at ``url``; with TLS, ``ca_file`` verifies the
    server and ``client_pair`` (a pki.CertPair) authenticates the client."""
    cluster = {"server": url}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    user: dict[str, str] = {}
    if client_pair is not None:
        user = {"client-certificate": client_pair.cert_file,
                "client-key": client_pair.key_file}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {
            "cluster": "test", "user": "test", "namespace": namespace}}],
        "current-context": "test",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path



@defer.inlineCallbacks
def start_server_with_client(case: Any, reactor: Any, client_timeout: float = ClientConfig.timeout,
                             **server_options: Any) -> Any:

    """Start a ``KubeAPIServer`` (plain http, free port, ``server_options``) and a
    ``KubeClient`` on it; ``case``'s cleanups close the client, then stop the server.

    Fires with ``(server, client)``.
    """
    server = KubeAPIServer(reactor, **server_options)
    url = yield server.start(port=0)
    case.addCleanup(server.stop)
    client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=client_timeout))
    case.addCleanup(client.close)
    return server, client
