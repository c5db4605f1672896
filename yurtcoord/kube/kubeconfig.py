"""Reading the parts of a kubeconfig file that a client needs.

Only the current context is used: its cluster's server and CA, its user's client
certificate and key or bearer token. Relative file paths are resolved against the
kubeconfig's own directory, as kubectl does. ``*-data`` fields are base64 PEM.
"""

import base64
import os
from dataclasses import dataclass

import yaml


class KubeconfigError(ValueError):
    """The kubeconfig file is missing, unreadable, or lacks what a client needs."""


@dataclass(frozen=True)
class KubeconfigCredentials:
    server: str
    ca_file: str = None
    ca_data: bytes = None
    cert_file: str = None
    cert_data: bytes = None
    key_file: str = None
    key_data: bytes = None
    token: str = None
    token_file: str = None
    insecure: bool = False


def _named(entries, name, kind, path):
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(kind) or {}
    raise KubeconfigError(f"{path}: no {kind} named {name!r}")


def _decode(value, field, path):
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=False)
    except (ValueError, TypeError) as e:
        raise KubeconfigError(f"{path}: {field} is not base64: {e}") from None


def load_kubeconfig(path, context=None):
    """The credentials of ``context`` (default: current-context) in the file at ``path``."""
    try:
        with open(path, "rb") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise KubeconfigError(f"{path}: cannot read kubeconfig: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise KubeconfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (expected a mapping)")
    base = os.path.dirname(os.path.abspath(path))

    def resolve(p):
        return p if not p or os.path.isabs(p) else os.path.join(base, p)

    context_name = context or doc.get("current-context")
    contexts = doc.get("contexts") or []
    if not context_name:
        if len(contexts) != 1:
            raise KubeconfigError(f"{path}: no current-context set")
        context_name = contexts[0].get("name")
    ctx = _named(contexts, context_name, "context", path)
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster", path)
    user = _named(doc.get("users"), ctx.get("user"), "user", path) if ctx.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    return KubeconfigCredentials(
        server=server,
        ca_file=resolve(cluster.get("certificate-authority")),
        ca_data=_decode(cluster.get("certificate-authority-data"), "certificate-authority-data", path),
        cert_file=resolve(user.get("client-certificate")),
        cert_data=_decode(user.get("client-certificate-data"), "client-certificate-data", path),
        key_file=resolve(user.get("client-key")),
        key_data=_decode(user.get("client-key-data"), "client-key-data", path),
        token=user.get("token") or None,
        token_file=resolve(user.get("tokenFile")),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )
