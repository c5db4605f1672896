"""Real network partitions: every agent, apiserver and etcd member on a host of its own.

Each scenario of ``yurtcoord.testing.partitions`` runs on a topology of its own (network
namespaces joined by a WAN and a LAN bridge), with each agent a separate ``twistd``
process; the scenarios of one test run side by side. After every scenario every
invariant is judged from the API test servers' request logs and the pool etcd; a test
fails listing each scenario's violations. Measured numbers are printed as
``PARTITION <scenario> key=value`` lines.

Where network namespaces cannot be made (not root, no iproute2) the tests are skipped
with the reason.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.testing import partitions
from yurtcoord.testing.netns import sweep_leftovers, unavailable_reason

UNAVAILABLE = unavailable_reason()


class PartitionScenarioTests(unittest.TestCase):
    # Scenarios run side by side; the flapping one alone lasts FLAP_DURATION.
    timeout = 600

    def setUp(self):
        if UNAVAILABLE:
            raise unittest.SkipTest(f"network namespaces unavailable: {UNAVAILABLE}")
        sweep_leftovers()

    @defer.inlineCallbacks
    def run_side_by_side(self, scenarios):
        outcomes = yield defer.gatherResults(
            [partitions.run_scenario(reactor, scenario) for scenario in scenarios])
        failures = []
        for outcome in outcomes:
            print(f"PARTITION {outcome.name} "
                  + " ".join(f"{key}={value}" for key, value in sorted(outcome.notes.items())))
            for problem in outcome.problems:
                failures.append(f"[{outcome.name}] {problem}")
        if failures:
            self.fail(f"{len(failures)} invariant violations:\n" + "\n".join(failures))

    def test_wan_cuts(self):
        """One follower's WAN, the leader's WAN, every WAN, and the cloud itself."""
        return self.run_side_by_side(partitions.WAN_SCENARIOS)

    def test_lan_cuts_and_a_flapping_wan(self):
        """One agent's LAN, the leader's LAN (fencing), a one-way WAN cut, the etcd
        member's LAN, and the leader's WAN flapping every 3 s for 2 minutes."""
        return self.run_side_by_side(partitions.LAN_SCENARIOS + [partitions.FLAP_SCENARIO])
