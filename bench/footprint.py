"""The agent's footprint: RSS and idle CPU of a follower and of a leader, and where the
RSS of imports goes (MiB: ``VmRSS`` / 1024).

    .venv/bin/python bench/footprint.py [--objects 5000] [--window 60] [--runs 3] [--json PATH]

Each run starts, and stops again, a pool on loopback (``yurtcoord.testing.world``'s
``ProcessWorld``): a real etcd, the cloud and coordinator Kubernetes API test servers
in this process, and two agents, each a separate ``twistd -n yurtcoord`` process with
the configuration defaults for every timing (leader election, heartbeats, informer
sync lease). The cloud holds ``--objects`` discovery.k8s.io/v1 endpointslices (three
namespaces, ~420 bytes of JSON each, written into the test server's store before the
agents start), which the leader mirrors into the pool etcd.

The leader starts first; once it leads and the pool etcd holds every endpointslice, the
follower starts (a follower joining a settled pool, which never leads). Once both are
ready, the agents get
``--settle`` seconds, then a quiet window of ``--window`` seconds: idle CPU
is utime + stime of each agent process (``/proc/<pid>/stat``) over the window, as a
share of one core; RSS is ``VmRSS`` of ``/proc/<pid>/status`` at the end of the window
(``VmHWM``, the peak, beside it). Each figure is the median over ``--runs`` runs. A
run in which the election lease changed holder (its ``leaseTransitions``) is discarded
and run again: its follower would have led for a while.

Import breakdown: the agents run with ``PYTHONPROFILEIMPORTTIME=1`` (Python writes one
line per finished import to stderr, nothing is kept in memory), so the follower's log
names every module its process imported, the lazily imported ones included. A fresh
interpreter (same Python, same path) then imports those modules with a meter on the
import system: each module's own share is the growth of ``VmRSS`` while its code (and,
for an extension, its shared library) is loaded, minus what the modules it imports in
turn added (as ``-X importtime``'s "self" column does for time). Only the imports made by
code running at the time are replayed, in their order (each brings in what it imported
in the agent, so a package the agent loads in part stays in part). The shares are
summed by top-level package. The interpreter's own RSS before any of it is reported apart.

``--json PATH`` writes the figures and the target (an idle follower at most 60 MiB of
RSS; see bench/benchresult.py).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchresult import row, write_result  # noqa: E402
from poolbench import endpoint_slice  # noqa: E402
from twisted.internet import defer, task  # noqa: E402

from yurtcoord.sim.agentini import FAULT_SUITE, configuration_defaults  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_FOLLOWER_MIB = 60.0
LEADER, FOLLOWER = "footprint-leader", "footprint-follower"
SLICES_PREFIX = "/registry/endpointslices/"
CLK_TCK = os.sysconf("SC_CLK_TCK")
IMPORT_MARK = "import time:"
# The configuration defaults of every timing the fault suite's ini (which this pool
# is built from) shortens, the kubelet grace period included.
DEFAULT_TIMINGS = configuration_defaults(FAULT_SUITE)
DEFAULT_KUBELET_GRACE_PERIOD = DEFAULT_TIMINGS["heartbeat"]["kubelet_grace_period"]


# -- /proc ---------------------------------------------------------------------------

def cpu_seconds(pid):
    """utime + stime of process ``pid`` in seconds (fields 14 and 15 of its stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid, field):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def agent_pid(ini_path):
    """The pid of the twistd process whose command line names ``ini_path``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if ini_path.encode() in argv and any(b"twistd" in arg for arg in argv[:2]):
            return int(entry)
    raise LookupError(f"no twistd process runs {ini_path}")


# -- the import breakdown ------------------------------------------------------------

# Runs in a fresh interpreter: argv[1:] are module names; prints a JSON document.
METER = r'''
import importlib, importlib.abc, json, sys

def rss():
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

shares = {}   # module -> KiB its own loading added
stack = []    # [RSS at start, KiB added by nested imports] of the modules loading

class Metered:
    """A loader that records the RSS growth of create_module and exec_module."""
    def __init__(self, loader, name):
        self._loader, self._name = loader, name
    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)
    def _measured(self, call, *args):
        stack.append([rss(), 0])
        try:
            return call(*args)
        finally:
            start, nested = stack.pop()
            grown = rss() - start
            shares[self._name] = shares.get(self._name, 0) + grown - nested
            if stack:
                stack[-1][1] += grown
    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return None if create is None else self._measured(create, spec)
    def exec_module(self, module):
        return self._measured(self._loader.exec_module, module)

class Meter(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = Metered(spec.loader, name)
                return spec
        return None

baseline = rss()
sys.meta_path.insert(0, Meter())
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as e:  # a module that only imports in its context
        failed.append(f"{name}: {type(e).__name__}")
sys.meta_path.pop(0)
print(json.dumps({"baseline_kib": baseline, "end_kib": rss(), "shares": shares,
                  "failed": failed}))
'''


def imported_modules(log_text):
    """``(name, depth)`` of each module a process imported, in the order they finished,
    from its ``PYTHONPROFILEIMPORTTIME`` lines (depth 0: imported by code running then,
    not by another module's import)."""
    modules = []
    for line in log_text.splitlines():
        if IMPORT_MARK not in line:
            continue
        columns = line.split(IMPORT_MARK, 1)[1].split("|")
        if len(columns) != 3 or not columns[0].strip().isdigit():
            continue  # the header line
        name = columns[2].rstrip()
        modules.append((name.strip(), (len(name) - len(name.lstrip()) - 1) // 2))
    return modules


def replayed(modules):
    """The imports to replay: those of depth 0, in their order; each brings in the
    modules it imported in the agent, as it did there (a package whose modules the
    agent loads without its ``__init__`` stays so)."""
    return [name for name, depth in modules if depth == 0]


def import_breakdown(modules, env):
    """KiB per top-level package, as the meter in a fresh interpreter measures them."""
    out = subprocess.run([sys.executable, "-c", METER, *modules], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"import meter failed: {out.stderr[-2000:]}")
    document = json.loads(out.stdout.strip().splitlines()[-1])
    packages = {}
    for module, kib in document["shares"].items():
        top = module.split(".")[0]
        packages[top] = packages.get(top, 0) + kib
    document["packages"] = packages
    return document


# -- one run -------------------------------------------------------------------------

@defer.inlineCallbacks
def one_run(reactor, options, number):
    from yurtcoord.kube.gvr import ENDPOINTSLICES_V1
    from yurtcoord.testing.poll import poll_until
    from yurtcoord.testing.twistd import child_environment
    from yurtcoord.testing.world import ProcessWorld, leader_of

    world = ProcessWorld(reactor, kubelet_grace_period=DEFAULT_KUBELET_GRACE_PERIOD)
    try:
        yield world.start()
        cloud = world.servers()[0]
        for i in range(options.objects):
            obj = endpoint_slice(i)
            cloud.store.create(ENDPOINTSLICES_V1, obj, namespace=obj["metadata"]["namespace"])
        for node in (LEADER, FOLLOWER):
            yield world.add_agent(node)
        # Inherited by the agents (child_environment copies this environment).
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
        try:
            # The leader first, the follower once the leader leads and has mirrored
            # the pool: a follower joining a settled pool, which never leads.
            yield world.start_agents([LEADER], **DEFAULT_TIMINGS)
            began = time.monotonic()

            @defer.inlineCallbacks
            def leading_and_synced():
                holder = yield world.election_holder()
                if holder != LEADER:
                    return False
                count = yield world.count_etcd(SLICES_PREFIX)
                return count == options.objects

            yield poll_until(leading_and_synced, 180.0, 0.5, reactor,
                             what=f"{LEADER} leading, {options.objects} endpointslices "
                                  "in the pool etcd")
            synced = time.monotonic() - began
            yield world.start_agents([FOLLOWER], **DEFAULT_TIMINGS)
        finally:
            del os.environ["PYTHONPROFILEIMPORTTIME"]

        @defer.inlineCallbacks
        def settled():
            statuses = yield world.statuses()
            return (leader_of(statuses) == LEADER
                    and all(s["ready"] for s in statuses.values()))

        yield poll_until(settled, 180.0, 0.5, reactor,
                         what=f"{LEADER} leading, both agents ready")
        roles = {"leader": world.agents[LEADER], "follower": world.agents[FOLLOWER]}
        print(f"run {number}: {LEADER} leads, pool synced {synced:.1f} s after it "
              f"listened; {FOLLOWER} ready; settling {options.settle:g} s", flush=True)
        yield task.deferLater(reactor, options.settle, lambda: None)
        pids = {role: agent_pid(agent.ini_path) for role, agent in roles.items()}
        cpu_before = {role: cpu_seconds(pid) for role, pid in pids.items()}
        load_before = os.getloadavg()
        wall = time.monotonic()
        yield task.deferLater(reactor, options.window, lambda: None)
        wall = time.monotonic() - wall
        result = {"load_before": load_before[0], "load_after": os.getloadavg()[0]}
        for role, pid in pids.items():
            result[role] = {
                "rss_mib": status_kib(pid, "VmRSS") / 1024,
                "hwm_mib": status_kib(pid, "VmHWM") / 1024,
                "cpu_percent": 100 * (cpu_seconds(pid) - cpu_before[role]) / wall,
            }
            print(f"run {number}: {role}: RSS {result[role]['rss_mib']:.1f} MiB (peak "
                  f"{result[role]['hwm_mib']:.1f} MiB), idle CPU "
                  f"{result[role]['cpu_percent']:.2f}% of one core over {wall:.0f} s",
                  flush=True)
        transitions = yield election_transitions(world)
        if transitions:
            # The follower led for a while: its RSS is a former leader's.
            print(f"run {number}: the election lease changed holder {transitions} "
                  f"time(s), run discarded", flush=True)
            return None
        result["follower_modules"] = imported_modules(roles["follower"].log_text())
        result["env"] = child_environment(without_etcd=True)
        return result
    finally:
        yield world.stop()


def election_transitions(world):
    """A Deferred: how often the pool's election lease changed holder (0: the first
    leader has led throughout, the other agent never did)."""
    return world.election_lease().addCallback(
        lambda lease: int((lease or {}).get("spec", {}).get("leaseTransitions") or 0))


@defer.inlineCallbacks
def run(reactor, options):
    runs = []
    discarded = 0
    while len(runs) < options.runs:
        if discarded >= 2 * options.runs:
            raise RuntimeError(f"{discarded} runs discarded: the leader keeps changing")
        result = yield one_run(reactor, options, len(runs) + discarded + 1)
        if result is None:
            discarded += 1
        else:
            runs.append(result)
    options.discarded = discarded
    breakdown = import_breakdown(replayed(runs[-1]["follower_modules"]), runs[-1]["env"])
    report(runs, breakdown, options)


def median(runs, role, key):
    return statistics.median(r[role][key] for r in runs)


def report(runs, breakdown, options):
    figures = {role: {key: median(runs, role, key)
                      for key in ("rss_mib", "hwm_mib", "cpu_percent")}
               for role in ("follower", "leader")}
    figures["runs"] = [{k: v for k, v in r.items() if k not in ("follower_modules", "env")}
                       for r in runs]
    figures["discarded_runs"] = options.discarded
    baseline = breakdown["baseline_kib"] / 1024
    imports = sum(breakdown["packages"].values()) / 1024
    packages = sorted(breakdown["packages"].items(), key=lambda kv: -kv[1])
    figures.update({"interpreter_mib": baseline, "imports_mib": imports,
                    "modules": len({name for name, _ in runs[-1]["follower_modules"]}),
                    "packages_mib": {name: kib / 1024 for name, kib in packages},
                    "meter_failed": breakdown["failed"]})
    print(f"\nmedians over {len(runs)} run(s), {options.objects:,} endpointslices, "
          f"{options.window:g} s quiet window ({options.discarded} run(s) discarded: "
          "the leader changed):")
    for role in ("follower", "leader"):
        f = figures[role]
        print(f"  {role:8s} RSS {f['rss_mib']:.1f} MiB (peak {f['hwm_mib']:.1f} MiB), "
              f"idle CPU {f['cpu_percent']:.2f}% of one core "
              f"(runs: {', '.join('%.1f MiB' % r[role]['rss_mib'] for r in runs)})")
    print(f"  load average (1 min) over the windows: "
          f"{', '.join('%.2f -> %.2f' % (r['load_before'], r['load_after']) for r in runs)}")
    print(f"imports of the follower ({figures['modules']} modules): {imports:.1f} MiB over "
          f"the interpreter's {baseline:.1f} MiB; by top-level package:")
    for name, kib in packages:
        if kib >= 256:
            print(f"  {name:24s} {kib / 1024:5.1f} MiB")
    rest = sum(kib for _, kib in packages if kib < 256) / 1024
    print(f"  {'(each under 0.25 MiB)':24s} {rest:5.1f} MiB")
    print(f"  ({len(breakdown['failed'])} of the imports replayed failed as they did in "
          f"the agent: optional modules that are not installed or not of this platform)")
    follower, leader = figures["follower"], figures["leader"]
    top = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in packages[:8])
    rows = [
        row(f"idle follower RSS ({options.objects:,} endpointslices in the pool)",
            f"{follower['rss_mib']:.1f} MiB (peak {follower['hwm_mib']:.1f} MiB)",
            f"<= {TARGET_FOLLOWER_MIB:g} MiB", follower["rss_mib"] <= TARGET_FOLLOWER_MIB),
        row(f"idle leader RSS (mirroring {options.objects:,} endpointslices)",
            f"{leader['rss_mib']:.1f} MiB (peak {leader['hwm_mib']:.1f} MiB)"),
        row(f"idle CPU over {options.window:g} s, follower / leader",
            f"{follower['cpu_percent']:.2f}% / {leader['cpu_percent']:.2f}% of one core"),
        row("RSS of the follower's imports, by top-level package (MiB)",
            f"{imports:.1f} MiB over the interpreter's {baseline:.1f} MiB: {top}"),
    ]
    write_result(options.json, "footprint",
                 {"objects": options.objects, "window": options.window, "runs": options.runs,
                  "settle": options.settle}, figures, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=5000,
                        help="endpointslices in the cloud, mirrored by the leader")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of the quiet window")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds between the pool synced and the window")
    parser.add_argument("--runs", type=int, default=3, help="runs, each a fresh pool")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    options = parser.parse_args()
    task.react(run, [options])


if __name__ == "__main__":
    main()
