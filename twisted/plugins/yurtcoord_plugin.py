"""``twistd yurtcoord``: runs one yurtcoord agent from its ini configuration.

A missing or invalid configuration is reported as one line on stderr and exit status
78 (EX_CONFIG, which the systemd unit excludes from restarts) before twistd starts
logging: twistd's own usage errors would print the whole option help first.

A start failure (the status port is taken) is one log line and exit status 71.

SIGTERM is the normal way to stop an agent (systemd, kubelet, supervisors): it stops
the services and exits with status 0. Twisted's default handler would re-raise the
signal after shutdown, making every ordinary stop look like a crash.

``--sandbox`` runs the embedded pool of ``yurtcoord.sandbox`` instead of one agent:
Ctrl-C (SIGINT) and SIGTERM both stop it with status 0 once everything it started is
gone (SIGUSR1/SIGUSR2 cut and restore the leader's cloud link); a sandbox that cannot
start (no etcd) says why in one line and exits with 69.
"""

import atexit
import os
import signal
import sys

from twisted.application.service import IServiceMaker, MultiService
from twisted.internet.error import CannotListenError
from twisted.plugin import IPlugin
from twisted.python import usage
from zope.interface import implementer

DEFAULT_CONFIG_PATH = "/etc/yurtcoord/yurtcoord.ini"
EXIT_CONFIG_ERROR = 78
EXIT_UNAVAILABLE = 69
EXIT_CANNOT_START = 71


def _exit_with_one_line(message, status):
    sys.stderr.write(" ".join(str(message).split()) + "\n")
    sys.stderr.flush()
    raise SystemExit(status)


class Options(usage.Options):
    synopsis = "[--config PATH | --sandbox [--sandbox-agents N]]"
    longdesc = "Runs the yurtcoord pool coordinator agent of one edge node."

    optParameters = [
        ["config", "c", DEFAULT_CONFIG_PATH, "Path of the agent's ini configuration."],
        ["sandbox-agents", None, 3, "Number of agents in the sandbox pool.", int],
    ]
    optFlags = [
        ["sandbox", None, "Run a self-contained demo pool on loopback (no cluster needed)."],
    ]

    def postOptions(self):
        if self["sandbox-agents"] < 1:
            raise usage.UsageError("--sandbox-agents must be 1 or more")
        if self["sandbox"]:
            return
        from yurtcoord.config import ConfigError, load_config

        try:
            self["loaded_config"] = load_config(self["config"])
        except ConfigError as error:
            _exit_with_one_line(error, EXIT_CONFIG_ERROR)


def stop_cleanly_on_sigterm(reactor, log):
    """Replace the reactor's SIGTERM handler: stop the reactor, exit status 0.

    Call once the reactor runs (it installs its own handlers when starting).
    """

    def on_sigterm(signum, frame):
        log.info("received SIGTERM, stopping")
        reactor.callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, on_sigterm)


class ExitOnStartFailure(MultiService):
    """Parent of the agent under twistd: a failure to listen at start becomes one log
    line and exit status 71 instead of a traceback."""

    def __init__(self, agent, log):
        super().__init__()
        self.log = log
        agent.setServiceParent(self)

    def startService(self):
        try:
            super().startService()
        except CannotListenError as error:
            reason = getattr(error.socketError, "strerror", None) or error.socketError
            self.log.critical("cannot listen on {address}: {reason}",
                              address=f"{error.interface or '*'}:{error.port}", reason=reason)
            raise SystemExit(EXIT_CANNOT_START) from None


@implementer(IServiceMaker, IPlugin)
class YurtcoordServiceMaker:
    tapname = "yurtcoord"
    description = "yurtcoord pool coordinator agent (OpenYurt-style edge node pools)"
    options = Options

    def makeService(self, options):
        from twisted.internet import reactor
        from twisted.logger import Logger

        from yurtcoord.config import ConfigError
        from yurtcoord.service import make_service

        log = Logger(namespace="yurtcoord")
        if options["sandbox"]:
            return make_sandbox(reactor, options["sandbox-agents"], log)
        try:
            agent = make_service(options["loaded_config"], reactor)
        except ConfigError as error:
            # Credentials named by a valid config may still not load (a missing CA file).
            _exit_with_one_line(error, EXIT_CONFIG_ERROR)
        reactor.callWhenRunning(stop_cleanly_on_sigterm, reactor, log)
        return ExitOnStartFailure(agent, log)


def _print_to_terminal(line):
    """Sandbox lines go to the real stdout, beside (not inside) the log lines."""
    stream = sys.__stdout__
    stream.write(line + "\n")
    stream.flush()


def make_sandbox(reactor, agent_count, log):
    """The sandbox service; its start failure stops the reactor and, once twistd has
    finished its own shutdown, ends the process with ``EXIT_UNAVAILABLE``."""
    from twisted.logger import globalLogPublisher

    from yurtcoord.sandbox import Sandbox, install_signal_handlers

    def failed(message):
        log.critical("sandbox cannot start: {reason}", reason=message)
        atexit.register(_exit_now, EXIT_UNAVAILABLE)
        reactor.stop()

    sandbox = Sandbox(reactor, _print_to_terminal, globalLogPublisher,
                      agent_count=agent_count, on_failure=failed)
    reactor.callWhenRunning(install_signal_handlers, reactor, sandbox)
    return sandbox


def _exit_now(status):
    """Run at interpreter exit, after twistd's own shutdown: twistd exits 0 after any
    reactor stop, and a start that failed asynchronously has no other way to say so."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


service_maker = YurtcoordServiceMaker()
