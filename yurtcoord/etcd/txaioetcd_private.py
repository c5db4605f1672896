"""Every use of txaioetcd's private names, in one place.

txaioetcd builds its request bodies with ``_marshal()`` methods, parses answers with
``_parse()`` static methods and sends every request through ``Client._post(url, data,
timeout)`` to ``Client._url`` + ``/v3alpha/...``. The adapter in
``yurtcoord.etcd.client`` reuses the first two and routes the third through its own
transport. A transaction is the exception: ``GatewayClient.submit`` writes its body
itself (``encode_transaction``) and reads the answer with txaioetcd's own
``validate_client_submit_response``. ``setup.py`` bounds txaioetcd to the versions
``yurtcoord.test.integration.test_private_canaries`` was run on, and those canaries fail with a
message naming what changed when a release moves one of them. Nothing else in the agent
touches a private txaioetcd name (a test scans for it).

txaioetcd's package ``__init__`` also imports its LMDB database layer
(``txaioetcd._pmap``, ``txaioetcd._database``: zlmdb, numpy, cbor2, about 13 MiB of RSS),
which the agent never uses. ``import_client_only`` loads the package without running
that ``__init__``: the package module gets exactly the names its ``__init__`` takes from
the client's own modules (``_version``, ``_types``, ``_lease``, ``_client_tx``), and
any other name (``Database``, the ``Map*`` classes) runs the real ``__init__`` on
first use, so a program that wants them still gets the whole package. Modules of the
agent take ``txaioetcd`` from here, never with ``import txaioetcd`` of their own (a
test checks that the agent runs without zlmdb and numpy loaded).
"""

import base64
import binascii
import importlib.util
import json
import sys
from types import ModuleType
from typing import Any, Callable, Protocol

from twisted.internet import defer
from twisted.internet.defer import Deferred

from yurtcoord.tx.twisted_private import QuietHTTPConnectionPool

__all__ = ["GatewayClient", "JSONPoster", "KeyAbsent", "encode_transaction",
           "marshal_range_request", "parse_key_value", "parse_status", "TXAIOETCD_PREFIX",
           "CLIENT_MODULES", "import_client_only", "txaioetcd"]

# The modules of txaioetcd's Twisted client, in the order its ``__init__`` imports
# them, with the names that ``__init__`` takes from each (``None``: the module's
# ``__all__``).
CLIENT_MODULES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("txaioetcd._version", ("__version__",)),
    ("txaioetcd._types", None),
    ("txaioetcd._lease", ("Lease",)),
    ("txaioetcd._client_tx", ("Client",)),
)


def import_client_only() -> ModuleType:
    """The ``txaioetcd`` package with its client and types, without its database layer.

    If ``txaioetcd`` is imported already (whole or by an earlier call), that module is
    returned as it is."""
    if "txaioetcd" in sys.modules:
        return sys.modules["txaioetcd"]
    spec = importlib.util.find_spec("txaioetcd")
    if spec is None or spec.loader is None:
        raise ImportError("txaioetcd is not installed")
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> Any:
        # A name the client modules do not define: the real ``__init__`` defines
        # everything (it re-imports the client modules from sys.modules).
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        delattr(package, "__getattr__")
        loader.exec_module(package)
        return getattr(package, name)

    sys.modules["txaioetcd"] = package
    try:
        for module_name, names in CLIENT_MODULES:
            # The import statement's own path (not importlib.import_module), so that
            # Python's import tracing (-X importtime) sees these modules too.
            __import__(module_name)
            module = sys.modules[module_name]
            for name in (module.__all__ if names is None else names):
                setattr(package, name, getattr(module, name))
    except BaseException:
        for name in [m for m in sys.modules if m == "txaioetcd" or m.startswith("txaioetcd.")]:
            del sys.modules[name]
        raise
    vars(package)["version"] = vars(package)["__version__"]
    setattr(package, "__getattr__", complete)
    return package


import_client_only()
import txaioetcd  # noqa: E402  (the package as import_client_only left it)
from txaioetcd._client_commons import validate_client_submit_response  # noqa: E402

# The gateway prefix txaioetcd puts in front of every path.
TXAIOETCD_PREFIX = "/v3alpha"


class JSONPoster(Protocol):
    """Where ``GatewayClient`` sends txaioetcd's requests: a path under the gateway
    prefix and a JSON-able body (``post``) or one already encoded (``post_body``) in,
    the parsed JSON answer out."""

    def post(self, path: str, data: dict, timeout: Any) -> Deferred: ...

    def post_body(self, path: str, body: bytes, timeout: Any) -> Deferred: ...


class KeyAbsent(txaioetcd.Comp):
    """A compare that holds while ``key`` does not exist: its version is 0.

    ``txaioetcd.CompVersion(key, "==", 0)`` says the same, but it spells out
    ``result``, ``target`` and ``version``, whose values here are the defaults of
    etcd's ``Compare`` message (``EQUAL``, ``VERSION``, 0); etcd reads the key alone as
    that compare. A batch of guarded creates carries one compare per object, and
    the shorter form spares the encoding here and the gateway's decoding in etcd
    three fields of each.
    """

    def __init__(self, key: bytes) -> None:
        txaioetcd.Comp.__init__(self, key, "==")

    def _marshal(self) -> dict:
        return {"key": base64.b64encode(self.key).decode("ascii")}

    def __str__(self) -> str:
        return f"KeyAbsent(key={self.key!r})"


# A put without lease or previous value, as ``OpSet._marshal()`` spells it.
_PUT = b'{"request_put":{"key":"%s","value":"%s"}}'
_KEY_ONLY = b'{"key":"%s"}'


def _base64(data: bytes) -> bytes:
    return binascii.b2a_base64(data, newline=False)


def _encode_part(part: Any) -> bytes:
    """One compare or operation of a transaction as JSON bytes."""
    kind = type(part)
    if kind is txaioetcd.OpSet and part.lease is None and not part.return_previous:
        return _PUT % (_base64(part.key), _base64(part.value))
    if kind is KeyAbsent:
        return _KEY_ONLY % _base64(part.key)
    return json.dumps(part._marshal()).encode("ascii")


def encode_transaction(txn: txaioetcd.Transaction) -> bytes:
    """The JSON body of ``txn`` for ``/kv/txn``: what ``json.dumps(txn._marshal())``
    says, as bytes.

    A batch of the pool store is 64 objects of a few KiB each. Marshalled by
    txaioetcd, every put becomes two dictionaries and two base64 strings, and
    ``json.dumps`` then scans each of those strings for characters to escape, none of
    which base64 holds; the puts (and the store's ``KeyAbsent`` compares) are
    written here straight from their keys and values instead. Any other compare or
    operation, and a put with a lease or asking for the previous value, goes
    through its own ``_marshal()``.
    """
    # Joined once: a body of a few hundred KiB is copied once, not per nesting level.
    pieces: list[bytes] = []
    for opening, parts in ((b'"compare":[', txn.compare), (b'"success":[', txn.success),
                           (b'"failure":[', txn.failure)):
        if parts:
            pieces.append((b"," if pieces else b"{") + opening)
            for part in parts:
                pieces.append(_encode_part(part))
                pieces.append(b",")
            pieces[-1] = b"]"
    pieces.append(b"}" if pieces else b"{}")
    return b"".join(pieces)


def _transaction_answer(obj: dict) -> Any:
    """A ``/kv/txn`` answer as txaioetcd's ``submit`` reads it: ``Success``, or
    ``Failed`` raised when the compares did not hold (``Error`` for an etcd error)."""
    header, responses = validate_client_submit_response(obj)
    if obj.get("succeeded", False):
        return txaioetcd.Success(header, responses)
    raise txaioetcd.Failed(header, responses)


def marshal_range_request(op: txaioetcd.OpGet) -> dict:
    """The JSON body of a range request for ``op`` (its ``request_range`` part)."""
    return op._marshal()["request_range"]


def parse_key_value(obj: dict) -> txaioetcd.KeyValue:
    """One ``kvs`` entry of a range answer as a ``txaioetcd.KeyValue``."""
    return txaioetcd.KeyValue._parse(obj)


def parse_status(obj: dict) -> txaioetcd.Status:
    """A ``/maintenance/status`` answer as a ``txaioetcd.Status``."""
    return txaioetcd.Status._parse(obj)


class GatewayClient(txaioetcd.Client):
    """txaioetcd's client with its one HTTP call sent through ``transport``.

    txaioetcd's own ``_post`` ignores the pool and agent it was given and posts with
    treq's global pool to ``/v3alpha``; here the path is cut from the URL and handed
    to the transport, which knows the gateway prefix etcd serves.

    txaioetcd's constructor builds an Agent nothing here uses on the pool it is given
    and sets ``noisy`` on that pool's factory class: the pool given is a
    ``QuietHTTPConnectionPool``, whose factory class is the agent's own, so no class
    of Twisted is changed.

    :param refuse: makes the failed Deferred a refused call (``watch``) returns.
    """

    def __init__(self, reactor: Any, url: str, transport: JSONPoster,
                 refuse: Callable[[str], Deferred]):
        txaioetcd.Client.__init__(self, reactor, url=url,
                                  pool=QuietHTTPConnectionPool(reactor, persistent=False))
        self._transport = transport
        self._refuse = refuse

    def _post(self, url: bytes, data: dict, timeout: Any) -> Deferred:
        path = url.decode("utf-8")[len(self._url):]
        if path.startswith(TXAIOETCD_PREFIX + "/"):
            path = path[len(TXAIOETCD_PREFIX):]
        return self._transport.post(path, data, timeout)

    def submit(self, txn: txaioetcd.Transaction, timeout: Any = None) -> Deferred:
        """txaioetcd's ``submit`` with the body written by ``encode_transaction``: the
        same request and the same ``Success``/``Failed`` answer, without the
        dictionaries of ``Transaction._marshal()`` and their second pass through
        ``json.dumps``. A transaction that cannot be encoded fails the Deferred, as
        there."""
        try:
            body = encode_transaction(txn)
        except Exception:
            return defer.fail()
        return self._transport.post_body("/kv/txn", body, timeout).addCallback(
            _transaction_answer)

    def watch(self, keys: Any, on_watch: Any, filters: Any = None,
              start_revision: Any = None, return_previous: Any = None) -> Deferred:
        """Refused: txaioetcd's watch bypasses the transport and drops split JSON lines."""
        return self._refuse("watch is not supported through this adapter")
