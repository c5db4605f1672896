"""TLS for Kubernetes API connections, with certificate files re-read on change.

The client's Agent is given a ``yurtcoord.tx.tlsreload.ReloadingTLSPolicy``: each new
connection uses the CA, certificate and key as they are on disk at that moment, while
connections already open keep theirs until they close (``KubeClient.drop_connections()``
closes the idle ones at once). A half-written pair that does not load is logged and the
previous material stays in use.
"""

from typing import Optional

from yurtcoord.tx.tlsreload import PEMSource, ReloadingTLSPolicy, TLSConfigError

__all__ = ["TLSConfigError", "tls_policy"]


def tls_policy(ca_file: Optional[str] = None, ca_data: Optional[bytes] = None,
               cert_file: Optional[str] = None, cert_data: Optional[bytes] = None,
               key_file: Optional[str] = None, key_data: Optional[bytes] = None,
               insecure: bool = False, name: str = "apiserver") -> ReloadingTLSPolicy:
    """The reloading policy for one apiserver, loaded now: material that does not load
    fails here with ``TLSConfigError`` rather than on the first request."""
    policy = ReloadingTLSPolicy(PEMSource(ca_file, ca_data), PEMSource(cert_file, cert_data),
                                PEMSource(key_file, key_data), error=TLSConfigError,
                                insecure=insecure, name=name)
    policy.refresh()
    return policy
