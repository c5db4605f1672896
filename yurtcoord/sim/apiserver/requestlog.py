"""The test API server's request log: one record per answer sent in full.

Tests of partitions judge the agents by what the servers saw, not by what the
agents say about themselves: which client (by IP address) wrote which Lease, with
which holder and renewTime, and when the answer went out. A record names the lease
only for Lease writes and deletes (``coordination.k8s.io`` leases), the requests
such checks are about; every other request is logged with method, path, query and
code. ``request_attributes`` reads a record as the apiserver's authorizer sees the
request (verb, API group, resource, subresource, namespace, name), so that the RBAC
rules an agent needs can be checked against what it really asked.

A server run as its own process (in a network namespace of its own, say) also
writes each record as one JSON line to a file (``--request-log``), which
``read_request_log`` turns back into records after the run.
"""

import json
import re
import sys
from typing import Any, NamedTuple, Optional
from urllib.parse import parse_qs, unquote

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
    the client's IP address; ``query`` the query string as sent (``""`` when none).
    For a successful (2xx) write of a Lease, ``namespace``,
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
    query: str = ""
    user: str = ""

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
                   body: Any = None, query: str = "", user: str = "") -> LoggedRequest:
    """The record of one answer; ``body`` is the JSON object answered (None when the
    answer was not JSON), ``query`` the request's query string, ``user`` who asked.
    Lease fields are filled as ``LoggedRequest`` says."""
    record = LoggedRequest(at, sys.intern(peer), sys.intern(method), sys.intern(path), code,
                           query=query, user=sys.intern(user))
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


class RequestAttributes(NamedTuple):
    """What the apiserver's authorizer sees of one request.

    For a resource request (``resource`` set) ``verb`` is one of get, list, watch,
    create, update, patch, delete, deletecollection; ``group`` is ``""`` for the core
    group, ``namespace`` ``""`` for a cluster-wide request, ``name`` ``""`` when the
    request names no object (a list or watch names one through a ``fieldSelector``
    of ``metadata.name=<name>``, as the apiserver reads it). For any other path
    (discovery such as ``/api/v1``, ``/version``) ``resource`` is ``""``, ``verb`` the
    method in lower case and ``path`` the one to match against non-resource URLs.
    """

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str

    @property
    def is_resource_request(self) -> bool:
        return bool(self.resource)

    def describe(self) -> str:
        """One line naming the request, e.g. ``update coordination.k8s.io leases
        kube-node-lease/edge-1``."""
        if not self.is_resource_request:
            return f"{self.verb} {self.path}"
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = "/".join(part for part in (self.namespace, self.name) if part)
        return f"{self.verb} {self.group or 'core'} {resource} {where or '(all)'}".rstrip()


_VERB_OF_METHOD = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update",
                   "PATCH": "patch", "DELETE": "delete"}
# Subresources of a Namespace object: /api/v1/namespaces/<name>/status is the
# namespace's own status, not a resource "status" inside the namespace.
_NAMESPACE_SUBRESOURCES = frozenset(("status", "finalize"))
_TRUE = frozenset(("1", "t", "T", "true", "TRUE", "True"))


def _name_of_field_selector(selector: str) -> str:
    """The name a ``fieldSelector`` requires exactly (``metadata.name=x``), or ``""``;
    as the apiserver, no name that could not be a path segment (``.``, ``..``, or one
    holding ``/`` or ``%``)."""
    for term in selector.split(","):
        field, equals, value = term.partition("=")
        if equals and not field.endswith("!") and field.strip() == "metadata.name":
            name = value[1:] if value.startswith("=") else value
            if name in (".", "..") or "/" in name or "%" in name:
                return ""
            return name
    return ""


def request_attributes(record: LoggedRequest) -> RequestAttributes:
    """``record`` as the authorizer sees it (see ``RequestAttributes``), read from its
    method, path and query the way the apiserver reads a request."""
    return attributes_of(record.method, record.path, record.query)


def attributes_of(method: str, path: str, query: str) -> RequestAttributes:
    """A request as the authorizer sees it (see ``RequestAttributes``): ``path`` is
    the URL's path as sent (percent-escapes and all), ``query`` its query string."""
    parts = [unquote(part) for part in path.strip("/").split("/") if part]
    non_resource = RequestAttributes(method.lower(), "", "", "", "", "", path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    if parts[0] == "apis":
        if len(parts) < 4:
            return non_resource
        group, parts = parts[1], parts[3:]
    else:
        group, parts = "", parts[2:]
    verb = _VERB_OF_METHOD.get(method, "")
    if parts[0] == "watch":  # the old /api/v1/watch/... form
        verb, parts = "watch", parts[1:]
        if not parts:
            return non_resource
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    arguments = parse_qs(query, keep_blank_values=True)
    if not name and verb == "get":
        verb = "watch" if arguments.get("watch", [""])[-1] in _TRUE else "list"
    if not name and verb in ("list", "watch"):
        name = _name_of_field_selector(arguments.get("fieldSelector", [""])[-1])
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(verb, group, resource, subresource, namespace, name, path)


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
