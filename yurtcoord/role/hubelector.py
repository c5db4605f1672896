"""The hub elector: turns health and the Lease election into a role.

Every ``check_interval``: coordinator unhealthy → no candidacy, role pending;
cloud unhealthy → no candidacy, role follower (a hub without the cloud must not
lead); otherwise take part in the election: follower until it wins, then leader.
"""

from typing import Any, Callable, Optional

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.heartbeat.interfaces import IHealthChecker
from yurtcoord.role.roles import Role
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.observers import Observers


class HubElector:
    """Decides this agent's role and reports each change to ``on_role(role)``.

    ``elector_factory(on_started_leading, on_stopped_leading, on_new_leader)``
    builds a fresh, unstarted leader elector (``LeaderElector``) with
    ``start()``, ``stop()`` (a Deferred; the leader releases its lease) and
    ``leader`` (the observed holder). An elector that lost the lease stays a
    candidate until stopped. Each candidacy gets its own elector; callbacks of an
    elector that is no longer the current one are ignored, so a late "stopped
    leading" after the coordinator went away cannot turn ``pending`` back into
    ``follower``.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, cloud_checker: IHealthChecker,
                 coordinator_checker: IHealthChecker,
                 elector_factory: Callable[[Callable[..., None], Callable[..., None],
                                            Callable[..., None]], Any],
                 check_interval: float, on_role: Callable[[Role], object],
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._cloud = cloud_checker
        self._coordinator = coordinator_checker
        self._elector_factory = elector_factory
        self._on_role = on_role
        self.role = Role.INIT
        self._elector: Any = None
        self._candidacies = 0
        self._leader_observers: Observers[[str]] = Observers("pool leader changes")
        self._stopping_electors: set[defer.Deferred[Any]] = set()
        # One bad check (an on_role callback raising) must not end the checks: it is
        # logged and counted (loop hub-role-check), the next check runs on time.
        self._checks = Cadence(reactor, self.check, check_interval, "hub-role-check",
                               loop_errors)
        self._health_known: defer.Deferred[Any] | None = None

    @property
    def electing(self) -> bool:
        return self._elector is not None

    @property
    def leader(self) -> str | None:
        """Holder identity of the election lease as last observed; None when not
        taking part in the election or when the lease is free."""
        if self._elector is None:
            return None
        return self._elector.leader

    def add_leader_observer(self, observer: Callable[[str], None]) -> None:
        """Call ``observer(identity)`` each time the current candidacy sees a new
        holder of the election lease; a failing observer is logged."""
        self._leader_observers.add(observer)

    def start(self, health_known: Optional[defer.Deferred[Any]] = None) -> None:
        """Check now and every ``check_interval``; with ``health_known``, the first
        check waits until it fired (the role stays init until then), so that an
        agent whose first probes are still on the way is not called pending."""
        if self._checks.running or self._health_known is not None:
            return
        if health_known is not None and not health_known.called:
            self._health_known = health_known
            health_known.addBoth(self._health_became_known)
            return
        self._checks.start()

    def _health_became_known(self, result: object) -> None:
        if self._health_known is None:
            return None  # stopped meanwhile: the wait was cancelled
        self._health_known = None
        if isinstance(result, Failure):
            self.log.warn("waiting for the first health answers failed: {error}; checking "
                          "anyway", error=result.getErrorMessage())
        self._checks.start()
        return None

    def stop(self) -> defer.Deferred[None]:
        """Stop checking and electing; fires once the elector stopped (and a leader
        released its lease)."""
        stopped: list[defer.Deferred[Any]] = []
        waiting, self._health_known = self._health_known, None
        if waiting is not None:
            waiting.cancel()
        stopped.append(self._checks.stop())
        self._stop_electing()
        stopped.extend(self._stopping_electors)
        return defer.gatherResults(stopped, consumeErrors=True).addCallback(lambda _: None)

    def check(self) -> None:
        """One health check; called by the loop every ``check_interval``."""
        if not self._coordinator.healthy:
            self._stop_electing()
            self._set_role(Role.PENDING)
        elif not self._cloud.healthy:
            self._stop_electing()
            self._set_role(Role.FOLLOWER)
        elif self._elector is None:
            self._set_role(Role.FOLLOWER)
            self._start_electing()

    def _start_electing(self) -> None:
        self._candidacies += 1
        candidacy: list[Any] = []

        def current() -> bool:
            return bool(candidacy) and self._elector is candidacy[0]

        def started_leading(*_args: object) -> None:
            if current():
                self._set_role(Role.LEADER)

        def stopped_leading(*_args: object) -> None:
            if current():
                # Lost the lease; the elector stays a candidate.
                self._set_role(Role.FOLLOWER)

        def new_leader(identity: str, *_args: object) -> None:
            if current():
                self.log.info("pool leader is now {leader}", leader=identity)
                self._leader_observers.notify(identity)

        elector = self._elector_factory(started_leading, stopped_leading, new_leader)
        candidacy.append(elector)
        self._elector = elector
        self.log.info("starting leader election (candidacy {candidacy})",
                      candidacy=self._candidacies)
        elector.start()

    def _stop_electing(self) -> None:
        elector, self._elector = self._elector, None
        if elector is None:
            return
        d = defer.maybeDeferred(elector.stop)
        self._stopping_electors.add(d)

        def done(result: object) -> object:
            self._stopping_electors.discard(d)
            return result

        def failed(failure: Failure) -> None:
            self.log.failure("stopping the leader elector failed", failure)

        d.addBoth(done).addErrback(failed)

    def _set_role(self, role: Role) -> None:
        if role == self.role:
            return
        previous, self.role = self.role, role
        self.log.info("hub role {previous} -> {role}", previous=previous.value, role=role.value)
        try:
            self._on_role(role)
        except Exception:
            self.log.failure("handling hub role {role} failed", role=role.value)
