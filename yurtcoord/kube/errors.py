"""Typed errors of the Kubernetes API, built from its ``Status`` objects."""

from yurtcoord.tx.jsondecode import decode_json as decode


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


_MESSAGE_LIMIT = 1000


def _http_code(value: object) -> int:
    """``value`` as an HTTP status code, or 0 when it is not one (a string, a bool,
    a number out of range): a peer's Status may carry any JSON in ``code``."""
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return 0


def _text(value: object) -> str:
    """A Status string field, or "" when it holds anything else; bounded, since it
    ends up in log lines."""
    if not isinstance(value, str):
        return ""
    return value[:_MESSAGE_LIMIT]


def error_from_status(code: object, status: object = None, message: str = "") -> KubeError:
    """The typed error for an HTTP ``code`` and an optional decoded Status dict.

    The HTTP code chooses the class. The Status ``reason`` only refines it among the
    classes of that code (``AlreadyExists`` or ``Conflict`` for 409), and the Status
    ``code`` stands in only when there is no HTTP code (an ERROR event of a watch).
    Fields of the wrong type are ignored, so any Status a peer sends gives a typed
    error. ``message`` is used when the Status has none.
    """
    code = _http_code(code)
    reason = ""
    if isinstance(status, dict):
        reason = _text(status.get("reason"))
        message = _text(status.get("message")) or message
        if not code:
            code = _http_code(status.get("code"))
    else:
        status = None
    cls = _BY_REASON.get(reason)
    if cls is None or (code and cls.code != code):
        cls = _BY_CODE.get(code)
    if cls is None:
        cls = ServerError if code >= 500 or code == 0 else KubeError
    return cls(message or f"HTTP {code}", code=code or cls.code, reason=reason or cls.reason,
               status=status)


def decode_json(body: bytes) -> object:
    """``body`` decoded as JSON (``yurtcoord.tx.jsondecode``); ``ValueError`` for
    anything that is not, including bytes that are not UTF-8 and nesting too deep for
    the parser (which raises ``RecursionError`` on its own)."""
    try:
        return decode(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def error_for_response(code: int, body: bytes, url: str) -> KubeError:
    """The typed error for an answer with error ``code`` and ``body``, whatever the
    body holds: a Status (of any shape), other JSON, bytes that are not JSON or not
    UTF-8, nesting too deep to parse, or nothing."""
    status = None
    if body:
        try:
            status = decode_json(body)
        except ValueError:
            status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        return error_from_status(code, status, f"HTTP {code} from {url}")
    snippet = body[:120].decode("utf-8", "replace")
    return error_from_status(code, None, f"HTTP {code} from {url}: {snippet!r}")
