"""A seeded chaos run: one pool through minutes of overlapping faults, judged by the
partition suite's invariants; exit status 0 only without a violation.

    .venv/bin/python bench/chaos.py --seed N --minutes M [--json PATH]

The pool (``yurtcoord.testing.chaos``): 5 agents, each a separate ``twistd -n
yurtcoord`` process on a host of its own (network namespaces, a WAN to the cloud and
a LAN), a pool etcd of 3 members and 2 coordinator apiservers, each on a host of its
own, at the partition suite's timings (heartbeat every 3 s, election lease 3 s). The
schedule (``yurtcoord.testing.chaosschedule``) is a pure function of its seed and
minutes, printed first: agent SIGKILL and restart, etcd member SIGKILL and restart
(one at a time: the quorum holds), coordinator apiserver SIGKILL and restart (one at a
time), WAN and LAN cuts and flaps of agent hosts, kubelet stops and starts, rolling
restarts in DaemonSet order. Run the same seed and minutes again to replay a run's
faults (what the processes make of them differs with the machine's timing).

After the faults and a settle time the run is judged over its whole length: one
delegator and fencing, live leases within the bound outside the windows the faults
excuse, stale leases for stopped kubelets, nothing uploaded lost and the pool etcd
exact against the cloud, no agent traceback. The excuse rules, derived from what the
invariants mean (a node whose agent is down or whose kubelet is stopped is not live;
a node cut from the cloud with no link to a possible delegator has no path to it),
are written down in ``yurtcoord/testing/chaosjudge.py``. Each violation is printed
with the records at fault, then the counts of the faults injected.

Needs root (network namespaces); ``--json PATH`` writes the result for bench/run
(see bench/benchresult.py).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchresult import row, write_result  # noqa: E402
from twisted.internet import defer, task  # noqa: E402


def result_rows(outcome):
    counts = ", ".join(f"{kind} {count}" for kind, count in outcome.injected.items())
    return [
        row(f"seed {outcome.seed}, {outcome.minutes:g} minutes of faults: faults injected",
            f"{sum(outcome.injected.values())} ({counts})"),
        row(f"seed {outcome.seed}, {outcome.minutes:g} minutes of faults: invariant "
            "violations", str(len(outcome.problems)), "0", not outcome.problems),
    ]


@defer.inlineCallbacks
def run(reactor, options):
    from yurtcoord.testing.chaos import run_chaos
    load_start = os.getloadavg()
    outcome = yield run_chaos(reactor, options.seed, options.minutes,
                              name=f"chaos-{os.getpid()}")
    for number, problem in enumerate(outcome.problems, start=1):
        print(f"VIOLATION {number}: {problem}", flush=True)
    print(outcome.summary(), flush=True)
    print(f"load average {'%.2f / %.2f / %.2f' % load_start} -> "
          f"{'%.2f / %.2f / %.2f' % os.getloadavg()}", flush=True)
    write_result(options.json, "chaos",
                 {"seed": options.seed, "minutes": options.minutes},
                 {"injected": outcome.injected, "violations": outcome.problems,
                  "notes": outcome.notes, "load_start": load_start,
                  "load_end": os.getloadavg(),
                  "schedule": [fault._asdict() for fault in outcome.schedule]},
                 result_rows(outcome))
    if outcome.problems:
        raise SystemExit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True,
                        help="what the schedule of faults is drawn from (random.Random(SEED))")
    parser.add_argument("--minutes", type=float, required=True,
                        help="minutes of faults (setup and settle time come on top)")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    options = parser.parse_args()
    if not options.minutes > 0:
        parser.error("--minutes must be positive")
    started = time.monotonic()
    try:
        task.react(run, [options])
    finally:
        print(f"whole run {(time.monotonic() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
