"""The contracts between the agent's parts and the Kubernetes API clients they use.

Code that reads and writes single objects takes any ``IObjectClient``: the real
``KubeClient``, a client that picks a server per call, or the in-memory fake of the
unit tests. Each is checked against this interface with ``verifyObject``.
"""

from zope.interface import Interface


class IObjectClient(Interface):
    """Single-object calls of a Kubernetes API client. Each returns a Deferred that
    fails with a ``yurtcoord.kube.errors`` type (``NotFound``, ``Conflict``,
    ``AlreadyExists``, ...) when the server refuses."""

    def get(gvr, name, namespace=None):
        """The object ``namespace/name`` of resource ``gvr`` (a dict)."""

    def create(gvr, obj, namespace=None):
        """Create ``obj``; fires with the object as stored."""

    def update(gvr, obj, namespace=None):
        """Replace the object, guarded by ``obj``'s resourceVersion; fires with the
        object as stored."""

    def delete(gvr, name, namespace=None):
        """Delete the object; fires with the server's answer."""
