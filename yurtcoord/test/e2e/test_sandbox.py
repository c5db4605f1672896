"""``twistd -n yurtcoord --sandbox`` as a real subprocess: a whole pool comes up with
one leader and every agent ready, its role changes are printed, its pool pages answer,
the pool etcd holds what the agents uploaded and synced, cutting the leader's cloud
link (SIGUSR1) hands leadership over and starts heartbeat delegation, stopping a
node's stand-in kubelet from the control page makes its node lease go stale in the
cloud and starting it brings the lease back, and a stop
(SIGINT as from Ctrl-C, or SIGTERM) exits 0 leaving no etcd and no temp dir behind,
also when etcd cannot start, dies, or is still starting; a SIGKILLed sandbox takes its
etcd with it.

The pool etcd is a cluster of three members that every agent is given in its storage
list: killing the raft leader from the control page leaves every agent ready and the
pool etcd whole, and a restarted member comes back healthy with what it missed;
``--sandbox-etcd-members 1`` runs one member.

The coordinator apiservers are two servers over the pool etcd, both in every agent's
``[coordinator] server``: ``kubectl`` against either lists exactly the
endpointslices the pool leader mirrored from the cloud and every agent's uploaded
pods; killing one from the control page leaves every agent ready and the election
lease with its holder, and a restarted one is healthy to every agent again.

The pool runs with identities, as a production pool does: etcd and the coordinator
apiservers serve TLS for the sandbox's CA, and the tests read them with the
certificates the sandbox printed (its admin's kubeconfig, etcdctl's flags). The
coordinator apiservers' request logs show each agent writing its own node lease as
its node and no node lease written by anyone else, and one node's certificate is
refused (403) a write of another node's lease."""

import json
import os
import re
import shlex
import shutil
import signal

import treq.client
import yaml
from twisted.internet import defer, reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial import unittest
from twisted.web.client import Agent as HTTPAgent, HTTPConnectionPool

from yurtcoord.agent.config import parse_duration
from yurtcoord.etcd.client import EtcdConfig
from yurtcoord.kube.lease import renew_time
from yurtcoord.names import ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE
from yurtcoord.sim.agentini import SANDBOX
from yurtcoord.sim.apiserver.requestlog import WRITE_METHODS, read_request_log
from yurtcoord.sim.pki import CertPair
from yurtcoord.sim.sandbox import (
    CACHED_PODS, HEARTBEAT_INTERVAL, KUBELET_GRACE_PERIOD, SEEDED_SERVICES,
)
from yurtcoord.sim.sandboxpki import ClientTLS
from yurtcoord.testing.twistd import TWISTD, TwistdProcess, child_environment, port_is_free
from yurtcoord.testing.chromium import LEADER_FIELD, PNG_MAGIC, run_chromium
from yurtcoord.testing.poll import poll_until
from yurtcoord.testing.agentpages import StatusReader, wait_for_statuses

READY_DEADLINE = 60.0
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
# The sandbox agents' election lease duration: a coordinator apiserver's loss is
# watched for longer than that, so that the pool leader must have renewed the lease
# through the other one.
LEASE_DURATION = parse_duration(SANDBOX["leader_election"]["lease_duration"])
# After the etcd raft leader is killed, every agent is ready on a live member within
# etcd's election (generous on a busy machine) and one request that timed out and its
# retry.
ETCD_ELECTION_ALLOWANCE = 5.0
ETCD_FAILOVER_DEADLINE = ETCD_ELECTION_ALLOWANCE + 2 * EtcdConfig("http://127.0.0.1:2379").timeout
OUTPUT_DEADLINE = 30.0
STOP_DEADLINE = 60.0
TEMP_DIR_LINE = re.compile(r"^\[sandbox\] temp dir (\S+)$", re.M)
ETCD_CLUSTER_LINE = re.compile(r"^\[sandbox\] etcd cluster of (\d+) members? ", re.M)
ETCD_LINE = re.compile(
    r"^\[sandbox\] etcd (member-\d+) pid (\d+) on (https://127\.0\.0\.1:\d+)$", re.M)
PAGE_LINE = re.compile(r"^\[sandbox\] (edge-\d+) pool page (http://127\.0\.0\.1:(\d+))/$", re.M)
ROLE_LINE = re.compile(
    r"^\[sandbox\] \d\d:\d\d:\d\d (edge-\d+): role (\w+) -> (\w+) \(leader: ([^)]*)\)$", re.M)
CLOUD_LINE = re.compile(r"^\[sandbox\] cloud apiserver (http://127\.0\.0\.1:\d+),", re.M)
COORDINATORS_LINE = re.compile(
    r"^\[sandbox\] cloud apiserver \S+, coordinator apiservers ((?:https://127\.0\.0\.1:\d+"
    r"(?:, )?)+) \(their objects: the pool etcd's, under /registry\)$", re.M)
CONTROL_LINE = re.compile(
    r"^\[sandbox\] control page (http://127\.0\.0\.1:\d+)/ stops and starts each agent's "
    r"stand-in kubelet \(kubelet grace period (\S+), heartbeat interval (\S+)\)", re.M)
CERTIFICATES_LINE = re.compile(
    r"^\[sandbox\] certificates in (\S+): .*; kubectl as admin \(system:masters\): "
    r"--kubeconfig (\S+); etcdctl: (--cacert \S+ --cert \S+ --key \S+)$", re.M)
REQUEST_LOGS_LINE = re.compile(
    r"^\[sandbox\] coordinator apiservers' request logs \([^)]*\): (\S.*)$", re.M)
COMMANDS_LINE = "[sandbox] commands to try, each line pastes as it is:\n"
COMMAND_LINE = re.compile(r"^    (\S.*)$", re.M)
ALL_READY_LINE = re.compile(
    r"^\[sandbox\] \d\d:\d\d:\d\d pool \S+: all (\d+) agents ready after ([\d.]+)s, "
    r"leader (\S+)$", re.M)


def tls_reader(ca_file, cert_file, key_file):
    """A reader of servers of the sandbox's CA (``ca_file``), presenting the client
    pair ``cert_file``/``key_file``, over a pool that keeps no idle connection."""
    policy = ClientTLS(ca_file, CertPair(cert_file, key_file)).policy("sandbox test client")
    agent = HTTPAgent(reactor, contextFactory=policy,
                      pool=HTTPConnectionPool(reactor, persistent=False), connectTimeout=2)
    return StatusReader(http=treq.client.HTTPClient(agent))


def processes_mentioning(text):
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry))
    return found


class SandboxRun:
    """One ``twistd yurtcoord --sandbox`` child with a private TMPDIR."""

    def __init__(self, test, *arguments, environment=None):
        self.test = test
        self.tmpdir = os.path.abspath(test.mktemp())
        os.makedirs(self.tmpdir)
        env = child_environment()
        env["TMPDIR"] = self.tmpdir
        env.update(environment or {})
        self.child = TwistdProcess()
        self._admin_reader = None
        self.started_at = reactor.seconds()
        reactor.spawnProcess(
            self.child, TWISTD,
            [TWISTD, "--nodaemon", "--pidfile=", "yurtcoord", "--sandbox", *arguments],
            env=env, path=self.tmpdir)
        test.addCleanup(self.kill_leftovers)

    @property
    def output(self):
        return self.child.output.decode("utf-8", "replace")

    def temp_dir(self):
        match = TEMP_DIR_LINE.search(self.output)
        return match.group(1) if match else None

    def etcd_members(self):
        """``[(name, pid, client URL)]`` of the pool etcd's members as started, once
        every member's line is printed; [] before."""
        size = ETCD_CLUSTER_LINE.search(self.output)
        members = [(name, int(pid), url) for name, pid, url in ETCD_LINE.findall(self.output)]
        if size is None or len(members) < int(size.group(1)):
            return []
        return members[:int(size.group(1))]

    def etcd_urls(self):
        return [url for _name, _pid, url in self.etcd_members()]

    def pages(self):
        return {node: url for node, url, _port in PAGE_LINE.findall(self.output)}

    def _certificates(self):
        match = CERTIFICATES_LINE.search(self.output)
        if match is None:
            raise AssertionError(f"no certificates line printed:\n{self.output[-3000:]}")
        return match

    def admin_kubeconfig(self):
        """The kubeconfig printed for kubectl as the sandbox's admin."""
        return self._certificates().group(2)

    def etcdctl_tls(self):
        """etcdctl's TLS flags printed: the sandbox's CA and the members' client pair."""
        return self._certificates().group(3).split()

    def admin_reader(self):
        """A reader of the coordinator apiservers as the sandbox's admin, with the CA
        and pair its printed kubeconfig names."""
        if self._admin_reader is None:
            with open(self.admin_kubeconfig()) as handle:
                config = yaml.safe_load(handle)
            cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
            self._admin_reader = tls_reader(cluster["certificate-authority"],
                                            user["client-certificate"], user["client-key"])
        return self._admin_reader

    def etcd_reader(self):
        """A reader of the pool etcd's members with the printed etcdctl TLS files."""
        _cacert, ca_file, _cert, cert_file, _key, key_file = self.etcdctl_tls()
        return tls_reader(ca_file, cert_file, key_file)

    def node_reader(self, node):
        """A reader of the coordinator apiservers as ``node``, with its own certificate
        (the one its agent's configuration names)."""
        pem = os.path.join(self.temp_dir(), node, "kubelet-client-current.pem")
        with open(self.admin_kubeconfig()) as handle:
            ca_file = yaml.safe_load(handle)["clusters"][0]["cluster"]["certificate-authority"]
        return tls_reader(ca_file, pem, pem)

    def request_logs(self):
        """The coordinator apiservers' request log files, as printed."""
        match = REQUEST_LOGS_LINE.search(self.output)
        if match is None:
            raise AssertionError(f"no request logs line printed:\n{self.output[-3000:]}")
        return match.group(1).split(", ")

    def role_lines(self):
        return ROLE_LINE.findall(self.output)

    def kill_leftovers(self):
        """Whatever a failed test left running dies here (the child, then its etcd)."""
        waits = []
        if not self.child.ended.called:
            self.child.transport.signalProcess("KILL")
            waits.append(self.child.ended)
        temp_dir = self.temp_dir()
        if temp_dir:
            for pid in processes_mentioning(temp_dir):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    continue
        return defer.gatherResults(waits) if waits else None


class SandboxTests(unittest.TestCase):
    timeout = 180

    def setUp(self):
        self.reader = StatusReader()

    @defer.inlineCallbacks
    def wait_for_pages(self, run, count):
        yield poll_until(lambda: len(run.pages()) == count or run.child.ended.called,
                         READY_DEADLINE, 0.05, reactor,
                         what=f"{count} pool page URLs printed")
        self.assertEqual(len(run.pages()), count, run.output)
        return run.pages()

    @defer.inlineCallbacks
    def wait_for_one_leader_all_ready(self, run, pages):
        def one_leader_all_ready(statuses):
            leaders = [n for n, s in statuses.items() if s["role"] == "leader"]
            return (len(leaders) == 1
                    and all(s["ready"] for s in statuses.values())
                    and {s["leader"] for s in statuses.values()} == set(leaders)
                    and all(s["role"] == "follower" for n, s in statuses.items()
                            if n not in leaders))

        statuses = yield wait_for_statuses(
            lambda: self.reader.statuses(pages),
            "one leader, every other agent follower, all ready", one_leader_all_ready,
            READY_DEADLINE, reactor, 0.1, details=lambda: run.output[-3000:])
        return next(n for n, s in statuses.items() if s["role"] == "leader"), statuses

    @defer.inlineCallbacks
    def check_role_lines(self, run, leader, nodes):
        """Every agent printed its way from init to its current role; the leader's
        last line names itself."""

        def settled():
            last = {}
            for node, _old, new, _leader in run.role_lines():
                last[node] = new
            expected = {n: ("leader" if n == leader else "follower") for n in nodes}
            return last == expected

        yield poll_until(settled, OUTPUT_DEADLINE, 0.05, reactor,
                         what="role-change lines ending in the pool's current roles")
        lines = run.role_lines()
        for node in nodes:
            mine = [(old, new, named) for n, old, new, named in lines if n == node]
            self.assertEqual(mine[0][0], "init", mine)
            for (_, new, _), (old, _, _) in zip(mine, mine[1:]):
                self.assertEqual(new, old, f"role lines of {node} do not chain: {mine}")
        leader_lines = [(n, named) for n, _old, new, named in lines if new == "leader"]
        self.assertEqual(leader_lines[-1], (leader, leader))
        # Every agent turning leader names itself, though its leader source has not
        # read the lease it just took yet.
        self.assertEqual([named for _n, named in leader_lines],
                         [n for n, _named in leader_lines], lines)

    @defer.inlineCallbacks
    def check_pool_etcd(self, run, nodes, member_url=None, more_keys=()):
        """Read the pool etcd with etcdctl from one member (``member_url``, by default
        the first): every agent's cached node and pods were uploaded, and the leader
        synced the cloud's endpoints and endpointslices (and ``more_keys``)."""
        etcdctl = shutil.which("etcdctl")
        if etcdctl is None:
            return
        expected = set(more_keys)
        for node in nodes:
            expected.add(f"/registry/minions/{node}")
            expected.update(f"/registry/pods/default/{node}-{pod}" for pod in CACHED_PODS)
        for service in SEEDED_SERVICES:
            expected.add(f"/registry/services/endpoints/default/{service}")
            expected.add(f"/registry/endpointslices/default/{service}-sandbox")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        env["ETCDCTL_API"] = "3"
        etcd_url = member_url or run.etcd_urls()[0]
        seen = {}

        @defer.inlineCallbacks
        def all_there():
            out, err, code = yield getProcessOutputAndValue(
                etcdctl, ["--endpoints", etcd_url, *run.etcdctl_tls(), "--command-timeout",
                          "5s", "get", "/registry/", "--prefix", "--keys-only"], env=env)
            seen["keys"] = {line for line in out.decode().splitlines() if line}
            return code == 0 and expected <= seen["keys"]

        yield poll_until(all_there, OUTPUT_DEADLINE, 0.1, reactor,
                         what=f"the pool etcd member {etcd_url} holding {sorted(expected)}")

    @defer.inlineCallbacks
    def check_node_identities(self, run, nodes):
        """The identities are in force on the coordinator apiservers: their request
        logs show each agent writing its own node lease as its node
        (``system:node:<node>``) and no node lease written by anyone else; one node's
        certificate cannot write another node's lease (403, logged under its user)."""
        logs = run.request_logs()
        self.assertEqual(len(logs), 2, run.output)
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        seen = {}

        def node_lease_writes():
            return [record for path in logs if os.path.exists(path)
                    for record in read_request_log(path)
                    if record.method in WRITE_METHODS and record.path.startswith(leases)]

        def by_its_node(record):
            # A refused or failed write names no lease but in its path (a create's
            # path names none: its writer must still be a node).
            name = record.name or record.path[len(leases):].strip("/")
            return (record.user == f"system:node:{name}" if name
                    else record.user.startswith("system:node:"))

        def each_node_wrote_its_own():
            seen["writes"] = node_lease_writes()
            return {r.name for r in seen["writes"] if r.succeeded} >= set(nodes)

        yield poll_until(each_node_wrote_its_own, OUTPUT_DEADLINE, 0.2, reactor,
                         what="a write of each node's own lease in the request logs")
        self.assertEqual([(r.describe(), r.user) for r in seen["writes"]
                          if not by_its_node(r)], [])

        # edge-1's certificate cannot renew edge-2's lease.
        server = COORDINATORS_LINE.search(run.output).group(1).split(", ")[0]
        response = yield run.node_reader(nodes[0]).http.put(
            f"{server}{leases}/{nodes[1]}",
            json={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                  "metadata": {"name": nodes[1], "namespace": "kube-node-lease"},
                  "spec": {"holderIdentity": nodes[1]}})
        body = yield response.content()
        self.assertEqual(response.code, 403, body)
        self.assertEqual(json.loads(body)["reason"], "Forbidden")

        def refusal_logged():
            return any(record.code == 403 and record.user == f"system:node:{nodes[0]}"
                       and record.path == f"{leases}/{nodes[1]}" and record.method == "PUT"
                       for path in logs for record in read_request_log(path))

        yield poll_until(refusal_logged, OUTPUT_DEADLINE, 0.1, reactor,
                         what=f"the refusal of {nodes[0]}'s write of {nodes[1]}'s lease logged")

    @defer.inlineCallbacks
    def etcd_state(self, run):
        """The control page's ``GET /etcd``: the members and each agent's storage."""
        code, body = yield self.reader.get(self.control_url(run), "etcd")
        self.assertEqual(code, 200, body)
        return json.loads(body)

    def control_url(self, run):
        match = CONTROL_LINE.search(run.output)
        self.assertIsNotNone(match, run.output)
        return match.group(1)

    @defer.inlineCallbacks
    def stop_and_check_clean(self, run, signal_name, pages):
        """Stop the sandbox with ``signal_name``: it exits 0, every etcd member running
        then is stopped in order, no process, port or directory is left."""
        temp_dir = run.temp_dir()
        self.assertTrue(temp_dir and os.path.isdir(temp_dir), run.output)
        self.assertTrue(temp_dir.startswith(run.tmpdir + os.sep), temp_dir)
        self.assertTrue(run.etcd_members(), run.output)
        running = {member["name"]: member["pid"]
                   for member in (yield self.etcd_state(run))["members"] if member["running"]}
        for pid in running.values():
            self.assertIn(pid, processes_mentioning(temp_dir))
        etcd_pids = set(running.values()) | {pid for _name, pid, _url in run.etcd_members()}
        stop_at = reactor.seconds()
        run.child.transport.signalProcess(signal_name)
        yield poll_until(lambda: run.child.ended.called, STOP_DEADLINE, 0.05, reactor,
                         what=f"the sandbox to exit after SIG{signal_name}")
        stop_took = reactor.seconds() - stop_at
        self.assertEqual(run.child.exit_code, 0, run.output[-3000:])
        self.assertEqual(processes_mentioning(temp_dir), [], "processes left behind")
        for pid in etcd_pids:
            self.assertFalse(os.path.exists(f"/proc/{pid}") and
                             temp_dir in open(f"/proc/{pid}/cmdline", "rb").read().decode(
                                 "utf-8", "replace"), f"etcd pid {pid} still running")
        self.assertFalse(os.path.exists(temp_dir), "temp dir left behind")
        self.assertEqual(os.listdir(run.tmpdir), [])
        for url in pages.values():
            port = int(url.rsplit(":", 1)[1])
            self.assertTrue(port_is_free(port), f"status port {port} still bound")
        for name, pid in running.items():
            # Stopped in order (SIGTERM, waited for), not merely killed with the sandbox.
            self.assertIn(f"etcd member {name} pid={pid} stopped", run.output)
        self.assertIn(f"[sandbox] stopped; removed {temp_dir}", run.output)
        self.assertNotIn("Traceback", run.output)
        return stop_took

    @defer.inlineCallbacks
    def test_three_agent_pool_leads_fails_over_delegates_and_stops_on_sigint(self):
        run = SandboxRun(self)
        pages = yield self.wait_for_pages(run, 3)
        self.assertEqual(sorted(pages), ["edge-1", "edge-2", "edge-3"])
        leader, statuses = yield self.wait_for_one_leader_all_ready(run, pages)
        ready_after = reactor.seconds() - run.started_at
        yield self.check_role_lines(run, leader, sorted(pages))
        for status in statuses.values():
            self.assertTrue(status["pool_cache_synced"])
            self.assertTrue(status["local_cache_uploaded"])
            self.assertEqual(list(status["cloud"].values()), [True])
        yield self.check_pool_etcd(run, sorted(pages))
        yield self.check_node_identities(run, sorted(pages))
        yield poll_until(lambda: ALL_READY_LINE.search(run.output), OUTPUT_DEADLINE, 0.05,
                         reactor, what="the 'all agents ready' line")
        count, printed_took, printed_leader = ALL_READY_LINE.search(run.output).groups()
        self.assertEqual((int(count), printed_leader), (3, leader))

        code, body = yield self.reader.get(pages[leader], "")
        self.assertEqual(code, 200)
        self.assertIn(f'data-field="leader" data-kind="text">{leader}<'.encode(), body)
        yield self.check_printed_commands(run, pages, leader)

        failover_took = yield self.cut_and_restore_the_leaders_cloud(run, pages, leader)
        stop_took = yield self.stop_and_check_clean(run, "INT", pages)
        print(f"sandbox: start to one leader and all ready {ready_after:.1f}s "
              f"(printed {printed_took}s after start of the service), leader's cloud cut "
              f"to new leader delegating {failover_took:.1f}s, stop after SIGINT "
              f"{stop_took:.1f}s")

    @defer.inlineCallbacks
    def test_three_etcd_members_serve_on_when_the_raft_leader_is_killed_and_it_restarts(self):
        run = SandboxRun(self)
        pages = yield self.wait_for_pages(run, 3)
        pool_leader, _ = yield self.wait_for_one_leader_all_ready(run, pages)
        self.assertEqual(ETCD_CLUSTER_LINE.search(run.output).group(1), "3", run.output)
        urls = run.etcd_urls()
        self.assertEqual(len(set(urls)), 3, run.output)

        # Every agent is given every member, starting with a member of its own.
        state = yield self.etcd_state(run)
        self.assertEqual(sorted(state["agents"]), sorted(pages))
        for node, agent in state["agents"].items():
            self.assertEqual(sorted(agent["storage"]), sorted(urls), node)
        self.assertEqual(len({agent["storage"][0] for agent in state["agents"].values()}), 3)
        for node, url in pages.items():
            status = yield self.reader.status(url)
            self.assertIn(status["etcd_member"], urls)
            self.assertIn(node, state["members"][urls.index(status["etcd_member"])]["agents"])
        yield self.check_pool_etcd(run, sorted(pages))

        raft_leader = yield self.raft_leader(run, urls)
        control = self.control_url(run)
        killed_at = reactor.seconds()
        code, body = yield self.post(f"{control}/etcd/leader/kill")
        self.assertEqual(code, 303, body)
        match = re.match(rb"etcd (member-(\d+)) \(pid (\d+), the raft leader\) killed", body)
        self.assertIsNotNone(match, body)
        name, index, pid = match.group(1).decode(), int(match.group(2)), int(match.group(3))
        self.assertEqual(urls[index], raft_leader, "the member killed was not the raft leader")
        self.assertFalse(os.path.exists(f"/proc/{pid}"), "the killed member still runs")
        live = [url for url in urls if url != raft_leader]

        # The pool leader mirrors a cloud change made after the kill.
        cloud = CLOUD_LINE.search(run.output).group(1)
        response = yield self.reader.http.post(
            f"{cloud}/api/v1/namespaces/default/endpoints",
            json={"apiVersion": "v1", "kind": "Endpoints",
                  "metadata": {"name": "after-kill", "namespace": "default"},
                  "subsets": [{"addresses": [{"ip": "10.244.9.9"}],
                               "ports": [{"port": 8080}]}]})
        self.assertEqual(response.code, 201, (yield response.content()))

        # Every agent stays or is ready again with the same pool leader, and each uses
        # a live member once it asked etcd (its /pool counts the pool cache's keys).
        seen = {}

        @defer.inlineCallbacks
        def every_agent_ready_on_a_live_member():
            statuses, pools = {}, {}
            for node, url in pages.items():
                code, body = yield self.reader.get(url, "pool")
                pools[node] = (code, json.loads(body) if code == 200 else body)
                statuses[node] = yield self.reader.status(url)
            seen.update(statuses=statuses, pools=pools)
            return all(status["ready"] and status["leader"] == pool_leader
                       and status["etcd_member"] in live
                       and pools[node][0] == 200 and not pools[node][1]["errors"]
                       for node, status in statuses.items())

        try:
            yield poll_until(every_agent_ready_on_a_live_member, ETCD_FAILOVER_DEADLINE, 0.2,
                             reactor, what="every agent ready on a live etcd member")
        except AssertionError as error:
            raise AssertionError(f"{error}; last statuses {seen.get('statuses')}, pool "
                                 f"documents {seen.get('pools')}\n{run.output[-3000:]}") from None
        ready_again = reactor.seconds() - killed_at
        after_kill = run.output.split(f"etcd {name} (pid {pid}, the raft leader) killed")[1]
        went_unready = re.findall(r"(edge-\d+): not ready", after_kill)
        yield self.check_pool_etcd(
            run, sorted(pages), member_url=live[0],
            more_keys=["/registry/services/endpoints/default/after-kill"])
        mirrored = reactor.seconds() - killed_at
        self.assertNotIn(f"etcd {name} pid {pid} exited unexpectedly", run.output)

        # Restarted, the member is healthy and has caught up with the writes it missed.
        code, body = yield self.post(f"{control}/etcd/{index}/restart")
        self.assertEqual(code, 303, body)
        match = re.match(rb"etcd member-\d+ restarted \(pid (\d+)\) and healthy", body)
        self.assertIsNotNone(match, body)
        code, body = yield run.etcd_reader().get(raft_leader, "health")
        self.assertEqual((code, json.loads(body)["health"]), (200, "true"))
        yield self.check_pool_etcd(
            run, sorted(pages), member_url=raft_leader,
            more_keys=["/registry/services/endpoints/default/after-kill"])
        member = (yield self.etcd_state(run))["members"][index]
        self.assertEqual((member["running"], member["pid"]), (True, int(match.group(1))))

        stop_took = yield self.stop_and_check_clean(run, "TERM", pages)
        print(f"sandbox, 3 etcd members: raft leader {name} killed, every agent ready on a "
              f"live member {ready_again:.1f}s later (agents that went not ready meanwhile: "
              f"{sorted(set(went_unready)) or 'none'}), a cloud change made after the kill "
              f"mirrored into etcd {mirrored:.1f}s after it; stop after SIGTERM "
              f"{stop_took:.1f}s")

    @defer.inlineCallbacks
    def kubectl_items(self, run, server, resource):
        """``kubectl --server <server> get <resource> -A -o json`` as the sandbox's
        admin (the kubeconfig it printed): its items."""
        home = os.path.abspath(self.mktemp())
        os.makedirs(home)
        out, err, code = yield getProcessOutputAndValue(
            KUBECTL, ["--kubeconfig", run.admin_kubeconfig(), "--server", server,
                      "--cache-dir", os.path.join(home, "cache"),
                      "--request-timeout", "20s", "get", resource, "-A", "-o", "json"],
            env={"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        self.assertEqual(code, 0, err)
        return json.loads(out)["items"]

    @defer.inlineCallbacks
    def cloud_items(self, run, path):
        """The items of a LIST of the sandbox's cloud apiserver."""
        code, body = yield self.reader.get(CLOUD_LINE.search(run.output).group(1), path)
        self.assertEqual(code, 200, body)
        return json.loads(body)["items"]

    @defer.inlineCallbacks
    def check_kubectl_serves_the_pool(self, run, server, nodes):
        """``kubectl`` against the coordinator apiserver ``server`` lists exactly the
        cloud's endpointslices (what the pool leader mirrored; only the resourceVersion,
        etcd's revision there, differs) and exactly every agent's uploaded pods, whose
        mirror rv keys in etcd hold the resourceVersions of the agents' caches."""

        def comparable(item):
            item = dict(item, metadata=dict(item["metadata"]))
            for field in ("kind", "apiVersion"):
                item.pop(field, None)
            del item["metadata"]["resourceVersion"]
            return (item["metadata"]["namespace"], item["metadata"]["name"]), item

        cloud = dict(map(comparable, (yield self.cloud_items(
            run, "apis/discovery.k8s.io/v1/endpointslices"))))
        self.assertEqual(len(cloud), len(SEEDED_SERVICES))
        served = {}

        @defer.inlineCallbacks
        def mirrored():
            served.update(slices=dict(map(comparable, (yield self.kubectl_items(
                run, server, "endpointslices")))))
            return served["slices"] == cloud

        try:
            yield poll_until(mirrored, OUTPUT_DEADLINE, 0.2, reactor,
                             what=f"kubectl at {server} listing the cloud's endpointslices")
        except AssertionError as error:
            self.assertEqual(served.get("slices"), cloud, str(error))
        for item in (yield self.kubectl_items(run, server, "endpointslices")):
            self.assertEqual(item["kind"], "EndpointSlice")

        pods = yield self.kubectl_items(run, server, "pods")
        expected = {(f"{node}-{pod}", node) for node in nodes for pod in CACHED_PODS}
        self.assertEqual({(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods},
                         expected)
        self.assertEqual({p["metadata"]["namespace"] for p in pods}, {"default"})
        # seed_local_cache numbers node i's pods 100 * i + 1, + 2, ...
        cached_rvs = {f"{node}-{pod}": 100 * index + offset
                      for index, node in enumerate(nodes, start=1)
                      for offset, pod in enumerate(CACHED_PODS, start=1)}
        etcdctl = shutil.which("etcdctl")
        if etcdctl is None:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        env["ETCDCTL_API"] = "3"
        out, err, code = yield getProcessOutputAndValue(
            etcdctl, ["--endpoints", ",".join(run.etcd_urls()), *run.etcdctl_tls(),
                      "--command-timeout", "5s", "get", "/mirror/rv/registry/pods/default/",
                      "--prefix"], env=env)
        self.assertEqual(code, 0, err)
        lines = out.decode().splitlines()
        rvs = {key.rsplit("/", 1)[1]: int(value) for key, value in zip(lines[::2], lines[1::2])}
        self.assertEqual(rvs, cached_rvs)

    @defer.inlineCallbacks
    def coordinator_state(self, run):
        """The control page's ``GET /coordinator``."""
        code, body = yield self.reader.get(self.control_url(run), "coordinator")
        self.assertEqual(code, 200, body)
        return json.loads(body)

    @defer.inlineCallbacks
    def election_lease(self, run, server):
        """The pool's election lease, read through the coordinator apiserver ``server``
        as the sandbox's admin."""
        code, body = yield run.admin_reader().get(
            server, f"apis/coordination.k8s.io/v1/namespaces/{ELECTION_LEASE_NAMESPACE}/"
                    f"leases/{ELECTION_LEASE_NAME}")
        self.assertEqual(code, 200, body)
        return json.loads(body)["spec"]

    @defer.inlineCallbacks
    def test_two_coordinator_apiservers_serve_the_pool_etcd_and_survive_a_kill(self):
        run = SandboxRun(self)
        pages = yield self.wait_for_pages(run, 3)
        pool_leader, statuses = yield self.wait_for_one_leader_all_ready(run, pages)
        servers = COORDINATORS_LINE.search(run.output).group(1).split(", ")
        self.assertEqual(len(set(servers)), 2, run.output)
        # Every agent is given both, starting with one of its own (agent i with i mod 2).
        for index, node in enumerate(sorted(pages)):
            listed = list(statuses[node]["coordinator_servers"])
            self.assertEqual(sorted(listed), sorted(servers), node)
            self.assertEqual(listed[0], servers[index % 2], node)
        state = yield self.coordinator_state(run)
        self.assertEqual([(s["url"], s["running"]) for s in state["apiservers"]],
                         [(url, True) for url in servers])
        self.assertEqual(state["election_lease"]["holder"], pool_leader)
        for server in servers:
            yield self.check_kubectl_serves_the_pool(run, server, sorted(pages))

        # Kill the server the pool leader writes the election lease through first.
        killed = list(statuses[pool_leader]["coordinator_servers"])[0]
        other = next(url for url in servers if url != killed)
        index = servers.index(killed)
        before = yield self.election_lease(run, other)
        self.assertEqual(before["holderIdentity"], pool_leader)
        control = self.control_url(run)
        code, body = yield self.post(f"{control}/coordinator/{len(servers)}/kill")
        self.assertEqual(code, 404, body)
        killed_at = reactor.seconds()
        code, body = yield self.post(f"{control}/coordinator/{index}/kill")
        self.assertEqual(code, 303, body)
        self.assertTrue(body.startswith(
            f"coordinator apiserver {index} ({killed}) killed".encode()), body)
        self.assertTrue(port_is_free(int(killed.rsplit(":", 1)[1])), "the port still listens")
        code, body = yield self.post(f"{control}/coordinator/{index}/kill")
        self.assertEqual((code, body), (303, f"coordinator apiserver {index} ({killed}) is "
                                             f"not running\n".encode()))

        # Every sample of every agent, until the loss has lasted longer than a lease:
        # ready, the same leader, the lease never changing hands.
        wrong = []
        # When every agent first counted the killed server down.
        seen_down = []

        @defer.inlineCallbacks
        def all_ready_on_the_other():
            documents = yield self.reader.statuses(pages)
            lease = yield self.election_lease(run, other)
            for node, document in documents.items():
                if not document["ready"] or document["leader"] != pool_leader:
                    wrong.append((node, document["role"], document["ready"],
                                  document["leader"]))
            if (lease["holderIdentity"], lease.get("leaseTransitions", 0),
                    lease["acquireTime"]) != (pool_leader, before.get("leaseTransitions", 0),
                                              before["acquireTime"]):
                wrong.append(("lease", lease))
            moved = all(d["coordinator_servers"] == {killed: False, other: True}
                        for d in documents.values())
            if moved and not seen_down:
                seen_down.append(reactor.seconds() - killed_at)
            return moved and reactor.seconds() - killed_at > LEASE_DURATION + 1.0

        yield poll_until(all_ready_on_the_other, READY_DEADLINE, 0.2, reactor,
                         what="every agent ready, counting only the other apiserver healthy")
        self.assertEqual(wrong, [], run.output[-3000:])
        after = yield self.election_lease(run, other)
        self.assertGreater(renew_time({"spec": after}), renew_time({"spec": before}))
        state = yield self.coordinator_state(run)
        self.assertEqual([(s["url"], s["running"], s["healthy_to"]) for s in state["apiservers"]],
                         [(url, url == other, sorted(pages) if url == other else [])
                          for url in servers])
        self.assertEqual(state["election_lease"]["holder"], pool_leader)
        code, page = yield self.reader.get(control, "")
        self.assertEqual(code, 200)
        self.assertIn(f"/coordinator/{index}/restart".encode(), page)
        yield self.check_kubectl_serves_the_pool(run, other, sorted(pages))

        code, body = yield self.post(f"{control}/coordinator/{index}/restart")
        self.assertEqual(code, 303, body)
        self.assertTrue(body.startswith(
            f"coordinator apiserver {index} ({killed}) restarted".encode()), body)
        restarted_at = reactor.seconds()

        def both_healthy_again(documents):
            return all(d["ready"] and d["leader"] == pool_leader
                       and d["coordinator_servers"] == dict.fromkeys(servers, True)
                       for d in documents.values())

        yield wait_for_statuses(
            lambda: self.reader.statuses(pages), "every agent counting both healthy again",
            both_healthy_again, READY_DEADLINE, reactor, 0.2, details=lambda: run.output[-3000:])
        back_took = reactor.seconds() - restarted_at
        self.assertEqual((yield self.election_lease(run, killed))["holderIdentity"], pool_leader)
        yield self.check_kubectl_serves_the_pool(run, killed, sorted(pages))
        yield self.stop_and_check_clean(run, "TERM", pages)
        for server in servers:
            self.assertTrue(port_is_free(int(server.rsplit(":", 1)[1])), server)
        print(f"sandbox, 2 coordinator apiservers: {killed} (the pool leader {pool_leader}'s "
              f"first) killed, every agent counting it down {seen_down[0]:.1f}s later and "
              f"staying ready with the lease holder unchanged; restarted, healthy to every "
              f"agent {back_took:.1f}s later")

    @defer.inlineCallbacks
    def raft_leader(self, run, urls):
        """The client URL of the member that is the raft leader, as etcdctl reads it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        env["ETCDCTL_API"] = "3"
        out, err, code = yield getProcessOutputAndValue(
            shutil.which("etcdctl") or "etcdctl",
            ["--endpoints", ",".join(urls), *run.etcdctl_tls(), "--command-timeout", "5s",
             "endpoint", "status", "-w", "json"], env=env)
        self.assertEqual(code, 0, err)
        leaders = [entry["Endpoint"] for entry in json.loads(out)
                   if entry["Status"]["header"]["member_id"] == entry["Status"].get("leader")]
        self.assertEqual(len(leaders), 1, out)
        return leaders[0]

    @defer.inlineCallbacks
    def cut_and_restore_the_leaders_cloud(self, run, pages, leader):
        """SIGUSR1: the leader loses the cloud, another agent leads and forwards its
        heartbeat; SIGUSR2: the cloud comes back. Returns the failover time."""
        before = yield self.reader.status(pages[leader])
        cut_at = reactor.seconds()
        run.child.transport.signalProcess(signal.SIGUSR1)

        def new_leader_delegating(statuses):
            leaders = [n for n, s in statuses.items() if s["role"] == "leader"]
            return (statuses[leader]["role"] == "follower"
                    and list(statuses[leader]["cloud"].values()) == [False]
                    and len(leaders) == 1 and leaders[0] != leader
                    and statuses[leaders[0]]["delegated_heartbeats"]
                    > before["delegated_heartbeats"])

        statuses = yield wait_for_statuses(
            lambda: self.reader.statuses(pages),
            f"a new leader delegating the heartbeat of {leader}", new_leader_delegating,
            READY_DEADLINE, reactor, 0.1, details=lambda: run.output[-3000:])
        failover_took = reactor.seconds() - cut_at
        new_leader = next(n for n, s in statuses.items() if s["role"] == "leader")
        self.assertIn(f"cloud link of {leader} cut", run.output)
        yield poll_until(
            lambda: re.search(rf"{new_leader}: delegating heartbeats of nodes without the "
                              r"cloud", run.output.split(f"cloud link of {leader} cut")[1]),
            OUTPUT_DEADLINE, 0.05, reactor, what=f"{new_leader}'s delegation line")
        # The control page shows the cut, the new pool leader and the raft leader.
        seen = []

        @defer.inlineCallbacks
        def raft_leader_told():
            code, body = yield self.reader.get(self.control_url(run), "page.json")
            self.assertEqual(code, 200, body)
            seen[:] = [json.loads(body)["state"]]
            return seen[0]["etcd"]["raft_leader"] is not None

        yield poll_until(raft_leader_told, OUTPUT_DEADLINE, 0.2, reactor,
                         what="the control page naming the raft leader")
        state = seen[0]
        self.assertEqual([link["node"] for link in state["cut_links"]], [leader])
        self.assertEqual(state["nodes"][leader]["cloud_link"], "cut")
        self.assertEqual([n for n, s in state["nodes"].items() if s["role"] == "leader"],
                         [new_leader])
        self.assertIn(state["etcd"]["raft_leader"], run.etcd_urls())
        yield self.pages_in_chromium_during_the_cut(run, pages, leader, new_leader)

        run.child.transport.signalProcess(signal.SIGUSR2)

        @defer.inlineCallbacks
        def cloud_back():
            status = yield self.reader.status(pages[leader])
            return list(status["cloud"].values()) == [True] and status["leader"] == new_leader

        yield poll_until(cloud_back, READY_DEADLINE, 0.1, reactor,
                         what=f"{leader} with the cloud again, following {new_leader}")
        self.assertIn(f"cloud links restored: {leader}", run.output)
        return failover_took

    @defer.inlineCallbacks
    def pages_in_chromium_during_the_cut(self, run, pages, leader, new_leader):
        """What an operator sees during the cut, in headless Chromium after the pages'
        scripts ran: a screenshot of the control page and of the cut agent's pool
        page, and their DOM: the control page marks the cut link and the new pool
        leader; the cut agent's pool page names the new leader."""
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        for name, url in (("control", self.control_url(run) + "/"),
                          ("pool", pages[leader] + "/")):
            shot = os.path.join(directory, f"{name}-page.png")
            code, _out, err = yield run_chromium(
                self, reactor, f"--screenshot={shot}", "--window-size=1200,900",
                "--virtual-time-budget=3000", url)
            self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
            with open(shot, "rb") as handle:
                png = handle.read()
            self.assertTrue(png.startswith(PNG_MAGIC), (name, png[:16]))
            self.assertEqual((int.from_bytes(png[16:20], "big"),
                              int.from_bytes(png[20:24], "big")), (1200, 900), name)
        code, dom, err = yield run_chromium(self, reactor, "--virtual-time-budget=3000",
                                            "--dump-dom", self.control_url(run) + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        dom = dom.decode("utf-8")
        self.assertRegex(dom, rf'data-node="{leader}"[^>]*data-link="cut"')
        self.assertRegex(dom, rf'data-node="{new_leader}" data-role="leader"')
        code, dom, err = yield run_chromium(self, reactor, "--virtual-time-budget=3000",
                                            "--dump-dom", pages[leader] + "/")
        self.assertEqual(code, 0, err.decode("utf-8", "replace")[-2000:])
        self.assertEqual(LEADER_FIELD.findall(dom.decode("utf-8")), [new_leader])

    @defer.inlineCallbacks
    def check_printed_commands(self, run, pages, leader):
        """The commands printed at start run as pasted, from the sandbox's working
        directory with an empty HOME: ``yurtcoordctl`` reads each agent, ``kubectl``
        lists the election lease on a coordinator apiserver (as the sandbox's admin)
        and the nodes in the cloud, ``etcdctl`` the election lease's key in the pool
        etcd."""
        self.assertIn(COMMANDS_LINE, run.output)
        printed = COMMAND_LINE.findall(run.output.split(COMMANDS_LINE, 1)[1])
        home = os.path.abspath(self.mktemp())
        os.makedirs(home)
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        expected = {**{f"--server {url} status": leader for url in pages.values()},
                    "members": "edge-3", "get leases -A": ELECTION_LEASE_NAME,
                    "get nodes": "edge-3"}
        if shutil.which("etcdctl") is not None:
            expected["get /registry/leases/ --prefix --keys-only"] = (
                f"/registry/leases/{ELECTION_LEASE_NAMESPACE}/{ELECTION_LEASE_NAME}")
        for command in printed:
            words = shlex.split(command)
            if words[0] == "kubectl":
                words[0] = KUBECTL
            out, err, code = yield getProcessOutputAndValue(
                words[0], words[1:], env=env, path=run.tmpdir)
            self.assertEqual(code, 0, (command, out, err))
            wanted = next(text for end, text in expected.items() if command.endswith(end))
            self.assertIn(wanted.encode(), out, command)
        self.assertEqual(len(printed), len(expected), printed)

    @defer.inlineCallbacks
    def test_two_agent_pool_kubelet_control_and_stop_on_sigterm(self):
        run = SandboxRun(self, "--sandbox-agents", "2")
        pages = yield self.wait_for_pages(run, 2)
        leader, _ = yield self.wait_for_one_leader_all_ready(run, pages)
        yield self.check_role_lines(run, leader, sorted(pages))
        follower = next(node for node in pages if node != leader)
        yield self.stop_and_start_a_kubelet(run, pages, follower)
        yield self.stop_and_check_clean(run, "TERM", pages)

    @defer.inlineCallbacks
    def cloud_renew_time(self, run, node):
        cloud = CLOUD_LINE.search(run.output).group(1)
        code, body = yield self.reader.get(
            cloud, f"apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
        self.assertEqual(code, 200, body)
        return renew_time(json.loads(body))

    @defer.inlineCallbacks
    def post(self, url):
        response = yield self.reader.http.post(url, allow_redirects=False)
        body = yield response.content()
        return response.code, body

    @defer.inlineCallbacks
    def stop_and_start_a_kubelet(self, run, pages, node):
        """The control page stops ``node``'s kubelet: the sandbox says so, the agent
        counts it dead after the printed grace period and the node's cloud lease stops
        being renewed; started again, the lease is renewed again."""
        match = CONTROL_LINE.search(run.output)
        self.assertIsNotNone(match, run.output)
        control, grace_text, interval_text = match.groups()
        self.assertEqual((grace_text, interval_text), (KUBELET_GRACE_PERIOD, HEARTBEAT_INTERVAL))
        grace, interval = parse_duration(grace_text), parse_duration(interval_text)
        code, body = yield self.reader.get(control, "")
        self.assertEqual(code, 200)
        self.assertIn(f"/kubelet/{node}/stop".encode(), body)
        code, body = yield self.post(f"{control}/kubelet/nobody/stop")
        self.assertEqual(code, 404)

        code, body = yield self.post(f"{control}/kubelet/{node}/stop")
        self.assertEqual((code, body), (303, f"{node}: kubelet stopped\n".encode()))
        stopped_at = reactor.seconds()
        # The sandbox's output reaches this process a moment after its answer.
        yield poll_until(
            lambda: f"{node}: kubelet stopped; after the {grace_text} grace period" in run.output,
            OUTPUT_DEADLINE, 0.05, reactor, what=f"the sandbox saying {node}'s kubelet stopped")
        yield poll_until(lambda: f"{node}: its agent counts the kubelet dead" in run.output,
                         grace + interval + READY_DEADLINE, 0.1, reactor,
                         what=f"the sandbox saying {node}'s agent counts its kubelet dead")
        dead_seen_at = reactor.seconds()
        # Safety, not timing: the grace period is not cut short, and no renewal starts
        # once the agent counts the kubelet dead (the second allows for the
        # resolution of renewTime and for a renewal that was already on its way). The
        # grace counts from the kubelet's last healthy answer, which the agent asked
        # for up to one interval before the stop.
        self.assertGreaterEqual(dead_seen_at - stopped_at, grace - interval - 0.5)
        stale = yield self.cloud_renew_time(run, node)
        self.assertLessEqual(stale, dead_seen_at + 1.0)
        # Stays put: no renewal for several intervals.
        hold_until = reactor.seconds() + 2 * interval + 1.0
        yield poll_until(lambda: reactor.seconds() >= hold_until, 30, 0.1, reactor,
                         what="the hold period")
        self.assertEqual((yield self.cloud_renew_time(run, node)), stale)
        code, body = yield self.reader.get(control, "state")
        state = json.loads(body)[node]
        self.assertEqual((state["kubelet_running"], state["agent_sees_kubelet_alive"]),
                         (False, False))
        self.assertGreaterEqual(state["cloud_lease_age_seconds"], 2 * interval)
        status = yield self.reader.status(pages[node])
        self.assertEqual(status["role"], "pending")

        code, body = yield self.post(f"{control}/kubelet/{node}/start")
        self.assertEqual(code, 303)
        yield poll_until(lambda: f"{node}: cloud lease kube-node-lease/{node} renewed again"
                         in run.output, READY_DEADLINE, 0.1, reactor,
                         what=f"the sandbox saying {node}'s cloud lease is renewed again")
        self.assertGreater((yield self.cloud_renew_time(run, node)), stale)
        self.assertIn(f"{node}: its agent sees the kubelet answer again", run.output)

    @defer.inlineCallbacks
    def test_one_etcd_member_by_flag_killed_under_the_sandbox_is_reported(self):
        # The flag for a small machine: one etcd, which every agent is given alone.
        run = SandboxRun(self, "--sandbox-agents", "2", "--sandbox-etcd-members", "1")
        pages = yield self.wait_for_pages(run, 2)
        yield self.wait_for_one_leader_all_ready(run, pages)
        self.assertEqual(ETCD_CLUSTER_LINE.search(run.output).group(1), "1", run.output)
        [(name, pid, url)] = run.etcd_members()
        state = yield self.etcd_state(run)
        self.assertEqual(state["agents"], {node: {"storage": [url], "etcd_member": url}
                                           for node in pages})
        self.assertEqual(state["members"][0]["agents"], sorted(pages))
        for node in pages:
            self.assertEqual((yield self.reader.status(pages[node]))["etcd_member"], url)
        yield self.check_pool_etcd(run, sorted(pages))

        os.kill(pid, 9)
        yield poll_until(lambda: f"etcd {name} pid {pid} exited unexpectedly" in run.output,
                         OUTPUT_DEADLINE, 0.05, reactor, what="the etcd exit reported")
        stop_took = yield self.stop_and_check_clean(run, "TERM", pages)
        print(f"sandbox without its etcd stopped {stop_took:.1f}s after SIGTERM")

    @defer.inlineCallbacks
    def test_every_etcd_member_dies_with_a_killed_sandbox(self):
        run = SandboxRun(self, "--sandbox-agents", "1")
        yield poll_until(lambda: run.etcd_members() or run.child.ended.called,
                         READY_DEADLINE, 0.05, reactor, what="the etcd lines")
        etcd_pids, temp_dir = [pid for _n, pid, _u in run.etcd_members()], run.temp_dir()
        self.assertEqual(len(etcd_pids), 3, run.output)
        for pid in etcd_pids:
            self.assertIn(pid, processes_mentioning(temp_dir))
        run.child.transport.signalProcess("KILL")
        yield run.child.ended
        # Nobody is left to stop etcd or remove the temp dir: the kernel kills etcd.
        yield poll_until(lambda: not set(etcd_pids) & set(processes_mentioning(temp_dir)),
                         STOP_DEADLINE, 0.05, reactor, what="etcd to die with the sandbox")
        shutil.rmtree(temp_dir)

    @defer.inlineCallbacks
    def test_etcd_that_cannot_start_is_one_line_and_leaves_nothing(self):
        fake_etcd = os.path.abspath(self.mktemp())
        with open(fake_etcd, "w") as handle:
            handle.write("#!/bin/sh\necho 'etcd: cannot bind the client port' >&2\nexit 3\n")
        os.chmod(fake_etcd, 0o755)
        run = SandboxRun(self, environment={"ETCD_BIN": fake_etcd})
        yield poll_until(lambda: run.child.ended.called, STOP_DEADLINE, 0.05, reactor,
                         what="the sandbox to give up")
        self.assertEqual(run.child.exit_code, 69, run.output)
        failures = [line for line in run.output.splitlines()
                    if line.startswith("[sandbox] cannot start:")]
        self.assertEqual(len(failures), 1, run.output)
        self.assertIn("exited while starting", failures[0])
        self.assertIn("cannot bind the client port", failures[0])
        self.assertNotIn("Traceback", run.output)
        self.assertEqual(os.listdir(run.tmpdir), [], "temp dir left behind")
        self.assertEqual(processes_mentioning(run.tmpdir), [])
        self.assertEqual(run.pages(), {})


    @defer.inlineCallbacks
    def interrupt_and_check_nothing_left(self, run, condition, what):
        """SIGINT once ``condition()`` holds; the sandbox must exit 0 without a
        traceback, leaving no process and no temp dir behind."""
        yield poll_until(lambda: condition() or run.child.ended.called, READY_DEADLINE,
                         0.02, reactor, what=what)
        self.assertFalse(run.child.ended.called, run.output)
        temp_dir = run.temp_dir()
        run.child.transport.signalProcess("INT")
        yield poll_until(lambda: run.child.ended.called, STOP_DEADLINE, 0.05, reactor,
                         what=f"the sandbox to exit after SIGINT ({what})")
        self.assertEqual(run.child.exit_code, 0, run.output)
        if temp_dir is not None:
            self.assertEqual(processes_mentioning(temp_dir), [], "processes left behind")
        self.assertEqual(processes_mentioning(run.tmpdir), [], "processes left behind")
        self.assertEqual(os.listdir(run.tmpdir), [], "temp dir left behind")
        self.assertNotIn("cannot start", run.output)
        self.assertNotIn("Traceback", run.output)
        self.assertNotIn("KeyboardInterrupt", run.output)

    @defer.inlineCallbacks
    def test_stop_while_etcd_is_starting_leaves_nothing(self):
        # An "etcd" that never answers: the sandbox is still waiting for it when
        # it is told to stop.
        hanging_etcd = os.path.abspath(self.mktemp())
        with open(hanging_etcd, "w") as handle:
            handle.write("#!/bin/sh\nexec python3 -c 'import time; time.sleep(300)' \"$@\"\n")
        os.chmod(hanging_etcd, 0o755)
        run = SandboxRun(self, environment={"ETCD_BIN": hanging_etcd})
        yield self.interrupt_and_check_nothing_left(
            run, lambda: run.temp_dir() and processes_mentioning(run.temp_dir()),
            "the hanging etcd started")

    @defer.inlineCallbacks
    def test_sigint_at_each_step_of_the_start_is_a_clean_stop(self):
        # The first line is printed by the start itself, which twistd runs before the
        # reactor: the signal lands before the reactor has installed its handlers.
        steps = {
            "the first line": lambda run: run.temp_dir(),
            "etcd healthy, apiservers starting": lambda run: run.etcd_members(),
            "agents starting": lambda run: run.pages(),
        }
        for step, condition in steps.items():
            with self.subTest(step=step):
                run = SandboxRun(self, "--sandbox-agents", "2")
                yield self.interrupt_and_check_nothing_left(
                    run, lambda run=run, condition=condition: condition(run), step)
