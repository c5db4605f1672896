"""Headless Chromium for the pool page tests, and what they read of its DOM.

``run_chromium`` runs one ``chromium --headless`` child (``--no-sandbox``: CI runs as
root without a display) for a trial test case: skipped where Chromium is not
installed, killed after ``CHROMIUM_TIMEOUT`` and at the test's end. The patterns read
the pool page's markup, server-rendered or rebuilt by its script alike.
"""

import os
import re
import shutil
from typing import Any

from twisted.internet import defer, error
from twisted.python.failure import Failure
from twisted.trial import unittest

from yurtcoord.testing.processes import CollectingProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_TIMEOUT = 90.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The leader card's text; every member row as (node, heartbeat); every member row as
# (node, pool etcd member, coordinator apiserver) as shown ("none" when unknown); the
# node of each row flagged stale; the leader of each timeline segment.
LEADER_FIELD = re.compile(r'data-field="leader"[^>]*>([^<]*)<')
MEMBER_ROW = re.compile(r'<tr class="(?:member|stale)" data-node="([^"]*)" '
                        r'data-heartbeat="([^"]*)"')
MEMBER_SERVERS = re.compile(
    r'<tr class="(?:member|stale)" data-node="([^"]*)"[^>]*>(?:(?!</tr>).)*?'
    r'<td data-column="etcd-member"[^>]*>([^<]*)</td>'
    r'<td data-column="coordinator-server"[^>]*>([^<]*)</td>', re.S)
STALE_ROW = re.compile(r'<tr class="stale" data-node="([^"]*)" data-heartbeat="stale"')
RECT_LEADERS = re.compile(r'<rect [^>]*data-leader="([^"]*)"')


class ChromiumRun(CollectingProcess):
    """One chromium child; ``finished`` fires with (exit code, stdout, stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: defer.Deferred[tuple[int | None, bytes, bytes]] = defer.Deferred()

    def processEnded(self, reason: Failure) -> None:
        code = getattr(reason.value, "exitCode", None)
        self.finished.callback((code, self.out, self.err))


def run_chromium(case: unittest.TestCase, reactor: Any, *arguments: str
                 ) -> "defer.Deferred[Any]":
    """Run headless chromium with ``arguments`` for ``case``; fires with (exit code,
    stdout bytes, stderr bytes)."""
    if CHROMIUM is None:
        raise unittest.SkipTest("chromium is not installed (Debian package chromium)")
    profile = os.path.abspath(case.mktemp())
    os.makedirs(profile)
    run = ChromiumRun()
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", *arguments]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ")}
    env["HOME"] = profile
    transport = reactor.spawnProcess(run, CHROMIUM, argv, env=env, path=profile)

    def give_up() -> None:
        try:
            transport.signalProcess("KILL")
        except error.ProcessExitedAlready:
            return

    killer = reactor.callLater(CHROMIUM_TIMEOUT, give_up)

    def ended(result: object) -> object:
        if killer.active():
            killer.cancel()
        return result

    def kill_if_running() -> "defer.Deferred[Any] | None":
        if run.finished.called:
            return None
        give_up()
        return run.finished

    case.addCleanup(kill_if_running)
    return run.finished.addBoth(ended)
