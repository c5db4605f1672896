"""``twistd yurtcoord --version`` and ``yurtcoordctl --version`` as an operator runs
them, each a one-shot child process: both print the version of the installed yurtcoord
package (its metadata, as ``pip`` wrote it) and exit 0, without a configuration or an
agent to read. twistd's own ``--version`` handling of a plugin's options prints only
Twisted's version."""

import importlib.metadata
import os
import subprocess
import sys

from twisted import copyright
from twisted.trial import unittest

from yurtcoord.testing.twistd import TWISTD, child_environment

# Seconds a child may take: an interpreter start and the imports of twistd's plugins
# on a loaded machine.
CHILD_DEADLINE = 60


class VersionCommandTests(unittest.TestCase):
    def setUp(self):
        self.installed = importlib.metadata.version("yurtcoord")

    def run_child(self, *argv):
        """Run ``argv`` from a fresh temporary directory (no ini there); its exit
        status, stdout and stderr."""
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=directory,
                              env=child_environment(), timeout=CHILD_DEADLINE)
        return done.returncode, done.stdout, done.stderr

    def test_twistd_yurtcoord_version(self):
        code, out, err = self.run_child(TWISTD, "yurtcoord", "--version")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines(),
                         [f"yurtcoord {self.installed} (Twisted {copyright.version}, "
                          f"Python {'.'.join(map(str, sys.version_info[:3]))})"])

    def test_yurtcoordctl_version(self):
        script = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
        if not os.path.exists(script):
            raise unittest.SkipTest(f"{script} not installed (pip install -e . installs it)")
        code, out, err = self.run_child(script, "--version")
        self.assertEqual((code, out, err), (0, f"yurtcoordctl (yurtcoord) {self.installed}\n",
                                            ""))
