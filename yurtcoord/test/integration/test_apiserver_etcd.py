"""The test API server with its objects in a real etcd (the preferred version), checked with
etcdctl as the independent reader: kube-apiserver's keys and values, the mod
revision as resourceVersion, guarded writes, LIST at a revision, watches over the
gateway's stream, 410 after compaction, pages of a selector list, etcd's mutual TLS;
and what the agents' pool store writes is exactly what kubectl reads back through it.
The storage's interface and key layout without an etcd are in the unit tier."""

import base64
import contextlib
import json
import os
import shutil
import signal
import sys

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.utils import getProcessOutputAndValue
from zope.interface.verify import verifyObject

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.informer import Informer
from yurtcoord.pool.keycache import POOL_SCOPED_COMPONENT
from yurtcoord.pool.keys import format_rv
from yurtcoord.sim.apiserver.clients import write_kubeconfig
from yurtcoord.sim.apiserver.etcdstorage import storage_for
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.storage import IStorageWatch
from yurtcoord.sim.etcd import make_etcd_test_class
from yurtcoord.testing.apiservercase import CM, ServerTestCase, configmap
from yurtcoord.testing.etcdstore import EtcdStoreCase
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess
from yurtcoord.testing.sharedetcd import use_shared_etcd
from yurtcoord.tx.retry import Retries, backoff_policy

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


class EtcdAPIServerTestsMixin(EtcdStoreCase, ServerTestCase):
    """The shared etcd (emptied after each test), the pool store and the API server
    both on it."""

    def setUp(self):
        EtcdStoreCase.setUp(self)
        return ServerTestCase.setUp(self)

    def make_storage(self):
        return storage_for(reactor, self.etcd.client_url)

    def etcd_kv(self, key):
        """The key's kv as etcdctl sees it (value decoded), or None."""
        answer = json.loads(self.etcd.etcdctl("get", key, "-w", "json"))
        if not answer.get("kvs"):
            return None
        kv = answer["kvs"][0]
        return {"value": json.loads(base64.b64decode(kv["value"])),
                "mod_revision": kv["mod_revision"], "create_revision": kv["create_revision"]}

    @defer.inlineCallbacks
    def test_keys_values_and_resource_versions_are_kube_apiservers(self):
        writes = [
            ("/api/v1/nodes", {"metadata": {"name": "edge-1"}}, "/registry/minions/edge-1"),
            ("/api/v1/namespaces/default/services", {"metadata": {"name": "web"}},
             "/registry/services/specs/default/web"),
            ("/api/v1/namespaces/default/endpoints", {"metadata": {"name": "web"}},
             "/registry/services/endpoints/default/web"),
            ("/api/v1/namespaces/default/pods", {"metadata": {"name": "p"}},
             "/registry/pods/default/p"),
            ("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices",
             {"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []},
             "/registry/endpointslices/kube-system/s"),
        ]
        for path, body, key in writes:
            code, created = yield self.call("POST", path, body)
            self.assertEqual(code, 201, created)
            stored = self.etcd_kv(key)
            self.assertIsNotNone(stored, key)
            self.assertEqual(created["metadata"]["resourceVersion"],
                             str(stored["mod_revision"]))
            self.assertNotIn("resourceVersion", stored["value"]["metadata"])
            served = dict(stored["value"])
            served["metadata"] = dict(served["metadata"],
                                      resourceVersion=str(stored["mod_revision"]))
            self.assertEqual(created, served)
        code, listed = yield self.call("GET", "/api/v1/pods")
        revision = json.loads(self.etcd.etcdctl("get", "/", "-w", "json"))["header"]["revision"]
        self.assertEqual(listed["metadata"]["resourceVersion"], str(revision))
        # The same objects under the other served version.
        code, beta = yield self.call(
            "GET", "/apis/discovery.k8s.io/v1beta1/namespaces/kube-system/endpointslices/s")
        self.assertEqual((code, beta["apiVersion"]), (200, "discovery.k8s.io/v1beta1"))

    @defer.inlineCallbacks
    def test_writes_are_guarded(self):
        code, created = yield self.call("POST", CM, configmap("a", data={"v": "1"}))
        self.assertEqual(code, 201)
        code, body = yield self.call("POST", CM, configmap("a", data={"v": "other"}))
        self.assertStatus(body, 409, "AlreadyExists")
        self.assertEqual(self.etcd_kv("/registry/configmaps/default/a")["value"]["data"],
                         {"v": "1"})
        stale = configmap("a", data={"v": "2"})
        stale["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        code, updated = yield self.call("PUT", CM + "/a", stale)
        self.assertEqual(code, 200, updated)
        self.assertEqual(updated["metadata"]["resourceVersion"],
                         str(self.etcd_kv("/registry/configmaps/default/a")["mod_revision"]))
        stale["data"] = {"v": "3"}
        code, body = yield self.call("PUT", CM + "/a", stale)
        self.assertStatus(body, 409, "Conflict")
        self.assertEqual(self.etcd_kv("/registry/configmaps/default/a")["value"]["data"],
                         {"v": "2"})
        code, body = yield self.call("PUT", CM + "/a", configmap("a", data={"v": "4"}))
        self.assertEqual((code, body["data"]), (200, {"v": "4"}))
        code, body = yield self.call("PATCH", CM + "/a", {"data": {"w": "5"}}, headers={
            b"Content-Type": [b"application/merge-patch+json"]})
        self.assertEqual((code, body["data"]), (200, {"v": "4", "w": "5"}))
        code, body = yield self.call("DELETE", CM + "/a", {
            "preconditions": {"resourceVersion": created["metadata"]["resourceVersion"]}})
        self.assertStatus(body, 409, "Conflict")
        self.assertIsNotNone(self.etcd_kv("/registry/configmaps/default/a"))
        code, body = yield self.call("DELETE", CM + "/a")
        self.assertEqual(code, 200, body)
        self.assertIsNone(self.etcd_kv("/registry/configmaps/default/a"))
        code, body = yield self.call("GET", CM + "/a")
        self.assertStatus(body, 404, "NotFound")

    @defer.inlineCallbacks
    def test_concurrent_writes_lose_nothing(self):
        creates = yield defer.gatherResults([
            self.call("POST", CM, configmap("race", data={"by": str(n)})) for n in range(5)])
        self.assertEqual(sorted(code for code, _ in creates), [201, 409, 409, 409, 409])
        # Merge patches read, change and write back: each write is guarded by the
        # revision read, and a patch that lost the race is applied again.
        patches = yield defer.gatherResults([
            self.call("PATCH", CM + "/race", {"data": {f"k{n}": str(n)}}, headers={
                b"Content-Type": [b"application/merge-patch+json"]}) for n in range(8)])
        self.assertEqual([code for code, _ in patches], [200] * 8)
        stored = self.etcd_kv("/registry/configmaps/default/race")
        self.assertEqual({k for k in stored["value"]["data"] if k.startswith("k")},
                         {f"k{n}" for n in range(8)})
        revisions = sorted(int(body["metadata"]["resourceVersion"]) for _, body in patches)
        self.assertEqual(len(set(revisions)), 8)
        self.assertEqual(revisions[-1], stored["mod_revision"])
        # Unconditional replacements: each one lands whole, one after the other.
        puts = yield defer.gatherResults([
            self.call("PUT", CM + "/race", configmap("race", data={"by": f"put-{n}"}))
            for n in range(8)])
        self.assertEqual([code for code, _ in puts], [200] * 8)
        last = max(puts, key=lambda answer: int(answer[1]["metadata"]["resourceVersion"]))[1]
        self.assertEqual(self.etcd_kv("/registry/configmaps/default/race")["value"]["data"],
                         last["data"])

    @defer.inlineCallbacks
    def test_list_at_a_revision_and_410_once_compacted(self):
        yield self.call("POST", CM, configmap("a"))
        _, listed = yield self.call("GET", CM)
        then = listed["metadata"]["resourceVersion"]
        yield self.call("POST", CM, configmap("b"))
        _, old = yield self.call("GET", CM, params={
            "resourceVersion": then, "resourceVersionMatch": "Exact"})
        self.assertEqual([i["metadata"]["name"] for i in old["items"]], ["a"])
        _, first = yield self.call("GET", CM, params={"limit": "1"})
        self.assertEqual(first["metadata"]["remainingItemCount"], 1)
        yield self.call("DELETE", CM + "/b")
        _, second = yield self.call("GET", CM, params={
            "limit": "1", "continue": first["metadata"]["continue"]})
        self.assertEqual([i["metadata"]["name"] for i in second["items"]], ["b"])
        yield self.call("POST", CM, configmap("c"))
        yield self.server.storage.compact()
        code, body = yield self.call("GET", CM, params={
            "resourceVersion": then, "resourceVersionMatch": "Exact"})
        self.assertStatus(body, 410, "Expired")
        code, body = yield self.call("GET", CM, params={
            "limit": "1", "continue": first["metadata"]["continue"]})
        self.assertStatus(body, 410, "Expired")
        reader = yield self.open_watch(CM + "?watch=1&resourceVersion=" + then)
        yield self.wait(lambda: reader.ended is not None, "the watch to end")
        self.assertEqual(reader.types(), ["ERROR"])
        self.assertEqual(reader.lines[0]["object"]["code"], 410)

    @defer.inlineCallbacks
    def test_watch_delivers_events_split_across_reads(self):
        reader = yield self.open_watch(CM + "?watch=1")
        yield self.wait(lambda: self.server.storage.watch_count() == 1, "the etcd watch")
        # Far larger than one read: the etcd watch answer arrives in many pieces.
        big = "x" * 300_000
        yield self.call("POST", CM, configmap("big", data={"v": big}))
        yield self.call("PUT", CM + "/big", configmap("big", data={"v": big + "y"}))
        yield self.call("DELETE", CM + "/big")
        yield self.wait(lambda: len(reader.lines) == 3, "three events")
        self.assertEqual(reader.types(), ["ADDED", "MODIFIED", "DELETED"])
        self.assertEqual([len(e["object"]["data"]["v"]) for e in reader.lines],
                         [300_000, 300_001, 300_001])
        revisions = [int(e["object"]["metadata"]["resourceVersion"]) for e in reader.lines]
        self.assertEqual(revisions, sorted(set(revisions)))
        self.assertIsNone(self.etcd_kv("/registry/configmaps/default/big"))

    @defer.inlineCallbacks
    def test_watch_of_one_namespace_with_bookmarks_at_the_last_change(self):
        reader = yield self.open_watch(CM + "?watch=1&allowWatchBookmarks=true")
        yield self.wait(lambda: "BOOKMARK" in reader.types(), "a first bookmark")
        yield self.call("POST", "/api/v1/namespaces/other/configmaps", configmap("x"))
        code, created = yield self.call("POST", CM, configmap("a"))
        yield self.call("POST", "/api/v1/namespaces/other/configmaps", configmap("y"))
        rv = created["metadata"]["resourceVersion"]
        yield self.wait(lambda: any(
            e["type"] == "BOOKMARK" and e["object"]["metadata"]["resourceVersion"] == rv
            for e in reader.lines), "a bookmark at the change")
        events = [e for e in reader.lines if e["type"] != "BOOKMARK"]
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in events],
                         [("ADDED", "a")])
        bookmarks = [int(e["object"]["metadata"]["resourceVersion"])
                     for e in reader.lines if e["type"] == "BOOKMARK"]
        self.assertEqual(bookmarks, sorted(bookmarks))
        self.assertLessEqual(bookmarks[-1], int(rv))

    @defer.inlineCallbacks
    def test_watch_translates_selector_transitions(self):
        seen = []
        watch = yield self.server.storage.watch(
            gvrs.CONFIGMAPS, ObjectFilter("default", "app=x"), None,
            lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
        self.assertTrue(verifyObject(IStorageWatch, watch))
        self.addCleanup(watch.cancel)
        yield self.call("POST", CM, configmap("a", labels={"app": "y"}))
        yield self.call("PUT", CM + "/a", configmap("a", labels={"app": "x"}))
        yield self.call("PUT", CM + "/a", configmap("a", labels={"app": "z"}))
        yield self.wait(lambda: len(seen) == 2, "two events")
        self.assertEqual(seen, [("ADDED", "a"), ("DELETED", "a")])

    @defer.inlineCallbacks
    def test_etcd_down_is_a_server_error_and_serving_resumes_when_it_is_back(self):
        yield self.call("POST", CM, configmap("a"))
        reader = yield self.open_watch(CM + "?watch=1")
        yield self.wait(lambda: len(reader.lines) == 1, "the initial ADDED")
        # Stopped, not killed: etcd 3.5.0 to 3.5.2 may restart without "a" after a
        # SIGKILL (etcd-io/etcd#13766), which is etcd's loss, not the server's.
        self.etcd.terminate()
        # The watch ends cleanly: its client watches again from what it saw.
        yield self.wait(lambda: reader.ended is not None, "the watch to end")
        self.assertEqual(reader.ended, "clean")
        self.assertEqual(self.server.storage.watch_count(), 0)
        code, body = yield self.call("GET", CM + "/a")
        self.assertEqual(code, 500)
        self.assertIn("etcd", body["message"])
        code, body = yield self.call("POST", CM, configmap("b"))
        self.assertEqual(code, 500)
        self.etcd.restart()
        code, body = yield self.call("POST", CM, configmap("b"))
        self.assertEqual(code, 201, body)
        code, body = yield self.call("GET", CM)
        self.assertEqual([i["metadata"]["name"] for i in body["items"]], ["a", "b"])

    @defer.inlineCallbacks
    def test_standalone_module_with_etcd(self):
        output = CollectingProcess()
        process = reactor.spawnProcess(output, sys.executable, [
            sys.executable, "-m", "yurtcoord.sim.apiserver", "--port", "0",
            "--etcd", f"{self.etcd.client_url},http://127.0.0.1:1", "--etcd-prefix", "/pool/"],
            env=dict(os.environ))
        try:
            yield self.wait(lambda: b"\n" in output.out, "the URL line")
            url = output.out.decode().splitlines()[0]
            response = yield self.http.post(
                url + CM, json.dumps(configmap("standalone")).encode(),
                headers={b"Content-Type": [b"application/json"]})
            created = yield response.json()
            self.assertEqual(response.code, 201, created)
            self.assertEqual(created["metadata"]["resourceVersion"],
                             str(self.etcd_kv("/pool/configmaps/default/standalone")
                                 ["mod_revision"]))
        finally:
            if not output.ended.called:
                with contextlib.suppress(ProcessExitedAlready):
                    process.signalProcess(signal.SIGTERM)
            reason = yield output.ended
        self.assertEqual(getattr(reason, "exitCode", None), 0)

    @defer.inlineCallbacks
    def test_a_server_stopped_and_started_again_serves_from_etcd(self):
        yield self.call("POST", CM, configmap("a"))
        yield self.server.stop()
        url = yield self.server.start()
        self.url = url
        code, body = yield self.call("GET", CM + "/a")
        self.assertEqual(code, 200, body)

    @defer.inlineCallbacks
    def test_the_agents_informer_lists_in_pages_watches_and_relists_after_410(self):
        client = KubeClient(reactor, ClientConfig(server=self.url, insecure=True))
        self.addCleanup(client.close)
        for index in range(5):
            yield self.call("POST", CM, configmap(f"cm-{index}"))
        informer = Informer(reactor, client, gvrs.CONFIGMAPS, namespace="default",
                            page_size=2, backoff=Retries(backoff_policy(initial=0.05,
                                                                        maximum=0.2)))
        self.addCleanup(informer.stop)
        informer.start()
        yield informer.wait_for_sync()

        @defer.inlineCallbacks
        def converged():
            _, listed = yield self.call("GET", CM)
            return ({f"default/{i['metadata']['name']}": i for i in listed["items"]}
                    == informer.store)

        self.assertTrue((yield converged()))
        self.assertEqual(sum(1 for _, path, query in self.server.requests
                             if path == CM and query.get("limit") == "2"), 3)
        yield self.call("PUT", CM + "/cm-0", configmap("cm-0", data={"v": "1"}))
        yield self.call("DELETE", CM + "/cm-1")
        yield self.wait(lambda: informer.store.get("default/cm-0", {}).get("data") == {"v": "1"}
                        and "default/cm-1" not in informer.store, "the changes watched")
        # The server down, changes the informer has not seen, then compaction: once
        # the server is back, the watch from its version gets 410 and it lists again.
        yield self.wait(lambda: self.server.open_watches == 1, "the watch")
        yield self.server.faults.down()
        yield self.server.storage.create(gvrs.CONFIGMAPS, configmap("late"))
        yield self.server.storage.delete(gvrs.CONFIGMAPS, "cm-2", "default")
        yield self.server.storage.compact()
        self.assertEqual(informer.lists, 1)
        yield self.server.faults.up()
        yield self.wait(lambda: informer.lists == 2, "a second list")
        yield self.wait(lambda: "default/late" in informer.store
                        and "default/cm-2" not in informer.store, "the relisted state")
        self.assertTrue((yield converged()))

    @defer.inlineCallbacks
    def test_mirror_keys_are_never_objects(self):
        key = self.key("pods", "p", "default")
        yield self.store.create_or_update_many([(key, _pod("p", "default", 7), 7)])
        self.assertEqual(self.mirrors(), {"/registry/pods/default/p": format_rv(7)})
        reader = yield self.open_watch("/api/v1/pods?watch=1")
        yield self.wait(lambda: len(reader.lines) == 1, "the initial ADDED")
        yield self.store.create_or_update_many([(key, _pod("p", "default", 8), 8)])
        yield self.wait(lambda: len(reader.lines) == 2, "the MODIFIED")
        _, listed = yield self.call("GET", "/api/v1/pods")
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["p"])
        self.assertEqual(reader.types(), ["ADDED", "MODIFIED"])
        # Even a storage whose key range holds the mirror keys does not list them.
        storage = storage_for(reactor, self.etcd.client_url, "/mirror/rv/registry")
        self.addCleanup(storage.close)
        items, _ = yield storage.list(gvrs.PODS)
        self.assertEqual(items, [])

    @defer.inlineCallbacks
    def kubectl(self, *args):
        workdir = self.mktemp()
        os.makedirs(workdir)
        kubeconfig = write_kubeconfig(os.path.join(workdir, "kubeconfig"), self.url)
        out, err, code = yield getProcessOutputAndValue(
            KUBECTL, ["--kubeconfig", kubeconfig, "--cache-dir", os.path.join(workdir, "cache"),
                      "--request-timeout", "20s", *args],
            env={"HOME": workdir, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        self.assertEqual(code, 0, err)
        return out.decode()

    @defer.inlineCallbacks
    def test_what_the_pool_store_writes_is_what_kubectl_reads(self):
        written = {}
        slices, pods = [], []
        for index, namespace in enumerate(["default", "kube-system", "default"]):
            name = f"web-{index}"
            value = json.dumps({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": namespace, "resourceVersion":
                             str(900 + index), "uid": f"uid-slice-{index}",
                             "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [f"10.0.0.{index}"]}]},
                separators=(",", ":")).encode()
            key = self.key("endpointslices", name, namespace, component=POOL_SCOPED_COMPONENT,
                           group="discovery.k8s.io")
            slices.append((key, value, 900 + index))
            written[key.path] = (value, 900 + index)
        for node, count in (("edge-1", 2), ("edge-2", 3)):
            for index in range(count):
                name = f"{node}-pod-{index}"
                value = _pod(name, "apps", 5000 + index)
                key = self.key("pods", name, "apps")
                pods.append((key, value, 5000 + index))
                written[key.path] = (value, 5000 + index)
        # As the leader's pool sync and each agent's uploader write them.
        outcome = yield self.store.create_or_update_many(slices)
        self.assertEqual(len(outcome.decided), 3)
        yield self.store.create_or_update_many(pods)

        for resource, prefix in (("endpointslices", "/registry/endpointslices/"),
                                 ("pods", "/registry/pods/")):
            out = yield self.kubectl("get", resource, "-A", "-o", "json")
            served = json.loads(out)["items"]
            stored = self.dump(prefix)
            self.assertEqual(len(served), len([k for k in written if k.startswith(prefix)]))
            for obj in served:
                meta = obj["metadata"]
                path = prefix + f"{meta['namespace']}/{meta['name']}"
                value, cloud_rv = written[path]
                self.assertEqual(stored[path], value)
                expected = json.loads(value)
                expected["metadata"]["resourceVersion"] = str(self.etcd_kv(path)["mod_revision"])
                self.assertEqual(obj, expected)
                self.assertEqual(self.mirrors(prefix)[path], format_rv(cloud_rv))
        out = yield self.kubectl("get", "pods", "-A")
        self.assertEqual(sorted(line.split()[1] for line in out.splitlines()[1:]),
                         sorted(path.rsplit("/", 1)[1] for path in written
                                if path.startswith("/registry/pods/")))


class SelectorPagingTests(ServerTestCase):
    """Pages of a selector list fill up across storage reads, in both modes (the
    class on etcd below runs these with the objects in etcd)."""

    @defer.inlineCallbacks
    def test_pages_with_a_selector_read_on_until_full(self):
        for index in range(9):
            namespace = "default" if index % 2 else "apps"
            yield self.call("POST", f"/api/v1/namespaces/{namespace}/configmaps",
                            configmap(f"cm-{index}", labels={"pick": str(index % 3 == 0)}))
        names, token, pages = [], None, 0
        while True:
            params = {"limit": "2", "labelSelector": "pick=True"}
            if token:
                params["continue"] = token
            code, page = yield self.call("GET", "/api/v1/configmaps", params=params)
            self.assertEqual(code, 200, page)
            names += [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in page["items"]]
            pages += 1
            token = page["metadata"].get("continue")
            if not token:
                break
        self.assertEqual(names, [("apps", "cm-0"), ("apps", "cm-6"), ("default", "cm-3")])
        self.assertEqual(pages, 2)
        code, page = yield self.call("GET", "/api/v1/configmaps", params={"limit": "4"})
        self.assertEqual(page["metadata"]["remainingItemCount"], 5)
        code, page = yield self.call("GET", "/api/v1/namespaces/default/configmaps",
                                     params={"limit": "3", "continue": page["metadata"]["continue"]})
        self.assertEqual([i["metadata"]["name"] for i in page["items"]],
                         ["cm-1", "cm-3", "cm-5"])


class EtcdSelectorPagingTestsMixin(EtcdStoreCase, SelectorPagingTests):

    def setUp(self):
        EtcdStoreCase.setUp(self)
        return SelectorPagingTests.setUp(self)

    def make_storage(self):
        return storage_for(reactor, self.etcd.client_url)


class EtcdTLSAPIServerTestsMixin:
    """The storage's reads, writes and watch stream over etcd's mutual TLS."""

    etcd_binary = None

    @defer.inlineCallbacks
    def test_reads_writes_and_watches_over_mutual_tls(self):
        etcd = use_shared_etcd(self, self.etcd_binary, tls=True)
        ca = etcd.tls_ca
        storage = storage_for(reactor, etcd.client_url, ca_file=ca.ca_file,
                              cert_file=etcd.client_cert.cert_file,
                              key_file=etcd.client_cert.key_file)
        self.addCleanup(storage.close)
        seen = []
        watch = yield storage.watch(gvrs.LEASES, ObjectFilter("kube-node-lease"), None,
                                    lambda kind, obj: seen.append((kind, obj)))
        self.addCleanup(watch.cancel)
        created = yield storage.create(gvrs.LEASES, {
            "metadata": {"name": "edge-1", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "edge-1"}})
        yield poll_until(lambda: seen, what="the ADDED event")
        self.assertEqual(seen, [("ADDED", created)])
        items, revision = yield storage.list(gvrs.LEASES)
        self.assertEqual((items, revision),
                         ([created], int(created["metadata"]["resourceVersion"])))
        self.assertIn(b"/registry/leases/kube-node-lease/edge-1",
                      etcd.read("/registry/", prefix=True))


def _pod(name, namespace, rv):
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv),
                     "uid": f"uid-{name}", "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"nodeName": name.rsplit("-pod-", 1)[0],
                 "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}}, separators=(",", ":")).encode()


make_etcd_test_class(EtcdAPIServerTestsMixin, globals())

make_etcd_test_class(EtcdSelectorPagingTestsMixin, globals())

make_etcd_test_class(EtcdTLSAPIServerTestsMixin, globals())

# TestCases themselves (through ServerTestCase): only the classes on etcd run.
del EtcdAPIServerTestsMixin, EtcdSelectorPagingTestsMixin
