"""Heartbeat delegation end to end, every agent a separate ``twistd -n yurtcoord`` process.

A ``ProcessWorld``: a real etcd, the cloud and coordinator Kubernetes API test servers in
this process, three agents of pool ``pool-a`` (their Nodes labelled so in the cloud),
each reaching the cloud through a TCP proxy of its own, with the world's short timings
(``FAULT_SUITE``: heartbeat every 4 s, election lease 3 s, retry 0.5 s). These tests
prove the wiring of separate processes, with loose bounds; the exact timing of the
leader-death scenario, for every phase of the death, is proved on a Clock in
``test_delegation_timing``.

- Forged pool leases: leases that no pool member may keep alive are written straight
  into the coordinator apiserver's storage (around its authorization, as a write
  straight into the pool etcd would be), with the delegate annotation, while the leader
  forwards the heartbeat of a genuinely cut-off member. Nothing changes in the cloud for
  them, the genuine lease keeps advancing, and the leader's ``/metrics`` counts each by
  reason. A cloud renewTime planted an hour ahead is exceeded by the next forward: the
  leader writes max(its time, the cloud's renewTime + 1 µs), so the cloud's renewTime
  keeps increasing.
- A cut-off node across a leader SIGKILL: its cloud lease's renewTime, sampled every
  50 ms, is never older than 2 x interval + takeover (lease_duration + retry_period).

Measured figures are printed as ``DELEGATION-E2E <name>=<value>`` lines.
"""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.kube.gvr import LEASES, NODES
from yurtcoord.kube.lease import renew_time
from yurtcoord.testing.cloudleases import CloudLeaseChanges, CloudLeaseSampler
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.world import (
    HEARTBEAT_INTERVAL, LEASE_DURATION, POOL, RETRY_PERIOD, ProcessWorld, add_pool_node,
    leader_of,
)

NODES_OF_POOL = ("edge-1", "edge-2", "edge-3")
INTERVAL = HEARTBEAT_INTERVAL
TAKEOVER = LEASE_DURATION + RETRY_PERIOD
MAX_RENEW_AGE = 2 * INTERVAL + TAKEOVER
SAMPLE_EVERY = 0.05
STEP_TIMEOUT = 30.0
SETTLE_TIMEOUT = 45.0
REFUSED = "yurtcoord_heartbeat_delegation_refused_total"
REASONS = ("namespace", "not_pool_member", "no_such_node", "holder_mismatch")


def report(name, value):
    print(f"DELEGATION-E2E {name}={value}")


def forged_lease(namespace, name, holder, renewed):
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 40,
                     "renewTime": format_micro_time(renewed)}}


@defer.inlineCallbacks
def write_lease(storage, lease):
    """Create or replace ``lease`` in an API test server's storage."""
    metadata = lease["metadata"]
    current = yield storage.get(LEASES, metadata["name"], metadata["namespace"])
    if current is None:
        yield storage.create(LEASES, lease, namespace=metadata["namespace"])
    else:
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        yield storage.update(LEASES, lease, namespace=metadata["namespace"])


class DelegationE2EBase(unittest.TestCase):
    timeout = 180

    @defer.inlineCallbacks
    def setUp(self):
        self.world = ProcessWorld(reactor)
        self.addCleanup(self.world.stop)
        yield self.world.start()
        self.cloud_log = CloudLeaseChanges(self.world.cloud, reactor)
        self.addCleanup(self.cloud_log.stop)
        self.leader = yield self.world.run_pool(NODES_OF_POOL, SETTLE_TIMEOUT)

    def pool_annotation(self, node):
        return self.world.coordinator_delegate_annotation(node)

    @defer.inlineCallbacks
    def cut_off(self, node):
        """Cut ``node``'s cloud link; fire once the leader forwarded two of its
        heartbeats."""
        yield self.world.cut_cloud([node])
        cut_at = reactor.seconds()
        yield poll_until(lambda: self.pool_annotation(node).addCallback(lambda a: a == "true"),
                         STEP_TIMEOUT, 0.05,
                         reactor, what=f"{node}'s pool lease marked for delegation")
        yield self.wait_delegated(node, cut_at, 2, f"two heartbeats of {node} forwarded")
        return cut_at

    @defer.inlineCallbacks
    def wait_delegated(self, node, since, count, what):
        try:
            yield poll_until(lambda: len(self.cloud_log.delegated(node, since)) >= count,
                             STEP_TIMEOUT, 0.05, reactor, what=what)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.world.log_tails()}") from None

    @defer.inlineCallbacks
    def refused(self, node):
        samples = yield self.world.metrics(self.world.agents[node])
        return {reason: samples.get(f'{REFUSED}{{reason="{reason}"}}') for reason in REASONS}


class ForgedLeaseTests(DelegationE2EBase):

    @defer.inlineCallbacks
    def test_forged_pool_leases_change_nothing_in_the_cloud_and_are_counted(self):
        leader, world = self.leader, self.world
        cut = next(n for n in NODES_OF_POOL if n != leader)
        before = yield self.refused(leader)
        self.assertEqual(before, dict.fromkeys(REASONS, 0.0))
        yield self.cut_off(cut)

        # The cut node's cloud lease, gone: the leader creates it again, with the
        # forwarded fields only and an ownerReference to the Node.
        world.cloud.store.delete(LEASES, cut, NODE_LEASE_NAMESPACE)
        deleted_at = reactor.seconds()
        yield poll_until(lambda: world.node_lease(world.cloud, cut) is not None, STEP_TIMEOUT,
                         0.05, reactor, what=f"{cut}'s cloud lease created by {leader}")
        created = world.node_lease(world.cloud, cut)
        node = world.cloud.store.get(NODES, cut)
        self.assertEqual(created["metadata"]["ownerReferences"], [{
            "apiVersion": "v1", "kind": "Node", "name": cut, "uid": node["metadata"]["uid"]}])
        self.assertEqual(created["metadata"]["annotations"],
                         {DELEGATE_HEARTBEAT_ANNOTATION: "true"})
        self.assertEqual(set(created["spec"]),
                         {"holderIdentity", "leaseDurationSeconds", "renewTime"})
        self.assertGreater(renew_time(created), deleted_at - 2 * INTERVAL)

        # Nodes the forged leases name: one of another pool, one of this pool that
        # runs no agent (its lease is held by another name); no Node edge-missing.
        add_pool_node(world.cloud, "edge-other", "pool-b")
        add_pool_node(world.cloud, "edge-4", POOL)
        cloud_before = {(lease["metadata"]["namespace"], lease["metadata"]["name"])
                        for lease in world.cloud.store.list(LEASES)}
        forged_at = reactor.seconds()

        def forge():
            now = reactor.seconds()
            return {
                # Outside kube-node-lease: the leader does not even watch it.
                "namespace": forged_lease("default", "edge-1", "edge-1", now),
                "not_pool_member": forged_lease(NODE_LEASE_NAMESPACE, "edge-other",
                                                "edge-other", now),
                "no_such_node": forged_lease(NODE_LEASE_NAMESPACE, "edge-missing",
                                             "edge-missing", now),
                "holder_mismatch": forged_lease(NODE_LEASE_NAMESPACE, "edge-4", cut, now),
            }

        # Each forged lease renewed like a heartbeat, a few times: the next renewal
        # once the leader has counted the last one of every lease.
        renewals = 4
        seen = {}

        def all_counted(count):
            @defer.inlineCallbacks
            def counted():
                seen["refused"] = yield self.refused(leader)
                return all((value or 0) >= count for reason, value in seen["refused"].items()
                           if reason != "namespace")
            return counted

        for renewal in range(1, renewals + 1):
            for lease in forge().values():
                yield write_lease(world.coordinator.storage, lease)
            yield poll_until(all_counted(renewal), STEP_TIMEOUT, 0.1, reactor,
                             what=f"{leader}'s /metrics counting forged renewal {renewal} of "
                                  f"every lease by reason (last {seen})")
        report("refused_by_reason", seen["refused"])
        # The leader watches node leases in kube-node-lease only (the coordinator lets a
        # node list no other namespace): a lease elsewhere never reaches it.
        self.assertEqual(seen["refused"]["namespace"], 0.0)
        # The genuine member still advances after the forgeries.
        yield self.wait_delegated(cut, reactor.seconds(), 3,
                                  f"{cut}'s heartbeats forwarded after the forgeries")

        # Nothing changed in the cloud for them: no new lease in any namespace, and
        # since the forgeries only the agents' own nodes' leases were written.
        cloud_after = {(lease["metadata"]["namespace"], lease["metadata"]["name"])
                       for lease in world.cloud.store.list(LEASES)}
        self.assertEqual(cloud_after, cloud_before)
        written = self.cloud_log.keys(since=forged_at)
        self.assertLessEqual(written, {f"{NODE_LEASE_NAMESPACE}/{n}" for n in NODES_OF_POOL},
                             written)
        for lease in world.cloud.store.list(LEASES, NODE_LEASE_NAMESPACE):
            name = lease["metadata"]["name"]
            self.assertEqual(lease["spec"]["holderIdentity"], name)
            self.assertLess(renew_time(lease), reactor.seconds() + 5, name)
        # A forged lease named after a pool Node is logged once per reason, not once
        # per renewal; names that are no Node of the pool, which may be made up by the
        # thousand, are logged together at most once a minute, naming each reason.
        log = world.agents[leader].log_text()
        self.assertEqual(log.count("not forwarded to the cloud (reason=holder_mismatch)"), 1)
        self.assertEqual(log.count("not forwarded to the cloud (reason=namespace)"), 0)
        summaries = [line for line in log.splitlines() if "not known as Nodes of pool" in line]
        self.assertGreaterEqual(len(summaries), 1, log)
        self.assertLessEqual(len(summaries), 1 + int((reactor.seconds() - forged_at) // 60),
                             summaries)
        # The first summary comes at once, the rest of the minute's refusals later
        # (they are counted by reason in /metrics above).
        self.assertTrue(any(f"{reason}=" in summaries[0]
                            for reason in ("not_pool_member", "no_such_node")), summaries)

        # A cloud renewTime an hour ahead, as a leader or a node whose clock ran an
        # hour ahead leaves it: every later forward of the cut node's renewals is past
        # it, so the cloud still sees each one.
        planted = world.node_lease(world.cloud, cut)
        ahead = float(int(reactor.seconds()) + 3600)
        planted["spec"]["renewTime"] = format_micro_time(ahead)
        world.cloud.store.update(LEASES, planted, namespace=NODE_LEASE_NAMESPACE)
        planted_at = reactor.seconds()
        yield poll_until(
            lambda: renew_time(world.node_lease(world.cloud, cut)) > ahead,
            STEP_TIMEOUT, 0.05, reactor, what=f"{cut}'s next renewal forwarded past the planted one")
        report("planted_future_renew_time_exceeded_after",
               f"{reactor.seconds() - planted_at:.2f}s")
        self.assertEqual(world.node_lease(world.cloud, cut)["spec"]["renewTime"],
                         format_micro_time(ahead + 0.000001))
        yield self.wait_delegated(cut, planted_at, 4,
                                  f"{cut}'s heartbeats forwarded after the planted one")
        past = [r for r in self.cloud_log.delegated(cut, planted_at) if r > ahead]
        self.assertEqual([round((r - ahead) * 1_000_000) for r in past[:3]], [1, 2, 3])


class LeaderDeathTests(DelegationE2EBase):

    @defer.inlineCallbacks
    def test_cut_node_renew_time_stays_fresh_across_a_leader_sigkill(self):
        """One run with the process world's timings, the leader killed after a
        forward of steady delegation, sampled until the new leader forwarded three
        heartbeats (the exact ages, for every phase of the death, are
        test_delegation_timing's)."""
        leader, world = self.leader, self.world
        cut = next(n for n in NODES_OF_POOL if n != leader)
        survivor = next(n for n in NODES_OF_POOL if n not in (leader, cut))
        sampler = CloudLeaseSampler(world.cloud, [cut], reactor, every=SAMPLE_EVERY)
        self.addCleanup(sampler.stop)
        cut_at = yield self.cut_off(cut)
        watched_from = reactor.seconds()
        # A forward of steady delegation, then the leader dies without releasing its
        # lease.
        yield self.wait_delegated(cut, watched_from, 1,
                                  f"{cut}'s heartbeat forwarded in steady delegation")
        victim = world.agents[leader]
        victim.signal("KILL")
        killed_at = reactor.seconds()
        yield victim.ended
        statuses = yield world.wait_for_pool(
            f"{survivor} leading after {leader} was killed",
            lambda s: leader_of(s) == survivor, STEP_TIMEOUT, interval=0.02)
        report("death_to_new_leader_status", f"{reactor.seconds() - killed_at:.2f}s")
        yield self.wait_delegated(cut, reactor.seconds(), 3,
                                  f"{cut}'s heartbeats forwarded by {survivor}")
        report("death_to_third_forward_by_new_leader", f"{reactor.seconds() - killed_at:.2f}s")
        sampler.stop()

        samples = [s for s in sampler.ages[cut] if s[0] >= watched_from]
        report("samples", len(samples))
        # Sampled before the death and after it, every 50 ms for several seconds.
        self.assertGreater(len(samples), 50)
        self.assertTrue(any(at < killed_at for at, _age in samples))
        self.assertTrue(any(at > killed_at + TAKEOVER for at, _age in samples))
        oldest, at = sampler.oldest(cut, since=watched_from)
        report("oldest_renew_time_age", f"{oldest:.3f}s (at {at - killed_at:+.2f}s from "
                                        f"the SIGKILL; bound {MAX_RENEW_AGE:.1f}s)")
        renewals = self.cloud_log.delegated(cut, cut_at)
        gaps = [b - a for a, b in zip(renewals, renewals[1:])]
        report("largest_renew_time_gap", f"{max(gaps):.3f}s")
        self.assertLessEqual(oldest, MAX_RENEW_AGE,
                             f"{cut}'s cloud renewTime got {oldest:.2f}s old\n"
                             f"{world.log_tails()}")
        # Both leaders forwarded: some renewals before the death, some after.
        self.assertTrue(any(r < killed_at for r in renewals))
        self.assertTrue(any(r > killed_at for r in renewals))
        self.assertEqual(statuses[cut]["role"], "follower")
