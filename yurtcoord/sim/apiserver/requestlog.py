"""The test API server's request log: one record per answer sent in full.

Tests of partitions judge the agents by what the servers saw, not by what the
agents say about themselves: which client (by IP address) wrote which Lease, with
which holder and renewTime, and when the answer went out. A record names the lease
only for Lease writes and deletes (``coordination.k8s.io`` leases), the requests
such checks are about; every other request is logged with method, path and code.

A server run as its own process (in a network namespace of its own, say) also
writes each record as one JSON line to a file (``--request-log``), which
``read_request_log`` turns back into records after the run.
"""

import json
import re
import sys
from typing import Any, NamedTuple, Optional
from urllib.parse import unquote

from yurtcoord.names import DELEGATE_HEARTBEAT_ANNOTATION

# How many records a server keeps: the newest ones. A few agents renewing leases for
# minutes make thousands; a record is a few hundred bytes (paths and addresses are
# interned), so the bound keeps a long run under about a hundred megabytes.
REQUEST_LOG_LIMIT = 200_000

LEASE_GROUP = "coordination.k8s.io"
WRITE_METHODS = frozenset(("POST", "PUT", "PATCH"))
_LEASE_PATH = re.compile(r"^/apis/coordination\.k8s\.io/[^/]+/namespaces/([^/]+)/leases/([^/]+)/?$")


class LoggedRequest(NamedTuple):
    """One answered request as the server saw it.

    ``at`` is the server's reactor time when the answer was sent in full; ``peer``
    the client's IP address. For a successful (2xx) write of a Lease, ``namespace``,
    ``name``, ``holder`` (``spec.holderIdentity``, ``""`` when absent),
    ``renew_time`` (``spec.renewTime`` as written, or None) and ``delegated``
    (whether the ``openyurt.io/delegate-heartbeat`` annotation says "true") are those
    of the lease as answered. For a successful DELETE of one Lease only
    ``namespace`` and ``name`` are set. Everything else leaves them None.
    """

    at: float
    peer: str
    method: str
    path: str
    code: int
    namespace: Optional[str] = None
    name: Optional[str] = None
    holder: Optional[str] = None
    renew_time: Optional[str] = None
    delegated: Optional[bool] = None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    @property
    def is_lease_write(self) -> bool:
        """A successful write that left a Lease with the fields above."""
        return self.succeeded and self.method in WRITE_METHODS and self.name is not None

    @property
    def is_lease_delete(self) -> bool:
        """A successful DELETE of one Lease."""
        return self.succeeded and self.method == "DELETE" and self.name is not None

    def describe(self) -> str:
        """One line naming the request, for problem reports."""
        text = f"{self.method} {self.path} -> {self.code} from {self.peer} at {self.at:.3f}"
        if self.is_lease_write:
            text += f" (holder {self.holder!r}, renewTime {self.renew_time}"
            text += ", delegated)" if self.delegated else ")"
        return text


def _is_lease(body: Any) -> bool:
    if not isinstance(body, dict) or body.get("kind") != "Lease":
        return False
    api_version = body.get("apiVersion")
    return isinstance(api_version, str) and api_version.split("/")[0] == LEASE_GROUP


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def logged_request(at: float, peer: str, method: str, path: str, code: int,
                   body: Any = None) -> LoggedRequest:
    """The record of one answer; ``body`` is the JSON object answered (None when the
    answer was not JSON). Lease fields are filled as ``LoggedRequest`` says."""
    record = LoggedRequest(at, sys.intern(peer), sys.intern(method), sys.intern(path), code)
    if not 200 <= code < 300:
        return record
    if method in WRITE_METHODS and _is_lease(body):
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        annotations = metadata.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        return record._replace(
            namespace=_text(metadata.get("namespace")), name=_text(metadata.get("name")),
            holder=_text(spec.get("holderIdentity")) or "",
            renew_time=_text(spec.get("renewTime")),
            delegated=annotations.get(DELEGATE_HEARTBEAT_ANNOTATION) == "true")
    if method == "DELETE":
        match = _LEASE_PATH.match(path)
        if match is not None:
            return record._replace(namespace=unquote(match.group(1)),
                                   name=unquote(match.group(2)))
    return record


def json_line(record: LoggedRequest) -> str:
    """``record`` as one line of JSON (fields by name), newline included."""
    return json.dumps(record._asdict(), separators=(",", ":")) + "\n"


def read_request_log(path: str) -> list[LoggedRequest]:
    """The records of a request log file, in the order written.

    A last line without its newline is skipped: the server was killed while writing
    it, and its answer may not have reached the client either. Any other line that
    is not a record is an error naming the file and line."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            fields = json.loads(line)
            record = LoggedRequest(**fields)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a request log record: {error}") from None
        if not isinstance(record.at, (int, float)) or not isinstance(record.code, int):
            raise ValueError(f"{path}:{number}: not a request log record: "
                             f"at {record.at!r}, code {record.code!r}")
        records.append(record)
    return records
