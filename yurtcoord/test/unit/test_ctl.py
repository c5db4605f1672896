"""``yurtcoordctl``'s tables: the ``/pool`` and ``/status`` documents of an agent
formatted like kubectl's, whatever the values, and a document of the wrong shape
refused as a bad answer."""

import importlib.metadata
import io
import json
import re
import sys

from twisted.trial import unittest

from yurtcoord.agent import ctl, ctlread
from yurtcoord.testing.agentdocuments import POOL, STATUS


class TableTests(unittest.TestCase):
    def test_members_are_aligned_like_kubectl(self):
        self.assertEqual(ctl.format_members(POOL), (
            "NODE               HEARTBEAT   LEASE-AGE   CLOUD-LEASE   POOL-LEASE   LEADER   "
            "ETCD-MEMBER             COORDINATOR-SERVER      UPLOAD\n"
            "edge-1             direct      1.2s        1.2s          0.7s         false    "
            "https://10.0.0.1:2379   https://10.0.0.1:6443   uploaded (12)\n"
            "edge-2             delegated   3.0s        3.0s          2.5s         true     "
            "https://10.0.0.2:2379   https://10.0.0.1:6443   <none>\n"
            "edge-long-name-3   stale       2m5s        2m5s          <none>       false    "
            "<none>                  <none>                  <none>\n"))

    def test_leader_and_changes(self):
        self.assertEqual(ctl.format_leader(POOL), (
            "LEADER   LEASE-HOLDER   LEASE-AGE   LEASE-DURATION   EXPIRED\n"
            "edge-2   edge-2         0.4s        15               false\n"
            "\n"
            "CHANGED                NEW-LEADER\n"
            "2026-12-01T20:00:00Z   edge-1\n"
            "2026-12-01T20:05:00Z   edge-2\n"))

    def test_cache(self):
        self.assertEqual(ctl.format_cache(POOL), (
            "SYNCED   INFORMER-SYNC-AGE   INFORMER-SYNC-HOLDER\n"
            "true     0.8s                edge-2\n"
            "\n"
            "RESOURCE                          OBJECTS\n"
            "endpoints                         3\n"
            "endpointslices.discovery.k8s.io   <none>\n"))

    def test_status(self):
        self.assertEqual(ctl.format_status(STATUS), (
            "NODE     POOL     ROLE       LEADER   HEALTHY   READY   SYNCED   UPLOADED   "
            "CLOUD   COORDINATOR   SINCE                  CAUSE\n"
            "edge-1   pool-a   follower   <none>   true      false   true     false      "
            "1/2     true          2026-12-01T20:00:00Z   <none>\n"))

    def test_a_dead_kubelet_is_the_cause_and_no_server_is_unhealthy(self):
        status = dict(STATUS, role="pending", healthy=False, leader="edge-2",
                      cloud={"https://a:6443": None, "https://b:6443": None},
                      coordinator_healthy=None,
                      servers_not_probed="not probed: kubelet dead for 42s",
                      cause={"kind": "kubelet_dead", "text": "kubelet dead for 42s"})
        self.assertEqual(ctl.format_status(status), (
            "NODE     POOL     ROLE      LEADER   HEALTHY   READY   SYNCED   UPLOADED   "
            "CLOUD        COORDINATOR   SINCE                  CAUSE\n"
            "edge-1   pool-a   pending   edge-2   false     false   true     false      "
            "not-probed   not-probed    2026-12-01T20:00:00Z   kubelet dead for 42s\n"))

    def test_values_cannot_break_the_layout(self):
        text = ctl.table(["a", "b"], [["x\ny\tz", ""], [None, 2.50]])
        self.assertEqual(text, 'A        B\nx y z    ""\n<none>   2.5\n')

    def test_ages(self):
        self.assertEqual([ctl.age(v) for v in (0, 59.94, 60, 3599, 3600, 7322, None, "x", True)],
                         ["0.0s", "59.9s", "1m0s", "59m59s", "1h0m", "2h2m", "<none>",
                          "<none>", "<none>"])

    def test_no_members(self):
        self.assertEqual(ctl.format_members(dict(POOL, members=[])), "No members found.\n")

    def test_a_document_of_the_wrong_shape_is_a_bad_answer(self):
        for document, render in ((dict(POOL, members={"a": 1}), ctl.format_members),
                                 (dict(POOL, members=[1]), ctl.format_members),
                                 (dict(POOL, election=None), ctl.format_leader),
                                 (dict(POOL, cache={"resources": []}), ctl.format_cache)):
            with self.assertRaises(ctl.CtlError) as caught:
                render(document)
            self.assertIn("bad answer", str(caught.exception))


class ServerFlagTests(unittest.TestCase):
    """Only ``http`` and ``https`` agents: anything else is bad usage (exit 2, one line
    naming ``--server`` and the value), refused before anything is read."""

    def setUp(self):
        def no_read(url, deadline):
            raise AssertionError(f"read {url} although --server was refused")
        self.patch(ctlread, "read_answer", no_read)

    def test_other_schemes_and_malformed_urls_are_bad_usage(self):
        for value, why in (
                ("file:///etc/passwd", "not an http or https URL"),
                ("ftp://127.0.0.1:21/", "not an http or https URL"),
                ("gopher://agent:70", "not an http or https URL"),
                ("http://", "no host"),
                ("127.0.0.1:http", "not a valid port"),
                ("admin:S3cret@127.0.0.1:10267", "credentials in the URL"),
                ("http://admin:S3cret@127.0.0.1:10267", "credentials in the URL"),
                ("http://127.0.0.1:10267/?x=1", "no query or fragment"),
                ("http://127.0.0.1:99999", "not a valid port"),
                ("http://127.0.0.1:1/ HTTP/1.1\r\nX: y", "not a URL"),
                ("http://agent\x1b[2J/", "not a URL")):
            out, err = io.StringIO(), io.StringIO()
            code = ctl.run(["members", "--server", value], out, err)
            self.assertEqual((code, out.getvalue()), (ctl.BAD_USAGE, ""), value)
            line = err.getvalue()
            self.assertTrue(line.startswith("yurtcoordctl: --server '"), line)
            self.assertIn(why, line)
            self.assertEqual(line.count("\n"), 1, line)
            self.assertNotIn("\x1b", line)

    def test_http_and_https_are_read(self):
        asked = []

        def read(url, deadline):
            asked.append(url)
            return json.dumps(POOL).encode()
        self.patch(ctlread, "read_answer", read)
        for value in ("http://127.0.0.1:10267/", "HTTPS://[::1]:10267", "http://agent/x/"):
            self.assertEqual(ctl.run(["members", "--server", value], io.StringIO(),
                                     io.StringIO()), 0)
        self.assertEqual(asked, ["http://127.0.0.1:10267/pool", "HTTPS://[::1]:10267/pool",
                                 "http://agent/x/pool"])

    def test_a_bare_host_and_port_is_an_http_server(self):
        """The address of ``[server] listen`` or a log line, pasted as it is."""
        asked = []

        def read(url, deadline):
            asked.append(url)
            return json.dumps(STATUS).encode()
        self.patch(ctlread, "read_answer", read)
        for value in ("127.0.0.1:10267", "[::1]:10267", "edge-1.pool-a:10267/", "agent"):
            out, err = io.StringIO(), io.StringIO()
            code = ctl.run(["status", "--server", value], out, err)
            # STATUS is of an agent that is not ready.
            self.assertEqual((code, err.getvalue()), (ctl.NOT_READY, ""), value)
        self.assertEqual(asked, ["http://127.0.0.1:10267/status", "http://[::1]:10267/status",
                                 "http://edge-1.pool-a:10267/status", "http://agent/status"])

    def test_timeouts_that_are_no_deadline_are_bad_usage(self):
        for value in ("0", "-1", "nan", "inf", "1e300"):
            err = io.StringIO()
            code = ctl.run(["members", "--server", "http://127.0.0.1:1", "--timeout", value],
                           io.StringIO(), err)
            self.assertEqual((code, err.getvalue()),
                             (ctl.BAD_USAGE, "yurtcoordctl: --timeout must be a positive "
                                             "number of seconds, at most 86400\n"), value)

    def test_help_names_the_deadline_and_the_exit_statuses(self):
        text = ctl.parser().format_help()
        self.assertIn("one deadline for the whole exchange", text)
        for line in ("0  the agent answered and is ready", "1  the agent answered and is not",
                     "2  bad usage", "3  the agent is unreachable"):
            self.assertIn(line, text)


class DecodeTests(unittest.TestCase):
    """An answer that is not the JSON object expected is one line, exit 3, never a
    traceback: the tool must say what is wrong with whatever answers at the address."""

    URL = "http://127.0.0.1:10267/pool"

    def assertBadAnswer(self, body, why):
        with self.assertRaises(ctl.CtlError) as caught:
            ctlread.decode(body, self.URL)
        message = str(caught.exception)
        self.assertEqual(caught.exception.status, ctl.UNREACHABLE)
        self.assertTrue(message.startswith(f"bad answer from {self.URL}: {why}"), message)
        self.assertNotIn("\n", message)
        self.assertLess(len(message), 400)

    def test_nested_too_deep(self):
        self.assertBadAnswer(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                             "nested deeper than 32")
        self.assertBadAnswer(b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper than 32")
        deep_enough = b'{"a": ' + b"[" * 31 + b"]" * 31 + b"}"
        self.assertIn("a", ctlread.decode(deep_enough, self.URL))

    def test_non_finite_numbers(self):
        for number in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"):
            self.assertBadAnswer(b'{"ready": true, "lease_age": ' + number + b"}", "not JSON")

    def test_not_utf8(self):
        self.assertBadAnswer(b'{"node": "\xff\xfe"}', "not UTF-8")
        self.assertBadAnswer('{"node": "x"}'.encode("utf-16"), "not UTF-8")

    def test_not_json_and_not_an_object(self):
        self.assertBadAnswer(b"<html>", "not JSON")
        self.assertBadAnswer(b'{"a": ' + b"9" * 5000 + b"}", "not JSON")
        self.assertBadAnswer(b"[1, 2]", "not a JSON object")
        self.assertBadAnswer(b'"ready"', "not a JSON object")

    def test_too_large(self):
        self.patch(ctlread, "MAX_ANSWER_BYTES", 100)
        self.assertBadAnswer(b'{"a": "' + b"x" * 200 + b'"}', "larger than 100 bytes")


class HostileAnswerTests(unittest.TestCase):
    """Whole command lines against in-memory answers: exit statuses and what reaches
    stdout and stderr, in every output mode."""

    def answer(self, body):
        self.patch(ctlread, "read_answer", lambda url, deadline: body)

    def ctl(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        code = ctl.run([*argv, "--server", "http://127.0.0.1:10267"], out, err)
        return code, out.getvalue(), err.getvalue()

    def test_decode_errors_are_one_line_exit_3(self):
        for body in (b"[" * 100_000, b'{"ready": NaN}', b'{"members": [{"lease_age": 1e999}]}',
                     b"\xff", b"[]", b"", b'{"members": 7}', b'{"election": "x"}',
                     b'{"cache": {"resources": 1}}'):
            self.answer(body)
            for command in ("status", "members", "leader", "cache"):
                code, out, err = self.ctl(command)
                if code == ctl.NOT_READY:  # a document this command shows
                    continue
                self.assertEqual((code, out), (ctl.UNREACHABLE, ""), (body[:20], command))
                self.assertRegex(err, r"^yurtcoordctl: bad answer[^\n]*\n$")

    def test_escape_sequences_are_escaped_in_tables_and_warnings(self):
        hostile = "edge-1\x1b]0;owned\x07\x1b[2J\r\u202eevil\x9b31m\ud800"
        self.answer(json.dumps(dict(
            POOL, members=[dict(POOL["members"][0], node=hostile)],
            leader=hostile, election=dict(POOL["election"], holder=hostile),
            leader_changes=[{"time": hostile, "leader": hostile}],
            cache=dict(POOL["cache"], resources={hostile: 1}),
            errors={hostile: hostile})).encode())
        for command in ("members", "leader", "cache"):
            code, out, err = self.ctl(command)
            self.assertEqual(code, 0, err)
            for text in (out, err):
                self.assertIn("edge-1\\x1b]0;owned\\x07\\x1b[2J", text)
                self.assertIn("\\u202eevil\\x9b31m\\ud800", text)
                self.assertIsNone(re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e\ud800]",
                                            text), ascii(text))
                text.encode("utf-8")  # writable to a UTF-8 terminal
            self.assertEqual(err.count("\n"), 1)

    def test_escape_sequences_are_escaped_in_json(self):
        self.answer(json.dumps({"ready": True, "node": "a\x1b[2J\u202e\ud800"},
                               ensure_ascii=False).encode("utf-8", "surrogatepass")
                    .replace(b"\xed\xa0\x80", b"\\ud800"))
        code, out, err = self.ctl("status", "-o", "json")
        self.assertEqual((code, err), (0, ""))
        self.assertIsNone(re.search("[^\n\x20-\x7e]", out), ascii(out))
        self.assertEqual(json.loads(out)["node"], "a\x1b[2J\u202e\ud800")

    def test_an_error_line_from_the_server_is_escaped(self):
        def read(url, deadline):
            raise ctl.CtlError(f"bad answer from {url}: HTTP 500 oops\x1b[2J\r\nforged")
        self.patch(ctlread, "read_answer", read)
        code, out, err = self.ctl("members")
        self.assertEqual((code, out), (ctl.UNREACHABLE, ""))
        self.assertEqual(err, "yurtcoordctl: bad answer from http://127.0.0.1:10267/pool: "
                              "HTTP 500 oops\\x1b[2J\\x0d\\x0aforged\n")

    def test_ages_that_are_not_finite_numbers(self):
        self.assertEqual([ctl.age(v) for v in (float("inf"), float("-inf"), float("nan"))],
                         ["<none>"] * 3)

    def test_printable_keeps_text(self):
        self.assertEqual(ctl.printable("edge-1 knoten-ä 節点 ✓"), "edge-1 knoten-ä 節点 ✓")
        self.assertEqual(ctl.printable("a\tb\nc\x7f\u200b"), "a\\x09b\\x0ac\\x7f\\u200b")


class CommandLineTests(unittest.TestCase):
    """The common options before or after the command, the top-level help showing
    them, ``--version``, and argparse's usage errors as one line with exit 2: nothing
    is read from an agent (``read_answer`` answers from memory) and nothing is
    written to the process's own stdout or stderr."""

    def setUp(self):
        self.asked = []

        def read(url, deadline):
            self.asked.append((url, deadline.seconds))
            return json.dumps(POOL if url.endswith("/pool") else STATUS).encode()
        self.patch(ctlread, "read_answer", read)
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.patch(sys, "stdout", self.stdout)
        self.patch(sys, "stderr", self.stderr)

    def tearDown(self):
        self.assertEqual((self.stdout.getvalue(), self.stderr.getvalue()), ("", ""))

    def run_ctl(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        return ctl.run(list(argv), out, err), out.getvalue(), err.getvalue()

    def test_common_options_before_the_command(self):
        code, out, err = self.run_ctl("--server", "http://agent:1", "-o", "json",
                                      "--timeout", "3", "members")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out), POOL)
        self.assertEqual(self.asked, [("http://agent:1/pool", 3.0)])

    def test_common_options_after_the_command(self):
        code, out, err = self.run_ctl("leader", "--server", "agent:2", "--output", "json",
                                      "--timeout", "4")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(json.loads(out), POOL)
        self.assertEqual(self.asked, [("http://agent:2/pool", 4.0)])

    def test_an_option_after_the_command_overrides_the_same_one_before_it(self):
        code, out, _err = self.run_ctl("--server", "agent:1", "--timeout", "5", "-o", "json",
                                       "status", "--server", "agent:2")
        self.assertEqual(code, ctl.NOT_READY)
        self.assertEqual(json.loads(out), STATUS)
        self.assertEqual(self.asked, [("http://agent:2/status", 5.0)])

    def test_defaults_when_no_option_is_given(self):
        self.patch(ctl, "server_url", lambda server, config: f"http://{server}|{config}")
        code, out, _err = self.run_ctl("status")
        self.assertEqual(code, ctl.NOT_READY)
        self.assertIn("NODE", out)
        self.assertEqual(self.asked, [("http://None|None/status", ctl.DEFAULT_TIMEOUT)])

    def test_the_top_level_help_shows_the_common_options(self):
        code, out, err = self.run_ctl("--help")
        self.assertEqual((code, err), (0, ""))
        self.assertTrue(out.startswith("usage: yurtcoordctl [options] COMMAND [options]"), out)
        # argparse shows "-o {table,json}, --output {table,json}" before Python 3.13
        # and "-o, --output {table,json}" from it on.
        for option in ("--server URL", "host:port", "--config PATH", "  -o", "--output",
                       "{table,json}", "--timeout SECONDS", "--version", "status", "members",
                       "leader", "cache", "exit status:"):
            self.assertIn(option, out)

    def test_a_commands_help_shows_them_too(self):
        code, out, err = self.run_ctl("members", "--help")
        self.assertEqual((code, err), (0, ""))
        self.assertTrue(out.startswith("usage: yurtcoordctl [options] members [options]"), out)
        for option in ("--server URL", "--config PATH", "--timeout SECONDS", "exit status:"):
            self.assertIn(option, out)
        self.assertEqual(self.asked, [])

    def test_version_is_the_installed_packages(self):
        self.patch(importlib.metadata, "version",
                   lambda name: "7.8.9" if name == "yurtcoord" else "?")
        for argv in (["--version"], ["status", "--version"], ["--server", "x:1", "--version"]):
            self.assertEqual(self.run_ctl(*argv), (0, "yurtcoordctl (yurtcoord) 7.8.9\n", ""),
                             argv)
        self.assertEqual(self.asked, [])

    def test_usage_errors_are_one_line_and_exit_2(self):
        for argv, why in (
                ([], "the following arguments are required: COMMAND"),
                (["nodes"], "invalid choice: 'nodes'"),
                (["--server", "agent:1", "nodes"], "invalid choice: 'nodes'"),
                (["status", "-o", "yaml"], "invalid choice: 'yaml'"),
                (["--timeout", "soon", "status"], "invalid float value: 'soon'"),
                (["status", "extra"], "unrecognized arguments: extra"),
                (["--bogus", "members"], "unrecognized arguments: --bogus"),
                (["members", "--server"], "argument --server: expected one argument"),
                (["status", "--server", "agent:1", "\x1b[2J"], "unrecognized arguments")):
            code, out, err = self.run_ctl(*argv)
            self.assertEqual((code, out), (ctl.BAD_USAGE, ""), argv)
            self.assertTrue(err.startswith("yurtcoordctl: "), err)
            self.assertIn(why, err)
            self.assertTrue(err.endswith(" (see yurtcoordctl --help)\n"), err)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertNotIn("usage:", err)
            self.assertNotIn("\x1b", err)
        self.assertEqual(self.asked, [])
