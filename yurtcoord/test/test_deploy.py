"""The deployment manifests (``deploy/``): they parse, they agree with the agent's
configuration, and their RBAC is exactly what the agents ask of each apiserver.

- Every YAML document deserializes into the official ``kubernetes`` client's model of
  its kind and serializes back to the same document (a misspelt or misplaced field is
  dropped by the model, so the round trip shows it).
- The ConfigMap's ini is a valid configuration once the DaemonSet's init container
  wrote the node name into it, and the DaemonSet mounts what that ini names.
- The RBAC checker (``yurtcoord.testing.rbac``) refuses a request no rule allows and a
  rule no request uses, on small policies and on the shipped one (a removed or added
  rule fails the check).
- A whole pool of agents, each a ``twistd`` process, with TLS to the coordinator (the
  certificates from the certs Secret), a leader, followers, a follower cut off from
  the cloud whose heartbeat the leader forwards, pool sync of every default pool-scoped
  resource and the local cache upload: every request the cloud and the coordinator
  apiserver logged is allowed by the shipped rules for that apiserver, and every
  permission of those rules was used. The permissions and the request that used each
  are printed as ``RBAC <apiserver> <permission> <- <request>`` lines.
"""

import glob
import json
import os
import subprocess
from typing import Any

import yaml
from kubernetes import client as kube_models
from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.agent.config import parse_config
from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, ENDPOINTSLICES_V1BETA1, SECRETS
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.requestlog import RequestAttributes, request_attributes
from yurtcoord.sim.etcd import EtcdProcess, etcd_binary_for
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.inprocess import certs_secret
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.rbac import RBACPolicy, Rule, Subject, check_policy, describe_use
from yurtcoord.testing.world import AgentProcess, ProcessWorld, leader_of, one_leader_all_ready

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
CLOUD_DIR = os.path.join(DEPLOY, "cloud")
COORDINATOR_DIR = os.path.join(DEPLOY, "coordinator")

# Who the agent is to each apiserver: the DaemonSet's ServiceAccount and, for the
# heartbeats the leader forwards, the node-lease-proxy certificate's user on the cloud;
# the yurthub client certificate's user on the coordinator apiserver.
SERVICE_ACCOUNT = Subject("ServiceAccount", "yurtcoord", "kube-system")
NODE_LEASE_PROXY = Subject("User", "openyurt:yurt-coordinator:node-lease-proxy-client")
CLOUD_SUBJECTS = (SERVICE_ACCOUNT, NODE_LEASE_PROXY)
COORDINATOR_SUBJECTS = (Subject("User", "openyurt:yurt-coordinator:yurthub"),)
NODE_NAME_PLACEHOLDER = "@NODE_NAME@"


def documents(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, document)`` of every YAML document under ``directory``."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            for document in yaml.safe_load_all(f):
                if document is not None:
                    found.append((os.path.relpath(path, ROOT), document))
    return found


def cloud_policy() -> RBACPolicy:
    return RBACPolicy.from_documents([d for _, d in documents(CLOUD_DIR)], CLOUD_SUBJECTS)


def coordinator_policy() -> RBACPolicy:
    return RBACPolicy.from_documents([d for _, d in documents(COORDINATOR_DIR)],
                                     COORDINATOR_SUBJECTS)


def the(kind: str, directory: str = CLOUD_DIR) -> dict[str, Any]:
    """The one document of ``kind`` under ``directory``."""
    found = [d for _, d in documents(directory) if d.get("kind") == kind]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} documents of kind {kind} in {directory}")
    return found[0]


def to_model(api: kube_models.ApiClient, document: dict[str, Any], name: str) -> Any:
    """``document`` deserialized into the client's model class ``name``, as the client
    reads an apiserver's JSON answer."""
    return api.deserialize(json.dumps(document), name, "application/json")


def model_class_name(document: dict[str, Any]) -> str:
    """``V1DaemonSet`` for ``apps/v1`` ``DaemonSet``: the client's model of the kind."""
    version = document["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + document["kind"]


class ManifestTests(unittest.TestCase):
    """Each document is a valid object of its kind, and the parts agree."""

    def test_every_document_round_trips_through_its_kubernetes_model(self):
        api = kube_models.ApiClient()
        found = documents(CLOUD_DIR) + documents(COORDINATOR_DIR)
        self.assertGreaterEqual(len(found), 12)
        for path, document in found:
            name = model_class_name(document)
            self.assertTrue(hasattr(kube_models, name), f"{path}: no model {name}")
            model = to_model(api, document, name)
            self.assertIsInstance(model, getattr(kube_models, name))
            self.assertEqual(api.sanitize_for_serialization(model), document,
                             f"{path}: {document['kind']} {document['metadata']['name']} "
                             "does not survive its model (a field the model does not know?)")

    def test_the_round_trip_catches_a_misplaced_field(self):
        api = kube_models.ApiClient()
        daemonset = the("DaemonSet")
        daemonset["spec"]["template"]["spec"]["hostNetwrok"] = True
        model = to_model(api, daemonset, "V1DaemonSet")
        self.assertNotEqual(api.sanitize_for_serialization(model), daemonset)

    def config_text(self) -> str:
        return the("ConfigMap")["data"]["yurtcoord.ini"]

    def test_the_configmap_ini_is_a_valid_configuration_for_a_node(self):
        text = self.config_text()
        self.assertIn(NODE_NAME_PLACEHOLDER, text)
        config = parse_config(text.replace(NODE_NAME_PLACEHOLDER, "edge-7"), "configmap")
        self.assertEqual(config.node.name, "edge-7")
        self.assertEqual(config.cloud.token_file,
                         "/var/run/secrets/kubernetes.io/serviceaccount/token")

    def test_the_daemonset_runs_the_agent_with_what_its_ini_names(self):
        config = parse_config(self.config_text().replace(NODE_NAME_PLACEHOLDER, "edge-7"),
                              "configmap")
        daemonset, configmap = the("DaemonSet"), the("ConfigMap")
        pod = daemonset["spec"]["template"]["spec"]
        (agent,) = pod["containers"]
        (init,) = pod["initContainers"]
        command = agent["command"]
        self.assertEqual([command[0], command[1]], ["twistd", "-n"])
        config_path = command[command.index("--config") + 1]
        self.assertEqual(config_path, "/etc/yurtcoord/yurtcoord.ini")
        self.assertTrue(pod["hostNetwork"])
        self.assertEqual(pod["serviceAccountName"], the("ServiceAccount")["metadata"]["name"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(volumes["config-template"]["configMap"]["name"],
                         configmap["metadata"]["name"])
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
        # The init container writes the ini where the agent reads it.
        self.assertIn(config_path, " ".join(init["command"]))
        self.assertIn(os.path.dirname(config_path), mounts)
        self.assertIn(config.coordinator.pki_dir, mounts)
        self.assertFalse(mounts[config.coordinator.pki_dir].get("readOnly", False))
        self.assertIn(config.pool_cache.local_cache_dir, mounts)
        self.assertEqual(volumes[mounts[config.pool_cache.local_cache_dir]["name"]]
                         ["hostPath"]["path"], "/etc/kubernetes/cache")
        probe = agent["readinessProbe"]["httpGet"]
        self.assertEqual((probe["host"], probe["port"], probe["path"]),
                         (config.server.listen.host, config.server.listen.port, "/readyz"))
        requests = agent["resources"]["requests"]
        self.assertEqual(set(requests), {"cpu", "memory"})
        # Pods of the DaemonSet are those of the ConfigMap's pool.
        pool_label = "apps.openyurt.io/nodepool"
        self.assertEqual(pod["nodeSelector"][pool_label], config.node.pool)

    def test_the_init_container_writes_the_node_name_into_the_ini(self):
        pod = the("DaemonSet")["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        (node_name,) = init["env"]
        self.assertEqual(node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        template_mount, config_mount = (m["mountPath"] for m in init["volumeMounts"])
        # Its shell command, run here with temp dirs in place of its two mounts.
        template_dir, config_dir = self.mktemp(), self.mktemp()
        os.makedirs(template_dir)
        os.makedirs(config_dir)
        with open(os.path.join(template_dir, "yurtcoord.ini"), "w", encoding="utf-8") as f:
            f.write(self.config_text())
        self.assertEqual(init["command"][:2], ["sh", "-c"])
        script = (init["command"][2].replace(template_mount + "/", template_dir + "/")
                  .replace(config_mount + "/", config_dir + "/"))
        subprocess.run(["sh", "-c", script], check=True, timeout=30,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                            node_name["name"]: "edge-7"})
        written = os.path.join(config_dir, "yurtcoord.ini")
        with open(written, encoding="utf-8") as f:
            config = parse_config(f.read(), written)
        self.assertEqual((config.node.name, config.node.pool), ("edge-7", "pool-a"))

    def test_the_dockerfile_starts_the_agent_the_way_the_daemonset_does(self):
        with open(os.path.join(DEPLOY, "Dockerfile"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        self.assertTrue(lines[0].startswith("FROM python:") and lines[0].endswith("-slim"),
                        lines[0])
        (cmd,) = [line for line in lines if line.startswith("CMD ")]
        self.assertEqual(json.loads(cmd[4:]), the("DaemonSet")["spec"]["template"]["spec"]
                         ["containers"][0]["command"])


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
    resource("list", "", "secrets", "kube-system", "yurt-coordinator-yurthub-certs"),
    resource("watch", "", "secrets", "kube-system", "yurt-coordinator-yurthub-certs"),
    resource("list", "", "configmaps", "kube-system", "yurt-hub-cfg"),
    resource("watch", "", "configmaps", "kube-system", "yurt-hub-cfg"),
    resource("get", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    resource("create", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("update", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    non_resource("/api/v1"),
    non_resource("/apis/discovery.k8s.io/v1"),
]
COORDINATOR_REQUESTS = [
    resource("list", "coordination.k8s.io", "leases"),
    resource("watch", "coordination.k8s.io", "leases"),
    resource("list", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("get", "", "nodes", name="edge-1"),
    resource("create", "coordination.k8s.io", "leases", "kube-system"),
    resource("get", "coordination.k8s.io", "leases", "kube-system", "yurthub"),
    resource("update", "coordination.k8s.io", "leases", "kube-system", "yurthub"),
    resource("get", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("update", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("delete", "coordination.k8s.io", "leases", "kube-system", "leader-informer-sync"),
    resource("get", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
    resource("create", "coordination.k8s.io", "leases", "kube-node-lease"),
    resource("update", "coordination.k8s.io", "leases", "kube-node-lease", "edge-1"),
]


class ShippedRulesTests(unittest.TestCase):
    """The shipped rules against the requests the agents make: removing any rule, or
    adding one, fails the check."""

    def test_the_shipped_rules_are_exactly_the_agent_requests(self):
        self.assertEqual(check_policy(cloud_policy(), CLOUD_REQUESTS).problems, [])
        self.assertEqual(check_policy(coordinator_policy(), COORDINATOR_REQUESTS).problems, [])

    def test_removing_any_rule_refuses_some_agent_request(self):
        for policy, requests in ((cloud_policy(), CLOUD_REQUESTS),
                                 (coordinator_policy(), COORDINATOR_REQUESTS)):
            for index, rule in enumerate(policy.rules):
                fewer = RBACPolicy(policy.rules[:index] + policy.rules[index + 1:])
                check = check_policy(fewer, requests)
                self.assertNotEqual(check.denied, [], f"without {rule.describe()}")

    def test_removing_any_verb_refuses_some_agent_request(self):
        policy = coordinator_policy()
        for index, rule in enumerate(policy.rules):
            for verb in rule.verbs:
                narrower = rule._replace(verbs=tuple(v for v in rule.verbs if v != verb))
                rules = policy.rules[:index] + [narrower] + policy.rules[index + 1:]
                check = check_policy(RBACPolicy(rules), COORDINATOR_REQUESTS)
                self.assertNotEqual(check.denied, [], f"{rule.describe()} without {verb}")

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


def endpoints(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": "default"}, "subsets": []}


def endpoint_slice(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": f"discovery.k8s.io/{version}", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default"}, "addressType": "IPv4",
            "endpoints": []}


class CertsProcessWorld(ProcessWorld):
    """A ``ProcessWorld`` whose coordinator apiserver and etcd serve TLS with client
    certificates of a test CA; the agents read those from the certs Secret in the
    cloud (put there by ``start``). The coordinator apiserver keeps its objects in
    that etcd, as its client."""

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor)
        self.ca = TestCA(os.path.join(self.base_dir, "ca"))
        self.ca.server_pair("server")
        self.etcd = EtcdProcess(etcd_binary_for("3.5") or etcd_binary_for("3.4"),
                                tls_ca=self.ca)
        self.coordinator = KubeAPIServer(reactor, tls_dir=self.ca.directory,
                                         storage=self.coordinator_storage())

    @defer.inlineCallbacks
    def start(self):
        yield super().start()
        self.servers()[0].store.create(SECRETS, certs_secret(self.ca))

    def ini_for(self, agent: AgentProcess, **sections: Any) -> str:
        coordinator = {"insecure": "false", **sections.pop("coordinator", {})}
        return super().ini_for(agent, coordinator=coordinator, **sections)


STEP_TIMEOUT = 60.0


class PoolRequestsTests(unittest.TestCase):
    """Every request of a whole pool against the shipped rules, both ways."""

    timeout = 240

    def setUp(self):
        self.world = CertsProcessWorld(reactor)
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

        for name, server, policy in (("cloud", cloud, cloud_policy()),
                                     ("coordinator", coordinator, coordinator_policy())):
            self.assertEqual(server.request_log_dropped, 0)
            requests = [request_attributes(record) for record in server.request_log]
            check = check_policy(policy, requests)
            for line in describe_use(check):
                print(f"RBAC {name} {line}")
            self.assertEqual(check.problems, [], f"{name} apiserver")
        # The coordinator saw the agents' client certificates from the certs Secret.
        self.assertIn("CN=system:node:yurthub,O=system:nodes", coordinator.client_subjects)
