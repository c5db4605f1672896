"""One transition table per state machine, checked in one place.

A machine's states are values (an ``enum.Enum``), its inputs are names, and its
table maps ``(state, input)`` to the next state. An input that the table does not
list for the current state is a programming error: ``TransitionTable.next`` raises
``IllegalTransition`` naming the machine, the state and the input, instead of the
owner guarding each method with flags.
"""

from typing import Generic, Hashable, Mapping, Tuple, TypeVar

S = TypeVar("S", bound=Hashable)


class IllegalTransition(Exception):
    """An input arrived in a state whose table has no transition for it."""


class TransitionTable(Generic[S]):
    """``transitions``: ``{(state, input): next state}``, the whole machine."""

    def __init__(self, name: str, transitions: Mapping[Tuple[S, str], S]) -> None:
        self.name = name
        self._transitions = dict(transitions)

    def next(self, state: S, event: str) -> S:
        """The state after ``event`` in ``state``; raises ``IllegalTransition``."""
        try:
            return self._transitions[(state, event)]
        except KeyError:
            raise IllegalTransition(
                f"{self.name}: no transition for input {event!r} in state {state!r}") from None
