"""``twistd yurtcoord``: runs one yurtcoord agent from its ini configuration.

``twistd yurtcoord --version`` prints yurtcoord's version (from the installed
package's metadata) with the Twisted and Python it runs on, and exits 0.

A missing or invalid configuration is reported as one line on stderr and exit status
78 (EX_CONFIG, which the systemd unit excludes from restarts) before twistd starts
logging: twistd's own usage errors would print the whole option help first.

A start failure (the status port is taken) is one log line and exit status 71.

The log goes where twistd's own options send it (stdout with ``--nodaemon``,
``--logfile``, ``--syslog``), in ``[log] format``, without the events below ``[log]
level`` (``yurtcoord.tx.logs``): the agent's service gives the application its log
observer, which twistd uses unless ``--logger`` names another one.

SIGTERM is the normal way to stop an agent (systemd, kubelet, supervisors): it stops
the services and exits with status 0. Twisted's default handler would re-raise the
signal after shutdown, making every ordinary stop look like a crash.

``--sandbox`` runs the embedded pool of ``yurtcoord.sim.sandbox`` instead of one agent
(``--sandbox-agents N`` agents over a pool etcd of ``--sandbox-etcd-members N``):
Ctrl-C (SIGINT) and SIGTERM both stop it with status 0 once everything it started is
gone (SIGUSR1/SIGUSR2 cut and restore the leader's cloud link); a sandbox that cannot
start (no etcd) says why in one line and exits with 69. twistd starts the services
before the reactor runs and installs its handlers, so the sandbox takes SIGINT and
SIGTERM over as soon as its options are parsed: a Ctrl-C while it is still starting is
a clean stop too, not a ``KeyboardInterrupt`` raised somewhere inside the start.
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


class EarlyStopSignals:
    """Handler of SIGINT and SIGTERM from option parsing until the sandbox's own
    handlers are in place: it only remembers the signals, which the sandbox then acts
    on (Python's default would raise ``KeyboardInterrupt`` wherever the start is)."""

    def __init__(self) -> None:
        self.received = []

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._remember)

    def _remember(self, signum, frame):
        self.received.append(signum)


class Options(usage.Options):
    synopsis = "[--config PATH | --sandbox [--sandbox-agents N] [--sandbox-etcd-members N]]"
    longdesc = "Runs the yurtcoord pool coordinator agent of one edge node."

    optParameters = [
        ["config", "c", DEFAULT_CONFIG_PATH, "Path of the agent's ini configuration."],
        ["sandbox-agents", None, 3, "Number of agents in the sandbox pool.", int],
        ["sandbox-etcd-members", None, 3,
         "Members of the sandbox's pool etcd cluster (1 for a small machine).", int],
    ]
    optFlags = [
        ["sandbox", None, "Run a self-contained demo pool on loopback (no cluster needed)."],
    ]

    def opt_version(self) -> None:
        """Print yurtcoord's version (and the Twisted and Python it runs on), exit 0.

        ``usage.Options`` would print Twisted's version alone, which does not tell
        an operator which yurtcoord a node runs."""
        from yurtcoord.agent.version import agent_version_line

        sys.stdout.write(agent_version_line() + "\n")
        sys.stdout.flush()
        raise SystemExit(0)

    def postOptions(self):
        if self["sandbox-agents"] < 1:
            raise usage.UsageError("--sandbox-agents must be 1 or more")
        if self["sandbox-etcd-members"] < 1:
            raise usage.UsageError("--sandbox-etcd-members must be 1 or more")
        if self["sandbox"]:
            self["early_stop_signals"] = EarlyStopSignals()
            self["early_stop_signals"].install()
            return
        from yurtcoord.agent.config import ConfigError, load_config

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
    line and exit status 71 instead of a traceback.

    With ``log_observer`` it gives the application it joins that observer (its
    ``ILogObserver`` component), which twistd then logs to: twistd asks for it after
    building the service and before logging anything."""

    def __init__(self, agent, log, log_observer=None):
        super().__init__()
        self.log = log
        self.log_observer = log_observer
        agent.setServiceParent(self)

    def setServiceParent(self, parent):
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            from twisted.logger import ILogObserver

            parent.setComponent(ILogObserver, self.log_observer)
        return super().setServiceParent(parent)

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

        from yurtcoord.agent.config import ConfigError
        from yurtcoord.agent.service import make_service

        log = Logger(namespace="yurtcoord")
        if options["sandbox"]:
            return make_sandbox(reactor, options["sandbox-agents"], log,
                                options.get("early_stop_signals"),
                                etcd_members=options["sandbox-etcd-members"])
        try:
            agent = make_service(options["loaded_config"], reactor)
        except ConfigError as error:
            # Credentials named by a valid config may still not load (a missing CA file).
            _exit_with_one_line(error, EXIT_CONFIG_ERROR)
        reactor.callWhenRunning(stop_cleanly_on_sigterm, reactor, log)
        return ExitOnStartFailure(agent, log, agent_log_observer(options))


def agent_log_observer(options):
    """The log observer of an agent run by twistd, from the ``[log]`` section of its
    configuration and twistd's own options (``options.parent``); None outside twistd."""
    from yurtcoord.tx.logs import twistd_log_observer

    if options.parent is None:
        return None
    log_config = options["loaded_config"].log
    return twistd_log_observer(options.parent, log_config.level, log_config.format)


def _print_to_terminal(line):
    """Sandbox lines go to the real stdout, beside (not inside) the log lines."""
    stream = sys.__stdout__
    stream.write(line + "\n")
    stream.flush()


def make_sandbox(reactor, agent_count, log, early_stop_signals=None, etcd_members=3):
    """The sandbox service; its start failure stops the reactor and, once twistd has
    finished its own shutdown, ends the process with ``EXIT_UNAVAILABLE``.

    Its signal handlers are installed at once, before twistd starts it: the reactor
    keeps a SIGINT handler it finds installed, so Ctrl-C stops the sandbox cleanly at
    any point of the start. They are installed again once the reactor runs, since it
    replaces the SIGTERM handler then. Stop signals remembered by
    ``early_stop_signals`` are acted on as if they came now."""
    from yurtcoord.sim.sandbox import Sandbox, install_signal_handlers

    def failed(message):
        log.critical("sandbox cannot start: {reason}", reason=message)
        atexit.register(_exit_now, EXIT_UNAVAILABLE)
        reactor.stop()

    sandbox = Sandbox(reactor, _print_to_terminal, agent_count=agent_count, on_failure=failed,
                      etcd_members=etcd_members)
    install_signal_handlers(reactor, sandbox,
                            early_stop_signals.received if early_stop_signals else ())
    reactor.callWhenRunning(install_signal_handlers, reactor, sandbox)
    return sandbox


def _exit_now(status):
    """Run at interpreter exit, after twistd's own shutdown: twistd exits 0 after any
    reactor stop, and a start that failed asynchronously has no other way to say so."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


service_maker = YurtcoordServiceMaker()
