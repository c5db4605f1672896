"""``twistd yurtcoord`` as a child process of a test: where twistd is, the child's
environment and ini file, and its collected output."""

import os
import re
import socket
import sys
from typing import Dict, Optional

from twisted.internet import defer, error, protocol
from twisted.python.failure import Failure
from yurtcoord.testing.paths import REPO

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
# The agent's log line naming its status pages' URL.
LISTENING = re.compile(r"status pages listening on (http://127\.0\.0\.1:(\d+))")


def child_environment(without_etcd: bool = False) -> Dict[str, str]:
    """This environment for a ``twistd`` child, importing yurtcoord from this tree and
    writing its output unbuffered. ``without_etcd`` leaves out the ``ETCD*`` variables
    (etcd reads them as flags), for children of a world that runs its own etcd."""
    env = dict(os.environ)
    if without_etcd:
        env = {k: v for k, v in env.items() if not k.startswith("ETCD")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


class TwistdProcess(protocol.ProcessProtocol):
    """Collects a twistd child's output; ``ended`` fires with its exit code."""

    def __init__(self) -> None:
        self.output = b""
        self.ended: defer.Deferred[Optional[int]] = defer.Deferred()
        self.exit_code: Optional[int] = None
        self.signal: Optional[int] = None

    def outReceived(self, data: bytes) -> None:
        self.output += data

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        if isinstance(reason.value, (error.ProcessDone, error.ProcessTerminated)):
            self.exit_code = reason.value.exitCode
            self.signal = reason.value.signal
        self.ended.callback(self.exit_code)

    def listening_url(self) -> Optional[str]:
        """The status pages' URL the child logged, None before it did."""
        match = LISTENING.search(self.output.decode("utf-8", "replace"))
        return match.group(1) if match else None


def write_ini(directory: str, text: str) -> str:
    """Write ``text`` to ``directory``/yurtcoord.ini (created); the file's path."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "yurtcoord.ini")
    with open(path, "w") as handle:
        handle.write(text)
    return path


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``port``: a new server (with SO_REUSEADDR, as
    Twisted and the agent itself use, so closed connections in TIME_WAIT don't count)
    can bind it."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
