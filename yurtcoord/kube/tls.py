"""TLS for Kubernetes API connections, with certificate files re-read on change.

``ReloadingTLSPolicy`` is the ``IPolicyForHTTPS`` given to the client's Agent. Each
new connection asks it for a connection creator; before answering, it compares the
modification time and size of the CA, certificate and key files with the ones it
loaded last and reloads them when any changed. So when certificates are rotated on
disk, every connection opened afterwards uses the new ones, while connections already
open keep theirs until they close (``KubeClient.drop_connections()`` closes the idle
ones at once). A half-written pair that does not load is logged and the previous
material stays in use.
"""

import os

from OpenSSL import SSL, crypto
from twisted.internet import ssl
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer


class TLSConfigError(ValueError):
    """CA, certificate or key material could not be loaded."""


_PEM_CERT_END = b"-----END CERTIFICATE-----"


def _split_pem_certificates(pem):
    """Every certificate in a PEM bundle, each as its own PEM block."""
    blocks = []
    for chunk in pem.split(_PEM_CERT_END)[:-1]:
        start = chunk.find(b"-----BEGIN CERTIFICATE-----")
        if start >= 0:
            blocks.append(chunk[start:] + _PEM_CERT_END + b"\n")
    return blocks


@implementer(IOpenSSLClientConnectionCreator)
class _UnverifiedCreator:
    """Client TLS that does not verify the server (``insecure``), still sends SNI and
    the client certificate when one is configured."""

    def __init__(self, hostname, context):
        self._hostname = hostname
        self._context = context

    def clientConnectionForTLS(self, tlsProtocol):
        connection = SSL.Connection(self._context, None)
        connection.set_app_data(tlsProtocol)
        connection.set_connect_state()
        if not _is_ip(self._hostname):
            connection.set_tlsext_host_name(self._hostname.encode("idna"))
        return connection


def _is_ip(hostname):
    return isIPAddress(hostname) or isIPv6Address(hostname)


class _Source:
    """One piece of PEM material: a file (re-read when it changes) or inline bytes."""

    def __init__(self, path=None, data=None):
        self.path = path or None
        self.data = data if data else None

    def __bool__(self):
        return bool(self.path or self.data)

    def stamp(self):
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return ("missing",)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def read(self):
        if self.data is not None:
            return self.data
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except OSError as e:
            raise TLSConfigError(f"cannot read {self.path}: {e.strerror}") from None


@implementer(IPolicyForHTTPS)
class ReloadingTLSPolicy:
    """Connection creators built from CA / client cert / key that may change on disk."""

    log = Logger()

    def __init__(self, ca_file=None, ca_data=None, cert_file=None, cert_data=None,
                 key_file=None, key_data=None, insecure=False):
        self._ca = _Source(ca_file, ca_data)
        self._cert = _Source(cert_file, cert_data)
        self._key = _Source(key_file, key_data)
        if bool(self._cert) != bool(self._key):
            raise TLSConfigError("a client certificate needs its key, and a key its certificate")
        self.insecure = insecure
        self._stamp = None
        self._trust = None
        self._client_cert = None
        self._creators = {}
        self.reloads = 0
        self._load()

    def _stamps(self):
        return (self._ca.stamp(), self._cert.stamp(), self._key.stamp())

    def _load(self):
        stamp = self._stamps()
        trust = None
        if self._ca:
            try:
                certs = [ssl.Certificate.loadPEM(b) for b in _split_pem_certificates(self._ca.read())]
            except (SSL.Error, crypto.Error, ValueError) as e:
                raise TLSConfigError(f"CA {self._ca.path or '(inline data)'} does not load: {e}") from None
            if not certs:
                raise TLSConfigError(f"no certificate in CA {self._ca.path or '(inline data)'}")
            trust = ssl.trustRootFromCertificates(certs)
        client_cert = None
        if self._cert:
            try:
                client_cert = ssl.PrivateCertificate.loadPEM(
                    self._cert.read() + b"\n" + self._key.read())
            except (SSL.Error, crypto.Error, ValueError) as e:
                raise TLSConfigError(
                    f"client certificate {self._cert.path or '(inline data)'} and key do not load: {e}"
                ) from None
        self._trust, self._client_cert, self._stamp = trust, client_cert, stamp
        self._creators = {}
        self.reloads += 1

    def _refresh(self):
        if self._stamps() == self._stamp:
            return
        try:
            self._load()
        except TLSConfigError as e:
            self.log.warn("tls material changed but does not load, keeping the previous: {error}",
                          error=str(e))
            self._stamp = self._stamps()
        else:
            self.log.info("tls material reloaded ca={ca} cert={cert}",
                          ca=self._ca.path, cert=self._cert.path)

    def creatorForNetloc(self, hostname, port):
        self._refresh()
        host = hostname.decode("ascii") if isinstance(hostname, bytes) else hostname
        creator = self._creators.get(host)
        if creator is None:
            creator = self._make_creator(host)
            self._creators[host] = creator
        return creator

    def _make_creator(self, host):
        if self.insecure:
            extra = {}
            if self._client_cert is not None:
                extra = dict(privateKey=self._client_cert.privateKey.original,
                             certificate=self._client_cert.original)
            context = ssl.CertificateOptions(verify=False, **extra).getContext()
            return _UnverifiedCreator(host, context)
        kwargs = {}
        if self._trust is not None:
            kwargs["trustRoot"] = self._trust
        if self._client_cert is not None:
            kwargs["clientCertificate"] = self._client_cert
        return ssl.optionsForClientTLS(host, **kwargs)
