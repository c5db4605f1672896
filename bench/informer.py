"""Watch throughput: yurtcoord's Informer vs the official client's Watch().stream().

    .venv/bin/python bench/informer.py [--objects 20000] [--rounds 2] [--drains 3]
                                       [--mode backlog|live] [--json PATH] [--profile DIR]

One run, one Kubernetes API test server (in this process), the same objects for every
consumer. A round is ``--drains`` turns, and in every turn each consumer drains one
backlog: in a fresh namespace, the consumer runs in its own process and starts
watching it. Then:

- ``backlog`` (default; measures the consumers): the server goes down, this process
  creates ``--objects`` ConfigMaps through ``server.store``, and brings the server
  back up. Each consumer reconnects by itself (informer: its backoff, here 10-50 ms;
  official client: a retry loop polling every 10 ms) and resumes from its last seen
  resourceVersion, so it receives all objects as a backlog of ADDED events, as fast
  as it can take them. events/s is the drain rate, from the first to the last event;
  the time from the server coming back up to the last event is shown beside it (it
  includes the reconnect and the test server preparing the replay). The test server
  streams the replay as kube-apiserver does, a batch of events a reactor turn, each
  object written as the JSON it encoded once when the change was stored (as the
  watch cache keeps one serialization of an object for all its watchers), so the
  server streams faster than a consumer decodes; with its heap frozen meanwhile (its
  collector does not walk the backlog it holds), and it is never at resourceVersion
  0 (which a watch takes as "any"). The objects are
  deleted again once the consumer is done (the server keeps one drain's objects).
- ``live``: the objects are created while the consumer watches (500 per reactor
  turn). This is bounded by how fast the test server creates and streams objects,
  so both consumers mostly keep up with it.

Each consumer measures the same way (``Drain``), from its first to its last ADDED
event: wall time, process CPU time (``time.process_time``: user and system time of the
whole consumer process, garbage collection included) and the CPU time spent in the
garbage collector (``gc.callbacks``), and what ``getrusage`` says of the drain (user
and system time, minor page faults, context switches: waiting for data, preempted).
A consumer's figures for a round are those of its drains of that round taken
together (events over CPU time, or wall time, of all of them): the consumers take
turns, so both see the same spells of other load on the machine, which changes a
drain of 0.15 s of CPU time by up to a half. Figures:
- events per CPU second while draining, the headline: the consumer's own cost per
  event, which other load on the machine changes much less than wall-clock rates;
  the ratio yurtcoord / kubernetes per round and its median (and that of every
  single drain against the official client's of the same turn);
- from the request: the time from the request the events came on to the first and
  to the last event, and events/s over the latter, with their ratio per round (events
  over the time of all drains of the round) and its median. Each consumer starts this
  clock itself, just before it sends a list or watch request (the yurtcoord consumer
  in its client's ``list`` and ``watch``, the official client's before its
  ``Watch().stream()`` sends one); the latest request before the first event is the
  one the backlog came on. So a reconnect's backoff before that request is not in
  it, but everything from the request on is: the connection, the test server
  preparing the replay, the first read and its decoding;
- events/s (as above; ``live``: objects / (last event - start of creation)) and
  their ratio, the secondary figure;
- events per CPU second of the whole consumer process (start-up and imports too);
- the longest lag of the yurtcoord consumer's reactor (the agent's ``ReactorLagProbe``
  every 0.1 s, from the informer's start to the last event), the longest of all rounds.

Consumers, each turn in this order:
- ``yurtcoord``: ``Informer`` (list, then watch) on a ``KubeClient``; counts on_add.
  It runs as the agent's pool sync runs its informers: the heap frozen once the
  list is in and full garbage collections held off while changes arrive
  (``yurtcoord.tx.heap.QuietCollections``, ``busy()`` for every change).
- ``yurtcoord-default-gc``: the same, under the interpreter's default garbage
  collection (its store makes the interpreter walk the whole heap during the drain).
- ``kubernetes``: ``kubernetes.watch.Watch().stream(CoreV1Api.list_namespaced_config_map,
  ...)`` as its documentation shows (objects deserialized into models, none kept, so
  the garbage collector never runs); counts ADDED.

Targets (backlog mode): yurtcoord's events per CPU second draining >= 3x the official
client's in every round and >= 4x in the median of the rounds; its events/s from the
request to the last event >= 3x the official client's (median of the rounds); its
time from the request to the first event at most the official client's (medians of
the rounds). ``--json PATH`` writes the ratios, the medians and whether
the target was met (see bench/benchresult.py). ``--profile DIR`` profiles each
consumer (cProfile) from its first to its last event and prints the functions with
the most time of their own.
"""

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# yurtcoord's Informer twice: with the garbage collection the agent runs its
# informers under (``yurtcoord.tx.heap``), and with the interpreter's defaults.
CONSUMERS = ("yurtcoord", "yurtcoord-default-gc", "kubernetes")
# yurtcoord's events per CPU second draining over the official client's, every round,
# and the median of the rounds.
TARGET_CPU_RATIO = 3.0
TARGET_CPU_RATIO_MEDIAN = 4.0
# yurtcoord's events/s from its request to its last event over the official client's,
# the median of the rounds; and its time from the request to the first event at most
# the official client's (medians of the rounds).
TARGET_REQUEST_RATIO = 3.0
CHUNK = 500
# What getrusage says about each drain (see Drain.usage).
USAGE_FIGURES = ("drain_user_s", "drain_sys_s", "drain_minor_faults",
                 "drain_voluntary_switches", "drain_involuntary_switches")


def config_map(i, namespace):
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"cm-{i:06d}", "namespace": namespace,
                     "labels": {"app": f"app-{i % 50}", "tier": "bench"},
                     "annotations": {"bench.yurtcoord.io/index": str(i)}},
        "data": {"config.yaml": "key: value\n" * 8, "index": str(i)},
    }


# -- consumers (run in their own process) -----------------------------------------

class Drain:
    """What every consumer measures the same way, from its first to its last event:
    wall time (``time.time``), process CPU time (``time.process_time``: user and
    system time of every thread, garbage collection included), the CPU time spent
    in the garbage collector (``gc.callbacks``), by generation, and with
    ``--profile DIR`` a cProfile written to ``DIR/<consumer>-<namespace>.prof``."""

    def __init__(self, profile_dir, consumer, namespace):
        self.path = (os.path.join(profile_dir, f"{consumer}-{namespace}.prof")
                     if profile_dir else None)
        self.profile = None
        self.first = self.first_cpu = self.last = self.last_cpu = None
        # Just before the consumer's latest list or watch request; the one in flight
        # when the first event comes is the request the drain is timed from.
        self.requested = self.request = None
        self.gc_s = 0.0
        self.collections = 0
        self.by_generation = [0, 0, 0]
        self.gc_s_by_generation = [0.0, 0.0, 0.0]
        self._gc_started = None

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_started = time.process_time()
        elif self._gc_started is not None:
            spent = time.process_time() - self._gc_started
            self.gc_s += spent
            self.collections += 1
            self.by_generation[info["generation"]] += 1
            self.gc_s_by_generation[info["generation"]] += spent
            self._gc_started = None

    def sending_request(self):
        """The consumer is about to send a list or watch request (the clock of the
        request-to-event figures starts here)."""
        self.requested = time.time()

    def first_event(self):
        import gc
        self.request = self.requested
        gc.callbacks.append(self._gc)
        if self.path:
            import cProfile
            self.profile = cProfile.Profile()
            self.profile.enable()
        self.first = time.time()
        self.first_usage = resource.getrusage(resource.RUSAGE_SELF)
        self.first_cpu = time.process_time()

    def last_event(self):
        import gc
        self.last_cpu = time.process_time()
        self.last_usage = resource.getrusage(resource.RUSAGE_SELF)
        self.last = time.time()
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(self.path)
        gc.callbacks.remove(self._gc)

    def figures(self, events):
        return {"request": self.request, "first_event": self.first, "last_event": self.last,
                "drain_cpu": self.last_cpu - self.first_cpu, "drain_gc": self.gc_s,
                "drain_collections": self.collections, "events": events,
                "drain_collections_by_generation": self.by_generation,
                "drain_gc_s_by_generation": self.gc_s_by_generation,
                "cpu": sum(os.times()[:2]), **self.usage()}

    def usage(self):
        """From the first to the last event: user and system CPU seconds, minor page
        faults (memory touched for the first time), voluntary and involuntary context
        switches (waiting for data; preempted by other processes)."""
        a, b = self.first_usage, self.last_usage
        return {"drain_user_s": b.ru_utime - a.ru_utime, "drain_sys_s": b.ru_stime - a.ru_stime,
                "drain_minor_faults": b.ru_minflt - a.ru_minflt,
                "drain_voluntary_switches": b.ru_nvcsw - a.ru_nvcsw,
                "drain_involuntary_switches": b.ru_nivcsw - a.ru_nivcsw}


def profile_top(path, lines=25):
    """The ``lines`` functions of a profile with the most time of their own."""
    import io
    import pstats
    out = io.StringIO()
    pstats.Stats(path, stream=out).sort_stats("tottime").print_stats(lines)
    text = out.getvalue()
    return text[text.find("   ncalls"):].rstrip() if "   ncalls" in text else text


def run_yurtcoord_consumer(consumer, url, namespace, count, profile_dir=None):
    from twisted.internet import defer, task

    from yurtcoord.tx.retry import Retries, backoff_policy
    from yurtcoord.kube.client import ClientConfig, KubeClient
    from yurtcoord.kube.gvr import CONFIGMAPS
    from yurtcoord.kube.informer import Informer
    from yurtcoord.tx.heap import QuietCollections
    from yurtcoord.tx.reactorlag import ReactorLagProbe

    @defer.inlineCallbacks
    def main(reactor):
        # How late the consumer's reactor runs a timer while it lists, watches and drains.
        probe = ReactorLagProbe(reactor, interval=0.1)
        probe.start()
        drain = Drain(profile_dir, consumer, namespace)

        class RequestTimedClient(KubeClient):
            """The agent's client, noting the time just before each list or watch."""

            def list(self, *args, **kwargs):
                drain.sending_request()
                return super().list(*args, **kwargs)

            def watch(self, *args, **kwargs):
                drain.sending_request()
                return super().watch(*args, **kwargs)

        client = RequestTimedClient(reactor, ClientConfig(server=url, insecure=True, timeout=30))
        informer = Informer(reactor, client, CONFIGMAPS, namespace=namespace,
                            backoff=Retries(backoff_policy(initial=0.01, maximum=0.05)))
        finished = defer.Deferred()
        state = {"n": 0}
        # As the agent's pool sync holds its informers' objects: the heap frozen once
        # the lists are in, full collections held off while changes arrive.
        heap = QuietCollections(reactor) if consumer == "yurtcoord" else None

        def on_add(obj):
            if heap is not None:
                heap.busy()
            state["n"] += 1
            if state["n"] == 1:
                drain.first_event()
            if state["n"] == count:
                drain.last_event()
                finished.callback(None)

        informer.add_handler(on_add=on_add)
        informer.start()
        yield informer.wait_for_sync()
        if heap is not None:
            heap.freeze()
        yield finished
        probe.stop()
        result = drain.figures(state["n"])
        if heap is not None:
            heap.stop()
        yield informer.stop()
        yield client.close()
        print(json.dumps({**result, "longest_reactor_lag": probe.longest}), flush=True)

    task.react(main)


def run_kubernetes_consumer(url, namespace, count, resource_version, profile_dir=None):
    from kubernetes import client, watch

    configuration = client.Configuration()
    configuration.host = url
    api = client.CoreV1Api(client.ApiClient(configuration))
    n = 0
    drain = Drain(profile_dir, "kubernetes", namespace)
    while drain.last is None:
        w = watch.Watch()
        try:
            events = w.stream(api.list_namespaced_config_map, namespace,
                              resource_version=resource_version, timeout_seconds=600)
            # The generator sends its request when first asked for an event.
            drain.sending_request()
            for event in events:
                resource_version = w.resource_version or resource_version
                if event["type"] == "ADDED":
                    n += 1
                    if n == 1:
                        drain.first_event()
                    if n == count:
                        drain.last_event()
                        w.stop()
                        break
        except Exception:  # cut or refused while the server is down: resume
            time.sleep(0.01)
            resource_version = w.resource_version or resource_version
    print(json.dumps(drain.figures(n)), flush=True)


# -- driver -------------------------------------------------------------------------
# (bench/decoders.py drives its consumers with the same four functions.)

def start_server(reactor, objects):
    """A Kubernetes API test server (in this process) with history for one drain of
    ``objects``: each consumer resumes from just before its objects. A fresh test
    server is at resourceVersion 0, which a watch takes as "any" (the first consumer
    would resume with the initial list, not the replay every other drain gets;
    kube-apiserver is never at 0): one object made and deleted moves it on."""
    from yurtcoord.kube.gvr import CONFIGMAPS
    from yurtcoord.sim.apiserver import KubeAPIServer

    server = KubeAPIServer(reactor, history=objects + 1000)

    def started(_):
        server.store.create(CONFIGMAPS, config_map(0, "default"))
        server.store.delete(CONFIGMAPS, "cm-000000", "default")
        return server
    return server.start(port=0).addCallback(started)


def start_consumer(reactor, server, script, consumer, namespace, count, extra=()):
    """Runs ``script --consumer consumer ...`` in its own process: (a Deferred that
    fires once that consumer watches, the Deferred of its output)."""
    from twisted.internet import defer
    from twisted.internet.task import deferLater
    from twisted.internet.utils import getProcessOutputAndValue

    rv = str(server.store.resource_version)
    args = [os.path.abspath(script), "--consumer", consumer, "--url", server.url,
            "--namespace", namespace, "--objects", str(count), "--resource-version", rv,
            *extra]
    output = getProcessOutputAndValue(sys.executable, args, env=os.environ)

    @defer.inlineCallbacks
    def watching():
        deadline = time.monotonic() + 60
        while server.open_watches < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{consumer} consumer did not start watching")
            yield deferLater(reactor, 0.01, lambda: None)
    return watching(), output


def make_backlog(server, namespace, count):
    """Takes the server down, creates ``count`` objects in ``namespace`` and brings
    it up again: the consumer resumes and gets them all as a backlog of ADDED events.
    The server's heap stays frozen until ``drop_backlog``: it keeps the backlog until
    the consumer is done, so its collector need not walk it while replaying it, as
    kube-apiserver's replay never stops for a collection of the whole heap (here the
    backlog's young objects cost a collection 70-130 ms, before the first byte)."""
    from twisted.internet import defer

    from yurtcoord.kube.gvr import CONFIGMAPS

    @defer.inlineCallbacks
    def run():
        yield server.faults.down()
        for i in range(count):
            server.store.create(CONFIGMAPS, config_map(i, namespace))
        gc.freeze()
        yield server.faults.up()
    return run()


def drop_backlog(server, namespace, count):
    """The server keeps only the objects of the drain under way."""
    from yurtcoord.kube.gvr import CONFIGMAPS

    gc.unfreeze()
    for i in range(count):
        server.store.delete(CONFIGMAPS, f"cm-{i:06d}", namespace)


def consumer_result(consumer, out, err, code):
    """The consumer's figures: the JSON of its last line of output."""
    if code != 0:
        raise RuntimeError(f"{consumer} consumer failed ({code}): {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def measure(reactor, server, consumer, namespace, count, mode, profile_dir=None):
    """Start one consumer, create ``count`` objects once it watches; its figures."""
    from twisted.internet import defer
    from twisted.internet.task import deferLater

    from yurtcoord.kube.gvr import CONFIGMAPS

    @defer.inlineCallbacks
    def run():
        extra = ["--profile", profile_dir] if profile_dir else []
        watching, output = start_consumer(reactor, server, __file__, consumer, namespace,
                                          count, extra)
        yield watching
        if mode == "backlog":
            yield make_backlog(server, namespace, count)
            started = created = time.time()
        else:
            started = time.time()
            for start in range(0, count, CHUNK):
                for i in range(start, min(count, start + CHUNK)):
                    server.store.create(CONFIGMAPS, config_map(i, namespace))
                yield deferLater(reactor, 0, lambda: None)
            created = time.time()
        result = consumer_result(consumer, *(yield output))
        elapsed = result["last_event"] - started
        draining = result["last_event"] - result["first_event"]
        return {
            "consumer": consumer, "events": result["events"],
            "drain_events": count - 1, "drain_s": draining,
            "seconds": elapsed, "total_events_per_s": count / elapsed,
            "events_per_s": (count - 1) / draining if mode == "backlog" else count / elapsed,
            "cpu_s": result["cpu"], "events_per_cpu_s": count / result["cpu"],
            "drain_events_per_cpu_s": (count - 1) / result["drain_cpu"],
            "drain_cpu_s": result["drain_cpu"], "drain_gc_s": result["drain_gc"],
            "drain_collections": result["drain_collections"],
            "drain_collections_by_generation": result["drain_collections_by_generation"],
            "drain_gc_s_by_generation": result["drain_gc_s_by_generation"],
            **{k: result[k] for k in USAGE_FIGURES},
            "create_s": created - started,
            "first_event_s": result["first_event"] - started,
            # From just before the consumer sent the request the events came on (its
            # own clock, started at the same point in every consumer).
            "request_to_first_event_s": result["first_event"] - result["request"],
            "request_to_last_event_s": result["last_event"] - result["request"],
            "request_events_per_s": count / (result["last_event"] - result["request"]),
            # yurtcoord's consumer only: the official client has no reactor.
            "longest_reactor_lag_s": result.get("longest_reactor_lag"),
        }

    return run()


def round_figures(drains, r, mode):
    """Round ``r`` of every consumer: its drains of that round taken together (events
    over the CPU time, and over the wall time, of all of them)."""
    figures = []
    for consumer in CONSUMERS:
        mine = [f for f in drains if f["consumer"] == consumer and f["round"] == r]
        events = sum(f["drain_events"] for f in mine)
        figures.append({
            "consumer": consumer, "round": r, "drains": mine,
            "drain_events_per_cpu_s": events / sum(f["drain_cpu_s"] for f in mine),
            "events_per_s": (events / sum(f["drain_s"] for f in mine) if mode == "backlog"
                             else sum(f["events"] for f in mine)
                             / sum(f["seconds"] for f in mine)),
            "events_per_cpu_s": (sum(f["events"] for f in mine)
                                 / sum(f["cpu_s"] for f in mine)),
            "request_events_per_s": (sum(f["events"] for f in mine)
                                     / sum(f["request_to_last_event_s"] for f in mine)),
            "request_to_first_event_s": statistics.median(
                f["request_to_first_event_s"] for f in mine),
            "longest_reactor_lag_s": max((f["longest_reactor_lag_s"] or 0) for f in mine),
        })
    return figures


def drive(objects, rounds, mode, json_path=None, profile_dir=None, drains_per_round=3):
    from twisted.internet import defer, task
    from twisted.logger import globalLogBeginner

    globalLogBeginner.beginLoggingTo([lambda event: None], redirectStandardIO=False)

    results = []

    @defer.inlineCallbacks
    def main(reactor):
        server = yield start_server(reactor, objects)
        drains = []
        try:
            for r in range(rounds):
                for d in range(drains_per_round):
                    for consumer in CONSUMERS:
                        namespace = f"bench-{consumer}-{r}-{d}"
                        figures = yield measure(reactor, server, consumer, namespace,
                                                objects, mode, profile_dir)
                        figures["round"], figures["drain"] = r, d
                        drains.append(figures)
                        print(f"round {r} drain {d} {consumer:20s} "
                              f"{figures['events_per_s']:9.0f} events/s, "
                              f"all in {figures['seconds']:.2f} s "
                              f"({figures['total_events_per_s']:.0f}/s overall), "
                              f"{figures['drain_events_per_cpu_s']:7.0f} events/CPU-s draining "
                              f"(CPU {figures['drain_cpu_s']:.3f} s, of it garbage collection "
                              f"{figures['drain_gc_s']:.3f} s in {figures['drain_collections']} "
                              f"collections, by generation "
                              f"{'/'.join(map(str, figures['drain_collections_by_generation']))} taking "
                              f"{'/'.join(f'{1000 * t:.0f}' for t in figures['drain_gc_s_by_generation'])} ms), "
                              f"user/sys {figures['drain_user_s']:.3f}/{figures['drain_sys_s']:.3f} s, "
                              f"{figures['drain_minor_faults']} page faults, context switches "
                              f"{figures['drain_voluntary_switches']} waiting/"
                              f"{figures['drain_involuntary_switches']} preempted, "
                              f"{figures['events_per_cpu_s']:6.0f} events/CPU-s whole process, "
                              f"first event after {figures['first_event_s']:.3f} s, "
                              f"from the request: first event after "
                              f"{figures['request_to_first_event_s']:.3f} s, last after "
                              f"{figures['request_to_last_event_s']:.3f} s "
                              f"({figures['request_events_per_s']:.0f} events/s) (mode {mode})",
                              flush=True)
                        if profile_dir:
                            print(profile_top(os.path.join(profile_dir,
                                                           f"{consumer}-{namespace}.prof")),
                                  flush=True)
                        drop_backlog(server, namespace, objects)
                results.extend(round_figures(drains, r, mode))
                for figures in results[-len(CONSUMERS):]:
                    print(f"round {r} {figures['consumer']:20s} "
                          f"{figures['drain_events_per_cpu_s']:7.0f} events/CPU-s draining, "
                          f"{figures['events_per_s']:9.0f} events/s, from the request "
                          f"{figures['request_events_per_s']:9.0f} events/s, first event "
                          f"after {figures['request_to_first_event_s']:.3f} s "
                          f"({drains_per_round} drains)", flush=True)
        finally:
            yield server.stop()
        summary = {}
        for consumer in CONSUMERS:
            mine = [f for f in results if f["consumer"] == consumer]
            summary[consumer] = {
                "events_per_s": statistics.median(f["events_per_s"] for f in mine),
                "events_per_cpu_s": statistics.median(f["events_per_cpu_s"] for f in mine),
                "drain_events_per_cpu_s": statistics.median(
                    f["drain_events_per_cpu_s"] for f in mine),
                "request_events_per_s": statistics.median(
                    f["request_events_per_s"] for f in mine),
                "request_to_first_event_s": statistics.median(
                    f["request_to_first_event_s"] for f in mine),
            }
        y, k = summary["yurtcoord"], summary["kubernetes"]
        for name, figures in summary.items():
            print(f"median {name:20s} {figures['events_per_s']:9.0f} events/s, "
                  f"{figures['drain_events_per_cpu_s']:9.0f} events/CPU-s draining, "
                  f"{figures['events_per_cpu_s']:9.0f} events/CPU-s whole process, "
                  f"from the request {figures['request_events_per_s']:9.0f} events/s, "
                  f"first event after {figures['request_to_first_event_s']:.3f} s")

        def listed(ratios):
            return ", ".join(f"{r:.2f}x" for r in ratios)
        print(f"ratio events/CPU-s draining "
              f"{statistics.median(per_round(results, 'drain_events_per_cpu_s')):.2f}x "
              f"(median of the rounds: {listed(per_round(results, 'drain_events_per_cpu_s'))}; "
              f"target >= {TARGET_CPU_RATIO:g}x in every round, backlog mode), "
              f"whole process {y['events_per_cpu_s'] / k['events_per_cpu_s']:.2f}x")
        print(f"ratio events/CPU-s draining, single drains: "
              f"{listed(per_drain(results, 'drain_events_per_cpu_s'))}")
        print(f"ratio events/CPU-s draining, interpreter's default garbage collection: "
              f"rounds {listed(per_round(results, 'drain_events_per_cpu_s', 'yurtcoord-default-gc'))}")
        print(f"ratio events/s from the request to the last event "
              f"{statistics.median(per_round(results, 'request_events_per_s')):.2f}x "
              f"(median of the rounds: {listed(per_round(results, 'request_events_per_s'))}; "
              f"target >= {TARGET_REQUEST_RATIO:g}x); time to the first event "
              f"{y['request_to_first_event_s']:.3f} s against {k['request_to_first_event_s']:.3f} s "
              f"(medians of the rounds; target: at most the official client's)")
        print(f"ratio events/s     {statistics.median(per_round(results, 'events_per_s')):.2f}x "
              f"(median of the rounds: {listed(per_round(results, 'events_per_s'))}; "
              f"mode {mode}, {objects} objects)")
        write_json(json_path, objects, rounds, drains_per_round, mode, results, summary)

    task.react(main)


def per_round(results, figure, consumer="yurtcoord"):
    """``consumer``'s ``figure`` over the official client's, round by round."""
    theirs = {f["round"]: f[figure] for f in results if f["consumer"] == "kubernetes"}
    return [f[figure] / theirs[f["round"]] for f in results if f["consumer"] == consumer]


def per_drain(results, figure, consumer="yurtcoord"):
    """``consumer``'s ``figure`` over the official client's, drain by drain (the drains
    of one turn of a round)."""
    drains = [d for f in results for d in f["drains"]]
    theirs = {(d["round"], d["drain"]): d[figure] for d in drains
              if d["consumer"] == "kubernetes"}
    return [d[figure] / theirs[d["round"], d["drain"]] for d in drains
            if d["consumer"] == consumer]


def write_json(path, objects, rounds, drains_per_round, mode, results, summary):
    """The ratios (events per CPU second draining first), the medians and the target
    as a machine-readable result."""
    from benchresult import row, write_result

    y, k = summary["yurtcoord"], summary["kubernetes"]
    cpu_rounds = per_round(results, "drain_events_per_cpu_s")
    wall_rounds = per_round(results, "events_per_s")
    plain_rounds = per_round(results, "drain_events_per_cpu_s", "yurtcoord-default-gc")
    # Each drain on its own against the official client's drain of the same turn.
    pairs = per_drain(results, "drain_events_per_cpu_s")
    # Ratios are taken within a round (its consumers run one after the other, seconds
    # apart), then the median of the rounds.
    ratio = statistics.median(wall_rounds)
    cpu_ratio = statistics.median(cpu_rounds)
    longest_lag = max(f["longest_reactor_lag_s"] for f in results
                      if f["consumer"] == "yurtcoord")
    backlog = mode == "backlog"
    request_rounds = per_round(results, "request_events_per_s")
    request_ratio = statistics.median(request_rounds)
    first_y, first_k = y["request_to_first_event_s"], k["request_to_first_event_s"]
    rows = [
        row("ratio events/s from the request to the last event (median of the rounds)",
            f"{request_ratio:.2f}x", f">= {TARGET_REQUEST_RATIO:g}x" if backlog else None,
            request_ratio >= TARGET_REQUEST_RATIO),
        row("ratio events/s from the request to the last event, lowest - highest round",
            f"{min(request_rounds):.2f}x - {max(request_rounds):.2f}x"),
        row("yurtcoord / kubernetes events/s from the request to the last event (median)",
            f"{y['request_events_per_s']:,.0f} / {k['request_events_per_s']:,.0f}"),
        row("time from the request to the first event, yurtcoord / kubernetes "
            "(medians of the rounds)",
            f"{1000 * first_y:.0f} ms / {1000 * first_k:.0f} ms",
            "<= the official client's" if backlog else None, first_y <= first_k),
        row("ratio events per CPU-s draining (median of the rounds)", f"{cpu_ratio:.2f}x",
            f">= {TARGET_CPU_RATIO_MEDIAN:g}x" if backlog else None,
            cpu_ratio >= TARGET_CPU_RATIO_MEDIAN),
        row("ratio events per CPU-s draining, lowest - highest round",
            f"{min(cpu_rounds):.2f}x - {max(cpu_rounds):.2f}x",
            f">= {TARGET_CPU_RATIO:g}x (lowest round)" if backlog else None,
            min(cpu_rounds) >= TARGET_CPU_RATIO),
        row(f"ratio events per CPU-s draining, single drains ({drains_per_round} a round), "
            "median; lowest - highest",
            f"{statistics.median(pairs):.2f}x; {min(pairs):.2f}x - {max(pairs):.2f}x"),
        row("yurtcoord / kubernetes events per CPU-s draining (median)",
            f"{y['drain_events_per_cpu_s']:,.0f} / {k['drain_events_per_cpu_s']:,.0f}"),
        row("ratio events per CPU-s draining, interpreter's default garbage collection "
            "(median of the rounds; lowest - highest round)",
            f"{statistics.median(plain_rounds):.2f}x; "
            f"{min(plain_rounds):.2f}x - {max(plain_rounds):.2f}x"),
        row("ratio events/s, wall clock (median of the rounds)", f"{ratio:.2f}x"),
        row("ratio events/s, wall clock, lowest - highest round",
            f"{min(wall_rounds):.2f}x - {max(wall_rounds):.2f}x"),
        row("yurtcoord / kubernetes events/s (median)",
            f"{y['events_per_s']:,.0f} / {k['events_per_s']:,.0f}"),
        row("longest reactor lag, yurtcoord consumer process (all rounds)",
            f"{1000 * longest_lag:.0f} ms"),
    ]
    write_result(path, "informer", {"objects": objects, "rounds": rounds,
                                    "drains_per_round": drains_per_round, "mode": mode},
                 {"rounds": results, "medians": summary, "ratio_events_per_s": ratio,
                  "ratio_drain_events_per_cpu_s": cpu_ratio,
                  "ratio_drain_events_per_cpu_s_per_round": cpu_rounds,
                  "ratio_drain_events_per_cpu_s_per_drain": pairs,
                  "ratio_events_per_s_per_round": wall_rounds,
                  "ratio_request_events_per_s": request_ratio,
                  "ratio_request_events_per_s_per_round": request_rounds,
                  "ratio_drain_events_per_cpu_s_default_gc_per_round": plain_rounds,
                  "longest_reactor_lag_s": longest_lag}, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--drains", type=int, default=3,
                        help="backlogs each consumer drains per round, the consumers taking "
                             "turns (default 3)")
    parser.add_argument("--mode", choices=("backlog", "live"), default="backlog")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--profile", metavar="DIR",
                        help="profile each consumer (cProfile) from its first to its last "
                             "event; profiles go to DIR, the top lines are printed")
    parser.add_argument("--consumer", choices=CONSUMERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--resource-version", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.consumer in ("yurtcoord", "yurtcoord-default-gc"):
        run_yurtcoord_consumer(options.consumer, options.url, options.namespace, options.objects,
                               options.profile)
    elif options.consumer == "kubernetes":
        run_kubernetes_consumer(options.url, options.namespace, options.objects,
                                options.resource_version, options.profile)
    else:
        if options.profile:
            os.makedirs(options.profile, exist_ok=True)
        drive(options.objects, options.rounds, options.mode, options.json, options.profile,
              options.drains)


if __name__ == "__main__":
    main()
