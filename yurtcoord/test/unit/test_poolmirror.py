"""One pool-scoped resource's mirror on a Clock: every transition of its life's machine
(new, awaiting_list, mirroring, relisting, stopped), the illegal inputs of each state,
and what each transition writes to a fake pool store. The manager of the mirrors is
tested in test_poolsync."""

from automat import NoTransition
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.errors import ConnectionFailed
from yurtcoord.pool.interfaces import IPoolSyncMetrics
from yurtcoord.pool.mirror import ResourceMirror
from yurtcoord.testing.fakeinformer import FakeInformer
from yurtcoord.testing.fakepoolstore import FakePoolStore

ENDPOINTS_PREFIX = "/registry/services/endpoints/default/"


def endpoints(name, rv):
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)},
            "subsets": []}


@implementer(IPoolSyncMetrics)
class RecordingMetrics:
    """The events and loop errors a mirror counts, in order."""

    def __init__(self):
        self.events = []
        self.loop_errors = []

    def count_pool_sync_event(self, resource, event_type):
        self.events.append((resource, event_type))

    def count_loop_error(self, loop):
        self.loop_errors.append(loop)


class MirrorLifeTests(unittest.TestCase):

    def setUp(self):
        self.clock = Clock()
        self.store = FakePoolStore()
        self.informer = FakeInformer()
        self.metrics = RecordingMetrics()
        verifyObject(IPoolSyncMetrics, self.metrics)
        self.changes = []
        self.mirror = ResourceMirror(
            self.clock, self.store, self.informer, gvrs.ENDPOINTS, kind="Endpoints",
            metrics=self.metrics, on_change=lambda: self.changes.append(self.state()),
            retry_policy=lambda failures: 2.0 * failures)

    def tearDown(self):
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def state(self):
        return (self.mirror.listed, self.mirror.failing)

    def stored(self):
        return sorted(p[len(ENDPOINTS_PREFIX):] for p in self.store.objects
                      if p.startswith(ENDPOINTS_PREFIX))

    def writes(self):
        return [c for c in self.store.calls if c[0] in ("replace", "put", "delete_many")]

    def assertIllegal(self, *inputs):
        life = self.mirror.life
        calls = {"start": life.start, "synced": life.synced,
                 "changed": lambda: life.changed("ADDED", endpoints("x", 1)),
                 "relisted": lambda: life.relisted("ADDED"),
                 "relist_delivered": life.relist_delivered, "rewrite": life.rewrite}
        for name in inputs:
            self.assertRaises(NoTransition, calls[name])

    def to_mirroring(self, objects=()):
        self.mirror.start()
        self.informer.end_list(objects)

    def to_relisting(self):
        self.to_mirroring([endpoints("a", 1)])
        self.informer.relist([endpoints("b", 2)])
        self.assertTrue(self.mirror.life.relist_pending())

    # -- new -------------------------------------------------------------------------

    def test_new_starts_the_informer_and_awaits_its_list(self):
        self.assertFalse(self.mirror.life.relist_pending())
        self.mirror.start()
        self.assertEqual(self.informer.started, 1)
        self.assertEqual(len(self.informer._handlers), 1)
        self.assertEqual((self.writes(), self.state()), ([], (False, False)))

    def test_new_stops_at_once(self):
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.informer.stopped, 1)
        self.assertIllegal("start", "changed", "rewrite")

    def test_new_refuses_every_input_of_a_started_mirror(self):
        self.assertIllegal("synced", "changed", "relisted", "relist_delivered", "rewrite")

    # -- awaiting_list -----------------------------------------------------------------

    def test_first_list_is_written_as_one_replace_and_then_changes_one_by_one(self):
        self.mirror.start()
        self.informer.end_list([endpoints("a", 1), endpoints("b", 2)])
        self.assertEqual(self.writes(), [("replace", "core/v1/endpoints", 2)])
        self.assertEqual(self.changes, [(True, False)])
        self.assertEqual(self.metrics.events, [("endpoints.v1", "LIST")],
                         "the list's own adds are not counted as changes")
        self.informer.add(endpoints("c", 3))
        self.assertEqual(self.writes()[-1], ("put", [ENDPOINTS_PREFIX + "c"]))
        self.assertEqual(self.stored(), ["a", "b", "c"])
        self.assertTrue(self.mirror.idle)

    def test_changes_rewrites_and_relists_before_the_list_are_left_to_it(self):
        self.mirror.start()
        self.informer.add(endpoints("a", 1))
        self.mirror.life.relisted("ADDED")
        self.mirror.rewrite()
        self.assertEqual((self.writes(), self.metrics.events), ([], []))
        self.assertFalse(self.mirror.life.relist_pending())
        self.informer.end_list()
        self.assertEqual(self.writes(), [("replace", "core/v1/endpoints", 1)])

    def test_an_informer_stopped_before_its_list_leaves_the_mirror_waiting(self):
        self.mirror.start()
        self.informer.end_list(synced=False)
        self.assertEqual(self.writes(), [])
        self.assertIllegal("start", "relist_delivered")

    def test_stop_while_awaiting_the_list_drops_the_wait(self):
        self.mirror.start()
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.informer.stopped, 1)
        self.assertEqual(self.informer._handlers, [])
        self.informer.end_list([endpoints("a", 1)])
        self.assertEqual(self.writes(), [], "a list after the stop is not written")

    def test_awaiting_list_refuses_a_second_start_and_a_relist_turn(self):
        self.mirror.start()
        self.assertIllegal("start", "relist_delivered")

    # -- mirroring -----------------------------------------------------------------------

    def test_mirroring_counts_and_writes_each_change(self):
        self.to_mirroring([endpoints("a", 1)])
        self.informer.update(endpoints("a", 1), endpoints("a", 2))
        self.informer.delete(endpoints("a", 2))
        self.assertEqual(self.writes()[1:], [("put", [ENDPOINTS_PREFIX + "a"]),
                                             ("delete_many", [ENDPOINTS_PREFIX + "a"])])
        self.assertEqual([e for _r, e in self.metrics.events], ["LIST", "MODIFIED", "DELETED"])
        self.assertEqual(self.mirror.writes, 3)

    def test_rewrite_writes_the_whole_list_again(self):
        self.to_mirroring([endpoints("a", 1)])
        self.mirror.rewrite()
        self.assertEqual(self.writes(), [("replace", "core/v1/endpoints", 1)] * 2)
        self.assertEqual(self.mirror.lists_written, 2)
        self.assertEqual(self.changes, [(True, False)], "only the first list is news")

    def test_mirroring_refuses_start_first_list_and_relist_turn(self):
        self.to_mirroring()
        self.assertIllegal("start", "synced", "relist_delivered")

    def test_stop_while_mirroring_cancels_the_write_in_flight(self):
        self.to_mirroring()
        self.store.hold_writes = True
        self.informer.add(endpoints("a", 1))
        self.assertTrue(self.mirror.writing)
        self.successResultOf(self.mirror.stop())
        self.assertFalse(self.mirror.writing)
        self.assertEqual((self.informer.stopped, self.informer._handlers), (1, []))

    def test_failing_writes_are_retried_after_the_policys_pause(self):
        self.to_mirroring()
        self.store.fail = [ConnectionFailed("etcd down")]
        self.informer.add(endpoints("a", 1))
        self.assertEqual(self.changes[-1], (True, True))
        self.assertTrue(self.mirror.failing)
        self.clock.advance(1.9)
        self.assertTrue(self.mirror.failing)
        self.clock.advance(0.1)
        self.assertFalse(self.mirror.failing)
        self.assertEqual(self.changes[-1], (True, False))
        # After failed changes, the whole list follows: etcd may have lost writes.
        self.assertEqual(self.writes()[-1], ("replace", "core/v1/endpoints", 1))
        self.assertEqual(self.stored(), ["a"])

    # -- relisting -----------------------------------------------------------------------

    def test_a_relist_is_written_as_one_replace_in_the_next_turn(self):
        self.to_relisting()
        self.assertEqual(self.writes(), [("replace", "core/v1/endpoints", 1)],
                         "nothing of the relist's difference is written change by change")
        self.assertFalse(self.mirror.idle)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.clock.advance(0)
        self.assertFalse(self.mirror.life.relist_pending())
        self.assertEqual(self.writes()[-1], ("replace", "core/v1/endpoints", 1))
        self.assertEqual(self.stored(), ["b"])
        self.assertTrue(self.mirror.idle)
        self.informer.add(endpoints("c", 3))
        self.assertEqual(self.writes()[-1], ("put", [ENDPOINTS_PREFIX + "c"]),
                         "back to mirroring: changes are written one by one")

    def test_relisting_counts_changes_and_further_relists_without_writing_them(self):
        self.to_relisting()
        counted = len(self.metrics.events)
        self.informer.add(endpoints("c", 3))
        self.informer.relist([endpoints("d", 4)])
        self.assertGreater(len(self.metrics.events), counted)
        self.assertEqual(len(self.writes()), 1)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1, "one turn timer")
        self.clock.advance(0)
        self.assertEqual(self.stored(), ["d"])

    def test_rewrite_while_relisting_queues_the_list(self):
        self.to_relisting()
        self.mirror.rewrite()
        self.assertEqual(self.writes()[-1], ("replace", "core/v1/endpoints", 1))
        self.assertTrue(self.mirror.life.relist_pending())
        self.clock.advance(0)

    def test_stop_while_relisting_cancels_the_turn_timer(self):
        self.to_relisting()
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(self.writes()), 1)

    def test_relisting_refuses_start_and_first_list(self):
        self.to_relisting()
        self.assertIllegal("start", "synced")
        self.clock.advance(0)

    # -- stopped -------------------------------------------------------------------------

    def test_stopped_stops_again_and_refuses_everything_else(self):
        self.to_mirroring()
        self.successResultOf(self.mirror.stop())
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.informer.stopped, 1)
        self.assertFalse(self.mirror.life.relist_pending())
        self.assertIllegal("start", "synced", "changed", "relisted", "relist_delivered",
                           "rewrite")

    def test_a_cancelled_write_reports_nothing(self):
        self.to_mirroring()
        self.store.hold_writes = True
        self.informer.add(endpoints("a", 1))
        changes = list(self.changes)
        self.successResultOf(self.mirror.stop())
        self.assertEqual(self.changes, changes)
        self.assertFalse(self.mirror.failing)
