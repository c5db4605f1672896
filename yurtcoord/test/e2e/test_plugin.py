"""``twistd yurtcoord`` as a real subprocess: start, answer, SIGTERM, exit 0, without
importing what the agent does not use; configuration errors as exactly one line and a
non-zero exit."""

import os
import re
import sys

import treq
from twisted.internet import defer, protocol, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.testing.offline import localize_paths, offline_ini
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.twistd import (
    LISTENING, REPO, TWISTD, TwistdProcess, child_environment, port_is_free, write_ini,
)

EXAMPLE_INI = os.path.join(REPO, "etc", "yurtcoord.ini")
START_DEADLINE = 20.0
# What serves only the sandbox, the tests or txaioetcd's database layer: the agent's
# process never imports these packages (each is about RSS an agent does not need).
NOT_IMPORTED_BY_THE_AGENT = ("numpy", "zlmdb", "cbor2", "yurtcoord.sim", "yurtcoord.testing")
# ... nor, configured without a kubeconfig (as here), the YAML parser.
NOT_IMPORTED_WITHOUT_A_KUBECONFIG = ("yaml",)
IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.M)


class RunningAgentTests(unittest.TestCase):
    def setUp(self):
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)
        self.client = treq.client.HTTPClient(Agent(reactor, pool=self.pool))

    def start_twistd(self, ini_path, child=None, **environment):
        child = child or TwistdProcess()
        directory = os.path.dirname(ini_path)
        reactor.spawnProcess(
            child, TWISTD, [TWISTD, "--nodaemon", "--pidfile=", "yurtcoord", "--config", ini_path],
            env={**child_environment(), **environment}, path=directory)

        def kill_if_running():
            if child.exit_code is None and not child.ended.called:
                child.transport.signalProcess("KILL")
                return child.ended
            return None

        self.addCleanup(kill_if_running)
        return child

    @defer.inlineCallbacks
    def get_healthz(self, url):
        """One GET of /healthz → (code, body), or None when it does not answer yet."""
        try:
            response = yield self.client.get(url + "/healthz", timeout=2)
            body = yield response.content()
        except Exception:
            return None
        return response.code, body

    @defer.inlineCallbacks
    def run_until_healthz_then_sigterm(self, ini_path, child=None, **environment):
        child = self.start_twistd(ini_path, child, **environment)
        yield poll_until(lambda: child.listening_url() or child.ended.called,
                         timeout=START_DEADLINE)
        self.assertIsNotNone(child.listening_url(), child.output.decode())
        url = child.listening_url()
        port = int(LISTENING.search(child.output.decode()).group(2))

        answers = []

        @defer.inlineCallbacks
        def answered():
            answers.append((yield self.get_healthz(url)))
            return answers[-1] is not None

        yield poll_until(answered, timeout=START_DEADLINE)
        # No peer answers: the agent is in role init until its first probes have
        # answered, then pending; either way it is not healthy.
        self.assertIn(answers[-1], [(503, b"not healthy: role init\n"),
                                    (503, b"not healthy: role pending\n")])

        child.transport.signalProcess("TERM")
        exit_code = yield child.ended
        self.assertEqual(exit_code, 0, child.output.decode())
        self.assertTrue(port_is_free(port), f"port {port} still bound after exit")
        log = child.output.decode()
        self.assertIn("received SIGTERM, stopping", log)
        self.assertNotIn("Traceback", log)
        return log

    @defer.inlineCallbacks
    def test_starts_answers_and_stops_on_sigterm(self):
        directory = self.mktemp()
        ini = write_ini(directory, offline_ini(directory))
        log = yield self.run_until_healthz_then_sigterm(ini)
        self.assertRegex(log, r"status pages listening on http://127\.0\.0\.1:\d+")

    @defer.inlineCallbacks
    def test_the_agent_imports_nothing_it_does_not_use(self):
        """Every module the running agent imported, from Python's own import trace
        (one line per finished import on stderr), from start to SIGTERM."""
        directory = self.mktemp()
        ini = write_ini(directory, offline_ini(directory))
        child = _StderrApart()
        yield self.run_until_healthz_then_sigterm(ini, child, PYTHONPROFILEIMPORTTIME="1")
        imported = set(IMPORT_TIME.findall(child.stderr.decode()))
        self.assertIn("yurtcoord.agent.service", imported)
        self.assertIn("txaioetcd._client_tx", imported)
        unneeded = sorted(m for m in imported if any(
            m == name or m.startswith(name + ".")
            for name in NOT_IMPORTED_BY_THE_AGENT + NOT_IMPORTED_WITHOUT_A_KUBECONFIG))
        self.assertEqual(unneeded, [])

    @defer.inlineCallbacks
    def test_the_agents_modules_import_nothing_it_does_not_use(self):
        """The same, from ``sys.modules`` of a fresh interpreter that imports the
        plugin and the agent's service module."""
        out, err, status = yield getProcessOutputAndValue(
            sys.executable, ["-c", "import sys, twisted.plugins.yurtcoord_plugin, "
                             "yurtcoord.agent.service\nprint('\\n'.join(sys.modules))"],
            env=child_environment(), reactor=reactor)
        self.assertEqual(status, 0, err.decode())
        imported = set(out.decode().split())
        self.assertIn("txaioetcd._client_tx", imported)
        self.assertEqual(sorted(m for m in imported if any(
            m == name or m.startswith(name + ".") for name in NOT_IMPORTED_BY_THE_AGENT)), [])

    @defer.inlineCallbacks
    def test_example_config_starts_without_any_server(self):
        with open(EXAMPLE_INI) as handle:
            example = handle.read()
        local, count = re.subn(r"(?m)^listen = \S+", "listen = 127.0.0.1:0", example)
        self.assertEqual(count, 1)
        directory = self.mktemp()
        yield self.run_until_healthz_then_sigterm(
            write_ini(directory, localize_paths(local, directory)))


class _StderrApart(TwistdProcess):
    """A twistd child whose stderr is kept apart from its log (on stdout), so that
    lines written to the two are never interleaved."""

    def __init__(self):
        super().__init__()
        self.stderr = b""

    def errReceived(self, data):
        self.stderr += data


class ConfigErrorExitTests(unittest.TestCase):
    """Bad configurations: one line of output naming the problem, non-zero exit."""

    @defer.inlineCallbacks
    def run_twistd(self, *arguments):
        directory = self.mktemp()
        os.makedirs(directory)
        out, err, code = yield getProcessOutputAndValue(
            TWISTD, ["--nodaemon", "--pidfile=", "yurtcoord", *arguments],
            env=child_environment(), path=directory)
        lines = [line for line in (out + err).decode().splitlines() if line.strip()]
        return lines, code

    @defer.inlineCallbacks
    def test_misspelt_key_is_one_line_naming_section_and_key(self):
        ini = write_ini(self.mktemp(), (
            "[node]\nname = edge-1\n[cloud]\nservers = https://10.0.0.1:6443\n"
            "[heartbeat]\nintervall = 5s\n"))
        lines, code = yield self.run_twistd("--config", ini)
        self.assertNotEqual(code, 0)
        self.assertEqual(code, 78)
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith(f"{ini}: [heartbeat] intervall = '5s': unknown key"),
                        lines[0])

    @defer.inlineCallbacks
    def test_bad_value_is_one_line(self):
        ini = write_ini(self.mktemp(), (
            "[node]\nname = edge-1\n[cloud]\nservers = https://10.0.0.1:6443\n"
            "[leader_election]\nretry_period = soon\n"))
        lines, code = yield self.run_twistd("--config", ini)
        self.assertEqual(code, 78)
        self.assertEqual(lines, [f"{ini}: [leader_election] retry_period = 'soon': "
                                 "not a duration (use 500ms, 15s, 2m)"])

    @defer.inlineCallbacks
    def test_missing_file_is_one_line(self):
        path = os.path.join(os.path.abspath(self.mktemp()), "absent.ini")
        lines, code = yield self.run_twistd("--config", path)
        self.assertEqual(code, 78)
        self.assertEqual(lines, [f"{path}: cannot read config: No such file or directory"])

    @defer.inlineCallbacks
    def test_sandbox_without_etcd_is_one_sandbox_line_and_exit_69(self):
        # No config is read with --sandbox (the default path does not exist here);
        # an etcd that cannot run ends the sandbox with one line saying why.
        absent_config = os.path.join(os.path.abspath(self.mktemp()), "absent.ini")
        directory = self.mktemp()
        os.makedirs(directory)
        env = child_environment()
        env["ETCD_BIN"] = "/bin/false"
        env["TMPDIR"] = os.path.abspath(directory)
        out, err, code = yield getProcessOutputAndValue(
            TWISTD, ["--nodaemon", "--pidfile=", "yurtcoord", "--sandbox",
                     "--sandbox-agents", "2", "--config", absent_config],
            env=env, path=directory)
        output = (out + err).decode()
        self.assertEqual(code, 69, output)
        failures = [line for line in output.splitlines() if line.startswith("[sandbox] cannot")]
        self.assertEqual(len(failures), 1, output)
        self.assertIn("etcd /bin/false exited while starting", failures[0])
        self.assertNotIn("Traceback", output)
        self.assertEqual(os.listdir(directory), [])


class StartFailureExitTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_port_in_use_is_one_log_line_and_exit_71(self):
        blocker = reactor.listenTCP(0, protocol.Factory(), interface="127.0.0.1")
        self.addCleanup(blocker.stopListening)
        port = blocker.getHost().port
        directory = self.mktemp()
        ini = write_ini(directory, offline_ini(directory, listen=f"127.0.0.1:{port}"))
        out, err, code = yield getProcessOutputAndValue(
            TWISTD, ["--nodaemon", "--pidfile=", "yurtcoord", "--config", ini],
            env=child_environment(), path=os.path.dirname(ini))
        output = (out + err).decode()
        self.assertEqual(code, 71, output)
        self.assertNotIn("Traceback", output)
        failures = [line for line in output.splitlines() if "cannot listen" in line]
        self.assertEqual(len(failures), 1, output)
        self.assertIn(f"cannot listen on 127.0.0.1:{port}: Address already in use", failures[0])
