"""Real network partitions for tests: hosts in network namespaces joined by bridges.

A pool exists for the moments its nodes lose the cloud, their neighbours, or both, so
its tests need links that really break: a ``Topology`` gives every agent, API test
server and etcd member a network namespace of its own (a *host*), joins the hosts with
one bridge per network ("wan", "lan" by default), and cuts, heals and flaps single
links with a few ``ip`` calls that act at once.

Everything it makes lives inside namespaces it creates: the hosts' namespaces and one
*switch* namespace per topology that holds the bridges and the switch side of every
veth pair. Nothing is ever added to the root namespace, so parallel topologies (other
tests, other test runs) never clash over interface names, and deleting the namespaces
removes every interface and bridge with them. Namespaces are named
``{PREFIX}-{owner pid}-{topology}-{host}`` (the switch is the host ``sw``) so that
``sweep_leftovers`` can tell the leftovers of a dead run from those of a live one.

Code runs in a host through its ``NamespacedReactor``: sockets belong to the network
namespace of the thread that creates them, and children inherit the namespace of the
thread that spawns them, so listening, connecting and spawning happen while the
calling thread is switched into the host's namespace (``entered``).

Addresses are taken from 198.18.0.0/15, the range set aside for network test beds, and
no host has a route out of its networks: nothing a test does inside a topology can
reach anything outside it.

Longer than 600 lines on purpose: one stack, each layer used only by the next: the ip
commands, entering a namespace, a reactor whose ports live in one, the clean-up of
leftovers and the ``Topology`` that cuts links.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from typing import (
    Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional,
    Sequence, Set, Tuple,
)

from twisted.internet import defer, tcp, udp
from twisted.internet.interfaces import IProcessProtocol, IProcessTransport
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from zope.interface import Interface, directlyProvides, implementer, providedBy

PREFIX = "ycnet"

# The host name of a topology's switch namespace, which holds its bridges.
SWITCH = "sw"

# The only range a topology's networks may use (RFC 2544 benchmarking networks).
TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")

DEFAULT_NETWORKS: Mapping[str, str] = {"wan": "198.18.0.0/24", "lan": "198.19.0.0/24"}

DIRECTIONS = ("both", "out", "in")

# A locally administered unicast address no interface has: frames sent to it are
# flooded by the bridge and dropped by every receiver, so a permanent neighbour entry
# pointing at it makes packets to that address vanish without any error.
BLACKHOLE_MAC = "02:00:00:00:00:01"

# Seconds close() and sweep_leftovers() wait for killed processes to be gone.
KILL_DEADLINE = 5.0

# Seconds close()'s Deferred waits for the reactor to see spawned processes end.
REAP_DEADLINE = 5.0

# Seconds one ip command may take.
COMMAND_TIMEOUT = 15.0

_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Network names become interface names: "{network}0" in a host, "br-{network}" and
# "{network}-{index}" in the switch, all within the kernel's 15 characters.
_NETWORK_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")

_log = Logger()


class CommandFailed(RuntimeError):
    """An ``ip`` (or other) command exited non-zero; the message holds its argv and
    stderr."""


class ICommandRunner(Interface):
    """Runs the commands that build and cut a topology.

    Injectable so that the timing of cuts and flaps can be tested on a ``task.Clock``
    with a runner that only records what would run.
    """

    def run(argv: Sequence[str]) -> str:
        """Run ``argv`` to completion and return its standard output; raise
        ``CommandFailed`` when it exits non-zero."""


@implementer(ICommandRunner)
class SubprocessRunner:
    """Runs commands as child processes, synchronously.

    Synchronous on purpose: a cut must be in force when ``cut()`` returns, so that the
    time recorded for it is the time it started.
    """

    def run(self, argv: Sequence[str]) -> str:
        try:
            done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=COMMAND_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CommandFailed(f"{' '.join(argv)}: {error}") from error
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip()
            raise CommandFailed(f"{' '.join(argv)} exited {done.returncode}: {message}")
        return done.stdout.decode("utf-8", "replace")


def namespace_name(topology: str, host: str, owner: Optional[int] = None,
                   prefix: str = PREFIX) -> str:
    """The namespace of ``host`` in ``topology`` owned by process ``owner`` (this one
    by default)."""
    return f"{prefix}-{os.getpid() if owner is None else owner}-{topology}-{host}"


# --- switching threads between namespaces ---------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, what: str) -> None:
    # ctypes rather than os.setns, which only exists from Python 3.12.
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"cannot enter {what}: {os.strerror(number)}")


@contextmanager
def entered(netns: str) -> Iterator[None]:
    """Run the body with the calling thread (only) in network namespace ``netns``.

    Sockets made and processes spawned in the body belong to ``netns``; the thread is
    switched back to the namespace it was in when the body ends, also on an exception.
    The body must not wait for the reactor (no ``yield`` of a Deferred inside it): the
    reactor's thread would keep serving every other connection from inside ``netns``.
    """
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"no network namespace named {netns!r}") from None
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target, f"network namespace {netns!r}")
            try:
                yield
            finally:
                _setns(home, "the thread's own network namespace")
        finally:
            os.close(home)
    finally:
        os.close(target)


# --- a reactor whose sockets and children live in a namespace -------------------------

class _ListensInNamespace:
    """Mixed into a port: its socket is made in a namespace, also when it listens again."""

    def __init__(self, netns: str, *args: Any) -> None:
        self._netns = netns
        super().__init__(*args)

    def startListening(self) -> None:
        with entered(self._netns):
            super().startListening()  # type: ignore[misc]


class _NamespacedPort(_ListensInNamespace, tcp.Port):
    """A TCP port whose socket is made in a namespace."""


class _NamespacedUDPPort(_ListensInNamespace, udp.Port):
    """A UDP port whose socket is made in a namespace."""


class _NamespacedConnector(tcp.Connector):
    """A TCP connector that makes every attempt's socket in a namespace.

    A connector makes a new socket on each ``connect()``, including the later retries
    of a ``ReconnectingClientFactory`` that run from the reactor's own thread; made in
    the root namespace, they would try to reach a test address through the machine's
    real network.
    """

    def __init__(self, netns: str, *args: Any) -> None:
        self._netns = netns
        super().__init__(*args)

    def _makeTransport(self) -> tcp.Client:
        with entered(self._netns):
            return super()._makeTransport()


class NamespacedReactor:
    """The reactor, as seen from inside network namespace ``netns``.

    ``listenTCP``, ``listenSSL``, ``listenUDP``, ``connectTCP``, ``connectSSL`` and
    ``spawnProcess`` make their sockets and children inside ``netns``; everything
    else (``callLater``, ``seconds``, ``adoptStreamPort``, the name resolver...) is
    the real reactor's. It provides the interfaces the real reactor provides, so that
    Twisted code (``Site``, ``Agent``, ``HTTPConnectionPool``, endpoints,
    ``deferLater``) takes it for a reactor. ``reactor`` must be a real (posix)
    reactor; give it addresses, not host names, since names are resolved in threads
    of the root namespace. An HTTP client needs a connection pool of its own per
    namespace (or none): pools key their cached connections by scheme, host and port
    only, so a shared one (treq's default) can hand out a connection made elsewhere.
    """

    def __init__(self, reactor: Any, netns: str) -> None:
        self._reactor = reactor
        self.netns = netns
        directlyProvides(self, *providedBy(reactor))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)

    def __repr__(self) -> str:
        return f"<NamespacedReactor {self.netns} of {self._reactor!r}>"

    def listenTCP(self, port: int, factory: Any, backlog: int = 50,
                  interface: str = "") -> tcp.Port:
        listening = _NamespacedPort(self.netns, port, factory, backlog, interface,
                                    self._reactor)
        listening.startListening()
        return listening

    def listenSSL(self, port: int, factory: Any, contextFactory: Any, backlog: int = 50,
                  interface: str = "") -> tcp.Port:
        # The real reactor's listenSSL would call its own listenTCP, in the root
        # namespace; wrap here as it does and listen through this one.
        listening = self.listenTCP(port, TLSMemoryBIOFactory(contextFactory, False, factory),
                                   backlog, interface)
        listening._type = "TLS"
        return listening

    def listenUDP(self, port: int, protocol: Any, interface: str = "",
                  maxPacketSize: int = 8192) -> udp.Port:
        listening = _NamespacedUDPPort(self.netns, port, protocol, interface,
                                       maxPacketSize, self._reactor)
        listening.startListening()
        return listening

    def connectTCP(self, host: str, port: int, factory: Any, timeout: float = 30.0,
                   bindAddress: Any = None) -> tcp.Connector:
        connector = _NamespacedConnector(self.netns, host, port, factory, timeout,
                                         bindAddress, self._reactor)
        connector.connect()
        return connector

    def connectSSL(self, host: str, port: int, factory: Any, contextFactory: Any,
                   timeout: float = 30.0, bindAddress: Any = None) -> tcp.Connector:
        return self.connectTCP(host, port, TLSMemoryBIOFactory(contextFactory, True, factory),
                               timeout, bindAddress)

    def spawnProcess(self, processProtocol: Any, executable: Any, args: Sequence[Any] = (),
                     env: Optional[Mapping[str, str]] = None, path: Optional[str] = None,
                     uid: Optional[int] = None, gid: Optional[int] = None,
                     usePTY: bool = False,
                     childFDs: Optional[Mapping[int, Any]] = None) -> IProcessTransport:
        """Spawn inside the namespace. ``env=None`` passes this process's environment
        (Twisted only does so when it does not fork)."""
        if env is None:
            env = dict(os.environ)
        with entered(self.netns):
            return self._reactor.spawnProcess(processProtocol, executable, args, env, path,
                                              uid, gid, usePTY, childFDs)


# --- processes ------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (it holds no namespace any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return fields[0] != b"Z"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pids_in(runner: ICommandRunner, netns: str) -> List[int]:
    try:
        output = runner.run(["ip", "netns", "pids", netns])
    except CommandFailed as error:
        _log.warn("netns cannot list processes netns={netns} error={error}",
                  netns=netns, error=str(error))
        return []
    return [int(word) for word in output.split() if word.isdigit()]


def _kill_everything(runner: ICommandRunner, namespaces: Iterable[str],
                     pids: Iterable[int] = (), deadline: float = KILL_DEADLINE) -> List[int]:
    """SIGKILL ``pids`` and every process inside ``namespaces`` until none is left or
    ``deadline`` seconds have passed; return the pids still running then.

    A namespace is only gone once no process is left in it: ``ip netns del`` merely
    drops its name, and a process still inside keeps it, with its veths and their
    peers, alive and out of reach.
    """
    namespaces = list(namespaces)
    remaining = set(pids)
    end = time.monotonic() + deadline
    while True:
        for netns in namespaces:
            remaining.update(_pids_in(runner, netns))
        # Never this process: its main thread may be inside one of them, entered.
        remaining = {pid for pid in remaining if pid != os.getpid() and _alive(pid)}
        if not remaining or time.monotonic() >= end:
            return sorted(remaining)
        for pid in remaining:
            _kill(pid)
        time.sleep(0.01)


def _delete_namespaces(runner: ICommandRunner, namespaces: Iterable[str]) -> List[str]:
    deleted = []
    for netns in namespaces:
        try:
            runner.run(["ip", "netns", "del", netns])
        except CommandFailed as error:
            _log.warn("netns cannot delete netns={netns} error={error}",
                      netns=netns, error=str(error))
        else:
            deleted.append(netns)
    return deleted


def _list_namespaces(runner: ICommandRunner) -> List[str]:
    # Lines read "NAME" or "NAME (id: N)".
    return [line.split()[0] for line in runner.run(["ip", "netns", "list"]).splitlines()
            if line.strip()]


def unavailable_reason(runner: Optional[ICommandRunner] = None,
                       euid: Optional[int] = None) -> Optional[str]:
    """None when this process can make network namespaces and enter them; otherwise
    one line saying why not, for ``SkipTest``: a partition test that cannot cut
    anything must say so rather than pass. ``euid`` stands for this process's
    effective uid (tests ask as another user without becoming one)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return f"network namespaces need root (running as uid {euid})"
    for tool, package in (("ip", "iproute2"), ("setpriv", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} ({package}) is not on PATH"
    runner = runner if runner is not None else SubprocessRunner()
    probe = namespace_name("probe", uuid.uuid4().hex[:8])
    try:
        runner.run(["ip", "netns", "add", probe])
    except CommandFailed as error:
        return f"cannot create a network namespace: {error}"
    try:
        with entered(probe):
            pass
    except OSError as error:
        return f"cannot enter a network namespace: {error}"
    finally:
        _delete_namespaces(runner, [probe])
    return None


def sweep_leftovers(prefix: str = PREFIX,
                    runner: Optional[ICommandRunner] = None) -> List[str]:
    """Remove the namespaces named ``{prefix}-{pid}-...`` whose owner ``pid`` is gone,
    with every process still inside them; return the names removed.

    A test run killed outright (SIGKILL, a CI timeout) cannot clean up after itself;
    the next run sweeps. Namespaces of a live owner, such as a test run in parallel,
    are left alone; so are those of a dead owner whose pid was reused since, until a
    later sweep.
    """
    runner = runner if runner is not None else SubprocessRunner()
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-")
    try:
        names = _list_namespaces(runner)
    except CommandFailed as error:
        _log.warn("netns cannot list namespaces error={error}", error=str(error))
        return []
    orphans = []
    for name in names:
        match = pattern.match(name)
        if match and not _alive(int(match.group(1))):
            orphans.append(name)
    if not orphans:
        return []
    left = _kill_everything(runner, orphans)
    if left:
        _log.warn("netns sweep could not kill pids={pids}", pids=left)
    removed = _delete_namespaces(runner, orphans)
    for name in removed:
        _log.info("netns swept leftover netns={netns}", netns=name)
    return removed


# --- topologies -----------------------------------------------------------------------

class Host:
    """One machine of a topology: its own network namespace, one interface per network
    it is on (named after the network, e.g. ``wan0``), and a reactor that listens,
    connects and spawns from inside it."""

    def __init__(self, name: str, netns: str, reactor: NamespacedReactor,
                 addresses: Mapping[str, str]) -> None:
        self.name = name
        self.netns = netns
        self.reactor = reactor
        self.addresses: Dict[str, str] = dict(addresses)

    def address(self, network: str) -> str:
        """This host's address on ``network``."""
        try:
            return self.addresses[network]
        except KeyError:
            raise KeyError(f"host {self.name!r} is not on network {network!r} "
                           f"(it is on {sorted(self.addresses)})") from None

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.addresses}>"


class LinkEvent(NamedTuple):
    """A cut or heal of one host's link: when (reactor seconds) it took effect."""

    at: float
    host: str
    network: str
    action: str
    direction: str


@implementer(IProcessProtocol)
class _EndWatcher:
    """Passes a spawned process's events to its protocol and notes when it ended, so
    that ``close()`` can wait until the reactor has reaped what it killed."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.ended: defer.Deferred = defer.Deferred()

    def makeConnection(self, process: Any) -> None:
        self.protocol.makeConnection(process)

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.protocol.childDataReceived(childFD, data)

    def childConnectionLost(self, childFD: int) -> None:
        self.protocol.childConnectionLost(childFD)

    def processExited(self, reason: Any) -> None:
        self.protocol.processExited(reason)

    def processEnded(self, reason: Any) -> None:
        try:
            self.protocol.processEnded(reason)
        finally:
            self.ended.callback(None)


_OPEN_TOPOLOGIES: Set[Tuple[str, str]] = set()
_SWEPT = False


class Topology:
    """Hosts in network namespaces, joined by one bridge per network, with links that
    can be cut, healed and flapped.

    ``prefix`` starts every namespace name; a test of the sweep uses one of its own
    so that other runs' sweeps leave its leftovers to it.

    ``networks`` maps a network name (up to 8 lowercase letters and digits: it names
    interfaces) to its subnet within 198.18.0.0/15. Namespaces are made as hosts are
    added; the first topology of a process sweeps the leftovers of dead runs first.
    ``close()`` removes every namespace, interface and process of the topology; it
    also runs at interpreter exit while the topology is open.

    Links: ``cut(host, network, direction)`` and ``heal(host, network)``; one cut per
    link at a time. Every cut and heal is appended to ``events`` with the reactor
    time it took effect, so that invariants can tell what was cut when.
    """

    def __init__(self, reactor: Any, name: str,
                 networks: Mapping[str, str] = DEFAULT_NETWORKS,
                 runner: Optional[ICommandRunner] = None, prefix: str = PREFIX) -> None:
        if not _NAME.match(name):
            raise ValueError(f"topology name {name!r} must be letters, digits, '_', '.' "
                             f"or '-', starting with a letter or digit")
        if not _NAME.match(prefix) or "-" in prefix:
            raise ValueError(f"namespace prefix {prefix!r} must be letters, digits, '_' "
                             f"or '.'")
        self._reactor = reactor
        self.name = name
        self.prefix = prefix
        self._runner = runner if runner is not None else SubprocessRunner()
        self.networks: Dict[str, ipaddress.IPv4Network] = {}
        for network, subnet in networks.items():
            if not _NETWORK_NAME.match(network):
                raise ValueError(f"network name {network!r} must be 1 to 8 lowercase "
                                 f"letters and digits, starting with a letter")
            try:
                parsed = ipaddress.ip_network(subnet)
            except ValueError as error:
                raise ValueError(f"network {network!r}: {error}") from None
            if not (isinstance(parsed, ipaddress.IPv4Network) and parsed.subnet_of(TEST_RANGE)):

                raise ValueError(f"network {network!r}: {subnet} is not within {TEST_RANGE}")
            for other, known in self.networks.items():
                if parsed.overlaps(known):
                    raise ValueError(f"network {network!r}: {subnet} overlaps "
                                     f"network {other!r} ({known})")
            self.networks[network] = parsed
        self.hosts: Dict[str, Host] = {}
        self.events: List[LinkEvent] = []
        self.switch = namespace_name(name, SWITCH, prefix=prefix)
        self._namespaces: List[str] = []
        self._ports: Dict[Tuple[str, str], str] = {}
        self._cuts: Dict[Tuple[str, str], str] = {}
        self._down: Set[Tuple[str, str]] = set()
        self._blackholed: Set[Tuple[str, str, str]] = set()
        self._processes: List[Tuple[int, _EndWatcher]] = []
        self._flaps: List[defer.Deferred] = []
        self._closed = False
        self._opened = False

    # building

    def _open(self) -> None:
        """Make the switch namespace and its bridges, on the first host."""
        global _SWEPT
        if self._opened:
            return
        if (self.prefix, self.name) in _OPEN_TOPOLOGIES:
            raise ValueError(f"a topology named {self.name!r} is already open in this "
                             f"process")
        # A runner that only records (timing tests) has nothing to sweep with.
        if not _SWEPT and isinstance(self._runner, SubprocessRunner):
            _SWEPT = True
            sweep_leftovers(runner=self._runner)
        _OPEN_TOPOLOGIES.add((self.prefix, self.name))
        self._opened = True
        atexit.register(self._close_at_exit)
        self._add_namespace(self.switch)
        for network in self.networks:
            bridge = f"br-{network}"
            self._ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
            self._ip("-n", self.switch, "link", "set", bridge, "addrgenmode", "none")
            self._ip("-n", self.switch, "link", "set", bridge, "up")

    def _ip(self, *args: str) -> str:
        return self._runner.run(["ip", *args])

    def _add_namespace(self, netns: str) -> None:
        self._ip("netns", "add", netns)
        self._namespaces.append(netns)

    def add_host(self, host: str, addresses: Mapping[str, str]) -> Host:
        """Add ``host``, a namespace of its own with loopback up and, for every
        ``network: address`` of ``addresses``, an interface ``{network}0`` with that
        address, joined to the network's bridge. It has no default route: it reaches
        the hosts of its networks and nothing else."""
        if not _NAME.match(host) or host == SWITCH:
            raise ValueError(f"host name {host!r} must be letters, digits, '_', '.' or "
                             f"'-', starting with a letter or digit, and not {SWITCH!r}")
        self._check_open()
        if host in self.hosts:
            raise ValueError(f"host {host!r} is already in topology {self.name!r}")
        interfaces = []
        for network, address in addresses.items():
            if network not in self.networks:
                raise ValueError(f"host {host!r}: no network {network!r} in topology "
                                 f"{self.name!r} (it has {sorted(self.networks)})")
            subnet = self.networks[network]
            try:
                parsed = ipaddress.ip_address(address)
            except ValueError as error:
                raise ValueError(f"host {host!r} on {network!r}: {error}") from None
            if parsed not in subnet or parsed in (subnet.network_address,
                                                  subnet.broadcast_address):
                raise ValueError(f"host {host!r}: {address} is not a host address of "
                                 f"network {network!r} ({subnet})")
            for other in self.hosts.values():
                if other.addresses.get(network) == address:
                    raise ValueError(f"host {host!r}: {address} on {network!r} is "
                                     f"already host {other.name!r}'s")
            interfaces.append((network, address, subnet.prefixlen))
        self._open()
        netns = namespace_name(self.name, host, prefix=self.prefix)
        index = len(self.hosts)
        self._add_namespace(netns)
        self._ip("-n", netns, "link", "set", "lo", "up")
        for network, address, prefixlen in interfaces:
            inside, port = f"{network}0", f"{network}-{index}"
            # Made inside the host and moved straight into the switch: neither end
            # ever exists in the root namespace.
            self._ip("-n", netns, "link", "add", inside, "type", "veth", "peer", "name",
                     port, "netns", self.switch)
            # No IPv6 link-local addresses (and no traffic from them).
            self._ip("-n", netns, "link", "set", inside, "addrgenmode", "none")
            self._ip("-n", self.switch, "link", "set", port, "addrgenmode", "none")
            self._ip("-n", self.switch, "link", "set", port, "master", f"br-{network}",
                     "up")
            self._ip("-n", netns, "addr", "add", f"{address}/{prefixlen}", "dev", inside)
            self._ip("-n", netns, "link", "set", inside, "up")
            self._ports[(host, network)] = port
        added = Host(host, netns, NamespacedReactor(self._reactor, netns), addresses)
        self.hosts[host] = added
        _log.info("netns host added topology={topology} host={host} netns={netns} "
                  "addresses={addresses}", topology=self.name, host=host, netns=netns,
                  addresses=dict(addresses))
        # Cuts in force on its networks apply to the newcomer too.
        self._apply()
        return added

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"topology {self.name!r} is closed")

    def _host(self, host: str, network: str) -> Host:
        self._check_open()
        if host not in self.hosts:
            raise ValueError(f"no host {host!r} in topology {self.name!r}")
        found = self.hosts[host]
        if network not in found.addresses:
            raise ValueError(f"host {host!r} is not on network {network!r}")
        return found

    # links

    def cut(self, host: str, network: str, direction: str = "both") -> None:
        """Cut ``host``'s link to ``network``, at once.

        ``both``: the switch's side of the link goes down; the host keeps its address
        and route (it does not get "network unreachable" at once, as it would if its
        own interface went down), its packets are lost and nothing reaches it. Its
        neighbour entries are flushed with the carrier, so a new connection fails with
        "No route to host" once address resolution gives up (about 3 s) rather than
        timing out. ``out``: everything the host sends on the network vanishes, while
        what others send still arrives. ``in``: what others send to the host
        vanishes, while what it sends still arrives. One-way cuts are silent: a
        connection attempt times out. They still break TCP both ways (handshakes and
        acknowledgements need both directions), but data sent the working way on an
        open connection reaches the application: a request can be acted upon while
        its answer is lost.

        Cutting a cut link again in the same direction does nothing; in another
        direction, it heals first.
        """
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} must be one of {DIRECTIONS}")
        self._host(host, network)
        current = self._cuts.get((host, network))
        if current == direction:
            return
        if current is not None:
            self.heal(host, network)
        self._cuts[(host, network)] = direction
        self._apply()
        self._record(host, network, "cut", direction)

    def heal(self, host: str, network: str) -> None:
        """Undo the cut of ``host``'s link to ``network``, whatever its direction; a
        link that is not cut is left as it is."""
        self._host(host, network)
        direction = self._cuts.pop((host, network), None)
        if direction is None:
            return
        self._apply()
        self._record(host, network, "heal", direction)

    def is_cut(self, host: str, network: str) -> Optional[str]:
        """The direction ``host``'s link to ``network`` is cut in, or None."""
        return self._cuts.get((host, network))

    def _record(self, host: str, network: str, action: str, direction: str) -> None:
        event = LinkEvent(self._reactor.seconds(), host, network, action, direction)
        self.events.append(event)
        _log.info("netns link {action} topology={topology} host={host} network={network} "
                  "direction={direction} at={at}", action=action, topology=self.name,
                  host=host, network=network, direction=direction, at=event.at)

    def _wanted(self) -> Tuple[Set[Tuple[str, str]], Set[Tuple[str, str, str]]]:
        """The links that must be down and the (namespace, interface, address) entries
        that must point at the black hole, from the cuts in force; computed as a whole
        because an "out" cut of one host and an "in" cut of another can need the same
        entry."""
        down, blackholed = set(), set()
        for (host, network), direction in self._cuts.items():
            if direction == "both":
                down.add((host, network))
                continue
            cut_host = self.hosts[host]
            for other in self.hosts.values():
                if other is cut_host or network not in other.addresses:
                    continue
                if direction == "out":
                    blackholed.add((cut_host.netns, f"{network}0", other.addresses[network]))
                else:
                    blackholed.add((other.netns, f"{network}0", cut_host.addresses[network]))
        return down, blackholed

    def _apply(self) -> None:
        down, blackholed = self._wanted()
        for host, network in sorted(down - self._down):
            self._ip("-n", self.switch, "link", "set", self._ports[(host, network)], "down")
            self._down.add((host, network))
        for netns, interface, address in sorted(blackholed - self._blackholed):
            self._ip("-n", netns, "neigh", "replace", address, "lladdr", BLACKHOLE_MAC,
                     "dev", interface, "nud", "permanent")
            self._blackholed.add((netns, interface, address))
        for host, network in sorted(self._down - down):
            self._ip("-n", self.switch, "link", "set", self._ports[(host, network)], "up")
            self._down.discard((host, network))
        for netns, interface, address in sorted(self._blackholed - blackholed):
            self._ip("-n", netns, "neigh", "del", address, "dev", interface)
            self._blackholed.discard((netns, interface, address))

    def flap(self, host: str, network: str, period: float, duration: float,
             direction: str = "both") -> defer.Deferred:
        """Cut ``host``'s link for ``period`` seconds, heal it for ``period``, and so
        on, for ``duration`` seconds of reactor time from now; the Deferred fires
        (with None) at the end, with the link healed. Each step is scheduled from the
        start, so a late reactor does not stretch the schedule. Cancelling the
        Deferred stops the flapping and heals the link."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} must be one of {DIRECTIONS}")
        if not period > 0:
            raise ValueError(f"flap period must be positive, not {period!r}")
        if not duration >= 0:
            raise ValueError(f"flap duration must not be negative, not {duration!r}")
        self._host(host, network)
        start = self._reactor.seconds()
        pending: List[Any] = []

        def stop(_: Any) -> None:
            for call in pending:
                if call.active():
                    call.cancel()
            self.heal(host, network)

        done: defer.Deferred = defer.Deferred(stop)

        def finish() -> None:
            self.heal(host, network)
            done.callback(None)

        def step() -> None:
            # The phase is computed from the start, not from the previous step, so
            # that a late reactor neither stretches the schedule nor flips the link
            # twice to catch up.
            pending.clear()
            now = self._reactor.seconds()
            if now >= start + duration:
                finish()
                return
            phase = int((now - start) // period)
            if phase % 2 == 0:
                self.cut(host, network, direction)
            else:
                self.heal(host, network)
            following = min(start + (phase + 1) * period, start + duration)
            pending.append(self._reactor.callLater(max(0.0, following - now), step))

        def forget(result: Any) -> Any:
            if done in self._flaps:
                self._flaps.remove(done)
            return result

        self._flaps.append(done)
        done.addBoth(forget)
        step()
        return done

    # processes

    def spawn(self, host: Host | str, process_protocol: Any, argv: Sequence[str],
              env: Optional[Mapping[str, str]] = None, path: Optional[str] = None,
              childFDs: Optional[Mapping[int, Any]] = None) -> IProcessTransport:
        """Spawn ``argv`` (``argv[0]`` looked up on the PATH of ``env``) inside
        ``host``, killed by ``close()``. It runs under ``setpriv --pdeathsig KILL`` so
        that it also dies when this process is killed outright. The kernel sends that
        signal when the *thread* that spawned it ends: spawn from the reactor's
        thread, not from a pool thread. ``env=None`` passes this process's
        environment."""
        self._check_open()
        name = host if isinstance(host, str) else host.name
        found = self.hosts.get(name)
        if found is None or (isinstance(host, Host) and host is not found):
            raise ValueError(f"host {name!r} is not in topology {self.name!r}")
        if not argv:
            raise ValueError("spawn needs a command (argv is empty)")
        setpriv = shutil.which("setpriv") or "setpriv"
        watcher = _EndWatcher(process_protocol)
        process = found.reactor.spawnProcess(
            watcher, setpriv, [setpriv, "--pdeathsig", "KILL", "--", *argv], env=env,
            path=path, childFDs=childFDs)
        self._processes.append((process.pid, watcher))
        _log.info("netns spawned topology={topology} host={host} pid={pid} argv={argv}",
                  topology=self.name, host=found.name, pid=process.pid, argv=list(argv))
        return process

    # the end

    def close(self) -> defer.Deferred:
        """Kill every process of the topology (spawned or found inside its
        namespaces), wait until they are gone, and delete its namespaces, which takes
        their interfaces and bridges with them. Never raises: what cannot be removed
        is logged. The Deferred fires once the reactor has seen the spawned processes
        end (bounded), so that a test ends with a clean reactor. Idempotent."""
        if self._closed:
            return defer.succeed(None)
        for flap in list(self._flaps):
            try:
                flap.addErrback(lambda failure: failure.trap(defer.CancelledError))
                flap.cancel()
            except Exception:
                _log.failure("netns stopping a flap of topology={topology} failed",
                             topology=self.name)
        self._closed = True
        atexit.unregister(self._close_at_exit)
        self._release()
        waiting = [watcher.ended for _, watcher in self._processes if not watcher.ended.called]
        if not waiting:
            return defer.succeed(None)
        ended = defer.gatherResults(waiting, consumeErrors=True)
        ended.addTimeout(REAP_DEADLINE, self._reactor)

        def unreaped(failure: Any) -> None:
            _log.warn("netns topology={topology} closed; the reactor did not see all its "
                      "processes end within {deadline}s", topology=self.name,
                      deadline=REAP_DEADLINE)

        ended.addCallbacks(lambda _: None, unreaped)
        return ended

    def _release(self) -> None:
        try:
            left = _kill_everything(self._runner, self._namespaces,
                                    [pid for pid, watcher in self._processes
                                     if pid and not watcher.ended.called])
            if left:
                _log.warn("netns topology={topology} could not kill pids={pids}",
                          topology=self.name, pids=left)
            # Hosts first: deleting the switch last lets each host's veth go with it.
            kept = set(self._namespaces) - set(_delete_namespaces(
                self._runner, reversed(self._namespaces)))
            if kept:
                _log.warn("netns topology={topology} left namespaces={namespaces}",
                          topology=self.name, namespaces=sorted(kept))
        except Exception:
            _log.failure("netns closing topology={topology} failed", topology=self.name)
        finally:
            if self._opened:
                _OPEN_TOPOLOGIES.discard((self.prefix, self.name))
            self._namespaces.clear()

    def _close_at_exit(self) -> None:
        # An uncaught failure ends the process without the test's cleanups.
        if not self._closed:
            self._closed = True
            self._release()

    def __repr__(self) -> str:
        return f"<Topology {self.name} hosts={sorted(self.hosts)}>"
