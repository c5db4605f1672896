"""Reading the parts of a kubeconfig file that a client needs.

Only the current context is used: its cluster's server and CA, its user's client
certificate and key or bearer token. Relative file paths are resolved against the
kubeconfig's own directory, as kubectl does. ``*-data`` fields are base64 PEM.

A field that would change how the client authenticates or verifies the server but
that this client does not implement (credential plugins, impersonation, basic auth,
a proxy, another TLS server name) is an error naming the file and the field: ignoring
it would quietly connect with other credentials or checks than the file asks for.
Fields of the wrong type are errors too.

A cluster ``server`` carrying credentials (``https://user:password@host``) is an
error, whose message shows the URL with them masked. ``insecure-skip-tls-verify:
true`` is an error unless the caller allows it (``allow_insecure``): the agent allows
it only with ``[cloud] insecure = true``, since a kubeconfig setting it silently would
send the node's token or key to any server answering at that address.
"""

import base64
import os
from dataclasses import dataclass

from yurtcoord.tx.credentials import mask_url_credentials, url_has_credentials


class KubeconfigError(ValueError):
    """The kubeconfig file is missing, unreadable, or lacks what a client needs."""


@dataclass(frozen=True)
class KubeconfigCredentials:
    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False


# Fields of the kubeconfig format that change authentication or verification and are
# not implemented here, with what to do instead.
_CREDENTIALS_INSTEAD = ("give the user a client certificate (client-certificate/client-key) "
                        "or a bearer token (token/tokenFile)")
UNSUPPORTED_USER_FIELDS = {
    "exec": "credential plugins are not supported; " + _CREDENTIALS_INSTEAD,
    "auth-provider": "auth providers are not supported; " + _CREDENTIALS_INSTEAD,
    "username": "basic authentication is not supported; " + _CREDENTIALS_INSTEAD,
    "password": "basic authentication is not supported; " + _CREDENTIALS_INSTEAD,
    "as": "impersonation is not supported; give the credentials of that user instead",
    "as-uid": "impersonation is not supported; give the credentials of that user instead",
    "as-groups": "impersonation is not supported; give the credentials of that user instead",
    "as-user-extra": "impersonation is not supported; give the credentials of that user instead",
}
UNSUPPORTED_CLUSTER_FIELDS = {
    "tls-server-name": "verifying the server under another name is not supported; use a "
                       "server URL whose host name the server certificate carries",
    "proxy-url": "proxies are not supported; connect to the apiserver directly",
}


def _is_set(value):
    """Whether a field holds a value (YAML's null and empty values mean "not set")."""
    return value is not None and not (isinstance(value, (str, list, dict)) and not value)


def _reject_unsupported(section, where, fields, path):
    for name, advice in fields.items():
        if _is_set(section.get(name)):
            raise KubeconfigError(f"{path}: {where}.{name} is set: {advice}")


def _string(section, name, where, path):
    """A string field, None when unset."""
    value = section.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KubeconfigError(f"{path}: {where}.{name} must be a string, "
                              f"got {type(value).__name__}")
    return value


def _named(entries, name, kind, path):
    """The ``kind`` mapping of the entry called ``name`` in the list ``entries``."""
    if entries is not None and not isinstance(entries, list):
        raise KubeconfigError(f"{path}: {kind}s must be a list")
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(kind)
            if found is None:
                return {}
            if not isinstance(found, dict):
                raise KubeconfigError(f"{path}: {kind}s[name={name}].{kind} must be a mapping")
            return found
    raise KubeconfigError(f"{path}: no {kind} named {name!r}")


def _decode(value, field, path):
    if not value:
        return None
    if not isinstance(value, str):
        raise KubeconfigError(f"{path}: {field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=False)
    except (ValueError, TypeError) as e:
        raise KubeconfigError(f"{path}: {field} is not base64: {e}") from None


def load_kubeconfig(path: str, context: str | None = None,
                    allow_insecure: bool = True) -> KubeconfigCredentials:
    """The credentials of ``context`` (default: current-context) in the file at ``path``;
    with ``allow_insecure`` false, ``insecure-skip-tls-verify: true`` is an error."""
    # Imported here: an agent that reads no kubeconfig never loads the YAML parser.
    import yaml

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

    context_name = context or _string(doc, "current-context", "kubeconfig", path)
    contexts = doc.get("contexts") or []
    if not context_name:
        if not isinstance(contexts, list) or len(contexts) != 1 \
                or not isinstance(contexts[0], dict):
            raise KubeconfigError(f"{path}: no current-context set")
        context_name = contexts[0].get("name")
    ctx = _named(contexts, context_name, "context", path)
    cluster_name = ctx.get("cluster")
    cluster = _named(doc.get("clusters"), cluster_name, "cluster", path)
    user_name = ctx.get("user")
    user = _named(doc.get("users"), user_name, "user", path) if user_name else {}
    cluster_where = f"clusters[name={cluster_name}].cluster"
    user_where = f"users[name={user_name}].user"
    _reject_unsupported(cluster, cluster_where, UNSUPPORTED_CLUSTER_FIELDS, path)
    _reject_unsupported(user, user_where, UNSUPPORTED_USER_FIELDS, path)
    server = _string(cluster, "server", cluster_where, path)
    if not server:
        raise KubeconfigError(f"{path}: cluster {cluster_name!r} has no server")
    if url_has_credentials(server):
        raise KubeconfigError(
            f"{path}: {cluster_where}.server {mask_url_credentials(server)!r} carries "
            "credentials (user:password@) in the URL; give the user a client certificate "
            "or a token instead")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool) and insecure is not None:
        raise KubeconfigError(f"{path}: {cluster_where}.insecure-skip-tls-verify must be "
                              f"true or false, got {insecure!r}")
    if insecure and not allow_insecure:
        raise KubeconfigError(
            f"{path}: {cluster_where}.insecure-skip-tls-verify is true: the server's "
            "certificate would not be verified and any server at that address would get "
            "the credentials; remove it (give certificate-authority instead) or, for "
            "testing only, set [cloud] insecure = true")
    return KubeconfigCredentials(
        server=server,
        ca_file=resolve(_string(cluster, "certificate-authority", cluster_where, path)),
        ca_data=_decode(cluster.get("certificate-authority-data"),
                        f"{cluster_where}.certificate-authority-data", path),
        cert_file=resolve(_string(user, "client-certificate", user_where, path)),
        cert_data=_decode(user.get("client-certificate-data"),
                          f"{user_where}.client-certificate-data", path),
        key_file=resolve(_string(user, "client-key", user_where, path)),
        key_data=_decode(user.get("client-key-data"), f"{user_where}.client-key-data", path),
        token=_string(user, "token", user_where, path),
        token_file=resolve(_string(user, "tokenFile", user_where, path)),
        insecure=bool(insecure),
    )
