"""Health of the cloud apiservers and of the pool coordinator apiserver.

A server is judged by writing something that matters: the node's own heartbeat
lease ``kube-node-lease/<node>``. A server that accepted the heartbeat is healthy;
one that did not is not, whatever else it still answers. A probe survives what a
single request may meet on a busy link: it is one lease write tried up to
``failed_retry`` times (``probe_retry_policy`` says when), and only a probe whose
every attempt failed turns a server unhealthy. Several cloud URLs usually lead to
one cloud, and several coordinator apiservers share the pool etcd, so the node lease
is written through one server of such a set per interval and the others are read
(``ServerSet``): a node never races itself for its lease. The coordinator prober
writes the same lease to the coordinator apiservers and marks it for delegation
while the cloud is unreachable, so the pool leader forwards it to the cloud.

A cloud prober removes that mark from the cloud lease when it writes: the leader
copies the pool lease's delegate annotation into the cloud lease while it delegates,
and a node heartbeating the cloud directly again must not keep claiming delegation
there (other annotations stay untouched).

The coordinator prober also names, on the lease it writes, what this agent uses of the
pool: the coordinator apiserver the write goes through and the pool etcd member its
pool store uses (``published_url``: never credentials). Agents cannot reach each
other's status pages, so this is how each agent's pool view learns what every member
uses (``servers_in_use``). Both stay in the pool: the leader forwards only the delegate
annotation of a lease to the cloud.

While the cloud is unhealthy the coordinator prober renews the pool lease every
``delegating_interval(interval, takeover)`` instead of every ``interval``, so that a
cut-off node's cloud lease survives the death of the pool leader; a flip of the
cloud's health restarts the cadence with a probe at once. See docs/design.md,
"Delegating cadence".
"""

import copy
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, List, Optional, Set, Tuple, Union
from urllib.parse import urlsplit, urlunsplit

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from yurtcoord.heartbeat.interfaces import (
    ICloudHealthChecker, ICoordinatorHealthChecker, IKubeletLiveness,
)
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.lease import node_owner_reference, stamped_renew_time
from yurtcoord.kube.leasewriter import LeaseWriter
from yurtcoord.names import (
    COORDINATOR_SERVER_ANNOTATION, DELEGATE_HEARTBEAT_ANNOTATION, ETCD_MEMBER_ANNOTATION,
    NODE_LEASE_NAMESPACE,
)
from yurtcoord.tx.cadence import Cadence
from yurtcoord.tx.failures import describe_failure
from yurtcoord.tx.guardedloop import ILoopErrors
from yurtcoord.tx.inflight import InFlight
from yurtcoord.tx.retry import RetryPolicy, backoff_policy

if TYPE_CHECKING:
    from yurtcoord.agent.config import HeartbeatConfig
    from yurtcoord.agent.metrics import Metrics

NODE_LEASE_DURATION_SECONDS = 40
# While a node lease has no owner, seconds between reads of the Node to name it owner.
OWNER_READ_INTERVAL = 60.0
# Seconds from the pool leader's death until the next leader forwards heartbeats with
# the default election timings: lease_duration (15 s) + retry_period (2 s).
DEFAULT_TAKEOVER_SECONDS = 17.0
# What a new leader's start plus one forward may take within the cadence rule.
TAKEOVER_MARGIN_SECONDS = 1.0


def delegating_interval(interval: float, takeover: float = DEFAULT_TAKEOVER_SECONDS,
                        margin: float = TAKEOVER_MARGIN_SECONDS) -> float:
    """Seconds between pool lease renewals while the cloud is unhealthy.

    ``W / ceil(W / interval)`` with ``W = takeover + margin``: never longer than
    ``interval``, and a whole fraction of ``W`` so that the cloud lease's renewTime
    gap across a leader's death is at most ``W`` plus one cadence (see docs/design.md,
    "Delegating cadence").
    """
    if interval <= 0:
        raise ValueError("interval must be positive")
    window = takeover + margin
    if window <= 0:
        return interval
    steps = max(1, math.ceil(window / interval - 1e-9))
    return window / steps


def probe_retry_policy(interval: float, timeout: float, failed_retry: int) -> RetryPolicy:
    """The pauses between the attempts of one probe: d, 2d, 4d, ... with
    ``d = slack / 2 ** (failed_retry - 1)`` and ``slack = interval - failed_retry *
    timeout``.

    Why: a probe has ``interval`` in all (the next one is due then, and the whole
    probe is cancelled at that point) and each of its ``failed_retry`` attempts up to
    ``timeout``. The pauses share what the attempts leave, doubling as backoff does,
    and add up to ``slack - d``: even a probe whose every attempt timed out ends ``d``
    before the next probe is due, so no probe is cut short. With the defaults (10 s,
    2 s, 3) the pauses are 1 s and 2 s: a server that failed twice and answers the
    third time is still healthy 3 s later, and one that never answers is unhealthy
    after 9 s. When the attempts alone fill the interval (``slack <= 0``) the retries
    follow at once and the interval cuts the probe short.
    """
    if failed_retry < 1:
        raise ValueError(f"failed_retry must be at least 1, got {failed_retry}")
    slack = max(0.0, interval - failed_retry * timeout)
    first = slack / 2 ** (failed_retry - 1)
    # The last pause (before attempt failed_retry) is slack / 2: the cap never binds.
    return backoff_policy(initial=first, maximum=slack, factor=2.0, jitter=0.0)


@dataclass(frozen=True)
class ProbeSettings:
    """The ``[heartbeat]`` timings shared by all probers of an agent.

    Any object with these four attributes will do (``config.HeartbeatConfig`` has them).
    """

    interval: float = 10.0
    timeout: float = 2.0
    failed_retry: int = 3
    healthy_threshold: int = 2


# The timings a prober is given: ``ProbeSettings`` or the agent's ``[heartbeat]`` section.
Settings = Union[ProbeSettings, "HeartbeatConfig"]
# The annotations a node lease writer sets, None meaning "remove".
Annotations = Mapping[str, Optional[str]]


def published_url(url: object) -> Optional[str]:
    """``url`` as an agent may show it to its pool: scheme, host, port and path only.

    Userinfo (``user:password@``), query and fragment are dropped, since they may carry
    credentials and what a node lease says every member of the pool reads. None when
    ``url`` is not an http(s) URL with a host: a value read from a peer's lease may be
    anything."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
        parts.port  # raises on a port that is not a number
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def servers_in_use(lease: object) -> tuple[Optional[str], Optional[str]]:
    """``(pool etcd member, coordinator apiserver)`` a node lease on the coordinator
    apiserver says its agent uses (see ``CoordinatorHealthChecker``); None for what it
    does not say, or says in anything but an http(s) URL (anything a peer wrote is
    read safely, and shown without credentials)."""
    metadata = lease.get("metadata") if isinstance(lease, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None, None
    return (published_url(annotations.get(ETCD_MEMBER_ANNOTATION)),
            published_url(annotations.get(COORDINATOR_SERVER_ANNOTATION)))


class NodeLeaseWriter:
    """Renews ``kube-node-lease/<node>`` on one apiserver through a ``LeaseWriter``.

    One renewal is tried up to ``failed_retry`` times: any error is retried after the
    pause of ``probe_retry_policy``, a conflict is read again at once, and each
    attempt is bounded by ``timeout``. ``annotations`` is an optional callable
    returning ``{name: value}`` to set on every write, a value of None meaning
    "remove this annotation".

    A lease this writer creates holds ``leaseDurationSeconds`` 40; a renewal keeps the
    duration the lease already has. As the kubelet does, the lease names its Node as
    owner (so it goes when the Node goes), and a lease without an owner gets it at a
    renewal: the server may not have had the Node yet when the lease was created (a
    node registering, a coordinator apiserver before the node's upload), and a Node
    read that failed must not keep the heartbeat from being written. The Node is read
    only while the lease has no owner, and then at most once per
    ``OWNER_READ_INTERVAL``: a renewal of a lease that has its owner stays one
    request, and a server that has no such Node is not asked on every renewal. A Node
    read that fails or hangs leaves the lease without an owner for that write (a hung
    read costs that attempt only: the next one, within the interval, does not read).

    Every write's renewTime is local now, or 1 µs past the renewTime the lease holds
    when that is later (``_renewed``): the lease's renewTime only moves forward,
    whoever wrote it last and with whatever clock.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, client: IObjectClient, node_name: str,
                 settings: Settings,
                 annotations: Optional[Callable[[], Annotations]] = None) -> None:
        self._clock = clock
        self._client = client
        self._node = node_name
        self._annotations = annotations or (lambda: {})
        # When the Node was last read for the lease's owner (local clock), or None.
        self._owner_read_at: Optional[float] = None
        self._writer = LeaseWriter(
            clock, client, NODE_LEASE_NAMESPACE, node_name,
            attempts=settings.failed_retry, retry_errors=True,
            retry_policy=probe_retry_policy(settings.interval, settings.timeout,
                                            settings.failed_retry),
            attempt_timeout=settings.timeout)

    def renew(self) -> defer.Deferred[Optional[dict]]:
        """Write a fresh renewTime. Fires with the written lease; fails with
        ``LeaseWriteFailed`` when the last attempt still conflicted, or with the last
        attempt's error."""
        return self._writer.write(self._change).addCallback(lambda result: result.lease)

    def read(self) -> defer.Deferred[Optional[dict]]:
        """Read the lease, with the same attempts, pauses and timeouts as a renewal
        (a server is checked without writing). Fires with the lease, None when the
        server has none."""
        self._writer.forget()
        return self._writer.write(lambda current: None).addCallback(
            lambda result: result.lease)

    def forget(self) -> None:
        """Read the lease before the next write: another writer may have renewed it."""
        self._writer.forget()

    def _change(self, current: Optional[dict]) -> Union[dict, defer.Deferred[dict]]:
        if current is None:
            return self._fresh_lease()
        if not _has_owner(current) and self._owner_read_due():
            return self._with_owner(current).addCallback(self._renewed)
        return self._renewed(current)

    def _apply_annotations(self, metadata: dict) -> None:
        annotations = dict(metadata.get("annotations") or {})
        for name, value in self._annotations().items():
            if value is None:
                annotations.pop(name, None)
            else:
                annotations[name] = value
        if annotations:
            metadata["annotations"] = annotations
        else:
            metadata.pop("annotations", None)

    def _fresh_lease(self) -> Union[dict, defer.Deferred[dict]]:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"leaseDurationSeconds": NODE_LEASE_DURATION_SECONDS},
        }
        if not self._owner_read_due():
            return self._renewed(lease)
        return self._with_owner(lease).addCallback(self._renewed)

    def _owner_read_due(self) -> bool:
        return (self._owner_read_at is None
                or self._clock.seconds() - self._owner_read_at >= OWNER_READ_INTERVAL)

    @defer.inlineCallbacks
    def _with_owner(self, lease: dict) -> Generator[Any, Any, dict]:
        """``lease`` naming the Node as owner when the server shows the Node; as it is
        when it does not, or when the read failed (logged)."""
        self._owner_read_at = self._clock.seconds()
        try:
            owner = yield node_owner_reference(self._client, self._node)
        except defer.CancelledError:
            raise
        except Exception as error:
            self.log.warn(
                "node lease {node}: cannot read Node {node} to name it owner ({error}); "
                "the lease is written without an owner, which a renewal adds later",
                node=self._node, error=error)
            return lease
        if owner is None:
            return lease
        lease = copy.deepcopy(lease)
        lease.setdefault("metadata", {})["ownerReferences"] = [owner]
        return lease

    def _renewed(self, lease: dict) -> dict:
        """``lease`` renewed by this node: holder, duration, annotations, and a
        renewTime of local now, or 1 µs past the renewTime the lease holds when that
        is not before now (docs/design.md, "Clocks"). So the renewTime this node
        writes moves forward whoever wrote last: the pool leader that forwarded this
        node's heartbeat while the cloud was cut off stamped its own clock, which may
        be minutes ahead of this one, and the node lifecycle controller counts a node
        as renewing only when the renewTime it sees moves forward. Nothing is judged
        fresh or stale here: the larger of the two times is written, that is all."""
        lease = copy.deepcopy(lease)
        self._apply_annotations(lease.setdefault("metadata", {}))
        spec = lease.setdefault("spec", {})
        spec["holderIdentity"] = self._node
        if not spec.get("leaseDurationSeconds"):
            spec["leaseDurationSeconds"] = NODE_LEASE_DURATION_SECONDS
        spec["renewTime"] = stamped_renew_time(self._clock.seconds(), spec.get("renewTime"))
        return lease


def _has_owner(lease: Mapping[str, Any]) -> bool:
    """Whether a lease names any owner: the kubelet, too, adds its Node as owner only
    to a lease that has none."""
    metadata = lease.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("ownerReferences"))


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
            self._record(False, _probe_error(failure))
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


def _probe_error(failure: Failure) -> str:
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
        self._listeners: List[Callable[[bool], object]] = []
        self._write_listeners: List[Callable[[str], object]] = []
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
        self._listeners.append(callback)

    def add_write_listener(self, callback: Callable[[str], object]) -> None:
        self._write_listeners.append(callback)

    def _prober_changed(self, _prober: LeaseProber) -> None:
        state = (self.decided, self.healthy)
        if state == self._last_state:
            return
        self._last_state = state
        healthy = state[1]
        for callback in list(self._listeners):
            try:
                callback(healthy)
            except Exception:
                self.log.failure("{name} health listener raised", name=self.name)

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
                for listener in list(self._write_listeners):
                    try:
                        listener(self._probers[index].server)
                    except Exception:
                        self.log.failure("heartbeat write listener raised")
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


@implementer(ICloudHealthChecker)
class CloudHealthChecker(ServerSet):
    """Health of the cloud: healthy when any cloud server is (see ``ServerSet``).

    ``add_listener(callback)``: ``callback(healthy)`` is called when the cloud's
    health becomes known and whenever it flips (the coordinator prober restarts its
    cadence on it).
    """

    def __init__(self, reactor: IReactorTime, probers: Iterable[LeaseProber], interval: float,
                 kubelet: Optional["KubeletHealthChecker"] = None,
                 loop_errors: Optional[ILoopErrors] = None) -> None:
        super().__init__(reactor, probers, lambda: interval, kubelet=kubelet, name="cloud",
                         loop_errors=loop_errors)

    @classmethod
    def for_servers(cls, reactor: IReactorTime, clients: Mapping[str, IObjectClient],
                    node_name: str, settings: Settings,
                    kubelet: Optional["KubeletHealthChecker"] = None,
                    metrics: Optional["Metrics"] = None) -> "CloudHealthChecker":
        """One prober per cloud server; ``clients`` maps server URL to its client.

        Each writes the node lease without the delegate annotation: a node that
        heartbeats the cloud directly is not delegating (see the module docstring).
        """
        probers = [
            LeaseProber(reactor,
                        NodeLeaseWriter(reactor, client, node_name, settings,
                                        annotations=_not_delegated),
                        url, settings, kubelet=kubelet,
                        report_health=None if metrics is None else metrics.set_server_healthy,
                        loop_errors=metrics)
            for url, client in clients.items()
        ]
        return cls(reactor, probers, settings.interval, kubelet=kubelet, loop_errors=metrics)


def _not_delegated() -> Annotations:
    return {DELEGATE_HEARTBEAT_ANNOTATION: None}


@implementer(ICoordinatorHealthChecker)
class CoordinatorHealthChecker(ServerSet):
    """Health of the coordinator apiservers, judged by writing the node lease there:
    healthy while any of them is. The apiservers share the pool etcd, so they are one
    ``ServerSet``: the lease is written through one of them, the others are read.

    While ``cloud_checker`` reports the cloud unhealthy the written lease carries
    ``openyurt.io/delegate-heartbeat: "true"`` so that the pool leader forwards it
    to the cloud, and it is renewed every ``delegating_interval(interval,
    takeover)``; once the cloud is back the annotation is removed and the cadence
    is ``interval`` again. ``takeover`` is the election's lease_duration +
    retry_period. ``cloud_checker`` is an ``ICloudHealthChecker``: every flip of the
    cloud's health writes at once instead of at the next renewal.

    Every write also sets ``coordinator.openyurt.io/apiserver`` to the URL of the
    apiserver it goes through and ``coordinator.openyurt.io/etcd-member`` to
    ``etcd_member()``, the pool etcd member this agent's pool store uses (the
    annotation is removed while that is None: no pool store open), both through
    ``published_url``. They are what the pool views of the other agents show for this
    node. A change of either is written with the next renewal of the lease, within one
    interval (or delegating interval), not at once: no write of its own, so the
    requests per interval stay what they are. Read probes of the other apiservers
    write nothing.

    ``clients`` maps each coordinator apiserver URL to its client; ``metrics`` gets
    each server's health (``set_coordinator_server_healthy``).
    """

    def __init__(self, reactor: IReactorTime, clients: Mapping[str, IObjectClient],
                 node_name: str, cloud_checker: ICloudHealthChecker, settings: Settings,
                 kubelet: Optional["KubeletHealthChecker"] = None,
                 metrics: Optional["Metrics"] = None,
                 takeover: float = DEFAULT_TAKEOVER_SECONDS,
                 etcd_member: Callable[[], Optional[str]] = lambda: None) -> None:
        self._cloud = cloud_checker
        self._etcd_member = etcd_member
        self._interval = settings.interval
        self.delegating_interval = delegating_interval(settings.interval, takeover)
        report = None if metrics is None else metrics.set_coordinator_server_healthy
        probers = [
            LeaseProber(reactor,
                        NodeLeaseWriter(reactor, client, node_name, settings,
                                        annotations=functools.partial(
                                            self._lease_annotations, url)),
                        url, settings, kubelet=kubelet, report_health=report,
                        loop_errors=metrics)
            for url, client in clients.items()
        ]
        super().__init__(reactor, probers, self._next_interval, kubelet=kubelet,
                         name="coordinator", loop_errors=metrics)
        cloud_checker.add_listener(self._cloud_changed)

    def _lease_annotations(self, server: str) -> Annotations:
        """What a write of the node lease through ``server`` sets (and removes)."""
        annotations = dict(self._delegation_annotations())
        annotations[COORDINATOR_SERVER_ANNOTATION] = published_url(server)
        annotations[ETCD_MEMBER_ANNOTATION] = published_url(self._etcd_member())
        return annotations

    def _delegation_annotations(self) -> Annotations:
        # Until the cloud's health is known (an agent just started) the annotation is
        # left as the stored lease has it: neither a delegation nor its end is claimed
        # on a guess.
        if not self._cloud.decided:
            return {}
        if self._cloud.healthy:
            return {DELEGATE_HEARTBEAT_ANNOTATION: None}
        return {DELEGATE_HEARTBEAT_ANNOTATION: "true"}

    def _next_interval(self) -> float:
        return self._interval if self._cloud.healthy else self.delegating_interval

    def _cloud_changed(self, _healthy: bool) -> None:
        self.restart()


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
        self._listeners: List[Callable[[bool], object]] = []
        self._dead = False

    def add_listener(self, callback: Callable[[bool], object]) -> None:
        """``callback(alive)`` when the kubelet turns dead and when it is back."""
        self._listeners.append(callback)

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
        for callback in list(self._listeners):
            try:
                callback(alive)
            except Exception:
                self.log.failure("kubelet liveness listener raised")

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
                               url=self.url, error=_probe_error(failure))
                self.is_alive()
            return False

        d.addCallbacks(answered, failed)
        return d
