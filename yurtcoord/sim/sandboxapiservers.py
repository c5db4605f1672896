"""The sandbox's coordinator apiservers: Kubernetes API test servers whose objects are
the pool etcd's, and the controls that kill and restart one of them.

Each server keeps its objects in the pool etcd (``etcdstorage.storage_for``), under
the agents' ``[coordinator] storage_prefix`` and in kube-apiserver's key layout, so
that it serves exactly what the agents' pool stores write: ``kubectl --server <URL>
get endpointslices -A`` lists what the pool leader mirrored, ``get pods -A`` what
every agent uploaded. Each has every etcd member, starting with a different one
(``rotated``), as two kube-apiservers of one pool would, and its own etcd client.
Every agent is given every server's URL in ``[coordinator] server``, starting with a
different one as well, so that the agents spread over the servers and losing one
moves only the agents that wrote through it.

As a pool's coordinator apiservers do, each serves https and requires a client
certificate of the sandbox's CA (``yurtcoord.sim.sandboxpki``), authorizes as the
Node authorizer and NodeRestriction do (``PoolCoordinatorAuthorizer``: each agent
writes its own node lease as its node, and no other) and reaches the pool etcd with
the members' client pair. Each appends a record of every answer, with the user who
asked, to its request log (``request_log_paths``: one JSON line per answer,
``yurtcoord.sim.apiserver.requestlog``), so that who wrote which lease can be read
while the sandbox runs.

The controls answer on the sandbox's control page (``POST /coordinator/<index>/kill``,
``POST /coordinator/<index>/restart``): a kill closes the server's port, drops every
connection (watches included) and its etcd client, as a crashed process would; a
restart listens again on the same port with a new etcd client. ``GET /coordinator``
on the same page lists the servers (URL, running), each agent's ``[coordinator]
server`` health as its ``/status`` ``coordinator_servers`` reports it, and the holder
of the pool's election lease as read from etcd through a running server's storage
(``unread`` says why not, when etcd did not answer in time).
"""

import html
import json
import os
from typing import Any, Callable, Generator, Mapping, Optional, Sequence

from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.web.server import Request

from yurtcoord.kube.gvr import LEASES
from yurtcoord.sim.apiserver import KubeAPIServer, PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.etcdstorage import storage_for
from yurtcoord.sim.sandboxetcd import answer_control, rotated
from yurtcoord.sim.sandboxpki import ClientTLS

# Coordinator apiservers of the sandbox by default: one may be lost with the pool
# still served.
DEFAULT_COORDINATOR_SERVERS = 2
# Seconds the control page waits for the election lease from etcd: a pool etcd without
# a majority must not hold the page up (it shows the holder as unknown then).
ELECTION_READ_TIMEOUT = 1.0

# Each agent's ``[coordinator] server`` health as its ``/status`` reports it:
# ``{url: healthy}``.
AgentServers = Mapping[str, Optional[bool]]


class SandboxCoordinators:
    """The coordinator apiservers of one sandbox.

    :param reactor: the running reactor.
    :param count: how many servers.
    :param say: prints one line for the person watching.
    :param say_event: prints one line of something that happened now (with the time).
    :param agents: ``{node: {url: healthy}}`` of the sandbox's agents now.
    :param election_lease: ``(namespace, name)`` of the pool's election lease.
    """

    log = Logger()

    def __init__(self, reactor: Any, count: int, say: Callable[[str], None],
                 say_event: Callable[[str], None],
                 agents: Callable[[], Mapping[str, AgentServers]],
                 election_lease: tuple[str, str]) -> None:
        if count < 1:
            raise ValueError(f"the sandbox needs at least one coordinator apiserver, "
                             f"not {count}")
        self.reactor = reactor
        self.count = count
        self.servers: list[KubeAPIServer] = []
        self._say = say
        self._say_event = say_event
        self._agents = agents
        self._election_lease = election_lease
        # Indexes of servers that are listening.
        self._running: set[int] = set()
        # Indexes of servers with a kill or restart under way.
        self._busy: set[int] = set()
        self._stopping = False

    @property
    def urls(self) -> list[str]:
        """Every server's URL, by index (known once started)."""
        return [server.url or "" for server in self.servers]

    @property
    def request_log_paths(self) -> list[str]:
        """Every server's request log file, by index (known once started)."""
        return [server.request_log_path or "" for server in self.servers]

    def server_for(self, index: int) -> list[str]:
        """The ``[coordinator] server`` of agent ``index``: every server, its first one
        chosen by ``rotated``."""
        return rotated(self.urls, index)

    def is_running(self, index: int) -> bool:
        return index in self._running

    # -- start and stop ------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self, etcd_urls: Sequence[str], prefix: str, tls_dir: str, etcd_tls: ClientTLS,
              log_dir: str) -> Generator["defer.Deferred[Any]", Any, list[str]]:
        """Make and start the servers over the pool etcd of ``etcd_urls`` under
        ``prefix``, reached with ``etcd_tls``; each serves the CA and server pair of
        ``tls_dir`` (``yurtcoord.sim.apiserver.server.tls_options``) and writes its
        request log in ``log_dir``; fires with their URLs."""
        for index in range(self.count):
            members = rotated(etcd_urls, index)
            server = KubeAPIServer(
                self.reactor, tls_dir=tls_dir, authorizer=PoolCoordinatorAuthorizer(),
                request_log_path=os.path.join(log_dir, f"coordinator-{index}-requests.jsonl"),
                storage=storage_for(self.reactor, ",".join(members), prefix,
                                    ca_file=etcd_tls.ca_file, cert_file=etcd_tls.pair.cert_file,
                                    key_file=etcd_tls.pair.key_file))
            self.servers.append(server)
            url = yield server.start()
            self._running.add(index)
            self.log.info("coordinator apiserver {index} listening url={url} etcd={etcd} "
                          "prefix={prefix} request_log={log}", index=index, url=url,
                          etcd=",".join(members), prefix=prefix, log=server.request_log_path)
        return self.urls

    @defer.inlineCallbacks
    def stop(self) -> Generator["defer.Deferred[Any]", Any, None]:
        """Stop every server (a killed one has nothing left to stop)."""
        self._stopping = True
        for index, server in enumerate(self.servers):
            try:
                yield server.stop()
            except Exception:
                self.log.failure("stopping coordinator apiserver {index} failed", index=index)
            self._running.discard(index)

    # -- the controls --------------------------------------------------------------------

    def _healthy_to(self, url: str) -> list[str]:
        return sorted(node for node, servers in self._agents().items() if servers.get(url))

    def _refused(self, index: int) -> str | None:
        """Why a kill or restart of server ``index`` cannot start now, or None."""
        if self._stopping:
            return f"coordinator apiserver {index}: the sandbox is stopping"
        if index in self._busy:
            return f"coordinator apiserver {index}: a kill or restart is already under way"
        return None

    @defer.inlineCallbacks
    def kill(self, index: int) -> Generator["defer.Deferred[Any]", Any, str]:
        """Close server ``index``'s port, its connections and its etcd client; fires
        with the line said."""
        server = self.servers[index]
        refused = self._refused(index)
        if refused is not None:
            return self._said(refused)
        if index not in self._running:
            return self._said(f"coordinator apiserver {index} ({server.url}) is not running")
        users = self._healthy_to(server.url or "")
        self._busy.add(index)
        try:
            yield server.stop()
        finally:
            self._running.discard(index)
            self._busy.discard(index)
        self.log.info("coordinator apiserver {index} url={url} killed through the control "
                      "page", index=index, url=server.url)
        left = len(self._running)
        if left == 1:
            served = "the other serves the pool on: the agents move to it at their next request"
        elif left:
            served = f"the {left} others serve the pool on: the agents move to them"
        else:
            served = "none is left: the agents go pending until one is restarted"
        return self._said(
            f"coordinator apiserver {index} ({server.url}) killed; agents that counted it "
            f"healthy: {', '.join(users) or 'none'}; {served}")

    @defer.inlineCallbacks
    def restart(self, index: int) -> Generator["defer.Deferred[Any]", Any, str]:
        """Listen again on server ``index``'s port; fires with the line said."""
        server = self.servers[index]
        refused = self._refused(index)
        if refused is not None:
            return self._said(refused)
        if index in self._running:
            return self._said(f"coordinator apiserver {index} ({server.url}) is already "
                              f"running")
        self._busy.add(index)
        try:
            yield server.start(port=server.port_number or 0)
        except CannotListenError as error:
            return self._said(f"coordinator apiserver {index} did not come back: port "
                              f"{server.port_number}: {error.socketError}")
        finally:
            self._busy.discard(index)
        self._running.add(index)
        self.log.info("coordinator apiserver {index} url={url} restarted", index=index,
                      url=server.url)
        return self._said(f"coordinator apiserver {index} ({server.url}) restarted: the "
                          f"agents count it healthy again at their next probe of it")

    def _said(self, line: str) -> str:
        self._say_event(line)
        return line

    # -- what the control page shows -----------------------------------------------------

    @defer.inlineCallbacks
    def election_holder(self) -> Generator["defer.Deferred[Any]", Any,
                                           tuple[str | None, str | None]]:
        """``(holder, None)`` of the pool's election lease, read from the pool etcd
        through the storage of a running server (holder None: no lease, or no holder);
        ``(None, why)`` when it could not be read within ``ELECTION_READ_TIMEOUT``."""
        running = sorted(self._running)
        if not running:
            return None, "no coordinator apiserver is running"
        namespace, name = self._election_lease
        read = self.servers[running[0]].storage.get(LEASES, name, namespace)
        # Cancelled when late: whatever failure the cancelled read ends with, it is late.
        timer = self.reactor.callLater(ELECTION_READ_TIMEOUT, read.cancel)
        try:
            lease = yield read
        except Exception as error:
            if not timer.active():
                return None, f"etcd did not answer within {ELECTION_READ_TIMEOUT:g} s"
            self.log.info("election lease not read: {error}", error=error)
            return None, str(error)
        finally:
            if timer.active():
                timer.cancel()
        return ((lease or {}).get("spec") or {}).get("holderIdentity"), None

    @defer.inlineCallbacks
    def state(self) -> Generator["defer.Deferred[Any]", Any, dict[str, Any]]:
        """The document of ``GET /coordinator``: the servers, the agents' health of
        each and the election lease holder."""
        holder, unread = yield self.election_holder()
        agents = self._agents()
        namespace, name = self._election_lease
        return {
            "apiservers": [
                {"index": index, "url": server.url, "running": index in self._running,
                 "healthy_to": sorted(node for node, servers in agents.items()
                                      if servers.get(server.url or ""))}
                for index, server in enumerate(self.servers)],
            "agents": {node: {"coordinator_servers": dict(servers)}
                       for node, servers in sorted(agents.items())},
            "election_lease": {"namespace": namespace, "name": name, "holder": holder,
                               "unread": unread},
        }

    @staticmethod
    def page_section(state: Mapping[str, Any]) -> str:
        """The control page's part for ``state()``: a row per server with its button,
        a row per agent with the servers it counts healthy."""
        rows = []
        for server in state["apiservers"]:
            index = server["index"]
            action = "kill" if server["running"] else "restart"
            rows.append(
                f"<tr><td>{index}</td><td>{html.escape(server['url'] or '-')}</td>"
                f"<td class='{'yes' if server['running'] else 'no'}'>"
                f"{'running' if server['running'] else 'down'}</td>"
                f"<td>{html.escape(', '.join(server['healthy_to']) or '-')}</td>"
                f"<td><form method='post' action='/coordinator/{index}/{action}'>"
                f"<button>{action}</button></form></td></tr>")
        agent_rows = []
        for node, agent in state["agents"].items():
            # None: not probed (the agent's kubelet is dead), which says nothing of
            # whether the server runs.
            health = ", ".join(
                f"{html.escape(url)} "
                f"{'not probed' if healthy is None else 'healthy' if healthy else 'down'}"
                for url, healthy in agent["coordinator_servers"].items())
            agent_rows.append(f"<tr><td>{html.escape(node)}</td><td>{health}</td></tr>")
        lease = state["election_lease"]
        return (
            "<h2>Coordinator apiservers</h2>"
            "<p>Each serves the pool etcd, over TLS for the sandbox's certificates, and "
            "lets each agent write its own node lease as its node, and no other. Every "
            "agent has every one in <code>"
            "[coordinator] server</code> and writes through one that is healthy. Kill "
            "one: the agents that used it move to another and stay ready, the pool "
            "leader keeps the election lease. Election lease "
            f"{html.escape(lease['namespace'])}/{html.escape(lease['name'])} held by "
            f"{html.escape(lease['holder'] or '-')}"
            f"{' (not read: ' + html.escape(lease['unread']) + ')' if lease['unread'] else ''}"
            ".</p>"
            "<table><tr><th>#</th><th>URL</th><th>state</th>"
            "<th>healthy to</th><th></th></tr>" + "".join(rows) + "</table>"
            "<table><tr><th>agent</th>"
            "<th>its coordinator apiservers (its /status)</th></tr>"
            + "".join(agent_rows) + "</table>")

    def render_get(self) -> "defer.Deferred[bytes]":
        """``GET /coordinator``: ``state()`` as JSON."""
        return self.state().addCallback(
            lambda state: json.dumps(state, indent=1).encode("utf-8"))

    def render_post(self, request: Request, path: Sequence[str]) -> bytes | int:
        """``POST /coordinator/<index>/kill`` or ``/coordinator/<index>/restart``
        (``path`` is what follows ``coordinator``): act, then answer 303 to ``/`` with
        the line said; 404 naming the valid paths otherwise."""
        action = self._action(path)
        if action is None:
            request.setResponseCode(404)
            return (f"not found: POST /coordinator/<index>/kill or "
                    f"/coordinator/<index>/restart (index 0 to "
                    f"{len(self.servers) - 1})\n").encode("utf-8")
        return answer_control(request, action, "coordinator control " + "/".join(path))

    def _action(self, path: Sequence[str]) -> Callable[[], "defer.Deferred[str]"] | None:
        if (len(path) != 2 or path[1] not in ("kill", "restart")
                or not (path[0].isascii() and path[0].isdigit())):
            return None
        index = int(path[0])
        if index >= len(self.servers):
            return None
        if path[1] == "kill":
            return lambda: self.kill(index)
        return lambda: self.restart(index)
