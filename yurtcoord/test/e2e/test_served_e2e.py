"""The pool cache is served: kubectl against the coordinator apiserver sees what the
agents wrote into the pool etcd.

A ``ProcessWorld`` (a real etcd, three ``twistd`` agent processes) whose two
coordinator apiservers keep their objects in that etcd. Once the pool has settled and
its etcd is exact against the cloud and the agents' caches:

- ``kubectl get endpointslices -A -o json`` on the coordinator lists exactly the
  cloud's endpointslices, same names, namespaces and content apart from the
  resourceVersion, which is the etcd mod revision of the object's key; the mirror rv
  key beside each holds the cloud's resourceVersion;
- ``kubectl get pods -A -o json`` lists every pod of every agent's cache, as cached,
  and the mirror rv key of each holds the cached resourceVersion;
- the election lease, every agent's node lease and the informer sync lease, which the
  agents write through the coordinator apiserver, are keys of the pool etcd: what
  kubectl reads is the value etcdctl reads at the revision kubectl reports;
- the second coordinator apiserver serves the same objects, same resourceVersions.

etcd is read with ``etcdctl``, an independent client.
"""

import json
import os

from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from yurtcoord.kube.gvr import ENDPOINTS, ENDPOINTSLICES_V1
from yurtcoord.names import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
from yurtcoord.sim.apiserver.clients import write_kubeconfig
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.twistd import child_environment
from yurtcoord.testing.world import (
    ELECTION_LEASE, ELECTION_NAMESPACE, MIRROR_RV_PREFIX, STORAGE_PREFIX, ProcessWorld,
    cached_pod, leader_of, one_leader_all_ready,
)

NODES = ("edge-1", "edge-2", "edge-3")
SLICE_NAMESPACES = ("default", "kube-system", "shop")
SETTLE_TIMEOUT = 60.0
STEP_TIMEOUT = 60.0
NODE_LEASE_NAMESPACE = "kube-node-lease"


def endpoints(name, namespace="default"):
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}


def endpoint_slice(name, namespace, ip):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}


def without_version(obj):
    """The object with its resourceVersion left out."""
    metadata = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return dict(obj, metadata=metadata)


def identity(obj):
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


class ServedPoolTests(unittest.TestCase):

    timeout = 240

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, coordinator_servers=2)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        cloud = self.world.cloud
        for index in range(10):
            cloud.store.create(ENDPOINTS, endpoints(f"svc-{index}"))
        for index in range(12):
            namespace = SLICE_NAMESPACES[index % len(SLICE_NAMESPACES)]
            cloud.store.create(ENDPOINTSLICES_V1,
                               endpoint_slice(f"slice-{index}", namespace, f"10.2.0.{index}"))
        for number, node in enumerate(NODES):
            agent = yield self.world.add_agent(node, pods=4, first_rv=100 * (number + 1))
            agent.write_pod(f"{node}-other", 7, namespace="shop")
        self.kube_dir = os.path.join(self.world.base_dir, "kube")
        os.makedirs(self.kube_dir)

    def kubeconfig(self, server):
        return write_kubeconfig(os.path.join(self.kube_dir, f"{server.port_number}.yaml"),
                                server.url)

    @defer.inlineCallbacks
    def kubectl(self, server, *args):
        """``kubectl <args> -o json`` against ``server``, parsed."""
        command = ["kubectl", "--kubeconfig", self.kubeconfig(server),
                   "--cache-dir", os.path.join(self.kube_dir, "cache"),
                   "--request-timeout", "15s", *args, "-o", "json"]
        out, err, code = yield getProcessOutputAndValue(
            command[0], command[1:], env=child_environment(without_etcd=True),
            reactor=reactor)
        if code != 0:
            raise AssertionError(f"{' '.join(command)} failed ({code}): {err!r}")
        return json.loads(out)

    @defer.inlineCallbacks
    def mirror_rvs(self, resource):
        """``{(namespace, name): mirrored resourceVersion}`` of one resource's objects."""
        prefix = f"{MIRROR_RV_PREFIX}{STORAGE_PREFIX}/{resource}/"
        entries = yield self.world.read_etcd_revisions(prefix, prefix=True)
        rvs = {}
        for key, (value, _revision) in entries.items():
            namespace, name = key[len(prefix):].split("/", 1)
            rvs[(namespace, name)] = int(value)
        return rvs

    @defer.inlineCallbacks
    def assert_served_as_stored(self, obj, key):
        """``obj``, as the coordinator served it, is the value of ``key`` in etcd at
        the revision it reports as its resourceVersion, and that revision is the
        key's mod revision."""
        revision = int(obj["metadata"]["resourceVersion"])
        entries = yield self.world.read_etcd_revisions(key, revision=revision)
        self.assertIn(key, entries, f"{key} not in the pool etcd at revision {revision}")
        value, mod_revision = entries[key]
        stored = json.loads(value)
        self.assertEqual(mod_revision, revision, key)
        self.assertEqual(stored["spec"], obj["spec"], key)
        self.assertEqual(without_version(stored)["metadata"], without_version(obj)["metadata"],
                         key)

    @defer.inlineCallbacks
    def test_kubectl_on_the_coordinator_serves_the_pool_etcd(self):
        world = self.world
        cloud, coordinator = world.servers()
        began = reactor.seconds()
        yield world.start_agents()
        statuses = yield world.wait_for_pool(
            "one leader among 3 agents, all following it, all ready",
            lambda s: one_leader_all_ready(s, len(NODES)), SETTLE_TIMEOUT)
        leader = leader_of(statuses)
        yield world.wait_pool_exact(STEP_TIMEOUT)
        print(f"SERVED-POOL settled and exact after {reactor.seconds() - began:.2f}s")

        # Endpointslices: exactly the cloud's, apart from the resourceVersion.
        cloud_slices = {identity(obj): obj for obj in
                        (yield self.kubectl(cloud, "get", "endpointslices", "-A"))["items"]}
        self.assertEqual(len(cloud_slices), 12)
        served = {}

        @defer.inlineCallbacks
        def slices_mirrored():
            listed = yield self.kubectl(coordinator, "get", "endpointslices", "-A")
            served.clear()
            served.update({identity(obj): obj for obj in listed["items"]})
            return set(served) == set(cloud_slices)

        try:
            yield poll_until(slices_mirrored, STEP_TIMEOUT, 0.5, reactor,
                             what="the cloud's endpointslices served by the coordinator")
        except PollTimeout as e:
            raise PollTimeout(f"{e}: served {sorted(served)}\n{world.log_tails()}") from None
        for key, obj in sorted(cloud_slices.items()):
            self.assertEqual(without_version(served[key]), without_version(obj), key)
        slice_rvs = yield self.mirror_rvs("endpointslices")
        self.assertEqual(slice_rvs, {key: int(obj["metadata"]["resourceVersion"])
                                     for key, obj in cloud_slices.items()})
        for (namespace, name), obj in sorted(served.items()):
            stored = yield self.world.read_etcd_revisions(
                f"{STORAGE_PREFIX}/endpointslices/{namespace}/{name}")
            (_value, mod_revision), = stored.values()
            self.assertEqual(int(obj["metadata"]["resourceVersion"]), mod_revision, name)

        # Pods: every agent's cached pods, as cached; their cache rv under the mirror keys.
        pods = (yield self.kubectl(coordinator, "get", "pods", "-A"))["items"]
        served_pods = {identity(obj): obj for obj in pods}
        expected = {}
        for agent in world.agents.values():
            for key, rv in agent.expected_pods.items():
                namespace, name = key[len(f"{STORAGE_PREFIX}/pods/"):].split("/", 1)
                expected[(namespace, name)] = rv
        self.assertEqual(len(expected), 5 * len(NODES))
        self.assertEqual(set(served_pods), set(expected))
        for (namespace, name), rv in sorted(expected.items()):
            self.assertEqual(without_version(served_pods[(namespace, name)]),
                             without_version(cached_pod(name, rv, namespace)), name)
        self.assertEqual((yield self.mirror_rvs("pods")), expected)

        # Leases written through the coordinator apiserver are keys of the pool etcd.
        election = yield self.kubectl(coordinator, "get", "lease", "-n", ELECTION_NAMESPACE,
                                      ELECTION_LEASE)
        self.assertEqual(election["spec"]["holderIdentity"], leader)
        yield self.assert_served_as_stored(
            election, f"{STORAGE_PREFIX}/leases/{ELECTION_NAMESPACE}/{ELECTION_LEASE}")
        self.assertEqual((yield world.election_holder()), leader)
        node_leases = {identity(obj)[1]: obj for obj in (yield self.kubectl(
            coordinator, "get", "leases", "-n", NODE_LEASE_NAMESPACE))["items"]}
        self.assertEqual(set(node_leases), set(NODES))
        for node, lease in sorted(node_leases.items()):
            self.assertEqual(lease["spec"]["holderIdentity"], node)
            yield self.assert_served_as_stored(
                lease, f"{STORAGE_PREFIX}/leases/{NODE_LEASE_NAMESPACE}/{node}")
            self.assertIsNotNone((yield world.coordinator_node_lease(node)), node)
        sync = yield self.kubectl(coordinator, "get", "lease", "-n",
                                  INFORMER_SYNC_LEASE_NAMESPACE, INFORMER_SYNC_LEASE_NAME)
        self.assertEqual(sync["spec"]["holderIdentity"], leader)
        yield self.assert_served_as_stored(
            sync, f"{STORAGE_PREFIX}/leases/{INFORMER_SYNC_LEASE_NAMESPACE}/"
                  f"{INFORMER_SYNC_LEASE_NAME}")
        # The other coordinator apiserver serves the same etcd.
        other = world.coordinators[1]
        for resource, listed in (("endpointslices", served), ("pods", served_pods)):
            again = yield self.kubectl(other, "get", resource, "-A")
            self.assertEqual({identity(obj): obj for obj in again["items"]}, listed, resource)
        # None of them is in the coordinator apiserver's memory: it has none.
        with self.assertRaises(AttributeError):
            coordinator.store
