"""The request-log invariants on synthetic logs: each holds on a clean history and
reports each kind of violation."""

from twisted.trial import unittest

from yurtcoord.heartbeat.probes import DELEGATE_HEARTBEAT_ANNOTATION, NODE_LEASE_NAMESPACE
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.sim.apiserver.requestlog import logged_request
from yurtcoord.testing.invariants import (
    DelegatedWrite, LeadershipChange, changes_per_minute, check_fencing, check_goes_stale,
    check_lease_age, check_single_delegator, delegated_writes, lease_path, leadership_changes,
    tenures)
from yurtcoord.testing.world import ELECTION_LEASE, ELECTION_NAMESPACE

NODE_OF_PEER = {"198.18.0.1": "n1", "198.18.0.2": "n2", "198.18.0.3": "n3"}
PEER_OF = {node: peer for peer, node in NODE_OF_PEER.items()}
DURATION = 15.0


def lease_write(at, peer, name, holder=None, namespace=NODE_LEASE_NAMESPACE, code=200,
                method="PUT", delegated=None, renewed=None):
    """The record of a write of lease ``namespace/name`` answered at ``at``; the
    holder is the lease's name unless given, delegated when written by another; its
    renewTime is ``at`` unless ``renewed`` names another (a writer's clock off)."""
    if delegated is None:
        delegated = NODE_OF_PEER.get(peer) != name and namespace == NODE_LEASE_NAMESPACE
    metadata = {"name": name, "namespace": namespace}
    if delegated:
        metadata["annotations"] = {DELEGATE_HEARTBEAT_ANNOTATION: "true"}
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": name if holder is None else holder,
                     "renewTime": format_micro_time(at if renewed is None else renewed)}}
    if code >= 300:
        body = {"kind": "Status", "apiVersion": "v1", "code": code}
    return logged_request(at, peer, method, lease_path(namespace, name), code, body)


def node_write(at, writer, node, code=200, renewed=None):
    """``writer`` (a node name) writes ``node``'s lease to the cloud."""
    return lease_write(at, PEER_OF.get(writer, writer), node, code=code, renewed=renewed)


def elect(at, holder, code=200):
    """A write of the election lease with ``holder`` ("" releases it)."""
    return lease_write(at, PEER_OF.get(holder, "198.18.0.1"), ELECTION_LEASE, holder=holder,
                       namespace=ELECTION_NAMESPACE, code=code)


def delete_election(at):
    return logged_request(at, "198.18.0.1", "DELETE",
                          lease_path(ELECTION_NAMESPACE, ELECTION_LEASE), 200,
                          {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def renewals(holder, start, stop, every=2.0):
    at, records = start, []
    while at <= stop:
        records.append(elect(at, holder))
        at += every
    return records


# n1 leads from 0 and stops renewing at 6; its lease expires at 21; n2 takes it at 25.
CLEAN_ELECTION = renewals("n1", 0.0, 6.0) + renewals("n2", 25.0, 60.0)
CLEAN_CLOUD = [node_write(1.0, "n1", "n3"), node_write(5.0, "n1", "n3"),
               node_write(3.0, "n2", "n2"), node_write(26.0, "n2", "n3"),
               node_write(40.0, "n2", "n3"), node_write(41.0, "n1", "n1")]


def single(coordinator, cloud):
    return check_single_delegator(cloud, coordinator, NODE_OF_PEER, ELECTION_NAMESPACE,
                                  ELECTION_LEASE, DURATION)


def fencing(coordinator, cloud):
    return check_fencing(cloud, coordinator, NODE_OF_PEER, ELECTION_NAMESPACE, ELECTION_LEASE)


def tenures_of(coordinator):
    return tenures(coordinator, ELECTION_NAMESPACE, ELECTION_LEASE, DURATION)


class DelegatedWritesTests(unittest.TestCase):

    def test_own_writes_are_not_delegated(self):
        self.assertEqual(delegated_writes([node_write(1.0, "n1", "n1"),
                                           node_write(2.0, "n2", "n2")], NODE_OF_PEER), [])

    def test_writes_of_other_nodes_leases_in_time_order(self):
        log = [node_write(5.0, "n2", "n1"), node_write(1.0, "n1", "n3"),
               node_write(2.0, "n3", "n3")]
        self.assertEqual([(w.at, w.writer, w.node) for w in delegated_writes(log, NODE_OF_PEER)],
                         [(1.0, "n1", "n3"), (5.0, "n2", "n1")])
        self.assertIsInstance(delegated_writes(log, NODE_OF_PEER)[0], DelegatedWrite)
        self.assertTrue(delegated_writes(log, NODE_OF_PEER)[0].record.delegated)

    def test_an_unknown_peer_is_named_by_its_address(self):
        log = [lease_write(1.0, "198.18.9.9", "n2")]
        self.assertEqual([(w.writer, w.node) for w in delegated_writes(log, NODE_OF_PEER)],
                         [("198.18.9.9", "n2")])

    def test_failed_writes_and_other_namespaces_do_not_count(self):
        log = [node_write(1.0, "n1", "n2", code=409), elect(2.0, "n1"),
               lease_write(3.0, "198.18.0.1", "n2", namespace="default"),
               logged_request(4.0, "198.18.0.1", "GET", lease_path(NODE_LEASE_NAMESPACE, "n2"),
                              200, {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                                    "metadata": {"name": "n2", "namespace": "kube-node-lease"}})]
        self.assertEqual(delegated_writes(log, NODE_OF_PEER), [])
        self.assertEqual(len(delegated_writes(log, NODE_OF_PEER, namespace="default")), 1)


class TenureTests(unittest.TestCase):

    def test_a_tenure_ends_when_the_lease_expires(self):
        self.assertEqual(tenures_of(CLEAN_ELECTION), {"n1": [(0.0, 21.0)], "n2": [(25.0, 74.0)]})

    def test_a_takeover_ends_the_tenure_of_the_previous_holder(self):
        log = renewals("n1", 0.0, 4.0) + [elect(10.0, "n2")]
        self.assertEqual(tenures_of(log), {"n1": [(0.0, 10.0)], "n2": [(10.0, 25.0)]})

    def test_a_release_ends_a_tenure_early(self):
        self.assertEqual(tenures_of(renewals("n1", 0.0, 4.0) + [elect(5.0, "")]),
                         {"n1": [(0.0, 5.0)]})
        self.assertEqual(tenures_of(renewals("n1", 0.0, 4.0) + [delete_election(5.0)]),
                         {"n1": [(0.0, 5.0)]})

    def test_a_holder_writing_after_its_lease_expired_starts_a_new_tenure(self):
        log = [elect(0.0, "n1"), elect(15.0, "n1"), elect(16.0, "n1")]
        self.assertEqual(tenures_of(log), {"n1": [(0.0, 15.0), (15.0, 31.0)]})

    def test_failed_writes_do_not_count(self):
        log = [elect(0.0, "n1"), elect(1.0, "n2", code=409), elect(2.0, "n1", code=500)]
        self.assertEqual(tenures_of(log), {"n1": [(0.0, 15.0)]})

    def test_lease_duration_must_be_positive(self):
        with self.assertRaisesRegex(ValueError, "lease_duration"):
            tenures(CLEAN_ELECTION, ELECTION_NAMESPACE, ELECTION_LEASE, 0)


class SingleDelegatorTests(unittest.TestCase):

    def test_a_clean_history_holds(self):
        self.assertEqual(single(CLEAN_ELECTION, CLEAN_CLOUD), [])

    def test_a_delegated_write_after_the_lease_expired(self):
        problems = single(CLEAN_ELECTION, CLEAN_CLOUD + [node_write(22.0, "n1", "n3")])
        self.assertEqual(len(problems), 1)
        self.assertIn("n1 wrote n3's cloud lease at 22.000 outside its tenures", problems[0])
        self.assertIn("[0.000, 21.000]", problems[0])
        self.assertIn("from 198.18.0.1", problems[0])

    def test_a_delegated_write_by_a_node_never_elected(self):
        problems = single(CLEAN_ELECTION, CLEAN_CLOUD + [node_write(30.0, "n3", "n1")])
        self.assertEqual(len(problems), 1)
        self.assertIn("n3 wrote n1's cloud lease at 30.000 outside its tenures as election "
                      "lease holder (none)", problems[0])

    def test_a_release_ends_the_right_to_delegate(self):
        election = renewals("n1", 0.0, 4.0) + [elect(5.0, "")]
        self.assertEqual(single(election, [node_write(4.5, "n1", "n3")]), [])
        problems = single(election, [node_write(5.5, "n1", "n3")])
        self.assertEqual(len(problems), 1)
        self.assertIn("at 5.500 outside its tenures", problems[0])

    def test_overlapping_tenures(self):
        election = renewals("n1", 0.0, 6.0) + renewals("n2", 10.0, 20.0)
        problems = single(election, [])
        self.assertEqual(len(problems), 1)
        self.assertIn("n2 took the election lease at 10.000 while n1's tenure lasted until "
                      "21.000 (last write at 6.000", problems[0])
        self.assertIn("overlap by 11.000 s", problems[0])

    def test_a_takeover_after_a_release_or_expiry_is_no_overlap(self):
        released = renewals("n1", 0.0, 6.0) + [elect(7.0, "")] + renewals("n2", 8.0, 12.0)
        self.assertEqual(single(released, []), [])
        self.assertEqual(single(renewals("n1", 0.0, 6.0) + [elect(21.0, "n2")], []), [])

    def test_a_former_leader_writing_after_the_new_leader_started(self):
        problems = single(CLEAN_ELECTION, CLEAN_CLOUD + [node_write(27.0, "n1", "n3")])
        self.assertEqual(len(problems), 2)
        self.assertIn("n1 wrote n3's cloud lease at 27.000 outside its tenures", problems[0])
        self.assertIn("former leader n1 wrote n3's cloud lease at 27.000, after n2 took the "
                      "election lease at 25.000 (n1's last election write at 6.000)",
                      problems[1])

    def test_a_leader_elected_again_may_delegate_again(self):
        election = CLEAN_ELECTION + renewals("n1", 80.0, 90.0)
        cloud = CLEAN_CLOUD + [node_write(85.0, "n1", "n3")]
        self.assertEqual(single(election, cloud), [])


class FencingTests(unittest.TestCase):

    def test_a_clean_history_holds(self):
        self.assertEqual(fencing(CLEAN_ELECTION, CLEAN_CLOUD), [])

    def test_a_former_leader_writing_after_the_takeover_is_reported_with_its_lag(self):
        problems = fencing(CLEAN_ELECTION, CLEAN_CLOUD + [node_write(26.5, "n1", "n3"),
                                                          node_write(25.0, "n1", "n2")])
        self.assertEqual(len(problems), 2)
        self.assertIn("n1 wrote n2's cloud lease at 25.000, 0.000 s after n2 took the "
                      "election lease at 25.000", problems[0])
        self.assertIn("n1 wrote n3's cloud lease at 26.500, 1.500 s after n2", problems[1])
        self.assertIn("takeover: PUT", problems[1])

    def test_writes_before_the_takeover_or_after_a_new_election_are_not_fencing_faults(self):
        election = CLEAN_ELECTION + renewals("n1", 80.0, 90.0)
        cloud = [node_write(24.9, "n1", "n3"), node_write(85.0, "n1", "n3")]
        self.assertEqual(fencing(election, cloud), [])

    def test_a_leader_taking_its_own_lease_again_is_no_takeover(self):
        for election in ([elect(0.0, "n1"), elect(20.0, "n1")],
                         [elect(0.0, "n1"), elect(10.0, ""), elect(20.0, "n1")]):
            self.assertEqual(fencing(election, [node_write(21.0, "n1", "n3")]), [])
            self.assertEqual(single(election, [node_write(21.0, "n1", "n3")]), [])

    def test_a_takeover_right_after_a_release(self):
        election = renewals("n1", 0.0, 4.0) + [elect(5.0, "")] + renewals("n2", 6.0, 10.0)
        problems = fencing(election, [node_write(7.0, "n1", "n3")])
        self.assertEqual(len(problems), 1)
        self.assertIn("1.000 s after n2 took the election lease at 6.000", problems[0])


def heartbeats(writer, node, start, stop, every=10.0):
    at, records = start, []
    while at <= stop:
        records.append(node_write(at, writer, node))
        at += every
    return records


class LeaseAgeTests(unittest.TestCase):

    def check(self, log, excused=(), start=0.0, end=100.0, bound=20.0):
        return check_lease_age(log, "n2", start, end, bound, list(excused))

    def test_regular_heartbeats_hold(self):
        self.assertEqual(self.check(heartbeats("n2", "n2", 0.0, 100.0)), [])

    def test_writes_by_a_delegating_leader_count(self):
        log = heartbeats("n2", "n2", 0.0, 30.0) + heartbeats("n1", "n2", 45.0, 100.0)
        self.assertEqual(self.check(log), [])

    def test_a_gap_longer_than_the_bound(self):
        log = heartbeats("n2", "n2", 0.0, 30.0) + heartbeats("n2", "n2", 80.0, 100.0)
        problems = self.check(log)
        self.assertEqual(len(problems), 1)
        self.assertIn("n2's cloud lease went 50.000 s without a renewal, longer than 20.0 s: "
                      "from 30.000 (PUT", problems[0])
        self.assertIn("to 80.000 (PUT", problems[0])
        self.assertIn("older than the bound over [50.000, 80.000]", problems[0])

    def test_other_leases_and_failed_writes_do_not_fill_a_gap(self):
        log = (heartbeats("n2", "n2", 0.0, 30.0) + heartbeats("n2", "n2", 80.0, 100.0)
               + heartbeats("n1", "n1", 0.0, 100.0) + [node_write(50.0, "n2", "n2", code=409)])
        self.assertEqual(len(self.check(log)), 1)

    def test_a_gap_excused_by_a_window(self):
        log = heartbeats("n2", "n2", 0.0, 30.0) + heartbeats("n2", "n2", 80.0, 100.0)
        self.assertEqual(self.check(log, [(35.0, 70.0)]), [])
        self.assertEqual(self.check(log, [(35.0, 50.0), (50.0, 60.0)]), [])

    def test_an_excused_window_allows_only_the_bound_after_it(self):
        log = heartbeats("n2", "n2", 0.0, 30.0) + heartbeats("n2", "n2", 80.0, 100.0)
        problems = self.check(log, [(35.0, 50.0)])
        self.assertEqual(len(problems), 1)
        self.assertIn("older than the bound over [70.000, 80.000], outside the excused "
                      "windows [35.000, 50.000]", problems[0])

    def test_a_lease_already_stale_before_the_window_is_not_excused(self):
        log = heartbeats("n2", "n2", 0.0, 0.0) + heartbeats("n2", "n2", 60.0, 100.0)
        problems = self.check(log, [(40.0, 55.0)])
        self.assertEqual(len(problems), 1)
        self.assertIn("over [20.000, 40.000]", problems[0])

    def test_gaps_at_the_start_and_at_the_end_count(self):
        problems = self.check(heartbeats("n2", "n2", 25.0, 75.0))
        self.assertEqual(len(problems), 2)
        self.assertIn("from 0.000 (the start) to 25.000", problems[0])
        self.assertIn("from 75.000 (PUT", problems[1])
        self.assertIn("to 100.000 (the end)", problems[1])
        self.assertEqual(len(self.check([])), 1)

    def test_writes_outside_the_span_do_not_count(self):
        problems = self.check(heartbeats("n2", "n2", 0.0, 100.0), start=110.0, end=140.0)
        self.assertEqual(len(problems), 1)
        self.assertIn("from 110.000 (the start) to 140.000 (the end)", problems[0])

    def test_bad_arguments_are_named(self):
        with self.assertRaisesRegex(ValueError, "end 1.0 is before start 2.0"):
            self.check([], start=2.0, end=1.0)
        with self.assertRaisesRegex(ValueError, "bound"):
            self.check([], bound=0)
        with self.assertRaisesRegex(ValueError, "end 3.0 is before start 4.0"):
            self.check([], [(4.0, 3.0)])


    def test_renewtimes_minutes_off_count_by_their_increase(self):
        # A node 300 s ahead, then a leader 120 s behind it delegating: each write names
        # a greater renewTime than the last, so each renews, far from the server's time.
        log = [node_write(at, "n2", "n2", renewed=at + 300.0) for at in range(0, 50, 10)]
        log += [node_write(at, "n1", "n2", renewed=340.0 + at / 1000.0)
                for at in range(50, 101, 10)]
        self.assertEqual(self.check(log), [])

    def test_writes_that_do_not_increase_the_renewtime_renew_nothing(self):
        # A writer whose clock is behind writes older renewTimes: the node lifecycle
        # controller sees no heartbeat in them.
        log = heartbeats("n2", "n2", 0.0, 30.0)
        log += [node_write(at, "n1", "n2", renewed=at - 120.0) for at in range(40, 101, 10)]
        problems = self.check(log)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("n2's cloud lease went 70.000 s without a renewal", problems[0])


class GoesStaleTests(unittest.TestCase):

    def test_a_write_after_the_bound_that_increases_nothing_keeps_nothing_alive(self):
        log = heartbeats("n2", "n2", 0.0, 50.0) + [node_write(95.0, "n1", "n2", renewed=10.0)]
        self.assertEqual(check_goes_stale(log, "n2", 50.0, 40.0, 200.0), [])

    def test_a_renewal_after_the_bound_with_a_renewtime_behind_is_reported(self):
        # renewTime increased, although it names a time before the kubelet stopped.
        log = heartbeats("n2", "n2", 0.0, 40.0) + [node_write(95.0, "n1", "n2", renewed=45.0)]
        problems = check_goes_stale(log, "n2", 50.0, 40.0, 200.0)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("n2's cloud lease was written at 95.000", problems[0])

    def test_no_write_after_the_bound_holds(self):
        log = heartbeats("n2", "n2", 0.0, 50.0) + [node_write(85.0, "n1", "n2")]
        self.assertEqual(check_goes_stale(log, "n2", 50.0, 40.0, 200.0), [])

    def test_a_write_after_the_bound_is_reported(self):
        log = (heartbeats("n2", "n2", 0.0, 50.0) + [node_write(95.0, "n1", "n2")]
               + [node_write(150.0, "n1", "n2")] + [node_write(100.0, "n1", "n1")])
        problems = check_goes_stale(log, "n2", 50.0, 40.0, 120.0)
        self.assertEqual(len(problems), 1)
        self.assertIn("n2's cloud lease was written at 95.000, 45.000 s after its kubelet "
                      "stopped at 50.000 (bound 40.0 s): PUT", problems[0])
        self.assertIn("from 198.18.0.1", problems[0])
        self.assertIn("delegated", problems[0])


class LeadershipChangeTests(unittest.TestCase):

    def test_changes_of_holder(self):
        log = [elect(0.0, "n1"), elect(2.0, "n1"), elect(20.0, "n2"), elect(21.0, "n3", code=409),
               elect(25.0, ""), elect(30.0, "n2"), delete_election(40.0), elect(50.0, "n3")]
        changes = leadership_changes(log, ELECTION_NAMESPACE, ELECTION_LEASE)
        self.assertEqual(changes, [(0.0, None, "n1"), (20.0, "n1", "n2"), (30.0, "", "n2"),
                                   (50.0, "", "n3")])
        self.assertIsInstance(changes[0], LeadershipChange)
        self.assertEqual(leadership_changes(log, ELECTION_NAMESPACE, "other"), [])

    def test_changes_per_minute(self):
        changes = [LeadershipChange(at, "a", "b") for at in (10.0, 20.0, 30.0, 100.0, 200.0)]
        self.assertEqual(changes_per_minute(changes, 0.0, 120.0), 2.0)
        self.assertEqual(changes_per_minute(changes, 15.0, 45.0), 4.0)
        self.assertEqual(changes_per_minute([], 0.0, 60.0), 0.0)
        with self.assertRaisesRegex(ValueError, "end 1.0 must be after start 1.0"):
            changes_per_minute(changes, 1.0, 1.0)
