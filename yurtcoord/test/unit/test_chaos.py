"""The chaos run without processes: its schedule is a pure function of its seed and
minutes that keeps the pool's quorums, and its excuses follow the rules of
``chaosjudge``'s docstring."""

from twisted.trial import unittest

from yurtcoord.kube.lease import format_micro_time
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.sim.apiserver.requestlog import logged_request
from yurtcoord.testing.invariants import lease_path

from yurtcoord.testing.chaosjudge import (
    LAN, WAN, Timeline, excused_windows, judge_chaos, stale_spans,
)
from yurtcoord.testing.chaosschedule import (
    COORDINATOR_KILL, ETCD_KILL, FAULT_KINDS, RECOVERY, ROLLING_RESTART, chaos_schedule,
    fault_counts, resources,
)
from yurtcoord.testing.netns import LinkEvent
from yurtcoord.testing.partitions import LIVE_LEASE_BOUND, STALE_BOUND

NODES = ["edge-1", "edge-2", "edge-3", "edge-4", "edge-5"]
NODE_OF_ADDRESS = {"198.18.0.11": "edge-1", "198.18.0.12": "edge-2"}
ADDRESS_OF = {node: address for address, node in NODE_OF_ADDRESS.items()}


def node_write(at, node):
    """``node``'s agent renews its own cloud lease at ``at`` (renewTime ``at``)."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": node, "renewTime": format_micro_time(at)}}
    return logged_request(at, ADDRESS_OF[node], "PUT", lease_path(NODE_LEASE_NAMESPACE, node),
                          200, body)


class ScheduleTests(unittest.TestCase):

    def test_the_same_seed_and_minutes_give_the_same_schedule(self):
        for seed in (0, 1, 20261204):
            self.assertEqual(chaos_schedule(seed, 2, NODES), chaos_schedule(seed, 2, NODES))
        self.assertNotEqual(chaos_schedule(1, 2, NODES), chaos_schedule(2, 2, NODES))
        self.assertNotEqual(chaos_schedule(1, 2, NODES), chaos_schedule(1, 3, NODES))

    def test_the_order_of_the_nodes_does_not_matter(self):
        self.assertEqual(chaos_schedule(7, 2, NODES), chaos_schedule(7, 2, NODES[::-1]))

    def test_every_kind_is_injected_within_two_minutes(self):
        for seed in range(50):
            counts = fault_counts(chaos_schedule(seed, 2, NODES))
            self.assertEqual([kind for kind, count in counts.items() if not count], [],
                             f"seed {seed}")

    def test_faults_end_within_the_run_in_order_of_start(self):
        for seed in range(50):
            faults = chaos_schedule(seed, 2, NODES)
            self.assertEqual(faults, sorted(faults, key=lambda fault: fault.at))
            self.assertTrue(all(0 < fault.at and fault.end() <= 120.0 + 1e-6
                                for fault in faults), faults)

    def test_no_resource_is_held_twice_at_once(self):
        """Hence never two etcd members or both coordinator apiservers down, and one
        fault at a time on each agent's process, kubelet and link."""
        for seed in range(50):
            held = {}
            for fault in chaos_schedule(seed, 5, NODES):
                for resource in resources(fault.kind, fault.target, NODES):
                    self.assertLessEqual(held.get(resource, 0.0), fault.at,
                                         f"seed {seed}: {fault.describe()} on {resource}")
                    held[resource] = fault.end() + RECOVERY[fault.kind]
        self.assertEqual(resources(ETCD_KILL, "member-2", NODES), ["etcd"])
        self.assertEqual(resources(COORDINATOR_KILL, "coordinator-0", NODES), ["coordinator"])
        self.assertEqual(resources(ROLLING_RESTART, "pool", NODES),
                         [f"agent:{node}" for node in NODES])

    def test_a_run_needs_spares(self):
        self.assertRaises(ValueError, chaos_schedule, 1, 2, NODES[:1])
        self.assertRaises(ValueError, chaos_schedule, 1, 2, NODES, etcd_members=1)
        self.assertRaises(ValueError, chaos_schedule, 1, 2, NODES, coordinators=1)
        self.assertRaises(ValueError, chaos_schedule, 1, 0, NODES)

    def test_the_kinds_are_the_schedules(self):
        self.assertEqual(sorted(fault_counts([])), sorted(FAULT_KINDS))


def cuts(*events):
    """A timeline of the link ``events`` ((at, host, network, action)), over [0, 100]."""
    timeline = Timeline()
    timeline.add_links([LinkEvent(at, host, network, action, "both")
                        for at, host, network, action in events], 100.0)
    return timeline


class ExcuseTests(unittest.TestCase):
    """Rule 2 of chaosjudge's docstring."""

    def test_a_wan_cut_with_a_possible_delegator_excuses_nothing(self):
        timeline = cuts((10.0, "edge-1", WAN, "cut"), (30.0, "edge-1", WAN, "heal"))
        self.assertEqual(excused_windows(timeline, NODES[:2], "edge-1", 0.0, 100.0), [])

    def test_a_wan_and_lan_cut_excuses_the_isolated_node_only(self):
        timeline = cuts((10.0, "edge-1", WAN, "cut"), (15.0, "edge-1", LAN, "cut"),
                        (25.0, "edge-1", LAN, "heal"), (30.0, "edge-1", WAN, "heal"))
        self.assertEqual(excused_windows(timeline, NODES, "edge-1", 0.0, 100.0),
                         [(15.0, 25.0)])
        self.assertEqual(excused_windows(timeline, NODES, "edge-2", 0.0, 100.0), [])

    def test_a_wan_cut_is_excused_while_no_other_agent_could_delegate(self):
        """edge-2's delegator candidates go one by one: its LAN-cut self does not
        count, edge-1 is cut from the cloud, edge-3's kubelet is stopped, edge-4's agent
        is down; only while all of that overlaps is edge-2 excused."""
        timeline = cuts((10.0, "edge-2", WAN, "cut"), (50.0, "edge-2", WAN, "heal"),
                        (12.0, "edge-1", WAN, "cut"), (40.0, "edge-1", WAN, "heal"))
        timeline.kubelet_down["edge-3"] = [(14.0, 30.0)]
        timeline.agent_down["edge-4"] = [(20.0, 35.0)]
        nodes = NODES[:4]
        self.assertEqual(excused_windows(timeline, nodes, "edge-2", 0.0, 100.0),
                         [(20.0, 30.0)])
        # edge-3 and edge-4 are excused for their own faults, whatever the links.
        self.assertEqual(excused_windows(timeline, nodes, "edge-3", 0.0, 100.0),
                         [(14.0, 30.0)])
        self.assertEqual(excused_windows(timeline, nodes, "edge-4", 0.0, 100.0),
                         [(20.0, 35.0)])

    def test_a_delegator_needs_both_links(self):
        timeline = cuts((10.0, "edge-1", WAN, "cut"), (30.0, "edge-1", WAN, "heal"),
                        (12.0, "edge-2", LAN, "cut"), (20.0, "edge-2", LAN, "heal"))
        self.assertEqual(excused_windows(timeline, NODES[:2], "edge-1", 0.0, 100.0),
                         [(12.0, 20.0)])

    def test_a_link_still_cut_at_the_end_stays_cut(self):
        timeline = cuts((90.0, "edge-1", WAN, "cut"), (95.0, "edge-1", LAN, "cut"))
        self.assertEqual(excused_windows(timeline, NODES, "edge-1", 0.0, 100.0),
                         [(95.0, 100.0)])


class StaleTests(unittest.TestCase):
    """Rule 3: a stopped kubelet's node goes stale, counted from the stop or from the
    latest start of its agent within it."""

    def test_an_agent_restart_within_a_stop_starts_the_grace_again(self):
        """The span before a new agent ends at its spawn; the next counts from when
        it was seen listening; restarts outside the stop change nothing."""
        timeline = Timeline(kubelet_down={"edge-1": [(10.0, 60.0)]},
                            agent_restarts={"edge-1": [(4.0, 5.0), (29.0, 30.5),
                                                       (70.0, 71.0)]})
        self.assertEqual(stale_spans(timeline, "edge-1"), [(10.0, 29.0), (30.5, 60.0)])

    def test_an_agent_spawned_before_the_stop_and_listening_after_it(self):
        timeline = Timeline(kubelet_down={"edge-1": [(10.0, 60.0)]},
                            agent_restarts={"edge-1": [(9.0, 11.0)]})
        self.assertEqual(stale_spans(timeline, "edge-1"), [(11.0, 60.0)])

    def test_a_new_agent_renews_before_it_is_seen_listening(self):
        """A renewal between the new agent's spawn and the moment it was seen
        listening is its own grace's; one later than the bound after that moment is
        a violation."""
        timeline = Timeline(kubelet_down={"edge-1": [(10.0, 60.0)]},
                            agent_restarts={"edge-1": [(25.0, 26.0)]})
        early = node_write(25.5, "edge-1")
        self.assertEqual(judge_chaos([early], [], NODE_OF_ADDRESS, ["edge-1"], timeline,
                                     10.0, 60.0), [])
        late = node_write(26.0 + STALE_BOUND + 0.5, "edge-1")
        judged = judge_chaos([early, late], [], NODE_OF_ADDRESS, ["edge-1"], timeline,
                             10.0, 60.0)
        self.assertEqual(len(judged), 1, judged)
        self.assertIn("after its kubelet stopped", judged[0])

    def test_judged_on_the_cloud_log(self):
        """edge-1's kubelet stops at 10 and starts at 40: renewals until the bound
        after the stop are fine, one after it is a violation, and after the start the
        lease must move again within the live bound; edge-2 renews all along."""
        timeline = Timeline(kubelet_down={"edge-1": [(10.0, 40.0)]})
        renewals = [node_write(at, "edge-2") for at in range(0, 61, 3)]
        good = [node_write(at, "edge-1") for at in (0, 3, 6, 9, 12, 15, 18)]
        good += [node_write(at, "edge-1") for at in range(41, 61, 3)]
        node_of = NODE_OF_ADDRESS
        judged = judge_chaos(renewals + good, [], node_of, ["edge-1", "edge-2"], timeline,
                             0.0, 60.0)
        self.assertEqual(judged, [])
        late = node_write(10.0 + STALE_BOUND + 1, "edge-1")
        judged = judge_chaos(renewals + good + [late], [], node_of, ["edge-1", "edge-2"],
                             timeline, 0.0, 60.0)
        self.assertEqual(len(judged), 1, judged)
        self.assertIn("after its kubelet stopped", judged[0])
        slow = [record for record in good if record.at < 41 or record.at > 40 + LIVE_LEASE_BOUND]
        judged = judge_chaos(renewals + slow, [], node_of, ["edge-1", "edge-2"], timeline,
                             0.0, 60.0)
        self.assertEqual(len(judged), 1, judged)
        self.assertIn("edge-1's cloud lease went", judged[0])
