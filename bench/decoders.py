"""JSON decoders side by side: the stdlib's ``json`` against ``orjson`` and ``msgspec``.

    .venv/bin/python bench/decoders.py [--objects 20000] [--rounds 3] [--turns 3]
                                       [--json PATH]

Whether a faster JSON library pays on the two streams the agent decodes most: the
Kubernetes watch and the etcd gateway's answers. One run, every library that is
installed (a missing one is reported as such, not measured):

- **watch stream decode**: CPU time (``time.process_time``, the garbage collector off,
  best of 7) to decode ``--objects`` watch events (the bench informer's ConfigMaps, as
  the test API server encodes them) in reads of 64 KiB, as ``yurtcoord.kube.watch``
  decodes a read: its complete lines joined into one JSON list, one decoder call per
  read (the stdlib through the decoder's C scanner on the read decoded to ``str``,
  the libraries on the bytes); and the same reads through the product's whole
  ``WatchStreamProtocol`` with that library as its decoder, for the share decoding is
  of the stream's cost.
- **etcd answer decode**: CPU time to decode one batch of etcd v3 gateway answers
  as the agent's pool store reads and writes them: 10 range answers of 1,000 keys
  with base64 values of ~600 bytes, 100 txn answers of 100 puts, and 100 watch lines
  of 100 events with base64 values and previous values.
- **informer, from the request to the last event**: yurtcoord's ``Informer`` on a
  ``KubeClient`` in a process of its own, with each library as the watch stream's
  decoder (``yurtcoord.kube.watch``'s decoder replaced in that process, nothing else),
  and the official client (``kubernetes.watch.Watch().stream``) beside them; the
  backlog mode of bench/informer.py (the consumer watches an empty namespace, the
  server goes down, ``--objects`` ConfigMaps are created, the server comes back and
  each consumer resumes its watch from its last resourceVersion). A round is
  ``--turns`` turns, and in each turn every consumer drains one backlog: a consumer's
  figure for a round is that of its drains of the round taken together (events over
  the time of all of them), so that all see the same spells of other load. Events over
  the time from the watch request that brought the events to the last event; the
  ratio to the official client's of the same round, and each library's gain over the
  stdlib's, per round, then the median of the rounds. (Until 2026-12-04 a round was
  one drain of each: a single drain of the same consumer moved by half between
  rounds, 146,000 to 228,000 events/s, more than the libraries differ.)
- **footprint**: what importing the library adds to the ``VmRSS`` of a fresh
  interpreter that has imported every module the agent loads but its own and
  msgspec's (median of 3), and the ``VmRSS`` of a fresh interpreter that imported the
  library and the agent (``yurtcoord.agent.service``). (Until 2026-12-04 the library
  was imported after the agent; the agent imports msgspec itself since.)
- **hostile lines**: lines a peer may send (non-finite numbers, huge integers,
  duplicate keys, invalid UTF-8, lone surrogates, deep nesting, ...) through the
  product's ``WatchStreamProtocol`` with each library: the lines whose outcome (events
  handed on, or the error and its message) differs from the stdlib's.

Adoption rule: a library is adopted as a dependency only if it raises the informer's
request-to-last-event ratio by at least 20% (median of the rounds) and adds at most
2 MB to the agent's RSS; of those that do, the one that changes least what the agent
accepts (the fewest hostile lines that differ from the stdlib's), the larger gain
between equals. The decision row says which, if any, and why. The agent
decodes its watch streams with msgspec, adopted by this rule on 2026-12-04, once the
test server no longer encoded every event as it streamed it (which had held every
decoder's rate from the request at the server's); its etcd answers still go through
the stdlib.
"""

import argparse
import base64
import gc
import json
import os
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

LIBRARIES = ("json", "orjson", "msgspec")
CONSUMERS = tuple(f"yurtcoord-{library}" for library in LIBRARIES) + ("kubernetes",)
# The adoption rule: at least this gain in the request-to-last-event ratio, at most
# this much more RSS for the agent.
MIN_GAIN = 0.20
MAX_RSS_MB = 2.0
READ_BYTES = 65536
REPEATS = 7


# -- the libraries -----------------------------------------------------------------

def installed(library):
    """The library's version, or None where it is not installed."""
    if library == "json":
        return "stdlib"
    try:
        module = __import__(library)
    except ImportError:
        return None
    return getattr(module, "__version__", "?")


def loads_of(library):
    """``library``'s decoder of one JSON document given as bytes or str. The stdlib's
    as ``yurtcoord.kube.watch`` used it until msgspec was adopted: its C scanner on the
    text, when that is exactly one value; anything else through the full decoder
    (surrounding whitespace, or the decoder's error)."""
    if library == "json":
        decoder = json.JSONDecoder()
        # (An attribute the decoder sets on itself, which the type stubs leave out.)
        scan, decode = vars(decoder)["scan_once"], decoder.decode

        def loads(data):
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            try:
                value, end = scan(text, 0)
                if end == len(text):
                    return value
            except StopIteration:
                pass
            return decode(text)
        return loads
    if library == "orjson":
        import orjson
        return orjson.loads
    import msgspec
    return msgspec.json.Decoder().decode


def use_in_watch(library):
    """Make ``library`` the decoder of ``yurtcoord.kube.watch`` in this process
    (msgspec: as shipped). The module's one decoder takes the bytes of one JSON
    document and raises a ValueError for anything that is not exactly one value."""
    from yurtcoord.kube import watch
    watch._decode_json = loads_of(library)


# -- the inputs ----------------------------------------------------------------------

def watch_events(count):
    """``count`` ADDED events of the bench informer's ConfigMaps, each one line as the
    test API server writes it."""
    from informer import config_map
    from yurtcoord.sim.apiserver.watch import encode_event

    events = []
    for i in range(count):
        obj = config_map(i, "bench")
        obj["metadata"].update(resourceVersion=str(1000 + i), uid=f"uid-{i:08d}",
                               creationTimestamp="2026-01-01T00:00:00Z")
        events.append(encode_event("ADDED", obj))
    return events


def in_reads(lines, size=READ_BYTES):
    """``lines`` cut into reads of ``size`` bytes (a read ends anywhere in a line)."""
    stream = b"".join(lines)
    return [stream[i:i + size] for i in range(0, len(stream), size)]


def complete_lines(reads):
    """The complete lines of each read, as the line splitter hands them on (one block
    per read, the unfinished tail carried over), without the last newline."""
    blocks, tail = [], b""
    for read in reads:
        data = tail + read
        end = data.rfind(b"\n")
        if end < 0:
            tail = data
            continue
        blocks.append(data[:end])
        tail = data[end + 1:]
    return blocks


def etcd_answers():
    """One batch of etcd gateway answers (bytes): range, txn and watch answers."""
    def b64(data):
        return base64.b64encode(data).decode("ascii")

    def value(i):
        return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"pod-{i:06d}", "namespace": "pool", "resourceVersion": str(5000 + i),
            "labels": {"app": f"app-{i % 50}"}}, "spec": {"nodeName": f"node-{i % 300}"},
            "status": {"phase": "Running", "podIP": f"10.0.{i % 250}.{i % 200}"}},
            separators=(",", ":")).encode()

    header = {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437",
              "revision": "90210", "raft_term": "7"}

    def kv(i):
        return {"key": b64(f"/yurtcoord/pool/pods/pool/pod-{i:06d}".encode()),
                "create_revision": str(1000 + i), "mod_revision": str(5000 + i),
                "version": "3", "value": b64(value(i))}

    ranges = [json.dumps({"header": header, "kvs": [kv(p * 1000 + i) for i in range(1000)],
                          "more": p < 9, "count": "10000"}).encode() for p in range(10)]
    txns = [json.dumps({"header": header, "succeeded": True, "responses": [
        {"response_put": {"header": {"revision": str(90210 + t * 100 + i)}}}
        for i in range(100)]}).encode() for t in range(100)]
    watches = [json.dumps({"result": {"header": header, "events": [
        {"kv": kv(w * 100 + i), "prev_kv": kv(w * 100 + i)} for i in range(100)]}}).encode()
        for w in range(100)]
    return {"range": ranges, "txn": txns, "watch": watches}


def cpu_of(work, repeats=REPEATS):
    """The least CPU time ``work()`` took over ``repeats`` runs, the collector off."""
    best = None
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.process_time()
            work()
            spent = time.process_time() - started
            best = spent if best is None else min(best, spent)
    finally:
        gc.enable()
    return best


# -- decode CPU --------------------------------------------------------------------------

def watch_decode_cpu(library, blocks):
    """CPU seconds to decode every block as ``yurtcoord.kube.watch`` decodes a read."""
    if library == "json":
        scan = vars(json.JSONDecoder())["scan_once"]

        def decode(block):
            text = b"".join((b"[", block.replace(b"\n", b",\n"), b"]")).decode("utf-8")
            return scan(text, 0)[0]
    else:
        loads = loads_of(library)

        def decode(block):
            return loads(b"".join((b"[", block.replace(b"\n", b",\n"), b"]")))
    return cpu_of(lambda: [decode(block) for block in blocks])


def watch_stream_cpu(library, reads, count):
    """CPU seconds for the product's ``WatchStreamProtocol`` to take every read, with
    ``library`` as its decoder (each run a fresh stream; every event counted)."""
    from twisted.internet.testing import StringTransport
    from yurtcoord.kube import watch

    saved = watch._decode_json
    use_in_watch(library)
    try:
        seen = []

        def one():
            events = [0]

            def on_event(kind, obj):
                events[0] += 1
            stream = watch.WatchStreamProtocol(on_event, "bench", None, max_line=1 << 24)
            stream.makeConnection(StringTransport())
            for read in reads:
                stream.dataReceived(read)
            seen.append(events[0])
        spent = cpu_of(one)
    finally:
        watch._decode_json = saved
    if set(seen) != {count}:
        raise RuntimeError(f"{library}: the watch stream handed on {seen} events, not {count}")
    return spent


def etcd_decode_cpu(library, answers):
    """CPU seconds to decode each kind of etcd answer of the batch, by kind."""
    loads = loads_of(library)
    return {kind: cpu_of(lambda: [loads(body) for body in bodies])
            for kind, bodies in answers.items()}


def etcd_parse_cpu(answers):
    """CPU seconds of the product's whole parse of the batch with the stdlib (decode,
    checks, base64 of keys and values), for the share decoding is of it."""
    from yurtcoord.etcd.client import _parse_range
    from yurtcoord.etcd.transport import parse_answer
    from yurtcoord.etcd.watch import _WatchProtocol

    class Watch:
        pass
    responses = []
    stream = _WatchProtocol(Watch(), responses.append, 1 << 26)

    def parse():
        for body in answers["range"]:
            _parse_range(parse_answer((200, body)))
        for body in answers["txn"]:
            parse_answer((200, body))
        for body in answers["watch"]:
            stream.line(body)
    spent = cpu_of(parse)
    if len(responses) != REPEATS * len(answers["watch"]):
        raise RuntimeError(f"the etcd watch parse handed on {len(responses)} responses")
    return spent


# -- hostile lines ------------------------------------------------------------------------

HOSTILE_LINES = {
    "NaN": b'{"type":"ADDED","object":{"metadata":{"name":"a"},"n":NaN}}',
    "Infinity": b'{"type":"ADDED","object":{"metadata":{"name":"a"},"n":-Infinity}}',
    "1e400": b'{"type":"ADDED","object":{"metadata":{"name":"a"},"n":1e400}}',
    "huge integer": b'{"type":"ADDED","object":{"metadata":{"name":"a"},'
                    b'"n":123456789012345678901234567890}}',
    "2**64": b'{"type":"ADDED","object":{"metadata":{"name":"a"},"n":18446744073709551616}}',
    "duplicate keys": b'{"type":"ADDED","type":"DELETED","object":{"metadata":{"name":"a"}}}',
    "invalid UTF-8": b'{"type":"ADDED","object":{"metadata":{"name":"\xff\xfe"}}}',
    "lone surrogate": b'{"type":"ADDED","object":{"metadata":{"name":"\\ud800"}}}',
    "nested 100,000 deep": b'{"type":"ADDED","object":{"metadata":{},"x":'
                           + b"[" * 100000 + b"]" * 100000 + b"}}",
    "nested 600 deep": b'{"type":"ADDED","object":{"metadata":{},"x":'
                       + b"[" * 600 + b"]" * 600 + b"}}",
    "byte order mark": b'\xef\xbb\xbf{"type":"ADDED","object":{"metadata":{"name":"a"}}}',
    "control character": b'{"type":"ADDED","object":{"metadata":{"name":"a\x01"}}}',
    "truncated": b'{"type":"ADDED","object":{"metadata":{"name":"a"}',
    "trailing data": b'{"type":"ADDED","object":{"metadata":{"name":"a"}}} x',
}


def watch_outcome(library, line):
    """What the product's watch stream makes of ``line`` (with a good event before and
    after it, in one read and alone) with ``library`` as its decoder: the events
    handed on, and how the stream ended (error type and message)."""
    from twisted.internet.testing import StringTransport
    from twisted.python.failure import Failure
    from twisted.web.client import ResponseDone
    from yurtcoord.kube import watch

    good = b'{"type":"ADDED","object":{"metadata":{"name":"good"}}}'
    saved = watch._decode_json
    use_in_watch(library)
    try:
        outcomes = []
        for reads in ([good + b"\n" + line + b"\n" + good + b"\n"], [line + b"\n"]):
            events, ends = [], []
            stream = watch.WatchStreamProtocol(lambda kind, obj: events.append((kind, obj)),
                                               "bench", None, max_line=1 << 24)
            stream.makeConnection(StringTransport())
            stream.finished.addBoth(ends.append)
            try:
                for read in reads:
                    stream.dataReceived(read)
                # The body ends (or, after a failure, the dropped connection is gone).
                stream.connectionLost(Failure(ResponseDone()))
            except BaseException as e:  # anything raised out of the stream: a crash
                outcomes.append(("raised", type(e).__name__, str(e)[:200]))
                continue
            end = ends[0] if ends else None
            error = getattr(end, "value", None)
            outcomes.append((repr(events)[:400], type(error).__name__ if error else None,
                             str(error)[:300] if error else None))
        return outcomes
    finally:
        watch._decode_json = saved


def hostile_differences(library):
    """The hostile lines whose outcome with ``library`` differs from the stdlib's."""
    return [name for name, line in HOSTILE_LINES.items()
            if watch_outcome(library, line) != watch_outcome("json", line)]


# -- footprint --------------------------------------------------------------------------

# The modules the agent has loaded besides its own and msgspec's, one per line.
AGENT_MODULES_PROBE = """
import sys
import yurtcoord.agent.service
print("\\n".join(name for name in sorted(sys.modules)
                if not name.startswith(("yurtcoord", "msgspec", "__main__"))))
"""

FOOTPRINT_PROBE = """
import importlib, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
for name in sys.stdin.read().split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
before = rss()
if sys.argv[1] != "json":
    __import__(sys.argv[1])
    if sys.argv[1] == "msgspec":
        import msgspec.json
print(rss() - before)
"""

# The agent's VmRSS in a fresh interpreter, with the library imported too.
AGENT_RSS_PROBE = """
import sys
if sys.argv[1] != "json":
    __import__(sys.argv[1])
import yurtcoord.agent.service
with open("/proc/self/status") as f:
    print([line.split()[1] for line in f if line.startswith("VmRSS:")][0])
"""


def footprint(library, runs=3):
    """(agent RSS MiB, MiB added by importing ``library``), medians of ``runs`` fresh
    interpreters: the agent with the library imported too; and what the library adds
    to an interpreter that imported every module the agent loads but its own and
    msgspec's (the agent imports msgspec itself)."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(BENCH))
    modules = subprocess.run([sys.executable, "-c", AGENT_MODULES_PROBE], capture_output=True,
                             check=True, text=True, cwd=os.path.dirname(BENCH), env=env).stdout
    agent, added = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", FOOTPRINT_PROBE, library], input=modules,
                             capture_output=True, check=True, text=True,
                             cwd=os.path.dirname(BENCH), env=env)
        added.append(int(out.stdout) / 1024)
        out = subprocess.run([sys.executable, "-c", AGENT_RSS_PROBE, library],
                             capture_output=True, check=True, text=True,
                             cwd=os.path.dirname(BENCH), env=env)
        agent.append(int(out.stdout) / 1024)
    return statistics.median(agent), statistics.median(added)


# -- consumers (their own process) -----------------------------------------------------

def run_yurtcoord_consumer(library, url, namespace, count):
    """The bench informer's yurtcoord consumer with ``library`` as the watch decoder;
    prints the watch request's time, the first and the last event's, and the CPU."""
    use_in_watch(library)
    from twisted.internet import defer, task
    from twisted.logger import globalLogBeginner

    from yurtcoord.kube.client import ClientConfig, KubeClient
    from yurtcoord.kube.gvr import CONFIGMAPS
    from yurtcoord.kube.informer import Informer
    from yurtcoord.tx.heap import QuietCollections
    from yurtcoord.tx.retry import Retries, backoff_policy

    globalLogBeginner.beginLoggingTo([lambda event: None], redirectStandardIO=False)

    @defer.inlineCallbacks
    def main(reactor):
        client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=30))
        requests = []
        watch = client.watch

        def timed_watch(*args, **kwargs):
            requests.append(time.time())
            return watch(*args, **kwargs)
        client.watch = timed_watch
        informer = Informer(reactor, client, CONFIGMAPS, namespace=namespace,
                            backoff=Retries(backoff_policy(initial=0.01, maximum=0.05)))
        heap = QuietCollections(reactor)
        finished = defer.Deferred()
        state = {"n": 0}

        def on_add(obj):
            heap.busy()
            state["n"] += 1
            if state["n"] == 1:
                state["request"] = requests[-1]
                state["first"] = time.time()
                state["first_cpu"] = time.process_time()
            if state["n"] == count:
                state["last_cpu"] = time.process_time()
                state["last"] = time.time()
                finished.callback(None)

        informer.add_handler(on_add=on_add)
        informer.start()
        yield informer.wait_for_sync()
        heap.freeze()
        yield finished
        heap.stop()
        yield informer.stop()
        yield client.close()
        print(json.dumps({"request": state["request"], "first": state["first"],
                          "last": state["last"],
                          "drain_cpu": state["last_cpu"] - state["first_cpu"]}), flush=True)

    task.react(main)


def run_kubernetes_consumer(url, namespace, count, resource_version):
    """The bench informer's official-client consumer, timing each watch request."""
    from kubernetes import client, watch

    configuration = client.Configuration()
    configuration.host = url
    api = client.CoreV1Api(client.ApiClient(configuration))
    n, state = 0, {}
    while "last" not in state:
        w = watch.Watch()
        request = time.time()
        try:
            for event in w.stream(api.list_namespaced_config_map, namespace,
                                  resource_version=resource_version, timeout_seconds=600):
                resource_version = w.resource_version or resource_version
                if event["type"] == "ADDED":
                    n += 1
                    if n == 1:
                        state.update(request=request, first=time.time(),
                                     first_cpu=time.process_time())
                    if n == count:
                        state.update(last_cpu=time.process_time(), last=time.time())
                        w.stop()
                        break
        except Exception:  # cut or refused while the server is down: resume
            time.sleep(0.01)
            resource_version = w.resource_version or resource_version
    print(json.dumps({"request": state["request"], "first": state["first"],
                      "last": state["last"],
                      "drain_cpu": state["last_cpu"] - state["first_cpu"]}), flush=True)


# -- the informer driver -------------------------------------------------------------------

def informer_rounds(objects, rounds, consumers, turns):
    """Each consumer drains ``turns`` backlogs per round, the consumers taking turns;
    the figures of every drain."""
    from twisted.internet import defer
    from twisted.logger import globalLogBeginner
    from twisted.python.failure import Failure

    from informer import (
        consumer_result, drop_backlog, make_backlog, start_consumer, start_server)

    globalLogBeginner.beginLoggingTo([lambda event: None], redirectStandardIO=False)
    drains = []

    @defer.inlineCallbacks
    def drain(reactor, server, consumer, namespace):
        watching, output = start_consumer(reactor, server, __file__, consumer, namespace,
                                          objects)
        yield watching
        yield make_backlog(server, namespace, objects)
        result = consumer_result(consumer, *(yield output))
        drop_backlog(server, namespace, objects)
        return {"request_to_first_s": result["first"] - result["request"],
                "request_to_last_s": result["last"] - result["request"],
                "request_events_per_s": objects / (result["last"] - result["request"]),
                "drain_cpu_s": result["drain_cpu"],
                "drain_events_per_cpu_s": (objects - 1) / result["drain_cpu"]}

    @defer.inlineCallbacks
    def main(reactor):
        server = yield start_server(reactor, objects)
        try:
            for r in range(rounds):
                for turn in range(turns):
                    for consumer in consumers:
                        figures = yield drain(reactor, server, consumer,
                                              f"dec-{consumer}-{r}-{turn}")
                        figures.update(consumer=consumer, round=r, turn=turn)
                        drains.append(figures)
                        print(f"round {r} turn {turn} {consumer:20s} from the request "
                              f"{figures['request_events_per_s']:8.0f} events/s (first "
                              f"event after {figures['request_to_first_s']:.3f} s, last after "
                              f"{figures['request_to_last_s']:.3f} s), "
                              f"{figures['drain_events_per_cpu_s']:8.0f} events/CPU-s "
                              f"draining", flush=True)
        finally:
            yield server.stop()

    # Not task.react, which ends the process: the summary is made after the rounds.
    from twisted.internet import reactor
    outcome = []
    main(reactor).addBoth(outcome.append).addBoth(lambda _: reactor.stop())
    reactor.run()
    if isinstance(outcome[0], Failure):
        outcome[0].raiseException()
    return drains


# -- the whole run ----------------------------------------------------------------------------

def decide(libraries):
    """The adopted library (or None) and why, by the adoption rule. Of the libraries
    that meet it, the one that changes least what the agent accepts: the fewest
    hostile lines whose outcome differs from the stdlib's (a library that refuses
    valid JSON, integers past 64 bits or nesting past its own limit, differs on more),
    the larger gain between equals."""

    def preference(name):
        figures = libraries[name]
        return len(figures["hostile_differences"]), -figures["ratio_gain"]
    verdicts, best = [], None
    for name, figures in libraries.items():
        if name == "json":
            continue
        if figures.get("version") is None:
            verdicts.append(f"{name} not installed")
            continue
        gain, rss = figures["ratio_gain"], figures["rss_added_mb"]
        reasons = []
        if gain < MIN_GAIN:
            reasons.append(f"gain {gain:+.0%} < +{MIN_GAIN:.0%}")
        if rss > MAX_RSS_MB:
            reasons.append(f"RSS +{rss:.1f} MB > {MAX_RSS_MB:g} MB")
        if reasons:
            verdicts.append(f"{name}: " + ", ".join(reasons))
        else:
            differences = len(figures["hostile_differences"])
            verdicts.append(f"{name}: gain {gain:+.0%}, RSS +{rss:.1f} MB, {differences} "
                            f"hostile lines differ")
            if best is None or preference(name) < preference(best):
                best = name
    return best, "; ".join(verdicts)


def drive(objects, rounds, json_path, turns=3):
    from benchresult import row, write_result

    available = {library: installed(library) for library in LIBRARIES}
    measured = [library for library in LIBRARIES if available[library]]
    for library, version in available.items():
        print(f"{library}: {version or 'not installed'}", flush=True)

    events = watch_events(objects)
    reads = in_reads(events)
    blocks = complete_lines(reads)
    answers = etcd_answers()
    answer_bytes = sum(len(body) for bodies in answers.values() for body in bodies)
    etcd_parse = etcd_parse_cpu(answers)
    print(f"{objects} watch events, {sum(map(len, events)) / objects:.0f} bytes each, "
          f"{len(reads)} reads; etcd batch {answer_bytes / 1e6:.1f} MB: the product's whole "
          f"parse with the stdlib {1000 * etcd_parse:.1f} ms", flush=True)
    libraries = {}
    for library in LIBRARIES:
        figures = libraries[library] = {"version": available[library]}
        if library not in measured:
            continue
        figures["watch_decode_ms"] = 1000 * watch_decode_cpu(library, blocks)
        figures["watch_stream_ms"] = 1000 * watch_stream_cpu(library, reads, objects)
        etcd = etcd_decode_cpu(library, answers)
        figures["etcd_decode_ms"] = {kind: 1000 * spent for kind, spent in etcd.items()}
        figures["etcd_batch_ms"] = sum(figures["etcd_decode_ms"].values())
        figures["agent_rss_mb"], figures["rss_added_mb"] = footprint(library)
        figures["hostile_differences"] = ([] if library == "json"
                                          else hostile_differences(library))
        print(f"{library:8s} watch decode {figures['watch_decode_ms']:6.1f} ms, whole watch "
              f"stream {figures['watch_stream_ms']:6.1f} ms per {objects} events; etcd batch "
              f"{figures['etcd_batch_ms']:6.1f} ms ("
              + ", ".join(f"{k} {v:.1f}" for k, v in figures["etcd_decode_ms"].items())
              + f"); agent RSS {figures['agent_rss_mb']:.1f} MiB, "
              f"+{figures['rss_added_mb']:.2f} MiB with it; hostile lines that differ: "
              f"{', '.join(figures['hostile_differences']) or 'none'}", flush=True)

    consumers = [f"yurtcoord-{library}" for library in measured] + ["kubernetes"]
    drains = informer_rounds(objects, rounds, consumers, turns)

    def by_round(consumer, figure):
        """``figure`` of ``consumer`` by round, its drains of the round taken together:
        events over the time (or CPU time) of all of them; the median time to the first
        event."""
        taken: dict[int, list[dict]] = {}
        for d in drains:
            if d["consumer"] == consumer:
                taken.setdefault(d["round"], []).append(d)
        if figure == "request_events_per_s":
            return {r: objects * len(ds) / sum(d["request_to_last_s"] for d in ds)
                    for r, ds in taken.items()}
        if figure == "drain_events_per_cpu_s":
            return {r: (objects - 1) * len(ds) / sum(d["drain_cpu_s"] for d in ds)
                    for r, ds in taken.items()}
        return {r: statistics.median(d[figure] for d in ds) for r, ds in taken.items()}
    official = by_round("kubernetes", "request_events_per_s")
    stdlib = by_round("yurtcoord-json", "request_events_per_s")
    for library in measured:
        mine = by_round(f"yurtcoord-{library}", "request_events_per_s")
        figures = libraries[library]
        figures["request_events_per_s"] = statistics.median(mine.values())
        figures["request_ratio_rounds"] = [mine[r] / official[r] for r in sorted(mine)]
        figures["request_ratio"] = statistics.median(figures["request_ratio_rounds"])
        figures["ratio_gain_rounds"] = [mine[r] / stdlib[r] - 1 for r in sorted(mine)]
        figures["ratio_gain"] = statistics.median(figures["ratio_gain_rounds"])
        figures["request_to_first_s"] = statistics.median(
            by_round(f"yurtcoord-{library}", "request_to_first_s").values())
        figures["drain_events_per_cpu_s"] = statistics.median(
            by_round(f"yurtcoord-{library}", "drain_events_per_cpu_s").values())
    official_figures = {
        "request_events_per_s": statistics.median(official.values()),
        "request_to_first_s": statistics.median(
            by_round("kubernetes", "request_to_first_s").values())}
    adopted, verdicts = decide(libraries)

    rows = []
    for library in LIBRARIES:
        figures = libraries[library]
        name = library if library == "json" else f"{library} {figures['version']}"
        if library not in measured:
            rows.append(row(f"{library}", "not installed: not measured"))
            continue
        differences = figures["hostile_differences"]
        rows.append(row(
            f"{name}: decode CPU per {objects:,} watch events / per etcd answer batch",
            f"{figures['watch_decode_ms']:.1f} ms (whole watch stream "
            f"{figures['watch_stream_ms']:.1f} ms) / {figures['etcd_batch_ms']:.1f} ms "
            f"(range {figures['etcd_decode_ms']['range']:.1f}, txn "
            f"{figures['etcd_decode_ms']['txn']:.1f}, watch "
            f"{figures['etcd_decode_ms']['watch']:.1f})"))
        rows.append(row(
            f"{name}: informer from the request to the last event (ratio to the official "
            f"client; gain over the stdlib)",
            f"{figures['request_events_per_s']:,.0f} events/s, "
            f"{figures['request_ratio']:.2f}x (rounds "
            + ", ".join(f"{r:.2f}x" for r in figures["request_ratio_rounds"])
            + f"); {figures['ratio_gain']:+.0%}; first event after "
            f"{figures['request_to_first_s']:.3f} s",
            None if library == "json" else f">= +{MIN_GAIN:.0%}",
            None if library == "json" else figures["ratio_gain"] >= MIN_GAIN))
        rows.append(row(
            f"{name}: agent RSS after import (added by the library); hostile lines that "
            f"differ from the stdlib",
            f"{figures['agent_rss_mb']:.1f} MiB (+{figures['rss_added_mb']:.2f} MiB); "
            + (f"{len(differences)} of {len(HOSTILE_LINES)}"
               + (f" ({', '.join(differences)})" if differences else "")
               if library != "json" else "the reference"),
            None if library == "json" else f"<= +{MAX_RSS_MB:g} MB",
            None if library == "json" else figures["rss_added_mb"] <= MAX_RSS_MB))
    rows.append(row(
        "decision (adopt only with >= +20% request-to-last-event ratio and <= +2 MB RSS)",
        f"{'adopt ' + adopted if adopted else 'keep the stdlib'}: {verdicts}; the official "
        f"client {official_figures['request_events_per_s']:,.0f} events/s from the request, "
        f"first event after {official_figures['request_to_first_s']:.3f} s"))
    for r in rows:
        print(f"{r['measure']}: {r['result']}", flush=True)
    write_result(json_path, "decoders",
                 {"objects": objects, "rounds": rounds, "turns": turns, "read_bytes": READ_BYTES,
                  "repeats": REPEATS, "hostile_lines": len(HOSTILE_LINES)},
                 {"libraries": libraries, "official": official_figures, "drains": drains,
                  "etcd_parse_ms": 1000 * etcd_parse, "etcd_batch_bytes": answer_bytes,
                  "adopted": adopted},
                 rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3,
                        help="drains of each consumer per round, the consumers taking turns "
                             "(default 3)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--consumer", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--resource-version", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.consumer == "kubernetes":
        run_kubernetes_consumer(options.url, options.namespace, options.objects,
                                options.resource_version)
    elif options.consumer:
        run_yurtcoord_consumer(options.consumer.split("-", 1)[1], options.url,
                               options.namespace, options.objects)
    else:
        drive(options.objects, options.rounds, options.json, options.turns)


if __name__ == "__main__":
    main()
