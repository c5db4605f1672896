"""An informer stand-in for fast unit tests: the test emits the events.

Code under test registers handlers and starts and stops it as it would a
``yurtcoord.kube.informer.Informer``; the test calls ``add``/``update``/``delete`` to
deliver events and fires ``sync`` to end the initial list.
"""

from twisted.internet import defer


class FakeInformer:
    """Delivers the events a test emits; counts starts and stops.

    ``synced``: None leaves ``sync`` (what ``wait_for_sync()`` returns) unfired for
    the test to fire; any other value makes it fire at once with that value.
    """

    def __init__(self, synced=None):
        self.handlers = []
        self.started = 0
        self.stopped = 0
        self.sync = defer.Deferred() if synced is None else defer.succeed(synced)

    def add_handler(self, on_add=None, on_update=None, on_delete=None, filter=None):
        self.handlers.append((on_add, on_update, on_delete))

    def start(self):
        self.started += 1

    def stop(self):
        self.stopped += 1
        return defer.succeed(None)

    def wait_for_sync(self):
        return self.sync

    def add(self, obj):
        for on_add, _, _ in self.handlers:
            on_add(obj)

    def update(self, old, new):
        for _, on_update, _ in self.handlers:
            on_update(old, new)

    def delete(self, obj):
        for _, _, on_delete in self.handlers:
            on_delete(obj)
