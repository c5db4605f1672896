"""Heartbeat delegation through one leader: throughput, latency, leader CPU.

    .venv/bin/python bench/delegation.py [--nodes 1000] [--period 5] [--seconds 60] [--json PATH]

Starts and stops everything itself: a real etcd; the cloud Kubernetes API test
server in a child process of its own (``--serve cloud``); the coordinator's test server
and the load generator in another (``--serve pool``); and ONE agent as a separate
``twistd -n yurtcoord`` process, which becomes the pool leader and runs the heartbeat
delegation. This process only steers them and pairs up what they print. The load
generator keeps ``--nodes`` node leases in the coordinator's store
with ``openyurt.io/delegate-heartbeat: "true"`` and renews each every ``--period``
seconds, spread evenly (1,000 nodes / 5 s = 200 renewals/s). A watch on the cloud
server's store sees every lease the leader writes there.

Figures, over ``--seconds`` after ``--warmup`` seconds:

- sustained throughput: renewals written to the cloud per second, and how many
  renewals were never written (superseded by a newer one of the same node: the
  leader falling behind) or were still missing at the end;
- latency from the pool update (the renewal written to the coordinator's store) to
  the cloud update (the cloud's store changed with that renewTime): p50, p99, max;
- CPU of the leader process only (utime + stime from /proc/<pid>/stat), as a share
  of one core; the test servers' child processes are not counted (their CPU is
  printed separately), nor is etcd;
- the leader's longest reactor lag over the window, from its ``/metrics``: the
  histogram ``yurtcoord_reactor_lag_seconds`` is read at the start and at the end of
  the window, and the upper bound of the highest bucket that gained an observation is
  reported as "at most X" (the histogram keeps no exact maximum).

Targets: keeps up with 200 renewals/s (nothing superseded or missing), p99 <= 250 ms
on loopback, the leader under half a core (``LEADER_CPU_TARGET``). ``--json PATH``
writes the figures and targets (see bench/benchresult.py).
"""

import argparse
import cProfile
import gc
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchresult import row, write_result  # noqa: E402
from twisted.internet import defer, protocol, stdio, task  # noqa: E402
from twisted.internet.threads import deferToThread  # noqa: E402
from twisted.protocols.basic import LineOnlyReceiver  # noqa: E402
from twisted.web.client import Agent, readBody  # noqa: E402

from yurtcoord.kube.gvr import LEASES  # noqa: E402
from yurtcoord.kube.lease import format_micro_time  # noqa: E402
from yurtcoord.names import (  # noqa: E402
    DELEGATE_HEARTBEAT_ANNOTATION, ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE,
)
from yurtcoord.sim.apiserver import KubeAPIServer  # noqa: E402
from yurtcoord.sim.apiserver.selectors import ObjectFilter  # noqa: E402
from yurtcoord.sim.agentini import FAULT_SUITE, configuration_defaults  # noqa: E402
from yurtcoord.sim.etcd import EtcdProcess, etcd_binary_for  # noqa: E402
from yurtcoord.testing.poll import poll_until  # noqa: E402
from yurtcoord.testing.world import (  # noqa: E402
    LISTENING_MARK, TWISTD, add_pool_node, agent_ini, child_environment, tail,
)

LEADER = "bench-leader"
# The leader's share of one core the delegation may take, in percent: 1,000 delegations
# a second (5,000 nodes renewing every 5 s) at 0.5 ms of CPU each leave it half a core.
LEADER_CPU_TARGET = 50
TICK = 0.01  # seconds between renewal batches of the load generator
CLK_TCK = os.sysconf("SC_CLK_TCK")
# A directory: the leader runs under twistd's cProfile (leader.pstats, written when it
# stops), this process profiles the measured window (bench.pstats), and the leader's
# log is copied there at the end (leader.log).
PROFILE_ENV = "YURTCOORD_BENCH_PROFILE"


def process_cpu_seconds(pid):
    """utime + stime of process ``pid`` in seconds (fields 14 and 15 of its stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


LAG_BUCKET = re.compile(
    r'^yurtcoord_reactor_lag_seconds_bucket\{(?:[^}]*,)?le="(?P<le>[^"]+)"[^}]*\} (?P<n>\S+)$',
    re.M)


def status_url(log_path):
    """The agent's status URL as its log announces it, or None before it listens."""
    for line in tail(log_path, 400).splitlines():
        if LISTENING_MARK in line:
            return line.split(LISTENING_MARK, 1)[1].split()[0]
    return None


@defer.inlineCallbacks
def reactor_lag_buckets(reactor, url):
    """``{upper bound: cumulative count}`` of the agent's ``yurtcoord_reactor_lag_seconds``."""
    response = yield Agent(reactor).request(b"GET", (url.rstrip("/") + "/metrics").encode())
    body = (yield readBody(response)).decode("utf-8")
    buckets = {float(m["le"]): float(m["n"]) for m in LAG_BUCKET.finditer(body)}
    if not buckets:
        raise RuntimeError(f"{url}/metrics has no yurtcoord_reactor_lag_seconds histogram")
    return buckets


def longest_lag_bound(before, after):
    """The upper bound of the highest bucket that gained observations between two
    readings of the histogram (``inf`` past the last bound), None if none did."""
    gained = {le: after[le] - before.get(le, 0.0) for le in after}
    total = gained.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return min(le for le, n in gained.items() if n >= total)


def lag_bound_text(bound):
    if bound is None:
        return "no probe call in the window"
    if bound == float("inf"):
        return "more than the highest bucket"
    return f"at most {1000 * bound:g} ms (histogram bucket)"


def percentile(sorted_values, fraction):
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * len(sorted_values))) - 1))
    return sorted_values[index]


def node_name(index):
    return f"edge-{index:05d}"


def delegated_lease(name, seconds):
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                         "annotations": {DELEGATE_HEARTBEAT_ANNOTATION: "true"}},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": format_micro_time(seconds)}}


class _Child(protocol.ProcessProtocol):
    def __init__(self):
        self.ended = defer.Deferred()

    def processEnded(self, reason):
        self.ended.callback(None)


class _Side(protocol.ProcessProtocol):
    """A child process of the bench (``--serve cloud`` or ``--serve pool``): its
    stdout lines go to ``on_line(words)``, its stderr to the bench's stderr."""

    def __init__(self, on_line):
        self.on_line = on_line
        self.ended = defer.Deferred()
        self.url = None
        self._buffer = b""

    def outReceived(self, data):
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            words = line.decode("utf-8").split()
            if words and words[0] == "url":
                self.url = words[1]
            elif words:
                self.on_line(words)

    def errReceived(self, data):
        sys.stderr.write(data.decode("utf-8", "replace"))

    def send(self, command):
        self.transport.write(command.encode("ascii") + b"\n")

    def processEnded(self, reason):
        self.ended.callback(None)


class Tracker:
    """What the bench process keeps: every renewal the pool side wrote (``renewed``
    lines) matched with the cloud side's next ``seen`` line for that node. The cloud's
    renewTime is the leader's own time, not the node's (docs/design.md, "Clocks"), so
    a cloud write is matched to the node's newest pool write before it, not by its
    renewTime. The two arrive on different pipes, so a cloud write seen before the
    line of the renewal it forwards arrived waits in ``early``."""

    def __init__(self):
        self.pending = {}  # name -> pool write time of its newest renewal not yet in the cloud
        self.early = {}  # name -> cloud time of a write whose renewal is not yet known
        self.latencies = []  # (pool write time, seconds to the cloud)
        self.superseded = 0
        self.renewed = 0
        self.in_cloud = set()  # names with a lease in the cloud
        self.election_holder = None
        self.measuring_since = None

    def pool_line(self, words):
        if words[0] == "renewed":
            self._track(words[1], float(words[3]))
        elif words[0] == "election":
            self.election_holder = words[1] if len(words) > 1 else None

    def _track(self, name, at):
        if self.pending.pop(name, None) is not None:
            self.superseded += 1
        self.renewed += 1
        seen_at = self.early.pop(name, None)
        if seen_at is not None and seen_at >= at:
            self._arrived(at, seen_at)
        else:
            self.pending[name] = at

    def cloud_line(self, words):
        if words[0] != "seen":
            return
        name, seen_at = words[1], float(words[3])
        self.in_cloud.add(name)
        written_at = self.pending.pop(name, None)
        if written_at is None:
            self.early[name] = seen_at
            return
        self._arrived(written_at, seen_at)

    def _arrived(self, written_at, seen_at):
        if self.measuring_since is not None and written_at >= self.measuring_since:
            self.latencies.append((written_at, seen_at - written_at))


class LoadGenerator:
    """In the pool side's process: renews every node's pool lease once per ``period``,
    in batches every ``TICK``, and prints ``renewed <name> <renewTime> <when>`` for
    each renewal (``when``: ``time.monotonic()``, the same clock in every process)."""

    def __init__(self, reactor, coordinator, nodes, period, out):
        self.reactor = reactor
        self.coordinator = coordinator
        self.names = [node_name(i) for i in range(nodes)]
        self.period = period
        self.out = out
        self._started_at = None
        self._issued = 0
        self._next = 0
        self._loop = None

    def create_all(self):
        """Every node's delegated lease in the coordinator."""
        now = self.reactor.seconds()
        for name in self.names:
            lease = delegated_lease(name, now)
            self.coordinator.store.create(LEASES, lease, namespace=NODE_LEASE_NAMESPACE)
            self.out.append(f"renewed {name} {lease['spec']['renewTime']} {time.monotonic()!r}")

    def renew(self, name):
        now = self.reactor.seconds()
        current = self.coordinator.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
        lease = delegated_lease(name, now)
        lease["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self.coordinator.store.update(LEASES, lease, namespace=NODE_LEASE_NAMESPACE)
        self.out.append(f"renewed {name} {lease['spec']['renewTime']} {time.monotonic()!r}")

    def _tick(self):
        # As many renewals as the elapsed time asks for: a late tick catches up, so
        # the offered rate is exact whatever the timer's jitter.
        due = int((self.reactor.seconds() - self._started_at) * len(self.names) / self.period)
        while self._issued < due:
            self._issued += 1
            self.renew(self.names[self._next])
            self._next = (self._next + 1) % len(self.names)
        self.out.flush()

    def start(self):
        self._started_at = self.reactor.seconds()
        self._issued = 0
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.reactor
        self._loop.start(TICK, now=True)

    def stop(self):
        if self._loop is not None and self._loop.running:
            self._loop.stop()


class Lines(list):
    """Lines to the bench process, written through the child's ``StandardIO``
    transport (it makes stdout non-blocking, so plain writes could be cut short)."""

    transport = None

    def flush(self):
        if self:
            self.transport.write(("\n".join(self) + "\n").encode("utf-8"))
            del self[:]


@defer.inlineCallbacks
def serve_cloud(reactor, args):
    """``--serve cloud``: the cloud API test server with the pool's Nodes; prints its
    URL, then ``seen <name> <renewTime> <when>`` for every node lease written."""
    cloud = KubeAPIServer(reactor)
    yield cloud.start()
    for index in range(args.nodes):
        add_pool_node(cloud, node_name(index))
    freeze_heap()
    forgetting = keep_no_request_records(reactor, cloud)
    out = Lines()
    stdin_ended = serve_stdio(reactor, out, {})

    def changed(event_type, lease):
        if event_type in ("ADDED", "MODIFIED"):
            out.append(f"seen {lease['metadata']['name']} {lease['spec'].get('renewTime')} "
                       f"{time.monotonic()!r}")

    cloud.store.watch(LEASES, ObjectFilter(namespace=NODE_LEASE_NAMESPACE), None, changed)
    flusher = task.LoopingCall(out.flush)
    flusher.clock = reactor
    flusher.start(TICK)
    out.append(f"url {cloud.url}")
    out.flush()
    yield stdin_ended
    flusher.stop()
    forgetting.stop()
    yield cloud.stop()


@defer.inlineCallbacks
def serve_pool(reactor, args):
    """``--serve pool``: the coordinator API test server and the load generator;
    prints its URL and ``election <holder>`` when the election lease changes, and
    takes ``create``, ``start`` and ``stop`` on stdin."""
    coordinator = KubeAPIServer(reactor)
    yield coordinator.start()
    forgetting = keep_no_request_records(reactor, coordinator)
    out = Lines()
    load = LoadGenerator(reactor, coordinator, args.nodes, args.period, out)
    commands = {"start": load.start, "stop": load.stop}
    stdin_ended = serve_stdio(reactor, out, commands)

    def election(event_type, lease):
        if lease["metadata"]["name"] == ELECTION_LEASE_NAME and event_type != "DELETED":
            out.append(f"election {lease['spec'].get('holderIdentity')}")
            out.flush()

    coordinator.store.watch(LEASES, ObjectFilter(namespace=ELECTION_LEASE_NAMESPACE), None,
                            election)
    out.append(f"url {coordinator.url}")
    out.flush()

    def create():
        load.create_all()
        freeze_heap()
        out.flush()

    commands["create"] = create
    yield stdin_ended
    load.stop()
    forgetting.stop()
    yield coordinator.stop()


def keep_no_request_records(reactor, server):
    """The bench reads none of the test server's records of the requests it answered,
    and at a request or two per delegation they would grow by a hundred thousand a
    minute (a Lease write's record holds the Lease answered): every full collection
    would walk more of them, a stall growing over the run. The request log keeps
    none (its bound is 0) and the lists of requests and answers are emptied each
    second. Returns the LoopingCall doing that."""
    server.request_log_limit = 0

    def forget():
        del server.requests[:]
        del server.answers[:]

    forgetting = task.LoopingCall(forget)
    forgetting.clock = reactor
    forgetting.start(1.0)
    return forgetting


def freeze_heap():
    """Collect once, then leave what the test server holds now (the pool's Nodes, the
    first leases) out of every later collection: a full collection walks every object
    the process holds, and over thousands of Nodes it stalls every request in flight
    for a few hundred milliseconds on a loaded machine, which a real API server does
    not do. Objects replaced later are still freed by reference counting."""
    gc.collect()
    gc.freeze()


def serve_stdio(reactor, out, commands):
    """Run the commands read line by line on stdin and give ``out`` its transport;
    fires when stdin ends (the bench process closed it or died)."""
    ended = defer.Deferred()

    class Commands(LineOnlyReceiver):
        delimiter = b"\n"

        def lineReceived(self, line):
            commands[line.decode("ascii").strip()]()

        def connectionLost(self, reason):
            ended.callback(None)

    commander = Commands()
    stdio.StandardIO(commander, reactor=reactor)
    out.transport = commander.transport
    return ended


# The configuration defaults of every timing the fault suite shortens.
DEFAULT_TIMINGS = configuration_defaults(FAULT_SUITE)


def leader_ini(directory, cloud_url, coordinator_url, etcd_url):
    return agent_ini(LEADER, cloud_url, coordinator_url, etcd_url,
                     os.path.join(directory, "pki"), os.path.join(directory, "cache"),
                     "127.0.0.1:0", **DEFAULT_TIMINGS)


def spawn_side(reactor, role, args, on_line):
    """A child process of this script serving ``role`` (cloud or pool)."""
    side = _Side(on_line)
    script = os.path.abspath(__file__)
    argv = [sys.executable, script, "--serve", role, "--nodes", str(args.nodes),
            "--period", repr(args.period)]
    side.pid = reactor.spawnProcess(side, sys.executable, argv, env=child_environment()).pid
    return side


@defer.inlineCallbacks
def stop_side(reactor, side):
    """Close its stdin (it stops on its own), SIGKILL after 15 s."""
    if side is None or side.ended.called:
        return
    side.transport.closeStdin()
    timer = reactor.callLater(15, lambda: not side.ended.called and os.kill(
        side.pid, signal.SIGKILL))
    yield side.ended
    if timer.active():
        timer.cancel()


@defer.inlineCallbacks
def run(reactor, args):
    base = tempfile.mkdtemp(prefix="yurtcoord-bench-delegation-")
    profile_dir = os.environ.get(PROFILE_ENV)
    etcd = EtcdProcess(etcd_binary_for("3.5") or etcd_binary_for("3.4"))
    tracker = Tracker()
    child = cloud = pool = None
    log_path = os.path.join(base, "leader.log")
    try:
        yield deferToThread(etcd.start)
        cloud = spawn_side(reactor, "cloud", args, tracker.cloud_line)
        pool = spawn_side(reactor, "pool", args, tracker.pool_line)
        yield poll_until(lambda: cloud.url and pool.url, 60.0, 0.05, reactor,
                         what="the cloud and coordinator API test servers")
        os.makedirs(os.path.join(base, "cache"))
        ini_path = os.path.join(base, "leader.ini")
        with open(ini_path, "w", encoding="utf-8") as f:
            f.write(leader_ini(base, cloud.url, pool.url, etcd.client_url))
        child = _Child()
        profiling = []
        if profile_dir:
            # twistd's own profiler, written when the leader stops.
            profiling = [f"--profile={os.path.join(profile_dir, 'leader.pstats')}",
                         "--profiler=cprofile", "--savestats"]
        with open(log_path, "ab") as log, open(os.devnull, "rb") as null:
            transport = reactor.spawnProcess(
                child, TWISTD,
                [TWISTD, "--nodaemon", "--pidfile=", *profiling, "yurtcoord", "--config", ini_path],
                env=child_environment(), path=base,
                childFDs={0: null.fileno(), 1: log.fileno(), 2: log.fileno()})
        pid = transport.pid
        yield poll_until(lambda: tracker.election_holder == LEADER, 60.0, 0.05, reactor,
                         what="the agent leading the pool")
        yield poll_until(lambda: status_url(log_path), 30.0, 0.05, reactor,
                         what="the agent's status pages")
        leader_url = status_url(log_path)

        began = time.monotonic()
        # The renewals start at once: the leases of a pool that has just been listed
        # keep renewing, and a renewal still queued after the heartbeat interval plus
        # the clock skew is refused as stale by the leader (the next one goes through).
        pool.send("create")
        pool.send("start")
        names = {node_name(index) for index in range(args.nodes)}
        # (The leader's own node lease is in the cloud too.)
        yield poll_until(lambda: tracker.in_cloud >= names, 120.0, 0.05, reactor,
                         what=f"{args.nodes} leases created in the cloud")
        initial = time.monotonic() - began
        print(f"initial burst: {args.nodes} leases created in the cloud in {initial:.2f}s "
              f"({args.nodes / initial:.0f}/s), renewals running")
        yield task.deferLater(reactor, args.warmup, lambda: None)
        tracker.measuring_since = time.monotonic()
        profiler = None
        if profile_dir:
            profiler = cProfile.Profile()
            profiler.enable()
        renewed_before, superseded_before = tracker.renewed, tracker.superseded
        cpu_leader = process_cpu_seconds(pid)
        cpu_sides = [process_cpu_seconds(cloud.pid), process_cpu_seconds(pool.pid)]
        cpu_self = time.process_time()
        wall = time.monotonic()
        load_before = os.getloadavg()
        lag_before = yield reactor_lag_buckets(reactor, leader_url)
        yield task.deferLater(reactor, args.seconds, lambda: None)
        measured_until = time.monotonic()
        wall = measured_until - wall
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, "bench.pstats"))
        cpu_leader = process_cpu_seconds(pid) - cpu_leader
        cpu_cloud = process_cpu_seconds(cloud.pid) - cpu_sides[0]
        cpu_pool = process_cpu_seconds(pool.pid) - cpu_sides[1]
        lag_bound = longest_lag_bound(lag_before,
                                      (yield reactor_lag_buckets(reactor, leader_url)))
        cpu_self = time.process_time() - cpu_self
        renewed = tracker.renewed - renewed_before
        superseded = tracker.superseded - superseded_before
        pool.send("stop")
        # Renewals of the window still on their way get a few seconds to arrive.
        yield poll_until(lambda: not any(
            at < measured_until for at in tracker.pending.values()), 10.0, 0.05, reactor,
            what="the window's renewals in the cloud").addErrback(lambda _: None)
        missing = sum(1 for at in tracker.pending.values()
                      if tracker.measuring_since <= at < measured_until)
        window = [lat for at, lat in tracker.latencies if at < measured_until]
        window.sort()
        load_after = os.getloadavg()
        print(f"nodes={args.nodes} period={args.period}s offered={renewed / wall:.1f}/s "
              f"over {wall:.1f}s")
        print(f"delegated={len(window)} ({len(window) / wall:.1f}/s) "
              f"superseded={superseded} missing={missing}")
        print(f"latency pool->cloud: p50={percentile(window, 0.50) * 1000:.1f}ms "
              f"p99={percentile(window, 0.99) * 1000:.1f}ms "
              f"max={(window[-1] if window else float('nan')) * 1000:.1f}ms")
        print(f"leader CPU: {cpu_leader:.2f}s in {wall:.1f}s = "
              f"{100 * cpu_leader / wall:.1f}% of one core "
              f"({1000 * cpu_leader / max(1, len(window)):.2f} ms per delegation)")
        print(f"leader's longest reactor lag in the window: {lag_bound_text(lag_bound)}")
        print(f"CPU, % of one core: cloud server {100 * cpu_cloud / wall:.1f}, coordinator "
              f"server + load generator {100 * cpu_pool / wall:.1f}, bench process "
              f"{100 * cpu_self / wall:.1f}")
        print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
              f"on {os.cpu_count()} cores")
        kept_up = superseded == 0 and missing == 0 and len(window) >= 0.99 * renewed
        p99_ok = percentile(window, 0.99) <= 0.250
        cpu_ok = 100 * cpu_leader / wall < LEADER_CPU_TARGET
        print(f"targets: keeps up {'OK' if kept_up else 'MISSED'}, "
              f"p99 <= 250 ms {'OK' if p99_ok else 'MISSED'}, "
              f"leader < {LEADER_CPU_TARGET:g}% of one core {'OK' if cpu_ok else 'MISSED'}")
        offered, delegated = renewed / wall, len(window) / wall
        p50, p99 = percentile(window, 0.50) * 1000, percentile(window, 0.99) * 1000
        leader_cpu = 100 * cpu_leader / wall
        rows = [
            row(f"delegated heartbeats ({args.nodes} nodes, every {args.period:g} s)",
                f"{delegated:.1f}/s of {offered:.1f}/s offered, {superseded} superseded, "
                f"{missing} missing", f">= {args.nodes / args.period:g}/s, none lost", kept_up),
            row("latency pool -> cloud, p50", f"{p50:.1f} ms", "<= 250 ms", p50 <= 250),
            row("latency pool -> cloud, p99", f"{p99:.1f} ms", "<= 250 ms", p99_ok),
            row("leader CPU", f"{leader_cpu:.1f}% of one core, "
                f"{1000 * cpu_leader / max(1, len(window)):.2f} ms per delegation",
                f"< {LEADER_CPU_TARGET:g}%", leader_cpu < LEADER_CPU_TARGET),
            row("CPU of the test servers (child processes)",
                f"cloud {100 * cpu_cloud / wall:.1f}%, coordinator + load generator "
                f"{100 * cpu_pool / wall:.1f}% of one core"),
            row("initial burst (leases created in the cloud, renewals running)",
                f"{args.nodes} in {initial:.2f} s"),
            row("leader's longest reactor lag in the window (its /metrics)",
                lag_bound_text(lag_bound)),
        ]
        write_result(args.json, f"delegation ({args.nodes} nodes)",
                     {"nodes": args.nodes, "period": args.period, "seconds": args.seconds,
                      "warmup": args.warmup},
                     {"offered_per_s": offered, "delegated_per_s": delegated,
                      "superseded": superseded, "missing": missing, "p50_ms": p50,
                      "p99_ms": p99, "max_ms": (window[-1] if window else float("nan")) * 1000,
                      "leader_cpu_percent": leader_cpu,
                      "cloud_cpu_percent": 100 * cpu_cloud / wall,
                      "pool_cpu_percent": 100 * cpu_pool / wall,
                      "bench_cpu_percent": 100 * cpu_self / wall,
                      "initial_burst_s": initial, "load_before": load_before[0],
                      "leader_reactor_lag_at_most_s": lag_bound,
                      "load_after": load_after[0]}, rows)
    except Exception:
        print(tail(log_path, 40), file=sys.stderr)
        raise
    finally:
        if child is not None and not child.ended.called:
            os.kill(pid, signal.SIGTERM)
            timer = reactor.callLater(15, lambda: not child.ended.called and os.kill(
                pid, signal.SIGKILL))
            yield child.ended
            if timer.active():
                timer.cancel()
        yield stop_side(reactor, pool)
        yield stop_side(reactor, cloud)
        yield deferToThread(etcd.stop)
        if profile_dir and os.path.exists(log_path):
            shutil.copy(log_path, profile_dir)
        shutil.rmtree(base, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--period", type=float, default=5.0,
                        help="seconds between two renewals of one node's lease")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--serve", choices=["cloud", "pool"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "cloud":
        task.react(serve_cloud, [args])
    elif args.serve == "pool":
        task.react(serve_pool, [args])
    else:
        task.react(run, [args])


if __name__ == "__main__":
    main()
