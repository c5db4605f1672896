"""The one way a part tells its observers of a change (``yurtcoord.tx.observers``)."""

from twisted.trial import unittest

from yurtcoord.tx.observers import Observers


class ObserversTests(unittest.TestCase):
    def setUp(self):
        self.observers = Observers("test changes")
        self.heard = []

    def test_every_observer_hears_each_change_in_registration_order(self):
        self.observers.add(lambda node, outcome: self.heard.append(("first", node, outcome)))
        self.observers.add(lambda node, outcome: self.heard.append(("second", node, outcome)))
        self.observers.notify("edge-1", "created")
        self.observers.notify("edge-2", outcome="updated")
        self.assertEqual(self.heard, [("first", "edge-1", "created"),
                                      ("second", "edge-1", "created"),
                                      ("first", "edge-2", "updated"),
                                      ("second", "edge-2", "updated")])

    def test_a_failing_observer_is_logged_and_the_others_still_hear(self):
        def broken(change):
            raise RuntimeError("observer broke")

        self.observers.add(broken)
        self.observers.add(self.heard.append)
        self.observers.notify("leader")
        self.observers.notify("follower")
        self.assertEqual(self.heard, ["leader", "follower"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)

    def test_a_failure_goes_to_on_error_instead_of_the_log(self):
        failures = []
        observers = Observers("test changes", on_error=failures.append)

        def broken(change):
            raise RuntimeError("observer broke")

        observers.add(broken)
        observers.add(self.heard.append)
        observers.notify("leader")
        self.assertEqual(self.heard, ["leader"])
        self.assertEqual([f.type for f in failures], [RuntimeError])
        self.assertEqual(self.flushLoggedErrors(RuntimeError), [])

    def test_a_removed_observer_hears_nothing_more(self):
        self.observers.add(self.heard.append)
        self.observers.notify(1)
        self.observers.remove(self.heard.append)
        self.observers.remove(self.heard.append)  # not registered any more: nothing
        self.observers.notify(2)
        self.assertEqual(self.heard, [1])
        self.assertEqual(len(self.observers), 0)

    def test_an_observer_added_while_notifying_hears_the_next_change_only(self):
        def adds_another(change):
            self.heard.append(("adder", change))
            self.observers.add(lambda later: self.heard.append(("added", later)))

        self.observers.add(adds_another)
        self.observers.notify(1)
        self.assertEqual(self.heard, [("adder", 1)])
