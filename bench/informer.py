"""Watch throughput: yurtcoord's Informer vs the official client's Watch().stream().

    .venv/bin/python bench/informer.py [--objects 20000] [--rounds 2] [--mode backlog|live]
                                       [--json PATH]

One run, one Kubernetes API test server (in this process), the same objects for both
consumers. Per round and consumer, a fresh namespace; the consumer runs in its own
process and starts watching it. Then:

- ``backlog`` (default; measures the consumers): the server goes down, this process
  creates ``--objects`` ConfigMaps through ``server.store``, and brings the server
  back up. Each consumer reconnects by itself (informer: its backoff, here 10-50 ms;
  official client: a retry loop polling every 10 ms) and resumes from its last seen
  resourceVersion, so it receives all objects as a backlog of ADDED events, as fast
  as it can take them. events/s is the drain rate, from the first to the last event;
  the time from the server coming back up to the last event is shown beside it (it
  includes the reconnect and the test server preparing the replay).
- ``live``: the objects are created while the consumer watches (500 per reactor
  turn). This is bounded by how fast the test server creates and streams objects,
  so both consumers mostly keep up with it.

The consumer reports the wall and CPU times (``time.process_time``) of its first
and last ADDED events, and its total CPU time. Figures:
- events/s (as above; ``live``: objects / (last event - start of creation));
- events per CPU second while draining: the consumer's own cost per event, which
  other load on the machine does not change (wall-clock rates do);
- events per CPU second of the whole consumer process (start-up and imports too);
- ratios yurtcoord / kubernetes;
- the longest lag of the yurtcoord consumer's reactor (the agent's ``ReactorLagProbe``
  every 0.1 s, from the informer's start to the last event), the longest of all rounds.

Consumers:
- ``yurtcoord``: ``Informer`` (list, then watch) on a ``KubeClient``; counts on_add.
- ``kubernetes``: ``kubernetes.watch.Watch().stream(CoreV1Api.list_namespaced_config_map,
  ...)`` as its documentation shows (objects deserialized into models); counts ADDED.

Target: yurtcoord >= 2x the official client (backlog mode). ``--json PATH`` writes the
medians, the ratios and whether the target was met (see bench/benchresult.py).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONSUMERS = ("yurtcoord", "kubernetes")
CHUNK = 500


def config_map(i, namespace):
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"cm-{i:06d}", "namespace": namespace,
                     "labels": {"app": f"app-{i % 50}", "tier": "bench"},
                     "annotations": {"bench.yurtcoord.io/index": str(i)}},
        "data": {"config.yaml": "key: value\n" * 8, "index": str(i)},
    }


# -- consumers (run in their own process) -----------------------------------------

def run_yurtcoord_consumer(url, namespace, count):
    from twisted.internet import defer, task

    from yurtcoord.tx.retry import Retries, backoff_policy
    from yurtcoord.kube.client import ClientConfig, KubeClient
    from yurtcoord.kube.gvr import CONFIGMAPS
    from yurtcoord.kube.informer import Informer
    from yurtcoord.tx.reactorlag import ReactorLagProbe

    @defer.inlineCallbacks
    def main(reactor):
        # How late the consumer's reactor runs a timer while it lists, watches and drains.
        probe = ReactorLagProbe(reactor, interval=0.1)
        probe.start()
        client = KubeClient(reactor, ClientConfig(server=url, insecure=True, timeout=30))
        informer = Informer(reactor, client, CONFIGMAPS, namespace=namespace,
                            backoff=Retries(backoff_policy(initial=0.01, maximum=0.05)))
        finished = defer.Deferred()
        state = {"n": 0}

        def on_add(obj):
            state["n"] += 1
            if state["n"] == 1:
                state["first"] = time.time()
                state["first_cpu"] = time.process_time()
            if state["n"] == count:
                state["last_cpu"] = time.process_time()
                finished.callback(time.time())

        informer.add_handler(on_add=on_add)
        informer.start()
        yield informer.wait_for_sync()
        last = yield finished
        probe.stop()
        cpu = sum(os.times()[:2])
        yield informer.stop()
        yield client.close()
        print(json.dumps({"first_event": state["first"], "last_event": last, "cpu": cpu,
                          "drain_cpu": state["last_cpu"] - state["first_cpu"],
                          "events": state["n"], "longest_reactor_lag": probe.longest}),
              flush=True)

    task.react(main)


def run_kubernetes_consumer(url, namespace, count, resource_version):
    from kubernetes import client, watch

    configuration = client.Configuration()
    configuration.host = url
    api = client.CoreV1Api(client.ApiClient(configuration))
    n = 0
    first = last = first_cpu = last_cpu = None
    while last is None:
        w = watch.Watch()
        try:
            for event in w.stream(api.list_namespaced_config_map, namespace,
                                  resource_version=resource_version, timeout_seconds=600):
                resource_version = w.resource_version or resource_version
                if event["type"] == "ADDED":
                    n += 1
                    if n == 1:
                        first = time.time()
                        first_cpu = time.process_time()
                    if n == count:
                        last = time.time()
                        last_cpu = time.process_time()
                        w.stop()
                        break
        except Exception:  # cut or refused while the server is down: resume
            time.sleep(0.01)
            resource_version = w.resource_version or resource_version
    cpu = sum(os.times()[:2])
    print(json.dumps({"first_event": first, "last_event": last, "cpu": cpu,
                      "drain_cpu": last_cpu - first_cpu, "events": n}), flush=True)


# -- driver -------------------------------------------------------------------------

def measure(reactor, server, consumer, namespace, count, mode):
    """Start one consumer, create ``count`` objects once it watches; its figures."""
    from twisted.internet import defer
    from twisted.internet.task import deferLater
    from twisted.internet.utils import getProcessOutputAndValue

    @defer.inlineCallbacks
    def run():
        rv = str(server.store.resource_version)
        args = [os.path.abspath(__file__), "--consumer", consumer, "--url", server.url,
                "--namespace", namespace, "--objects", str(count), "--resource-version", rv]
        output = getProcessOutputAndValue(sys.executable, args, env=os.environ)
        deadline = time.monotonic() + 60
        while server.open_watches < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{consumer} consumer did not start watching")
            yield deferLater(reactor, 0.01, lambda: None)
        if mode == "backlog":
            yield server.faults.down()
            for i in range(count):
                server.store.create(CONFIGMAPS_GVR, config_map(i, namespace))
            yield server.faults.up()
            started = created = time.time()
        else:
            started = time.time()
            for start in range(0, count, CHUNK):
                for i in range(start, min(count, start + CHUNK)):
                    server.store.create(CONFIGMAPS_GVR, config_map(i, namespace))
                yield deferLater(reactor, 0, lambda: None)
            created = time.time()
        out, err, code = yield output
        if code != 0:
            raise RuntimeError(f"{consumer} consumer failed ({code}): {err.decode()[-2000:]}")
        result = json.loads(out.decode().strip().splitlines()[-1])
        elapsed = result["last_event"] - started
        draining = result["last_event"] - result["first_event"]
        return {
            "consumer": consumer, "events": result["events"],
            "seconds": elapsed, "total_events_per_s": count / elapsed,
            "events_per_s": (count - 1) / draining if mode == "backlog" else count / elapsed,
            "cpu_s": result["cpu"], "events_per_cpu_s": count / result["cpu"],
            "drain_events_per_cpu_s": (count - 1) / result["drain_cpu"],
            "create_s": created - started,
            "first_event_s": result["first_event"] - started,
            # yurtcoord's consumer only: the official client has no reactor.
            "longest_reactor_lag_s": result.get("longest_reactor_lag"),
        }

    return run()


CONFIGMAPS_GVR = None


def drive(objects, rounds, mode, json_path=None):
    global CONFIGMAPS_GVR
    from twisted.internet import defer, task
    from twisted.logger import globalLogBeginner

    from yurtcoord.kube.gvr import CONFIGMAPS
    from yurtcoord.sim.apiserver import KubeAPIServer

    CONFIGMAPS_GVR = CONFIGMAPS
    globalLogBeginner.beginLoggingTo([lambda event: None], redirectStandardIO=False)

    @defer.inlineCallbacks
    def main(reactor):
        server = KubeAPIServer(reactor, history=objects * len(CONSUMERS) * rounds + 1000)
        yield server.start(port=0)
        results = []
        try:
            for r in range(rounds):
                for consumer in CONSUMERS:
                    figures = yield measure(reactor, server, consumer, f"bench-{consumer}-{r}",
                                            objects, mode)
                    results.append(figures)
                    print(f"round {r} {consumer:10s} {figures['events_per_s']:9.0f} events/s, "
                          f"all in {figures['seconds']:.2f} s "
                          f"({figures['total_events_per_s']:.0f}/s overall), "
                          f"{figures['drain_events_per_cpu_s']:7.0f} events/CPU-s draining, "
                          f"{figures['events_per_cpu_s']:6.0f} events/CPU-s whole process, "
                          f"first event after {figures['first_event_s']:.3f} s (mode {mode})",
                          flush=True)
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
            }
        y, k = summary["yurtcoord"], summary["kubernetes"]
        for name, figures in (("yurtcoord", y), ("kubernetes", k)):
            print(f"median {name:10s} {figures['events_per_s']:9.0f} events/s, "
                  f"{figures['drain_events_per_cpu_s']:9.0f} events/CPU-s draining, "
                  f"{figures['events_per_cpu_s']:9.0f} events/CPU-s whole process")
        print(f"ratio events/s     {y['events_per_s'] / k['events_per_s']:.2f}x "
              f"(mode {mode}, {objects} objects; target >= 2x in backlog mode)")
        print(f"ratio events/CPU-s draining {y['drain_events_per_cpu_s'] / k['drain_events_per_cpu_s']:.2f}x, "
              f"whole process {y['events_per_cpu_s'] / k['events_per_cpu_s']:.2f}x")
        write_json(json_path, objects, rounds, mode, results, summary)

    task.react(main)


def write_json(path, objects, rounds, mode, results, summary):
    """The medians, the ratios and the 2x target as a machine-readable result."""
    from benchresult import row, write_result

    y, k = summary["yurtcoord"], summary["kubernetes"]
    ratio = y["events_per_s"] / k["events_per_s"]
    cpu_ratio = y["drain_events_per_cpu_s"] / k["drain_events_per_cpu_s"]
    per_round = [mine["events_per_s"] / theirs["events_per_s"]
                 for mine, theirs in zip(results[0::2], results[1::2])]
    longest_lag = max(f["longest_reactor_lag_s"] for f in results
                      if f["consumer"] == "yurtcoord")
    rows = [
        row("yurtcoord Informer, events/s (median)", f"{y['events_per_s']:,.0f}"),
        row("kubernetes Watch().stream(), events/s (median)", f"{k['events_per_s']:,.0f}"),
        row("ratio events/s", f"{ratio:.2f}x",
            ">= 2x" if mode == "backlog" else None, ratio >= 2),
        row("ratio events/s, lowest - highest round",
            f"{min(per_round):.2f}x - {max(per_round):.2f}x"),
        row("ratio events per CPU-s draining", f"{cpu_ratio:.2f}x"),
        row("longest reactor lag, yurtcoord consumer process (all rounds)",
            f"{1000 * longest_lag:.0f} ms"),
    ]
    write_result(path, "informer", {"objects": objects, "rounds": rounds, "mode": mode},
                 {"rounds": results, "medians": summary, "ratio_events_per_s": ratio,
                  "ratio_drain_events_per_cpu_s": cpu_ratio,
                  "ratio_events_per_s_per_round": per_round,
                  "longest_reactor_lag_s": longest_lag}, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=("backlog", "live"), default="backlog")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--consumer", choices=CONSUMERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--resource-version", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.consumer == "yurtcoord":
        run_yurtcoord_consumer(options.url, options.namespace, options.objects)
    elif options.consumer == "kubernetes":
        run_kubernetes_consumer(options.url, options.namespace, options.objects,
                                options.resource_version)
    else:
        drive(options.objects, options.rounds, options.mode, options.json)


if __name__ == "__main__":
    main()
