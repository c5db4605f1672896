"""A real etcd per test with a ``PoolStore`` on it, and objects to store, for the
tests of the pool store and of what writes through it."""

import json
import os

from twisted.internet import defer, reactor
from twisted.trial import unittest

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.etcd.errors import EtcdTimeout
from yurtcoord.pool.keycache import KEY_CACHE_FILE_NAME, ComponentKeyCache
from yurtcoord.pool.keys import KeyBuildInfo
from yurtcoord.pool.store import PoolStore
from yurtcoord.sim.etcd import EtcdProcess, etcd_binary_for

ETCD_34 = etcd_binary_for("3.4")
ETCD_35 = etcd_binary_for("3.5")


def make_object(name, namespace, rv, kind="Pod", padding=0):
    """Compact JSON bytes of a Kubernetes-like object (exact bytes are what etcd must hold)."""
    metadata = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        metadata["namespace"] = namespace
    obj = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
    if padding:
        obj["spec"] = {"padding": "x" * padding}
    return json.dumps(obj, separators=(",", ":")).encode()


class EtcdStoreCase:
    """Starts a real etcd per test and a PoolStore on it; mixed into trial TestCases."""

    etcd_binary = None
    etcd_args = ()
    store_kwargs = {}

    def setUp(self):
        if self.etcd_binary is None:
            raise unittest.SkipTest("this etcd version is not installed")
        self.etcd = EtcdProcess(self.etcd_binary, extra_args=self.etcd_args).start()
        self.addCleanup(self.etcd.stop)
        self.cache_dir = os.path.abspath(self.mktemp())
        os.makedirs(self.cache_dir)
        self.client = self.new_client()
        self.key_cache = ComponentKeyCache.in_directory(self.cache_dir).load()
        self.store = self.new_store(self.client, self.key_cache, **self.store_kwargs)

    def new_client(self):
        client = EtcdClient(reactor, EtcdConfig(self.etcd.client_url, timeout=5.0))
        self.addCleanup(client.close)
        return client

    def new_store(self, client, key_cache, **kwargs):
        store = PoolStore(reactor, client, "/registry", key_cache, **kwargs)
        self.addCleanup(store.close)
        return store

    def key(self, resource, name, namespace="", component="kubelet", group="", version="v1"):
        return self.store.key_func(KeyBuildInfo(component, resource, group, version,
                                                namespace, name))

    def dump(self, prefix="/registry/"):
        """``{key: value}`` under prefix as etcdctl sees it, str keys."""
        return {k.decode(): v for k, v in self.etcd.read(prefix, prefix=True).items()}

    def mirrors(self, prefix="/registry/"):
        mirrors = self.dump("/mirror/rv" + prefix)
        return {k[len("/mirror/rv"):]: v.decode() for k, v in mirrors.items()}

    def cache_file(self):
        path = os.path.join(self.cache_dir, KEY_CACHE_FILE_NAME)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read()

    @defer.inlineCallbacks
    def create_all(self, objects):
        """Create ``[(key, bytes)]`` in the store."""
        for key, value in objects:
            yield self.store.create(key, value)


class HangingClient:
    """Requests never answer; cancelling one fails it the way the etcd client does."""

    def _hang(self, *args, **kwargs):
        return defer.Deferred(lambda d: d.errback(EtcdTimeout("request cancelled")))

    submit = get = range_page = status = _hang
