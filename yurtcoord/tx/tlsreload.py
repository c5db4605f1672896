"""TLS client material (CA, certificate, key) re-read when its files change.

Both clients of the agent (apiservers and the pool etcd) present certificates that are
rotated on disk while the agent runs. ``ReloadingTLSPolicy`` is the
``IPolicyForHTTPS`` they give their Agent: each new connection asks it for a
connection creator, and before answering it compares the modification time, size and
inode of the files with the ones it loaded last and reloads them when any changed. So
every connection opened after a rotation handshakes with the new files, while
connections already open keep theirs until they close (``on_change`` tells the owner,
which may close its idle ones).

A rotation that is half done (a file missing, truncated, a key that does not match) is
logged once and the previous material stays in use; only when nothing loaded yet does
the caller get the error, made by its own ``error`` factory so each client reports it
with its own type.

PEM material is a file (re-read on change) or bytes given inline (kubeconfig's
``*-data``); the certificate file may carry its chain after the leaf.
"""

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from OpenSSL import SSL
from twisted.internet import ssl
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

__all__ = ["PEMSource", "ReloadingTLSPolicy", "TLSConfigError", "TLSMaterial",
           "split_pem_certificates"]

_BEGIN = b"-----BEGIN CERTIFICATE-----"
_END = b"-----END CERTIFICATE-----"

class TLSConfigError(ValueError):
    """CA, certificate or key material could not be loaded: the one such error of both
    clients (``yurtcoord.kube.tls`` raises it; the etcd client's
    ``yurtcoord.etcd.errors.EtcdTLSConfigError`` is it and an etcd outage at once)."""


# What a file's change is judged by: (mtime in ns, size, inode), or None when it
# cannot be stat'ed (missing in the middle of a rotation).
Stamp = Optional[tuple]


def split_pem_certificates(pem: bytes) -> list[bytes]:
    """Every certificate in a PEM bundle, in order, each as its own PEM block."""
    blocks = []
    for chunk in pem.split(_END)[:-1]:
        start = chunk.find(_BEGIN)
        if start >= 0:
            blocks.append(chunk[start:] + _END + b"\n")
    return blocks


@dataclass(frozen=True)
class PEMSource:
    """One piece of PEM material: a file (re-read when it changes) or inline bytes."""

    path: Optional[str] = None
    data: Optional[bytes] = None

    def __bool__(self) -> bool:
        return bool(self.path or self.data)

    @property
    def label(self) -> str:
        return self.path or "(inline data)"

    def stamp(self) -> Stamp:
        if not self.path:
            return ()
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def read(self) -> bytes:
        if not self.path:
            return self.data or b""
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"cannot read {self.path}: {e.strerror}") from None


@dataclass(frozen=True)
class TLSMaterial:
    """What one load of the files gave: the CA trust root (None: the platform's),
    the client certificate with its key (None: none presented) and its chain."""

    # What ``ssl.trustRootFromCertificates`` returns; its interface is not public.
    trust: Optional[Any]
    client_cert: Optional[ssl.PrivateCertificate]
    chain: tuple


def load_material(ca: PEMSource, cert: PEMSource, key: PEMSource) -> TLSMaterial:
    """Parse CA, certificate (plus chain) and key; ``ValueError`` names the file at fault."""
    trust = None
    if ca:
        pem = ca.read()
        try:
            roots = [ssl.Certificate.loadPEM(b) for b in split_pem_certificates(pem)]
        except Exception as e:
            raise ValueError(f"CA {ca.label} does not load: {e}") from None
        if not roots:
            raise ValueError(f"no certificate in CA {ca.label}")
        trust = ssl.trustRootFromCertificates(roots)
    client_cert, chain = None, ()
    if cert:
        blocks = split_pem_certificates(cert.read())
        key_pem = key.read()
        if not blocks:
            raise ValueError(f"no certificate in {cert.label}")
        try:
            client_cert = ssl.PrivateCertificate.loadPEM(blocks[0] + b"\n" + key_pem)
            chain = tuple(ssl.Certificate.loadPEM(b).original for b in blocks[1:])
        except Exception as e:
            raise ValueError(
                f"client certificate {cert.label} and key {key.label} do not load: {e}") from None
    return TLSMaterial(trust, client_cert, chain)


@implementer(IOpenSSLClientConnectionCreator)
class _UnverifiedCreator:
    """Client TLS that does not verify the server (``insecure``), still sends SNI and
    the client certificate when one is configured."""

    def __init__(self, hostname: str, context: SSL.Context):
        self._hostname = hostname
        self._context = context

    def clientConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        connection = SSL.Connection(self._context, None)
        connection.set_app_data(tlsProtocol)
        connection.set_connect_state()
        if not (isIPAddress(self._hostname) or isIPv6Address(self._hostname)):
            connection.set_tlsext_host_name(self._hostname.encode("idna"))
        return connection


@implementer(IPolicyForHTTPS)
class ReloadingTLSPolicy:
    """Connection creators built from CA / client certificate / key that may change
    on disk (see the module doc).

    :param error: makes the exception raised when material is wrong and nothing
        loaded before (the caller's own type).
    :param on_change: called after a reload that replaced loaded material.
    :param insecure: do not verify the server (the client certificate is still sent).
    :param name: what the log events say the material is for.
    """

    log = Logger()

    def __init__(self, ca: PEMSource = PEMSource(), cert: PEMSource = PEMSource(),
                 key: PEMSource = PEMSource(), *,
                 error: Callable[[str], Exception] = ValueError,
                 on_change: Optional[Callable[[], object]] = None,
                 insecure: bool = False, name: str = "tls"):
        if bool(cert) != bool(key):
            raise error("a client certificate needs its key, and a key its certificate")
        self._ca, self._cert, self._key = ca, cert, key
        self._error = error
        self._on_change = on_change
        self.insecure = insecure
        self._name = name
        self._material: Optional[TLSMaterial] = None
        self._stamps: Optional[tuple] = None
        self._bad_stamps: Optional[tuple] = None
        self._creators: dict = {}
        self.reloads = 0

    def _current_stamps(self) -> tuple:
        return (self._ca.stamp(), self._cert.stamp(), self._key.stamp())

    def refresh(self) -> bool:
        """Reload the material if a file changed; True when it was replaced.

        Raises the ``error`` type when nothing loaded yet and the files do not load.
        """
        stamps = self._current_stamps()
        if stamps == self._stamps or stamps == self._bad_stamps:
            return False
        try:
            material = load_material(self._ca, self._cert, self._key)
        except ValueError as e:
            if self._material is None:
                raise self._error(str(e)) from None
            self._bad_stamps = stamps
            self.log.warn("{name} TLS material changed but does not load, keeping the "
                          "previous: {error}", name=self._name, error=str(e))
            return False
        first = self._material is None
        self._material, self._stamps, self._bad_stamps = material, stamps, None
        self._creators = {}
        self.reloads += 1
        if not first:
            self.log.info("{name} TLS material reloaded, new connections use it: ca={ca} "
                          "cert={cert}", name=self._name, ca=self._ca.path, cert=self._cert.path)
            if self._on_change is not None:
                self._on_change()
        return True

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        self.refresh()
        host = hostname.decode("ascii") if isinstance(hostname, bytes) else hostname
        creator = self._creators.get(host)
        if creator is None:
            creator = self._make_creator(host)
            self._creators[host] = creator
        return creator

    def _make_creator(self, host: str) -> IOpenSSLClientConnectionCreator:
        material = self._material
        assert material is not None  # refresh() loaded it or raised
        chain = list(material.chain)
        if self.insecure:
            client = material.client_cert
            context = ssl.CertificateOptions(
                verify=False,
                privateKey=None if client is None else client.privateKey.original,
                certificate=None if client is None else client.original,
                extraCertChain=chain or None).getContext()
            return _UnverifiedCreator(host, context)
        return ssl.optionsForClientTLS(
            host, trustRoot=material.trust, clientCertificate=material.client_cert,
            extraCertificateOptions={"extraCertChain": chain} if chain else None)
