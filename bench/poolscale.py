"""Pool sync at scale: a delete and update storm from the cloud into a 100k-object pool.

    .venv/bin/python bench/poolscale.py [--etcd 3.5] [--objects 100000] [--deletes 10000]
        [--updates 10000] [--concurrency 32] [--json PATH]

One run starts, and stops again, everything it needs on loopback:

- a real etcd (``--etcd`` 3.4 or 3.5);
- the cloud: the Kubernetes API test server in a child process, seeded over HTTP with
  ``--objects`` endpointslices (discovery.k8s.io/v1, three namespaces, ~420 bytes of
  JSON each; seeding is not part of any figure);
- the coordinator apiserver (test server, in this process; it only holds the lease);
- a ``PoolSyncManager`` with its ``PoolStore`` on that etcd, as a leader agent builds
  them; its initial sync writes every object (and the component key cache file holds
  all their keys) before the measurement starts;
- an independent reader: ``etcdctl watch --prefix /mirror/rv/registry/endpointslices/``
  in a child process. The pool store deletes or writes an object's key and its
  ``/mirror/rv<key>`` in one etcd transaction, so the mirror rv event says when the
  change is readable in etcd.

The storm: ``--deletes`` DELETEs and ``--updates`` PUTs (distinct objects, interleaved,
``--concurrency`` requests in flight) are sent to the cloud over HTTP from this
process. They reach the pool store the way a leader sees them: the pool sync's watch
on the cloud, its write queue, batched transactions, the key cache file.

Figures:

1. Longest reactor stall while the storm is applied: a ``LoopingCall`` lag probe every
   10 ms on this process's reactor (the one the pool sync runs on) records how much
   later than due each call ran; the longest lag, the 99th percentile and the number
   of lags over 50 ms are reported, from the first request sent until etcd is exact.
2. Time until etcd is exact: from the first request sent until the watcher saw every
   deleted object's mirror rv deleted and every updated object's mirror rv at the
   resourceVersion its PUT returned.
3. Nothing lost: afterwards every mirror rv under the prefix is read with etcdctl and
   compared with what the cloud holds (keys and resourceVersions), and the object keys
   are counted.

After etcd is exact the lag probe and the garbage collection record go on for
``AFTER_STORM`` seconds more, reported apart: pool sync runs its full garbage
collection once a burst of changes is over (``yurtcoord.tx.heap``), outside the storm.

``--json PATH`` writes the figures and the targets (longest stall at most 100 ms,
nothing lost; see bench/benchresult.py).
"""

import argparse
import base64
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from poolbench import (  # noqa: E402
    MIRROR_PREFIX, NAMESPACES, SLICES_KEY_PREFIX, PoolBench, endpoint_slice, headline,
    percentile, print_report, react, slice_key,
)

SENTINEL_KEY = MIRROR_PREFIX + SLICES_KEY_PREFIX + "~bench-sentinel"
PROBE_INTERVAL = 0.01
STALL_TARGET_MS = 100.0
# Seconds the lag probe goes on after etcd is exact (see the docstring).
AFTER_STORM = 3.0
# Seconds for the initial sync of the whole pool and for the storm to settle.
SYNC_TIMEOUT = 900.0
STORM_TIMEOUT = 300.0


class LagProbe:
    """The agent's reactor lag probe every ``interval``, keeping every lag it measures.

    ``lags`` are how late each call ran (wall clock); ``busy`` is the CPU time this
    thread used between two calls, which tells a stall of our own code from the
    machine giving the CPU to another process (both cores are shared)."""

    def __init__(self, reactor, interval):
        from yurtcoord.tx.reactorlag import ReactorLagProbe

        self.lags = []
        self.busy = []
        self._last_cpu = None
        self._probe = ReactorLagProbe(reactor, interval)
        self._probe.add_observer(self._observe)

    def start(self):
        self._last_cpu = time.thread_time()
        self._probe.start()

    def stop(self):
        self._probe.stop()

    def _observe(self, lag):
        cpu = time.thread_time()
        self.lags.append(lag)
        self.busy.append(cpu - self._last_cpu)
        self._last_cpu = cpu


class GCPauses:
    """Durations of the interpreter's garbage collections, by generation."""

    def __init__(self):
        self.pauses = {0: [], 1: [], 2: []}
        self._started = None

    def __call__(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses[info["generation"]].append(time.perf_counter() - self._started)
            self._started = None

    def start(self):
        gc.callbacks.append(self)

    def stop(self):
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def run(reactor, options):
    from twisted.internet import defer, task

    from yurtcoord.kube import gvr as gvrs
    from yurtcoord.sim.etcd import etcd_binary_for

    binary = etcd_binary_for(options.etcd)
    if binary is None:
        raise SystemExit(f"etcd {options.etcd} is not installed")
    if options.deletes + options.updates > options.objects:
        raise SystemExit("--deletes + --updates must not exceed --objects")
    bench = PoolBench(reactor, binary, history=options.objects
                      + 2 * (options.deletes + options.updates) + 1000)
    etcd = bench.etcd
    require = bench.require

    # What the watcher saw: current mirror rv per key (None once deleted).
    seen = {}

    def on_event(key, value, deleted, now):
        if not key.startswith(MIRROR_PREFIX + SLICES_KEY_PREFIX):
            return
        # A delete event carries no value (etcdctl may show its type as a number).
        seen[key[len(MIRROR_PREFIX):]] = None if deleted or not value else int(value)

    def read_mirrors():
        """``{key: rv}`` of every mirror rv under the prefix, read by etcdctl."""
        out = json.loads(etcd.etcdctl("get", "--prefix", MIRROR_PREFIX + SLICES_KEY_PREFIX,
                                      "-w", "json"))
        found = {}
        for kv in out.get("kvs", []):
            key = base64.b64decode(kv["key"]).decode("utf-8")
            if key != SENTINEL_KEY:
                found[key[len(MIRROR_PREFIX):]] = int(base64.b64decode(kv["value"]))
        return found

    def count_objects():
        out = json.loads(etcd.etcdctl("get", "--prefix", SLICES_KEY_PREFIX, "--keys-only",
                                      "-w", "json"))
        return len(out.get("kvs", []))

    @defer.inlineCallbacks
    def main():
        yield bench.connect(cloud_timeout=60.0)
        cloud_client = bench.cloud_client
        created = yield bench.seed(options.objects)
        expected = {slice_key(o["metadata"]["namespace"], o["metadata"]["name"]):
                    int(o["metadata"]["resourceVersion"]) for o in created}
        del created
        yield bench.start_watcher(MIRROR_PREFIX + SLICES_KEY_PREFIX, SENTINEL_KEY, on_event)
        etcd.etcdctl("del", SENTINEL_KEY)

        # -- initial sync of the whole pool ----------------------------------------------------
        store, manager = yield bench.pool_sync()
        began = time.perf_counter()
        yield manager.start(store)

        def synced():
            return manager.all_listed and all(seen.get(k) == rv for k, rv in expected.items())

        yield require(synced, SYNC_TIMEOUT, 0.5, "the initial sync")
        initial_sync = time.perf_counter() - began
        cached_keys = len(store.key_cache.keys("leader-yurthub"))
        print(f"initial sync of {options.objects} objects in {initial_sync:.1f}s "
              f"({cached_keys} keys in the key cache)", flush=True)

        # -- the storm --------------------------------------------------------------------------
        names = sorted(expected)
        deleted = names[:options.deletes]
        updated = names[options.deletes:options.deletes + options.updates]
        operations = []
        for i in range(max(len(deleted), len(updated))):
            if i < len(deleted):
                operations.append(("delete", deleted[i]))
            if i < len(updated):
                operations.append(("update", updated[i]))
        by_key = {slice_key(NAMESPACES[i % len(NAMESPACES)], endpoint_slice(i)["metadata"]
                            ["name"]): i for i in range(options.objects)}
        failures = []
        # The rvs the storm's PUTs returned, by key.
        updated_rvs = {}

        def send(kind, key):
            i = by_key[key]
            obj = endpoint_slice(i)
            meta = obj["metadata"]
            if kind == "delete":
                return cloud_client.delete(gvrs.ENDPOINTSLICES_V1, meta["name"],
                                           meta["namespace"])
            obj["endpoints"][0]["conditions"]["ready"] = False
            meta["annotations"] = {"bench.yurtcoord.io/update": "1"}

            def done(result):
                updated_rvs[key] = int(result["metadata"]["resourceVersion"])

            return cloud_client.update(gvrs.ENDPOINTSLICES_V1, obj).addCallback(done)

        def guarded(kind, key):
            return send(kind, key).addErrback(lambda f: failures.append((kind, key, f)))

        def exact():
            return (len(updated_rvs) + len(failures) == len(updated) + sum(
                        1 for f in failures if f[0] == "delete")
                    and all(seen.get(k, "absent") is None for k in deleted)
                    and all(seen.get(k) == rv for k, rv in updated_rvs.items()))

        probe = LagProbe(reactor, PROBE_INTERVAL)
        collections = GCPauses()
        # Key cache snapshots taken on the reactor (the pool sync's own; timed here, not
        # changed); the file's text is made and written in a thread.
        file_writes = []
        real_snapshot = store.key_cache.snapshot_for_writing

        def timed_snapshot():
            started = time.perf_counter()
            try:
                return real_snapshot()
            finally:
                file_writes.append(time.perf_counter() - started)

        store.key_cache.snapshot_for_writing = timed_snapshot
        cpu_before = time.process_time()
        collections.start()
        probe.start()
        began = time.perf_counter()
        # ``--concurrency`` senders pulling from one iterator: no Deferred per request
        # waits in a queue (20k of them would weigh on the garbage collector).
        pending = iter(operations)

        @defer.inlineCallbacks
        def sender():
            for kind, key in pending:
                yield guarded(kind, key)

        yield defer.gatherResults([sender() for _ in range(options.concurrency)])
        sent_in = time.perf_counter() - began
        yield require(exact, STORM_TIMEOUT, 0.01, "etcd exact after the storm")
        to_exact = time.perf_counter() - began
        probe.stop()
        collections.stop()
        store.key_cache.snapshot_for_writing = real_snapshot
        storm_cpu = time.process_time() - cpu_before
        after_probe = LagProbe(reactor, PROBE_INTERVAL)
        after_collections = GCPauses()
        after_collections.start()
        after_probe.start()
        yield task.deferLater(reactor, AFTER_STORM, lambda: None)
        after_probe.stop()
        after_collections.stop()

        # -- nothing lost: read everything back ----------------------------------------------
        for key in deleted:
            expected.pop(key)
        expected.update(updated_rvs)
        mirrors = read_mirrors()
        objects = count_objects()
        missing = sum(1 for k in expected if k not in mirrors)
        extra = sum(1 for k in mirrors if k not in expected)
        wrong_rv = sum(1 for k, rv in expected.items() if k in mirrors and mirrors[k] != rv)
        lags = sorted(probe.lags)
        results = {
            "etcd": etcd.version,
            "objects": options.objects,
            "deletes": len(deleted),
            "updates": len(updated),
            "concurrency": options.concurrency,
            "initial_sync_s": initial_sync,
            "storm_sent_s": sent_in,
            "to_exact_s": to_exact,
            "storm_cpu_s": storm_cpu,
            "longest_stall_ms": 1000 * (lags[-1] if lags else 0.0),
            "stall_p99_ms": 1000 * percentile(lags, 0.99),
            "stalls_over_50ms": sum(1 for lag in lags if lag > 0.05),
            "longest_busy_ms": 1000 * max(probe.busy, default=0.0),
            "key_cache_writes": len(file_writes),
            "key_cache_longest_write_ms": 1000 * max(file_writes, default=0.0),
            "probe_samples": len(lags),
            "gc_full_collections": len(collections.pauses[2]),
            "gc_longest_full_ms": 1000 * max(collections.pauses[2], default=0.0),
            "gc_longest_young_ms": 1000 * max(collections.pauses[0] + collections.pauses[1],
                                              default=0.0),
            "after_longest_stall_ms": 1000 * max(after_probe.lags, default=0.0),
            "after_longest_busy_ms": 1000 * max(after_probe.busy, default=0.0),
            "after_gc_full_collections": len(after_collections.pauses[2]),
            "after_gc_longest_full_ms": 1000 * max(after_collections.pauses[2], default=0.0),
            "request_failures": len(failures),
            "objects_in_etcd": objects,
            "expected_objects": len(expected),
            "missing": missing,
            "extra": extra,
            "wrong_rv": wrong_rv,
        }
        report(results, options)

    return bench.run(main)


def report(r, options):
    lost = r["request_failures"] + r["missing"] + r["extra"] + r["wrong_rv"]
    print_report([
        headline("pool scale bench", r["etcd"]),
        f"initial sync of {r['objects']} endpointslices: {r['initial_sync_s']:.1f}s",
        f"storm: {r['deletes']} deletes and {r['updates']} updates sent to the cloud in "
        f"{r['storm_sent_s']:.1f}s ({r['concurrency']} in flight)",
        f"  etcd exact {r['to_exact_s']:.2f}s after the first request; CPU of this process "
        f"{r['storm_cpu_s']:.1f}s",
        f"  reactor lag: longest {r['longest_stall_ms']:.0f} ms, p99 {r['stall_p99_ms']:.0f} ms,"
        f" {r['stalls_over_50ms']} over 50 ms of {r['probe_samples']} probes",
        f"  CPU of the reactor thread between two probes: longest {r['longest_busy_ms']:.0f} ms;"
        f" key cache file written {r['key_cache_writes']} times, longest snapshot of it on "
        f"the reactor {r['key_cache_longest_write_ms']:.0f} ms",
        f"  garbage collections meanwhile: {r['gc_full_collections']} full, longest "
        f"{r['gc_longest_full_ms']:.0f} ms; longest young {r['gc_longest_young_ms']:.0f} ms",
        f"  in the {AFTER_STORM:.0f} s after etcd was exact: reactor lag longest "
        f"{r['after_longest_stall_ms']:.0f} ms, CPU between two probes longest "
        f"{r['after_longest_busy_ms']:.0f} ms; {r['after_gc_full_collections']} full garbage "
        f"collections, longest {r['after_gc_longest_full_ms']:.0f} ms",
        f"  read back: {r['objects_in_etcd']} objects in etcd of {r['expected_objects']} "
        f"expected, missing {r['missing']}, extra {r['extra']}, wrong rv {r['wrong_rv']}, "
        f"failed requests {r['request_failures']} (lost in all: {lost})",
    ], r)
    write_json(r, options, lost)


def write_json(r, options, lost):
    from benchresult import row, write_result

    name = f"poolscale (etcd {r['etcd']})"
    rows = [
        row(f"initial sync of {r['objects']:,} endpointslices", f"{r['initial_sync_s']:.1f} s"),
        row(f"longest reactor stall, {r['deletes']:,} deletes + {r['updates']:,} updates "
            "from the cloud", f"{r['longest_stall_ms']:.0f} ms (p99 {r['stall_p99_ms']:.0f} ms)",
            f"<= {STALL_TARGET_MS:.0f} ms", r["longest_stall_ms"] <= STALL_TARGET_MS),
        row("longest CPU time of the reactor thread between two probes (own work)",
            f"{r['longest_busy_ms']:.0f} ms"),
        row("first request -> etcd exact", f"{r['to_exact_s']:.2f} s"),
        row(f"longest reactor stall in the {AFTER_STORM:.0f} s after etcd exact (the full "
            "garbage collection after the burst)",
            f"{r['after_longest_stall_ms']:.0f} ms ({r['after_gc_full_collections']} full, "
            f"longest {r['after_gc_longest_full_ms']:.0f} ms)"),
        row("objects in etcd / missing / extra / wrong rv / failed requests",
            f"{r['objects_in_etcd']:,} of {r['expected_objects']:,} / {r['missing']} / "
            f"{r['extra']} / {r['wrong_rv']} / {r['request_failures']}", "nothing lost",
            lost == 0 and r["objects_in_etcd"] == r["expected_objects"]),
    ]
    write_result(options.json, name,
                 {"objects": options.objects, "deletes": options.deletes,
                  "updates": options.updates, "concurrency": options.concurrency,
                  "etcd": r["etcd"], "probe_ms": PROBE_INTERVAL * 1000}, r, rows)


def arguments():
    parser = argparse.ArgumentParser(prog="bench/poolscale.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--etcd", default="3.5", help="etcd version: 3.4 or 3.5")
    parser.add_argument("--objects", type=int, default=100000)
    parser.add_argument("--deletes", type=int, default=10000)
    parser.add_argument("--updates", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=32,
                        help="requests to the cloud in flight during the storm")
    return parser


if __name__ == "__main__":
    react(run, arguments(), sys.argv[1:])
