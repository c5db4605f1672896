"""The agent's ini configuration: one declarative schema, parsed into frozen dataclasses.

Every key the agent understands is a row of ``SCHEMA``; parsing, validation, defaults,
rendering back to ini text and the operator documentation all come from that table, so
a key cannot exist in one place and be missing in another. A key an earlier agent read
and this one ignores is in ``RETIRED_KEYS`` instead: a file that sets it still starts,
with one warning line naming it.

Errors are ``ConfigError`` whose ``str`` is a single line naming the file, the section,
the key and the offending value, because operators read them on a console or in
``journalctl`` where a traceback helps nobody.

Credential rules for ``[cloud]`` (decided here, documented in ``etc/yurtcoord.ini``):

- ``kubeconfig`` replaces the four keys ``ca_file``, ``cert_file``, ``key_file`` and
  ``token_file``: setting it together with any of them is an error, so there is never a
  question of which one wins;
- ``cert_file`` and ``key_file`` come together or not at all;
- ``token_file`` is an alternative to the client certificate: not both.

Longer than 600 lines on purpose: the schema is one table, and the value types,
parsers and section dataclasses its rows name sit beside it, so that a key's type,
default, check and section are read in one place; split, every row would point into
another module.
"""

import configparser
import difflib
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from twisted.logger import Logger

from yurtcoord.kube.leaderelection import (
    LeaderElectionConfig, LeaderElectionConfigError, check_election_timing)
from yurtcoord.tx.durations import format_duration
from yurtcoord.tx.credentials import mask_url_credentials, url_has_credentials
from yurtcoord.names import ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE, NODE_POOL_LABEL
from yurtcoord.pool.keys import normalize_prefix, resource_prefix
# Re-exported: the ini names upload resources, the local cache defines them.
from yurtcoord.pool.localcache import UploadResource  # noqa: F401
from yurtcoord.pool.scope import DEFAULT_POOL_SCOPE_RESOURCES, describe

DEFAULT_CONFIG_PATH = "/etc/yurtcoord/yurtcoord.ini"

log = Logger()


class ConfigError(Exception):
    """A configuration problem, printable as one line.

    ``section``, ``key`` and ``value`` are None when the problem is not about one key
    (an unreadable file, a syntax error).
    """

    def __init__(self, source, reason, section=None, key=None, value=None):
        super().__init__(source, reason, section, key, value)
        self.source = source
        self.reason = reason
        self.section = section
        self.key = key
        self.value = value

    def __str__(self):
        where = str(self.source)
        if self.section is not None:
            where += f": [{self.section}]"
            if self.key is not None:
                where += f" {self.key}"
                if self.value is not None:
                    where += f" = {self.value!r}"
        # A URL's credentials are never printed, whichever value or reason holds them.
        return mask_url_credentials(_one_line(f"{where}: {self.reason}"))


def _one_line(text):
    return " ".join(text.split())


class _BadValue(ValueError):
    """Raised by value parsers; the message is the reason shown to the operator."""


# ---------------------------------------------------------------------------------------
# Value types: each parses the raw ini text and renders a parsed value back.

_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_HINT = "not a duration (use 500ms, 15s, 2m)"


def parse_duration(text: str) -> float:
    """``500ms``, ``15s``, ``2m``, ``1h`` or combinations like ``1m30s`` → float seconds."""
    text = text.strip()
    if not text:
        raise _BadValue(_DURATION_HINT)
    position = 0
    total = 0.0
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        if match is None:
            raise _BadValue(_DURATION_HINT)
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    return total


def _parse_positive_duration(text):
    seconds = parse_duration(text)
    if seconds <= 0:
        raise _BadValue("must be longer than 0s")
    return seconds


def _parse_bool(text):
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise _BadValue("not a boolean (use true or false)")


def _format_bool(value):
    return "true" if value else "false"


def _parse_positive_int(text):
    try:
        number = int(text.strip(), 10)
    except ValueError:
        raise _BadValue("not a whole number") from None
    if number < 1:
        raise _BadValue("must be 1 or more")
    return number


def _parse_text(text):
    return text.strip()


def _parse_optional_path(text):
    """An empty value means "not set" (None)."""
    return text.strip() or None


def _format_optional(value):
    return "" if value is None else str(value)


def _split_list(text):
    return [item.strip() for item in text.split(",") if item.strip()]


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _parse_object_name(text):
    """A Kubernetes object name (DNS subdomain): node names, lease names."""
    name = text.strip()
    if not _DNS_SUBDOMAIN.fullmatch(name) or ".." in name:
        raise _BadValue(
            "not a valid Kubernetes name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit)"
        )
    return name


def _parse_optional_object_name(text):
    if not text.strip():
        return ""
    return _parse_object_name(text)


def _parse_namespace(text):
    name = text.strip()
    if not _DNS_LABEL.fullmatch(name):
        raise _BadValue(
            "not a valid namespace (lowercase letters, digits and '-', at most 63 characters)"
        )
    return name


def _check_url(text):
    """An http(s) URL with a host; whether http is allowed is a rule of its section.

    A URL carrying credentials (``https://user:password@host``) is refused: the agent
    would show it on ``/status``, in metric labels and in log lines, and apiservers
    and etcd take their credentials from certificates and tokens, not from the URL."""
    url = text.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
            character.isspace() for character in url):
        raise _BadValue("not a URL (use https://host:port)")
    if url_has_credentials(url):
        raise _BadValue("a URL with credentials (user:password@), which would be shown "
                        "wherever the server is named; give credentials as cert_file/"
                        "key_file, token_file or a kubeconfig instead")
    try:
        parts.port
    except ValueError:
        raise _BadValue("not a URL: bad port") from None
    return url.rstrip("/") if not parts.path.strip("/") else url


KUBELET_CHECK_OFF = "off"
DEFAULT_KUBELET_HEALTHZ_URL = "http://127.0.0.1:10248/healthz"


def _parse_kubelet_url(text):
    """The kubelet's healthz URL, or ``off`` (None) on a node with no kubelet.

    An empty value is refused: it once meant "no check" and now the check is on by
    default, so an empty line left over from an old file must not be read either way.
    """
    value = text.strip()
    if not value:
        raise _BadValue(
            f"empty value: write the kubelet's healthz URL (default "
            f"{DEFAULT_KUBELET_HEALTHZ_URL}) or {KUBELET_CHECK_OFF} on a node with no "
            f"kubelet; an empty value no longer turns the check off")
    if value.lower() == KUBELET_CHECK_OFF:
        return None
    return _check_url(value)


def _format_kubelet_url(value):
    return KUBELET_CHECK_OFF if value is None else str(value)


def _parse_url_list(text):
    items = _split_list(text)
    if not items:
        raise _BadValue("needs at least one URL")
    return tuple(_check_url(item) for item in items)


def _parse_etcd_urls(text):
    """The pool etcd's members: distinct URLs (see ``_parse_distinct_url_list``), all of
    one scheme (one TLS setting)."""
    urls = _parse_distinct_url_list(text)
    schemes = {urlsplit(url).scheme for url in urls}
    if len(schemes) > 1:
        raise _BadValue("mixes http:// and https://: every etcd member of a pool is "
                        "reached the same way")
    return urls


def _format_list(values):
    return ", ".join(str(value) for value in values)


def _server_identity(url):
    """What makes two spellings of a URL the same server: scheme, host (any case),
    port (the scheme's default when left out) and path."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def _parse_distinct_url_list(text):
    """One or more URLs, comma-separated, each of them once; an error names the URL
    at fault, since the operator sees the whole list as the value."""
    items = _split_list(text)
    if not items:
        raise _BadValue("needs at least one URL")
    urls: list[str] = []
    seen: dict[tuple, str] = {}
    for item in items:
        try:
            url = _check_url(item)
        except _BadValue as error:
            raise _BadValue(f"{item!r} is {error}") from None
        identity = _server_identity(url)
        if identity in seen:
            raise _BadValue(f"{item!r} names the same server as {seen[identity]!r}: "
                            "list each server once")
        seen[identity] = item
        urls.append(url)
    return tuple(urls)


def _parse_etcd_prefix(text):
    prefix = text.strip()
    if not prefix.startswith("/"):
        raise _BadValue("must start with '/', e.g. /registry")
    return prefix.rstrip("/") or "/"


@dataclass(frozen=True)
class ListenAddress:
    """Where the status HTTP server listens; port 0 picks a free port."""

    host: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    def url(self, port: int | None = None) -> str:
        """The base URL clients use, with the real ``port`` when 0 was configured."""
        host = f"[{self.host}]" if self.is_ipv6 else self.host
        return f"http://{host}:{self.port if port is None else port}"

    def __str__(self):
        host = f"[{self.host}]" if self.is_ipv6 else self.host
        return f"{host}:{self.port}"


_LISTEN = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")


def parse_listen(text: str) -> ListenAddress:
    """``host:port`` or ``[ipv6]:port`` → ``ListenAddress``."""
    match = _LISTEN.fullmatch(text.strip())
    if match is None:
        raise _BadValue("not host:port (e.g. 127.0.0.1:10267 or [::1]:10267)")
    port = int(match.group("port"))
    if port > 65535:
        raise _BadValue("port must be 0..65535")
    return ListenAddress(match.group("ipv6") or match.group("host"), port)


_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_RESOURCE = re.compile(r"[a-z][a-z0-9]*")
_VERSION = re.compile(r"v[1-9][0-9]*(?:(?:alpha|beta)[1-9][0-9]*)?")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def parse_upload_resource(text: str) -> UploadResource:
    """``component/resource/version[/group]`` → ``UploadResource``."""
    parts = text.strip().split("/")
    hint = "not component/resource/version[/group] (e.g. kubelet/pods/v1)"
    if len(parts) not in (3, 4):
        raise _BadValue(hint)
    component, resource, version = parts[:3]
    group = parts[3] if len(parts) == 4 else ""
    if not _COMPONENT.fullmatch(component):
        raise _BadValue(f"{hint}: bad component {component!r}")
    if not _RESOURCE.fullmatch(resource):
        raise _BadValue(f"{hint}: bad resource {resource!r} (lowercase plural, e.g. pods)")
    if not _VERSION.fullmatch(version):
        raise _BadValue(f"{hint}: bad version {version!r} (e.g. v1, v1beta1)")
    if len(parts) == 4 and not _GROUP.fullmatch(group):
        raise _BadValue(f"{hint}: bad group {group!r} (e.g. discovery.k8s.io)")
    return UploadResource(component, resource, version, group)


def _parse_upload_resources(text):
    return tuple(parse_upload_resource(item) for item in _split_list(text))


LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("text", "json")


def _choice(name, choices):
    """A parser accepting one of ``choices`` (any case), returned in lower case."""

    def parse(text):
        value = text.strip().lower()
        if value not in choices:
            raise _BadValue(f"not a {name} (use {', '.join(choices[:-1])} or {choices[-1]})")
        return value

    return parse


@dataclass(frozen=True)
class ValueType:
    """How one kind of value is read from and written to ini text."""

    name: str
    parse: Callable[[str], Any]
    render: Callable[[Any], str] = str


DURATION = ValueType("duration", _parse_positive_duration, format_duration)
BOOLEAN = ValueType("boolean", _parse_bool, _format_bool)
POSITIVE_INT = ValueType("positive integer", _parse_positive_int)
TEXT = ValueType("text", _parse_text)
OBJECT_NAME = ValueType("Kubernetes name", _parse_object_name)
OPTIONAL_OBJECT_NAME = ValueType("Kubernetes name or empty", _parse_optional_object_name)
NAMESPACE = ValueType("namespace", _parse_namespace)
OPTIONAL_PATH = ValueType("path or empty", _parse_optional_path, _format_optional)
PATH = ValueType("path", _parse_text)
URL = ValueType("URL", _check_url)
KUBELET_URL = ValueType("URL or off", _parse_kubelet_url, _format_kubelet_url)
URL_LIST = ValueType("comma-separated URLs", _parse_url_list, _format_list)
ETCD_URLS = ValueType("comma-separated distinct URLs", _parse_etcd_urls, _format_list)
DISTINCT_URL_LIST = ValueType("comma-separated distinct URLs", _parse_distinct_url_list,
                              _format_list)
ETCD_PREFIX = ValueType("etcd key prefix", _parse_etcd_prefix)
LISTEN = ValueType("host:port", parse_listen)
LOG_LEVEL = ValueType("debug, info, warn or error", _choice("log level", LOG_LEVELS))
LOG_FORMAT = ValueType("text or json", _choice("log format", LOG_FORMATS))
UPLOAD_RESOURCES = ValueType(
    "comma-separated component/resource/version[/group]", _parse_upload_resources, _format_list
)


# ---------------------------------------------------------------------------------------
# The schema: one row per key. ``default`` is ini text (None = required).

@dataclass(frozen=True)
class Key:
    section: str
    name: str
    type: ValueType
    default: str | None
    help: str

    @property
    def required(self) -> bool:
        return self.default is None


SCHEMA = (
    Key("node", "name", OBJECT_NAME, None,
        "required; lease holder identity and node lease name"),
    Key("node", "pool", OPTIONAL_OBJECT_NAME, "",
        f"node pool name (label {NODE_POOL_LABEL} of the pool's Nodes); "
        "required with the coordinator enabled"),
    Key("node", "kubelet_client_cert", PATH, "/var/lib/kubelet/pki/kubelet-client-current.pem",
        "the node's own client certificate and key in one PEM file (the kubelet's, "
        "CN=system:node:<name>, O=system:nodes, rotated by it): the identity the "
        "node's own lease is written with, in the cloud (over TLS) and on the "
        "coordinator apiservers, which let a node write only its own node lease; "
        "re-read when it changes, heartbeats failing until it exists; a certificate "
        "naming another node stops the agent at start; unused with [cloud] and "
        "[coordinator] insecure = true"),

    Key("cloud", "servers", URL_LIST, None,
        "required; one or more cloud apiserver URLs, comma-separated"),
    Key("cloud", "ca_file", OPTIONAL_PATH, "", "CA bundle for the cloud apiservers"),
    Key("cloud", "cert_file", OPTIONAL_PATH, "",
        "client certificate for the cloud (heartbeats, pool sync); needs key_file"),
    Key("cloud", "key_file", OPTIONAL_PATH, "", "client key for cert_file"),
    Key("cloud", "token_file", OPTIONAL_PATH, "",
        "alternative to cert_file/key_file: bearer token file"),
    Key("cloud", "kubeconfig", OPTIONAL_PATH, "",
        "alternative to the four keys above; cannot be combined with them"),
    Key("cloud", "insecure", BOOLEAN, "false",
        "allow http:// and skip verification (testing only)"),

    Key("coordinator", "enabled", BOOLEAN, "true", "run the pool coordinator"),
    Key("coordinator", "server", DISTINCT_URL_LIST, "https://yurt-coordinator-apiserver:443",
        "one or more coordinator apiserver URLs over the pool etcd, comma-separated; "
        "healthy while any of them is"),
    Key("coordinator", "storage", ETCD_URLS, "https://yurt-coordinator-etcd:2379",
        "the pool etcd behind the coordinator apiserver: one or more members of one "
        "etcd cluster, comma-separated"),
    Key("coordinator", "storage_prefix", ETCD_PREFIX, "/registry",
        "same as the coordinator apiserver's --etcd-prefix"),
    Key("coordinator", "pki_dir", PATH, "/var/lib/yurtcoord/pki",
        "certs fetched from the certs secret are written here"),
    Key("coordinator", "secret_namespace", NAMESPACE, "kube-system",
        "where secret yurt-coordinator-yurthub-certs lives"),
    Key("coordinator", "insecure", BOOLEAN, "false",
        "plain http etcd/apiserver, no client certs (testing only)"),

    Key("leader_election", "lease_namespace", NAMESPACE, ELECTION_LEASE_NAMESPACE,
        "namespace of the election lease"),
    Key("leader_election", "lease_name", OBJECT_NAME, ELECTION_LEASE_NAME,
        "name of the election lease"),
    Key("leader_election", "lease_duration", DURATION, "15s",
        "a lease not renewed for this long may be taken over"),
    Key("leader_election", "renew_deadline", DURATION, "10s",
        "the leader gives up when it could not renew for this long"),
    Key("leader_election", "retry_period", DURATION, "2s",
        "how often to try to acquire or renew the lease"),
    Key("leader_election", "check_interval", DURATION, "5s",
        "how often the elector re-checks health"),

    Key("heartbeat", "interval", DURATION, "10s",
        "how often the node lease is written; a probe must end within it"),
    Key("heartbeat", "failed_retry", POSITIVE_INT, "3",
        "attempts of one probe (any error, with pauses) before it fails"),
    Key("heartbeat", "healthy_threshold", POSITIVE_INT, "2",
        "consecutive good probes before a server counts as healthy again"),
    Key("heartbeat", "timeout", DURATION, "2s", "timeout of one probe request"),
    Key("heartbeat", "kubelet_healthz_url", KUBELET_URL, DEFAULT_KUBELET_HEALTHZ_URL,
        "probes stop when the kubelet does not answer here; off on a node with no kubelet"),
    Key("heartbeat", "kubelet_grace_period", DURATION, "40s",
        "probes stop when the kubelet has not been healthy for this long"),

    Key("pool_cache", "informer_lease_renew", DURATION, "10s",
        "renew period of the informer sync lease"),
    Key("pool_cache", "stale_timeout", DURATION, "30s",
        "the pool cache is stale when the sync lease was not renewed for this long"),
    Key("pool_cache", "upload_resources", UPLOAD_RESOURCES, "kubelet/pods/v1, kubelet/nodes/v1",
        "component/resource/version[/group], comma-separated"),
    Key("pool_cache", "local_cache_dir", PATH, "/etc/kubernetes/cache",
        "the node's yurthub disk cache"),

    Key("server", "listen", LISTEN, "127.0.0.1:10267",
        "/ /healthz /readyz /status /pool /metrics"),

    Key("log", "level", LOG_LEVEL, "info",
        "events below this level are dropped, Twisted's own included; the status "
        "pages' access log is at debug"),
    Key("log", "format", LOG_FORMAT, "text",
        "text lines, or json: one JSON object per line"),
)

SECTIONS = tuple(dict.fromkeys(key.section for key in SCHEMA))

# Keys an earlier agent read that this one accepts and ignores, (section, key) -> why:
# an ini written for that agent still starts, and says once that the key does nothing.
RETIRED_KEYS = {
    ("heartbeat", "max_clock_skew"):
        "the pool leader stamps forwarded heartbeats with its own clock and compares no "
        "node's renewTime with it",
}


# ---------------------------------------------------------------------------------------
# Typed, immutable results. Field names equal the schema's key names.

@dataclass(frozen=True)
class NodeConfig:
    name: str
    pool: str
    kubelet_client_cert: str


@dataclass(frozen=True)
class CloudConfig:
    servers: tuple
    ca_file: Optional[str]
    cert_file: Optional[str]
    key_file: Optional[str]
    token_file: Optional[str]
    kubeconfig: Optional[str]
    insecure: bool


@dataclass(frozen=True)
class CoordinatorConfig:
    enabled: bool
    server: tuple
    storage: tuple
    storage_prefix: str
    pki_dir: str
    secret_namespace: str
    insecure: bool


@dataclass(frozen=True)
class LeaderElectionSection:
    """``[leader_election]`` as read: the election's lease and timings, whose rule is
    ``check_election_timing``'s, and the hub elector's ``check_interval``."""

    lease_namespace: str
    lease_name: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    check_interval: float

    def election(self, identity: str) -> LeaderElectionConfig:
        """The election's configuration for the agent named ``identity``; a leader
        releases the lease when it stops."""
        return LeaderElectionConfig(
            lease_namespace=self.lease_namespace, lease_name=self.lease_name,
            identity=identity, lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline, retry_period=self.retry_period,
            release_on_cancel=True)


@dataclass(frozen=True)
class HeartbeatConfig:
    interval: float
    failed_retry: int
    healthy_threshold: int
    timeout: float
    kubelet_healthz_url: Optional[str]
    kubelet_grace_period: float


@dataclass(frozen=True)
class PoolCacheConfig:
    informer_lease_renew: float
    stale_timeout: float
    upload_resources: tuple
    local_cache_dir: str


@dataclass(frozen=True)
class ServerConfig:
    listen: ListenAddress


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"
    format: str = "text"


_SECTION_CLASSES = {
    "node": NodeConfig,
    "cloud": CloudConfig,
    "coordinator": CoordinatorConfig,
    "leader_election": LeaderElectionSection,
    "heartbeat": HeartbeatConfig,
    "pool_cache": PoolCacheConfig,
    "server": ServerConfig,
    "log": LogConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole agent configuration. ``source`` names the file it came from."""

    node: NodeConfig
    cloud: CloudConfig
    coordinator: CoordinatorConfig
    leader_election: LeaderElectionSection
    heartbeat: HeartbeatConfig
    pool_cache: PoolCacheConfig
    server: ServerConfig
    log: LogConfig = field(default_factory=LogConfig)
    source: str = field(default="<config>", compare=False)


# ---------------------------------------------------------------------------------------
# Parsing.

# configparser copies the keys of its default section into every section, which would
# hide typos there; use a name no header can have so "[DEFAULT]" is just an unknown section.
_NO_DEFAULT_SECTION = "\0"


def _new_parser():
    return configparser.ConfigParser(
        inline_comment_prefixes=(";",),
        comment_prefixes=("#", ";"),
        interpolation=None,
        strict=True,
        empty_lines_in_values=False,
        default_section=_NO_DEFAULT_SECTION,
    )


def _read_ini(text, source_name):
    parser = _new_parser()
    try:
        parser.read_string(text, source=source_name)
    except configparser.DuplicateSectionError as error:
        raise ConfigError(source_name, f"section appears twice (line {error.lineno})",
                          section=error.section) from None
    except configparser.DuplicateOptionError as error:
        raise ConfigError(source_name, f"key appears twice (line {error.lineno})",
                          section=error.section, key=error.option) from None
    except configparser.MissingSectionHeaderError as error:
        raise ConfigError(
            source_name,
            f"line {error.lineno}: {error.line.strip()!r} is outside any section "
            f"(start with one of {', '.join('[%s]' % s for s in SECTIONS)})",
        ) from None
    except configparser.ParsingError as error:
        lineno, line = error.errors[0]
        raise ConfigError(source_name,
                          f"line {lineno}: cannot parse {line.strip()!r} (expected key = value)"
                          ) from None
    return parser


def _suggestion(word, candidates):
    close = difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_config(text: str, source_name: str = "<config>") -> "Config":
    """Parse ini ``text``; ``source_name`` is the file name used in error messages."""
    parser = _read_ini(text, source_name)
    schema_keys = {(key.section, key.name): key for key in SCHEMA}

    retired = []
    for section in parser.sections():
        if section not in SECTIONS:
            raise ConfigError(
                source_name,
                f"unknown section{_suggestion(section, SECTIONS)}; known sections: "
                f"{', '.join(SECTIONS)}",
                section=section,
            )
        known = [key.name for key in SCHEMA if key.section == section]
        for name, raw in parser.items(section):
            if (section, name) in RETIRED_KEYS:
                retired.append((section, name))
                continue
            if (section, name) not in schema_keys:
                raise ConfigError(
                    source_name,
                    f"unknown key{_suggestion(name, known)}; keys of [{section}]: "
                    f"{', '.join(known)}",
                    section=section, key=name, value=raw,
                )

    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    raw_values: dict[tuple[str, str], str] = {}
    for key in SCHEMA:
        raw = parser.get(key.section, key.name, fallback=None)
        if raw is None or (key.required and not raw.strip()):
            if key.required:
                raise ConfigError(source_name, "required key is missing",
                                  section=key.section, key=key.name)
            raw = key.default
        raw_values[(key.section, key.name)] = raw
        try:
            values[key.section][key.name] = key.type.parse(raw)
        except _BadValue as error:
            raise ConfigError(source_name, str(error),
                              section=key.section, key=key.name, value=raw) from None

    config = Config(
        source=source_name,
        **{section: _SECTION_CLASSES[section](**values[section]) for section in SECTIONS},
    )
    _check_rules(config, raw_values, source_name)
    for section, name in retired:
        log.warn("{source}: [{section}] {key} is retired and ignored: {why}",
                 source=source_name, section=section, key=name,
                 why=RETIRED_KEYS[(section, name)])
    return config


def load_config(path: str) -> "Config":
    """Read and parse the ini file at ``path``; any problem is a one-line ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ConfigError(str(path), f"cannot read config: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(str(path), f"cannot read config: not UTF-8 text ({error.reason})") from None
    return parse_config(text, str(path))


def _check_rules(config, raw, source):
    """Rules that involve more than one key."""

    def fail(section, name, reason):
        raise ConfigError(source, reason, section=section, key=name, value=raw[(section, name)])

    cloud = config.cloud
    if not cloud.insecure:
        for url in cloud.servers:
            if urlsplit(url).scheme != "https":
                fail("cloud", "servers",
                     f"http:// ({url}) is only allowed with insecure = true; use https://")
    if cloud.kubeconfig is not None:
        combined = [name for name in ("ca_file", "cert_file", "key_file", "token_file")
                    if getattr(cloud, name) is not None]
        if combined:
            fail("cloud", "kubeconfig",
                 f"cannot be combined with {', '.join(combined)}: kubeconfig replaces "
                 "ca_file, cert_file, key_file and token_file")
    if (cloud.cert_file is None) != (cloud.key_file is None):
        missing, present = ("key_file", "cert_file") if cloud.key_file is None \
            else ("cert_file", "key_file")
        fail("cloud", present, f"needs {missing} as well")
    if cloud.token_file is not None and cloud.cert_file is not None:
        fail("cloud", "token_file",
             "cannot be combined with cert_file/key_file: use a client certificate or a token")

    coordinator = config.coordinator
    if coordinator.enabled and not config.node.pool:
        raise ConfigError(source, "required when [coordinator] enabled = true: the leader "
                          "forwards heartbeats only of Nodes labelled "
                          f"{NODE_POOL_LABEL}=<pool>", section="node", key="pool")
    if not coordinator.insecure:
        for name in ("server", "storage"):
            for url in getattr(coordinator, name):
                if urlsplit(url).scheme != "https":
                    fail("coordinator", name,
                         f"http:// ({url}) is only allowed with insecure = true; use https://")

    overlap = _pool_scoped_upload(config)
    if overlap is not None:
        fail("pool_cache", "upload_resources", overlap)

    election = config.leader_election
    try:
        check_election_timing(election.lease_duration, election.renew_deadline,
                              election.retry_period, show=format_duration)
    except LeaderElectionConfigError as error:
        fail("leader_election", error.field, error.reason)


def _pool_scoped_upload(config: "Config") -> Optional[str]:
    """Why an entry of ``upload_resources`` may not be uploaded, or None.

    An uploaded resource must not share its pool store keys with a pool-scoped one:
    the pool leader owns every key under a pool-scoped prefix, and a new leader's
    rebuild adopts whatever is there that its own key cache does not record for
    another component, so the other nodes' uploads there would be deleted by its
    pool sync. A key names a resource by kube-apiserver's storage path only (neither
    its version nor, for most resources, its group), so that path is compared. Only
    the default pool-scoped resources are known at start; the ConfigMap's entries
    come from the cloud later."""
    prefix = normalize_prefix(config.coordinator.storage_prefix)
    for upload in config.pool_cache.upload_resources:
        path = resource_prefix(upload.group, upload.resource)
        sharing = [gvr for gvr in DEFAULT_POOL_SCOPE_RESOURCES
                   if resource_prefix(gvr.group, gvr.resource) == path]
        if sharing:
            # The same resource when it is pool-scoped, else one stored in its place.
            same = [gvr for gvr in sharing
                    if (gvr.group, gvr.version) == (upload.group, upload.version)]
            gvr = (same or sharing)[0]
            return (f"{upload} overlaps the pool-scoped resource {describe(gvr)} (pool store "
                    f"keys {prefix}/{path}/): the pool leader mirrors it there from the "
                    "cloud, and a new leader's rebuild would delete the other nodes' "
                    "uploads of it; remove it from upload_resources")
    return None


# ---------------------------------------------------------------------------------------
# Rendering: config objects back to ini text (defaults file, docs, round trips).

def render_config(config: "Config") -> str:
    """Ini text that ``parse_config`` reads back into an equal ``Config``."""
    lines: list[str] = []
    for section in SECTIONS:
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        section_value = getattr(config, section)
        for key in SCHEMA:
            if key.section == section:
                text = key.type.render(getattr(section_value, key.name))
                lines.append(f"{key.name} = {text}".rstrip())
    return "\n".join(lines) + "\n"


def describe_schema() -> str:
    """The operator reference: one line per key with section, key, type, default, help."""
    rows = []
    for key in SCHEMA:
        default = "(required)" if key.required else (key.default or "(empty)")
        rows.append(f"[{key.section}] {key.name} ({key.type.name}; default {default}): {key.help}")
    return "\n".join(rows) + "\n"


def section_fields(section: str) -> list[str]:

    """Field names of a section's dataclass, in schema order (used by tests and docs)."""
    return [f.name for f in fields(_SECTION_CLASSES[section])]
