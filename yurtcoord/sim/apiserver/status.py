"""Kubernetes ``Status`` objects, as the API server sends them for errors and
successful deletes, and the typed errors that carry them."""

from typing import TYPE_CHECKING, Any

from yurtcoord.kube.errors import KubeError, error_from_status

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.catalog import ResourceType

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def failure(code: int, message: str, reason: str | None = None, name: str | None = None,
            group: str | None = None, kind: str | None = None,
            causes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Failure Status dict as kube-apiserver writes it (its fields in that order)."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
    }
    details = _details(name=name, group=group, kind=kind, causes=causes or None)
    if details:
        status["details"] = details
    status["code"] = code
    return status


def success(name: str | None = None, group: str | None = None, kind: str | None = None,
            uid: str | None = None) -> dict[str, Any]:
    details = _details(name=name, group=group, kind=kind, uid=uid)
    status: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details:
        status["details"] = details
    return status


def error(code: int, message: str, **kwargs: Any) -> KubeError:
    """A typed KubeError (see ``yurtcoord.kube.errors``) carrying its Status dict."""
    return error_from_status(code, failure(code, message, **kwargs))


def not_found(resource_type: "ResourceType", name: str) -> KubeError:
    return error(404, f'{resource_type.qualified_name} "{name}" not found',
                 name=name, group=resource_type.gvr.group, kind=resource_type.gvr.resource)


def already_exists(resource_type: "ResourceType", name: str) -> KubeError:
    return error(409, f'{resource_type.qualified_name} "{name}" already exists',
                 reason="AlreadyExists", name=name, group=resource_type.gvr.group,
                 kind=resource_type.gvr.resource)


def conflict(resource_type: "ResourceType", name: str,
             why: str = "the object has been modified; please apply your "
             "changes to the latest version and try again") -> KubeError:
    return error(409, f'Operation cannot be fulfilled on {resource_type.qualified_name} '
                      f'"{name}": {why}',
                 reason="Conflict", name=name, group=resource_type.gvr.group,
                 kind=resource_type.gvr.resource)


def invalid(resource_type: "ResourceType", name: str | None, field: str,
            message: str) -> KubeError:
    cause = {"reason": "FieldValueInvalid", "message": message, "field": field}
    return error(422, f'{resource_type.kind} "{name or ""}" is invalid: {field}: {message}',
                 name=name, group=resource_type.gvr.group, kind=resource_type.kind,
                 causes=[cause])


def bad_request(message: str) -> KubeError:
    return error(400, message)


def expired(requested: object, oldest: object) -> KubeError:
    return error(410, f"too old resource version: {requested} ({oldest})")


def status_of(kube_error: KubeError) -> dict[str, Any]:
    """The Status dict of a KubeError (built if it came without one)."""
    if isinstance(kube_error.status, dict):
        return kube_error.status
    code = kube_error.code or 500
    return failure(code, kube_error.message or str(kube_error), reason=kube_error.reason)


def _details(**fields: Any) -> dict[str, Any]:

    """A Status ``details`` object: the fields that are set, in the order given."""
    return {key: value for key, value in fields.items() if value is not None}
