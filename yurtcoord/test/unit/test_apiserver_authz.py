"""The pool coordinator's authorization of the API test server, as a decision table:
who (user, groups) asks what (verb, namespace, resource, name, the body's name of a
create, a list's field selector), and whether it is allowed or refused with which
Status. Requests are read from method, path and query as the server reads them."""

import json
import os
from urllib.parse import quote, urlencode

from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.sim.apiserver.authz import (
    AUTHENTICATED_GROUP, IAuthorizer, ONLY_LEASE_VERBS, ONLY_NODE_LEASE_NAMESPACE,
    ONLY_OWN_LEASE, POOL_AGENTS_GROUP, UNAUTHORIZED, PoolCoordinatorAuthorizer, Refusal,
    User)
from yurtcoord.sim.apiserver.requestlog import (
    LoggedRequest, attributes_of, json_line, logged_request, read_request_log)

NODES = "system:nodes"
MASTERS = "system:masters"
_METHOD_OF_VERB = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST",
                   "update": "PUT", "patch": "PATCH", "delete": "DELETE",
                   "deletecollection": "DELETE"}


def path_of(resource: str, namespace: str = "", name: str = "") -> str:
    """The URL path of a resource, as a client writes it (names escaped)."""
    base = ("/apis/coordination.k8s.io/v1" if resource == "leases" else "/api/v1")
    if namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{resource}"
    return f"{base}/{quote(name, safe='')}" if name else base


def ask(authorizer: PoolCoordinatorAuthorizer, user: str, groups: tuple[str, ...],
        verb: str, namespace: str, resource: str, name: str = "", body_name: str = "",
        field_selector: str = "") -> Refusal | None:
    """The decision on one request, sent as a client sends it."""
    query: dict[str, str] = {}
    if verb == "watch":
        query["watch"] = "true"
    if field_selector:
        query["fieldSelector"] = field_selector
    path = path_of(resource, namespace, "" if verb in ("create", "list", "watch") else name)
    attributes = attributes_of(_METHOD_OF_VERB[verb], path, urlencode(query))
    self_check = verb if verb != "get" or name else "list"
    assert attributes.verb == self_check, (attributes, verb)
    subject = User.from_subject([user], groups)
    assert subject is not None
    return authorizer.authorize(subject, attributes, body_name)


def node(name: str) -> tuple[str, tuple[str, ...]]:
    return f"system:node:{name}", (NODES,)


# The pool's agents' shared coordinator identity (the certs Secret's client pair).
POOL_AGENT = ("openyurt:yurt-coordinator:yurthub", (POOL_AGENTS_GROUP,))


def forbidden(name: str, message_tail: str, kind: str = "leases",
              group: str = "coordination.k8s.io") -> Refusal:
    qualified = f"{kind}.{group}" if group else kind
    subject = f'{qualified} "{name}"' if name else qualified
    return Refusal(403, "Forbidden", f"{subject} is forbidden: {message_tail}", name,
                   group, kind)


def lease_refusal(verb: str, namespace: str, reason: str, name: str = "",
                  user: str = "system:node:edge-1") -> Refusal:
    """The authorizer's refusal of a lease request of ``user``, with the Node
    authorizer's ``reason`` ("": RBAC's refusal, which gives none)."""
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    tail = f": {reason}" if reason else ""
    return forbidden(name, f'User "{user}" cannot {verb} resource "leases" in API group '
                           f'"coordination.k8s.io" {where}{tail}')


class DecisionTableTests(unittest.TestCase):

    def setUp(self):
        self.authorizer = PoolCoordinatorAuthorizer()

    def decide(self, who, *request, **options):
        """The decision on ``request`` (verb, namespace, resource, name; ``options``
        body_name, field_selector) of ``who`` (user, groups)."""
        user, groups = who
        return ask(self.authorizer, user, groups, *request, **options)

    def assertAllowed(self, who, *request, **options):
        self.assertIsNone(self.decide(who, *request, **options), (who, request, options))

    def assertRefused(self, who, *request, **options):
        """The refusal of a request that must be refused 403 Forbidden."""
        decision = self.decide(who, *request, **options)
        self.assertIsNotNone(decision, (who, request, options))
        self.assertEqual((decision.code, decision.reason), (403, "Forbidden"))
        return decision

    def test_is_an_authorizer(self):
        self.assertTrue(verifyObject(IAuthorizer, self.authorizer))

    def test_node_writes_its_own_lease(self):
        for verb in ("update", "patch", "delete"):
            self.assertAllowed(node("edge-1"), verb, "kube-node-lease", "leases", "edge-1")
        self.assertAllowed(node("edge-1"), "create", "kube-node-lease", "leases",
                           body_name="edge-1")

    def test_node_updates_another_nodes_lease(self):
        decision = self.decide(node("edge-1"), "update", "kube-node-lease", "leases",
                               "edge-2")
        self.assertEqual(decision, forbidden(
            "edge-2", 'User "system:node:edge-1" cannot update resource "leases" in API '
            'group "coordination.k8s.io" in the namespace "kube-node-lease": '
            "can only access node lease with the same name as the requesting node"))
        self.assertEqual(decision.status(), {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": decision.message, "reason": "Forbidden",
            "details": {"name": "edge-2", "group": "coordination.k8s.io", "kind": "leases"},
            "code": 403})
        self.assertEqual(list(decision.status()), [
            "kind", "apiVersion", "metadata", "status", "message", "reason", "details",
            "code"])
        for verb in ("patch", "delete"):
            decision = self.assertRefused(node("edge-1"), verb, "kube-node-lease", "leases",
                                          "edge-2")
            self.assertTrue(decision.message.endswith(": " + ONLY_OWN_LEASE))
            self.assertIn(f"cannot {verb} resource", decision.message)

    def test_node_creates_another_nodes_lease(self):
        # The Node authorizer allows the create; NodeRestriction refuses it by the
        # name in the object.
        decision = self.decide(node("edge-1"), "create", "kube-node-lease", "leases",
                               body_name="edge-2")
        self.assertEqual(decision, forbidden("edge-2", ONLY_OWN_LEASE))
        self.assertEqual(
            decision.message, 'leases.coordination.k8s.io "edge-2" is forbidden: '
            "can only access node lease with the same name as the requesting node")
        # A body without a name (a generateName only) names no lease of the node.
        decision = self.decide(node("edge-1"), "create", "kube-node-lease", "leases")
        self.assertEqual(decision, forbidden("Unknown", ONLY_OWN_LEASE))

    def test_node_reads_only_its_own_lease(self):
        self.assertAllowed(node("edge-1"), "get", "kube-node-lease", "leases", "edge-1")
        decision = self.assertRefused(node("edge-1"), "get", "kube-node-lease", "leases",
                                      "edge-2")
        self.assertEqual(decision, lease_refusal("get", "kube-node-lease", ONLY_OWN_LEASE,
                                                 "edge-2"))
        for verb in ("list", "watch"):
            decision = self.assertRefused(node("edge-1"), verb, "kube-node-lease", "leases")
            self.assertEqual(decision, lease_refusal(verb, "kube-node-lease",
                                                     ONLY_LEASE_VERBS))

    def test_pool_agents_read_every_node_lease_and_write_none(self):
        # As the pool's Role grants: list and watch, no get (nothing asks for one).
        self.assertRefused(POOL_AGENT, "get", "kube-node-lease", "leases", "edge-2")
        self.assertAllowed(POOL_AGENT, "list", "kube-node-lease", "leases")
        self.assertAllowed(POOL_AGENT, "watch", "kube-node-lease", "leases")
        self.assertAllowed(POOL_AGENT, "watch", "kube-node-lease", "leases",
                           field_selector="metadata.name=edge-3")
        for verb in ("update", "patch", "delete"):
            decision = self.assertRefused(POOL_AGENT, verb, "kube-node-lease", "leases",
                                          "edge-2")
            self.assertEqual(decision, lease_refusal(
                verb, "kube-node-lease", "", "edge-2", user=POOL_AGENT[0]))
        self.assertRefused(POOL_AGENT, "create", "kube-node-lease", "leases",
                           body_name="edge-2")
        self.assertRefused(POOL_AGENT, "list", "", "leases")
        self.assertRefused(POOL_AGENT, "get", "", "nodes", "edge-1")

    def test_node_deletes_no_collection_of_leases(self):
        decision = self.assertRefused(node("edge-1"), "deletecollection", "kube-node-lease",
                                      "leases")
        self.assertEqual(decision, lease_refusal("deletecollection", "kube-node-lease",
                                                 ONLY_LEASE_VERBS))

    def test_named_leases_by_name(self):
        for name in ("yurthub", "leader-informer-sync"):
            for verb in ("get", "update", "patch", "delete"):
                self.assertAllowed(POOL_AGENT, verb, "kube-system", "leases", name)
            self.assertAllowed(POOL_AGENT, "create", "kube-system", "leases",
                               body_name=name)
            for verb in ("list", "watch"):
                self.assertAllowed(POOL_AGENT, verb, "kube-system", "leases",
                                   field_selector=f"metadata.name={name}")
                self.assertAllowed(POOL_AGENT, verb, "kube-system", "leases",
                                   field_selector=f"metadata.name=={name}")
            self.assertRefused(POOL_AGENT, "update", "kube-system", "leases", "other")
            self.assertRefused(POOL_AGENT, "create", "kube-system", "leases",
                               body_name="other")

    def test_nodes_write_no_named_lease(self):
        # NodeRestriction refuses a node's lease writes outside kube-node-lease: what
        # the pool shares is written as the pool's agent.
        for name in ("yurthub", "leader-informer-sync"):
            decision = self.assertRefused(node("edge-1"), "update", "kube-system", "leases",
                                          name)
            self.assertEqual(decision, lease_refusal("update", "kube-system",
                                                     ONLY_NODE_LEASE_NAMESPACE, name))
            self.assertRefused(node("edge-1"), "create", "kube-system", "leases",
                               body_name=name)

    def test_other_leases_in_kube_system(self):
        self.assertEqual(ONLY_NODE_LEASE_NAMESPACE,
                         'can only access leases in the "kube-node-lease" system namespace')
        decision = self.assertRefused(node("edge-1"), "update", "kube-system", "leases",
                                      "other")
        self.assertEqual(decision, lease_refusal("update", "kube-system",
                                                 ONLY_NODE_LEASE_NAMESPACE, "other"))
        decision = self.assertRefused(node("edge-1"), "create", "kube-system", "leases",
                                      body_name="other")
        self.assertEqual(decision, lease_refusal("create", "kube-system",
                                                 ONLY_NODE_LEASE_NAMESPACE, "other"))
        self.assertRefused(node("edge-1"), "get", "kube-system", "leases", "other")

    def test_named_leases_listed_only_by_name(self):
        decision = self.assertRefused(POOL_AGENT, "list", "kube-system", "leases")
        self.assertEqual(decision, lease_refusal("list", "kube-system", "",
                                                 user=POOL_AGENT[0]))
        for selector in ("metadata.name=other", "metadata.name!=yurthub",
                         "metadata.namespace=kube-system", "spec.holderIdentity=yurthub"):
            self.assertRefused(POOL_AGENT, "watch", "kube-system", "leases",
                               field_selector=selector)

    def test_named_leases_are_named_in_their_namespace(self):
        # The named leases are (namespace, name) pairs: yurthub elsewhere is no
        # election lease.
        self.assertRefused(POOL_AGENT, "update", "default", "leases", "yurthub")
        self.assertRefused(POOL_AGENT, "create", "default", "leases", body_name="yurthub")
        authorizer = PoolCoordinatorAuthorizer(named_leases=[("pool-a", "election")])
        user, groups = POOL_AGENT
        self.assertIsNone(ask(authorizer, user, groups, "update", "pool-a", "leases",
                              "election"))
        refused = ask(authorizer, user, groups, "update", "kube-system", "leases", "yurthub")
        self.assertEqual(refused.code, 403)

    def test_cluster_wide_lease_lists(self):
        self.assertEqual(ONLY_LEASE_VERBS,
                         "can only get, create, update, patch, or delete a node lease")
        for verb in ("list", "watch"):
            decision = self.assertRefused(node("edge-1"), verb, "", "leases")
            self.assertEqual(decision, lease_refusal(verb, "", ONLY_LEASE_VERBS))
        # Not even for a named lease by field selector: names are per namespace.
        self.assertRefused(node("edge-1"), "watch", "", "leases",
                           field_selector="metadata.name=leader-informer-sync")

    def test_leases_of_other_namespaces(self):
        for verb in ("get", "update", "delete"):
            decision = self.assertRefused(node("edge-1"), verb, "default", "leases", "edge-1")
            self.assertTrue(decision.message.endswith(": " + ONLY_NODE_LEASE_NAMESPACE))
        self.assertRefused(node("edge-1"), "create", "default", "leases", body_name="edge-1")
        self.assertRefused(node("edge-1"), "list", "default", "leases")

    def test_node_reads_only_its_own_node(self):
        for verb in ("get", "list", "watch"):
            field_selector = "" if verb == "get" else "metadata.name=edge-1"
            self.assertAllowed(node("edge-1"), verb, "", "nodes", "edge-1",
                               field_selector=field_selector)
        decision = self.assertRefused(node("edge-1"), "get", "", "nodes", "edge-2")
        self.assertEqual(decision, forbidden(
            "edge-2", 'User "system:node:edge-1" cannot get resource "nodes" in API group '
            "\"\" at the cluster scope: node 'edge-1' cannot read 'edge-2', only its own "
            "Node object", kind="nodes", group=""))
        decision = self.assertRefused(node("edge-1"), "list", "", "nodes")
        self.assertTrue(decision.message.endswith(
            "node 'edge-1' cannot read all nodes, only its own Node object"))
        for verb in ("update", "patch", "delete"):
            self.assertRefused(node("edge-1"), verb, "", "nodes", "edge-1")
        self.assertRefused(node("edge-1"), "create", "", "nodes", body_name="edge-1")

    def test_other_resources(self):
        decision = self.assertRefused(node("edge-1"), "get", "kube-system", "secrets", "certs")
        self.assertEqual(decision, forbidden(
            "certs", 'User "system:node:edge-1" cannot get resource "secrets" in API group '
            '"" in the namespace "kube-system"', kind="secrets", group=""))
        self.assertRefused(node("edge-1"), "list", "default", "configmaps")
        self.assertRefused(node("edge-1"), "create", "default", "configmaps", body_name="x")
        self.assertRefused(node("edge-1"), "list", "", "namespaces")

    def test_masters_may_do_anything(self):
        admin = ("admin", (MASTERS,))
        for verb, namespace, resource, name in (
                ("update", "kube-node-lease", "leases", "edge-2"),
                ("create", "kube-system", "leases", "other"),
                ("list", "", "leases", ""),
                ("deletecollection", "kube-node-lease", "leases", ""),
                ("get", "kube-system", "secrets", "certs"),
                ("delete", "", "nodes", "edge-1")):
            self.assertAllowed(admin, verb, namespace, resource, name,
                               body_name=name if verb == "create" else "")
        # A node that is also a master is a master.
        self.assertAllowed(("system:node:edge-1", (NODES, MASTERS)), "update",
                           "kube-node-lease", "leases", "edge-2")

    def test_discovery_for_every_authenticated_user(self):
        for user, groups in (node("edge-1"), ("nobody", ()), ("system:node:", (NODES,))):
            subject = User.from_subject([user], groups)
            for path in ("/api", "/api/v1", "/apis", "/apis/coordination.k8s.io",
                         "/apis/coordination.k8s.io/v1", "/version", "/healthz", "/readyz",
                         "/livez", "/openapi/v2"):
                self.assertIsNone(self.authorizer.authorize(
                    subject, attributes_of("GET", path, ""), ""), (user, path))
        subject = User.from_subject(["system:node:edge-1"], [NODES])
        decision = self.authorizer.authorize(subject, attributes_of("GET", "/metrics", ""), "")
        self.assertEqual(decision, Refusal(
            403, "Forbidden", 'forbidden: User "system:node:edge-1" cannot get path "/metrics"'))
        self.assertNotIn("details", decision.status())
        decision = self.authorizer.authorize(subject, attributes_of("POST", "/api/v1", ""), "")
        self.assertEqual(decision.code, 403)

    # -- hostile input -------------------------------------------------------

    def test_node_without_a_name(self):
        # CN "system:node:" in system:nodes: the Node authorizer knows no node.
        who = ("system:node:", (NODES,))
        for verb, namespace, name in (("get", "kube-node-lease", ""),
                                      ("list", "kube-node-lease", ""),
                                      ("update", "kube-system", "yurthub")):
            decision = self.assertRefused(who, verb, namespace, "leases", name)
            self.assertTrue(decision.message.endswith(
                ': unknown node for user "system:node:"'), decision.message)
        self.assertRefused(who, "create", "kube-node-lease", "leases", body_name="")

    def test_node_name_without_the_nodes_group(self):
        # Only the group makes a node: the name alone is any user's.
        for groups in ((), ("system:node",), ("edge-nodes",)):
            who = ("system:node:edge-1", groups)
            decision = self.assertRefused(who, "update", "kube-node-lease", "leases", "edge-1")
            self.assertTrue(decision.message.endswith('in the namespace "kube-node-lease"'),
                            decision.message)
            self.assertRefused(who, "get", "kube-node-lease", "leases", "edge-1")
            self.assertRefused(who, "update", "kube-system", "leases", "yurthub")
        # The group without the name's prefix is no node either.
        self.assertRefused(("edge-1", (NODES,)), "update", "kube-node-lease", "leases",
                           "edge-1")
        self.assertRefused(("System:Node:edge-1", (NODES,)), "update", "kube-node-lease",
                           "leases", "edge-1")

    def test_names_with_slashes(self):
        # A name is compared whole: one that holds "/" names no node's lease.
        for name in ("edge-1/x", "edge-1/../edge-2", "../edge-1", "edge-1%2F"):
            self.assertRefused(node("edge-1"), "update", "kube-node-lease", "leases", name)
            self.assertRefused(node("edge-1"), "create", "kube-node-lease", "leases",
                               body_name=name)
        # A node whose name holds "/" writes only a lease of that very name.
        self.assertRefused(node("edge-1/x"), "update", "kube-node-lease", "leases", "edge-1")
        self.assertRefused(node("edge-1/x"), "create", "kube-node-lease", "leases",
                           body_name="edge-1")
        # A field selector naming no possible object names nothing.
        for selector in ("metadata.name=yurthub/x", "metadata.name=..",
                         "metadata.name=yurthub%2F"):
            self.assertRefused(node("edge-1"), "watch", "kube-system", "leases",
                               field_selector=selector)

    def test_escaped_paths_are_read_as_the_server_reads_them(self):
        user = User.from_subject(["system:node:edge-1"], [NODES])
        # %2F in a name is a "/" inside one segment, never a path separator.
        attributes = attributes_of(
            "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/"
                   "edge-1%2F..%2Fedge-2", "")
        self.assertEqual((attributes.namespace, attributes.name),
                         ("kube-node-lease", "edge-1/../edge-2"))
        self.assertEqual(self.authorizer.authorize(user, attributes, "").code, 403)
        attributes = attributes_of(
            "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-%31", "")
        self.assertEqual(attributes.name, "edge-1")
        self.assertIsNone(self.authorizer.authorize(user, attributes, ""))
        attributes = attributes_of(
            "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube%2Dnode%2Dlease/leases/edge-2",
            "")
        self.assertEqual(attributes.namespace, "kube-node-lease")
        self.assertEqual(self.authorizer.authorize(user, attributes, "").code, 403)

    def test_quotes_in_names_are_escaped_in_messages(self):
        decision = self.assertRefused(node("edge-1"), "update", "kube-node-lease", "leases",
                                      'a"b')
        self.assertTrue(decision.message.startswith(
            'leases.coordination.k8s.io "a\\"b" is forbidden'), decision.message)


class UserTests(unittest.TestCase):
    """The user of a certificate subject, as kube-apiserver's x509 authenticator
    makes it."""

    def test_common_name_and_organizations(self):
        user = User.from_subject(["system:node:edge-1"], ["system:nodes"])
        self.assertEqual(user, User("system:node:edge-1",
                                    ("system:nodes", AUTHENTICATED_GROUP)))
        self.assertEqual(user.node_name(), "edge-1")
        admin = User.from_subject(["admin"], ["system:masters", "ops", "ops"])
        self.assertEqual(admin.groups, ("system:masters", "ops", AUTHENTICATED_GROUP))
        self.assertIsNone(admin.node_name())

    def test_no_user_without_exactly_one_common_name(self):
        self.assertIsNone(User.from_subject([], ["system:masters"]))
        self.assertIsNone(User.from_subject([""], ["system:masters"]))
        self.assertIsNone(User.from_subject(["a", "b"], ["system:masters"]))

    def test_node_names(self):
        self.assertEqual(User.from_subject(["system:node:"], [NODES]).node_name(), "")
        self.assertIsNone(User.from_subject(["system:node:edge-1"], []).node_name())
        self.assertEqual(User.from_subject(["system:node:a/b"], [NODES]).node_name(), "a/b")

    def test_unauthorized_status(self):
        self.assertEqual(UNAUTHORIZED.status(), {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Unauthorized", "reason": "Unauthorized", "code": 401})


class RequestLogUserTests(unittest.TestCase):
    """The request log names the user of each answer, in a key of its own."""

    def test_user_in_records_and_lines(self):
        record = logged_request(5.0, "127.0.0.1", "PUT",
                                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/"
                                "leases/edge-2", 403, {"kind": "Status"}, "",
                                "system:node:edge-1")
        self.assertEqual(record.user, "system:node:edge-1")
        self.assertEqual((record.code, record.name, record.succeeded), (403, None, False))
        self.assertEqual(json.loads(json_line(record))["user"], "system:node:edge-1")
        self.assertEqual(logged_request(1.0, "", "GET", "/api", 200).user, "")

    def test_lines_without_a_user_still_read(self):
        path = os.path.join(self.mktemp())
        old = {"at": 1.5, "peer": "127.0.0.1", "method": "GET", "path": "/api", "code": 200,
               "namespace": None, "name": None, "holder": None, "renew_time": None,
               "delegated": None, "query": ""}
        new = logged_request(2.0, "127.0.0.1", "GET", "/api", 200, user="admin")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(old) + "\n" + json_line(new))
        self.assertEqual(read_request_log(path),
                         [LoggedRequest(1.5, "127.0.0.1", "GET", "/api", 200), new])


class StandaloneOptionsTests(unittest.TestCase):
    """``python -m yurtcoord.sim.apiserver --authorize``: the authorizer it builds."""

    def test_authorize(self):
        from yurtcoord.sim.apiserver import __main__ as standalone
        self.assertIsNone(standalone.authorizer_of(standalone._parse(["--tls-dir", "d"])))
        authorizer = standalone.authorizer_of(standalone._parse(["--tls-dir", "d",
                                                                 "--authorize"]))
        self.assertTrue(verifyObject(IAuthorizer, authorizer))
        self.assertEqual(authorizer.named_leases, {("kube-system", "yurthub"),
                                                   ("kube-system", "leader-informer-sync")})
        authorizer = standalone.authorizer_of(standalone._parse([
            "--tls-dir", "d", "--authorize", "--named-lease", "pool-a/election",
            "--named-lease", "kube-system/leader-informer-sync"]))
        self.assertEqual(authorizer.named_leases, {("pool-a", "election"),
                                                   ("kube-system", "leader-informer-sync")})

    def test_refused_options(self):
        from yurtcoord.sim.apiserver import __main__ as standalone
        for argv in (["--authorize"], ["--tls-dir", "d", "--named-lease", "a/b"],
                     ["--tls-dir", "d", "--authorize", "--named-lease", "yurthub"],
                     ["--tls-dir", "d", "--authorize", "--named-lease", "a/b/c"],
                     ["--tls-dir", "d", "--authorize", "--named-lease", "/b"]):
            with self.assertRaises(SystemExit, msg=argv):
                standalone._parse(argv)
