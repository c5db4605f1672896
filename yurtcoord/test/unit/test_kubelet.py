"""The kubelet gate of the heartbeat probes, on a ``task.Clock``.

Exact timing lives here: a kubelet that never answers stops the probes at the grace
period counted from the start, one that dies stops them within the grace period plus
one check interval, and they resume once it answers again.
"""

from twisted.internet import defer
from twisted.logger import Logger
from twisted.trial import unittest
from zope.interface import Interface, implementer
from zope.interface.verify import verifyObject

from yurtcoord.heartbeat.probes import KubeletHealthChecker, ProbeSettings
from yurtcoord.kube.lease import format_micro_time
from yurtcoord.testing.fakekube import FakeKube
from yurtcoord.testing.leaseprobes import START, make_clock, make_prober, node_lease

URL = "http://127.0.0.1:10248/healthz"


class IHealthzGetter(Interface):
    """The treq-like ``get`` the kubelet checker is given."""

    def get(url):
        """A Deferred firing with a response that has ``code`` and ``content()``."""


class _Response:
    def __init__(self, code):
        self.code = code

    def content(self):
        return defer.succeed(b"ok" if self.code == 200 else b"unhealthy")


@implementer(IHealthzGetter)
class ClockKubelet:
    """A kubelet's healthz on a clock: answers 200 while ``up``, refuses otherwise."""

    def __init__(self, up=True):
        self.up = up
        self.asked = []

    def get(self, url):
        self.asked.append(url)
        if not self.up:
            return defer.fail(ConnectionRefusedError("connection refused"))
        return defer.succeed(_Response(200))


class Gate:
    """A prober writing the node lease every ``interval`` behind a kubelet checker
    asking every ``check_interval``, wired like the agent wires them."""

    def __init__(self, test, grace, interval=10.0, check_interval=10.0, up=True,
                 restart_on_back=True):
        self.clock = make_clock()
        self.client = FakeKube()
        self.kubelet = ClockKubelet(up)
        verifyObject(IHealthzGetter, self.kubelet)
        self.events = []
        self.checker = KubeletHealthChecker(self.clock, self.kubelet.get, URL, grace,
                                            interval=check_interval, timeout=2)
        self.checker.log = Logger(observer=self.events.append)
        settings = ProbeSettings(interval=interval, timeout=2, failed_retry=3,
                                 healthy_threshold=1)
        self.prober = make_prober(self.clock, self.client, settings, kubelet=self.checker)
        self.renewals = []
        self.changes = []
        self.checker.add_listener(self.changes.append)
        if restart_on_back:
            self.checker.add_listener(lambda alive: alive and self.prober.restart())
        self.checker.start()
        self.prober.start()
        test.addCleanup(self.stop)

    def stop(self):
        self.prober.stop()
        self.checker.stop()

    def run_until(self, seconds, step=0.25):
        """Advance to START + ``seconds``, noting every renewTime written."""
        while self.clock.seconds() < START + seconds - 1e-9:
            self.clock.advance(min(step, START + seconds - self.clock.seconds()))
            lease = node_lease(self.client)
            renew = lease["spec"]["renewTime"] if lease else None
            if renew is not None and (not self.renewals or self.renewals[-1] != renew):
                self.renewals.append(renew)

    def last_renewal(self):
        return self.renewals[-1]

    def log_lines(self):
        return [event["log_format"] for event in self.events
                if event["log_level"].name in ("info", "warn")
                and "kubelet" in event["log_format"]]


def at(seconds):
    return format_micro_time(START + seconds)


class NeverAnsweringKubeletTests(unittest.TestCase):

    def test_the_probes_stop_at_grace_after_the_start(self):
        """Probes every 10 s: the last write is the last probe at or before the grace
        period, whatever the grace period's phase against the probes."""
        for grace, last in ((25, 20), (30, 30), (35, 30), (40, 40)):
            gate = Gate(self, grace, up=False)
            gate.run_until(grace + 60)
            self.assertEqual(gate.last_renewal(), at(last), f"grace {grace}")
            self.assertFalse(gate.prober.healthy)
            self.assertIn("kubelet", gate.prober.last_error)
            gate.stop()

    def test_the_gate_closes_exactly_at_grace(self):
        gate = Gate(self, 40, up=False)
        gate.clock.advance(40)
        self.assertTrue(gate.checker.is_alive())
        gate.clock.advance(1e-6)
        self.assertFalse(gate.checker.is_alive())

    def test_one_line_says_it_never_answered_with_url_and_seconds(self):
        gate = Gate(self, 35, up=False)
        gate.run_until(200)
        dead = [e for e in gate.events if e["log_level"].name == "warn"]
        self.assertEqual(len(dead), 1, gate.events)
        self.assertIn("has not answered since the agent started", dead[0]["log_format"])
        self.assertEqual(dead[0]["url"], URL)
        self.assertEqual(dead[0]["grace"], 35)
        # Noticed by the probe at 40 s, the first after the grace period ran out.
        self.assertEqual(dead[0]["seconds"], 40.0)
        self.assertEqual(gate.changes, [False])


class DyingKubeletTests(unittest.TestCase):

    def test_probes_stop_within_grace_plus_check_interval_of_the_death(self):
        grace, interval, check_interval = 40.0, 10.0, 10.0
        for death in (55.0, 60.0, 61.0, 64.5, 69.9):
            gate = Gate(self, grace, interval=interval, check_interval=check_interval)
            gate.run_until(death)
            gate.kubelet.up = False
            gate.run_until(death + grace + check_interval + 3 * interval)
            last = gate.renewals[-1]
            # Never a renewal more than the grace period after the death...
            self.assertLessEqual(last, at(death + grace), f"death at {death}")
            # ...and none missing before the kubelet could have been seen dead: it
            # was last healthy at most one check interval before it died.
            self.assertGreaterEqual(last, at(death - check_interval + grace - interval),
                                    f"death at {death}")
            self.assertFalse(gate.prober.healthy)
            stopped = len(gate.renewals)
            gate.run_until(death + grace + 10 * interval)
            self.assertEqual(len(gate.renewals), stopped, "renewed with the kubelet dead")
            gate.stop()

    def test_one_line_when_dead_one_when_back_and_probes_resume(self):
        gate = Gate(self, 40, interval=10, check_interval=10)
        gate.run_until(25)  # healthy answers at 0, 10, 20
        gate.kubelet.up = False
        gate.run_until(95)
        self.assertEqual(gate.last_renewal(), at(60))  # 60 - 20 = 40: still within grace
        self.assertEqual(gate.changes, [False])
        warn = [e for e in gate.events if e["log_level"].name == "warn"]
        self.assertEqual(len(warn), 1)
        self.assertIn("counts as dead: last healthy answer", warn[0]["log_format"])
        self.assertEqual((warn[0]["url"], warn[0]["seconds"]), (URL, 50.0))

        gate.kubelet.up = True
        gate.run_until(100.5)  # the check at 100 answered: renewed at once
        self.assertEqual(gate.changes, [False, True])
        self.assertEqual(gate.last_renewal(), at(100))
        self.assertTrue(gate.prober.healthy)
        back = [e for e in gate.events if "answers again" in e["log_format"]]
        self.assertEqual(len(back), 1)
        gate.run_until(200)
        self.assertEqual(len(gate.log_lines()), 3, gate.log_lines())  # started, dead, back

    def test_without_a_restart_the_next_probe_writes(self):
        """The gate alone (no listener): the first probe after the kubelet answered
        writes, within one check interval plus one probe interval."""
        gate = Gate(self, 20, interval=10, check_interval=5, restart_on_back=False)
        gate.kubelet.up = False  # it answered at 0 only
        gate.run_until(57)
        self.assertEqual(gate.last_renewal(), at(20))
        gate.kubelet.up = True
        gate.run_until(57 + 5 + 10)
        self.assertGreater(gate.last_renewal(), at(57))
        self.assertLessEqual(gate.last_renewal(), at(57 + 5 + 10))

    def test_the_dead_kubelet_after_a_pause_of_the_agent_is_seen_at_once(self):
        """Nothing ran for longer than the grace period (a suspended VM): the first
        probe afterwards asks the gate, which counts the silence, and writes nothing."""
        gate = Gate(self, 40, interval=10, check_interval=10)
        gate.run_until(5)
        gate.kubelet.up = False
        writes = len(gate.client.requests)
        gate.clock.advance(100)  # the probe and the check due at 10 run late, at 105
        self.assertEqual(len(gate.client.requests), writes)
        self.assertFalse(gate.prober.healthy)

    def test_a_stopped_checker_logs_nothing_more(self):
        gate = Gate(self, 10, up=False)
        gate.run_until(5)
        gate.checker.stop()
        gate.clock.advance(100)
        gate.checker.is_alive()
        self.assertEqual([e for e in gate.events if e["log_level"].name == "warn"], [])


@implementer(IHealthzGetter)
class HangingKubelet:
    """A kubelet's healthz that never answers; notes which requests were cancelled."""

    def __init__(self):
        self.requests = []
        self.cancelled = []

    def get(self, url):
        d = defer.Deferred(self.cancelled.append)
        self.requests.append(d)
        return d


class StopTests(unittest.TestCase):
    def test_stop_cancels_every_check_still_waiting(self):
        clock = make_clock()
        kubelet = HangingKubelet()
        verifyObject(IHealthzGetter, kubelet)
        checker = KubeletHealthChecker(clock, kubelet.get, URL, 30, interval=10, timeout=2)
        checker.start()  # the first check is under way
        extra = checker.check()  # and one more, asked from outside the loop
        self.assertEqual(len(kubelet.requests), 2)
        stopped = checker.stop()
        self.assertCountEqual(kubelet.cancelled, kubelet.requests)
        self.assertIs(self.successResultOf(extra), False)
        self.successResultOf(stopped)
        self.assertEqual(clock.getDelayedCalls(), [])
