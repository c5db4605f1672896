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


class IListWatchClient(Interface):
    """What an informer needs of a Kubernetes API client: paged lists and watches.

    ``list`` fires with the decoded List (``items`` and ``metadata`` with
    ``resourceVersion`` and ``continue``). ``watch`` returns at once an object with a
    ``done`` Deferred (None when the stream ended cleanly or was cancelled, else a
    ``yurtcoord.kube.errors`` type), an ``events`` count and ``cancel()``.
    """

    def list(gvr, namespace=None, label_selector=None, field_selector=None,
             resource_version=None, limit=None, continue_token=None):
        """One page of the objects of ``gvr``."""

    def watch(gvr, on_event, namespace=None, resource_version=None, label_selector=None,
              field_selector=None, allow_bookmarks=True, timeout_seconds=None,
              idle_timeout=None):
        """Start a watch calling ``on_event(type, obj)`` for every event."""
