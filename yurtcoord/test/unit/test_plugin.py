"""The options of ``twistd yurtcoord``, parsed without starting anything:
``--sandbox-etcd-members``, how many members the sandbox's pool etcd has."""

import signal

from twisted.internet.testing import MemoryReactorClock
from twisted.logger import Logger
from twisted.plugins.yurtcoord_plugin import Options, make_sandbox
from twisted.python import usage
from twisted.trial import unittest


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
