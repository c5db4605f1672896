"""The txaioetcd adapter without an etcd: transactions encoded as txaioetcd's own
``_marshal()`` describes them, the end of a prefix range, the errors' common base, and
requests on a memory reactor, where a timeout while connecting is an ``EtcdTimeout`` and
a request its caller cancelled keeps its member. The adapter against a real etcd and
misbehaving servers is in the integration tier."""

import json

from twisted.internet import reactor
from twisted.trial import unittest
from txaioetcd import (
    CompCreated, CompModified, CompValue, CompVersion, KeySet, OpDel, OpGet, OpSet, Transaction,
)

from yurtcoord.etcd.client import EtcdClient, EtcdConfig, prefix_range_end
from yurtcoord.etcd.errors import (
    BadResponse, ClientClosed, EtcdError, EtcdTimeout, EtcdUnavailable, RequestCancelled, RequestRejected, TransactionFailed,
)
from yurtcoord.etcd.txaioetcd_private import KeyAbsent, encode_transaction, txaioetcd


class TransactionEncodingTests(unittest.TestCase):
    """``encode_transaction`` writes the JSON that txaioetcd's ``_marshal()`` describes."""

    def assertEncodesAsMarshalled(self, txn):
        body = encode_transaction(txn)
        self.assertIsInstance(body, bytes)
        self.assertEqual(json.loads(body), txn._marshal())

    def test_puts_and_key_only_compares(self):
        values = [b"", b"v", b"\x00\xff\n\"\\", bytes(range(256)) * 20, "ü".encode("utf-8")]
        txn = Transaction(compare=[KeyAbsent(b"/k/%d" % i) for i in range(len(values))],
                          success=[OpSet(b"/k/%d" % i, value) for i, value in enumerate(values)])
        self.assertEncodesAsMarshalled(txn)
        self.assertEqual(json.loads(encode_transaction(txn))["compare"][0], {"key": "L2svMA=="})

    def test_every_other_compare_and_operation_as_its_own_marshal_says(self):
        lease = txaioetcd.Lease(client=None, header=None, time_to_live=60, lease_id=99)
        txn = Transaction(
            compare=[CompValue(b"/m", "<", b"0001"), CompVersion(b"/a", ">", 0),
                     CompCreated(b"/a", "==", 3), CompModified(b"/a", "!=", 4)],
            success=[OpSet(b"/a", b"v", lease=lease), OpSet(b"/b", b"v", return_previous=True),
                     OpGet(b"/a", keys_only=True, limit=3), OpGet(KeySet(b"/p", prefix=True)),
                     OpDel(b"/d"), OpDel(KeySet(b"/q", prefix=True), return_previous=True)],
            failure=[OpGet(b"/a")])
        self.assertEncodesAsMarshalled(txn)
        put = json.loads(encode_transaction(txn))["success"][0]["request_put"]
        self.assertEqual(put["lease"], 99)

    def test_empty_branches_are_left_out(self):
        self.assertEqual(encode_transaction(Transaction()), b"{}")
        self.assertEncodesAsMarshalled(Transaction(compare=[], success=[],
                                                   failure=[OpDel(b"/d")]))

    def test_a_part_that_cannot_be_encoded_fails_the_submit(self):
        client = EtcdClient(reactor, EtcdConfig("http://127.0.0.1:1"))
        self.addCleanup(client.close)
        txn = Transaction(success=[OpSet(b"/k", b"v")])
        txn.success.append(object())
        self.failureResultOf(client.txaioetcd.submit(txn), AttributeError)


class PrefixRangeEndTests(unittest.TestCase):

    def test_increments_last_byte(self):
        self.assertEqual(prefix_range_end(b"/a/"), b"/a0")

    def test_drops_trailing_0xff(self):
        self.assertEqual(prefix_range_end(b"/a\xff\xff"), b"/b")

    def test_all_0xff_means_to_the_end(self):
        self.assertEqual(prefix_range_end(b"\xff"), b"\x00")
        self.assertEqual(prefix_range_end(b""), b"\x00")

    def test_errors_share_a_base(self):
        for cls in (EtcdUnavailable, EtcdTimeout, TransactionFailed, BadResponse,
                    RequestRejected, ClientClosed):
            self.assertTrue(issubclass(cls, EtcdError))


class ConnectingCancelledTests(unittest.TestCase):
    """A request whose connection never completes (a cut link drops the SYN) ends in
    the client's timeout: an ``EtcdTimeout``, not an unexpected error."""

    def test_a_timeout_while_connecting_is_an_etcd_timeout(self):
        from twisted.internet.testing import MemoryReactorClock
        clock = MemoryReactorClock()
        client = EtcdClient(clock, EtcdConfig("http://127.0.0.1:2379", timeout=2.0,
                                              gateway_prefix="/v3"))
        d = client.put(b"/registry/a", b"1")
        self.assertEqual(len(clock.tcpClients), 1)
        clock.advance(2.0)
        self.failureResultOf(d, EtcdTimeout)


class CallerCancellationTests(unittest.TestCase):
    """A caller that cancels its request (pool sync stopping on a role change) learns
    that the write is in doubt, but the member is not blamed: it stays the one
    requests go to. Only the client's own timeout skips a member."""

    def client(self):
        from twisted.internet.testing import MemoryReactorClock
        clock = MemoryReactorClock()
        client = EtcdClient(clock, EtcdConfig(
            "http://127.0.0.1:2379", more_urls=("http://127.0.0.1:2380",), timeout=2.0,
            gateway_prefix="/v3"))
        # Its connection pool never closes on a memory reactor: not waited for.
        self.addCleanup(lambda: client.close() and None)
        return clock, client

    def test_a_cancelled_write_is_in_doubt_and_keeps_its_member(self):
        clock, client = self.client()
        d = client.put(b"/registry/a", b"1")
        self.assertEqual(len(clock.tcpClients), 1)
        d.cancel()
        error = self.failureResultOf(d, RequestCancelled).value
        self.assertTrue(error.maybe_applied)
        self.assertEqual(client.member, "http://127.0.0.1:2379")
        clock.advance(2.0)
        self.assertEqual(client.member, "http://127.0.0.1:2379")

    def test_a_timed_out_write_moves_to_the_next_member(self):
        clock, client = self.client()
        d = client.put(b"/registry/a", b"1")
        clock.advance(2.0)
        self.assertTrue(self.failureResultOf(d, EtcdTimeout).value.maybe_applied)
        self.assertEqual(client.member, "http://127.0.0.1:2380")
