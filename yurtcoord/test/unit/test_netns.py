"""The network topology helper without namespaces: cuts and flaps on a ``task.Clock``
with the commands recorded, not run, and the reason given where namespaces cannot be
made."""

from twisted.internet import defer, task
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.testing import netns
from yurtcoord.testing.netns import ICommandRunner, LinkEvent, Topology, unavailable_reason


@implementer(ICommandRunner)
class RecordingRunner:
    """Records the commands a topology would run, at the clock time it would run them."""

    def __init__(self, clock):
        self.clock = clock
        self.commands = []

    def run(self, argv):
        self.commands.append((self.clock.seconds(), tuple(argv)))
        return ""


class ClockTests(unittest.TestCase):
    """Cuts and flaps on a ``task.Clock``, with commands recorded, not run."""

    def setUp(self):
        self.clock = task.Clock()
        self.runner = RecordingRunner(self.clock)
        verifyObject(ICommandRunner, self.runner)
        self.topology = Topology(self.clock, "clock", runner=self.runner)
        self.addCleanup(self.topology.close)
        self.a = self.topology.add_host("a", {"wan": "198.18.0.2"})
        self.b = self.topology.add_host("b", {"wan": "198.18.0.3"})
        self.runner.commands.clear()

    def link_commands(self):
        return [(at, argv[-1]) for at, argv in self.runner.commands
                if argv[3:6] == ("link", "set", "wan-0")]

    def test_flap_cuts_and_heals_on_schedule(self):
        done = self.topology.flap("a", "wan", period=3, duration=10)
        self.clock.pump([0.5] * 19)
        self.assertNoResult(done)
        self.clock.advance(0.5)
        self.assertIsNone(self.successResultOf(done))
        self.assertEqual(self.topology.events, [
            LinkEvent(0, "a", "wan", "cut", "both"), LinkEvent(3, "a", "wan", "heal", "both"),
            LinkEvent(6, "a", "wan", "cut", "both"), LinkEvent(9, "a", "wan", "heal", "both"),
        ])
        self.assertEqual(self.link_commands(), [(0, "down"), (3, "up"), (6, "down"),
                                                (9, "up")])
        self.assertIsNone(self.topology.is_cut("a", "wan"))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_flap_ends_healed_when_its_end_falls_in_a_cut(self):
        done = self.topology.flap("a", "wan", period=2, duration=5, direction="out")
        self.clock.pump([1] * 5)
        self.successResultOf(done)
        self.assertEqual([(event.at, event.action, event.direction)
                          for event in self.topology.events],
                         [(0, "cut", "out"), (2, "heal", "out"), (4, "cut", "out"),
                          (5, "heal", "out")])

    def test_a_late_clock_does_not_stretch_the_schedule(self):
        done = self.topology.flap("a", "wan", period=2, duration=9)
        self.clock.advance(2.5)
        self.clock.advance(1.5)
        self.assertEqual([(event.at, event.action) for event in self.topology.events],
                         [(0, "cut"), (2.5, "heal"), (4, "cut")])
        # Over a whole heal phase late: the link stays cut rather than flipping twice.
        self.clock.advance(4.5)
        self.assertEqual(len(self.topology.events), 3)
        self.clock.advance(0.5)
        self.successResultOf(done)
        self.assertEqual(self.topology.events[-1], LinkEvent(9, "a", "wan", "heal", "both"))

    def test_cancelling_a_flap_heals(self):
        done = self.topology.flap("a", "wan", period=2, duration=10)
        self.clock.pump([0.5] * 9)
        self.assertEqual(self.topology.is_cut("a", "wan"), "both")
        done.cancel()
        self.failureResultOf(done, defer.CancelledError)
        self.assertEqual(self.topology.events[-1], LinkEvent(4.5, "a", "wan", "heal", "both"))
        self.clock.advance(20)
        self.assertEqual(len(self.topology.events), 4)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_close_stops_a_flap(self):
        done = self.topology.flap("a", "wan", period=2, duration=10)
        self.clock.advance(1)
        self.topology.close()
        self.assertTrue(done.called)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.topology.events[-1], LinkEvent(1, "a", "wan", "heal", "both"))
        self.assertIn(("ip", "netns", "del", self.topology.switch),
                      [argv for _, argv in self.runner.commands])
        with self.assertRaises(RuntimeError) as raised:
            self.topology.cut("a", "wan")
        self.assertIn("closed", str(raised.exception))
        self.assertIsNone(self.successResultOf(self.topology.close()))

    def test_one_way_cuts_share_black_hole_entries(self):
        # a's "out" and b's "in" both need a's entry for b; healing one keeps it.
        a_ns, b_ns = self.a.netns, self.b.netns
        self.topology.cut("a", "wan", "out")
        self.topology.cut("b", "wan", "in")
        self.topology.cut("a", "wan", "out")
        self.assertEqual([argv for _, argv in self.runner.commands], [
            ("ip", "-n", a_ns, "neigh", "replace", "198.18.0.3", "lladdr",
             netns.BLACKHOLE_MAC, "dev", "wan0", "nud", "permanent"),
        ])
        self.topology.heal("a", "wan")
        self.assertEqual(len(self.runner.commands), 1)
        self.topology.heal("b", "wan")
        self.assertEqual(self.runner.commands[-1][1],
                         ("ip", "-n", a_ns, "neigh", "del", "198.18.0.3", "dev", "wan0"))
        self.topology.cut("a", "wan", "in")
        self.assertEqual(self.runner.commands[-1][1][:6],
                         ("ip", "-n", b_ns, "neigh", "replace", "198.18.0.2"))
        self.assertEqual([event[3:] for event in self.topology.events], [
            ("cut", "out"), ("cut", "in"), ("heal", "out"), ("heal", "in"), ("cut", "in")])


class UnavailableTests(unittest.TestCase):

    def test_not_root_is_a_reason(self):
        """Nothing is tried as a user who may not make namespaces: the reason says so.
        (A child process under another uid would first need to read this machine's
        Python, which may live in a directory only root can enter.)"""
        runner = RecordingRunner(task.Clock())
        self.assertEqual(unavailable_reason(runner=runner, euid=65534),
                         "network namespaces need root (running as uid 65534)")
        self.assertEqual(runner.commands, [])
