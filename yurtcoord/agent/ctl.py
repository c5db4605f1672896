"""``yurtcoordctl``: an agent's status pages as plain-text tables, for operators and
scripts.

::

    yurtcoordctl status  [--server URL | --config PATH] [-o table|json]
    yurtcoordctl members ...     # GET /pool: every member, its heartbeat path, lease age,
                                 # the pool etcd member and coordinator apiserver it uses
    yurtcoordctl leader  ...     # GET /pool: the election lease and the leader changes
    yurtcoordctl cache   ...     # GET /pool: pool cache counts and informer sync lease

The server is ``--server`` or else the ``[server] listen`` of ``--config`` (default
``DEFAULT_CONFIG``, read with the agent's own parser; without that file, the
schema's default listen address). Tables are aligned like kubectl's; ``-o json``
prints the document the agent answered, unchanged. The exit status is 0 when the
agent is ready, ``NOT_READY`` when it answered but is not ready (so that scripts can
wait for it), ``UNREACHABLE`` when it cannot be read (no answer, or an answer that is
not the expected JSON document) and ``BAD_USAGE`` for a bad command line or config.
Every error is one line on stderr. It is a plain synchronous program: one request
per command, bounded by ``--timeout`` and by ``MAX_ANSWER_BYTES``.
"""

import argparse
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Optional, TextIO

from yurtcoord.agent.config import SCHEMA, ConfigError, ListenAddress, load_config, parse_listen

DEFAULT_CONFIG = "/etc/yurtcoord/yurtcoord.ini"
# Bytes of one answer read at most; a longer one is a bad answer.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0
NOT_READY, BAD_USAGE, UNREACHABLE = 1, 2, 3
NONE = "<none>"


class CtlError(Exception):
    """One line saying why a command could not be answered; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = UNREACHABLE) -> None:
        super().__init__(message)
        self.status = status


# -- tables --------------------------------------------------------------------------


def cell(value: object) -> str:
    """How a table shows one value: ``<none>`` for null, ``true``/``false``, ages with
    an ``s``-less plain number, text with its whitespace folded into single spaces."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    text = " ".join(str(value).split())
    return text or '""'


def age(seconds: object) -> str:
    """``4.2s``, ``3m5s``, ``2h0m``: a lease age as kubectl's AGE column shows it."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return NONE
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    return f"{whole // 3600}h{whole % 3600 // 60}m"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns left-aligned, three spaces apart, upper-case headers, no trailing
    blanks: the layout of ``kubectl get``."""
    texts = [[header.upper() for header in headers]]
    texts += [[cell(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in texts) for i in range(len(headers))]
    lines = ["   ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip()
             for row in texts]
    return "\n".join(lines) + "\n"


def _mapping(document: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = document.get(key)
    if not isinstance(value, Mapping):
        raise CtlError(f"bad answer: field {key!r} is not an object")
    return value


def _records(document: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = document.get(key)
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise CtlError(f"bad answer: field {key!r} is not a list of objects")
    return value


def format_status(status: Mapping[str, Any]) -> str:
    cloud = status.get("cloud")
    healthy_clouds = (sum(1 for v in cloud.values() if v) if isinstance(cloud, Mapping)
                      else None)
    clouds = (f"{healthy_clouds}/{len(cloud)}" if isinstance(cloud, Mapping) else None)
    return table(
        ["node", "pool", "role", "leader", "healthy", "ready", "synced", "uploaded",
         "cloud", "coordinator", "since"],
        [[status.get("node"), status.get("pool"), status.get("role"), status.get("leader"),
          status.get("healthy"), status.get("ready"), status.get("pool_cache_synced"),
          status.get("local_cache_uploaded"), clouds, status.get("coordinator_healthy"),
          status.get("last_transition")]])


def _upload(member: Mapping[str, Any]) -> object:
    upload = member.get("upload")
    if not isinstance(upload, Mapping):
        return None
    done = "uploaded" if upload.get("uploaded") else "not uploaded"
    return f"{done} ({cell(upload.get('objects'))})"


def format_members(pool: Mapping[str, Any]) -> str:
    members = _records(pool, "members")
    rows = [[m.get("node"), m.get("heartbeat"), age(m.get("lease_age")),
             age(m.get("cloud_lease_age")), age(m.get("pool_lease_age")),
             m.get("leader") is True, m.get("etcd_member"), m.get("coordinator_server"),
             _upload(m)]
            for m in members]
    if not rows:
        return "No members found.\n"
    return table(["node", "heartbeat", "lease-age", "cloud-lease", "pool-lease", "leader",
                  "etcd-member", "coordinator-server", "upload"], rows)


def format_leader(pool: Mapping[str, Any]) -> str:
    election = _mapping(pool, "election")
    text = table(["leader", "lease-holder", "lease-age", "lease-duration", "expired"],
                 [[pool.get("leader"), election.get("holder"), age(election.get("lease_age")),
                   election.get("lease_duration_seconds"), election.get("expired")]])
    changes = _records(pool, "leader_changes")
    if changes:
        text += "\n" + table(["changed", "new-leader"],
                             [[c.get("time"), c.get("leader")] for c in changes])
    return text


def format_cache(pool: Mapping[str, Any]) -> str:
    cache = _mapping(pool, "cache")
    text = table(["synced", "informer-sync-age", "informer-sync-holder"],
                 [[cache.get("synced"), age(cache.get("informer_sync_lease_age")),
                   cache.get("informer_sync_holder")]])
    resources = cache.get("resources")
    if not isinstance(resources, Mapping):
        raise CtlError("bad answer: field 'cache.resources' is not an object")
    if resources:
        text += "\n" + table(["resource", "objects"], sorted(
            ([name, count] for name, count in resources.items()), key=lambda r: str(r[0])))
    return text


# command: (path it reads, how it is shown)
COMMANDS = {
    "status": ("/status", format_status),
    "members": ("/pool", format_members),
    "leader": ("/pool", format_leader),
    "cache": ("/pool", format_cache),
}


# -- reading the agent ---------------------------------------------------------------


def default_listen() -> ListenAddress:
    """The schema's default ``[server] listen``."""
    key = next(k for k in SCHEMA if (k.section, k.name) == ("server", "listen"))
    assert key.default is not None, "[server] listen has a default"
    return parse_listen(key.default)


def server_url(server: Optional[str], config: Optional[str]) -> str:
    """The base URL: ``server``; else ``[server] listen`` of ``config``; else of
    ``DEFAULT_CONFIG`` when that file exists; else the default listen address. A
    wildcard listen address is reached on loopback."""
    if server:
        return server.rstrip("/")
    path = config
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    try:
        listen = load_config(path).server.listen if path is not None else default_listen()
    except ConfigError as error:
        raise CtlError(str(error), BAD_USAGE) from None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen.host, listen.host)
    return ListenAddress(host, listen.port).url()


def fetch(url: str, timeout: float) -> Mapping[str, Any]:
    """GET ``url``: its JSON object, or a ``CtlError`` naming what went wrong."""
    request = urllib.request.Request(url, headers={"accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as error:
        raise CtlError(f"bad answer from {url}: HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            reason = f"no answer within {timeout:g}s"
        raise CtlError(f"agent unreachable at {url}: {reason}") from None
    except (socket.timeout, TimeoutError):
        raise CtlError(f"agent unreachable at {url}: no answer within {timeout:g}s") from None
    except (OSError, ValueError) as error:
        raise CtlError(f"agent unreachable at {url}: {error}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise CtlError(f"bad answer from {url}: larger than {MAX_ANSWER_BYTES} bytes")
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise CtlError(f"bad answer from {url}: not JSON ({error})") from None
    if not isinstance(document, dict):
        raise CtlError(f"bad answer from {url}: not a JSON object")
    return document


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help="base URL of the agent's status pages "
                                         "(default: [server] listen of --config)")
    common.add_argument("--config", help=f"the agent's ini file (default {DEFAULT_CONFIG})")
    common.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or json: the agent's document unchanged")
    common.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds to wait for the agent (default {DEFAULT_TIMEOUT:g})")
    top = argparse.ArgumentParser(
        prog="yurtcoordctl", description="Read a yurtcoord agent's status pages.",
        epilog=f"exit status: 0 ready, {NOT_READY} not ready, {BAD_USAGE} bad usage or "
               f"config, {UNREACHABLE} agent unreachable or bad answer")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (("status", "this agent: role, leader, readiness"),
                            ("members", "the pool's members, their heartbeat paths and "
                                        "the servers they use"),
                            ("leader", "the election lease and the leader changes seen"),
                            ("cache", "the pool cache: objects and informer sync lease")):
        commands.add_parser(name, parents=[common], help=help_text)
    return top


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Run one command line; the exit status."""
    try:
        arguments = parser().parse_args(list(argv))
    except SystemExit as exit_:
        return BAD_USAGE if exit_.code else 0
    path, render = COMMANDS[arguments.command]
    try:
        if not arguments.timeout > 0:
            raise CtlError("--timeout must be a positive number of seconds", BAD_USAGE)
        url = server_url(arguments.server, arguments.config) + path
        document = fetch(url, arguments.timeout)
        text = (json.dumps(document, indent=2) + "\n" if arguments.output == "json"
                else render(document))
    except CtlError as error:
        err.write(f"yurtcoordctl: {error}\n")
        return error.status
    out.write(text)
    if arguments.output == "table":
        errors = document.get("errors")
        if isinstance(errors, Mapping):
            for what, why in sorted(errors.items(), key=lambda item: str(item[0])):
                err.write(f"yurtcoordctl: warning: the agent could not read {cell(what)}: "
                          f"{cell(why)}\n")
    return 0 if document.get("ready") is True else NOT_READY


def main() -> None:
    """The ``yurtcoordctl`` console script."""
    sys.exit(run(sys.argv[1:], sys.stdout, sys.stderr))


if __name__ == "__main__":
    main()
