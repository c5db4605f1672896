"""The RBAC checker (``yurtcoord.testing.rbac``) and the rules the deployment manifests
(``deploy/``) ship: the checker refuses a request no rule allows and a rule no request
uses, on small policies and on the shipped one held against the requests the agents of
a pool make (a removed or added rule fails the check). That those are all the requests
a real pool makes is the e2e test of the same name.
"""

from typing import Any

from twisted.trial import unittest

from yurtcoord.agent import poolpki
from yurtcoord.sim.apiserver import authz
from yurtcoord.sim.apiserver.requestlog import RequestAttributes
from yurtcoord.testing.manifests import (
    BASE_DIR, COORDINATOR_DIR, COORDINATOR_SUBJECTS, COORDINATOR_UNUSED_BY_DESIGN, NODE_AUTHORIZER_RULES, NODE_LEASE_PROXY,
    cloud_policy, coordinator_policy, documents, for_pool, pool_namespace, service_account)
from yurtcoord.testing.rbac import RBACPolicy, Rule, Subject, check_policy


def resource(verb: str, group: str, resource: str, namespace: str = "", name: str = "",
             subresource: str = "") -> RequestAttributes:
    return RequestAttributes(verb, group, resource, subresource, namespace, name, "/x")


def non_resource(path: str, verb: str = "get") -> RequestAttributes:
    return RequestAttributes(verb, "", "", "", "", "", path)


RBAC_V1 = "rbac.authorization.k8s.io/v1"
AGENT = Subject("ServiceAccount", "agent", "ns")


def role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str = "",
         ) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC_V1, "kind": kind, "metadata": metadata, "rules": rules}


def binding(kind: str, name: str, role_kind: str, role_name: str, namespace: str = "",
            subjects: tuple[Subject, ...] = (AGENT,)) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC_V1, "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role_name},
            "subjects": [{"kind": s.kind, "name": s.name,
                          **({"namespace": s.namespace} if s.namespace else {})}
                         for s in subjects]}


LEASE_RULE = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
              "verbs": ["get", "update"]}


class RBACCheckerTests(unittest.TestCase):
    """The checker evaluates rules as the RBAC authorizer does, and reports both ways."""

    def check(self, documents, requests, subjects=(AGENT,)):
        return check_policy(RBACPolicy.from_documents(documents, subjects), requests)

    def test_a_role_allows_only_in_its_namespace(self):
        docs = [role("Role", "r", [LEASE_RULE], "a"), binding("RoleBinding", "b", "Role", "r", "a")]
        inside = resource("get", "coordination.k8s.io", "leases", "a", "x")
        update = resource("update", "coordination.k8s.io", "leases", "a", "x")
        outside = resource("get", "coordination.k8s.io", "leases", "b", "x")
        everywhere = resource("list", "coordination.k8s.io", "leases")
        check = self.check(docs, [inside, update, outside, everywhere])
        self.assertEqual(check.denied, [outside, everywhere])
        self.assertEqual(check.unused, [])

    def test_a_clusterrole_bound_by_a_rolebinding_allows_in_that_namespace_only(self):
        docs = [role("ClusterRole", "c", [LEASE_RULE]),
                binding("RoleBinding", "b", "ClusterRole", "c", "a")]
        check = self.check(docs, [resource("get", "coordination.k8s.io", "leases", "a", "x"),
                                  resource("update", "coordination.k8s.io", "leases", "z", "x")])
        self.assertEqual([r.namespace for r in check.denied], ["z"])
        self.assertEqual([p.verb for p in check.unused], ["update"])

    def test_a_clusterrolebinding_allows_everywhere_and_cluster_scoped(self):
        docs = [role("ClusterRole", "c", [{"apiGroups": [""], "resources": ["nodes"],
                                           "verbs": ["get"]}]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c")]
        check = self.check(docs, [resource("get", "", "nodes", name="n1")])
        self.assertEqual(check.problems, [])

    def test_groups_resources_subresources_and_verbs_must_all_match(self):
        docs = [role("ClusterRole", "c", [{"apiGroups": [""], "resources": ["nodes/status"],
                                           "verbs": ["patch"]}]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c")]
        status = resource("patch", "", "nodes", name="n", subresource="status")
        node = resource("patch", "", "nodes", name="n")
        other_group = resource("patch", "example.com", "nodes", name="n", subresource="status")
        other_verb = resource("update", "", "nodes", name="n", subresource="status")
        check = self.check(docs, [status, node, other_group, other_verb])
        self.assertEqual(check.denied, [node, other_group, other_verb])

    def test_resource_names_allow_a_list_or_watch_of_that_name_only(self):
        docs = [role("Role", "r", [{"apiGroups": [""], "resources": ["secrets"],
                                    "resourceNames": ["certs"], "verbs": ["list", "watch"]}],
                     "kube-system"),
                binding("RoleBinding", "b", "Role", "r", "kube-system")]
        by_name = resource("watch", "", "secrets", "kube-system", "certs")
        listed = resource("list", "", "secrets", "kube-system", "certs")
        all_of_them = resource("list", "", "secrets", "kube-system")
        other = resource("watch", "", "secrets", "kube-system", "token")
        check = self.check(docs, [by_name, listed, all_of_them, other])
        self.assertEqual(check.denied, [all_of_them, other])
        self.assertEqual(check.unused, [])

    def test_each_verb_resource_and_name_of_a_rule_must_be_used(self):
        docs = [role("Role", "r", [{"apiGroups": ["coordination.k8s.io"],
                                    "resources": ["leases"], "resourceNames": ["a", "b"],
                                    "verbs": ["get", "update"]}], "n"),
                binding("RoleBinding", "b", "Role", "r", "n")]
        check = self.check(docs, [resource("get", "coordination.k8s.io", "leases", "n", "a"),
                                  resource("update", "coordination.k8s.io", "leases", "n", "a"),
                                  resource("get", "coordination.k8s.io", "leases", "n", "b")])
        self.assertEqual([(p.verb, p.name) for p in check.unused], [("update", "b")])
        self.assertEqual(check.problems,
                         ["unused: update coordination.k8s.io leases b in n "
                          "(Role n/r (bound by RoleBinding b) rule 1)"])

    def test_a_rule_whose_requests_another_rule_allows_is_redundant(self):
        docs = [role("ClusterRole", "c", [LEASE_RULE]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c"),
                role("Role", "r", [{**LEASE_RULE, "verbs": ["get"]}], "n"),
                binding("RoleBinding", "b", "Role", "r", "n")]
        check = self.check(docs, [resource("get", "coordination.k8s.io", "leases", "n", "a"),
                                  resource("update", "coordination.k8s.io", "leases", "n", "a"),
                                  resource("get", "coordination.k8s.io", "leases", "m", "a")])
        self.assertEqual([(p.rule.role.split()[0], p.verb) for p in check.redundant],
                         [("Role", "get")])

    def test_wildcards_are_reported(self):
        docs = [role("ClusterRole", "c", [{"apiGroups": ["*"], "resources": ["leases"],
                                           "verbs": ["get"]}]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c")]
        check = self.check(docs, [resource("get", "coordination.k8s.io", "leases", "n", "a")])
        self.assertEqual(check.denied, [])
        self.assertEqual(len(check.wildcards), 1)
        self.assertIn("wildcard", check.problems[0])

    def test_only_bindings_of_the_subjects_count(self):
        other = Subject("User", "someone-else")
        docs = [role("ClusterRole", "c", [LEASE_RULE]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c", subjects=(other,))]
        check = self.check(docs, [resource("get", "coordination.k8s.io", "leases", "n", "a")])
        self.assertEqual(len(check.denied), 1)
        self.assertEqual(check.unused, [])

    def test_a_binding_of_a_missing_role_is_an_error(self):
        docs = [binding("ClusterRoleBinding", "b", "ClusterRole", "gone")]
        with self.assertRaisesRegex(ValueError, "ClusterRoleBinding b: roleRef ClusterRole "
                                                "gone is not among the documents"):
            RBACPolicy.from_documents(docs, [AGENT])

    def test_discovery_is_allowed_by_the_builtin_role_and_other_urls_are_not(self):
        docs = [role("ClusterRole", "c", [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
                binding("ClusterRoleBinding", "b", "ClusterRole", "c")]
        check = self.check(docs, [non_resource("/api/v1"), non_resource("/apis/x.io/v1"),
                                  non_resource("/metrics"), non_resource("/debug/pprof")])
        self.assertEqual([r.path for r in check.denied], ["/debug/pprof"])
        self.assertEqual(check.unused, [])


# What the agents of a pool ask, as the pool test below sees it; the unit tests of the
# shipped rules use it so that they run without a pool.
CLOUD_REQUESTS = [
    resource("get", "", "nodes", name="edge-1"),
    resource("list", "", "nodes"),
    resource("watch", "", "nodes"),
    resource("list", "", "endpoints"),
    resource("watch", "", "endpoints"),
    resource("list", "discovery.k8s.io", "endpointslices"),
    resource("watch", "discovery.k8s.io", "endpointslices"),
    # In the pool's namespace, [coordinator] secret_namespace.
    resource("list", "", "secrets", "yurt-pool-example", "yurt-coordinator-yurthub-certs"),
    resource("watch", "", "secrets", "yurt-pool-example", "yurt-coordinator-yurthub-certs"),
    resource("list", "", "configmaps", "kube-system", "yurt-hub-cfg"),
    resource("watch", "", "configmaps", "kube-system", "yurt-hub-cfg"),
    resource("get", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    resource("create", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("update", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    # The /pool view's informer of the node leases (filtered to the members).
    resource("list", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("watch", "coordination.k8s.io", "leases", "kube-node-lease"),
    non_resource("/api/v1"),
    non_resource("/apis/discovery.k8s.io/v1"),
]
COORDINATOR_REQUESTS = [
    # As the pool's agents: the leader's informer of the pool's node leases, the pool
    # view's list of them; the synced detector's watch of the informer sync lease by
    # name; the election; the informer sync lease.
    resource("list", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("watch", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("list", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("watch", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("create", "coordination.k8s.io", "leases", "kube-system"),
    resource("get", "coordination.k8s.io", "leases", "kube-system", "yurthub"),
    resource("update", "coordination.k8s.io", "leases", "kube-system", "yurthub"),
    resource("get", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("update", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("delete", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    # As its node, allowed by the Node authorizer, not by RBAC: its own Node and its
    # own node's lease.
    resource("get", "", "nodes", name="edge-1"),
    resource("get", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    resource("create", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("update", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
]


def check_coordinator(policy: RBACPolicy, requests=COORDINATOR_REQUESTS):
    """The coordinator's check as the e2e test makes it: the Node authorizer first,
    the permissions granted by design not reported unused."""
    return check_policy(policy, requests, builtin=NODE_AUTHORIZER_RULES,
                        unused_by_design=COORDINATOR_UNUSED_BY_DESIGN)


class ShippedRulesTests(unittest.TestCase):
    """The shipped rules against the requests the agents make: removing any rule, or
    adding one, fails the check."""

    def test_the_shipped_rules_are_exactly_the_agent_requests(self):
        self.assertEqual(check_policy(cloud_policy(), CLOUD_REQUESTS).problems, [])
        self.assertEqual(check_coordinator(coordinator_policy()).problems, [])

    def test_removing_any_rule_refuses_some_agent_request(self):
        for policy, check in ((cloud_policy(), lambda p: check_policy(p, CLOUD_REQUESTS)),
                              (coordinator_policy(), check_coordinator)):
            for index, rule in enumerate(policy.rules):
                fewer = RBACPolicy(policy.rules[:index] + policy.rules[index + 1:])
                self.assertNotEqual(check(fewer).denied, [], f"without {rule.describe()}")

    def test_removing_any_used_verb_refuses_some_agent_request(self):
        policy = coordinator_policy()
        by_design = {verb for verb, *_ in COORDINATOR_UNUSED_BY_DESIGN}
        for index, rule in enumerate(policy.rules):
            for verb in rule.verbs:
                if verb in by_design:
                    continue
                narrower = rule._replace(verbs=tuple(v for v in rule.verbs if v != verb))
                rules = policy.rules[:index] + [narrower] + policy.rules[index + 1:]
                check = check_coordinator(RBACPolicy(rules))
                self.assertNotEqual(check.denied, [], f"{rule.describe()} without {verb}")

    def test_the_coordinator_rules_are_namespaced_and_write_no_node_lease(self):
        """No ClusterRole on the coordinator: the pool's agents' rules name a
        namespace, write no node lease, and in kube-system touch only the two named
        leases (and create, which RBAC cannot limit by name); a node's own requests
        are the Node authorizer's, RBAC grants nodes nothing."""
        policy = coordinator_policy()
        self.assertEqual({rule.namespace for rule in policy.rules},
                         {"kube-node-lease", "kube-system"})
        for rule in policy.rules:
            if rule.namespace == "kube-node-lease":
                self.assertEqual(set(rule.verbs), {"list", "watch"}, rule.describe())
            elif "create" not in rule.verbs:
                self.assertTrue(rule.resource_names, rule.describe())
                self.assertTrue(set(rule.resource_names)
                                <= {"yurthub", "leader-informer-sync"}, rule.describe())
        nodes = RBACPolicy.from_documents(
            [d for _, d in documents(COORDINATOR_DIR)], [Subject("Group", "system:nodes")])
        self.assertEqual(nodes.rules, [])
        self.assertEqual(check_policy(policy, COORDINATOR_REQUESTS).denied, [
            resource("get", "", "nodes", name="edge-1"),
            resource("get", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
            resource("create", "coordination.k8s.io", "leases", "kube-node-lease"),
            resource("update", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1")])

    def test_the_roles_are_bound_to_the_group_of_the_pool_certificates(self):
        """The coordinator's Roles, the pool's agents' pair of ``yurtcoordctl pki``
        and the test server's authorizer name one group."""
        self.assertEqual(COORDINATOR_SUBJECTS, (Subject("Group", poolpki.POOL_AGENTS_GROUP),))
        self.assertEqual(poolpki.POOL_AGENTS_GROUP, authz.POOL_AGENTS_GROUP)

    def test_permissions_granted_by_design_are_granted_and_unused(self):
        """Each of them is in the shipped rules and no agent request uses it: the list
        hides nothing the agents do, and nothing the rules no longer grant."""
        check = check_policy(coordinator_policy(), COORDINATOR_REQUESTS,
                             builtin=NODE_AUTHORIZER_RULES)
        unused = {(p.verb, p.resource, p.name, p.rule.namespace) for p in check.unused}
        self.assertEqual(unused, set(COORDINATOR_UNUSED_BY_DESIGN))

    def test_the_shared_service_account_writes_no_lease(self):
        """Every agent of a pool shares the ServiceAccount: it may read the node leases
        but write none (each agent writes its own as its node, the Node authorizer's
        business; the leader the forwarded ones as node-lease-proxy)."""
        documents_of_pool = [for_pool(d) for _, d in documents(BASE_DIR)]
        shared = RBACPolicy.from_documents(documents_of_pool,
                                           [service_account(pool_namespace("example"))])
        writes = [rule.describe() for rule in shared.rules if "leases" in rule.resources
                  and set(rule.verbs) & {"create", "update", "patch", "delete"}]
        self.assertEqual(writes, [])
        proxy = RBACPolicy.from_documents(documents_of_pool, [NODE_LEASE_PROXY])
        (rule,) = proxy.rules
        self.assertEqual((rule.namespace, rule.resources, set(rule.verbs)),
                         ("kube-node-lease", ("leases",), {"get", "create", "update"}))

    def test_the_pool_overlay_names_the_pool_in_the_base(self):
        """``for_pool`` writes the pool's namespace and RBAC names as the overlay does
        (the integration tier compares it with ``kubectl kustomize``), and nothing of
        the base names a pool once it did."""
        for _, document in documents(BASE_DIR):
            text = repr(for_pool(document, "edge-west"))
            self.assertNotIn("yurt-pool-POOL", text)
            self.assertNotIn("yurtcoord:POOL", text)
        (account,) = [for_pool(d, "edge-west") for _, d in documents(BASE_DIR)
                      if d["kind"] == "ServiceAccount"]
        self.assertEqual(account["metadata"]["namespace"], pool_namespace("edge-west"))
        self.assertEqual(pool_namespace("edge-west"), "yurt-pool-edge-west")

    def test_an_extra_rule_or_verb_is_unused(self):
        policy = cloud_policy()
        extra_rule = Rule("ClusterRole extra", "", ("",), ("pods",), ("get",))
        check = check_policy(RBACPolicy(policy.rules + [extra_rule]), CLOUD_REQUESTS)
        self.assertEqual([p.describe() for p in check.unused],
                         ["get core pods cluster-wide (ClusterRole extra)"])
        first = policy.rules[0]
        wider = first._replace(verbs=first.verbs + ("patch",))
        check = check_policy(RBACPolicy([wider] + policy.rules[1:]), CLOUD_REQUESTS)
        self.assertEqual([p.verb for p in check.unused], ["patch"])
        named = policy.rules[-1]
        check = check_policy(RBACPolicy(policy.rules + [named._replace(role="copy")]),
                             CLOUD_REQUESTS)
        self.assertNotEqual(check.redundant, [])
