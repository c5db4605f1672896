"""Helpers for tests that talk to the test API server: a kubeconfig for
kubectl and client-go style clients, and a bounded poll."""

import time

import yaml
from twisted.internet import defer
from twisted.internet.task import deferLater


def write_kubeconfig(path, url, ca_file=None, client_pair=None, namespace="default"):
    """Write a kubeconfig pointing at ``url``; with TLS, ``ca_file`` verifies the
    server and ``client_pair`` (a pki.CertPair) authenticates the client."""
    cluster = {"server": url}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    user = {}
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
def poll_until(reactor, condition, timeout=10.0, interval=0.005, message="condition"):
    """Check ``condition()`` every ``interval`` seconds until it is true (returns
    its value) or ``timeout`` seconds of wall time pass (raises AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        yield deferLater(reactor, interval, lambda: None)
