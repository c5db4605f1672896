"""The agent's log under ``twistd``: a level below which events are dropped, text or
JSON lines, and a bound on lines a remote can make the agent write.

twistd writes every event it is given, debug included, and so do Twisted's own parts;
an agent on a small edge disk must not write what its operator did not ask for. The
observer ``twistd_log_observer`` builds writes where twistd itself would (the file of
``--logfile``, stdout with ``--nodaemon``, syslog with ``--syslog``) and drops every
event below ``[log] level``, whoever logged it: the agent, Twisted's reactor, factories
and web server, or ``print``s and legacy ``log.msg`` calls twistd turns into events.

Twisted logs "Starting factory" and "Stopping factory" at info for every factory it
starts and stops (``Factory.noisy``): a client factory starts and stops once per
connection, so every kubelet probe or request of a client left noisy made two lines.
The agent's own clients are quiet (``QuietHTTPConnectionPool``); what is left, from a
client of a dependency or one added later, is filtered as debug (``shown_level``).

A json line is one object, as log pipelines (Loki, Elasticsearch, fluent-bit) read
them: ``time``, ``level``, ``namespace``, ``text``, then the event's own fields of plain
values; strict JSON, so a non-finite float field is written as a string.

Lines caused by remote clients (the status pages' access log) are also bounded in
number: ``LinesPerSecond`` lets ``limit`` of them through in any second and then
reports once how many it dropped, so a client sending requests as fast as it can
costs a bounded amount of log at every level.
"""

import json
import math
import signal
import sys
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import IO, Any, Optional, cast

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import (
    FileLogObserver, FilteringLogObserver, ILogFilterPredicate, ILogObserver,
    LegacyLogObserverWrapper,
    LogEvent, LogLevel, PredicateResult, eventAsText, textFileLogObserver,
)
from twisted.python.logfile import LogFile
from zope.interface import implementer

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn,
          "error": LogLevel.error}
FORMATS = ("text", "json")
# Access log lines written per second at most; past it, one line says how many were
# dropped. The pool page polls twice every 2 s, so a browser or two never reach it.
ACCESS_LOG_LINES_PER_SECOND = 20
# Characters of a request path an access log line shows; a longer path is cut there.
ACCESS_LOG_PATH_CHARS = 200


# The message formats of the lines ``twisted.internet.protocol.Factory`` logs at info
# when a factory starts and stops (``doStart``/``doStop`` of a ``noisy`` factory).
FACTORY_LINE_FORMATS = frozenset({"Starting factory {factory!r}",
                                  "Stopping factory {factory!r}"})


def shown_level(event: LogEvent) -> Optional[LogLevel]:
    """The level ``event`` is filtered at: its own, except Twisted's factory start and
    stop lines, which are debug (they say a connection was made, once per connection,
    which is nothing an operator acts on)."""
    level = event.get("log_level")
    if level is not None and level > LogLevel.debug \
            and event.get("log_format") in FACTORY_LINE_FORMATS:
        return LogLevel.debug
    return level


@implementer(ILogFilterPredicate)
class AtLeast:
    """A predicate dropping events whose ``shown_level`` is below ``level``. An event
    without a level (none of the twisted.logger API makes one) is kept: nothing says it
    is unimportant."""

    def __init__(self, level: LogLevel) -> None:
        self.level = level

    def __call__(self, event: LogEvent) -> PredicateResult:
        event_level = shown_level(event)
        if event_level is not None and event_level < self.level:
            return PredicateResult.no
        return PredicateResult.maybe


def level_filter(observer: ILogObserver, level: str) -> ILogObserver:
    """``observer`` behind a filter dropping events below ``level``, one of ``LEVELS``."""
    return FilteringLogObserver(observer, [AtLeast(LEVELS[level])])


# The fields every json line starts with; an event's own fields of these names are
# left out (the event's text shows them).
_JSON_HEADER = ("time", "level", "namespace", "text")


def _json_line(event: LogEvent) -> str:
    """One JSON object and a newline: ``time`` (ISO 8601, UTC), ``level``,
    ``namespace``, ``text`` (the line the text format shows, with a traceback when the
    event has one), then the event's own fields whose values are JSON scalars. A float
    that is not finite is written as its text (``"nan"``, ``"inf"``): ``NaN`` and
    ``Infinity`` are not JSON, and a pipeline's parser would drop the whole line."""
    when = event.get("log_time")
    level = event.get("log_level")
    line: dict[str, Any] = {
        "time": None if when is None else datetime.fromtimestamp(
            when, timezone.utc).isoformat(timespec="milliseconds"),
        "level": None if level is None else level.name,
        "namespace": event.get("log_namespace"),
        "text": eventAsText(event, includeTimestamp=False, includeSystem=False),
    }
    for name, value in event.items():
        if name.startswith("log_") or name in _JSON_HEADER:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            line[name] = str(value)
        elif value is None or isinstance(value, (str, int, float, bool)):
            line[name] = value
    return json.dumps(line, default=str, allow_nan=False) + "\n"


def file_observer(out: IO[Any], log_format: str) -> ILogObserver:
    """Writes each event to ``out``: twistd's text lines, or one JSON object per line."""
    if log_format == "json":
        return FileLogObserver(out, _json_line)
    return textFileLogObserver(out)


def _rotate_on_sigusr1(log_file: LogFile) -> None:
    """What twistd does for its own log file: SIGUSR1 rotates it (unless the signal
    is taken already)."""
    if signal.getsignal(signal.SIGUSR1) in (None, signal.SIG_DFL):
        def rotate(signum: int, frame: object) -> None:
            from twisted.internet import reactor
            reactor.callFromThread(log_file.rotate)  # type: ignore[attr-defined]

        signal.signal(signal.SIGUSR1, rotate)


def twistd_log_observer(server_options: Mapping[str, Any], level: str,
                        log_format: str) -> ILogObserver:
    """The observer for an agent under twistd: where twistd's own options
    (``server_options``: ``--logfile``, ``--nodaemon``, ``--syslog``, ``--prefix``)
    send the log, in ``log_format``, without the events below ``level``.

    syslog gets text whatever the format: it frames and stamps lines itself."""
    if server_options.get("syslog"):
        from twisted.python.syslog import SyslogObserver

        syslog = SyslogObserver(server_options.get("prefix") or "twisted")
        from twisted.python import log as legacy_log

        # A legacy observer: a callable taking the legacy event dict.
        legacy = cast(legacy_log.ILogObserver, syslog.emit)
        return level_filter(LegacyLogObserverWrapper(legacy), level)
    logfile = server_options.get("logfile")
    out: IO[Any]
    if logfile == "-" or (not logfile and server_options.get("nodaemon")):
        out = sys.stdout
    else:
        log_file = LogFile.fromFullPath(logfile or "twistd.log")
        _rotate_on_sigusr1(log_file)
        out = log_file
    return level_filter(file_observer(out, log_format), level)


def shown_path(path: str, limit: int = ACCESS_LOG_PATH_CHARS) -> str:
    """A request path as a log line shows it: at most ``limit`` characters, then how
    long it was."""
    if len(path) <= limit:
        return path
    return f"{path[:limit]}... ({len(path)} characters)"


class LinesPerSecond:
    """At most ``limit`` lines in any one-second window; a line past that is dropped,
    and once the window ends ``report_dropped(count)`` is called with how many were.

    ``allow()`` says whether to write a line now. ``stop()`` reports what was dropped
    and not yet reported, and cancels the pending report (its timer)."""

    def __init__(self, reactor: IReactorTime, report_dropped: Callable[[int], None],
                 limit: int = ACCESS_LOG_LINES_PER_SECOND) -> None:
        self.reactor = reactor
        self.report_dropped = report_dropped
        self.limit = limit
        self.dropped = 0
        self._window_end = float("-inf")
        self._written = 0
        self._report: Optional[IDelayedCall] = None

    def allow(self) -> bool:
        now = self.reactor.seconds()
        if now >= self._window_end:
            self._window_end = now + 1.0
            self._written = 0
        if self._written < self.limit:
            self._written += 1
            return True
        self.dropped += 1
        if self._report is None:
            self._report = self.reactor.callLater(self._window_end - now, self._reported)
        return False

    def _reported(self) -> None:
        self._report = None
        dropped, self.dropped = self.dropped, 0
        if dropped:
            self.report_dropped(dropped)

    def stop(self) -> None:
        if self._report is not None and self._report.active():
            self._report.cancel()
        self._reported()

