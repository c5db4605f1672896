"""The one periodic mechanism of the agent: a run now and then on a fixed lattice.

Every periodic loop of the agent (the heartbeat rounds and lease probes, the kubelet
check, the hub role check, the election lease read, the reactor lag probe) is a
``Cadence``. It runs ``run()`` (anything; a Deferred is waited for) at slots a step
apart. Like ``LoopingCall``, a run that takes longer than a step skips the slots it
missed instead of shifting the later ones, so the lattice does not drift with the
reactor's lateness. Unlike it, ``next_interval()`` is asked after every run for the
step to the next slot (the heartbeat renews faster while it delegates), ``restart()``
runs at once (right after the run in flight, if any) and anchors the lattice there,
and ``stop()`` cancels the run in flight and fires once it has ended.

No loop dies silently (``yurtcoord.tx.guardedloop``): a run that raises or fails
unexpectedly is reported as an error of guarded loop ``loop`` (logged once with its
traceback, counted in ``loop_errors``) and the cadence goes on at its next slot; a
``next_interval()`` that raises is reported the same way and the next run comes one
step later (the last step it gave, ``first_step`` before any). A run's failure after
``stop()`` is no error: it was cancelled.

The cadence is an Automat machine whose states own their data: the timer of the
next slot exists only while ``waiting``, the Deferred of the run in flight only
while ``running`` or ``running, then again``. An input that cannot happen in a state
(the timer firing while a run is in flight, ``start()`` while the cancelled run has
not ended yet) raises ``automat.NoTransition``.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Protocol, Union

from automat import TypeMachineBuilder
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from yurtcoord.tx.guardedloop import LOOPS, ILoopErrors, report_loop_error

__all__ = ["Cadence"]


class _Inputs(Protocol):
    """What a cadence is told: by its owner (start, restart, stop), its timer
    (``_due``) and the end of its run (``_ran``)."""

    def start(self, slot: float) -> None:
        """Run now, at ``slot``, and then on the lattice from there."""

    def start_later(self, slot: float) -> None:
        """First run at ``slot``, and then on the lattice from there."""

    def restart(self, slot: float) -> None:
        """Run now (right after the run in flight), anchoring the lattice at ``slot``."""

    def stop(self, stopped: defer.Deferred[None]) -> None:
        """Stop; ``stopped`` fires once the run in flight (cancelled) has ended."""

    def _due(self, slot: float) -> None:
        """The timer of ``slot`` fired."""

    def _ran(self, result: object) -> None:
        """The run in flight ended with ``result`` (a Failure when it failed)."""

    def _wait_until(self, slot: float) -> None:
        """After a run: the next run at ``slot``."""

    def _run_again(self, run: "_Run") -> None:
        """A restart was asked while ``run`` is in flight: run again after it."""


@dataclass
class _Core:
    """What a cadence keeps across its states: what it runs and how it reports."""

    clock: IReactorTime
    run: Callable[[], Any]
    next_interval: Callable[[], float]
    loop: str
    loop_errors: Optional[ILoopErrors]
    # The last step next_interval() gave: after it raised, the next run is this far.
    step: float
    # The stop() calls waiting for the cancelled run to end.
    stop_waiters: List[defer.Deferred[None]] = field(default_factory=list)
    # What ``Cadence.running`` answers: True from start() to stop(). The transitions
    # that start and stop set it, since a run (inside a transition) may ask, and a
    # machine cannot be asked anything while it is in a transition.
    running: bool = False
    # The slot the latest run was due at, which a run may read (``Cadence.due``): the
    # reactor lag probe measures how late after it the run began.
    due: float = 0.0

    def report(self, result: object) -> None:
        """A run's unexpected failure, as an error of the guarded loop."""
        if isinstance(result, Failure) and not result.check(defer.CancelledError):
            report_loop_error(self.loop, result, self.loop_errors)

    def next_slot(self, slot: float, started: float) -> float:
        """The slot after a run due at ``slot`` that started at ``started``: the first
        of the lattice through ``slot`` after ``started`` that is not past.

        As ``LoopingCall`` does, a run that started late skips the slots that passed
        meanwhile, the one it started at included, so that a late timer does not run
        twice in one instant; and the slots missed while a run lasted are skipped. A
        run that ends right at the next slot (a probe cut off by its interval) is
        followed at once."""
        now = self.clock.seconds()
        try:
            step = self.step = float(self.next_interval())
        except Exception:
            report_loop_error(self.loop, Failure(), self.loop_errors)
            return now + self.step
        following = slot + step
        if following <= started:
            following = slot + step * (math.floor((started - slot) / step) + 1)
        if following < now:
            following += step * math.ceil((now - following) / step)
        return following

    def stopped(self) -> None:
        waiters, self.stop_waiters = self.stop_waiters, []
        for waiter in waiters:
            waiter.callback(None)


@dataclass
class _Run:
    """The run in flight, due at ``slot`` and started at ``started``; ``stop()``
    cancels ``ended``."""

    slot: float
    started: float
    ended: defer.Deferred[None]


@dataclass
class _Timer:
    """The timer of the next run, due at ``slot``; ``stop()`` and ``restart()``
    cancel it."""

    slot: float
    call: IDelayedCall


def _build() -> Callable[[_Core], _Inputs]:
    builder = TypeMachineBuilder(_Inputs, _Core)

    def run(c: _Inputs, s: _Core, slot: float) -> _Run:
        # A synchronous end is handed to the machine once this transition is done.
        started, s.due = s.clock.seconds(), slot
        ended = defer.maybeDeferred(s.run).addBoth(c._ran)
        return _Run(slot, started, ended)

    def wait(c: _Inputs, s: _Core, slot: float) -> _Timer:
        delay = max(0.0, slot - s.clock.seconds())
        return _Timer(slot, s.clock.callLater(delay, c._due, slot))

    def hand_over(c: _Inputs, s: _Core, run: _Run) -> _Run:
        return run

    idle = builder.state("idle")
    running = builder.state("running", run)
    running_then_again = builder.state("running, then again", hand_over)
    # Between two runs, for one turn: the next slot or a run at once is decided.
    between = builder.state("between")
    waiting = builder.state("waiting", wait)
    stopping = builder.state("stopping")

    idle.upon(_Inputs.restart).loop().returns(None)
    waiting.upon(_Inputs._due).to(running).returns(None)
    between.upon(_Inputs._wait_until).to(waiting).returns(None)
    between.upon(_Inputs.restart).to(running).returns(None)
    running.upon(_Inputs._run_again).to(running_then_again).returns(None)
    for state in (running, running_then_again, waiting):
        state.upon(_Inputs.start).loop().returns(None)
        state.upon(_Inputs.start_later).loop().returns(None)
    running_then_again.upon(_Inputs.restart).loop().returns(None)
    stopping.upon(_Inputs.restart).loop().returns(None)

    # Through "between", so that the first run already sees the cadence running.
    @idle.upon(_Inputs.start).to(between)
    def start(c: _Inputs, s: _Core, slot: float) -> None:
        s.running = True
        c.restart(slot)

    @idle.upon(_Inputs.start_later).to(between)
    def start_later(c: _Inputs, s: _Core, slot: float) -> None:
        s.running = True
        c._wait_until(slot)

    @idle.upon(_Inputs.stop).loop()
    def stop_idle(c: _Inputs, s: _Core, stopped: defer.Deferred[None]) -> None:
        stopped.callback(None)

    @running.upon(_Inputs.restart).loop()
    def restart_running(c: _Inputs, s: _Core, run: _Run, slot: float) -> None:
        c._run_again(run)

    @running.upon(_Inputs._ran).to(between)
    def ran(c: _Inputs, s: _Core, run: _Run, result: object) -> None:
        s.report(result)
        c._wait_until(s.next_slot(run.slot, run.started))

    @running_then_again.upon(_Inputs._ran).to(between)
    def ran_then_again(c: _Inputs, s: _Core, run: _Run, result: object) -> None:
        s.report(result)
        c.restart(s.clock.seconds())

    @waiting.upon(_Inputs.restart).to(running)
    def restart_waiting(c: _Inputs, s: _Core, timer: _Timer, slot: float) -> None:
        timer.call.cancel()

    @waiting.upon(_Inputs.stop).to(idle)
    def stop_waiting(c: _Inputs, s: _Core, timer: _Timer,
                     stopped: defer.Deferred[None]) -> None:
        s.running = False
        timer.call.cancel()
        stopped.callback(None)

    @running.upon(_Inputs.stop).to(stopping)
    @running_then_again.upon(_Inputs.stop).to(stopping)
    def stop_running(c: _Inputs, s: _Core, run: _Run,
                     stopped: defer.Deferred[None]) -> None:
        s.running = False
        s.stop_waiters.append(stopped)
        run.ended.cancel()

    @stopping.upon(_Inputs.stop).loop()
    def stop_stopping(c: _Inputs, s: _Core, stopped: defer.Deferred[None]) -> None:
        s.stop_waiters.append(stopped)

    @stopping.upon(_Inputs._ran).to(idle)
    def ran_stopped(c: _Inputs, s: _Core, result: object) -> None:
        # A run cancelled by stop() ends however its parts report the cancellation.
        s.stopped()

    return builder.build()


_Machine = _build()


class Cadence:
    """Runs ``run()`` now and then on a fixed lattice (see the module docstring).

    ``next_interval`` is the step between slots, or a callable asked for it after
    every run; ``loop`` names the guarded loop (a key of
    ``yurtcoord.tx.guardedloop.LOOPS``) whose errors ``loop_errors`` counts;
    ``first_step`` is the step after a ``next_interval()`` that raised before it
    ever answered (required with a callable; the step itself when it is a number).
    """

    def __init__(self, clock: IReactorTime, run: Callable[[], Any],
                 next_interval: Union[float, Callable[[], float]], loop: str,
                 loop_errors: Optional[ILoopErrors] = None,
                 first_step: Optional[float] = None) -> None:
        if loop not in LOOPS:
            raise ValueError(f"loop {loop!r} is not in yurtcoord.tx.guardedloop.LOOPS")
        if callable(next_interval):
            if first_step is None:
                raise ValueError("a cadence with a callable next_interval needs first_step")
            step = next_interval
        else:
            interval = float(next_interval)
            if interval <= 0:
                raise ValueError(f"a cadence's interval must be positive, not {interval!r}")
            first_step = interval

            def step() -> float:
                return interval

        self._clock = clock
        self._core = _Core(clock, run, step, loop, loop_errors, step=first_step)
        self._machine = _Machine(self._core)

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._core.running

    @property
    def due(self) -> float:
        """The slot (clock time) the run in flight, or the latest run, was due at."""
        return self._core.due

    def start(self, now: bool = True) -> None:
        """Run now (or, with ``now=False``, one step from now) and then on the
        lattice; nothing when running."""
        at = self._clock.seconds()
        if now:
            self._machine.start(at)
        else:
            self._machine.start_later(self._core.next_slot(at, at))

    def restart(self) -> None:
        """Run now (right after the run in flight, if any) and anchor the lattice
        there; nothing when not running."""
        self._machine.restart(self._clock.seconds())

    def stop(self) -> defer.Deferred[None]:
        """Stop; the run in flight is cancelled. Fires once it has ended (at once when
        none is in flight)."""
        stopped: defer.Deferred[None] = defer.Deferred()
        self._machine.stop(stopped)
        return stopped
