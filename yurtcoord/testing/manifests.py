"""The shipped deployment manifests (``deploy/``) as documents, and the RBAC policy
they grant the agent on each apiserver, for the tests that hold the manifests against
the agent's configuration and against the requests the agents make."""

import glob
import os
from typing import Any

import yaml

from yurtcoord.testing.paths import REPO
from yurtcoord.testing.rbac import RBACPolicy, Subject

DEPLOY = os.path.join(REPO, "deploy")
CLOUD_DIR = os.path.join(DEPLOY, "cloud")
COORDINATOR_DIR = os.path.join(DEPLOY, "coordinator")

# Who the agent is to each apiserver: the DaemonSet's ServiceAccount and, for the
# heartbeats the leader forwards, the node-lease-proxy certificate's user on the cloud;
# the yurthub client certificate's user on the coordinator apiserver.
SERVICE_ACCOUNT = Subject("ServiceAccount", "yurtcoord", "kube-system")
NODE_LEASE_PROXY = Subject("User", "openyurt:yurt-coordinator:node-lease-proxy-client")
CLOUD_SUBJECTS = (SERVICE_ACCOUNT, NODE_LEASE_PROXY)
COORDINATOR_SUBJECTS = (Subject("User", "openyurt:yurt-coordinator:yurthub"),)


def documents(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` of every YAML document under ``directory``."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            for document in yaml.safe_load_all(f):
                if document is not None:
                    found.append((os.path.relpath(path, REPO), document))
    return found


def the(kind: str, directory: str = CLOUD_DIR) -> dict[str, Any]:
    """The one document of ``kind`` under ``directory``."""
    found = [d for _, d in documents(directory) if d.get("kind") == kind]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} documents of kind {kind} in {directory}")
    return found[0]


def cloud_policy() -> RBACPolicy:
    """What the shipped cloud manifests grant the agent on the cloud apiserver."""
    return RBACPolicy.from_documents([d for _, d in documents(CLOUD_DIR)], CLOUD_SUBJECTS)


def coordinator_policy() -> RBACPolicy:
    """What the shipped coordinator manifests grant the agent on the coordinator
    apiserver."""
    return RBACPolicy.from_documents([d for _, d in documents(COORDINATOR_DIR)],
                                     COORDINATOR_SUBJECTS)
