"""A throwaway certificate authority for tests: CA, server and client certificates.

Files are PEM. Server certificates name ``localhost`` and ``127.0.0.1``. Client
certificates carry a common name and optional organizations (Kubernetes maps these
to user and groups), which the TLS test servers report back to tests.

The certificates follow RFC 5280 as a strict verifier reads it (Python's ``ssl``
with ``VERIFY_X509_STRICT``, the default from Python 3.13, which the ``kubernetes``
client and the etcd fixture's health check use): every certificate has a Subject
Key Identifier and an Authority Key Identifier naming the CA's key; the CA has
critical basic constraints ``CA:TRUE`` and may only sign; a leaf has critical
``CA:FALSE``, a critical key usage for signing (ECDSA keys) and the extended key
usages of its role. ``trustme`` makes similar certificates, but a client certificate
here needs several organizations (one per Kubernetes group), no subject alternative
name, and only the client usage, so that a test can tell a client certificate from a
server's.
"""

import datetime
import ipaddress
import os
from dataclasses import dataclass
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertPair:
    cert_file: str
    key_file: str


def _name(common_name, organizations=()):
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _write(path, data, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(ca):
    """A CA signs certificates and CRLs; an ECDSA leaf key only signs handshakes."""
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca,
        content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )


def _builder(subject, issuer, public_key, issuer_ski, not_after):
    """What every certificate of this CA carries, the CA's own included."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key),
                       critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski),
            critical=False,
        )
    )


class TestCA:
    """A CA living in ``directory``; issues server and client pairs into it."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: str, common_name: str = "yurtcoord-test-ca") -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._ski = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self._cert = (
            _builder(_name(common_name), _name(common_name), self._key.public_key(),
                     self._ski, datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = os.path.join(directory, "ca.crt")
        _write(self.ca_file, self.cert_pem, 0o644)

    def issue(self, name: str, common_name: str, organizations: Iterable[str] = (),
              server: bool = False, client: bool = False, valid_days: int = 1,
              addresses: Iterable[str] = ()) -> CertPair:
        """Issue a pair ``<name>.crt``/``<name>.key`` and return their paths.

        ``server`` adds the serverAuth usage and the names ``localhost`` and
        ``127.0.0.1``, and ``addresses`` (IP addresses a server also listens on, e.g.
        on a test network); ``client`` adds the clientAuth usage."""
        if not (server or client):
            raise ValueError(f"certificate {name!r}: give it a server or client role")
        key = ec.generate_private_key(ec.SECP256R1())
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            _builder(_name(common_name, organizations), self._cert.subject,
                     key.public_key(), self._ski, datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    *(x509.IPAddress(ipaddress.ip_address(address))
                      for address in dict.fromkeys(["127.0.0.1", *addresses])),
                ]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = _key_pem(key)
        pair = CertPair(
            os.path.join(self.directory, f"{name}.crt"),
            os.path.join(self.directory, f"{name}.key"),
        )
        _write(pair.cert_file, cert_pem, 0o644)
        _write(pair.key_file, key_pem, 0o600)
        return pair

    def server_pair(self, name: str = "server", addresses: Iterable[str] = ()) -> CertPair:
        return self.issue(name, "localhost", server=True, client=True, addresses=addresses)

    def client_pair(self, name: str, common_name: str,
                    organizations: Iterable[str] = ()) -> CertPair:
        return self.issue(name, common_name, organizations, client=True)

    def node_client_pem(self, node: str, path: str | None = None) -> str:
        """The node's own client certificate and key in one PEM file, as the kubelet
        keeps ``kubelet-client-current.pem``: ``CN=system:node:<node>``,
        ``O=system:nodes``, the identity the Node authorizer knows. Written to ``path``
        (default ``<directory>/kubelet-client-<node>.pem``, mode 0600); returns it."""
        pair = self.client_pair(f"kubelet-client-{node}", f"system:node:{node}",
                                ["system:nodes"])
        target = path or os.path.join(self.directory, f"kubelet-client-{node}.pem")
        _write(target, read_pem(pair.cert_file) + read_pem(pair.key_file), 0o600)
        return target


def read_pem(path: str) -> bytes:

    with open(path, "rb") as f:
        return f.read()
