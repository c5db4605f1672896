"""Who may do what on the test API server, as the pool's coordinator apiserver decides.

A production coordinator is a kube-apiserver with ``--authorization-mode=Node,RBAC``
and the NodeRestriction admission plugin. Its users come from TLS client
certificates: the user is the common name, the groups are the organizations plus
``system:authenticated``. Each agent authenticates as its node, with the kubelet's
certificate (``CN=system:node:<node>``, ``O=system:nodes``), so the coordinator can
hold a pool member to its own node lease: a member that could write another node's
lease could keep a dead node Ready through the leader's delegation.

``PoolCoordinatorAuthorizer`` gives the test server those decisions, so that tests see
what such a coordinator refuses, with the Status kube-apiserver answers:

- group ``system:masters``: everything (as kube-apiserver, which asks no authorizer);
- every authenticated user: ``get`` of the discovery and health paths (``/api``,
  ``/apis/...``, ``/version``, ``/healthz``, ...), as the built-in ClusterRoles
  ``system:discovery`` and ``system:public-info-viewer`` grant;
- a node (user ``system:node:<node>`` in group ``system:nodes``), as the Node
  authorizer and NodeRestriction allow it:

  - its own lease in ``kube-node-lease``: ``get``, ``update``, ``patch``, ``delete``,
    and ``create`` of a body named as the node; no other lease, no list or watch
    (the Node authorizer has no opinion on those and the pool's Roles grant nodes
    nothing), no lease outside ``kube-node-lease`` (NodeRestriction refuses a node's
    lease writes anywhere else);
  - ``get``, ``list``, ``watch`` of its own Node only (the node lease names its Node as
    owner; the Node authorizer with ``AuthorizeNodeWithSelectors`` lets a node read
    no other);
- the pool's agents (group ``openyurt:yurthub``, the certs Secret's
  ``yurt-coordinator-yurthub-client`` pair, which names no node), as the pool's Roles
  grant them:

  - leases in ``kube-node-lease``: ``list``, ``watch`` (the leader forwards the
    heartbeats of cut-off members, the pool page shows them), never a ``get`` of one
    (nothing asks) nor a write;
  - the named leases (by default ``kube-system/yurthub``, the election lease, and
    ``kube-system/leader-informer-sync``, the informer sync lease): ``get``,
    ``update``, ``patch``, ``delete`` by name, ``create`` of a body of that name,
    ``list``, ``watch`` only with ``fieldSelector=metadata.name=<that name>`` (as RBAC
    ``resourceNames`` allow). Every agent contends for the election lease; a new
    leader deletes the informer sync lease, then creates and renews it;
- any other user, and a node whose name is empty: nothing but the paths above.

So each agent writes its own node lease as its node and nothing else as a node; what
the pool shares (the election, the informer sync lease, the reads of the pool's node
leases) it does as the pool's agent, an identity that can write no node lease at all.

Refusals are kube-apiserver's: the authorizer's ``<resource>.<group> "<name>" is
forbidden: User "<user>" cannot <verb> resource "<resource>" in API group "<group>" in
the namespace "<namespace>"``, followed by the Node authorizer's reason for a node;
NodeRestriction's ``leases.coordination.k8s.io "<name>" is forbidden: can only access
node lease with the same name as the requesting node`` for a node creating another
node's lease (the authorizer does not know the name of a create, the admission plugin
reads it from the object).

One difference from kube-apiserver, stricter: RBAC cannot limit a ``create`` by name,
so a coordinator's Role lets the pool's agents create any lease in ``kube-system``,
where this authorizer allows only the named ones.
"""

import json
from typing import Any, Iterable, NamedTuple, Optional

from zope.interface import Interface, implementer

from yurtcoord.names import (
    ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE, INFORMER_SYNC_LEASE_NAME,
    INFORMER_SYNC_LEASE_NAMESPACE, NODE_LEASE_NAMESPACE)
from yurtcoord.sim.apiserver import status
from yurtcoord.sim.apiserver.requestlog import LEASE_GROUP, RequestAttributes

MASTERS_GROUP = "system:masters"
NODES_GROUP = "system:nodes"
AUTHENTICATED_GROUP = "system:authenticated"
NODE_USER_PREFIX = "system:node:"
# The group of the pool's agents' shared coordinator identity (the certs Secret's
# yurt-coordinator-yurthub-client certificate).
POOL_AGENTS_GROUP = "openyurt:yurthub"

# The paths every authenticated user may get (system:discovery and
# system:public-info-viewer); a trailing "*" matches any rest.
DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                  "/openapi", "/openapi/*", "/readyz", "/version", "/version/")

DEFAULT_NAMED_LEASES = ((ELECTION_LEASE_NAMESPACE, ELECTION_LEASE_NAME),
                        (INFORMER_SYNC_LEASE_NAMESPACE, INFORMER_SYNC_LEASE_NAME))

# The Node authorizer's reasons, word for word, which kube-apiserver appends to its
# refusal of a node.
ONLY_OWN_LEASE = "can only access node lease with the same name as the requesting node"
ONLY_LEASE_VERBS = "can only get, create, update, patch, or delete a node lease"
ONLY_NODE_LEASE_NAMESPACE = f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace'

_POOL_LEASE_READS = frozenset(("list", "watch"))
_NODE_LEASE_VERBS = frozenset(("get", "create", "update", "patch", "delete"))
_NAMED_LEASE_VERBS = frozenset(("get", "list", "watch", "create", "update", "patch", "delete"))
_NODE_READS = frozenset(("get", "list", "watch"))


class User(NamedTuple):
    """An authenticated user: ``name`` and ``groups`` (``system:authenticated`` among
    them), as kube-apiserver's client certificate authenticator makes them."""

    name: str
    groups: tuple[str, ...]

    @classmethod
    def from_subject(cls, common_names: Iterable[str],
                     organizations: Iterable[str]) -> Optional["User"]:
        """The user a certificate subject names, or None when it names none: a
        certificate without a common name authenticates nobody (as in
        kube-apiserver), and one with several is refused rather than guessed."""
        names = list(common_names)
        if len(names) != 1 or not names[0]:
            return None
        groups = tuple(dict.fromkeys([*organizations, AUTHENTICATED_GROUP]))
        return cls(names[0], groups)

    def node_name(self) -> Optional[str]:
        """The node this user is (``""`` for ``system:node:`` alone), or None when it is
        no node: the name must start with ``system:node:`` and the groups hold
        ``system:nodes``, as kube-apiserver's node identifier requires."""
        if NODES_GROUP not in self.groups or not self.name.startswith(NODE_USER_PREFIX):
            return None
        return self.name[len(NODE_USER_PREFIX):]


class Refusal(NamedTuple):
    """A request refused: the Status code, reason and message kube-apiserver answers
    and the object the Status's ``details`` name (``resource`` is its ``kind``)."""

    code: int
    reason: str
    message: str
    name: str = ""
    group: str = ""
    resource: str = ""

    def status(self) -> dict[str, Any]:
        """The Status object to answer."""
        return status.failure(self.code, self.message, reason=self.reason,
                              name=self.name or None, group=self.group or None,
                              kind=self.resource or None)


UNAUTHORIZED = Refusal(401, "Unauthorized", "Unauthorized")


class IAuthorizer(Interface):
    """Decides whether an authenticated user may make a request, before the server
    reads or writes any object for it."""

    def authorize(user: User, request: RequestAttributes, body_name: str) -> Optional[Refusal]:
        """None to serve ``request`` (as the authorizer sees it, see
        ``requestlog.RequestAttributes``) for ``user``, else the refusal to answer.
        ``body_name`` is the name in the body of a create (``metadata.name``; ``""``
        when it has none, as before a ``generateName`` is filled in, or is no
        create)."""


def _quoted(text: str) -> str:
    """``text`` in double quotes, as Go's ``%q`` writes printable text."""
    return json.dumps(text, ensure_ascii=False)


def _forbidden(user: User, request: RequestAttributes, reason: str = "",
               name: str = "") -> Refusal:
    """kube-apiserver's refusal by its authorizers: who cannot do what, where, and
    the reason an authorizer gave (``""``: none). ``name`` is the object named, which
    is the request's unless it is a create."""
    if not request.is_resource_request:
        text = f"User {_quoted(user.name)} cannot {request.verb} path {_quoted(request.path)}"
    else:
        resource = request.resource
        if request.subresource:
            resource += "/" + request.subresource
        where = (f"in the namespace {_quoted(request.namespace)}" if request.namespace
                 else "at the cluster scope")
        text = (f"User {_quoted(user.name)} cannot {request.verb} resource "
                f"{_quoted(resource)} in API group {_quoted(request.group)} {where}")
    if reason:
        text += ": " + reason
    return _forbidden_object(request, name or request.name, text)


def _forbidden_object(request: RequestAttributes, name: str, why: str) -> Refusal:
    """apimachinery's Forbidden error for ``name`` of the request's resource."""
    if not request.is_resource_request:
        return Refusal(403, "Forbidden", f"forbidden: {why}")
    qualified = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f"{qualified} {_quoted(name)}" if name else qualified
    return Refusal(403, "Forbidden", f"{subject} is forbidden: {why}", name,
                   request.group, request.resource)


def _url_allowed(path: str) -> bool:
    return any(path == url or (url.endswith("*") and path.startswith(url[:-1]))
               for url in DISCOVERY_URLS)


@implementer(IAuthorizer)
class PoolCoordinatorAuthorizer:
    """The pool coordinator's authorization (see the module doc): masters may do
    anything, nodes only their own node lease and Node, the pool's agents the reads of
    the pool's node leases and the named leases; ``named_leases`` are (namespace, name)
    pairs, by default the election lease and the informer sync lease."""

    def __init__(self, named_leases: Iterable[tuple[str, str]] = DEFAULT_NAMED_LEASES) -> None:
        self.named_leases = frozenset(named_leases)

    def authorize(self, user: User, request: RequestAttributes,
                  body_name: str) -> Optional[Refusal]:
        if MASTERS_GROUP in user.groups:
            return None
        if not request.is_resource_request:
            if request.verb == "get" and _url_allowed(request.path):
                return None
            return _forbidden(user, request)
        node = user.node_name()
        is_lease = request.group == LEASE_GROUP and request.resource == "leases"
        if node is not None:
            if not node:
                return _forbidden(user, request, f"unknown node for user {_quoted(user.name)}")
            if request.subresource:
                return _forbidden(user, request, self._node_reason(node, request))
            if is_lease:
                return self._node_lease(user, node, request, body_name)
            if request.group == "" and request.resource == "nodes":
                return self._node(user, node, request)
            return _forbidden(user, request)
        if POOL_AGENTS_GROUP in user.groups and is_lease and not request.subresource:
            return self._pool_lease(user, request, body_name)
        return _forbidden(user, request)

    def _node_lease(self, user: User, node: str, request: RequestAttributes,
                    body_name: str) -> Optional[Refusal]:
        """The Node authorizer, then NodeRestriction's check of a create's name."""
        reason = self._node_reason(node, request)
        if reason:
            return _forbidden(user, request, reason,
                              body_name if request.verb == "create" else "")
        if request.verb == "create" and body_name != node:
            # The Node authorizer lets a node create a lease here; NodeRestriction
            # then refuses any but its own, by the name in the object.
            return _forbidden_object(request, body_name or "Unknown", ONLY_OWN_LEASE)
        return None

    def _pool_lease(self, user: User, request: RequestAttributes,
                    body_name: str) -> Optional[Refusal]:
        """The pool's Roles: reads of the node leases, the named leases by name."""
        verb, namespace = request.verb, request.namespace
        if namespace == NODE_LEASE_NAMESPACE and verb in _POOL_LEASE_READS:
            return None
        if verb in _NAMED_LEASE_VERBS:
            name = body_name if verb == "create" else request.name
            if (namespace, name) in self.named_leases:
                return None
            if verb == "create":
                return _forbidden(user, request, name=body_name)
        return _forbidden(user, request)

    @staticmethod
    def _node_reason(node: str, request: RequestAttributes) -> str:
        """The reason the Node authorizer gives for not allowing a node's lease
        request ("" when it allows it; a create's name is NodeRestriction's check)."""
        if request.group != LEASE_GROUP or request.resource != "leases":
            return ""
        if request.verb not in _NODE_LEASE_VERBS:
            return ONLY_LEASE_VERBS
        if request.namespace != NODE_LEASE_NAMESPACE:
            return ONLY_NODE_LEASE_NAMESPACE
        if request.verb != "create" and request.name != node:
            return ONLY_OWN_LEASE
        return ""

    @staticmethod
    def _node(user: User, node: str, request: RequestAttributes) -> Optional[Refusal]:
        if request.verb in _NODE_READS:
            if request.name == node:
                return None
            if request.name:
                reason = f"node '{node}' cannot read '{request.name}', only its own Node object"
            else:
                reason = f"node '{node}' cannot read all nodes, only its own Node object"
            return _forbidden(user, request, reason)
        return _forbidden(user, request)
