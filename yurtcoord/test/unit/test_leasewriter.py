"""The one lease write primitive: get-or-create, optimistic update, re-read on conflict,
bounded attempts, backoff between failed attempts, and exact timing on a Clock."""

from twisted.internet import defer, task
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import Conflict, ServerError
from yurtcoord.kube.gvr import LEASES
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import resource_version, resource_version_number
from yurtcoord.kube.leasewriter import (
    CREATED, UNCHANGED, UPDATED, LeaseWriteFailed, LeaseWriter,
)
from yurtcoord.testing.fakekube import FakeKube

NAMESPACE, NAME = "kube-node-lease", "edge-1"


def fresh_lease(renew="2026-12-01T10:00:00.000000Z"):
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"holderIdentity": NAME, "renewTime": renew}}


def renew_to(value):
    """A change that creates the lease or sets its renewTime to ``value``."""
    def change(current):
        if current is None:
            return fresh_lease(value)
        lease = dict(current)
        lease["spec"] = dict(current.get("spec") or {}, renewTime=value)
        return lease
    return change


class ContractTests(unittest.TestCase):
    def test_fake_and_real_client_provide_the_object_client_interface(self):
        self.assertTrue(verifyObject(IObjectClient, FakeKube()))
        client = KubeClient(task.Clock(), ClientConfig(server="http://127.0.0.1:1", insecure=True))
        self.addCleanup(client.close)
        self.assertTrue(verifyObject(IObjectClient, client))


class LeaseWriterTests(unittest.TestCase):
    def setUp(self):
        self.clock = task.Clock()
        self.kube = FakeKube()

    def writer(self, **options):
        return LeaseWriter(self.clock, self.kube, NAMESPACE, NAME, **options)

    def stored_renew(self):
        return self.kube.peek(LEASES, NAME, NAMESPACE)["spec"]["renewTime"]

    def test_absent_lease_is_created_then_renewed_with_one_update(self):
        writer = self.writer()
        first = self.successResultOf(writer.write(renew_to("A")))
        self.assertEqual(first.outcome, CREATED)
        self.assertEqual(self.kube.calls, [("get", NAME), ("create", NAME)])
        del self.kube.calls[:]
        second = self.successResultOf(writer.write(renew_to("B")))
        self.assertEqual(second.outcome, UPDATED)
        self.assertEqual(self.kube.calls, [("update", NAME)])
        self.assertEqual(self.stored_renew(), "B")

    def test_change_returning_none_writes_nothing(self):
        self.kube.put(LEASES, fresh_lease("A"))
        result = self.successResultOf(self.writer().write(lambda current: None))
        self.assertEqual(result.outcome, UNCHANGED)
        self.assertFalse(result.written)
        self.assertEqual(result.lease["spec"]["renewTime"], "A")
        self.assertEqual(self.kube.calls, [("get", NAME)])

    def test_conflict_on_the_remembered_lease_reads_again_and_asks_change_again(self):
        writer = self.writer(attempts=2)
        self.successResultOf(writer.write(renew_to("A")))
        self.kube.put(LEASES, fresh_lease("other"))  # another writer moved the rv on
        seen = []

        def change(current):
            seen.append(current["spec"]["renewTime"])
            return renew_to("B")(current)

        del self.kube.calls[:]
        result = self.successResultOf(writer.write(change))
        self.assertEqual(result.outcome, UPDATED)
        self.assertEqual(seen, ["A", "other"])
        self.assertEqual(self.kube.calls, [("update", NAME), ("get", NAME), ("update", NAME)])
        self.assertEqual(self.stored_renew(), "B")

    def test_conflicts_to_the_last_attempt_fail_and_write_nothing(self):
        self.kube.put(LEASES, fresh_lease("A"))
        self.kube.fail_next("update", Conflict("stale"), count=3)
        failure = self.failureResultOf(self.writer(attempts=3).write(renew_to("B")),
                                       LeaseWriteFailed)
        self.assertIn("kube-node-lease/edge-1", str(failure.value))
        self.assertEqual(self.stored_renew(), "A")
        # Conflicts re-read at once: no timer was left behind.
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_created_meanwhile_reads_and_updates(self):
        self.kube.hold("get")
        d = self.writer(attempts=2).write(renew_to("B"))
        self.kube.release_hold("get")
        self.kube.put(LEASES, fresh_lease("A"))  # the node created it meanwhile
        self.kube.deliver_held()  # the first read still answers NotFound
        result = self.successResultOf(d)
        self.assertEqual(result.outcome, UPDATED)
        self.assertEqual([verb for verb, _ in self.kube.calls],
                         ["get", "create", "get", "update"])
        self.assertEqual(self.stored_renew(), "B")

    def test_errors_end_the_write_unless_retried(self):
        self.kube.put(LEASES, fresh_lease("A"))
        self.kube.fail_next("update", ServerError("boom"))
        writer = self.writer(attempts=3)
        self.failureResultOf(writer.write(renew_to("B")), ServerError)
        self.assertEqual([verb for verb, _ in self.kube.calls], ["get", "update"])
        # What the server holds is unknown after an error: the next write reads first.
        del self.kube.calls[:]
        self.successResultOf(writer.write(renew_to("C")))
        self.assertEqual([verb for verb, _ in self.kube.calls], ["get", "update"])

    def test_retried_errors_wait_the_policy_delay_between_attempts(self):
        self.kube.put(LEASES, fresh_lease("A"))
        self.kube.fail_next("update", ServerError("boom"), count=2)
        writer = self.writer(attempts=3, retry_errors=True,
                             retry_policy=lambda failures: {1: 0.5, 2: 1.5}[failures])
        d = writer.write(renew_to("B"))
        self.assertNoResult(d)
        self.assertEqual(len(self.kube.calls), 2)
        self.clock.advance(0.499)
        self.assertEqual(len(self.kube.calls), 2)
        self.clock.advance(0.001)
        self.assertEqual(len(self.kube.calls), 4)  # read again, update failed again
        self.clock.advance(1.499)
        self.assertNoResult(d)
        self.clock.advance(0.001)
        self.assertEqual(self.successResultOf(d).outcome, UPDATED)
        self.assertEqual(self.stored_renew(), "B")

    def test_retried_errors_fail_with_the_last_error_after_the_last_attempt(self):
        self.kube.put(LEASES, fresh_lease("A"))
        self.kube.fail_next("update", ServerError("boom"), count=2)
        writer = self.writer(attempts=2, retry_errors=True, retry_policy=lambda n: 1.0)
        d = writer.write(renew_to("B"))
        self.clock.advance(1.0)
        self.failureResultOf(d, ServerError)
        self.assertEqual(self.stored_renew(), "A")

    def test_each_attempt_is_bounded_by_the_attempt_timeout(self):
        self.kube.put(LEASES, fresh_lease("A"))
        self.kube.hold("get")
        writer = self.writer(attempts=2, retry_errors=True, attempt_timeout=2.0,
                             retry_policy=lambda n: 0.5)
        d = writer.write(renew_to("B"))
        self.clock.advance(1.999)
        self.assertFalse(self.kube.held[0].cancelled)
        self.clock.advance(0.001)
        self.assertTrue(self.kube.held[0].cancelled)
        self.kube.release_hold("get")
        self.clock.advance(0.5)
        self.assertEqual(self.successResultOf(d).outcome, UPDATED)

    def test_an_attempt_timeout_is_an_error_that_ends_an_unretried_write(self):
        self.kube.hold("get")
        d = self.writer(attempt_timeout=2.0).write(renew_to("B"))
        self.clock.advance(2.0)
        self.failureResultOf(d, defer.TimeoutError)

    def test_cancelling_the_write_cancels_the_request_and_retries_nothing(self):
        self.kube.hold("get")
        writer = self.writer(attempts=3, retry_errors=True)
        d = writer.write(renew_to("B"))
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(self.kube.held[0].cancelled)
        self.clock.advance(60)
        self.assertEqual(len(self.kube.calls), 1)

    def test_on_read_sees_every_read_lease_and_absence(self):
        seen = []
        writer = self.writer(attempts=2, on_read=seen.append)
        self.successResultOf(writer.write(renew_to("A")))
        self.assertEqual(seen, [None])
        self.successResultOf(writer.write(renew_to("B")))
        self.assertEqual(seen, [None])  # renewed from what it wrote: nothing read
        self.kube.put(LEASES, fresh_lease("other"))
        self.successResultOf(writer.write(renew_to("C")))
        self.assertEqual([lease and lease["spec"]["renewTime"] for lease in seen],
                         [None, "other"])

    def test_attempts_must_be_positive(self):
        with self.assertRaises(ValueError):
            self.writer(attempts=0)

    def test_change_may_answer_later_within_the_attempt_timeout(self):
        """What to create may need a request of its own (the Node it belongs to):
        ``change`` answers with a Deferred, bounded by the attempt's timeout."""
        answers = []

        def change(current):
            answer = defer.Deferred()
            answers.append(answer)
            return answer

        writer = self.writer(attempts=2, retry_errors=True, attempt_timeout=1.0,
                             retry_policy=lambda n: 0.5)
        d = writer.write(change)
        self.clock.advance(1.0)  # the first answer never came: the attempt timed out
        self.assertTrue(answers[0].called)
        self.clock.advance(0.5)
        self.assertEqual(len(answers), 2)
        answers[1].callback(fresh_lease("A"))
        self.assertEqual(self.successResultOf(d).outcome, CREATED)
        self.assertEqual(self.stored_renew(), "A")
        self.assertEqual([verb for verb, _ in self.kube.calls], ["get", "get", "create"])

    def test_attempts_can_be_narrowed_for_one_write(self):
        writer = self.writer(attempts=2)
        self.successResultOf(writer.write(renew_to("A")))
        self.kube.put(LEASES, fresh_lease("other"))
        self.failureResultOf(writer.write(renew_to("B"), attempts=1), LeaseWriteFailed)
        self.assertEqual(self.stored_renew(), "other")
        self.successResultOf(writer.write(renew_to("C")))
        self.assertEqual(self.stored_renew(), "C")
        with self.assertRaises(ValueError):
            writer.write(renew_to("D"), attempts=0)


class ResourceVersionTests(unittest.TestCase):
    def test_the_version_of_any_object_or_none(self):
        self.assertEqual(resource_version({"metadata": {"resourceVersion": "42"}}), "42")
        for obj in (None, {}, {"metadata": None}, {"metadata": {}}):
            self.assertIsNone(resource_version(obj), obj)

    def test_the_version_as_a_number_only_when_it_is_decimal(self):
        self.assertEqual(resource_version_number({"metadata": {"resourceVersion": "42"}}), 42)
        for rv in ("", "4a", "-1", " 7", None, 42):
            self.assertIsNone(
                resource_version_number({"metadata": {"resourceVersion": rv}}), rv)
