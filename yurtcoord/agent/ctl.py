"""``yurtcoordctl``: an agent's status pages as plain-text tables, for operators and
scripts.

::

    yurtcoordctl [--server URL|HOST:PORT | --config PATH] [-o table|json] [--timeout S] status
    yurtcoordctl members ...     # GET /pool: every member, its heartbeat path, lease age,
                                 # the pool etcd member and coordinator apiserver it uses
    yurtcoordctl leader  ...     # GET /pool: the election lease and the leader changes
    yurtcoordctl cache   ...     # GET /pool: pool cache counts and informer sync lease
    yurtcoordctl --version       # yurtcoord's version, from the installed package
    yurtcoordctl pki --pool NAME --out DIR [--node NODE ...] [--extra-san NAME ...]
                                 # the certificates and Secrets of a pool's coordinator
                                 # (yurtcoord.agent.poolpki); reads no agent

The common options may come before or after the command (after it, they override the
same option before it). The server is ``--server`` (a bare ``host:port`` is
``http://host:port``) or else the ``[server] listen`` of ``--config`` (default
``DEFAULT_CONFIG``, read with the agent's own parser; without that file, the
schema's default listen address). Tables are aligned like kubectl's; ``-o json``
prints the document the agent answered, unchanged. The exit status is 0 when the
agent is ready, ``NOT_READY`` when it answered but is not ready (so that scripts can
wait for it), ``UNREACHABLE`` when it cannot be read (no answer, or an answer that is
not the expected JSON document) and ``BAD_USAGE`` for a bad command line (argparse's
errors included: one line, not the usage), server URL or config. Every error is one
line on stderr.

It is a plain synchronous program, one request per command, and the agent it reads may
be broken or hostile (it is whatever answers at that address), so nothing the server
sends can hold it or break its output:

- ``--timeout`` is one deadline for the whole exchange (name lookup, connect, TLS,
  request, headers, body): every socket wait gets only what is left of it, so a server
  trickling a byte at a time cannot stretch it (``yurtcoord.agent.ctlread``);
- only ``http`` and ``https`` servers (``check_server``), reached directly: an agent's
  status pages are read where the agent listens, so the proxy environment variables
  (``HTTP_PROXY``, ``ALL_PROXY``, ...) are never used, and loopback never leaves the node;
- an answer is at most ``MAX_ANSWER_BYTES``, strict UTF-8, JSON without non-finite
  numbers, nested at most ``MAX_DEPTH`` deep, an object (``ctlread.decode``);
- control characters, terminal escape sequences and other invisible characters from
  the server are shown escaped (``printable``) in tables, warnings and errors; ``-o
  json`` escapes them as JSON does (``\\u001b``).
"""

import argparse
import json
import math
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Optional, TextIO

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

from yurtcoord.agent.config import SCHEMA, ConfigError, ListenAddress, load_config, parse_listen
from yurtcoord.agent.ctlread import (
    BAD_USAGE, MAX_ANSWER_BYTES, MAX_DEPTH, NOT_READY, UNREACHABLE, CtlError, fetch,
)

DEFAULT_CONFIG = "/etc/yurtcoord/yurtcoord.ini"
DEFAULT_TIMEOUT = 10.0
# The longest --timeout: a day is already more than any operator waits, and a socket
# timeout must fit the operating system's.
MAX_TIMEOUT = 86400.0
NONE = "<none>"


# -- tables --------------------------------------------------------------------------


# C0 and C1 controls (ESC, CSI, BEL, CR, ...), DEL, lone surrogates, format characters
# (bidirectional overrides, zero-width ones) and line or paragraph separators.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _escaped(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character that would act on the terminal instead of showing
    (escape sequences, carriage returns, bells, bidirectional overrides, line breaks)
    or could not be written (lone surrogates) shown as a visible ``\\x1b`` or
    ``\\u202e`` escape: what the agent answered is data, and a hostile server must
    not be able to rewrite the operator's screen or forge a line of output."""
    return _UNPRINTABLE.sub(_escaped, text)


def cell(value: object) -> str:
    """How a table shows one value: ``<none>`` for null, ``true``/``false``, ages with
    an ``s``-less plain number, text with its whitespace folded into single spaces and
    its control characters escaped (``printable``)."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    text = printable(" ".join(str(value).split()))
    return text or '""'


def age(seconds: object) -> str:
    """``4.2s``, ``3m5s``, ``2h0m``: a lease age as kubectl's AGE column shows it;
    ``<none>`` for what is not a finite number."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return NONE
    if isinstance(seconds, float) and not math.isfinite(seconds):
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
    """One row: the agent, the leader it names (the election lease as last read),
    its health and the first cause of what keeps it from being a ready, electing
    member. Servers not probed (null while the kubelet is dead) show as
    ``not-probed``, never as unhealthy."""
    cloud = status.get("cloud")
    probed = not isinstance(cloud, Mapping) or all(v is not None for v in cloud.values())
    healthy_clouds = (sum(1 for v in cloud.values() if v) if isinstance(cloud, Mapping)
                      else None)
    clouds = (None if not isinstance(cloud, Mapping) else
              f"{healthy_clouds}/{len(cloud)}" if probed else "not-probed")
    coordinator = status.get("coordinator_healthy")
    if coordinator is None and status.get("servers_not_probed"):
        coordinator = "not-probed"
    cause = status.get("cause")
    return table(
        ["node", "pool", "role", "leader", "healthy", "ready", "synced", "uploaded",
         "cloud", "coordinator", "since", "cause"],
        [[status.get("node"), status.get("pool"), status.get("role"), status.get("leader"),
          status.get("healthy"), status.get("ready"), status.get("pool_cache_synced"),
          status.get("local_cache_uploaded"), clouds, coordinator,
          status.get("last_transition"),
          cause.get("text") if isinstance(cause, Mapping) else None]])


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


# -- which agent -------------------------------------------------------------------


def default_listen() -> ListenAddress:
    """The schema's default ``[server] listen``."""
    key = next(k for k in SCHEMA if (k.section, k.name) == ("server", "listen"))
    assert key.default is not None, "[server] listen has a default"
    return parse_listen(key.default)


def check_server(value: str) -> str:
    """``value`` as a base URL to read an agent at, without a trailing ``/``; a
    ``CtlError`` (``BAD_USAGE``) naming ``--server`` and the value otherwise.

    A value without ``://`` is a ``host[:port]`` of an agent serving plain http (its
    default), read as ``http://host[:port]``: the address an operator copies from
    ``[server] listen`` or a log line. Only ``http`` and ``https``: the agent serves
    nothing else, and a ``file://`` or ``ftp://`` "server" would have the tool read
    something that is no agent. No credentials (they would be shown in every error
    line), query or fragment (the page's path is appended), and nothing but visible
    ASCII (a space or CR/LF would split the request line)."""
    def refuse(why: str) -> CtlError:
        return CtlError(f"--server {printable(repr(value))}: {why}", BAD_USAGE)

    if not value or any(not "!" <= c <= "~" for c in value):
        raise refuse("not a URL (empty, or spaces, control or non-ASCII characters)")
    url = value if "://" in value else "http://" + value
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise refuse("not an http or https URL")
    if not parts.hostname:
        raise refuse("no host")
    if parts.username is not None or parts.password is not None:
        raise refuse("credentials in the URL are not supported")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise refuse("a base URL has no query or fragment")
    try:
        parts.port
    except ValueError:
        raise refuse("not a valid port") from None
    return url.rstrip("/")


def server_url(server: Optional[str], config: Optional[str]) -> str:
    """The base URL: ``server`` (checked by ``check_server``); else ``[server] listen``
    of ``config``; else of ``DEFAULT_CONFIG`` when that file exists; else the default
    listen address. A wildcard listen address is reached on loopback."""
    if server is not None:
        return check_server(server)
    path = config
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    try:
        listen = load_config(path).server.listen if path is not None else default_listen()
    except ConfigError as error:
        raise CtlError(str(error), BAD_USAGE) from None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen.host, listen.host)
    return ListenAddress(host, listen.port).url()


EPILOG = f"""\
deadline:
  --timeout is one deadline for the whole exchange with the agent: name lookup,
  connect, TLS, request, headers and body. A server that answers slowly, or a byte at
  a time, is given up on when it passes (exit {UNREACHABLE}).
  The agent is reached directly: HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are not used.

exit status:
  0  the agent answered and is ready
  {NOT_READY}  the agent answered and is not ready
  {BAD_USAGE}  bad usage: command line, --server (an http or https URL, or host:port),
     --timeout (0 < seconds <= {MAX_TIMEOUT:g}) or the config
  {UNREACHABLE}  the agent is unreachable, gave no whole answer within --timeout, or its
     answer is not the expected JSON object (not UTF-8, not JSON, NaN or Infinity,
     nested deeper than {MAX_DEPTH}, larger than {MAX_ANSWER_BYTES} bytes, fields of the
     wrong type)
  Every error is one line on stderr. Control characters and escape sequences in the
  agent's answer are shown escaped (\\x1b).
"""


class _UsageError(CtlError):
    """A command line ``argparse`` refused: one line, exit ``BAD_USAGE``."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (see yurtcoordctl --help)", BAD_USAGE)


class _Parser(argparse.ArgumentParser):
    """``argparse`` made to fit the tool's contract: a usage error is a
    ``_UsageError`` (one line on stderr, exit ``BAD_USAGE``) instead of the usage and
    the error on ``sys.stderr`` and exit 2 from inside ``parse_args``; ``--help`` and
    ``--version`` write to ``out`` (``run``'s, so that they can be read like any other
    output), sub-command parsers included."""

    def __init__(self, *args: Any, out: Optional[TextIO] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)

    def print_help(self, file: "Optional[SupportsWrite[str]]" = None) -> None:
        (file or self.out or sys.stdout).write(self.format_help())


class _VersionAction(argparse.Action):
    """``--version``: yurtcoord's version on the parser's ``out``, exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: Optional[str] = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default,
                         nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        from yurtcoord.agent.version import ctl_version_line

        out = (parser.out if isinstance(parser, _Parser) else None) or sys.stdout
        out.write(ctl_version_line() + "\n")
        parser.exit(0)


# (command, what it shows), in the order the help lists them.
COMMAND_HELP = (
    ("status", "this agent: role, leader, readiness"),
    ("members", "the pool's members, their heartbeat paths and the servers they use"),
    ("leader", "the election lease and the leader changes seen"),
    ("cache", "the pool cache: objects and informer sync lease"),
)


def _add_common_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes. The top-level parser holds their defaults;
    each command's parser has them without defaults (``SUPPRESS``), so that an
    option given before the command is not reset by the command's parser, and one
    given after it overrides one given before."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--server", metavar="URL", default=default(None),
                        help="the agent's status pages: an http or https base URL, or "
                             "host:port for http (default: [server] listen of --config)")
    parser.add_argument("--config", metavar="PATH", default=default(None),
                        help=f"the agent's ini file, read for its [server] listen "
                             f"(default {DEFAULT_CONFIG})")
    parser.add_argument("-o", "--output", choices=("table", "json"),
                        default=default("table"),
                        help="table (default) or json: the agent's document unchanged")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        default=default(DEFAULT_TIMEOUT),
                        help=f"seconds for the whole exchange with the agent (default "
                             f"{DEFAULT_TIMEOUT:g})")


PKI_HELP = "create a pool's coordinator certificates and their Secrets"


def _add_pki_command(commands: Any, out: Optional[TextIO]) -> None:
    """``pki``: options of its own (it reads no agent, so none of the common ones)."""
    from yurtcoord.agent import poolpki

    pki = commands.add_parser(
        "pki", help=PKI_HELP, out=out, prog="yurtcoordctl pki",
        usage="yurtcoordctl pki --pool NAME --out DIR [options]",
        description=PKI_HELP + ": the pool CA (kept when DIR holds one, unless --rotate), "
        "etcd server and peer pairs, the apiserver's, the node-lease-proxy client pair, "
        "a pair per --node, and secrets.yaml with a kustomization.yaml to add to the "
        "pool's overlay. Keys are written with mode 0600.")
    pki.add_argument("--pool", required=True, metavar="NAME",
                     help="the pool's name (label apps.openyurt.io/nodepool)")
    pki.add_argument("--out", required=True, metavar="DIR", help="where to write")
    pki.add_argument("--namespace", default="", metavar="NS",
                     help=f"the pool's namespace (default {poolpki.NAMESPACE_PREFIX}<pool>)")
    pki.add_argument("--node", action="append", default=[], metavar="NODE",
                     help="issue NODE's client pair (CN=system:node:NODE, O=system:nodes) "
                          "into DIR/nodes/NODE.pem; repeat for more nodes")
    pki.add_argument("--extra-san", action="append", default=[], metavar="NAME",
                     help="one more DNS name or IP address in every server certificate "
                          "(e.g. 127.0.0.1 to serve on loopback); repeat for more")
    pki.add_argument("--client-ca", action="append", default=[], metavar="FILE",
                     help="a CA whose client certificates the coordinator apiserver "
                          "accepts besides the pool CA's (the cluster CA that signs the "
                          "kubelets' certificates); repeat for more")
    pki.add_argument("--cluster-domain", default=poolpki.CLUSTER_DOMAIN, metavar="DOMAIN",
                     help=f"the cluster's DNS domain (default {poolpki.CLUSTER_DOMAIN})")
    pki.add_argument("--rotate", action="store_true",
                     help="make a new pool CA even when DIR holds one")


def run_pki(arguments: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``yurtcoordctl pki``: 0 when written; ``BAD_USAGE`` with one line naming the
    option, value or file at fault."""
    from yurtcoord.agent import poolpki

    request = poolpki.PKIRequest(
        pool=arguments.pool, out=arguments.out, namespace=arguments.namespace,
        nodes=tuple(arguments.node), extra_sans=tuple(arguments.extra_san),
        rotate=arguments.rotate, cluster_domain=arguments.cluster_domain,
        client_ca_files=tuple(arguments.client_ca))
    try:
        result = poolpki.create_pool_pki(request)
    except poolpki.PKIError as error:
        err.write(f"yurtcoordctl: pki: {printable(str(error))}\n")
        return BAD_USAGE
    except OSError as error:
        err.write(f"yurtcoordctl: pki: {printable(str(error.filename or request.out))}: "
                  f"{printable(error.strerror or str(error))}\n")
        return BAD_USAGE
    out.write(poolpki.describe(result, request))
    return 0


def parser(out: Optional[TextIO] = None) -> argparse.ArgumentParser:
    """The command line: ``yurtcoordctl [options] COMMAND [options]``, one command per
    view. The common options may come before or after the command and are shown in
    the top-level ``--help`` as in each command's, with the deadline and the exit
    statuses; ``--version`` prints yurtcoord's version. Usage errors raise
    ``CtlError`` (``BAD_USAGE``); ``--help`` and ``--version`` write to ``out``
    (default stdout) and raise ``SystemExit(0)``."""
    formatting: dict[str, Any] = {
        "epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    top = _Parser(prog="yurtcoordctl", description="Read a yurtcoord agent's status pages.",
                  usage="yurtcoordctl [options] COMMAND [options]", out=out, **formatting)
    top.add_argument("--version", action=_VersionAction,
                     help="print yurtcoord's version and exit")
    _add_common_options(top, defaults=True)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                  title="commands")
    for name, help_text in COMMAND_HELP:
        command = commands.add_parser(
            name, help=help_text, description=help_text, out=out, prog=f"yurtcoordctl {name}",
            usage=f"yurtcoordctl [options] {name} [options]", **formatting)
        command.add_argument("--version", action=_VersionAction,
                             help="print yurtcoord's version and exit")
        _add_common_options(command, defaults=False)
    _add_pki_command(commands, out)
    return top


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Run one command line; the exit status. Whatever the agent answered, what is
    written is escaped by ``printable`` (tables and warnings through ``cell``, errors
    here, JSON by ``json.dumps``) and every error is one line."""
    try:
        arguments = parser(out).parse_args(list(argv))
    except CtlError as error:
        err.write(f"yurtcoordctl: {printable(str(error))}\n")
        return error.status
    except SystemExit as exit_:  # --help and --version
        return BAD_USAGE if exit_.code else 0
    if arguments.command == "pki":
        return run_pki(arguments, out, err)
    path, render = COMMANDS[arguments.command]
    try:
        if not 0 < arguments.timeout <= MAX_TIMEOUT:  # also false for NaN
            raise CtlError(f"--timeout must be a positive number of seconds, at most "
                           f"{MAX_TIMEOUT:g}", BAD_USAGE)
        url = server_url(arguments.server, arguments.config) + path
        document = fetch(url, arguments.timeout)
        text = (json.dumps(document, indent=2) + "\n" if arguments.output == "json"
                else render(document))
    except CtlError as error:
        err.write(f"yurtcoordctl: {printable(str(error))}\n")
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
