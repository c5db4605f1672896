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

import os
import subprocess

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.testing import partitions
from yurtcoord.testing.netns import namespace_name, unavailable_reason
from yurtcoord.testing.partitionworld import WAN, PartitionWorld

UNAVAILABLE = unavailable_reason()


def namespaces_of(world_name):
    """Names of this process's namespaces that belong to the world ``world_name``."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    mark = namespace_name(world_name, "")
    return [line.split()[0] for line in listed.splitlines()
            if line.split() and line.split()[0].startswith(mark)]


def alive(pid):
    """``pid`` runs (a zombie that was not reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class PartitionWorldCleanupTests(unittest.TestCase):
    timeout = 120

    def setUp(self):
        if UNAVAILABLE:
            raise unittest.SkipTest(f"network namespaces unavailable: {UNAVAILABLE}")

    @defer.inlineCallbacks
    def test_a_scenario_that_fails_half_way_leaves_nothing_behind(self):
        """Agents running, etcd running, a link cut, then the scenario fails: stopping
        the world removes every namespace (and with them the bridges) and process."""
        world = PartitionWorld(reactor, "halfway")
        pids = []
        try:
            yield world.start()
            for node in ("edge-1", "edge-2"):
                yield world.add_agent(node)
            yield world.start_agents()
            pids = [agent._child.transport.pid for agent in world.agents.values()]
            pids.append(world.etcd.pid)
            world.cut("edge-1", WAN)
            self.assertEqual(len(namespaces_of("halfway")), 1 + 3 + 2)  # switch, servers, agents
            raise RuntimeError("the scenario fails half way")
        except RuntimeError:
            pass
        finally:
            yield world.stop()
        self.assertEqual(len(pids), 3)
        self.assertEqual(namespaces_of("halfway"), [])
        self.assertEqual([pid for pid in pids if alive(pid)], [])
        self.assertFalse(os.path.exists(world.base_dir))


class PartitionScenarioTests(unittest.TestCase):
    # Scenarios run side by side: the slowest of them sets the length of a test.
    timeout = 600

    def setUp(self):
        if UNAVAILABLE:
            raise unittest.SkipTest(f"network namespaces unavailable: {UNAVAILABLE}")

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

    def test_a_rolling_update_while_two_followers_are_cut_off(self):
        """Six agents restarted one at a time in node order, the leader included, each
        ready before the next stops, while two followers have no cloud."""
        return self.run_side_by_side([partitions.ROLLING_UPDATE_SCENARIO])

    def test_lan_cuts_and_a_flapping_wan(self):
        """One agent's LAN, the leader's LAN (fencing), a one-way WAN cut, the etcd
        member's LAN, and the leader's WAN flapping every 3 s for half a minute (the
        wiring; two minutes of it are judged on a Clock in test_flapping_clock)."""
        return self.run_side_by_side(partitions.LAN_SCENARIOS + [partitions.FLAP_SCENARIO])
