"""The fault suite of SPEC §8 with every agent a separate ``twistd -n yurtcoord`` process.

Each test builds a ``ProcessWorld`` (real etcd, cloud and coordinator API test servers
in this process, agents as child processes reaching the cloud through TCP proxies),
waits for one leader and all agents ready, applies one fault, and then checks, from
the outside only: roles and readiness read from each agent's ``/status``, and the pool
etcd read with ``etcdctl`` compared with the cloud's endpoints and with the agents'
local caches (nothing lost, nothing regressed).

Measured times are printed as ``FAULT-SUITE <name>=<seconds>s`` lines.
"""

import json
import os
import re
import signal

from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from yurtcoord.kube.gvr import CONFIGMAPS, ENDPOINTS
from yurtcoord.testing.poll import PollTimeout, poll_until
from yurtcoord.testing.world import (
    ELECTION_LEASE, HEARTBEAT_INTERVAL, LEASE_DURATION, RETRY_PERIOD,
    ProcessWorld, endpoints, leader_of, one_leader_all_ready,
)

STEP_TIMEOUT = 30.0
SETTLE_TIMEOUT = 45.0
COORDINATOR_SERVER_GAUGE = "yurtcoord_coordinator_server_healthy_status"


def report(name, seconds):
    print(f"FAULT-SUITE {name}={seconds:.2f}s")


class FaultSuiteBase(unittest.TestCase):
    """A fresh world per test: ``nodes`` prepared with ``pods_per_agent`` cached pods,
    the cloud holding ``initial_endpoints`` endpoints; agents are started by the test."""

    timeout = 120
    nodes = ("edge-1", "edge-2", "edge-3")
    pods_per_agent = 20
    initial_endpoints = 50
    coordinator_servers = 1
    etcd_members = 1
    # One agent's clock runs ahead, as an edge node's that lost NTP: no fault may
    # turn that into a wrong role, a lost object or a dead node kept alive.
    skewed = {"edge-2": 120.0}

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, coordinator_servers=self.coordinator_servers,
                                  etcd_members=self.etcd_members)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        for index in range(self.initial_endpoints):
            self.world.cloud.store.create(ENDPOINTS, endpoints(f"svc-{index}",
                                                               f"10.0.0.{index % 250}"))
        for node in self.nodes:
            yield self.world.add_agent(node, pods=self.pods_per_agent,
                                       clock_offset=self.skewed.get(node, 0.0))

    # -- helpers -----------------------------------------------------------------------

    @defer.inlineCallbacks
    def start_and_settle(self, nodes=None):
        began = reactor.seconds()
        yield self.world.start_agents(nodes)
        statuses = yield self.settled(len(nodes or self.nodes))
        report(f"{self.id().rsplit('.', 1)[-1]}.start_to_all_ready", reactor.seconds() - began)
        return statuses

    def settled(self, count=None, timeout=SETTLE_TIMEOUT):
        count = count or len(self.world.running_agents())
        return self.world.wait_for_pool(
            f"one leader among {count} agents, all following it, all ready",
            lambda s: one_leader_all_ready(s, count), timeout)

    @defer.inlineCallbacks
    def check_settled_and_exact(self, count=None):
        statuses = yield self.settled(count)
        leader = leader_of(statuses)
        holder = yield self.world.election_holder()
        self.assertEqual(holder, leader)
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        return statuses

    @defer.inlineCallbacks
    def wait_for_log(self, node, text, timeout=STEP_TIMEOUT):
        agent = self.world.agents[node]
        try:
            yield poll_until(lambda: text in agent.log_text(), timeout, 0.05, reactor,
                             what=f"{node} logging {text!r}")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{agent.log_tail()}") from None


class LeaderLossTests(FaultSuiteBase):
    """The leader process dies or stops: another agent takes over in time."""

    @defer.inlineCallbacks
    def test_leader_sigkill_fails_over_within_lease_duration(self):
        statuses = yield self.start_and_settle()
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        leader = leader_of(statuses)
        victim = self.world.agents[leader]
        victim.signal("KILL")
        killed_at = reactor.seconds()
        yield victim.ended
        statuses = yield self.world.wait_for_pool(
            f"a new leader after {leader} was killed",
            lambda s: leader_of(s) not in (None, leader), timeout=STEP_TIMEOUT, interval=0.02)
        failover = reactor.seconds() - killed_at
        report("failover_sigkill", failover)
        bound = LEASE_DURATION + RETRY_PERIOD + 1.0
        self.assertLessEqual(failover, bound, self.world.log_tails())
        self.assertEqual((victim.exit_code, victim.exit_signal), (None, signal.SIGKILL))
        self.world.change_cloud_endpoints("after-kill")
        yield self.check_settled_and_exact(len(self.nodes) - 1)

    @defer.inlineCallbacks
    def test_leader_sigterm_releases_the_lease_at_once(self):
        statuses = yield self.start_and_settle()
        leader = leader_of(statuses)
        victim = self.world.agents[leader]
        victim.signal("TERM")
        stopped_at = reactor.seconds()
        statuses = yield self.world.wait_for_pool(
            f"a new leader after {leader} was stopped",
            lambda s: leader_of(s) not in (None, leader), timeout=STEP_TIMEOUT, interval=0.02)
        release = reactor.seconds() - stopped_at
        report("release_sigterm", release)
        exit_code = yield victim.ended
        self.assertEqual(exit_code, 0, victim.log_tail())
        self.assertIn("received SIGTERM, stopping", victim.log_text())
        self.assertNotIn("Traceback", victim.log_text())
        self.assertLessEqual(release, RETRY_PERIOD + 1.0, self.world.log_tails())
        self.world.change_cloud_endpoints("after-term")
        yield self.check_settled_and_exact(len(self.nodes) - 1)


class EtcdRestartTests(FaultSuiteBase):
    """The pool etcd is SIGKILLed in the middle of a big write and started again."""

    nodes = ("edge-1", "edge-2")

    @defer.inlineCallbacks
    def kill_etcd_when(self, what, prefix, low, high):
        """SIGKILL etcd as soon as ``low < keys under prefix < high``; fire with the count."""
        count = yield self.world.wait_for_keys_between(what, prefix, low, high, STEP_TIMEOUT)
        yield self.world.kill_etcd()
        return count

    @defer.inlineCallbacks
    def restart_etcd_and_check(self, killed_with, node, failure_line):
        """Once ``node`` logged ``failure_line`` (etcd gone), change the cloud, start
        etcd again, and wait for the pool to settle and the etcd to be exact."""
        name = self.id().rsplit(".", 1)[-1]
        print(f"FAULT-SUITE {name}.keys_when_killed={killed_with}")
        yield self.wait_for_log(node, failure_line)
        self.world.change_cloud_endpoints("while-etcd-down")
        yield self.world.restart_etcd()
        restarted_at = reactor.seconds()
        yield self.check_settled_and_exact(len(self.nodes))
        report(f"{name}.etcd_restart_to_exact", reactor.seconds() - restarted_at)


class EtcdKilledMidSyncTests(EtcdRestartTests):
    initial_endpoints = 3000

    @defer.inlineCallbacks
    def test_etcd_killed_and_restarted_while_the_leader_mirrors_endpoints(self):
        yield self.world.start_agents()
        count = yield self.kill_etcd_when("pool sync of 3000 endpoints",
                                          "/registry/services/endpoints/",
                                          0, self.initial_endpoints)
        statuses = yield self.world.statuses()
        leader = leader_of(statuses)
        self.assertIsNotNone(leader, statuses)
        yield self.restart_etcd_and_check(count, leader, "pool sync of endpoints.v1 failed")


class EtcdKilledMidUploadTests(EtcdRestartTests):
    pods_per_agent = 0
    big_cache = 5000

    @defer.inlineCallbacks
    def test_etcd_killed_and_restarted_while_an_agent_uploads_its_cache(self):
        self.world.agents["edge-1"].write_pods(self.big_cache, padding=200)
        self.world.agents["edge-2"].write_pods(20)
        # edge-2 also caches older copies of some of edge-1's pods: whichever agent
        # uploads first, the newer copies must win.
        self.world.agents["edge-2"].write_pods(10, prefix="edge-1-pod", first_rv=1)
        yield self.world.start_agents()
        count = yield self.kill_etcd_when("upload of 5000 cached pods", "/registry/pods/",
                                          30, self.big_cache)
        yield self.restart_etcd_and_check(count, "edge-1", "local cache upload interrupted")


class CoordinatorRestartTests(FaultSuiteBase):
    """The coordinator apiserver goes down and comes back."""

    @defer.inlineCallbacks
    def test_coordinator_apiserver_down_then_up(self):
        yield self.start_and_settle()
        yield self.world.coordinator.faults.down()
        down_at = reactor.seconds()
        yield self.world.wait_for_pool(
            "every agent pending, none ready",
            lambda s: all(d["role"] == "pending" and not d["ready"]
                          and not d["coordinator_healthy"] for d in s.values()),
            timeout=STEP_TIMEOUT)
        report("coordinator_down_to_all_pending", reactor.seconds() - down_at)
        for node in self.nodes:
            self.assertIn("is unhealthy", self.world.agents[node].log_text())
        self.world.change_cloud_endpoints("while-coordinator-down")
        yield self.world.coordinator.faults.up()
        up_at = reactor.seconds()
        yield self.check_settled_and_exact()
        report("coordinator_up_to_exact", reactor.seconds() - up_at)
        for agent in self.world.agents.values():
            self.assertTrue(agent.running, agent.log_tail())


class CoordinatorServerLossTests(FaultSuiteBase):
    """One of two coordinator apiservers over one store stops and comes back: the
    agents move to the other one at once, none leaves ready, the leader keeps its
    election lease, and the pool stays exact.

    Over a pool etcd of one member: the apiservers share one storage and its etcd
    client whatever the number of members, so a cluster under them changes nothing
    of this fault. A coordinator apiserver lost over a cluster of three members is
    ``test_etcd_ha_e2e.EtcdClusterFaultsMixin.test_coordinator_apiserver_killed_while_the_leader_mirrors_endpoints``."""

    coordinator_servers = 2

    @defer.inlineCallbacks
    def test_one_coordinator_apiserver_stopped_then_back(self):
        statuses = yield self.start_and_settle()
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        leader = leader_of(statuses)
        first, second = self.world.coordinators
        before = (yield self.world.election_lease())["spec"]
        self.assertEqual(before["holderIdentity"], leader)
        urls = [first.url, second.url]
        for document in statuses.values():
            self.assertEqual(document["coordinator_servers"], dict.fromkeys(urls, True))

        yield first.faults.down()
        down_at = reactor.seconds()
        self.world.change_cloud_endpoints("while-one-coordinator-down")
        # Every sample of every agent, until the outage has lasted several lease
        # durations: ready, the same leader, the lease never changing hands.
        wrong = []

        @defer.inlineCallbacks
        def all_ready_same_leader():
            documents = yield self.world.statuses()
            for node, document in documents.items():
                if not document["ready"] or document["role"] not in ("leader", "follower"):
                    wrong.append((node, document["role"], document["ready"]))
            spec = (yield self.world.election_lease())["spec"]
            if (spec["holderIdentity"], spec.get("leaseTransitions", 0),
                    spec["acquireTime"]) != (leader, before.get("leaseTransitions", 0),
                                             before["acquireTime"]):
                wrong.append(("lease", spec))
            return (reactor.seconds() - down_at > 3 * LEASE_DURATION + HEARTBEAT_INTERVAL
                    and all(d["coordinator_servers"] == {first.url: False, second.url: True}
                            and d["coordinator_healthy"] for d in documents.values()))

        try:
            yield poll_until(all_ready_same_leader, STEP_TIMEOUT, 0.05, reactor,
                             what="every agent on the second coordinator apiserver")
        except PollTimeout as e:
            raise PollTimeout(f"{e}\n{self.world.log_tails()}") from None
        self.assertEqual(wrong, [])
        renewals = [at for at, method, path, code in second.answers
                    if at >= down_at and method == "PUT" and code == 200
                    and path.endswith(f"/leases/{ELECTION_LEASE}")]
        self.assertTrue(renewals, "no election lease renewal through the second server")
        report("coordinator_server_down_to_renewal_through_the_other", renewals[0] - down_at)
        spec = (yield self.world.election_lease())["spec"]
        self.assertGreater(spec["renewTime"], before["renewTime"])
        for node, agent in self.world.running_agents().items():
            response = yield self.world.http.get(f"{agent.url}/readyz", timeout=5)
            yield response.content()
            self.assertEqual((node, response.code), (node, 200))
            samples = yield self.world.metrics(agent)
            self.assertEqual(
                samples[f'{COORDINATOR_SERVER_GAUGE}{{server="{first.url}"}}'], 0.0)
        yield self.world.wait_pool_exact(STEP_TIMEOUT)

        yield first.faults.up()
        up_at = reactor.seconds()
        yield self.world.wait_for_pool(
            "every agent seeing both coordinator apiservers healthy",
            lambda s: one_leader_all_ready(s, len(self.nodes)) and all(
                d["coordinator_servers"] == dict.fromkeys(urls, True) for d in s.values()),
            timeout=STEP_TIMEOUT)
        report("coordinator_server_up_to_healthy", reactor.seconds() - up_at)
        after = yield self.world.election_lease()
        self.assertEqual(after["spec"]["holderIdentity"], leader)
        self.assertEqual(after["spec"].get("leaseTransitions", 0),
                         before.get("leaseTransitions", 0))
        for agent in self.world.agents.values():
            self.assertTrue(agent.running, agent.log_tail())


class CloudCutTests(FaultSuiteBase):
    """Every agent loses the cloud: nobody may lead; heartbeats wait in the coordinator."""

    @defer.inlineCallbacks
    def annotations(self):
        """``{node: delegate annotation of its lease in the coordinator}``."""
        found = {}
        for node in self.nodes:
            found[node] = yield self.world.coordinator_delegate_annotation(node)
        return found

    @defer.inlineCallbacks
    def test_cloud_cut_for_all_agents_then_restored(self):
        yield self.start_and_settle()
        yield self.world.cut_cloud()
        cut_at = reactor.seconds()
        yield self.world.wait_for_pool(
            "every agent follower without the cloud",
            lambda s: all(d["role"] == "follower" and not any(d["cloud"].values())
                          for d in s.values()),
            timeout=STEP_TIMEOUT)
        report("cloud_cut_to_all_follower", reactor.seconds() - cut_at)
        yield poll_until(
            lambda: self.annotations().addCallback(
                lambda found: all(value == "true" for value in found.values())),
            STEP_TIMEOUT, 0.05, reactor,
            what="the delegate annotation on every node lease in the coordinator")
        self.world.change_cloud_endpoints("while-cloud-cut")
        self.world.restore_cloud()
        restored_at = reactor.seconds()
        yield self.check_settled_and_exact()
        report("cloud_restore_to_exact", reactor.seconds() - restored_at)
        yield poll_until(
            lambda: self.annotations().addCallback(
                lambda found: all(value is None for value in found.values())),
            STEP_TIMEOUT, 0.05, reactor,
            what="the delegate annotation removed from every node lease")


class CloudAnswerFaultTests(FaultSuiteBase):
    """The cloud's watches break, it answers 500 or garbage, or it answers slowly."""

    nodes = ("edge-1", "edge-2")

    @defer.inlineCallbacks
    def test_watch_cut_mid_line(self):
        statuses = yield self.start_and_settle()
        leader = leader_of(statuses)
        faults = self.world.cloud.faults
        for round_number in range(3):
            self.world.change_cloud_endpoints(f"cut-{round_number}", created=5, updated=5,
                                        deleted=2)
            self.assertGreater(self.world.cloud.open_watches, 0)
            faults.cut_watches(mid_line=True)
            self.world.change_cloud_endpoints(f"after-cut-{round_number}", created=5, updated=5,
                                        deleted=2)
            yield self.world.wait_pool_exact(STEP_TIMEOUT)
        self.assertIn("informer reconnecting gvr=core/v1/endpoints",
                      self.world.agents[leader].log_text())
        yield self.check_settled_and_exact()

    @defer.inlineCallbacks
    def test_garbage_and_500_answers(self):
        statuses = yield self.start_and_settle()
        leader = leader_of(statuses)
        faults = self.world.cloud.faults
        # Every watch restarts with a list: the history is gone past a version no
        # watch has seen (a write nobody watches, then compaction, in one turn), so a
        # resumed watch gets 410. The relists of the endpoints meet the broken answers.
        faults.fail_next(2, code=500, path="/api/v1/endpoints", query="limit=")
        faults.garbage_next(2, path="/api/v1/endpoints", query="limit=")
        self.world.cloud.store.create(CONFIGMAPS, {
            "metadata": {"name": "history-marker", "namespace": "default"}})
        self.world.cloud.store.compact()
        faults.cut_watches()
        self.world.change_cloud_endpoints("during-errors")
        # More than failed_retry broken answers per agent: some heartbeat probe fails.
        faults.fail_next(4, code=500, path="/leases")
        faults.garbage_next(4, path="/leases")
        expected = [
            r"informer list failed gvr=core/v1/endpoints reason=injected failure \(500\)",
            r"informer list failed gvr=core/v1/endpoints reason=not JSON from",
            # A probe fails after failed_retry attempts; its last error names the server.
            r"server http://\S+ is unhealthy: ServerError: (injected failure|not JSON)",
        ]

        def logs():
            return "\n".join(self.world.agents[n].log_text() for n in self.nodes)

        def all_logged():
            text = logs()
            missing = [e for e in expected if not re.search(e, text)]
            if missing:
                raise AssertionError(f"not logged: {missing}")
            return True

        yield poll_until(all_logged, STEP_TIMEOUT, 0.1, reactor,
                         what="the broken answers logged")
        yield self.check_settled_and_exact()
        log = logs()
        self.assertNotIn("Traceback", log)
        self.assertIn(leader, self.nodes)

    @defer.inlineCallbacks
    def test_slow_answers_still_converge(self):
        statuses = yield self.start_and_settle()
        leader = leader_of(statuses)
        # Slower than a renewal period on both apiservers, well within every timeout:
        # the pool keeps its leader, and relists (watches cut) still complete.
        self.world.cloud.faults.latency = 0.6
        self.world.coordinator.faults.latency = 0.3
        slowed_at = reactor.seconds()
        self.world.cloud.faults.cut_watches()
        self.world.change_cloud_endpoints("slow")
        statuses = yield self.check_settled_and_exact()
        report("slow_answers_to_exact", reactor.seconds() - slowed_at)
        self.assertEqual(leader_of(statuses), leader, self.world.log_tails())
        self.world.cloud.faults.clear()
        self.world.coordinator.faults.clear()


class CorruptLocalCacheTests(FaultSuiteBase):
    """Bad files in a local cache are skipped, counted and logged; the rest is uploaded."""

    nodes = ("edge-1", "edge-2")

    @defer.inlineCallbacks
    def test_corrupt_cache_files_are_skipped_and_counted(self):
        agent = self.world.agents["edge-1"]
        good = json.dumps({"metadata": {"name": "truncated", "namespace": "default",
                                        "resourceVersion": "5"}}).encode()
        agent.write_cache_file("default", "truncated", good[:len(good) // 2])
        agent.write_cache_file("default", "no-rv", json.dumps(
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "no-rv", "namespace": "default"}}).encode())
        os.makedirs(os.path.join(agent.cache_dir, "kubelet", "pods.v1.core", "default",
                                 "a-directory", "inner"))
        yield self.start_and_settle()
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        stored = yield self.world.read_etcd("/registry/pods/default/")
        for bad in ("truncated", "no-rv", "a-directory"):
            self.assertNotIn(f"/registry/pods/default/{bad}", stored)
        self.assertEqual(len(stored), 2 * self.pods_per_agent)
        seen = {}

        @defer.inlineCallbacks
        def counted_as_logged():
            samples = seen["samples"] = yield self.world.metrics(agent)
            seen["log"] = agent.log_text()
            seen["counted"] = sum(value for name, value in samples.items()
                                  if name.startswith("yurtcoord_skipped_objects_total")
                                  and 'reason="not_newer"' not in name)
            seen["skipped"] = [line for line in seen["log"].splitlines()
                               if "local cache file skipped" in line]
            return seen["skipped"] and seen["counted"] == len(seen["skipped"])

        try:
            yield poll_until(counted_as_logged, STEP_TIMEOUT, 0.1, reactor,
                             what="skipped files counted in /metrics as logged")
        except PollTimeout as e:
            raise PollTimeout(f"{e}: counted {seen.get('counted')}, logged:\n"
                              + "\n".join(seen.get("skipped") or [agent.log_tail()])) from None
        log, skipped = seen["log"], seen["skipped"]
        # A role change during the start (follower, then leader) may upload again;
        # every upload skips, logs and counts the same three files, and only them.
        uploads = [line for line in log.splitlines() if "local cache uploaded: " in line]
        self.assertTrue(uploads, agent.log_tail())
        for line in uploads:
            self.assertIn(" 3 bad files", line, agent.log_tail())
        times = {bad: sum(f"/default/{bad}: " in line for line in skipped)
                 for bad in ("truncated", "no-rv", "a-directory")}
        rounds = times["truncated"]
        self.assertGreaterEqual(rounds, 1)
        self.assertEqual(times, dict.fromkeys(times, rounds), skipped)
        self.assertEqual(len(skipped), 3 * rounds, "\n".join(skipped))
        self.assertRegex(log, r"/default/truncated: not JSON")
        self.assertRegex(log, r"/default/no-rv: no resourceVersion")
        self.assertRegex(log, r"/default/a-directory: a directory where an object file")
        by_reason = {reason: seen["samples"].get(
            f'yurtcoord_skipped_objects_total{{reason="{reason}"}}') for reason in
            ("unreadable", "bad_object")}
        self.assertEqual(by_reason, {"unreadable": rounds, "bad_object": 2 * rounds})
        status = yield self.world.status(agent)
        self.assertTrue(status["ready"] and status["local_cache_uploaded"], status)


class PoolJudgeTests(FaultSuiteBase):
    """The comparison every fault test relies on notices what it must notice."""

    nodes = ("edge-1",)
    initial_endpoints = 5

    @defer.inlineCallbacks
    def test_judge_reports_lost_left_over_and_regressed_objects(self):
        yield self.start_and_settle()
        yield self.world.wait_pool_exact(STEP_TIMEOUT)
        pods = sorted(self.world.agents["edge-1"].expected_pods)
        regressed = json.dumps(
            {"metadata": {"name": pods[0].rsplit("/", 1)[1], "namespace": "default",
                          "resourceVersion": "1"}})
        etcd = self.world.etcd
        # Written behind the agents' backs: the pool must be found inexact.
        yield threads.deferToThread(etcd.put, pods[0], regressed)
        yield threads.deferToThread(etcd.put, "/mirror/rv" + pods[0], "0" * 31 + "1")
        yield threads.deferToThread(etcd.etcdctl, "del", pods[1])
        problems = yield self.world.pool_problems()
        self.assertIn(f"{pods[0]}: regressed to rv 1 below the cached "
                      f"{self.world.agents['edge-1'].expected_pods[pods[0]]}", problems)
        self.assertIn(f"{pods[1]}: in edge-1's cache, missing in the pool etcd", problems)
        # An endpoints object deleted in the cloud behind the leader's back (no event),
        # and one created in the cloud without the leader hearing of it.
        self.world.cloud.faults.stall_watches()
        self.world.cloud.store.delete(ENDPOINTS, "svc-0", "default")
        self.world.cloud.store.create(ENDPOINTS, endpoints("unseen", "10.2.0.1"))
        problems = yield self.world.pool_problems()
        self.assertIn("/registry/services/endpoints/default/svc-0: in the pool etcd, "
                      "deleted in the cloud", problems)
        self.assertTrue(any(p.startswith("/registry/services/endpoints/default/unseen: in "
                                         "the cloud") for p in problems), problems)
