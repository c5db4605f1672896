"""Why a request failed, and whether it was cancelled, also through the HTTP client's
wrappers."""

from twisted.internet import defer
from twisted.internet.error import ConnectingCancelledError, ConnectionLost
from twisted.python.failure import Failure
from twisted.trial import unittest
from twisted.web.client import RequestTransmissionFailed, ResponseFailed, ResponseNeverReceived

from yurtcoord.tx.failures import describe_failure, is_cancellation


def failure_of(error):
    try:
        raise error
    except Exception:
        return Failure()


class DescribeFailureTests(unittest.TestCase):
    def test_names_the_type_and_the_message(self):
        self.assertEqual(describe_failure(failure_of(ValueError("bad value"))),
                         "ValueError: bad value")

    def test_names_every_cause_of_a_wrapped_failure_instead_of_the_wrapper(self):
        wrapped = ResponseNeverReceived([failure_of(ConnectionLost("reset by peer")),
                                         failure_of(ValueError("odd"))])
        text = describe_failure(failure_of(wrapped))
        self.assertEqual(text, "ConnectionLost: Connection to the other side was lost in a "
                               "non-clean fashion: reset by peer.; ValueError: odd")

    def test_a_wrapper_without_causes_is_described_itself(self):
        self.assertEqual(describe_failure(failure_of(ResponseFailed([]))),
                         "ResponseFailed: []")


class IsCancellationTests(unittest.TestCase):
    def test_a_cancelled_deferred_is_a_cancellation(self):
        d = defer.Deferred()
        d.cancel()
        self.assertTrue(is_cancellation(self.failureResultOf(d)))

    def test_a_cancel_while_connecting_is_a_cancellation(self):
        self.assertTrue(is_cancellation(failure_of(ConnectingCancelledError(None))))

    def test_a_cancellation_wrapped_by_the_http_client_is_one(self):
        for wrapper in (ResponseNeverReceived, ResponseFailed, RequestTransmissionFailed):
            wrapped = wrapper([failure_of(defer.CancelledError())])
            self.assertTrue(is_cancellation(failure_of(wrapped)), wrapper)

    def test_other_failures_are_not(self):
        self.assertFalse(is_cancellation(failure_of(ConnectionLost())))
        wrapped = ResponseFailed([failure_of(ConnectionLost())])
        self.assertFalse(is_cancellation(failure_of(wrapped)))
