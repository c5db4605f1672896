"""Runs every benchmark, one after the other, and regenerates bench/RESULTS.md.

    bench/run [--quick] [--output PATH] [--only NAME ... | --keep NAME ...]

Each benchmark runs as its own process (its own session, so that anything it leaves
behind is killed with it) with ``--json`` pointing into a temp dir; its output is
shown as it runs. The results become one table (benchmark | measure | result |
target | met) under a header describing the machine and its load, followed by how
each benchmark measures. A benchmark that crashes, times out or writes no result
makes the run exit non-zero (its row says so); a missed target does not, it is
reported in the table.

The full run takes about 20 minutes on a 2-core machine (the two poolscale runs take
about 2 minutes each); ``--quick`` (one round, short windows, a 20k-object pool, about
5 minutes) is a smoke run and by default writes bench/RESULTS-quick.md rather than
bench/RESULTS.md. poolsize (pools of 5, 20 and 40 agent processes, about 10 minutes)
runs only when named, ``--only poolsize``; other runs keep its rows. So does chaos
(a 30-minute seeded chaos run, about 33 minutes; network namespaces, so root),
``--only chaos``.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)


class Benchmark:
    """One benchmark script and its settings for a full and for a quick run."""

    def __init__(self, name, script, full, quick, timeout, method, needs_etcd=None,
                 opt_in=False):
        self.name = name
        # Run only when named with --only (too long for every run).
        self.opt_in = opt_in
        self.script = script
        self.full = full
        self.quick = quick
        self.timeout = timeout
        self.method = method
        self.needs_etcd = needs_etcd

    def command(self, quick, json_path):
        return ([sys.executable, os.path.join(BENCH, self.script)]
                + (self.quick if quick else self.full) + ["--json", json_path])


METHOD_INFORMER = """\
Backlog mode, {objects:,} ConfigMaps (~465-byte watch events) per consumer and drain,
{rounds} round(s) of {drains_per_round} turns; in every turn each consumer drains one
backlog, and a consumer's figure for a round is that of its drains of the round taken
together (events over the CPU time of all of them): the consumers take turns, so both
see the same spells of other load on the machine. One Kubernetes API test server in the
bench process, each consumer in its own process watching a fresh namespace. The server
goes down, the objects are created, the server comes back: each consumer resumes its
watch from its last resourceVersion and drains the backlog of ADDED events as fast as
it can. Headline: events per CPU second while draining, from each consumer's first to
its last event, measured the same way in every consumer process (`time.process_time`:
user and system time of the whole process, garbage collection included), their ratio
per round (target on the lowest round) and its median; the ratios of single drains
(each against the official client's drain of the same turn) are shown beside.
From the request: each consumer notes the time just before it sends a list or watch
request (yurtcoord in its client's `list` and `watch`, the official client before its
`Watch().stream()` sends one), the same point in both; from the request the backlog came
on, the time to the first and to the last event, events/s over the latter and their
ratio per round (target on the median of the rounds), and the time to the first event
(medians of the rounds, target: at most the official client's). A reconnect's backoff
before that request is not in it; the connection, the test server preparing its replay
and the first read are. The test server streams a replay as kube-apiserver does (256
events taken from its history and written a reactor turn, in chunks of 2,048 bytes, as
the watch cache hands a watcher its interval: nothing of the history beyond the first
batch is looked at before the first byte leaves), with its heap frozen while it holds a
backlog and never at resourceVersion 0, so the consumer decodes while the server still
writes. It writes each event's object as the JSON it encoded once, when the change was
stored, as kube-apiserver's watch cache keeps one serialization of an object for all
its watchers (since 2026-12-04; before, it encoded every event as it streamed it, about
6 us an event on this machine, longer than yurtcoord's informer takes to decode one:
yurtcoord's rate from the request was then the server's, about 100,000 events/s, with its
drain waiting for data some 70 times, while the official client, at a third of that
rate, never waited). yurtcoord decodes the watch stream with msgspec since 2026-12-04
(the decoders rows: adopted by their rule once the server no longer held the consumer
back); the notes below from before that date are of the stdlib's decoder.
Wall-clock events/s (first to last event) and their ratio follow as secondary rows:
they move with the machine's load much more. Consumers, in this order every turn:
yurtcoord's `Informer` on a `KubeClient` (treq/Twisted), run as the agent's pool sync
runs its informers (heap frozen once the list is in, full and middle garbage
collections held off while changes arrive: `yurtcoord.tx.heap.QuietCollections`,
`busy()` per change); the
same informer under the interpreter's default garbage collection (its row: the store it
keeps makes the interpreter walk the whole heap once or twice per drain, 30-90 ms of
CPU); and the official client's
`watch.Watch().stream(CoreV1Api.list_namespaced_config_map, ...)` (objects deserialized
into models, as its documentation shows, none kept: its garbage collector never runs).
`--mode live` (objects created while the consumers watch) is bounded by how fast the
test server creates objects, so no ratio is claimed from it. Watch bodies are read with
all HTTP chunks of one socket read delivered together (`ChunkedBodyBatcher` in
`yurtcoord/tx/twisted_private.py`), and the complete lines of one read are decoded as
one JSON list (`WatchStreamProtocol.lines`; one by one whenever that is not one event
per line): one decoder call per read instead of one per event, and the events of a read
share their keys' strings, so the informer's store holds a third less memory (1.8 instead
of 2.7 kB per ConfigMap; 10,100 instead of 15,500 page faults per drain of 20,000). In
alternating runs of this benchmark on 2026-12-02 (5 rounds of 3 turns, load average
1.8-3.5), the ratio per round was 2.84-3.21x (median 3.01x) before and 3.19-4.00x
(median 3.82x) after. What makes single drains differ (from `getrusage` around each
drain, in those runs, when the server still wrote the whole backlog before the first
event went out): neither consumer waited for data during a drain (a voluntary context
switch in hardly one drain of 40; since the server streams its replay, a yurtcoord drain
waits for it 50-75 times, the official client's hardly ever), and
garbage collection and page faults vary little from drain to drain; what varies is the
user CPU time of the same work, on both sides, by up to a half between drains seconds
apart, with the other load on this 2-core machine. A yurtcoord drain is 0.1-0.2 s of
CPU, so one spell of other load covers much of it: hence the turns.
Where the yurtcoord consumer's CPU goes (`--profile DIR`: cProfile in the consumer
process from its first to its last event, one drain, 2026-12-02 02:55 UTC, load
average 1.6-1.8; own time, the C JSON scanner counted in its caller):
`WatchStreamProtocol.lines` 206 calls 0.075 s (the JSON scan of every read, and the
garbage collections and page faults of the objects it makes), `ChunkedBodyBatcher.dataReceived`
206 calls 0.025 s, `Informer._on_event` 19,999 calls 0.023 s,
`WatchStreamProtocol._take` 206 calls 0.020 s, `dict.get` 159,992 calls 0.015 s, socket
`recv` 206 calls 0.011 s, the bench's on_add 0.007 s, `Informer._deliver_add` 0.006 s,
`QuietCollections.busy` 0.005 s: no Deferred, logging or line-splitting work shows per
event. Besides the CPU time the profile shows, 15-30% of a yurtcoord drain is system
time, nearly all of it the page faults of the memory the store grows by (the official
client keeps nothing and has none). Garbage collection (CPU inside `gc.callbacks`) under
the agent's policy: about 130 young collections per drain, 3-5 ms (before the middle
generation was held off during bursts as well: 12 middle ones too, 9-13 ms in all);
under the interpreter's defaults middle and one or two full ones as well, 30-90 ms.
Since that profile: the chunk framing's usual boundary (CRLF and a plain size line) is
read with one match and each payload copied once (batcher 11.4 -> 10.3 ms per 20,000
chunks), and a read's lines are counted from the replace that lists them (no separate
byte count, 2.9 ms per 20,000 events): a yurtcoord drain of 20,000 events 5.64 -> 5.11
us per event (median drain 112.8 -> 102.2 ms, old and new consumers taking turns against
one server), and rounds of 3.35-4.16x (median 3.93x) in one run at load average 1.7.
Longest reactor lag: the agent's `ReactorLagProbe` (every 100 ms) in the yurtcoord
consumer process, from the informer's start to its last event, the longest over the
rounds."""

METHOD_DECODERS = """\
The stdlib's `json` against `orjson` and `msgspec` (each installed one), in one run: CPU
time (`time.process_time`, the collector off, best of {repeats}) to decode {objects:,}
watch events (the informer bench's ConfigMaps as the test API server writes them) in
reads of {read_bytes:,} bytes as `WatchStreamProtocol.lines` decodes a read (its lines
as one JSON list, one decoder call per read), and the whole `WatchStreamProtocol` over
the same reads with that library as its decoder; the decode of one batch of etcd v3
gateway answers (10 range answers of 1,000 keys with base64 values of ~600 bytes, 100
txn answers of 100 puts, 100 watch lines of 100 events with previous values). Informer:
the informer bench's backlog mode, {rounds} round(s) of {turns} turns, in each turn
yurtcoord's `Informer` once with each library as the watch decoder (the decoder of
`yurtcoord.kube.watch` replaced in the consumer process, nothing else) and the official
client once; events over the time from the watch request that brought them to the last
event, a consumer's drains of a round taken together, the ratio to the official client's
of the same round, each library's gain over the stdlib's per round, medians of the
rounds (until 2026-12-04 a round was one drain of each, and single drains of one
consumer moved by half between rounds). Footprint: what importing the library adds to
the `VmRSS` of a fresh interpreter that has imported every module the agent loads but
its own and msgspec's, and the `VmRSS` of a fresh interpreter that imported the library
and `yurtcoord.agent.service` (median of 3; until 2026-12-04 the library was imported
after the agent, which imports msgspec itself since). Hostile lines: {hostile_lines}
lines a peer may send (NaN, Infinity, 1e400, integers past 64 bits, duplicate keys,
invalid UTF-8, a lone surrogate, nesting 600 and 100,000 deep, a BOM, a control
character, a truncated line, trailing data) through `WatchStreamProtocol` with each
library, alone and between two good events: those whose events or error differ from the
stdlib's. Rule: a library is adopted as a dependency only with a gain of at least 20% in
the request-to-last-event ratio and at most 2 MB more RSS for the agent; of those that
do, the one that changes least what the agent accepts (the fewest hostile lines that
differ from the stdlib's: a library that refuses valid JSON, integers past 64 bits or
nesting past its own limit, differs on more), the larger gain between equals. The agent
decodes its watch streams with msgspec since 2026-12-04, adopted by this rule (+42% in a
run of 3 rounds once the test server wrote each event's stored JSON instead of encoding
it as it streamed; before, with the server holding every decoder's rate, orjson +13% and
msgspec -6%); its etcd answers go through the stdlib."""


METHOD_UPLOAD = """\
{objects:,} pods of about {size:,} bytes (10 namespaces) in a yurthub disk cache; a
fresh etcd per mode, {repeat} round(s) with the modes alternating; rates are each
mode's best round, ratios are taken within each round and judged by their median (the
rounds' range beside it); every mode's result is checked with etcdctl (key count and
sample values). A round runs the batched upload next to raw puts with 4 in flight, the
baseline it is held closest to, and every other round runs its modes in reverse order,
so neither side of that ratio always follows the same mode (until 2026-12-04 the order
was fixed: batched, one per object, raw, raw with 4 in flight).
**batched**: `LocalCacheUploader` reading the cache (files, JSON and resourceVersion
checks included) and writing through `PoolStore.create_or_update_many`: 64 objects per
transaction, each guarded by a compare (the key alone: absent), 4 transactions in
flight, one more per round of answers within 1.5 times etcd's quickest, up to 8 (the
most per round is a row) (lanes over one reading of the cache, each writing a chunk of
64 files as one transaction and reading its next chunk while that one is in flight, so
they stay in flight across chunk boundaries; each file of the size fstat gives read with one read;
automatic full garbage collections held off while the upload runs, as the agent's
upload holds them with `QuietCollections`; middle ones go on). **one per object**:
one `PoolStore.create` per object, one at a time (the unbatched baseline), through the same
adapter, on the first {per_object_sample:,} objects (every request waits for an etcd
disk sync), compared by objects per second. **raw batched**: the same keys and mirror
values as plain puts, 64 objects (128 operations) per transaction through
`EtcdClient.submit`, no reads, no compares, one at a time, and with 4 in flight like
the store; the gap to the latter is reading and checking the files and the compares.
Peak RSS growth is `VmHWM` before/after the batched mode, which runs first in the
process (each lane holds at most two chunks of 64 files).
Longest reactor lag: the agent's `ReactorLagProbe` (a `LoopingCall` every 100 ms that
records how late it runs) on the reactor the mode runs on, the longest over the
rounds; a mode shorter than 100 ms gives the probe no call to be late.
Where the gap to raw puts went: `.venv/bin/python bench/upload.py --etcd 3.5 --profile`
(the batched mode and raw puts with 4 in flight, each once under cProfile on a fresh
etcd; CPU of the process and of etcd from /proc; time at each number of transactions in
flight measured on `EtcdClient.submit`, up to the last answer). Now (2026-12-02 06:30
UTC, load average 1.5-2.5): process CPU 1.17 s under the profiler against 0.95 s for
raw puts; 4 transactions in flight for 89% of the wall time. Top lines by own time:
epoll wait 1.05 s, socket send 0.56 s (469 calls), JSON decoding of the objects 0.07 s
(10,157 calls), posix.read 0.046 s, `_create_or_update_batch` 0.045 s, `_prepare` 0.042
s, base64 0.042 s (50,000: keys and values of the puts, keys of the compares),
posix.open 0.041 s, `_encode_part` 0.041 s (30,000). Without the profiler the upload's
own work costs 0.59-0.69 s of process CPU per 10,000 pods (raw puts 0.54 s, 3.5), the
rest being the file system calls (open, fstat, read, close: system time 0.13-0.17 s
against 0.02-0.06 s) and the objects' JSON. etcd 3.4 (07:00 UTC, two profiled runs):
process CPU 1.10 and 1.17 s against 0.70 and 0.81 s, etcd CPU 2.06 and 2.23 s against
1.95 and 2.20 s (the compares). Both share 2 cores, so a round's rate follows the sum.
Before that (03:26 UTC, load average 2.6-3.5): batched 5.28 s under the profiler against
4.79 s for raw puts, process CPU 2.05 s (raw 1.61 s); request JSON encoding 0.21 s (157
requests), txaioetcd `OpSet` construction 0.17 s (20,000) and marshalling 0.06 s: a
transaction's body is now written straight from its puts and key-only compares
(`encode_transaction`, which raw puts use too: process CPU per 10,000 pods 0.78 ->
0.68 s for the upload, 0.70 -> 0.54 s for raw puts, medians of 3), and a directory's
key path is built once (at most 1,024 kept).
How it got there. On 2026-12-01 (load average 6.2): batched 9.00 s under the profiler
against 5.85 s; no transaction in flight for 31% of the wall time while each chunk of
500 files was read and checked, four directories opened again for each file, every
object parsed twice, 20,000 reads in the failure branch of every write; changed to 4
lanes, one open per file, one parse, no reads in the guarded write (a failed guard is
followed by one read of its batch). On 2026-12-02 (load average 2.4-2.8, same
profile): batched 6.28 s against 5.32 s, process CPU 1.97 s (raw 1.27 s), etcd CPU
3.04 s (raw 2.76 s); 4 in flight for 61% of the time and 3 for 29%: each lane read and
checked 500 files in one go between two of its writes (the 43-47 ms reactor lag), while
the other lanes' answers waited. Changed: a chunk is one transaction (64 files), read
and checked while the lane's previous transaction is in flight; a create's compare is
the key alone (etcd's `version == 0` by the defaults of its `Compare` message; raw puts
plus one compare per object, 10,000 pods, median of 4-5 rounds: etcd 3.5 CPU +0.10 s
with txaioetcd's `CompVersion`, +0.00 s with the key alone, etcd 3.4 +0.06 s and
-0.01 s); an item's keys, mirror value and size are worked out once. Peak RSS growth
went from 25 MB to 16 MB (at most 8 chunks of 64 files held instead of 4 of 500).
Then (load average 2.6-3.3, the same profile run side by side with the code before,
two rounds each): each file read a second time to see its end (20,001 reads) and the
interpreter's full collections running during the upload; changed to one read for a
file of the size fstat gives (reading the cache and checking it, no etcd: 0.29-0.31 s
of CPU per 10,000 pods before, 0.25-0.27 s after, medians of 7) and full collections
held off for the upload, as pool sync holds them for a burst (peak RSS growth 16 MB ->
21 MB). Holding the middle generation's collections off as well, as pool sync's bursts
now do, made it worse for the upload (2026-12-02 06:58 UTC full run: peak RSS growth
43.6 MB, 0.90x and 0.75x of raw puts with 4 in flight on etcd 3.5 and 3.4): its files do
not stay, and the garbage that outlived a young collection piled up until the end.
Given back (07:21 UTC, the upload rows alone): 16.0 MB, 1.02x and 0.99x."""

METHOD_UPLOAD_MEMBERS = """The upload benchmark above ({objects:,} pods, {repeat} rounds, one request per object on
the first {per_object_sample:,}), with every mode run on a fresh single etcd and on a
fresh 3-member etcd cluster (`EtcdCluster`: three etcd processes on loopback, each with
its own data directory on the same disk, so a write is committed once two of them have
synced it), the two alternating within each round, best round of each kept. The
adapter is given every member's URL, first member first, as `[coordinator] storage`
gives them; the cluster result is checked with etcdctl like the single one. Ratios are
the cluster's objects per second over the single member's."""

METHOD_POOLSYNC = """\
{objects:,} discovery.k8s.io/v1 endpointslices (~420 bytes, three namespaces) in the
cloud, the API test server in a child process (seeding it over HTTP is not part of any
figure); a `PoolSyncManager` with its `PoolStore` on a real etcd {etcd}, built as a
leader agent builds them (`informer_lease_renew = 10s`), runs in the bench process with
the coordinator test server. The independent reader is `etcdctl watch --prefix
/mirror/rv` in a child process: the pool store writes an object and its mirror rv in
one transaction, so the mirror rv event of key K at resourceVersion R means "K at R is
readable in etcd" (times are when the bench reads it from etcdctl: an upper bound).
Initial sync runs from `manager.start(store)` (which first deletes the informer sync
lease and old keys) to every object seen in etcd; "lease after the lists" is from all
lists written to the informer sync lease existing on the coordinator (a renewal loop
that waits before its first write would add one whole `informer_lease_renew`, 10 s).
Latency: {rate:g} unconditional PUTs per second of distinct endpointslices for
{seconds:g} s, from the PUT sent to the cloud to
its resourceVersion's mirror rv event read from etcdctl. On a loaded machine the p99
varies widely between runs (17-400 ms over five earlier runs, p50 steady at 4-6 ms).
Longest reactor lag: the agent's `ReactorLagProbe` (every 100 ms) on the bench
process's reactor, where the pool sync, the sender and the watcher reader run, during
the initial sync and during the updates."""

METHOD_POOLSYNC_MEMBERS = """The pool sync benchmark above ({objects:,} endpointslices, {rate:g} updates/s for
{seconds:g} s), run twice in one process, each time with a fresh etcd, cloud and pool
sync: first on a single etcd, then on a 3-member etcd cluster (`EtcdCluster`: three
etcd processes on loopback, each with its own data directory on the same disk, so a
write is committed once two of them have synced it). The pool store's client is given
every member's URL, first member first, as `[coordinator] storage` gives them; the
independent `etcdctl watch` reads the first member. Figures are the cluster's beside
the single member's."""

METHOD_POOLSCALE = """\
{objects:,} discovery.k8s.io/v1 endpointslices in the cloud (API test server in a child
process, seeded over HTTP, not part of any figure; it runs with
`--no-full-collections`, as each full collection of its store would stop its watch
for 1-2 s, which a real API server does not do) and in the pool store: a
`PoolSyncManager` with its `PoolStore` on a real etcd {etcd}, built as a leader agent
builds them, first syncs the whole pool (the component key cache then holds
{objects:,} keys). Then {deletes:,} DELETEs and {updates:,} PUTs of distinct objects,
interleaved, {concurrency} in flight, are sent to the cloud over HTTP from the bench
process and reach the pool store through the pool sync's watch, write queue and
batched transactions. Longest reactor stall: a `LoopingCall` every {probe_ms:g} ms on
the reactor the pool sync runs on records how late each call runs, from the first
request until etcd is exact (the sender and the watcher reader share that reactor).
Exact: `etcdctl watch` on the mirror rv keys (child process) has seen every deleted
object's mirror rv deleted and every updated object's mirror rv at the
resourceVersion its PUT returned. Nothing lost: afterwards every mirror rv under the
prefix is read with etcdctl and compared with the cloud's objects and versions, and
the object keys are counted. Pool sync runs its full garbage collection once a burst
of changes is over: the probe goes on for 3 s after etcd is exact, reported apart."""

METHOD_DELEGATION = """\
{nodes:,} nodes, each delegated lease renewed every {period:g} s, {warmup:g} s warm-up,
{seconds:g} s measured. One agent runs as a separate `twistd -n yurtcoord` process and
leads the pool, with the configuration defaults for its election, heartbeat and pool
cache timings; a real etcd 3.5 is its pool store. The cloud API test server (with the
pool's Nodes) runs in a child process of the bench, the coordinator API test server
and the load generator in another: the generator writes each renewal (lease annotated
`openyurt.io/delegate-heartbeat: "true"`) into the coordinator's store, spread evenly,
the cloud process reports every node lease written to it, and the bench process only
matches the two streams by renewTime (times from `time.monotonic()`, one clock for every
process). The renewals start together with the initial burst (all leases created at
once); the burst ends when every node has a lease in the cloud. Kept up = every renewal
of the window reached the cloud, none superseded by the next renewal of its node, none
missing. Latency = pool update to cloud update. Leader CPU = utime + stime of the agent
process from `/proc/<pid>/stat` over the window; the test servers' CPU likewise, etcd's
not counted. The leader bounds its delegation chains in flight with `AdaptiveLimit`
(from 16, between 16 and 128, following the cloud's latency); per-lease coalescing
stays. Why the servers moved out of the bench process: at 1,000 renewals/s the test
server's store (which deep-copies every object it stores and serves) and the load
generator shared one reactor with the cloud server, so a catch-up of the generator held
back the leader's cloud writes and its election renewals. `YURTCOORD_BENCH_PROFILE=DIR`
runs the leader under twistd's cProfile and profiles the bench process over the window.
Leader's longest reactor lag: its `/metrics` histogram `yurtcoord_reactor_lag_seconds`
(the agent's lag probe, every 100 ms) is read at the start and the end of the window;
the upper bound of the highest bucket that gained an observation is reported as "at most
X" (the histogram keeps no maximum)."""

METHOD_ETCD_ADAPTER = """\
Puts per second through yurtcoord's `EtcdClient`, {value_size:,}-byte values, a fresh
etcd per installed version: **single** ({puts:,} puts, one per request, one at a
time), **single-x16** (16 in flight), **txn100** ({batched_puts:,} puts, 100 per
transaction, one at a time), **txn100-x4** (4 transactions in flight). Every mode's
keys are counted with etcdctl afterwards. No target: it shows what batching buys.
Longest reactor lag: the agent's `ReactorLagProbe` (every 100 ms) on the reactor the
client runs on, per mode; a mode shorter than 100 ms gives it no call to be late."""

METHOD_FOOTPRINT = """\
A pool of two agents, each a separate `twistd -n yurtcoord` process with the
configuration defaults for every timing (the kubelet grace period included), a real etcd, the cloud and coordinator API
test servers in the bench process; {objects:,} discovery.k8s.io/v1 endpointslices in
the cloud, mirrored by the leader into the pool etcd. The leader starts first, the
follower once the leader leads and etcd holds every endpointslice (a follower joining a
settled pool); once both are ready, {settle:g} s
to settle, then a quiet window
of {window:g} s: idle CPU = utime + stime of the agent process from `/proc/<pid>/stat`
over the window, RSS = `VmRSS` of `/proc/<pid>/status` at its end (`VmHWM`, the peak,
beside it); medians over {runs} run(s), each a fresh pool (a run in which the election
lease changed holder is discarded and run again: its follower led for a while). Import breakdown: the agents
run with `PYTHONPROFILEIMPORTTIME=1`, so the follower's log names every module it
imported; a fresh interpreter replays the imports made by running code (not those made
by another module's import), in their order, with a meter on the import system that
records each module's own `VmRSS` growth while it loads (minus what its own imports
added); the shares are summed by top-level package, the interpreter's RSS before any
of them reported apart. The agent loads txaioetcd's client without its package
`__init__`, which would bring in its LMDB layer (zlmdb, numpy, cbor2, about 13 MiB):
before that, an idle follower was 73 MiB and a leader 98 MiB (RSS in MiB throughout:
`VmRSS` / 1024)."""


def per_etcd_version(name, script, full, quick, timeout, method):
    """``name-3.5`` and ``name-3.4``: the benchmark on each etcd version, ``--etcd V``
    in front of its settings, skipped where that version is not installed."""
    return [Benchmark(f"{name}-{version}", script, ["--etcd", version] + full,
                      ["--etcd", version] + quick, timeout, method, needs_etcd=version)
            for version in ("3.5", "3.4")]


METHOD_POOLSIZE = """\
Pools of {sizes_text} agents, one after the other, each agent a separate `twistd -n yurtcoord`
process with its own stand-in kubelet and {pods} pods in its local cache, at the
configuration defaults of every timing (leader election 15 s / 10 s / 2 s / 5 s,
heartbeat every 10 s, informer sync lease every 10 s), a real etcd, the cloud and
coordinator API test servers in the bench process (`ProcessWorld`; the coordinator
apiserver keeps its objects in the pool etcd), loopback only; agents started 5 at a
time. Once one leads, all follow it and are ready and every pod is uploaded, {settle:g} s
to settle, then a {window:g} s window: cloud and coordinator requests from the test
servers' request logs, pool etcd requests from etcd's own `grpc_server_started_total`
(its /metrics; the agents' gateway calls and the coordinator apiserver's reads and
writes are all gRPC calls there), per second and per agent (pool total / N); RSS
(`VmRSS`) at the window's end and idle CPU (utime + stime of `/proc/<pid>/stat` over the
window, % of one core) of each agent process. Then the leader is SIGKILLed and the
coordinator's election lease read every 50 ms until another agent holds it (the
takeover), and the agents' /status until all follow it and are ready. The machine is
shared: CPU figures move with the load average shown in each row; request rates, RSS
and the takeover hardly do. docs/capacity.md models a pool of N nodes from these rows.
"""

METHOD_CHAOS = """\
`bench/chaos.py`: {minutes:g} minutes of overlapping faults drawn from seed {seed}
(the schedule is a pure function of seed and minutes, printed at the start;
run the same command to replay it) on one pool on network namespaces: 5 agents, each a
separate `twistd -n yurtcoord` process on a host of its own, a pool etcd of 3 members
and 2 coordinator apiservers, each on a host of its own, at the partition suite's
timings. Faults: agent SIGKILL and restart, etcd member SIGKILL and restart (one at a
time), coordinator apiserver SIGKILL and restart (one at a time), WAN and LAN cuts and
flaps of agent hosts, kubelet stops, rolling restarts in DaemonSet order. After a
settle time the whole run is judged by the partition suite's invariants (one
delegator and fencing, live leases within the bound outside the windows the faults
excuse, stale leases for stopped kubelets, the pool etcd exact against the cloud,
no agent traceback); the excuse rules are written down in
yurtcoord/testing/chaosjudge.py.
"""

METHOD_POOLPAGE = """\
The cloud and coordinator Kubernetes API test servers (real sockets, loopback) with
1,000 pool Nodes and their node leases, each member renewing its lease in both every
10 s (`--renew-interval`, a live pool's 100 renewals a second in each server), and a
load generator asking `/pool` 200 times a second on persistent connections, gzip
accepted as browsers do, in the bench process; the agent's real status site and
`PoolView` (over `KubeClient`s, `POOL_VIEW_TTL` as shipped) in a child process. Cloud
requests: every request that reached the cloud server in the window (a watch too), per
TTL, against at most one per `POOL_VIEW_TTL`: the view watches the pool's Nodes and
node leases instead of reading them per document. Agent CPU: `time.process_time()` of
the whole child process (user + system) over the window; the servers and the load
generator are not counted. A plain `GET /pool` that finds its document built is
answered from bytes made once per document, without a twisted.web request (the
README's "Pool view").
"""

# Full run: the sizes the acceptance targets name (10,000 pods, 10,000 endpointslices,
# 1,000 and 5,000 nodes), repeated or measured long enough to steady the figures; about 17
# minutes on 2 cores. Quick run: the same sizes, one round and short windows (2-3 min).
BENCHMARKS = [
    Benchmark("informer", "informer.py",
              ["--objects", "20000", "--rounds", "5"], ["--objects", "10000", "--rounds", "1"],
              400, METHOD_INFORMER),
    # The JSON libraries against the stdlib on the watch stream and the etcd answers.
    Benchmark("decoders", "decoders.py", ["--objects", "20000", "--rounds", "3"],
              ["--objects", "10000", "--rounds", "1"], 300, METHOD_DECODERS),
    # Upload: 7 rounds, as one round of a mode lasts about 2 s, and other load on the
    # machine moves a single round by 10-20% (raw puts with 4 in flight on etcd 3.4 in
    # one run: 5,477, 6,207 and 6,688 objects/s; the batched upload against them, in
    # the rounds of one run: 0.71x to 1.28x); every mode keeps its best round.
    *per_etcd_version("upload", "upload.py",
                      ["--objects", "10000", "--per-object-sample", "1000", "--repeat", "7"],
                      ["--objects", "10000", "--per-object-sample", "300", "--repeat", "1"],
                      600, METHOD_UPLOAD),
    # Upload on a 3-member etcd cluster against a single member, side by side.
    Benchmark("upload-members-3.5", "upload.py",
              ["--etcd", "3.5", "--etcd-members", "1", "3", "--objects", "10000",
               "--per-object-sample", "300", "--repeat", "2"],
              ["--etcd", "3.5", "--etcd-members", "1", "3", "--objects", "10000",
               "--per-object-sample", "100", "--repeat", "1"],
              600, METHOD_UPLOAD_MEMBERS, needs_etcd="3.5"),
    Benchmark("poolsync", "poolsync.py",
              ["--objects", "10000", "--rate", "100", "--seconds", "60"],
              ["--objects", "10000", "--rate", "100", "--seconds", "10"], 400, METHOD_POOLSYNC),
    # Pool sync on a 3-member etcd cluster against a single member, one after the other.
    Benchmark("poolsync-members", "poolsync.py",
              ["--objects", "10000", "--rate", "100", "--seconds", "30",
               "--etcd-members", "1", "3"],
              ["--objects", "10000", "--rate", "100", "--seconds", "10",
               "--etcd-members", "1", "3"], 500, METHOD_POOLSYNC_MEMBERS),
    *per_etcd_version("poolscale", "poolscale.py",
                      ["--objects", "100000", "--deletes", "10000", "--updates", "10000"],
                      ["--objects", "20000", "--deletes", "2000", "--updates", "2000"],
                      900, METHOD_POOLSCALE),
    Benchmark("delegation", "delegation.py",
              ["--nodes", "1000", "--period", "5", "--seconds", "120", "--warmup", "10"],
              ["--nodes", "1000", "--period", "5", "--seconds", "30", "--warmup", "5"],
              400, METHOD_DELEGATION),
    # A 5,000-node pool: 1,000 delegations/s offered.
    Benchmark("delegation-5000", "delegation.py",
              ["--nodes", "5000", "--period", "5", "--seconds", "60", "--warmup", "10"],
              ["--nodes", "5000", "--period", "5", "--seconds", "20", "--warmup", "5"],
              500, METHOD_DELEGATION),
    Benchmark("footprint", "footprint.py",
              ["--objects", "5000", "--window", "60", "--runs", "3"],
              ["--objects", "5000", "--window", "15", "--settle", "5", "--runs", "1"],
              900, METHOD_FOOTPRINT),
    # Pools of 5, 20 and 40 agent processes: about 10 minutes, so only with --only.
    Benchmark("poolsize", "poolsize.py", ["--sizes", "5", "20", "40"],
              ["--sizes", "5", "--window", "20", "--settle", "10"], 1800, METHOD_POOLSIZE,
              opt_in=True),
    # A seeded chaos run of 30 minutes (2 with --quick), only with --only.
    Benchmark("chaos", "chaos.py", ["--seed", "20261204", "--minutes", "30"],
              ["--seed", "20261204", "--minutes", "2"], 2700, METHOD_CHAOS, opt_in=True),
    # 200 req/s to /pool on a 1,000-member pool for 10 s.
    Benchmark("poolpage", "poolpage.py",
              ["--members", "1000", "--rate", "200", "--seconds", "10"],
              ["--members", "1000", "--rate", "200", "--seconds", "5"], 300, METHOD_POOLPAGE),
    Benchmark("etcd_adapter", "etcd_adapter.py",
              ["--puts", "3000", "--batched-puts", "30000"],
              ["--puts", "1000", "--batched-puts", "10000"], 300, METHOD_ETCD_ADAPTER),
]


# -- the machine ----------------------------------------------------------------------

def memory_gib():
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return float("nan")


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return platform.processor() or platform.machine()
    return platform.machine()


def etcd_versions():
    from yurtcoord.sim.etcd import etcd_binaries
    return [binary.version for binary in etcd_binaries()]


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def load_average():
    return "{:.2f} / {:.2f} / {:.2f}".format(*os.getloadavg())


# -- running one benchmark ---------------------------------------------------------------

class Outcome:
    """What one benchmark run gave: its result document or why there is none."""

    def __init__(self, benchmark, command):
        self.benchmark = benchmark
        self.command = command
        self.result = None
        self.failure = None
        self.skipped = None
        self.seconds = 0.0
        self.load_before = self.load_after = None
        self.kept = None  # (title, table lines, method lines) from the previous results


def display_command(command):
    """The command as someone would type it from the repository root."""
    shown = [".venv/bin/python", os.path.relpath(command[1], REPO)]
    arguments = command[2:]
    if "--json" in arguments:
        index = arguments.index("--json")
        arguments = arguments[:index] + arguments[index + 2:]
    return " ".join(shown + arguments)


def run_benchmark(benchmark, quick, workdir, available_etcd):
    json_path = os.path.join(workdir, benchmark.name + ".json")
    log_path = os.path.join(workdir, benchmark.name + ".log")
    outcome = Outcome(benchmark, benchmark.command(quick, json_path))
    if benchmark.needs_etcd and not any(
            v == benchmark.needs_etcd or v.startswith(benchmark.needs_etcd + ".")
            for v in available_etcd):
        outcome.skipped = f"etcd {benchmark.needs_etcd} is not installed"
        print(f"=== {benchmark.name}: skipped, {outcome.skipped}", flush=True)
        return outcome
    print(f"=== {benchmark.name}: {display_command(outcome.command)}", flush=True)
    outcome.load_before = os.getloadavg()[0]
    started = time.monotonic()
    process = subprocess.Popen(outcome.command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    timed_out = threading.Event()

    def on_timeout():
        timed_out.set()
        stop_group(process)

    timer = threading.Timer(benchmark.timeout, on_timeout)
    timer.start()
    try:
        with open(log_path, "wb") as log:
            for line in process.stdout:
                log.write(line)
                sys.stdout.write(f"  [{benchmark.name}] " + line.decode("utf-8", "replace"))
                sys.stdout.flush()
        code = process.wait()
    except BaseException:  # Ctrl-C: the benchmark gets the chance to clean up
        stop_group(process)
        raise
    finally:
        timer.cancel()
        process.stdout.close()
        # Whatever the benchmark may have left in its session goes with it.
        kill_group(process.pid, signal.SIGKILL)
    outcome.seconds = time.monotonic() - started
    outcome.load_after = os.getloadavg()[0]
    if timed_out.is_set():
        outcome.failure = f"timed out after {benchmark.timeout} s"
    elif code != 0:
        outcome.failure = f"crashed (exit code {code})"
    elif not os.path.exists(json_path):
        outcome.failure = "wrote no result"
    else:
        with open(json_path, encoding="utf-8") as f:
            outcome.result = json.load(f)
    if outcome.failure:
        print(f"=== {benchmark.name}: {outcome.failure}; its log ends:", file=sys.stderr)
        with open(log_path, "rb") as f:
            print(f.read()[-3000:].decode("utf-8", "replace"), file=sys.stderr, flush=True)
    else:
        print(f"=== {benchmark.name}: done in {outcome.seconds:.0f} s", flush=True)
    return outcome


def stop_group(process, grace=15.0):
    """SIGTERM to the benchmark's session (its own cleanup runs), SIGKILL after ``grace``."""
    kill_group(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        kill_group(process.pid, signal.SIGKILL)


def kill_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


# -- RESULTS.md -------------------------------------------------------------------------

def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def met_cell(met):
    if met is None:
        return ""
    return "yes" if met else "**NO**"


def render(outcomes, header):
    lines = ["# Benchmark results", "",
             "Regenerated by `bench/run" + (" --quick" if header["quick"] else "")
             + "`, which runs every benchmark one after the other, each in its own process, "
             "everything on loopback; do not edit by hand.", "",
             f"- date: {header['date']}",
             f"- machine: {header['cores']} cores ({header['cpu']}), "
             f"{header['memory_gib']:.1f} GiB memory, {header['system']}",
             f"- Python {header['python']}; etcd {', '.join(header['etcd']) or 'none'}; "
             f"kubernetes client {header['kubernetes']}",
             f"- load average (1 / 5 / 15 min) at start: {header['load_start']}; "
             f"at end: {header['load_end']} (other processes may share the machine: "
             "wall-clock figures vary with it)",
             f"- whole run: {header['seconds'] / 60:.1f} min"
             + (" (quick smoke run: one round, short windows)" if header["quick"] else "")]
    kept = [o.kept[0] for o in outcomes if o.kept is not None]
    if kept:
        lines.append("- rows kept from the previous results, not measured in this run: "
                     + ", ".join(kept))
    lines += header.get("notes", [])
    lines += ["", "| benchmark | measure | result | target | met |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        name = outcome.benchmark.name
        if outcome.kept is not None:
            lines += outcome.kept[1]
        elif outcome.result is not None:
            name = outcome.result.get("benchmark", name)
            for row in outcome.result["rows"]:
                lines.append(f"| {cell(name)} | {cell(row['measure'])} | {cell(row['result'])} "
                             f"| {cell(row['target'] or '')} | {met_cell(row['met'])} |")
        elif outcome.skipped:
            lines.append(f"| {cell(name)} | (not run) | skipped: {cell(outcome.skipped)} | | |")
        else:
            lines.append(f"| {cell(name)} | (the benchmark) | {cell(outcome.failure)} | runs "
                         f"to the end | **NO** |")
    lines += ["", "## Method", ""]
    described = set()  # methods already written out (both uploads share one)
    for outcome in outcomes:
        benchmark = outcome.benchmark
        if outcome.kept is not None:
            lines += outcome.kept[2]
            described.add(benchmark.method)
            continue
        if outcome.skipped:
            continue
        title = outcome.result["benchmark"] if outcome.result else benchmark.name
        lines += [f"### {title}", "",
                  f"`{display_command(outcome.command)}` (this run: {outcome.seconds:.0f} s, "
                  f"load average {outcome.load_before:.2f} -> {outcome.load_after:.2f})", ""]
        if outcome.result is None:
            lines += [f"No result: {outcome.failure}.", ""]
        elif benchmark.method in described:
            lines += ["Measured as above.", ""]
        else:
            text = " ".join(benchmark.method.format(**outcome.result["settings"]).split())
            lines += [textwrap.fill(text, width=88, break_long_words=False,
                                    break_on_hyphens=False), ""]
            described.add(benchmark.method)
    for section in header.get("sections", []):
        while lines and not lines[-1]:
            lines.pop()
        lines += [""] + section
    return "\n".join(lines).rstrip() + "\n"


# -- the previous results ------------------------------------------------------------------

class Previous:
    """What a run of some benchmarks keeps from the results file it rewrites: the table
    rows and method section of each benchmark it does not run, the header's notes on
    kept rows and every section after the method part."""

    def __init__(self, text):
        self.notes = []
        self.rows = []  # (title, line)
        self.methods = []  # (title, lines)
        self.sections = []  # lines, the "## ..." heading first
        part = "header"
        for line in text.splitlines():
            if line == "## Method":
                part = "method"
                continue
            if line.startswith("## "):
                part = "section"
                self.sections.append([line])
                continue
            if part == "header":
                if line.startswith("| ") and not line.startswith("| benchmark |"):
                    self.rows.append((line[2:].split(" | ", 1)[0], line))
                elif line.startswith("- ") and " rows: " in line.split(":", 1)[0] + ": ":
                    self.notes.append(line)
            elif part == "method":
                if line.startswith("### "):
                    self.methods.append((line[4:], [line]))
                elif self.methods:
                    self.methods[-1][1].append(line)
            else:
                self.sections[-1].append(line)

    @classmethod
    def read(cls, path):
        try:
            with open(path, encoding="utf-8") as f:
                return cls(f.read())
        except FileNotFoundError:
            return cls("")

    def kept(self, benchmark, quick):
        """(title, table lines, method lines) of ``benchmark`` as last measured with
        this run's settings, found by its command line; None when it is not there."""
        command = display_command(benchmark.command(quick, "-"))
        for title, lines in self.methods:
            if len(lines) > 2 and lines[2].startswith(f"`{command}`"):
                while lines and not lines[-1]:
                    lines = lines[:-1]
                rows = [line for row_title, line in self.rows if row_title == title]
                return title, rows, lines + [""]
        return None


def main(argv):
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller settings, a ~3-minute smoke run")
    parser.add_argument("--output", metavar="PATH",
                        help="where to write the results (default: bench/RESULTS.md, "
                             "or bench/RESULTS-quick.md with --quick)")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--only", nargs="+", metavar="NAME",
                        choices=[b.name for b in BENCHMARKS],
                        help="run only these, keep the others' rows from the output file")
    chosen.add_argument("--keep", nargs="+", metavar="NAME",
                        choices=[b.name for b in BENCHMARKS],
                        help="run all but these, keep their rows from the output file")
    options = parser.parse_args(argv)
    output = options.output or os.path.join(
        BENCH, "RESULTS-quick.md" if options.quick else "RESULTS.md")
    if options.only:
        selected = [b for b in BENCHMARKS if b.name in options.only]
    else:
        selected = [b for b in BENCHMARKS
                    if b.name not in (options.keep or ()) and not b.opt_in]
    previous = Previous.read(output)
    kept = {}
    for benchmark in BENCHMARKS:
        if benchmark in selected:
            continue
        kept[benchmark.name] = previous.kept(benchmark, options.quick)
        if kept[benchmark.name] is None and benchmark.name in (options.keep or ()):
            parser.error(f"{output} has no result of {benchmark.name} with this run's "
                         "settings to keep")

    header = {"quick": options.quick,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cores": os.cpu_count(), "cpu": cpu_model(), "memory_gib": memory_gib(),
              "system": f"{platform.system()} {platform.release()} {platform.machine()}",
              "python": platform.python_version(), "etcd": etcd_versions(),
              "kubernetes": package_version("kubernetes"), "load_start": load_average()}
    print(f"bench/run{' --quick' if options.quick else ''}: {len(selected)} benchmarks, "
          f"load average {header['load_start']}", flush=True)
    workdir = tempfile.mkdtemp(prefix="yurtcoord-bench-run-")
    started = time.monotonic()
    try:
        outcomes = []
        for benchmark in BENCHMARKS:
            if benchmark in selected:
                outcomes.append(run_benchmark(benchmark, options.quick, workdir,
                                              header["etcd"]))
            elif kept[benchmark.name] is not None:
                outcome = Outcome(benchmark, benchmark.command(options.quick, "-"))
                outcome.kept = kept[benchmark.name]
                outcomes.append(outcome)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    header["seconds"] = time.monotonic() - started
    header["load_end"] = load_average()
    kept_titles = [o.kept[0] for o in outcomes if o.kept is not None]
    header["notes"] = [note for note in previous.notes
                       if any(title.startswith(note[2:].split(" rows: ", 1)[0])
                              for title in kept_titles)]
    header["sections"] = previous.sections
    with open(output, "w", encoding="utf-8") as f:
        f.write(render(outcomes, header))
    failed = [o.benchmark.name for o in outcomes if o.failure]
    missed = [o.benchmark.name for o in outcomes if o.result and any(
        row["met"] is False for row in o.result["rows"])]
    print(f"wrote {output} in {header['seconds'] / 60:.1f} min; "
          f"failed: {', '.join(failed) or 'none'}; targets missed in: "
          f"{', '.join(missed) or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
