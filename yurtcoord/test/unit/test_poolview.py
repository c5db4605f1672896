"""The pool view's parts on their own and the view on a ``task.Clock``: the heartbeat
path of a member judged from its node lease (direct, delegated or stale) and the local
time its renewTime was seen to change, and the documents of ``PoolView`` over in-memory clients while the members, the leader
and the informer sync lease write renewTimes minutes ahead of or behind the viewer's
clock (docs/design.md, "Clocks"): direct and delegated while they change, stale (or
expired) once they stop, ages counted on the viewer's clock."""

import gzip
import json
from typing import Any, Optional

from twisted.internet import defer, task
from twisted.trial import unittest
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.agent import poolview
from yurtcoord.agent import statuspages as status_module
from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.poolview import (
    DELEGATED, DIRECT, STALE, PoolView, heartbeat_path,
)
from yurtcoord.agent.statuspages import status_resource
from yurtcoord.agent.statussources import IPoolView, IStatusSource, InitialStatus
from yurtcoord.kube.errors import ServerError
from yurtcoord.kube.gvr import LEASES, NODES, GroupVersionResource
from yurtcoord.kube.interfaces import IListWatchClient, IObjectClient, IWatch
from yurtcoord.kube.lease import LeaseRecord, build_lease
from yurtcoord.names import (
    DELEGATE_HEARTBEAT_ANNOTATION, INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE,
    NODE_LEASE_NAMESPACE, NODE_POOL_LABEL,
)
from yurtcoord.role.leadersource import ElectionLeader
from yurtcoord.testing.fakekube import FakeKube

START = 1_700_000_000.0
POOL = "pool-a"
ELECTION = ("kube-system", "yurthub")
# The members' heartbeat interval, and the view's window: two of them.
INTERVAL = 10.0
STALE_AFTER = 2 * INTERVAL
ELECTION_DURATION = 15


class HeartbeatPathTests(unittest.TestCase):
    def test_paths(self):
        lease = build_lease("n", NODE_LEASE_NAMESPACE, LeaseRecord("n", 40, None, START))
        delegated = dict(lease, metadata=dict(
            lease["metadata"], annotations={DELEGATE_HEARTBEAT_ANNOTATION: "true"}))
        now = START + 100
        self.assertEqual(heartbeat_path(None, now - 3, now, 9), (STALE, None))
        self.assertEqual(heartbeat_path(lease, None, now, 9), (STALE, None))
        self.assertEqual(heartbeat_path(lease, now - 3, now, 9), (DIRECT, 3.0))
        self.assertEqual(heartbeat_path(delegated, now - 3, now, 9), (DELEGATED, 3.0))
        self.assertEqual(heartbeat_path(delegated, now - 9, now, 9), (DELEGATED, 9.0))
        self.assertEqual(heartbeat_path(delegated, now - 9.5, now, 9), (STALE, 9.5))
        # The renewTime itself (100 s before now here) is not what the age counts.
        self.assertEqual(heartbeat_path(lease, now, now, 9), (DIRECT, 0.0))


# The kind of the objects of each resource the fake watches tell apart.
KINDS = {"leases": "Lease", "nodes": "Node"}


@implementer(IWatch)
class FakeWatch:
    """One watch of a ``ListingKube``: ``done`` fires with None once cancelled, or
    with the error ``ListingKube.cut_watches`` ends it with."""

    def __init__(self, stop: Any) -> None:
        self.done: defer.Deferred[None] = defer.Deferred()
        self.events = 0
        self._stop = stop

    def end(self, error: Optional[BaseException] = None) -> None:
        if self.done.called:
            return
        self._stop()
        if error is None:
            self.done.callback(None)
        else:
            self.done.errback(error)

    def cancel(self) -> None:
        self.end()


@implementer(IObjectClient, IListWatchClient)
class ListingKube(FakeKube):
    """The in-memory apiserver of ``FakeKube`` that also answers ``list`` and
    ``watch`` as ``KubeClient`` does for the pool view: the objects of a resource in a
    namespace, selected by one ``key=value`` label, in name order and in pages of
    ``limit`` (the continue token is the offset of the next page); a watch tells each
    later write of such an object as it is stored (``watching`` counts the open ones).
    ``fail_next("list", ...)`` fails the next lists, ``fail_next_list(resource, ...)``
    the next ``count`` lists of that resource; ``cut_watches(error)`` ends every open
    watch with ``error``."""

    def __init__(self, clock: Any = None) -> None:
        super().__init__(clock)
        self.list_failures: dict[str, list[BaseException]] = {}
        self._watches: list[FakeWatch] = []

    def fail_next_list(self, resource: str, error: BaseException, count: int = 1) -> None:
        self.list_failures.setdefault(resource, []).extend([error] * count)

    @property
    def watching(self) -> int:
        return sum(1 for watch in self._watches if not watch.done.called)

    def cut_watches(self, error: BaseException) -> None:
        for watch in list(self._watches):
            watch.end(error)

    @staticmethod
    def _selected(obj: dict[str, Any], namespace: Optional[str],
                  label_selector: Optional[str]) -> bool:
        key, _, value = (label_selector or "").partition("=")
        metadata = obj["metadata"]
        return ((namespace is None or metadata.get("namespace") == namespace)
                and (not key or (metadata.get("labels") or {}).get(key) == value))

    def watch(self, gvr: GroupVersionResource, on_event: Any,
              namespace: Optional[str] = None, resource_version: Optional[str] = None,
              label_selector: Optional[str] = None, field_selector: Optional[str] = None,
              allow_bookmarks: bool = True, timeout_seconds: Optional[int] = None,
              idle_timeout: Optional[float] = None) -> FakeWatch:
        self.requests.append(f"watch {gvr.resource}")

        def written(event: str, obj: dict[str, Any]) -> None:
            if (obj.get("kind") == KINDS.get(gvr.resource)
                    and self._selected(obj, namespace, label_selector)):
                watch.events += 1
                on_event(event, obj)

        watch = FakeWatch(lambda: stop())
        verifyObject(IWatch, watch)
        stop = self.add_write_observer(written)
        self._watches = [w for w in self._watches if not w.done.called] + [watch]
        return watch

    def list(self, gvr: GroupVersionResource, namespace: Optional[str] = None,
             label_selector: Optional[str] = None, field_selector: Optional[str] = None,
             resource_version: Optional[str] = None, limit: Optional[int] = None,
             continue_token: Optional[str] = None) -> "defer.Deferred[Any]":
        def answer() -> dict[str, Any]:
            failures = self.list_failures.get(gvr.resource)
            if failures:
                raise failures.pop(0)
            items = sorted((obj for obj in self.stored(gvr)
                            if self._selected(obj, namespace, label_selector)),
                           key=lambda obj: obj["metadata"]["name"])
            start = int(continue_token or 0)
            end = len(items) if limit is None else start + limit
            token = str(end) if end < len(items) else None
            return {"items": items[start:end],
                    "metadata": {"continue": token} if token else {}}
        return self._call("list", gvr, namespace or "", answer)


class Member:
    """One node of the pool whose clock is ``offset`` seconds off the viewer's: it
    writes its node lease in the cloud and on the coordinator apiserver with its own
    clock's time, marked for delegation when ``delegated`` (its cloud lease is then
    written by the leader, whose clock is ``offset`` off too)."""

    def __init__(self, clock: task.Clock, cloud: FakeKube, coordinator: FakeKube, name: str,
                 offset: float, delegated: bool = False) -> None:
        self.clock, self.cloud, self.coordinator = clock, cloud, coordinator
        self.name, self.offset, self.delegated = name, offset, delegated
        cloud.put(NODES, {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": {NODE_POOL_LABEL: POOL}}})

    def renew(self) -> None:
        now = self.clock.seconds() + self.offset
        for server in (self.cloud, self.coordinator):
            annotations = {DELEGATE_HEARTBEAT_ANNOTATION: "true"} if self.delegated else None
            server.put(LEASES, build_lease(self.name, NODE_LEASE_NAMESPACE,
                                           LeaseRecord(self.name, 40, None, now),
                                           annotations=annotations))


class PoolViewSkewTests(unittest.TestCase):
    """One viewer's documents, its clock a ``task.Clock``: edge-1 writes its leases
    300 s ahead of it, edge-2 is cut off and delegated by a leader 120 s behind it,
    edge-3 writes 120 s ahead; the leader, edge-2's delegate, renews the election and
    informer sync leases 300 s ahead. Everybody renews every ``INTERVAL``."""

    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(START)
        self.cloud, self.coordinator = ListingKube(self.clock), ListingKube(self.clock)
        self.cloud_healthy = True
        self.members = {
            "edge-1": Member(self.clock, self.cloud, self.coordinator, "edge-1", +300.0),
            "edge-2": Member(self.clock, self.cloud, self.coordinator, "edge-2", -120.0,
                             delegated=True),
            "edge-3": Member(self.clock, self.cloud, self.coordinator, "edge-3", +120.0)}
        self.leader_offset = +300.0
        self.view = PoolView(
            self.clock, InitialStatus("edge-1", POOL, (), since=START), "edge-1", POOL,
            self.coordinator, self.cloud, lambda: self.cloud_healthy,
            lambda _prefix: defer.succeed(0), "/registry", lambda: (), ELECTION,
            STALE_AFTER, ElectionLeader(self.clock), ttl=0)

    def tearDown(self):
        self.successResultOf(self.view.stop())
        self.assertEqual(self.cloud.watching, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def leader_renews(self):
        """The leader's renewals of the election and informer sync leases."""
        now = self.clock.seconds() + self.leader_offset
        self.coordinator.put(LEASES, build_lease(
            ELECTION[1], ELECTION[0], LeaseRecord("edge-2", ELECTION_DURATION, now, now)))
        self.coordinator.put(LEASES, build_lease(
            INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE,
            LeaseRecord("edge-2", 10, now, now)))

    def renew(self, *names):
        for name in names:
            self.members[name].renew()

    def document(self):
        document = self.successResultOf(self.view.document())
        self.assertEqual(document["errors"], {})
        return document

    def paths(self, document):
        return {m["node"]: (m["heartbeat"], m["lease_age"]) for m in document["members"]}

    def test_the_fakes_offer_the_interfaces(self):
        verifyObject(IObjectClient, self.cloud)
        verifyObject(IListWatchClient, self.cloud)
        verifyObject(IListWatchClient, poolview.ListFailures(self.cloud))
        verifyObject(IStatusSource, InitialStatus("edge-1", POOL, ()))
        verifyObject(IPoolView, self.view)

    def test_skewed_members_are_fresh_while_their_leases_change_and_stale_once_they_stop(self):
        self.renew("edge-1", "edge-2", "edge-3")
        self.leader_renews()
        for _ in range(6):
            document = self.document()
            self.assertTrue(document["cloud_read"])
            # Seen changed at this document: age 0, whatever the renewTimes say.
            self.assertEqual(self.paths(document), {
                "edge-1": (DIRECT, 0.0), "edge-2": (DELEGATED, 0.0), "edge-3": (DIRECT, 0.0)})
            self.assertEqual(document["leader"], "edge-2")
            self.assertEqual(document["election"]["lease_age"], 0.0)
            self.assertFalse(document["election"]["expired"])
            self.assertEqual(document["cache"]["informer_sync_lease_age"], 0.0)
            self.clock.advance(4)
            # Read again unchanged: the age counts on this clock.
            document = self.document()
            self.assertEqual(self.paths(document)["edge-1"], (DIRECT, 4.0))
            self.assertEqual(document["election"]["lease_age"], 4.0)
            self.clock.advance(INTERVAL - 4)
            self.renew("edge-1", "edge-2", "edge-3")
            self.leader_renews()

        # edge-1's kubelet and the leader die; edge-2 and edge-3 go on.
        self.document()
        for step in range(1, 5):
            self.clock.advance(INTERVAL / 2)
            if step % 2 == 0:
                self.renew("edge-2", "edge-3")
            document = self.document()
            members = {m["node"]: m for m in document["members"]}
            self.assertEqual(members["edge-1"]["heartbeat"], DIRECT, step)
            self.assertEqual(members["edge-1"]["cloud_lease_age"], step * INTERVAL / 2)
            self.assertEqual(members["edge-1"]["pool_lease_age"], step * INTERVAL / 2)
            self.assertEqual(members["edge-2"]["heartbeat"], DELEGATED)
            self.assertEqual(document["leader"] is None,
                             step * INTERVAL / 2 > ELECTION_DURATION, step)
        self.clock.advance(0.5)
        document = self.document()
        members = {m["node"]: m for m in document["members"]}
        self.assertEqual((members["edge-1"]["heartbeat"], members["edge-1"]["stale"]),
                         (STALE, True))
        self.assertEqual(members["edge-1"]["lease_age"], STALE_AFTER + 0.5)
        self.assertEqual(self.paths(document)["edge-3"], (DIRECT, 0.5))
        self.assertEqual({key: document["election"][key] for key in (
            "holder", "lease_age", "lease_duration_seconds", "expired")}, {
            "holder": "edge-2", "lease_age": STALE_AFTER + 0.5,
            "lease_duration_seconds": ELECTION_DURATION, "expired": True})
        self.assertIsNone(document["leader"])
        self.assertEqual(document["cache"]["informer_sync_lease_age"], STALE_AFTER + 0.5)

    def test_without_the_cloud_the_skewed_pool_leases_decide_the_same_way(self):
        self.cloud_healthy = False
        self.renew("edge-1", "edge-2", "edge-3")
        self.document()
        self.clock.advance(INTERVAL)
        self.renew("edge-2", "edge-3")
        document = self.document()
        self.assertFalse(document["cloud_read"])
        self.assertEqual(self.paths(document), {
            "edge-1": (DIRECT, INTERVAL), "edge-2": (DELEGATED, 0.0), "edge-3": (DIRECT, 0.0)})
        self.clock.advance(INTERVAL + 0.5)
        self.renew("edge-2")
        document = self.document()
        self.assertEqual(self.paths(document), {
            "edge-1": (STALE, STALE_AFTER + 0.5), "edge-2": (DELEGATED, 0.0),
            "edge-3": (DIRECT, INTERVAL + 0.5)})
        self.assertIsNone(document["members"][0]["cloud_lease_age"])
        # Nor watched: the cloud is asked nothing while no server of it is healthy.
        self.assertEqual(self.cloud.requests, [])

    def test_a_write_that_leaves_the_renew_time_renews_nothing(self):
        self.renew("edge-1", "edge-2", "edge-3")
        self.document()
        self.clock.advance(STALE_AFTER + 1)
        # edge-3's agent rewrites its pool lease's annotations only, then the cloud's.
        for server in (self.coordinator, self.cloud):
            lease = server.peek(LEASES, "edge-3", NODE_LEASE_NAMESPACE)
            lease["metadata"]["annotations"] = {"example.com/touched": "true"}
            server.put(LEASES, lease)
        document = self.document()
        self.assertEqual(self.paths(document)["edge-3"], (STALE, STALE_AFTER + 1))

    def test_a_renewal_in_the_cloud_is_dated_when_its_event_arrives(self):
        self.renew("edge-1", "edge-2", "edge-3")
        self.document()
        self.clock.advance(INTERVAL)
        self.renew("edge-1")
        self.clock.advance(0.75)
        members = {m["node"]: m for m in self.document()["members"]}
        # The cloud lease was seen to change as it was written, 0.75 s before this
        # document; the pool lease, read with the document, at the document.
        self.assertEqual((members["edge-1"]["lease_age"], members["edge-1"]["cloud_lease_age"],
                          members["edge-1"]["pool_lease_age"]), (0.8, 0.8, 0.0))
        self.assertEqual(members["edge-3"]["cloud_lease_age"], INTERVAL + 0.8)

    def test_a_cloud_that_cannot_be_listed_is_named_and_the_pool_leases_decide(self):
        self.renew("edge-1", "edge-2", "edge-3")
        self.cloud.fail_next_list("leases", ServerError("overloaded"), count=1000)
        document = self.successResultOf(self.view.document())
        self.assertEqual(document["errors"], {
            "cloud node leases": "ServerError: overloaded code=500 reason=InternalError"})
        self.assertFalse(document["cloud_read"])
        self.assertEqual({m["node"]: m["cloud_lease_age"] for m in document["members"]},
                         dict.fromkeys(("edge-1", "edge-2", "edge-3")))
        self.assertEqual(self.paths(document)["edge-2"], (DELEGATED, 0.0))
        # The watch lists again after its backoff; from then on the cloud decides,
        # its leases first seen when listed.
        self.cloud.list_failures.clear()
        self.clock.advance(INTERVAL)
        self.clock.advance(1)
        document = self.document()
        self.assertTrue(document["cloud_read"])
        self.assertEqual(self.paths(document)["edge-2"], (DELEGATED, 1.0))

    def test_a_failed_read_forgets_nothing_and_a_lease_gone_and_back_is_new(self):
        self.renew("edge-1", "edge-2", "edge-3")
        self.document()
        self.clock.advance(INTERVAL)
        self.coordinator.fail_next("list", ServerError("etcd timed out"))
        document = self.successResultOf(self.view.document())
        self.assertEqual(sorted(document["errors"]), ["pool node leases"])
        self.clock.advance(INTERVAL + 1)
        document = self.document()
        members = {m["node"]: m for m in document["members"]}
        self.assertEqual((members["edge-1"]["heartbeat"], members["edge-1"]["lease_age"],
                          members["edge-1"]["pool_lease_age"]),
                         (STALE, STALE_AFTER + 1, STALE_AFTER + 1))
        # edge-3's leases are deleted and written again with the renewTime they had:
        # gone, then seen for the first time again, fresh.
        leases = {}
        for server in (self.cloud, self.coordinator):
            leases[server] = server.peek(LEASES, "edge-3", NODE_LEASE_NAMESPACE)
            self.successResultOf(server.delete(LEASES, "edge-3", NODE_LEASE_NAMESPACE))
        members = {m["node"]: m for m in self.document()["members"]}
        self.assertEqual((members["edge-3"]["heartbeat"], members["edge-3"]["lease_age"],
                          members["edge-3"]["pool_lease_age"]), (STALE, None, None))
        for server, lease in leases.items():
            server.put(LEASES, lease)
        self.assertEqual(self.paths(self.document())["edge-3"], (DIRECT, 0.0))


class PoolViewCostTests(unittest.TestCase):
    """What a flood of ``/pool`` and ``/`` requests costs, on a ``task.Clock``: the
    cloud's pool Nodes and node leases are watched while documents are asked for (one
    paged list and one watch of each, never a read per member or per document), and
    a document is built, encoded and rendered once, then served as the same bytes
    until the next build."""

    MEMBERS = 5

    def setUp(self):
        self.clock = task.Clock()
        self.clock.advance(START)
        self.cloud, self.coordinator = ListingKube(self.clock), ListingKube(self.clock)
        for i in range(1, self.MEMBERS + 1):
            Member(self.clock, self.cloud, self.coordinator, f"edge-{i}", 0.0).renew()
        # Another pool's node: its lease is in the cloud's list, not in the document.
        self.cloud.put(LEASES, build_lease("other-1", NODE_LEASE_NAMESPACE,
                                           LeaseRecord("other-1", 40, None, START)))
        self.source = InitialStatus("edge-1", POOL, (), since=START)
        self.view = PoolView(
            self.clock, self.source, "edge-1", POOL, self.coordinator, self.cloud,
            lambda: True, lambda _prefix: defer.succeed(0), "/registry", lambda: (),
            ELECTION, STALE_AFTER, ElectionLeader(self.clock), ttl=1.0)
        self.root = status_resource(self.source, Metrics("edge-1", POOL), self.view)
        self.addCleanup(lambda: self.successResultOf(self.view.stop()))

    def get(self, path):
        """``GET /<path>`` on the status pages: (code, body bytes as written)."""
        request = DummyRequest([path] if path else [b""])
        page = self.root.getChildWithDefault(path, request)
        request.postpath = []
        body = page.render(request)
        if body is not NOT_DONE_YET:
            request.write(body)
            request.finish()
        self.assertTrue(request.finished)
        self.assertEqual(len(request.written), 1)
        return request.responseCode or 200, request.written[0]

    def test_the_cloud_is_listed_in_pages_and_watched_once_for_every_document(self):
        self.patch(poolview, "MEMBER_LIST_LIMIT", 2)
        document = self.successResultOf(self.view.document())
        self.assertEqual(document["errors"], {})
        self.assertTrue(document["cloud_read"])
        self.assertEqual({m["node"]: m["heartbeat"] for m in document["members"]},
                         {f"edge-{i}": DIRECT for i in range(1, self.MEMBERS + 1)})
        # Five pool Nodes and six cloud leases, two a page: three pages each, then one
        # watch of each; no GET.
        watched = ["list leases"] * 3 + ["list nodes"] * 3 + ["watch leases", "watch nodes"]
        self.assertEqual(sorted(self.cloud.requests), watched)
        # A document a second for a minute, members renewing every interval: not one
        # more request to the cloud, and every renewal in the documents.
        for second in range(1, 61):
            self.clock.advance(1.0)
            if second % INTERVAL == 0:
                for i in range(1, self.MEMBERS + 1):
                    Member(self.clock, self.cloud, self.coordinator, f"edge-{i}", 0.0).renew()
            document = self.successResultOf(self.view.document())
            ages = {m["cloud_lease_age"] for m in document["members"]}
            self.assertEqual(ages, {second % INTERVAL}, second)
        self.assertEqual(self.view.builds, 61)
        self.assertEqual(sorted(self.cloud.requests), watched)

    def test_the_watches_stop_when_no_document_is_asked_and_start_again_with_one(self):
        self.successResultOf(self.view.document())
        self.assertEqual((self.view.watching, self.cloud.watching), (True, 2))
        self.clock.advance(poolview.POOL_WATCH_IDLE - 1)
        self.assertEqual(self.cloud.watching, 2)
        self.clock.advance(1)
        self.assertEqual((self.view.watching, self.cloud.watching), (False, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])
        # Meanwhile edge-2 renews and edge-3's cloud lease is deleted; edge-1 (and the
        # others) renewed last before the stop.
        Member(self.clock, self.cloud, self.coordinator, "edge-2", 0.0).renew()
        self.successResultOf(self.cloud.delete(LEASES, "edge-3", NODE_LEASE_NAMESPACE))
        self.clock.advance(1)
        self.cloud.requests.clear()
        members = {m["node"]: m for m in self.successResultOf(self.view.document())["members"]}
        self.assertEqual(sorted(self.cloud.requests),
                         ["list leases", "list nodes", "watch leases", "watch nodes"])
        # Listed again: what changed unwatched counts from now, what did not keeps
        # its age (a node that died meanwhile is not fresh again), what is gone is.
        self.assertEqual(members["edge-1"]["cloud_lease_age"], poolview.POOL_WATCH_IDLE + 1)
        self.assertEqual(members["edge-1"]["heartbeat"], STALE)
        self.assertEqual(members["edge-2"]["cloud_lease_age"], 0.0)
        self.assertEqual((members["edge-3"]["heartbeat"], members["edge-3"]["cloud_lease_age"]),
                         (STALE, None))

    def test_requests_within_the_ttl_get_the_same_bytes_of_one_build(self):
        code, first = self.get(b"pool")
        self.assertEqual(code, 200)
        requests = len(self.cloud.requests), len(self.coordinator.requests)
        self.clock.advance(0.5)
        code, second = self.get(b"pool")
        self.assertIs(second, first)
        self.assertEqual(self.view.builds, 1)
        self.assertEqual((len(self.cloud.requests), len(self.coordinator.requests)), requests)
        self.assertEqual(json.loads(first)["members"][0]["node"], "edge-1")
        # The pool page too: rendered once for this document and status.
        code, page = self.get(b"")
        self.assertEqual(code, 200)
        self.assertIn(b'data-node="edge-5"', page)
        self.assertIs(self.get(b"")[1], page)
        # The next build is encoded and rendered anew.
        self.clock.advance(0.5)
        code, third = self.get(b"pool")
        self.assertEqual(self.view.builds, 2)
        self.assertIsNot(third, first)
        self.assertIs(self.get(b"pool")[1], third)
        self.assertIsNot(self.get(b"")[1], page)

    def test_a_client_that_accepts_gzip_gets_the_document_compressed_once_a_build(self):
        compressions = []
        real = gzip.compress

        def counted(data, *args, **kwargs):
            compressions.append(len(data))
            return real(data, *args, **kwargs)

        self.patch(status_module.gzip, "compress", counted)
        plain = self.get(b"pool")[1]
        answers = []
        for accept in (b"gzip, deflate, br", b"br;q=1.0, gzip;q=0.5", b"*"):
            request = DummyRequest([b""])
            request.requestHeaders.setRawHeaders(b"accept-encoding", [accept])
            page = self.root.getChildWithDefault(b"pool", request)
            request.postpath = []
            self.assertIs(page.render(request), NOT_DONE_YET)
            self.assertEqual(request.responseHeaders.getRawHeaders(b"content-encoding"),
                             [b"gzip"], accept)
            self.assertEqual(request.responseHeaders.getRawHeaders(b"vary"),
                             [b"accept-encoding"])
            answers.append(request.written[0])
        self.assertEqual(gzip.decompress(answers[0]), plain)
        self.assertEqual(len({id(answer) for answer in answers}), 1)
        self.assertEqual(compressions, [len(plain)])
        self.assertLess(len(answers[0]), len(plain) / 3)
        # Refused gzip, or none asked: the plain bytes.
        for accept in (b"gzip;q=0", b"identity"):
            request = DummyRequest([b""])
            request.requestHeaders.setRawHeaders(b"accept-encoding", [accept])
            page = self.root.getChildWithDefault(b"pool", request)
            request.postpath = []
            page.render(request)
            self.assertIsNone(request.responseHeaders.getRawHeaders(b"content-encoding"))
            self.assertIs(request.written[0], plain)

    def test_answers_carry_their_length(self):
        for accept in (None, b"gzip"):
            request = DummyRequest([b""])
            if accept:
                request.requestHeaders.setRawHeaders(b"accept-encoding", [accept])
            page = self.root.getChildWithDefault(b"pool", request)
            request.postpath = []
            page.render(request)
            self.assertEqual(request.finished, 1)
            self.assertEqual(request.responseHeaders.getRawHeaders(b"content-length"),
                             [b"%d" % len(request.written[0])], accept)

    def test_the_pool_page_follows_the_status_between_builds(self):
        self.get(b"pool")
        page = self.get(b"")[1]
        self.source.pool = "pool-b"
        changed = self.get(b"")[1]
        self.assertIsNot(changed, page)
        self.assertIn(b"pool-b", changed)
        self.assertEqual(self.view.builds, 1)

    def test_concurrent_requests_during_a_build_share_it_and_its_bytes(self):
        self.cloud.hold("list")
        requests = [DummyRequest([]) for _ in range(5)]
        page = self.root.getChildWithDefault(b"pool", requests[0])
        for request in requests:
            self.assertIs(page.render(request), NOT_DONE_YET)
        self.assertEqual([r.finished for r in requests], [0] * 5)
        self.assertEqual(sorted(self.cloud.requests), ["list leases", "list nodes"])
        self.cloud.release_hold("list")
        self.cloud.deliver_held()
        self.assertEqual([r.finished for r in requests], [1] * 5)
        bodies = [r.written[0] for r in requests]
        self.assertEqual(len({id(body) for body in bodies}), 1)
        self.assertEqual(self.view.builds, 1)
        self.assertEqual(sorted(self.cloud.requests),
                         ["list leases", "list nodes", "watch leases", "watch nodes"])
        self.assertEqual(self.coordinator.requests,
                         ["get leases", "list leases", "get leases"])
