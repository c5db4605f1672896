"""RBAC rules evaluated the way the apiserver's RBAC authorizer does, against requests.

The shipped manifests (``deploy/``) grant the agent exactly what it asks of each
apiserver. ``RBACPolicy.from_documents`` reads the Roles, ClusterRoles and their
bindings to the agent's subjects out of manifest documents; ``check_policy`` then
holds a list of ``RequestAttributes`` (what the API test servers' request logs say the
agents asked, see ``yurtcoord.sim.apiserver.requestlog.request_attributes``) against
it and reports both ways:

- a request no rule allows (the agent would be refused: a rule is missing);
- a permission no request used (a rule, or one verb, resource, group or resource name
  of it, grants more than the agent needs);
- a permission whose every request another rule allows as well (it could go);
- a wildcard (``*``) anywhere in a rule: it is never exactly what the agent needs.

A permission is one (group, resource, verb, resource name) of a rule: a rule with
``verbs: [get, update]`` and ``resourceNames: [a, b]`` is four permissions, each of
which some request must use. Non-resource requests (discovery such as ``/api/v1``)
are allowed by the cluster's built-in ``system:discovery`` ClusterRole, which every
authenticated user holds, unless a shipped rule names their URL.
"""

from typing import Any, Iterable, Mapping, NamedTuple, Sequence

# The non-resource URLs of the built-in ClusterRoles system:discovery and
# system:public-info-viewer, which the apiserver binds to every authenticated user.
from yurtcoord.sim.apiserver.authz import DISCOVERY_URLS
from yurtcoord.sim.apiserver.requestlog import RequestAttributes

RBAC_GROUP = "rbac.authorization.k8s.io"


class Subject(NamedTuple):
    """A binding subject: ``kind`` User, Group or ServiceAccount; ``namespace`` only
    for a ServiceAccount."""

    kind: str
    name: str
    namespace: str = ""


class Rule(NamedTuple):
    """One PolicyRule of a Role or ClusterRole, where ``role`` names it in messages
    (``Role kube-system/yurtcoord rule 1``) and ``namespace`` is where it applies:
    the Role's or RoleBinding's namespace, ``""`` everywhere (a ClusterRole bound
    by a ClusterRoleBinding)."""

    role: str
    namespace: str
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.non_resource_urls:
            return f"{self.role}: {','.join(self.verbs)} {','.join(self.non_resource_urls)}"
        names = f" names {','.join(self.resource_names)}" if self.resource_names else ""
        groups = ",".join(group or "core" for group in self.api_groups)
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        return (f"{self.role}: {','.join(self.verbs)} {groups} "
                f"{','.join(self.resources)}{names}{where}")

    def permissions(self) -> list["Permission"]:
        """Every (group, resource, verb, name) this rule grants, each to be used."""
        if self.non_resource_urls:
            return [Permission(self, "", url, verb, "")
                    for url in self.non_resource_urls for verb in self.verbs]
        return [Permission(self, group, resource, verb, name)
                for group in self.api_groups for resource in self.resources
                for verb in self.verbs for name in (self.resource_names or ("",))]

    def allows(self, request: RequestAttributes) -> list["Permission"]:
        """The permissions of this rule that allow ``request`` (none: refused)."""
        return [p for p in self.permissions() if p.allows(request)]


class Permission(NamedTuple):
    """One grant of a rule: ``resource`` may carry a subresource (``nodes/status``);
    for a non-resource rule ``resource`` is the URL and ``group`` is empty."""

    rule: Rule
    group: str
    resource: str
    verb: str
    name: str

    def describe(self) -> str:
        if self.rule.non_resource_urls:
            return f"{self.verb} {self.resource} ({self.rule.role})"
        name = f" {self.name}" if self.name else ""
        where = f" in {self.rule.namespace}" if self.rule.namespace else " cluster-wide"
        return (f"{self.verb} {self.group or 'core'} {self.resource}{name}{where} "
                f"({self.rule.role})")

    def allows(self, request: RequestAttributes) -> bool:
        if self.verb not in ("*", request.verb):
            return False
        if self.rule.non_resource_urls:
            return not request.is_resource_request and _url_matches(self.resource, request.path)
        if not request.is_resource_request:
            return False
        if self.rule.namespace and request.namespace != self.rule.namespace:
            return False
        if self.group not in ("*", request.group):
            return False
        if not _resource_matches(self.resource, request.resource, request.subresource):
            return False
        return not self.name or self.name == request.name


def _url_matches(rule_url: str, path: str) -> bool:
    if rule_url == "*" or rule_url == path:
        return True
    return rule_url.endswith("*") and path.startswith(rule_url[:-1])


def _resource_matches(rule_resource: str, resource: str, subresource: str) -> bool:
    if rule_resource == "*":
        return True
    requested = f"{resource}/{subresource}" if subresource else resource
    if rule_resource == requested:
        return True
    # "*/scale" grants one subresource of every resource.
    return bool(subresource) and rule_resource == f"*/{subresource}"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: not a list of strings: {value!r}")
    return tuple(value)


def _rules_of(role: Mapping[str, Any], role_name: str, namespace: str) -> list[Rule]:
    rules = []
    for index, rule in enumerate(role.get("rules") or [], start=1):
        where = f"{role_name} rule {index}"
        rules.append(Rule(
            where, namespace, _strings(rule.get("apiGroups"), where),
            _strings(rule.get("resources"), where), _strings(rule.get("verbs"), where),
            _strings(rule.get("resourceNames"), where),
            _strings(rule.get("nonResourceURLs"), where)))
    return rules


def _subjects_of(binding: Mapping[str, Any]) -> set[Subject]:
    subjects = set()
    for subject in binding.get("subjects") or []:
        kind = subject.get("kind", "")
        namespace = subject.get("namespace", "") if kind == "ServiceAccount" else ""
        subjects.add(Subject(kind, subject.get("name", ""), namespace))
    return subjects


class RBACPolicy:
    """The rules bound to some subjects by a set of manifest documents."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)

    @classmethod
    def from_documents(cls, documents: Iterable[Mapping[str, Any]],
                       subjects: Iterable[Subject]) -> "RBACPolicy":
        """The rules of the Roles and ClusterRoles that a RoleBinding or
        ClusterRoleBinding among ``documents`` binds to any of ``subjects``.

        A binding naming a role that is not among the documents is an error (it
        would bind nothing); so is a ClusterRoleBinding of a Role."""
        wanted = set(subjects)
        roles: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        bindings = []
        for document in documents:
            if not isinstance(document, Mapping):
                continue
            api_group = str(document.get("apiVersion", "")).split("/")[0]
            kind = document.get("kind")
            if api_group != RBAC_GROUP:
                continue
            metadata = document.get("metadata") or {}
            namespace = metadata.get("namespace", "") if kind in ("Role", "RoleBinding") else ""
            if kind in ("Role", "ClusterRole"):
                roles[(kind, namespace, metadata.get("name", ""))] = document
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                bindings.append((kind, namespace, metadata.get("name", ""), document))
        rules = []
        for kind, namespace, name, binding in bindings:
            if not _subjects_of(binding) & wanted:
                continue
            ref = binding.get("roleRef") or {}
            ref_kind, ref_name = str(ref.get("kind", "")), str(ref.get("name", ""))
            if kind == "ClusterRoleBinding" and ref_kind != "ClusterRole":
                raise ValueError(f"ClusterRoleBinding {name}: roleRef {ref_kind} {ref_name} "
                                 "is not a ClusterRole")
            role_namespace = namespace if ref_kind == "Role" else ""
            role = roles.get((ref_kind, role_namespace, ref_name))
            if role is None:
                raise ValueError(f"{kind} {name}: roleRef {ref_kind} {ref_name} is not "
                                 "among the documents")
            role_name = (f"{ref_kind} {role_namespace}/{ref_name}" if role_namespace
                         else f"{ref_kind} {ref_name}")
            rules += _rules_of(role, f"{role_name} (bound by {kind} {name})", namespace)
        return cls(rules)

    def allowing(self, request: RequestAttributes) -> list[Permission]:
        """Every permission of the policy that allows ``request``."""
        return [p for rule in self.rules for p in rule.allows(request)]


class PolicyCheck(NamedTuple):
    """What ``check_policy`` found; ``used`` maps each permission that some request
    used to the first such request."""

    denied: list[RequestAttributes]
    unused: list[Permission]
    redundant: list[Permission]
    wildcards: list[Rule]
    used: dict[Permission, RequestAttributes]

    @property
    def problems(self) -> list[str]:
        """One line per problem; empty when the policy is exactly what was asked."""
        lines = [f"not allowed: {request.describe()}" for request in self.denied]
        lines += [f"unused: {permission.describe()}" for permission in self.unused]
        lines += [f"redundant (another rule allows all its requests): {permission.describe()}"
                  for permission in self.redundant]
        lines += [f"wildcard: {rule.describe()}" for rule in self.wildcards]
        return lines


def _is_discovery(request: RequestAttributes) -> bool:
    return (not request.is_resource_request and request.verb == "get"
            and any(_url_matches(url, request.path) for url in DISCOVERY_URLS))


def _described(permission: Permission) -> tuple[str, str, str, str]:
    return (permission.verb, permission.resource, permission.name, permission.rule.namespace)


def check_policy(policy: RBACPolicy, requests: Iterable[RequestAttributes],
                 builtin: Sequence[Rule] = (),
                 unused_by_design: Iterable[tuple[str, str, str, str]] = (),
                 ) -> PolicyCheck:
    """Hold ``requests`` against ``policy`` both ways (see the module doc).

    ``builtin`` are rules another authorizer applies before RBAC (kube-apiserver's
    Node authorizer for a node's requests): a request they allow is not refused,
    and they need not be used. ``unused_by_design`` names permissions, as ``(verb,
    resource, resource name, namespace)``, that the policy grants on purpose although
    no request uses them; they are not reported unused."""
    denied: list[RequestAttributes] = []
    used: dict[Permission, RequestAttributes] = {}
    # Permissions that allowed some request no other rule allows.
    needed: set[Permission] = set()
    for request in dict.fromkeys(requests):
        allowing = policy.allowing(request)
        if not allowing and not _is_discovery(request) and not any(
                rule.allows(request) for rule in builtin):
            denied.append(request)
        for permission in allowing:
            used.setdefault(permission, request)
        if len({permission.rule for permission in allowing}) == 1:
            needed.update(allowing)
    permissions = [p for rule in policy.rules for p in rule.permissions()]
    by_design = set(unused_by_design)
    unused = [p for p in permissions if p not in used and _described(p) not in by_design]
    redundant = [p for p in permissions if p in used and p not in needed]
    wildcards = [rule for rule in policy.rules
                 if "*" in rule.verbs + rule.api_groups + rule.resources
                 or any(url.endswith("*") for url in rule.non_resource_urls)
                 or any(r.startswith("*/") for r in rule.resources)]
    return PolicyCheck(denied, unused, redundant, wildcards, used)


def describe_use(check: PolicyCheck) -> list[str]:
    """``<permission> <- <first request that used it>`` per used permission, for logs
    and the docs' table of rules."""
    return [f"{permission.describe()} <- {request.describe()}"
            for permission, request in check.used.items()]

