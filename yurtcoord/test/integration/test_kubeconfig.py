"""An agent given a kubeconfig with a field the client does not implement (an exec
plugin, an auth provider), or with ``insecure-skip-tls-verify: true`` while ``[cloud]
insecure = false``, fails to build with a configuration error of its cloud section,
and ``twistd`` run on it exits with status 78 and one line. Key and token files that
group or others may read are named, with their mode, in one warning at start."""

import os
from typing import Any, Generator

from twisted.logger import LogLevel, Logger, formatEvent

from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from yurtcoord.agent.config import ConfigError, parse_config
from yurtcoord.agent import service as service_module
from yurtcoord.agent.service import make_service
from yurtcoord.sim.agentini import ini_text
from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.kubeconfigs import (
    AUTH_PROVIDER, CLUSTER, EXEC, USER, kubeconfig_text, write_kubeconfig,
)
from yurtcoord.testing.twistd import TWISTD, child_environment, write_ini


def agent_ini(kubeconfig, insecure="false"):
    return ini_text({"node": {"name": "edge-1"},
                     "cloud": {"servers": "https://127.0.0.1:6443", "kubeconfig": kubeconfig,
                               "insecure": insecure},
                     "coordinator": {"enabled": "false"}})


def cloud_ini(**cloud):
    return ini_text({"node": {"name": "edge-1"},
                     "cloud": {"servers": "https://127.0.0.1:6443", **cloud},
                     "coordinator": {"enabled": "false"}})


INSECURE = CLUSTER + "    insecure-skip-tls-verify: true\n"


class AgentTests(unittest.TestCase):
    def kubeconfig(self, text):
        return write_kubeconfig(self, text)

    def test_building_the_agent_is_a_config_error_of_the_cloud_section(self):
        kubeconfig = self.kubeconfig(kubeconfig_text(user=USER + EXEC))
        config = parse_config(agent_ini(kubeconfig), "/etc/yurtcoord/yurtcoord.ini")
        with self.assertRaises(ConfigError) as caught:
            make_service(config, reactor)
        message = str(caught.exception)
        self.assertEqual(caught.exception.section, "cloud")
        self.assertIn(f"{kubeconfig}: users[name=u1].user.exec is set", message)

    @defer.inlineCallbacks
    def twistd_refusal(self, kubeconfig: str) -> Generator[Any, Any, tuple[str, str]]:
        """(ini path, the one line) of ``twistd yurtcoord`` refusing a configuration
        that names ``kubeconfig``: it exits 78 and prints one line."""
        ini = write_ini(self.mktemp(), agent_ini(kubeconfig))
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        # An agent that wrongly starts is killed after a minute, so nothing is left.
        out, err, code = yield getProcessOutputAndValue(
            "/usr/bin/timeout", ["-s", "KILL", "60", TWISTD, "--nodaemon", "--pidfile=",
                                 "yurtcoord", "--config", ini],
            env=child_environment(), path=directory)
        lines = [line for line in (out + err).decode().splitlines() if line.strip()]
        self.assertEqual(code, 78, lines)
        self.assertEqual(len(lines), 1, lines)
        return ini, lines[0]

    @defer.inlineCallbacks
    def test_twistd_exits_78_with_one_line(self):
        kubeconfig = self.kubeconfig(kubeconfig_text(user=AUTH_PROVIDER))
        ini, line = yield self.twistd_refusal(kubeconfig)
        self.assertTrue(line.startswith(f"{ini}: [cloud]: cannot build the clients: "
                                        f"{kubeconfig}: users[name=u1].user.auth-provider"),
                        line)
        self.assertNotIn("abc", line)

    def test_insecure_skip_tls_verify_needs_cloud_insecure(self):
        """Honoured before while ``[cloud] insecure = false``, also with a CA set: a
        server with another CA received the bearer token."""
        kubeconfig = self.kubeconfig(kubeconfig_text(cluster=INSECURE))
        config = parse_config(agent_ini(kubeconfig), "/etc/yurtcoord/yurtcoord.ini")
        with self.assertRaises(ConfigError) as caught:
            make_service(config, reactor)
        message = str(caught.exception)
        self.assertEqual(caught.exception.section, "cloud")
        self.assertIn(f"{kubeconfig}: clusters[name=c1].cluster.insecure-skip-tls-verify "
                      "is true", message)
        self.assertNotIn("t0ken", message)
        allowed = parse_config(agent_ini(kubeconfig, insecure="true"), "/etc/y.ini")
        agent = make_service(allowed, reactor)
        self.addCleanup(agent._close_clients)
        self.assertTrue(all(c.config.insecure for c in agent.cloud_clients.values()))

    @defer.inlineCallbacks
    def test_twistd_refuses_insecure_skip_tls_verify_with_exit_78_and_one_line(self):
        kubeconfig = self.kubeconfig(kubeconfig_text(cluster=INSECURE))
        _ini, line = yield self.twistd_refusal(kubeconfig)
        self.assertIn(f"{kubeconfig}: clusters[name=c1].cluster.insecure-skip-tls-verify "
                      "is true", line)


class ReadableSecretsTests(unittest.TestCase):
    """Key and token files that group or others may read: one warning each at start,
    naming the file and its mode in octal, never its content."""

    def setUp(self):
        self.events = []
        self.patch(service_module.Agent, "log", Logger(observer=self.events.append))
        self.directory = os.path.abspath(self.mktemp())
        os.makedirs(self.directory)
        self.pair = TestCA(self.directory).client_pair("edge-1", "system:node:edge-1",
                                                       ["system:nodes"])

    def key(self, mode):
        """The client pair's key file with permission bits ``mode``."""
        os.chmod(self.pair.key_file, mode)
        return self.pair.key_file

    def secret(self, name, mode, text="S3cretKeyMaterial\n"):
        path = os.path.join(self.directory, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, mode)
        return path

    def warnings(self, ini):
        agent = make_service(parse_config(ini, "/etc/yurtcoord/yurtcoord.ini"), reactor)
        self.addCleanup(agent._close_clients)
        lines = [formatEvent(e) for e in self.events if e["log_level"] == LogLevel.warn]
        with open(self.pair.key_file) as handle:
            key_material = handle.read().splitlines()[1]
        for line in lines:
            self.assertNotIn("S3cret", line)
            self.assertNotIn(key_material, line)
        return lines

    def test_a_key_and_a_token_readable_by_others_are_named_with_their_mode(self):
        cert, key = self.pair.cert_file, self.key(0o644)
        self.assertEqual(self.warnings(cloud_ini(cert_file=cert, key_file=key)), [
            f"{key} ([cloud] key_file) is readable by group or others (mode 0644): only "
            "the agent's user should read it (chmod 600)"])
        self.events.clear()
        token = self.secret("token", 0o640)
        (line,) = self.warnings(cloud_ini(token_file=token))
        self.assertIn(f"{token} ([cloud] token_file) is readable by group or others "
                      "(mode 0640)", line)

    def test_files_of_the_agent_alone_give_no_warning(self):
        cert, key = self.pair.cert_file, self.key(0o600)
        self.assertEqual(self.warnings(cloud_ini(cert_file=cert, key_file=key)), [])

    def test_a_kubeconfig_holding_a_token_and_its_key_file(self):
        key = self.key(0o604)
        kubeconfig = write_kubeconfig(self, kubeconfig_text(
            user=f"{USER}    client-key: {key}\n"
                 f"    client-certificate: {self.pair.cert_file}\n"))
        os.chmod(kubeconfig, 0o644)
        lines = self.warnings(agent_ini(kubeconfig))
        self.assertEqual(len(lines), 2, lines)
        self.assertIn(f"{key} (client-key of {kubeconfig}) is readable by group or others "
                      "(mode 0604)", lines[0])
        self.assertIn(f"{kubeconfig} ([cloud] kubeconfig, with a key or token) is readable "
                      "by group or others (mode 0644)", lines[1])
