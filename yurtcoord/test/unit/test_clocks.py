"""No decision compares a timestamp written by another machine with the local clock
(docs/design.md, "Clocks").

A scan of the product's code (``yurtcoord/`` without its tests and test support): in
each function, a comparison, sum, difference, ``max`` or ``min`` of a lease's
renewTime or acquireTime (or a local name derived from one) with a clock reading (or a
local name derived from one) is such a comparison. Each one found must be one of
``MIXING_ALLOWED``, the one place that only writes a time derived from both
(``max(now, remote + 1 µs)``), named in the "Clocks" section with its reason. A
place listed that no longer does so is reported too, so that the list stays true.
Remembering when a change was seen (a remote time compared with the last remote time,
the clock read to stamp the moment) is no comparison. The scan follows local names,
parameters named as a parsed remote time (``renewed``, ``..._renew_time``) and
parameters named ``now`` only: a remote time kept in an attribute and compared in another method escapes it,
which the tests of each place in the "Clocks" section cover.
"""

import ast
import os
import re

from twisted.trial import unittest

from yurtcoord.testing.paths import PRODUCT_PACKAGE, REPO

DESIGN = os.path.join(REPO, "docs", "design.md")
SKIPPED_DIRS = ("test", "testing")
# Calls and names that read a remote lease time.
REMOTE_TIME_CALLS = {"renew_time", "renew_time_of", "acquire_time", "parse_micro_time"}
REMOTE_TIME_ATTRIBUTES = {"renew_time", "acquire_time"}
REMOTE_TIME_KEYS = {"renewTime", "acquireTime"}
# Calls that read a clock: a reactor's or Clock's ``seconds()``, ``time.time()``,
# ``time.monotonic()``, ``datetime.now()``/``utcnow()``.
CLOCK_METHODS = {"seconds", "time", "monotonic", "now", "utcnow", "time_ns", "monotonic_ns"}

# (module, function) that read both a remote time and the local clock, and why that is
# no comparison of the two: each also listed in docs/design.md, "Clocks".
MIXING_ALLOWED = {
    ("yurtcoord/kube/lease.py", "stamped_renew_time"):
        "writes max(the writer's now, the lease's renewTime + 1 µs): the cloud's "
        "renewTime strictly increases whoever wrote last",
}


def product_modules():
    """(path relative to the repo, source) of every product module."""
    for directory, subdirs, files in os.walk(PRODUCT_PACKAGE):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS
                            and not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO), f.read()


def _called_name(call):
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_remote_read(node):
    if isinstance(node, ast.Call) and _called_name(node) in REMOTE_TIME_CALLS:
        return True
    if (isinstance(node, ast.Attribute) and node.attr in REMOTE_TIME_ATTRIBUTES
            and isinstance(node.ctx, ast.Load)):
        return True
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
        and node.slice.value in REMOTE_TIME_KEYS and isinstance(node.ctx, ast.Load) \
        or (isinstance(node, ast.Call) and _called_name(node) == "get" and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in REMOTE_TIME_KEYS)


def _is_clock_read(node):
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLOCK_METHODS and not node.args)


def _mentions(node, direct, names):
    return any(direct(child) or (isinstance(child, ast.Name) and child.id in names)
               for child in ast.walk(node))


def _targets(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _targets(element)


# Parameters that hold a parsed remote time by the code's naming: ``renewed``,
# ``cloud_renew_time``, ``acquired``...
REMOTE_TIME_PARAMETER = re.compile(r"(^|_)(renewed|renew_time|acquired|acquire_time)$")


def _remote_parameters(function):
    arguments = function.args
    return {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            if REMOTE_TIME_PARAMETER.search(a.arg)}


def _clock_parameters(function):
    """Parameters named ``now``: a clock reading, by the code's naming."""
    arguments = function.args
    return {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            if a.arg == "now"}


def _tainted(function, direct, names=()):
    """Local names whose value derives from what ``direct`` recognises, or from
    ``names``."""
    names = set(names)
    while True:
        before = len(names)
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and _mentions(node.value, direct, names):
                for target in node.targets:
                    names.update(_targets(target))
            elif (isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr))
                  and node.value is not None and _mentions(node.value, direct, names)):
                names.update(_targets(node.target))
        if len(names) == before:
            return names


def compares_remote_with_clock(function):
    """Whether ``function`` compares, subtracts, adds or takes max/min of a remote
    lease time (or a local name derived from one) and a clock reading (or a local
    name derived from one)."""
    remote = _tainted(function, _is_remote_read, _remote_parameters(function))
    clock = _tainted(function, _is_clock_read, _clock_parameters(function))
    for node in ast.walk(function):
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Add)):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and _called_name(node) in ("max", "min"):
            operands = list(node.args)
        else:
            continue
        if (any(_mentions(o, _is_remote_read, remote) for o in operands)
                and any(_mentions(o, _is_clock_read, clock) for o in operands)):
            return True
    return False


def mixing_functions(source):
    """Names of the functions of ``source`` that compare a remote time with a clock."""
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and compares_remote_with_clock(node)]


class ClockScanTests(unittest.TestCase):

    def test_no_function_compares_a_remote_time_with_the_local_clock(self):
        found = {(path, name) for path, source in product_modules()
                 for name in mixing_functions(source)}
        unexpected = sorted(found - set(MIXING_ALLOWED))
        self.assertEqual(unexpected, [], "these read a lease's renewTime/acquireTime and "
                                         "a clock in one function: a comparison of a "
                                         "remote time with the local clock")
        stale = sorted(set(MIXING_ALLOWED) - found)
        self.assertEqual(stale, [], "listed as mixing, but no longer read both")

    def test_the_places_allowed_are_named_in_the_clocks_section(self):
        with open(DESIGN, encoding="utf-8") as f:
            design = f.read()
        match = re.search(r"^## Clocks\n(.*?)(?=^## |\Z)", design, re.S | re.M)
        self.assertIsNotNone(match, "docs/design.md has no \"Clocks\" section")
        section = match.group(1)
        for path, name in MIXING_ALLOWED:
            self.assertIn(f"`{name}`", section, f"{path}: {name}")


class ScannerTests(unittest.TestCase):
    """The scan finds what it is for, so that the test above can fail."""

    def test_a_freshness_decision_on_a_remote_renewtime_is_found(self):
        source = ("def fresh(self, lease):\n"
                  "    return renew_time(lease) + 40 > self.reactor.seconds()\n")
        self.assertEqual(mixing_functions(source), ["fresh"])

    def test_reading_the_spec_key_and_time_is_found(self):
        source = ("import time\n"
                  "def age(lease):\n"
                  "    return time.time() - parse(lease['spec']['renewTime'])\n")
        self.assertEqual(mixing_functions(source), ["age"])

    def test_writing_a_renewtime_from_the_clock_is_no_comparison(self):
        source = ("def renewed(self, spec):\n"
                  "    spec['renewTime'] = format_micro_time(self.clock.seconds())\n")
        self.assertEqual(mixing_functions(source), [])

    def test_remembering_when_a_change_was_seen_is_no_comparison(self):
        source = ("def seen(self, lease):\n"
                  "    renewed = renew_time(lease)\n"
                  "    if renewed != self.last:\n"
                  "        self.last, self.changed_at = renewed, self.clock.seconds()\n"
                  "    return self.clock.seconds() - self.changed_at < 40\n")
        self.assertEqual(mixing_functions(source), [])

    def test_a_name_derived_from_a_remote_time_is_followed(self):
        source = ("def stale(self, lease):\n"
                  "    renewed = renew_time(lease)\n"
                  "    deadline = renewed + 40\n"
                  "    now = self.reactor.seconds()\n"
                  "    return deadline <= now\n")
        self.assertEqual(mixing_functions(source), ["stale"])

    def test_a_parameter_named_as_a_parsed_renewtime_is_followed(self):
        source = ("def too_old(self, lease, renewed):\n"
                  "    return self._reactor.seconds() - renewed > 40\n")
        self.assertEqual(mixing_functions(source), ["too_old"])

    def test_a_parameter_named_now_is_a_clock_reading(self):
        source = ("def fresh(lease, now):\n"
                  "    return renew_time(lease) > now - 40\n")
        self.assertEqual(mixing_functions(source), ["fresh"])

    def test_max_of_now_and_the_cloud_time_is_found(self):
        source = ("def stamp(self, current):\n"
                  "    return max(self.clock.seconds(), renew_time(current) + 1e-6)\n")
        self.assertEqual(mixing_functions(source), ["stamp"])
