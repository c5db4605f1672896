"""``yurtcoordctl``'s answers and exit statuses against a local HTTP server that
answers what each test wants (good documents, errors, garbage, nothing, a byte at a
time), its console script, and that it never goes through a proxy. Loopback only.
The CLI is synchronous: each run happens in a thread (or a child process) while the
reactor serves."""

import io
import json
import os
import subprocess
import sys
import time

from twisted.internet import defer, protocol, reactor, task, threads, utils
from twisted.trial import unittest
from twisted.web import resource, server

from yurtcoord.agent import ctl, ctlread
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

    async def test_unreadable_answers_are_one_line_exit_3(self):
        for body in (b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                     json.dumps(dict(STATUS, last_transition=[[[[]]]])).encode()
                     .replace(b"[[[[]]]]", b"[" * 40 + b"]" * 40),
                     json.dumps(POOL).encode().replace(b"125.0", b"Infinity"),
                     json.dumps(POOL).encode().replace(b"125.0", b"1e999"),
                     json.dumps(POOL).encode().replace(b"125.0", b"NaN"),
                     json.dumps(POOL).encode().replace(b"edge-1", b"edge-\xff"),
                     b"[]"):
            self.answers.answers["/pool"] = (200, body)
            self.answers.answers["/status"] = (200, body)
            for command in ("members", "status"):
                code, out, err = await self.ctl(command, "--server", self.base)
                self.assertEqual((code, out), (ctl.UNREACHABLE, ""), (command, body[:40]))
                self.assertRegex(err, rf"^yurtcoordctl: bad answer from {self.base}/"
                                      rf"(pool|status): [^\n]*\n$")

    async def test_escape_sequences_from_the_agent_are_shown_escaped(self):
        hostile = "edge-9\x1b]0;owned\x07\x1b[2J\u202e"
        self.answers.answers["/pool"] = (200, json.dumps(dict(
            POOL, members=[dict(POOL["members"][0], node=hostile)],
            errors={"cloud nodes": hostile})).encode())
        for output in ("table", "json"):
            code, out, err = await self.ctl("members", "--server", self.base, "-o", output)
            self.assertEqual(code, 0, err)
            self.assertIn("edge-9", out)
            self.assertNotRegex(out + err, "[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")
        self.answers.answers["/status"] = (500, b"")
        self.patch(server.Request, "setResponseCode",
                   lambda request, code, message=None: server.http.Request.setResponseCode(
                       request, code, b"Oops\x1b[2J"))
        code, out, err = await self.ctl("status", "--server", self.base)
        self.assertEqual((code, err), (ctl.UNREACHABLE, f"yurtcoordctl: bad answer from "
                                                        f"{self.base}/status: HTTP 500 "
                                                        f"Oops\\x1b[2J\n"))

    async def test_only_http_and_https_servers(self):
        for value in ("file:///etc/hostname", f"ftp://127.0.0.1:{self.base.rsplit(':', 1)[1]}"):
            code, out, err = await self.ctl("status", "--server", value)
            self.assertEqual((code, out, err), (
                ctl.BAD_USAGE, "", f"yurtcoordctl: --server {value!r}: not an http or https "
                                   f"URL\n"))

    async def test_an_answer_too_large_is_a_bad_answer(self):
        self.patch(ctlread, "MAX_ANSWER_BYTES", 100)
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
                                                      "positive number of seconds, at most "
                                                      "86400\n"))

    def test_the_console_script_is_installed(self):
        script = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
        if not os.path.exists(script):
            raise unittest.SkipTest(f"{script} not installed (pip install -e . installs it)")
        done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        for command in ("status", "members", "leader", "cache"):
            self.assertIn(command, done.stdout)


class Trickle(protocol.Protocol):
    """Sends the factory's ``at_once`` bytes as soon as connected, then its ``payload``
    ``chunk`` bytes every ``interval`` seconds, then closes: a slow or hostile server
    whose every single byte comes well within any per-read timeout."""

    def connectionMade(self):
        self.factory.connections.append(self)
        self.transport.write(self.factory.at_once)
        self.sent = 0
        self.loop = task.LoopingCall(self.send_some)
        self.loop.start(self.factory.interval, now=False)

    def send_some(self):
        payload = self.factory.payload
        if self.sent >= len(payload):
            self.loop.stop()
            self.transport.loseConnection()
            return
        self.transport.write(payload[self.sent:self.sent + self.factory.chunk])
        self.sent += self.factory.chunk

    def connectionLost(self, reason=None):
        if self.loop.running:
            self.loop.stop()


class TrickleFactory(protocol.Factory):
    protocol = Trickle

    def __init__(self, at_once=b"", payload=b"", interval=0.1, chunk=1):
        self.at_once, self.payload, self.interval, self.chunk = (at_once, payload, interval,
                                                                 chunk)
        self.connections = []


def http_answer(document, *extra_headers):
    body = json.dumps(document).encode()
    head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json",
            b"Content-Length: %d" % len(body), *extra_headers]
    return b"\r\n".join(head) + b"\r\n\r\n", body


class DeadlineTests(unittest.TestCase):
    """``--timeout`` bounds the whole exchange: a server trickling its status line,
    headers or body a byte at a time (each byte far within the timeout) is given up on
    at the deadline, exit 3, one line; the bound allows 1 s for a loaded machine."""

    TIMEOUT = 1.0

    def serve(self, factory):
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(lambda: [c.transport.abortConnection() for c in factory.connections
                                 if c.transport.connected])
        return port.getHost().port

    async def timed_ctl(self, url, *argv):
        def run():
            out, err = io.StringIO(), io.StringIO()
            started = time.monotonic()
            code = ctl.run(["status", "--server", url, "--timeout", f"{self.TIMEOUT:g}",
                            *argv], out, err)
            return code, out.getvalue(), err.getvalue(), time.monotonic() - started
        return await threads.deferToThread(run)

    async def assertGivenUpAtTheDeadline(self, scheme, factory):
        port = self.serve(factory)
        url = f"{scheme}://127.0.0.1:{port}"
        code, out, err, elapsed = await self.timed_ctl(url)
        self.assertEqual((code, out, err), (
            ctl.UNREACHABLE, "", f"yurtcoordctl: agent unreachable at {url}/status: no answer "
                                 f"within {self.TIMEOUT:g}s\n"))
        self.assertLess(elapsed, self.TIMEOUT + 1.0)
        self.assertGreater(elapsed, self.TIMEOUT * 0.9)

    async def test_headers_trickled_a_byte_at_a_time(self):
        head, body = http_answer(STATUS, *(b"X-Padding-%d: %s" % (i, b"p" * 20)
                                           for i in range(8)))
        await self.assertGivenUpAtTheDeadline(
            "http", TrickleFactory(payload=head + body, interval=0.05))

    async def test_a_body_trickled_a_byte_at_a_time(self):
        head, body = http_answer(STATUS)
        await self.assertGivenUpAtTheDeadline(
            "http", TrickleFactory(at_once=head, payload=body, interval=0.05))

    async def test_a_chunked_body_trickled_a_chunk_at_a_time(self):
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        body = b"1\r\n \r\n" * 400
        await self.assertGivenUpAtTheDeadline(
            "http", TrickleFactory(at_once=head, payload=body, interval=0.05, chunk=6))

    async def test_a_tls_server_that_never_finishes_its_handshake(self):
        await self.assertGivenUpAtTheDeadline(
            "https", TrickleFactory(payload=b"\x16\x03\x01" * 200, interval=0.05))

    async def test_a_fast_server_is_read_whole(self):
        head, body = http_answer(STATUS)
        port = self.serve(TrickleFactory(at_once=head + body))
        code, out, err, _elapsed = await self.timed_ctl(f"http://127.0.0.1:{port}")
        self.assertEqual((code, err), (ctl.NOT_READY, ""))
        self.assertEqual(out, ctl.format_status(STATUS))

    async def test_what_is_not_http_is_a_bad_answer(self):
        for answer, why in (
                (b"SSH-2.0-OpenSSH_9.6\r\n", "not HTTP (BadStatusLine: "),
                (b"HTTP/1.1 200 OK\r\n" + b"x" * 70_000, "not HTTP (LineTooLong: "),
                (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", "cut short after 1 of "
                                                                     "100 bytes"),
                (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{", "not HTTP "
                                                                           "(IncompleteRead")):
            port = self.serve(TrickleFactory(at_once=answer))
            url = f"http://127.0.0.1:{port}"
            code, out, err, _elapsed = await self.timed_ctl(url)
            self.assertEqual((code, out), (ctl.UNREACHABLE, ""), answer[:20])
            self.assertTrue(err.startswith(f"yurtcoordctl: bad answer from {url}/status: {why}"),
                            err)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertLess(len(err), 400)


class Bad502(protocol.Protocol):
    def dataReceived(self, data):
        self.transport.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
        self.transport.loseConnection()


class Recorder(protocol.Factory):
    """A would-be proxy: counts the connections it gets."""

    protocol = Bad502

    def __init__(self):
        self.connections = 0

    def buildProtocol(self, addr):
        self.connections += 1
        return super().buildProtocol(addr)


class NoProxyTests(unittest.TestCase):
    """The agent is read directly, loopback above all: with every proxy variable
    pointing at a recorder, ``yurtcoordctl`` (a child process, so that it reads the
    environment the way an operator's shell gives it) reaches the agent and the
    recorder gets no connection."""

    def setUp(self):
        answers = Answers()
        answers.answers["/pool"] = (200, json.dumps(POOL).encode())
        port = reactor.listenTCP(0, server.Site(answers), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.agent_port = port.getHost().port
        self.recorder = Recorder()
        proxy = reactor.listenTCP(0, self.recorder, interface="127.0.0.1")
        self.addCleanup(proxy.stopListening)
        self.proxy = f"http://127.0.0.1:{proxy.getHost().port}"

    @defer.inlineCallbacks
    def test_proxy_variables_are_not_used_for_loopback(self):
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                     "all_proxy"):
            env[name] = self.proxy
        for host in ("127.0.0.1", "localhost"):
            out, err, code = yield utils.getProcessOutputAndValue(
                sys.executable, ["-m", "yurtcoord.agent.ctl", "members", "--server",
                                 f"http://{host}:{self.agent_port}"], env=env)
            self.assertEqual((code, err.decode()), (0, ""), host)
            self.assertEqual(out.decode(), ctl.format_members(POOL))
        self.assertEqual(self.recorder.connections, 0)
