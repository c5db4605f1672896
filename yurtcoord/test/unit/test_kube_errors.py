"""Any answer a peer sends becomes one of the client's typed errors: Status objects with
fields of the wrong type, JSON that is not a Status, nesting too deep for the parser,
bytes that are not UTF-8, an empty body. Checked on the parsing function, case by case
and by property; the same answers through ``KubeClient`` over a loopback socket are
in the integration tier."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from yurtcoord.kube import errors
from yurtcoord.testing.hostilestatuses import HOSTILE, status

URL = "http://127.0.0.1:1/api/v1/namespaces/x/configmaps/a"


class ErrorForResponseTests(unittest.TestCase):
    def test_hostile_bodies_become_the_error_of_the_http_code(self):
        for name, (code, body, expected) in HOSTILE.items():
            with self.subTest(name=name):
                error = errors.error_for_response(code, body, URL)
                self.assertIs(type(error), expected)
                self.assertEqual(error.code, code)
                self.assertIsInstance(error.reason, str)
                self.assertIsInstance(str(error), str)
                self.assertLess(len(str(error)), 2000)

    def test_a_well_formed_status_still_chooses_by_reason_within_its_code(self):
        error = errors.error_for_response(
            409, status(code=409, reason="AlreadyExists", message='configmaps "a" already exists'),
            URL)
        self.assertIs(type(error), errors.AlreadyExists)
        self.assertEqual(error.message, 'configmaps "a" already exists')
        self.assertEqual(error.status["reason"], "AlreadyExists")

    def test_watch_error_event_status_with_a_string_code_is_typed(self):
        # An ERROR event carries no HTTP code: the Status's own code stands in, if usable.
        self.assertIs(type(errors.error_from_status(0, {"code": 410, "reason": "Expired"})),
                      errors.Gone)
        error = errors.error_from_status("410", {"code": "410", "reason": ["Expired"]})
        self.assertIs(type(error), errors.ServerError)

    def test_error_text_names_the_url_when_the_body_is_not_a_status(self):
        error = errors.error_for_response(404, b"\xff<html>", URL)
        self.assertIn(URL, str(error))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(code=st.integers(min_value=300, max_value=599),
           body=st.one_of(
               st.binary(max_size=300),
               st.dictionaries(st.sampled_from(["kind", "code", "reason", "message", "details"]),
                               st.recursive(st.none() | st.booleans() | st.integers()
                                            | st.floats() | st.text(max_size=20),
                                            lambda inner: st.lists(inner, max_size=3)
                                            | st.dictionaries(st.text(max_size=5), inner,
                                                              max_size=3),
                                            max_leaves=10))
               .map(lambda d: json.dumps(dict(d, kind="Status")).encode()),
               st.integers(min_value=1, max_value=5000).map(lambda n: b"[" * n * 100),
           ))
    def test_any_bytes_with_any_code_give_a_typed_error(self, code, body):
        error = errors.error_for_response(code, body, URL)
        self.assertIsInstance(error, errors.KubeError)
        self.assertEqual(error.code, code)
        expected = {400: errors.BadRequest, 401: errors.Unauthorized, 403: errors.Forbidden,
                    404: errors.NotFound, 409: errors.Conflict, 410: errors.Gone,
                    422: errors.Invalid}.get(code)
        if expected is not None:
            self.assertIsInstance(error, expected)
        elif code >= 500:
            self.assertIsInstance(error, errors.ServerError)
        str(error)
