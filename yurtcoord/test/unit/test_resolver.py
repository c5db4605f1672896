"""The remembering resolver on a ``task.Clock`` with a scripted DNS: a coordinator
apiserver or pool etcd named by a DNS name is reached at the addresses the name last
resolved to while it does not resolve (found nothing, or no answer in time), from
memory and from the file in the state directory, with one warning per outage; a file
that is not what the agent writes is ignored with a warning. The clients connect
through it (a memory reactor records where they dial). Over real sockets:
``yurtcoord/test/integration/test_resolver.py``."""

import json
import os

from twisted.internet.interfaces import (
    IHostnameResolver, IHostResolution, IReactorPluggableNameResolver, IReactorTCP,
    IReactorTime, IResolutionReceiver,
)
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.gvr import LEASES
from yurtcoord.testing.clocks import advance
from yurtcoord.testing.fakeresolver import FakeResolution, FakeResolver, RecordingReceiver
from yurtcoord.testing.logcapture import GlobalLogCapture
from yurtcoord.testing.leaseprobes import make_clock
from yurtcoord.tx.resolver import (
    ADDRESSES_FILE_NAME, DEFAULT_PATIENCE, RememberedAddresses, RememberingResolver,
    ResolverReactor, remembering_resolver,
)

NAME = "yurt-coordinator-etcd.kube-system.svc"
OTHER = "yurt-coordinator-apiserver.kube-system.svc"


class Fixture:
    def setUp(self):
        self.clock = make_clock()
        self.dns = FakeResolver({NAME: ["10.0.0.7"]})
        self.state_dir = self.mktemp()
        os.mkdir(self.state_dir)
        self.path = os.path.join(self.state_dir, ADDRESSES_FILE_NAME)
        self.log = GlobalLogCapture(self)

    def resolver(self):
        return RememberingResolver(self.clock, self.dns, RememberedAddresses(self.path))

    def resolve(self, resolver, name=NAME, port=2379, **kwargs):
        receiver = RecordingReceiver()
        resolution = resolver.resolveHostName(receiver, name, port, **kwargs)
        self.assertTrue(verifyObject(IHostResolution, resolution))
        return receiver

    def warnings(self):
        return [e for e in self.log.events
                if e.get("log_level") is not None and e["log_level"].name == "warn"
                and e.get("log_namespace", "").startswith("yurtcoord.tx.resolver")]

    def stored(self):
        with open(self.path, encoding="utf-8") as handle:
            return json.load(handle)


class FakesTests(Fixture, unittest.TestCase):
    def test_the_fakes_provide_their_interfaces(self):
        self.assertTrue(verifyObject(IHostnameResolver, self.dns))
        self.assertTrue(verifyObject(IResolutionReceiver, RecordingReceiver()))
        self.assertTrue(verifyObject(IHostResolution, FakeResolution(NAME)))
        self.assertTrue(verifyObject(IHostnameResolver, self.resolver()))
        view = ResolverReactor(MemoryReactorClock(), self.resolver())
        for interface in (IReactorPluggableNameResolver, IReactorTCP, IReactorTime):
            self.assertTrue(verifyObject(interface, view))


class RememberingResolverTests(Fixture, unittest.TestCase):
    def test_a_name_that_resolves_is_answered_by_the_dns_and_remembered(self):
        resolver = self.resolver()
        self.dns.answers[NAME] = ["10.0.0.7", "fd00::7"]
        receiver = self.resolve(resolver)
        self.assertEqual((receiver.began, receiver.complete), (True, True))
        self.assertEqual(receiver.addresses, [("10.0.0.7", 2379), ("fd00::7", 2379)])
        self.assertEqual(self.stored(), {"version": 1,
                                         "names": {NAME: ["10.0.0.7", "fd00::7"]}})
        self.assertEqual(self.warnings(), [])

    def test_while_the_name_does_not_resolve_its_last_addresses_are_used(self):
        resolver = self.resolver()
        self.resolve(resolver)
        del self.dns.answers[NAME]  # the DNS server is cut off with the cloud
        answers = [self.resolve(resolver, port=port) for port in (2379, 2379, 443)]
        self.assertEqual([r.addresses for r in answers],
                         [[("10.0.0.7", 2379)], [("10.0.0.7", 2379)], [("10.0.0.7", 443)]])
        self.assertTrue(all(r.complete for r in answers))
        self.assertEqual(self.dns.lookups, [NAME] * 4)  # the DNS is still asked every time
        warnings = self.warnings()
        self.assertEqual(len(warnings), 1)
        self.assertIn(f"{NAME} does not resolve: connecting to the addresses it last "
                      "resolved to (10.0.0.7)", formatEvent(warnings[0]))

    def test_once_it_resolves_again_the_new_addresses_are_used_and_kept(self):
        resolver = self.resolver()
        self.resolve(resolver)
        del self.dns.answers[NAME]
        self.resolve(resolver)
        self.dns.answers[NAME] = ["10.0.0.8"]
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.8", 2379)])
        self.assertEqual(self.stored()["names"], {NAME: ["10.0.0.8"]})
        self.assertEqual(len(self.log.matching(f"{NAME} resolves again: 10.0.0.8")), 1)
        del self.dns.answers[NAME]  # the next outage: warned of once more
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.8", 2379)])
        self.assertEqual(len(self.warnings()), 2)

    def test_a_name_never_resolved_fails_as_before(self):
        receiver = self.resolve(self.resolver(), name=OTHER)
        self.assertEqual((receiver.addresses, receiver.complete), ([], True))
        self.assertFalse(os.path.exists(self.path))

    def test_an_agent_started_during_the_outage_uses_the_file(self):
        self.resolve(self.resolver())
        del self.dns.answers[NAME]
        restarted = self.resolver()  # a new agent: nothing in memory
        self.assertEqual(self.resolve(restarted).addresses, [("10.0.0.7", 2379)])

    def test_a_dns_that_does_not_answer_costs_the_patience_once(self):
        """A lookup of a remembered name that has not answered within the patience is
        answered from memory; requests meanwhile take the memory at once and start no
        lookup of their own; the late answer still updates the memory."""
        resolver = self.resolver()
        self.resolve(resolver)
        self.dns.hang = True
        first = self.resolve(resolver)
        advance(self.clock, DEFAULT_PATIENCE - 0.001)
        self.assertFalse(first.complete)
        advance(self.clock, 0.001)
        self.assertEqual(first.addresses, [("10.0.0.7", 2379)])
        later = self.resolve(resolver)
        self.assertEqual(later.addresses, [("10.0.0.7", 2379)])
        self.assertEqual(self.dns.held, 1)
        self.assertEqual(self.dns.lookups, [NAME, NAME])
        self.assertEqual(len(self.warnings()), 1)
        self.assertIn("has not resolved within 1s", formatEvent(self.warnings()[0]))
        self.dns.answers[NAME] = ["10.0.0.9"]
        self.dns.release()
        self.assertEqual(self.stored()["names"], {NAME: ["10.0.0.9"]})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_requests_during_a_lookup_wait_for_it(self):
        resolver = self.resolver()
        self.dns.hang = True
        waiting = [self.resolve(resolver), self.resolve(resolver, port=443)]
        advance(self.clock, 10)  # nothing remembered: no patience, the DNS decides
        self.assertFalse(any(r.complete for r in waiting))
        self.dns.release()
        self.assertEqual([r.addresses for r in waiting],
                         [[("10.0.0.7", 2379)], [("10.0.0.7", 443)]])
        self.assertEqual(self.dns.lookups, [NAME])

    def test_a_resolver_that_raises_ends_that_lookup_only(self):
        resolver = self.resolver()
        self.resolve(resolver)
        self.dns.error = OSError("resolver broken")
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.7", 2379)])
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.dns.error = None
        self.dns.answers[NAME] = ["10.0.0.8"]
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.8", 2379)])

    def test_address_types_are_honoured(self):
        resolver = self.resolver()
        self.dns.answers[NAME] = ["10.0.0.7", "fd00::7"]
        self.resolve(resolver)
        del self.dns.answers[NAME]
        self.assertEqual(self.resolve(resolver, addressTypes=[IPv6Address]).addresses,
                         [("fd00::7", 2379)])
        self.assertEqual(self.resolve(resolver, addressTypes=[IPv4Address]).addresses,
                         [("10.0.0.7", 2379)])

    def test_ip_literals_pass_through_and_are_not_remembered(self):
        resolver = self.resolver()
        self.assertEqual(self.resolve(resolver, name="127.0.0.1").addresses,
                         [("127.0.0.1", 2379)])
        self.assertFalse(os.path.exists(self.path))

    def test_a_new_order_of_the_same_addresses_writes_nothing(self):
        resolver = self.resolver()
        self.dns.answers[NAME] = ["10.0.0.7", "10.0.0.8"]
        self.resolve(resolver)
        written = os.stat(self.path).st_ino  # a write replaces the file
        self.dns.answers[NAME] = ["10.0.0.8", "10.0.0.7"]
        self.assertEqual(self.resolve(resolver).addresses,
                         [("10.0.0.8", 2379), ("10.0.0.7", 2379)])
        self.assertEqual(os.stat(self.path).st_ino, written)
        self.dns.answers[NAME] = ["10.0.0.8"]
        self.resolve(resolver)
        self.assertNotEqual(os.stat(self.path).st_ino, written)


class StateFileTests(Fixture, unittest.TestCase):
    """Nothing the file holds stops the agent: what is not the file the agent writes is
    ignored with one warning, and the next resolution writes a good one."""

    BAD = {
        "not JSON": b"{\"version\": 1, \"names\": {",
        "not UTF-8": b"\xff\xfe\x00",
        "nested too deep": b"[" * 100000 + b"]" * 100000,
        "a list": b"[]",
        "another version": b'{"version": 2, "names": {}}',
        "names not an object": b'{"version": 1, "names": []}',
        "addresses not a list": b'{"version": 1, "names": {"a": "10.0.0.7"}}',
        "not an IP address": b'{"version": 1, "names": {"a": ["evil.example"]}}',
        "an empty list": b'{"version": 1, "names": {"a": []}}',
        "too large": b'{"version": 1, "names": {}, "x": "' + b"x" * (1024 * 1024) + b'"}',
    }

    def test_a_corrupt_file_is_ignored_with_a_warning(self):
        for what, content in self.BAD.items():
            with open(self.path, "wb") as handle:
                handle.write(content)
            before = len(self.warnings())
            memory = RememberedAddresses(self.path)
            self.assertEqual(memory.get("a"), (), what)
            self.assertEqual(len(self.warnings()), before + 1, what)
            self.assertIn("remembered addresses file", formatEvent(self.warnings()[-1]))
        resolver = RememberingResolver(self.clock, self.dns, memory)
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.7", 2379)])
        self.assertEqual(self.stored()["names"], {NAME: ["10.0.0.7"]})

    def test_an_unreadable_file_is_ignored(self):
        os.mkdir(self.path)  # reading a directory fails
        memory = RememberedAddresses(self.path)
        self.assertEqual(memory.get(NAME), ())
        self.assertEqual(len(self.warnings()), 1)

    def test_an_unwritable_state_directory_keeps_the_addresses_in_memory(self):
        resolver = RememberingResolver(
            self.clock, self.dns,
            RememberedAddresses(os.path.join(self.state_dir, "missing", ADDRESSES_FILE_NAME)))
        self.resolve(resolver)
        self.dns.answers[OTHER] = ["10.0.0.9"]
        self.resolve(resolver, name=OTHER)
        self.assertEqual(len(self.log.matching("cannot write remembered addresses")), 1)
        del self.dns.answers[NAME]
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.7", 2379)])

    def test_no_state_directory_is_memory_only(self):
        resolver = RememberingResolver(self.clock, self.dns, RememberedAddresses(None))
        self.resolve(resolver)
        del self.dns.answers[NAME]
        self.assertEqual(self.resolve(resolver).addresses, [("10.0.0.7", 2379)])
        self.assertEqual(os.listdir(self.state_dir), [])

    def test_made_for_a_reactor_with_a_pluggable_resolver_only(self):
        self.assertIsNone(remembering_resolver(self.clock, self.state_dir))
        reactor = MemoryReactorClock()
        made = remembering_resolver(reactor, self.state_dir)
        self.assertIsInstance(made, RememberingResolver)
        self.assertEqual(made.memory.path, self.path)


class ClientsDialTests(Fixture, unittest.TestCase):
    """Where the clients of the coordinator apiserver and of the pool etcd dial when
    their server's name does not resolve: the remembered address (a memory reactor
    records the connection attempts)."""

    def setUp(self):
        super().setUp()
        self.reactor = MemoryReactorClock()
        self.remembering = RememberingResolver(self.reactor, self.dns,
                                               RememberedAddresses(self.path))
        self.dns.answers[OTHER] = ["10.0.0.8"]
        for name in (NAME, OTHER):  # resolved once, before the outage
            self.resolve(self.remembering, name=name)
        self.dns.answers.clear()

    def close_on_the_memory_reactor(self, client):
        closed = client.close()
        self.reactor.advance(0)  # the close waits one turn of the client's reactor
        self.successResultOf(closed)

    def dialled(self):
        return [(host, port) for host, port, *_ in self.reactor.tcpClients]

    def test_hostname_endpoint_dials_the_remembered_address(self):
        endpoint = HostnameEndpoint(ResolverReactor(self.reactor, self.remembering), NAME, 2379)
        endpoint.connect(Factory.forProtocol(Protocol))
        self.assertEqual(self.dialled(), [("10.0.0.7", 2379)])

    def test_kube_client_dials_the_remembered_address(self):
        client = KubeClient(self.reactor, ClientConfig(server=f"http://{OTHER}:8080",
                                                       insecure=True),
                            name_resolver=self.remembering)
        self.addCleanup(client.close)
        client.get(LEASES, "edge-1", namespace="kube-node-lease").addErrback(lambda _: None)
        self.assertEqual(self.dialled(), [("10.0.0.8", 8080)])

    def test_etcd_client_dials_the_remembered_address(self):
        client = EtcdClient(self.reactor, EtcdConfig(url=f"http://{NAME}:2379"),
                            name_resolver=self.remembering)
        self.addCleanup(self.close_on_the_memory_reactor, client)
        client.get(b"/registry/leases/").addErrback(lambda _: None)
        self.assertEqual(self.dialled(), [("10.0.0.7", 2379)])
