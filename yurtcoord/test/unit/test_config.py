"""Tests for yurtcoord.agent.config: value types, defaults, validation and one-line errors."""

import dataclasses
import io
import os
import sys

from twisted.logger import Logger, LogLevel, formatEvent
from twisted.trial import unittest

from yurtcoord.agent import config as config_module
from yurtcoord.agent.config import (
    SCHEMA,
    SECTIONS,
    Config,
    ConfigError,
    ListenAddress,
    UploadResource,
    describe_schema,
    format_duration,
    load_config,
    parse_config,
    parse_duration,
    render_config,
    section_fields,
)
from yurtcoord.testing.paths import REPO
from twisted.plugins.yurtcoord_plugin import Options

SOURCE = "/etc/yurtcoord/yurtcoord.ini"
MINIMAL = """\
[node]
name = edge-1
pool = pool-a

[cloud]
servers = https://10.0.0.1:6443
"""
EXAMPLE_INI = os.path.join(REPO, "etc", "yurtcoord.ini")


def with_section(section, body, base=MINIMAL):
    """``base`` plus ``[section]`` with ``body``, merged when the section exists."""
    header = f"[{section}]\n"
    if header in base:
        return base.replace(header, header + body + "\n", 1)
    return f"{base}\n{header}{body}\n"


class ConfigErrorAssertions:
    def assertConfigError(self, text, section, key, value, reason_part):
        """Parsing ``text`` fails with a one-line message naming file, section, key, value."""
        error = self.assertRaises(ConfigError, parse_config, text, SOURCE)
        message = str(error)
        self.assertNotIn("\n", message)
        self.assertTrue(message.startswith(f"{SOURCE}: [{section}] {key}"), message)
        if value is not None:
            self.assertIn(f"= {value!r}", message)
        self.assertIn(reason_part, message)
        self.assertEqual((error.section, error.key), (section, key))
        return message


class DurationTests(unittest.TestCase):
    def test_units_and_combinations(self):
        self.assertEqual(parse_duration("500ms"), 0.5)
        self.assertEqual(parse_duration("15s"), 15.0)
        self.assertEqual(parse_duration("2m"), 120.0)
        self.assertEqual(parse_duration("1h"), 3600.0)
        self.assertEqual(parse_duration("1m30s"), 90.0)
        self.assertEqual(parse_duration("1h2m3s4ms"), 3723.004)
        self.assertEqual(parse_duration("1.5s"), 1.5)

    def test_rejects_non_durations(self):
        for text in ("ten", "15", "", "s", "15 s", "-1s", "1d", "1s5", "1e3s"):
            self.assertRaises(ValueError, parse_duration, text)

    def test_format_reads_back(self):
        for seconds in (0.5, 15.0, 120.0, 90.0, 3723.004, 0.0001, 36000.0):
            self.assertEqual(parse_duration(format_duration(seconds)), seconds)
        self.assertEqual(format_duration(90), "1m30s")
        self.assertEqual(format_duration(0.5), "500ms")


class ParseValuesTests(unittest.TestCase):
    def test_defaults_match_the_spec(self):
        config = parse_config(MINIMAL, SOURCE)
        self.assertEqual(config.node.name, "edge-1")
        self.assertEqual(config.node.pool, "pool-a")
        self.assertEqual(config.cloud.servers, ("https://10.0.0.1:6443",))
        self.assertEqual(
            (config.cloud.ca_file, config.cloud.cert_file, config.cloud.key_file,
             config.cloud.token_file, config.cloud.kubeconfig, config.cloud.insecure),
            (None, None, None, None, None, False))
        coordinator = config.coordinator
        self.assertEqual(coordinator.enabled, True)
        self.assertEqual(coordinator.server, ("https://yurt-coordinator-apiserver:443",))
        self.assertEqual(coordinator.storage, ("https://yurt-coordinator-etcd:2379",))
        self.assertEqual(coordinator.storage_prefix, "/registry")
        self.assertEqual(coordinator.pki_dir, "/var/lib/yurtcoord/pki")
        self.assertEqual(coordinator.secret_namespace, "kube-system")
        self.assertEqual(coordinator.insecure, False)
        election = config.leader_election
        self.assertEqual(
            (election.lease_namespace, election.lease_name, election.lease_duration,
             election.renew_deadline, election.retry_period, election.check_interval),
            ("kube-system", "yurthub", 15.0, 10.0, 2.0, 5.0))
        heartbeat = config.heartbeat
        self.assertEqual(
            (heartbeat.interval, heartbeat.failed_retry, heartbeat.healthy_threshold,
             heartbeat.timeout, heartbeat.kubelet_healthz_url, heartbeat.kubelet_grace_period),
            (10.0, 3, 2, 2.0, "http://127.0.0.1:10248/healthz", 40.0))
        pool_cache = config.pool_cache
        self.assertEqual(pool_cache.informer_lease_renew, 10.0)
        self.assertEqual(pool_cache.stale_timeout, 30.0)
        self.assertEqual(pool_cache.upload_resources, (
            UploadResource("kubelet", "pods", "v1", ""),
            UploadResource("kubelet", "nodes", "v1", "")))
        self.assertEqual(pool_cache.local_cache_dir, "/etc/kubernetes/cache")
        self.assertEqual(config.server.listen, ListenAddress("127.0.0.1", 10267))

    def test_every_value_type(self):
        text = """\
[node]
name = edge-7.example        ; a comment after the value
pool = pool-b
[cloud]
servers = https://a:6443 ,http://b:8080/,   https://c
token_file = /run/token
insecure = TRUE
[coordinator]
enabled = false
storage_prefix = /custom/
insecure = true
server = http://127.0.0.1:8001
storage = http://127.0.0.1:2379
[leader_election]
lease_duration = 1m30s
renew_deadline = 1m
retry_period = 500ms
[heartbeat]
failed_retry = 7
kubelet_healthz_url = http://127.0.0.1:10248/healthz
# a whole-line comment
; another one
[pool_cache]
upload_resources = kubelet/pods/v1, calico/networkpolicies/v1beta1/networking.k8s.io
[server]
listen = [::1]:0
"""
        config = parse_config(text, SOURCE)
        self.assertEqual(config.node, config_module.NodeConfig(
            "edge-7.example", "pool-b", "/var/lib/kubelet/pki/kubelet-client-current.pem"))
        self.assertEqual(config.cloud.servers,
                         ("https://a:6443", "http://b:8080", "https://c"))
        self.assertEqual(config.cloud.token_file, "/run/token")
        self.assertIs(config.cloud.insecure, True)
        self.assertIs(config.coordinator.enabled, False)
        self.assertEqual(config.coordinator.storage_prefix, "/custom")
        self.assertEqual(config.leader_election.lease_duration, 90.0)
        self.assertEqual(config.leader_election.retry_period, 0.5)
        self.assertEqual(config.heartbeat.failed_retry, 7)
        self.assertEqual(config.heartbeat.kubelet_healthz_url, "http://127.0.0.1:10248/healthz")
        self.assertEqual(config.pool_cache.upload_resources[1], UploadResource(
            "calico", "networkpolicies", "v1beta1", "networking.k8s.io"))
        self.assertEqual(config.pool_cache.upload_resources[1].cache_dir_name,
                         "networkpolicies.v1beta1.networking.k8s.io")
        self.assertEqual(config.pool_cache.upload_resources[0].cache_dir_name, "pods.v1.core")
        self.assertEqual(config.server.listen, ListenAddress("::1", 0))
        self.assertEqual(config.server.listen.url(4321), "http://[::1]:4321")

    def test_empty_upload_resources_is_an_empty_tuple(self):
        config = parse_config(with_section("pool_cache", "upload_resources ="), SOURCE)
        self.assertEqual(config.pool_cache.upload_resources, ())

    def test_kubelet_check_is_on_by_default_and_off_turns_it_off(self):
        default = parse_config(MINIMAL, SOURCE).heartbeat.kubelet_healthz_url
        self.assertEqual(default, "http://127.0.0.1:10248/healthz")
        for spelling in ("off", "OFF", " off "):
            config = parse_config(
                with_section("heartbeat", f"kubelet_healthz_url = {spelling}"), SOURCE)
            self.assertIsNone(config.heartbeat.kubelet_healthz_url, spelling)
        config = parse_config(with_section(
            "heartbeat", "kubelet_healthz_url = https://10.0.0.5:10250/healthz/"), SOURCE)
        self.assertEqual(config.heartbeat.kubelet_healthz_url,
                         "https://10.0.0.5:10250/healthz/")

    def test_config_is_immutable(self):
        config = parse_config(MINIMAL, SOURCE)
        with self.assertRaises(AttributeError):
            config.node.name = "other"
        with self.assertRaises(AttributeError):
            config.heartbeat = None

    def test_cert_pair_and_kubeconfig_are_accepted_alone(self):
        pair = parse_config(with_section("cloud", "cert_file = /c.crt\nkey_file = /c.key\n"
                                         "ca_file = /ca.crt"), SOURCE)
        self.assertEqual((pair.cloud.cert_file, pair.cloud.key_file, pair.cloud.ca_file),
                         ("/c.crt", "/c.key", "/ca.crt"))
        kubeconfig = parse_config(with_section("cloud", "kubeconfig = /k.conf"), SOURCE)
        self.assertEqual(kubeconfig.cloud.kubeconfig, "/k.conf")


class RoundTripTests(unittest.TestCase):
    def test_defaults_round_trip(self):
        config = parse_config(MINIMAL, SOURCE)
        rendered = render_config(config)
        self.assertEqual(parse_config(rendered, "rendered"), config)
        for key in SCHEMA:
            self.assertIn(f"\n{key.name} =", "\n" + rendered)

    def test_non_default_values_round_trip(self):
        text = with_section("leader_election", "lease_duration = 1m30s\nretry_period = 750ms")
        text = with_section("pool_cache", "upload_resources = a/b/v1/x.io, c/d/v2beta3", text)
        text = with_section("server", "listen = [::]:9000", text)
        config = parse_config(text, SOURCE)
        self.assertEqual(parse_config(render_config(config), "rendered"), config)

    def test_kubelet_check_off_round_trips(self):
        config = parse_config(with_section("heartbeat", "kubelet_healthz_url = off"), SOURCE)
        rendered = render_config(config)
        self.assertIn("\nkubelet_healthz_url = off\n", rendered)
        self.assertEqual(parse_config(rendered, "rendered"), config)

    def test_schema_and_dataclasses_agree(self):
        for section in SECTIONS:
            self.assertEqual(section_fields(section),
                             [key.name for key in SCHEMA if key.section == section])
        self.assertEqual([f for f in Config.__dataclass_fields__ if f != "source"],
                         list(SECTIONS))

    def test_describe_schema_lists_every_key(self):
        description = describe_schema()
        for key in SCHEMA:
            self.assertIn(f"[{key.section}] {key.name} ", description)
        self.assertIn("[node] name (Kubernetes name; default (required))", description)


class ExampleFileTests(unittest.TestCase):
    def test_example_validates_and_sets_every_key(self):
        config = load_config(EXAMPLE_INI)
        self.assertEqual(config.node.name, "edge-1")
        self.assertEqual(config.cloud.servers, ("https://127.0.0.1:6443",))
        with open(EXAMPLE_INI) as handle:
            parser = config_module._new_parser()
            parser.read_file(handle)
        written = {(section, key) for section in parser.sections()
                   for key in parser.options(section)}
        self.assertEqual(written, {(key.section, key.name) for key in SCHEMA})

    def test_example_values_are_the_defaults_except_identity(self):
        example = load_config(EXAMPLE_INI)
        defaults = parse_config(MINIMAL, SOURCE)
        # The example's peers are loopback addresses, so that it runs on a test machine.
        self.assertEqual(example.coordinator, dataclasses.replace(
            defaults.coordinator, server=("https://127.0.0.1:10443",),
            storage=("https://127.0.0.1:12379",)))
        self.assertEqual(example.leader_election, defaults.leader_election)
        self.assertEqual(example.heartbeat, defaults.heartbeat)
        self.assertEqual(example.pool_cache, defaults.pool_cache)
        self.assertEqual(example.server, defaults.server)


class ErrorTests(ConfigErrorAssertions, unittest.TestCase):
    def test_bad_duration_message(self):
        message = self.assertConfigError(
            with_section("heartbeat", "interval = ten"), "heartbeat", "interval", "ten",
            "not a duration")
        self.assertEqual(
            message,
            "/etc/yurtcoord/yurtcoord.ini: [heartbeat] interval = 'ten': "
            "not a duration (use 500ms, 15s, 2m)")

    def test_zero_duration(self):
        self.assertConfigError(with_section("heartbeat", "timeout = 0s"),
                               "heartbeat", "timeout", "0s", "longer than 0s")

    def test_bad_boolean(self):
        self.assertConfigError(with_section("cloud", "insecure = yes"),
                               "cloud", "insecure", "yes", "true or false")

    def test_bad_integer(self):
        self.assertConfigError(with_section("heartbeat", "failed_retry = three"),
                               "heartbeat", "failed_retry", "three", "whole number")
        self.assertConfigError(with_section("heartbeat", "healthy_threshold = 0"),
                               "heartbeat", "healthy_threshold", "0", "1 or more")

    def test_unknown_key_suggests_the_right_one(self):
        message = self.assertConfigError(with_section("heartbeat", "intervall = 5s"),
                                         "heartbeat", "intervall", "5s", "unknown key")
        self.assertIn("did you mean 'interval'", message)

    def test_unknown_section(self):
        error = self.assertRaises(ConfigError, parse_config, MINIMAL + "[heartbeats]\n", SOURCE)
        self.assertEqual(error.section, "heartbeats")
        self.assertIn(f"{SOURCE}: [heartbeats]: unknown section", str(error))
        self.assertIn("did you mean 'heartbeat'", str(error))

    def test_default_section_is_not_special(self):
        error = self.assertRaises(ConfigError, parse_config,
                                  MINIMAL + "[DEFAULT]\ninterval = 1s\n", SOURCE)
        self.assertEqual(error.section, "DEFAULT")

    def test_missing_required_keys(self):
        self.assertConfigError("[cloud]\nservers = https://a\n", "node", "name", None,
                               "required key is missing")
        self.assertConfigError("[node]\nname = a\n", "cloud", "servers", None,
                               "required key is missing")
        self.assertConfigError("[node]\nname =\n[cloud]\nservers = https://a\n",
                               "node", "name", None, "required key is missing")

    def test_pool_is_required_with_the_coordinator_enabled(self):
        no_pool = MINIMAL.replace("pool = pool-a\n", "")
        for text in (no_pool, MINIMAL.replace("pool = pool-a", "pool ="),
                     with_section("coordinator", "enabled = true", no_pool)):
            message = self.assertConfigError(text, "node", "pool", None,
                                             "required when [coordinator] enabled = true")
            self.assertEqual(message, (
                f"{SOURCE}: [node] pool: required when [coordinator] enabled = true: the "
                "leader forwards heartbeats only of Nodes labelled "
                "apps.openyurt.io/nodepool=<pool>"))
        config = parse_config(with_section("coordinator", "enabled = false", no_pool), SOURCE)
        self.assertEqual(config.node.pool, "")

    def test_missing_file(self):
        path = os.path.join(self.mktemp(), "absent.ini")
        error = self.assertRaises(ConfigError, load_config, path)
        self.assertEqual(str(error), f"{path}: cannot read config: No such file or directory")

    def test_syntax_errors_are_one_line(self):
        for text in ("name = edge-1\n", "[node]\nname = a\njust words\n", "[node]\n[node]\n",
                     "[node]\nname = a\nname = b\n"):
            error = self.assertRaises(ConfigError, parse_config, text, SOURCE)
            self.assertNotIn("\n", str(error))
            self.assertTrue(str(error).startswith(f"{SOURCE}: "), str(error))
            self.assertIn("line ", str(error))

    def test_bad_names(self):
        self.assertConfigError(MINIMAL.replace("pool = pool-a", "pool = Pool_A"),
                               "node", "pool", "Pool_A", "not a valid Kubernetes name")
        self.assertConfigError("[node]\nname = -edge\n[cloud]\nservers = https://a\n",
                               "node", "name", "-edge", "not a valid Kubernetes name")
        self.assertConfigError(with_section("coordinator", "secret_namespace = kube.system"),
                               "coordinator", "secret_namespace", "kube.system",
                               "not a valid namespace")

    def test_bad_urls(self):
        self.assertConfigError(with_section("cloud", "servers = 10.0.0.1:6443", base=""
                                            "[node]\nname = a\n"),
                               "cloud", "servers", "10.0.0.1:6443", "not a URL")
        self.assertConfigError("[node]\nname = a\n[cloud]\nservers = ftp://a\n",
                               "cloud", "servers", "ftp://a", "not a URL")
        self.assertConfigError("[node]\nname = a\n[cloud]\nservers = https://a:99999\n",
                               "cloud", "servers", "https://a:99999", "bad port")
        self.assertConfigError("[node]\nname = a\n[cloud]\nservers = https://a b\n",
                               "cloud", "servers", "https://a b", "not a URL")
        self.assertConfigError(with_section("heartbeat", "kubelet_healthz_url = localhost:10248"),
                               "heartbeat", "kubelet_healthz_url", "localhost:10248", "not a URL")
        self.assertConfigError("[node]\nname = a\n[cloud]\nservers = ,\n",
                               "cloud", "servers", ",", "at least one URL")

    def test_empty_kubelet_url_is_an_error_saying_what_to_write(self):
        """An empty value used to turn the check off; now the check is on by default,
        so an empty line must be neither taken as "off" nor as the default."""
        for line in ("kubelet_healthz_url =", "kubelet_healthz_url =    ; old example"):
            message = self.assertConfigError(with_section("heartbeat", line), "heartbeat",
                                             "kubelet_healthz_url", "", "empty value")
            self.assertIn("http://127.0.0.1:10248/healthz", message)
            self.assertIn(" or off ", message)

    def test_bad_kubelet_urls(self):
        for value in ("localhost:10248", "ftp://127.0.0.1/healthz", "http://:10248/healthz",
                      "http://127.0.0.1:99999/healthz", "none", "false"):
            self.assertConfigError(with_section("heartbeat", f"kubelet_healthz_url = {value}"),
                                   "heartbeat", "kubelet_healthz_url", value, "not a URL")

    def test_http_requires_insecure(self):
        self.assertConfigError("[node]\nname = a\n[cloud]\nservers = https://a, http://b\n",
                               "cloud", "servers", "https://a, http://b",
                               "only allowed with insecure = true")
        self.assertConfigError(with_section("coordinator", "storage = http://etcd:2379"),
                               "coordinator", "storage", "http://etcd:2379",
                               "only allowed with insecure = true")
        self.assertConfigError(with_section("coordinator", "server = http://api:8080"),
                               "coordinator", "server", "http://api:8080",
                               "only allowed with insecure = true")

    def test_storage_takes_several_etcd_members(self):
        config = parse_config(with_section(
            "coordinator", "storage = https://e1:2379, https://e2:2379/ ,https://e3:2379"),
            SOURCE)
        self.assertEqual(config.coordinator.storage,
                         ("https://e1:2379", "https://e2:2379", "https://e3:2379"))
        rendered = parse_config(render_config(config), SOURCE)
        self.assertEqual(rendered.coordinator.storage, config.coordinator.storage)

    def test_one_storage_url_reads_as_before(self):
        config = parse_config(with_section("coordinator", "storage = https://etcd:2379/"),
                              SOURCE)
        self.assertEqual(config.coordinator.storage, ("https://etcd:2379",))

    def test_bad_storage_member_is_named(self):
        value = "https://e1:2379, e2:2379"
        message = self.assertConfigError(with_section("coordinator", f"storage = {value}"),
                                         "coordinator", "storage", value, "not a URL")
        self.assertIn("'e2:2379' is not a URL", message)
        value = "https://e1:2379, https://e2:99999"
        message = self.assertConfigError(with_section("coordinator", f"storage = {value}"),
                                         "coordinator", "storage", value, "bad port")
        self.assertIn("'https://e2:99999'", message)
        self.assertConfigError(with_section("coordinator", "storage = ,"),
                               "coordinator", "storage", ",", "at least one URL")

    def test_duplicate_storage_member_is_refused(self):
        value = "https://e1:2379, https://e2:2379, https://e1:2379/"
        message = self.assertConfigError(with_section("coordinator", f"storage = {value}"),
                                         "coordinator", "storage", value,
                                         "names the same server as")
        self.assertIn("'https://e1:2379/' names the same server as 'https://e1:2379'", message)

    def test_storage_members_share_one_scheme(self):
        value = "http://e1:2379, https://e2:2379"
        self.assertConfigError(
            with_section("coordinator", f"storage = {value}\ninsecure = true"),
            "coordinator", "storage", value, "mixes http:// and https://")

    def test_http_storage_member_requires_insecure(self):
        value = "http://e1:2379, http://e2:2379"
        self.assertConfigError(with_section("coordinator", f"storage = {value}"),
                               "coordinator", "storage", value,
                               "only allowed with insecure = true")

    def test_several_coordinator_servers(self):
        config = parse_config(with_section(
            "coordinator", "server = https://api-1:443/, https://API-2:8443"), SOURCE)
        self.assertEqual(config.coordinator.server, ("https://api-1:443", "https://API-2:8443"))
        self.assertEqual(parse_config(render_config(config), SOURCE), config)
        one = parse_config(with_section("coordinator", "server = https://api-1:443"), SOURCE)
        self.assertEqual(one.coordinator.server, ("https://api-1:443",))

    def test_bad_coordinator_server_is_named(self):
        message = self.assertConfigError(
            with_section("coordinator", "server = https://api-1, api-2:443"),
            "coordinator", "server", "https://api-1, api-2:443", "'api-2:443' is not a URL")
        self.assertNotIn("'https://api-1' is", message)
        self.assertConfigError(with_section("coordinator", "server = https://a, https://b:0x1"),
                               "coordinator", "server", "https://a, https://b:0x1",
                               "'https://b:0x1' is not a URL: bad port")
        self.assertConfigError(with_section("coordinator", "server = ,"),
                               "coordinator", "server", ",", "at least one URL")
        self.assertConfigError(
            with_section("coordinator", "server = https://a:443, http://b:8080"),
            "coordinator", "server", "https://a:443, http://b:8080",
            "http:// (http://b:8080) is only allowed with insecure = true")

    def test_duplicate_coordinator_servers_are_refused(self):
        for value, again, first in (
                ("https://a:443, https://b, https://a:443", "https://a:443", "https://a:443"),
                ("https://a, https://A:443/", "https://A:443/", "https://a"),
                ("http://a, http://a:80", "http://a:80", "http://a")):
            self.assertConfigError(
                with_section("coordinator", f"server = {value}\ninsecure = true"),
                "coordinator", "server", value,
                f"{again!r} names the same server as {first!r}")
        # Other ports or paths are other servers.
        config = parse_config(with_section(
            "coordinator", "server = https://a, https://a:8443, https://a/b"), SOURCE)
        self.assertEqual(len(config.coordinator.server), 3)

    def test_bad_listen(self):
        for value in ("10267", "localhost", "127.0.0.1:", "::1:80", "host:70000", "a b:1"):
            self.assertConfigError(with_section("server", f"listen = {value}"),
                                   "server", "listen", value, "")

    def test_bad_upload_resources(self):
        for value, reason in (("kubelet/pods", "component/resource/version"),
                              ("kubelet/Pods/v1", "bad resource"),
                              ("kubelet/pods/1", "bad version"),
                              ("kubelet/pods/v1/Bad_Group", "bad group"),
                              ("kubelet/pods/v1/a/b", "component/resource/version")):
            self.assertConfigError(with_section("pool_cache", f"upload_resources = {value}"),
                                   "pool_cache", "upload_resources", value, reason)

    def test_uploads_of_pool_scoped_resources_are_refused(self):
        """A new leader's rebuild would delete the other nodes' uploads under a
        pool-scoped prefix: the line names the upload, the pool-scoped resource and
        the pool store keys they share (whatever the version or group that shares
        them)."""
        for value, upload, scoped, keys in (
                ("kubelet/pods/v1, kube-proxy/endpointslices/v1/discovery.k8s.io",
                 "kube-proxy/endpointslices/v1/discovery.k8s.io",
                 "endpointslices.v1.discovery.k8s.io", "/registry/endpointslices/"),
                ("coredns/endpointslices/v1beta1/discovery.k8s.io",
                 "coredns/endpointslices/v1beta1/discovery.k8s.io",
                 "endpointslices.v1beta1.discovery.k8s.io", "/registry/endpointslices/"),
                ("kubelet/endpoints/v1", "kubelet/endpoints/v1", "endpoints.v1",
                 "/registry/services/endpoints/"),
                ("kubelet/endpointslices/v2/example.com",
                 "kubelet/endpointslices/v2/example.com",
                 "endpointslices.v1.discovery.k8s.io", "/registry/endpointslices/")):
            message = self.assertConfigError(
                with_section("pool_cache", f"upload_resources = {value}"),
                "pool_cache", "upload_resources", value,
                f"{upload} overlaps the pool-scoped resource {scoped} (pool store keys {keys})")
            self.assertIn("rebuild would delete the other nodes' uploads", message)
        text = with_section("coordinator", "storage_prefix = /custom",
                            with_section("pool_cache", "upload_resources = kubelet/endpoints/v1"))
        self.assertIn("(pool store keys /custom/services/endpoints/)",
                      str(self.assertRaises(ConfigError, parse_config, text, SOURCE)))

    def test_the_documented_overlap_error_is_what_the_parser_says(self):
        value = "kubelet/pods/v1, kube-proxy/endpointslices/v1/discovery.k8s.io"
        error = self.assertRaises(ConfigError, parse_config, with_section(
            "pool_cache", f"upload_resources = {value}"), SOURCE)
        with open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8") as handle:
            self.assertIn(f"\n{error}\n", handle.read())

    def test_uploads_beside_the_pool_scoped_resources_are_accepted(self):
        value = "kubelet/pods/v1, kubelet/nodes/v1, kubelet/services/v1, x/endpointsx/v1"
        config = parse_config(with_section("pool_cache", f"upload_resources = {value}"), SOURCE)
        self.assertEqual(len(config.pool_cache.upload_resources), 4)

    def test_an_overlapping_upload_ends_the_start_with_exit_status_78(self):
        from twisted.plugins import yurtcoord_plugin

        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(with_section("pool_cache", "upload_resources = kubelet/endpoints/v1"))
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        exit_ = self.assertRaises(SystemExit, yurtcoord_plugin.Options().parseOptions,
                                  ["--config", path])
        self.assertEqual(exit_.code, 78)
        lines = stderr.getvalue().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertIn("[pool_cache] upload_resources = 'kubelet/endpoints/v1': kubelet/"
                      "endpoints/v1 overlaps the pool-scoped resource endpoints.v1", lines[0])

    def test_bad_etcd_prefix(self):
        self.assertConfigError(with_section("coordinator", "storage_prefix = registry"),
                               "coordinator", "storage_prefix", "registry", "start with '/'")

    def test_leader_election_ordering(self):
        self.assertConfigError(
            with_section("leader_election", "lease_duration = 10s\nrenew_deadline = 10s"),
            "leader_election", "renew_deadline", "10s", "shorter than lease_duration (10s)")
        self.assertConfigError(
            with_section("leader_election", "retry_period = 9s"),
            "leader_election", "retry_period", "9s", "must be shorter than renew_deadline")
        # 8s * 1.2 = 9.6s < 10s is fine; 8.5s * 1.2 = 10.2s is not.
        parse_config(with_section("leader_election", "retry_period = 8s"), SOURCE)
        self.assertConfigError(with_section("leader_election", "retry_period = 8500ms"),
                               "leader_election", "retry_period", "8500ms", "1.2")
        # The election's own rule: a zero period is refused here, not when it starts.
        self.assertConfigError(with_section("leader_election", "retry_period = 0s"),
                               "leader_election", "retry_period", "0s", "longer than 0s")

    def test_kubeconfig_excludes_the_other_credentials(self):
        for other in ("ca_file", "cert_file", "token_file"):
            body = f"kubeconfig = /k.conf\n{other} = /x"
            if other == "cert_file":
                body += "\nkey_file = /y"
            message = self.assertConfigError(with_section("cloud", body), "cloud", "kubeconfig",
                                             "/k.conf", "cannot be combined with")
            self.assertIn(other, message)

    def test_cert_and_key_come_together(self):
        self.assertConfigError(with_section("cloud", "cert_file = /c.crt"),
                               "cloud", "cert_file", "/c.crt", "needs key_file")
        self.assertConfigError(with_section("cloud", "key_file = /c.key"),
                               "cloud", "key_file", "/c.key", "needs cert_file")

    def test_token_excludes_client_cert(self):
        self.assertConfigError(
            with_section("cloud", "cert_file = /c\nkey_file = /k\ntoken_file = /t"),
            "cloud", "token_file", "/t", "cannot be combined with cert_file")

    def test_multiline_value_stays_one_line(self):
        text = with_section("heartbeat", "interval = 1s\n  more text")
        error = self.assertRaises(ConfigError, parse_config, text, SOURCE)
        self.assertNotIn("\n", str(error))
        self.assertEqual((error.section, error.key), ("heartbeat", "interval"))


class RetiredKeyTests(unittest.TestCase):
    """``[heartbeat] max_clock_skew`` is retired: a file that still sets it starts, with
    one warning line naming the key and saying it is ignored."""

    WARNING = (f"{SOURCE}: [heartbeat] max_clock_skew is retired and ignored: the pool "
               "leader stamps forwarded heartbeats with its own clock and compares no "
               "node's renewTime with it")

    def setUp(self):
        self.events = []
        self.patch(config_module, "log", Logger(observer=self.events.append))

    def warnings(self):
        return [formatEvent(e) for e in self.events if e["log_level"] == LogLevel.warn]

    def test_a_file_that_sets_it_parses_as_one_without_it_and_warns_once(self):
        config = parse_config(with_section("heartbeat", "max_clock_skew = 5s"), SOURCE)
        self.assertEqual(self.warnings(), [self.WARNING])
        self.assertEqual(len(self.events), 1)
        self.assertEqual(config, parse_config(MINIMAL, SOURCE))
        self.assertFalse(hasattr(config.heartbeat, "max_clock_skew"))
        self.assertNotIn("max_clock_skew", render_config(config))
        self.assertEqual(len(self.events), 1)

    def test_any_value_is_accepted(self):
        for value in ("1500ms", "soon", ""):
            parse_config(with_section("heartbeat", f"max_clock_skew = {value}"), SOURCE)
        self.assertEqual(self.warnings(), [self.WARNING] * 3)

    def test_other_errors_are_still_errors_and_nothing_is_logged_for_them(self):
        text = with_section("heartbeat", "max_clock_skew = 5s\ninterval = ten")
        error = self.assertRaises(ConfigError, parse_config, text, SOURCE)
        self.assertEqual((error.section, error.key), ("heartbeat", "interval"))
        self.assertEqual(self.events, [])

    def test_a_file_without_it_logs_nothing(self):
        parse_config(MINIMAL, SOURCE)
        load_config(EXAMPLE_INI)
        self.assertEqual(self.events, [])

    def test_the_command_starts_with_a_file_that_sets_it(self):
        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(with_section("heartbeat", "max_clock_skew = 5s"))
        options = Options()
        options.parseOptions(["--config", path])
        self.assertEqual(options["loaded_config"], parse_config(MINIMAL, path))
        self.assertEqual(self.warnings(), [self.WARNING.replace(SOURCE, path)])


class LogSectionTests(ConfigErrorAssertions, unittest.TestCase):
    """``[log] level`` and ``format``: defaults, accepted values, and a bad value as one
    line naming the key and the value that ends the start with status 78."""

    def test_info_and_text_by_default(self):
        log = parse_config(MINIMAL, SOURCE).log
        self.assertEqual((log.level, log.format), ("info", "text"))

    def test_every_level_and_format(self):
        for level in ("debug", "info", "warn", "error", "WARN"):
            for log_format in ("text", "json"):
                log = parse_config(with_section(
                    "log", f"level = {level}\nformat = {log_format}"), SOURCE).log
                self.assertEqual((log.level, log.format), (level.lower(), log_format))

    def test_bad_values_are_one_line_naming_the_key_and_value(self):
        self.assertConfigError(with_section("log", "level = verbose"), "log", "level",
                               "verbose", "not a log level (use debug, info, warn or error)")
        self.assertConfigError(with_section("log", "level = warning"), "log", "level",
                               "warning", "not a log level")
        self.assertConfigError(with_section("log", "format = xml"), "log", "format", "xml",
                               "not a log format (use text or json)")

    def test_a_bad_level_ends_the_start_with_exit_status_78(self):
        from twisted.plugins import yurtcoord_plugin

        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(with_section("log", "level = trace"))
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        exit_ = self.assertRaises(SystemExit, yurtcoord_plugin.Options().parseOptions,
                                  ["--config", path])
        self.assertEqual(exit_.code, 78)
        self.assertEqual(stderr.getvalue().splitlines(), [
            f"{path}: [log] level = 'trace': not a log level (use debug, info, warn or error)"])


class URLCredentialsTests(ConfigErrorAssertions, unittest.TestCase):
    """Credentials inside a server URL (``https://admin:S3cret@host``) are refused in
    every URL key, and the one line saying so masks them: they would otherwise show on
    ``/status``, in metric labels and in log lines."""

    SECRET = "admin:S3cret@"

    def assertRefusedMasked(self, text, section, key, masked_value):
        message = self.assertConfigError(text, section, key, masked_value,
                                         "a URL with credentials (user:password@)")
        self.assertNotIn("S3cret", message)
        self.assertNotIn("admin", message)
        return message

    def test_every_server_key_refuses_credentials_and_masks_them(self):
        self.assertRefusedMasked(
            MINIMAL.replace("https://10.0.0.1", f"https://{self.SECRET}10.0.0.1"),
            "cloud", "servers", "https://***@10.0.0.1:6443")
        self.assertRefusedMasked(
            with_section("coordinator", f"server = https://a:443, https://{self.SECRET}b:443"),
            "coordinator", "server", "https://a:443, https://***@b:443")
        self.assertRefusedMasked(
            with_section("coordinator", f"storage = https://{self.SECRET}etcd:2379"),
            "coordinator", "storage", "https://***@etcd:2379")
        self.assertRefusedMasked(
            with_section("heartbeat", f"kubelet_healthz_url = http://{self.SECRET}"
                                      "127.0.0.1:10248/healthz"),
            "heartbeat", "kubelet_healthz_url", "http://***@127.0.0.1:10248/healthz")

    def test_a_user_name_alone_is_refused_too(self):
        self.assertConfigError(MINIMAL.replace("https://10.0.0.1", "https://admin@10.0.0.1"),
                               "cloud", "servers", "https://***@10.0.0.1:6443",
                               "a URL with credentials")

    def test_the_start_ends_with_exit_status_78_and_one_masked_line(self):
        from twisted.plugins import yurtcoord_plugin

        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(MINIMAL.replace("https://10.0.0.1", f"https://{self.SECRET}10.0.0.1"))
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        exit_ = self.assertRaises(SystemExit, yurtcoord_plugin.Options().parseOptions,
                                  ["--config", path])
        self.assertEqual(exit_.code, 78)
        lines = stderr.getvalue().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith(
            f"{path}: [cloud] servers = 'https://***@10.0.0.1:6443': a URL with credentials"),
            lines[0])
        self.assertNotIn("S3cret", lines[0])
