"""Only the holder modules use private names of Twisted, treq or txaioetcd.

Each private use sits in one module (``yurtcoord.tx.twisted_private``,
``yurtcoord.etcd.txaioetcd_private``), whose canaries in the integration tier fail
with a message saying what changed when a release renames, removes or reshapes one of
the names. A private use anywhere else would have no canary, so a scan of every other
product module keeps such uses out.
"""

import ast
import os

from twisted.trial import unittest

from yurtcoord.testing.paths import REPO

ROOT = REPO
PRODUCT = os.path.join(ROOT, "yurtcoord")
# The one module per library allowed to touch its private names.
PRIVATE_HOLDERS = {
    "twisted": "yurtcoord/tx/twisted_private.py",
    "treq": None,
    "txaioetcd": "yurtcoord/etcd/txaioetcd_private.py",
}
NOT_SCANNED = ("test", "testing")


def _private_imports(path):
    """``module: name`` for each private name of twisted, treq or txaioetcd that the
    file at ``path`` imports or reaches through an imported module."""
    found = []
    bound = {}  # local name -> library
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())

    def library(module):
        root = module.split(".")[0]
        return root if root in PRIVATE_HOLDERS else None

    def private(part):
        return part.startswith("_") and not part.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if library(alias.name):
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(alias.name)
                    bound[(alias.asname or alias.name).split(".")[0]] = library(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and library(node.module):
            for alias in node.names:
                parts = node.module.split(".") + [alias.name]
                if any(private(p) for p in parts):
                    found.append(f"{node.module}: {alias.name}")
                bound[alias.asname or alias.name] = library(node.module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"{ast.unparse(node)}")
    return found


class NoPrivateNamesElsewhereTests(unittest.TestCase):
    def test_only_the_holder_modules_use_private_names(self):
        holders = {v for v in PRIVATE_HOLDERS.values() if v}
        offending = []
        for directory, _dirs, files in os.walk(PRODUCT):
            relative = os.path.relpath(directory, PRODUCT).split(os.sep)
            if relative[0] in NOT_SCANNED:
                continue
            for name in sorted(files):
                path = os.path.join(directory, name)
                where = os.path.relpath(path, ROOT)
                if name.endswith(".py") and where not in holders:
                    offending += [f"{where}: {use}" for use in _private_imports(path)]
        self.assertEqual(offending, [])

    def test_the_scan_sees_private_names(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("from twisted.web._newclient import ParseError\n"
                    "from twisted.web.client import _HTTP11ClientFactory\n"
                    "import txaioetcd\nx = txaioetcd.KeyValue._parse\n"
                    "from twisted.web import http\ny = http._ChunkedTransferDecoder\n"
                    "from treq.client import HTTPClient\n")
        self.assertEqual(_private_imports(path), [
            "twisted.web._newclient: ParseError", "twisted.web.client: _HTTP11ClientFactory",
            "txaioetcd.KeyValue._parse", "http._ChunkedTransferDecoder"])
