"""Prometheus and promtool for the tests of the pool's rules (``yurtcoord.monitoring.alerts``).

``PROMTOOL`` and ``PROMETHEUS`` are the binaries on PATH (Debian package
``prometheus``), None when absent: the tests skip with ``MISSING``.
``filled_unit_tests`` makes the runnable copy of ``deploy/prometheus/tests.yaml``
(expected annotations from the source). ``PrometheusProcess`` is a real Prometheus on
loopback with its own temporary config and data directory, scraping given targets every
second and evaluating given rules every second; its HTTP API is read with treq on the
test's reactor.
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
from typing import Any, Generator, Iterable, Optional

import treq.client
import yaml
from twisted.internet import defer
from twisted.web.client import Agent, HTTPConnectionPool

from yurtcoord.monitoring.alerts import DEPLOY_DIR, RULES_FILE, rule_groups
from yurtcoord.testing.poll import poll_until

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
MISSING = "promtool/prometheus not installed (Debian package prometheus)"
UNIT_TESTS = os.path.join(DEPLOY_DIR, "tests.yaml")
START_DEADLINE = 30.0
STOP_DEADLINE = 10.0


def filled_unit_tests(rules_path: str, tests_path: str = UNIT_TESTS) -> dict[str, Any]:
    """``tests.yaml`` on ``rules_path``, every expected alert given the annotations the
    source writes for its alert."""
    annotations = {rule["alert"]: rule["annotations"]
                   for group in rule_groups() for rule in group["rules"] if "alert" in rule}
    with open(tests_path, encoding="utf-8") as f:
        tests = yaml.safe_load(f)
    tests["rule_files"] = [os.path.abspath(rules_path)]
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            for expected in case.get("exp_alerts") or []:
                expected["exp_annotations"] = annotations[case["alertname"]]
    return tests


def promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None, MISSING
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def shipped_rules_path() -> str:
    return os.path.join(DEPLOY_DIR, RULES_FILE)


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusProcess:
    """One ``prometheus`` on ``127.0.0.1:<free port>``; ``start()``, ``stop()``
    (SIGKILL and wait; the temp dir removed), ``alerts()``, ``query(expr)``."""

    def __init__(self, reactor: Any, targets: Iterable[str], rules: dict[str, Any],
                 interval: str = "1s") -> None:
        assert PROMETHEUS is not None, MISSING
        self.reactor = reactor
        self.directory = tempfile.mkdtemp(prefix="yurtcoord-prometheus-")
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(self.directory, "prometheus.log")
        with open(os.path.join(self.directory, "rules.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(rules, f)
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": "yurtcoord",
                                "static_configs": [{"targets": list(targets)}]}],
        }
        self.config_path = os.path.join(self.directory, "prometheus.yml")
        with open(self.config_path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        self.process: Optional[subprocess.Popen] = None
        # No connection outlives a request: nothing is left in the reactor.
        self._pool = HTTPConnectionPool(reactor, persistent=False)
        self._http = treq.client.HTTPClient(Agent(reactor, pool=self._pool, connectTimeout=2))

    @defer.inlineCallbacks
    def start(self) -> Generator[defer.Deferred[Any], Any, None]:
        assert PROMETHEUS is not None, MISSING
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={os.path.join(self.directory, 'data')}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                start_new_session=True)

        @defer.inlineCallbacks
        def ready() -> Generator[defer.Deferred[Any], Any, bool]:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log_tail()}")
            response = yield self._http.get(f"{self.url}/-/ready", timeout=1)
            yield response.content()
            return response.code == 200

        yield poll_until(ready, START_DEADLINE, 0.2, self.reactor, what="prometheus ready")

    def stop(self) -> defer.Deferred[Any]:
        """SIGKILL, wait, remove the temp dir; fires once the HTTP pool is closed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_DEADLINE)
        shutil.rmtree(self.directory, ignore_errors=True)
        return self._pool.closeCachedConnections()

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    @defer.inlineCallbacks
    def _get(self, path: str, **params: str) -> Generator[defer.Deferred[Any], Any, Any]:
        response = yield self._http.get(f"{self.url}{path}", params=params, timeout=2)
        body = yield response.content()
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise AssertionError(f"{path}: {answer}")
        return answer["data"]

    @defer.inlineCallbacks
    def alerts(self) -> Generator[defer.Deferred[Any], Any, list[dict[str, Any]]]:
        """The active alerts (pending and firing): ``[{"labels", "state", ...}]``."""
        data = yield self._get("/api/v1/alerts")
        return data["alerts"]

    @defer.inlineCallbacks
    def query(self, expr: str) -> Generator[defer.Deferred[Any], Any, list[dict[str, Any]]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = yield self._get("/api/v1/query", query=expr)
        return data["result"]
