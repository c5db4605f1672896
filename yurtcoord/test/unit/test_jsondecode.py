"""The agent's one JSON decoder (``yurtcoord.tx.jsondecode``): what it takes, what it
refuses that Python's own decoder takes, and the typed errors its users rely on."""

import json

from twisted.trial import unittest

from yurtcoord.kube.errors import ServerError, decode_json as decode_api_json
from yurtcoord.kube.client import _decode_json as decode_answer
from yurtcoord.tx.jsondecode import NotJSON, decode_json


class DecodeJSONTests(unittest.TestCase):

    def test_one_json_value_with_whitespace_around_it(self):
        for data in (b'{"a":[1,2.5,"x",null,true]}', b' \r\n{"a":[1,2.5,"x",null,true]}\n '):
            self.assertEqual(decode_json(data), {"a": [1, 2.5, "x", None, True]})
        self.assertEqual(decode_json('{"n":"ünï"}'.encode("utf-8")), {"n": "ünï"})
        self.assertEqual(decode_json(b'{"big":123456789012345678901234567890}'),
                         {"big": 123456789012345678901234567890})

    def test_what_the_stdlib_takes_and_no_kubernetes_server_sends_is_not_json(self):
        refused = {
            "NaN": b'{"a":NaN}', "Infinity": b'{"a":-Infinity}', "beyond a double": b"[1e400]",
            "lone surrogate": b'["\\ud800"]', "byte order mark": b'\xef\xbb\xbf{"a":1}',
            "UTF-16": '{"a":1}'.encode("utf-16"), "not UTF-8": b'["\xff"]',
        }
        for name, data in refused.items():
            with self.subTest(name):
                # (Python's decoder, on the text or the bytes, takes every one but one.)
                self.assertRaises(NotJSON, decode_json, data)
                self.assertRaises(ValueError, decode_json, data)
        taken = [name for name, data in refused.items() if _stdlib_takes(data)]
        self.assertEqual(len(taken), 6, taken)

    def test_anything_else_is_not_json_and_deep_nesting_a_recursion_error(self):
        for data in (b"", b" ", b'{"a":1} x', b'{"a":1}{"b":2}', b"<html>", b'{"a":'):
            self.assertRaises(NotJSON, decode_json, data)
        self.assertRaises(RecursionError, decode_json, b"[" * 100_000 + b"]" * 100_000)

    def test_short_keys_are_one_string_for_every_object(self):
        first = decode_json(b'{"metadata":{"name":"a","resourceVersion":"1"}}')
        second = decode_json(b'{"metadata":{"name":"b","resourceVersion":"2"}}')
        for one, other in zip(first["metadata"], second["metadata"]):
            self.assertIs(one, other)

    def test_api_answers_that_are_not_json_are_typed_errors(self):
        for data in (b'{"a":NaN}', b"[" * 100_000, b'{"a":1} x'):
            self.assertRaises(ValueError, decode_api_json, data)
            error = self.assertRaises(ServerError, decode_answer, data, "https://api/x")
            self.assertIn("not JSON from https://api/x", str(error))


def _stdlib_takes(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True
