"""The product's shape, kept true by reading its source: the packages depend on each
other in one direction, one implementation of each mechanism lives where
docs/design.md says ("One of each"), and a module longer than the house's measure
says why at its top."""

import ast
import os
import re
import unittest

from yurtcoord.testing.paths import REPO

PRODUCT = os.path.join(REPO, "yurtcoord")
# Packages that hold no product code.
NOT_PRODUCT = ("test", "testing", "sim")
# The product's packages from the bottom up: each may import only those before it.
LAYERS = ("tx", "monitoring", "kube", "etcd", "pool", "heartbeat", "role", "agent")
# Lines above which a module says at its top why it is one module.
LONG_MODULE_LINES = 600
# What a list of callbacks to tell is called (a queue of work to run is another thing).
OBSERVERS_NAME = re.compile(r"observer|listener|callbacks|subscriber|watchers", re.IGNORECASE)
LONG_MODULE_REASON = re.compile(r"Longer than \d+ lines on purpose:")


def product_modules():
    """(package, path) of every product module."""
    for directory, _dirs, files in os.walk(PRODUCT):
        relative = os.path.relpath(directory, PRODUCT).split(os.sep)
        if relative[0] in NOT_PRODUCT or relative[0] == "." or "__pycache__" in relative:
            continue
        for name in sorted(files):
            if name.endswith(".py"):
                yield relative[0], os.path.join(directory, name)


def shipped_modules():
    """Every module of the package but the tests: the product, the sandbox and the
    test support."""
    for directory, _dirs, files in os.walk(PRODUCT):
        relative = os.path.relpath(directory, PRODUCT).split(os.sep)
        if relative[0] == "test" or "__pycache__" in relative:
            continue
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def imported_modules(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


def parse(path):
    with open(path, encoding="utf-8") as source:
        return ast.parse(source.read(), path)


class PackageDependencyTests(unittest.TestCase):

    def test_every_product_package_has_its_layer(self):
        packages = {package for package, _path in product_modules()}
        self.assertEqual(sorted(packages - set(LAYERS)), [])

    def test_packages_import_only_the_layers_below_them(self):
        upward = []
        for package, path in product_modules():
            allowed = LAYERS[:LAYERS.index(package) + 1]
            for module in imported_modules(parse(path)):
                parts = module.split(".")
                if parts[0] != "yurtcoord" or len(parts) < 2 or parts[1] == "names":
                    continue
                if parts[1] not in allowed:
                    upward.append(f"{os.path.relpath(path, REPO)} imports {module}")
        self.assertEqual(upward, [])

    def test_only_etcd_speaks_to_txaioetcd(self):
        outside = [f"{os.path.relpath(path, REPO)} imports {module}"
                   for package, path in product_modules() if package != "etcd"
                   for module in imported_modules(parse(path))
                   if module.split(".")[0] == "txaioetcd"]
        self.assertEqual(outside, [])


class OneOfEachTests(unittest.TestCase):
    """What docs/design.md's "One of each" says can be read from the source."""

    def test_no_state_table_module_is_left(self):
        self.assertFalse(os.path.exists(os.path.join(PRODUCT, "tx", "fsm.py")))
        users = [os.path.relpath(path, REPO) for _package, path in product_modules()
                 if "yurtcoord.tx.fsm" in set(imported_modules(parse(path)))]
        self.assertEqual(users, [])

    def test_only_the_cadence_runs_a_loop_on_the_clock(self):
        looping = sorted({os.path.relpath(path, REPO) for _package, path in product_modules()
                          if not path.endswith(os.path.join("tx", "cadence.py"))
                          for node in ast.walk(parse(path))
                          if (isinstance(node, ast.Name) and node.id == "LoopingCall")
                          or (isinstance(node, ast.Attribute) and node.attr == "LoopingCall")})
        self.assertEqual(looping, [])

    def test_only_observers_keeps_a_list_of_callbacks(self):
        keeping = []
        for _package, path in product_modules():
            if path.endswith(os.path.join("tx", "observers.py")):
                continue
            for node in ast.walk(parse(path)):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.attr for t in targets if isinstance(t, ast.Attribute)]
                if any(OBSERVERS_NAME.search(name) for name in names) and isinstance(
                        node.value, (ast.List, ast.Set, ast.Dict)):
                    keeping.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
        self.assertEqual(keeping, [])


class ModuleLengthTests(unittest.TestCase):

    def test_a_long_module_says_why_it_is_one(self):
        unexplained = []
        for path in shipped_modules():
            with open(path, encoding="utf-8") as source:
                text = source.read()
            lines = text.count("\n")
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if lines > LONG_MODULE_LINES and not LONG_MODULE_REASON.search(docstring):
                unexplained.append(f"{os.path.relpath(path, REPO)} ({lines} lines)")
        self.assertEqual(unexplained, [])
