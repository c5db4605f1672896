"""Which etcd member the client's requests go to, as ``MemberSet`` decides on a
``task.Clock``: the first member until it fails, a failed member skipped, probed on
``/health`` on the backoff policy and readmitted once healthy; and the member URLs an
``EtcdConfig`` accepts. The client on scripted gateways and on a real cluster that lost
its quorum is in the integration tier."""

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial import unittest

from yurtcoord.etcd.client import EtcdConfig
from yurtcoord.etcd.errors import EtcdUnavailable
from yurtcoord.etcd.members import MemberSet
from yurtcoord.tx.retry import backoff_policy

A, B, C = "http://a:2379", "http://b:2379", "http://c:2379"
# Pauses before the probes of a skipped member: 0.5, 1, 2, 4, then 4 s.
POLICY = backoff_policy(initial=0.5, maximum=4.0, jitter=0.0)


class Probes:
    """The health probe of a ``MemberSet``: each call waits for the test's answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, "defer.Deferred[bool]"]] = []

    def __call__(self, url: str) -> "defer.Deferred[bool]":
        d: defer.Deferred[bool] = defer.Deferred()
        self.calls.append((self.clock.seconds(), url, d))
        return d

    clock: Clock


class MemberSetTests(unittest.TestCase):

    def setUp(self) -> None:
        self.clock = Clock()
        self.probes = Probes()
        self.probes.clock = self.clock
        self.events: list[dict[str, Any]] = []
        self.members = self.member_set([A, B, C])

    def member_set(self, urls: list[str]) -> MemberSet:
        members = MemberSet(self.clock, urls, self.probes, policy=POLICY)
        members.log = Logger(observer=self.events.append)
        self.addCleanup(members.close)
        return members

    def switches(self) -> list[tuple[Any, Any, str]]:
        return [(e["from"], e["to"], e["reason"]) for e in self.events
                if e.get("log_format", "").startswith("etcd member switch")]

    def test_requests_go_to_the_first_member_until_it_fails(self):
        self.assertEqual(self.members.pick(), A)
        self.members.failed(A, "connection refused")
        self.assertEqual(self.members.pick(), B)
        self.assertEqual(self.members.current, B)
        self.assertEqual(self.members.skipped(), {A: "connection refused"})
        self.assertEqual(self.switches(), [(A, B, "connection refused")])

    def test_one_switch_is_logged_once_however_many_requests_fail_with_it(self):
        for _ in range(5):
            self.members.failed(A, "timed out")
        self.assertEqual(self.switches(), [(A, B, "timed out")])
        self.assertEqual(len(self.probes.calls), 0)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_a_failed_member_that_is_not_current_is_skipped_without_a_switch(self):
        self.members.failed(B, "refused")
        self.assertEqual(self.members.current, A)
        self.assertEqual(self.switches(), [])
        self.members.failed(A, "no leader")
        self.assertEqual(self.members.current, C)
        self.assertEqual(self.switches(), [(A, C, "no leader")])

    def test_a_skipped_member_is_probed_on_the_policy_and_readmitted_when_healthy(self):
        self.members.failed(A, "refused")
        self.clock.advance(0.49)
        self.assertEqual(self.probes.calls, [])
        self.clock.advance(0.01)
        self.assertEqual([(t, url) for t, url, _d in self.probes.calls], [(0.5, A)])
        self.probes.calls[0][2].callback(False)
        self.clock.advance(0.99)
        self.assertEqual(len(self.probes.calls), 1)
        self.clock.advance(0.01)
        self.assertEqual(len(self.probes.calls), 2)
        self.assertEqual(self.probes.calls[1][0], 1.5)
        self.probes.calls[1][2].errback(EtcdUnavailable("refused"))
        self.clock.advance(2.0)
        self.assertEqual(self.probes.calls[2][0], 3.5)
        self.assertEqual(self.members.skipped(), {A: "refused"})
        self.probes.calls[2][2].callback(True)
        self.assertEqual(self.members.skipped(), {})
        # Re-admitted, not taken back: B keeps the requests (no flapping).
        self.assertEqual(self.members.current, B)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.switches(), [(A, B, "refused")])

    def test_probes_back_off_to_the_policy_maximum(self):
        self.members.failed(A, "refused")
        for pause in (0.5, 1.0, 2.0, 4.0, 4.0, 4.0):
            self.clock.advance(pause)
            self.probes.calls[-1][2].callback(False)
        self.assertEqual([t for t, _url, _d in self.probes.calls],
                         [0.5, 1.5, 3.5, 7.5, 11.5, 15.5])
        self.assertEqual([call.getTime() for call in self.clock.getDelayedCalls()], [19.5])

    def test_a_readmitted_member_that_fails_again_starts_the_policy_afresh(self):
        self.members.failed(A, "refused")
        self.clock.advance(0.5)
        self.probes.calls[0][2].callback(False)
        self.clock.advance(1.0)
        self.probes.calls[1][2].callback(True)
        self.members.failed(B, "refused")
        self.assertEqual(self.members.current, C)
        self.members.failed(C, "refused")
        self.assertEqual(self.members.current, A)
        self.members.failed(A, "refused again")
        self.assertEqual(self.members.skipped()[A], "refused again")
        self.assertEqual(sorted(call.getTime() for call in self.clock.getDelayedCalls()),
                         [2.0, 2.0, 2.0])

    def test_every_member_skipped_means_no_member_until_one_is_healthy(self):
        for url in (A, B, C):
            self.members.failed(url, f"{url} refused")
        self.assertIsNone(self.members.pick())
        self.assertEqual(self.members.no_member_reason(),
                         f"{A}: {A} refused; {B}: {B} refused; {C}: {C} refused")
        self.clock.advance(0.5)
        by_url = {url: d for _t, url, d in self.probes.calls}
        self.assertEqual(sorted(by_url), [A, B, C])
        by_url[B].callback(False)
        by_url[C].callback(True)
        self.assertEqual(self.members.pick(), C)
        by_url[A].callback(True)
        self.assertEqual(self.members.pick(), C)
        self.assertEqual(self.switches(), [
            (A, B, f"{A} refused"), (B, C, f"{B} refused"), (C, None, f"{C} refused"),
            (None, C, f"{C} is healthy again")])

    def test_one_member_is_never_skipped(self):
        members = self.member_set([A])
        members.failed(A, "refused")
        self.assertEqual(members.pick(), A)
        self.assertEqual(members.skipped(), {})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_close_stops_every_probe(self):
        self.members.failed(A, "refused")
        self.members.failed(B, "refused")
        self.clock.advance(0.5)
        self.members.failed(C, "refused")
        self.members.close()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        for _t, _url, d in self.probes.calls:
            self.assertTrue(d.called)

    def test_urls_must_be_distinct_and_present(self):
        self.assertRaises(ValueError, MemberSet, self.clock, [A, B, A], self.probes)
        self.assertRaises(ValueError, MemberSet, self.clock, [], self.probes)


class EtcdConfigMembersTests(unittest.TestCase):

    def test_urls_lists_every_member_first_one_first(self):
        config = EtcdConfig("https://a:2379", more_urls=("https://b:2379",))
        self.assertEqual(config.urls, ("https://a:2379", "https://b:2379"))
        self.assertEqual(EtcdConfig("http://a:2379").urls, ("http://a:2379",))

    def test_members_share_a_scheme_and_appear_once(self):
        with self.assertRaisesRegex(ValueError, "must start with https://"):
            EtcdConfig("https://a:2379", more_urls=("http://b:2379",))
        with self.assertRaisesRegex(ValueError, "appears twice"):
            EtcdConfig("http://a:2379", more_urls=("http://a:2379/",))
