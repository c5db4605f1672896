"""The operator documentation agrees with the code it describes.

The configuration reference (``docs/configuration.md``) is compared with
``yurtcoord.agent.config.SCHEMA``, the metrics table of the README with a live
``yurtcoord.agent.metrics.Metrics`` registry, the HTTP section with the status site's pages
and ``/status`` fields, and every log line the runbook quotes with the log calls of
the product code. A key, metric, page or log message renamed in the code without the
docs following makes a test here fail.

``.venv/bin/python -m yurtcoord.test.unit.test_docs`` prints the configuration tables and
the metrics table as the docs should hold them.
"""

import ast
import os
import re
import sys

from prometheus_client.metrics import MetricWrapperBase
from twisted.trial import unittest

from yurtcoord.agent.config import SCHEMA, SECTIONS, ConfigError, parse_config, parse_duration
from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.statuspages import status_resource
from yurtcoord.agent.statussources import InitialStatus, NoPoolView
from yurtcoord.pool.uploader import SKIP_REASONS
from yurtcoord.testing.paths import REPO

ROOT = REPO
README = os.path.join(ROOT, "README.md")
CONFIGURATION = os.path.join(ROOT, "docs", "configuration.md")
RUNBOOK = os.path.join(ROOT, "docs", "runbook.md")
PLUGIN = os.path.join(ROOT, "twisted", "plugins", "yurtcoord_plugin.py")
PRODUCT_PACKAGE = os.path.join(ROOT, "yurtcoord")
NOT_PRODUCT = ("test", "testing")

LOG_LEVELS = frozenset({"debug", "info", "warn", "error", "critical", "failure"})


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def section_of(markdown, heading):
    """The text under the level-2 ``heading`` up to the next level-2 heading."""
    match = re.search(rf"^## {re.escape(heading)}[ \t]*$", markdown, re.MULTILINE)
    if match is None:
        raise AssertionError(f"no section '## {heading}'")
    rest = markdown[match.end():]
    following = re.search(r"^## ", rest, re.MULTILINE)
    return rest[:following.start()] if following else rest


def table_rows(text):
    """Cells of every markdown table row in ``text``, header and rule rows excluded."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = [cell.strip() for cell in line[1:-1].split("|")]
        if all(set(cell) <= set("-: ") for cell in cells):
            continue
        rows.append(cells)
    return rows


def code(text):
    """``text`` → the inside of a single code span, or None."""
    match = re.fullmatch(r"`([^`]+)`", text)
    return match.group(1) if match else None


# ---------------------------------------------------------------------------------------
# Configuration reference.

def default_cell(key):
    """How the reference shows a key's default (the conventions of describe_schema)."""
    if key.required:
        return "(required)"
    if not key.default:
        return "(empty)"
    return f"`{key.default}`"


def render_configuration_tables():
    """The reference tables, one per section, as docs/configuration.md holds them."""
    blocks = []
    for section in SECTIONS:
        lines = [f"### `[{section}]`", "", "| key | type | default | meaning |",
                 "|---|---|---|---|"]
        for key in SCHEMA:
            if key.section == section:
                lines.append(f"| `{key.name}` | {key.type.name} | {default_cell(key)} "
                             f"| {key.help} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def documented_keys(markdown):
    """``{(section, key): (type, default cell, meaning)}`` from the reference's tables,
    each table belonging to the ``### `[section]` `` heading above it."""
    documented = {}
    section = None
    for line in markdown.splitlines():
        heading = re.fullmatch(r"###\s+`\[([a-z_]+)\]`\s*", line)
        if heading:
            section = heading.group(1)
            continue
        if line.startswith("#"):
            section = None
            continue
        rows = table_rows(line)
        if section is None or not rows or len(rows[0]) != 4:
            continue
        name = code(rows[0][0])
        if name is None:
            continue
        if (section, name) in documented:
            raise AssertionError(f"[{section}] {name} documented twice")
        documented[(section, name)] = tuple(rows[0][1:])
    return documented


def configuration_problems(markdown):
    """Every disagreement between the reference and SCHEMA, as readable lines."""
    documented = documented_keys(markdown)
    problems = []
    for key in SCHEMA:
        where = f"[{key.section}] {key.name}"
        row = documented.pop((key.section, key.name), None)
        if row is None:
            problems.append(f"{where} is missing")
            continue
        type_name, default, meaning = row
        if type_name != key.type.name:
            problems.append(f"{where}: type {type_name!r}, the schema says {key.type.name!r}")
        if default != default_cell(key):
            problems.append(f"{where}: default {default!r}, the schema says "
                            f"{default_cell(key)!r}")
        if meaning != key.help:
            problems.append(f"{where}: meaning {meaning!r}, the schema says {key.help!r}")
    for section, name in sorted(documented):
        problems.append(f"[{section}] {name} is documented but not in the schema")
    return problems


class ConfigurationReferenceTests(unittest.TestCase):

    def setUp(self):
        self.reference = read(CONFIGURATION)

    def test_every_schema_key_is_documented_with_its_type_default_and_meaning(self):
        self.assertEqual(configuration_problems(self.reference), [],
                         "regenerate with: .venv/bin/python -m yurtcoord.test.unit.test_docs")

    def test_sections_are_documented_in_schema_order(self):
        headings = re.findall(r"^###\s+`\[([a-z_]+)\]`", self.reference, re.MULTILINE)
        self.assertEqual(headings, list(SECTIONS))

    def test_a_missing_key_is_reported(self):
        doctored = self.reference.replace("| `retry_period` |", "| `retry_periods` |")
        self.assertNotEqual(doctored, self.reference)
        problems = configuration_problems(doctored)
        self.assertIn("[leader_election] retry_period is missing", problems)
        self.assertIn("[leader_election] retry_periods is documented but not in the schema",
                      problems)

    def test_a_wrong_default_is_reported(self):
        doctored = re.sub(r"(\| `lease_duration` \| duration \| )`15s`", r"\1`20s`",
                          self.reference)
        self.assertNotEqual(doctored, self.reference)
        self.assertEqual(configuration_problems(doctored), [
            "[leader_election] lease_duration: default '`20s`', the schema says '`15s`'"])

    def test_the_minimal_example_of_the_reference_parses(self):
        """The reference's first ini block is a complete minimal configuration."""
        block = re.search(r"```ini\n(.*?)```", self.reference, re.DOTALL)
        self.assertIsNotNone(block, "no ini example in docs/configuration.md")
        config = parse_config(block.group(1), "docs/configuration.md")
        self.assertEqual(config.leader_election.lease_duration, 15.0)


# ---------------------------------------------------------------------------------------
# Metrics table.

def exposed_name(family):
    """The sample name a dashboard queries: counters get ``_total``, info ``_info``."""
    suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
    return family.name + suffix


def live_metrics():
    """``{exposed name: (type, labels)}`` of a fresh agent registry."""
    metrics = Metrics("edge-1", "pool-a")
    label_names = {
        collector._name: set(getattr(collector, "_labelnames", ()))
        for collector in vars(metrics).values() if isinstance(collector, MetricWrapperBase)}
    described = {}
    for family in metrics.registry.collect():
        labels = set(label_names.get(family.name, ()))
        for sample in family.samples:
            labels.update(sample.labels)
        labels.discard("le")
        described[exposed_name(family)] = (family.type, labels)
    return described


def documented_metrics(markdown):
    """``{name: (type, labels)}`` from the README's metrics table."""
    documented = {}
    for cells in table_rows(section_of(markdown, "Metrics")):
        if len(cells) != 4:
            continue
        name = code(cells[0])
        if name is None:
            continue
        labels = set(re.findall(r"`([a-z_]+)`", cells[2]))
        documented[name] = (cells[1], labels)
    return documented


def metrics_problems(markdown):
    live = live_metrics()
    documented = documented_metrics(markdown)
    problems = []
    for name, (kind, labels) in sorted(live.items()):
        if name not in documented:
            problems.append(f"{name} is missing")
            continue
        doc_kind, doc_labels = documented.pop(name)
        if doc_kind != kind:
            problems.append(f"{name}: type {doc_kind!r}, the registry says {kind!r}")
        if doc_labels != labels:
            problems.append(f"{name}: labels {sorted(doc_labels)}, the registry says "
                            f"{sorted(labels)}")
    problems.extend(f"{name} is documented but not exported" for name in sorted(documented))
    return problems


def render_metrics_rows():
    """Table rows for the live registry (the meaning column left for a human)."""
    lines = []
    for name, (kind, labels) in sorted(live_metrics().items()):
        label_text = ", ".join(f"`{label}`" for label in sorted(labels)) or "none"
        lines.append(f"| `{name}` | {kind} | {label_text} | |")
    return "\n".join(lines) + "\n"


class MetricsTableTests(unittest.TestCase):

    def setUp(self):
        self.readme = read(README)

    def test_every_exported_metric_is_documented_with_its_type_and_labels(self):
        self.assertEqual(metrics_problems(self.readme), [])

    def test_spec_metric_names_are_exported(self):
        """The yurthub names dashboards rely on are in the live registry."""
        live = live_metrics()
        for name in ("node_yurthub_yurt_coordinator_yurthub_role",
                     "node_yurthub_yurt_coordinator_healthy_status",
                     "node_yurthub_yurt_coordinator_ready_status",
                     "node_yurthub_server_healthy_status"):
            self.assertIn(name, live)

    def test_a_renamed_metric_is_reported(self):
        doctored = self.readme.replace("`yurtcoord_uploaded_objects_total`",
                                       "`yurtcoord_uploaded_objects_count`")
        self.assertNotEqual(doctored, self.readme)
        self.assertEqual(metrics_problems(doctored), [
            "yurtcoord_uploaded_objects_total is missing",
            "yurtcoord_uploaded_objects_count is documented but not exported"])

    def test_wrong_labels_are_reported(self):
        doctored = re.sub(r"(\| `yurtcoord_skipped_objects_total` \| counter \| )`reason`",
                          r"\1`why`", self.readme)
        self.assertNotEqual(doctored, self.readme)
        self.assertEqual(metrics_problems(doctored), [
            "yurtcoord_skipped_objects_total: labels ['why'], the registry says ['reason']"])


# ---------------------------------------------------------------------------------------
# HTTP surface.

class HTTPSurfaceTests(unittest.TestCase):

    def setUp(self):
        self.section = section_of(read(README), "HTTP surface")

    def test_every_page_of_the_status_site_is_documented(self):
        root = status_resource(InitialStatus("edge-1", "pool-a", ()), Metrics("edge-1"))
        paths = sorted("/" + name.decode("ascii") for name in root.children)
        self.assertEqual(paths, ["/", "/healthz", "/metrics", "/pool", "/readyz", "/status"])
        for path in paths:
            self.assertIn(f"`GET {path}`", self.section)

    def test_every_status_field_is_documented(self):
        fields = InitialStatus("edge-1", "pool-a", ("https://cloud:6443",)).status()
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", self.section, re.MULTILINE))
        self.assertEqual(documented, set(fields))

    def test_every_pool_field_is_documented(self):
        section = section_of(read(README), "Pool view")
        documented = {name for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE)
                      for name in re.findall(r"`([a-z_.\[\]]+)`", row)}
        document = self.successResultOf(
            NoPoolView(InitialStatus("edge-1", "pool-a", ())).document())
        fields = set(document) | {f"cache.{key}" for key in document["cache"]}
        fields |= {f"members[].{key}" for key in POOL_MEMBER_FIELDS}
        # election's parts are named in one row: `holder`, `lease_age`, ...
        fields -= {"election"}
        self.assertEqual(fields - documented, set())
        self.assertIn("| `election` |", section)
        for key in document["election"]:
            self.assertIn(f"`{key}`", section)


# The fields of one member of a /pool document.
POOL_MEMBER_FIELDS = ("node", "heartbeat", "stale", "lease_age", "cloud_lease_age",
                      "pool_lease_age", "leader", "this_agent", "etcd_member",
                      "coordinator_server", "upload")


# ---------------------------------------------------------------------------------------
# Comments and docs/design.md.

DESIGN = os.path.join(ROOT, "docs", "design.md")
BENCH = os.path.join(ROOT, "bench")
# References to texts that are not in the repository: a specification's sections,
# numbered fixes, the program this one replaced.
FOREIGN_REFERENCES = re.compile(r"SPEC\s*§|§\s*\d|\bfix(?:es)?\s+\d+\b|\bthe seed\b", re.I)
DESIGN_LINK = re.compile(r"docs/design\.md,\s*[\"']([^\"']+)[\"']")


def commented_sources():
    """Product code, the plugin and the benchmarks: what reads as the project itself."""
    yield from product_sources()
    for name in sorted(os.listdir(BENCH)):
        if name.endswith(".py"):
            yield os.path.join(BENCH, name)


def foreign_references(text):
    """``line: excerpt`` of every reference to a text outside the repository."""
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for m in FOREIGN_REFERENCES.finditer(text)]


def design_links(text):
    """Section titles of docs/design.md that ``text`` links to; a link may be wrapped
    over lines of a docstring or of ``#`` comments."""
    flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    return {re.sub(r"\s+", " ", title) for title in DESIGN_LINK.findall(flat)}


def design_sections():
    return set(re.findall(r"^## (.+?)[ \t]*$", read(DESIGN), re.MULTILINE))


class CommentsTests(unittest.TestCase):
    """Comments say why in the repository's own terms, and their links lead somewhere."""

    def test_no_comment_refers_to_a_text_outside_the_repository(self):
        found = {os.path.relpath(path, ROOT): foreign_references(read(path))
                 for path in commented_sources()}
        self.assertEqual({path: refs for path, refs in found.items() if refs}, {})

    def test_the_check_sees_each_kind_of_reference(self):
        text = "a (SPEC §6.2)\nb (fix 15)\n# c: the seed's way\nd suffix 3, seeded, §4"
        self.assertEqual(foreign_references(text),
                         ["1: SPEC §", "2: fix 15", "3: the seed", "4: §4"])

    def test_every_linked_design_section_exists_and_every_section_is_linked(self):
        sections = design_sections()
        linked = {}
        for path in commented_sources():
            for title in design_links(read(path)):
                linked.setdefault(title, []).append(os.path.relpath(path, ROOT))
        self.assertEqual({t: paths for t, paths in linked.items() if t not in sections}, {})
        self.assertEqual(sorted(sections - set(linked)), [])

    def test_links_are_found_across_wrapped_lines(self):
        text = 'x = 1  # see docs/design.md, "Delegating\n    # cadence".\n'
        text += '"""See docs/design.md,\n    \'Election timing\'."""'
        self.assertEqual(design_links(text), {"Delegating cadence", "Election timing"})


# ---------------------------------------------------------------------------------------
# Runbook.

def product_sources():
    yield PLUGIN
    for directory, subdirectories, files in os.walk(PRODUCT_PACKAGE):
        if os.path.relpath(directory, PRODUCT_PACKAGE).split(os.sep)[0] in NOT_PRODUCT:
            subdirectories[:] = []
            continue
        subdirectories.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def log_templates():
    """The message template of every ``<logger>.<level>("...")`` call in product code."""
    templates = set()
    for path in product_sources():
        for node in ast.walk(ast.parse(read(path), path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_LEVELS and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                templates.add(node.args[0].value)
    return templates


def quoted_log_lines(markdown):
    """Every line of the ```` ```log ```` blocks of ``markdown``."""
    lines = []
    for block in re.findall(r"^```log\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL):
        lines.extend(line for line in block.splitlines() if line.strip())
    return lines


def unknown_log_lines(markdown):
    templates = log_templates()
    return [line for line in quoted_log_lines(markdown) if line not in templates]


def schema_default(section, name):
    for key in SCHEMA:
        if (key.section, key.name) == (section, name):
            return parse_duration(key.default)
    raise KeyError((section, name))


class RunbookTests(unittest.TestCase):

    def setUp(self):
        self.runbook = read(RUNBOOK)

    def test_quoted_log_lines_are_logged_by_the_code(self):
        self.assertGreater(len(quoted_log_lines(self.runbook)), 10)
        self.assertEqual(unknown_log_lines(self.runbook), [])

    def test_a_log_line_the_code_does_not_write_is_reported(self):
        doctored = self.runbook.replace("role {previous} -> {role} on node {node}",
                                        "role changed to {role}")
        self.assertNotEqual(doctored, self.runbook)
        self.assertEqual(unknown_log_lines(doctored), ["role changed to {role}"])

    def test_exit_statuses_match_the_command(self):
        from twisted.plugins import yurtcoord_plugin
        readme = read(README)
        for status in (yurtcoord_plugin.EXIT_CONFIG_ERROR, yurtcoord_plugin.EXIT_CANNOT_START):
            self.assertIn(f"exit status {status}", self.runbook)
        self.assertIn(f"exit status {yurtcoord_plugin.EXIT_CONFIG_ERROR}", readme)

    def test_failover_times_follow_the_default_timings(self):
        lease = schema_default("leader_election", "lease_duration")
        retry = schema_default("leader_election", "retry_period")
        self.assertIn(f"within {lease + retry:g} s", self.runbook)
        self.assertIn(f"within {retry:g} s", self.runbook)

    def test_every_skip_reason_is_explained(self):
        """The README's metric row and the runbook's table name each reason the
        uploader counts, and the runbook's causes are texts the code writes."""
        reasons = set(SKIP_REASONS)
        [row] = [line for line in read(README).splitlines()
                 if line.startswith("| `yurtcoord_skipped_objects_total`")]
        self.assertEqual({r for r in reasons if f"`{r}`" not in row}, set())
        section = section_of(self.runbook, "Corrupt local cache files")
        documented = {code(cells[0]) for cells in table_rows(section) if code(cells[0])}
        self.assertEqual(documented, reasons - {"not_newer"})
        sources = "\n".join(read(path) for path in product_sources())
        for text in ("a symbolic link (links in the local cache are not followed)",
                     "not JSON: nested too deeply", "name or namespace is not UTF-8",
                     "bytes, larger than one", "where {location.resource} of",
                     "a directory where an object file should be", "not a regular file"):
            self.assertTrue(text in sources, f"no product code writes {text!r}")

    def test_quoted_error_texts_are_written_by_the_code(self):
        sources = "\n".join(read(path) for path in product_sources())
        for text in ("kubelet has not been healthy for its grace period",
                     "malformed component key cache line",
                     "not healthy: role", "not ready: ",
                     "coordinator not healthy (role", "steps of role",
                     "pool cache not synced", "local cache not uploaded"):
            self.assertIn(text, self.runbook + read(README))
            self.assertIn(text, sources)

    def test_the_configuration_error_example_is_what_the_parser_says(self):
        ini = ("[node]\nname = edge-1\n[cloud]\nservers = https://10.0.0.1:6443\n"
               "[leader_election]\nlease_duraton = 15s\n")
        with self.assertRaises(ConfigError) as raised:
            parse_config(ini, "/etc/yurtcoord/yurtcoord.ini")
        message = str(raised.exception)
        self.assertIn(f"\n{message}\n", self.runbook)
        self.assertIn(f"\n{message}\n", read(CONFIGURATION))

    def test_the_empty_kubelet_url_error_is_what_the_parser_says(self):
        ini = ("[node]\nname = edge-1\n[cloud]\nservers = https://10.0.0.1:6443\n"
               "[heartbeat]\nkubelet_healthz_url =\n")
        with self.assertRaises(ConfigError) as raised:
            parse_config(ini, "/etc/yurtcoord/yurtcoord.ini")
        self.assertIn(f"\n{raised.exception}\n", read(CONFIGURATION))

    def test_readme_links_the_operator_documents(self):
        readme = read(README)
        for path in ("docs/configuration.md", "docs/runbook.md", "bench/RESULTS.md"):
            self.assertIn(f"]({path})", readme)
            self.assertTrue(os.path.exists(os.path.join(ROOT, path)), path)


# ---------------------------------------------------------------------------------------
# Repository layout.

# Packages whose every module the layout table names, so that a reader finds each job
# from the table alone.
NAMED_MODULE_BY_MODULE = ("agent", "role", "heartbeat", "pool", "tx")


class LayoutTableTests(unittest.TestCase):
    """The README's layout table matches the tree."""

    def setUp(self):
        rows = table_rows(section_of(read(README), "Repository layout"))
        self.rows = {code(cells[0]): cells[1] for cells in rows if code(cells[0])}

    def test_every_path_of_the_table_exists(self):
        missing = [path for path in self.rows if not os.path.exists(os.path.join(ROOT, path))]
        self.assertEqual(missing, [])

    def test_every_package_has_a_row_and_every_named_file_exists(self):
        packages = sorted(name for name in os.listdir(PRODUCT_PACKAGE)
                          if os.path.isfile(os.path.join(PRODUCT_PACKAGE, name, "__init__.py")))
        self.assertEqual([p for p in packages if f"yurtcoord/{p}/" not in self.rows], [])
        for package in packages:
            for name in re.findall(r"`(\w[\w/]*(?:\.py|/))`", self.rows[f"yurtcoord/{package}/"]):
                self.assertTrue(os.path.exists(os.path.join(PRODUCT_PACKAGE, package, name)),
                                f"yurtcoord/{package}/{name} is named in the layout table")

    def test_the_capability_packages_name_each_of_their_modules(self):
        for package in NAMED_MODULE_BY_MODULE:
            described = self.rows[f"yurtcoord/{package}/"]
            modules = sorted(name for name in os.listdir(os.path.join(PRODUCT_PACKAGE, package))
                             if name.endswith(".py") and name != "__init__.py")
            self.assertEqual([m for m in modules if f"`{m}`" not in described], [], package)

    def test_product_code_imports_no_test_support_and_tx_imports_only_tx(self):
        offending = []
        for directory, _dirs, files in os.walk(PRODUCT_PACKAGE):
            relative = os.path.relpath(directory, PRODUCT_PACKAGE).split(os.sep)
            if relative[0] in NOT_PRODUCT:
                continue
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                for node in ast.walk(ast.parse(read(path))):
                    imported = []
                    if isinstance(node, ast.ImportFrom) and node.module:
                        imported = [node.module]
                    elif isinstance(node, ast.Import):
                        imported = [alias.name for alias in node.names]
                    for module in imported:
                        if module.startswith("yurtcoord.testing") or (
                                relative[0] == "tx" and module.startswith("yurtcoord")
                                and not module.startswith("yurtcoord.tx")):
                            offending.append(f"{os.path.relpath(path, ROOT)} imports {module}")
        self.assertEqual(offending, [])

    def test_no_module_lies_outside_a_package(self):
        loose = sorted(name for name in os.listdir(PRODUCT_PACKAGE)
                       if name.endswith(".py") and name not in ("__init__.py", "names.py"))
        self.assertEqual(loose, [])


if __name__ == "__main__":
    sys.stdout.write(render_configuration_tables())
    sys.stdout.write("\n")
    sys.stdout.write(render_metrics_rows())
