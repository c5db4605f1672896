"""The handlers a test registers on an informer, replaying what they are told into
a dict of objects by key: each add, update and delete must agree with what the
earlier calls left (no add of a present key, no update with a stale old object, no
delete of an absent key), whether the informer runs on a Clock against a scripted
client or against the Kubernetes API test server."""

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from yurtcoord.kube.informer import object_key


class Recorder:
    """Replays handler calls into a dict, asserting each is consistent with it."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test
        self.state: dict[str, Any] = {}
        self.calls: list[tuple[str, str]] = []

    def on_add(self, obj: Any) -> None:
        key = object_key(obj)
        self.calls.append(("add", key))
        self.test.assertNotIn(key, self.state, f"add of {key} that is already present")
        self.state[key] = obj

    def on_update(self, old: Any, new: Any) -> None:
        key = object_key(new)
        self.calls.append(("update", key))
        self.test.assertEqual(self.state.get(key), old, f"update of {key} with a stale old")
        self.state[key] = new

    def on_delete(self, obj: Any) -> None:
        key = object_key(obj)
        self.calls.append(("delete", key))
        self.test.assertIn(key, self.state, f"delete of {key} that is absent")
        del self.state[key]
