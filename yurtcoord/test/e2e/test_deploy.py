"""The RBAC of the deployment manifests (``deploy/``) against what a whole pool of
agents asks of each apiserver.

A pool of agents, each a ``twistd`` process, with TLS to the coordinator (each agent
as its node and as the pool's agent, ``ProcessWorld(identities=True)``), a leader, followers, a follower cut off from the
cloud whose heartbeat the leader forwards, pool sync of every default pool-scoped
resource and the local cache upload: every request the cloud and the coordinator
apiserver logged is allowed by the shipped rules for that apiserver, and every
permission of those rules was used. The permissions and the request that used each
are printed as ``RBAC <apiserver> <permission> <- <request>`` lines.
"""

import json
from typing import Any

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, ENDPOINTSLICES_V1BETA1
from yurtcoord.sim.apiserver.requestlog import request_attributes
from yurtcoord.testing.manifests import (
    COORDINATOR_UNUSED_BY_DESIGN, NODE_AUTHORIZER_RULES, cloud_policy, coordinator_policy)
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.rbac import check_policy, describe_use
from yurtcoord.testing.world import ProcessWorld, leader_of, one_leader_all_ready


def endpoints(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": "default"}, "subsets": []}


def endpoint_slice(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": f"discovery.k8s.io/{version}", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default"}, "addressType": "IPv4",
            "endpoints": []}


STEP_TIMEOUT = 60.0


class PoolRequestsTests(unittest.TestCase):
    """Every request of a whole pool against the shipped rules, both ways."""

    timeout = 240

    def setUp(self):
        # A pool as it runs in production: TLS to the coordinator and etcd, the certs
        # Secret in the cloud, each agent as its node and as the pool's agent.
        self.world = ProcessWorld(reactor, identities=True)
        self.addCleanup(self.world.stop)
        return self.world.start()

    @defer.inlineCallbacks
    def test_every_request_is_allowed_and_every_rule_is_used(self):
        world = self.world
        cloud, coordinator = world.servers()
        cloud.store.create(ENDPOINTS, endpoints("web"))
        cloud.store.create(ENDPOINTSLICES_V1, endpoint_slice("web-v1", "v1"))
        cloud.store.create(ENDPOINTSLICES_V1BETA1, endpoint_slice("web-v1beta1", "v1beta1"))
        nodes = ("edge-1", "edge-2", "edge-3")
        for node in nodes:
            yield world.add_agent(node, pods=3)
        yield world.start_agents()
        statuses = yield world.wait_for_pool(
            "one leader, all ready", lambda s: one_leader_all_ready(s, len(nodes)),
            STEP_TIMEOUT)
        leader = leader_of(statuses)
        cut = sorted(node for node in nodes if node != leader)[0]
        # Pool sync mirrors changes too, not only the first list.
        cloud.store.create(ENDPOINTS, endpoints("api"))
        yield world.cut_cloud([cut])
        yield poll_until(
            lambda: any(r.is_lease_write and r.delegated and r.name == cut
                        for r in cloud.request_log),
            STEP_TIMEOUT, 0.1, reactor, what=f"the leader forwards {cut}'s heartbeat")
        world.restore_cloud([cut])
        yield world.wait_for_pool(
            "all ready again", lambda s: one_leader_all_ready(s, len(nodes)), STEP_TIMEOUT)
        # The pool view reads the cloud too (the pool's Nodes, the node leases).
        agent = world.agents[leader]
        code, body = yield world.reader_for(agent).get(str(agent.url), "pool")
        self.assertEqual(code, 200, body)
        self.assertTrue(json.loads(body)["cloud_read"], body)
        # The pool view then watches the cloud's node leases; that watch must be open
        # before the open watches are ended below, or it would never be logged.
        yield poll_until(
            lambda: any(method == "GET" and path.endswith("/namespaces/kube-node-lease/leases")
                        and query.get("watch") in ("true", "1")
                        for method, path, query in cloud.requests),
            STEP_TIMEOUT, 0.05, reactor, what="the pool view watching the cloud's node leases")
        # A watch is logged when its answer ends: end the open ones, so that every
        # watch the agents made is in the logs.
        logged = {server: len(server.request_log) for server in (cloud, coordinator)}
        watches = {server: server.open_watches for server in (cloud, coordinator)}
        for server in (cloud, coordinator):
            server.faults.end_watches()
        yield poll_until(lambda: all(len(s.request_log) >= logged[s] + watches[s]
                                     for s in (cloud, coordinator)),
                         STEP_TIMEOUT, 0.05, reactor, what="ended watches logged")
        for agent in world.agents.values():
            yield agent.stop()

        # The world's agents read their certs Secret in kube-system, a pool's in the
        # pool's namespace: the cloud rules are those of a pool whose namespace that is.
        # On the coordinator the Node authorizer comes before RBAC.
        checks = (("cloud", cloud, cloud_policy(namespace="kube-system"), {}),
                  ("coordinator", coordinator, coordinator_policy(),
                   {"builtin": NODE_AUTHORIZER_RULES,
                    "unused_by_design": COORDINATOR_UNUSED_BY_DESIGN}))
        for name, server, policy, options in checks:
            self.assertEqual(server.request_log_dropped, 0)
            requests = [request_attributes(record) for record in server.request_log]
            check = check_policy(policy, requests, **options)
            for line in describe_use(check):
                print(f"RBAC {name} {line}")
            self.assertEqual(check.problems, [], f"{name} apiserver")
        # The coordinator saw each agent as its node and as the pool's agent.
        self.assertEqual(set(coordinator.client_subjects),
                         {f"CN=system:node:{node},O=system:nodes" for node in nodes}
                         | {"CN=system:yurthub:pool,O=openyurt:yurthub"})
