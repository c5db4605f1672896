"""Wire conformance of the test API server, judged by clients written
elsewhere: the official ``kubernetes`` Python client and ``kubectl``; once with
the objects in memory and once more with them in a real etcd (the preferred
version: what a client sees does not differ between 3.4 and 3.5), as the
coordinator apiserver keeps them."""

import contextlib
import datetime
import json
import os
import shutil
import signal
import tempfile

from kubernetes import client as kube
from kubernetes import watch as kube_watch
from kubernetes.client.rest import ApiException
from twisted.internet import defer, reactor, threads
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.clients import write_kubeconfig
from yurtcoord.sim.apiserver.etcdstorage import storage_for
from yurtcoord.sim.etcd import make_etcd_test_class
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess
from yurtcoord.testing.sharedetcd import use_shared_etcd

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


class _ServerCase(unittest.TestCase):
    tls = False
    # Set (by make_etcd_test_class) for the classes that keep the objects in the
    # shared etcd of the run, emptied after each test.
    etcd_binary = None

    @defer.inlineCallbacks
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="apiserver-conformance-")
        self.addCleanup(shutil.rmtree, self.workdir, True)
        tls_dir = None
        if self.tls:
            tls_dir = os.path.join(self.workdir, "pki")
            self.ca = TestCA(tls_dir)
            self.ca.server_pair("server")
        storage = None
        if self.etcd_binary is not None:
            self.etcd = use_shared_etcd(self, self.etcd_binary)
            storage = storage_for(reactor, self.etcd.client_url)
        self.server = KubeAPIServer(reactor, tls_dir=tls_dir, bookmark_interval=0.2,
                                    storage=storage)
        self.url = yield self.server.start()
        self.addCleanup(self.server.stop)

    def wait(self, condition, message="condition", timeout=15.0):
        return poll_until(condition, timeout=timeout, what=message)


class KubernetesClientTests(_ServerCase):
    """The official Python client, run in threads while the reactor serves."""

    def setUp(self):
        d = super().setUp()

        def make_client(_):
            configuration = kube.Configuration()
            configuration.host = self.url
            self.api_client = kube.ApiClient(configuration)
            self.addCleanup(self.api_client.close)
            self.core = kube.CoreV1Api(self.api_client)
            self.coordination = kube.CoordinationV1Api(self.api_client)

        return d.addCallback(make_client)

    def lease(self, name, holder):
        return kube.V1Lease(
            metadata=kube.V1ObjectMeta(name=name, namespace="kube-node-lease"),
            spec=kube.V1LeaseSpec(
                holder_identity=holder, lease_duration_seconds=15,
                renew_time=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)))

    @defer.inlineCallbacks
    def test_create_get_list_replace_conflict_delete(self):
        api = self.coordination
        created = yield threads.deferToThread(
            api.create_namespaced_lease, "kube-node-lease", self.lease("pool", "edge-1"))
        self.assertEqual(created.spec.holder_identity, "edge-1")
        self.assertTrue(created.metadata.uid)
        first_rv = int(created.metadata.resource_version)
        got = yield threads.deferToThread(api.read_namespaced_lease, "pool", "kube-node-lease")
        self.assertEqual(got.spec.renew_time.year, 2026)
        self.assertEqual(got.kind, "Lease")
        listed = yield threads.deferToThread(api.list_namespaced_lease, "kube-node-lease")
        self.assertEqual([i.metadata.name for i in listed.items], ["pool"])
        self.assertEqual(listed.metadata.resource_version, str(first_rv))

        got.spec.holder_identity = "edge-2"
        replaced = yield threads.deferToThread(
            api.replace_namespaced_lease, "pool", "kube-node-lease", got)
        self.assertEqual(replaced.spec.holder_identity, "edge-2")
        self.assertEqual(replaced.metadata.resource_version, str(first_rv + 1))

        got.spec.holder_identity = "edge-3"  # still carries the first resourceVersion
        failure = yield self.assertFailure(threads.deferToThread(
            api.replace_namespaced_lease, "pool", "kube-node-lease", got), ApiException)
        self.assertEqual(failure.status, 409)
        self.assertEqual(json.loads(failure.body)["reason"], "Conflict")

        failure = yield self.assertFailure(threads.deferToThread(
            api.create_namespaced_lease, "kube-node-lease", self.lease("pool", "x")),
            ApiException)
        self.assertEqual(failure.status, 409)
        self.assertEqual(json.loads(failure.body)["reason"], "AlreadyExists")

        status = yield threads.deferToThread(api.delete_namespaced_lease, "pool", "kube-node-lease")
        self.assertEqual(_field(status, "status"), "Success")
        failure = yield self.assertFailure(threads.deferToThread(
            api.read_namespaced_lease, "pool", "kube-node-lease"), ApiException)
        self.assertEqual(failure.status, 404)
        self.assertEqual(json.loads(failure.body)["reason"], "NotFound")

    @defer.inlineCallbacks
    def test_core_resources_and_selectors(self):
        core = self.core
        yield threads.deferToThread(core.create_node, kube.V1Node(
            metadata=kube.V1ObjectMeta(name="edge-1", labels={"pool": "a"})))
        yield threads.deferToThread(core.create_node, kube.V1Node(
            metadata=kube.V1ObjectMeta(name="edge-2", labels={"pool": "b"})))
        nodes = yield threads.deferToThread(core.list_node, label_selector="pool in (a)")
        self.assertEqual([n.metadata.name for n in nodes.items], ["edge-1"])
        nodes = yield threads.deferToThread(core.list_node, field_selector="metadata.name!=edge-1")
        self.assertEqual([n.metadata.name for n in nodes.items], ["edge-2"])
        yield threads.deferToThread(core.create_namespaced_config_map, "default",
                                    kube.V1ConfigMap(metadata=kube.V1ObjectMeta(name="c"),
                                                     data={"k": "v"}))
        maps = yield threads.deferToThread(core.list_config_map_for_all_namespaces)
        self.assertEqual([(m.metadata.namespace, m.data) for m in maps.items],
                         [("default", {"k": "v"})])
        status = yield threads.deferToThread(core.delete_node, "edge-2")
        self.assertEqual(_field(status, "status"), "Success")

    @defer.inlineCallbacks
    def test_watch_added_modified_deleted_in_order(self):
        core = self.core
        listed = yield threads.deferToThread(core.list_namespaced_config_map, "default")
        since = listed.metadata.resource_version
        watcher = kube_watch.Watch()

        def consume():
            seen = []
            for event in watcher.stream(core.list_namespaced_config_map, "default",
                                        resource_version=since, timeout_seconds=20):
                seen.append((event["type"], event["object"].metadata.name,
                             event["object"].data))
                if len(seen) == 3:
                    watcher.stop()
            return seen

        consumed = threads.deferToThread(consume)
        yield self.wait(lambda: self.server.open_watches == 1, "the watch to open")
        cm = kube.V1ConfigMap(metadata=kube.V1ObjectMeta(name="w"), data={"v": "1"})
        yield threads.deferToThread(core.create_namespaced_config_map, "default", cm)
        cm.data = {"v": "2"}
        yield threads.deferToThread(core.replace_namespaced_config_map, "w", "default", cm)
        yield threads.deferToThread(core.delete_namespaced_config_map, "w", "default")
        seen = yield consumed
        self.assertEqual(seen, [("ADDED", "w", {"v": "1"}), ("MODIFIED", "w", {"v": "2"}),
                                ("DELETED", "w", {"v": "2"})])

    @defer.inlineCallbacks
    def test_watch_from_compacted_version_is_410(self):
        core = self.core
        created = yield threads.deferToThread(
            core.create_namespaced_config_map, "default",
            kube.V1ConfigMap(metadata=kube.V1ObjectMeta(name="old")))
        for name in ("new", "newer"):
            yield threads.deferToThread(
                core.create_namespaced_config_map, "default",
                kube.V1ConfigMap(metadata=kube.V1ObjectMeta(name=name)))
        # etcd keeps the revision it was compacted at: the change after the one
        # watched from ("new") is gone once the store is compacted at "newer".
        yield self.server.storage.compact()

        def consume():
            return list(kube_watch.Watch().stream(
                core.list_namespaced_config_map, "default",
                resource_version=created.metadata.resource_version, timeout_seconds=10))

        failure = yield self.assertFailure(threads.deferToThread(consume), ApiException)
        self.assertEqual(failure.status, 410)
        self.assertIn("Expired", failure.reason)


def _field(result, name):
    """A top-level field of a client result (a model, or a plain dict for
    calls the client declares as returning ``object``, such as deletes)."""
    return result[name] if isinstance(result, dict) else getattr(result, name)


class KubectlTests(_ServerCase):
    """kubectl as a subprocess, with a kubeconfig written for the server."""

    def setUp(self):
        d = super().setUp()

        def configure(_):
            self.kubeconfig = os.path.join(self.workdir, "kubeconfig")
            pair = None
            if self.tls:
                pair = self.ca.client_pair("admin", "admin", ["system:masters"])
            write_kubeconfig(self.kubeconfig, self.url,
                             ca_file=self.ca.ca_file if self.tls else None, client_pair=pair)

        return d.addCallback(configure)

    def args(self, *args):
        return ["--kubeconfig", self.kubeconfig,
                "--cache-dir", os.path.join(self.workdir, "cache"),
                "--request-timeout", "20s", *args]

    def env(self):
        return {"HOME": self.workdir, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    @defer.inlineCallbacks
    def kubectl(self, *args):
        out, err, code = yield getProcessOutputAndValue(
            KUBECTL, self.args(*args), env=self.env())
        return out.decode(), err.decode(), code

    @defer.inlineCallbacks
    def test_get_create_delete(self):
        manifest = os.path.join(self.workdir, "cm.yaml")
        with open(manifest, "w") as f:
            f.write("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello\n"
                    "data:\n  greeting: hi\n")
        out, err, code = yield self.kubectl("get", "configmaps")
        self.assertEqual(code, 0, err)
        self.assertIn("No resources found", out + err)
        out, err, code = yield self.kubectl("create", "-f", manifest)
        self.assertEqual((code, out.strip()), (0, "configmap/hello created"), err)
        stored = yield self.server.storage.get(gvrs.CONFIGMAPS, "hello", "default")
        self.assertEqual(stored["data"], {"greeting": "hi"})
        out, err, code = yield self.kubectl("get", "configmaps")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.split()[:2], ["NAME", "CREATED"])
        self.assertIn("hello", out)
        out, err, code = yield self.kubectl("get", "cm", "hello", "-o", "json")
        self.assertEqual(json.loads(out)["data"], {"greeting": "hi"})
        out, err, code = yield self.kubectl("create", "-f", manifest)
        self.assertNotEqual(code, 0)
        self.assertIn("AlreadyExists", err)
        out, err, code = yield self.kubectl("delete", "configmap", "hello")
        self.assertEqual((code, out.strip()), (0, 'configmap "hello" deleted'), err)
        out, err, code = yield self.kubectl("get", "configmap", "hello")
        self.assertNotEqual(code, 0)
        self.assertIn('configmaps "hello" not found', err)

    @defer.inlineCallbacks
    def test_apply_label_and_selector(self):
        manifest = os.path.join(self.workdir, "node.yaml")
        with open(manifest, "w") as f:
            f.write("apiVersion: v1\nkind: Node\nmetadata:\n  name: edge-1\n"
                    "  labels:\n    pool: hangzhou\n")
        out, err, code = yield self.kubectl("apply", "-f", manifest)
        self.assertEqual((code, out.strip()), (0, "node/edge-1 created"), err)
        out, err, code = yield self.kubectl("label", "node", "edge-1", "role=leader")
        self.assertEqual(code, 0, err)
        node = yield self.server.storage.get(gvrs.NODES, "edge-1")
        self.assertEqual(node["metadata"]["labels"], {"pool": "hangzhou", "role": "leader"})
        out, err, code = yield self.kubectl("get", "nodes", "-l", "role in (leader)", "-o", "name")
        self.assertEqual((code, out.split()), (0, ["node/edge-1"]), err)
        out, err, code = yield self.kubectl("get", "nodes", "-l", "role!=leader", "-o", "name")
        self.assertEqual((code, out.split()), (0, []), err)

    @defer.inlineCallbacks
    def test_chunked_get(self):
        for index in range(7):
            yield self.server.storage.create(gvrs.CONFIGMAPS,
                                             {"metadata": {"name": f"cm-{index}"}})
        out, err, code = yield self.kubectl("get", "configmaps", "--chunk-size", "3")
        self.assertEqual(code, 0, err)
        self.assertEqual([line.split()[0] for line in out.splitlines()[1:]],
                         [f"cm-{index}" for index in range(7)])
        out, err, code = yield self.kubectl("get", "configmaps", "--chunk-size", "2", "-o", "name")
        self.assertEqual(out.split(), [f"configmap/cm-{index}" for index in range(7)])
        continued = [query for _, _, query in self.server.requests if "continue" in query]
        self.assertGreaterEqual(len(continued), 5)

    @defer.inlineCallbacks
    def test_get_watch_until_first_event(self):
        process = CollectingProcess()
        transport = reactor.spawnProcess(
            process, KUBECTL,
            [KUBECTL, *self.args("get", "leases", "-n", "kube-node-lease", "-w",
                                 "--output-watch-events")],
            env=self.env())
        try:
            yield self.wait(lambda: self.server.open_watches == 1, "kubectl to watch")
            yield self.server.storage.create(gvrs.LEASES, {
                "metadata": {"name": "edge-9", "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": "edge-9"}})
            yield self.wait(lambda: b"edge-9" in process.out, "the first event")
        finally:
            if not process.ended.called:
                with contextlib.suppress(ProcessExitedAlready):
                    transport.signalProcess(signal.SIGKILL)
            yield process.ended
        first = [line for line in process.out.decode().splitlines() if "edge-9" in line][0]
        self.assertEqual(first.split()[:2], ["ADDED", "edge-9"])
        self.assertTrue(any(path.endswith("/leases") and query.get("watch") == "true"
                            for _, path, query in self.server.requests))


class KubectlTLSTests(KubectlTests):
    """The same kubectl checks over TLS with a client certificate."""

    tls = True

    @defer.inlineCallbacks
    def test_client_certificate_subject_recorded(self):
        out, err, code = yield self.kubectl("get", "nodes", "-o", "name")
        self.assertEqual(code, 0, err)
        self.assertTrue(self.url.startswith("https://"))
        self.assertIn("CN=admin,O=system:masters", self.server.client_subjects)


class KubernetesClientTLSTests(_ServerCase):
    """The Python client (urllib3, which offers ALPN) with a client certificate."""

    tls = True

    @defer.inlineCallbacks
    def test_tls_client_certificate(self):
        pair = self.ca.client_pair("edge", "system:node:edge-7", ["system:nodes"])
        configuration = kube.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = self.ca.ca_file
        configuration.cert_file = pair.cert_file
        configuration.key_file = pair.key_file
        api_client = kube.ApiClient(configuration)
        self.addCleanup(api_client.close)
        core = kube.CoreV1Api(api_client)
        yield threads.deferToThread(core.create_node, kube.V1Node(
            metadata=kube.V1ObjectMeta(name="edge-7")))
        nodes = yield threads.deferToThread(core.list_node)
        self.assertEqual([n.metadata.name for n in nodes.items], ["edge-7"])
        self.assertEqual(set(self.server.client_subjects),
                         {"CN=system:node:edge-7,O=system:nodes"})
        self.assertEqual(len(self.server.client_subjects), 2)


# The same clients against the objects kept in etcd.
for _tests in (KubernetesClientTests, KubectlTests, KubectlTLSTests, KubernetesClientTLSTests):
    make_etcd_test_class(type(_tests.__name__ + "Mixin", (_tests,), {
        "__module__": __name__,
        "__doc__": f"{_tests.__doc__.rstrip('.')}, the objects in etcd."}), globals())
del _tests
