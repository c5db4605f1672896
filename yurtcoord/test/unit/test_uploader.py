"""The local cache upload on a Clock, with a fake pool store or a pool store whose etcd
never answers: which resource a cached object's kind belongs to, the retry pauses and
what is written again after an outage, the transactions kept in flight across chunks,
and an upload cancelled by a role change. The upload to a real etcd (counts, bad
files, resourceVersion ordering, etcd killed mid-upload) is in the integration tier.
"""

import gc
import os

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from yurtcoord.etcd.errors import EtcdUnavailable, RequestRejected
from yurtcoord.pool.localcache import LocalCacheReader
from yurtcoord.pool.interfaces import IPoolStore
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.store import PoolStore
from yurtcoord.testing.hangingetcd import HangingClient
from yurtcoord.testing.storedobjects import make_object
from yurtcoord.testing.fakepoolstore import FakePoolStore
from yurtcoord.testing.uploads import PODS, PODS_GVR, steady_backoff, write_file
from yurtcoord.pool.uploader import (
    LocalCacheUploader, UploadCounts, UploadFailed, api_version_of, resource_of_kind,
)


def flaky_store(clock, failures=0, error=None, lose_at=None, fail_on=()):
    """A pool store whose first ``failures`` batched writes fail with ``error`` (and
    those numbered in ``fail_on``); ``lose_at``: that call forgets the writes of the
    call before and fails."""
    store = FakePoolStore(clock)
    store.fail_on = set(range(1, failures + 1)) | set(fail_on)
    if error is not None:
        store.error = error
    store.lose_at = lose_at
    return store


class KindTests(unittest.TestCase):
    """A cached object's type is checked against its directory by the resource
    Kubernetes names for its kind."""

    def test_resources_of_the_kinds_a_node_cache_holds(self):
        kinds = {"Pod": "pods", "Node": "nodes", "Endpoints": "endpoints",
                 "EndpointSlice": "endpointslices", "Service": "services",
                 "Ingress": "ingresses", "NetworkPolicy": "networkpolicies",
                 "Lease": "leases", "ConfigMap": "configmaps", "Secret": "secrets",
                 "StorageClass": "storageclasses", "CSINode": "csinodes",
                 "RuntimeClass": "runtimeclasses"}
        self.assertEqual({kind: resource_of_kind(kind) for kind in kinds}, kinds)

    def test_api_versions(self):
        self.assertEqual(api_version_of("", "v1"), "v1")
        self.assertEqual(api_version_of("discovery.k8s.io", "v1"), "discovery.k8s.io/v1")


class RetryTimingTests(unittest.TestCase):
    def setUp(self):
        self.local = os.path.abspath(self.mktemp())
        write_file(os.path.join(self.local, "kubelet", "pods.v1.core", "ns", "a"),
                   make_object("a", "ns", 1))

    def test_backoff_between_attempts_on_injected_clock(self):
        clock = Clock()
        store = flaky_store(clock, failures=2)
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS],
                                      backoff=steady_backoff(maximum=8.0))
        d = uploader.upload()
        self.assertEqual(store.puts, 1)
        clock.advance(0.99)
        self.assertEqual(store.puts, 1)
        clock.advance(0.01)
        self.assertEqual(store.puts, 2)
        clock.advance(1.99)
        self.assertEqual(store.puts, 2)
        clock.advance(0.01)
        # The third attempt succeeds, and the cache is checked again after the outage.
        self.assertEqual(store.puts, 4)
        self.assertEqual(self.successResultOf(d), UploadCounts(1, 0, 0, 0))
        self.assertEqual(store.flushes, 1)

    def test_objects_lost_by_etcd_before_an_outage_are_written_again(self):
        for name in ("b", "c", "d", "e", "f"):
            write_file(os.path.join(self.local, "kubelet", "pods.v1.core", "ns", name),
                       make_object(name, "ns", 1))
        clock = Clock()
        # Chunks of 2: calls 1-3 write them; call 2 is lost with the failing call 3.
        store = flaky_store(clock, lose_at=3)
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local, chunk_size=2),
                                      [PODS], backoff=steady_backoff())
        d = uploader.upload()
        self.assertEqual(len(store.versions), 2)
        clock.advance(1.0)
        self.assertEqual(self.successResultOf(d), UploadCounts(6, 0, 0, 0))
        self.assertEqual(sorted(store.versions), [f"/registry/pods/ns/{n}" for n in "abcdef"])
        self.assertEqual(uploader.rewritten, 2)
        # 2 chunks, the failed call, its retry, then 3 chunks checked again.
        self.assertEqual(store.puts, 7)
        self.assertEqual(store.flushes, 1)

    def test_check_after_an_outage_changes_nothing_when_nothing_was_lost(self):
        clock = Clock()
        store = flaky_store(clock, failures=1)
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS],
                                      backoff=steady_backoff(), max_attempts=2)
        d = uploader.upload()
        clock.advance(1.0)
        self.assertEqual(self.successResultOf(d), UploadCounts(1, 0, 0, 0))
        self.assertEqual(uploader.rewritten, 0)
        self.assertEqual(store.puts, 3)
        self.assertEqual(store.versions, {"/registry/pods/ns/a": 1})

    def test_check_that_etcd_never_accepts_fails_the_upload_with_first_counts(self):
        clock = Clock()
        store = flaky_store(clock, fail_on={1, 3, 4})
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS],
                                      backoff=steady_backoff(), max_attempts=2)
        d = uploader.upload()
        clock.advance(1.0)
        clock.advance(1.0)
        failure = self.failureResultOf(d, UploadFailed)
        self.assertEqual(failure.value.counts, UploadCounts(1, 0, 0, 0))
        self.assertEqual(store.puts, 4)
        self.assertEqual(store.flushes, 1)

    def test_rejected_request_is_not_retried(self):
        clock = Clock()
        store = flaky_store(clock, failures=5, error=RequestRejected("bad request"))
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS])
        failure = self.failureResultOf(uploader.upload(), UploadFailed)
        self.assertIsInstance(failure.value.cause, RequestRejected)
        self.assertEqual(store.puts, 1)
        self.assertEqual(store.flushes, 1)
        self.assertFalse(clock.getDelayedCalls())


class PipelineTests(unittest.TestCase):
    """The upload keeps the store's number of transactions in flight across chunks:
    each lane reads and checks its next chunk while its own write is in flight, so an
    answered lane writes again at once, with two chunks per lane in memory."""

    # Pods in the cache, files per chunk, the store's parallel_batches.
    FILES, CHUNK, PARALLEL = 20, 2, 4

    def setUp(self):
        self.local = os.path.abspath(self.mktemp())
        for i in range(self.FILES):
            write_file(os.path.join(self.local, "kubelet", "pods.v1.core", "ns", f"p{i:02d}"),
                       make_object(f"p{i:02d}", "ns", 1 + i))
        self.clock = Clock()
        self.store = FakePoolStore(self.clock)
        verifyObject(IPoolStore, self.store)
        self.store.parallel_batches = self.PARALLEL
        self.store.hold_writes = True

    def uploader(self, **kwargs):
        return LocalCacheUploader(self.store, LocalCacheReader(self.local,
                                                               chunk_size=self.CHUNK),
                                  [PODS], backoff=steady_backoff(), **kwargs)

    def test_as_many_in_flight_as_the_store_allows_across_chunks(self):
        uploader = self.uploader()
        d = uploader.upload()
        # Four chunks of two in flight, each lane's next chunk read behind its write;
        # the rest of the cache not read yet.
        self.assertEqual((self.store.in_flight, uploader.files_seen), (4, 16))
        for answered in range(1, 7):
            self.store.release()
            # The lane answered writes the chunk it read ahead at once and reads the
            # next one (while there is one): still four in flight.
            self.assertEqual((self.store.in_flight, uploader.files_seen),
                             (4, min(20, 16 + 2 * answered)))
        while self.store.held:
            self.assertNoResult(d)
            self.store.release()
        self.assertEqual(self.successResultOf(d), UploadCounts(20, 0, 0, 0))
        self.assertEqual(self.store.most_in_flight, 4)
        self.assertEqual(self.store.puts, 10)
        self.assertEqual(len(self.store.versions), 20)

    def test_full_collections_are_held_off_while_the_upload_runs(self):
        thresholds = gc.get_threshold()
        d = self.uploader().upload()
        # The interpreter's young and middle collections go on (an upload's objects do
        # not stay); its full ones wait for the end.
        self.assertEqual(gc.get_threshold()[:2], thresholds[:2])
        self.assertGreater(gc.get_threshold()[2], 1_000_000)
        while self.store.held:
            self.store.release()
        self.assertEqual(self.successResultOf(d), UploadCounts(20, 0, 0, 0))
        self.assertEqual(gc.get_threshold(), thresholds)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_full_collections_are_given_back_when_the_upload_fails(self):
        thresholds = gc.get_threshold()
        self.store.fail_on = {1}
        self.store.error = RequestRejected("bad request")
        d = self.uploader().upload()
        while self.store.held:
            self.store.release()
        self.failureResultOf(d, UploadFailed)
        self.assertEqual(gc.get_threshold(), thresholds)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_lane_that_gives_up_stops_the_others(self):
        self.store.fail_on = {2}
        self.store.error = RequestRejected("bad request")
        uploader = self.uploader()
        d = uploader.upload()
        # Lane 1's write is held (its next chunk read behind it); lane 2's was
        # refused: nobody reads another chunk.
        self.assertEqual((self.store.puts, uploader.files_seen), (2, 6))
        self.assertNoResult(d)
        self.store.release()
        failure = self.failureResultOf(d, UploadFailed)
        self.assertIsInstance(failure.value.cause, RequestRejected)
        # What lane 1 wrote before the failure is counted; the chunk it read ahead
        # is not written.
        self.assertEqual(failure.value.counts, UploadCounts(2, 0, 0, 0))
        self.assertEqual((self.store.puts, uploader.files_seen), (2, 6))
        self.assertEqual(self.store.flushes, 1)

    def test_a_lane_that_gives_up_ends_the_retry_pauses_of_the_others(self):
        self.store.hold_writes = False
        self.store.fail = [EtcdUnavailable("down"), RequestRejected("bad request")]
        uploader = self.uploader()
        failure = self.failureResultOf(uploader.upload(), UploadFailed)
        self.assertIsInstance(failure.value.cause, RequestRejected)
        self.assertEqual(uploader.retries, 1)
        self.assertFalse(self.clock.getDelayedCalls())
        self.clock.advance(60)
        self.assertEqual(self.store.puts, 2)


class InFlightTests(unittest.TestCase):
    """How many transactions are in flight follows etcd's answer times: one writer more
    per round of answers as quick as the quickest, up to ``max_in_flight``; answers
    that stay slow send writers away, down to the store's ``parallel_batches``. A
    writer that leaves first writes the chunk it holds: every file is written once."""

    FILES, CHUNK, PARALLEL = 40, 1, 2
    setUp = PipelineTests.setUp
    uploader = PipelineTests.uploader

    def answer_round(self, latency):
        """etcd answers every write in flight ``latency`` seconds after it was sent;
        returns how many were in flight."""
        self.clock.advance(latency)
        held = len(self.store.held)
        for _ in range(held):
            self.store.release()
        return held

    def test_quick_answers_add_writers_up_to_the_most_allowed(self):
        uploader = self.uploader(max_in_flight=4)
        d = uploader.upload()
        rounds = []
        while self.store.held:
            rounds.append(self.answer_round(0.010))
        # Two answers at two in flight make three, three at three make four; four
        # stays, and the last rounds write what is left of the 40 files.
        self.assertEqual(rounds, [2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 3])
        self.assertEqual(self.successResultOf(d), UploadCounts(self.FILES, 0, 0, 0))
        self.assertEqual((uploader.most_in_flight, self.store.most_in_flight), (4, 4))
        self.assertEqual(self.store.puts, self.FILES)
        self.assertEqual(len(self.store.versions), self.FILES)

    def test_answers_that_stay_slow_send_writers_away_down_to_the_stores_number(self):
        uploader = self.uploader(max_in_flight=4)
        d = uploader.upload()
        rounds = [self.answer_round(0.010) for _ in range(3)]
        self.assertEqual(rounds, [2, 3, 4])
        # Three times slower. The first slow round only marks the slowness; in the
        # next, a write sent after the mark is slow as well: 4 -> 3. Each writer
        # still holds the chunk it read ahead and writes it before leaving; those
        # writes, sent at the decrease, are slow too: 3 -> 2, and the two writers
        # over it leave after their writes. The store's number stays.
        while self.store.held:
            rounds.append(self.answer_round(0.030))
        self.assertEqual(rounds, [2, 3, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1])
        self.assertEqual(self.successResultOf(d), UploadCounts(self.FILES, 0, 0, 0))
        self.assertEqual(self.store.puts, self.FILES)
        self.assertEqual(len(self.store.versions), self.FILES)

    def test_answers_as_quick_as_before_bring_writers_back(self):
        uploader = self.uploader(max_in_flight=4)
        d = uploader.upload()
        rounds = [self.answer_round(0.010) for _ in range(3)]
        rounds += [self.answer_round(0.030) for _ in range(3)]
        while self.store.held:
            rounds.append(self.answer_round(0.010))
        self.assertEqual(rounds, [2, 3, 4, 4, 4, 4, 2, 3, 4, 4, 4, 2])
        self.assertEqual(self.successResultOf(d), UploadCounts(self.FILES, 0, 0, 0))
        self.assertEqual(self.store.puts, self.FILES)

    def test_an_outage_loses_nothing_with_writers_added(self):
        uploader = self.uploader(max_in_flight=4)
        d = uploader.upload()
        rounds = [self.answer_round(0.010) for _ in range(3)]
        # A write fails (etcd unavailable): its writer writes the chunk again after
        # the pause; the check after the outage reads the cache again.
        self.store.fail = [EtcdUnavailable("down")]
        rounds.append(self.answer_round(0.010))
        self.assertEqual(uploader.retries, 1)
        self.clock.advance(1.0)
        while self.store.held:
            rounds.append(self.answer_round(0.010))
        self.assertEqual(self.successResultOf(d), UploadCounts(self.FILES, 0, 0, 0))
        self.assertEqual(len(self.store.versions), self.FILES)
        # Each file written once by the upload and once more by the check (the
        # failed write was refused at once, never held).
        self.assertEqual(sum(rounds), 2 * self.FILES)
        self.assertEqual(max(rounds), 4)

    def test_never_more_than_the_store_allows_by_default_twice(self):
        uploader = self.uploader()
        d = uploader.upload()
        while self.store.held:
            self.answer_round(0.010)
        self.successResultOf(d)
        self.assertEqual(uploader.most_in_flight, 4)

    def test_cancelling_ends_the_writers_added_as_well(self):
        uploader = self.uploader(max_in_flight=4)
        d = uploader.upload()
        for _ in range(3):
            self.answer_round(0.010)
        self.assertEqual(len(self.store.held), 4)
        puts = self.store.puts
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertTrue(all(held.called for held, _outcome in self.store.held))
        self.clock.advance(60)
        self.assertEqual(self.store.puts, puts)
        self.assertFalse(self.clock.getDelayedCalls())

    def test_at_least_the_stores_number(self):
        with self.assertRaises(ValueError):
            self.uploader(max_in_flight=1)


class CancellationTests(unittest.TestCase):
    """A role change cancels an upload: it ends with CancelledError at once, is not
    retried, and the key cache file holds every key that may have been written."""

    def setUp(self):
        self.local = os.path.abspath(self.mktemp())
        for name in ("a", "b", "c"):
            write_file(os.path.join(self.local, "kubelet", "pods.v1.core", "ns", name),
                       make_object(name, "ns", 1))

    def test_cancelled_during_a_write(self):
        clock = Clock()
        store = PoolStore(clock, HangingClient(), "/registry",
                          ComponentKeyCache.in_directory(self.local), parallel_batches=1,
                          max_ops=4)
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS],
                                      backoff=steady_backoff())
        d = uploader.upload()
        self.assertNoResult(d)
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(uploader.retries, 0)
        self.assertFalse(clock.getDelayedCalls())
        # The batch in flight (2 objects of 4 operations) may have landed: owned, and
        # the file is written; the batch never sent is not.
        on_disk = ComponentKeyCache.in_directory(self.local).load()
        owned = on_disk.keys("kubelet", PODS_GVR)
        self.assertEqual(len(owned), 2)
        self.assertLess(owned, {f"/registry/pods/ns/{n}" for n in "abc"})

    def test_cancelled_during_a_retry_pause(self):
        clock = Clock()
        store = flaky_store(clock, failures=1)
        uploader = LocalCacheUploader(store, LocalCacheReader(self.local), [PODS],
                                      backoff=steady_backoff())
        d = uploader.upload()
        self.assertEqual(store.puts, 1)
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertFalse(clock.getDelayedCalls())
        clock.advance(10)
        self.assertEqual(store.puts, 1)
        self.assertEqual(store.flushes, 1)
