"""Every node speaks only for itself, end to end: a pool whose members are hostile.

A ``ProcessWorld`` with ``identities``: the coordinator apiserver and the pool etcd
serve TLS and require client certificates of the pool's CA, the coordinator
authorizes as kube-apiserver's Node authorizer and NodeRestriction do, and each of the
three agents (separate ``twistd`` processes) reaches it with its node's own
certificate, the kubelet's ``kubelet-client-current.pem``.

- A member cannot keep a dead node alive: one node is cut off from the cloud (the
  leader forwards its heartbeats), then its agent is SIGKILLed, while another member,
  using its own node's certificate as a compromised node would, renews the dead node's
  pool lease every heartbeat interval. The coordinator refuses each write with 403
  (its request log names the member's user), and the dead node's cloud renewTime
  stops moving within the kubelet grace period plus one interval of the kill.
- Names made up by the ten thousand cost the leader neither memory nor a cloud request
  each: 50,000 delegated leases of names that are no Node are written straight into
  the pool etcd (around the coordinator's authorization, as anyone holding the pool
  etcd's client certificate could). The leader sees and counts every one, its resident
  memory grows by less than 20 MB, and the cloud is asked about at most
  ``MAX_NODE_READS_PER_MINUTE`` names a minute.
"""

import json
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.trial import unittest

from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import KubeError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.names import NODE_LEASE_NAMESPACE
from yurtcoord.testing.cloudleases import CloudLeaseChanges
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import (
    HEARTBEAT_INTERVAL, KUBELET_GRACE_PERIOD, ProcessWorld, one_leader_all_ready,
)
from yurtcoord.agent.config import parse_duration
from yurtcoord.etcd.client import EtcdClient
from yurtcoord.etcd.txaioetcd_private import txaioetcd
from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION

NODES_OF_POOL = ("edge-1", "edge-2", "edge-3")
INTERVAL = HEARTBEAT_INTERVAL
GRACE = parse_duration(KUBELET_GRACE_PERIOD)
STEP_TIMEOUT = 30.0
SETTLE_TIMEOUT = 60.0
MADE_UP = 50_000
# etcd's default --max-txn-ops.
TXN_OPS = 128
# What the leader may read of the cloud's Nodes for names it does not know, a minute
# (the delegation's bound).
MAX_NODE_READS_PER_MINUTE = 512
RSS_GROWTH_KIB = 20 * 1024
REFUSED = "yurtcoord_heartbeat_delegation_refused_total"


def report(name: str, value: Any) -> None:
    print(f"IDENTITIES-E2E {name}={value}")


class HostileMemberTests(unittest.TestCase):
    timeout = 240

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor, identities=True)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        self.cloud_log = CloudLeaseChanges(self.world.cloud, reactor)
        self.addCleanup(self.cloud_log.stop)
        self.leader = yield self.world.run_pool(NODES_OF_POOL, SETTLE_TIMEOUT)

    def client_as(self, node: str) -> KubeClient:
        """A client of the coordinator apiserver holding ``node``'s own certificate, as
        a compromised node holds its kubelet's."""
        world = self.world
        cert = world.agents[node].node_cert
        assert world.ca is not None and cert is not None
        client = KubeClient(reactor, ClientConfig(
            server=str(world.coordinator.url), ca_file=world.ca.ca_file, cert_file=cert,
            key_file=cert, timeout=5.0))
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def renew_as(self, client: KubeClient, name: str) -> Any:
        """Renew ``kube-node-lease/name`` through ``client`` as its holder would (a
        lease it may not even read written from scratch); fire with the HTTP code the
        coordinator answered the write with."""
        try:
            lease = yield client.get(LEASES, name, namespace=NODE_LEASE_NAMESPACE)
        except KubeError as error:
            if error.code != 403:
                raise
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE},
                     "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}
        lease["spec"]["renewTime"] = format_micro_time(reactor.seconds())
        try:
            yield client.update(LEASES, lease, namespace=NODE_LEASE_NAMESPACE)
        except KubeError as error:
            return error.code
        return 200

    @defer.inlineCallbacks
    def test_a_member_cannot_keep_a_dead_node_alive(self):
        world = self.world
        dead, hostile = [n for n in NODES_OF_POOL if n != self.leader]
        yield world.cut_cloud([dead])
        cut_at = reactor.seconds()
        yield poll_until(lambda: len(self.cloud_log.delegated(dead, cut_at)) >= 2,
                         STEP_TIMEOUT, 0.05, reactor,
                         what=f"two heartbeats of {dead} forwarded by {self.leader}")

        hostile_client = self.client_as(hostile)
        # The member renews its own node's lease: allowed.
        own = yield self.renew_as(hostile_client, hostile)
        self.assertEqual(own, 200)

        world.agents[dead].signal("KILL")
        yield world.agents[dead].ended
        killed_at = reactor.seconds()
        # The member keeps renewing the dead node's pool lease, once an interval, for
        # the grace period and three more intervals.
        codes = []
        while reactor.seconds() < killed_at + GRACE + 3 * INTERVAL:
            code = yield self.renew_as(hostile_client, dead)
            codes.append(code)
            yield deferLater(reactor, INTERVAL, lambda: None)
        report("hostile_renewals", codes)
        self.assertTrue(codes)
        self.assertEqual(set(codes), {403}, codes)

        # The coordinator saw every attempt as the member's node, and refused it.
        refused = [r for r in world.coordinator.request_log
                   if r.method == "PUT" and r.path.endswith(f"/leases/{dead}")
                   and r.at >= killed_at]
        self.assertEqual(len(refused), len(codes), refused)
        self.assertEqual({(r.code, r.user) for r in refused},
                         {(403, f"system:node:{hostile}")})

        # The dead node's cloud lease stopped moving within grace + one interval.
        forwarded = self.cloud_log.delegated(dead, killed_at)
        changed = [at for at, key, _renew, _annotation in self.cloud_log.changes
                   if key == f"{NODE_LEASE_NAMESPACE}/{dead}" and at >= killed_at]
        report("cloud_writes_after_kill", len(changed))
        report("last_cloud_write_after_kill_s",
               round(max(changed) - killed_at, 2) if changed else None)
        self.assertLessEqual(len(forwarded), 2, forwarded)
        for at in changed:
            self.assertLessEqual(at, killed_at + GRACE + INTERVAL, changed)

    @defer.inlineCallbacks
    def write_made_up_leases(self, names: list[str]) -> Any:
        """Delegated leases of ``names``, each held by its name, put straight into the
        pool etcd where the coordinator apiserver keeps leases, ``TXN_OPS`` a
        transaction, one transaction at a time (a burst no faster than the pool's etcd
        takes it while the pool keeps its election)."""
        world = self.world
        etcd = EtcdClient(reactor, world.coordinator_etcd_config())
        self.addCleanup(etcd.close)
        storage = world.coordinator.storage
        renewed = format_micro_time(reactor.seconds())

        def value(name: str) -> bytes:
            return json.dumps({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                             "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                         "renewTime": renewed}}, separators=(",", ":")).encode()

        for first in range(0, len(names), TXN_OPS):
            yield etcd.submit(txaioetcd.Transaction(success=[
                txaioetcd.OpSet(storage.key(LEASES, name, NODE_LEASE_NAMESPACE), value(name))
                for name in names[first:first + TXN_OPS]]))

    @defer.inlineCallbacks
    def refused_unknown(self, node: str) -> Any:
        samples = yield self.world.metrics(self.world.agents[node])
        return sum(samples.get(f'{REFUSED}{{reason="{reason}"}}', 0.0)
                   for reason in ("not_pool_member", "no_such_node"))

    @defer.inlineCallbacks
    def test_made_up_names_cost_the_leader_no_memory_and_no_cloud_request_each(self):
        world, leader = self.world, self.world.agents[self.leader]
        names = [f"made-up-{index}" for index in range(MADE_UP)]
        rss_before = leader.rss_kib()
        refused_before = yield self.refused_unknown(self.leader)
        started = reactor.seconds()
        yield self.write_made_up_leases(names)
        written = reactor.seconds()
        report("written_s", round(written - started, 1))

        seen = {}

        @defer.inlineCallbacks
        def all_counted():
            seen["refused"] = yield self.refused_unknown(self.leader)
            return seen["refused"] - refused_before >= MADE_UP
        try:
            yield poll_until(all_counted, 180.0, 0.5, reactor,
                             what=f"{self.leader} counting {MADE_UP} made-up names")
        finally:
            report("refused", seen.get("refused"))
            # Only the leader that saw the writes counts them: a new leader's first
            # list is where its term starts, no change it saw.
            holder = yield world.election_holder()
            report("election_holder", holder)
        counted = reactor.seconds()
        rss_after = leader.rss_kib()
        report("counted_s", round(counted - started, 1))
        report("leader_rss_kib", f"{rss_before}->{rss_after}")
        self.assertLess(rss_after - rss_before, RSS_GROWTH_KIB)

        # The cloud was asked about a bounded number of the names, not each.
        reads = [r for r in world.cloud.request_log
                 if r.at >= started and r.method == "GET" and "/nodes/made-up-" in r.path]
        minutes = int((counted - started) // 60) + 1
        report("cloud_node_reads", len(reads))
        self.assertLessEqual(len(reads), MAX_NODE_READS_PER_MINUTE * minutes)
        # Nothing of them reached the cloud's leases.
        self.assertFalse([lease for lease in world.cloud.store.list(LEASES, NODE_LEASE_NAMESPACE)
                          if lease["metadata"]["name"].startswith("made-up-")])
        # The pool still works: every member is followed, ready, with one leader.
        yield world.wait_for_pool(
            "one leader among 3 agents, all ready, after the made-up names",
            lambda s: one_leader_all_ready(s, len(NODES_OF_POOL)), SETTLE_TIMEOUT)
