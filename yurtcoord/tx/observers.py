"""Observers of one kind of change, told in the turn the change happens: the product's
one mechanism for it (see docs/design.md, "One of each").

A part that others follow (the coordinator's role and readiness, the heartbeat
delegation's forwards) keeps one ``Observers`` per kind of change and offers an
``add_..._observer`` method that registers with it. ``notify`` calls every observer in
the order they registered; an observer that raises is logged and keeps neither the
part nor the observers after it from going on, so a broken status page or sandbox line
never changes what the agent does. A part whose observers' failures are errors of
one of its guarded loops (the reactor lag probe's) passes ``on_error`` instead, which
gets each failure in place of the log line (``yurtcoord.tx.guardedloop``).
"""

from typing import Callable, Generic, List, Optional, ParamSpec

from twisted.logger import Logger
from twisted.python.failure import Failure

P = ParamSpec("P")


class Observers(Generic[P]):
    """The observers of one kind of change; ``what`` names it in the log line of an
    observer that failed (e.g. ``"role change on node edge-1"``); ``on_error``, when
    given, gets the failure of an observer instead of that line."""

    log = Logger()

    def __init__(self, what: str,
                 on_error: Optional[Callable[[Failure], object]] = None) -> None:
        self.what = what
        self._on_error = on_error
        self._observers: List[Callable[P, object]] = []

    def add(self, observer: Callable[P, object]) -> None:
        """Call ``observer`` on every later change."""
        self._observers.append(observer)

    def remove(self, observer: Callable[P, object]) -> None:
        """Stop calling ``observer``; nothing when it is not registered."""
        if observer in self._observers:
            self._observers.remove(observer)

    def __len__(self) -> int:
        return len(self._observers)

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every observer with the change, in registration order."""
        for observer in list(self._observers):
            try:
                observer(*args, **kwargs)
            except Exception:
                if self._on_error is not None:
                    self._on_error(Failure())
                else:
                    self.log.failure("observer {observer!r} of {what} failed",
                                     observer=observer, what=self.what)
