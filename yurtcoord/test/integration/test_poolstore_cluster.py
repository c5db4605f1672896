"""The pool store on a real 3-member etcd cluster: one member lost (the raft leader in
the middle of an upload, or a follower) costs nothing, two lost make requests fail
with a clear error until a member is back, and the store recovers by itself. Read back
with etcdctl against a live member.

Members killed and not restarted: on the preferred etcd version only, as losing them
costs the same on 3.4 and 3.5. Members killed and restarted: on a version that keeps
acknowledged writes through SIGKILL, as a member of a 3.5.0 to 3.5.2 cluster restarted
after SIGKILL can answer without writes the cluster acknowledged (etcd-io/etcd#13766)."""

import os
import time
from typing import Any, Generator, Optional

from twisted.internet import defer, reactor, task

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.etcd.errors import EtcdError, EtcdUnavailable
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.keys import KeyBuildInfo, PoolKey, format_rv
from yurtcoord.pool.store import PoolStore, WriteOutcome
from yurtcoord.sim import pki
from yurtcoord.sim.etcd import EtcdCluster, EtcdProcess, make_etcd_test_class
from yurtcoord.testing.storedobjects import make_object
from yurtcoord.testing.poll import poll_until

# Seconds one etcd request may take: short, so that a lost member costs little here.
REQUEST_TIMEOUT = 2.0
# Objects of one upload: enough batches that the upload is still going when a member dies.
UPLOAD_OBJECTS = 1500
# Seconds an upload (or a recovery) may take at most on a loaded 2-core machine.
DEADLINE = 90.0


class _ClusterStoreCase:
    """A 3-member cluster per test and stores on it, for the mixins below."""

    etcd_binary: Any
    tls = False

    def setUp(self) -> None:
        ca = pki.TestCA(os.path.abspath(self.mktemp())) if self.tls else None
        self.cluster = EtcdCluster(self.etcd_binary, tls_ca=ca).start()
        self.addCleanup(self.cluster.stop)
        self.ca = ca

    def store_on(self, first: EtcdProcess) -> PoolStore:
        """A store whose client sends to ``first`` first, then the other members."""
        urls = [first.client_url] + [m.client_url for m in self.cluster.members
                                     if m is not first]
        tls: dict[str, Any] = {}
        if self.ca is not None:
            pair = self.cluster.client_cert
            tls = dict(ca_file=self.ca.ca_file, cert_file=pair.cert_file,
                       key_file=pair.key_file)
        self.client = EtcdClient(reactor, EtcdConfig(
            urls[0], more_urls=tuple(urls[1:]), timeout=REQUEST_TIMEOUT, **tls))
        self.addCleanup(self.client.close)
        cache_dir = os.path.abspath(self.mktemp())
        store = PoolStore(reactor, self.client, "/registry",
                          ComponentKeyCache.in_directory(cache_dir).load())
        self.addCleanup(store.close)
        return store

    def key(self, store: PoolStore, name: str) -> PoolKey:
        return store.key_func(KeyBuildInfo("kubelet", "pods", "", "v1", "ns", name))

    def items(self, store: PoolStore, count: int) -> list[tuple[PoolKey, bytes, int]]:
        return [(self.key(store, f"p{i:05d}"), make_object(f"p{i:05d}", "ns", 100 + i,
                                                           padding=200), 100 + i)
                for i in range(count)]

    @defer.inlineCallbacks
    def upload(self, store: PoolStore, items: list, outcome: WriteOutcome,
               errors: list) -> Generator[Any, Any, None]:
        """Upload as the uploader does: the same outcome again after each etcd error."""
        give_up = time.monotonic() + DEADLINE
        while True:
            try:
                yield store.create_or_update_many(items, outcome)
                return
            except EtcdError as error:
                errors.append(error)
                if time.monotonic() > give_up:
                    raise
                yield task.deferLater(reactor, 0.2, lambda: None)

    def assert_exactly_in_etcd(self, items: list) -> None:
        """etcd (etcdctl against a live member) holds every object and mirror, no more."""
        stored = self.cluster.read("/registry/", prefix=True)
        self.assertEqual(stored, {key.path.encode(): value for key, value, _rv in items})
        mirrors = self.cluster.read("/mirror/rv/registry/", prefix=True)
        self.assertEqual(mirrors, {b"/mirror/rv" + key.path.encode(): format_rv(rv).encode()
                                   for key, _value, rv in items})

    @defer.inlineCallbacks
    def lose_one_member_mid_upload(self, victim: EtcdProcess) -> Generator[Any, Any, None]:
        store = self.store_on(victim)
        items = self.items(store, UPLOAD_OBJECTS)
        outcome, errors = WriteOutcome(), []
        uploading = self.upload(store, items, outcome, errors)
        yield poll_until(lambda: len(outcome.created) > 0 or uploading.called,
                         timeout=DEADLINE, what="the first batch acknowledged")
        self.assertFalse(uploading.called, "the upload ended before the member was killed")
        victim.kill()
        yield uploading
        paths = [key.path for key, _value, _rv in items]
        self.assertEqual(sorted(outcome.created), sorted(paths))
        self.assertEqual(len(set(outcome.created)), len(paths))
        self.assertEqual((outcome.updated, outcome.in_doubt), ([], {}))
        self.assert_exactly_in_etcd(items)
        self.assertNotEqual(self.client.member, victim.client_url)
        self.assertIn(self.client.member, self.cluster.client_urls)
        # The store keeps working on the members left.
        more = [(self.key(store, "after"), make_object("after", "ns", 7), 7)]
        again = yield store.create_or_update_many(more)
        self.assertEqual(again.created, [more[0][0].path])
        self.assert_exactly_in_etcd(items + more)



class PoolStoreOnClusterMixin(_ClusterStoreCase):
    """On the preferred etcd version (see make_etcd_test_class); each test kills
    members, so each has a cluster of its own."""

    def test_leader_killed_mid_upload_loses_and_duplicates_nothing(self):
        return self.lose_one_member_mid_upload(self.cluster.leader())

    def test_follower_killed_mid_upload_loses_and_duplicates_nothing(self):
        return self.lose_one_member_mid_upload(self.cluster.followers()[0])


class PoolStoreOnClusterRestartMixin(_ClusterStoreCase):
    """A killed member restarted: on ``kill_safe_etcd_version()`` (see
    make_etcd_test_class)."""

    @defer.inlineCallbacks
    def test_two_members_down_fail_clearly_and_the_store_recovers_by_itself(self):
        first, second, third = self.cluster.members
        store = self.store_on(first)
        yield store.create(self.key(store, "before"), make_object("before", "ns", 1))
        first.kill()
        second.kill()
        # The member left answers its status but has no leader: the store is unhealthy.
        yield poll_until(lambda: store.check_health().addCallback(lambda _: not store.healthy),
                         timeout=DEADLINE, interval=0.2, what="the store unhealthy")
        key = self.key(store, "during")
        value = make_object("during", "ns", 2)
        last: list[Optional[BaseException]] = [None]

        @defer.inlineCallbacks
        def refused_at_once() -> Generator[Any, Any, bool]:
            started = time.monotonic()
            try:
                yield store.create(key, value)
            except EtcdUnavailable as error:
                last[0] = error
                return ("no etcd member serves" in str(error)
                        and time.monotonic() - started < REQUEST_TIMEOUT)
            except EtcdError as error:
                last[0] = error
            return False

        # Once every member has failed a request, each request fails at once with
        # an error naming every member.
        yield poll_until(refused_at_once, timeout=DEADLINE, interval=0.2,
                         what="a request refused at once")
        message = str(last[0])
        for url in self.cluster.client_urls:
            self.assertIn(url, message)
        self.assertIsNone(self.client.member)
        # The store's health says why, as the agent's /readyz shows it (after two
        # failed checks in a row).
        yield store.check_health()
        yield store.check_health()
        self.assertFalse(store.healthy)
        self.assertIn("no etcd member serves", store.unreachable)
        for url in self.cluster.client_urls:
            self.assertIn(url, store.unreachable)

        self.cluster.restart(1)

        @defer.inlineCallbacks
        def written() -> Generator[Any, Any, bool]:
            try:
                yield store.create_or_update_many([(key, value, 2)])
            except EtcdError:
                return False
            return True

        yield poll_until(written, timeout=DEADLINE, interval=0.2,
                         what="a write accepted once a member is back")
        self.assertIn(self.client.member, (second.client_url, third.client_url))
        yield store.check_health()
        self.assertTrue(store.healthy)
        self.assertIsNone(store.unreachable)
        self.assertEqual(self.cluster.read("/registry/", prefix=True), {
            self.key(store, "before").path.encode(): make_object("before", "ns", 1),
            key.path.encode(): value})


class PoolStoreOnClusterOverTLSMixin(_ClusterStoreCase):
    """Mutual TLS on every member, each with a server certificate of its own."""

    tls = True

    def test_leader_killed_mid_upload_over_tls(self):
        return self.lose_one_member_mid_upload(self.cluster.leader())


make_etcd_test_class(PoolStoreOnClusterMixin, globals())
make_etcd_test_class(PoolStoreOnClusterRestartMixin, globals(), restarts_killed_members=True)
make_etcd_test_class(PoolStoreOnClusterOverTLSMixin, globals())
