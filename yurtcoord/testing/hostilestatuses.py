"""Error answers a hostile peer may send in place of a Kubernetes Status: Status
objects with fields of the wrong type, JSON that is not a Status, nesting too deep for
the parser, bytes that are not UTF-8, an empty body. Each must become the client's
typed error of its HTTP code, whether fed to the parsing function or served to
``KubeClient``."""

import json
from typing import Any

from yurtcoord.kube import errors

DEEP = b'{"kind":"Status","details":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
DEEP_LIST = b"[" * 200_000


def status(**fields: Any) -> bytes:
    """A failure Status with ``fields``, as JSON."""
    return json.dumps(dict({"kind": "Status", "apiVersion": "v1", "status": "Failure"},
                           **fields)).encode()


# (HTTP code, body, expected class); every expected class is the one of the HTTP code.
HOSTILE: dict[str, tuple[int, bytes, type[errors.KubeError]]] = {
    "string-code": (409, status(code="409", reason="Conflict"), errors.Conflict),
    "string-code-alone": (404, status(code="404"), errors.NotFound),
    "list-reason": (409, status(code=409, reason=["AlreadyExists"]), errors.Conflict),
    "dict-message": (422, status(code=422, reason="Invalid", message={"a": 1}), errors.Invalid),
    "bool-code": (500, status(code=True, reason="InternalError"), errors.ServerError),
    "huge-code": (403, status(code=10**30, reason="Forbidden"), errors.Forbidden),
    "float-code": (410, status(code=410.5, reason="Expired"), errors.Gone),
    "reason-of-another-code": (500, status(code=404, reason="NotFound"), errors.ServerError),
    "not-a-status": (404, b'{"kind":"Pod","code":"x"}', errors.NotFound),
    "json-list": (400, b'["Status", 400]', errors.BadRequest),
    "json-string": (401, b'"Unauthorized"', errors.Unauthorized),
    "deep-status": (409, DEEP, errors.Conflict),
    "deep-list": (503, DEEP_LIST, errors.ServerError),
    "not-utf8": (404, b'{"kind":"Status","message":"\xff\xfe"}', errors.NotFound),
    "binary": (502, bytes(range(256)), errors.ServerError),
    "empty": (410, b"", errors.Gone),
    "unknown-4xx": (418, status(code="teapot", reason=7), errors.KubeError),
}
