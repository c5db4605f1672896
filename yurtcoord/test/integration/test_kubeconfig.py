"""An agent given a kubeconfig with a field the client does not implement (an exec
plugin, an auth provider) fails to build with a configuration error of its cloud
section, and ``twistd`` run on it exits with status 78 and one line."""

import os

from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest

from yurtcoord.agent.config import ConfigError, parse_config
from yurtcoord.agent.service import make_service
from yurtcoord.sim.agentini import ini_text
from yurtcoord.testing.kubeconfigs import (
    AUTH_PROVIDER, EXEC, USER, kubeconfig_text, write_kubeconfig,
)
from yurtcoord.testing.twistd import TWISTD, child_environment, write_ini


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
