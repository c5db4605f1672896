"""Agents whose clocks are minutes off, each a separate ``twistd`` process with
libfaketime preloaded (``yurtcoord.testing.skew``), in a ``ProcessWorld`` with the fault
suite's timings (heartbeat every 4 s, election lease 3 s, retry 0.5 s, kubelet grace
10 s).

Edge nodes lose NTP when cut off, and devices without a battery-backed clock boot
minutes off. Nothing an agent decides may compare a renewTime written by another
machine with its own clock (docs/design.md, "Clocks"), so a pool of skewed agents must
work as one of true clocks does. The cloud is judged as the node lifecycle controller
judges it: the test samples each node's cloud lease and stamps its own clock whenever
the renewTime increases (``CloudLeaseSampler.longest_gap``); a live node's renewTime is seen to
increase at least every two heartbeat intervals, across a takeover at most two
intervals plus the takeover; a node whose kubelet died stops increasing within the
kubelet grace period plus one interval.

One scenario, in phases, so that the pool is built once (five agents):

1. The agent 5 min ahead starts alone and leads; two agents of true clocks and two
   2 min ahead and behind join, and all become ready (each judges the informer sync
   lease by the change it saw, not by the leader's renewTime): the lead does not move.
2. The nodes 2 min ahead, 2 min behind and one of true clock lose the cloud: the
   leader, 5 min ahead, keeps each of them increasing.
3. The kubelet of the node 2 min ahead dies: its cloud lease stops increasing.
4. The leader is SIGKILLed: the other agent with the cloud (true clock) takes over
   and the cut-off nodes keep increasing.
5. The agent 5 min ahead starts again, cut off from the cloud: the lead does not move,
   and its heartbeats are forwarded by the leader of true clock.

Measured figures are printed as ``SKEW-E2E <name>=<value>`` lines.
"""

import signal

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.cloudleases import CloudLeaseSampler
from yurtcoord.testing.skew import libfaketime_path
from yurtcoord.testing.world import (
    HEARTBEAT_INTERVAL, KUBELET_GRACE_PERIOD, LEASE_DURATION, RETRY_PERIOD, ProcessWorld,
    leader_of, one_leader_all_ready,
)
from yurtcoord.agent.config import parse_duration

INTERVAL = HEARTBEAT_INTERVAL
TAKEOVER = LEASE_DURATION + RETRY_PERIOD
GRACE = parse_duration(KUBELET_GRACE_PERIOD)
# Slack for twistd processes of a loaded 2-core machine that were not scheduled for a
# moment, and for the test's 50 ms sampling.
SLACK = 1.0
LIVE_BOUND = 2 * INTERVAL + SLACK
TAKEOVER_BOUND = 2 * INTERVAL + TAKEOVER + SLACK
STALE_BOUND = GRACE + INTERVAL + SLACK
# Each node's clock offset, in seconds.
OFFSETS = {"edge-ahead-5m": 300.0, "edge-true-1": 0.0, "edge-true-2": 0.0,
           "edge-ahead-2m": 120.0, "edge-behind-2m": -120.0}
FIRST_LEADER = "edge-ahead-5m"
SUCCESSOR = "edge-true-2"  # the one other agent that keeps the cloud
CUT_OFF = ("edge-ahead-2m", "edge-behind-2m", "edge-true-1")
KUBELET_DIES = "edge-ahead-2m"
# How long each phase watches the cloud renewals.
WATCH = 4 * INTERVAL
STEP_TIMEOUT = 60.0
SETTLE_TIMEOUT = 90.0


def report(name, value):
    print(f"SKEW-E2E {name}={value}")


class ClockSkewTests(unittest.TestCase):
    timeout = 400

    def setUp(self):
        if libfaketime_path() is None:
            raise unittest.SkipTest("libfaketime not installed (Debian package faketime)")

    @defer.inlineCallbacks
    def wait(self, seconds):
        done = defer.Deferred()
        call = reactor.callLater(seconds, done.callback, None)
        self.addCleanup(lambda: call.active() and call.cancel())
        yield done

    @defer.inlineCallbacks
    def lead_and_transitions(self):
        lease = yield self.world.election_lease()
        spec = (lease or {}).get("spec") or {}
        return spec.get("holderIdentity"), spec.get("leaseTransitions")

    def check_gaps(self, nodes, since, until, bound, what):
        problems = []
        for node in nodes:
            gap = self.renewals.longest_gap(node, since, until)
            report(f"{what}.{node}.longest_gap_s", f"{gap:.2f}")
            if gap > bound:
                problems.append(f"{node} ({OFFSETS[node]:+g} s): {gap:.2f} s without an "
                                f"increase of its cloud renewTime, more than {bound:g} s")
        if problems:
            self.fail(f"{what}: " + "; ".join(problems) + "\n" + self.world.log_tails())

    @defer.inlineCallbacks
    def wait_increasing(self, nodes, since, what):
        """Fire once every one of ``nodes`` was seen increasing twice after ``since``."""
        try:
            yield poll_until(lambda: all(self.renewals.seen_increasing(n, since) >= 2
                                         for n in nodes),
                             STEP_TIMEOUT, 0.1, reactor, what=what)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.world.log_tails()}") from None

    @defer.inlineCallbacks
    def test_a_pool_of_skewed_clocks_keeps_live_nodes_alive_and_lets_a_dead_one_go(self):
        world = self.world = ProcessWorld(reactor)
        self.addCleanup(world.stop)
        yield world.start()
        for node, offset in OFFSETS.items():
            yield world.add_agent(node, clock_offset=offset)
        self.renewals = CloudLeaseSampler(world.cloud, list(OFFSETS), reactor, every=0.05)
        self.addCleanup(self.renewals.stop)

        # 1. The agent 5 min ahead leads alone; skewed candidates join; all ready.
        yield world.start_agents([FIRST_LEADER])
        yield world.wait_for_pool(f"{FIRST_LEADER} leading alone",
                                  lambda s: one_leader_all_ready(s, 1), SETTLE_TIMEOUT)
        lead = yield self.lead_and_transitions()
        self.assertEqual(lead[0], FIRST_LEADER)
        joined_at = reactor.seconds()
        yield world.start_agents([n for n in OFFSETS if n != FIRST_LEADER])
        statuses = yield world.wait_for_pool(
            "five agents of skewed clocks all ready, one leader",
            lambda s: one_leader_all_ready(s, len(OFFSETS)), SETTLE_TIMEOUT)
        report("all_ready_after_s", f"{reactor.seconds() - joined_at:.1f}")
        self.assertEqual(leader_of(statuses), FIRST_LEADER)
        self.assertEqual((yield self.lead_and_transitions()), lead)

        # 2. Three nodes lose the cloud; the leader 5 min ahead keeps them increasing.
        yield world.cut_cloud(list(CUT_OFF))
        cut_at = reactor.seconds()
        yield self.wait_increasing(CUT_OFF, cut_at + INTERVAL,
                                   "the cut-off nodes forwarded by the leader 5 min ahead")
        delegating_at = reactor.seconds()
        yield self.wait(WATCH)
        self.check_gaps(CUT_OFF, delegating_at, reactor.seconds(), LIVE_BOUND,
                        "delegated by a leader 5 min ahead")
        self.assertEqual((yield self.lead_and_transitions()), lead)

        # 3. The kubelet of the node 2 min ahead dies.
        yield world.stop_kubelet(KUBELET_DIES)
        died_at = reactor.seconds()
        yield self.wait(STALE_BOUND + INTERVAL)
        last = self.renewals.last_increase(KUBELET_DIES)
        report("dead_kubelet.last_increase_after_s", f"{last - died_at:.2f}")
        self.assertLessEqual(last - died_at, STALE_BOUND,
                             f"{KUBELET_DIES}'s cloud renewTime still increased "
                             f"{last - died_at:.2f} s after its kubelet died")
        alive = [n for n in CUT_OFF if n != KUBELET_DIES]
        self.check_gaps(alive, died_at, reactor.seconds(), LIVE_BOUND,
                        "delegated while another node died")

        # 4. The leader 5 min ahead is SIGKILLed; the agent of true clock takes over.
        killed_at = reactor.seconds()
        world.agents[FIRST_LEADER].signal("KILL")
        yield world.agents[FIRST_LEADER].ended
        self.assertEqual(world.agents[FIRST_LEADER].exit_signal, signal.SIGKILL)
        yield poll_until(lambda: self.lead_and_transitions().addCallback(
            lambda lead: lead[0] == SUCCESSOR), STEP_TIMEOUT, 0.1, reactor,
            what=f"{SUCCESSOR} taking the lead over")
        report("takeover_s", f"{reactor.seconds() - killed_at:.2f}")
        yield self.wait(WATCH)
        self.check_gaps(alive, killed_at, reactor.seconds(), TAKEOVER_BOUND,
                        "across a takeover from 5 min ahead to a true clock")
        self.assertEqual(self.renewals.seen_increasing(KUBELET_DIES, died_at + STALE_BOUND), 0)
        lead = yield self.lead_and_transitions()

        # 5. The agent 5 min ahead comes back without the cloud: it does not take the
        # lead, and the leader of true clock forwards its heartbeats.
        yield world.cut_cloud([FIRST_LEADER])
        back_at = reactor.seconds()
        world.agents[FIRST_LEADER].start(world.ini_for(world.agents[FIRST_LEADER]))
        yield world.agents[FIRST_LEADER].wait_listening()
        # Without the cloud it follows without electing (it names no leader).
        yield world.wait_for_pool(
            f"{FIRST_LEADER} back, following and ready",
            lambda s: (s.get(FIRST_LEADER, {}).get("ready")
                       and s[FIRST_LEADER].get("role") == "follower"),
            SETTLE_TIMEOUT)
        yield self.wait_increasing([FIRST_LEADER], back_at,
                                   f"{FIRST_LEADER}'s heartbeats forwarded by {SUCCESSOR}")
        forwarded_at = reactor.seconds()
        yield self.wait(WATCH)
        self.check_gaps([FIRST_LEADER] + alive, forwarded_at, reactor.seconds(), LIVE_BOUND,
                        "a node 5 min ahead delegated by a true clock")
        self.assertEqual((yield self.lead_and_transitions()), lead)
        self.assertEqual(self.renewals.seen_increasing(KUBELET_DIES, died_at + STALE_BOUND), 0)
