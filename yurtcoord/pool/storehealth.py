"""Whether the pool etcd answers the pool store: a status check every interval.

The check asks etcd for its status and keeps ``healthy``. It runs on a ``Cadence``
(``yurtcoord.tx.cadence``), guarded as loop ``pool-store-health``
(``yurtcoord.tx.guardedloop``): a check that raises (an answer the store cannot read,
such as a status whose version is not text) is logged with its traceback, counted, and
turns the store unhealthy, and the next check still runs; unguarded, the loop stopped
and ``healthy`` kept its last value with etcd gone. Reconnecting after an etcd restart
is the etcd client's job (it dials again on the next request), so the store keeps
working without being rebuilt.

Three kinds of change are told to observers (``yurtcoord.tx.observers``): ``healthy``
changing; the pool etcd starting or stopping to count as unreachable for the agent's
readiness (``UNREACHABLE_AFTER_CHECKS`` failed checks in a row); and a new raft term
found by a check although the check before found etcd reachable (etcd restarted or
elected a new leader between two checks, unseen by the health observers; see
docs/design.md, "etcd that forgets acknowledged writes").
"""

from typing import Any, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.etcd.versions import version_warning
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors, guarded
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.observers import Observers

__all__ = ["StoreHealth", "UNREACHABLE_AFTER_CHECKS"]

# Failed health checks in a row before the pool etcd counts as unreachable for the
# agent's readiness: one check that times out on a busy machine, or lands on a member
# in the middle of an election, is not an outage.
UNREACHABLE_AFTER_CHECKS = 2


class StoreHealth:
    """The status checks of one pool store's etcd and what they found.

    :param clock: the reactor/clock of the checks.
    :param etcd: the store's etcd client (``status(timeout=...)``).
    :param prefix: the store's key prefix, named in the log line of a recovery.
    :param interval: seconds between two checks.
    :param timeout: seconds one check waits for etcd's answer.
    :param loop_errors: counts the checks that raised (the agent's metrics), or None.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, etcd: Any, prefix: str, interval: float,
                 timeout: float, loop_errors: Optional[ILoopErrors] = None) -> None:
        self.clock = clock
        self.etcd = etcd
        self.prefix = prefix
        self.interval = interval
        self.timeout = timeout
        self.healthy = False
        # Why the checks fail, once ``UNREACHABLE_AFTER_CHECKS`` failed in a row; None
        # after a good one (and before any).
        self.unreachable: Optional[str] = None
        # The version the pool etcd last reported, None before.
        self.etcd_version: Optional[str] = None
        self.closed = False
        self.health_changes: Observers[[bool]] = Observers("pool store health changes")
        self.unreachable_changes: Observers[[Optional[str]]] = Observers(
            "pool etcd unreachable changes")
        self.new_terms: Observers[[]] = Observers("pool etcd raft term changes")
        self._failed_checks = 0
        # etcd's raft term at the last check that reached it.
        self._raft_term: Optional[int] = None
        # The checks still waiting on etcd, cancelled at close.
        self._checks = InFlight()
        self._cadence = Cadence(clock, guarded(
            "pool-store-health", self.check, loop_errors,
            on_error=lambda failure: self._set_healthy(False, failure)),
            interval, "pool-store-health", loop_errors)

    def start(self) -> None:
        """Check now, then every ``interval``; nothing when started."""
        self._cadence.start()

    def check(self) -> defer.Deferred[Any]:
        """Ask etcd for its status now; fires when ``healthy`` reflects the answer."""
        d = self._checks.track(self.etcd.status(timeout=self.timeout))
        d.addCallbacks(self._reachable, lambda failure: self._set_healthy(False, failure))
        return d

    def close(self) -> None:
        """Stop checking; the checks still waiting are cancelled and change nothing."""
        self.closed = True
        self._cadence.stop()
        self._checks.cancel_all()

    def _reachable(self, status: Any) -> None:
        self._note_version(status.version)
        self._note_term(status.raft_term)
        self._set_healthy(True, None)

    def _note_term(self, term: Optional[int]) -> None:
        previous, self._raft_term = self._raft_term, term
        if previous is None or term is None or term == previous or self.closed:
            return
        if not self.healthy:
            return  # back from an outage: the health observers hear of it
        self.log.info("pool etcd changed raft term from {previous} to {term} between two "
                      "checks: it restarted or elected a new leader", previous=previous,
                      term=term)
        self.new_terms.notify()

    def _note_version(self, version: Optional[str]) -> None:
        """Log the etcd version when first seen or changed, warning about bad releases."""
        if not version or version == self.etcd_version or self.closed:
            return
        self.etcd_version = version
        warning = version_warning(version)
        if warning is None:
            self.log.info("pool etcd version {version}", version=version)
        else:
            self.log.warn("pool etcd version {version}: {advice}", version=version,
                          advice=warning)

    def _set_healthy(self, healthy: bool, failure: Optional[Failure]) -> None:
        if self.closed:
            return
        self._failed_checks = 0 if healthy else self._failed_checks + 1
        was_unreachable = self.unreachable is not None
        self.unreachable = None if self._failed_checks < UNREACHABLE_AFTER_CHECKS else (
            failure.getErrorMessage() if failure else "no answer")
        if was_unreachable != (self.unreachable is not None):
            self.unreachable_changes.notify(self.unreachable)
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:
                self.log.info("pool etcd reachable again at prefix {prefix}",
                              prefix=self.prefix)
            else:
                self.log.warn("pool etcd unreachable: {error}",
                              error=failure.getErrorMessage() if failure else "")
            self.health_changes.notify(healthy)
