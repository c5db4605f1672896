"""Versions of the certs Secret (``yurt-coordinator-yurthub-certs``) issued by a test
CA, and the files the certificate manager writes of them into its pki_dir, for the
tests of the certificate manager on files and against a cloud API test server."""

import base64
from typing import Any, Mapping

from yurtcoord.agent.certs import CERTS_SECRET_NAME
from yurtcoord.sim.pki import TestCA, read_pem

# The namespace of the certs Secret.
NAMESPACE = "kube-system"
# The files in pki_dir, in the order ``Bundle.files`` gives their contents.
FILES = (
    "yurt-coordinator-ca.crt",
    "yurt-coordinator-yurthub-client.crt", "yurt-coordinator-yurthub-client.key",
    "node-lease-proxy-client.crt", "node-lease-proxy-client.key",
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Bundle:
    """PEM material for one version of the certs Secret, issued by ``ca``."""

    def __init__(self, ca: TestCA, tag: str) -> None:
        self.ca_pem = ca.cert_pem
        hub = ca.client_pair(f"hub-{tag}", f"system:yurthub:{tag}", ["openyurt:yurthub"])
        proxy = ca.client_pair(f"proxy-{tag}", f"system:node-lease-proxy:{tag}")
        self.hub_cert, self.hub_key = read_pem(hub.cert_file), read_pem(hub.key_file)
        self.proxy_cert, self.proxy_key = read_pem(proxy.cert_file), read_pem(proxy.key_file)

    def data(self) -> dict[str, str]:
        """The Secret's ``data``."""
        return {
            "ca.crt": b64(self.ca_pem),
            "yurt-coordinator-yurthub-client.crt": b64(self.hub_cert),
            "yurt-coordinator-yurthub-client.key": b64(self.hub_key),
            "node-lease-proxy-client.crt": b64(self.proxy_cert),
            "node-lease-proxy-client.key": b64(self.proxy_key),
        }

    def files(self) -> dict[str, bytes]:
        """What the manager writes of this version: file name to contents."""
        return dict(zip(FILES, (self.ca_pem, self.hub_cert, self.hub_key,
                                self.proxy_cert, self.proxy_key)))


def secret(data: Mapping[str, Any], name: str = CERTS_SECRET_NAME,
           namespace: str = NAMESPACE) -> dict[str, Any]:
    """The certs Secret with ``data``, as the cloud API server holds it."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace}, "data": data}
