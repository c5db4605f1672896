"""The kubelet liveness gate of every heartbeat: a node whose kubelet is dead must
not be kept alive by its agent, neither directly nor through the pool leader."""

from collections.abc import Callable
from typing import Any, Generator, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.heartbeat.interfaces import IKubeletLiveness
from yurtcoord.heartbeat.serverset import probe_error
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.observers import Observers


@implementer(IKubeletLiveness)
class KubeletHealthChecker:
    """Tells whether the kubelet answered its healthz within ``grace_period``.

    ``http_get(url)`` is treq-compatible: a Deferred firing with a response that
    has ``.code`` and ``.content()``. The kubelet is asked every ``interval``. It is
    alive while its last 200 is at most ``grace_period`` old; until its first 200 the
    grace period counts from ``start()``, so a kubelet that never answers ends the
    heartbeats ``grace_period`` after the agent started. Every lease prober asks
    ``is_alive()`` before writing: a node whose kubelet is dead must not be kept
    alive by its agent, neither directly nor through the pool leader.

    The turn to dead is noticed by the first ``is_alive()`` or check after the
    grace period ran out, the turn back by the first healthy answer; each is logged
    once and passed to the ``add_listener`` callbacks as ``callback(alive)``.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, http_get: Callable[[str], defer.Deferred[Any]],
                 url: str, grace_period: float, interval: float = 5.0,
                 timeout: float = 2.0, loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._http_get = http_get
        self.url = url
        self._grace = grace_period
        self._interval = interval
        self._timeout = timeout
        self._started_at: Optional[float] = None
        self.last_healthy: Optional[float] = None
        # A check that raises is logged and counted (loop kubelet-check); the next
        # one runs on time, so a bug here cannot freeze the node's liveness.
        self._cadence = Cadence(reactor, self.check, interval, "kubelet-check", loop_errors)
        # The checks still waiting on the kubelet, cancelled at stop.
        self._checks = InFlight()
        self._stopping = False
        self._listeners: Observers[[bool]] = Observers(f"kubelet {url} liveness")
        self._dead = False

    def add_listener(self, callback: Callable[[bool], object]) -> None:
        """``callback(alive)`` when the kubelet turns dead and when it is back."""
        self._listeners.add(callback)

    def _since(self) -> Optional[float]:
        return self.last_healthy if self.last_healthy is not None else self._started_at

    def dead_for(self) -> Optional[float]:
        """Seconds since the last healthy answer (or the start) while the kubelet
        counts as dead; None while it is alive."""
        since = self._since()
        if since is None or self.is_alive():
            return None
        return max(0.0, self._reactor.seconds() - since)

    def is_alive(self) -> bool:
        since = self._since()
        if since is None:
            return True
        alive = self._reactor.seconds() - since <= self._grace
        if not alive and not self._dead and not self._stopping:
            self._turned(False)
        return alive

    def _turned(self, alive: bool) -> None:
        self._dead = not alive
        since = self._since()
        silent = 0.0 if since is None else round(self._reactor.seconds() - since, 1)
        if not alive and self.last_healthy is None:
            self.log.warn(
                "kubelet {url} has not answered since the agent started {seconds}s ago "
                "(grace period {grace}s): heartbeats stop until it answers",
                url=self.url, seconds=silent, grace=self._grace)
        elif not alive:
            self.log.warn(
                "kubelet {url} counts as dead: last healthy answer {seconds}s ago (grace "
                "period {grace}s): heartbeats stop until it answers",
                url=self.url, seconds=silent, grace=self._grace)
        else:
            self.log.info("kubelet {url} answers again: heartbeats resume", url=self.url)
        self._listeners.notify(alive)

    def start(self) -> None:
        if self._cadence.running:
            return
        self._stopping = False
        self._started_at = self._reactor.seconds()
        self.log.info("kubelet liveness checked at {url} every {interval}s: heartbeats stop "
                      "when it has not answered for {grace}s",
                      url=self.url, interval=self._interval, grace=self._grace)
        self._cadence.start()

    def stop(self) -> defer.Deferred[Any]:
        if not self._cadence.running:
            return defer.succeed(None)
        self._stopping = True
        self._checks.cancel_all()
        return self._cadence.stop()

    def check(self) -> defer.Deferred[bool]:
        """Ask the kubelet once. Fires with True when it answered 200 (never errbacks)."""

        @defer.inlineCallbacks
        def ask() -> Generator[Any, Any, bool]:
            response = yield self._http_get(self.url)
            yield response.content()
            return response.code == 200

        d = self._checks.track(ask().addTimeout(self._timeout, self._reactor))

        def answered(healthy: bool) -> bool:
            if self._stopping:
                return healthy
            if healthy:
                self.last_healthy = self._reactor.seconds()
                if self._dead:
                    self._turned(True)
            else:
                self.is_alive()
            return healthy

        def failed(failure: Failure) -> bool:
            if not self._stopping:
                self.log.debug("kubelet healthz {url} failed: {error}",
                               url=self.url, error=probe_error(failure))
                self.is_alive()
            return False

        d.addCallbacks(answered, failed)
        return d
