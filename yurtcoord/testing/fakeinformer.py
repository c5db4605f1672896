"""An informer stand-in for fast unit tests: the test emits the events.

Code under test registers handlers and starts and stops it as it would a
``yurtcoord.kube.informer.Informer``; the test calls ``add``/``update``/``delete`` to
deliver events and fires ``sync`` to end the initial list.
"""

from typing import Any, Callable, Optional

from twisted.internet import defer

Handler = Optional[Callable[..., object]]


class FakeInformer:
    """Delivers the events a test emits; counts starts and stops.

    ``synced``: None leaves ``sync`` (what ``wait_for_sync()`` returns) unfired for
    the test to fire; any other value makes it fire at once with that value.
    """

    def __init__(self, synced: object = None) -> None:
        self.handlers: list[tuple[Any, Any, Any]] = []
        self.started = 0
        self.stopped = 0
        self.sync: defer.Deferred[Any] = (
            defer.Deferred() if synced is None else defer.succeed(synced))

    def add_handler(self, on_add: Handler = None, on_update: Handler = None,
                    on_delete: Handler = None, filter: Handler = None) -> None:
        self.handlers.append((on_add, on_update, on_delete))

    def start(self) -> None:
        self.started += 1

    def stop(self) -> defer.Deferred[None]:
        self.stopped += 1
        return defer.succeed(None)

    def wait_for_sync(self) -> defer.Deferred[Any]:
        return self.sync

    def add(self, obj: dict[str, Any]) -> None:
        for on_add, _, _ in self.handlers:
            on_add(obj)

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        for _, on_update, _ in self.handlers:
            on_update(old, new)

    def delete(self, obj: dict[str, Any]) -> None:

        for _, _, on_delete in self.handlers:
            on_delete(obj)
