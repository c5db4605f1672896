"""Hostile watch streams, as property tests (hypothesis, derandomized).

Random bytes, random cut points, lines longer than the bound, deeply nested JSON and
every wrong JSON type (an event that is not an object, an object that is not a dict,
a type that is not a string, a Status with fields of the wrong types) are fed to:

- the real ``WatchStreamProtocol``: every stream ends in exactly one outcome, None
  or a ``KubeError``; no call raises; every event handed on is a known type with a
  dict object; the unfinished line held never exceeds the bound;
- a real ``Informer`` whose watches run the real parser over in-memory transports:
  each hostile stream ends its watch with a typed error and a backoff, nothing is
  logged as a crash, and once the hostile input is gone the next watch brings the
  store up to date.
"""

import json

from hypothesis import HealthCheck, given, settings, strategies as st
from twisted.internet import defer
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial import unittest
from twisted.web.client import ResponseDone, ResponseFailed
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.tx.retry import Retries, backoff_policy
from yurtcoord.kube.errors import KubeError
from yurtcoord.kube.gvr import CONFIGMAPS
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IListWatchClient
from yurtcoord.kube.watch import WATCH_EVENT_TYPES, WatchStreamProtocol

MAX_LINE = 4096
EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
objects = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=8), "namespace": st.just("ns"),
         "resourceVersion": st.integers(1, 10 ** 6).map(str) | json_values})})
event_types = st.sampled_from(sorted(WATCH_EVENT_TYPES) + ["ERROR", "SURPRISE"]) | json_values
statuses = st.fixed_dictionaries({}, optional={
    "kind": st.just("Status") | json_values, "code": json_values | st.integers(100, 599),
    "reason": json_values | st.sampled_from(["Expired", "Gone", "NotFound"]),
    "message": json_values})
events = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": event_types, "object": objects | json_values | statuses}),
    st.fixed_dictionaries({"type": event_types}),
    st.fixed_dictionaries({"object": objects}),
)


def nested(depth, kind):
    opening, closing = {"list": (b"[", b"]"), "dict": (b'{"a":', b"}")}[kind]
    inner = opening * depth + b"1" + closing * depth
    return b'{"type":"ADDED","object":{"metadata":{"name":"n"},"spec":' + inner + b"}}"


lines = st.one_of(
    events.map(lambda e: json.dumps(e).encode()),
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    st.integers(MAX_LINE + 1, 3 * MAX_LINE).map(lambda n: b"z" * n),
    st.tuples(st.integers(1, 20000), st.sampled_from(["list", "dict"])).map(
        lambda args: nested(*args)),
)
streams = st.tuples(st.lists(lines, max_size=8), st.booleans()).map(
    lambda parts: b"\n".join(parts[0]) + (b"\n" if parts[1] else b""))
cuts = st.lists(st.integers(min_value=0, max_value=4 * MAX_LINE), max_size=12)
endings = st.sampled_from(["done", "lost", "cancel"])


def split_at(data, points):
    points = sorted(set(p for p in points if 0 < p < len(data)))
    bounds = [0] + points + [len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def describe(outcome):
    """An outcome as comparable: None, or the error's type and text."""
    if isinstance(outcome, Failure):
        return type(outcome.value), str(outcome.value)
    return outcome


def end(protocol, ending):
    if ending == "cancel":
        protocol.cancel()
        protocol.connectionLost(Failure(ResponseFailed([Failure(ConnectionLost("gone"))])))
    elif ending == "lost":
        protocol.connectionLost(Failure(ResponseFailed([Failure(ConnectionLost("reset"))])))
    else:
        protocol.connectionLost(Failure(ResponseDone("end")))


class WatchParserPropertyTests(unittest.TestCase):

    def run_stream(self, chunks, ending):
        delivered, outcomes = [], []
        protocol = WatchStreamProtocol(lambda kind, obj: delivered.append((kind, obj)),
                                       "https://api/watch", max_line=MAX_LINE)
        protocol.makeConnection(StringTransport())
        protocol.finished.addBoth(outcomes.append)
        for chunk in chunks:
            protocol.dataReceived(chunk)
            self.assertLessEqual(protocol.pending_bytes, MAX_LINE)
        end(protocol, ending)
        for kind, obj in delivered:
            self.assertIn(kind, WATCH_EVENT_TYPES)
            self.assertIsInstance(obj, dict)
        self.assertEqual(len(outcomes), 1)
        outcome = outcomes[0]
        if isinstance(outcome, Failure):
            self.assertIsInstance(outcome.value, KubeError, outcome.getTraceback())
        else:
            self.assertIsNone(outcome)
        return delivered, outcome

    @EXAMPLES
    @given(streams, cuts, endings)
    def test_any_stream_cut_anywhere_ends_in_none_or_a_typed_error(self, data, points, ending):
        self.run_stream(split_at(data, points), ending)

    @EXAMPLES
    @given(st.lists(st.binary(max_size=3 * MAX_LINE), max_size=6), endings)
    def test_random_bytes_end_in_none_or_a_typed_error(self, chunks, ending):
        self.run_stream(chunks, ending)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.integers(MAX_LINE + 1, 8 * MAX_LINE), st.integers(1, 2 * MAX_LINE))
    def test_a_line_past_the_bound_ends_the_stream_however_it_arrives(self, size, read):
        line = b'{"type":"ADDED","object":{"metadata":{"name":"' + b"y" * size
        chunks = split_at(line, range(read, len(line), read))
        delivered, outcome = self.run_stream(chunks, "done")
        self.assertEqual(delivered, [])
        self.assertIn(f"longer than {MAX_LINE} bytes", str(outcome.value))

    def test_deep_nesting_is_a_typed_error_not_a_recursion_error(self):
        for kind in ("list", "dict"):
            delivered, outcome = self.run_stream([nested(100000, kind)[:MAX_LINE - 1]
                                                  + b"\n"], "done")
            self.assertEqual(delivered, [])
        protocol = WatchStreamProtocol(lambda kind, obj: None, "w", max_line=10 ** 7)
        protocol.makeConnection(StringTransport())
        outcomes = []
        protocol.finished.addBoth(outcomes.append)
        protocol.dataReceived(nested(100000, "list") + b"\n")
        end(protocol, "done")
        self.assertIn("nested too deeply", str(outcomes[0].value))

    @EXAMPLES
    @given(st.lists(lines | st.sampled_from([b"", b"  ", b"\r", b"{}  "]), max_size=10),
           endings)
    def test_all_lines_of_one_read_give_what_one_line_per_read_gives(self, parts, ending):
        # The lines of one read are decoded together; whenever that is not one event
        # per line they are decoded one by one: either way the outcome is the same.
        stream = b"".join(part + b"\n" for part in parts)
        if len(stream) > MAX_LINE:
            stream = stream[:stream.rfind(b"\n", 0, MAX_LINE) + 1]
        one_by_one = self.run_stream([part + b"\n" for part in stream.split(b"\n")[:-1]],
                                     ending)
        together = self.run_stream([stream], ending)
        self.assertEqual(together[0], one_by_one[0])
        self.assertEqual(describe(together[1]), describe(one_by_one[1]))

    def test_wrong_types_are_typed_errors(self):
        for line in [b"[1,2]", b'"text"', b"null", b'{"type":["ADDED"],"object":{}}',
                     b'{"type":{"a":1},"object":{}}', b'{"type":"ADDED","object":[1]}',
                     b'{"type":"ADDED","object":{"metadata":"x"}}', b'{"type":"ADDED"}',
                     b'{"type":"ERROR","object":{"code":"410","reason":["Expired"]}}',
                     b'{"type":"ERROR","object":"gone"}']:
            delivered, outcome = self.run_stream([line + b"\n"], "done")
            self.assertEqual(delivered, [], line)
            self.assertIsInstance(outcome.value, KubeError, line)


@implementer(IListWatchClient)
class ScriptedStreams:
    """Lists answer with ``listed``; each watch plays the next payload through a real
    ``WatchStreamProtocol`` over an in-memory transport and ends it, and the watch
    after the last payload stays open."""

    class Watch:
        def __init__(self, protocol):
            self.protocol = protocol
            self.done = protocol.finished

        @property
        def events(self):
            return self.protocol.events

        def cancel(self):
            self.protocol.cancel()
            self.protocol.connectionLost(Failure(ResponseDone("cancelled")))

    def __init__(self, listed, payloads, points):
        self.listed = listed
        self.payloads = list(payloads)
        self.points = points
        self.outcomes = []

    def list(self, gvr, namespace=None, label_selector=None, field_selector=None,
             resource_version=None, limit=None, continue_token=None):
        return defer.succeed({"kind": "ConfigMapList", "metadata": {"resourceVersion": "1"},
                              "items": [dict(obj) for obj in self.listed]})

    def watch(self, gvr, on_event, namespace=None, resource_version=None,
              label_selector=None, field_selector=None, allow_bookmarks=True,
              timeout_seconds=None, idle_timeout=None):
        protocol = WatchStreamProtocol(on_event, "https://api/watch", max_line=MAX_LINE)
        protocol.makeConnection(StringTransport())
        protocol.finished.addBoth(lambda result: self.outcomes.append(result) or result)
        if self.payloads:
            for chunk in split_at(self.payloads.pop(0), self.points):
                protocol.dataReceived(chunk)
            protocol.connectionLost(Failure(ResponseDone("end")))
        else:
            protocol.dataReceived(json.dumps(
                {"type": "ADDED", "object": GOOD}).encode() + b"\n")
        return self.Watch(protocol)


GOOD = {"metadata": {"name": "good", "namespace": "ns", "resourceVersion": "99"}}


class InformerPropertyTests(unittest.TestCase):

    def test_the_scripted_client_provides_the_interface(self):
        verifyObject(IListWatchClient, ScriptedStreams([], [], []))

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(streams, min_size=1, max_size=4), cuts)
    def test_informer_survives_hostile_streams_and_catches_up_once_they_are_gone(
            self, payloads, points):
        failures = []

        def observer(event):
            if "log_failure" in event:
                failures.append(event)
        globalLogPublisher.addObserver(observer)
        try:
            clock = Clock()
            client = ScriptedStreams([], payloads, points)
            informer = Informer(clock, client, CONFIGMAPS, namespace="ns",
                                backoff=Retries(backoff_policy(initial=0.5, maximum=4.0,
                                                               jitter=0.0)),
                                watch_timeout_seconds=None)
            informer.start()
            for _ in range(20 * len(payloads) + 10):
                if "ns/good" in informer.store:
                    break
                clock.advance(1.0)
            self.assertTrue(informer.running)
            self.assertEqual(informer.store.get("ns/good"), GOOD)
            for outcome in client.outcomes[:len(payloads)]:
                if isinstance(outcome, Failure):
                    self.assertIsInstance(outcome.value, KubeError, outcome.getTraceback())
            stopped = informer.stop()
            self.assertTrue(stopped.called)
            self.assertEqual(clock.getDelayedCalls(), [])
        finally:
            globalLogPublisher.removeObserver(observer)
        self.assertEqual(failures, [])
