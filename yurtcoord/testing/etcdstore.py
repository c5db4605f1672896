"""A real etcd with a ``PoolStore`` on it, for the tests of the pool store and of what
writes through it (the objects they store are ``yurtcoord.testing.storedobjects``).

The etcd is the run's shared one of its binary and flags (``yurtcoord.testing.sharedetcd``),
emptied after each test; a case whose tests need an etcd of their own sets
``own_etcd``."""

import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Tuple

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.pool.keycache import KEY_CACHE_FILE_NAME, ComponentKeyCache
from yurtcoord.pool.keys import KeyBuildInfo, PoolKey
from yurtcoord.pool.store import PoolStore, Steps
from yurtcoord.sim.etcd import EtcdBinary, EtcdProcess, etcd_binary_for
from yurtcoord.testing.sharedetcd import use_shared_etcd

ETCD_34 = etcd_binary_for("3.4")
ETCD_35 = etcd_binary_for("3.5")

if TYPE_CHECKING:
    _TestCase = unittest.TestCase
else:
    _TestCase = object


class EtcdStoreCase(_TestCase):
    """A real etcd (shared, emptied after each test) and a PoolStore on it; mixed into
    trial TestCases."""

    etcd_binary: Optional[EtcdBinary] = None
    etcd_args: Tuple[str, ...] = ()
    store_kwargs: Dict[str, Any] = {}
    # True: each test starts an etcd of its own instead of the shared one.
    own_etcd = False

    def setUp(self) -> None:
        if self.etcd_binary is None:
            raise unittest.SkipTest("this etcd version is not installed")
        if self.own_etcd:
            self.etcd = EtcdProcess(self.etcd_binary, extra_args=self.etcd_args).start()
            self.addCleanup(self.etcd.stop)
        else:
            self.etcd = use_shared_etcd(self, self.etcd_binary, extra_args=self.etcd_args)
        self.cache_dir = os.path.abspath(self.mktemp())
        os.makedirs(self.cache_dir)
        self.client = self.new_client()
        self.key_cache = ComponentKeyCache.in_directory(self.cache_dir).load()
        self.store = self.new_store(self.client, self.key_cache, **self.store_kwargs)

    def new_client(self) -> EtcdClient:
        client = EtcdClient(reactor, EtcdConfig(self.etcd.client_url, timeout=5.0))
        self.addCleanup(client.close)
        return client

    def new_store(self, client: Any, key_cache: ComponentKeyCache, **kwargs: Any) -> PoolStore:
        store = PoolStore(reactor, client, "/registry", key_cache, **kwargs)
        self.addCleanup(store.close)
        return store

    def key(self, resource: str, name: str, namespace: str = "", component: str = "kubelet",
            group: str = "", version: str = "v1") -> PoolKey:
        return self.store.key_func(KeyBuildInfo(component, resource, group, version,
                                                namespace, name))

    def dump(self, prefix: str = "/registry/") -> Dict[str, bytes]:
        """``{key: value}`` under prefix as etcdctl sees it, str keys."""
        return {k.decode(): v for k, v in self.etcd.read(prefix, prefix=True).items()}

    def mirrors(self, prefix: str = "/registry/") -> Dict[str, str]:
        mirrors = self.dump("/mirror/rv" + prefix)
        return {k[len("/mirror/rv"):]: v.decode() for k, v in mirrors.items()}

    def cache_file(self) -> str:
        path = os.path.join(self.cache_dir, KEY_CACHE_FILE_NAME)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read()

    @defer.inlineCallbacks
    def create_all(self, objects: Iterable[Tuple[PoolKey, bytes]]) -> Steps:
        """Create ``[(key, bytes)]`` in the store."""
        for key, value in objects:
            yield self.store.create(key, value)

