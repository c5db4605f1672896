"""Typed errors of the Kubernetes API, built from its ``Status`` objects."""


class KubeError(Exception):
    """An API call failed. ``code`` is the HTTP code (0 when there was no answer),
    ``reason`` the Status reason, ``status`` the Status object when one came back."""

    code = 0
    reason = ""

    def __init__(self, message="", code=None, reason=None, status=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason
        self.status = status

    def __str__(self):
        parts = [self.message or self.__class__.__name__]
        if self.code:
            parts.append(f"code={self.code}")
        if self.reason:
            parts.append(f"reason={self.reason}")
        return " ".join(parts)


class BadRequest(KubeError):
    code, reason = 400, "BadRequest"


class Unauthorized(KubeError):
    code, reason = 401, "Unauthorized"


class Forbidden(KubeError):
    code, reason = 403, "Forbidden"


class NotFound(KubeError):
    code, reason = 404, "NotFound"


class Conflict(KubeError):
    """409 on update: the object changed since it was read (stale resourceVersion)."""

    code, reason = 409, "Conflict"


class AlreadyExists(Conflict):
    """409 on create: an object of that name exists."""

    code, reason = 409, "AlreadyExists"


class Gone(KubeError):
    """410: the requested resourceVersion is older than the server's history."""

    code, reason = 410, "Expired"


class Invalid(KubeError):
    code, reason = 422, "Invalid"


class ServerError(KubeError):
    """5xx, or an answer that is not valid Kubernetes JSON."""

    code, reason = 500, "InternalError"


class Timeout(KubeError):
    """No (complete) answer within the request timeout."""

    code, reason = 0, "Timeout"


class ConnectionFailed(KubeError):
    """The server could not be reached or dropped the connection."""

    code, reason = 0, "ConnectionFailed"


class ResponseTooLarge(KubeError):
    """An answer body or one watch line grew past the client's bound; the connection
    was dropped without reading the rest."""

    code, reason = 0, "ResponseTooLarge"


class ListTooLong(KubeError):
    """One list went on for more pages than a list may have (a server that keeps
    answering with a continue token)."""

    code, reason = 0, "ListTooLong"


_BY_REASON = {
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "NotFound": NotFound,
    "Expired": Gone,
    "Gone": Gone,
    "Invalid": Invalid,
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "BadRequest": BadRequest,
}

_BY_CODE = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def _text(value):
    return value if isinstance(value, str) else ""


def error_from_status(code: int, status: object = None) -> KubeError:
    """The typed error for an HTTP ``code`` and an optional decoded Status dict."""
    reason = message = ""
    if isinstance(status, dict):
        # A Status from a broken or hostile peer may hold anything: only a text
        # reason and message and an integer code are taken from it.
        reason = _text(status.get("reason"))
        message = _text(status.get("message"))
        status_code = status.get("code")
        if type(status_code) is int and status_code:
            code = status_code
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code)
    if cls is None:
        cls = ServerError if code >= 500 or code == 0 else KubeError
    return cls(message or f"HTTP {code}", code=code, reason=reason or cls.reason, status=status)
