"""The leader's pool sync over real sockets: a cloud and a coordinator Kubernetes API
test server and the pool store on a real etcd (the preferred version), read back with
etcdctl. The mirror is exact after the first sync (with the informer sync lease written
promptly), after a watch cut mid-line or a forced 410, after writes etcd lost and after
the pool scope ConfigMap added services; keys that are not UTF-8, a delete storm,
objects gone while no one led and a thousand endpoints do not stop it, and a stop in
the middle of the first list writes nothing after. The order and timing of its steps
on a Clock are in the unit tier.
"""

import json
import os
import time

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.agent.metrics import Metrics
from yurtcoord.pool.scope import HealthyCloudClient, PoolScopeResources
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keys import format_rv
from yurtcoord.pool.store import PoolStore
from yurtcoord.pool.sync import PoolSyncManager
from yurtcoord.pool.synced import PoolCacheSyncedDetector
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.etcd import preferred_etcd_binary
from yurtcoord.testing.cloudobjects import make_endpoints, make_slice
from yurtcoord.testing.discovery import configmap
from yurtcoord.testing.logcapture import capture_log
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.sharedetcd import use_shared_etcd

ETCD = preferred_etcd_binary()
NODE = "edge-1"
# Wall-clock bound for "promptly" on real sockets: far below the 10 s informer_lease_renew.
PROMPT = 5.0


KEY_PREFIXES = {
    "endpoints": "/registry/services/endpoints",
    "endpointslices": "/registry/endpointslices",
    "services": "/registry/services/specs",
}


class PoolSyncLiveTests(unittest.TestCase):

    timeout = 120

    def setUp(self):
        if ETCD is None:
            raise unittest.SkipTest("no etcd installed")
        # The run's shared etcd, emptied after each test.
        self.etcd = use_shared_etcd(self, ETCD)
        return self._set_up_servers()

    @defer.inlineCallbacks
    def _set_up_servers(self):
        self.etcd_client = EtcdClient(reactor, EtcdConfig(self.etcd.client_url, timeout=5.0))
        self.addCleanup(self.etcd_client.close)
        self.cache_dir = os.path.abspath(self.mktemp())
        os.makedirs(self.cache_dir)
        self.cloud = KubeAPIServer(reactor, history=100000)
        self.cloud_url = yield self.cloud.start(port=0)
        self.addCleanup(self.cloud.stop)
        self.pool_api = KubeAPIServer(reactor)
        pool_url = yield self.pool_api.start(port=0)
        self.addCleanup(self.pool_api.stop)
        self.cloud_client = KubeClient(reactor, ClientConfig(server=self.cloud_url, insecure=True))
        self.addCleanup(self.cloud_client.close)
        self.pool_client = KubeClient(reactor, ClientConfig(server=pool_url, insecure=True))
        self.addCleanup(self.pool_client.close)
        self.pool_api.store.create(gvrs.NODES, {"metadata": {"name": NODE}})
        self.synced_reports = []
        self.detector = PoolCacheSyncedDetector(reactor, self.pool_client, 30.0,
                                                self.synced_reports.append)
        self.addCleanup(self.detector.stop)
        self.managers = []

    def new_store(self, **kwargs):
        key_cache = ComponentKeyCache.in_directory(self.cache_dir).load()
        store = PoolStore(reactor, self.etcd_client, "/registry", key_cache, **kwargs)
        self.addCleanup(store.close)
        return store

    def new_manager(self):
        cloud = HealthyCloudClient(lambda: self.cloud_url, {self.cloud_url: self.cloud_client}.get)
        scope = PoolScopeResources(reactor, cloud)
        manager = PoolSyncManager(reactor, NODE, self.pool_client, cloud, scope,
                                  informer_lease_renew=10, metrics=Metrics(NODE))
        self.addCleanup(manager.stop)
        self.managers.append(manager)
        return manager

    def populate(self, count, namespaces=("default", "kube-system", "team-a")):
        for i in range(count):
            namespace = namespaces[i % len(namespaces)]
            self.cloud.store.create(gvrs.ENDPOINTS, make_endpoints(i, namespace))
            self.cloud.store.create(gvrs.ENDPOINTSLICES_V1, make_slice(i, namespace))

    def expected(self, resources=(gvrs.ENDPOINTS, gvrs.ENDPOINTSLICES_V1)):
        found = {}
        for gvr in resources:
            for obj in self.cloud.store.list(gvr):
                meta = obj["metadata"]
                found[f"{KEY_PREFIXES[gvr.resource]}/{meta['namespace']}/{meta['name']}"] = obj
        return found

    def actual(self):
        return {k.decode(): json.loads(v)
                for k, v in self.etcd.read("/registry/", prefix=True).items()}

    def mirrors(self):
        return {k.decode()[len("/mirror/rv"):]: v.decode()
                for k, v in self.etcd.read("/mirror/rv/registry/", prefix=True).items()}

    def wait_exact(self, what, resources=(gvrs.ENDPOINTS, gvrs.ENDPOINTSLICES_V1), timeout=30.0):
        def exact():
            return self.actual() == self.expected(resources)
        return poll_until(exact, timeout=timeout, interval=0.05, what=what)

    def check_mirror_rvs(self, resources=(gvrs.ENDPOINTS, gvrs.ENDPOINTSLICES_V1)):
        expected = {k: format_rv(int(v["metadata"]["resourceVersion"]))
                    for k, v in self.expected(resources).items()}
        self.assertEqual(self.mirrors(), expected)

    def lease(self):
        return self.pool_api.store.get(gvrs.LEASES, "leader-informer-sync", "kube-system")

    def modify(self, gvr, name, namespace, change):
        obj = self.cloud.store.get(gvr, name, namespace)
        change(obj)
        self.cloud.store.update(gvr, obj)

    @defer.inlineCallbacks
    def test_initial_sync_changes_and_lease(self):
        self.populate(200)
        # Left by a previous leader for objects gone since; this node's key cache never knew.
        ghost = make_endpoints(9999, "default")
        ghost["metadata"].update(name="ghost", resourceVersion="3")
        self.etcd.put("/registry/services/endpoints/default/ghost", json.dumps(ghost))
        self.etcd.put("/mirror/rv/registry/services/endpoints/default/ghost", format_rv(3))

        manager = self.new_manager()
        yield self.detector.start()
        started = time.monotonic()
        yield manager.start(self.new_store())
        yield poll_until(lambda: manager.all_listed, timeout=30, what="all listed")
        listed = time.monotonic()
        # The exact "at once" is proven on a Clock above; here the bound only has to be
        # well under informer_lease_renew (10 s, the seed's delay) on a loaded machine.
        yield poll_until(lambda: self.lease() is not None, timeout=PROMPT,
                         what="informer sync lease promptly after the lists")
        yield poll_until(lambda: self.detector.synced, timeout=PROMPT,
                         what="detector synced promptly after the first renewal")
        synced = time.monotonic()
        yield self.wait_exact("initial sync")
        self.check_mirror_rvs()
        self.assertEqual(len(self.actual()), 400)
        lease = self.lease()
        self.assertEqual(lease["spec"]["holderIdentity"], NODE)
        self.assertEqual(lease["spec"]["leaseDurationSeconds"], 10)
        node = self.pool_api.store.get(gvrs.NODES, NODE)
        self.assertEqual(lease["metadata"]["ownerReferences"], [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}])
        self.assertLess(synced - listed, PROMPT)
        self.log_timing(f"200+200 objects: all listed {listed - started:.2f}s, "
                        f"synced {synced - started:.2f}s after start")

        for i in range(0, 60, 3):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.modify(gvrs.ENDPOINTS, f"svc-{i}", namespace,
                        lambda o: o["subsets"][0]["addresses"].append({"ip": "192.168.0.1"}))
            self.cloud.store.delete(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", namespace)
        self.cloud.store.create(gvrs.ENDPOINTS, make_endpoints(500, "team-b"))
        yield self.wait_exact("modifications and deletions")
        self.check_mirror_rvs()

    @defer.inlineCallbacks
    def test_exact_after_watch_cut_mid_line_and_forced_410(self):
        self.populate(100)
        manager = self.new_manager()
        yield manager.start(self.new_store())
        yield self.wait_exact("initial sync")
        yield poll_until(lambda: self.cloud.open_watches >= 4, what="watches open")

        self.cloud.faults.cut_watches(mid_line=True)
        for i in range(10):
            self.modify(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", ("default", "kube-system",
                        "team-a")[i % 3], lambda o: o["endpoints"][0]["conditions"].update(
                            ready=False))
        self.cloud.store.delete(gvrs.ENDPOINTS, "svc-20", "team-a")
        yield self.wait_exact("after a watch cut mid-line")

        # Forced 410: changes while no watch is open, then the history is dropped.
        yield self.cloud.faults.down()
        for i in range(30, 60):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.cloud.store.delete(gvrs.ENDPOINTS, f"svc-{i}", namespace)
            self.modify(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", namespace,
                        lambda o: o["metadata"]["labels"].update(changed="yes"))
        self.cloud.store.create(gvrs.ENDPOINTS, make_endpoints(700, "default"))
        self.cloud.store.compact()
        yield self.cloud.faults.up()
        yield self.wait_exact("after a 410 relist")
        self.check_mirror_rvs()
        informers = [m.informer for m in manager.mirrors.values()]
        self.assertGreaterEqual(max(i.lists for i in informers), 2, "a relist happened")

    @defer.inlineCallbacks
    def synced_then_keys_lost(self, health_interval, every):
        """A synced pool; then every ``every``-th mirrored key (and its mirror rv) is
        deleted in etcd, as etcd 3.5.0-3.5.2 may lose acknowledged writes when killed.
        Fires with the store, whose health loop runs every ``health_interval``."""
        self.populate(60)
        manager = self.new_manager()
        store = self.new_store(health_interval=health_interval)
        store.start()
        yield poll_until(lambda: store.healthy, what="store healthy")
        yield manager.start(store)
        yield self.wait_exact("initial sync")
        for path in sorted(self.expected())[::every]:
            self.etcd.etcdctl("del", path)
            self.etcd.etcdctl("del", "/mirror/rv" + path)
        return store

    @defer.inlineCallbacks
    def test_writes_etcd_lost_in_an_outage_are_written_again(self):
        store = yield self.synced_then_keys_lost(health_interval=0.05, every=7)
        self.etcd.kill()
        yield poll_until(lambda: not store.healthy, what="store unhealthy")
        self.etcd.restart()
        yield self.wait_exact("after etcd came back")
        self.check_mirror_rvs()

    @defer.inlineCallbacks
    def test_writes_lost_in_a_restart_between_health_checks_are_written_again(self):
        store = yield self.synced_then_keys_lost(health_interval=3600.0, every=5)
        self.etcd.kill()
        self.etcd.restart()
        yield store.check_health()  # the next check: reachable, in a new raft term
        self.assertTrue(store.healthy)
        yield self.wait_exact("after the restart")
        self.check_mirror_rvs()

    @defer.inlineCallbacks
    def test_a_key_that_is_not_utf8_does_not_stop_pool_sync(self):
        self.populate(30)
        bad = b"/registry/services/endpoints/default/\xff\xfe"
        # Any pool member can write such a key through the gateway.
        yield self.etcd_client.put(bad, b"{}")
        metrics = Metrics(NODE)
        store = self.new_store(metrics=metrics)
        manager = self.new_manager()
        yield manager.start(store)
        yield poll_until(lambda: manager.all_listed and self.lease() is not None,
                         timeout=30.0, interval=0.05, what="pool sync listed, lease written")
        stored = self.etcd.read("/registry/", prefix=True)
        self.assertIn(bad, stored)
        self.assertEqual({k.decode() for k in stored if k != bad}, set(self.expected()))
        self.assertEqual(metrics.registry.get_sample_value(
            "yurtcoord_pool_store_undecodable_keys_total"), 1.0)

    @defer.inlineCallbacks
    def test_a_delete_storm_rewrites_the_key_cache_file_once_per_batch(self):
        self.populate(300)
        store = self.new_store()
        manager = self.new_manager()
        yield manager.start(store)
        yield self.wait_exact("synced")
        writes = []
        real_snapshot = store.key_cache.snapshot_for_writing
        store.key_cache.snapshot_for_writing = lambda: (writes.append(1), real_snapshot())[1]
        self.addCleanup(setattr, store.key_cache, "snapshot_for_writing", real_snapshot)
        for i in range(200):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.cloud.store.delete(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", namespace)
        yield self.wait_exact("the deletes in etcd")
        yield poll_until(lambda: not store.key_cache.dirty, timeout=10.0, interval=0.05,
                         what="the key cache file written")
        # A few drained batches (events arrive in a few watch reads), not 200 writes.
        self.assertGreaterEqual(len(writes), 1)
        self.assertLessEqual(len(writes), 20, len(writes))
        self.assertEqual(len(store.key_cache.keys("leader-yurthub", gvrs.ENDPOINTSLICES_V1)),
                         100)
        yield manager.stop()
        yield store.close()
        # Read back as written (the agent itself rebuilds the leader's entries from etcd).
        on_disk = ComponentKeyCache.in_directory(self.cache_dir, rebuilt_components=()).load()
        self.assertEqual(on_disk.snapshot(), store.key_cache.snapshot())

    @defer.inlineCallbacks
    def test_new_leader_removes_keys_of_objects_gone_meanwhile(self):
        self.populate(50)
        first = self.new_manager()
        yield first.start(self.new_store())
        yield self.wait_exact("first leader synced")
        yield first.stop()
        for i in range(0, 50, 2):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.cloud.store.delete(gvrs.ENDPOINTS, f"svc-{i}", namespace)
            self.cloud.store.delete(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", namespace)
        self.assertEqual(len(self.actual()), 100, "nothing is synced while no leader runs")

        # Another node becomes leader with a key cache of its own (empty).
        other_dir = os.path.abspath(self.mktemp())
        os.makedirs(other_dir)
        store = PoolStore(reactor, self.etcd_client, "/registry",
                          ComponentKeyCache.in_directory(other_dir).load())
        self.addCleanup(store.close)
        second = self.new_manager()
        yield second.start(store)
        yield self.wait_exact("second leader synced")
        self.assertEqual(len(self.actual()), 50)
        self.check_mirror_rvs()

    @defer.inlineCallbacks
    def test_configmap_adds_services_and_unknown_group_is_dropped(self):
        self.populate(20)
        for i in range(15):
            self.cloud.store.create(gvrs.SERVICES, {
                "metadata": {"name": f"svc-{i}", "namespace": "default"},
                "spec": {"ports": [{"port": 80}]}})
        manager = self.new_manager()
        messages = capture_log(manager.pool_scope)
        yield manager.start(self.new_store())
        yield self.wait_exact("endpoints synced")
        self.cloud.store.create(gvrs.CONFIGMAPS, configmap(
            '[{"group":"","version":"v1","resource":"services"},'
            ' {"group":"example.com","version":"v1","resource":"widgets"}]'))
        everything = (gvrs.ENDPOINTS, gvrs.ENDPOINTSLICES_V1, gvrs.SERVICES)
        yield self.wait_exact("services synced", resources=everything)
        self.assertTrue(any("widgets.v1.example.com" in m and "dropped" in m for m in messages),
                        messages)
        self.cloud.store.delete(gvrs.SERVICES, "svc-3", "default")
        self.cloud.store.create(gvrs.ENDPOINTS, make_endpoints(77, "default"))
        yield self.wait_exact("services and endpoints keep syncing", resources=everything)
        self.check_mirror_rvs(everything)

    @defer.inlineCallbacks
    def test_thousand_endpoints_and_endpointslices(self):
        self.populate(1000)
        manager = self.new_manager()
        yield self.detector.start()
        started = time.monotonic()
        yield manager.start(self.new_store())
        yield poll_until(lambda: manager.all_listed, timeout=30, what="all listed")
        listed = time.monotonic()
        yield poll_until(lambda: self.detector.synced, timeout=PROMPT,
                         what="detector synced")
        yield self.wait_exact("1000+1000 synced")
        self.check_mirror_rvs()
        self.log_timing(f"1000+1000 objects listed into etcd in {listed - started:.2f}s")
        for i in range(0, 1000, 10):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.modify(gvrs.ENDPOINTSLICES_V1, f"svc-{i}-abcde", namespace,
                        lambda o: o["endpoints"][0]["conditions"].update(ready=False))
        yield self.wait_exact("100 updates followed")

        # 500 deletions learned only through a 410 relist.
        yield self.cloud.faults.down()
        for i in range(0, 1000, 2):
            namespace = ("default", "kube-system", "team-a")[i % 3]
            self.cloud.store.delete(gvrs.ENDPOINTS, f"svc-{i}", namespace)
        self.cloud.store.compact()
        relist = time.monotonic()
        yield self.cloud.faults.up()
        yield self.wait_exact("500 deletions after a relist")
        self.log_timing(f"500 deletions through a relist in {time.monotonic() - relist:.2f}s "
                        "(including the informer's reconnect backoff)")

    @defer.inlineCallbacks
    def test_stop_in_the_middle_of_the_first_list_writes_nothing_after(self):
        self.populate(1000)
        manager = self.new_manager()
        yield manager.start(self.new_store())
        yield poll_until(lambda: manager.all_listed or any(
            m.writing for m in manager.mirrors.values()),
            timeout=30, what="a list being written")
        stopping = manager.stop()
        yield stopping
        self.assertEqual(manager.mirrors, {})
        revision = self.etcd_revision()
        self.cloud.store.create(gvrs.ENDPOINTS, make_endpoints(5000, "default"))
        self.cloud.store.delete(gvrs.ENDPOINTS, "svc-0", "default")
        # A round trip through the cloud server: had a watch survived, its events
        # would have been delivered by now.
        yield self.cloud_client.list(gvrs.ENDPOINTS, namespace="default")
        yield poll_until(lambda: self.cloud.open_watches == 0,
                         what="the cloud server saw every watch close")
        self.assertEqual(self.etcd_revision(), revision)
        self.assertIsNone(self.lease())

    def etcd_revision(self):
        status = json.loads(self.etcd.etcdctl("endpoint", "status", "-w", "json"))
        return status[0]["Status"]["header"]["revision"]

    def log_timing(self, text):
        with open(os.path.join(self.cache_dir, "..", "timing.txt"), "a") as f:
            f.write(text + "\n")
