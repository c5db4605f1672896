"""The leader's pool sync on a Clock, with a fake coordinator, fake informers and a fake
pool store: the order of the start steps; the informer sync lease, first written as
soon as every list is in (not a renewal period later, so followers are synced without
waiting for one) and then renewed by one timer; writes retried with backoff and written
again after an outage or a new etcd term; resources added and removed by the pool scope
ConfigMap; and a stop that leaves nothing running. The mirror over real sockets is in
the integration tier.
"""

import gc
import json

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.tx.retry import backoff_policy
from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.kube.lease import parse_micro_time, renew_time
from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.keys import ResourceId
from yurtcoord.pool.scope import PoolScopeResources
from yurtcoord.pool.mirror import ResourceMirror, object_bytes
from yurtcoord.pool.sync import PoolSyncManager
from yurtcoord.testing.discovery import SERVICES_ENTRY, cloud_discovery, configmap
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube
from yurtcoord.testing.fakepoolstore import FakePoolStore
from yurtcoord.testing.logcapture import capture_log

NODE = "edge-1"
START = 1_700_000_000.0


def endpoints(name, rv, namespace="default", ip="10.0.0.1"):
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 80}]}]}


class PoolSyncClockTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(START)
        self.coordinator = FakeKube()
        self.store = FakePoolStore()
        self.scope_informers = []
        self.informers = []
        self.scope = PoolScopeResources(
            self.clock, cloud_discovery(),
            informer_factory=FakeInformer.factory(self.scope_informers))
        self.metrics = Metrics(NODE)
        self.manager = PoolSyncManager(
            self.clock, NODE, self.coordinator, object(), self.scope,
            informer_lease_renew=10, metrics=self.metrics,
            informer_factory=FakeInformer.factory(self.informers),
            write_retry_policy=backoff_policy(initial=1.0, maximum=4.0, jitter=0))
        self.messages = capture_log(self.manager)
        self.patch(ResourceMirror, "log", self.manager.log)

    def tearDown(self):
        self.manager.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def lease(self):
        return self.coordinator.peek(gvrs.LEASES, "leader-informer-sync", "kube-system")

    def start(self, configmaps=()):
        """Start and let the ConfigMap list in; returns the resource informers by name."""
        started = self.manager.start(self.store)
        self.successResultOf(started)
        self.scope_informers[-1].end_list(configmaps)
        return {(i.gvr.group, i.gvr.version, i.gvr.resource): i for i in self.informers}

    def sync_all(self, informers, objects=None):
        for key, informer in informers.items():
            informer.end_list((objects or {}).get(key, ()))

    def test_start_deletes_lease_and_old_keys_before_mirroring(self):
        self.coordinator.put(gvrs.LEASES, {"metadata": {
            "name": "leader-informer-sync", "namespace": "kube-system"}, "spec": {}})
        self.successResultOf(self.manager.start(self.store))
        self.assertIsNone(self.lease())
        self.assertEqual(self.coordinator.calls[0], ("delete", "leader-informer-sync"))
        self.assertEqual([c[0] for c in self.store.calls], ["recover", "delete_component"])
        self.assertEqual(self.store.calls[0][2], (
            "core/v1/endpoints", "discovery.k8s.io/v1/endpointslices",
            "discovery.k8s.io/v1beta1/endpointslices"))
        self.assertEqual(self.informers, [], "no resource informer before the resource set")
        self.scope_informers[-1].end_list()
        self.assertEqual(len(self.informers), 3)
        self.assertTrue(all(i.started for i in self.informers))

    def test_start_with_absent_lease_is_fine(self):
        self.successResultOf(self.manager.start(self.store))
        self.assertTrue(self.manager.running)

    def test_start_cancelled_in_flight_leaves_nothing_running(self):
        """A role change cancels a start still deleting old keys: nothing was started,
        and the next start begins afresh."""
        self.store.hold_delete_component = True
        started = self.manager.start(self.store)
        self.assertNoResult(started)
        started.cancel()
        self.failureResultOf(started, defer.CancelledError)
        self.assertEqual(self.store.calls[-1], ("delete_component cancelled",))
        self.assertFalse(self.manager.running)
        self.assertFalse(self.scope.running)
        self.assertEqual((self.scope_informers, self.informers), ([], []))
        self.assertEqual(self.store.health_observers, [])
        self.successResultOf(self.manager.stop())
        informers = self.start()
        self.assertTrue(self.manager.running)
        self.assertEqual(len(informers), 3)

    def test_first_list_replaces_component_list(self):
        informers = self.start()
        informers[("", "v1", "endpoints")].end_list([endpoints("a", 5), endpoints("b", 6)])
        self.assertIn(("replace", "core/v1/endpoints", 2), self.store.calls)
        stored = self.store.objects["/registry/services/endpoints/default/a"]
        self.assertEqual((stored["apiVersion"], stored["kind"]), ("v1", "Endpoints"))
        self.assertFalse(any(c[0] == "put" for c in self.store.calls),
                         "listed objects are written by the list replace only")

    def test_lease_exists_as_soon_as_all_lists_complete(self):
        informers = self.start()
        names = list(informers)
        informers[names[0]].end_list()
        informers[names[1]].end_list()
        self.assertIsNone(self.lease(), "not all resources listed yet")
        informers[names[2]].end_list()
        # No clock advance: the seed waited a whole informer_lease_renew here.
        lease = self.lease()
        self.assertIsNotNone(lease)
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 10)
        self.assertEqual(parse_micro_time(lease["spec"]["renewTime"]), START)
        self.assertNotIn("ownerReferences", lease["metadata"])

    def test_heap_frozen_while_synced_and_unfrozen_on_stop(self):
        self.addCleanup(gc.unfreeze)
        gc.unfreeze()
        informers = self.start()
        self.assertEqual(gc.get_freeze_count(), 0)
        self.sync_all(informers)
        self.assertGreater(gc.get_freeze_count(), 0)
        self.successResultOf(self.manager.stop())
        self.assertEqual(gc.get_freeze_count(), 0)

    def test_a_burst_of_changes_holds_full_collections_off_while_it_lasts(self):
        threshold = gc.get_threshold()
        self.addCleanup(gc.set_threshold, *threshold)
        self.addCleanup(gc.unfreeze)
        informers = self.start()
        self.sync_all(informers)
        before = gc.get_stats()[2]["collections"]
        informer = informers[("", "v1", "endpoints")]
        for i in range(20):
            informer.add(endpoints(f"e{i}", 10 + i))
            self.clock.advance(0.1)
        self.assertEqual(len(self.store.objects), 20)
        self.assertEqual(gc.get_stats()[2]["collections"], before)
        self.assertGreater(gc.get_threshold()[2], threshold[2])
        self.clock.advance(1.0)
        # Over: the interpreter's own thresholds apply again (the burst left too few
        # long-lived objects behind for a full collection of its own).
        self.assertEqual(gc.get_threshold(), threshold)
        self.assertEqual(gc.get_stats()[2]["collections"], before)
        # A stop in the middle of a burst gives the thresholds back and thaws the heap.
        informer.delete(endpoints("e0", 10))
        self.assertGreater(gc.get_threshold()[2], threshold[2])
        self.successResultOf(self.manager.stop())
        self.assertEqual(gc.get_threshold(), threshold)
        self.assertEqual(gc.get_freeze_count(), 0)

    def test_one_timer_renews_every_period(self):
        self.sync_all(self.start())
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        for turn in range(1, 4):
            self.clock.advance(9.5)
            self.assertEqual(parse_micro_time(self.lease()["spec"]["renewTime"]),
                             START + (turn - 1) * 10)
            self.clock.advance(0.5)
            self.assertEqual(parse_micro_time(self.lease()["spec"]["renewTime"]), START + turn * 10)
            self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(self.manager.lease_writes, 4)
        self.assertEqual([c for c in self.coordinator.calls if c[0] == "create"],
                         [("create", "leader-informer-sync")])

    def test_owner_reference_to_existing_node(self):
        self.coordinator.put(gvrs.NODES, {"metadata": {"name": NODE, "uid": "uid-1"}})
        self.sync_all(self.start())
        self.assertEqual(self.lease()["metadata"]["ownerReferences"], [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}])

    def test_a_node_read_that_fails_does_not_keep_the_lease_from_being_created(self):
        # The coordinator answers the Node read with an error: the pool counts as
        # synced all the same, with a lease that names no owner.
        def fail_node_reads(verb, name):
            if (verb, name) == ("get", NODE):
                self.coordinator.fail_next("get", ConnectionFailed("node read refused"))
        self.coordinator.on_call = fail_node_reads
        self.sync_all(self.start())
        lease = self.lease()
        self.assertIsNotNone(lease)
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertNotIn("ownerReferences", lease["metadata"])
        self.assertIn(("get", NODE), self.coordinator.calls)

    def test_lease_deleted_behind_our_back_is_created_again(self):
        self.sync_all(self.start())
        self.coordinator.delete(gvrs.LEASES, "leader-informer-sync", "kube-system")
        self.clock.advance(10)
        self.assertIsNotNone(self.lease())

    def test_lease_write_failure_is_retried_next_period(self):
        self.coordinator.fail_next("create", ConnectionFailed("down"))
        self.sync_all(self.start())
        self.assertIsNone(self.lease())
        self.assertEqual(len(self.clock.getDelayedCalls()), 1, "the loop survives a failure")
        self.clock.advance(10)
        self.assertIsNotNone(self.lease())

    def test_watch_events_are_written_after_the_list(self):
        informers = self.start()
        informer = informers[("", "v1", "endpoints")]
        informer.end_list([endpoints("a", 5)])
        informer.add(endpoints("b", 7))
        informer.add(endpoints("a", 8, ip="10.0.0.9"))
        informer.delete(endpoints("b", 7))
        writes = [c for c in self.store.calls if c[0] in ("put", "delete_many")]
        self.assertEqual(writes, [
            ("put", ["/registry/services/endpoints/default/b"]),
            ("put", ["/registry/services/endpoints/default/a"]),
            ("delete_many", ["/registry/services/endpoints/default/b"]),
        ])
        self.assertEqual(
            self.store.objects["/registry/services/endpoints/default/a"]["subsets"][0],
            {"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 80}]})
        text = self.metrics.render().decode()
        for event_type in ("ADDED", "MODIFIED", "DELETED", "LIST"):
            self.assertIn('yurtcoord_pool_sync_events_total{resource="endpoints.v1",'
                          f'type="{event_type}"}} 1.0', text)

    def test_relist_is_written_as_one_list_replace(self):
        informers = self.start()
        self.sync_all(informers)
        informer = informers[("", "v1", "endpoints")]
        informer.add(endpoints("a", 5))
        informer.add(endpoints("b", 6))
        calls = len(self.store.calls)
        informer.relist([endpoints("b", 9, ip="10.0.0.2"), endpoints("c", 10)])
        self.assertEqual(len(self.store.calls), calls, "nothing written during the relist")
        informer.add(endpoints("d", 11))
        self.clock.advance(0)
        self.assertEqual(self.store.calls[calls:], [("replace", "core/v1/endpoints", 3)])
        self.assertEqual(sorted(self.store.objects), [
            f"/registry/services/endpoints/default/{n}" for n in "bcd"])
        informer.delete(endpoints("c", 10))
        self.assertEqual(self.store.calls[-1],
                         ("delete_many", ["/registry/services/endpoints/default/c"]))

    def test_failed_relist_write_is_retried_with_a_fresh_list(self):
        informers = self.start()
        self.sync_all(informers)
        informer = informers[("", "v1", "endpoints")]
        self.store.fail = [ConnectionFailed("etcd down")]
        informer.relist([endpoints("a", 5)])
        self.clock.advance(0)
        informer.add(endpoints("b", 6))
        self.clock.advance(1)
        self.assertEqual([c for c in self.store.calls if c[1] == "core/v1/endpoints"][-1],
                         ("replace", "core/v1/endpoints", 2))
        self.assertFalse(self.manager.mirrors[ResourceId("", "v1", "endpoints")].failing)

    def test_failed_writes_are_retried_with_backoff_and_hold_the_lease(self):
        informers = self.start()
        self.sync_all(informers)
        informer = informers[("", "v1", "endpoints")]
        self.store.fail = [ConnectionFailed("etcd down")] * 2
        informer.add(endpoints("a", 5))
        mirror = self.manager.mirrors[ResourceId("", "v1", "endpoints")]
        self.assertTrue(mirror.failing)
        self.assertFalse(self.manager.all_listed)
        self.clock.advance(1)
        self.assertTrue(mirror.failing, "second attempt failed too")
        renewals = self.manager.lease_writes
        self.clock.advance(2)
        self.assertFalse(mirror.failing)
        self.assertIn("/registry/services/endpoints/default/a", self.store.objects)
        self.assertEqual([c for c in self.store.calls if c[0] == "put"],
                         [("put", ["/registry/services/endpoints/default/a"])] * 3)
        self.clock.advance(7)
        self.assertEqual(self.manager.lease_writes, renewals + 1)

    def test_writes_recovering_from_failures_are_followed_by_the_whole_list(self):
        informers = self.start()
        self.sync_all(informers, {("", "v1", "endpoints"): [endpoints("a", 5)]})
        informer = informers[("", "v1", "endpoints")]
        self.store.fail = [ConnectionFailed("etcd down")]
        informer.add(endpoints("b", 6))
        self.clock.advance(1)
        calls = [c for c in self.store.calls if c[0] == "put" or c[1] == "core/v1/endpoints"]
        self.assertEqual(calls[-4:], [("replace", "core/v1/endpoints", 1),
                                      ("put", ["/registry/services/endpoints/default/b"]),
                                      ("put", ["/registry/services/endpoints/default/b"]),
                                      ("replace", "core/v1/endpoints", 2)])
        self.assertTrue(self.manager.mirrors[ResourceId("", "v1", "endpoints")].idle)

    def test_store_back_from_an_outage_rewrites_every_list(self):
        informers = self.start()
        self.sync_all(informers, {("", "v1", "endpoints"): [endpoints("a", 5)]})
        replaces = len([c for c in self.store.calls if c[0] == "replace"])
        self.store.health(True)  # no outage seen: nothing to repair
        self.assertEqual(len([c for c in self.store.calls if c[0] == "replace"]), replaces)
        self.store.health(False)
        self.store.objects.pop("/registry/services/endpoints/default/a")  # lost by etcd
        self.store.health(True)
        self.assert_every_list_rewritten(replaces, "reachable again")
        self.assertEqual(self.store.health_observers, [])

    def test_list_written_since_the_outage_is_not_written_again(self):
        informers = self.start()
        self.sync_all(informers, {("", "v1", "endpoints"): [endpoints("a", 5)]})
        self.store.health(False)
        self.store.fail = [ConnectionFailed("etcd down")]
        informers[("", "v1", "endpoints")].add(endpoints("b", 6))
        self.clock.advance(1)  # the retry succeeds and the whole list follows
        replaces = [c[1] for c in self.store.calls if c[0] == "replace"]
        self.store.health(True)
        rewritten = [c[1] for c in self.store.calls if c[0] == "replace"][len(replaces):]
        self.assertEqual(sorted(rewritten),
                         sorted(str(g) for g in self.manager.pool_scope.resources
                                if str(g) != "core/v1/endpoints"))
        self.assertIn("/registry/services/endpoints/default/b", self.store.objects)

    def assert_every_list_rewritten(self, replaces_before, logged):
        """Each mirror wrote its list once more (the lost object is back), the repair was
        logged with ``logged``, and the manager stops."""
        rewritten = [c for c in self.store.calls if c[0] == "replace"][replaces_before:]
        self.assertEqual(sorted(c[1] for c in rewritten),
                         sorted(str(g) for g in self.manager.pool_scope.resources))
        self.assertIn("/registry/services/endpoints/default/a", self.store.objects)
        self.assertTrue(any(logged in m for m in self.messages), self.messages)
        self.successResultOf(self.manager.stop())

    def test_etcd_in_a_new_term_rewrites_every_list(self):
        informers = self.start()
        self.sync_all(informers, {("", "v1", "endpoints"): [endpoints("a", 5)]})
        replaces = len([c for c in self.store.calls if c[0] == "replace"])
        self.store.objects.pop("/registry/services/endpoints/default/a")  # lost by etcd
        self.store.new_term()
        self.assert_every_list_rewritten(replaces, "new raft term")
        self.assertEqual(self.store.term_observers, [])

    def test_lease_not_renewed_while_a_write_fails(self):
        informers = self.start()
        self.sync_all(informers)
        self.store.fail = [ConnectionFailed("etcd down")] * 100
        informers[("", "v1", "endpoints")].add(endpoints("a", 5))
        self.clock.pump([4] * 10)
        self.assertEqual(self.manager.lease_writes, 1)
        self.assertTrue(any("not renewed" in m for m in self.messages), self.messages)

    def test_a_renewal_skipped_while_a_write_failed_is_made_up_once_it_succeeds(self):
        informers = self.start()
        self.sync_all(informers)
        self.assertEqual(self.manager.lease_writes, 1)
        # Attempts at +0, +1, +3 and +7 fail; the renewal due at +10 is skipped.
        self.store.fail = [ConnectionFailed("etcd down")] * 4
        informers[("", "v1", "endpoints")].add(endpoints("a", 5))
        self.clock.pump([1] * 10)
        self.assertEqual(self.manager.lease_writes, 1)
        self.assertTrue(any("not renewed" in m for m in self.messages), self.messages)
        self.clock.advance(1)
        self.assertFalse(self.manager.mirrors[ResourceId("", "v1", "endpoints")].failing)
        self.assertEqual(self.manager.lease_writes, 2, "renewed as the write went through")
        self.assertEqual(renew_time(self.lease()), START + 11)
        self.clock.pump([1] * 9)
        self.assertEqual(self.manager.lease_writes, 2)
        self.clock.advance(1)
        self.assertEqual(self.manager.lease_writes, 3, "one period after the late renewal")

    def test_failed_first_list_is_retried(self):
        informers = self.start()
        self.store.fail = [ConnectionFailed("etcd down")]
        self.sync_all(informers)
        self.assertIsNone(self.lease())
        self.clock.advance(1)
        self.assertIsNotNone(self.lease())
        self.assertEqual([c[1] for c in self.store.calls if c[0] == "replace"].count(
            "core/v1/endpoints"), 2)

    def test_object_too_large_is_left_out_of_the_first_list(self):
        informers = self.start()
        informers[("", "v1", "endpoints")].end_list([endpoints("a", 5), endpoints("huge", 6)])
        self.assertEqual([c for c in self.store.calls if c[0] == "replace"][:2], [
            ("replace", "core/v1/endpoints", 2), ("replace", "core/v1/endpoints", 1)])
        self.assertIn("/registry/services/endpoints/default/a", self.store.objects)
        self.assertTrue(any("too large" in m for m in self.messages), self.messages)

    def test_failed_deletes_are_retried(self):
        informers = self.start()
        informer = informers[("", "v1", "endpoints")]
        informer.end_list([endpoints(f"e{i}", i + 1) for i in range(40)])
        self.store.fail = [ConnectionFailed("etcd down")]
        informer.add(endpoints("x", 100))
        for i in range(40):
            informer.delete(endpoints(f"e{i}", i + 1))
        self.assertEqual([c for c in self.store.calls if c[0] == "delete_many"], [],
                         "deletes wait behind the failed write")
        self.store.fail_deletes = {"/registry/services/endpoints/default/e7"}
        self.clock.advance(1)
        deletes = [c[1] for c in self.store.calls if c[0] == "delete_many"]
        self.assertEqual(len(deletes), 1, "one batched call for the whole drain")
        self.assertEqual(len(deletes[0]), 40)
        mirror = self.manager.mirrors[ResourceId("", "v1", "endpoints")]
        self.assertTrue(mirror.failing)
        self.clock.advance(2)
        deletes = [c[1] for c in self.store.calls if c[0] == "delete_many"]
        self.assertEqual(sorted(deletes[1]), sorted(
            f"/registry/services/endpoints/default/e{i}" for i in range(40)),
            "every delete of the failed call is tried again (deleting twice is harmless)")
        self.assertFalse(mirror.failing)
        self.assertEqual(sorted(self.store.objects), ["/registry/services/endpoints/default/x"])

    def test_key_cache_file_written_once_per_drained_batch(self):
        informers = self.start()
        informer = informers[("", "v1", "endpoints")]
        informer.end_list([endpoints(f"e{i}", i + 1) for i in range(40)])
        del self.store.calls[:]
        del self.store.soon_flushes[:]
        # A burst arrives while the first change is being written: two drained batches
        # (the first change, then the rest), two file writes.
        self.store.fail = [ConnectionFailed("etcd down")]
        for i in range(30):
            informer.delete(endpoints(f"e{i}", i + 1))
        informer.add(endpoints("x", 100))
        # The first batch failed: the file is written all the same (memory moved on).
        self.assertEqual([c[0] for c in self.store.calls], ["delete_many"])
        self.assertEqual(self.store.soon_flushes, [1])
        self.clock.advance(1)
        # The changes, then (after failures) the whole list, which the store writes
        # itself as one operation.
        self.assertEqual([c[0] for c in self.store.calls[1:]],
                         ["put", "delete_many", "replace"])
        self.assertEqual(self.store.soon_flushes, [1, 3])
        self.assertEqual(len(self.store.objects), 11)

    def test_object_bytes_adds_type_only_when_missing(self):
        listed = {"metadata": {"name": "a"}}
        self.assertEqual(json.loads(object_bytes(listed, gvrs.ENDPOINTSLICES_V1, "EndpointSlice")),
                         {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                          "metadata": {"name": "a"}})
        typed = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "a"}}
        self.assertEqual(object_bytes(typed, gvrs.ENDPOINTS, "Other"),
                         b'{"apiVersion":"v1","kind":"Endpoints","metadata":{"name":"a"}}')
        self.assertNotIn("kind", listed, "the informer's object is not changed")

    def test_stop_leaves_nothing_and_writes_nothing_after(self):
        informers = self.start()
        self.sync_all(informers)
        self.store.fail = [ConnectionFailed("etcd down")]
        informers[("", "v1", "endpoints")].add(endpoints("a", 5))
        self.assertEqual(len(self.clock.getDelayedCalls()), 3,
                         "lease loop, write retry and the collection after the burst")
        done = self.manager.stop()
        self.assertTrue(done.called)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertTrue(all(i.stopped for i in self.informers + self.scope_informers))
        calls = len(self.store.calls)
        informers[("", "v1", "endpoints")].add(endpoints("b", 6))
        self.clock.advance(60)
        self.assertEqual(len(self.store.calls), calls)
        self.assertFalse(self.scope.running)

    def test_stop_during_held_lease_write(self):
        self.coordinator.hold("create")
        self.sync_all(self.start())
        self.assertEqual(len(self.coordinator.held), 1)
        done = self.manager.stop()
        self.assertTrue(done.called)
        self.assertTrue(self.coordinator.held[0].cancelled)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop_before_any_list(self):
        informers = self.start()
        self.successResultOf(self.manager.stop())
        for informer in informers.values():
            informer.end_list([endpoints("a", 5)])
        self.assertEqual([c[0] for c in self.store.calls], ["recover", "delete_component"])

    def test_configmap_adds_and_removes_a_resource(self):
        informers = self.start()
        self.sync_all(informers)
        self.scope_informers[-1].add(configmap(SERVICES_ENTRY))
        services = self.informers[-1]
        self.assertEqual(services.gvr.resource, "services")
        self.assertFalse(self.manager.all_listed, "services not listed yet")
        self.clock.advance(10)
        self.assertEqual(self.manager.lease_writes, 1, "no renewal while services list")
        services.end_list([{"metadata": {"name": "web", "namespace": "default",
                                     "resourceVersion": "9"}}])
        self.assertIn(("replace", "core/v1/services", 1), self.store.calls)
        self.assertEqual(self.manager.lease_writes, 2, "renewed once services listed")
        self.clock.advance(10)
        self.assertEqual(self.manager.lease_writes, 3)
        self.scope_informers[-1].add(configmap("[]", rv="2"))
        self.assertTrue(services.stopped)
        self.assertEqual(self.store.calls[-1], ("replace", "core/v1/services", 0))
        self.assertNotIn(("", "v1", "services"), self.manager.mirrors)

    def test_restart_after_stop_starts_afresh(self):
        self.sync_all(self.start())
        self.successResultOf(self.manager.stop())
        self.assertIsNotNone(self.lease())
        self.successResultOf(self.manager.start(self.store))
        self.assertIsNone(self.lease(), "a new leadership deletes the lease first")
        self.scope_informers[-1].end_list()
        self.sync_all({(i.gvr.group, i.gvr.version, i.gvr.resource): i
                       for i in self.informers[3:]})
        self.assertIsNotNone(self.lease())
