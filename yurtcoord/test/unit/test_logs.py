"""The agent's log: ``[log] level`` drops every event below it, Twisted's own lines
included; ``[log] format = json`` writes one JSON object per line; the status pages'
access log is at debug and bounded per second; and ``twistd yurtcoord`` hands twistd
an observer built from the ini and twistd's own options, as twistd asks for it.

twistd alone writes every event, debug included: one local client with long paths
could make an agent write tens of megabytes of access log in seconds."""

import io
import json
import os
import signal

from twisted.application import service
from twisted.internet import protocol
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.logger import (
    ILogObserver, LogLevel, Logger, globalLogPublisher, formatEvent,
)
from twisted.python import log as legacy_log
from twisted.python.logfile import LogFile
from twisted.scripts.twistd import ServerOptions
from twisted.trial import unittest

from yurtcoord.agent.metrics import Metrics
from yurtcoord.agent.status import StatusSite
from yurtcoord.agent.statuspages import status_resource
from yurtcoord.agent.statussources import InitialStatus
from yurtcoord.sim.agentini import ini_text
from yurtcoord.tx.logs import (
    ACCESS_LOG_LINES_PER_SECOND, ACCESS_LOG_PATH_CHARS, FACTORY_LINE_FORMATS, LEVELS,
    file_observer, level_filter,
)

ALL_LEVELS = (LogLevel.debug, LogLevel.info, LogLevel.warn, LogLevel.error,
              LogLevel.critical)


class Collected:
    """An observer keeping every event it is given."""

    def __init__(self):
        self.events = []

    def __call__(self, event):
        self.events.append(event)

    def texts(self):
        return [formatEvent(event) for event in self.events]


class LevelFilterTests(unittest.TestCase):
    """Events below ``[log] level`` are dropped, whoever logs them."""

    def test_events_below_the_level_are_dropped_and_the_others_kept(self):
        for name, level in LEVELS.items():
            with self.subTest(level=name):
                kept = Collected()
                log = Logger(namespace="yurtcoord.test", observer=level_filter(kept, name))
                for event_level in ALL_LEVELS:
                    log.emit(event_level, "at {what}", what=event_level.name)
                self.assertEqual([event["log_level"] for event in kept.events],
                                 [lvl for lvl in ALL_LEVELS if lvl >= level])

    def test_twisteds_own_lines_are_filtered_too(self):
        """A noisy factory's start and stop lines (one pair per outgoing connection)
        and legacy ``log.msg`` lines go through the global log like the agent's."""
        seen, kept = Collected(), Collected()
        filtered = level_filter(kept, "warn")
        for observer in (seen, filtered):
            globalLogPublisher.addObserver(observer)
            self.addCleanup(globalLogPublisher.removeObserver, observer)

        factory = protocol.Factory()
        factory.noisy = True
        factory.doStart()
        factory.doStop()
        legacy_log.msg("HTTPChannel,7,127.0.0.1: a per-connection line")
        Logger(namespace="twisted.web.server").debug("a web server debug line")

        everything = "\n".join(seen.texts())
        self.assertIn("Starting factory", everything)
        self.assertIn("a per-connection line", everything)
        self.assertIn("a web server debug line", everything)
        self.assertEqual(kept.texts(), [])

    def test_twisteds_factory_lines_are_debug(self):
        """The events Twisted's ``Factory.doStart``/``doStop`` emit for a noisy
        factory (a client factory: once per connection) are not written at info, and
        are at debug; the lines around them are kept at info."""
        at_info, at_debug = Collected(), Collected()
        for observer in (level_filter(at_info, "info"), level_filter(at_debug, "debug")):
            globalLogPublisher.addObserver(observer)
            self.addCleanup(globalLogPublisher.removeObserver, observer)

        Logger(namespace="yurtcoord.heartbeat.probes").info("before the probe")
        for factory in (protocol.Factory(), protocol.ClientFactory()):
            self.assertTrue(factory.noisy)
            factory.doStart()
            factory.doStop()
        Logger(namespace="yurtcoord.heartbeat.probes").info("after the probe")

        self.assertEqual(at_info.texts(), ["before the probe", "after the probe"])
        factory_lines = [text for text in at_debug.texts() if " factory " in text]
        self.assertEqual([line.split(" <")[0] for line in factory_lines],
                         ["Starting factory", "Stopping factory"] * 2)
        self.assertEqual({event["log_format"] for event in at_debug.events
                          if "factory" in event}, FACTORY_LINE_FORMATS)

    def test_an_error_of_twisted_passes_the_filter(self):
        kept = Collected()
        filtered = level_filter(kept, "error")
        globalLogPublisher.addObserver(filtered)
        self.addCleanup(globalLogPublisher.removeObserver, filtered)
        legacy_log.err(ValueError("boom"), "an unexpected error")
        self.flushLoggedErrors(ValueError)
        self.assertTrue(any("an unexpected error" in text for text in kept.texts()))


class JSONFormatTests(unittest.TestCase):
    """``format = json``: one JSON object per line, nothing else."""

    def test_each_event_is_one_json_object_on_its_own_line(self):
        out = io.StringIO()
        log = Logger(namespace="yurtcoord.agent.service.Agent",
                     observer=level_filter(file_observer(out, "json"), "info"))
        log.debug("not written")
        log.info("agent {node} of pool {pool} starting", node="edge-1", pool="pool-a")
        log.warn("two\nlines in one message")
        try:
            raise RuntimeError("broken")
        except RuntimeError:
            log.failure("a step failed")

        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 3, out.getvalue())
        objects = [json.loads(line) for line in lines]
        self.assertTrue(all(isinstance(obj, dict) for obj in objects))
        first = objects[0]
        self.assertEqual(first["level"], "info")
        self.assertEqual(first["namespace"], "yurtcoord.agent.service.Agent")
        self.assertEqual(first["text"], "agent edge-1 of pool pool-a starting")
        self.assertEqual((first["node"], first["pool"]), ("edge-1", "pool-a"))
        self.assertRegex(first["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")
        self.assertEqual(objects[1]["text"], "two\nlines in one message")
        self.assertEqual(objects[2]["level"], "critical")
        self.assertIn("RuntimeError: broken", objects[2]["text"])

    def test_lines_are_strict_json_with_the_fields_pipelines_read(self):
        """Every line parses with a strict parser (no ``NaN``/``Infinity``), carries
        ``time``, ``level``, ``namespace`` and ``text`` first, then the event's plain
        fields, legacy ``log.msg`` events included; objects are in the text only."""
        out = io.StringIO()
        observer = file_observer(out, "json")
        log = Logger(namespace="yurtcoord.agent.metrics", observer=observer)
        log.warn("reactor lag {lag} over {limit}", lag=float("nan"), limit=float("inf"),
                 node="edge-1", loops=3, healthy=False, why=None, servers=["a", "b"])
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        legacy_log.msg("StatusSite starting on 10267")

        def strict(constant):
            raise ValueError(f"not JSON: {constant}")

        lines = [json.loads(line, parse_constant=strict) for line in out.getvalue().splitlines()]
        self.assertEqual(len(lines), 2, out.getvalue())
        first, legacy = lines
        self.assertEqual(list(first)[:4], ["time", "level", "namespace", "text"])
        self.assertEqual(
            {key: first[key] for key in list(first)[1:]},
            {"level": "warn", "namespace": "yurtcoord.agent.metrics",
             "text": "reactor lag nan over inf", "lag": "nan", "limit": "inf",
             "node": "edge-1", "loops": 3, "healthy": False, "why": None})
        self.assertEqual(list(legacy)[:4], ["time", "level", "namespace", "text"])
        self.assertEqual((legacy["level"], legacy["text"]),
                         ("info", "StatusSite starting on 10267"))

    def test_text_is_twistds_own_line_format(self):
        out = io.StringIO()
        Logger(namespace="yurtcoord.x", observer=file_observer(out, "text")).info("hello")
        self.assertRegex(out.getvalue(), r"^\S+ \[yurtcoord\.x#info\] hello\n$")


class Request:
    """What the access log reads of a request."""

    def __init__(self, path=b"/healthz"):
        self.method = b"GET"
        self.uri = path
        self.code = 200

    def getClientAddress(self):
        return IPv4Address("TCP", "127.0.0.1", 40000)


class AccessLogBoundTests(unittest.TestCase):
    """The status pages' access log: debug, at most
    ``ACCESS_LOG_LINES_PER_SECOND`` lines a second, then one line with the count."""

    def setUp(self):
        self.clock = Clock()
        self.site = StatusSite(
            status_resource(InitialStatus("edge-1", "pool-a", ()), Metrics("edge-1", "pool-a")),
            self.clock)
        self.lines = Collected()
        self.site.logger = Logger(namespace="yurtcoord.agent.status", observer=self.lines)

    def access_lines(self):
        return [text for text in self.lines.texts() if text.startswith("status request ")]

    def dropped_lines(self):
        return [text for text in self.lines.texts() if "lines dropped" in text]

    def test_a_flood_writes_the_bound_then_one_line_with_the_count(self):
        for _ in range(1000):
            self.site.log(Request())
            self.clock.advance(0.0005)
        self.assertEqual(len(self.access_lines()), ACCESS_LOG_LINES_PER_SECOND)
        self.assertEqual(self.dropped_lines(), [])
        self.clock.advance(1)
        self.assertEqual(self.dropped_lines(), [
            f"status access log: {1000 - ACCESS_LOG_LINES_PER_SECOND} lines dropped in the "
            f"last second (at most {ACCESS_LOG_LINES_PER_SECOND} a second)"])
        self.assertTrue(all(event["log_level"] == LogLevel.debug
                            for event in self.lines.events))
        # The next second has its own budget.
        self.site.log(Request())
        self.assertEqual(len(self.access_lines()), ACCESS_LOG_LINES_PER_SECOND + 1)

    def test_stopping_reports_what_was_dropped_and_leaves_no_timer(self):
        for _ in range(ACCESS_LOG_LINES_PER_SECOND + 5):
            self.site.log(Request())
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.site.stopFactory()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(self.dropped_lines()), 1)
        self.assertIn("5 lines dropped", self.dropped_lines()[0])

    def test_a_long_path_is_cut(self):
        self.site.log(Request(b"/" + b"x" * 8192))
        (line,) = self.access_lines()
        self.assertLess(len(line), ACCESS_LOG_PATH_CHARS + 100)
        self.assertIn("(8193 characters)", line)


class TwistdLoggingTests(unittest.TestCase):
    """``twistd yurtcoord`` as twistd builds it: options parsed by twistd's
    ``ServerOptions``, the service made by the plugin and put into an application;
    twistd then logs to that application's ``ILogObserver``."""

    def setUp(self):
        saved = signal.getsignal(signal.SIGUSR1)
        self.addCleanup(signal.signal, signal.SIGUSR1, saved)
        # The log file twistd's observer opens is closed after each test (an agent
        # keeps it until it exits), so that no open file is left to the collector.
        opened = LogFile.fromFullPath

        def closed_after_the_test(path, *args, **kwargs):
            log_file = opened(path, *args, **kwargs)
            self.addCleanup(log_file.close)
            return log_file

        self.patch(LogFile, "fromFullPath", closed_after_the_test)

    def application_observer(self, log_section, *twistd_arguments):
        from twisted.plugins.yurtcoord_plugin import service_maker

        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ini = os.path.join(directory, "yurtcoord.ini")
        self.write(ini, ini_text({
            "node": {"name": "edge-1"},
            "cloud": {"servers": "http://127.0.0.1:9", "insecure": "true"},
            "coordinator": {"enabled": "false"},
            "heartbeat": {"kubelet_healthz_url": "off"},
            "server": {"listen": "127.0.0.1:0"},
            "log": log_section}))
        logfile = os.path.join(directory, "agent.log")
        options = ServerOptions()
        options.parseOptions(["--nodaemon", "--pidfile=", "--logfile", logfile,
                              *twistd_arguments, "yurtcoord", "--config", ini])
        application = service.Application("yurtcoord")
        service_maker.makeService(options.subOptions).setServiceParent(application)
        observer = application.getComponent(ILogObserver, None)
        self.assertIsNotNone(observer)
        return observer, logfile

    def write(self, path, text):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    def read(self, path):
        with open(path, encoding="utf-8") as handle:
            return handle.read()

    def emit_one_of_each(self, observer):
        agent = Logger(namespace="yurtcoord.agent.status.StatusSite", observer=observer)
        agent.debug("status request GET /healthz 503 from 127.0.0.1")
        agent.info("status pages listening on http://127.0.0.1:1")
        agent.warn("a warning")

    def test_info_by_default_in_twistds_text_format_to_its_logfile(self):
        observer, logfile = self.application_observer({})
        self.emit_one_of_each(observer)
        written = self.read(logfile)
        self.assertNotIn("status request", written)
        self.assertIn("[yurtcoord.agent.status.StatusSite#info] status pages listening", written)
        self.assertIn("#warn] a warning", written)

    def test_debug_and_json_as_configured(self):
        observer, logfile = self.application_observer({"level": "debug", "format": "json"})
        self.emit_one_of_each(observer)
        lines = [json.loads(line) for line in self.read(logfile).splitlines()]
        self.assertEqual([line["level"] for line in lines], ["debug", "info", "warn"])

    def test_error_drops_warnings(self):
        observer, logfile = self.application_observer({"level": "error"})
        self.emit_one_of_each(observer)
        self.assertEqual(self.read(logfile), "")
