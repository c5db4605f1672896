"""Two coordinator apiservers over one store, agents built in this process.

Two Kubernetes API test servers serve one object store, as two coordinator
apiservers serve one pool etcd; two agents are given both URLs. One server goes
down: the leader keeps the election lease (its renewals land on the other server),
no agent leaves ready, and each agent's ``/status`` and ``/metrics`` show which
server is down; the server comes back, answers the agents' probes and is shown
healthy again. Checked through the agents' pages and the servers' own stores and
answer logs, polled with bounded deadlines.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.testing.agentpages import StatusReader
from yurtcoord.testing.inprocess import (
    ELECTION_LEASE, ELECTION_NAMESPACE, PoolWorld, write_cached_pod,
)
from yurtcoord.testing.poll import poll_until

NODES = ("edge-1", "edge-2")
STEP_TIMEOUT = 30.0
# The agents' lease_duration (seconds, see agent_config_text): the leader must keep
# the lease over several of them while one server is down.
LEASE_DURATION = 2.0
ELECTION_LEASE_PATH = (f"/apis/coordination.k8s.io/v1/namespaces/{ELECTION_NAMESPACE}"
                       f"/leases/{ELECTION_LEASE}")
SERVER_GAUGE = "yurtcoord_coordinator_server_healthy_status"


def election_renewals(server, since):
    """Times at which ``server`` answered 200 to a write of the election lease."""
    return [at for at, method, path, code in server.answers
            if at >= since and method == "PUT" and path == ELECTION_LEASE_PATH
            and code == 200]


class TwoCoordinatorServersTests(unittest.TestCase):
    timeout = 180

    @defer.inlineCallbacks
    def setUp(self):
        self.world = PoolWorld(self, coordinator_servers=2, shared_etcd=True)
        yield self.world.start()
        self.reader = StatusReader()
        self.agents = {}
        for node in NODES:
            config = self.world.config(node)
            self.assertEqual(config.coordinator.server,
                             tuple(server.url for server in self.world.coordinators))
            write_cached_pod(config.pool_cache.local_cache_dir, f"pod-of-{node}", 10)
            self.agents[node] = self.world.start_agent(config)

    @defer.inlineCallbacks
    def statuses(self):
        documents = {}
        for node, agent in self.agents.items():
            documents[node] = yield self.reader.status(agent.status_http.url)
        return documents

    @defer.inlineCallbacks
    def wait_for_pool(self, what, predicate, timeout=STEP_TIMEOUT):
        seen = {}

        @defer.inlineCallbacks
        def check():
            seen["statuses"] = yield self.statuses()
            return predicate(seen["statuses"])

        try:
            yield poll_until(check, timeout, 0.05, reactor, what=what)
        except AssertionError as error:
            raise AssertionError(f"{error}; last statuses: {seen.get('statuses')}") from None
        return seen["statuses"]

    @staticmethod
    def one_leader_all_ready(statuses):
        roles = sorted(s["role"] for s in statuses.values())
        return (roles == ["follower", "leader"] and len({s["leader"] for s in
                                                         statuses.values()}) == 1
                and all(s["ready"] for s in statuses.values()))

    @defer.inlineCallbacks
    def not_ready_or_lease_lost(self, leader, transitions):
        """What is wrong now: an agent whose /readyz is not 200, a lease that is not
        ``leader``'s with ``transitions`` transitions; empty when all is well."""
        wrong = []
        for node, agent in self.agents.items():
            code, body = yield self.reader.get(agent.status_http.url, "readyz")
            if code != 200:
                wrong.append(f"{node} /readyz {code}: {body!r}")
        lease = self.world.election_lease()
        if (lease.holder_identity, lease.lease_transitions) != (leader, transitions):
            wrong.append(f"lease of {lease.holder_identity} with "
                         f"{lease.lease_transitions} transitions")
        return wrong

    @defer.inlineCallbacks
    def test_one_server_down_keeps_the_lease_and_every_agent_ready(self):
        first, second = self.world.coordinators
        statuses = yield self.wait_for_pool(
            "one leader, one follower, all ready, both servers healthy",
            lambda s: self.one_leader_all_ready(s) and all(
                d["coordinator_servers"] == {first.url: True, second.url: True}
                for d in s.values()))
        leader = next(node for node, s in statuses.items() if s["role"] == "leader")
        before = self.world.election_lease()
        self.assertEqual(before.holder_identity, leader)
        # The agents use the first server; the second is only read by the probes.
        self.assertEqual(election_renewals(second, 0.0), [])
        # The leader renews through the first (its creation of the lease is no renewal:
        # an agent may be ready before its first renewal).
        yield poll_until(lambda: len(election_renewals(first, 0.0)) > 0, 30.0, 0.05, reactor,
                         what="the leader renewing the election lease through the first server")
        self.assertEqual(election_renewals(second, 0.0), [])

        yield first.faults.down()
        down_at = reactor.seconds()

        # While the first server stays down, for several lease durations: every agent
        # stays ready and the lease keeps its holder, with no transition (every
        # sample is checked, and kept if wrong).
        wrong = []

        @defer.inlineCallbacks
        def failed_over():
            now_wrong = yield self.not_ready_or_lease_lost(leader, before.lease_transitions)
            wrong.extend(now_wrong)
            documents = yield self.statuses()
            return (reactor.seconds() - down_at > 3 * LEASE_DURATION
                    and all(d["coordinator_servers"] == {first.url: False, second.url: True}
                            and d["coordinator_healthy"] for d in documents.values())
                    and second.open_watches > 0)

        yield poll_until(failed_over, STEP_TIMEOUT, 0.05, reactor,
                         what="both agents on the second server, the first one shown down")
        self.assertEqual(wrong, [])
        renewals = election_renewals(second, down_at)
        self.assertGreater(len(renewals), 3)
        after = self.world.election_lease()
        self.assertEqual((after.holder_identity, after.lease_transitions),
                         (leader, before.lease_transitions))
        self.assertEqual(after.acquire_time, before.acquire_time)
        self.assertGreater(after.renew_time, before.renew_time)
        for node, agent in self.agents.items():
            samples = yield self.reader.metrics(agent.status_http.url)
            self.assertEqual(samples[f'{SERVER_GAUGE}{{server="{first.url}"}}'], 0.0)
            self.assertEqual(samples[f'{SERVER_GAUGE}{{server="{second.url}"}}'], 1.0)
        print(f"first server down to the first election renewal through the second: "
              f"{renewals[0] - down_at:.2f} s")

        # The first server comes back: probed (read) and shown healthy again.
        yield first.faults.up()
        up_at = reactor.seconds()
        yield self.wait_for_pool(
            "both servers healthy again",
            lambda s: self.one_leader_all_ready(s) and all(
                d["coordinator_servers"] == {first.url: True, second.url: True}
                for d in s.values()))
        yield poll_until(
            lambda: any(at >= up_at and code == 200 for at, _m, _p, code in first.answers),
            STEP_TIMEOUT, 0.05, reactor, what="the first server answering the agents again")
        now_wrong = yield self.not_ready_or_lease_lost(leader, before.lease_transitions)
        self.assertEqual(now_wrong, [])
