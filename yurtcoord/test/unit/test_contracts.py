"""The contracts between the agent's parts: every implementation, real or fake,
provides the interface it stands for, and product code calls its collaborators'
members instead of probing for them."""

import ast
import os

from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface.verify import verifyClass, verifyObject

from yurtcoord.heartbeat.interfaces import (
    ICloudHealthChecker, ICoordinatorHealthChecker, IHealthChecker,
)
from yurtcoord.heartbeat.probes import CloudHealthChecker, CoordinatorHealthChecker
from yurtcoord.kube.client import KubeClient
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.resolving import PickedServerClient
from yurtcoord.kube.interfaces import IInformer, IListWatchClient, IObjectClient
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.store import PoolStore
from yurtcoord.testing.fakehealth import FakeHealth
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakekube import FakeKube
from yurtcoord.testing.fakepoolstore import FakePoolStore
from yurtcoord.testing.paths import PRODUCT_PACKAGE

NOT_PRODUCT = ("test", "testing")

# Attributes product code may look up with a default because the object is not a
# collaborator with a contract but a value whose type legitimately varies.
# (module under yurtcoord/, attribute) -> why.
OPTIONAL_ATTRIBUTES = {
    ("agent/metrics.py", "CONTENT_TYPE_PLAIN_0_0_4"):
        "a module of prometheus-client: older releases lack the constant",
    ("kube/watch.py", "maxChunkSizeLineLength"):
        "a module of Twisted: releases differ in the chunk size line limit",
    ("etcd/client.py", "socket"):
        "a pooled connection's transport: only TCP transports have a socket to peek at",
    ("etcd/client.py", "reasons"):
        "a Failure's value: only ResponseFailed and its kin carry a list of reasons",
    ("agent/status.py", "disconnecting"):
        "a connection's transport: only file descriptor transports say they are closing",
    ("agent/status.py", "host"):
        "a peer's address: only IP addresses have a host (a UNIX socket's has none)",
    ("kube/client.py", "reasons"):
        "a Failure's value: only ResponseFailed and its kin carry a list of reasons",
    ("kube/watch.py", "reasons"):
        "a Failure's value: only ResponseFailed and its kin carry a list of reasons",
    **{(module, name):
       "Twisted's HTTP client objects under a watch response: when one is not as "
       "expected the watch body is delivered per chunk instead of batched"
       for module in ("kube/watch.py", "tx/twisted_private.py")
       for name in ("_ChunkedTransferDecoder", "original", "_transport", "_producer",
                    "wrappedProtocol", "protocol", "_wrappedProtocol", "_parser",
                    "bodyDecoder", "response", "state", "dataCallback", "_buffer")},
}


def probes(tree):
    """(line, attribute) of every ``getattr(x, "name", default)`` and ``hasattr(x, "name")``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        args = node.args
        named = (len(args) >= 2 and isinstance(args[1], ast.Constant)
                 and isinstance(args[1].value, str))
        if not named:
            continue
        if node.func.id == "getattr" and len(args) == 3:
            found.append((node.lineno, args[1].value))
        elif node.func.id == "hasattr" and len(args) == 2:
            found.append((node.lineno, args[1].value))
    return found


def product_probes():
    """{(module, attribute): [lines]} over the product packages."""
    found = {}
    for directory, _dirs, files in os.walk(PRODUCT_PACKAGE):
        relative = os.path.relpath(directory, PRODUCT_PACKAGE)
        if relative.split(os.sep)[0] in NOT_PRODUCT:
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = os.path.normpath(os.path.join(relative, name)).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for line, attribute in probes(tree):
                found.setdefault((module, attribute), []).append(line)
    return found


class NoProbingTests(unittest.TestCase):
    def test_product_code_does_not_probe_collaborators_for_members(self):
        unexplained = {site: lines for site, lines in product_probes().items()
                       if site not in OPTIONAL_ATTRIBUTES}
        self.assertEqual(unexplained, {})

    def test_the_scan_finds_both_shapes_of_probing(self):
        tree = ast.parse('getattr(self.informer, "lists", None)\n'
                         'hasattr(cloud, "add_listener")\n'
                         'getattr(cloud, "decided", True)\n'
                         'getattr(status, "version")\n'
                         'getattr(counts, name, None)\n')
        self.assertEqual(probes(tree), [(1, "lists"), (2, "add_listener"), (3, "decided")])

    def test_every_listed_exception_gives_a_reason(self):
        for site, reason in OPTIONAL_ATTRIBUTES.items():
            self.assertTrue(reason.strip(), site)


class TestSupportTests(unittest.TestCase):
    def test_no_test_module_imports_another(self):
        """What tests share lives in yurtcoord.testing, not in a test module of any tier."""
        tests = os.path.join(PRODUCT_PACKAGE, "test")
        offending = []
        for directory, _dirs, files in sorted(os.walk(tests)):
            for name in sorted(files):
                if not (name.startswith("test_") and name.endswith(".py")):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    modules = []
                    if isinstance(node, ast.ImportFrom):
                        if node.level:  # a relative import reaches a sibling test module
                            modules = ["yurtcoord.test.test_"]
                        elif node.module:
                            modules = [node.module] + [f"{node.module}.{a.name}"
                                                       for a in node.names]
                    elif isinstance(node, ast.Import):
                        modules = [a.name for a in node.names]
                    if any(m.startswith("yurtcoord.test.") and ".test_" in m for m in modules):
                        offending.append((os.path.relpath(path, tests), node.lineno))
        self.assertEqual(offending, [])


class RealImplementationTests(unittest.TestCase):
    """The real parts declare the contracts their consumers rely on."""

    def test_declared_interfaces_hold(self):
        for interface, cls in ((IObjectClient, KubeClient), (IListWatchClient, KubeClient),
                               (IInformer, Informer), (IPoolStore, PoolStore),
                               (ICloudHealthChecker, CloudHealthChecker),
                               (ICoordinatorHealthChecker, CoordinatorHealthChecker),
                               (IObjectClient, PickedServerClient),
                               (IListWatchClient, PickedServerClient)):
            self.assertTrue(verifyClass(interface, cls), (interface, cls))


class FakeImplementationTests(unittest.TestCase):
    """One fake per contract, each a full implementation of it."""

    def test_fake_informer(self):
        self.assertTrue(verifyObject(IInformer, FakeInformer()))
        made = []
        informer = FakeInformer.factory(made)(Clock(), object(), None)
        self.assertTrue(verifyObject(IInformer, informer))
        self.assertEqual(made, [informer])

    def test_fake_informer_keys_objects_as_the_informer_does(self):
        # ``get`` takes the key the real informer holds an object under.
        informer = FakeInformer()
        node = {"metadata": {"name": "node-a"}}
        lease = {"metadata": {"name": "node-a", "namespace": "kube-node-lease"}}
        informer.end_list([node, lease])
        self.assertEqual((informer.get("node-a"), informer.get("kube-node-lease/node-a")),
                         (node, lease))

    def test_fake_object_client_is_the_fake_lease_api(self):
        self.assertTrue(verifyObject(IObjectClient, FakeKube()))

    def test_fake_pool_store(self):
        self.assertTrue(verifyObject(IPoolStore, FakePoolStore()))

    def test_fake_health_checker(self):
        self.assertTrue(verifyObject(ICloudHealthChecker, FakeHealth()))
        self.assertTrue(verifyObject(IHealthChecker, FakeHealth()))
