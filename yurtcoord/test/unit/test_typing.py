"""Every public function and method of yurtcoord carries type annotations, and the
mypy configuration that checks them stays strict.

mypy (run by ``.ci/run``) checks the bodies; this test asks for the annotations
themselves: a public function (its name does not start with ``_``) annotates each
parameter but ``self`` and ``cls``, and its return. The modules named in ``setup.cfg``'s
"not yet annotated" section are left out of both until they leave that list.
"""

import ast
import configparser
import os

from twisted.trial import unittest
from yurtcoord.testing.paths import REPO

ROOT = REPO
PACKAGE = os.path.join(ROOT, "yurtcoord")
SETUP_CFG = os.path.join(ROOT, "setup.cfg")

# The flags the whole package is checked with; mypy's own defaults do not check the
# bodies of unannotated functions nor half-annotated signatures.
REQUIRED_FLAGS = ("check_untyped_defs", "disallow_incomplete_defs", "no_implicit_optional",
                  "warn_redundant_casts", "warn_unused_ignores", "strict_equality")


def mypy_config():
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG, encoding="utf-8")
    return parser


def not_yet_annotated(parser):
    """The modules of the section that silences mypy's errors for yurtcoord modules."""
    modules = []
    for section in parser.sections():
        if not section.startswith("mypy-"):
            continue
        names = section[len("mypy-"):].split(",")
        if parser.getboolean(section, "ignore_errors", fallback=False):
            modules.extend(name.strip() for name in names)
    return modules


def product_modules():
    """``{dotted module name: path}`` of yurtcoord, the tests excepted."""
    modules = {}
    for directory, dirs, files in os.walk(PACKAGE):
        relative = os.path.relpath(directory, ROOT)
        if relative.split(os.sep)[:2] == ["yurtcoord", "test"]:
            dirs[:] = []
            continue
        for name in files:
            if name.endswith(".py"):
                parts = relative.split(os.sep)
                if name != "__init__.py":
                    parts.append(name[:-3])
                modules[".".join(parts)] = os.path.join(directory, name)
    return modules


def unannotated(source):
    """``["Class.method: x, return", ...]`` for the public functions of ``source`` that
    lack an annotation. Functions nested in functions are not public."""
    found = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_"):
                    continue
                positional = node.args.posonlyargs + node.args.args
                if prefix and positional and positional[0].arg in ("self", "cls"):
                    positional = positional[1:]
                params = positional + node.args.kwonlyargs
                params += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
                missing = [a.arg for a in params if a.annotation is None]
                if node.returns is None:
                    missing.append("return")
                if missing:
                    found.append(f"{prefix}{node.name}: {', '.join(missing)}")

    visit(ast.parse(source).body, "")
    return found


class AnnotationTests(unittest.TestCase):
    def test_public_functions_are_annotated(self):
        skipped = set(not_yet_annotated(mypy_config()))
        missing = []
        for module, path in sorted(product_modules().items()):
            if module in skipped:
                continue
            with open(path, encoding="utf-8") as handle:
                missing.extend(f"{module}.{entry}" for entry in unannotated(handle.read()))
        self.assertEqual(missing, [])

    def test_the_not_yet_annotated_list_names_existing_modules(self):
        self.assertEqual(
            [m for m in not_yet_annotated(mypy_config()) if m not in product_modules()], [])

    def test_the_scan_sees_a_missing_annotation(self):
        source = (
            "def f(a: int, b) -> None: ...\n"
            "def g(a: int) : ...\n"
            "def _private(a): ...\n"
            "class C:\n"
            "    def m(self, x: int, *args, **kw: str) -> int: ...\n"
            "    @classmethod\n"
            "    def k(cls) -> None: ...\n"
            "    def n(self, *, y: int = 0) -> None:\n"
            "        def inner(z): ...\n"
        )
        self.assertEqual(unannotated(source), ["f: b", "g: return", "C.m: args"])


class MypyConfigTests(unittest.TestCase):
    def test_the_package_is_checked_strictly(self):
        parser = mypy_config()
        self.assertEqual(parser.get("mypy", "files").strip(), "yurtcoord")
        for flag in REQUIRED_FLAGS:
            self.assertTrue(parser.getboolean("mypy", flag, fallback=False), flag)

    def test_missing_imports_are_ignored_only_per_third_party_package(self):
        parser = mypy_config()
        self.assertFalse(parser.has_option("mypy", "ignore_missing_imports"))
        lenient = [s for s in parser.sections()
                   if s.startswith("mypy-") and parser.has_option(s, "ignore_missing_imports")]
        self.assertEqual([s for s in lenient if "yurtcoord" in s], [])

    def test_only_the_not_yet_annotated_list_silences_errors(self):
        parser = mypy_config()
        silencing = [s for s in parser.sections()
                     if parser.getboolean(s, "ignore_errors", fallback=False)]
        # One section a module, each naming exactly that module.
        self.assertEqual([s for s in silencing if "," in s or "*" in s], [])
        self.assertEqual([m for m in not_yet_annotated(parser)
                          if not m.startswith("yurtcoord.")], [])
