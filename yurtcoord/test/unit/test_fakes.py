"""Every fake in the tests is checked: a class of ``yurtcoord/test`` or
``yurtcoord/testing`` named ``Fake*``, ``Recording*``, ``Scripted*`` or ``Stub*`` (the
names the tests give what stands in for a product collaborator) is checked with
``verifyObject`` in a test, which fails unless the fake declares the interface it is
checked against and has all of it.

The check is read from the source: a fake of a test module must be checked in that
module, one of ``yurtcoord/testing`` in some test module; ``verifyObject(I, x)``
counts for a fake when ``x`` names the fake (``FakeX(...)``) or is a name the module
assigns a new fake to (``self.x = FakeX(...)``).
"""

import ast
import os
import re

from twisted.internet.task import Clock
from twisted.trial import unittest
from twisted.web.resource import IResource
from zope.interface.verify import verifyClass, verifyObject

from yurtcoord.etcd.client import EtcdClient
from yurtcoord.etcd.interfaces import IEtcdKeyValue
from yurtcoord.kube.client import KubeClient, Watch
from yurtcoord.kube.interfaces import IAPIRequests, IObjectClient, IWatch
from yurtcoord.testing.discovery import ScriptedDiscovery
from yurtcoord.testing.etcdgateway import ScriptedGateway
from yurtcoord.testing.fakekube import FakeKube, FakeKubeServer
from yurtcoord.testing.fakelink import FakeLink
from yurtcoord.testing.paths import REPO

FAKE_NAME = re.compile(r"^(Fake|Recording|Scripted|Stub)[A-Z]\w*$")
TREES = ("yurtcoord/test", "yurtcoord/testing")

def modules():
    """``{path relative to the repository: parsed module}`` of both trees."""
    parsed = {}
    for tree in TREES:
        for directory, _dirs, files in sorted(os.walk(os.path.join(REPO, tree))):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as handle:
                        parsed[os.path.relpath(path, REPO)] = ast.parse(handle.read(), path)
    return parsed


def is_test_case(node):
    """A test case or a mixin of test cases, not a fake."""
    return node.name.endswith(("Tests", "Mixin", "TestCase")) or any(
        "TestCase" in ast.unparse(base) for base in node.bases)


def fakes(module):
    """``[(line, class name)]`` of the fakes a module defines (nested ones too)."""
    return [(node.lineno, node.name) for node in ast.walk(module)
            if isinstance(node, ast.ClassDef) and FAKE_NAME.match(node.name)
            and not is_test_case(node)]


def names_in(expression):
    return {node.id for node in ast.walk(expression) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(expression) if isinstance(node, ast.Attribute)}


def checked(module):
    """The fake class names ``verifyObject`` checks somewhere in ``module``, within a
    function (a test, or the ``setUp`` of every test)."""
    made = {}  # target text -> the class names its value is made by
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            makers = names_in(node.value.func)
            for target in node.targets:
                made.setdefault(ast.unparse(target), set()).update(makers)
    seen = set()
    for function in ast.walk(module):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for call in ast.walk(function):
            if (isinstance(call, ast.Call) and ast.unparse(call.func).endswith("verifyObject")
                    and len(call.args) == 2):
                checked_object = call.args[1]
                seen |= names_in(checked_object)
                seen |= made.get(ast.unparse(checked_object), set())
    return seen


class FakesAreCheckedTests(unittest.TestCase):
    def test_every_fake_is_checked_against_its_interface_with_verifyObject(self):
        parsed = modules()
        checked_in = {path: checked(module) for path, module in parsed.items()}
        anywhere = set().union(*(names for path, names in checked_in.items()
                                 if path.startswith("yurtcoord/test/")))
        unchecked = []
        for path, module in sorted(parsed.items()):
            for line, name in fakes(module):
                where = anywhere if path.startswith("yurtcoord/testing/") else checked_in[path]
                if name not in where:
                    unchecked.append(f"{path}:{line} {name}")
        self.assertEqual(unchecked, [])

    def test_the_scan_finds_fakes_and_their_checks(self):
        module = ast.parse(
            "class FakeA:\n    pass\n"
            "class FakeB:\n    pass\n"
            "class RecordingC:\n    pass\n"
            "class FakeTests(TestCase):\n    pass\n"
            "class Recorder:\n    pass\n"
            "def test_it(self):\n"
            "    self.b = FakeB()\n"
            "    verifyObject(IA, FakeA(1))\n"
            "    verifyObject(IB, self.b)\n"
            "verifyObject(IC, RecordingC())\n")
        self.assertEqual([name for _line, name in fakes(module)],
                         ["FakeA", "FakeB", "RecordingC"])
        # RecordingC is checked outside any function: that is never run as a test.
        self.assertEqual(checked(module) & {"FakeA", "FakeB", "RecordingC"},
                         {"FakeA", "FakeB"})


class SharedFakesTests(unittest.TestCase):
    """The fakes of ``yurtcoord.testing`` that no other test module checks."""

    def test_each_provides_its_interface(self):
        server = FakeKubeServer(FakeKube(), "https://coordinator-a")
        self.assertTrue(verifyObject(IObjectClient, server))
        self.assertTrue(verifyObject(IObjectClient, FakeLink(Clock(), server, "edge-1")))
        self.assertTrue(verifyObject(IAPIRequests, ScriptedDiscovery({})))
        self.assertTrue(verifyObject(IResource, ScriptedGateway({})))

    def test_the_real_clients_fit_the_interfaces_their_fakes_provide(self):
        # Not declared by the clients themselves: their methods fit.
        self.assertTrue(verifyClass(IEtcdKeyValue, EtcdClient, tentative=True))
        self.assertTrue(verifyClass(IAPIRequests, KubeClient, tentative=True))
        self.assertTrue(verifyClass(IWatch, Watch, tentative=True))
