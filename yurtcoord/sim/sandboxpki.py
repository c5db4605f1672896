"""The sandbox pool's certificates: one CA of the sandbox's own, in its temp dir.

The sandbox runs its pool as a production pool runs (docs/design.md, "Identities"): the
pool etcd and the coordinator apiservers serve TLS and require client certificates of
one CA, the coordinator apiservers authorize as kube-apiserver's Node authorizer and
NodeRestriction do (``PoolCoordinatorAuthorizer``), the cloud holds the certs Secret
the agents fetch (``kube-system/yurt-coordinator-yurthub-certs``: the CA, the pool's
agents' pair, the node-lease-proxy pair) and each agent writes its node lease on the
coordinator apiservers as its node, with the node's own certificate (``[node]
kubelet_client_cert``). What a person at the sandbox runs against those servers
(``kubectl``, ``etcdctl``) needs certificates too: an admin pair for the coordinator
apiservers, the etcd members' client pair for etcd.

Files in ``directory`` (``SandboxPKI.directory``), all signed by its ``ca.crt``:

=============================================  =========================================
``server.crt``/``.key``                        the coordinator apiservers' (``tls_dir``
                                               of ``KubeAPIServer``)
``admin.crt``/``.key``, ``admin.kubeconfig``   ``CN=admin``, ``O=system:masters``: the
                                               person at the sandbox, to whom the
                                               coordinator apiservers refuse nothing
``yurthub-etcd-client.crt``/``.key``           the certs Secret's pair of the pool's
                                               agents (group ``openyurt:yurthub``), to
                                               etcd and for what the pool shares on the
                                               coordinator apiservers
``node-lease-proxy-client.crt``/``.key``       the certs Secret's pair for delegated
                                               heartbeats
``etcd-server-member-<i>``,                    each etcd member's server pair and a
``etcd-client-member-<i>``                     client pair it accepts (``EtcdCluster``
                                               issues them: ``SandboxEtcd.client_tls``)
=============================================  =========================================

and each node's own certificate and key where its agent's configuration names them
(``node_certificate``), as the kubelet keeps ``kubelet-client-current.pem``.
"""

import os
from dataclasses import dataclass
from typing import Any

from yurtcoord.agent.certs import (
    CA_UNIT, CERTS_SECRET_NAME, NODE_LEASE_PROXY_UNIT, YURTHUB_CLIENT_UNIT,
)
from yurtcoord.agent.poolpki import (
    MASTERS_GROUP, NODE_LEASE_PROXY_CN, YURTHUB_ETCD_CLIENT_CN, secret,
)
from yurtcoord.kube.tls import tls_policy
from yurtcoord.sim.apiserver.authz import POOL_AGENTS_GROUP
from yurtcoord.sim.apiserver.clients import write_kubeconfig
from yurtcoord.sim.pki import CertPair, TestCA, read_pem
from yurtcoord.tx.tlsreload import ReloadingTLSPolicy

# Who the sandbox's own admin is on the coordinator apiservers.
ADMIN_USER = "admin"
# Where the agents look for the certs Secret (``[coordinator] secret_namespace``'s
# default).
SECRET_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class ClientTLS:
    """What a client of the sandbox's pool servers presents: the CA it verifies them
    with and its own pair."""

    ca_file: str
    pair: CertPair

    def etcdctl_flags(self) -> list[str]:
        """``etcdctl``'s flags for this CA and pair."""
        return ["--cacert", self.ca_file, "--cert", self.pair.cert_file,
                "--key", self.pair.key_file]

    def policy(self, name: str) -> ReloadingTLSPolicy:
        """The ``contextFactory`` of a ``twisted.web.client.Agent`` that verifies the
        servers with the CA and presents the pair; ``name`` is what its log events
        say it is for."""
        return tls_policy(ca_file=self.ca_file, cert_file=self.pair.cert_file,
                          key_file=self.pair.key_file, name=name)


class SandboxPKI:
    """The sandbox's CA in ``directory`` and the pairs issued at once (see the module
    doc); ``admin_kubeconfig`` and ``node_certificate`` write the rest once the
    servers listen and the agents' directories are known."""

    def __init__(self, directory: str, pool: str) -> None:
        self.pool = pool
        self.ca = TestCA(directory, common_name=f"yurtcoord-sandbox-ca-{pool}")
        self.directory = directory
        self.ca_file = self.ca.ca_file
        # The coordinator apiservers' pair, under the name their tls_dir is read by.
        self.ca.server_pair("server")
        self.admin = ClientTLS(self.ca_file, self.ca.client_pair(
            "admin", ADMIN_USER, [MASTERS_GROUP]))
        self._pool_agents = self.ca.client_pair(
            "yurthub-etcd-client", YURTHUB_ETCD_CLIENT_CN, [POOL_AGENTS_GROUP])
        self._lease_proxy = self.ca.client_pair("node-lease-proxy-client", NODE_LEASE_PROXY_CN)
        self.kubeconfig_path = os.path.join(directory, "admin.kubeconfig")

    def certs_secret(self) -> dict[str, Any]:
        """The certs Secret the agents fetch from the cloud, with the keys their
        certificate manager reads (``yurtcoord.agent.certs``)."""
        contents = [
            (CA_UNIT, [self.ca.cert_pem]),
            (YURTHUB_CLIENT_UNIT, [read_pem(self._pool_agents.cert_file),
                                   read_pem(self._pool_agents.key_file)]),
            (NODE_LEASE_PROXY_UNIT, [read_pem(self._lease_proxy.cert_file),
                                     read_pem(self._lease_proxy.key_file)]),
        ]
        files = {key: pem for unit, pems in contents
                 for (key, _file), pem in zip(unit.items, pems)}
        return secret(CERTS_SECRET_NAME, files, self.pool, SECRET_NAMESPACE)

    def node_certificate(self, node: str, path: str) -> str:
        """``node``'s own certificate and key in one file at ``path``, as the kubelet
        keeps them (``CN=system:node:<node>``, ``O=system:nodes``); returns ``path``."""
        return self.ca.node_client_pem(node, path)

    def write_admin_kubeconfig(self, server: str) -> str:
        """``admin.kubeconfig``: ``kubectl`` as the admin against ``server`` (any
        coordinator apiserver with ``--server``); returns its path."""
        return write_kubeconfig(self.kubeconfig_path, server, ca_file=self.ca_file,
                                client_pair=self.admin.pair)
