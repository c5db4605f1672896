"""What the pool sync benchmarks (poolsync.py, poolscale.py) are built from.

Both start a real etcd and the cloud (the Kubernetes API test server in a child
process), seed the cloud with endpointslices over HTTP, read etcd with an independent
``etcdctl watch`` in a child process, and build a ``PoolSyncManager`` with its
``PoolStore`` as a leader agent builds them. ``PoolBench`` holds those parts of one run
and stops them again in reverse order, whatever the measurement did; each benchmark
keeps only its own measurement, report and result rows.
"""

import base64
import json
import os
import platform
import subprocess
import sys
import time

from twisted.internet import defer, protocol

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

NAMESPACES = ("default", "kube-system", "team-a")
SEED_CONCURRENCY = 32
MIRROR_PREFIX = "/mirror/rv"
SLICES_KEY_PREFIX = "/registry/endpointslices/"


def endpoint_slice(i):
    namespace = NAMESPACES[i % len(NAMESPACES)]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i:05d}-abcde", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": f"svc-{i:05d}",
                                    "endpointslice.kubernetes.io/managed-by":
                                        "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [f"10.{i // 250 % 250}.{i % 250}.1"],
                           "conditions": {"ready": True},
                           "nodeName": f"edge-{i % 20}"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}


def slice_key(namespace, name):
    return f"{SLICES_KEY_PREFIX}{namespace}/{name}"


def percentile(values, fraction):
    """Nearest-rank percentile of sorted ``values``."""
    if not values:
        return float("nan")
    rank = max(1, min(len(values), round(fraction * len(values) + 0.5)))
    return values[rank - 1]


def headline(title, etcd_version):
    """The first line of a report: what ran, when, on what, under which load."""
    return (f"{title}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{platform.machine()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}, etcd {etcd_version}")


def print_report(lines, figures):
    """Print a report's ``lines``, then all its ``figures`` on one ``RESULT`` line."""
    print("\n".join(["", *lines, "RESULT " + json.dumps(figures, sort_keys=True)]),
          flush=True)


def react(run, parser, argv):
    """``run(reactor, options)`` with ``argv`` parsed by ``parser`` plus ``--json PATH``."""
    from twisted.internet import task

    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    task.react(run, (parser.parse_args(argv),))


def child_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["ETCDCTL_API"] = "3"
    return env


class CloudProcess:
    """The API test server as a child process; ``url`` once it listens.

    It runs without automatic full garbage collections: seeded with 100,000
    endpointslices, each of its full collections stops it (and the watch it streams
    the changes on) for 1-2 s on this machine, which a real API server does not do;
    the pool sync then sees a quiet second in the middle of a storm."""

    def __init__(self, history):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yurtcoord.sim.apiserver", "--port", "0",
             "--history", str(history), "--no-full-collections"],
            stdout=subprocess.PIPE, env=child_env(), cwd=REPO)
        self.url = self.process.stdout.readline().decode("utf-8").strip()
        if not self.url.startswith("http"):
            self.stop()
            raise SystemExit(f"the cloud test server did not start: {self.url!r}")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


class EtcdctlWatch(protocol.ProcessProtocol):
    """Reads ``etcdctl watch -w json`` (one JSON response per line) into ``on_event``:
    ``on_event(key, value, deleted, now)``, ``now`` being when the line was read."""

    def __init__(self, on_event):
        self.on_event = on_event
        self.buffer = b""
        self.ended = defer.Deferred()
        self.stderr = b""

    def outReceived(self, data):
        now = time.perf_counter()
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            response = json.loads(line)
            for event in response.get("Events") or []:
                kv = event.get("kv") or {}
                key = base64.b64decode(kv.get("key", "")).decode("utf-8")
                value = base64.b64decode(kv.get("value", "") or "")
                self.on_event(key, value, event.get("type") == "DELETE", now)

    def errReceived(self, data):
        self.stderr += data

    def processEnded(self, reason):
        self.ended.callback(None)


class PoolBench:
    """The parts of one pool sync benchmark run; ``cleanups`` stop them, first first.

    etcd and the cloud start with the object; the rest in ``connect``,
    ``start_watcher`` and ``pool_sync``, each adding how to stop it in front.
    """

    def __init__(self, reactor, binary, history, members=1):
        from yurtcoord.sim.etcd import EtcdCluster, EtcdProcess

        self.reactor = reactor
        if members == 1:
            self.cluster = self.etcd = EtcdProcess(binary).start()
            self.etcd_urls = [self.etcd.client_url]
        else:
            # etcdctl (the independent reader) talks to the first member; the pool
            # store's client is given every member, as ``[coordinator] storage`` is.
            self.cluster = EtcdCluster(binary, size=members).start()
            self.etcd = self.cluster.members[0]
            self.etcd_urls = self.cluster.client_urls
        try:
            self.cloud = CloudProcess(history=history)
        except BaseException:
            self.cluster.stop()
            raise
        self.cleanups = [self.cloud.stop, self.cluster.stop]
        # The local key cache lives in etcd's temp dir, which ``etcd.stop()`` removes.
        self.work_dir = os.path.join(self.etcd.base_dir, "key-cache")

    @defer.inlineCallbacks
    def run(self, main):
        """Run ``main()`` (a Deferred-returning callable), then every cleanup."""
        try:
            yield main()
        finally:
            for cleanup in self.cleanups:
                try:
                    yield defer.maybeDeferred(cleanup)
                except Exception as error:
                    print(f"cleanup {cleanup!r} failed: {error}", file=sys.stderr)

    def require(self, condition, timeout, interval, what):
        """Fires once ``condition()`` holds; fails naming ``what`` after ``timeout`` s."""
        from yurtcoord.testing.poll import poll_until

        return poll_until(condition, timeout, interval, self.reactor, what)

    @defer.inlineCallbacks
    def connect(self, cloud_timeout):
        """The coordinator test server and the clients of the cloud, it and etcd."""
        from yurtcoord.etcd.client import EtcdClient, EtcdConfig
        from yurtcoord.kube.client import ClientConfig, KubeClient
        from yurtcoord.sim.apiserver import KubeAPIServer

        reactor = self.reactor
        self.coordinator = KubeAPIServer(reactor)
        coordinator_url = yield self.coordinator.start()
        self.cleanups.insert(0, self.coordinator.stop)
        self.cloud_client = KubeClient(reactor, ClientConfig(
            server=self.cloud.url, insecure=True, timeout=cloud_timeout))
        self.pool_client = KubeClient(reactor, ClientConfig(server=coordinator_url,
                                                            insecure=True))
        self.etcd_client = EtcdClient(reactor, EtcdConfig(
            self.etcd_urls[0], more_urls=tuple(self.etcd_urls[1:]), timeout=30.0))
        self.cleanups[:0] = [self.cloud_client.close, self.pool_client.close,
                             self.etcd_client.close]

    @defer.inlineCallbacks
    def seed(self, objects):
        """Create ``objects`` endpointslices in the cloud; fires with them as created."""
        from yurtcoord.kube import gvr as gvrs

        began = time.perf_counter()
        semaphore = defer.DeferredSemaphore(SEED_CONCURRENCY)
        created = yield defer.gatherResults(
            [semaphore.run(self.cloud_client.create, gvrs.ENDPOINTSLICES_V1,
                           endpoint_slice(i))
             for i in range(objects)], consumeErrors=True)
        print(f"seeded {objects} endpointslices in the cloud in "
              f"{time.perf_counter() - began:.1f}s", flush=True)
        return created

    @defer.inlineCallbacks
    def start_watcher(self, prefix, sentinel_key, on_event):
        """``etcdctl watch --prefix prefix`` into ``on_event``, once it is established.

        The watch is established once it reports a write of ``sentinel_key`` made after
        it started; that key's events do not reach ``on_event``."""
        from yurtcoord.testing.poll import PollTimeout

        sentinel = {"seen": False}

        def dispatch(key, value, deleted, now):
            if key == sentinel_key:
                sentinel["seen"] = True
                return
            on_event(key, value, deleted, now)

        watcher = EtcdctlWatch(dispatch)
        command = self.etcd.etcdctl_command("watch", "--prefix", prefix, "-w", "json")
        self.reactor.spawnProcess(watcher, command[0], command, env=child_env())

        def stop_watcher():
            if watcher.transport.pid is not None:
                watcher.transport.signalProcess("KILL")
            return watcher.ended

        self.cleanups.insert(0, stop_watcher)
        for attempt in range(200):
            self.etcd.put(sentinel_key, str(attempt))
            try:
                yield self.require(lambda: sentinel["seen"], 0.1, 0.01, "the sentinel")
            except PollTimeout:
                continue
            return
        raise SystemExit("etcdctl watch never reported the sentinel write")

    @defer.inlineCallbacks
    def pool_sync(self):
        """A started ``PoolStore`` on etcd and a ``PoolSyncManager`` (not yet started)
        on the cloud, as a leader agent builds them; fires with ``(store, manager)``."""
        from yurtcoord.agent.metrics import Metrics
        from yurtcoord.pool.scope import HealthyCloudClient, PoolScopeResources
        from yurtcoord.pool.keycache import ComponentKeyCache
        from yurtcoord.pool.store import PoolStore
        from yurtcoord.pool.sync import PoolSyncManager

        reactor = self.reactor
        os.makedirs(self.work_dir, exist_ok=True)
        store = PoolStore(reactor, self.etcd_client, "/registry",
                          ComponentKeyCache.in_directory(self.work_dir).load())
        yield defer.maybeDeferred(store.start)
        self.cleanups.insert(0, store.close)
        cloud_url = self.cloud.url
        healthy = HealthyCloudClient(lambda: cloud_url, {cloud_url: self.cloud_client}.get)
        scope = PoolScopeResources(reactor, healthy)
        manager = PoolSyncManager(reactor, "edge-1", self.pool_client, healthy, scope,
                                  informer_lease_renew=10.0, metrics=Metrics("edge-1"))
        self.cleanups.insert(0, manager.stop)
        return store, manager
