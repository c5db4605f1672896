"""The health of apiservers judged by probing them: one server (``LeaseProber``) and a
set of servers in front of one store (``ServerSet``).

A server that accepted the node's heartbeat lease is healthy; one that did not is
not, whatever else it still answers. Several cloud URLs usually lead to one cloud,
and several coordinator apiservers share the pool etcd, so the node lease is written
through one server of such a set per interval and the others are read: a node never
races itself for its lease. Both probe on a ``Cadence`` (``yurtcoord.tx.cadence``).
"""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generator, List, Optional, Set, Tuple, Union

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from yurtcoord.heartbeat.nodelease import NodeLeaseWriter, ProbeSettings, Settings
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.observers import Observers

if TYPE_CHECKING:
    from yurtcoord.heartbeat.kubeletcheck import KubeletHealthChecker


class LeaseProber:
    """The health of one server, judged by probing it: renewing the node lease on it
    (``probe()``) or, for a cloud server the heartbeat does not go through, reading
    it (``check()``).

    One probe is one ``NodeLeaseWriter`` renewal or read: up to ``failed_retry``
    attempts with pauses, each bounded by ``timeout``, the whole probe bounded by
    ``interval`` (cancelled then). Only a whole probe succeeds or fails: the first
    probe decides health directly; afterwards one failed probe makes the server
    unhealthy and ``healthy_threshold`` consecutive good probes make it healthy
    again. With a ``kubelet`` liveness source that reports the kubelet dead, nothing
    is sent and the probe fails: an agent must not keep a dead node alive.

    ``start()`` probes every ``interval`` on its own ``Cadence`` (``next_interval``
    changes the step, ``restart()`` probes at once); the cloud checker instead
    drives its probers itself. ``on_change(prober)`` is called after the first probe
    and whenever ``healthy`` flips.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, writer: NodeLeaseWriter, server: str,
                 settings: Settings, kubelet: Optional["KubeletHealthChecker"] = None,
                 report_health: Optional[Callable[[str, bool], object]] = None,
                 next_interval: Optional[Callable[[], float]] = None,
                 on_change: Optional[Callable[["LeaseProber"], object]] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        self._reactor = reactor
        self._writer = writer
        self.server = server
        self._settings = settings
        self._kubelet = kubelet
        self._report_health = report_health
        self.on_change = on_change
        self.healthy = False
        self.probes = 0
        self.successes = 0
        self.last_error: Optional[str] = None
        self._consecutive = 0
        self._first_answer_waiters: List[defer.Deferred[None]] = []
        self._cadence = Cadence(reactor, self.probe,
                                next_interval or (lambda: settings.interval),
                                "lease-probe", loop_errors, first_step=ProbeSettings.interval)

    @property
    def writer(self) -> NodeLeaseWriter:
        return self._writer

    @property
    def running(self) -> bool:
        return self._cadence.running

    def start(self) -> None:
        """Probe now and then every ``interval``."""
        self._cadence.start()

    def restart(self) -> None:
        """Probe now (right after the probe in flight, if any) and count the cadence
        from there; nothing when not started."""
        self._cadence.restart()

    def stop(self) -> defer.Deferred[None]:
        """Stop probing; an in-flight probe is cancelled. Fires when nothing is left."""
        return self._cadence.stop()

    def when_answered(self) -> defer.Deferred[None]:
        """Fires once the first probe has ended (well or not), at once if one has;
        cancelling it ends the wait only."""
        if self.probes:
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred(self._first_answer_waiters.remove)
        self._first_answer_waiters.append(waiter)
        return waiter

    def probe(self) -> defer.Deferred[bool]:
        """Renew the node lease on this server now. Fires with the resulting health
        (never errbacks)."""
        return self.write().addCallback(lambda _ok: self.healthy)

    def write(self) -> defer.Deferred[bool]:
        """One probe that renews the node lease. Fires with True when the lease was
        written, whatever the resulting health (never errbacks)."""
        return self._probe(self._writer.renew)

    def check(self) -> defer.Deferred[bool]:
        """One probe that reads the node lease (absent is an answer too). Fires with
        True when the server answered (never errbacks)."""
        return self._probe(self._writer.read)

    def _probe(self, send: Callable[[], defer.Deferred[Optional[dict]]]
               ) -> defer.Deferred[bool]:
        if self._kubelet is not None and not self._kubelet.is_alive():
            self._record(False, "kubelet has not been healthy for its grace period")
            return defer.succeed(False)
        d = send()
        d.addTimeout(self._settings.interval, self._reactor)

        def answered(_lease: Optional[dict]) -> bool:
            self._record(True)
            return True

        def failed(failure: Failure) -> Union[bool, Failure]:
            # A probe abandoned (the prober stopped) tells nothing about the server.
            if failure.check(defer.CancelledError):
                return failure
            self._record(False, probe_error(failure))
            return False

        return d.addCallbacks(answered, failed)

    def _record(self, ok: bool, error: Optional[str] = None) -> None:
        first = self.probes == 0
        self.probes += 1
        was = self.healthy
        if ok:
            self.successes += 1
            self._consecutive += 1
            self.last_error = None
            if first or self._consecutive >= self._settings.healthy_threshold:
                self.healthy = True
        else:
            self._consecutive = 0
            self.last_error = error
            self.healthy = False
        if self._report_health is not None:
            self._report_health(self.server, self.healthy)
        if first or was != self.healthy:
            if self.healthy:
                self.log.info("server {server} is healthy", server=self.server)
            else:
                self.log.warn("server {server} is unhealthy: {error}",
                              server=self.server, error=error)
        elif not ok:
            self.log.debug("probe of {server} failed: {error}", server=self.server,
                           error=error)
        if (first or was != self.healthy) and self.on_change is not None:
            try:
                self.on_change(self)
            except Exception:
                self.log.failure("health change handler of {server} raised", server=self.server)
        # Last: a waiter may read the health this answer decided.
        waiters, self._first_answer_waiters = self._first_answer_waiters, []
        for waiter in waiters:
            waiter.callback(None)


def probe_error(failure: Failure) -> str:
    """Why a probe failed; a probe cut off by its timeout says so plainly."""
    if failure.check(defer.TimeoutError, defer.CancelledError):
        return "probe timed out"
    return describe_failure(failure)


class ServerSet:
    """Health of several apiservers in front of one store: healthy when any is.

    The node lease is written once per interval, through one server: the writing
    server, the last one whose write succeeded. The other servers are probed by
    reading the node lease, one of them per interval in turn (and, until each has
    been probed once, all of them), so that with several URLs in front of one store a
    node neither writes its lease twice nor conflicts with itself, and sends at most
    twice the requests it sends with one URL. When the write fails the heartbeat
    moves at once to another server, a healthy one first, else the next one, until
    one took it or every server failed this interval. With one server this is that
    server's prober renewing the lease every interval.

    The cloud servers are one such set (``CloudHealthChecker``), the coordinator
    apiservers over the pool etcd another (``CoordinatorHealthChecker``).
    ``next_interval()`` is asked after every round for the step to the next one;
    ``name`` ("cloud", "coordinator") names the set in logs.

    ``decided`` is False until the set's health is known: no server has been found
    healthy yet and some server has not answered its first probe.

    ``suspect(url)`` tells the set that a request to ``url`` got no answer (refused,
    cut, timed out): while that server still counts as healthy it is probed at once
    instead of at its next slot, and ``pick_server`` avoids it until that probe has
    ended, so that requests move to another server at once and a dead server is
    known within one probe rather than one interval. A set of one server has
    nowhere else to send requests: there it changes nothing, and the server is
    probed at its slots as ever.

    ``add_listener(callback)``: ``callback(healthy)`` is called when the set's
    health becomes known and whenever it flips. ``add_write_listener(callback)``:
    ``callback(server)`` is called each time a round's heartbeat was written, through
    ``server``.
    """

    log = Logger()

    def __init__(self, reactor: IReactorTime, probers: Iterable[LeaseProber],
                 next_interval: Callable[[], float],
                 kubelet: Optional["KubeletHealthChecker"] = None,
                 name: str = "cloud", loop_errors: Optional[ILoopErrors] = None) -> None:
        self._probers = list(probers)
        if not self._probers:
            raise ValueError(f"at least one {name} server is required")
        self.name = name
        self._kubelet = kubelet
        self._writing = 0
        self._next_check = 1 % len(self._probers)
        self._next = 0
        # Servers (indexes) suspected since their last probe began, and the one to
        # read first in the next round.
        self._suspected: Set[int] = set()
        self._check_first: Optional[int] = None
        self._listeners: Observers[[bool]] = Observers(f"{name} health")
        self._write_listeners: Observers[[str]] = Observers(f"{name} heartbeat writes")
        self._last_state = (self.decided, self.healthy)
        self._cadence = Cadence(reactor, self._round, next_interval, "heartbeat", loop_errors,
                                first_step=ProbeSettings.interval)
        for prober in self._probers:
            prober.on_change = self._prober_changed

    @property
    def probers(self) -> Tuple[LeaseProber, ...]:
        return tuple(self._probers)

    @property
    def writing_server(self) -> str:
        """The server the next heartbeat is written through."""
        return self._probers[self._writing].server

    @property
    def healthy(self) -> bool:
        return any(p.healthy for p in self._probers)

    @property
    def decided(self) -> bool:
        return self.healthy or all(p.probes for p in self._probers)

    def add_listener(self, callback: Callable[[bool], object]) -> None:
        self._listeners.add(callback)

    def add_write_listener(self, callback: Callable[[str], object]) -> None:
        self._write_listeners.add(callback)

    def _prober_changed(self, _prober: LeaseProber) -> None:
        state = (self.decided, self.healthy)
        if state == self._last_state:
            return
        self._last_state = state
        self._listeners.notify(state[1])

    def servers(self) -> dict[str, bool]:
        """``{url: healthy}`` of every server, for ``/status``."""
        return {p.server: p.healthy for p in self._probers}

    def unhealthy_reasons(self) -> dict[str, str]:
        """``{url: why its last probe failed}`` of every server that is not healthy
        and was probed, for ``/readyz``."""
        return {p.server: p.last_error for p in self._probers
                if not p.healthy and p.last_error}

    def pick_healthy_server(self) -> Optional[str]:
        """A healthy server URL, rotating among the healthy ones; None when none is."""
        count = len(self._probers)
        for offset in range(count):
            index = (self._next + offset) % count
            if self._probers[index].healthy:
                self._next = (index + 1) % count
                return self._probers[index].server
        return None

    def pick_server(self) -> str:
        """The server a request goes to: the one the heartbeat is written through
        while it is healthy, else another healthy one; a server suspected since its
        last probe began only when no other is healthy; while none is healthy, the
        heartbeat's server (with one server, always that server)."""
        writing = self._writing
        healthy = [i for i in range(len(self._probers)) if self._probers[i].healthy]
        trusted = [i for i in healthy if i not in self._suspected]
        for candidates in (trusted, healthy):
            if writing in candidates:
                return self._probers[writing].server
            if candidates:
                return self._probers[candidates[0]].server
        return self._probers[writing].server

    def suspect(self, server: str) -> None:
        """A request to ``server`` got no answer: probe it now if it still counts as
        healthy (see the class docstring)."""
        if len(self._probers) < 2:
            return
        for index, prober in enumerate(self._probers):
            if prober.server != server or not prober.healthy or index in self._suspected:
                continue
            self._suspected.add(index)
            if index != self._writing:
                self._check_first = index
            self.log.info("{name} server {server} did not answer a request: probing it now",
                          name=self.name, server=server)
            self._cadence.restart()

    def _probed(self, result: object, index: int) -> object:
        self._suspected.discard(index)
        return result

    def _round(self) -> defer.Deferred[Any]:
        """One interval: the heartbeat through the writing server (moving on when it
        fails) and read probes of the others. While the kubelet counts as dead every
        server's probe fails at once, without a request."""
        if self._kubelet is not None and not self._kubelet.is_alive():
            self._suspected.clear()
            return defer.gatherResults([p.write() for p in self._probers])
        probes = [self._heartbeat()]
        probes.extend(self._probers[index].check().addBoth(self._probed, index)
                      for index in self._to_check())
        return defer.gatherResults(probes, consumeErrors=True)

    def _to_check(self) -> List[int]:
        count = len(self._probers)
        others = [i for i in range(count) if i != self._writing]
        first, self._check_first = self._check_first, None
        if not others:
            return []
        unprobed = [i for i in others if not self._probers[i].probes]
        if unprobed:
            return unprobed
        if first is not None and first != self._writing:
            return [first]
        index = self._next_check
        if index == self._writing:
            index = (index + 1) % count
        self._next_check = (index + 1) % count
        return [index]

    @defer.inlineCallbacks
    def _heartbeat(self) -> Generator[Any, Any, bool]:
        count = len(self._probers)
        started = index = self._writing
        tried: Set[int] = set()
        while True:
            tried.add(index)
            written = yield self._probers[index].write().addBoth(self._probed, index)
            if written:
                self._write_listeners.notify(self._probers[index].server)
                if index != started:
                    self.log.info("heartbeat now written through {new}: {old} failed",
                                  new=self._probers[index].server,
                                  old=self._probers[started].server, servers=self.name)
                return True
            untried = [(index + step) % count for step in range(1, count)
                       if (index + step) % count not in tried]
            if not untried:
                return False
            healthy = [i for i in untried if self._probers[i].healthy]
            index = self._writing = (healthy or untried)[0]
            # This server's copy of the lease is older than what the set holds now.
            self._probers[index].writer.forget()

    def start(self) -> None:
        self._cadence.start()

    def restart(self) -> None:
        """Probe now (right after the round in flight, if any)."""
        self._cadence.restart()

    def stop(self) -> defer.Deferred[None]:
        return self._cadence.stop()
