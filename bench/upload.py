"""Local cache upload: batched upload vs one request per object vs raw batched puts.

    .venv/bin/python bench/upload.py [--objects 10000] [--size 3000] [--etcd 3.5] [--json PATH]

One run, a fresh etcd (on loopback, temp dir) per mode, the same objects in each:

- ``batched``: ``LocalCacheUploader`` reading a yurthub disk cache of N pods of about
  ``--size`` bytes and writing them with the pool store's guarded create-or-update
  (into an empty pool: one guarded write transaction per batch of 64, as many in
  flight as the store's ``parallel_batches`` across chunk boundaries).  Peak RSS growth of the process
  during this mode is measured (``VmHWM`` from /proc/self/status); it runs first so
  nothing before it inflated the peak.
- ``per-object``: the unbatched baseline, one ``PoolStore.create`` (one transaction holding
  the object and its mirror rv) per object, one at a time, through the same adapter.
  Each request waits for an etcd disk sync, so this runs on the first
  ``--per-object-sample`` objects only and is compared by objects per second.
- ``raw-batched``: the same keys and mirror values as plain puts, 64 objects (128
  operations) per transaction through the adapter's ``submit``, no reads, no compares,
  one transaction at a time; ``raw-batched-x4``: the same with as many transactions in
  flight as the store uses (``parallel_batches``).

Modes alternate for ``--repeat`` rounds.  Each mode's rate shown is its best round;
each ratio is taken within a round (the modes of one round ran back to back, under the
same load from other processes on the machine) and judged by the median of the rounds,
so that neither one lucky round nor one disturbed round decides a target.  A round runs
the batched upload and raw puts with as many in flight side by side, the two closest
compared, and every other round runs its modes in the reverse order: a mode's place in
a round (what the disk is still doing after the mode before it removed its etcd) then
falls on each side of a ratio equally often, instead of always on the same one.  Every
mode's result is checked with etcdctl (key count and a sample of values).

``--etcd-members 1 3`` runs every mode on a single etcd and on a 3-member cluster
(``EtcdCluster``; the adapter is given every member's URL, as ``[coordinator]
storage`` gives them), alternating within each round, and reports each mode's rate
on the cluster against the single member.  The reactor's longest lag (the agent's
``ReactorLagProbe`` every 0.1 s on the reactor the upload runs on) is kept per mode.
Targets (medians of the rounds' ratios): batched >= 5x per-object, batched >= 0.7x
raw-batched, batched >= 0.9x raw-batched-x4, RSS growth <= 50 MB.
``--json PATH`` writes the rates, ratios and targets (see bench/benchresult.py).

``--profile`` runs one batched upload and one raw batched upload with as many in
flight, each under cProfile on a fresh etcd, and prints for each: the profile's top
lines (cumulative and own time), the CPU time of the process and of etcd against the
wall time, and how
long (share of the wall time) 0, 1, 2, ... transactions were in flight, measured on
``EtcdClient.submit``.
"""

import argparse
import cProfile
import io
import json
import pstats
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import txaioetcd  # noqa: E402
from twisted.internet import defer, task  # noqa: E402

from yurtcoord.agent.config import UploadResource  # noqa: E402
from yurtcoord.etcd.client import EtcdClient, EtcdConfig  # noqa: E402
from yurtcoord.pool.localcache import LocalCacheReader  # noqa: E402
from yurtcoord.pool.keycache import ComponentKeyCache  # noqa: E402
from yurtcoord.pool.keys import KeyBuildInfo, PoolKeyBuilder, format_rv  # noqa: E402
from yurtcoord.pool.store import PoolStore  # noqa: E402
from yurtcoord.sim.etcd import (  # noqa: E402
    EtcdCluster, EtcdProcess, default_etcd_binary, etcd_binary_for,
)
from yurtcoord.tx.reactorlag import ReactorLagProbe  # noqa: E402
from yurtcoord.pool.uploader import LocalCacheUploader  # noqa: E402

PODS = UploadResource("kubelet", "pods", "v1")
NAMESPACES = 10


def peak_rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def pod(i, size):
    name, namespace = f"pod-{i:06d}", f"ns-{i % NAMESPACES}"
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(1000 + i),
                        "labels": {"app": f"app-{i % 50}"}},
           "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "busybox"}]}}
    base = len(json.dumps(obj, separators=(",", ":")))
    obj["metadata"]["annotations"] = {"padding": "x" * max(0, size - base - 30)}
    return namespace, name, 1000 + i, json.dumps(obj, separators=(",", ":")).encode()


def write_local_cache(directory, count, size):
    for i in range(count):
        namespace, name, _rv, data = pod(i, size)
        path = os.path.join(directory, "kubelet", "pods.v1.core", namespace, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def objects(keys, count, size):
    """Lazily, ``(PoolKey, bytes, rv)`` for every object (never all in memory)."""
    for i in range(count):
        namespace, name, rv, data = pod(i, size)
        yield keys.object_key(KeyBuildInfo("kubelet", "pods", "", "v1", namespace, name)), data, rv


# The most transactions the batched upload had in flight at once, per round.
UPLOAD_IN_FLIGHT = []


async def mode_batched(reactor, store, args, workdir):
    reader = LocalCacheReader(os.path.join(workdir, "cache"))
    uploader = LocalCacheUploader(store, reader, [PODS])
    counts = await uploader.upload()
    assert counts.created == args.objects, counts
    UPLOAD_IN_FLIGHT.append(uploader.most_in_flight)


async def mode_per_object(reactor, store, args, workdir):
    for key, data, rv in objects(store.keys, args.per_object_sample, args.size):
        await store.create(key, data, rv)


def raw_transactions(keys, args, per_txn=64):
    batch = []
    for key, data, rv in objects(keys, args.objects, args.size):
        batch += [txaioetcd.OpSet(key.path.encode(), data),
                  txaioetcd.OpSet(key.mirror_rv_path.encode(), format_rv(rv).encode())]
        if len(batch) >= 2 * per_txn:
            yield txaioetcd.Transaction(success=batch)
            batch = []
    if batch:
        yield txaioetcd.Transaction(success=batch)


async def raw_batched(store, args, in_flight):
    transactions = raw_transactions(store.keys, args)

    async def worker():
        for txn in transactions:
            await store.etcd.submit(txn)

    await defer.gatherResults([defer.ensureDeferred(worker()) for _ in range(in_flight)],
                              consumeErrors=True)


async def mode_raw_batched(reactor, store, args, workdir):
    await raw_batched(store, args, 1)


async def mode_raw_batched_parallel(reactor, store, args, workdir):
    await raw_batched(store, args, store.parallel_batches)


def verify(etcd, count, size):
    out = etcd.etcdctl("get", "--prefix", "--keys-only", "/registry/pods/")
    found = len([line for line in out.splitlines() if line.strip()])
    assert found == count, f"{found} objects in etcd, expected {count}"
    keys = PoolKeyBuilder("/registry")
    for i in (0, count // 2, count - 1):
        namespace, name, rv, data = pod(i, size)
        path = keys.object_key(KeyBuildInfo("kubelet", "pods", "", "v1", namespace, name)).path
        stored = etcd.read(path)
        assert stored == {path.encode(): data}, f"{path} differs"
        mirror = etcd.read("/mirror/rv" + path)
        assert mirror == {("/mirror/rv" + path).encode(): format_rv(rv).encode()}, path


def start_etcd(binary, members):
    """A fresh etcd of ``members`` members and every member's client URL."""
    if members == 1:
        etcd = EtcdProcess(binary).start()
        return etcd, [etcd.client_url]
    etcd = EtcdCluster(binary, size=members).start()
    return etcd, etcd.client_urls


async def run_mode(reactor, func, count, binary, args, workdir, members=1):
    etcd, urls = start_etcd(binary, members)
    client = EtcdClient(reactor, EtcdConfig(urls[0], more_urls=tuple(urls[1:]),
                                            timeout=30.0))
    probe = ReactorLagProbe(reactor, interval=0.1)
    cache_dir = tempfile.mkdtemp(prefix="keycache-", dir=workdir)
    store = PoolStore(reactor, client, "/registry",
                      ComponentKeyCache.in_directory(cache_dir).load())
    try:
        rss_before = peak_rss_kib()
        started = time.perf_counter()
        probe.start()
        await func(reactor, store, args, workdir)
        probe.stop()
        elapsed = time.perf_counter() - started
        rss_growth = peak_rss_kib() - rss_before
        verify(etcd, count, args.size)
        return elapsed, rss_growth, probe.longest
    finally:
        probe.stop()
        await store.close()
        await client.close()
        etcd.stop()


async def main(reactor, args):
    binary = etcd_binary_for(args.etcd) if args.etcd else default_etcd_binary()
    if binary is None:
        raise SystemExit(f"etcd {args.etcd} is not installed")
    workdir = tempfile.mkdtemp(prefix="yurtcoord-bench-upload-")
    try:
        write_local_cache(os.path.join(workdir, "cache"), args.objects, args.size)
        print(f"etcd {binary.version}, {args.objects} pods of {args.size} bytes")
        if args.profile:
            await profile(reactor, args, binary, workdir)
            return
        # The batched upload first (its peak RSS is measured in the first round),
        # then the baseline it is held closest to; every other round reversed.
        modes = [
            ("batched", mode_batched, args.objects),
            ("raw-batched-x4", mode_raw_batched_parallel, args.objects),
            ("raw-batched", mode_raw_batched, args.objects),
            ("per-object", mode_per_object, args.per_object_sample),
        ]
        members_list = args.etcd_members
        # rates and lags of the single member (the targets) and of each cluster size.
        rates, rss, lags = {}, {}, {}
        cluster_rates = {m: {} for m in members_list}
        cluster_lags = {m: {} for m in members_list}
        # Each round's rate of each mode on the first cluster size, for the ratios.
        round_rates = []
        for round_number in range(1, args.repeat + 1):
            round_rates.append({})
            for name, func, count in (modes if round_number % 2 else modes[::-1]):
                for members in members_list:
                    elapsed, growth, lag = await run_mode(reactor, func, count, binary, args,
                                                          workdir, members)
                    if members == 1:
                        rss.setdefault(name, growth)
                    if members == members_list[0]:
                        round_rates[-1][name] = count / elapsed
                    by_members = cluster_rates[members]
                    by_members[name] = max(by_members.get(name, 0.0), count / elapsed)
                    cluster_lags[members][name] = max(cluster_lags[members].get(name, 0.0), lag)
                    print(f"round {round_number} {name:15s} {members} member(s) {count:6d} "
                          f"objects {elapsed:8.2f} s {count / elapsed:9.0f} objects/s, "
                          f"longest reactor lag {1000 * lag:.0f} ms", flush=True)
        rates = cluster_rates[members_list[0]]
        lags = cluster_lags[members_list[0]]
        print("best of each mode:")
        for name, _func, _count in modes:
            print(f"  {name:15s} {rates[name]:9.0f} objects/s")
        ratios = {other: RoundRatios([r["batched"] / r[other] for r in round_rates])
                  for other in ("per-object", "raw-batched", "raw-batched-x4")}
        vs_per_object = ratios["per-object"].median
        vs_raw = ratios["raw-batched"].median
        vs_raw_x4 = ratios["raw-batched-x4"].median
        rss_mb = rss.get("batched", 0) / 1024
        print(f"batched vs per-object:     {ratios['per-object'].text('.1f')} (target >= 5x) "
              f"{'ok' if vs_per_object >= 5 else 'MISSED'}")
        print(f"batched vs raw-batched:    {ratios['raw-batched'].text('.2f')} (target >= 0.7x) "
              f"{'ok' if vs_raw >= 0.7 else 'MISSED'}")
        print(f"batched vs raw-batched-x4: {ratios['raw-batched-x4'].text('.2f')} "
              f"(target >= 0.9x) {'ok' if vs_raw_x4 >= 0.9 else 'MISSED'}")
        print(f"most transactions in flight, batched upload, by round: {UPLOAD_IN_FLIGHT}")
        print(f"peak RSS growth during batched upload: {rss_mb:.1f} MB (target <= 50 MB) "
              f"{'ok' if rss_mb <= 50 else 'MISSED'}")
        for members in members_list[1:]:
            for name, _func, _count in modes:
                print(f"{name:15s} {members} members vs {members_list[0]}: "
                      f"{cluster_rates[members][name] / rates[name]:.2f}x")
        write_json(args, binary.version, rates, rss_mb, ratios, lags, cluster_rates,
                   cluster_lags)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class RoundRatios:
    """One ratio taken in each round: judged by their median (the middle one, or the
    mean of the two middle ones), shown with the rounds' range."""

    def __init__(self, values):
        self.values = list(values)
        ordered = sorted(self.values)
        middle = len(ordered) // 2
        self.median = (ordered[middle] if len(ordered) % 2
                       else (ordered[middle - 1] + ordered[middle]) / 2)

    def text(self, spec):
        """``0.95x`` for one round, ``0.95x (median of 5 rounds, 0.90-0.99x)`` for more."""
        if len(self.values) == 1:
            return f"{self.median:{spec}}x"
        return (f"{self.median:{spec}}x (median of {len(self.values)} rounds, "
                f"{min(self.values):{spec}}-{max(self.values):{spec}}x)")


class InFlightMeter:
    """Wraps an etcd client's ``submit`` and adds up the wall time spent at each number
    of transactions in flight."""

    def __init__(self, client):
        self.client = client
        self.submit = client.submit
        self.in_flight = 0
        self.since = time.perf_counter()
        self.spent = {}
        self.most = 0
        client.submit = self._submit

    def _change(self, by):
        now = time.perf_counter()
        self.spent[self.in_flight] = self.spent.get(self.in_flight, 0.0) + now - self.since
        self.since = now
        self.in_flight += by
        self.most = max(self.most, self.in_flight)

    def _submit(self, *args, **kwargs):
        self._change(1)
        d = self.submit(*args, **kwargs)

        def done(result):
            self._change(-1)
            return result

        return d.addBoth(done)

    def report(self):
        self._change(0)
        total = sum(self.spent.values()) or 1.0
        return ", ".join(f"{n}: {100 * self.spent[n] / total:.0f}%"
                         for n in sorted(self.spent))


# Functions listed by cumulative time in ``--profile`` (a regular expression on the
# profile's file:line(function) names).
PROFILED_CODE = r"yurtcoord/|txaioetcd/|json/|bench/upload"


def process_cpu(pid):
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def profile(reactor, args, binary, workdir):
    """The batched upload and raw batched puts with as many in flight, profiled."""
    for name, func in (("batched", mode_batched),
                       ("raw-batched-x4", mode_raw_batched_parallel)):
        etcd, urls = start_etcd(binary, 1)
        client = EtcdClient(reactor, EtcdConfig(urls[0], timeout=30.0))
        cache_dir = tempfile.mkdtemp(prefix="keycache-", dir=workdir)
        store = PoolStore(reactor, client, "/registry",
                          ComponentKeyCache.in_directory(cache_dir).load())
        try:
            etcd_cpu = process_cpu(etcd.pid)
            meter = InFlightMeter(client)
            profiler = cProfile.Profile()
            cpu, started = time.process_time(), time.perf_counter()
            meter.since = started
            profiler.enable()
            await func(reactor, store, args, workdir)
            profiler.disable()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            etcd_cpu = process_cpu(etcd.pid) - etcd_cpu
            # Taken before the check with etcdctl, whose time is no part of the mode.
            in_flight = meter.report()
            verify(etcd, args.objects, args.size)
            print(f"== {name}: {args.objects} objects in {elapsed:.2f} s under the profiler "
                  f"({args.objects / elapsed:.0f} objects/s), process CPU {cpu:.2f} s, "
                  f"etcd CPU {etcd_cpu:.2f} s; "
                  f"wall time at each number of transactions in flight: {in_flight}")
            # By cumulative time, the reactor's own frames come first: only the
            # upload's code, txaioetcd's request building and JSON are listed.
            for order, restriction in (("cumulative", [PROFILED_CODE]), ("tottime", [])):
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(
                    *restriction, args.profile_lines)
                print(out.getvalue())
        finally:
            await store.close()
            await client.close()
            etcd.stop()


def write_json(args, version, rates, rss_mb, ratios, lags, cluster_rates, cluster_lags):
    """Best rate of each mode, the ratios (medians of the rounds') and the three targets
    as a machine-readable result; with more than one cluster size, each size's rates
    against the first."""
    from benchresult import row, write_result

    members_list = args.etcd_members
    base = members_list[0]
    base_text = f"{base} member" + ("s" if base != 1 else "")

    vs_per_object = ratios["per-object"].median
    vs_raw = ratios["raw-batched"].median
    vs_raw_x4 = ratios["raw-batched-x4"].median
    rows = [
        row("batched upload", f"{rates['batched']:,.0f} obj/s"),
        row("one request per object", f"{rates['per-object']:,.0f} obj/s"),
        row("raw batched puts (1 / 4 in flight)",
            f"{rates['raw-batched']:,.0f} / {rates['raw-batched-x4']:,.0f} obj/s"),
        row("batched vs one per object", ratios["per-object"].text(".1f"), ">= 5x",
            vs_per_object >= 5),
        row("batched vs raw batched", ratios["raw-batched"].text(".2f"), ">= 0.7x",
            vs_raw >= 0.7),
        row("batched vs raw batched, 4 in flight", ratios["raw-batched-x4"].text(".2f"),
            ">= 0.9x", vs_raw_x4 >= 0.9),
        row("peak RSS growth during batched upload", f"{rss_mb:.1f} MB", "<= 50 MB",
            rss_mb <= 50),
        row("most transactions in flight, batched upload (by round)",
            " / ".join(str(n) for n in UPLOAD_IN_FLIGHT)),
        row("longest reactor lag, batched upload / one per object / raw batched x1 / x4",
            " / ".join(f"{1000 * lags[name]:.0f}" for name in
                       ("batched", "per-object", "raw-batched", "raw-batched-x4")) + " ms"),
    ]
    labels = {"batched": "batched upload", "per-object": "one request per object",
              "raw-batched": "raw batched puts, 1 in flight",
              "raw-batched-x4": "raw batched puts, 4 in flight"}
    if len(members_list) > 1:
        # Side by side: the comparison and each size's reactor lag; the single
        # member's own rows (and the targets) are the plain upload benchmark's.
        rows = [row(f"longest reactor lag, batched upload, {base_text}",
                    f"{1000 * lags['batched']:.0f} ms")]
    for members in members_list[1:]:
        for name, label in labels.items():
            ratio = cluster_rates[members][name] / rates[name]
            rows.append(row(f"{label}, {members} members vs {base_text}",
                            f"{cluster_rates[members][name]:,.0f} vs {rates[name]:,.0f} obj/s "
                            f"({ratio:.2f}x)"))
        rows.append(row(f"longest reactor lag, batched upload, {members} members",
                        f"{1000 * cluster_lags[members]['batched']:.0f} ms"))
    title = f"upload (etcd {version})"
    if members_list != [1]:
        title = f"upload (etcd {version}, " + " vs ".join(
            f"{m} member" + ("s" if m != 1 else "") for m in reversed(members_list)) + ")"
    write_result(args.json, title,
                 {"objects": args.objects, "size": args.size, "repeat": args.repeat,
                  "per_object_sample": args.per_object_sample, "etcd": version,
                  "etcd_members": members_list},
                 {"objects_per_s": rates, "peak_rss_growth_mb": rss_mb,
                  "vs_per_object": vs_per_object, "vs_raw_batched": vs_raw,
                  "vs_raw_batched_x4": vs_raw_x4,
                  "ratios_by_round": {name: r.values for name, r in ratios.items()},
                  "upload_most_in_flight_by_round": UPLOAD_IN_FLIGHT,
                  "longest_reactor_lag_s": lags,
                  "objects_per_s_by_members": cluster_rates,
                  "longest_reactor_lag_s_by_members": cluster_lags}, rows)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--size", type=int, default=3000, help="bytes per object")
    parser.add_argument("--per-object-sample", type=int, default=1000,
                        help="objects written one request each (rate is per object)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; modes alternate, each ratio is the median of the "
                             "rounds' ratios")
    parser.add_argument("--etcd", default="3.5", help="etcd version to use, e.g. 3.4 or 3.5")
    parser.add_argument("--etcd-members", type=int, nargs="+", default=[1], metavar="N",
                        help="etcd cluster sizes to run every mode on, alternating within "
                             "each round; the first is the one the others are compared with")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--profile", action="store_true",
                        help="profile one batched and one raw batched (x4) upload instead")
    parser.add_argument("--profile-lines", type=int, default=15,
                        help="lines of each profile listing printed")
    args = parser.parse_args()
    if any(m < 1 for m in args.etcd_members):
        parser.error(f"--etcd-members: every size must be at least 1, not {args.etcd_members}")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, arguments)))
