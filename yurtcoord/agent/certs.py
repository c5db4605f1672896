"""Certificates of the pool coordinator, fetched from a Secret in the cloud.

The cloud keeps Secret ``<namespace>/yurt-coordinator-yurthub-certs``. Its data keys
map to files in ``pki_dir``:

============================================  ============================================
secret key                                    file
============================================  ============================================
``ca.crt``                                    ``yurt-coordinator-ca.crt``
``yurt-coordinator-yurthub-client.crt/.key``  same names: the pool etcd client
                                              certificate
``node-lease-proxy-client.crt/.key``          same names: cloud writes of delegated
                                              heartbeats
============================================  ============================================

``CertManager`` watches the Secret with an informer and keeps the files equal to it:

- the CA and each certificate/key pair are checked before anything is written: the
  CA must hold PEM certificates; a pair must parse and the key must belong to the
  certificate. A malformed unit is logged (names and reason only, never key
  material) and its previous files stay in use: a bad rotation never takes away
  certificates that work;
- a pair is written key and certificate together: both go to temporary files in
  ``pki_dir`` that are synced, then both are renamed over the old ones. Every file is
  mode 0600. Unchanged content is not rewritten, so clients do not reload for nothing;
- keys removed from the Secret → their files are removed; the Secret deleted (or
  absent when the informer has listed) → every file is removed and ``ready`` turns
  False, so the coordinator reports unhealthy.

``on_change()`` is called after files changed. Clients built on these files re-read
them for every new TLS connection (``yurtcoord.kube.tls``); ``on_change`` is the place
to make them drop idle connections (``KubeClient.drop_connections()``) so that new
certificates take effect at once.

With ``[coordinator] insecure = true`` (plain http to the coordinator apiserver and
etcd) no certificates are used: the agent does not build a ``CertManager`` at all and
the Secret is not required.

The files are a few kilobytes and change only on rotation, so they are written
synchronously in the reactor thread.
"""

import base64
import binascii
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from twisted.internet import defer
from twisted.internet.interfaces import IHostnameResolver
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.kube.client import ClientConfig, KubeClient
from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.kube.gvr import SECRETS
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.interfaces import IObjectClient
from yurtcoord.kube.resolving import ResolvingClient
from yurtcoord.names import CERTS_SECRET_NAME
from yurtcoord.tx.atomicfiles import fsync_directory, replace_files_atomically
from yurtcoord.tx.guardedloop import ILoopErrors

FILE_MODE = 0o600


@dataclass(frozen=True)
class CertPair:
    """Paths of a client certificate and its key."""

    cert_file: str
    key_file: str


@dataclass(frozen=True)
class CertUnit:
    """Files that are validated and replaced together: the CA, or a cert/key pair.

    ``items`` maps each secret key to its file name; a pair lists the certificate
    first, then the key.
    """

    name: str
    items: tuple[tuple[str, str], ...]

    @property
    def is_pair(self) -> bool:
        return len(self.items) == 2


CA_UNIT = CertUnit("ca", (("ca.crt", "yurt-coordinator-ca.crt"),))
YURTHUB_CLIENT_UNIT = CertUnit("yurthub-client", (
    ("yurt-coordinator-yurthub-client.crt", "yurt-coordinator-yurthub-client.crt"),
    ("yurt-coordinator-yurthub-client.key", "yurt-coordinator-yurthub-client.key"),
))
NODE_LEASE_PROXY_UNIT = CertUnit("node-lease-proxy-client", (
    ("node-lease-proxy-client.crt", "node-lease-proxy-client.crt"),
    ("node-lease-proxy-client.key", "node-lease-proxy-client.key"),
))
UNITS = (CA_UNIT, YURTHUB_CLIENT_UNIT, NODE_LEASE_PROXY_UNIT)


class MalformedCerts(ValueError):
    """Secret data that must not be written. Messages never contain key material."""


def _public_key_bytes(public_key):
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def check_ca(ca_pem: bytes) -> None:
    """Raise MalformedCerts unless ``ca_pem`` holds at least one PEM certificate."""
    try:
        certificates = x509.load_pem_x509_certificates(ca_pem)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise MalformedCerts("CA bundle does not parse as PEM certificates") from None
    if not certificates:
        raise MalformedCerts("CA bundle holds no certificate")


def check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Raise MalformedCerts unless the certificate and the unencrypted key parse and
    the key is the certificate's."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise MalformedCerts("certificate does not parse as PEM") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # Not logged with the library's message: keep anything about the key out.
        raise MalformedCerts("private key does not parse as unencrypted PEM") from None
    try:
        matches = (_public_key_bytes(certificate.public_key())
                   == _public_key_bytes(key.public_key()))
    except (ValueError, TypeError, UnsupportedAlgorithm):
        matches = False
    if not matches:
        raise MalformedCerts("private key does not belong to the certificate")


class CertManager:
    """Keeps ``pki_dir`` equal to the certs Secret of the cloud.

    ``cloud_client`` is a KubeClient of the cloud (used by the default informer);
    ``make_informer()`` may be given instead, returning an ``IInformer`` of that
    Secret.
    """

    log = Logger()

    def __init__(self, reactor: Any, cloud_client: Any, pki_dir: str, namespace: str,
                 on_change: Callable[[], object] | None = None,
                 make_informer: Callable[[], Any] | None = None,
                 loop_errors: ILoopErrors | None = None) -> None:
        self._reactor = reactor
        # Where the default informer counts its loop's unexpected errors.
        self._loop_errors = loop_errors
        self._client = cloud_client
        self.pki_dir = pki_dir
        self.namespace = namespace
        self._on_change = on_change or (lambda: None)
        self._make_informer = make_informer or self._default_informer
        self._informer: Any = None
        self._secret_seen = False
        self.writes = 0
        self.removals = 0
        self.rejected = 0
        self.last_error: str | None = None

    def _default_informer(self):
        return Informer(self._reactor, self._client, SECRETS, namespace=self.namespace,
                        field_selector=f"metadata.name={CERTS_SECRET_NAME}",
                        loop_errors=self._loop_errors)

    # -- where the files are -------------------------------------------------------

    def _path(self, file_name):
        return os.path.join(self.pki_dir, file_name)

    @property
    def ca_file(self) -> str:
        return self._path(CA_UNIT.items[0][1])

    @property
    def yurthub_client_pair(self) -> CertPair:
        """Client certificate for the pool etcd. The coordinator apiservers are reached
        with the node's own certificate instead (``[node] kubelet_client_cert``): a
        shared one would let any member write every node's lease."""
        return CertPair(*(self._path(f) for _, f in YURTHUB_CLIENT_UNIT.items))

    @property
    def node_lease_proxy_pair(self) -> CertPair:
        """Client certificate for writing delegated heartbeats to the cloud."""
        return CertPair(*(self._path(f) for _, f in NODE_LEASE_PROXY_UNIT.items))

    def has_unit(self, unit: CertUnit) -> bool:
        return all(os.path.exists(self._path(f)) for _, f in unit.items)

    @property
    def ready(self) -> bool:
        """Every certificate file is in place (checked on disk, so files left by an
        earlier run count until the Secret says otherwise)."""
        return all(self.has_unit(unit) for unit in UNITS)

    @property
    def has_certs(self) -> bool:
        """Same as ``ready``: the name the coordinator's health check reads."""
        return self.ready

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> defer.Deferred[None]:
        """Create ``pki_dir`` and start watching the Secret."""
        if self._informer is not None:
            return defer.succeed(None)
        os.makedirs(self.pki_dir, mode=0o700, exist_ok=True)
        self._secret_seen = False
        informer = self._make_informer()
        informer.add_handler(self._on_add, self._on_update, self._on_delete)
        self._informer = informer
        informer.start()
        informer.wait_for_sync().addCallback(self._synced, informer)
        self.log.info("certificate manager watching secret {namespace}/{name} pki_dir={pki_dir}",
                      namespace=self.namespace, name=CERTS_SECRET_NAME, pki_dir=self.pki_dir)
        return defer.succeed(None)

    def stop(self) -> defer.Deferred[Any]:

        informer, self._informer = self._informer, None
        if informer is None:
            return defer.succeed(None)
        return defer.maybeDeferred(informer.stop)

    # -- informer events -----------------------------------------------------------

    def _synced(self, synced, informer):
        if not synced or informer is not self._informer or self._secret_seen:
            return
        # Listed and the Secret is not there: it was deleted while nobody watched.
        self._drop_all("secret is absent")

    def _on_add(self, secret):
        self._apply(secret)

    def _on_update(self, old, new):
        self._apply(new)

    def _on_delete(self, secret):
        if self._informer is None:
            return
        self._secret_seen = False
        self._drop_all("secret deleted")

    def _apply(self, secret):
        if self._informer is None or not self._is_certs_secret(secret):
            return
        self._secret_seen = True
        data = secret.get("data") or {}
        changed = False
        for unit in UNITS:
            try:
                changed = self._apply_unit(unit, data) or changed
            except MalformedCerts as error:
                self.rejected += 1
                self.last_error = f"{unit.name}: {error}"
                self.log.warn("certs secret {namespace}/{name}: rejected {unit}: {reason}; "
                              "keeping the previous files",
                              namespace=self.namespace, name=CERTS_SECRET_NAME,
                              unit=unit.name, reason=str(error))
            except OSError as error:
                self.last_error = f"{unit.name}: {error.strerror}"
                self.log.error("cannot write certificate files of {unit} in {pki_dir}: {error}",
                               unit=unit.name, pki_dir=self.pki_dir, error=error.strerror)
        if changed:
            self._notify()

    def _is_certs_secret(self, secret):
        metadata = secret.get("metadata") or {}
        return (metadata.get("name") == CERTS_SECRET_NAME
                and metadata.get("namespace", self.namespace) == self.namespace)

    def _apply_unit(self, unit, data):
        """Bring one unit's files in line with the Secret; True if files changed."""
        present = [key for key, _ in unit.items if data.get(key)]
        if not present:
            return self._remove_unit(unit, "removed from the secret")
        if len(present) != len(unit.items):
            missing = [key for key, _ in unit.items if key not in present]
            raise MalformedCerts(f"incomplete: {', '.join(missing)} missing")
        contents = {}
        for key, file_name in unit.items:
            try:
                contents[file_name] = base64.b64decode(data[key], validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise MalformedCerts(f"{key} is not valid base64") from None
        blobs = list(contents.values())
        if unit.is_pair:
            check_pair(*blobs)
        else:
            check_ca(blobs[0])
        if all(self._current(name) == blob for name, blob in contents.items()):
            return False
        replace_files_atomically(self.pki_dir, contents, FILE_MODE)
        self.writes += 1
        self.log.info("certificate files of {unit} written: {files}",
                      unit=unit.name, files=", ".join(contents))
        return True

    def _current(self, file_name):
        """The file's bytes if it exists with mode 0600, else None (rewrite it)."""
        path = self._path(file_name)
        try:
            if os.stat(path).st_mode & 0o777 != FILE_MODE:
                return None
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def _remove_unit(self, unit, why):
        removed = []
        for _, file_name in unit.items:
            path = self._path(file_name)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as error:
                self.log.error("cannot remove certificate file {file}: {error}",
                               file=path, error=error.strerror)
                continue
            removed.append(file_name)
        if not removed:
            return False
        self.removals += 1
        try:
            fsync_directory(self.pki_dir)
        except OSError:
            self.log.warn("cannot sync directory {pki_dir}", pki_dir=self.pki_dir)
        self.log.info("certificate files of {unit} removed ({why}): {files}",
                      unit=unit.name, why=why, files=", ".join(removed))
        return True

    def _drop_all(self, why):
        removed = [unit.name for unit in UNITS if self._remove_unit(unit, why)]
        self.log.warn("certs secret {namespace}/{name}: {why}; certificates dropped "
                      "removed={removed}", namespace=self.namespace, name=CERTS_SECRET_NAME,
                      why=why, removed=",".join(removed) or "none")
        self._notify()

    def _notify(self):
        try:
            self._on_change()
        except Exception:
            self.log.failure("certificate change callback failed")


NODE_GROUP = "system:nodes"


def read_pem_certificates(path: str, what: str,
                          error: type[Exception] = ValueError) -> list[x509.Certificate]:
    """The PEM certificates in ``path`` (other PEM blocks, a key, are skipped); an
    ``error`` naming ``what`` and the file when it cannot be read or holds none."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as failure:
        raise error(f"{what} {path}: {failure.strerror}") from None
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise error(f"{what} {path}: no PEM certificate in it") from None


def check_node_certificate(path: str, node: str) -> None:
    """Refuse a node certificate that names another node (``ValueError`` naming the
    file and both names): with it the agent would speak for that node. A file that
    does not exist yet passes (the kubelet writes it after bootstrap; until then the
    coordinator is unhealthy); one that exists must hold a PEM certificate whose
    subject is ``CN=system:node:<node>`` in organization ``system:nodes``."""
    if not os.path.lexists(path):
        return
    subject = read_pem_certificates(path, "[node] kubelet_client_cert")[0].subject
    names = [a.value for a in subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    groups = [a.value for a in subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)]
    expected = f"system:node:{node}"
    if names != [expected] or NODE_GROUP not in groups:
        raise ValueError(
            f"[node] kubelet_client_cert {path} is {subject.rfc4514_string()!r}, not "
            f"CN={expected} in O={NODE_GROUP}: the agent may only speak for its own node")


@implementer(IObjectClient)
class CertificateClient(ResolvingClient):
    """A ``KubeClient`` whose client certificate comes from the certs Secret.

    The certificate files in ``pki_dir`` do not exist before the certificate manager
    wrote them (first start of a node), and a TLS client cannot be built without them.
    This client builds its ``KubeClient`` on the first call made once the files are
    there. While any file is missing (before the Secret was fetched, or after it was
    deleted) every call fails with ``ConnectionFailed`` naming the missing files, which
    the callers treat like an unreachable server (the coordinator prober reports
    unhealthy, the elector keeps trying). ``name_resolver`` and ``loop_errors`` are
    the ``KubeClient``'s.
    """

    # Building the KubeClient may fail too (unreadable files): fail the call, not
    # the caller.
    resolve_errors = (Exception,)

    def __init__(self, reactor: Any, make_config: Callable[[], ClientConfig],
                 required_files: Iterable[str],
                 name_resolver: IHostnameResolver | None = None,
                 loop_errors: ILoopErrors | None = None) -> None:
        self._reactor = reactor
        self._make_config = make_config
        self._required_files = tuple(required_files)
        self._name_resolver = name_resolver
        self._loop_errors = loop_errors
        self.client: KubeClient | None = None
        self._closed = False

    def _missing(self):
        return [path for path in self._required_files if not os.path.exists(path)]

    def _resolve(self):
        if self._closed:
            raise ConnectionFailed("client is closed")
        # Checked on every call: certificates removed with the Secret end the use of
        # this client at once: without certificates the coordinator is unhealthy.
        missing = self._missing()
        if missing:
            raise ConnectionFailed(f"certificates not available: {', '.join(missing)}")
        if self.client is None:
            self.client = KubeClient(self._reactor, self._make_config(),
                                     name_resolver=self._name_resolver,
                                     loop_errors=self._loop_errors)
        return self.client

    def drop_connections(self) -> defer.Deferred[None]:
        if self.client is None:
            return defer.succeed(None)
        return self.client.drop_connections()

    def close(self) -> defer.Deferred[None]:
        self._closed = True
        if self.client is None:
            return defer.succeed(None)
        return self.client.close()
