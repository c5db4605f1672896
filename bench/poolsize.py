"""Pool-size figures: what pools of N agents cost the cloud, the coordinator apiserver
and the pool etcd at the shipped timings, each agent's RSS and idle CPU, and how long
another agent takes to hold the election lease once the leader is SIGKILLed.

    .venv/bin/python bench/poolsize.py [--sizes 5 20 40] [--window 60] [--settle 20]
        [--pods 10] [--json PATH]

For each size, one after the other, a pool starts on loopback and is stopped again
(``yurtcoord.testing.world``'s ``ProcessWorld``, as the e2e suites run it): a real etcd,
the cloud and coordinator Kubernetes API test servers in this process (the coordinator
apiserver keeps its objects in the pool etcd), and N agents, each a separate ``twistd
-n yurtcoord`` process with its own stand-in kubelet, ``--pods`` pods in its local
cache and the configuration defaults for every timing the fault suite's ini shortens
(leader election 15 s / 10 s / 2 s / 5 s, heartbeat every 10 s, informer sync lease
every 10 s, kubelet grace period 40 s). Agents are started ``START_BATCH`` at a time
(each batch listening before the next starts: twistd start-up is CPU-bound and the
machine has two cores).

Once one agent leads, every other follows it, all are ready and the pool etcd holds
every uploaded pod, the pool gets ``--settle`` seconds, then a window of ``--window``
seconds is measured:

- cloud and coordinator requests: the answers of the test servers' request logs whose
  time falls in the window (every agent reaches both through loopback, so a request is
  told apart by what it asks, not by who asks), per second, and per agent (/ N);
- pool etcd requests: the growth of etcd's own ``grpc_server_started_total`` (its
  ``/metrics``; the agents' HTTP/JSON gateway calls and the coordinator apiserver's
  reads and writes are all gRPC calls there) over the window, by gRPC method;
- RSS: ``VmRSS`` of each agent process at the end of the window;
- idle CPU: utime + stime of each agent process (``/proc/<pid>/stat``) over the window,
  as a share of one core; the bench process (the test apiservers, proxies and stand-in
  kubelets) and etcd are measured the same way;
- load average at the window's start and end: the CPU figures move with other load.

Then the leader (the election lease's holder) is SIGKILLed and the coordinator's
election lease is read every 50 ms until another agent holds it (as the fault suite
judges a takeover): the takeover time; and then until every other agent's ``/status``
follows the new leader and is ready.

Every process is stopped at the end of each pool, also on an exception, Ctrl-C or
SIGTERM (a before-shutdown trigger stops the pool running then). ``--json PATH``
writes the figures (see bench/benchresult.py).
"""

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchresult import row, write_result  # noqa: E402
from footprint import DEFAULT_KUBELET_GRACE_PERIOD, DEFAULT_TIMINGS, cpu_seconds  # noqa: E402
from footprint import agent_pid, status_kib  # noqa: E402
from twisted.internet import defer, task  # noqa: E402

# Agents spawned together; each batch listens before the next one is spawned.
START_BATCH = 5
# Seconds for every agent of a pool to be ready under one leader, and for the uploads.
SETTLE_TIMEOUT = 600.0
# Seconds for another agent to take the election lease, and for all to follow it.
TAKEOVER_TIMEOUT = 120.0
TAKEOVER_POLL = 0.05
REQUEST_METRIC = "grpc_server_started"
_LEASE = re.compile(r"^/apis/coordination\.k8s\.io/[^/]+/namespaces/([^/]+)/leases(?:/([^/?]+))?")
_RESOURCE = re.compile(r"^/(?:api|apis/[^/]+)/[^/]+/(?:namespaces/[^/]+/)?([^/?]+)")


def request_kind(method, path, election_lease):
    """What a logged request asks, for the breakdown: the election lease, the node
    leases, or method and resource (``GET nodes``, ``WATCH pods``...)."""
    lease = _LEASE.match(path)
    if lease:
        namespace, name = lease.groups()
        if (namespace, name) == election_lease:
            return f"{method} election lease"
        if namespace == "kube-node-lease":
            return f"{method} node leases"
        return f"{method} leases in {namespace}"
    resource = _RESOURCE.match(path)
    return f"{method} {resource.group(1) if resource else path}"


def count_requests(log, began, ended, election_lease):
    """``{kind: count}`` of the logged answers sent within [began, ended)."""
    kinds = {}
    for record in log:
        if began <= record.at < ended:
            method = "WATCH" if "watch=" in record.query else record.method
            kind = request_kind(method, record.path, election_lease)
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@defer.inlineCallbacks
def etcd_requests(world):
    """``{grpc method: calls started}`` of the pool etcd now, from its ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    response = yield world.http.get(world.etcd.local_client_url + "/metrics")
    text = yield response.text()
    started = {}
    for family in text_string_to_metric_families(text):
        if family.name != REQUEST_METRIC:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                method = sample.labels.get("grpc_method", "?")
                started[method] = started.get(method, 0) + sample.value
    return started


def rates(counts, seconds):
    """``{kind: per second}``, largest first."""
    return {kind: n / seconds for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def own_cpu_seconds():
    times = os.times()
    return times.user + times.system


class Pools:
    """The pool running now, stopped by ``stop()`` (also from a shutdown trigger)."""

    def __init__(self):
        self.world = None

    def stop(self):
        world, self.world = self.world, None
        return defer.succeed(None) if world is None else world.stop()


@defer.inlineCallbacks
def one_pool(reactor, pools, options, size):
    from yurtcoord.testing.poll import poll_until
    from yurtcoord.testing.world import (
        ELECTION_LEASE, ELECTION_NAMESPACE, PODS_PREFIX, ProcessWorld, leader_of,
        one_leader_all_ready,
    )

    world = pools.world = ProcessWorld(reactor,
                                       kubelet_grace_period=DEFAULT_KUBELET_GRACE_PERIOD)
    result = {"size": size, "load_start": os.getloadavg()}
    try:
        yield world.start()
        nodes = [f"node-{index:02d}" for index in range(size)]
        for node in nodes:
            yield world.add_agent(node, pods=options.pods)
        began = reactor.seconds()
        for first in range(0, size, START_BATCH):
            yield world.start_agents(nodes[first:first + START_BATCH], **DEFAULT_TIMINGS)
        result["all_listening_s"] = reactor.seconds() - began
        statuses = yield world.wait_for_pool(
            f"one leader among {size} agents, all following it, all ready",
            lambda s: one_leader_all_ready(s, size), SETTLE_TIMEOUT, interval=1.0)
        result["all_ready_s"] = reactor.seconds() - began
        expected_pods = size * options.pods

        @defer.inlineCallbacks
        def uploaded():
            count = yield world.count_etcd(PODS_PREFIX)
            return count >= expected_pods

        yield poll_until(uploaded, SETTLE_TIMEOUT, 1.0, reactor,
                         what=f"{expected_pods} uploaded pods in the pool etcd")
        print(f"pool of {size}: all listening after {result['all_listening_s']:.0f} s, "
              f"ready under {leader_of(statuses)} after {result['all_ready_s']:.0f} s; "
              f"settling {options.settle:g} s", flush=True)
        yield task.deferLater(reactor, options.settle, lambda: None)

        leader = yield world.election_holder()
        pids = {node: agent_pid(agent.ini_path) for node, agent in world.agents.items()}
        etcd_pid = world.etcd.pid
        cpu_before = {node: cpu_seconds(pid) for node, pid in pids.items()}
        etcd_cpu_before = cpu_seconds(etcd_pid)
        own_before = own_cpu_seconds()
        etcd_before = yield etcd_requests(world)
        window_start, load_before = reactor.seconds(), os.getloadavg()
        yield task.deferLater(reactor, options.window, lambda: None)
        window_end, load_after = reactor.seconds(), os.getloadavg()
        etcd_after = yield etcd_requests(world)
        seconds = window_end - window_start
        cpu = {node: 100 * (cpu_seconds(pid) - cpu_before[node]) / seconds
               for node, pid in pids.items()}
        rss = {node: status_kib(pid, "VmRSS") / 1024 for node, pid in pids.items()}
        result["etcd_cpu_percent"] = 100 * (cpu_seconds(etcd_pid) - etcd_cpu_before) / seconds
        result["bench_cpu_percent"] = 100 * (own_cpu_seconds() - own_before) / seconds
        holder_after = yield world.election_holder()
        election = (ELECTION_NAMESPACE, ELECTION_LEASE)
        cloud, coordinator = world.servers()
        cloud_counts = count_requests(cloud.request_log, window_start, window_end, election)
        coordinator_counts = count_requests(coordinator.request_log, window_start,
                                            window_end, election)
        etcd_counts = {method: etcd_after.get(method, 0) - etcd_before.get(method, 0)
                       for method in etcd_after}
        etcd_counts = {method: n for method, n in etcd_counts.items() if n}
        followers = [node for node in nodes if node != leader]
        result.update({
            "window_s": seconds, "load_window": [load_before[0], load_after[0]],
            "leader": leader, "leader_changed_in_window": holder_after != leader,
            "cloud_per_s": sum(cloud_counts.values()) / seconds,
            "coordinator_per_s": sum(coordinator_counts.values()) / seconds,
            "etcd_per_s": sum(etcd_counts.values()) / seconds,
            "cloud_by_kind_per_s": rates(cloud_counts, seconds),
            "coordinator_by_kind_per_s": rates(coordinator_counts, seconds),
            "etcd_by_method_per_s": rates(etcd_counts, seconds),
            "cloud_failed": sum(1 for r in cloud.request_log
                                if window_start <= r.at < window_end and r.code >= 400),
            "coordinator_failed": sum(1 for r in coordinator.request_log
                                      if window_start <= r.at < window_end
                                      and r.code >= 400),
            "rss_mib": rss, "cpu_percent": cpu,
            "leader_rss_mib": rss.get(leader), "leader_cpu_percent": cpu.get(leader),
            "follower_rss_mib_median": statistics.median(rss[n] for n in followers),
            "follower_rss_mib_max": max(rss[n] for n in followers),
            "follower_cpu_percent_median": statistics.median(cpu[n] for n in followers),
            "follower_cpu_percent_max": max(cpu[n] for n in followers),
            "agents_cpu_percent_total": sum(cpu.values()),
        })
        for key in ("cloud", "coordinator", "etcd"):
            result[f"{key}_per_agent_per_s"] = result[f"{key}_per_s"] / size
        print_window(result)

        victim = world.agents[leader]
        victim.signal("KILL")
        killed_at = reactor.seconds()

        @defer.inlineCallbacks
        def taken_over():
            holder = yield world.election_holder()
            if holder not in (None, leader):
                result["new_leader"] = holder
                return True
            return False

        yield poll_until(taken_over, TAKEOVER_TIMEOUT, TAKEOVER_POLL, reactor,
                         what=f"another agent holding the election lease after {leader} "
                              "was SIGKILLed")
        result["takeover_s"] = reactor.seconds() - killed_at
        yield victim.ended
        yield world.wait_for_pool(
            f"one leader among {size - 1} agents after {leader} was SIGKILLed, all ready",
            lambda s: one_leader_all_ready(s, size - 1), TAKEOVER_TIMEOUT, interval=0.5)
        result["all_follow_s"] = reactor.seconds() - killed_at
        print(f"pool of {size}: SIGKILL of the leader {leader}: {result['new_leader']} "
              f"holds the election lease after {result['takeover_s']:.2f} s, all "
              f"{size - 1} follow it and are ready after {result['all_follow_s']:.1f} s",
              flush=True)
    finally:
        yield pools.stop()
    result["load_end"] = os.getloadavg()
    return result


def print_window(r):
    n = r["size"]
    print(f"pool of {n}, {r['window_s']:.0f} s window (load average "
          f"{r['load_window'][0]:.2f} -> {r['load_window'][1]:.2f}), leader {r['leader']}"
          f"{' (CHANGED in the window)' if r['leader_changed_in_window'] else ''}:", flush=True)
    for key, name in (("cloud", "cloud"), ("coordinator", "coordinator apiserver"),
                      ("etcd", "pool etcd")):
        breakdown = r[f"{key}_by_kind_per_s" if key != "etcd" else "etcd_by_method_per_s"]
        print(f"  {name}: {r[f'{key}_per_s']:.2f} req/s, {r[f'{key}_per_agent_per_s']:.3f} "
              f"per agent; " + ", ".join(f"{kind} {rate:.2f}" for kind, rate in breakdown.items()),
              flush=True)
    print(f"  RSS: leader {r['leader_rss_mib']:.1f} MiB, followers median "
          f"{r['follower_rss_mib_median']:.1f} / max {r['follower_rss_mib_max']:.1f} MiB",
          flush=True)
    print(f"  idle CPU (% of one core): leader {r['leader_cpu_percent']:.2f}, followers "
          f"median {r['follower_cpu_percent_median']:.2f} / max "
          f"{r['follower_cpu_percent_max']:.2f}, all agents {r['agents_cpu_percent_total']:.1f}; "
          f"etcd {r['etcd_cpu_percent']:.1f}, bench process (test apiservers, proxies, "
          f"kubelets) {r['bench_cpu_percent']:.1f}", flush=True)
    print(f"  failed answers in the window: cloud {r['cloud_failed']}, coordinator "
          f"{r['coordinator_failed']}", flush=True)


def result_rows(results):
    rows = []
    for r in results:
        n = r["size"]
        title = f"pool of {n}"
        rows += [
            row(f"{title}: cloud / coordinator apiserver / pool etcd requests per second, "
                "per agent",
                f"{r['cloud_per_agent_per_s']:.3f} / {r['coordinator_per_agent_per_s']:.2f} "
                f"/ {r['etcd_per_agent_per_s']:.2f} (pool: {r['cloud_per_s']:.1f} / "
                f"{r['coordinator_per_s']:.1f} / {r['etcd_per_s']:.1f})"),
            row(f"{title}: RSS, leader / followers (median, max)",
                f"{r['leader_rss_mib']:.1f} / {r['follower_rss_mib_median']:.1f}, "
                f"{r['follower_rss_mib_max']:.1f} MiB"),
            row(f"{title}: idle CPU, leader / followers (median, max), busy machine",
                f"{r['leader_cpu_percent']:.2f}% / {r['follower_cpu_percent_median']:.2f}%, "
                f"{r['follower_cpu_percent_max']:.2f}% of one core (load average "
                f"{r['load_window'][0]:.1f} -> {r['load_window'][1]:.1f})"),
            row(f"{title}: SIGKILL of the leader -> another agent holds the election lease "
                "(all follow it, ready)",
                f"{r['takeover_s']:.1f} s ({r['all_follow_s']:.1f} s)"),
        ]
    return rows


@defer.inlineCallbacks
def run(reactor, options):
    pools = Pools()
    # Ctrl-C or SIGTERM stop the reactor: the pool running then is stopped first.
    reactor.addSystemEventTrigger("before", "shutdown", pools.stop)
    started, load_start = time.monotonic(), os.getloadavg()
    results = []
    for size in options.sizes:
        result = yield one_pool(reactor, pools, options, size)
        results.append(result)
        write(options, results, started, load_start)
    for r in results:
        print(f"pool of {r['size']}: per agent cloud {r['cloud_per_agent_per_s']:.3f}, "
              f"coordinator {r['coordinator_per_agent_per_s']:.2f}, etcd "
              f"{r['etcd_per_agent_per_s']:.2f} req/s; RSS leader "
              f"{r['leader_rss_mib']:.1f} / follower {r['follower_rss_mib_median']:.1f} MiB; "
              f"idle CPU leader {r['leader_cpu_percent']:.2f}% / follower "
              f"{r['follower_cpu_percent_median']:.2f}%; takeover {r['takeover_s']:.1f} s",
              flush=True)
    print(f"whole run {(time.monotonic() - started) / 60:.1f} min, load average "
          f"{'%.2f / %.2f / %.2f' % load_start} -> {'%.2f / %.2f / %.2f' % os.getloadavg()}",
          flush=True)


def write(options, results, started, load_start):
    """The JSON result so far (after each pool: a later pool that fails keeps these)."""
    figures = {"pools": results, "seconds": time.monotonic() - started,
               "load_start": load_start, "load_end": os.getloadavg()}
    write_result(options.json, "poolsize",
                 {"sizes": options.sizes, "window": options.window,
                  "sizes_text": sizes_text(options.sizes),
                  "settle": options.settle, "pods": options.pods,
                  "timings": DEFAULT_TIMINGS}, figures, result_rows(results))


def sizes_text(sizes):
    """``5, 20 and 40``."""
    names = [str(size) for size in sizes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 20, 40],
                        help="agents per pool, one pool after the other")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of the steady-state window (6 heartbeat intervals)")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds between the pool ready and uploaded and the window")
    parser.add_argument("--pods", type=int, default=10,
                        help="pods in each agent's local cache, uploaded at its start")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    options = parser.parse_args()
    if min(options.sizes) < 2:
        parser.error("a pool needs at least 2 agents for a takeover")
    task.react(run, [options])


if __name__ == "__main__":
    main()
