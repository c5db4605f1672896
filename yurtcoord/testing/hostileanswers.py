"""Hypothesis strategies for what a hostile etcd gateway may answer: bodies that are
garbage, huge, nested beyond any parser's depth, or JSON of the wrong types, with the
statuses a broken proxy or a corrupt member sends.

The parse functions of the etcd client are fed these directly, and the whole client
and the pool store meet them over loopback HTTP; both must end in a typed error."""

import base64
import json
from typing import Any, Tuple

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

STATUSES = st.sampled_from([200, 200, 200, 400, 404, 429, 500, 502, 503, 504, 201, 302])

json_scalars: SearchStrategy[Any] = (
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False) | st.sampled_from([1e308, -1e308])
    | st.text(max_size=20))
json_values: SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kv_fields() -> SearchStrategy[Any]:
    """A key-value record of a range answer, each field well-formed or hostile."""
    not_base64 = st.sampled_from(["!!!", "YQ", "a b c", "é", "=", "YWJj\n===="])
    key = st.binary(max_size=40).map(b64) | not_base64 | json_values
    return st.fixed_dictionaries({}, optional={
        "key": key, "value": key, "version": st.just("1") | json_values,
        "mod_revision": st.just("7") | json_values,
        "create_revision": st.just("7") | json_values})


def range_bodies() -> SearchStrategy[Any]:
    return st.fixed_dictionaries({}, optional={
        "header": st.fixed_dictionaries({}, optional={"revision": st.just("9") | json_values})
        | json_values,
        "kvs": st.lists(kv_fields(), max_size=3) | json_values,
        "more": json_values, "count": st.just("1") | json_values})


def txn_bodies() -> SearchStrategy[Any]:
    response = st.fixed_dictionaries({}, optional={
        "response_range": range_bodies() | json_values,
        "response_put": st.fixed_dictionaries({}, optional={"header": json_values})
        | json_values,
        "response_delete_range": st.fixed_dictionaries({}, optional={
            "deleted": json_values}) | json_values})
    return st.fixed_dictionaries({}, optional={
        "header": st.fixed_dictionaries({}, optional={"revision": st.just("9") | json_values}),
        "succeeded": json_values, "responses": st.lists(response, max_size=6) | json_values})


def error_bodies() -> SearchStrategy[Any]:
    """What the gateway sends with an error: code and message of any type."""
    return st.fixed_dictionaries({}, optional={
        "code": json_values | st.sampled_from([14, 4, 8, "14", 1e308]),
        "message": json_values | st.sampled_from(["request is too large", "too many operations"]),
        "error": json_values, "details": json_values})


def deeply_nested(depth: int, opener: str) -> bytes:
    """A JSON error object with ``depth`` levels below its message."""
    closer = {"[": "]", '{"a":': "}"}[opener]
    return (b'{"code": 3, "message": ' + opener.encode() * depth + b"1"
            + closer.encode() * depth + b"}")


def bodies() -> SearchStrategy[bytes]:
    structured = st.one_of(range_bodies(), txn_bodies(), error_bodies(), json_values)
    return st.one_of(
        structured.map(lambda obj: json.dumps(obj).encode()),
        st.binary(max_size=300),
        st.builds(deeply_nested, st.integers(min_value=500, max_value=60000),
                  st.sampled_from(["[", '{"a":'])),
        st.builds(lambda n: b'{"message": "' + b"x" * n + b'", "code": 3}',
                  st.integers(min_value=100_000, max_value=3_000_000)),
    )


# One answer of the gateway: (HTTP status, body).
answers: SearchStrategy[Tuple[int, bytes]] = st.tuples(STATUSES, bodies())
