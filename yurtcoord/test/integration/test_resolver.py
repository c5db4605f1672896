"""The coordinator apiserver and the pool etcd named by a DNS name that resolves once
and then no more (its DNS server cut off with the cloud), over real sockets: the
clients keep reaching them at the remembered loopback address, on new connections,
and an agent restarted meanwhile finds the address in its state directory. The
resolver's rules on a Clock: ``yurtcoord/test/unit/test_resolver.py``."""

import os

from twisted.internet import defer, reactor
from twisted.trial import unittest
from zope.interface.verify import verifyObject
from twisted.internet.interfaces import IHostnameResolver

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import NotFound
from yurtcoord.kube.gvr import CONFIGMAPS
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.etcd import make_etcd_test_class
from yurtcoord.testing.fakeresolver import FakeResolver
from yurtcoord.testing.sharedetcd import use_shared_etcd
from yurtcoord.tx.resolver import RememberedAddresses, RememberingResolver

APISERVER = "yurt-coordinator-apiserver.test"
ETCD = "yurt-coordinator-etcd.test"


class StateDirFixture:
    def state_dir(self):
        path = self.mktemp()
        os.mkdir(path)
        return path

    def resolver(self, dns, state_dir):
        return RememberingResolver(reactor, dns, RememberedAddresses(
            os.path.join(state_dir, "resolved-addresses.json")))


class CoordinatorAPIServerTests(StateDirFixture, unittest.TestCase):
    @defer.inlineCallbacks
    def test_the_apiserver_is_reached_while_its_name_does_not_resolve(self):
        server = KubeAPIServer(reactor)
        url = yield server.start(port=0)
        self.addCleanup(server.stop)
        port = url.rsplit(":", 1)[1]
        dns = FakeResolver({APISERVER: ["127.0.0.1"]})
        self.assertTrue(verifyObject(IHostnameResolver, dns))
        state_dir = self.state_dir()

        def client(resolver):
            made = KubeClient(reactor, ClientConfig(server=f"http://{APISERVER}:{port}",
                                                    insecure=True, timeout=5.0),
                              name_resolver=resolver)
            self.addCleanup(made.close)
            return made

        first = client(self.resolver(dns, state_dir))
        yield self.assertFailure(first.get(CONFIGMAPS, "a", "ns"), NotFound)
        del dns.answers[APISERVER]  # from now on the name does not resolve
        yield first.drop_connections()  # the next request dials again
        yield first.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": "ns"}})
        restarted = client(self.resolver(dns, state_dir))  # an agent started now
        got = yield restarted.get(CONFIGMAPS, "a", "ns")
        self.assertEqual(got["metadata"]["name"], "a")
        self.assertEqual(dns.lookups, [APISERVER] * 3)


class PoolEtcdTestsMixin(StateDirFixture):
    def setUp(self):
        self.etcd = use_shared_etcd(self, self.etcd_binary)

    @defer.inlineCallbacks
    def test_the_pool_etcd_is_reached_while_its_name_does_not_resolve(self):
        port = self.etcd.client_url.rsplit(":", 1)[1]
        dns = FakeResolver({ETCD: ["127.0.0.1"]})
        state_dir = self.state_dir()

        def client():
            made = EtcdClient(reactor, EtcdConfig(url=f"http://{ETCD}:{port}", timeout=5.0),
                              name_resolver=self.resolver(dns, state_dir))
            self.addCleanup(made.close)
            return made

        yield client().put(b"/registry/configmaps/ns/a", b"before")
        del dns.answers[ETCD]
        stored = yield client().get(b"/registry/configmaps/ns/a")
        self.assertEqual(stored.value, b"before")


make_etcd_test_class(PoolEtcdTestsMixin, globals())
