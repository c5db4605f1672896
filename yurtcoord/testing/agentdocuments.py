"""Documents of an agent's HTTP surface: the keys every ``/status`` document has, and
a ``/pool`` and a ``/status`` document as the tests of ``yurtcoordctl`` serve them
(its tables are formatted from these, and its requests are answered with them)."""

from typing import Any

STATUS_KEYS = {
    "node", "pool", "role", "healthy", "ready", "pool_cache_synced", "local_cache_uploaded",
    "leader", "cloud", "coordinator_healthy", "coordinator_servers", "last_transition",
    "delegated_heartbeats", "uploaded_objects", "etcd_member", "election", "cause",
    "servers_not_probed",
}
"""The keys of every ``/status`` document, whatever the agent's role or health."""

POOL: dict[str, Any] = {
    "node": "edge-1", "pool": "pool-a", "role": "follower", "ready": True,
    "leader": "edge-2",
    "election": {"holder": "edge-2", "lease_age": 0.4, "lease_duration_seconds": 15,
                 "expired": False},
    "members": [
        {"node": "edge-1", "heartbeat": "direct", "stale": False, "lease_age": 1.2,
         "cloud_lease_age": 1.2, "pool_lease_age": 0.7, "leader": False,
         "this_agent": True, "etcd_member": "https://10.0.0.1:2379",
         "coordinator_server": "https://10.0.0.1:6443",
         "upload": {"uploaded": True, "objects": 12}},
        {"node": "edge-2", "heartbeat": "delegated", "stale": False, "lease_age": 3.0,
         "cloud_lease_age": 3.0, "pool_lease_age": 2.5, "leader": True,
         "this_agent": False, "etcd_member": "https://10.0.0.2:2379",
         "coordinator_server": "https://10.0.0.1:6443", "upload": None},
        {"node": "edge-long-name-3", "heartbeat": "stale", "stale": True,
         "lease_age": 125.0, "cloud_lease_age": 125.0, "pool_lease_age": None,
         "leader": False, "this_agent": False, "etcd_member": None,
         "coordinator_server": None, "upload": None},
    ],
    "leader_changes": [{"time": "2026-12-01T20:00:00Z", "at": 1.0, "leader": "edge-1"},
                       {"time": "2026-12-01T20:05:00Z", "at": 2.0, "leader": "edge-2"}],
    "cache": {"synced": True, "informer_sync_lease_age": 0.8, "informer_sync_holder": "edge-2",
              "resources": {"endpoints": 3, "endpointslices.discovery.k8s.io": None}},
    "errors": {},
}
"""What ``/pool`` of a follower answers: a delegated leader, a stale member with a long
name, no upload yet on two members, one resource not yet counted."""

STATUS: dict[str, Any] = {
    "node": "edge-1", "pool": "pool-a", "role": "follower", "healthy": True,
    "ready": False, "pool_cache_synced": True, "local_cache_uploaded": False,
    "leader": None, "cloud": {"https://a:6443": False, "https://b:6443": True},
    "coordinator_healthy": True, "last_transition": "2026-12-01T20:00:00Z",
    "delegated_heartbeats": 0, "uploaded_objects": 0,
}
"""What ``/status`` of a follower answers: not ready, one of two cloud servers
healthy, no leader known."""
