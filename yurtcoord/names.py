"""Well-known object names, labels and annotations the agents of a pool agree on.

Each name is a contract with something outside one module (the kubelet, the cloud's
Node objects, the peers of the pool, the operator's configuration), so it lives here
once and every part that needs it imports it from here rather than from the part that
happens to write it first.
"""

# Namespace of every node's heartbeat Lease, named after its node (the kubelet's
# convention, on the cloud and on the coordinator apiserver alike).
NODE_LEASE_NAMESPACE = "kube-node-lease"

# A node lease written to the coordinator apiserver with this annotation set to
# "true" asks the pool leader to forward it to the cloud.
DELEGATE_HEARTBEAT_ANNOTATION = "openyurt.io/delegate-heartbeat"

# What the agent of a node lease uses, set on the lease it writes to the coordinator
# apiserver so that every agent of the pool can show it: the pool etcd member its pool
# store's requests go to (absent while it has no pool store open) and the coordinator
# apiserver the write went through. URLs without userinfo, query or fragment; the
# leader never forwards them to the cloud.
ETCD_MEMBER_ANNOTATION = "coordinator.openyurt.io/etcd-member"
COORDINATOR_SERVER_ANNOTATION = "coordinator.openyurt.io/apiserver"

# The label naming a Node's pool.
NODE_POOL_LABEL = "apps.openyurt.io/nodepool"

# The election Lease on the coordinator apiserver, unless ``[leader_election]``
# names another.
ELECTION_LEASE_NAMESPACE = "kube-system"
ELECTION_LEASE_NAME = "yurthub"

# The Lease the leader renews on the coordinator apiserver while its pool sync is
# current; followers trust the pool cache only while it is fresh.
INFORMER_SYNC_LEASE_NAMESPACE = "kube-system"
INFORMER_SYNC_LEASE_NAME = "leader-informer-sync"

# The cloud Secret (in ``[coordinator] secret_namespace``) holding the coordinator's
# certificates.
CERTS_SECRET_NAME = "yurt-coordinator-yurthub-certs"

# The cloud ConfigMap whose key lists the pool-scoped resources beyond the defaults.
POOL_SCOPE_CONFIGMAP_NAMESPACE = "kube-system"
POOL_SCOPE_CONFIGMAP_NAME = "yurt-hub-cfg"
POOL_SCOPE_CONFIGMAP_KEY = "pool_scope_resources"

__all__ = [
    "NODE_LEASE_NAMESPACE", "DELEGATE_HEARTBEAT_ANNOTATION", "ETCD_MEMBER_ANNOTATION",
    "COORDINATOR_SERVER_ANNOTATION", "NODE_POOL_LABEL",
    "ELECTION_LEASE_NAMESPACE", "ELECTION_LEASE_NAME",
    "INFORMER_SYNC_LEASE_NAMESPACE", "INFORMER_SYNC_LEASE_NAME", "CERTS_SECRET_NAME",
    "POOL_SCOPE_CONFIGMAP_NAMESPACE", "POOL_SCOPE_CONFIGMAP_NAME", "POOL_SCOPE_CONFIGMAP_KEY",
]
