"""The addresses a server's DNS name last resolved to, used while it no longer resolves.

The coordinator apiserver and the pool etcd are usually named by a DNS name (a Service
name). In a cloud outage the DNS server may be out of reach as well (cluster DNS runs
in the cloud or forwards there) while the pool's servers, on the nodes' own network,
still answer at the addresses the name had. ``RememberingResolver`` wraps the reactor's
resolver: every lookup still asks it, and the addresses a name resolved to are
remembered (``RememberedAddresses``: in memory and in a file of the agent's state
directory, so that an agent restarted during the outage has them too). A lookup that
finds nothing, or has not answered within ``patience`` seconds, is answered with the
remembered addresses when there are any, and as the resolver answered otherwise. The
first such answer for a name is one warning and its next resolution one information
line: one pair per outage, not a line per request.

Lookups of one name run one at a time: requests while one is pending wait for it (or,
past its patience, take the remembered addresses at once), so a DNS server that does
not answer does not pile up one blocked lookup per request.

IP address literals are passed to the wrapped resolver as they are: there is nothing to
remember. TLS is unaffected: a connection to a remembered address still verifies the
server's certificate against the name.

``ResolverReactor`` is how the resolver reaches Twisted's ``HostnameEndpoint`` (and so
an ``Agent``), which takes its resolver from the reactor it is given.
"""

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional

from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import (
    IAddress, IConnector, IDelayedCall, IHostnameResolver, IHostResolution, IListeningPort,
    IReactorPluggableNameResolver, IReactorTCP, IReactorTime, IResolutionReceiver,
)
from twisted.internet.protocol import P, ClientFactory, ServerFactory
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.tx.atomicfiles import replace_files_atomically

# The file of remembered addresses in the agent's state directory.
ADDRESSES_FILE_NAME = "resolved-addresses.json"
FILE_FORMAT_VERSION = 1
# A file larger than this is not read: it cannot be one this agent wrote.
MAX_FILE_BYTES = 1024 * 1024
# Seconds a lookup of a name with remembered addresses may take before they are used:
# far above a working DNS server's answer, below a heartbeat's request timeout.
DEFAULT_PATIENCE = 1.0


def _is_ip_literal(host: object) -> bool:
    return isinstance(host, str) and bool(isIPAddress(host) or isIPv6Address(host))


class RememberedAddresses:
    """Addresses by DNS name, in memory and in the JSON file ``path`` (None: in memory
    only).

    The file is ``{"version": 1, "names": {"<name>": ["<address>", ...]}}``. It is read
    once, here; a file that cannot be read or does not have that shape (anything but IP
    address literals included) is ignored with one warning: it is local state that only
    helps, and nothing it holds may stop the agent. It is written only when a name's
    set of addresses changed (a DNS server that rotates their order writes nothing),
    atomically (temporary file, fsync, rename, directory fsync) so that a crash leaves
    the old or the new file; a write that fails is one warning until a write succeeds,
    and the addresses stay remembered in memory. The file is a few hundred bytes and
    changes rarely, so it is written synchronously in the reactor thread.
    """

    log = Logger()

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._write_failing = False
        self._names: dict[str, tuple[str, ...]] = self._load()

    def get(self, name: str) -> tuple[str, ...]:
        """The addresses ``name`` last resolved to (none: empty)."""
        return self._names.get(name.lower(), ())

    def remember(self, name: str, addresses: Sequence[str]) -> None:
        """``name`` resolved to ``addresses`` (IP literals, not empty)."""
        key, addresses = name.lower(), tuple(addresses)
        changed = set(self._names.get(key, ())) != set(addresses)
        self._names[key] = addresses
        if changed:
            self._save()

    def _load(self) -> dict[str, tuple[str, ...]]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as error:
            self._ignored(f"cannot read it: {error.strerror or error}")
            return {}
        if len(data) > MAX_FILE_BYTES:
            self._ignored(f"larger than {MAX_FILE_BYTES} bytes")
            return {}
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            self._ignored(f"not JSON: {type(error).__name__}")
            return {}
        names = document.get("names") if isinstance(document, dict) else None
        if (not isinstance(document, dict) or document.get("version") != FILE_FORMAT_VERSION
                or not isinstance(names, dict)):
            self._ignored(f'not {{"version": {FILE_FORMAT_VERSION}, "names": {{...}}}}')
            return {}
        loaded: dict[str, tuple[str, ...]] = {}
        for name, addresses in names.items():
            if (not isinstance(addresses, list) or not addresses
                    or not all(_is_ip_literal(address) for address in addresses)):
                self._ignored(f"the addresses of {name!r} are not a list of IP addresses")
                return {}
            loaded[name.lower()] = tuple(addresses)
        return loaded

    def _ignored(self, why: str) -> None:
        self.log.warn("remembered addresses file {path} ignored ({why}): names are "
                      "resolved afresh and the file is rewritten", path=self.path, why=why)

    def _save(self) -> None:
        if self.path is None:
            return
        document = {"version": FILE_FORMAT_VERSION,
                    "names": {name: list(addresses)
                              for name, addresses in sorted(self._names.items())}}
        try:
            data = json.dumps(document, indent=1).encode("utf-8") + b"\n"
            replace_files_atomically(os.path.dirname(self.path) or ".",
                                     {os.path.basename(self.path): data}, mode=0o644)
        except OSError as error:
            if not self._write_failing:
                self._write_failing = True
                self.log.warn("cannot write remembered addresses to {path}: {error}; they "
                              "are kept in memory only", path=self.path,
                              error=error.strerror or error)
            return
        if self._write_failing:
            self._write_failing = False
            self.log.info("remembered addresses written to {path} again", path=self.path)


@implementer(IHostResolution)
class _Resolution:
    """One request's resolution, as its receiver is told of it."""

    def __init__(self, name: str, on_cancel: Callable[["_Resolution"], None]) -> None:
        self.name = name
        self._on_cancel = on_cancel
        self.cancelled = False

    def cancel(self) -> None:
        """The receiver is told nothing more."""
        if not self.cancelled:
            self.cancelled = True
            self._on_cancel(self)


class _Request:
    """A ``resolveHostName`` call waiting for its answer."""

    def __init__(self, receiver: IResolutionReceiver, port: int,
                 address_types: Optional[Sequence[type[IAddress]]], transport: str,
                 resolution: _Resolution) -> None:
        self.receiver = receiver
        self.port = port
        self.address_types = address_types
        self.transport = transport
        self.resolution = resolution

    def answer(self, hosts: Sequence[str]) -> None:
        if self.resolution.cancelled:
            return
        transport: Literal["TCP", "UDP"] = "UDP" if self.transport == "UDP" else "TCP"
        for host in hosts:
            kind = IPv6Address if isIPv6Address(host) else IPv4Address
            if self.address_types is not None and kind not in self.address_types:
                continue
            self.receiver.addressResolved(kind(transport, host, self.port))
        self.receiver.resolutionComplete()


class _Lookup:
    """The lookup of one name in flight, and the requests waiting for it."""

    def __init__(self) -> None:
        self.requests: list[_Request] = []
        self.found: list[str] = []
        self.timer: Optional[IDelayedCall] = None
        # Past its patience: requests meanwhile take the remembered addresses.
        self.late = False


@implementer(IResolutionReceiver)
class _LookupReceiver:
    """Collects the wrapped resolver's answer to one lookup."""

    def __init__(self, done: Callable[[list[str]], None], lookup: _Lookup) -> None:
        self._done = done
        self._lookup = lookup

    def resolutionBegan(self, resolutionInProgress: IHostResolution) -> None:
        pass

    def addressResolved(self, address: IAddress) -> None:
        if (isinstance(address, (IPv4Address, IPv6Address)) and _is_ip_literal(address.host)
                and address.host not in self._lookup.found):
            self._lookup.found.append(address.host)

    def resolutionComplete(self) -> None:
        self._done(list(self._lookup.found))


@implementer(IHostnameResolver)
class RememberingResolver:
    """``resolver`` (an ``IHostnameResolver``, the reactor's ``nameResolver``) with the
    addresses each name resolved to remembered in ``memory`` and used while the name
    does not resolve (see the module docstring). ``clock`` times the ``patience``."""

    log = Logger()

    def __init__(self, clock: IReactorTime, resolver: IHostnameResolver,
                 memory: RememberedAddresses, patience: float = DEFAULT_PATIENCE) -> None:
        self._clock = clock
        self._resolver = resolver
        self.memory = memory
        self._patience = patience
        self._lookups: dict[tuple[str, str], _Lookup] = {}
        # Names answered from memory since they last resolved (each warned of once).
        self._unresolved: set[str] = set()

    def resolveHostName(self, resolutionReceiver: IResolutionReceiver, hostName: str,
                        portNumber: int = 0,
                        addressTypes: Optional[Sequence[type[IAddress]]] = None,
                        transportSemantics: str = "TCP") -> IHostResolution:
        if _is_ip_literal(hostName):
            return self._resolver.resolveHostName(resolutionReceiver, hostName, portNumber,
                                                  addressTypes, transportSemantics)
        name = hostName.lower()
        key = (name, transportSemantics)
        resolution = _Resolution(hostName, lambda cancelled: self._cancelled(key, cancelled))
        request = _Request(resolutionReceiver, portNumber, addressTypes, transportSemantics,
                           resolution)
        resolutionReceiver.resolutionBegan(resolution)
        lookup = self._lookups.get(key)
        remembered = self.memory.get(name)
        if lookup is not None and lookup.late and remembered:
            request.answer(remembered)
            return resolution
        if lookup is not None:
            lookup.requests.append(request)
            return resolution
        lookup = self._lookups[key] = _Lookup()
        lookup.requests.append(request)
        if remembered:
            lookup.timer = self._clock.callLater(self._patience, self._impatient, key, lookup)
        # Asked for every address and port 0: each request gets its own port and types.
        try:
            self._resolver.resolveHostName(
                _LookupReceiver(lambda found: self._resolved(key, lookup, found), lookup),
                hostName, 0, None, transportSemantics)
        except Exception:
            # A lookup left pending would hold every later request of the name.
            self.log.failure("resolving {name} raised", name=hostName)
            self._resolved(key, lookup, [])
        return resolution

    def _cancelled(self, key: tuple[str, str], resolution: _Resolution) -> None:
        lookup = self._lookups.get(key)
        if lookup is not None:
            lookup.requests = [r for r in lookup.requests if r.resolution is not resolution]

    def _impatient(self, key: tuple[str, str], lookup: _Lookup) -> None:
        lookup.timer = None
        lookup.late = True
        remembered = self.memory.get(key[0])
        if not remembered:
            return
        self._from_memory(key[0], remembered, late=True)
        requests, lookup.requests = lookup.requests, []
        for request in requests:
            request.answer(remembered)

    def _resolved(self, key: tuple[str, str], lookup: _Lookup, found: list[str]) -> None:
        if self._lookups.get(key) is lookup:
            del self._lookups[key]
        if lookup.timer is not None and lookup.timer.active():
            lookup.timer.cancel()
        lookup.timer = None
        name = key[0]
        hosts: Sequence[str] = found
        if found:
            self.memory.remember(name, found)
            if name in self._unresolved:
                self._unresolved.discard(name)
                self.log.info("{name} resolves again: {addresses}", name=name,
                              addresses=", ".join(found))
        else:
            hosts = self.memory.get(name)
            if hosts:
                self._from_memory(name, hosts, late=False)
        requests, lookup.requests = lookup.requests, []
        for request in requests:
            request.answer(hosts)

    def _from_memory(self, name: str, hosts: Sequence[str], late: bool) -> None:
        """Warn once per outage that ``name`` is reached at remembered addresses."""
        if name in self._unresolved:
            return
        self._unresolved.add(name)
        if late:
            self.log.warn("{name} has not resolved within {patience}s: connecting to the "
                          "addresses it last resolved to ({addresses}) until it resolves "
                          "again", name=name, patience=f"{self._patience:g}",
                          addresses=", ".join(hosts))
        else:
            self.log.warn("{name} does not resolve: connecting to the addresses it last "
                          "resolved to ({addresses}) until it resolves again", name=name,
                          addresses=", ".join(hosts))


@implementer(IReactorPluggableNameResolver, IReactorTCP, IReactorTime)
class ResolverReactor:
    """``reactor`` with ``resolver`` as its name resolver: what ``HostnameEndpoint``
    and ``Agent``, which take the resolver from the reactor they are given, need to
    resolve through it. Connections and timers are ``reactor``'s."""

    def __init__(self, reactor: Any, resolver: IHostnameResolver) -> None:
        self._reactor = reactor
        self._resolver = resolver

    @property
    def nameResolver(self) -> IHostnameResolver:
        return self._resolver

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        previous, self._resolver = self._resolver, resolver
        return previous

    def connectTCP(self, host: str, port: int, factory: ClientFactory[P],
                   timeout: float = 30.0,
                   bindAddress: tuple[str, int] | None = None) -> IConnector:
        connector: IConnector = self._reactor.connectTCP(host, port, factory, timeout=timeout,
                                                         bindAddress=bindAddress)
        return connector

    def listenTCP(self, port: int, factory: ServerFactory, backlog: int = 50,
                  interface: str = "") -> IListeningPort:
        listening: IListeningPort = self._reactor.listenTCP(port, factory, backlog=backlog,
                                                            interface=interface)
        return listening

    def seconds(self) -> float:
        return float(self._reactor.seconds())

    def callLater(self, delay: float, callable: Callable[..., Any], *args: object,
                  **kwargs: object) -> IDelayedCall:
        call: IDelayedCall = self._reactor.callLater(delay, callable, *args, **kwargs)
        return call

    def getDelayedCalls(self) -> Sequence[IDelayedCall]:
        calls: Sequence[IDelayedCall] = self._reactor.getDelayedCalls()
        return calls


def remembering_resolver(reactor: Any, state_dir: Optional[str],
                         patience: float = DEFAULT_PATIENCE) -> Optional[RememberingResolver]:
    """A ``RememberingResolver`` over ``reactor``'s resolver, its file in ``state_dir``
    (None: memory only); None when ``reactor`` has no pluggable resolver (a test clock)."""
    resolving = IReactorPluggableNameResolver(reactor, None)
    if resolving is None:
        return None
    path = None if state_dir is None else os.path.join(state_dir, ADDRESSES_FILE_NAME)
    return RememberingResolver(reactor, resolving.nameResolver, RememberedAddresses(path),
                               patience)
