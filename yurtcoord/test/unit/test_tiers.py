"""Every test module belongs to exactly one tier (docs/testing.md).

The tiers are the packages ``unit``, ``integration`` and ``e2e`` of ``yurtcoord.test``;
trial runs a tier by its package name and pytest by its path, so a test module outside
them would run in no tier at all, and one that imports what starts processes or
servers from the unit tier would make that tier slow and timing-dependent.
"""

import ast
import os

from twisted.trial import unittest

TIERS = ("unit", "integration", "e2e")
TEST_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Test support that starts processes or serves sockets: never imported by a unit test
# (``world`` and ``partitions`` also hold the timings and the judges of a run, which
# unit tests share with the scenarios they stand in for; ``netns`` runs its commands
# through an injected runner, which unit tests replace).
NOT_IN_UNIT = (
    "yurtcoord.testing.partitionworld", "yurtcoord.testing.inprocess",
    "yurtcoord.testing.twistd", "yurtcoord.testing.chromium",
    "yurtcoord.testing.etcdstore",
    "yurtcoord.testing.sharedetcd",
    "subprocess",
)


def modules_below(root: str = TEST_ROOT) -> list:
    """Paths of every ``test_*.py`` below ``root``, relative to it."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found.extend(os.path.relpath(os.path.join(directory, name), root)
                     for name in sorted(files)
                     if name.startswith("test_") and name.endswith(".py"))
    return found


def tier_of(relative_path: str) -> str | None:
    """The tier a test module is in, or None where it is in none (or nested deeper)."""
    parts = relative_path.split(os.sep)
    return parts[0] if len(parts) == 2 and parts[0] in TIERS else None


def imported_modules(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


class TierTests(unittest.TestCase):

    def test_every_test_module_is_in_exactly_one_tier(self):
        modules = modules_below()
        self.assertGreater(len(modules), 50)
        self.assertEqual([path for path in modules if tier_of(path) is None], [])

    def test_every_tier_is_a_package_with_tests(self):
        for tier in TIERS:
            self.assertTrue(os.path.isfile(os.path.join(TEST_ROOT, tier, "__init__.py")), tier)
            self.assertTrue([path for path in modules_below() if tier_of(path) == tier], tier)

    def test_unit_modules_import_nothing_that_starts_processes_or_servers(self):
        offending = []
        for path in modules_below():
            if tier_of(path) != "unit":
                continue
            for module in sorted(imported_modules(os.path.join(TEST_ROOT, path))):
                if any(module == banned or module.startswith(banned + ".")
                       for banned in NOT_IN_UNIT):
                    offending.append((path, module))
        self.assertEqual(offending, [])

    def test_the_checks_see_misplaced_modules(self):
        """The rules above judge paths as trial and pytest see them."""
        self.assertEqual(tier_of(os.path.join("unit", "test_x.py")), "unit")
        self.assertIsNone(tier_of("test_x.py"))
        self.assertIsNone(tier_of(os.path.join("unit", "deeper", "test_x.py")))
        self.assertIsNone(tier_of(os.path.join("slow", "test_x.py")))
