"""The network topology helper in real namespaces: hosts, their links, and their
cleanup.

Skipped, with the reason, where namespaces cannot be made. Traffic to test addresses
only ever leaves sockets made through a host's reactor; the tests that show where
sockets live use loopback, which each namespace has of its own.
"""

import json
import os
import signal
import subprocess
import sys

import treq.client
from twisted.internet import defer, error, protocol, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import (
    IReactorCore, IReactorProcess, IReactorTCP, IReactorTime, IReactorUDP,
)
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer

from yurtcoord.testing.netns import (
    NamespacedReactor, Topology, entered, namespace_name, sweep_leftovers, unavailable_reason,
)
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.processes import CollectingProcess

# Seconds a connection attempt gets where a cut should make it time out; enough for a
# loaded machine to answer on a healthy link (answers take about a millisecond).
CONNECT_TIMEOUT = 1.0


def ns_link(path):
    """The ``net:[inode]`` form of the namespace of ``path`` (a /proc link or a
    /run/netns file)."""
    try:
        return os.readlink(path)
    except OSError:
        return f"net:[{os.stat(path).st_ino}]"


def running(pid):
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, check=True).stdout
    return {line.split()[0] for line in out.decode().splitlines() if line.strip()}


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                         check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.decode().splitlines()}


class Text(Resource):
    isLeaf = True

    def __init__(self, body):
        super().__init__()
        self.body = body

    def render_GET(self, request):
        return self.body


@implementer(IAgentEndpointFactory)
class EndpointsFrom:
    """Connects an ``Agent`` through ``reactor`` (a host's)."""

    def __init__(self, reactor):
        self.reactor = reactor

    def endpointForURI(self, uri):
        return TCP4ClientEndpoint(self.reactor, uri.host.decode(), uri.port,
                                  timeout=CONNECT_TIMEOUT)


class Datagrams(protocol.DatagramProtocol):
    def __init__(self):
        self.received = []

    def datagramReceived(self, data, address):
        self.received.append(data)


class Quiet(protocol.Protocol):
    """A client connection that closes itself once made and tells when it is gone."""

    def __init__(self):
        self.gone = defer.Deferred()

    def connectionMade(self):
        self.transport.loseConnection()

    def connectionLost(self, reason):
        self.gone.callback(None)


class Marker(protocol.Protocol):
    """Collects what the server says until it closes."""

    def __init__(self):
        self.data = b""
        self.done = defer.Deferred()

    def dataReceived(self, data):
        self.data += data

    def connectionLost(self, reason):
        self.done.callback(self.data)


class MarkerClient(protocol.ClientFactory):
    def __init__(self):
        self.answers = []

    def buildProtocol(self, addr):
        marker = Marker()
        self.answers.append(marker)
        return marker


class SayAndClose(protocol.Protocol):
    def connectionMade(self):
        self.transport.write(self.factory.marker)
        self.transport.loseConnection()


def say(marker):
    factory = protocol.ServerFactory.forProtocol(SayAndClose)
    factory.marker = marker
    return factory


class NamespaceTestCase(unittest.TestCase):
    """Skipped with the reason where namespaces cannot be made."""

    timeout = 30

    def setUp(self):
        reason = unavailable_reason()
        if reason is not None:
            raise unittest.SkipTest(reason)

    def topology(self, name, **kwargs):
        topology = Topology(reactor, name, **kwargs)
        self.addCleanup(topology.close)
        return topology

    def listen(self, reactor_, port, factory, interface=""):
        listening = reactor_.listenTCP(port, factory, interface=interface)
        self.addCleanup(listening.stopListening)
        return listening

    def serve(self, host, body, network="wan"):
        """An HTTP site in ``host`` answering ``body``; its port."""
        return self.listen(host.reactor, 0, Site(Text(body)),
                           interface=host.address(network)).getHost().port

    def get(self, reactor_, url):
        """GET ``url`` with a client whose sockets are made through ``reactor_``."""
        pool = HTTPConnectionPool(reactor_, persistent=False)
        agent = Agent.usingEndpointFactory(reactor_, EndpointsFrom(reactor_), pool=pool)
        client = treq.client.HTTPClient(agent)
        return client.get(url).addCallback(treq.content)

    @defer.inlineCallbacks
    def connects(self, host, address, port):
        """True when ``host`` connects to ``address:port``; the failure otherwise."""
        endpoint = TCP4ClientEndpoint(host.reactor, address, port, timeout=CONNECT_TIMEOUT)
        try:
            client = yield endpoint.connect(protocol.Factory.forProtocol(Quiet))
        except Exception as failure:
            return failure
        yield client.gone
        return True

    def reaches(self, host, address, port):
        """Fires once ``host`` connects to ``address:port`` (retrying: a first attempt
        can lose its address resolution to a busy machine)."""
        return poll_until(
            lambda: self.connects(host, address, port).addCallback(lambda done: done is True),
            what=f"{host.name} connecting to {address}:{port}")

    def udp(self, host):
        datagrams = Datagrams()
        listening = host.reactor.listenUDP(0, datagrams)
        self.addCleanup(listening.stopListening)
        return datagrams, listening

    @defer.inlineCallbacks
    def arrives(self, sender, receiver, address, marker):
        """Send ``marker`` from ``sender`` to ``address`` until ``receiver`` got it."""
        receiver_datagrams, receiver_port = receiver
        _, sender_port = sender
        port = receiver_port.getHost().port

        def got():
            sender_port.write(marker, (address, port))
            return marker in receiver_datagrams.received

        yield poll_until(got, timeout=10, interval=0.05, what=f"{marker!r} arriving")


class EnteredTests(NamespaceTestCase):

    def test_switches_the_thread_and_back_even_on_errors(self):
        topology = self.topology("enter")
        host = topology.add_host("a", {"wan": "198.18.0.2"})
        home = ns_link("/proc/thread-self/ns/net")
        inside = ns_link(f"/run/netns/{host.netns}")
        self.assertNotEqual(home, inside)
        with self.assertRaises(ZeroDivisionError):
            with entered(host.netns):
                self.assertEqual(ns_link("/proc/thread-self/ns/net"), inside)
                1 / 0
        self.assertEqual(ns_link("/proc/thread-self/ns/net"), home)

    def test_an_unknown_namespace_is_named(self):
        with self.assertRaises(FileNotFoundError) as raised:
            with entered("ycnet-no-such-namespace"):
                pass
        self.assertIn("ycnet-no-such-namespace", str(raised.exception))


class NamespacedReactorTests(NamespaceTestCase):

    def test_provides_what_the_reactor_provides(self):
        topology = self.topology("ifaces")
        host = topology.add_host("a", {"wan": "198.18.0.2"})
        for interface in (IReactorTCP, IReactorUDP, IReactorTime, IReactorCore,
                          IReactorProcess):
            self.assertTrue(interface.providedBy(host.reactor), interface)
        self.assertIsInstance(host.reactor, NamespacedReactor)
        return task.deferLater(host.reactor, 0, lambda: None)

    @defer.inlineCallbacks
    def test_site_listens_inside_and_only_inside(self):
        # The same loopback port serves two sites: one in the root namespace, one in
        # the host's (in a single namespace the second listen would fail), and each
        # client reaches the one of its own namespace.
        topology = self.topology("site")
        host = topology.add_host("x", {"wan": "198.18.0.2"})
        port = self.listen(reactor, 0, Site(Text(b"root")),
                           interface="127.0.0.1").getHost().port
        self.listen(host.reactor, port, Site(Text(b"inside x")), interface="127.0.0.1")
        url = f"http://127.0.0.1:{port}/"
        self.assertEqual((yield self.get(host.reactor, url)), b"inside x")
        self.assertEqual((yield self.get(reactor, url)), b"root")

    @defer.inlineCallbacks
    def test_a_connector_connects_again_from_inside(self):
        # A connector's later attempts (a reconnecting factory's) run from the
        # reactor's thread, in the root namespace; their sockets still belong inside.
        topology = self.topology("again")
        host = topology.add_host("x", {"wan": "198.18.0.2"})
        port = self.listen(reactor, 0, say(b"root"), interface="127.0.0.1").getHost().port
        self.listen(host.reactor, port, say(b"inside x"), interface="127.0.0.1")
        client = MarkerClient()
        connector = host.reactor.connectTCP("127.0.0.1", port, client)
        yield poll_until(lambda: client.answers, what="a first connection")
        self.assertEqual((yield client.answers[0].done), b"inside x")
        connector.connect()
        yield poll_until(lambda: len(client.answers) == 2, what="a second connection")
        self.assertEqual((yield client.answers[1].done), b"inside x")

    @defer.inlineCallbacks
    def test_default_agent_connects_from_inside(self):
        # Agent's own endpoints (HostnameEndpoint) connect later, from a resolver's
        # callback: still through the host's reactor.
        topology = self.topology("agent")
        host = topology.add_host("x", {"wan": "198.18.0.2"})
        port = self.listen(reactor, 0, Site(Text(b"root")),
                           interface="127.0.0.1").getHost().port
        self.listen(host.reactor, port, Site(Text(b"inside x")), interface="127.0.0.1")
        client = treq.client.HTTPClient(Agent(
            host.reactor, pool=HTTPConnectionPool(host.reactor, persistent=False)))
        body = yield client.get(f"http://127.0.0.1:{port}/").addCallback(treq.content)
        self.assertEqual(body, b"inside x")

    @defer.inlineCallbacks
    def test_spawned_process_runs_inside(self):
        topology = self.topology("spawn")
        host = topology.add_host("x", {"wan": "198.18.0.2"})
        # Without a working directory Twisted uses posix_spawn; with one, it forks.
        for path in (None, "/"):
            child = CollectingProcess()
            host.reactor.spawnProcess(
                child, sys.executable,
                [sys.executable, "-c", "import os; print(os.readlink('/proc/self/ns/net'))"],
                path=path)
            ended = yield child.ended
            self.assertIsInstance(ended, error.ProcessDone, child.err)
            self.assertEqual(child.out.decode().strip(),
                             ns_link(f"/run/netns/{host.netns}"))
            self.assertNotEqual(child.out.decode().strip(), ns_link("/proc/self/ns/net"))


class TopologyTests(NamespaceTestCase):

    @defer.inlineCallbacks
    def test_hosts_of_one_network_talk_and_of_others_do_not(self):
        topology = self.topology("talk")
        a = topology.add_host("a", {"wan": "198.18.0.2", "lan": "198.19.0.2"})
        b = topology.add_host("b", {"wan": "198.18.0.3"})
        c = topology.add_host("c", {"lan": "198.19.0.4"})
        port = self.serve(b, b"from b")
        self.assertEqual((yield self.get(a.reactor, f"http://{b.address('wan')}:{port}/")),
                         b"from b")
        lan_port = self.serve(c, b"from c", network="lan")
        self.assertEqual((yield self.get(a.reactor, f"http://198.19.0.4:{lan_port}/")),
                         b"from c")
        # b (wan only) has no route to c (lan only), even though a is on both.
        with self.assertRaises(error.NoRouteError):
            yield self.get(b.reactor, f"http://198.19.0.4:{lan_port}/")
        with self.assertRaises(error.NoRouteError):
            yield self.get(c.reactor, f"http://198.18.0.3:{port}/")

    @defer.inlineCallbacks
    def test_no_route_out(self):
        topology = self.topology("noroute")
        a = topology.add_host("a", {"wan": "198.18.0.2"})
        self.assertNotIn("default", subprocess.run(
            ["ip", "-n", a.netns, "route", "show"], capture_output=True,
            check=True).stdout.decode())
        failure = yield self.connects(a, "198.18.200.1", 80)
        self.assertIsInstance(failure, error.NoRouteError)

    def test_interfaces_live_only_in_its_namespaces(self):
        before = root_links()
        topology = self.topology("ifnames")
        a = topology.add_host("a", {"wan": "198.18.0.2", "lan": "198.19.0.2"})
        inside = subprocess.run(["ip", "-n", a.netns, "-o", "link", "show"],
                                capture_output=True, check=True).stdout.decode()
        self.assertIn(" wan0@", inside)
        self.assertIn(" lan0@", inside)
        switch = subprocess.run(["ip", "-n", topology.switch, "-o", "link", "show"],
                                capture_output=True, check=True).stdout.decode()
        self.assertIn(" br-wan:", switch)
        self.assertIn(" wan-0@", switch)
        self.assertEqual(root_links() - before, set())
        self.assertEqual(a.address("lan"), "198.19.0.2")
        with self.assertRaises(KeyError):
            topology.add_host("b", {"wan": "198.18.0.3"}).address("lan")

    @defer.inlineCallbacks
    def test_spawn_runs_inside_with_a_parent_death_signal(self):
        topology = self.topology("tspawn")
        host = topology.add_host("x", {"wan": "198.18.0.2"})
        child = CollectingProcess()
        topology.spawn(host, child, [sys.executable, "-c", (
            "import ctypes, os; signal = ctypes.c_int();"
            "ctypes.CDLL(None).prctl(2, ctypes.byref(signal));"  # PR_GET_PDEATHSIG
            "print(os.readlink('/proc/self/ns/net'), signal.value)")])
        ended = yield child.ended
        self.assertIsInstance(ended, error.ProcessDone, child.err)
        self.assertEqual(child.out.decode().split(),
                         [ns_link(f"/run/netns/{host.netns}"), str(int(signal.SIGKILL))])

    def test_bad_input_is_named(self):
        with self.assertRaises(ValueError) as raised:
            Topology(reactor, "bad", networks={"wan": "10.0.0.0/24"})
        self.assertIn("10.0.0.0/24", str(raised.exception))
        topology = self.topology("bad")
        for addresses, named in (({"dmz": "198.18.0.2"}, "dmz"),
                                 ({"wan": "198.19.0.2"}, "198.19.0.2"),
                                 ({"wan": "198.18.0.0"}, "198.18.0.0")):
            with self.assertRaises(ValueError) as raised:
                topology.add_host("a", addresses)
            self.assertIn(named, str(raised.exception))
        topology.add_host("a", {"wan": "198.18.0.2"})
        with self.assertRaises(ValueError) as raised:
            topology.add_host("b", {"wan": "198.18.0.2"})
        self.assertIn("'a'", str(raised.exception))
        with self.assertRaises(ValueError) as raised:
            topology.cut("a", "wan", "sideways")
        self.assertIn("sideways", str(raised.exception))
        with self.assertRaises(ValueError) as raised:
            topology.cut("a", "lan")
        self.assertIn("lan", str(raised.exception))


class CutTests(NamespaceTestCase):

    def pair(self, name):
        topology = self.topology(name)
        a = topology.add_host("a", {"wan": "198.18.0.2"})
        b = topology.add_host("b", {"wan": "198.18.0.3"})
        return topology, a, b

    @defer.inlineCallbacks
    def test_cut_both_ways_and_heal(self):
        topology, a, b = self.pair("both")
        a_port = self.listen(a.reactor, 0, protocol.ServerFactory.forProtocol(
            protocol.Protocol)).getHost().port
        b_port = self.listen(b.reactor, 0, protocol.ServerFactory.forProtocol(
            protocol.Protocol)).getHost().port
        yield self.reaches(a, "198.18.0.3", b_port)
        topology.cut("a", "wan")
        self.assertEqual(topology.is_cut("a", "wan"), "both")
        self.assertIsInstance((yield self.connects(a, "198.18.0.3", b_port)),
                              error.TimeoutError)
        self.assertIsInstance((yield self.connects(b, "198.18.0.2", a_port)),
                              error.TimeoutError)
        topology.heal("a", "wan")
        yield self.reaches(a, "198.18.0.3", b_port)
        yield self.reaches(b, "198.18.0.2", a_port)
        self.assertEqual([event[1:] for event in topology.events],
                         [("a", "wan", "cut", "both"), ("a", "wan", "heal", "both")])
        self.assertLessEqual(topology.events[0].at, topology.events[1].at)

    @defer.inlineCallbacks
    def test_cut_out_drops_only_what_the_host_sends(self):
        topology, a, b = self.pair("out")
        at_a, at_b = self.udp(a), self.udp(b)
        b_port = self.listen(b.reactor, 0, protocol.ServerFactory.forProtocol(
            protocol.Protocol)).getHost().port
        topology.cut("a", "wan", "out")
        self.assertIsInstance((yield self.connects(a, "198.18.0.3", b_port)),
                              error.TimeoutError)
        yield self.arrives(at_b, at_a, "198.18.0.2", b"b to a, during the cut")
        at_a[1].write(b"a to b, during the cut", ("198.18.0.3", at_b[1].getHost().port))
        topology.heal("a", "wan")
        yield self.arrives(at_a, at_b, "198.18.0.3", b"a to b, healed")
        # Sent before the one that arrived, over the same path: it was dropped.
        self.assertNotIn(b"a to b, during the cut", at_b[0].received)
        self.assertEqual([event[1:] for event in topology.events],
                         [("a", "wan", "cut", "out"), ("a", "wan", "heal", "out")])

    @defer.inlineCallbacks
    def test_cut_in_drops_only_what_is_sent_to_the_host(self):
        topology, a, b = self.pair("in")
        at_a, at_b = self.udp(a), self.udp(b)
        topology.cut("a", "wan", "in")
        yield self.arrives(at_a, at_b, "198.18.0.3", b"a to b, during the cut")
        at_b[1].write(b"b to a, during the cut", ("198.18.0.2", at_a[1].getHost().port))
        topology.heal("a", "wan")
        yield self.arrives(at_b, at_a, "198.18.0.2", b"b to a, healed")
        self.assertNotIn(b"b to a, during the cut", at_a[0].received)
        self.assertEqual([event[1:] for event in topology.events],
                         [("a", "wan", "cut", "in"), ("a", "wan", "heal", "in")])

    @defer.inlineCallbacks
    def test_a_host_added_later_is_cut_off_too(self):
        topology, a, b = self.pair("later")
        topology.cut("a", "wan", "out")
        c = topology.add_host("c", {"wan": "198.18.0.4"})
        c_port = self.listen(c.reactor, 0, protocol.ServerFactory.forProtocol(
            protocol.Protocol)).getHost().port
        self.assertIsInstance((yield self.connects(a, "198.18.0.4", c_port)),
                              error.TimeoutError)
        yield self.reaches(b, "198.18.0.4", c_port)
        topology.heal("a", "wan")
        yield self.reaches(a, "198.18.0.4", c_port)


CHILD = r"""
import json, sys, time
from twisted.internet import protocol, reactor
from yurtcoord.testing.netns import Topology

topology = Topology(reactor, "child", prefix=sys.argv[1])
host = topology.add_host("a", {"wan": "198.18.0.2"})
topology.add_host("b", {"wan": "198.18.0.3"})
sleeper = topology.spawn(host, protocol.ProcessProtocol(),
                         [sys.executable, "-c", "import time; time.sleep(120)"])
print(json.dumps({"sleeper": sleeper.pid, "namespaces": [topology.switch] + [
    h.netns for h in topology.hosts.values()]}), flush=True)
if sys.argv[2] == "raise":
    raise RuntimeError("a test failing without its cleanups")
sys.stdin.read()
"""


class CleanupTests(NamespaceTestCase):
    """Nothing is left behind: no namespace, interface or process."""

    def test_failing_half_way_leaves_nothing(self):
        links = root_links()
        topology = self.topology("halfway")
        processes = []

        def scenario():
            a = topology.add_host("a", {"wan": "198.18.0.2", "lan": "198.19.0.2"})
            topology.add_host("b", {"wan": "198.18.0.3"})
            topology.cut("a", "wan", "out")
            sleeper = CollectingProcess()
            processes.append((topology.spawn(
                a, sleeper, [sys.executable, "-c", "import time; time.sleep(120)"]).pid,
                sleeper))
            raise RuntimeError("half way")

        self.assertRaises(RuntimeError, scenario)
        [(pid, sleeper)] = processes
        self.assertTrue(running(pid))
        made = {name for name in namespaces()
                if name.startswith(namespace_name("halfway", ""))}
        self.assertEqual(len(made), 3)

        def check(_):
            self.assertEqual(made & namespaces(), set())
            self.assertFalse(running(pid))
            self.assertEqual(root_links() - links, set())
            self.assertTrue(sleeper.ended.called)
            return topology.close()

        return topology.close().addCallback(check)

    def child(self, prefix, mode):
        """Run the CHILD script; its first line, its CollectingProcess and transport.
        Whatever it leaves under ``prefix`` is swept once it is killed, also when the
        test fails."""
        self.addCleanup(sweep_leftovers, prefix)
        child = CollectingProcess()
        transport = reactor.spawnProcess(child, sys.executable,
                                         [sys.executable, "-c", CHILD, prefix, mode],
                                         env=dict(os.environ))

        def kill():
            if transport.pid is not None:
                transport.signalProcess("KILL")
            return child.ended

        self.addCleanup(kill)
        d = poll_until(lambda: b"\n" in child.out or child.ended.called,
                       what="the child's topology")
        d.addCallback(lambda _: json.loads(child.out.split(b"\n")[0] or b"null"))
        return d.addCallback(lambda line: (line, child, transport))

    @defer.inlineCallbacks
    def test_an_uncaught_failure_cleans_up_at_exit(self):
        prefix = f"ycnetexit{os.getpid()}"
        line, child, _ = yield self.child(prefix, "raise")
        self.assertIsNotNone(line, child.err)
        ended = yield child.ended
        self.assertIsInstance(ended, error.ProcessTerminated)
        self.assertIn(b"a test failing without its cleanups", child.err)
        self.assertEqual(set(line["namespaces"]) & namespaces(), set())
        yield poll_until(lambda: not running(line["sleeper"]), what="the sleeper gone")

    @defer.inlineCallbacks
    def test_sweep_removes_what_a_killed_owner_left(self):
        prefix = f"ycnetkill{os.getpid()}"
        line, child, transport = yield self.child(prefix, "wait")
        self.assertIsNotNone(line, child.err)
        made = set(line["namespaces"])
        self.assertEqual(len(made), 3)
        transport.signalProcess("KILL")
        yield child.ended
        # Killed outright, it left its namespaces; its process died with it.
        self.assertEqual(made - namespaces(), set())
        yield poll_until(lambda: not running(line["sleeper"]), what="the sleeper gone")
        self.assertEqual(set(sweep_leftovers(prefix)), made)
        self.assertEqual(made & namespaces(), set())
        self.assertEqual(sweep_leftovers(prefix), [])

    @defer.inlineCallbacks
    def test_sweep_kills_what_is_left_inside(self):
        prefix = f"ycnetinside{os.getpid()}"
        # A pid that is certainly dead: a finished child's.
        dead = subprocess.Popen(["true"])
        dead.wait()
        orphan = namespace_name("orphan", "a", owner=dead.pid, prefix=prefix)
        subprocess.run(["ip", "netns", "add", orphan], check=True)
        self.addCleanup(sweep_leftovers, prefix)
        # Started without a parent-death signal, as by a killed owner's child whose
        # signal was lost: only the sweep ends it.
        stray = subprocess.Popen(["ip", "netns", "exec", orphan, sys.executable, "-c",
                                  "import time; time.sleep(120)"])
        self.addCleanup(lambda: stray.poll() is None and stray.kill())
        yield poll_until(lambda: str(stray.pid) in subprocess.run(
            ["ip", "netns", "pids", orphan], capture_output=True).stdout.decode().split(),
            what="the stray inside")
        self.assertEqual(sweep_leftovers(prefix), [orphan])
        self.assertEqual(stray.wait(timeout=5), -signal.SIGKILL)
        self.assertNotIn(orphan, namespaces())

    @defer.inlineCallbacks
    def test_sweep_leaves_a_live_owner_alone(self):
        prefix = f"ycnetlive{os.getpid()}"
        mine = self.topology("mine", prefix=prefix)
        mine.add_host("a", {"wan": "198.18.0.2"})
        line, child, transport = yield self.child(prefix, "wait")
        self.assertIsNotNone(line, child.err)
        self.assertEqual(sweep_leftovers(prefix), [])
        self.assertEqual(set(line["namespaces"]) - namespaces(), set())
        self.assertIn(mine.hosts["a"].netns, namespaces())
        self.assertTrue(running(line["sleeper"]))
        transport.signalProcess("KILL")
        yield child.ended
        self.assertEqual(set(sweep_leftovers(prefix)), set(line["namespaces"]))
        self.assertIn(mine.hosts["a"].netns, namespaces())
