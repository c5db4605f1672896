"""``yurtcoordctl pki``: what it is asked (every bad value a one-line error naming it,
exit 2), the names its server certificates carry, the files it writes and their modes,
and a kept CA. That the certificates work with a real etcd and the API test server
under mutual TLS is the integration tier's ``test_poolpki``.
"""

import io
import ipaddress
import os
import stat

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.trial import unittest

from yurtcoord.agent import ctl, poolpki


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = ctl.run(["pki", *argv], out, err)
    return status, out.getvalue(), err.getvalue()


def load(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (names.get_values_for_type(x509.DNSName),
            [str(ip) for ip in names.get_values_for_type(x509.IPAddress)])


class NamesTests(unittest.TestCase):
    """The names the server certificates must carry: the Services' and the members'."""

    def test_a_service_is_named_as_a_pod_resolves_it(self):
        self.assertEqual(poolpki.service_names("yurt-coordinator-apiserver", "yurt-pool-a"), [
            "yurt-coordinator-apiserver", "yurt-coordinator-apiserver.yurt-pool-a",
            "yurt-coordinator-apiserver.yurt-pool-a.svc",
            "yurt-coordinator-apiserver.yurt-pool-a.svc.cluster.local"])

    def test_each_etcd_member_has_its_stable_name_under_the_peer_service(self):
        names = poolpki.etcd_member_names("ns", members=3, domain="edge.example")
        self.assertEqual(len(names), 12)
        self.assertIn("yurt-coordinator-etcd-0.yurt-coordinator-etcd-peers", names)
        self.assertIn("yurt-coordinator-etcd-2.yurt-coordinator-etcd-peers.ns.svc.edge.example",
                      names)
        self.assertNotIn("yurt-coordinator-etcd-3.yurt-coordinator-etcd-peers", names)
        server = poolpki.etcd_server_names("ns")
        self.assertIn("yurt-coordinator-etcd.ns.svc", server)
        self.assertTrue(set(poolpki.etcd_member_names("ns")) <= set(server))

    def test_an_extra_san_is_an_address_or_a_dns_name(self):
        self.assertEqual(poolpki.parse_san("127.0.0.1"),
                         x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        self.assertEqual(poolpki.parse_san("::1"), x509.IPAddress(ipaddress.ip_address("::1")))
        self.assertEqual(poolpki.parse_san("localhost"), x509.DNSName("localhost"))
        for bad in ("", "a b", "-x.example", "x..example", "*"):
            with self.assertRaisesRegex(poolpki.PKIError, "^--extra-san "):
                poolpki.parse_san(bad)


class ArgumentTests(unittest.TestCase):
    """Bad input: one line naming what is at fault, exit status 2, nothing written."""

    def check_refused(self, argv, expected):
        status, out, err = run(*argv)
        self.assertEqual(status, ctl.BAD_USAGE)
        self.assertEqual(out, "")
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(expected, err)
        return err

    def test_each_bad_value_is_named(self):
        out = self.mktemp()
        cases = [
            (["--pool", "Pool_A", "--out", out], "--pool 'Pool_A': not a DNS-1123 label"),
            (["--pool", "a" * 54, "--out", out], "at most 53 characters"),
            (["--pool", "a", "--out", out, "--namespace", "x" * 64], "--namespace 'xxx"),
            (["--pool", "a", "--out", out, "--node", "Edge_1"], "--node 'Edge_1'"),
            (["--pool", "a", "--out", out, "--extra-san", "not a name"],
             "--extra-san 'not a name'"),
            (["--pool", "a", "--out", out, "--cluster-domain", "bad domain"],
             "--cluster-domain 'bad domain'"),
            (["--pool", "a", "--out", out, "--client-ca", "/no/such/ca.crt"],
             "--client-ca /no/such/ca.crt: No such file or directory"),
            (["--out", out], "the following arguments are required: --pool"),
            (["--pool", "a"], "the following arguments are required: --out"),
            (["--pool", "a", "--out", out, "--bogus"], "unrecognized arguments: --bogus"),
        ]
        for argv, expected in cases:
            self.check_refused(argv, expected)
        self.assertFalse(os.path.exists(out))

    def test_an_out_path_that_is_a_file_is_refused(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("x")
        self.check_refused(["--pool", "a", "--out", path],
                           f"--out {path}: exists and is not a directory")

    def test_an_out_path_below_a_file_is_named_with_why(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("x")
        below = os.path.join(path, "pki")
        self.check_refused(["--pool", "a", "--out", below], f"{path}")
        self.check_refused(["--pool", "a", "--out", below], "Not a directory")

    def test_a_kept_ca_that_does_not_parse_is_named(self):
        out = self.mktemp()
        os.makedirs(out)
        with open(os.path.join(out, "ca.crt"), "w") as f:
            f.write("not a certificate\n")
        with open(os.path.join(out, "ca.key"), "w") as f:
            f.write("not a key\n")
        self.check_refused(["--pool", "a", "--out", out],
                           f"CA certificate {os.path.join(out, 'ca.crt')}: no PEM certificate")

    def test_a_kept_ca_whose_key_is_another_is_refused_until_rotate(self):
        first, second = self.mktemp(), self.mktemp()
        self.assertEqual(run("--pool", "a", "--out", first)[0], 0)
        self.assertEqual(run("--pool", "a", "--out", second)[0], 0)
        os.replace(os.path.join(second, "ca.key"), os.path.join(first, "ca.key"))
        self.check_refused(["--pool", "a", "--out", first], "does not match")
        status, out, _ = run("--pool", "a", "--out", first, "--rotate")
        self.assertEqual(status, 0)
        self.assertIn("new pool CA", out)

    def test_pki_is_listed_in_the_help(self):
        out = io.StringIO()
        self.assertEqual(ctl.run(["--help"], out, io.StringIO()), 0)
        self.assertIn("pki", out.getvalue())
        out = io.StringIO()
        self.assertEqual(ctl.run(["pki", "--help"], out, io.StringIO()), 0)
        for option in ("--pool", "--out", "--node", "--extra-san", "--rotate", "--client-ca"):
            self.assertIn(option, out.getvalue())


class FilesTests(unittest.TestCase):
    """What a run writes."""

    def setUp(self):
        self.out = os.path.abspath(self.mktemp())
        status, self.printed, err = run("--pool", "west", "--out", self.out,
                                        "--node", "edge-1", "--extra-san", "127.0.0.1",
                                        "--extra-san", "localhost")
        self.assertEqual((status, err), (0, ""))

    def path(self, name):
        return os.path.join(self.out, name)

    def test_keys_are_readable_by_the_owner_only(self):
        keys = [name for name in os.listdir(self.out) if name.endswith(".key")]
        self.assertEqual(len(keys), 9, keys)
        for name in keys + ["secrets.yaml", "admin.kubeconfig", os.path.join("nodes", "edge-1.pem")]:
            self.assertEqual(stat.S_IMODE(os.stat(self.path(name)).st_mode), 0o600, name)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("ca.crt")).st_mode), 0o644)
        self.assertEqual([n for n in os.listdir(self.out) if n.endswith(".tmp")], [])

    def test_server_certificates_name_the_services_and_the_extra_names(self):
        ns = "yurt-pool-west"
        apiserver = load(self.path("apiserver.crt"))
        dns, ips = sans(apiserver)
        self.assertEqual(dns, poolpki.apiserver_names(ns) + ["localhost"])
        self.assertEqual(ips, ["127.0.0.1"])
        dns, _ = sans(load(self.path("etcd-server.crt")))
        self.assertEqual(dns, poolpki.etcd_server_names(ns) + ["localhost"])
        dns, _ = sans(load(self.path("etcd-peer.crt")))
        self.assertEqual(dns, poolpki.etcd_member_names(ns) + ["localhost"])
        usages = apiserver.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(usages), [ExtendedKeyUsageOID.SERVER_AUTH])

    def test_client_certificates_name_who_they_are(self):
        node = load(self.path(os.path.join("nodes", "edge-1.pem")))
        subject = node.subject
        self.assertEqual(subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
                         "system:node:edge-1")
        self.assertEqual(subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value,
                         "system:nodes")
        with open(self.path(os.path.join("nodes", "edge-1.pem")), "rb") as f:
            self.assertIn(b"PRIVATE KEY", f.read())
        hub = load(self.path("yurthub-client.crt")).subject
        self.assertEqual(hub.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value,
                         poolpki.POOL_AGENTS_GROUP)
        self.assertFalse(hub.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
                         .startswith("system:node:"))
        proxy = load(self.path("node-lease-proxy-client.crt"))
        self.assertEqual(proxy.subject.rfc4514_string(), f"CN={poolpki.NODE_LEASE_PROXY_CN}")
        ca = poolpki.PoolCA.load(self.path("ca.crt"), self.path("ca.key"))
        for name in ("apiserver.crt", "etcd-server.crt", "etcd-peer.crt",
                     "yurthub-client.crt", "apiserver-etcd-client.crt",
                     "node-lease-proxy-client.crt", os.path.join("nodes", "edge-1.pem")):
            self.assertTrue(ca.signed(load(self.path(name))), name)

    def test_the_secrets_carry_the_keys_the_agents_and_the_coordinator_read(self):
        with open(self.path("secrets.yaml"), encoding="utf-8") as f:
            secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(f)}
        self.assertEqual(sorted(secrets), sorted([
            "yurt-coordinator-yurthub-certs", poolpki.ETCD_SECRET, poolpki.APISERVER_SECRET]))
        self.assertEqual(sorted(secrets["yurt-coordinator-yurthub-certs"]["data"]), sorted([
            "ca.crt", "yurt-coordinator-yurthub-client.crt",
            "yurt-coordinator-yurthub-client.key", "node-lease-proxy-client.crt",
            "node-lease-proxy-client.key"]))
        for secret in secrets.values():
            self.assertEqual(secret["metadata"]["namespace"], "yurt-pool-west")
            self.assertEqual(secret["metadata"]["labels"]["apps.openyurt.io/nodepool"], "west")
        with open(self.path("kustomization.yaml"), encoding="utf-8") as f:
            self.assertEqual(yaml.safe_load(f)["resources"], ["secrets.yaml"])
        self.assertIn("yurt-pool-west", self.printed)

    def test_a_second_run_keeps_the_ca_and_rotate_replaces_it(self):
        with open(self.path("ca.crt"), "rb") as f:
            ca = f.read()
        status, printed, _ = run("--pool", "west", "--out", self.out)
        self.assertEqual(status, 0)
        self.assertIn("pool CA kept", printed)
        with open(self.path("ca.crt"), "rb") as f:
            self.assertEqual(f.read(), ca)
        kept = poolpki.PoolCA.load(self.path("ca.crt"), self.path("ca.key"))
        self.assertTrue(kept.signed(load(self.path("apiserver.crt"))))
        self.assertEqual(run("--pool", "west", "--out", self.out, "--rotate")[0], 0)
        with open(self.path("ca.crt"), "rb") as f:
            self.assertNotEqual(f.read(), ca)
        self.assertFalse(kept.signed(load(self.path("apiserver.crt"))))

    def test_client_ca_files_are_accepted_besides_the_pool_ca(self):
        other = os.path.abspath(self.mktemp())
        self.assertEqual(run("--pool", "east", "--out", other)[0], 0)
        status, _, err = run("--pool", "west", "--out", self.out,
                             "--client-ca", os.path.join(other, "ca.crt"))
        self.assertEqual((status, err), (0, ""))
        with open(self.path("client-ca.crt"), "rb") as f:
            bundle = x509.load_pem_x509_certificates(f.read())
        self.assertEqual([c.subject.rfc4514_string() for c in bundle],
                         ["CN=yurt-coordinator-ca-west", "CN=yurt-coordinator-ca-east"])
