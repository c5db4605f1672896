"""Pool-scoped resources against the Kubernetes API test server, with the real
informer and discovery: an edit of the ConfigMap takes effect and an unknown group is
dropped, and discovery tells a cluster-scoped resource."""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.pool.scope import PoolScopeResources
from yurtcoord.sim.apiserver.clients import start_server_with_client
from yurtcoord.testing.discovery import DEFAULT_IDS, resource_ids
from yurtcoord.testing.logcapture import capture_log
from yurtcoord.testing.poll import poll_until


class PoolScopeLiveTests(unittest.TestCase):
    """Against the Kubernetes API test server, with the real informer and discovery."""

    @defer.inlineCallbacks
    def setUp(self):
        self.server, self.client = yield start_server_with_client(self, reactor)

    @defer.inlineCallbacks
    def test_configmap_edit_takes_effect_and_unknown_group_is_dropped(self):
        scope = PoolScopeResources(reactor, self.client)
        messages = capture_log(scope)
        self.addCleanup(scope.stop)
        scope.start()
        yield poll_until(lambda: scope.resources is not None, what="first resolution")
        self.assertEqual(resource_ids(scope.resources), DEFAULT_IDS)
        self.server.store.create(gvrs.CONFIGMAPS, {
            "metadata": {"name": "yurt-hub-cfg", "namespace": "kube-system"},
            "data": {"pool_scope_resources":
                     '[{"Group":"","Version":"v1","Resource":"services"},'
                     ' {"group":"example.com","version":"v1","resource":"widgets"}]'}})
        yield poll_until(lambda: len(scope.resources) == 4, what="services added")
        self.assertEqual(resource_ids(scope.resources)[-1], ("", "v1", "services"))
        self.assertTrue(any("widgets.v1.example.com" in m and "dropped" in m for m in messages),
                        messages)
        self.server.store.delete(gvrs.CONFIGMAPS, "yurt-hub-cfg", "kube-system")
        yield poll_until(lambda: len(scope.resources) == 3, what="back to defaults")

    @defer.inlineCallbacks
    def test_discovery_of_a_cluster_scoped_resource(self):
        scope = PoolScopeResources(reactor, self.client, defaults=(
            GroupVersionResource("", "v1", "nodes"),))
        self.addCleanup(scope.stop)
        scope.start()
        yield poll_until(lambda: scope.resources is not None, what="resolution")
        self.assertEqual([(g.resource, g.namespaced) for g in scope.resources],
                         [("nodes", False)])
