"""Kubeconfig fields that would change how the client authenticates or verifies the
server, but that the client does not implement, are configuration errors naming the
file and the field; an agent given such a kubeconfig exits with status 78."""

import os

from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from yurtcoord.agent.config import ConfigError, parse_config
from yurtcoord.agent.service import make_service
from yurtcoord.sim.agentini import ini_text
from yurtcoord.testing.twistd import TWISTD, child_environment, write_ini

CLUSTER = "    server: https://127.0.0.1:6443\n"
USER = "    token: t0ken\n"


def kubeconfig_text(cluster=CLUSTER, user=USER):
    return ("apiVersion: v1\nkind: Config\ncurrent-context: pool\n"
            "contexts:\n- name: pool\n  context: {cluster: c1, user: u1}\n"
            f"clusters:\n- name: c1\n  cluster:\n{cluster}"
            f"users:\n- name: u1\n  user:\n{user}")


EXEC = ("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
        "      command: get-token\n      interactiveMode: Never\n")
AUTH_PROVIDER = "    auth-provider:\n      name: oidc\n      config: {id-token: abc}\n"


def write_kubeconfig(test, text):
    """``text`` as a kubeconfig file in a fresh directory of ``test``; its path."""
    directory = os.path.abspath(test.mktemp())
    os.makedirs(directory)
    path = os.path.join(directory, "kubeconfig")
    with open(path, "w") as f:
        f.write(text)
    return path


def agent_ini(kubeconfig):
    return ini_text({"node": {"name": "edge-1"},
                     "cloud": {"servers": "https://127.0.0.1:6443", "kubeconfig": kubeconfig},
                     "coordinator": {"enabled": "false"}})


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
    def test_twistd_exits_78_with_one_line(self):
        kubeconfig = self.kubeconfig(kubeconfig_text(user=AUTH_PROVIDER))
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
        self.assertTrue(lines[0].startswith(f"{ini}: [cloud]: cannot build the clients: "
                                            f"{kubeconfig}: users[name=u1].user.auth-provider"),
                        lines[0])
        self.assertNotIn("abc", lines[0])
