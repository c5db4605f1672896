"""The Kubernetes API test server over real sockets (treq): CRUD, selectors, bad
input, discovery, the request log, watches, faults, TLS with client certificates,
pagination and lists at a revision, and the server run standalone as a process of
its own."""

import contextlib
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import treq
import yaml
from twisted.internet import defer, reactor, ssl
from twisted.internet.error import ConnectionRefusedError, ProcessExitedAlready
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION
from yurtcoord.sim.apiserver import KubeAPIServer, ResourceType
from yurtcoord.sim.apiserver.requestlog import (
    LoggedRequest, json_line, logged_request, read_request_log, request_attributes)
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.storage import IObjectStorage
from yurtcoord.sim.pki import CertPair, TestCA
from yurtcoord.testing.apiservercase import CM, ServerTestCase, configmap
from yurtcoord.testing.inmemoryhttp import InMemoryHTTP
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess


@implementer(IPolicyForHTTPS)
class ClientCertPolicy:
    """Trust ``ca`` for the server named localhost; present ``client`` if given."""

    def __init__(self, ca_file, client_pair=None):
        with open(ca_file, "rb") as f:
            self._ca = ssl.Certificate.loadPEM(f.read())
        self._client = None
        if client_pair is not None:
            with open(client_pair.cert_file, "rb") as f:
                cert = f.read()
            with open(client_pair.key_file, "rb") as f:
                key = f.read()
            self._client = ssl.PrivateCertificate.loadPEM(cert + b"\n" + key)

    def creatorForNetloc(self, hostname, port):
        return ssl.optionsForClientTLS("localhost", trustRoot=self._ca,
                                       clientCertificate=self._client)


class CrudTests(ServerTestCase):

    @defer.inlineCallbacks
    def test_create_get_list(self):
        code, created = yield self.call("POST", CM, configmap("a", {"app": "x"}, {"k": "v"}))
        self.assertEqual(code, 201)
        self.assertEqual(created["kind"], "ConfigMap")
        self.assertEqual(created["apiVersion"], "v1")
        meta = created["metadata"]
        self.assertEqual((meta["name"], meta["namespace"], meta["generation"]), ("a", "default", 1))
        self.assertTrue(meta["uid"])
        self.assertRegex(meta["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual(meta["resourceVersion"], "1")
        code, got = yield self.call("GET", CM + "/a")
        self.assertEqual((code, got), (200, created))
        code, listed = yield self.call("GET", CM)
        self.assertEqual(code, 200)
        self.assertEqual(listed["kind"], "ConfigMapList")
        self.assertEqual(listed["apiVersion"], "v1")
        self.assertEqual(listed["metadata"]["resourceVersion"], "1")
        self.assertEqual(listed["items"], [created])

    @defer.inlineCallbacks
    def test_one_global_resource_version_across_types(self):
        _, first = yield self.call("POST", CM, configmap("a"))
        _, lease = yield self.call(
            "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            {"metadata": {"name": "edge-1"}, "spec": {"holderIdentity": "edge-1"}})
        _, node = yield self.call("POST", "/api/v1/nodes", {"metadata": {"name": "edge-1"}})
        versions = [int(o["metadata"]["resourceVersion"]) for o in (first, lease, node)]
        self.assertEqual(versions, sorted(versions))
        self.assertEqual(len(set(versions)), 3)
        self.assertEqual(lease["apiVersion"], "coordination.k8s.io/v1")
        self.assertEqual(lease["metadata"]["namespace"], "kube-node-lease")
        self.assertNotIn("namespace", node["metadata"])
        code, listed = yield self.call("GET", "/apis/coordination.k8s.io/v1/leases")
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["edge-1"])
        self.assertEqual(listed["kind"], "LeaseList")
        self.assertEqual(listed["metadata"]["resourceVersion"], str(versions[-1]))

    @defer.inlineCallbacks
    def test_cluster_and_namespaced_paths(self):
        code, _ = yield self.call("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
        self.assertEqual(code, 201)
        code, node = yield self.call("GET", "/api/v1/nodes/n1")
        self.assertEqual((code, node["kind"]), (200, "Node"))
        code, body = yield self.call("GET", "/api/v1/namespaces/default/nodes/n1")
        self.assertEqual(code, 404)
        self.assertStatus(body, 404, "NotFound")
        code, body = yield self.call("GET", "/api/v1/configmaps/a")
        self.assertEqual(code, 404)
        for version in ("v1", "v1beta1"):
            path = f"/apis/discovery.k8s.io/{version}/namespaces/kube-system/endpointslices"
            code, created = yield self.call("POST", path, {
                "metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []})
            self.assertEqual(code, 201)
            self.assertEqual(created["apiVersion"], f"discovery.k8s.io/{version}")
            self.assertEqual(created["kind"], "EndpointSlice")

    @defer.inlineCallbacks
    def test_not_found_status(self):
        code, body = yield self.call(
            "GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/nope")
        self.assertEqual(code, 404)
        self.assertStatus(body, 404, "NotFound")
        self.assertEqual(body["details"], {
            "name": "nope", "group": "coordination.k8s.io", "kind": "leases"})
        self.assertEqual(body["message"], 'leases.coordination.k8s.io "nope" not found')

    @defer.inlineCallbacks
    def test_create_existing_is_already_exists(self):
        yield self.call("POST", CM, configmap("a"))
        code, body = yield self.call("POST", CM, configmap("a"))
        self.assertEqual(code, 409)
        self.assertStatus(body, 409, "AlreadyExists")
        self.assertEqual(body["details"]["name"], "a")

    @defer.inlineCallbacks
    def test_answers_log_the_code_of_every_answer_sent(self):
        yield self.call("POST", CM, configmap("a"))
        yield self.call("POST", CM, configmap("a"))
        self.server.faults.fail_next(1, code=503)
        yield self.call("GET", CM + "/a")
        yield self.wait(lambda: len(self.server.answers) == 3, "three answers logged")
        self.assertEqual([(method, path, code) for _at, method, path, code in self.server.answers],
                         [("POST", CM, 201), ("POST", CM, 409), ("GET", CM + "/a", 503)])

    @defer.inlineCallbacks
    def test_update_rules(self):
        _, created = yield self.call("POST", CM, configmap("a", data={"k": "1"}))
        stale = dict(created, data={"k": "2"})
        _, updated = yield self.call("PUT", CM + "/a", stale)
        self.assertEqual(updated["data"], {"k": "2"})
        self.assertGreater(int(updated["metadata"]["resourceVersion"]),
                           int(created["metadata"]["resourceVersion"]))
        self.assertEqual(updated["metadata"]["uid"], created["metadata"]["uid"])
        self.assertEqual(updated["metadata"]["generation"], 2)
        code, body = yield self.call("PUT", CM + "/a", dict(stale, data={"k": "3"}))
        self.assertEqual(code, 409)
        self.assertStatus(body, 409, "Conflict")
        unconditional = configmap("a", data={"k": "4"})
        code, body = yield self.call("PUT", CM + "/a", unconditional)
        self.assertEqual((code, body["data"]), (200, {"k": "4"}))
        code, body = yield self.call("PUT", CM + "/missing", configmap("missing"))
        self.assertEqual(code, 404)
        self.assertStatus(body, 404, "NotFound")

    @defer.inlineCallbacks
    def test_identical_update_does_not_bump_resource_version(self):
        _, created = yield self.call("POST", CM, configmap("a", data={"k": "1"}))
        _, same = yield self.call("PUT", CM + "/a", created)
        self.assertEqual(same["metadata"]["resourceVersion"],
                         created["metadata"]["resourceVersion"])

    @defer.inlineCallbacks
    def test_status_subresource(self):
        yield self.call("POST", "/api/v1/nodes", {
            "metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"phase": "Pending"}})
        code, node = yield self.call("PUT", "/api/v1/nodes/n/status", {
            "metadata": {"name": "n"}, "spec": {"podCIDR": "ignored"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        self.assertEqual(code, 200)
        self.assertEqual(node["spec"], {"podCIDR": "10.0.0.0/24"})
        self.assertEqual(node["status"]["conditions"][0]["type"], "Ready")
        code, node = yield self.call("PUT", "/api/v1/nodes/n", {
            "metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.1.0/24"}, "status": {}})
        self.assertEqual(node["spec"], {"podCIDR": "10.0.1.0/24"})
        self.assertEqual(node["status"]["conditions"][0]["status"], "True")

    @defer.inlineCallbacks
    def test_generate_name(self):
        code, created = yield self.call("POST", CM, {"metadata": {"generateName": "gen-"}})
        self.assertEqual(code, 201)
        name = created["metadata"]["name"]
        self.assertRegex(name, r"^gen-[a-z0-9]{5}$")
        code, _ = yield self.call("GET", CM + "/" + name)
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_delete_then_not_found(self):
        _, created = yield self.call("POST", CM, configmap("a"))
        code, body = yield self.call("DELETE", CM + "/a")
        self.assertEqual(code, 200)
        self.assertEqual((body["kind"], body["status"]), ("Status", "Success"))
        self.assertEqual(body["details"]["uid"], created["metadata"]["uid"])
        code, body = yield self.call("GET", CM + "/a")
        self.assertEqual(code, 404)
        code, body = yield self.call("DELETE", CM + "/a")
        self.assertEqual(code, 404)
        self.assertStatus(body, 404, "NotFound")

    @defer.inlineCallbacks
    def test_delete_precondition(self):
        yield self.call("POST", CM, configmap("a"))
        code, body = yield self.call("DELETE", CM + "/a", {
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": "999"}})
        self.assertEqual(code, 409)
        self.assertStatus(body, 409, "Conflict")

    @defer.inlineCallbacks
    def test_merge_and_json_patch(self):
        yield self.call("POST", CM, configmap("a", data={"k": "1", "drop": "x"}))
        code, body = yield self.call(
            "PATCH", CM + "/a", {"data": {"k": "2", "drop": None}},
            headers={b"Content-Type": [b"application/merge-patch+json"]})
        self.assertEqual((code, body["data"]), (200, {"k": "2"}))
        code, body = yield self.call(
            "PATCH", CM + "/a", [{"op": "add", "path": "/data/n", "value": "3"}],
            headers={b"Content-Type": [b"application/json-patch+json"]})
        self.assertEqual((code, body["data"]), (200, {"k": "2", "n": "3"}))
        code, body = yield self.call(
            "PATCH", CM + "/a", {"data": {}},
            headers={b"Content-Type": [b"application/apply-patch+yaml"]})
        self.assertEqual(code, 415)


class SelectorTests(ServerTestCase):

    @defer.inlineCallbacks
    def setUp(self):
        yield super().setUp()
        yield self.call("POST", CM, configmap("a", {"app": "web", "tier": "front"}))
        yield self.call("POST", CM, configmap("b", {"app": "db"}))
        yield self.call("POST", CM, configmap("c"))
        yield self.call("POST", "/api/v1/namespaces/other/configmaps", configmap("a", {"app": "web"}))

    @defer.inlineCallbacks
    def names(self, query, path="/api/v1/configmaps"):
        code, body = yield self.call("GET", path, params=query)
        self.assertEqual(code, 200, body)
        return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]]

    @defer.inlineCallbacks
    def test_label_selector_operators(self):
        cases = {
            "app=web": [("default", "a"), ("other", "a")],
            "app==web,tier=front": [("default", "a")],
            "app!=web": [("default", "b"), ("default", "c")],
            "app in (db, web),tier": [("default", "a")],
            "app notin (web)": [("default", "b"), ("default", "c")],
            "app": [("default", "a"), ("default", "b"), ("other", "a")],
            "!app": [("default", "c")],
        }
        for selector, expected in cases.items():
            got = yield self.names({"labelSelector": selector})
            self.assertEqual(got, expected, selector)

    @defer.inlineCallbacks
    def test_field_selector_name_and_namespace(self):
        got = yield self.names({"fieldSelector": "metadata.name=a"})
        self.assertEqual(got, [("default", "a"), ("other", "a")])
        got = yield self.names({"fieldSelector": "metadata.namespace=other"})
        self.assertEqual(got, [("other", "a")])
        got = yield self.names({"fieldSelector": "metadata.name!=a,metadata.namespace==default"})
        self.assertEqual(got, [("default", "b"), ("default", "c")])
        got = yield self.names({"fieldSelector": "metadata.name=a"}, path=CM)
        self.assertEqual(got, [("default", "a")])

    @defer.inlineCallbacks
    def test_invalid_selector_is_bad_request(self):
        for query in ({"labelSelector": "app in (web"}, {"fieldSelector": "metadata.name"}):
            code, body = yield self.call("GET", "/api/v1/configmaps", params=query)
            self.assertEqual(code, 400, query)
            self.assertStatus(body, 400, "BadRequest")


class BadInputTests(ServerTestCase):

    @defer.inlineCallbacks
    def test_bad_bodies_get_400_or_422(self):
        yield self.call("POST", CM, configmap("a"))
        cases = [
            ("POST", CM, b"{not json", 400, "BadRequest"),
            ("PUT", CM + "/a", b"", 400, "BadRequest"),
            ("POST", CM, b"[1, 2]", 400, "BadRequest"),
            ("POST", CM, json.dumps({"kind": "Pod", "metadata": {"name": "p"}}).encode(),
             400, "BadRequest"),
            ("POST", CM, json.dumps({"apiVersion": "apps/v1", "kind": "ConfigMap",
                                     "metadata": {"name": "p"}}).encode(), 400, "BadRequest"),
            ("PUT", CM + "/a", json.dumps(configmap("b")).encode(), 400, "BadRequest"),
            ("PUT", CM + "/a", json.dumps(configmap("a", namespace="other")).encode(),
             400, "BadRequest"),
            ("POST", CM, json.dumps({"metadata": {}}).encode(), 422, "Invalid"),
            ("POST", CM, json.dumps({"metadata": {"name": "Bad_Name"}}).encode(), 422, "Invalid"),
            ("POST", CM, json.dumps({"metadata": "x"}).encode(), 400, "BadRequest"),
            ("POST", CM, json.dumps({"metadata": {"name": "l", "labels": {"a": 1}}}).encode(),
             400, "BadRequest"),
            ("POST", CM, json.dumps({"metadata": {"generateName": 7}}).encode(),
             400, "BadRequest"),
            ("DELETE", CM + "/a", b'{"preconditions": 5}', 400, "BadRequest"),
            ("GET", CM + "?watch=1&resourceVersion=abc", None, 400, "BadRequest"),
        ]
        merge = {b"Content-Type": [b"application/merge-patch+json"]}
        cases += [
            ("PATCH", CM + "/a", b'{"metadata": true}', 400, "BadRequest", merge),
            ("PATCH", CM + "/a", b'{"metadata": {"name": "b"}}', 400, "BadRequest", merge),
            ("PATCH", CM + "/a", b'[1]', 400, "BadRequest", merge),
            ("PATCH", CM + "/a", b'{"data": {}}', 415, "UnsupportedMediaType",
             {b"Content-Type": [b"text/plain"]}),
            ("PATCH", CM + "/a", b'[{"op": "remove", "path": "/nope"}]', 422, "Invalid",
             {b"Content-Type": [b"application/json-patch+json"]}),
        ]
        for method, path, raw, code, reason, *headers in cases:
            extra = {"headers": headers[0]} if headers else {}
            got_code, body = yield self.call(method, path, raw=raw, **extra)
            self.assertEqual(got_code, code, (method, path, raw, body))
            self.assertStatus(body, code, reason)
        code, body = yield self.call("GET", CM + "/a")
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_unknown_paths_and_methods(self):
        for path in ("/api/v2", "/apis/nope.io/v1", "/api/v1/widgets", "/openapi/v3",
                     "/apis/coordination.k8s.io/v9/leases", "/api/v1/nodes/n/exec"):
            code, body = yield self.call("GET", path)
            self.assertEqual(code, 404, path)
            self.assertStatus(body, 404, "NotFound")
        code, body = yield self.call("POST", CM + "/a", configmap("a"))
        self.assertEqual(code, 405)
        self.assertStatus(body, 405, "MethodNotAllowed")


class DiscoveryTests(ServerTestCase):

    @defer.inlineCallbacks
    def test_discovery_documents(self):
        _, api = yield self.call("GET", "/api")
        self.assertEqual((api["kind"], api["versions"]), ("APIVersions", ["v1"]))
        _, core = yield self.call("GET", "/api/v1")
        self.assertEqual(core["kind"], "APIResourceList")
        by_name = {r["name"]: r for r in core["resources"]}
        self.assertEqual(by_name["nodes"]["namespaced"], False)
        self.assertEqual(by_name["pods"]["kind"], "Pod")
        self.assertEqual(by_name["configmaps"]["singularName"], "configmap")
        self.assertIn("watch", by_name["secrets"]["verbs"])
        for name in ("endpoints", "pods", "nodes", "secrets", "configmaps", "services",
                     "namespaces"):
            self.assertIn(name, by_name)
        _, groups = yield self.call("GET", "/apis")
        self.assertEqual(groups["kind"], "APIGroupList")
        names = {g["name"]: [v["version"] for v in g["versions"]] for g in groups["groups"]}
        self.assertEqual(names, {"coordination.k8s.io": ["v1"],
                                 "discovery.k8s.io": ["v1", "v1beta1"]})
        _, leases = yield self.call("GET", "/apis/coordination.k8s.io/v1")
        self.assertEqual(leases["groupVersion"], "coordination.k8s.io/v1")
        self.assertEqual([r["kind"] for r in leases["resources"]], ["Lease"])

    @defer.inlineCallbacks
    def test_catalog_changes_show_in_discovery(self):
        self.server.catalog.remove(gvrs.ENDPOINTSLICES_V1BETA1)
        code, body = yield self.call("GET", "/apis/discovery.k8s.io/v1beta1")
        self.assertEqual(code, 404)
        self.assertStatus(body, 404, "NotFound")
        _, group = yield self.call("GET", "/apis/discovery.k8s.io")
        self.assertEqual([v["version"] for v in group["versions"]], ["v1"])
        pools = GroupVersionResource("apps.openyurt.io", "v1beta1", "nodepools",
                                     namespaced=False)
        self.server.catalog.add(ResourceType(pools, "NodePool", "nodepool", ("np",)))
        _, listing = yield self.call("GET", "/apis/apps.openyurt.io/v1beta1")
        self.assertEqual(listing["resources"][0]["kind"], "NodePool")
        code, created = yield self.call("POST", "/apis/apps.openyurt.io/v1beta1/nodepools",
                                        {"metadata": {"name": "hangzhou"}})
        self.assertEqual((code, created["apiVersion"]), (201, "apps.openyurt.io/v1beta1"))
        self.assertEqual(self.server.store.get(pools, "hangzhou")["kind"], "NodePool")

    @defer.inlineCallbacks
    def test_health_and_version(self):
        for path in ("/healthz", "/readyz", "/livez"):
            response = yield self.request("GET", path)
            body = yield response.text()
            self.assertEqual((response.code, body), (200, "ok"))
        _, version = yield self.call("GET", "/version")
        self.assertEqual(version["gitVersion"], "v1.28.0")
        self.assertEqual(version["major"], "1")

    @defer.inlineCallbacks
    def test_openapi_v2_is_an_empty_document(self):
        response = yield self.request(
            "GET", "/openapi/v2",
            headers={b"Accept": [b"application/com.github.proto-openapi.spec.v2@v1.0+protobuf"]})
        body = yield response.content()
        self.assertEqual((response.code, body), (200, b""))
        code, body = yield self.call("GET", "/openapi/v2")
        self.assertEqual((code, body["swagger"], body["paths"]), (200, "2.0", {}))

    @defer.inlineCallbacks
    def test_requests_are_recorded(self):
        yield self.call("GET", CM, params={"labelSelector": "a=b"})
        self.assertEqual(self.server.requests[-1], ("GET", CM, {"labelSelector": "a=b"}))


NODE_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def node_lease(name, holder, renew_time, delegated=False):
    metadata = {"name": name}
    if delegated:
        metadata["annotations"] = {DELEGATE_HEARTBEAT_ANNOTATION: "true"}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "renewTime": renew_time,
                     "leaseDurationSeconds": 40}}


class RequestLogTests(ServerTestCase):
    """``request_log``: who wrote which lease, as the server answered it."""

    def logged(self, count):
        return self.wait(lambda: len(self.server.request_log) >= count,
                         f"{count} requests logged")

    @defer.inlineCallbacks
    def test_lease_writes_carry_the_peer_and_the_lease_as_answered(self):
        code, created = yield self.call(
            "POST", NODE_LEASES, node_lease("edge-1", "edge-1", "2026-01-01T00:00:01.000000Z"))
        self.assertEqual(code, 201)
        update = node_lease("edge-1", "edge-1", "2026-01-01T00:00:11.000000Z", delegated=True)
        update["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        code, _ = yield self.call("PUT", NODE_LEASES + "/edge-1", update)
        self.assertEqual(code, 200)
        yield self.logged(2)
        posted, put = self.server.request_log
        self.assertEqual(posted[1:], ("127.0.0.1", "POST", NODE_LEASES, 201, "kube-node-lease",
                                      "edge-1", "edge-1", "2026-01-01T00:00:01.000000Z", False, "",
                                      ""))
        self.assertEqual(put[1:], ("127.0.0.1", "PUT", NODE_LEASES + "/edge-1", 200,
                                   "kube-node-lease", "edge-1", "edge-1",
                                   "2026-01-01T00:00:11.000000Z", True, "", ""))
        self.assertTrue(put.is_lease_write)
        self.assertEqual([r.at for r in self.server.request_log],
                         [at for at, _method, _path, _code in self.server.answers])
        self.assertLessEqual(posted.at, put.at)

    @defer.inlineCallbacks
    def test_a_failed_write_has_its_code_and_no_lease(self):
        code, created = yield self.call(
            "POST", NODE_LEASES, node_lease("edge-1", "edge-1", "2026-01-01T00:00:01.000000Z"))
        stale = node_lease("edge-1", "intruder", "2026-01-01T00:00:02.000000Z")
        stale["metadata"]["resourceVersion"] = "999"
        code, _ = yield self.call("PUT", NODE_LEASES + "/edge-1", stale)
        self.assertEqual(code, 409)
        yield self.logged(2)
        failed = self.server.request_log[-1]
        self.assertEqual((failed.method, failed.code, failed.peer), ("PUT", 409, "127.0.0.1"))
        self.assertEqual((failed.namespace, failed.name, failed.holder, failed.renew_time,
                          failed.delegated), (None, None, None, None, None))
        self.assertFalse(failed.is_lease_write)

    @defer.inlineCallbacks
    def test_reads_and_other_kinds_have_no_lease_fields(self):
        yield self.call("POST", NODE_LEASES, node_lease("edge-1", "edge-1", None))
        yield self.call("GET", NODE_LEASES + "/edge-1")
        yield self.call("POST", CM, configmap("a"))
        yield self.logged(3)
        created, read, configmap_write = self.server.request_log
        self.assertEqual((created.holder, created.renew_time), ("edge-1", None))
        self.assertEqual(read, LoggedRequest(read.at, "127.0.0.1", "GET", NODE_LEASES + "/edge-1", 200))
        self.assertEqual(configmap_write, LoggedRequest(configmap_write.at, "127.0.0.1",
                                                        "POST", CM, 201))

    @defer.inlineCallbacks
    def test_a_lease_delete_names_the_lease(self):
        yield self.call("POST", NODE_LEASES, node_lease("edge-1", "edge-1", None))
        code, _ = yield self.call("DELETE", NODE_LEASES + "/edge-1")
        self.assertEqual(code, 200)
        code, _ = yield self.call("DELETE", NODE_LEASES + "/edge-1")
        self.assertEqual(code, 404)
        yield self.logged(3)
        deleted, missing = self.server.request_log[1:]
        self.assertEqual(deleted[1:], ("127.0.0.1", "DELETE", NODE_LEASES + "/edge-1", 200,
                                       "kube-node-lease", "edge-1", None, None, None, "", ""))
        self.assertTrue(deleted.is_lease_delete)
        self.assertEqual((missing.code, missing.name), (404, None))

    @defer.inlineCallbacks
    def test_an_injected_failure_is_logged_without_a_lease(self):
        self.server.faults.fail_next(1, code=503)
        code, _ = yield self.call("POST", NODE_LEASES, node_lease("edge-1", "edge-1", None))
        self.assertEqual(code, 503)
        yield self.logged(1)
        self.assertEqual(self.server.request_log[0][1:],
                         ("127.0.0.1", "POST", NODE_LEASES, 503, None, None, None, None, None,
                          "", ""))

    def test_the_log_keeps_the_newest_records_and_counts_the_others(self):
        http = InMemoryHTTP()
        http.server.request_log_limit = 3
        for path in (b"/healthz", b"/version", b"/livez", b"/readyz", b"/nope"):
            http.request(b"GET", path)
        self.assertEqual([(r.path, r.peer) for r in http.server.request_log],
                         [("/livez", "127.0.0.1"), ("/readyz", "127.0.0.1"),
                          ("/nope", "127.0.0.1")])
        self.assertEqual(http.server.request_log_dropped, 2)
        http.server.request_log_limit = 20
        for _ in range(21):
            http.request(b"GET", b"/healthz")
        self.assertEqual((len(http.server.request_log), http.server.request_log_dropped),
                         (20, 6))

    def test_a_request_log_file_reads_back_as_records(self):
        path = self.mktemp()
        records = [logged_request(1.5, "198.18.0.2", "PUT", NODE_LEASES + "/edge-1", 200,
                                  node_lease("edge-1", "edge-1", "t", delegated=True)),
                   logged_request(2.0, "198.18.0.3", "GET", "/healthz", 200)]
        with open(path, "w") as f:
            f.writelines(json_line(record) for record in records)
            f.write('{"at": 3.0, "peer": "198.18')
        self.assertEqual(read_request_log(path), records)
        with open(path, "w") as f:
            f.write(json_line(records[0]) + '{"at": 3.0}\n' + json_line(records[1]))
        with self.assertRaisesRegex(ValueError, f"{path}:2: not a request log record"):
            read_request_log(path)
        with open(path, "w") as f:
            f.write('{"at": "x", "peer": "", "method": "GET", "path": "/", "code": 200}\n')
        with self.assertRaisesRegex(ValueError, f"{path}:1: .*at 'x'"):
            read_request_log(path)

    @defer.inlineCallbacks
    def test_a_server_with_a_request_log_path_appends_every_record(self):
        path = self.mktemp()
        self.server.request_log_path = path
        yield self.call("POST", NODE_LEASES, node_lease("edge-1", "edge-1", None))
        yield self.call("GET", NODE_LEASES + "/edge-1")
        yield self.logged(2)
        self.assertEqual(read_request_log(path), list(self.server.request_log))

    @defer.inlineCallbacks
    def test_every_request_keeps_its_query(self):
        yield self.call("GET", NODE_LEASES + "?fieldSelector=metadata.name%3Dedge-1&limit=5")
        yield self.logged(1)
        self.assertEqual(self.server.request_log[0].query,
                         "fieldSelector=metadata.name%3Dedge-1&limit=5")
        self.assertEqual(self.server.request_log[0].path, NODE_LEASES)

    def test_request_attributes_read_a_record_as_the_authorizer_does(self):
        def attributes(method, path, query=""):
            record = logged_request(1.0, "127.0.0.1", method, path, 200, query=query)
            attrs = request_attributes(record)
            return (attrs.verb, attrs.group, attrs.resource, attrs.subresource,
                    attrs.namespace, attrs.name)

        lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        self.assertEqual(attributes("GET", lease + "/edge-1"),
                         ("get", "coordination.k8s.io", "leases", "", "kube-node-lease",
                          "edge-1"))
        self.assertEqual(attributes("PUT", lease + "/edge-1")[0], "update")
        self.assertEqual(attributes("PATCH", lease + "/edge-1")[0], "patch")
        self.assertEqual(attributes("POST", lease), ("create", "coordination.k8s.io",
                                                     "leases", "", "kube-node-lease", ""))
        self.assertEqual(attributes("DELETE", lease + "/edge-1")[0], "delete")
        self.assertEqual(attributes("DELETE", lease)[0], "deletecollection")
        self.assertEqual(attributes("GET", lease, "limit=500"),
                         ("list", "coordination.k8s.io", "leases", "", "kube-node-lease", ""))
        self.assertEqual(attributes("GET", lease, "watch=true&resourceVersion=5")[0], "watch")
        self.assertEqual(attributes("GET", lease, "watch=false")[0], "list")
        # A list or watch of one name by field selector is authorized by that name.
        self.assertEqual(attributes("GET", "/api/v1/namespaces/kube-system/secrets",
                                    "watch=1&fieldSelector=metadata.name%3Dcerts"),
                         ("watch", "", "secrets", "", "kube-system", "certs"))
        self.assertEqual(attributes("GET", "/api/v1/namespaces/kube-system/secrets",
                                    "fieldSelector=metadata.name%21%3Dcerts")[5], "")
        self.assertEqual(attributes("GET", "/api/v1/nodes", "labelSelector=a%3Db"),
                         ("list", "", "nodes", "", "", ""))
        self.assertEqual(attributes("PUT", "/api/v1/nodes/edge-1/status"),
                         ("update", "", "nodes", "status", "", "edge-1"))
        self.assertEqual(attributes("GET", "/api/v1/namespaces/kube-system"),
                         ("get", "", "namespaces", "", "kube-system", "kube-system"))
        self.assertEqual(attributes("PUT", "/api/v1/namespaces/x/status"),
                         ("update", "", "namespaces", "status", "x", "x"))
        self.assertEqual(attributes("GET", "/api/v1/watch/namespaces/d/endpoints"),
                         ("watch", "", "endpoints", "", "d", ""))
        self.assertEqual(attributes("GET", "/apis/discovery.k8s.io/v1/endpointslices"),
                         ("list", "discovery.k8s.io", "endpointslices", "", "", ""))
        for path in ("/api/v1", "/apis/discovery.k8s.io/v1", "/apis", "/version", "/healthz"):
            attrs = request_attributes(logged_request(1.0, "127.0.0.1", "GET", path, 200))
            self.assertFalse(attrs.is_resource_request, path)
            self.assertEqual((attrs.verb, attrs.path), ("get", path))

    def test_odd_lease_bodies_never_break_the_record(self):
        for body in ({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1"},
                     {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                      "metadata": [], "spec": "x"},
                     {"kind": "Lease", "apiVersion": 7}, [], "text", None):
            record = logged_request(1.0, "10.0.0.1", "PUT", "/x", 200, body)
            self.assertEqual(record.peer, "10.0.0.1")
            self.assertIn(record.holder, ("", None))


class WatchTests(ServerTestCase):

    @defer.inlineCallbacks
    def test_watch_order_add_modify_delete(self):
        _, listed = yield self.call("GET", CM)
        rv = listed["metadata"]["resourceVersion"]
        reader = yield self.open_watch(f"{CM}?watch=1&resourceVersion={rv}")
        _, created = yield self.call("POST", CM, configmap("a"))
        yield self.call("PUT", CM + "/a", configmap("a", data={"x": "y"}))
        yield self.call("DELETE", CM + "/a")
        yield self.wait(lambda: len(reader.lines) >= 3, "three events")
        self.assertEqual(reader.types(), ["ADDED", "MODIFIED", "DELETED"])
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in reader.lines]
        self.assertEqual(versions, sorted(set(versions)))
        self.assertEqual(reader.lines[1]["object"]["data"], {"x": "y"})
        self.assertEqual(reader.lines[2]["object"]["kind"], "ConfigMap")

    @defer.inlineCallbacks
    def test_replay_from_resource_version(self):
        _, a = yield self.call("POST", CM, configmap("a"))
        yield self.call("POST", CM, configmap("b"))
        yield self.call("DELETE", CM + "/a")
        rv = a["metadata"]["resourceVersion"]
        reader = yield self.open_watch(f"{CM}?watch=true&resourceVersion={rv}")
        yield self.wait(lambda: len(reader.lines) >= 2, "replayed events")
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in reader.lines],
                         [("ADDED", "b"), ("DELETED", "a")])

    @defer.inlineCallbacks
    def test_watch_without_version_starts_with_current_state(self):
        yield self.call("POST", CM, configmap("a"))
        yield self.call("POST", CM, configmap("b"))
        for query in ("watch=1", "watch=1&resourceVersion=0"):
            reader = yield self.open_watch(f"{CM}?{query}")
            yield self.wait(lambda: len(reader.lines) >= 2, "synthetic ADDED")
            self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in reader.lines],
                             [("ADDED", "a"), ("ADDED", "b")])

    @defer.inlineCallbacks
    def test_watch_selector_enter_and_leave(self):
        yield self.call("POST", CM, configmap("a"))
        reader = yield self.open_watch(f"{CM}?watch=1&labelSelector=app%3Dweb")
        yield self.call("PUT", CM + "/a", configmap("a", {"app": "web"}))
        yield self.call("PUT", CM + "/a", configmap("a", {"app": "web"}, {"k": "v"}))
        yield self.call("PUT", CM + "/a", configmap("a", {"app": "db"}))
        yield self.call("POST", CM, configmap("other", {"app": "db"}))
        yield self.call("POST", CM, configmap("b", {"app": "web"}))
        yield self.wait(lambda: len(reader.lines) >= 4, "selected events")
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in reader.lines],
                         [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")])
        left = reader.lines[2]["object"]
        self.assertEqual(left["metadata"]["labels"], {"app": "web"})
        _, now = yield self.call("GET", CM + "/a")
        self.assertEqual(left["metadata"]["resourceVersion"], now["metadata"]["resourceVersion"])

    @defer.inlineCallbacks
    def test_watch_single_object_by_path_and_legacy_watch_prefix(self):
        reader = yield self.open_watch(f"{CM}/a?watch=1")
        legacy = yield self.open_watch("/api/v1/watch/namespaces/default/configmaps")
        yield self.call("POST", CM, configmap("b"))
        yield self.call("POST", CM, configmap("a"))
        yield self.wait(lambda: len(reader.lines) >= 1 and len(legacy.lines) >= 2, "events")
        self.assertEqual([e["object"]["metadata"]["name"] for e in reader.lines], ["a"])
        self.assertEqual([e["object"]["metadata"]["name"] for e in legacy.lines], ["b", "a"])

    @defer.inlineCallbacks
    def test_compacted_version_gets_410_error_event(self):
        _, a = yield self.call("POST", CM, configmap("a"))
        yield self.call("POST", CM, configmap("b"))
        self.server.store.compact()
        reader = yield self.open_watch(
            f"{CM}?watch=1&resourceVersion={a['metadata']['resourceVersion']}")
        yield reader.done
        self.assertEqual(reader.ended, "clean")
        self.assertEqual(reader.types(), ["ERROR"])
        error = reader.lines[0]["object"]
        self.assertStatus(error, 410, "Expired")
        self.assertEqual(self.server.open_watches, 0)

    @defer.inlineCallbacks
    def test_bookmarks_carry_current_version_only(self):
        _, a = yield self.call("POST", CM, configmap("a"))
        reader = yield self.open_watch(f"{CM}?watch=1&allowWatchBookmarks=true"
                                       f"&resourceVersion={a['metadata']['resourceVersion']}")
        yield self.wait(lambda: "BOOKMARK" in reader.types(), "a bookmark")
        bookmark = [e for e in reader.lines if e["type"] == "BOOKMARK"][0]["object"]
        self.assertEqual(bookmark, {"kind": "ConfigMap", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": "1"}})
        plain = yield self.open_watch(f"{CM}?watch=1&resourceVersion=1&timeoutSeconds=1")
        yield plain.done
        self.assertNotIn("BOOKMARK", plain.types())

    @defer.inlineCallbacks
    def test_timeout_seconds_ends_stream_cleanly(self):
        started = time.monotonic()
        reader = yield self.open_watch(f"{CM}?watch=1&timeoutSeconds=1")
        yield reader.done
        self.assertEqual(reader.ended, "clean")
        self.assertGreaterEqual(time.monotonic() - started, 0.9)
        yield self.wait(lambda: self.server.open_watches == 0, "watch closed")

    @defer.inlineCallbacks
    def test_direct_store_writes_reach_watchers(self):
        reader = yield self.open_watch(f"{CM}?watch=1&resourceVersion=0")
        created = self.server.store.create(gvrs.CONFIGMAPS, configmap("a"))
        self.server.store.update(gvrs.CONFIGMAPS, dict(created, data={"k": "v"}))
        self.server.store.delete(gvrs.CONFIGMAPS, "a", "default")
        yield self.wait(lambda: len(reader.lines) >= 3, "events from direct writes")
        self.assertEqual(reader.types(), ["ADDED", "MODIFIED", "DELETED"])
        code, body = yield self.call("GET", CM)
        self.assertEqual(body["metadata"]["resourceVersion"], "3")


class ShortHistoryTests(ServerTestCase):
    history = 2

    @defer.inlineCallbacks
    def test_history_bound_expires_old_versions(self):
        for name in "abcd":
            yield self.call("POST", CM, configmap(name))
        reader = yield self.open_watch(f"{CM}?watch=1&resourceVersion=1")
        yield reader.done
        self.assertEqual(reader.types(), ["ERROR"])
        self.assertEqual(reader.lines[0]["object"]["code"], 410)
        reader = yield self.open_watch(f"{CM}?watch=1&resourceVersion=2&timeoutSeconds=1")
        yield self.wait(lambda: len(reader.lines) >= 2, "retained events")
        self.assertEqual([e["object"]["metadata"]["name"] for e in reader.lines], ["c", "d"])
        yield reader.done


class FaultTests(ServerTestCase):

    @defer.inlineCallbacks
    def test_down_refuses_and_up_listens_on_same_port(self):
        port = self.server.port_number
        reader = yield self.open_watch(f"{CM}?watch=1")
        yield self.server.faults.down()
        yield self.wait(lambda: reader.ended is not None, "watch dropped")
        self.assertNotEqual(reader.ended, "clean")
        failure = yield self.assertFailure(self.request("GET", "/healthz"), ConnectionRefusedError)
        self.assertIsInstance(failure, ConnectionRefusedError)
        yield self.server.faults.up()
        self.assertEqual(self.server.port_number, port)
        code, _ = yield self.call("GET", "/healthz")
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_down_without_waiting_then_up(self):
        self.server.faults.down()
        yield self.server.faults.up()
        code, _ = yield self.call("GET", "/readyz")
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_latency_delays_answers(self):
        self.server.faults.latency = 0.3
        started = time.monotonic()
        code, _ = yield self.call("GET", "/healthz")
        self.assertEqual(code, 200)
        self.assertGreaterEqual(time.monotonic() - started, 0.29)

    @defer.inlineCallbacks
    def test_fail_next_answers_status_then_recovers(self):
        self.server.faults.fail_next(2, code=503)
        for _ in range(2):
            code, body = yield self.call("GET", CM)
            self.assertEqual(code, 503)
            self.assertStatus(body, 503, "ServiceUnavailable")
        code, body = yield self.call("GET", CM)
        self.assertEqual((code, body["kind"]), (200, "ConfigMapList"))
        self.server.faults.fail_next(1, code=429)
        response = yield self.request("GET", CM)
        body = yield response.json()
        self.assertEqual(response.code, 429)
        self.assertEqual(response.headers.getRawHeaders(b"retry-after"), [b"1"])
        self.assertStatus(body, 429, "TooManyRequests")

    @defer.inlineCallbacks
    def test_fail_next_narrowed_to_method_and_path(self):
        yield self.call("POST", CM, configmap("a"))
        self.server.faults.fail_next(1, code=500, method="PUT", path="/configmaps/a")
        code, _ = yield self.call("GET", CM + "/a")
        self.assertEqual(code, 200)
        code, _ = yield self.call("PUT", CM + "/b", configmap("b"))
        self.assertEqual(code, 404)
        code, body = yield self.call("PUT", CM + "/a", configmap("a"))
        self.assertEqual(code, 500)
        self.assertStatus(body, 500, "InternalError")
        code, _ = yield self.call("PUT", CM + "/a", configmap("a"))
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_drop_connections_keeps_listening(self):
        reader = yield self.open_watch(f"{CM}?watch=1")
        yield self.server.faults.drop_connections()
        yield self.wait(lambda: reader.ended is not None, "watch dropped")
        self.assertNotEqual(reader.ended, "clean")
        code, _ = yield self.call("GET", "/healthz")
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_hang_next_never_answers_until_down(self):
        self.server.faults.hang_next(1, path="/configmaps")
        hung = self.request("GET", CM)
        answered = []
        hung.addBoth(lambda result: answered.append(result) or result)
        yield self.wait(lambda: any(p == CM for _, p, _ in self.server.requests), "the request")
        code, _ = yield self.call("GET", "/healthz")
        self.assertEqual(code, 200)
        self.assertEqual(answered, [])
        yield self.server.faults.down()
        yield self.assertFailure(hung, ResponseFailed)
        yield self.server.faults.up()
        code, _ = yield self.call("GET", CM)
        self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def test_stall_watches_goes_silent_but_stays_open(self):
        reader = yield self.open_watch(f"{CM}?watch=1&allowWatchBookmarks=true")
        yield self.call("POST", CM, configmap("a"))
        yield self.wait(lambda: "ADDED" in reader.types(), "first event")
        self.server.faults.stall_watches()
        before = len(reader.lines)
        yield self.call("POST", CM, configmap("b"))
        fresh = yield self.open_watch(f"{CM}?watch=1")
        yield self.wait(lambda: len(fresh.lines) >= 2, "a new watch still works")
        self.assertEqual(len(reader.lines), before)
        self.assertIsNone(reader.ended)
        self.assertEqual(self.server.open_watches, 2)

    @defer.inlineCallbacks
    def test_garbage_next(self):
        self.server.faults.garbage_next(1)
        response = yield self.request("GET", CM)
        raw = yield response.content()
        self.assertEqual(response.code, 200)
        self.assertRaises(ValueError, json.loads, raw)
        code, body = yield self.call("GET", CM)
        self.assertEqual(body["kind"], "ConfigMapList")

    @defer.inlineCallbacks
    def test_cut_watches_mid_line(self):
        reader = yield self.open_watch(f"{CM}?watch=1")
        yield self.call("POST", CM, configmap("a"))
        yield self.wait(lambda: reader.lines, "first event")
        self.server.faults.cut_watches(mid_line=True)
        yield self.wait(lambda: reader.ended is not None, "watch cut")
        self.assertNotEqual(reader.ended, "clean")
        self.assertTrue(reader.ended.check(ResponseFailed))
        self.assertEqual(reader.types(), ["ADDED"])
        self.assertTrue(reader.partial.startswith(b'{"type":'))
        self.assertRaises(ValueError, json.loads, reader.partial)
        self.assertEqual(self.server.open_watches, 0)

    @defer.inlineCallbacks
    def test_cut_watches_between_lines_and_end_watches(self):
        reader = yield self.open_watch(f"{CM}?watch=1")
        yield self.wait(lambda: self.server.open_watches == 1, "watch open")
        self.server.faults.cut_watches()
        yield self.wait(lambda: reader.ended is not None, "watch cut")
        self.assertTrue(reader.ended.check(ResponseFailed))
        self.assertEqual(reader.partial, b"")
        reader = yield self.open_watch(f"{CM}?watch=1")
        yield self.wait(lambda: self.server.open_watches == 1, "watch open")
        self.server.faults.end_watches()
        yield reader.done
        self.assertEqual(reader.ended, "clean")

    @defer.inlineCallbacks
    def test_stop_closes_open_watches(self):
        reader = yield self.open_watch(f"{CM}?watch=1&allowWatchBookmarks=1")
        yield self.server.stop()
        yield self.wait(lambda: reader.ended is not None, "watch dropped")
        self.assertEqual(self.server.open_watches, 0)


class TLSTests(ServerTestCase):
    tls = True

    def tls_client(self, client_pair=None):
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        policy = ClientCertPolicy(self.ca.ca_file, client_pair)
        return treq.client.HTTPClient(Agent(reactor, contextFactory=policy, pool=pool))

    @defer.inlineCallbacks
    def test_client_cert_required_and_subject_recorded(self):
        self.assertTrue(self.url.startswith("https://127.0.0.1:"))
        without = self.tls_client()
        yield self.assertFailure(without.get(self.url + "/healthz"), Exception)
        self.assertEqual(self.server.client_subjects, [])
        pair = self.ca.client_pair("edge-1", "system:node:edge-1", ["system:nodes"])
        client = self.tls_client(pair)
        response = yield client.get(self.url + "/api/v1/nodes")
        body = yield response.json()
        self.assertEqual((response.code, body["kind"]), (200, "NodeList"))
        self.assertEqual(self.server.client_subjects,
                         ["CN=system:node:edge-1,O=system:nodes"])
        # Without an authorizer everything is served, and still logged with its user.
        yield self.wait(lambda: len(self.server.request_log) == 1, "the answer logged")
        self.assertEqual([(r.code, r.user) for r in self.server.request_log],
                         [(200, "system:node:edge-1")])

    @defer.inlineCallbacks
    def test_cert_from_another_ca_rejected(self):
        other_dir = tempfile.mkdtemp(prefix="apiserver-other-ca-")
        self.addCleanup(shutil.rmtree, other_dir, True)
        stranger = TestCA(other_dir).client_pair("stranger", "system:node:x", ["system:nodes"])
        client = self.tls_client(stranger)
        yield self.assertFailure(client.get(self.url + "/healthz"), Exception)
        self.assertEqual(self.server.client_subjects, [])


class StandaloneTests(unittest.TestCase):
    """``python -m yurtcoord.sim.apiserver`` prints its URL and serves."""

    def test_no_full_collections_holds_them_off_for_the_process(self):
        from yurtcoord.sim.apiserver import __main__ as standalone
        from yurtcoord.tx.heap import release_collections
        before = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *before)
        standalone._garbage_collection(standalone._parse([]))
        self.assertEqual(gc.get_threshold(), before)
        standalone._garbage_collection(standalone._parse(["--no-full-collections"]))
        self.addCleanup(release_collections, standalone.main)
        young, middle, full = gc.get_threshold()
        self.assertEqual((young, middle), before[:2])
        self.assertGreater(full, 1_000_000)

    @defer.inlineCallbacks
    def run_module(self, args, check):
        output = CollectingProcess()
        process = reactor.spawnProcess(
            output, sys.executable,
            [sys.executable, "-m", "yurtcoord.sim.apiserver", "--port", "0", *args],
            env=dict(os.environ))
        try:
            yield poll_until(lambda: b"\n" in output.out, what="the URL line")
            yield check(output.out.decode().splitlines()[0])
        finally:
            if not output.ended.called:
                with contextlib.suppress(ProcessExitedAlready):
                    process.signalProcess(signal.SIGTERM)
            reason = yield output.ended
        self.assertEqual(getattr(reason, "exitCode", None), 0)

    def test_plain(self):
        @defer.inlineCallbacks
        def check(url):
            self.assertRegex(url, r"^http://127\.0\.0\.1:\d+$")
            pool = HTTPConnectionPool(reactor, persistent=False)
            response = yield treq.get(url + "/readyz", pool=pool)
            body = yield response.text()
            self.assertEqual(body, "ok")
            yield pool.closeCachedConnections()
        return self.run_module([], check)

    def test_tls_dir_and_kubeconfig(self):
        workdir = tempfile.mkdtemp(prefix="apiserver-standalone-")
        self.addCleanup(shutil.rmtree, workdir, True)
        tls_dir = os.path.join(workdir, "pki")
        kubeconfig = os.path.join(workdir, "kubeconfig")

        @defer.inlineCallbacks
        def check(url):
            self.assertRegex(url, r"^https://127\.0\.0\.1:\d+$")
            with open(kubeconfig) as f:
                config = yaml.safe_load(f)
            self.assertEqual(config["clusters"][0]["cluster"]["server"], url)
            pair = CertPair(os.path.join(tls_dir, "client.crt"),
                            os.path.join(tls_dir, "client.key"))
            pool = HTTPConnectionPool(reactor, persistent=False)
            agent = Agent(reactor, contextFactory=ClientCertPolicy(
                os.path.join(tls_dir, "ca.crt"), pair), pool=pool)
            response = yield treq.client.HTTPClient(agent).get(url + "/version")
            body = yield response.json()
            self.assertEqual(body["gitVersion"], "v1.28.0")
            yield pool.closeCachedConnections()
        return self.run_module(["--tls-dir", tls_dir, "--kubeconfig", kubeconfig], check)

    def test_request_log_file(self):
        workdir = tempfile.mkdtemp(prefix="apiserver-standalone-")
        self.addCleanup(shutil.rmtree, workdir, True)
        path = os.path.join(workdir, "requests.jsonl")

        @defer.inlineCallbacks
        def check(url):
            pool = HTTPConnectionPool(reactor, persistent=False)
            lease = node_lease("edge-1", "edge-1", "2026-01-01T00:00:01.000000Z")
            response = yield treq.post(url + NODE_LEASES, json.dumps(lease).encode(), pool=pool)
            self.assertEqual(response.code, 201)
            yield response.content()
            response = yield treq.get(url + "/readyz", pool=pool)
            yield response.content()
            yield pool.closeCachedConnections()
            yield poll_until(lambda: os.path.exists(path) and len(read_request_log(path)) == 2,
                             what="two records in the request log file")
            created, ready = read_request_log(path)
            self.assertEqual(created[1:], ("127.0.0.1", "POST", NODE_LEASES, 201,
                                           "kube-node-lease", "edge-1", "edge-1",
                                           "2026-01-01T00:00:01.000000Z", False, "", ""))
            self.assertEqual(ready[1:5], ("127.0.0.1", "GET", "/readyz", 200))
            self.assertLess(abs(created.at - time.time()), 60)
        return self.run_module(["--request-log", path], check)


class PaginationTests(ServerTestCase):
    history = 3

    @defer.inlineCallbacks
    def test_pages_come_from_one_snapshot(self):
        for name in "abcde":
            yield self.call("POST", CM, configmap(name))
        code, first = yield self.call("GET", CM, params={"limit": "2"})
        self.assertEqual(code, 200)
        self.assertEqual([i["metadata"]["name"] for i in first["items"]], ["a", "b"])
        self.assertEqual(first["metadata"]["remainingItemCount"], 3)
        token = first["metadata"]["continue"]
        yield self.call("DELETE", CM + "/d")
        code, second = yield self.call("GET", CM, params={"limit": "2", "continue": token})
        self.assertEqual([i["metadata"]["name"] for i in second["items"]], ["c", "d"])
        self.assertEqual(second["metadata"]["resourceVersion"],
                         first["metadata"]["resourceVersion"])
        code, third = yield self.call(
            "GET", CM, params={"limit": "2", "continue": second["metadata"]["continue"]})
        self.assertEqual([i["metadata"]["name"] for i in third["items"]], ["e"])
        self.assertNotIn("continue", third["metadata"])
        code, body = yield self.call("GET", CM, params={"limit": "x"})
        self.assertEqual(code, 400)

    @defer.inlineCallbacks
    def test_continue_token_older_than_history_is_410(self):
        for name in "abc":
            yield self.call("POST", CM, configmap(name))
        _, first = yield self.call("GET", CM, params={"limit": "1"})
        yield self.call("POST", CM, configmap("d"))
        self.server.store.compact()
        code, body = yield self.call(
            "GET", CM, params={"limit": "1", "continue": first["metadata"]["continue"]})
        self.assertEqual(code, 410)
        self.assertStatus(body, 410, "Expired")
        code, body = yield self.call("GET", CM, params={"continue": "made-up"})
        self.assertEqual(code, 410)


class ListAtRevisionTests(ServerTestCase):
    history = 4

    @defer.inlineCallbacks
    def test_exact_revision_lists_the_state_then(self):
        yield self.call("POST", CM, configmap("a", data={"v": "1"}))
        yield self.call("POST", CM, configmap("b"))
        _, listed = yield self.call("GET", CM)
        then = listed["metadata"]["resourceVersion"]
        yield self.call("PUT", CM + "/a", configmap("a", data={"v": "2"}))
        yield self.call("DELETE", CM + "/b")
        yield self.call("POST", CM, configmap("c"))
        code, old = yield self.call("GET", CM, params={
            "resourceVersion": then, "resourceVersionMatch": "Exact"})
        self.assertEqual(code, 200, old)
        self.assertEqual(old["metadata"]["resourceVersion"], then)
        self.assertEqual(old["items"], listed["items"])
        code, now = yield self.call("GET", CM)
        self.assertEqual([(i["metadata"]["name"], i.get("data")) for i in now["items"]],
                         [("a", {"v": "2"}), ("c", {})])
        code, body = yield self.call("GET", CM, params={
            "resourceVersion": "0", "resourceVersionMatch": "Exact"})
        self.assertEqual(code, 400)

    @defer.inlineCallbacks
    def test_exact_revision_older_than_history_is_410(self):
        for name in "abcdef":
            yield self.call("POST", CM, configmap(name))
        code, body = yield self.call("GET", CM, params={
            "resourceVersion": "1", "resourceVersionMatch": "Exact"})
        self.assertEqual(code, 410)
        self.assertStatus(body, 410, "Expired")

    def test_memory_storage_provides_the_interface(self):
        from zope.interface.verify import verifyObject
        from yurtcoord.sim.apiserver.storage import IStorageWatch
        self.assertTrue(verifyObject(IObjectStorage, self.server.storage))
        watch = self.successResultOf(self.server.storage.watch(
            gvrs.CONFIGMAPS, ObjectFilter(), None, lambda *_: None))
        self.assertTrue(verifyObject(IStorageWatch, watch))
        watch.cancel()

    def test_servers_on_one_memory_storage_share_its_synchronous_store(self):
        server = KubeAPIServer(reactor, storage=self.server.storage)
        self.assertIs(server.store, self.server.store)
        self.server.store.create(gvrs.CONFIGMAPS, configmap("shared"))
        self.assertIsNotNone(server.store.get(gvrs.CONFIGMAPS, "shared", "default"))
