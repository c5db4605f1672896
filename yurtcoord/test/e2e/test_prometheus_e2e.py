"""The pool's alerts in a real Prometheus (Debian package ``prometheus``) scraping a
pool of three separate ``twistd`` agents, every second, with the rules of
``yurtcoord.monitoring.alerts`` written with short thresholds and ``for:`` durations.

- A follower's kubelet stops: ``YurtcoordNodeHeartbeatStale`` fires for its node (its
  agent stops renewing it), ``YurtcoordHeartbeatDelegationFailing`` never does (the
  kubelet is dead, not the delegation); the kubelet starts again: the alert resolves.
- The leader is SIGKILLed: another agent takes over and ``YurtcoordPoolNoLeader`` never
  fires, although Prometheus saw the pool without a leader during the takeover.

Prometheus listens on loopback with its own temporary config and data directory and is
killed at the end. Times are printed as ``PROMETHEUS-E2E <name>=<seconds>s`` lines.
"""

import time

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.monitoring.alerts import rules_document, shortened
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.prometheus import MISSING, PROMETHEUS, PrometheusProcess
from yurtcoord.testing.world import POOL, ProcessWorld, leader_of, one_leader_all_ready

NODES = ("edge-1", "edge-2", "edge-3")
GRACE = 3.0
HEARTBEAT = {"interval": "1s", "timeout": "300ms"}
# Stale after 5 s without a cloud write, for 3 s; no leader for 12 s (a takeover with
# the suite's 3 s election lease takes about 4 s).
FOR_SECONDS, STALE_SECONDS, NO_LEADER_SECONDS = 3, 5, 12
SETTLE_TIMEOUT = 60.0
STEP_TIMEOUT = 60.0


def report(name, seconds):
    print(f"PROMETHEUS-E2E {name}={seconds:.2f}s")


def named(alerts, name, state=None, **labels):
    return [a for a in alerts if a["labels"].get("alertname") == name
            and (state is None or a["state"] == state)
            and all(a["labels"].get(k) == v for k, v in labels.items())]


class PrometheusAlertsTests(unittest.TestCase):
    timeout = 300

    @defer.inlineCallbacks
    def setUp(self):
        if PROMETHEUS is None:
            raise unittest.SkipTest(MISSING)
        self.world = ProcessWorld(reactor, kubelet_grace_period=f"{GRACE:g}s")
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for node in NODES:
            yield self.world.add_agent(node)
        yield self.world.start_agents(heartbeat=HEARTBEAT)
        self.statuses = yield self.world.wait_for_pool(
            "one leader among 3 agents, all ready", lambda s: one_leader_all_ready(s, 3),
            SETTLE_TIMEOUT)
        targets = [a.url.split("://", 1)[1].rstrip("/") for a in self.world.agents.values()]
        rules = rules_document(shortened(FOR_SECONDS, STALE_SECONDS, NO_LEADER_SECONDS))
        self.prometheus = PrometheusProcess(reactor, targets, rules)
        self.addCleanup(self.prometheus.stop)
        yield self.prometheus.start()
        yield poll_until(self.pool_seen, SETTLE_TIMEOUT, 0.5, reactor,
                         what="prometheus scraping 3 agents, one leader recorded")
        self.seen_alerts = []

    @defer.inlineCallbacks
    def pool_seen(self):
        up = yield self.prometheus.query('sum(up{job="yurtcoord"})')
        leaders = yield self.prometheus.query(f'yurtcoord:pool_leaders:sum{{pool="{POOL}"}}')
        return (bool(up) and float(up[0]["value"][1]) == 3
                and bool(leaders) and float(leaders[0]["value"][1]) == 1)

    @defer.inlineCallbacks
    def alerts(self):
        """The active alerts now; every answer is kept for the checks that an alert
        never fired."""
        answer = yield self.prometheus.alerts()
        self.seen_alerts.append(answer)
        return answer

    def fired_ever(self, name, **labels):
        return [a for answer in self.seen_alerts for a in named(answer, name, "firing", **labels)]

    @defer.inlineCallbacks
    def test_stale_heartbeat_fires_and_resolves_no_leader_stays_silent(self):
        leader = leader_of(self.statuses)
        follower = sorted(n for n in NODES if n != leader)[0]

        # A follower's kubelet dies: its heartbeat stops and the alert fires.
        stopped_at = time.monotonic()
        yield self.world.stop_kubelet(follower)

        @defer.inlineCallbacks
        def stale_firing():
            alerts = yield self.alerts()
            return named(alerts, "YurtcoordNodeHeartbeatStale", "firing", node=follower,
                         pool=POOL)

        yield poll_until(stale_firing, STEP_TIMEOUT, 0.5, reactor,
                         what=f"YurtcoordNodeHeartbeatStale firing for {follower}")
        report("stale_fired_after_kubelet_stop", time.monotonic() - stopped_at)
        self.assertEqual(self.fired_ever("YurtcoordNodeHeartbeatStale", node=leader), [])
        self.assertEqual(self.fired_ever("YurtcoordHeartbeatDelegationFailing"), [])

        # It comes back: the node is renewed and the alert resolves.
        started_at = time.monotonic()
        self.world.start_kubelet(follower)

        @defer.inlineCallbacks
        def stale_resolved():
            alerts = yield self.alerts()
            return not named(alerts, "YurtcoordNodeHeartbeatStale", node=follower)

        yield poll_until(stale_resolved, STEP_TIMEOUT, 0.5, reactor,
                         what=f"YurtcoordNodeHeartbeatStale resolved for {follower}")
        report("stale_resolved_after_kubelet_start", time.monotonic() - started_at)
        self.assertEqual(self.fired_ever("YurtcoordHeartbeatDelegationFailing"), [])

        # The leader is SIGKILLed: another agent takes over, the pool is without a
        # leader for a few seconds, and the no-leader alert stays silent.
        killed_at = time.monotonic()
        self.world.agents[leader].signal("KILL")

        @defer.inlineCallbacks
        def new_leader_recorded():
            yield self.alerts()
            leading = yield self.prometheus.query(
                "(node_yurthub_yurt_coordinator_yurthub_role == 1) "
                "* on(instance, job) group_left(node) yurtcoord_agent_info")
            leaders = yield self.prometheus.query(
                f'yurtcoord:pool_leaders:sum{{pool="{POOL}"}}')
            return ([s["metric"]["node"] for s in leading] not in ([], [leader])
                    and bool(leaders) and float(leaders[0]["value"][1]) == 1)

        yield poll_until(new_leader_recorded, STEP_TIMEOUT, 0.5, reactor,
                         what="prometheus recording a new leader after the SIGKILL")
        took_over = time.monotonic() - killed_at
        report("takeover_recorded", took_over)

        # The rule saw the gap: the recorded leader count was 0 meanwhile.
        window = int(took_over) + 5
        gap = yield self.prometheus.query(
            f'min_over_time(yurtcoord:pool_leaders:sum{{pool="{POOL}"}}[{window}s])')
        self.assertEqual(float(gap[0]["value"][1]), 0.0)

        # Watched past the longest the alert could have been pending.
        watch_until = killed_at + took_over + NO_LEADER_SECONDS + 3

        @defer.inlineCallbacks
        def watched():
            yield self.alerts()
            return time.monotonic() > watch_until

        yield poll_until(watched, NO_LEADER_SECONDS + STEP_TIMEOUT, 0.5, reactor,
                         what="the no-leader alert watched past its for: duration")
        self.assertEqual(self.fired_ever("YurtcoordPoolNoLeader"), [])
        self.assertEqual(self.fired_ever("YurtcoordPoolSeveralLeaders"), [])
        report("no_leader_watched", time.monotonic() - killed_at)
