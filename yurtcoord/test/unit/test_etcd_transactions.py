"""The public builders of etcd transactions (``yurtcoord.etcd.transactions``): each
compare and operation is the etcd request it names, as the client encodes it for the
gateway, and the answer of a transaction of reads is accepted only with exactly its
range results. The pool store builds every transaction with them, so the store never
reaches txaioetcd's private layer."""

import ast
import json
import os

from twisted.trial import unittest

from yurtcoord.etcd import transactions as etcdtx
from yurtcoord.etcd.errors import BadResponse
from yurtcoord.etcd.txaioetcd_private import encode_transaction, txaioetcd
from yurtcoord.testing.paths import REPO


def encoded(txn):
    return json.loads(encode_transaction(txn))


class BuilderTests(unittest.TestCase):
    def test_a_guarded_create(self):
        txn = etcdtx.transaction(compare=[etcdtx.key_absent(b"/k")],
                                 success=[etcdtx.put(b"/k", b"v"), etcdtx.put(b"/m", b"1")])
        self.assertIsInstance(txn, etcdtx.Transaction)
        self.assertEqual(encoded(txn), {
            "compare": [{"key": "L2s="}],
            "success": [{"request_put": {"key": "L2s=", "value": "dg=="}},
                        {"request_put": {"key": "L20=", "value": "MQ=="}}]})
        self.assertEqual(encoded(txn), txn._marshal())

    def test_a_guarded_update_with_reads_on_failure(self):
        txn = etcdtx.transaction(
            compare=[etcdtx.key_present(b"/k"), etcdtx.value_below(b"/m", b"0002")],
            success=[etcdtx.put(b"/k", b"v")],
            failure=[etcdtx.get(b"/k"), etcdtx.get(b"/m", keys_only=True)])
        body = encoded(txn)
        self.assertEqual(body["compare"], [
            {"key": "L2s=", "result": "GREATER", "target": "VERSION", "version": 0},
            {"key": "L20=", "result": "LESS", "target": "VALUE", "value": "MDAwMg=="}])
        self.assertEqual([op["request_range"]["key"] for op in body["failure"]],
                         ["L2s=", "L20="])
        self.assertTrue(body["failure"][1]["request_range"]["keys_only"])
        self.assertNotIn("keys_only", body["failure"][0]["request_range"])

    def test_deletes_without_compares(self):
        txn = etcdtx.transaction(success=[etcdtx.delete(b"/k"), etcdtx.delete(b"/m")])
        self.assertEqual(encoded(txn), {"success": [
            {"request_delete_range": {"key": "L2s="}},
            {"request_delete_range": {"key": "L20="}}]})

    def test_a_key_range(self):
        keys = etcdtx.key_range(b"/p/", b"/p0")
        self.assertIsInstance(keys, etcdtx.KeyRange)
        self.assertEqual((keys.key, keys.range_end), (b"/p/", b"/p0"))


class RangeResultsTests(unittest.TestCase):
    def test_the_kvs_of_each_read_in_order(self):
        first, second = txaioetcd.Range([1], None, 1), txaioetcd.Range([], None, 0)
        self.assertEqual(etcdtx.range_results([first, second], 2), [[1], []])

    def test_another_count_or_kind_of_answer_is_a_bad_response(self):
        read = txaioetcd.Range([], None, 0)
        with self.assertRaises(BadResponse) as caught:
            etcdtx.range_results([read], 2)
        self.assertIn("2 reads of a transaction with 1 results", str(caught.exception))
        with self.assertRaises(BadResponse) as caught:
            etcdtx.range_results([read, object()], 2)
        self.assertIn("['Range', 'object']", str(caught.exception))


class OnlyEtcdTouchesThePrivateLayerTests(unittest.TestCase):
    def test_the_pool_package_imports_no_txaioetcd(self):
        """The pool's modules build transactions with ``yurtcoord.etcd.transactions``;
        none imports txaioetcd or the layer that holds its private names."""
        pool = os.path.join(REPO, "yurtcoord", "pool")
        offending = []
        for name in sorted(os.listdir(pool)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(pool, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [f"{node.module}.{a.name}" for a in node.names]
                           if isinstance(node, ast.ImportFrom) else [])
                offending += [f"{name}: {m}" for m in modules
                              if m.split(".")[0] == "txaioetcd"
                              or m.startswith("yurtcoord.etcd.txaioetcd_private")]
        self.assertEqual(offending, [])
