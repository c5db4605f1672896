"""The end-of-stream machine of ``yurtcoord.tx.lines``, shared by both watches: every
transition, the illegal input included, on a recording stream over an in-memory
transport."""

from automat import NoTransition
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial import unittest
from twisted.web.client import ResponseDone, ResponseFailed

from yurtcoord.tx.lines import LineStreamProtocol


class Broken(Exception):
    pass


class Recording(LineStreamProtocol):
    """Records lines and the end; a line ``b"bad"`` makes it fail."""

    def __init__(self, max_line: int = 16) -> None:
        super().__init__(max_line)
        self.lines_seen: list[bytes] = []
        self.ends: list[object] = []

    def line(self, line: bytes) -> None:
        if line == b"bad":
            self.fail(ValueError("bad line"))
        else:
            self.lines_seen.append(line)

    def too_long(self) -> None:
        self.fail(ValueError("too long"))

    def broken(self, why: str) -> BaseException:
        return Broken(why)

    def ended(self, error: BaseException | None) -> None:
        self.ends.append(error)


def connected() -> tuple[Recording, StringTransport]:
    stream, transport = Recording(), StringTransport()
    stream.makeConnection(transport)
    return stream, transport


CLEAN = Failure(ResponseDone("end"))
LOST = Failure(ResponseFailed([Failure(ConnectionLost("reset"))]))


class StreamingTests(unittest.TestCase):

    def test_lines_flow_while_streaming(self):
        stream, transport = connected()
        stream.dataReceived(b"a\nb")
        stream.dataReceived(b"c\n")
        self.assertEqual(stream.lines_seen, [b"a", b"bc"])
        self.assertTrue(stream.streaming)
        self.assertFalse(transport.disconnecting)

    def test_clean_end_ends_with_none(self):
        stream, _ = connected()
        stream.dataReceived(b"a\n")
        stream.connectionLost(CLEAN)
        self.assertEqual(stream.ends, [None])
        self.assertFalse(stream.streaming)

    def test_end_without_a_reason_is_clean(self):
        stream, _ = connected()
        stream.connectionLost(None)
        self.assertEqual(stream.ends, [None])

    def test_lost_connection_ends_with_broken(self):
        stream, _ = connected()
        stream.connectionLost(LOST)
        [error] = stream.ends
        self.assertIsInstance(error, Broken)
        self.assertTrue(str(error).startswith("lost: "), str(error))

    def test_end_in_the_middle_of_a_line_is_broken_even_when_clean(self):
        stream, _ = connected()
        stream.dataReceived(b"a\npartial")
        stream.connectionLost(CLEAN)
        [error] = stream.ends
        self.assertIsInstance(error, Broken)
        self.assertEqual(str(error), "cut in the middle of a line (7 bytes discarded)")
        self.assertEqual(stream.pending_bytes, 0)


class FailingTests(unittest.TestCase):

    def test_fail_drops_the_connection_and_stops_the_lines(self):
        stream, transport = connected()
        stream.dataReceived(b"a\nbad\nb\ntail")
        self.assertEqual(stream.lines_seen, [b"a"])
        self.assertFalse(stream.streaming)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(stream.pending_bytes, 0)
        self.assertEqual(stream.ends, [])
        stream.dataReceived(b"c\n")
        self.assertEqual(stream.lines_seen, [b"a"])

    def test_ends_with_its_error_however_the_connection_ends(self):
        for reason in (CLEAN, LOST, None):
            stream, _ = connected()
            error = ValueError("given up")
            stream.fail(error)
            stream.connectionLost(reason)
            self.assertEqual(stream.ends, [error])

    def test_first_error_wins(self):
        stream, _ = connected()
        first = ValueError("first")
        stream.fail(first)
        stream.fail(ValueError("second"))
        stream.connectionLost(LOST)
        self.assertEqual(stream.ends, [first])

    def test_cancel_while_failing_keeps_the_error(self):
        stream, _ = connected()
        first = ValueError("first")
        stream.fail(first)
        stream.cancel()
        stream.connectionLost(CLEAN)
        self.assertEqual(stream.ends, [first])

    def test_too_long_fails(self):
        stream, transport = connected()
        stream.dataReceived(b"x" * 17)
        self.assertTrue(transport.disconnecting)
        stream.connectionLost(LOST)
        [error] = stream.ends
        self.assertEqual(str(error), "too long")


class CancellingTests(unittest.TestCase):

    def test_cancel_drops_the_connection_and_ends_with_none(self):
        stream, transport = connected()
        stream.dataReceived(b"a\npartial")
        stream.cancel()
        self.assertTrue(transport.disconnecting)
        self.assertFalse(stream.streaming)
        self.assertEqual(stream.ends, [])
        stream.dataReceived(b"\nb\n")
        self.assertEqual(stream.lines_seen, [b"a"])
        stream.connectionLost(LOST)
        self.assertEqual(stream.ends, [None])
        self.assertEqual(stream.pending_bytes, 0)

    def test_a_later_error_or_cancel_changes_nothing(self):
        stream, _ = connected()
        stream.cancel()
        stream.fail(ValueError("late"))
        stream.cancel()
        stream.connectionLost(LOST)
        self.assertEqual(stream.ends, [None])


class EndedTests(unittest.TestCase):

    def ended(self) -> Recording:
        stream, _ = connected()
        stream.connectionLost(CLEAN)
        self.assertEqual(stream.ends, [None])
        return stream

    def test_cancel_after_the_end_is_harmless(self):
        stream = self.ended()
        stream.cancel()
        self.assertEqual(stream.ends, [None])

    def test_a_second_end_is_ignored(self):
        stream = self.ended()
        stream.connectionLost(LOST)
        self.assertEqual(stream.ends, [None])

    def test_data_after_the_end_is_ignored(self):
        stream = self.ended()
        stream.dataReceived(b"a\n")
        self.assertEqual(stream.lines_seen, [])

    def test_fail_after_the_end_is_illegal(self):
        stream = self.ended()
        self.assertRaises(NoTransition, stream.fail, ValueError("nowhere to go"))
        self.assertEqual(stream.ends, [None])

    def test_an_owner_that_cancels_from_the_end_callback_is_heard_after_it(self):
        stream, transport = connected()
        stream.ended = lambda error: (stream.ends.append(error),  # type: ignore[method-assign]
                                      stream.cancel())
        stream.connectionLost(CLEAN)
        self.assertEqual(stream.ends, [None])
        self.assertFalse(transport.disconnecting)
