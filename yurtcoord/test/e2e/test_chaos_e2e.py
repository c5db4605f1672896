"""Two minutes of overlapping faults on one pool, from a fixed seed (``bench/chaos.py``
runs any seed for any length).

``yurtcoord.testing.chaos`` runs the pool (5 ``twistd`` agents, 3 pool etcd members and
2 coordinator apiservers, each on a host of its own) through its seed's schedule and
judges the whole run by the partition suite's invariants, with the excuses written
down in ``yurtcoord.testing.chaosjudge``. The test fails listing every violation with
the records at fault; it prints the schedule and a ``CHAOS`` line with the faults
injected and the run's times.

Where network namespaces cannot be made (not root, no iproute2) it is skipped with
the reason.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.testing import chaos
from yurtcoord.testing.netns import unavailable_reason

UNAVAILABLE = unavailable_reason()
SEED = 20261204
MINUTES = 2.0


class ChaosRunTests(unittest.TestCase):
    # Setup, two minutes of faults, the settle time and teardown on a loaded machine.
    timeout = 480

    def setUp(self):
        if UNAVAILABLE:
            raise unittest.SkipTest(f"network namespaces unavailable: {UNAVAILABLE}")

    @defer.inlineCallbacks
    def test_two_minutes_of_overlapping_faults(self):
        """Every kind of fault at least once, overlapping: no invariant is violated."""
        outcome = yield chaos.run_chaos(reactor, SEED, MINUTES, name="chaos-ci")
        print(outcome.summary())
        if outcome.problems:
            self.fail(f"{len(outcome.problems)} violations (replay: bench/chaos.py --seed "
                      f"{SEED} --minutes {MINUTES:g}):\n" + "\n".join(outcome.problems))
        self.assertEqual([kind for kind, count in outcome.injected.items() if not count], [])
