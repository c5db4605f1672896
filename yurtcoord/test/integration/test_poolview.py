"""The pool view (``GET /pool``) against real Kubernetes API test servers: members from
the cloud's pool Nodes and the coordinator's node leases with their heartbeat paths,
the election holder read from the coordinator, the pool cache counts, failed and hung
reads named under ``errors``, one round of reads for a flood of requests, and the
cloud's Nodes and node leases watched rather than listed per document.

The view judges a lease by when it saw its renewTime change, on its own clock (the
exact rules, with clocks minutes apart, are ``test_poolview``'s in the unit tier): a
lease it reads for the first time counts as just renewed. The tests that need a member
gone stale or an election lease expired (``until``) poll documents of a view while the
live nodes renew their leases, until the quiet ones have gone unchanged for longer
than ``STALE_AFTER``, as a view that has been running shows them."""

import json
import time

import treq.client
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent import poolview
from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.poolview import DELEGATED, DIRECT, STALE, PoolView
from yurtcoord.agent.status import status_site
from yurtcoord.agent.statussources import IPoolView, IStatusSource, InitialStatus
from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1, ENDPOINTSLICES_V1BETA1, LEASES
from yurtcoord.names import (
    COORDINATOR_SERVER_ANNOTATION, DELEGATE_HEARTBEAT_ANNOTATION, ETCD_MEMBER_ANNOTATION,
    INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE,
)
from yurtcoord.sim.apiserver.clients import start_server_with_client
from yurtcoord.role.leadersource import ElectionLeader
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.poolleases import lease
from yurtcoord.testing.world import add_pool_node

# Short, so that a lease left alone goes stale within a second of the first document.
STALE_AFTER = 0.5
ELECTION = ("kube-system", "yurthub")
# What the setUp pool renews, by server: every lease but edge-3's (its kubelet died).
LIVE_CLOUD_LEASES = ("edge-1", "edge-2", "other-1", "edge-4")
LIVE_POOL_LEASES = ("edge-1", "edge-2", "edge-5")


@implementer(IStatusSource)
class FollowerStatus:
    """A ready follower that uploaded 12 objects."""

    role = "follower"
    healthy = True
    ready = True

    def readiness_failures(self):
        return []

    def status(self):
        return {"node": "edge-1", "pool": "pool-a", "role": "follower", "ready": True,
                "pool_cache_synced": True, "local_cache_uploaded": True,
                "uploaded_objects": 12}


class PoolViewTests(unittest.TestCase):
    @defer.inlineCallbacks
    def setUp(self):
        self.cloud, self.cloud_client = yield start_server_with_client(self, reactor)
        self.coordinator, self.coordinator_client = yield start_server_with_client(
            self, reactor)
        self.cloud_healthy = True
        self.keys = {b"/registry/services/endpoints/": 3,
                     b"/registry/endpointslices/": 7}
        self.counted = []
        for node in ("edge-1", "edge-2", "edge-3", "edge-4"):
            add_pool_node(self.cloud, node)
        add_pool_node(self.cloud, "other-1", pool="pool-b")
        # edge-1 direct, edge-2 cut off and delegated through the leader, edge-3's
        # kubelet died (both leases old), edge-4 has no pool lease yet, edge-5 is
        # only on the coordinator (no cloud Node).
        for name, cloud_age, pool_age, delegated in (
                ("edge-1", 1, 1, False), ("edge-2", 2, 1, True), ("edge-3", 30, 30, False),
                ("other-1", 1, None, False), ("edge-4", 1, None, False),
                ("edge-5", None, 2, False)):
            if cloud_age is not None:
                self.cloud.store.create(LEASES, lease(name, cloud_age, delegated=delegated))
            if pool_age is not None:
                self.coordinator.store.create(LEASES, lease(name, pool_age,
                                                            delegated=delegated))
        self.coordinator.store.create(LEASES, lease(ELECTION[1], 0.5, namespace=ELECTION[0],
                                                    holder="edge-2", duration=15))
        self.coordinator.store.create(LEASES, lease(
            INFORMER_SYNC_LEASE_NAME, 1.5, namespace=INFORMER_SYNC_LEASE_NAMESPACE,
            holder="edge-2"))
        self.leader = ElectionLeader(reactor)
        self.view = self.make_view()

    def count_keys(self, prefix):
        self.counted.append(prefix)
        return defer.succeed(self.keys[prefix])

    def make_view(self, **options):
        """A view of this pool; its watches of the cloud stop with the test."""
        view = PoolView(reactor, FollowerStatus(), "edge-1", "pool-a",
                        self.coordinator_client, self.cloud_client,
                        lambda: self.cloud_healthy, self.count_keys, "/registry",
                        lambda: (ENDPOINTS, ENDPOINTSLICES_V1, ENDPOINTSLICES_V1BETA1),
                        ELECTION, STALE_AFTER, self.leader, **options)
        self.addCleanup(view.stop)
        return view

    def members(self, document):
        return {m["node"]: m for m in document["members"]}

    def renew(self, server, name, namespace=NODE_LEASE_NAMESPACE):
        """A renewal of the lease ``name`` on ``server``: renewTime now."""
        current = server.store.get(LEASES, name, namespace)
        current["spec"]["renewTime"] = lease(name, 0)["spec"]["renewTime"]
        server.store.update(LEASES, current)

    @defer.inlineCallbacks
    def until(self, done, what, renew_election=True):
        """The first document ``done(document)`` holds for, of a view without a cache
        (``ttl`` 0) that reads again every 0.1 s while the live nodes, and unless not
        ``renew_election`` the leader, renew their leases before each read."""
        view = self.make_view(ttl=0)
        seen = {}

        @defer.inlineCallbacks
        def renewed_and_read():
            for name in LIVE_CLOUD_LEASES:
                self.renew(self.cloud, name)
            for name in LIVE_POOL_LEASES:
                self.renew(self.coordinator, name)
            self.renew(self.coordinator, INFORMER_SYNC_LEASE_NAME,
                       INFORMER_SYNC_LEASE_NAMESPACE)
            if renew_election:
                self.renew(self.coordinator, ELECTION[1], ELECTION[0])
            seen["document"] = yield view.document()
            return done(seen["document"])

        yield poll_until(renewed_and_read, timeout=10.0, interval=0.1, reactor=reactor,
                         what=what)
        return seen["document"]

    def edge_3_stale(self, document):
        return self.members(document)["edge-3"]["heartbeat"] == STALE

    @defer.inlineCallbacks
    def test_members_paths_leader_and_cache_with_the_cloud(self):
        verifyObject(IPoolView, self.view)
        verifyObject(IStatusSource, FollowerStatus())
        document = yield self.until(self.edge_3_stale, "edge-3 stale")
        self.assertEqual(document["errors"], {})
        self.assertTrue(document["cloud_read"])
        members = self.members(document)
        # Pool Nodes of the cloud and leases of the coordinator; not other pools' Nodes.
        self.assertEqual(sorted(members), ["edge-1", "edge-2", "edge-3", "edge-4", "edge-5"])
        self.assertEqual({n: m["heartbeat"] for n, m in members.items()},
                         {"edge-1": DIRECT, "edge-2": DELEGATED, "edge-3": STALE,
                          "edge-4": DIRECT, "edge-5": STALE})
        self.assertTrue(members["edge-3"]["stale"])
        self.assertGreaterEqual(members["edge-3"]["lease_age"], STALE_AFTER)
        # Renewed just before this document: seen changed by this read.
        self.assertLessEqual(members["edge-2"]["cloud_lease_age"], STALE_AFTER)
        self.assertLessEqual(members["edge-2"]["pool_lease_age"], STALE_AFTER)
        self.assertIsNone(members["edge-4"]["pool_lease_age"])
        self.assertEqual([n for n, m in members.items() if m["leader"]], ["edge-2"])
        self.assertEqual(document["leader"], "edge-2")
        self.assertEqual(document["election"]["holder"], "edge-2")
        self.assertFalse(document["election"]["expired"])
        self.assertEqual(members["edge-1"]["upload"], {"uploaded": True, "objects": 12})
        self.assertIsNone(members["edge-2"]["upload"])
        self.assertTrue(members["edge-1"]["this_agent"])
        self.assertEqual(document["cache"]["resources"],
                         {"endpoints": 3, "endpointslices.discovery.k8s.io": 7})
        # Both endpointslices versions share their keys: counted once a document.
        self.assertEqual(len(self.counted) % 2, 0)
        self.assertLessEqual(document["cache"]["informer_sync_lease_age"], STALE_AFTER)
        self.assertEqual(document["cache"]["informer_sync_holder"], "edge-2")
        self.assertEqual((document["node"], document["pool"], document["role"]),
                         ("edge-1", "pool-a", "follower"))
        json.dumps(document)

    def annotate(self, server, name, annotations):
        current = server.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
        current["metadata"]["annotations"] = dict(
            current["metadata"].get("annotations") or {}, **annotations)
        server.store.update(LEASES, current)

    @defer.inlineCallbacks
    def test_each_member_shows_the_servers_its_coordinator_lease_names(self):
        self.annotate(self.coordinator, "edge-1", {
            ETCD_MEMBER_ANNOTATION: "https://10.0.0.2:2379",
            COORDINATOR_SERVER_ANNOTATION: "https://10.0.0.1:6443"})
        # No pool store open: no etcd member.
        self.annotate(self.coordinator, "edge-2", {
            COORDINATOR_SERVER_ANNOTATION: "https://10.0.0.2:6443"})
        # Whatever a peer writes is shown as a URL without credentials, or not at all.
        self.annotate(self.coordinator, "edge-3", {
            ETCD_MEMBER_ANNOTATION: "https://root:secret@10.0.0.3:2379/?token=abc",
            COORDINATOR_SERVER_ANNOTATION: "<script>alert(1)</script>"})
        self.annotate(self.coordinator, "edge-5", {
            ETCD_MEMBER_ANNOTATION: "http://[::1", COORDINATOR_SERVER_ANNOTATION: ""})
        # Only the coordinator's lease tells: edge-4 has none, its cloud lease does not count.
        self.annotate(self.cloud, "edge-4", {
            ETCD_MEMBER_ANNOTATION: "https://10.0.0.4:2379",
            COORDINATOR_SERVER_ANNOTATION: "https://10.0.0.4:6443"})
        document = yield self.view.document()
        self.assertEqual(document["errors"], {})
        self.assertEqual(
            {n: (m["etcd_member"], m["coordinator_server"])
             for n, m in self.members(document).items()},
            {"edge-1": ("https://10.0.0.2:2379", "https://10.0.0.1:6443"),
             "edge-2": (None, "https://10.0.0.2:6443"),
             "edge-3": ("https://10.0.0.3:2379/", None),
             "edge-4": (None, None),
             "edge-5": (None, None)})
        self.assertNotIn("secret", json.dumps(document))
        self.assertNotIn("token", json.dumps(document))

    @defer.inlineCallbacks
    def test_without_the_cloud_the_coordinator_decides(self):
        self.cloud_healthy = False
        before = len(self.cloud.requests)
        document = yield self.until(self.edge_3_stale, "edge-3 stale")
        self.assertEqual(len(self.cloud.requests), before, "the cloud was not asked")
        self.assertFalse(document["cloud_read"])
        members = self.members(document)
        self.assertEqual(sorted(members), ["edge-1", "edge-2", "edge-3", "edge-5"])
        self.assertEqual({n: m["heartbeat"] for n, m in members.items()},
                         {"edge-1": DIRECT, "edge-2": DELEGATED, "edge-3": STALE,
                          "edge-5": DIRECT})
        self.assertIsNone(members["edge-1"]["cloud_lease_age"])
        # A follower cut off from the cloud does not elect, yet names the leader.
        self.assertEqual(document["leader"], "edge-2")

    @defer.inlineCallbacks
    def test_an_expired_election_lease_names_no_leader(self):
        # The leader stops renewing a lease of 1 s: expired once a document has seen
        # it unchanged for longer.
        self.coordinator.store.update(LEASES, dict(
            lease(ELECTION[1], 0, namespace=ELECTION[0], holder="edge-2", duration=1),
            metadata={"name": ELECTION[1], "namespace": ELECTION[0],
                      "resourceVersion": self.coordinator.store.get(
                          LEASES, ELECTION[1], ELECTION[0])["metadata"]["resourceVersion"]}))
        document = yield self.until(lambda d: d["election"]["expired"], "election expired",
                                    renew_election=False)
        self.assertIsNone(document["leader"])
        self.assertEqual(document["election"]["holder"], "edge-2")
        self.assertGreaterEqual(document["election"]["lease_age"], 1)
        self.assertFalse(any(m["leader"] for m in document["members"]))

    @defer.inlineCallbacks
    def test_leases_nobody_wrote_yet_are_no_errors(self):
        self.coordinator.store.delete(LEASES, ELECTION[1], ELECTION[0])
        self.coordinator.store.delete(LEASES, INFORMER_SYNC_LEASE_NAME,
                                      INFORMER_SYNC_LEASE_NAMESPACE)
        document = yield self.view.document()
        self.assertEqual(document["errors"], {})
        self.assertIsNone(document["leader"])
        self.assertIsNone(document["election"]["holder"])
        self.assertIsNone(document["cache"]["informer_sync_lease_age"])

    @defer.inlineCallbacks
    def test_hostile_leases_do_not_break_the_document(self):
        current = self.coordinator.store.get(LEASES, ELECTION[1], ELECTION[0])
        current["spec"] = {"holderIdentity": {"x": 1}, "renewTime": 7,
                           "leaseDurationSeconds": "forever"}
        self.coordinator.store.update(LEASES, current)
        self.coordinator.store.create(LEASES, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "edge-6", "namespace": NODE_LEASE_NAMESPACE,
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"renewTime": {"no": "time"}}})
        document = yield self.view.document()
        json.dumps(document)
        self.assertIsNone(document["leader"])
        self.assertEqual(self.members(document)["edge-6"]["heartbeat"], STALE)
        self.assertEqual(self.members(document)["edge-2"]["heartbeat"], DELEGATED)

    @defer.inlineCallbacks
    def test_failed_reads_are_named_and_the_rest_is_shown(self):
        self.coordinator.faults.fail_next(1, code=500, path="/kube-node-lease/")
        self.keys[b"/registry/services/endpoints/"] = None

        def broken(prefix):
            if prefix == b"/registry/services/endpoints/":
                return defer.fail(ConnectionRefusedError("etcd refused"))
            return defer.succeed(7)

        self.count_keys = broken
        self.view = self.make_view()
        document = yield self.view.document()
        self.assertEqual(sorted(document["errors"]),
                         ["pool cache endpoints", "pool node leases"])
        self.assertIn("etcd refused", document["errors"]["pool cache endpoints"])
        self.assertIsNone(document["cache"]["resources"]["endpoints"])
        self.assertEqual(document["cache"]["resources"]["endpointslices.discovery.k8s.io"], 7)
        # The cloud still names its pool Nodes; their paths come from the cloud leases.
        members = self.members(document)
        self.assertEqual(sorted(members), ["edge-1", "edge-2", "edge-3", "edge-4"])
        self.assertEqual(members["edge-2"]["heartbeat"], DELEGATED)
        self.assertEqual({m["pool_lease_age"] for m in members.values()}, {None})
        self.assertEqual(document["leader"], "edge-2")

    @defer.inlineCallbacks
    def test_when_the_cloud_leases_cannot_be_listed_the_pool_leases_decide(self):
        self.cloud.faults.fail_next(1000, code=503, path="/kube-node-lease/leases")
        document = yield self.make_view(read_timeout=1.0).document()
        self.assertEqual(list(document["errors"]), ["cloud node leases"])
        self.assertIn("503", document["errors"]["cloud node leases"])
        self.assertFalse(document["cloud_read"])
        members = self.members(document)
        # The cloud's pool Nodes are still members; not stale for want of an answer:
        # edge-2's pool lease is fresh and delegated; edge-4 has no pool lease.
        self.assertEqual(sorted(members), ["edge-1", "edge-2", "edge-3", "edge-4", "edge-5"])
        self.assertEqual(members["edge-2"]["heartbeat"], DELEGATED)
        self.assertIsNone(members["edge-2"]["cloud_lease_age"])
        self.assertEqual(members["edge-1"]["heartbeat"], DIRECT)
        self.assertEqual(members["edge-4"]["heartbeat"], STALE)

    @defer.inlineCallbacks
    def test_the_cloud_is_one_paged_list_and_one_watch_of_each_for_every_document(self):
        self.patch(poolview, "MEMBER_LIST_LIMIT", 2)
        before = len(self.cloud.requests)
        document = yield self.view.document()
        self.assertEqual(document["errors"], {})
        self.assertEqual(self.members(document)["edge-2"]["heartbeat"], DELEGATED)
        nodes = "/api/v1/nodes"
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        # Five Nodes (one of another pool: the selector skips it, its page still
        # counts) and five cloud leases (one of another pool), two a page; then a
        # watch of each.
        yield poll_until(lambda: self.cloud.open_watches == 2, 5.0, 0.01, reactor,
                         what="both watches open")
        asked = sorted((path, query.get("watch") in ("true", "1"))
                       for _method, path, query in self.cloud.requests[before:])
        self.assertEqual(asked, [(nodes, False)] * 3 + [(nodes, True)] + [
            (leases, False)] * 3 + [(leases, True)])
        # Later documents ask the cloud nothing; renewals in the cloud reach them.
        before = len(self.cloud.requests)
        for _ in range(3):
            yield deferLater(reactor, poolview.POOL_VIEW_TTL, lambda: None)
            self.renew(self.cloud, "edge-3")
            yield deferLater(reactor, 0.1, lambda: None)
            document = yield self.view.document()
            self.assertEqual(self.members(document)["edge-3"]["heartbeat"], DIRECT)
            self.assertLess(self.members(document)["edge-3"]["cloud_lease_age"], STALE_AFTER)
        self.assertEqual(self.cloud.requests[before:], [])
        self.assertEqual(self.view.builds, 4)

    @defer.inlineCallbacks
    def test_paged_lists_share_one_deadline(self):
        # The second page of the cloud lease list hangs: the list ends within one read
        # timeout, named under errors, and the pool leases decide.
        self.patch(poolview, "MEMBER_LIST_LIMIT", 2)
        self.cloud.faults.hang_next(1, path="/kube-node-lease/leases", query="continue=")
        view = self.make_view(read_timeout=1.0)
        started = time.monotonic()
        document = yield view.document()
        self.assertLess(time.monotonic() - started, 3.0)
        self.assertEqual(document["errors"], {"cloud node leases": "no answer within 1s"})
        self.assertEqual(self.members(document)["edge-4"]["heartbeat"], STALE)
        self.assertEqual(self.members(document)["edge-1"]["heartbeat"], DIRECT)
        yield self.cloud.faults.drop_connections()

    @defer.inlineCallbacks
    def test_a_list_past_its_pages_is_cut_and_named(self):
        self.patch(poolview, "MEMBER_LIST_LIMIT", 1)
        self.patch(poolview, "MEMBER_LIST_PAGES", 2)
        document = yield self.view.document()
        # The coordinator's list is cut; the watched cloud is listed whole, in pages.
        self.assertEqual(document["errors"], {
            "pool node leases": "more than 2; the rest left out"})
        # edge-1 and edge-2 are on the first pages of the pool list, judged on the cloud.
        members = self.members(document)
        self.assertEqual(members["edge-2"]["heartbeat"], DELEGATED)
        self.assertIsNotNone(members["edge-2"]["cloud_lease_age"])

    @defer.inlineCallbacks
    def test_a_hung_read_ends_within_the_read_timeout(self):
        self.coordinator.faults.hang_next(1, path=f"/leases/{ELECTION[1]}")
        view = self.make_view(read_timeout=0.5)
        started = time.monotonic()
        document = yield view.document()
        self.assertLess(time.monotonic() - started, 5.0)
        self.assertEqual(document["errors"], {"election lease": "no answer within 0.5s"})
        self.assertIsNone(document["leader"])
        self.assertEqual(len(document["members"]), 5)
        yield self.coordinator.faults.drop_connections()

    @defer.inlineCallbacks
    def test_a_flood_of_requests_is_one_round_of_reads(self):
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        http = treq.client.HTTPClient(Agent(reactor, pool=pool))
        site = status_site(FollowerStatus(), Metrics("edge-1", "pool-a"), reactor, self.view)
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/pool"
        before, cloud_before = len(self.coordinator.requests), len(self.cloud.requests)
        responses = yield defer.gatherResults([http.get(url) for _ in range(30)])
        bodies = yield defer.gatherResults([r.content() for r in responses])
        self.assertEqual({r.code for r in responses}, {200})
        self.assertEqual({tuple(r.headers.getRawHeaders("content-type")) for r in responses},
                         {("application/json",)})
        self.assertEqual(len({b for b in bodies}), 1)
        self.assertEqual(self.view.builds, 1)
        # One round: the election lease, the node leases, the informer sync lease;
        # and the cloud's two lists and two watches, whatever the number of members.
        yield poll_until(lambda: self.cloud.open_watches == 2, 5.0, 0.01, reactor,
                         what="both watches open")
        self.assertEqual(len(self.coordinator.requests) - before, 3)
        self.assertEqual(len(self.cloud.requests) - cloud_before, 4)
        self.assertEqual(json.loads(bodies[0])["leader"], "edge-2")
        response = yield http.post(url, b"")
        yield response.content()
        self.assertEqual(response.code, 405)

    @defer.inlineCallbacks
    def test_an_agent_without_coordinator_answers_with_an_error(self):
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        http = treq.client.HTTPClient(Agent(reactor, pool=pool))
        site = status_site(InitialStatus("edge-9", "pool-a", []), Metrics("edge-9", "pool-a"),
                           reactor)
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        response = yield http.get(f"http://127.0.0.1:{port.getHost().port}/pool")
        document = json.loads((yield response.content()))
        self.assertEqual(response.code, 200)
        self.assertEqual((document["node"], document["members"], document["leader"]),
                         ("edge-9", [], None))
        self.assertIn("role init", document["errors"]["pool view"])


@implementer(IPoolView)
class BrokenPoolView:
    """A pool view with a defect: its document fails."""

    last_document = None

    def document(self):
        return defer.fail(RuntimeError("defect"))


class BrokenViewTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_defect_of_the_view_is_a_500_and_the_server_keeps_serving(self):
        verifyObject(IPoolView, BrokenPoolView())
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        http = treq.client.HTTPClient(Agent(reactor, pool=pool))
        site = status_site(FollowerStatus(), Metrics("edge-1", "pool-a"), reactor,
                           BrokenPoolView())
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        base = f"http://127.0.0.1:{port.getHost().port}"
        response = yield http.get(base + "/pool")
        self.assertEqual((response.code, (yield response.content())),
                         (500, b"internal error\n"))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        response = yield http.get(base + "/status")
        yield response.content()
        self.assertEqual(response.code, 200)
