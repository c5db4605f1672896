"""``yurtcoordctl``'s answers and exit statuses against a local HTTP server that
answers what each test wants (good documents, errors, garbage, nothing), and its
console script. The CLI is synchronous: each run happens in a thread while the
reactor serves."""

import io
import json
import os
import subprocess
import sys

from twisted.internet import reactor, threads
from twisted.trial import unittest
from twisted.web import resource, server

from yurtcoord.agent import ctl
from yurtcoord.testing.agentdocuments import POOL, STATUS
from yurtcoord.testing.world import agent_ini


class Answers(resource.Resource):
    """``answers[path] = (code, body)``; a path answered ``None`` never answers."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.answers = {}
        self.hung = []

    def render_GET(self, request):
        answer = self.answers.get(request.path.decode())
        if answer is None and request.path.decode() in self.answers:
            self.hung.append(request)
            return server.NOT_DONE_YET
        code, body = answer or (404, b"no such page\n")
        request.setResponseCode(code)
        return body


class CommandTests(unittest.TestCase):
    def setUp(self):
        self.answers = Answers()
        self.answers.answers["/pool"] = (200, json.dumps(POOL).encode())
        self.answers.answers["/status"] = (200, json.dumps(STATUS).encode())
        port = reactor.listenTCP(0, server.Site(self.answers), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.base = f"http://127.0.0.1:{port.getHost().port}"

    def tearDown(self):
        for request in self.answers.hung:
            if not request.finished and request.channel is not None:
                request.channel.transport.abortConnection()

    def ctl(self, *argv):
        """Run one command line in a thread; fires with (exit status, stdout, stderr)."""
        def run():
            out, err = io.StringIO(), io.StringIO()
            return ctl.run(list(argv), out, err), out.getvalue(), err.getvalue()
        return threads.deferToThread(run)

    async def test_members_of_a_ready_agent(self):
        code, out, err = await self.ctl("members", "--server", self.base)
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, ctl.format_members(POOL))

    async def test_members_as_json_name_the_servers_each_member_uses(self):
        code, out, err = await self.ctl("members", "--server", self.base, "-o", "json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(
            {m["node"]: (m["etcd_member"], m["coordinator_server"])
             for m in json.loads(out)["members"]},
            {"edge-1": ("https://10.0.0.1:2379", "https://10.0.0.1:6443"),
             "edge-2": ("https://10.0.0.2:2379", "https://10.0.0.1:6443"),
             "edge-long-name-3": (None, None)})

    async def test_json_is_the_document_unchanged(self):
        code, out, err = await self.ctl("leader", "--server", self.base + "/", "-o", "json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out), POOL)

    async def test_not_ready_exits_non_zero_and_still_shows(self):
        code, out, err = await self.ctl("status", "--server", self.base)
        self.assertEqual((code, err), (ctl.NOT_READY, ""))
        self.assertIn("follower", out)

    async def test_read_errors_of_the_agent_are_warnings(self):
        self.answers.answers["/pool"] = (200, json.dumps(dict(
            POOL, errors={"cloud nodes": "ConnectionFailed: no healthy cloud server"})).encode())
        code, out, err = await self.ctl("cache", "--server", self.base)
        self.assertEqual(code, 0)
        self.assertEqual(err, "yurtcoordctl: warning: the agent could not read cloud nodes: "
                              "ConnectionFailed: no healthy cloud server\n")

    async def test_errors_are_one_line(self):
        cases = {
            "/pool": ((404, b"x"), "bad answer from {base}/pool: HTTP 404 Not Found"),
            "/status": ((200, b"<html>"), "bad answer from {base}/status: not JSON"),
        }
        for path, (answer, expected) in cases.items():
            self.answers.answers[path] = answer
        code, _out, err = await self.ctl("members", "--server", self.base)
        self.assertEqual((code, err), (ctl.UNREACHABLE, "yurtcoordctl: " + cases["/pool"][1]
                                       .format(base=self.base) + "\n"))
        code, _out, err = await self.ctl("status", "--server", self.base)
        self.assertEqual(code, ctl.UNREACHABLE)
        self.assertTrue(err.startswith("yurtcoordctl: " + cases["/status"][1].format(
            base=self.base)), err)
        self.assertEqual(err.count("\n"), 1)
        self.answers.answers["/pool"] = (200, b"[1, 2]")
        code, _out, err = await self.ctl("leader", "--server", self.base)
        self.assertEqual((code, err), (ctl.UNREACHABLE, f"yurtcoordctl: bad answer from "
                                                        f"{self.base}/pool: not a JSON object\n"))
        self.answers.answers["/pool"] = (200, json.dumps(dict(POOL, members=7)).encode())
        code, _out, err = await self.ctl("members", "--server", self.base)
        self.assertEqual((code, err), (ctl.UNREACHABLE, "yurtcoordctl: bad answer: field "
                                                        "'members' is not a list of objects\n"))

    async def test_an_answer_too_large_is_a_bad_answer(self):
        self.patch(ctl, "MAX_ANSWER_BYTES", 100)
        code, _out, err = await self.ctl("members", "--server", self.base)
        self.assertEqual((code, err), (ctl.UNREACHABLE, f"yurtcoordctl: bad answer from "
                                                        f"{self.base}/pool: larger than 100 "
                                                        f"bytes\n"))

    async def test_an_agent_that_does_not_answer(self):
        self.answers.answers["/pool"] = None
        code, _out, err = await self.ctl("members", "--server", self.base, "--timeout", "0.5")
        self.assertEqual((code, err), (ctl.UNREACHABLE, f"yurtcoordctl: agent unreachable at "
                                                        f"{self.base}/pool: no answer within "
                                                        f"0.5s\n"))

    async def test_an_agent_that_is_not_there(self):
        port = reactor.listenTCP(0, server.Site(self.answers), interface="127.0.0.1")
        free = port.getHost().port
        await port.stopListening()
        code, _out, err = await self.ctl("members", "--server", f"http://127.0.0.1:{free}")
        self.assertEqual(code, ctl.UNREACHABLE)
        self.assertRegex(err, rf"^yurtcoordctl: agent unreachable at "
                              rf"http://127\.0\.0\.1:{free}/pool: .*refused.*\n$")

    async def test_the_server_is_the_listen_address_of_the_config(self):
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        port = self.base.rsplit(":", 1)[1]
        path = os.path.join(directory, "agent.ini")
        with open(path, "w") as handle:
            handle.write(agent_ini("edge-1", "http://127.0.0.1:1", "http://127.0.0.1:2",
                                   "http://127.0.0.1:3", directory, directory,
                                   f"0.0.0.0:{port}"))
        code, out, err = await self.ctl("members", "--config", path)
        self.assertEqual((code, err), (0, ""))
        self.assertIn("edge-long-name-3", out)
        with open(path) as handle:
            text = handle.read()
        with open(path, "w") as handle:
            handle.write(text.replace(f"0.0.0.0:{port}", "nowhere"))
        code, out, err = await self.ctl("members", "--config", path)
        self.assertEqual((code, out), (ctl.BAD_USAGE, ""))
        self.assertRegex(err, r"^yurtcoordctl: .*agent\.ini.*\[server\] listen.*nowhere.*\n$")

    async def test_bad_usage(self):
        code, out, err = await self.ctl("nodes")
        self.assertEqual(code, ctl.BAD_USAGE)
        code, out, err = await self.ctl("members", "--server", self.base, "--timeout", "0")
        self.assertEqual((code, err), (ctl.BAD_USAGE, "yurtcoordctl: --timeout must be a "
                                                      "positive number of seconds\n"))

    def test_the_console_script_is_installed(self):
        script = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
        if not os.path.exists(script):
            raise unittest.SkipTest(f"{script} not installed (pip install -e . installs it)")
        done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        for command in ("status", "members", "leader", "cache"):
            self.assertIn(command, done.stdout)
