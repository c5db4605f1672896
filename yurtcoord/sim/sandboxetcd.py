"""The sandbox's pool etcd: a cluster of members on loopback, and the controls that
kill and restart one member, the raft leader included.

The cluster is an ``EtcdCluster`` (``yurtcoord.sim.etcd``) started and stopped from
the reactor: each member in its own session, bound to die with the sandbox, its data
and log in a directory of its own under the sandbox's temp dir. Given the sandbox's CA
(``yurtcoord.sim.sandboxpki``), every member serves https and requires a client
certificate of that CA, as a pool etcd does; the sandbox's own requests (the control
page's raft status, ``etcdctl``) present the members' client pair
(``client_tls``). Every agent is given
every member's URL in ``[coordinator] storage``, starting with a different member
each (agent ``i`` with member ``i`` modulo the size), so that the agents spread over
the members and losing one member moves only the agents that used it.

The controls answer on the sandbox's control page (``POST /etcd/<index>/kill``,
``POST /etcd/<index>/restart``, ``POST /etcd/leader/kill``): a kill is a SIGKILL, as a
crashed machine would be; a restart starts the member again on its data dir and ports
and answers once it is healthy, which needs a majority of the members running. A
member that exits by itself is reported as exiting unexpectedly; one killed through a
control is not. ``GET /etcd`` on the same page lists the members (URL, pid, running)
and, per agent, its storage list and the member its pool store uses now (the agent's
``/status`` ``etcd_member``).
"""

import html
import io
import json
import shutil
from typing import Any, Callable, Generator, Mapping, Sequence

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import client
from twisted.web.http_headers import Headers
from twisted.web.server import NOT_DONE_YET, Request

from yurtcoord.sim.etcd import (
    EtcdCluster, EtcdFixtureError, EtcdProcess, EtcdStartError, etcd_binary_at,
)
from yurtcoord.sim.pki import TestCA
from yurtcoord.sim.sandboxpki import ClientTLS
from yurtcoord.tx.tlsreload import ReloadingTLSPolicy
from yurtcoord.tx.twisted_private import QuietHTTPConnectionPool

# Members of the pool etcd cluster by default: one may be lost with the pool still
# served. ``--sandbox-etcd-members 1`` runs one, for a small machine.
DEFAULT_MEMBERS = 3
# Seconds a member may take to answer /health, and to exit after SIGTERM (then SIGKILL).
ETCD_START_TIMEOUT = 30.0
ETCD_STOP_TIMEOUT = 10.0
# Seconds the "kill the raft leader" control waits for a member to name the leader.
LEADER_TIMEOUT = 10.0
# Seconds the control page waits for a member to tell its raft status (it asks every
# second).
RAFT_STATUS_TIMEOUT = 1.0

_log = Logger()

# An agent's etcd as the sandbox reads it: its ``[coordinator] storage`` list and the
# member its pool store uses now (None while no member serves).
AgentEtcd = tuple[Sequence[str], str | None]


def rotated(urls: Sequence[str], index: int) -> list[str]:
    """``urls`` starting at ``index`` (modulo their number), the others following in
    order: agent ``index``'s storage list."""
    start = index % len(urls)
    return [*urls[start:], *urls[:start]]


class SandboxEtcd:
    """The pool etcd of one sandbox.

    :param reactor: the running reactor; every member is spawned from its thread.
    :param binary: the path of the etcd to run (etcdctl beside it or on PATH).
    :param size: members of the cluster.
    :param directory: where each member keeps its directory (``member-0``, ...).
    :param say: prints one line for the person watching.
    :param say_event: prints one line of something that happened now (with the time).
    :param agents: ``{node: (storage, member in use)}`` of the sandbox's agents now.
    :param tls_ca: the CA whose certificates the members serve with and require of
        their clients (None: plain http).
    """

    log = Logger()

    def __init__(self, reactor: Any, binary: str, size: int, directory: str,
                 say: Callable[[str], None], say_event: Callable[[str], None],
                 agents: Callable[[], Mapping[str, AgentEtcd]] = dict,
                 tls_ca: TestCA | None = None) -> None:
        self.reactor = reactor
        self.binary = binary
        self.cluster = EtcdCluster(etcd_binary_at(binary), size=size, base_dir=directory,
                                   tls_ca=tls_ca)
        self._tls_ca = tls_ca
        self._say = say
        self._say_event = say_event
        self._agents = agents
        # Pids killed through a control: their exit is no surprise.
        self._killed: set[int] = set()
        # Indexes of members with a kill or restart under way.
        self._busy: set[int] = set()
        self._stopping = False
        # The control page's status requests, without a factory line for each.
        self._status_pool = QuietHTTPConnectionPool(reactor, persistent=False)
        self._status_tls: ReloadingTLSPolicy | None = None

    @property
    def members(self) -> list[EtcdProcess]:
        return self.cluster.members

    @property
    def client_urls(self) -> list[str]:
        return self.cluster.client_urls

    @property
    def client_tls(self) -> ClientTLS | None:
        """The CA and the client pair every member accepts, once the members are made
        (None without TLS, or before)."""
        pair = self.cluster.client_cert
        if self._tls_ca is None or pair is None:
            return None
        return ClientTLS(self._tls_ca.ca_file, pair)

    def etcdctl_command(self) -> list[str] | None:
        """``etcdctl`` against every member, with the members' client pair under TLS,
        up to its command (``get``, ...); None when no etcdctl is found beside etcd or
        on PATH."""
        etcdctl = shutil.which(self.cluster.binary.etcdctl)
        if etcdctl is None:
            return None
        tls = self.client_tls
        return [etcdctl, "--endpoints", ",".join(self.client_urls),
                *(tls.etcdctl_flags() if tls is not None else [])]

    def storage_for(self, index: int) -> list[str]:
        """The ``[coordinator] storage`` of agent ``index``: every member, its first
        one chosen by ``rotated``."""
        return rotated(self.client_urls, index)

    # -- start and stop ------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self, abandoned: Callable[[], bool]) -> Generator["defer.Deferred[Any]", Any, None]:
        """Start every member and wait until each is healthy; fails with
        ``EtcdFixtureError`` (``EtcdStartError`` with the log tail of the member that
        failed) as ``EtcdCluster.start_from_reactor`` does."""
        yield self.cluster.start_from_reactor(self.reactor, ETCD_START_TIMEOUT, abandoned)
        self._say(f"etcd cluster of {len(self.members)} member"
                  f"{'s' if len(self.members) != 1 else ''} ({self.binary})")
        for member in self.members:
            self.log.info("etcd member {name} started pid={pid} url={url}",
                          name=member.name, pid=member.pid, url=member.client_url)
            self._say(f"etcd {member.name} pid {member.pid} on {member.client_url}")
            self._watch(member)

    @defer.inlineCallbacks
    def stop(self) -> Generator["defer.Deferred[Any]", Any, None]:
        """SIGTERM every member and wait for it (SIGKILL after ``ETCD_STOP_TIMEOUT``),
        one after the other, then remove their data."""
        self._stopping = True
        running = [(member.name, member.pid) for member in self.members
                   if member.is_running()]
        yield self.cluster.stop_from_reactor(self.reactor, ETCD_STOP_TIMEOUT)
        for name, pid in running:
            self.log.info("etcd member {name} pid={pid} stopped", name=name, pid=pid)

    def _watch(self, member: EtcdProcess) -> None:
        pid = member.pid
        member.when_exited(self.reactor).addCallback(
            lambda status: self._exited(member, pid, status))

    def _exited(self, member: EtcdProcess, pid: int | None, status: int | None) -> None:
        """A member exited: say so unless a control killed it or the sandbox stops it."""
        if self._stopping or pid in self._killed:
            return
        tail = " | ".join(member.log_tail(5).splitlines())
        self.log.error("etcd member {name} pid={pid} exited unexpectedly status={status}: "
                       "{tail}", name=member.name, pid=pid, status=status, tail=tail)
        index = self.members.index(member)
        last_lines = " | ".join(member.log_tail(2).splitlines())
        self._say_event(f"etcd {member.name} pid {pid} exited unexpectedly ({last_lines}); "
                        f"POST /etcd/{index}/restart on the control page starts it again")

    # -- the controls --------------------------------------------------------------------

    def _users(self, member: EtcdProcess) -> list[str]:
        return sorted(node for node, (_storage, current) in self._agents().items()
                      if current == member.client_url)

    @defer.inlineCallbacks
    def kill(self, index: int, what: str = "") -> Generator["defer.Deferred[Any]", Any, str]:
        """SIGKILL member ``index`` (its data stays for a restart); fires with the line
        said. ``what`` qualifies the member in that line (", the raft leader")."""
        member = self.members[index]
        if self._stopping:
            return self._said(f"etcd {member.name}: the sandbox is stopping")
        if index in self._busy:
            return self._said(f"etcd {member.name}: a kill or restart is already under way")
        if not member.is_running():
            return self._said(f"etcd {member.name} is not running")
        pid = member.pid
        if pid is not None:
            self._killed.add(pid)
        users = self._users(member)
        self._busy.add(index)
        try:
            yield member.kill_from_reactor(self.reactor)
        finally:
            self._busy.discard(index)
        self.log.info("etcd member {name} pid={pid} killed through the control page",
                      name=member.name, pid=pid)
        running = len(self.cluster.running())
        quorum = len(self.members) // 2 + 1
        served = ("the others elect a leader if needed and serve on" if running >= quorum
                  else f"{running} of {len(self.members)} running: no majority, the pool "
                       f"etcd serves nothing until a member is restarted")
        return self._said(
            f"etcd {member.name} (pid {pid}{what}) killed; agents that used it: "
            f"{', '.join(users) or 'none'}; {served}")

    @defer.inlineCallbacks
    def kill_leader(self) -> Generator["defer.Deferred[Any]", Any, str]:
        """SIGKILL the member that is the raft leader now, as the members report it."""
        try:
            leader = yield self.cluster.leader_from_reactor(self.reactor, LEADER_TIMEOUT)
        except EtcdFixtureError as error:
            return self._said(f"etcd: no leader to kill ({error})")
        index = self.members.index(leader)
        line = yield self.kill(index, ", the raft leader")
        return line

    @defer.inlineCallbacks
    def restart(self, index: int) -> Generator["defer.Deferred[Any]", Any, str]:
        """Start member ``index`` again on its data dir and ports; fires with the line
        said once it is healthy (or failed to be)."""
        member = self.members[index]
        if self._stopping:
            return self._said(f"etcd {member.name}: the sandbox is stopping")
        if index in self._busy:
            return self._said(f"etcd {member.name}: a kill or restart is already under way")
        if member.is_running():
            return self._said(f"etcd {member.name} is already running (pid {member.pid})")
        self._busy.add(index)
        self._say_event(f"etcd {member.name} restarting on {member.client_url}")
        try:
            yield member.restart_from_reactor(self.reactor, ETCD_START_TIMEOUT)
        except EtcdStartError as error:
            return self._said(f"etcd {member.name} did not come back: {error.reason}: "
                              + " | ".join(error.log_tail.splitlines()[-3:]))
        finally:
            self._busy.discard(index)
        self.log.info("etcd member {name} restarted pid={pid}", name=member.name,
                      pid=member.pid)
        self._watch(member)
        return self._said(f"etcd {member.name} restarted (pid {member.pid}) and healthy")

    def _said(self, line: str) -> str:
        self._say_event(line)
        return line

    # -- what the control page shows -----------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The document of ``GET /etcd``: the members, and each agent's storage list and
        the member it uses now."""
        agents = self._agents()
        return {
            "members": [
                {"index": index, "name": member.name, "url": member.client_url,
                 "pid": member.pid if member.is_running() else None,
                 "running": member.is_running(),
                 "agents": sorted(node for node, (_s, current) in agents.items()
                                  if current == member.client_url)}
                for index, member in enumerate(self.members)],
            "agents": {node: {"storage": list(storage), "etcd_member": current}
                       for node, (storage, current) in sorted(agents.items())},
        }

    def raft_leader(self) -> "defer.Deferred[str | None]":
        """The client URL of the member that is the raft leader now, as the running
        members tell it (``/v3/maintenance/status``, each within
        ``RAFT_STATUS_TIMEOUT``): the control page marks it. None while no member
        names itself leader (an election under way, or none answered). Asked over
        HTTP (with the members' client pair, ``client_tls``), not with etcdctl as
        ``kill_leader`` does, because the page asks every second."""
        tls = self.client_tls
        options = {} if tls is None else {"contextFactory": self._status_policy(tls)}
        agent = client.Agent(self.reactor, pool=self._status_pool,
                             connectTimeout=RAFT_STATUS_TIMEOUT, **options)
        asks = [self._member_status(agent, member.client_url)
                for member in self.members if member.is_running()]
        gathered: "defer.Deferred[list[tuple[str, Any]]]" = defer.gatherResults(asks)
        return gathered.addCallback(lambda answers: raft_leader_of(
            {url: answer for url, answer in answers if isinstance(answer, dict)}))

    def _status_policy(self, tls: ClientTLS) -> ReloadingTLSPolicy:
        """The TLS of the status requests, made once: the page asks every second."""
        if self._status_tls is None:
            self._status_tls = tls.policy("sandbox etcd status")
        return self._status_tls

    def _member_status(self, agent: client.Agent,
                       url: str) -> "defer.Deferred[tuple[str, Any]]":
        """``(url, the member's status answer)``; None as the answer when it gave none
        in time or an unreadable one."""
        d: "defer.Deferred[Any]" = agent.request(
            b"POST", f"{url}/v3/maintenance/status".encode("ascii"),
            Headers({b"content-type": [b"application/json"]}),
            client.FileBodyProducer(io.BytesIO(b"{}")))
        d.addCallback(client.readBody)
        d.addTimeout(RAFT_STATUS_TIMEOUT, self.reactor)
        d.addCallback(json.loads)
        d.addErrback(lambda _failure: None)
        return d.addCallback(lambda answer: (url, answer))

    @staticmethod
    def page_section(state: Mapping[str, Any]) -> str:
        """The control page's etcd part for ``state()`` marked by
        ``mark_raft_leader``: a row per member with the agents using it and its
        buttons, the raft leader badged."""
        rows = []
        for member in state["members"]:
            index = member["index"]
            action = "kill" if member["running"] else "restart"
            leader = ('<span class="role-leader">raft leader</span>'
                      if member.get("raft_leader") else "")
            pid = member["pid"] if member["running"] else '<span class="no">down</span>'
            rows.append(
                f"<tr data-member='{html.escape(member['name'])}'><td>{index}</td>"
                f"<td>{html.escape(member['name'])}</td><td>{leader}</td>"
                f"<td>{html.escape(member['url'])}</td>"
                f"<td>{pid}</td><td>{html.escape(', '.join(member['agents']) or '-')}</td>"
                f"<td><form method='post' action='/etcd/{index}/{action}'>"
                f"<button>{action}</button></form></td></tr>")
        return (
            "<h2>Pool etcd</h2>"
            "<p>Every agent has every member in <code>[coordinator] storage</code> and "
            "uses one at a time. Kill a member: the agents that used it move on to the "
            "next one, and if it was the raft leader the others elect a new one first. "
            "Killing a majority leaves the pool etcd unable to serve until a member is "
            "restarted.</p>"
            "<form method='post' action='/etcd/leader/kill'>"
            "<button>kill the raft leader</button></form>"
            "<table><thead><tr><th>#</th><th>member</th><th>raft</th><th>URL</th>"
            "<th>pid</th><th>used by</th><th></th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")

    def render_post(self, request: Request, path: Sequence[str]) -> bytes | int:
        """``POST /etcd/<index>/kill``, ``/etcd/<index>/restart`` or
        ``/etcd/leader/kill`` (``path`` is what follows ``etcd``): act, then answer 303
        to ``/`` with the line said; 404 naming the valid paths otherwise."""
        action = self._action(path)
        if action is None:
            request.setResponseCode(404)
            return (f"not found: POST /etcd/<index>/kill, /etcd/<index>/restart (index 0 "
                    f"to {len(self.members) - 1}) or /etcd/leader/kill\n").encode("utf-8")
        return answer_control(request, action, "etcd control " + "/".join(path))

    def _action(self, path: Sequence[str]) -> Callable[[], "defer.Deferred[str]"] | None:
        if list(path) == ["leader", "kill"]:
            return self.kill_leader
        if (len(path) != 2 or path[1] not in ("kill", "restart")
                or not (path[0].isascii() and path[0].isdigit())):
            return None
        index = int(path[0])
        if index >= len(self.members):
            return None
        if path[1] == "kill":
            return lambda: self.kill(index)
        return lambda: self.restart(index)


def raft_leader_of(answers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The URL of the member whose status answer names itself the raft leader, of
    ``{member URL: its /v3/maintenance/status answer}``; None when none does."""
    for url, answer in answers.items():
        header = answer.get("header")
        own = header.get("member_id") if isinstance(header, Mapping) else None
        if own is not None and own == answer.get("leader"):
            return url
    return None


def mark_raft_leader(state: Mapping[str, Any], leader: str | None) -> dict[str, Any]:
    """``state()`` with the raft leader ``leader`` (a client URL, or None) marked on
    its member and named as ``raft_leader``."""
    return {**state, "raft_leader": leader,
            "members": [{**member, "raft_leader": member["url"] == leader}
                        for member in state["members"]]}


def answer_later(request: Request, body: "defer.Deferred[bytes]", what: str,
                 code: int = 200, headers: Mapping[bytes, bytes] = {}) -> int:
    """Answer ``request`` once ``body`` fired: ``code`` with ``headers`` and the body,
    or 500 with the failure (logged, naming ``what``); nothing is written to a client
    that went away meanwhile. Returns ``NOT_DONE_YET`` for ``render_GET`` or
    ``render_POST``."""
    # Set once the client is gone: nothing is written to it then.
    gone: list[Failure] = []
    request.notifyFinish().addErrback(gone.append)

    def answer(data: bytes) -> None:
        if gone:
            return
        request.setResponseCode(code)
        for name, value in headers.items():
            request.setHeader(name, value)
        request.write(data)
        request.finish()

    def failed(failure: Failure) -> None:
        _log.failure("{what} failed", failure, what=what)
        if gone:
            return
        request.setResponseCode(500)
        request.write(f"failed: {failure.getErrorMessage()}\n".encode("utf-8"))
        request.finish()

    body.addCallbacks(answer, failed)
    return NOT_DONE_YET


def answer_control(request: Request, action: Callable[[], "defer.Deferred[str]"],
                   what: str) -> int:
    """Run a control page ``action`` for ``request``: 303 to ``/`` with the line it
    said once it fired (``answer_later``)."""
    said = defer.maybeDeferred(action).addCallback(lambda line: f"{line}\n".encode("utf-8"))
    return answer_later(request, said, what, 303, {b"location": b"/"})


def etcd_state_json(etcd: SandboxEtcd | None) -> bytes:
    """``GET /etcd`` of the control page (an empty document before etcd started)."""
    state = etcd.state() if etcd is not None else {"members": [], "agents": {}}
    return json.dumps(state, indent=1).encode("utf-8")
