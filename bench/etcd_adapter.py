"""Puts per second through yurtcoord's etcd adapter: one put per request vs 100 per transaction.

Runs against every etcd version installed here (a fresh etcd per version, on loopback),
side by side in one run:

    .venv/bin/python bench/etcd_adapter.py [--puts 3000] [--batched-puts 30000] [--value-size 1024]
                                           [--json PATH]

Modes: ``single``: one put per request, one at a time; ``single-x16``: one put per
request, 16 in flight; ``txn100``: 100 puts per transaction, one at a time; ``txn100-x4``:
100 per transaction, 4 in flight. Every run checks its keys with etcdctl afterwards.
The reactor's longest lag during each mode (the agent's ``ReactorLagProbe`` every
0.1 s on the reactor the client runs on) is reported beside the rates.
``--json PATH`` writes puts/s per version and mode (no targets; see bench/benchresult.py).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from twisted.internet import defer, task  # noqa: E402
from txaioetcd import OpSet, Transaction  # noqa: E402

from yurtcoord.etcd.client import EtcdClient, EtcdConfig  # noqa: E402
from yurtcoord.sim.etcd import EtcdProcess, etcd_binaries  # noqa: E402
from yurtcoord.tx.reactorlag import ReactorLagProbe  # noqa: E402


async def _run_in_flight(jobs, in_flight):
    """Run the zero-argument coroutine factories ``jobs`` with at most ``in_flight`` at once."""
    sem = defer.DeferredSemaphore(in_flight)
    await defer.gatherResults(
        [sem.run(lambda job=job: defer.ensureDeferred(job())) for job in jobs],
        consumeErrors=True)


async def single(client, prefix, n, value, in_flight):
    jobs = [lambda i=i: client.put(b"%s%08d" % (prefix, i), value) for i in range(n)]
    await _run_in_flight(jobs, in_flight)


async def batched(client, prefix, n, value, in_flight, per_txn=100):
    def job(start):
        ops = [OpSet(b"%s%08d" % (prefix, i), value)
               for i in range(start, min(start + per_txn, n))]
        return client.submit(Transaction(success=ops))

    await _run_in_flight([lambda s=s: job(s) for s in range(0, n, per_txn)], in_flight)


MODES = [
    ("single", single, 1, "puts"),
    ("single-x16", single, 16, "puts"),
    ("txn100", batched, 1, "batched_puts"),
    ("txn100-x4", batched, 4, "batched_puts"),
]


async def bench_version(reactor, binary, args):
    etcd = EtcdProcess(binary).start()
    client = EtcdClient(reactor, EtcdConfig(etcd.client_url, timeout=30.0))
    value = os.urandom(args.value_size // 2).hex().encode()[:args.value_size]
    rates, lags = {}, {}
    probe = ReactorLagProbe(reactor, interval=0.1)
    try:
        for name, run, in_flight, count_arg in MODES:
            n = getattr(args, count_arg)
            prefix = f"/bench/{name}/".encode()
            started = time.perf_counter()
            probe.start()
            await run(client, prefix, n, value, in_flight)
            probe.stop()
            elapsed = time.perf_counter() - started
            lags[name] = probe.longest
            stored = json.loads(etcd.etcdctl("get", prefix.decode(), "--prefix", "--limit", "1",
                                             "-w", "json")).get("count", 0)
            if stored != n:
                raise SystemExit(f"{name}: expected {n} keys, etcd has {stored}")
            rates[name] = n / elapsed
            print(f"etcd {binary.version:7s} {name:11s} {n:6d} puts in {elapsed:6.2f}s "
                  f"= {rates[name]:8.0f} puts/s, longest reactor lag "
                  f"{1000 * lags[name]:.0f} ms", flush=True)
    finally:
        probe.stop()
        await client.close()
        etcd.stop()
    sequential = rates["txn100"] / rates["single"]
    concurrent = rates["txn100-x4"] / rates["single-x16"]
    print(f"etcd {binary.version:7s} ratio txn100/single = {sequential:.1f}x, "
          f"txn100-x4/single-x16 = {concurrent:.1f}x", flush=True)
    return rates, lags


async def main(reactor, args):
    binaries = etcd_binaries()
    if not binaries:
        raise SystemExit("no etcd binary found")
    print(f"value size {args.value_size} bytes; pool of {EtcdConfig('http://x').max_connections} "
          f"connections", flush=True)
    results, lags = {}, {}
    for binary in binaries:
        results[binary.version], lags[binary.version] = await bench_version(
            reactor, binary, args)
    write_json(args, results, lags)


def write_json(args, results, lags):
    """puts/s per etcd version and mode as a machine-readable result."""
    from benchresult import row, write_result

    rows = []
    for version, rates in results.items():
        rows.append(row(f"etcd {version}: puts/s single / single-x16 / txn100 / txn100-x4",
                        " / ".join(f"{rates[name]:,.0f}" for name, *_ in MODES)))
    for version, by_mode in lags.items():
        rows.append(row(f"etcd {version}: longest reactor lag single / single-x16 / txn100 / "
                        "txn100-x4",
                        " / ".join(f"{1000 * by_mode[name]:.0f}" for name, *_ in MODES)
                        + " ms"))
    write_result(args.json, "etcd_adapter",
                 {"puts": args.puts, "batched_puts": args.batched_puts,
                  "value_size": args.value_size},
                 {"puts_per_s": results, "longest_reactor_lag_s": lags}, rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=3000)
    parser.add_argument("--batched-puts", type=int, default=30000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parsed = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, parsed)))
