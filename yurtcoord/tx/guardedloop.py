"""No silent deaths: one guard for the step of every periodic loop of the agent.

A ``LoopingCall`` whose call raises (or returns a Deferred that fails) stops for good,
and the failure is only seen as "Unhandled error in Deferred" when the garbage
collector gets to it; a ``callLater`` chain whose callback raises never arms its next
timer. The pool store's health loop died that way on a malformed etcd status answer
and left ``healthy`` True with etcd gone. Every periodic loop therefore runs its step
through ``guarded(name, step, ...)``: an unexpected exception of the step (raised, or
the failure of the Deferred it returns) is

- logged once, with its traceback (``log.failure``, field ``loop=<name>``);
- counted in ``yurtcoord_loop_errors_total{loop=<name>}`` through the optional
  ``ILoopErrors`` sink (the agent's ``Metrics``; tests and tools may pass none);
- handed to ``on_error`` where the loop's owner must not go on as if the step had
  succeeded (the pool store turns unhealthy);

and the guarded step returns normally, so the loop runs again at its next tick.
A ``CancelledError`` is not an error: stopping a loop cancels its step.

Every name passed to ``guarded`` must be in ``LOOPS`` (``guarded`` refuses others), so
this list is the complete list of guarded loops, the metric's label values are known in
advance (the agent exports each at 0), and the unit test that injects an exception
into each loop by name covers them all (``yurtcoord.test.unit.test_guardedloop``).

The loops (name: module:function whose run is guarded; docs/runbook.md, "A loop
raised", says what an operator does when the counter moves):

- ``pool-store-health``: ``yurtcoord.pool.storehealth:StoreHealth.check``, the pool
  etcd status check every ``health_interval``; an error turns the store unhealthy.
- ``informer-sync-lease``: ``yurtcoord.pool.sync:PoolSyncManager._renew_lease``, the
  leader's renewal of the informer sync lease every ``informer_lease_renew``.
- ``hub-role-check``: ``yurtcoord.role.hubelector:HubElector.check``, the role
  decision every ``[leader_election] check_interval``.
- ``kubelet-check``: ``yurtcoord.heartbeat.kubeletcheck:KubeletHealthChecker.check``, the
  kubelet liveness check every ``[heartbeat] interval``.
- ``lease-probe``: ``yurtcoord.heartbeat.serverset:LeaseProber.probe``, one server's probe
  on its ``Cadence``, and the end of each probe, which arms the next.
- ``heartbeat``: ``yurtcoord.heartbeat.serverset:ServerSet._round``, the
  node lease heartbeat round over several servers on its ``Cadence``, and the end of
  each round, which arms the next.
- ``reactor-lag``: ``yurtcoord.tx.reactorlag:ReactorLagProbe._tick``, the reactor lag
  measurement every 0.1 s.
- ``etcd-member-probe``: ``yurtcoord.etcd.members:MemberSet._probe_done``, the
  ``/health`` probe chain of a skipped pool etcd member; an error schedules the
  member's next probe, so it can be current again.
- ``informer``: ``yurtcoord.kube.informer:Informer._step``, one list or watch of an
  informer's list-and-watch loop (pool sync, delegation, the certificate Secret, the
  synced detector, the pool scope); an error relists after the informer's backoff.
- ``election-tick``: ``yurtcoord.kube.leaderelection:LeaderElector._tick_due``, the
  attempt and renewal timers of the election (and the end of each attempt); an
  attempt whose start raises ends as not written, and a ``random`` that raises gives
  retry_period instead of a jittered pause, so the next tick is armed all the same.
- ``election-deadline``: ``yurtcoord.kube.leaderelection:LeaderElector._deadline_due``,
  the renew deadline of a leader; a ``random`` that raises gives retry_period, and
  the leader still steps down and arms the next tick.
- ``role-retry``: ``yurtcoord.role.coordinator:Coordinator._retry_due``, the retry
  timer of a failed run of role steps (and the end of each run, and the retry
  policy's answer); a policy that raises is answered by ``ROLE_RETRY``, so the
  retry is armed all the same.
- ``watch-idle``: ``yurtcoord.kube.watch:IdleWatchdog._check``, the idle check of a
  watch with an ``idle_timeout`` (every ``KubeClient`` of the agent counts into the
  metrics); an error arms the check again, so the watch keeps its idle timeout.
- ``work-retry``: ``yurtcoord.tx.workqueue:WorkQueue._retry``, the retry timer of
  one key's failed work (pool sync writes), and the retry of a delegated heartbeat
  (``yurtcoord.heartbeat.forwarding:LeaseForwarding.retry``); an error arms the
  key's retry again, or starts the delegation's chains again a second later, so the
  work goes on.
- ``election-lease-read``: ``yurtcoord.role.leadersource:ElectionLeaseReader._read``,
  the read of the election lease every ``retry_period`` that names the pool's leader
  on every page; a defect in handling an answer is counted and the next tick reads
  again.

Chains that need no guard (a raise ends in an errback their caller handles, or the
timer is re-armed by the next event) are listed in docs/runbook.md, "A loop raised".
"""

from typing import Any, Callable, Mapping, Optional

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface

__all__ = ["LOOPS", "ILoopErrors", "guarded", "report_loop_error"]

# name -> "module:function" of every guarded loop; the module docstring says more.
LOOPS: Mapping[str, str] = {
    "pool-store-health": "yurtcoord.pool.storehealth:StoreHealth.check",
    "informer-sync-lease": "yurtcoord.pool.sync:PoolSyncManager._renew_lease",
    "hub-role-check": "yurtcoord.role.hubelector:HubElector.check",
    "kubelet-check": "yurtcoord.heartbeat.kubeletcheck:KubeletHealthChecker.check",
    "lease-probe": "yurtcoord.heartbeat.serverset:LeaseProber.probe",
    "heartbeat": "yurtcoord.heartbeat.serverset:ServerSet._round",
    "reactor-lag": "yurtcoord.tx.reactorlag:ReactorLagProbe._tick",
    "etcd-member-probe": "yurtcoord.etcd.members:MemberSet._probe_done",
    "informer": "yurtcoord.kube.informer:Informer._step",
    "election-tick": "yurtcoord.kube.leaderelection:LeaderElector._tick_due",
    "election-deadline": "yurtcoord.kube.leaderelection:LeaderElector._deadline_due",
    "role-retry": "yurtcoord.role.coordinator:Coordinator._retry_due",
    "watch-idle": "yurtcoord.kube.watch:IdleWatchdog._check",
    "work-retry": "yurtcoord.tx.workqueue:WorkQueue._retry",
    "election-lease-read": "yurtcoord.role.leadersource:ElectionLeaseReader._read",
}

log = Logger(namespace="yurtcoord.loop")



class ILoopErrors(Interface):
    """Where a guarded loop counts its unexpected errors (the agent's ``Metrics``)."""

    def count_loop_error(loop: str) -> None:
        """One unexpected error in loop ``loop`` (a name in ``LOOPS``)."""


def report_loop_error(name: str, failure: Failure, sink: Optional[ILoopErrors] = None,
                      on_error: Optional[Callable[[Failure], object]] = None) -> None:
    """Log ``failure`` of loop ``name`` once with its traceback, count it in ``sink``
    and hand it to ``on_error``; none of them may stop the loop, so a sink or an
    ``on_error`` that raises is logged too and swallowed."""
    log.failure("loop {loop} raised; it goes on at its next tick", failure, loop=name)
    if sink is not None:
        try:
            sink.count_loop_error(name)
        except Exception:
            log.failure("counting an error of loop {loop} failed", loop=name)
    if on_error is not None:
        try:
            on_error(failure)
        except Exception:
            log.failure("error handler of loop {loop} failed", loop=name)


def guarded(name: str, step: Callable[..., Any], sink: Optional[ILoopErrors] = None,
            on_error: Optional[Callable[[Failure], object]] = None) -> Callable[..., Any]:
    """``step`` for loop ``name`` (a key of ``LOOPS``), guarded: a synchronous
    exception ends as None, a Deferred result fires with None instead of failing, and
    either is reported (``report_loop_error``). A result that is not a Deferred is
    passed on; a ``CancelledError`` (the loop was stopped) passes silently as None."""
    if name not in LOOPS:
        raise ValueError(f"loop {name!r} is not in yurtcoord.tx.guardedloop.LOOPS")

    def failed(failure: Failure) -> None:
        if not failure.check(defer.CancelledError):
            report_loop_error(name, failure, sink, on_error)
        return None

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = step(*args, **kwargs)
        except defer.CancelledError:
            return None
        except Exception:
            failed(Failure())
            return None
        if isinstance(result, defer.Deferred):
            return result.addErrback(failed)
        return result

    return run
