"""The txaioetcd adapter against a real etcd (the preferred version; 3.4 and 3.5 where
they differ; over mutual TLS with rotated certificates), and against small misbehaving
servers over loopback. How it encodes transactions and meets cancellation without a
socket is in the unit tier."""

import json
import os
import shutil
import tempfile

from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest
from txaioetcd import CompValue, CompVersion, KeySet, OpDel, OpGet, OpSet, Transaction

from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.etcd.errors import (
    BadResponse, ClientClosed, EtcdError, EtcdTimeout, EtcdUnavailable, NoLeader, RequestRejected, RequestTooLarge, TLSConfigError, TooManyOperations, TransactionFailed,
)
from yurtcoord.etcd.txaioetcd_private import KeyAbsent
from yurtcoord.sim.etcd import free_port, make_etcd_test_class, make_etcd_test_classes
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.etcdgateway import PUT_OK, ScriptedGatewayMixin, range_answer
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.sharedetcd import use_shared_etcd


class OnlineTestsMixin:
    """Shared setup: a real etcd (``self.etcd``, the run's shared one, emptied after
    each test) and a client on it (``self.client``). With ``tls`` the etcd requires
    certificates of its CA (``self.ca``); ``self.ca_dir`` is the test's own directory
    for other certificates."""

    tls = False

    def setUp(self):
        self.etcd = use_shared_etcd(self, self.etcd_binary, tls=self.tls)
        if self.tls:
            self.ca_dir = tempfile.mkdtemp(prefix="yurtcoord-ca-")
            self.addCleanup(shutil.rmtree, self.ca_dir, True)
            self.ca = self.etcd.tls_ca
        self.client = self.make_client()

    def make_client(self, **overrides):
        options = dict(url=self.etcd.client_url, timeout=5.0)
        if self.tls:
            options.update(ca_file=self.ca.ca_file, cert_file=self.etcd.client_cert.cert_file,
                           key_file=self.etcd.client_cert.key_file)
        options.update(overrides)
        client = EtcdClient(reactor, EtcdConfig(**options))
        self.addCleanup(client.close)
        return client


class EtcdClientTestsMixin(OnlineTestsMixin):

    @defer.inlineCallbacks
    def test_put_get_roundtrip_exact_bytes(self):
        value = bytes(range(256)) * 4
        revision = yield self.client.put(b"/c/binary", value)
        self.assertIsInstance(revision, int)
        self.assertEqual(self.etcd.read(b"/c/binary"), {b"/c/binary": value})
        kv = yield self.client.get(b"/c/binary")
        self.assertEqual((kv.key, kv.value, kv.version, kv.mod_revision),
                         (b"/c/binary", value, 1, revision))

    @defer.inlineCallbacks
    def test_get_missing_is_none(self):
        kv = yield self.client.get(b"/c/missing")
        self.assertIsNone(kv)

    @defer.inlineCallbacks
    def test_auto_gateway_prefix_finds_v3(self):
        client = self.make_client(gateway_prefix="auto")
        self.assertIsNone(client.gateway_prefix)
        results = yield defer.gatherResults([client.get(b"/c/x"), client.status(),
                                             client.put(b"/c/y", b"1")])
        self.assertEqual(client.gateway_prefix, "/v3")
        self.assertIsNone(results[0])
        self.assertEqual(self.etcd.read(b"/c/y"), {b"/c/y": b"1"})

    @defer.inlineCallbacks
    def test_range_prefix_is_exact(self):
        for key in (b"/r/pods/default/a", b"/r/pods/default/b", b"/r/pods/default-2/c",
                    b"/r/podsecuritypolicy/p", b"/r/podz"):
            self.etcd.put(key, key)
        kvs = yield self.client.range(b"/r/pods/")
        self.assertEqual([kv.key for kv in kvs],
                         [b"/r/pods/default-2/c", b"/r/pods/default/a", b"/r/pods/default/b"])
        kvs = yield self.client.range(b"/r/pods/default/")
        self.assertEqual([(kv.key, kv.value) for kv in kvs],
                         [(b"/r/pods/default/a", b"/r/pods/default/a"),
                          (b"/r/pods/default/b", b"/r/pods/default/b")])

    @defer.inlineCallbacks
    def test_range_limit_and_keys_only(self):
        for i in range(10):
            self.etcd.put(f"/l/{i}", f"value-{i}")
        page = yield self.client.range_page(b"/l/", limit=3)
        self.assertEqual([kv.key for kv in page.kvs], [b"/l/0", b"/l/1", b"/l/2"])
        self.assertEqual([kv.value for kv in page.kvs], [b"value-0", b"value-1", b"value-2"])
        self.assertTrue(page.more)
        self.assertEqual(page.count, 10)
        page = yield self.client.range_page(b"/l/", limit=10)
        self.assertFalse(page.more)
        self.assertEqual(len(page.kvs), 10)
        kvs = yield self.client.range(b"/l/", keys_only=True)
        self.assertEqual([kv.key for kv in kvs], [f"/l/{i}".encode() for i in range(10)])
        self.assertEqual({kv.value for kv in kvs}, {None})

    @defer.inlineCallbacks
    def test_range_at_older_revision(self):
        first = yield self.client.put(b"/v/k", b"old")
        yield self.client.put(b"/v/k", b"new")
        kvs = yield self.client.range(b"/v/", revision=first)
        self.assertEqual([kv.value for kv in kvs], [b"old"])
        kvs = yield self.client.range(b"/v/")
        self.assertEqual([kv.value for kv in kvs], [b"new"])

    @defer.inlineCallbacks
    def test_range_and_delete_prefix_ending_in_0xff(self):
        yield self.client.put(b"/ff/\xff", b"1")
        yield self.client.put(b"/ff/\xff\xff", b"2")
        yield self.client.put(b"/fg", b"3")
        kvs = yield self.client.range(b"/ff/\xff")
        self.assertEqual([kv.key for kv in kvs], [b"/ff/\xff", b"/ff/\xff\xff"])
        deleted = yield self.client.delete_prefix(b"/ff/\xff")
        self.assertEqual(deleted, 2)
        self.assertEqual(self.etcd.read(b"/f", prefix=True), {b"/fg": b"3"})

    @defer.inlineCallbacks
    def test_delete_and_delete_prefix(self):
        for key in (b"/d/a/1", b"/d/a/2", b"/d/ab", b"/d/b"):
            yield self.client.put(key, b"x")
        self.assertEqual((yield self.client.delete(b"/d/b")), 1)
        self.assertEqual((yield self.client.delete(b"/d/b")), 0)
        self.assertEqual((yield self.client.delete_prefix(b"/d/a/")), 2)
        self.assertEqual(self.etcd.read(b"/d/", prefix=True), {b"/d/ab": b"x"})
        self.assertEqual((yield self.client.delete_prefix(b"/d/none/")), 0)

    @defer.inlineCallbacks
    def test_transaction_compare_success(self):
        txn = Transaction(
            compare=[CompVersion(b"/t/a", "==", 0)],
            success=[OpSet(b"/t/a", b"1"), OpSet(b"/t/mirror", b"00001"), OpGet(b"/t/a")],
            failure=[OpGet(b"/t/a")],
        )
        result = yield self.client.submit(txn)
        self.assertTrue(result.succeeded)
        self.assertEqual(len(result.responses), 3)
        self.assertEqual([kv.value for kv in result.responses[2].kvs], [b"1"])
        self.assertEqual(self.etcd.read(b"/t/", prefix=True),
                         {b"/t/a": b"1", b"/t/mirror": b"00001"})
        kv = yield self.client.get(b"/t/a")
        self.assertEqual(kv.mod_revision, result.revision)

    @defer.inlineCallbacks
    def test_transaction_compare_failure_raises_with_failure_responses(self):
        self.etcd.put("/t/a", "stored")
        txn = Transaction(
            compare=[CompVersion(b"/t/a", "==", 0)],
            success=[OpSet(b"/t/a", b"new")],
            failure=[OpGet(b"/t/a")],
        )
        e = yield self.assertFailure(self.client.submit(txn), TransactionFailed)
        self.assertEqual([kv.value for kv in e.responses[0].kvs], [b"stored"])
        self.assertIsInstance(e.revision, int)
        result = yield self.client.submit(txn, raise_on_failure=False)
        self.assertFalse(result.succeeded)
        self.assertEqual([kv.value for kv in result.responses[0].kvs], [b"stored"])
        self.assertEqual(self.etcd.read(b"/t/a"), {b"/t/a": b"stored"})

    @defer.inlineCallbacks
    def test_key_absent_holds_only_while_the_key_does_not_exist(self):
        """The key-only compare is etcd's ``version == 0``: it holds for an absent key
        (and for one deleted again) and fails for a present one."""
        marshalled = KeyAbsent(b"/t/a")._marshal()
        self.assertEqual(marshalled, {"key": "L3QvYQ=="})
        create = Transaction(compare=[KeyAbsent(b"/t/a"), KeyAbsent(b"/t/b")],
                             success=[OpSet(b"/t/a", b"1"), OpSet(b"/t/b", b"2")])
        self.assertTrue((yield self.client.submit(create)).succeeded)
        self.assertEqual(self.etcd.read(b"/t/", prefix=True), {b"/t/a": b"1", b"/t/b": b"2"})
        # One present key of several fails the whole guard: nothing is written.
        again = Transaction(compare=[KeyAbsent(b"/t/c"), KeyAbsent(b"/t/b")],
                            success=[OpSet(b"/t/c", b"3"), OpSet(b"/t/b", b"changed")])
        result = yield self.client.submit(again, raise_on_failure=False)
        self.assertFalse(result.succeeded)
        self.assertEqual(self.etcd.read(b"/t/", prefix=True), {b"/t/a": b"1", b"/t/b": b"2"})
        yield self.client.delete(b"/t/b")
        self.assertTrue((yield self.client.submit(again)).succeeded)
        self.assertEqual(self.etcd.read(b"/t/", prefix=True),
                         {b"/t/a": b"1", b"/t/b": b"changed", b"/t/c": b"3"})

    @defer.inlineCallbacks
    def test_transaction_value_compare_and_delete(self):
        yield self.client.put(b"/t/x", b"v1")
        yield self.client.put(b"/t/y", b"keep")
        txn = Transaction(compare=[CompValue(b"/t/x", "==", b"v1")],
                          success=[OpDel(b"/t/x"), OpDel(KeySet(b"/t/z", prefix=True))])
        result = yield self.client.submit(txn)
        self.assertTrue(result.succeeded)
        self.assertEqual(result.responses[0].deleted, 1)
        self.assertEqual(self.etcd.read(b"/t/", prefix=True), {b"/t/y": b"keep"})

    @defer.inlineCallbacks
    def test_batch_of_100_puts_in_one_transaction(self):
        ops = [OpSet(f"/b/{i:03d}".encode(), f"v{i}".encode()) for i in range(100)]
        result = yield self.client.submit(Transaction(success=ops))
        self.assertTrue(result.succeeded)
        stored = self.etcd.read(b"/b/", prefix=True)
        self.assertEqual(stored, {f"/b/{i:03d}".encode(): f"v{i}".encode() for i in range(100)})

    @defer.inlineCallbacks
    def test_too_many_operations_is_typed(self):
        ops = [OpSet(f"/m/{i}".encode(), b"v") for i in range(129)]
        e = yield self.assertFailure(self.client.submit(Transaction(success=ops)),
                                     TooManyOperations)
        self.assertIsInstance(e, RequestRejected)
        self.assertEqual(self.etcd.read(b"/m/", prefix=True), {})

    @defer.inlineCallbacks
    def test_large_value_roundtrip_and_too_large_is_typed(self):
        big = os.urandom(1400 * 1024)
        yield self.client.put(b"/big/ok", big)
        self.assertEqual(self.etcd.read(b"/big/ok"), {b"/big/ok": big})
        kv = yield self.client.get(b"/big/ok")
        self.assertEqual(kv.value, big)
        yield self.assertFailure(self.client.put(b"/big/no", b"x" * (1700 * 1024)),
                                 RequestTooLarge)
        yield self.assertFailure(self.client.put(b"/big/no", b"x" * (3 * 1024 * 1024)),
                                 RequestTooLarge)
        self.assertEqual(self.etcd.read(b"/big/no"), {})

    @defer.inlineCallbacks
    def test_many_concurrent_requests_share_the_pool(self):
        client = self.make_client(max_connections=4)
        puts = [client.put(f"/p/{i:03d}".encode(), b"v") for i in range(200)]
        revisions = yield defer.gatherResults(puts, consumeErrors=True)
        self.assertEqual(len(set(revisions)), 200)
        self.assertEqual(len(self.etcd.read(b"/p/", prefix=True)), 200)

    @defer.inlineCallbacks
    def test_killed_etcd_is_unavailable_and_restart_needs_no_new_client(self):
        yield defer.gatherResults([self.client.put(f"/k/{i}".encode(), b"before")
                                   for i in range(8)])
        self.etcd.kill()
        yield self.assertFailure(self.client.get(b"/k/0"), EtcdUnavailable)
        yield self.assertFailure(self.client.put(b"/k/0", b"lost"), EtcdUnavailable)
        self.etcd.restart()
        failures = 0
        for i in range(8):
            try:
                yield self.client.put(f"/k/{i}".encode(), b"after")
            except EtcdUnavailable:
                failures += 1
        self.assertEqual(failures, 0)
        kv = yield self.client.get(b"/k/7")
        self.assertEqual(kv.value, b"after")
        self.assertEqual(self.etcd.read(b"/k/7"), {b"/k/7": b"after"})

    @defer.inlineCallbacks
    def test_hung_etcd_times_out_then_recovers(self):
        yield self.client.put(b"/h/1", b"1")
        self.etcd.freeze()
        self.addCleanup(self.etcd.thaw)
        started = reactor.seconds()
        yield self.assertFailure(self.client.get(b"/h/1", timeout=0.5), EtcdTimeout)
        yield self.assertFailure(self.client.put(b"/h/2", b"2", timeout=0.5), EtcdTimeout)
        self.assertLess(reactor.seconds() - started, 5.0)
        self.etcd.thaw()
        kv = yield self.client.get(b"/h/1")
        self.assertEqual(kv.value, b"1")

    @defer.inlineCallbacks
    def test_restart_with_idle_pooled_connections_costs_no_request(self):
        # Fill the pool with several idle keep-alive connections.
        yield defer.gatherResults([self.client.get(f"/i/{i}".encode()) for i in range(8)])
        # Kill and restart without letting the reactor notice the closed connections;
        # writes are never resent, so a stale pooled connection would fail them.
        self.etcd.kill()
        self.etcd.restart()
        yield defer.gatherResults([self.client.put(f"/i/{i}".encode(), b"ok")
                                   for i in range(8)])
        self.assertEqual(self.etcd.read(b"/i/", prefix=True),
                         {f"/i/{i}".encode(): b"ok" for i in range(8)})

    @defer.inlineCallbacks
    def test_closed_client_refuses(self):
        client = self.make_client()
        yield client.put(b"/closed", b"1")
        yield client.close()
        yield self.assertFailure(client.get(b"/closed"), ClientClosed)

    def test_arguments_must_be_bytes(self):
        self.assertRaises(TypeError, self.client.put, "/str", b"v")
        self.assertRaises(TypeError, self.client.put, b"/k", "v")
        self.assertRaises(TypeError, self.client.get, "/str")
        self.assertRaises(TypeError, self.client.delete_prefix, "/str")


class EtcdClientVersionTestsMixin(OnlineTestsMixin):
    """What the client sees differently on each etcd version."""

    @defer.inlineCallbacks
    def test_status_reports_server_version(self):
        """Differs by version: status answers with the version of the etcd running."""
        status = yield self.client.status()
        self.assertEqual(status.version, self.etcd_binary.version)
        self.assertGreater(status.leader, 0)

    @defer.inlineCallbacks
    def test_kill_with_requests_in_flight_gives_only_typed_outcomes(self):
        """Differs by version: etcd 3.5.0 to 3.5.2 may restart without transactions it
        acknowledged before SIGKILL (etcd-io/etcd#13766); every other release keeps
        them. Each transaction is all or nothing on every version."""
        txns = [self.client.submit(Transaction(success=[
            OpSet(f"/f/{i:02d}/{j:02d}".encode(), b"v" * 512) for j in range(50)]))
            for i in range(20)]

        late = []

        def kill_now(result):
            self.etcd.kill()
            # Sent after the kill: these cannot succeed, whatever the others managed
            # to finish before it landed.
            late.extend(self.client.submit(Transaction(success=[
                OpSet(f"/f/{i:02d}/{j:02d}".encode(), b"v" * 512) for j in range(50)]))
                for i in range(20, 22))
            return result

        txns[1].addBoth(kill_now)  # the others are in flight or queued at that moment
        outcomes = yield defer.DeferredList(txns, consumeErrors=True)
        late_outcomes = yield defer.DeferredList(late, consumeErrors=True)
        succeeded = {i for i, (ok, _) in enumerate(outcomes) if ok}
        for ok, result in outcomes + late_outcomes:
            if not ok:
                self.assertIsInstance(result.value, EtcdUnavailable)
        self.assertIn(1, succeeded)
        self.assertEqual([ok for ok, _ in late_outcomes], [False, False])

        self.etcd.restart()
        stored = self.etcd.read(b"/f/", prefix=True)
        by_txn = {}
        for key in stored:
            by_txn.setdefault(int(key.split(b"/")[2]), []).append(key)
        if not self.etcd.binary.loses_acknowledged_writes_on_kill:
            # etcd 3.5.0-3.5.2 may restart without acknowledged transactions
            # (etcd-io/etcd#13766); every other release keeps them.
            self.assertLessEqual(succeeded, set(by_txn))
        for keys in by_txn.values():  # each transaction is all or nothing
            self.assertEqual(len(keys), 50)
        result = yield self.client.submit(Transaction(success=[OpSet(b"/f/after", b"1")]))
        self.assertTrue(result.succeeded)


class EtcdClientTLSTestsMixin(OnlineTestsMixin):

    tls = True

    @defer.inlineCallbacks
    def test_client_certificate_works(self):
        yield self.client.put(b"/tls/a", b"1")
        kv = yield self.client.get(b"/tls/a")
        self.assertEqual(kv.value, b"1")
        self.assertEqual(self.etcd.read(b"/tls/a"), {b"/tls/a": b"1"})

    @defer.inlineCallbacks
    def test_without_client_certificate_is_unavailable(self):
        client = self.make_client(cert_file=None, key_file=None)
        yield self.assertFailure(client.put(b"/tls/b", b"1"), EtcdUnavailable)
        self.assertEqual(self.etcd.read(b"/tls/b"), {})

    @defer.inlineCallbacks
    def test_untrusted_server_is_unavailable(self):
        other = TestCA(os.path.join(self.ca_dir, "other"))
        client = self.make_client(ca_file=other.ca_file)
        yield self.assertFailure(client.get(b"/tls/c"), EtcdUnavailable)

    @defer.inlineCallbacks
    def test_rotated_certificate_files_are_used_by_new_connections(self):
        cert_dir = os.path.join(self.ca_dir, "client")
        os.makedirs(cert_dir)
        cert_file, key_file = os.path.join(cert_dir, "c.crt"), os.path.join(cert_dir, "c.key")
        _install_pair(self.etcd.client_cert, cert_file, key_file)
        client = self.make_client(cert_file=cert_file, key_file=key_file)
        yield client.put(b"/rot/1", b"first")

        # A certificate from a CA etcd does not trust: new connections must fail.
        stranger = TestCA(os.path.join(self.ca_dir, "stranger")).client_pair("x", "stranger")
        _install_pair(stranger, cert_file, key_file)
        yield self.assertFailure(client.put(b"/rot/2", b"rejected"), EtcdUnavailable)

        # A fresh certificate from the right CA: works again, same client.
        fresh = self.ca.client_pair("fresh", "etcd-test-client-2")
        _install_pair(fresh, cert_file, key_file)
        yield client.put(b"/rot/3", b"third")
        self.assertEqual(self.etcd.read(b"/rot/", prefix=True),
                         {b"/rot/1": b"first", b"/rot/3": b"third"})

    @defer.inlineCallbacks
    def test_rotation_retires_connections_busy_at_that_moment(self):
        cert_dir = os.path.join(self.ca_dir, "client")
        os.makedirs(cert_dir)
        cert_file, key_file = os.path.join(cert_dir, "c.crt"), os.path.join(cert_dir, "c.key")
        _install_pair(self.etcd.client_cert, cert_file, key_file)
        client = self.make_client(cert_file=cert_file, key_file=key_file)
        yield client.put(b"/busy/warmup", b"1")

        busy = [client.put(f"/busy/{i}".encode(), b"old-cert") for i in range(4)]
        stranger = TestCA(os.path.join(self.ca_dir, "stranger")).client_pair("x", "stranger")
        _install_pair(stranger, cert_file, key_file)
        # This request notices the rotation while the four above are still in flight.
        after = client.put(b"/busy/after", b"rejected")
        yield defer.gatherResults(busy)
        yield self.assertFailure(after, EtcdUnavailable)
        # None of the four connections may be reused: the stranger cert is refused.
        for _ in range(3):
            yield self.assertFailure(client.put(b"/busy/later", b"rejected"), EtcdUnavailable)
        self.assertEqual(set(self.etcd.read(b"/busy/", prefix=True)),
                         {b"/busy/warmup"} | {f"/busy/{i}".encode() for i in range(4)})

    @defer.inlineCallbacks
    def test_rotation_replaces_the_pool_and_the_old_one_keeps_no_connection(self):
        cert_dir = os.path.join(self.ca_dir, "client")
        os.makedirs(cert_dir)
        cert_file, key_file = os.path.join(cert_dir, "c.crt"), os.path.join(cert_dir, "c.key")
        _install_pair(self.etcd.client_cert, cert_file, key_file)
        client = self.make_client(cert_file=cert_file, key_file=key_file)
        yield client.put(b"/pool/warmup", b"1")
        old_pool = client._transport.pool
        busy = [client.put(f"/pool/{i}".encode(), b"old-cert") for i in range(3)]
        _install_pair(self.ca.client_pair("fresh", "etcd-test-client-2"), cert_file, key_file)
        yield client.put(b"/pool/after", b"new-cert")
        self.assertIsNot(client._transport.pool, old_pool)
        yield defer.gatherResults(busy)
        # Busy connections that came back to the old pool are closed on the next turn.
        yield poll_until(lambda: not any(old_pool._connections.values()), 5.0,
                         what="the old pool's connections closed")
        self.assertEqual(old_pool.cachedConnectionTimeout, 0)
        self.assertEqual(len(self.etcd.read(b"/pool/", prefix=True)), 5)

    @defer.inlineCallbacks
    def test_half_written_certificate_keeps_previous_one(self):
        cert_dir = os.path.join(self.ca_dir, "client")
        os.makedirs(cert_dir)
        cert_file, key_file = os.path.join(cert_dir, "c.crt"), os.path.join(cert_dir, "c.key")
        _install_pair(self.etcd.client_cert, cert_file, key_file)
        client = self.make_client(cert_file=cert_file, key_file=key_file)
        yield client.put(b"/half/1", b"1")
        with open(cert_file, "rb") as f:
            pem = f.read()
        with open(cert_file, "wb") as f:
            f.write(pem[:len(pem) // 2])
        yield client.put(b"/half/2", b"2")
        self.assertEqual(self.etcd.read(b"/half/", prefix=True),
                         {b"/half/1": b"1", b"/half/2": b"2"})

    @defer.inlineCallbacks
    def test_missing_certificate_file_is_typed(self):
        client = self.make_client(cert_file=os.path.join(self.ca_dir, "absent.crt"),
                                  key_file=os.path.join(self.ca_dir, "absent.key"))
        e = yield self.assertFailure(client.get(b"/x"), TLSConfigError)
        self.assertIsInstance(e, EtcdUnavailable)


def _install_pair(pair, cert_file, key_file):
    """Replace cert and key the way a rotation does: write aside, then rename over."""
    for source, target in ((pair.cert_file, cert_file), (pair.key_file, key_file)):
        with open(source, "rb") as f:
            data = f.read()
        with open(target + ".tmp", "wb") as f:
            f.write(data)
        os.replace(target + ".tmp", target)


make_etcd_test_class(EtcdClientTestsMixin, globals())

make_etcd_test_classes(EtcdClientVersionTestsMixin, globals())

make_etcd_test_class(EtcdClientTLSTestsMixin, globals())


class _Silent(protocol.Protocol):
    """Accepts the connection, reads the request, never answers."""


class _NotHTTP(protocol.Protocol):
    def dataReceived(self, data):
        self.transport.write(b"hello, this is not HTTP\r\n\r\n")
        self.transport.loseConnection()


class MisbehavingServerTests(ScriptedGatewayMixin, unittest.TestCase):

    @defer.inlineCallbacks
    def test_silent_server_times_out_within_the_timeout(self):
        url, _ = self.listen(protocol.Factory.forProtocol(_Silent))
        client = self.client(url, timeout=0.3)
        started = reactor.seconds()
        yield self.assertFailure(client.get(b"/k"), EtcdTimeout)
        elapsed = reactor.seconds() - started
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, 3.0)
        # A per-request timeout overrides the configured one.
        started = reactor.seconds()
        yield self.assertFailure(client.put(b"/k", b"v", timeout=0.1), EtcdTimeout)
        self.assertLess(reactor.seconds() - started, 0.3 + 2.0)

    @defer.inlineCallbacks
    def test_connection_refused_is_unavailable(self):
        client = self.client(f"http://127.0.0.1:{free_port()}")
        yield self.assertFailure(client.put(b"/k", b"v"), EtcdUnavailable)
        yield self.assertFailure(client.status(), EtcdUnavailable)

    @defer.inlineCallbacks
    def test_not_json_is_bad_response(self):
        url, gw, _ = self.gateway({"/v3/kv/range": [(200, b"<html>surprise</html>")],
                                   "/v3/kv/put": [(200, b"[1, 2]")],
                                   "/v3/kv/txn": [(200, json.dumps(
                                       {"responses": [{"a": {}, "b": {}}]}).encode())],
                                   "/v3/maintenance/status": [(200, b"{\"dbSize\": \"x\"}")]})
        client = self.client(url)
        e = yield self.assertFailure(client.get(b"/k"), BadResponse)
        self.assertEqual(e.status, 200)
        self.assertIn(b"surprise", e.body)
        yield self.assertFailure(client.put(b"/k", b"v"), BadResponse)
        yield self.assertFailure(client.submit(Transaction(success=[OpSet(b"/k", b"v")])),
                                 BadResponse)
        yield self.assertFailure(client.status(), BadResponse)

    @defer.inlineCallbacks
    def test_not_http_is_bad_response(self):
        url, _ = self.listen(protocol.Factory.forProtocol(_NotHTTP))
        client = self.client(url)
        yield self.assertFailure(client.put(b"/k", b"v"), BadResponse)

    @defer.inlineCallbacks
    def test_error_answers_are_typed(self):
        unavailable = json.dumps({"error": "etcdserver: no leader", "code": 14,
                                  "message": "etcdserver: no leader"}).encode()
        invalid = json.dumps({"error": "etcdserver: duplicate key given in txn request",
                              "code": 3}).encode()
        url, gw, _ = self.gateway({"/v3/kv/put": [(503, unavailable), (400, invalid),
                                                  (500, b"oops"), (502, b"bad gateway"),
                                                  (504, b"slow")]})
        client = self.client(url)
        yield self.assertFailure(client.put(b"/k", b"v"), EtcdUnavailable)
        e = yield self.assertFailure(client.put(b"/k", b"v"), RequestRejected)
        self.assertEqual((e.code, e.status), (3, 400))
        self.assertIn("duplicate key", str(e))
        e = yield self.assertFailure(client.put(b"/k", b"v"), BadResponse)
        self.assertEqual(e.status, 500)
        yield self.assertFailure(client.put(b"/k", b"v"), EtcdUnavailable)
        yield self.assertFailure(client.put(b"/k", b"v"), EtcdTimeout)

    @defer.inlineCallbacks
    def test_every_request_requires_a_leader(self):
        """Each request carries the gateway header that becomes etcd's ``hasleader``
        metadata, so a member without a leader refuses it at once."""
        txn_ok = json.dumps({"header": {"revision": "9"}, "succeeded": True,
                             "responses": [{"response_put": {"header": {}}}]}).encode()
        status = json.dumps({"header": {"revision": "3"}, "version": "3.5.1",
                             "dbSize": "20480", "leader": "1"}).encode()
        watch_created = json.dumps({"result": {"header": {"revision": "3"},
                                               "created": True}}).encode() + b"\n"
        url, gw, _ = self.gateway({
            "/v3/kv/put": [(200, PUT_OK)],
            "/v3/kv/range": [(200, range_answer((b"/k", b"v")))],
            "/v3/kv/deleterange": [(200, json.dumps({"deleted": "1"}).encode())],
            "/v3/kv/txn": [(200, txn_ok)],
            "/v3/kv/compaction": [(200, b"{}")],
            "/v3/maintenance/status": [(200, status)],
            "/v3/watch": [(200, watch_created)],
        })
        client = self.client(url)
        yield client.put(b"/k", b"v")
        yield client.get(b"/k")
        yield client.delete(b"/k")
        yield client.submit(Transaction(success=[OpSet(b"/k", b"w")]))
        yield client.compact(3)
        yield client.status()
        watch = yield client.watch(b"/k", lambda response: None)
        yield watch.finished  # the scripted stream ends after one answer
        yield client.close()
        self.assertEqual([path for path, _body in gw.seen],
                         ["/v3/kv/put", "/v3/kv/range", "/v3/kv/deleterange", "/v3/kv/txn",
                          "/v3/kv/compaction", "/v3/maintenance/status", "/v3/watch"])
        self.assertEqual([headers.get(b"grpc-metadata-hasleader") for headers in gw.headers],
                         [[b"true"]] * 7)

    @defer.inlineCallbacks
    def test_no_leader_is_a_refusal_before_the_request_was_proposed(self):
        no_leader = json.dumps({"error": "etcdserver: no leader", "code": 14,
                                "message": "etcdserver: no leader"}).encode()
        url, gw, _ = self.gateway({"/v3/kv/txn": [(503, no_leader)]})
        client = self.client(url)
        error = yield self.assertFailure(
            client.submit(Transaction(success=[OpSet(b"/k", b"v")])), NoLeader)
        self.assertIsInstance(error, EtcdUnavailable)
        self.assertFalse(error.maybe_applied)
        # One member: nowhere else to go, the caller retries later.
        self.assertEqual([path for path, _body in gw.seen], ["/v3/kv/txn"])

    @defer.inlineCallbacks
    def test_reads_are_resent_once_after_a_dropped_connection_writes_are_not(self):
        url, gw, tracking = self.gateway({
            "/v3/kv/range": ["abort", (200, range_answer((b"/k", b"v")))],
            "/v3/kv/put": ["abort", (200, PUT_OK)],
        })
        client = self.client(url)
        kv = yield client.get(b"/k")
        self.assertEqual(kv.value, b"v")
        self.assertEqual([p for p, _ in gw.seen], ["/v3/kv/range", "/v3/kv/range"])
        # A write may have been applied before the drop: reported, not resent.
        yield self.assertFailure(client.put(b"/k", b"v2"), EtcdUnavailable)
        self.assertEqual([p for p, _ in gw.seen][2:], ["/v3/kv/put"])
        revision = yield client.put(b"/k", b"v2")
        self.assertEqual(revision, 8)

    @defer.inlineCallbacks
    def test_auto_prefix_falls_back_to_v3beta(self):
        url, gw, _ = self.gateway({
            "/v3beta/maintenance/status": [(200, b"{\"version\": \"3.3.0\"}")],
            "/v3beta/kv/put": [(200, PUT_OK)],
            "/v3beta/kv/range": [(200, range_answer((b"/a", b"1"), (b"/b", b"2")))],
        })
        client = self.client(url, gateway_prefix="auto")
        revisions = yield defer.gatherResults([client.put(b"/a", b"1"), client.put(b"/b", b"2")])
        self.assertEqual(revisions, [8, 8])
        kvs = yield client.range(b"/")
        self.assertEqual([(kv.key, kv.value) for kv in kvs], [(b"/a", b"1"), (b"/b", b"2")])
        self.assertEqual(client.gateway_prefix, "/v3beta")
        paths = [p for p, _ in gw.seen]
        self.assertEqual(paths.count("/v3/maintenance/status"), 1)
        self.assertEqual(paths.count("/v3beta/maintenance/status"), 1)
        put_body = json.loads(dict(gw.seen)["/v3beta/kv/put"])
        self.assertEqual(put_body, {"key": "L2I=", "value": "Mg=="})

    @defer.inlineCallbacks
    def test_auto_prefix_without_gateway_is_bad_response(self):
        url, gw, _ = self.gateway({})
        client = self.client(url, gateway_prefix="auto")
        yield self.assertFailure(client.get(b"/k"), BadResponse)
        self.assertIsNone(client.gateway_prefix)

    @defer.inlineCallbacks
    def test_range_request_carries_limit_keys_only_revision(self):
        url, gw, _ = self.gateway({"/v3/kv/range": [(200, range_answer())]})
        client = self.client(url)
        page = yield client.range_page(b"/p/", limit=5, keys_only=True, revision=42)
        self.assertEqual((page.kvs, page.more, page.count, page.revision), ([], False, 0, 7))
        body = json.loads(gw.seen[0][1])
        self.assertEqual(body, {"key": "L3Av", "range_end": "L3Aw", "limit": 5,
                                "keys_only": True, "revision": 42})

    @defer.inlineCallbacks
    def test_a_transaction_goes_out_as_its_json_and_its_answer_is_read(self):
        """The body of ``/kv/txn`` is the transaction's JSON (puts, compares, reads and
        deletes alike), and the answer's responses reach the caller parsed, for a
        guard that held and one that failed."""
        held = json.dumps({"header": {"revision": "12"}, "succeeded": True, "responses": [
            {"response_put": {"header": {"revision": "12"}}},
            {"response_delete_range": {"header": {}, "deleted": "1"}}]}).encode()
        failed = json.dumps({"header": {"revision": "13"}, "responses": [
            {"response_range": {"header": {}, "kvs": [
                {"key": "L2s=", "value": "c3RvcmVk", "version": "1"}], "count": "1"}}]}).encode()
        url, gw, _ = self.gateway({"/v3/kv/txn": [(200, held), (200, failed)]})
        client = self.client(url)
        txn = Transaction(compare=[KeyAbsent(b"/k"), CompValue(b"/m", "<", b"\x00\xff")],
                          success=[OpSet(b"/k", b"\x00value\xff"), OpDel(b"/d")],
                          failure=[OpGet(b"/k")])
        result = yield client.submit(txn)
        self.assertEqual((result.succeeded, result.revision), (True, 12))
        self.assertEqual(result.responses[1].deleted, 1)
        self.assertEqual(json.loads(gw.seen[0][1]), txn._marshal())
        self.assertEqual(json.loads(gw.seen[0][1])["success"][0],
                         {"request_put": {"key": "L2s=", "value": "AHZhbHVl/w=="}})
        e = yield self.assertFailure(client.submit(txn), TransactionFailed)
        self.assertEqual(e.revision, 13)
        self.assertEqual([kv.value for kv in e.responses[0].kvs], [b"stored"])

    @defer.inlineCallbacks
    def test_close_ends_requests_in_flight(self):
        url, tracking = self.listen(protocol.Factory.forProtocol(_Silent))
        client = self.client(url, timeout=30.0)
        pending = client.get(b"/k")
        yield poll_until(lambda: tracking.connections_made == 1)
        yield client.close()
        yield self.assertFailure(pending, ClientClosed)

    def test_txaioetcd_watch_is_refused(self):
        client = self.client("http://127.0.0.1:1")
        d = client.txaioetcd.watch([b"/k"], lambda kv: None)
        self.failureResultOf(d, EtcdError)

    def test_config_validation(self):
        self.assertRaises(ValueError, EtcdConfig, "127.0.0.1:2379")
        self.assertRaises(ValueError, EtcdConfig, "https://e:2379", cert_file="c")
        self.assertRaises(ValueError, EtcdConfig, "http://e:2379", gateway_prefix="/v4")
        self.assertRaises(ValueError, EtcdConfig, "http://e:2379", timeout=0)
