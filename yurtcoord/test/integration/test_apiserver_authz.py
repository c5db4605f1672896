"""The API test server as the pool's coordinator apiserver authorizes, over real
sockets and TLS: each client is the user of its certificate (a node with the
kubelet's, ``CN=system:node:<node>``, ``O=system:nodes``; an admin of
``system:masters``), a node writes only its own node lease and the named
``kube-system`` leases, and every refusal is a kube-apiserver Status that the
official clients (``kubectl``, the ``kubernetes`` Python client) report as Forbidden,
answered before the server touched an object and logged with its code and user."""

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

from kubernetes import client as kube
from kubernetes.client.rest import ApiException
from twisted.internet import defer, reactor, threads
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import Forbidden, Unauthorized
from yurtcoord.sim.apiserver import Catalog, KubeAPIServer, ObjectStore
from yurtcoord.sim.apiserver.authz import POOL_AGENTS_GROUP, PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.clients import write_kubeconfig
from yurtcoord.sim.apiserver.requestlog import read_request_log
from yurtcoord.sim.apiserver.storage import IObjectStorage, MemoryStorage
from yurtcoord.sim.pki import CertPair, TestCA
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
NODE_LEASES = "kube-node-lease"


def lease(name: str, namespace: str = NODE_LEASES, holder: str | None = None,
          renew_time: str = "2026-12-03T10:00:00.000000Z") -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": holder or name, "leaseDurationSeconds": 40,
                     "renewTime": renew_time}}


def forbidden_status(message: str, name: str = "", kind: str = "leases",
                     group: str = "coordination.k8s.io") -> dict[str, Any]:
    details = {key: value for key, value in
               (("name", name), ("group", group), ("kind", kind)) if value}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Forbidden", "details": details, "code": 403}


UPDATE_EDGE_2 = (
    'leases.coordination.k8s.io "edge-2" is forbidden: User "system:node:edge-1" cannot '
    'update resource "leases" in API group "coordination.k8s.io" in the namespace '
    '"kube-node-lease": can only access node lease with the same name as the requesting node')
CREATE_EDGE_2 = ('leases.coordination.k8s.io "edge-2" is forbidden: can only access node '
                 'lease with the same name as the requesting node')
LIST_ALL_LEASES = (
    'leases.coordination.k8s.io is forbidden: User "system:node:edge-1" cannot list '
    'resource "leases" in API group "coordination.k8s.io" at the cluster scope: can only '
    'get, create, update, patch, or delete a node lease')


class RecordingStorage(MemoryStorage):
    """The in-memory storage, noting each call the server makes to it (method and
    resource), so that a test can tell a refusal touched no object."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.calls: list[tuple[str, str]] = []


def _recorded(method: str):
    def call(self, gvr, *args, **kwargs):
        self.calls.append((method, gvr.resource))
        return getattr(MemoryStorage, method)(self, gvr, *args, **kwargs)
    return call


for _method in ("get", "list", "list_page", "create", "update", "delete", "watch"):
    setattr(RecordingStorage, _method, _recorded(_method))
del _method


class _AuthorizedServerCase(unittest.TestCase):
    """A TLS server with the pool coordinator's authorizer; clients for edge-1 (the
    kubelet's combined PEM) and for an admin of system:masters."""

    @defer.inlineCallbacks
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="apiserver-authz-")
        self.addCleanup(shutil.rmtree, self.workdir, True)
        self.ca = TestCA(os.path.join(self.workdir, "pki"))
        self.ca.server_pair("server")
        self.storage = RecordingStorage(ObjectStore(Catalog(), reactor))
        self.server = KubeAPIServer(reactor, tls_dir=self.ca.directory, storage=self.storage,
                                    authorizer=PoolCoordinatorAuthorizer())
        self.url = yield self.server.start()
        self.addCleanup(self.server.stop)
        pem = self.ca.node_client_pem("edge-1")
        self.edge_1_pair = CertPair(pem, pem)
        self.admin_pair = self.ca.client_pair("admin", "admin", ["system:masters"])
        # The pool's agents' shared coordinator identity, as the certs Secret holds it.
        self.agent_pair = self.ca.client_pair("yurthub-client",
                                              "openyurt:yurt-coordinator:yurthub",
                                              [POOL_AGENTS_GROUP])
        self.edge_1 = self.client(self.edge_1_pair)
        self.admin = self.client(self.admin_pair)
        self.agent = self.client(self.agent_pair)

    def client(self, pair: CertPair) -> KubeClient:
        client = KubeClient(reactor, ClientConfig(
            server=self.url, ca_file=self.ca.ca_file, cert_file=pair.cert_file,
            key_file=pair.key_file, timeout=15.0))
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def refused(self, call, *args, **kwargs):
        """The Forbidden error of a call that must be refused, having checked that the
        server touched no object for it and logged a 403."""
        calls, logged = len(self.storage.calls), len(self.server.request_log)
        error = yield self.assertFailure(defer.maybeDeferred(call, *args, **kwargs), Forbidden)
        self.assertEqual(self.storage.calls[calls:], [])
        yield poll_until(lambda: len(self.server.request_log) > logged, 10.0, 0.01, reactor,
                         what="the refusal logged")
        self.assertEqual([r.code for r in self.server.request_log[logged:]], [403])
        return error


class NodeLeaseTests(_AuthorizedServerCase):

    def test_authorizer_is_declared(self):
        from yurtcoord.sim.apiserver.authz import IAuthorizer
        self.assertTrue(verifyObject(IAuthorizer, self.server.authorizer))
        self.assertTrue(verifyObject(IObjectStorage, self.storage))

    @defer.inlineCallbacks
    def test_node_creates_and_renews_its_own_lease(self):
        created = yield self.edge_1.create(gvrs.LEASES, lease("edge-1"))
        created["spec"]["renewTime"] = "2026-12-03T10:00:10.000000Z"
        renewed = yield self.edge_1.update(gvrs.LEASES, created)
        self.assertEqual(renewed["spec"]["renewTime"], "2026-12-03T10:00:10.000000Z")
        read = yield self.edge_1.get(gvrs.LEASES, "edge-1", NODE_LEASES)
        self.assertEqual(read["metadata"]["resourceVersion"],
                         renewed["metadata"]["resourceVersion"])
        yield self.edge_1.delete(gvrs.LEASES, "edge-1", NODE_LEASES)
        yield poll_until(lambda: len(self.server.request_log) >= 4, 10.0, 0.01, reactor,
                         what="four answers logged")
        writes = [(r.method, r.code, r.name, r.user, r.renew_time)
                  for r in self.server.request_log]
        self.assertEqual(writes, [
            ("POST", 201, "edge-1", "system:node:edge-1", "2026-12-03T10:00:00.000000Z"),
            ("PUT", 200, "edge-1", "system:node:edge-1", "2026-12-03T10:00:10.000000Z"),
            ("GET", 200, None, "system:node:edge-1", None),
            ("DELETE", 200, "edge-1", "system:node:edge-1", None)])

    @defer.inlineCallbacks
    def test_node_is_refused_another_nodes_lease(self):
        error = yield self.refused(self.edge_1.create, gvrs.LEASES, lease("edge-2"))
        self.assertEqual(error.status, forbidden_status(CREATE_EDGE_2, "edge-2"))
        original = yield self.admin.create(gvrs.LEASES, lease("edge-2"))
        changed = json.loads(json.dumps(original))
        changed["spec"]["renewTime"] = "2026-12-03T11:00:00.000000Z"
        error = yield self.refused(self.edge_1.update, gvrs.LEASES, changed)
        self.assertEqual(error.status, forbidden_status(UPDATE_EDGE_2, "edge-2"))
        yield self.refused(self.edge_1.request, "PATCH", gvrs.LEASES.object_path(
            "edge-2", NODE_LEASES), body={"spec": {"holderIdentity": "edge-1"}})
        yield self.refused(self.edge_1.delete, gvrs.LEASES, "edge-2", NODE_LEASES)
        stored = self.server.store.get(gvrs.LEASES, "edge-2", NODE_LEASES)
        self.assertEqual(stored, original)
        refusals = [(r.method, r.code, r.user, r.name) for r in self.server.request_log
                    if r.code == 403]
        self.assertEqual(refusals, [
            ("POST", 403, "system:node:edge-1", None), ("PUT", 403, "system:node:edge-1", None),
            ("PATCH", 403, "system:node:edge-1", None),
            ("DELETE", 403, "system:node:edge-1", None)])
        self.assertEqual([r.user for r in self.server.request_log if r.code == 201],
                         ["admin"])

    @defer.inlineCallbacks
    def test_node_reads_only_its_own_lease_and_the_pool_agent_every_one(self):
        yield self.admin.create(gvrs.LEASES, lease("edge-2"))
        yield self.refused(self.edge_1.get, gvrs.LEASES, "edge-2", NODE_LEASES)
        yield self.refused(self.edge_1.list, gvrs.LEASES, NODE_LEASES)
        listed = yield self.agent.list(gvrs.LEASES, NODE_LEASES)
        self.assertEqual([item["metadata"]["name"] for item in listed["items"]], ["edge-2"])
        got = listed["items"][0]
        events: list[tuple[str, str]] = []
        watch = self.agent.watch(gvrs.LEASES, lambda kind, obj: events.append(
            (kind, obj["metadata"]["name"])), namespace=NODE_LEASES,
            resource_version=listed["metadata"]["resourceVersion"], allow_bookmarks=False)
        self.addCleanup(watch.cancel)
        yield poll_until(lambda: self.server.open_watches == 1, 10.0, 0.01, reactor,
                         what="the watch open")
        yield self.edge_1.create(gvrs.LEASES, lease("edge-1"))
        yield poll_until(lambda: events == [("ADDED", "edge-1")], 10.0, 0.01, reactor,
                         what="the watch event")
        # The pool's agent writes no node lease.
        yield self.refused(self.agent.update, gvrs.LEASES, got)

    @defer.inlineCallbacks
    def test_cluster_wide_lease_lists_are_refused(self):
        error = yield self.refused(self.edge_1.list, gvrs.LEASES)
        self.assertEqual(error.status, forbidden_status(LIST_ALL_LEASES))
        watch = self.edge_1.watch(gvrs.LEASES, lambda kind, obj: None)
        error = yield self.assertFailure(watch.done, Forbidden)
        self.assertIn("cannot watch resource", error.status["message"])
        self.assertEqual(self.server.open_watches, 0)
        self.assertFalse([call for call in self.storage.calls if call[0] == "watch"])


class NamedLeaseTests(_AuthorizedServerCase):

    @defer.inlineCallbacks
    def test_named_leases_are_writable_by_name(self):
        for name in ("yurthub", "leader-informer-sync"):
            # Not as a node: NodeRestriction keeps nodes to kube-node-lease.
            yield self.refused(self.edge_1.create, gvrs.LEASES,
                               lease(name, "kube-system", "edge-1"))
            created = yield self.agent.create(gvrs.LEASES, lease(name, "kube-system", "edge-1"))
            created["spec"]["holderIdentity"] = "edge-2"
            updated = yield self.agent.update(gvrs.LEASES, created)
            self.assertEqual(updated["spec"]["holderIdentity"], "edge-2")
            listed = yield self.agent.list(gvrs.LEASES, "kube-system",
                                           field_selector=f"metadata.name={name}")
            self.assertEqual([item["metadata"]["name"] for item in listed["items"]], [name])
        yield self.agent.delete(gvrs.LEASES, "leader-informer-sync", "kube-system")
        self.assertIsNone(self.server.store.get(gvrs.LEASES, "leader-informer-sync",
                                                "kube-system"))

    @defer.inlineCallbacks
    def test_other_kube_system_leases_are_refused(self):
        error = yield self.refused(self.edge_1.create, gvrs.LEASES,
                                   lease("other", "kube-system"))
        self.assertEqual(error.status, forbidden_status(
            'leases.coordination.k8s.io "other" is forbidden: User "system:node:edge-1" '
            'cannot create resource "leases" in API group "coordination.k8s.io" in the '
            'namespace "kube-system": can only access leases in the "kube-node-lease" '
            'system namespace', "other"))
        yield self.admin.create(gvrs.LEASES, lease("other", "kube-system"))
        yield self.refused(self.edge_1.get, gvrs.LEASES, "other", "kube-system")
        yield self.refused(self.edge_1.list, gvrs.LEASES, "kube-system")
        yield self.refused(self.edge_1.list, gvrs.LEASES, "kube-system",
                           field_selector="metadata.name=other")
        yield self.refused(self.edge_1.get, gvrs.CONFIGMAPS, "yurt-hub-cfg", "kube-system")

    @defer.inlineCallbacks
    def test_admin_may_do_anything(self):
        yield self.admin.create(gvrs.LEASES, lease("edge-2"))
        yield self.admin.create(gvrs.LEASES, lease("other", "kube-system"))
        yield self.admin.create(gvrs.CONFIGMAPS, {"metadata": {"name": "c",
                                                               "namespace": "default"}})
        listed = yield self.admin.list(gvrs.LEASES)
        self.assertEqual(sorted(item["metadata"]["name"] for item in listed["items"]),
                         ["edge-2", "other"])
        yield self.admin.delete(gvrs.LEASES, "edge-2", NODE_LEASES)
        self.assertEqual({r.code for r in self.server.request_log} - {200, 201}, set())
        self.assertEqual({r.user for r in self.server.request_log}, {"admin"})


class PlainHTTPTests(unittest.TestCase):
    """Without a client certificate there is no user: every request is 401."""

    @defer.inlineCallbacks
    def test_plain_http_is_unauthorized(self):
        server = KubeAPIServer(reactor, authorizer=PoolCoordinatorAuthorizer())
        url = yield server.start()
        self.addCleanup(server.stop)
        server.store.create(gvrs.LEASES, lease("edge-1"))
        client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=15.0))
        self.addCleanup(client.close)
        for call in (lambda: client.get(gvrs.LEASES, "edge-1", NODE_LEASES),
                     lambda: client.create(gvrs.LEASES, lease("edge-2")),
                     lambda: client.request("GET", "/version")):
            error = yield self.assertFailure(call(), Unauthorized)
            self.assertEqual(error.status, {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
        yield poll_until(lambda: len(server.request_log) == 3, 10.0, 0.01, reactor,
                         what="three answers logged")
        self.assertEqual([(r.code, r.user) for r in server.request_log], [(401, "")] * 3)
        self.assertIsNone(server.store.get(gvrs.LEASES, "edge-2", NODE_LEASES))


class OfficialClientTests(_AuthorizedServerCase):
    """kubectl and the kubernetes Python client see kube-apiserver's refusals."""

    def kubectl(self, pair: CertPair, *args: str):
        kubeconfig = os.path.join(self.workdir, f"kubeconfig-{os.path.basename(pair.key_file)}")
        write_kubeconfig(kubeconfig, self.url, ca_file=self.ca.ca_file, client_pair=pair,
                         namespace=NODE_LEASES)
        d = getProcessOutputAndValue(
            KUBECTL, ["--kubeconfig", kubeconfig, "--cache-dir",
                      os.path.join(self.workdir, "cache"), "--request-timeout", "20s", *args],
            env={"HOME": self.workdir, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        return d.addCallback(lambda result: (result[0].decode(), result[1].decode(), result[2]))

    @defer.inlineCallbacks
    def test_kubectl(self):
        manifest = os.path.join(self.workdir, "edge-2.json")
        with open(manifest, "w") as f:
            json.dump(lease("edge-2"), f)
        out, err, code = yield self.kubectl(self.edge_1_pair, "create", "-f", manifest)
        self.assertEqual(code, 1, (out, err))
        self.assertEqual(err.strip(), f"Error from server (Forbidden): error when creating "
                                      f'"{manifest}": {CREATE_EDGE_2}')
        out, err, code = yield self.kubectl(self.admin_pair, "create", "-f", manifest)
        self.assertEqual((code, out.strip()), (0, "lease.coordination.k8s.io/edge-2 created"),
                         err)
        out, err, code = yield self.kubectl(self.edge_1_pair, "annotate", "lease", "edge-2",
                                            "x=y")
        self.assertEqual(code, 1, (out, err))
        # kubectl reads the lease first, which a node may not either.
        self.assertEqual(err.strip(), "Error from server (Forbidden): " + UPDATE_EDGE_2.replace(
            "cannot update", "cannot get"))
        out, err, code = yield self.kubectl(self.edge_1_pair, "get", "leases", "-A")
        self.assertEqual(code, 1, (out, err))
        self.assertEqual(err.strip(), "Error from server (Forbidden): " + LIST_ALL_LEASES)
        out, err, code = yield self.kubectl(self.agent_pair, "get", "leases", "-o", "name")
        self.assertEqual((code, out.split()), (0, ["lease.coordination.k8s.io/edge-2"]), err)
        lease_2 = self.server.store.get(gvrs.LEASES, "edge-2", NODE_LEASES)
        self.assertNotIn("annotations", lease_2["metadata"])

    @defer.inlineCallbacks
    def test_kubernetes_client(self):
        configuration = kube.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = self.ca.ca_file
        configuration.cert_file = self.edge_1_pair.cert_file
        configuration.key_file = self.edge_1_pair.key_file
        api_client = kube.ApiClient(configuration)
        self.addCleanup(api_client.close)
        leases = kube.CoordinationV1Api(api_client)
        mine = yield threads.deferToThread(
            leases.create_namespaced_lease, NODE_LEASES, lease("edge-1"))
        self.assertEqual(mine.metadata.name, "edge-1")
        yield self.admin.create(gvrs.LEASES, lease("edge-2"))
        theirs = kube.V1Lease(metadata=kube.V1ObjectMeta(name="edge-2", namespace=NODE_LEASES),
                              spec=kube.V1LeaseSpec(holder_identity="edge-1"))
        error = yield self.assertFailure(threads.deferToThread(
            leases.replace_namespaced_lease, "edge-2", NODE_LEASES, theirs), ApiException)
        self.assertEqual((error.status, error.reason), (403, "Forbidden"))
        self.assertEqual(json.loads(error.body), forbidden_status(UPDATE_EDGE_2, "edge-2"))
        error = yield self.assertFailure(threads.deferToThread(
            leases.list_lease_for_all_namespaces), ApiException)
        self.assertEqual((error.status, error.reason), (403, "Forbidden"))
        self.assertEqual(json.loads(error.body)["message"], LIST_ALL_LEASES)
        self.assertEqual(self.server.store.get(gvrs.LEASES, "edge-2", NODE_LEASES)["spec"]
                         ["holderIdentity"], "edge-2")


class StandaloneTests(unittest.TestCase):
    """``python -m yurtcoord.sim.apiserver --authorize`` refuses another node's lease and
    logs who was refused."""

    @defer.inlineCallbacks
    def test_authorize_flag(self):
        workdir = tempfile.mkdtemp(prefix="apiserver-authz-standalone-")
        self.addCleanup(shutil.rmtree, workdir, True)
        ca = TestCA(os.path.join(workdir, "pki"))
        ca.server_pair("server")
        request_log = os.path.join(workdir, "requests.jsonl")
        output = CollectingProcess()
        process = reactor.spawnProcess(
            output, sys.executable,
            [sys.executable, "-m", "yurtcoord.sim.apiserver", "--port", "0", "--tls-dir",
             ca.directory, "--authorize", "--request-log", request_log],
            env=dict(os.environ))
        try:
            yield poll_until(lambda: b"\n" in output.out, 30.0, 0.05, reactor,
                             what="the URL line")
            url = output.out.decode().splitlines()[0]
            pem = ca.node_client_pem("edge-1")
            admin_pair = ca.client_pair("admin", "admin", ["system:masters"])
            clients = []
            for cert, key in ((pem, pem), (admin_pair.cert_file, admin_pair.key_file)):
                clients.append(KubeClient(reactor, ClientConfig(
                    server=url, ca_file=ca.ca_file, cert_file=cert, key_file=key,
                    timeout=15.0)))
                self.addCleanup(clients[-1].close)
            edge_1, admin = clients
            created = yield admin.create(gvrs.LEASES, lease("edge-2"))
            error = yield self.assertFailure(edge_1.update(gvrs.LEASES, created), Forbidden)
            self.assertEqual(error.status, forbidden_status(UPDATE_EDGE_2, "edge-2"))
            yield poll_until(lambda: os.path.exists(request_log)
                             and len(read_request_log(request_log)) == 2, 10.0, 0.05, reactor,
                             what="two records in the request log file")
            self.assertEqual([(r.method, r.code, r.user) for r in read_request_log(request_log)],
                             [("POST", 201, "admin"), ("PUT", 403, "system:node:edge-1")])
        finally:
            if not output.ended.called:
                with contextlib.suppress(ProcessExitedAlready):
                    process.signalProcess(signal.SIGTERM)
            reason = yield output.ended
        self.assertEqual(getattr(reason, "exitCode", None), 0, output.err)
