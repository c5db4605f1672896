"""``yurtcoordctl pki``: the certificates of one pool's coordinator, and the Secrets that
carry them.

A pool's coordinator is a 3-member etcd and a kube-apiserver over it, both serving TLS
and asking every client for a certificate. One pool CA signs everything here:

==================================  =====================================================
pair (files in ``--out``)           what it is
==================================  =====================================================
``ca.crt``/``ca.key``               the pool CA; kept when it exists, unless ``--rotate``
``etcd-server``                     the etcd members' client port (each member's stable
                                    name and the client Service's)
``etcd-peer``                       the members to each other (server and client)
``apiserver``                       the coordinator apiserver (its Service's names)
``apiserver-etcd-client``           the apiserver to etcd
``yurthub-client``                  the pool's agents (group ``openyurt:yurthub``) to
                                    etcd and, for what the pool shares (the election
                                    and informer sync leases, the reads of the node
                                    leases), to the coordinator apiserver; it names no
                                    node (``yurt-coordinator-yurthub-client`` in the
                                    Secret)
``node-lease-proxy-client``         the leader to the cloud, for delegated heartbeats
``admin``                           an operator to the coordinator apiserver (group
                                    ``system:masters``), with ``admin.kubeconfig``
``service-account.key/.pub``        the apiserver's service account signing key
``nodes/<node>.pem``                with ``--node``: a node's own client certificate and
                                    key in one file, as the kubelet keeps
                                    ``kubelet-client-current.pem``
==================================  =====================================================

and ``secrets.yaml`` with ``kustomization.yaml`` beside it: the three Secrets the pool
needs in the cloud (the agents' ``yurt-coordinator-yurthub-certs`` with the keys the
agent reads, the etcd members' and the apiserver's) in the pool's namespace: add the
directory to the ``resources`` of the pool's overlay.

Server names are those of the Services of ``deploy/components/coordinator``, in the
pool's namespace (``yurt-pool-<pool>`` unless ``--namespace``): a Service's short name,
``<name>.<namespace>``, ``<name>.<namespace>.svc`` and ``.svc.<cluster domain>``, and
for each etcd member its name under the headless peer Service. Loopback names are not
in them unless asked (``--extra-san 127.0.0.1``): a test runs these very files on
loopback, a pool does not.

Every key file is written with mode 0600, atomically (temp file, rename). Leaf pairs
are issued anew on every run (new names, a new node), signed by the kept CA, so the
Secrets already applied stay valid until they are replaced.
"""

import base64
import datetime
import ipaddress
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from yurtcoord.agent.certs import CERTS_SECRET_NAME, read_pem_certificates

# Names of the pool's coordinator objects (deploy/components/coordinator): the
# certificates must name the Services the agents reach.
NAMESPACE_PREFIX = "yurt-pool-"
APISERVER_SERVICE = "yurt-coordinator-apiserver"
ETCD_SERVICE = "yurt-coordinator-etcd"
ETCD_PEER_SERVICE = "yurt-coordinator-etcd-peers"
ETCD_STATEFULSET = "yurt-coordinator-etcd"
ETCD_MEMBERS = 3
CLUSTER_DOMAIN = "cluster.local"
ETCD_SECRET = "yurt-coordinator-etcd-certs"
APISERVER_SECRET = "yurt-coordinator-apiserver-certs"

# Who the client certificates say they are. The pool's agents' pair is in the group
# the coordinator's Roles (deploy/coordinator/rbac.yaml) are bound to.
YURTHUB_ETCD_CLIENT_CN = "openyurt:yurt-coordinator:yurthub"
POOL_AGENTS_GROUP = "openyurt:yurthub"
NODE_LEASE_PROXY_CN = "openyurt:yurt-coordinator:node-lease-proxy-client"
APISERVER_ETCD_CLIENT_CN = "yurt-coordinator-apiserver-etcd-client"
ADMIN_CN = "yurt-coordinator-admin"
MASTERS_GROUP = "system:masters"
NODE_GROUP = "system:nodes"
# Where admin.kubeconfig reaches the coordinator apiserver: a port forwarded to its
# Service (`kubectl port-forward svc/yurt-coordinator-apiserver 6443:443`), checked
# against the Service's name (tls-server-name) rather than a loopback SAN.
ADMIN_SERVER = "https://127.0.0.1:6443"

CA_DAYS = 3650
LEAF_DAYS = 365

# A pool name becomes a label value and a namespace: a DNS-1123 label, short enough
# that yurt-pool-<pool> is one too.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A DNS name in a certificate: labels of letters, digits and hyphens, optionally a
# leading wildcard label.
_DNS_NAME = re.compile(r"^(\*\.)?([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")


class PKIError(Exception):
    """One line naming the input at fault (an option and its value, or a file)."""


def check_label(option: str, value: str, max_length: int = 63) -> str:
    """``value`` when it is a DNS-1123 label of at most ``max_length`` characters;
    a ``PKIError`` naming ``option`` otherwise."""
    if len(value) > max_length or not _LABEL.match(value):
        raise PKIError(f"{option} {value!r}: not a DNS-1123 label (lower-case letters, "
                       f"digits and '-', at most {max_length} characters)")
    return value


def check_node_name(value: str) -> str:
    """A node name as Kubernetes allows it (a DNS-1123 subdomain)."""
    if len(value) > 253 or not _SUBDOMAIN.match(value):
        raise PKIError(f"--node {value!r}: not a valid node name (a DNS-1123 subdomain)")
    return value


def parse_san(value: str) -> x509.GeneralName:
    """An ``--extra-san``: an IP address, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if len(value) > 253 or not _DNS_NAME.match(value):
        raise PKIError(f"--extra-san {value!r}: neither an IP address nor a DNS name")
    return x509.DNSName(value)


def service_names(service: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> list[str]:
    """Every name a pod resolves ``service`` by: its short name (through the pod's
    search path, as the agents' ini names it), with its namespace, ``.svc`` and the
    cluster domain."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{domain}"]


def etcd_member(index: int) -> str:
    """The pod (and etcd member) name of member ``index`` of the StatefulSet."""
    return f"{ETCD_STATEFULSET}-{index}"


def etcd_member_names(namespace: str, members: int = ETCD_MEMBERS,
                      domain: str = CLUSTER_DOMAIN) -> list[str]:
    """The stable names of the etcd members under the headless peer Service."""
    return [name for index in range(members)
            for name in service_names(f"{etcd_member(index)}.{ETCD_PEER_SERVICE}",
                                      namespace, domain)]


def etcd_server_names(namespace: str, members: int = ETCD_MEMBERS,
                      domain: str = CLUSTER_DOMAIN) -> list[str]:
    """The etcd server certificate's DNS names: each member and the client Service
    (a client may use either)."""
    return etcd_member_names(namespace, members, domain) + service_names(
        ETCD_SERVICE, namespace, domain)


def apiserver_names(namespace: str, domain: str = CLUSTER_DOMAIN) -> list[str]:
    """The coordinator apiserver certificate's DNS names: its Service's."""
    return service_names(APISERVER_SERVICE, namespace, domain)


@dataclass(frozen=True)
class PKIRequest:
    """What one ``yurtcoordctl pki`` run is asked for."""

    pool: str
    out: str
    namespace: str = ""
    nodes: tuple[str, ...] = ()
    extra_sans: tuple[str, ...] = ()
    rotate: bool = False
    cluster_domain: str = CLUSTER_DOMAIN
    members: int = ETCD_MEMBERS
    client_ca_files: tuple[str, ...] = field(default=())

    @property
    def pool_namespace(self) -> str:
        return self.namespace or NAMESPACE_PREFIX + self.pool

    def checked(self) -> "PKIRequest":
        """This request when every value is valid; a ``PKIError`` naming the first
        one that is not."""
        check_label("--pool", self.pool, 63 - len(NAMESPACE_PREFIX))
        check_label("--namespace", self.pool_namespace)
        if not _SUBDOMAIN.match(self.cluster_domain):
            raise PKIError(f"--cluster-domain {self.cluster_domain!r}: not a DNS name")
        for node in self.nodes:
            check_node_name(node)
        for san in self.extra_sans:
            parse_san(san)
        if not self.out:
            raise PKIError("--out: no directory given")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise PKIError(f"--out {self.out}: exists and is not a directory")
        for path in self.client_ca_files:
            read_certificates(path, "--client-ca")
        return self


# -- certificates ---------------------------------------------------------------------


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name(attrs + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca,
                         content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False,
                         encipher_only=False, decipher_only=False)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM."""

    cert: bytes
    key: bytes


class PoolCA:
    """The pool CA: a certificate and its key; signs the leaf pairs.

    Certificates are what a strict verifier (Python 3.13's ``VERIFY_X509_STRICT``, Go's
    crypto/x509) asks for: Subject and Authority Key Identifiers, critical basic
    constraints and key usage, the extended key usages of the pair's role."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def new(cls, pool: str) -> "PoolCA":
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(f"yurt-coordinator-ca-{pool}")
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (cls._builder(name, name, key.public_key(), ski, CA_DAYS)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(_usage(ca=True), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(cert, key)

    @classmethod
    def load(cls, cert_file: str, key_file: str) -> "PoolCA":
        """The CA kept in ``cert_file`` and ``key_file``; a ``PKIError`` naming the file
        that is unreadable, not PEM, or not the other's match."""
        (cert,) = read_certificates(cert_file, "CA certificate", one=True)
        try:
            with open(key_file, "rb") as f:
                key = serialization.load_pem_private_key(f.read(), None)
        except OSError as error:
            raise PKIError(f"CA key {key_file}: {error.strerror}") from None
        except (ValueError, TypeError):
            raise PKIError(f"CA key {key_file}: not an unencrypted PEM private key") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PKIError(f"CA key {key_file}: not an ECDSA key")
        public = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        if key.public_key().public_bytes(*public) != cert.public_key().public_bytes(*public):
            raise PKIError(f"CA key {key_file} does not match {cert_file} (use --rotate "
                           "for a new CA)")
        return cls(cert, key)

    @staticmethod
    def _builder(subject: x509.Name, issuer: x509.Name, public_key: Any,
                 issuer_ski: x509.SubjectKeyIdentifier, days: int) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (x509.CertificateBuilder()
                .subject_name(subject).issuer_name(issuer).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier
                               .from_issuer_subject_key_identifier(issuer_ski),
                               critical=False))

    @property
    def pem(self) -> bytes:
        return _cert_pem(self.cert)

    def issue(self, common_name: str, organizations: Sequence[str] = (), *,
              server_names: Sequence[x509.GeneralName] = (), client: bool = False,
              days: int = LEAF_DAYS) -> Pair:
        """A new pair: a server certificate when ``server_names`` are given (they are
        its SANs), a client one with ``client``, or both."""
        if not (server_names or client):
            raise ValueError(f"{common_name}: a pair is a server, a client or both")
        key = ec.generate_private_key(ec.SECP256R1())
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = (self._builder(_name(common_name, organizations), self.cert.subject,
                                 key.public_key(), ski, days)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(_usage(ca=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(server_names)),
                                            critical=False)
        return Pair(_cert_pem(builder.sign(self.key, hashes.SHA256())), _key_pem(key))

    def signed(self, cert: x509.Certificate) -> bool:
        """Whether this CA signed ``cert``."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True


def read_certificates(path: str, what: str, one: bool = False) -> list[x509.Certificate]:
    """The PEM certificates in ``path``; a ``PKIError`` naming ``what`` and the file
    when it cannot be read or holds none (or, with ``one``, several)."""
    certs = read_pem_certificates(path, what, PKIError)
    if one and len(certs) != 1:
        raise PKIError(f"{what} {path}: {len(certs)} certificates, expected one")
    return certs


def dns_names(names: Iterable[str]) -> list[x509.GeneralName]:
    return [x509.DNSName(name) for name in names]


# -- files ------------------------------------------------------------------------------


def write_atomically(path: str, data: bytes, mode: int) -> None:
    """``data`` into ``path`` with ``mode``, whole or not at all: a temp file in the
    same directory, created with ``mode`` (a key is never readable by others, not
    even for a moment), fsynced and renamed over ``path``."""
    directory = os.path.dirname(path) or "."
    fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def secret(name: str, files: dict[str, bytes], pool: str, namespace: str) -> dict[str, Any]:
    """A Secret manifest of ``files`` (key: content) in the pool's ``namespace``."""
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "yurt-coordinator",
                                    "apps.openyurt.io/nodepool": pool}},
            "type": "Opaque",
            "data": {key: base64.b64encode(value).decode("ascii")
                     for key, value in files.items()}}


@dataclass
class PKIResult:
    """What a run wrote: every file's path, and whether the CA was new."""

    ca_created: bool
    files: list[str]


def server_sans(names: Sequence[str], extra: Sequence[str]) -> list[x509.GeneralName]:
    """The SANs of a server certificate: ``names`` then the ``--extra-san`` values."""
    return dns_names(names) + [parse_san(value) for value in extra]


def create_pool_pki(request: PKIRequest) -> PKIResult:
    """Write the pool's certificates and Secrets into ``request.out`` (see the module
    doc); a ``PKIError`` when the input (or a kept CA) is at fault."""
    request = request.checked()
    out = request.out
    os.makedirs(out, mode=0o700, exist_ok=True)
    ns, domain = request.pool_namespace, request.cluster_domain
    ca_cert_file, ca_key_file = os.path.join(out, "ca.crt"), os.path.join(out, "ca.key")
    created = request.rotate or not (os.path.exists(ca_cert_file)
                                     or os.path.exists(ca_key_file))
    ca = PoolCA.new(request.pool) if created else PoolCA.load(ca_cert_file, ca_key_file)
    extra = request.extra_sans
    pairs = {
        "etcd-server": ca.issue(f"{ETCD_SERVICE}.{ns}", server_names=server_sans(
            etcd_server_names(ns, request.members, domain), extra), client=True),
        "etcd-peer": ca.issue(f"{ETCD_PEER_SERVICE}.{ns}", server_names=server_sans(
            etcd_member_names(ns, request.members, domain), extra), client=True),
        "apiserver": ca.issue(f"{APISERVER_SERVICE}.{ns}", server_names=server_sans(
            apiserver_names(ns, domain), extra)),
        "apiserver-etcd-client": ca.issue(APISERVER_ETCD_CLIENT_CN, client=True),
        "yurthub-client": ca.issue(YURTHUB_ETCD_CLIENT_CN, [POOL_AGENTS_GROUP], client=True),
        "node-lease-proxy-client": ca.issue(NODE_LEASE_PROXY_CN, client=True),
        "admin": ca.issue(ADMIN_CN, [MASTERS_GROUP], client=True),
    }
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # Client certificates the coordinator apiserver accepts: the pool CA's (test nodes,
    # --node pairs) and the CAs of --client-ca (the cluster CA that signs kubelets').
    client_ca = ca.pem + b"".join(_cert_pem(cert) for path in request.client_ca_files
                                  for cert in read_certificates(path, "--client-ca"))
    written: list[str] = []

    def put(name: str, data: bytes, mode: int = 0o644) -> None:
        path = os.path.join(out, name)
        write_atomically(path, data, mode)
        written.append(path)

    if created:
        put("ca.key", _key_pem(ca.key), 0o600)
        put("ca.crt", ca.pem)
    for name, pair in pairs.items():
        put(f"{name}.crt", pair.cert)
        put(f"{name}.key", pair.key, 0o600)
    put("service-account.key", _key_pem(sa_key), 0o600)
    put("service-account.pub", sa_pub)
    put("client-ca.crt", client_ca)
    if request.nodes:
        os.makedirs(os.path.join(out, "nodes"), mode=0o700, exist_ok=True)
    for node in request.nodes:
        pair = ca.issue(f"system:node:{node}", [NODE_GROUP], client=True)
        put(os.path.join("nodes", f"{node}.pem"), pair.cert + pair.key, 0o600)

    secrets = [
        secret(CERTS_SECRET_NAME, {
            "ca.crt": ca.pem,
            "yurt-coordinator-yurthub-client.crt": pairs["yurthub-client"].cert,
            "yurt-coordinator-yurthub-client.key": pairs["yurthub-client"].key,
            "node-lease-proxy-client.crt": pairs["node-lease-proxy-client"].cert,
            "node-lease-proxy-client.key": pairs["node-lease-proxy-client"].key,
        }, request.pool, ns),
        secret(ETCD_SECRET, {
            "ca.crt": ca.pem,
            "server.crt": pairs["etcd-server"].cert, "server.key": pairs["etcd-server"].key,
            "peer.crt": pairs["etcd-peer"].cert, "peer.key": pairs["etcd-peer"].key,
        }, request.pool, ns),
        secret(APISERVER_SECRET, {
            "ca.crt": ca.pem,
            "client-ca.crt": client_ca,
            "apiserver.crt": pairs["apiserver"].cert, "apiserver.key": pairs["apiserver"].key,
            "etcd-client.crt": pairs["apiserver-etcd-client"].cert,
            "etcd-client.key": pairs["apiserver-etcd-client"].key,
            "service-account.key": _key_pem(sa_key), "service-account.pub": sa_pub,
        }, request.pool, ns),
    ]
    put("admin.kubeconfig", admin_kubeconfig(request.pool, out).encode("utf-8"), 0o600)
    put("secrets.yaml", yaml.safe_dump_all(secrets, sort_keys=False).encode("utf-8"), 0o600)
    put("kustomization.yaml", yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["secrets.yaml"]}, sort_keys=False).encode("utf-8"))
    return PKIResult(created, written)


def admin_kubeconfig(pool: str, out: str) -> str:
    """A kubeconfig for the coordinator apiserver as ``admin`` (to apply
    ``deploy/coordinator/rbac.yaml`` there) through a port forward to its Service; the
    files by absolute path, so that it works from any directory."""
    name = f"yurt-coordinator-{pool}"
    directory = os.path.abspath(out)
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": ADMIN_SERVER, "tls-server-name": APISERVER_SERVICE,
            "certificate-authority": os.path.join(directory, "ca.crt")}}],
        "users": [{"name": f"{name}-admin", "user": {
            "client-certificate": os.path.join(directory, "admin.crt"),
            "client-key": os.path.join(directory, "admin.key")}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
    }, sort_keys=False)


def certificate_names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """``(DNS names, IP addresses)`` of a certificate's SANs."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (sans.get_values_for_type(x509.DNSName),
            [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)])


def load_certificate(path: str) -> x509.Certificate:
    """The first certificate of ``path``."""
    return read_certificates(path, "certificate")[0]


def describe(result: PKIResult, request: PKIRequest) -> str:
    """What ``yurtcoordctl pki`` prints: the CA kept or made, and where the Secrets are."""
    ca = "new pool CA" if result.ca_created else "pool CA kept"
    return (f"{ca} in {os.path.join(request.out, 'ca.crt')}; {len(result.files)} files "
            f"written; Secrets for namespace {request.pool_namespace} in "
            f"{os.path.join(request.out, 'secrets.yaml')} (add {request.out} to the "
            "pool overlay's resources)\n")
