"""``poll_until`` on a Clock: the bounded wait that the agent tests over real sockets
rely on fires once its condition holds, and fails after its deadline naming what it
awaited and the last error. The agent built by ``make_service`` is tested over real
sockets in the integration tier.
"""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from yurtcoord.testing.poll import PollTimeout, poll_until


class PollUntilTests(unittest.TestCase):
    """The bounded wait every real-socket test relies on, on a fake clock."""

    def test_fires_once_the_condition_holds(self):
        clock = Clock()
        answers = iter([False, False, defer.succeed(True)])
        d = poll_until(lambda: next(answers), 1.0, 0.1, clock, what="the third answer")
        self.assertNoResult(d)
        clock.advance(0.1)
        self.assertNoResult(d)
        clock.advance(0.1)
        self.assertTrue(self.successResultOf(d))

    def test_fails_after_the_deadline_naming_what_was_awaited(self):
        clock = Clock()

        def broken():
            raise ValueError("no answer")

        d = poll_until(broken, 0.5, 0.1, clock, what="a working server")
        clock.pump([0.1] * 6)
        failure = self.failureResultOf(d, PollTimeout)
        self.assertIn("a working server", str(failure.value))
        self.assertIn("ValueError: no answer", str(failure.value))
        self.assertEqual(clock.getDelayedCalls(), [])
