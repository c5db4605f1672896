"""Pool store keys: kube-apiserver layout, special prefixes, name rules, mirror rv keys."""

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial import unittest

from yurtcoord.kube import gvr
from yurtcoord.pool.keys import (
    DIRECTORIES_KEPT, InvalidKey, KeyBuildInfo, PoolKeyBuilder, ResourceId, format_rv,
    mirror_rv_key, normalize_prefix, parse_rv,
)


def info(resource, name, namespace="", group="", version="v1", component="kubelet"):
    return KeyBuildInfo(component, resource, group, version, namespace, name)


class ObjectKeyTests(unittest.TestCase):
    def setUp(self):
        self.keys = PoolKeyBuilder("/registry")

    def test_namespaced_object(self):
        key = self.keys.object_key(info("pods", "nginx", "default"))
        self.assertEqual(key.path, "/registry/pods/default/nginx")
        self.assertEqual(key.component, "kubelet")
        self.assertEqual(key.resource, ResourceId("", "v1", "pods"))
        self.assertEqual(key.mirror_rv_path, "/mirror/rv/registry/pods/default/nginx")

    def test_cluster_scoped_object_has_no_namespace(self):
        self.assertEqual(self.keys.object_key(info("nodes", "edge-1")).path,
                         "/registry/minions/edge-1")

    def test_special_prefixes(self):
        cases = [
            (info("endpoints", "svc", "ns"), "/registry/services/endpoints/ns/svc"),
            (info("services", "svc", "ns"), "/registry/services/specs/ns/svc"),
            (info("replicationcontrollers", "rc", "ns"), "/registry/controllers/ns/rc"),
            (info("ingresses", "in", "ns", group="networking.k8s.io"), "/registry/ingress/ns/in"),
            (info("ingresses", "in", "ns", group="extensions", version="v1beta1"),
             "/registry/ingress/ns/in"),
            (info("podsecuritypolicies", "p", group="policy", version="v1beta1"),
             "/registry/podsecuritypolicy/p"),
            (info("endpointslices", "s", "ns", group="discovery.k8s.io"),
             "/registry/endpointslices/ns/s"),
            (info("leases", "l", "kube-system", group="coordination.k8s.io"),
             "/registry/leases/kube-system/l"),
        ]
        for build_info, expected in cases:
            self.assertEqual(self.keys.object_key(build_info).path, expected)

    def test_special_prefix_depends_on_group(self):
        # A CRD named "nodes" in another group is not kube-apiserver's minions.
        self.assertEqual(self.keys.object_key(info("nodes", "n", group="example.com")).path,
                         "/registry/nodes/n")

    def test_names_kubernetes_allows_are_kept(self):
        for name in ("system:node:edge-1", "a.b-c", "x%y", "a,b;c#d"):
            self.assertEqual(self.keys.object_key(info("clusterroles", name)).path,
                             f"/registry/clusterroles/{name}")

    def test_invalid_names_rejected(self):
        for name in ("", ".", "..", "a/b", "/"):
            self.assertRaises(InvalidKey, self.keys.object_key, info("pods", name, "default"))
        for namespace in (".", "..", "a/b"):
            self.assertRaises(InvalidKey, self.keys.object_key, info("pods", "p", namespace))

    def test_a_known_directory_still_checks_each_name(self):
        """A directory's path is kept once built; every name in it is still checked, and
        a bad namespace or component is never kept as a known directory."""
        first = self.keys.object_key(info("pods", "a", "default"))
        second = self.keys.object_key(info("pods", "b", "default"))
        self.assertEqual((first.path, second.path),
                         ("/registry/pods/default/a", "/registry/pods/default/b"))
        self.assertEqual((second.component, second.resource),
                         ("kubelet", ResourceId("", "v1", "pods")))
        for name in ("", ".", "..", "a/b", "\x00"):
            self.assertRaises(InvalidKey, self.keys.object_key, info("pods", name, "default"))
        for _ in range(2):
            self.assertRaises(InvalidKey, self.keys.object_key, info("pods", "p", "a/b"))
            self.assertRaises(InvalidKey, self.keys.object_key,
                              info("pods", "p", "default", component=""))
        # Same namespace, another component, version or group: another directory.
        other = self.keys.object_key(info("pods", "a", "default", version="v2", component="kp"))
        self.assertEqual((other.path, other.component, other.resource),
                         ("/registry/pods/default/a", "kp", ResourceId("", "v2", "pods")))
        ingress = self.keys.object_key(info("ingresses", "i", "default",
                                            group="networking.k8s.io"))
        self.assertEqual(ingress.path, "/registry/ingress/default/i")

    def test_directories_kept_are_bounded(self):
        for i in range(3 * DIRECTORIES_KEPT):
            key = self.keys.object_key(info("pods", "p", f"ns-{i}"))
            self.assertEqual(key.path, f"/registry/pods/ns-{i}/p")
            self.assertLessEqual(len(self.keys._directories), DIRECTORIES_KEPT)
        self.assertEqual(self.keys.object_key(info("pods", "q", "ns-0")).path,
                         "/registry/pods/ns-0/q")

    def test_empty_component_or_resource_rejected(self):
        self.assertRaises(InvalidKey, self.keys.object_key, info("pods", "p", component=""))
        self.assertRaises(InvalidKey, self.keys.object_key, info("", "p"))

    def test_prefix_normalized_like_apiserver(self):
        for prefix in ("/registry", "registry", "/registry/", "registry/"):
            self.assertEqual(PoolKeyBuilder(prefix).object_key(info("pods", "p", "n")).path,
                             "/registry/pods/n/p")
        self.assertEqual(normalize_prefix(""), "")
        self.assertEqual(PoolKeyBuilder("").object_key(info("pods", "p", "n")).path, "/pods/n/p")


class ListPrefixTests(unittest.TestCase):
    def setUp(self):
        self.keys = PoolKeyBuilder("/registry")

    def test_prefixes_end_with_slash(self):
        self.assertEqual(self.keys.list_prefix("", "pods"), "/registry/pods/")
        self.assertEqual(self.keys.list_prefix("", "pods", "default"), "/registry/pods/default/")
        self.assertEqual(self.keys.list_prefix("", "endpoints"), "/registry/services/endpoints/")

    def test_pods_prefix_does_not_match_podsecuritypolicy(self):
        pods = self.keys.list_prefix("", "pods")
        psp = self.keys.object_key(info("podsecuritypolicies", "p", group="policy")).path
        self.assertFalse(psp.startswith(pods))
        # The seed's prefix without the slash would have matched:
        self.assertTrue(psp.startswith(pods.rstrip("/")))

    def test_namespace_prefix_does_not_match_longer_namespace(self):
        default = self.keys.list_prefix("", "pods", "default")
        other = self.keys.object_key(info("pods", "p", "default-2")).path
        self.assertFalse(other.startswith(default))
        self.assertTrue(self.keys.object_key(info("pods", "p", "default")).path.startswith(default))

    def test_list_prefix_for_info(self):
        self.assertEqual(self.keys.list_prefix_for(info("pods", "", "kube-system")),
                         "/registry/pods/kube-system/")
        self.assertEqual(self.keys.list_prefix_for(info("nodes", "")), "/registry/minions/")


class ResourceVersionTests(unittest.TestCase):
    def test_padded_to_32_digits(self):
        self.assertEqual(format_rv(12345), "0" * 27 + "12345")
        self.assertEqual(len(format_rv(0)), 32)
        self.assertEqual(parse_rv(b"00000000000000000000000000012345"), 12345)

    def test_out_of_range_and_garbage(self):
        self.assertRaises(ValueError, format_rv, -1)
        self.assertRaises(ValueError, format_rv, 10 ** 32)
        for bad in ("", "abc", "-1", "1.5", "\u00b2"):
            self.assertRaises(ValueError, parse_rv, bad)

    @given(st.integers(min_value=0, max_value=10 ** 32 - 1),
           st.integers(min_value=0, max_value=10 ** 32 - 1))
    def test_byte_order_is_numeric_order(self, a, b):
        self.assertEqual(format_rv(a) < format_rv(b), a < b)
        self.assertEqual(parse_rv(format_rv(a)), a)

    def test_mirror_key(self):
        self.assertEqual(mirror_rv_key("/registry/minions/n"), "/mirror/rv/registry/minions/n")


class ResourceIdTests(unittest.TestCase):
    def test_of_ignores_scope(self):
        self.assertEqual(ResourceId.of(gvr.NODES), ResourceId("", "v1", "nodes"))
        self.assertEqual(ResourceId.of(("discovery.k8s.io", "v1", "endpointslices")),
                         ResourceId.of(gvr.ENDPOINTSLICES_V1))
        self.assertEqual(str(ResourceId.of(gvr.PODS)), "_v1_pods")
