"""Pool-scoped resources: defaults, the ConfigMap, discovery filtering and its retries.

Timing is driven by a ``Clock`` with a fake informer and a scripted discovery client;
the run against the Kubernetes API test server with the real informer is in the
integration tier.
"""

from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.errors import ServerError
from yurtcoord.pool.scope import (
    DEFAULT_POOL_SCOPE_RESOURCES, HealthyCloudClient, PoolScopeResources,
    merge_resources, parse_pool_scope_resources,
)
from yurtcoord.testing.discovery import (
    DEFAULT_IDS, SERVICES_ENTRY, cloud_discovery, configmap, resource_ids,
)
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.logcapture import capture_log


class ParseTests(unittest.TestCase):

    def test_field_names_are_case_insensitive(self):
        parsed = parse_pool_scope_resources(
            '[{"Group":"","Version":"v1","Resource":"services"},'
            ' {"GROUP":"apps","version":"v1","RESOURCE":"deployments"}]')
        self.assertEqual(resource_ids(parsed),
                         [("", "v1", "services"), ("apps", "v1", "deployments")])

    def test_missing_group_means_core(self):
        parsed = parse_pool_scope_resources('[{"version":"v1","resource":"pods"}]')
        self.assertEqual(resource_ids(parsed), [("", "v1", "pods")])

    def test_bad_values_are_rejected_with_a_reason(self):
        for text, reason in [("{not json", "not JSON"), ('{"group":""}', "list"),
                             ('["services"]', "not an object"),
                             ('[{"group":"","resource":"x"}]', "version and resource")]:
            with self.assertRaises(ValueError) as caught:
                parse_pool_scope_resources(text)
            self.assertIn(reason, str(caught.exception))

    def test_merge_keeps_defaults_first_without_duplicates(self):
        extra = parse_pool_scope_resources(
            '[{"group":"","version":"v1","resource":"endpoints"},'
            ' {"group":"","version":"v1","resource":"services"}]')
        self.assertEqual(resource_ids(merge_resources(DEFAULT_POOL_SCOPE_RESOURCES, extra)),
                         DEFAULT_IDS + [("", "v1", "services")])


class PoolScopeClockTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.discovery = cloud_discovery()
        self.informers = []
        self.scope = PoolScopeResources(self.clock, self.discovery,
                                        informer_factory=FakeInformer.factory(self.informers))
        self.messages = capture_log(self.scope)
        self.changes = []
        self.scope.add_listener(self.changes.append)

    def tearDown(self):
        self.scope.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def start(self, objects=()):
        self.scope.start()
        informer = self.informers[-1]
        self.assertEqual((informer.gvr, informer.namespace, informer.field_selector),
                         (gvrs.CONFIGMAPS, "kube-system", "metadata.name=yurt-hub-cfg"))
        informer.end_list(objects)
        return informer

    def test_defaults_resolved_after_the_configmap_list(self):
        self.scope.start()
        self.assertIsNone(self.scope.resources, "nothing resolved before the first list")
        self.assertEqual(self.discovery.calls, [])
        self.informers[-1].end_list()
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)
        self.assertEqual(len(self.changes), 1)
        self.assertTrue(all(g.namespaced for g in self.scope.resources))
        self.assertEqual(self.scope.kind_of(gvrs.ENDPOINTS), "Endpoints")

    def test_configmap_entries_are_added(self):
        self.start([configmap(SERVICES_ENTRY)])
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS + [("", "v1", "services")])
        self.assertEqual(len(self.changes), 1, "one resolution for the first list")

    def test_discovery_says_whether_a_resource_is_namespaced(self):
        self.start([configmap('[{"group":"","version":"v1","resource":"nodes"}]')])
        nodes = [g for g in self.scope.resources if g.resource == "nodes"]
        self.assertEqual([g.namespaced for g in nodes], [False])

    def test_unserved_group_version_is_dropped_with_a_warning(self):
        self.start([configmap('[{"group":"example.com","version":"v1","resource":"widgets"},'
                              ' {"group":"","version":"v1","resource":"gadgets"}]')])
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)
        warnings = [m for m in self.messages if "dropped" in m]
        self.assertEqual(len(warnings), 2, self.messages)
        self.assertIn("widgets.v1.example.com", warnings[0])
        self.assertIn("gadgets.v1", warnings[1])

    def test_bad_json_keeps_defaults_and_names_configmap_and_key(self):
        self.start([configmap("[{oops")])
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)
        warning = [m for m in self.messages if "ignoring key" in m]
        self.assertEqual(len(warning), 1, self.messages)
        self.assertIn("pool_scope_resources", warning[0])
        self.assertIn("kube-system/yurt-hub-cfg", warning[0])

    def test_configmap_change_notifies_listeners_without_restart(self):
        informer = self.start()
        self.assertEqual(resource_ids(self.changes[-1]), DEFAULT_IDS)
        informer.add(configmap(SERVICES_ENTRY))
        self.assertEqual(resource_ids(self.changes[-1]), DEFAULT_IDS + [("", "v1", "services")])
        informer.add(configmap("[]", rv="2"))
        self.assertEqual(resource_ids(self.changes[-1]), DEFAULT_IDS)
        informer.add(configmap("[]", rv="3"))
        self.assertEqual(len(self.changes), 3, "an unchanged set is not announced again")

    def test_configmap_deleted_falls_back_to_defaults(self):
        informer = self.start([configmap(SERVICES_ENTRY)])
        informer.delete(configmap(SERVICES_ENTRY))
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)

    def test_discovery_errors_are_retried_three_times_five_seconds_apart(self):
        self.discovery.fail["/apis/discovery.k8s.io/v1"] = [ServerError("boom")] * 3
        self.start()
        self.assertIsNone(self.scope.resources)
        for _ in range(3):
            self.clock.advance(4.5)
            self.assertIsNone(self.scope.resources, "no retry before 5 s")
            self.clock.advance(0.5)
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)
        self.assertEqual(self.discovery.calls.count(("GET", "/apis/discovery.k8s.io/v1")), 4)
        self.assertEqual(self.clock.seconds(), 15.0)

    def test_new_resource_left_out_after_retries_run_out(self):
        self.discovery.fail["/apis/discovery.k8s.io/v1beta1"] = [ServerError("boom")] * 4
        self.start()
        self.clock.pump([5, 5, 5])
        self.assertEqual(resource_ids(self.scope.resources),
                         [("", "v1", "endpoints"), ("discovery.k8s.io", "v1", "endpointslices")])
        self.assertEqual(self.discovery.calls.count(("GET", "/apis/discovery.k8s.io/v1beta1")), 4)
        self.assertTrue(any("did not answer" in m for m in self.messages), self.messages)

    def test_resource_already_kept_stays_when_discovery_fails(self):
        informer = self.start()
        self.discovery.fail["/api/v1"] = [ServerError("boom")] * 4
        informer.add(configmap(SERVICES_ENTRY))
        self.clock.pump([5, 5, 5])
        self.assertEqual(self.discovery.calls.count(("GET", "/api/v1")), 5)
        self.assertEqual(resource_ids(self.scope.resources), DEFAULT_IDS)
        self.assertTrue(any("keeping it" in m for m in self.messages), self.messages)
        self.assertTrue(any("services.v1 left out" in m for m in self.messages), self.messages)

    def test_404_is_not_retried(self):
        self.discovery.served.pop("/apis/discovery.k8s.io/v1beta1")
        self.start()
        self.assertEqual(self.discovery.calls.count(("GET", "/apis/discovery.k8s.io/v1beta1")), 1)
        self.assertEqual(len(self.scope.resources), 2)

    def test_stop_cancels_retry_timer(self):
        self.discovery.fail["/api/v1"] = [ServerError("boom")] * 3
        informer = self.start()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        done = self.scope.stop()
        self.assertTrue(done.called)
        self.assertTrue(informer.stopped)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertIsNone(self.scope.resources)
        self.assertEqual(self.changes, [])


class HealthyCloudClientTests(unittest.TestCase):

    def test_asks_the_healthy_server_each_call(self):
        picked = ["https://a"]
        clients = {"https://a": cloud_discovery(), "https://b": cloud_discovery()}
        client = HealthyCloudClient(lambda: picked[0], clients.__getitem__)
        client.request("GET", "/api/v1")
        picked[0] = "https://b"
        client.request("GET", "/api/v1")
        self.assertEqual([len(c.calls) for c in clients.values()], [1, 1])

    def test_no_healthy_server_fails_the_call(self):
        client = HealthyCloudClient(lambda: None, lambda url: self.fail("no client wanted"))
        failure = self.failureResultOf(client.list(gvrs.ENDPOINTS))
        self.assertIn("no healthy cloud server", failure.getErrorMessage())
        watch = client.watch(gvrs.ENDPOINTS, lambda *a: None)
        self.failureResultOf(watch.done)
