"""The shipped deployment manifests (``deploy/``) as documents, and the RBAC policy
they grant the agent on each apiserver, for the tests that hold the manifests against
the agent's configuration and against the requests the agents make.

The agent's base (``deploy/base``) and the coordinator component name no pool: a pool
overlay (``deploy/pools/<pool>``) writes the pool's name for ``POOL`` in
``yurt-pool-POOL`` (the pool's namespace) and ``yurtcoord:POOL`` (its RBAC objects
outside it). ``for_pool`` does the same to documents read here, so that the unit tier
checks the rules without ``kubectl kustomize``; the integration tier checks that it
gives what the overlay renders."""

import copy
import glob
import os
from typing import Any, Optional

import yaml

from yurtcoord.testing.paths import REPO
from yurtcoord.testing.rbac import RBACPolicy, Rule, Subject

DEPLOY = os.path.join(REPO, "deploy")
BASE_DIR = os.path.join(DEPLOY, "base")
COORDINATOR_DIR = os.path.join(DEPLOY, "coordinator")
EXAMPLE_POOL_DIR = os.path.join(DEPLOY, "pools", "example")
EXAMPLE_POOL = "example"
POOL_LABEL = "apps.openyurt.io/nodepool"
# What a pool overlay replaces in the base and the components.
NAMESPACE_PLACEHOLDER = "yurt-pool-POOL"
RBAC_NAME_PLACEHOLDER = "yurtcoord:POOL"
# The Kubernetes version the manifests are written for and validated against: that of
# the coordinator's kube-apiserver image, whose minor version a test compares.
KUBERNETES_VERSION = "1.32.0"

# Who the agent is to each apiserver: the DaemonSet's ServiceAccount and, for the
# heartbeats the leader forwards, the node-lease-proxy certificate's user on the cloud;
# on the coordinator apiserver, the pool's agents (the certs Secret's pair, group
# openyurt:yurthub), which the Roles are bound to, and each agent's node.
NODE_LEASE_PROXY = Subject("User", "openyurt:yurt-coordinator:node-lease-proxy-client")
POOL_AGENTS = Subject("Group", "openyurt:yurthub")
COORDINATOR_SUBJECTS = (POOL_AGENTS,)

# What kube-apiserver's Node authorizer (with NodeRestriction) allows a node before RBAC
# is asked, as far as the agents use it: its own Node (the node lease names it as
# owner) and its own node's lease in kube-node-lease. The request logs do not say whose
# lease a request wrote; the test server's authorizer holds each node to its own.
NODE_AUTHORIZER_RULES = (
    Rule("Node authorizer", "", ("",), ("nodes",), ("get",)),
    Rule("Node authorizer", "kube-node-lease", ("coordination.k8s.io",), ("leases",),
         ("get", "create", "update")),
)

# Permissions the coordinator Roles grant though no agent request uses them, each
# for a reason: the two named leases are read in every way a client reads one object
# (list and watch of that name) and may be patched as well as updated. Any other
# unused permission fails the check.
COORDINATOR_UNUSED_BY_DESIGN = (
    ("patch", "leases", "yurthub", "kube-system"),
    ("patch", "leases", "leader-informer-sync", "kube-system"),
    ("list", "leases", "yurthub", "kube-system"),
    ("watch", "leases", "yurthub", "kube-system"),
)


def pool_namespace(pool: str) -> str:
    """The namespace a pool overlay gives pool ``pool``."""
    return NAMESPACE_PLACEHOLDER.replace("POOL", pool)


def service_account(namespace: str) -> Subject:
    """The agent's ServiceAccount in the pool's ``namespace``."""
    return Subject("ServiceAccount", "yurtcoord", namespace)


def cloud_subjects(namespace: str) -> tuple[Subject, ...]:
    return (service_account(namespace), NODE_LEASE_PROXY)


def for_pool(document: Any, pool: str = EXAMPLE_POOL,
             namespace: Optional[str] = None) -> Any:
    """``document`` with the pool's name written in as the pool overlay writes it:
    ``yurt-pool-POOL`` becomes ``namespace`` (default ``yurt-pool-<pool>``) and
    ``yurtcoord:POOL`` becomes ``yurtcoord:<pool>`` (also as the start of a longer
    name, ``yurtcoord:POOL:node-lease-proxy``), wherever they are a whole value."""
    namespace = namespace or pool_namespace(pool)
    rbac_name = RBAC_NAME_PLACEHOLDER.replace("POOL", pool)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if value == NAMESPACE_PLACEHOLDER:
            return namespace
        if isinstance(value, str) and (value == RBAC_NAME_PLACEHOLDER or value.startswith(
                RBAC_NAME_PLACEHOLDER + ":")):
            return rbac_name + value[len(RBAC_NAME_PLACEHOLDER):]
        return value

    return walk(copy.deepcopy(document))


def documents(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` of every YAML document under ``directory``, its
    ``kustomization.yaml`` (no Kubernetes object) excepted."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        with open(path, encoding="utf-8") as f:
            for document in yaml.safe_load_all(f):
                if document is not None:
                    found.append((os.path.relpath(path, REPO), document))
    return found


def cloud_policy(pool: str = EXAMPLE_POOL, namespace: Optional[str] = None) -> RBACPolicy:
    """What the shipped cloud manifests grant the agents of pool ``pool`` on the cloud
    apiserver, the pool's objects in ``namespace`` (default ``yurt-pool-<pool>``;
    a test world whose agents read their certs Secret in kube-system passes that)."""
    namespace = namespace or pool_namespace(pool)
    return RBACPolicy.from_documents(
        [for_pool(d, pool, namespace) for _, d in documents(BASE_DIR)],
        cloud_subjects(namespace))


def coordinator_policy() -> RBACPolicy:
    """What the shipped coordinator manifests grant the agent on the coordinator
    apiserver."""
    return RBACPolicy.from_documents([d for _, d in documents(COORDINATOR_DIR)],
                                     COORDINATOR_SUBJECTS)
