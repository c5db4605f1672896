"""The etcd storage of the test API server without an etcd: the storage interface it
provides, kube-apiserver's key layout, and that a server on etcd has no synchronous
store (what it serves from a real etcd is tested in the integration tier)."""

from twisted.internet import reactor
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.kube import gvr as gvrs
from yurtcoord.sim.apiserver import KubeAPIServer
from yurtcoord.sim.apiserver.etcdstorage import EtcdStorage, storage_for
from yurtcoord.sim.apiserver.storage import IObjectStorage


class EtcdStorageInterfaceTests(unittest.TestCase):

    def test_provides_the_storage_interface(self):
        storage = EtcdStorage(lambda: EtcdClient(reactor, EtcdConfig("http://127.0.0.1:1")),
                              reactor)
        self.addCleanup(storage.close)
        self.assertTrue(verifyObject(IObjectStorage, storage))

    def test_keys_are_the_pool_stores(self):
        storage = storage_for(reactor, "http://127.0.0.1:1,http://127.0.0.1:2", "registry/")
        self.addCleanup(storage.close)
        self.assertEqual(storage.key(gvrs.NODES, "edge-1"), b"/registry/minions/edge-1")
        self.assertEqual(storage.key(gvrs.ENDPOINTS, "svc", "default"),
                         b"/registry/services/endpoints/default/svc")
        self.assertEqual(storage.key(gvrs.SERVICES, "svc", "default"),
                         b"/registry/services/specs/default/svc")
        self.assertEqual(storage.key(gvrs.ENDPOINTSLICES_V1BETA1, "s", "kube-system"),
                         b"/registry/endpointslices/kube-system/s")
        with self.assertRaises(ValueError):
            storage_for(reactor, " , ")

    def test_a_server_on_etcd_has_no_synchronous_store(self):
        storage = storage_for(reactor, "http://127.0.0.1:1")
        self.addCleanup(storage.close)
        server = KubeAPIServer(reactor, storage=storage)
        with self.assertRaises(AttributeError) as raised:
            server.store
        self.assertIn("server.storage", str(raised.exception))

