"""A flood of ``GET /pool`` on a large pool: what it costs the cloud and the agent.

    .venv/bin/python bench/poolpage.py [--members 1000] [--rate 200] [--seconds 10]
        [--renew-interval 10] [--plain] [--json PATH]

This process runs the cloud and the coordinator Kubernetes API test servers
(``yurtcoord/sim/apiserver``, real sockets on loopback) holding ``--members`` pool
Nodes, their node leases in the cloud and on the coordinator, and the election and
informer sync leases, each member renewing its node lease in both every
``--renew-interval`` seconds (``[heartbeat] interval``'s default; spread evenly, so
100 renewals a second each at 1,000 members, as a live pool writes them); and the
load generator. The serving side runs in a child
process of its own (``--serve``): the agent's real status site (``status_site``) with
the agent's ``PoolView`` over ``KubeClient``s to both servers (the pool etcd's key
counts answer 0 at once: no etcd here), as the composition root builds them, with
``POOL_VIEW_TTL`` as shipped. The load generator asks ``/pool`` ``--rate`` times a
second for ``--seconds`` after ``--warmup`` seconds, on persistent connections (a
browser or a poller keeps its connection), and reads every answer whole. It asks for
gzip, as the pool page's browser and most HTTP tools do (``--plain``: it does not),
and checks that every answer decodes to the document.

Figures, over the window:

- cloud requests per ``POOL_VIEW_TTL``: every request that reached the cloud server
  in the window (counted as it arrives, a watch too), over the window's length in
  TTLs; the target is at most one (issue 29: one paged list or a watch, never one
  read per member). The watches open at the end of the window are shown beside: the
  pool view watches the pool's Nodes and the node leases from its first document;
- the agent's CPU: ``time.process_time()`` of the whole child process (user + system,
  garbage collection included) from the start to the end of the window, as a share
  of one core; the test servers and the load generator run in this process and are
  not counted;
- ``/pool`` answers: sent, answered 200, failed; latency p50 / p99; documents built.
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchresult import row, write_result  # noqa: E402


def serve(cloud_url, coordinator_url):
    """The child: the status site with the real pool view, on a free port. Prints
    ``port <n>``; on ``start`` / ``stop`` from stdin prints the process CPU time and
    the documents built so far."""
    from twisted.internet import defer, reactor, stdio
    from twisted.protocols.basic import LineReceiver

    from yurtcoord.agent.metrics import Metrics
    from yurtcoord.agent.poolview import PoolView
    from yurtcoord.agent.status import status_site
    from yurtcoord.kube.client import ClientConfig, KubeClient
    from yurtcoord.names import ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE
    from yurtcoord.role.leadersource import ElectionLeader

    class Follower:
        role, healthy, ready = "follower", True, True

        def readiness_failures(self):
            return []

        def status(self):
            return {"node": "edge-0000", "pool": "pool-a", "role": "follower",
                    "ready": True, "healthy": True, "pool_cache_synced": True,
                    "local_cache_uploaded": True, "uploaded_objects": 0, "leader": None,
                    "cloud": {cloud_url: True}}

    cloud = KubeClient(reactor, ClientConfig(server=cloud_url, insecure=True))
    coordinator = KubeClient(reactor, ClientConfig(server=coordinator_url, insecure=True))
    source = Follower()
    view = PoolView(reactor, source, "edge-0000", "pool-a", coordinator, cloud,
                    lambda: True, lambda _prefix: defer.succeed(0), "/registry",
                    lambda: (), (ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME),
                    20.0, ElectionLeader(reactor))
    port = reactor.listenTCP(0, status_site(source, Metrics("edge-0000", "pool-a"),
                                            reactor, view), interface="127.0.0.1")

    class Control(LineReceiver):
        delimiter = b"\n"

        def connectionMade(self):
            self.sendLine(f"port {port.getHost().port}".encode())

        def lineReceived(self, line):
            self.sendLine(f"cpu {time.process_time():.6f} builds {view.builds}".encode())

        def connectionLost(self, reason):
            if reactor.running:
                reactor.stop()

    stdio.StandardIO(Control())
    profile = os.environ.get("POOLPAGE_PROFILE")
    if profile:
        import cProfile
        cProfile.runctx("reactor.run()", globals(), {"reactor": reactor}, profile)
    else:
        reactor.run()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--renew-interval", type=float, default=10.0,
                        help="seconds between two renewals of a member's node lease "
                             "(in the cloud and on the coordinator); 0: none")
    parser.add_argument("--plain", action="store_true",
                        help="do not ask for gzip (Accept-Encoding)")
    parser.add_argument("--json")
    parser.add_argument("--serve", nargs=2, metavar=("CLOUD", "COORDINATOR"))
    options = parser.parse_args()
    if options.serve:
        serve(*options.serve)
        return
    from twisted.internet import defer, reactor, task
    from twisted.web.client import Agent, HTTPConnectionPool, readBody
    from twisted.web.http_headers import Headers

    from yurtcoord.agent.poolview import POOL_VIEW_TTL
    from yurtcoord.kube.gvr import LEASES
    from yurtcoord.names import (
        ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE, INFORMER_SYNC_LEASE_NAME,
        INFORMER_SYNC_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE,
    )
    from yurtcoord.sim.apiserver import KubeAPIServer
    from yurtcoord.testing.poolleases import lease
    from yurtcoord.testing.world import add_pool_node

    figures = {}

    @defer.inlineCallbacks
    def run():
        cloud, coordinator = KubeAPIServer(reactor), KubeAPIServer(reactor)
        cloud_url = yield cloud.start(port=0)
        coordinator_url = yield coordinator.start(port=0)
        names = [f"edge-{i:04d}" for i in range(options.members)]
        for name in names:
            add_pool_node(cloud, name)
            cloud.store.create(LEASES, lease(name, 1))
            coordinator.store.create(LEASES, lease(name, 1))
        coordinator.store.create(LEASES, lease(ELECTION_LEASE_NAME, 1, holder=names[1],
                                               namespace=ELECTION_LEASE_NAMESPACE))
        coordinator.store.create(LEASES, lease(INFORMER_SYNC_LEASE_NAME, 1,
                                               holder=names[1],
                                               namespace=INFORMER_SYNC_LEASE_NAMESPACE))
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", cloud_url,
             coordinator_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(child.stdout.readline().split()[1])

            def sample():
                child.stdin.write("sample\n")
                child.stdin.flush()
                _, cpu, _, builds = child.stdout.readline().split()
                return float(cpu), int(builds)

            pool = HTTPConnectionPool(reactor, persistent=True)
            pool.maxPersistentPerHost = 16
            agent = Agent(reactor, pool=pool)
            url = f"http://127.0.0.1:{port}/pool".encode()
            headers = Headers({} if options.plain else {b"accept-encoding": [b"gzip"]})
            renewals = {"count": 0}

            def renew(n):
                """The members due since the last tick renew their node leases, in
                both servers, each once every ``--renew-interval`` (a live pool)."""
                for _ in range(n):
                    name = names[renewals["count"] % len(names)]
                    renewals["count"] += 1
                    for server in (cloud, coordinator):
                        current = server.store.get(LEASES, name, NODE_LEASE_NAMESPACE)
                        current["spec"]["renewTime"] = lease(name, 0)["spec"]["renewTime"]
                        server.store.update(LEASES, current)

            renewing = None
            if options.renew_interval > 0:
                renewing = task.LoopingCall.withCount(renew)
                renewing.start(options.renew_interval / len(names), now=False)
            counts = {"sent": 0, "ok": 0, "failed": 0}
            latencies = []
            measuring = [False]

            def ask():
                started = time.monotonic()
                counted = measuring[0]
                if counted:
                    counts["sent"] += 1
                d = agent.request(b"GET", url, headers)

                def answered(response):
                    def decoded(body):
                        if response.headers.getRawHeaders(b"content-encoding") == [b"gzip"]:
                            body = gzip.decompress(body)
                        json.loads(body)
                        return response.code
                    return readBody(response).addCallback(decoded)

                def done(code):
                    if counted:
                        counts["ok" if code == 200 else "failed"] += 1
                        latencies.append(time.monotonic() - started)

                def failed(_failure):
                    if counted:
                        counts["failed"] += 1

                d.addCallback(answered).addCallbacks(done, failed)

            # One request a tick; ticks a late reactor missed are made up.
            loop = task.LoopingCall.withCount(lambda n: [ask() for _ in range(n)])
            loop.start(1.0 / options.rate)
            yield task.deferLater(reactor, options.warmup, lambda: None)
            cloud_before = len(cloud.requests)
            coordinator_before = len(coordinator.requests)
            renewed_before = renewals["count"]
            cpu_before, builds_before = sample()
            started = time.monotonic()
            measuring[0] = True
            yield task.deferLater(reactor, options.seconds, lambda: None)
            measuring[0] = False
            cpu_after, builds_after = sample()
            window = time.monotonic() - started
            cloud_requests = cloud.requests[cloud_before:]
            coordinator_requests = len(coordinator.requests) - coordinator_before
            renewed = renewals["count"] - renewed_before
            open_watches = cloud.open_watches
            loop.stop()
            if renewing is not None:
                renewing.stop()
            yield task.deferLater(reactor, 1.0, lambda: None)
            yield pool.closeCachedConnections()
        finally:
            child.stdin.close()
            child.wait(10)
            yield cloud.stop()
            yield coordinator.stop()
        per_ttl = len(cloud_requests) / (window / POOL_VIEW_TTL)
        get_leases = sum(1 for _method, path, _query in cloud_requests if "/leases/" in path)
        latencies.sort()
        figures.update({
            "window_seconds": window, "cloud_requests": len(cloud_requests),
            "cloud_requests_per_ttl": per_ttl, "cloud_lease_gets": get_leases,
            "cloud_watches_open": open_watches, "ttl": POOL_VIEW_TTL,
            "renewals": renewed, "coordinator_requests": coordinator_requests,
            "agent_cpu_seconds": cpu_after - cpu_before,
            "agent_cpu_share": (cpu_after - cpu_before) / window,
            "builds": builds_after - builds_before,
            "sent": counts["sent"], "ok": counts["ok"], "failed": counts["failed"],
            "rate": counts["sent"] / window,
            "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        })

    def finished(result):
        if reactor.running:
            reactor.stop()
        return result

    def failed(failure):
        failure.printTraceback()
        figures["error"] = str(failure.value)

    reactor.callWhenRunning(lambda: run().addErrback(failed).addBoth(finished))
    reactor.run()
    if "error" in figures:
        sys.exit(1)
    f = figures
    print(json.dumps(f, indent=2))
    rows = [
        row(f"cloud requests per POOL_VIEW_TTL ({f['ttl']:g} s), {options.members} members, "
            f"{f['rate']:.0f} req/s to /pool{' (no gzip asked)' if options.plain else ''}",
            f"{f['cloud_requests_per_ttl']:.2f} ({f['cloud_requests']} in {f['window_seconds']:.1f} s; "
            f"{f['cloud_lease_gets']} lease GETs; {f['cloud_watches_open']} watches open; "
            f"{f['renewals']} lease renewals in each server meanwhile)",
            "<= 1, no GET per member",
            f["cloud_requests_per_ttl"] <= 1 + 1e-9 and f["cloud_lease_gets"] == 0),
        row("agent CPU (process CPU time of the serving child)"
            + (", no gzip asked" if options.plain else ", gzip asked as browsers do"),
            f"{100 * f['agent_cpu_share']:.1f}% of one core", "< 10% of one core",
            f["agent_cpu_share"] < 0.10),
        row("/pool answers sent / 200 / failed; latency p50 / p99; documents built",
            f"{f['sent']} / {f['ok']} / {f['failed']}; {f['p50_ms']:.1f} / {f['p99_ms']:.1f} ms; "
            f"{f['builds']}"),
    ]
    for r in rows:
        print(f"| poolpage | {r['measure']} | {r['result']} | {r['target'] or ''} | "
              f"{'' if r['met'] is None else ('yes' if r['met'] else 'no')} |")
    write_result(options.json, "poolpage", vars(options), figures, rows)


if __name__ == "__main__":
    main()
