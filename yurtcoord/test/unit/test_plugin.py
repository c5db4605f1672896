"""The options of ``twistd yurtcoord``, parsed without starting anything:
``--sandbox-etcd-members``, how many members the sandbox's pool etcd has, and
``--version``, yurtcoord's own."""

import importlib.metadata
import io
import platform
import signal
import sys

from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger
from twisted.plugins.yurtcoord_plugin import Options, make_sandbox
from twisted import copyright
from twisted.python import usage
from twisted.trial import unittest

from yurtcoord.agent import version


class SandboxOptionsTests(unittest.TestCase):
    """``--sandbox-etcd-members``: how many members the sandbox's pool etcd has."""

    def setUp(self):
        # --sandbox takes the stop signals over at once: give them back afterwards.
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
        saved = {signum: signal.getsignal(signum) for signum in signums}
        self.addCleanup(lambda: [signal.signal(n, h) for n, h in saved.items()])

    def parse(self, *arguments):
        options = Options()
        options.parseOptions(list(arguments))
        return options

    def test_three_members_by_default_and_one_on_request_reach_the_sandbox(self):
        self.assertEqual(self.parse("--sandbox")["sandbox-etcd-members"], 3)
        options = self.parse("--sandbox", "--sandbox-etcd-members", "1")
        self.assertEqual(options["sandbox-etcd-members"], 1)
        sandbox = make_sandbox(MemoryReactorClock(), options["sandbox-agents"], Logger(),
                               etcd_members=options["sandbox-etcd-members"])
        self.assertEqual(sandbox.etcd_members, 1)

    def test_no_member_is_a_usage_error(self):
        with self.assertRaisesRegex(usage.UsageError,
                                    "--sandbox-etcd-members must be 1 or more"):
            self.parse("--sandbox", "--sandbox-etcd-members", "0")


class VersionOptionTests(unittest.TestCase):
    """``twistd yurtcoord --version`` names yurtcoord's version, from the installed
    package's metadata, before anything else is parsed or loaded; ``usage.Options``
    alone prints Twisted's version only."""

    def setUp(self):
        self.stdout = io.StringIO()
        self.patch(sys, "stdout", self.stdout)

    def version_output(self, *arguments):
        with self.assertRaises(SystemExit) as exited:
            Options().parseOptions(list(arguments))
        self.assertEqual(exited.exception.code, 0)
        return self.stdout.getvalue()

    def test_yurtcoords_version_then_twisted_and_python(self):
        self.patch(importlib.metadata, "version",
                   lambda name: "7.8.9" if name == "yurtcoord" else "?")
        self.assertEqual(self.version_output("--version"),
                         f"yurtcoord 7.8.9 (Twisted {copyright.version}, "
                         f"Python {platform.python_version()})\n")

    def test_a_config_that_does_not_load_is_not_read_first(self):
        """--version is answered while the options are parsed: a missing config
        named before it would otherwise end the command with exit 78."""
        self.patch(importlib.metadata, "version", lambda name: "7.8.9")
        output = self.version_output("--config", "/nonexistent/yurtcoord.ini", "--version")
        self.assertTrue(output.startswith("yurtcoord 7.8.9 "), output)

    def test_the_installed_package_is_this_one(self):
        self.assertEqual(version.version(), importlib.metadata.version("yurtcoord"))

    def test_without_package_metadata_it_says_so(self):
        def not_installed(name):
            raise importlib.metadata.PackageNotFoundError(name)
        self.patch(importlib.metadata, "version", not_installed)
        self.assertEqual(version.version(), version.NOT_INSTALLED)
        self.assertIn("yurtcoord unknown (the yurtcoord package is not installed)",
                      self.version_output("--version"))
