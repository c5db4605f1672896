"""What a failure of a request means: one line that says why (``describe_failure``),
and whether it was a cancellation (``is_cancellation``).

Twisted's HTTP client reports a lost request as ``ResponseFailed``,
``ResponseNeverReceived`` or ``RequestTransmissionFailed`` whose message says nothing;
the causes are in its ``reasons``, a list of failures. Both helpers look at the causes
instead of the wrapper: a request cancelled (by a timeout, or a client that closes)
often fails with such a wrapper around the ``CancelledError``.
"""

from twisted.internet.defer import CancelledError
from twisted.internet.error import ConnectingCancelledError
from twisted.python.failure import Failure
from twisted.web.client import (
    RequestGenerationFailed, RequestTransmissionFailed, ResponseFailed, ResponseNeverReceived,
)

# The HTTP client's failures that carry their causes in ``reasons``.
_WRAPPERS = (ResponseFailed, ResponseNeverReceived, RequestTransmissionFailed,
             RequestGenerationFailed)
# What a cancelled request fails with: a cancel while the connection is still being
# made (a cut link drops the SYN, so connecting hangs) is ConnectingCancelledError.
_CANCELLATIONS = (CancelledError, ConnectingCancelledError)


def causes(failure: Failure) -> list:
    """The causes a failure of the HTTP client wraps (its ``reasons``), else none."""
    value = failure.value
    if isinstance(value, _WRAPPERS) and value.reasons:
        return list(value.reasons)
    return []


def describe_failure(failure: Failure) -> str:
    """``Type: message`` of ``failure``; for a failure of the HTTP client that wraps
    its causes, those of every cause, joined by ``; ``."""
    wrapped = causes(failure)
    if wrapped:
        return "; ".join(describe_failure(cause) if isinstance(cause, Failure)
                         else f"{type(cause).__name__}: {cause}" for cause in wrapped)
    return f"{type(failure.value).__name__}: {failure.getErrorMessage()}"


def is_cancellation(failure: Failure) -> bool:
    """Whether ``failure`` is a cancelled Deferred or request, also one the HTTP client
    wrapped (see the module doc)."""
    if failure.check(*_CANCELLATIONS):
        return True
    return any(isinstance(cause, Failure) and cause.check(*_CANCELLATIONS)
               for cause in causes(failure))
