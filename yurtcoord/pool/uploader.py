"""Uploads the node's local cache into the pool store, by resourceVersion.

The local cache is read in chunks (``LocalCacheReader.chunks``); each chunk is checked
(JSON, numeric resourceVersion, valid name) and written with the pool store's batched
create-or-update, so an older object never overwrites a newer one, whichever agent
uploads first, and a second upload of the same cache changes nothing. At least as many
chunks as the store keeps transactions in flight (``parallel_batches``) are written at
once, each one transaction at a time, so etcd is never left idle while the next chunk
is read and checked; each writer reads its next chunk while its own is in flight, and
at most two chunks per writer are held in memory.

How many write at once follows etcd's answer times (``yurtcoord.tx.limiter.
AdaptiveLimit``): while a transaction's answer takes no longer than
``IN_FLIGHT_TOLERANCE`` times the quickest one seen (plus ``IN_FLIGHT_SLACK``), one
more writer joins per round of answers, up to ``max_in_flight``; answers that stay
slow, or an error, send writers away again, down to ``parallel_batches``. More
transactions in flight let etcd commit more of them per disk sync, as long as it
answers each as quickly. A writer leaves only after writing the chunk it holds, so
nothing read is dropped. The size of a transaction does not adapt: a chunk is already
what one transaction of the store may carry (etcd's ``--max-txn-ops`` and request
size limits, ``max_ops`` and ``max_bytes`` of the store).

A bad file is counted, logged (one line: path and reason) and skipped; it never stops
the upload. Whatever a file holds ends as an object written or as one of the reasons of
``SKIP_REASONS``, never as an exception: the cache is written by other processes on the
node and nothing in it is trusted.  An object must be what its directory says
(``kind`` and ``apiVersion``), so a Secret placed among the pods is not handed to the
pool as a pod. An etcd outage is retried with backoff, resuming the chunk where it stopped
(the store recognises writes whose answer was lost). Only when etcd could not accept a
chunk after ``max_attempts`` does ``upload()`` fail, and then with ``UploadFailed``: the
caller must not count the local cache as uploaded.

An upload is a burst like the first lists of pool sync: tens of thousands of parsed
objects pass through and are freed again by reference counting, so the interpreter's
automatic full collections are held off while chunks are read (``QuietCollections``,
the policy pool sync uses for a burst of changes) and put back when the upload ends.

An upload that met an etcd outage reads the whole cache once more when it is done and
writes again whatever the pool lacks, because etcd may have lost writes it
acknowledged. See docs/design.md, "etcd that forgets acknowledged writes".
"""

from typing import Any, Generator, Iterator, NamedTuple

from twisted.internet import defer, task
from twisted.internet.defer import inlineCallbacks
from twisted.logger import Logger

from yurtcoord.etcd.errors import BadResponse, EtcdError, EtcdTimeout, EtcdUnavailable
from yurtcoord.tx.heap import QuietCollections
from yurtcoord.tx.jsondecode import NotJSON, decode_json
from yurtcoord.tx.limiter import AdaptiveLimit
from yurtcoord.tx.retry import POOL_WRITE_RETRY, Retries
from yurtcoord.pool.localcache import BadCacheEntry, CachedObjectPath, printable_path
from yurtcoord.pool.keys import InvalidKey, KeyBuildInfo
from yurtcoord.pool.store import (
    ConflictRetriesExhausted, PoolStoreError, WriteOutcome, metadata_of,
)

RETRYABLE_ERRORS = (EtcdUnavailable, EtcdTimeout, BadResponse, ConflictRetriesExhausted)

# An answer counts as as quick as etcd's quickest while within this many times it, plus
# the slack (seconds: scheduling noise on a pool etcd answering in milliseconds). On an
# etcd that has nothing more to give, each transaction more in flight makes every
# answer longer by its share (six where four were take 1.5 times as long), so writers
# stop joining about there.
IN_FLIGHT_TOLERANCE = 1.5
IN_FLIGHT_SLACK = 0.002

# Labels of yurtcoord_skipped_objects_total: why a local cache entry was not uploaded.
SKIP_REASONS = ("not_newer", "unreadable", "bad_object", "invalid_name", "too_large",
                "symlink", "wrong_kind")

# Kinds whose resource is not the default plural of the kind (same singular and plural).
_UNPLURALIZED_SUFFIXES = ("endpoints",)


def resource_of_kind(kind: str) -> str:
    """The resource Kubernetes names by default for a kind: ``Pod`` → ``pods``,
    ``NetworkPolicy`` → ``networkpolicies``, ``Ingress`` → ``ingresses``,
    ``Endpoints`` → ``endpoints`` (apimachinery's plural guess)."""
    singular = kind.lower()
    if singular.endswith(_UNPLURALIZED_SUFFIXES):
        return singular
    if singular.endswith("s"):
        return singular + "es"
    if singular.endswith("y"):
        return singular[:-1] + "ies"
    return singular + "s"


def api_version_of(group: str, version: str) -> str:
    """``apiVersion`` of a group and version: ``v1`` for the core group."""
    return f"{group}/{version}" if group else version


def kind_mismatch_of(obj: Any, location: CachedObjectPath) -> str:
    """Why a decoded object's ``kind``/``apiVersion`` is not that of the directory it
    was found in (``location``: a CachedObjectPath), or ``""`` when they agree.

    The coordinator apiserver decodes what the pool store holds by ``kind`` and
    ``apiVersion``, so an object without them, or of another type, must not be stored
    under this resource's key.
    """
    if not isinstance(obj, dict):
        return "not an object"
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    expected_version = api_version_of(location.group, location.version)
    if not isinstance(kind, str) or not kind:
        return "no kind"
    if not isinstance(api_version, str) or not api_version:
        return "no apiVersion"
    if resource_of_kind(kind) != location.resource or api_version != expected_version:
        return (f"a {kind[:64]!r} of {api_version[:64]!r} where {location.resource} of "
                f"{expected_version} belong")
    return ""


class UploadCounts(NamedTuple):
    """What an upload did with the local cache's files."""

    created: int = 0
    updated: int = 0
    skipped_not_newer: int = 0
    skipped_bad: int = 0

    def __add__(self, other):
        return UploadCounts(*(a + b for a, b in zip(self, other)))


class UploadFailed(Exception):
    """etcd did not accept the objects after retries; nothing counts as uploaded.

    ``counts`` says what had been written before the failure, ``cause`` the last error.
    """

    def __init__(self, counts, cause):
        super().__init__(f"local cache upload failed: {cause}")
        self.counts = counts
        self.cause = cause


class LocalCacheUploader:
    """Create-or-update every cached object of ``upload_resources`` in the pool store.

    :param store: a ``PoolStore``.
    :param reader: a ``LocalCacheReader``.
    :param upload_resources: items with ``component``, ``resource``, ``version``,
        ``group`` (``""`` for core).
    :param metrics: optional ``yurtcoord.agent.metrics.Metrics``.
    :param reactor: clock for retry delays; default the store's.
    :param backoff: a ``yurtcoord.tx.retry.Retries`` whose policy paces the retries
        (each lane of writes counts its own failures under it).
    :param max_attempts: attempts per chunk before the upload fails.
    :param max_in_flight: the most transactions (writers) in flight while etcd answers
        as quickly as with fewer; default twice the store's ``parallel_batches``.
    """

    log = Logger()

    def __init__(self, store, reader, upload_resources, metrics=None, reactor=None,
                 backoff=None, max_attempts=10, max_in_flight=None):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.min_in_flight = max(1, store.parallel_batches)
        self.max_in_flight = (2 * self.min_in_flight if max_in_flight is None
                              else max_in_flight)
        if self.max_in_flight < self.min_in_flight:
            raise ValueError(f"max_in_flight must be >= the store's parallel_batches "
                             f"({self.min_in_flight}), got {max_in_flight}")
        self.store = store
        self.reader = reader
        self.upload_resources = tuple(upload_resources)
        self.metrics = metrics
        self.reactor = reactor if reactor is not None else store.reactor
        self.backoff = backoff if backoff is not None else Retries(POOL_WRITE_RETRY)
        self.max_attempts = max_attempts
        self.files_seen = 0
        self.retries = 0
        # Objects found missing by the check after an outage and written again.
        self.rewritten = 0
        # The most writers that were writing at once, over every pass.
        self.most_in_flight = 0
        self._interrupted = False
        self._heap: QuietCollections | None = None

    @inlineCallbacks
    def upload(self) -> Generator[Any, Any, UploadCounts]:
        """Upload everything; fires with UploadCounts, or fails with UploadFailed."""
        self.files_seen = 0
        self._interrupted = False
        # The files of an upload do not stay: middle collections go on freeing what
        # outlived a young one (held off, they let peak RSS grow 20 -> 43 MB per
        # 10,000 pods).
        self._heap = QuietCollections(self.reactor, hold_middle=False)
        try:
            counts = yield self._upload_chunks()
            yield self._check_after_outages(counts)
        finally:
            self._heap.stop()
            self._heap = None
            # The store's key cache follows every accepted batch in memory; the file is
            # written once per upload rather than once per chunk.
            self.store.flush_key_cache()
        self.log.info("local cache uploaded: {created} created, {updated} updated, "
                      "{not_newer} not newer, {bad} bad files", created=counts.created,
                      updated=counts.updated, not_newer=counts.skipped_not_newer,
                      bad=counts.skipped_bad)
        return counts

    @inlineCallbacks
    def _upload_chunks(self):
        run = yield self._write_chunks(report=True)
        if run.error is not None:
            raise UploadFailed(run.counts, run.error) from run.error
        return run.counts

    @inlineCallbacks
    def _check_after_outages(self, counts):
        """After an outage, read the cache again and rewrite what the pool lacks.

        Repeated while a check itself meets an outage, at most ``max_attempts`` times.
        The counts of the upload stay as they are: a rewritten object was counted once.
        """
        for _check in range(self.max_attempts):
            if not self._interrupted:
                return
            self._interrupted = False
            run = yield self._write_chunks(report=False)
            if run.error is not None:
                raise UploadFailed(counts, run.error) from run.error
            self.rewritten += run.rewritten
            if run.rewritten:
                self.log.warn("local cache checked again after an etcd outage: {rewritten} "
                              "of {checked} objects were missing from the pool or older "
                              "there, and were written again (etcd can lose writes it "
                              "acknowledged)", rewritten=run.rewritten, checked=run.checked)
            else:
                self.log.info("local cache checked again after an etcd outage: all "
                              "{checked} objects in place", checked=run.checked)
        if self._interrupted:
            self.log.warn("etcd failed again during each of {checks} checks of the local "
                          "cache after an outage; objects acknowledged before the last "
                          "failure were not checked", checks=self.max_attempts)

    @inlineCallbacks
    def _write_chunks(self, report):
        """One pass over the cache: fires with its ``_Pass`` once every lane ended.

        ``parallel_batches`` lanes (more while etcd answers as quickly, see
        ``_Pass.lanes_to_add``) pull chunks from one reading of the cache, each
        writing its chunk one transaction at a time: while one lane reads and checks
        its next chunk, the others' transactions stay in flight, so etcd always has
        as many as the store allows and never waits for the slowest batch of a chunk.
        A lane reads and checks its next chunk while its own transaction is in
        flight, so that when etcd answers, the lane's next transaction goes out
        without waiting for the files behind it. Memory stays bounded by two chunks
        per lane. A lane that gives up stops the others (they end their current
        request, pull no chunk and retry nothing); the pass's ``error`` says why.
        """
        limit = AdaptiveLimit(self.reactor, self.min_in_flight, self.min_in_flight,
                              self.max_in_flight, tolerance=IN_FLIGHT_TOLERANCE,
                              slack=IN_FLIGHT_SLACK)
        run = _Pass(self.reader.chunks(self.upload_resources), limit)
        run.lanes.extend(self._lane(run, report) for _ in range(self.min_in_flight))
        waited = 0
        try:
            # A lane may add lanes while it runs: wait until the ones added have ended too.
            while waited < len(run.lanes):
                lanes = run.lanes[waited:]
                waited = len(run.lanes)
                results = yield defer.DeferredList(lanes, consumeErrors=True)
                for succeeded, result in results:
                    if not succeeded:
                        # Cancelled from outside (a role change): the upload ends with it.
                        result.raiseException()
        except BaseException:
            # Lanes added after the ones waited for are cancelled here; their
            # cancellation is no error of its own.
            for lane in run.lanes:
                lane.addErrback(lambda failure: failure.trap(defer.CancelledError))
                lane.cancel()
            raise
        return run

    def _next_chunk(self, run, report):
        """The pass's next chunk, read and checked: ``(items, bad, shadowed)``, or
        None once the cache is read or the pass stopped."""
        if run.error is not None:
            return None
        try:
            chunk = next(run.chunks, None)
        except Exception as e:
            # Reading never raises for what the cache holds; anything else ends
            # the upload as a failure, as etcd giving up does.
            run.stop(e)
            return None
        if chunk is None:
            run.read_all = True
            return None
        if self._heap is not None:
            self._heap.busy()
        if report:
            self.files_seen += len(chunk)
        return self._prepare(chunk, report=report)

    @inlineCallbacks
    def _lane(self, run, report):
        """Write chunks one transaction at a time until the cache is read, the pass
        stopped, or the lanes are more than etcd's answers allow (the lane leaves
        after writing what it holds); adds the lanes they allow."""
        run.running += 1
        try:
            retries = Retries(self.backoff.policy)
            prepared = self._next_chunk(run, report)
            while prepared is not None and run.error is None:
                items, bad, shadowed = prepared
                outcome = WriteOutcome()
                written = self._write_with_retries(items, outcome, run, retries)
                try:
                    # Read ahead while the transaction is in flight.
                    prepared = (self._next_chunk(run, report)
                                if not written.called and not run.too_many() else None)
                    yield written
                    if prepared is None and not run.too_many():
                        prepared = self._next_chunk(run, report)
                finally:
                    if report:
                        self._count(run, outcome, bad, shadowed)
                if not report:
                    run.checked += len(items)
                    run.rewritten += len(outcome.created) + len(outcome.updated)
                for _ in range(run.lanes_to_add()):
                    run.lanes.append(self._lane(run, report))
        finally:
            run.running -= 1

    def _count(self, run, outcome, bad, shadowed):
        """Add a chunk's outcome (written whole or in part) to the pass's counts."""
        for path in outcome.too_large:
            self._skip_bad(path, "too large for one etcd request", "too_large")
        chunk_counts = UploadCounts(len(outcome.created), len(outcome.updated),
                                    len(outcome.not_newer) + shadowed,
                                    bad + len(outcome.too_large))
        run.counts = run.counts + chunk_counts
        if self.metrics is not None:
            self.metrics.count_uploaded(chunk_counts.created + chunk_counts.updated)
            if chunk_counts.skipped_not_newer:
                self.metrics.count_skipped("not_newer", chunk_counts.skipped_not_newer)

    def _prepare(self, chunk, report=True):
        """Check each entry; return ``([(key, bytes, rv)], bad entries, shadowed entries)``.

        The same object found twice in a chunk (new and legacy layout) is written once,
        at its newest resourceVersion; the other copy counts as not newer.
        ``report=False`` leaves bad entries out silently (they were reported once).
        """
        items: dict[Any, Any] = {}
        bad = 0

        shadowed = 0
        skip_bad = self._skip_bad if report else (lambda path, reason, category: None)
        for entry in chunk:
            if isinstance(entry, BadCacheEntry):
                skip_bad(entry.path, entry.reason, entry.category)
                bad += 1
                continue
            location = entry.location
            # Parsed once: its metadata and its kind are read from the same object.
            # Only UTF-8 JSON as RFC 8259 defines it is taken (yurtcoord.tx.jsondecode),
            # as the coordinator apiserver reads the pool store back.
            try:
                obj = decode_json(entry.data)
                name, namespace, rv = metadata_of(obj)
            except NotJSON as e:
                skip_bad(location.path, f"not JSON: {e}", "bad_object")
                bad += 1
                continue
            except ValueError as e:
                skip_bad(location.path, str(e), "bad_object")
                bad += 1
                continue
            except RecursionError:
                skip_bad(location.path, "not JSON: nested too deeply", "bad_object")
                bad += 1
                continue
            mismatch = kind_mismatch_of(obj, location)
            if mismatch:
                skip_bad(location.path, mismatch, "wrong_kind")
                bad += 1
                continue
            if (name and name != location.name) or (namespace and namespace != location.namespace):
                skip_bad(location.path, f"object {namespace}/{name} does not match its path",
                         "invalid_name")
                bad += 1
                continue
            try:
                key = self.store.key_func(KeyBuildInfo(
                    location.component, location.resource, location.group, location.version,
                    location.namespace, location.name))
            except InvalidKey as e:
                skip_bad(location.path, str(e), "invalid_name")
                bad += 1
                continue
            previous = items.get(key.path)
            if previous is not None:
                shadowed += 1
                if previous[2] >= rv:
                    continue
            items[key.path] = (key, entry.data, rv)
        return list(items.values()), bad, shadowed

    def _skip_bad(self, path, reason, category):
        self.log.warn("local cache file skipped ({category}): {path}: {reason}",
                      category=category, path=printable_path(path), reason=reason)
        if self.metrics is not None:
            self.metrics.count_skipped(category)

    @inlineCallbacks
    def _write_with_retries(self, items, outcome, run, retries):
        """Write ``items`` into ``outcome``, one transaction at a time, retrying etcd
        outages with ``retries``; gives up by stopping ``run`` with the error."""
        attempt = 0
        while True:
            attempt += 1
            started = self.reactor.seconds()
            run.writing += 1
            self.most_in_flight = max(self.most_in_flight, run.writing)
            try:
                yield self.store.create_or_update_many(items, outcome, flush_key_cache=False,
                                                       in_flight=1)
            except (EtcdError, PoolStoreError) as e:
                run.limit.sample(started, run.writing, succeeded=False)
                run.writing -= 1
                if run.error is not None:
                    return
                if attempt >= self.max_attempts or not isinstance(e, RETRYABLE_ERRORS):
                    self.log.error("local cache upload gave up after {attempts} attempts: "
                                   "{error}", attempts=attempt, error=str(e))
                    run.stop(e)
                    return
                delay = retries.next_delay()
                self.retries += 1
                self._interrupted = True
                self.log.warn("local cache upload interrupted, retrying in {delay:.2f}s "
                              "(attempt {attempt}/{max_attempts}): {error}", delay=delay,
                              attempt=attempt, max_attempts=self.max_attempts, error=str(e))
                pause = task.deferLater(self.reactor, delay, lambda: None)
                run.pauses.add(pause)
                try:
                    yield pause
                except defer.CancelledError:
                    if run.error is not None:
                        return
                    raise
                finally:
                    run.pauses.discard(pause)
                continue
            except BaseException:
                run.writing -= 1
                raise
            run.limit.sample(started, run.writing, succeeded=True)
            run.writing -= 1
            retries.reset()
            return


class _Pass:
    """What the lanes of one pass over the local cache share: the chunks still to be
    read, the counts so far, the retry pauses under way, the error that ended it, and
    how many lanes run and write against the limit etcd's answers set."""

    def __init__(self, chunks: Iterator[Any], limit: AdaptiveLimit) -> None:
        self.chunks = iter(chunks)
        self.limit = limit
        # Every lane started (their Deferreds), the lanes not ended yet, and the
        # transactions in flight.
        self.lanes: list[defer.Deferred[Any]] = []
        self.running = 0
        self.writing = 0
        self.read_all = False
        self.counts = UploadCounts()
        self.checked = 0
        self.rewritten = 0
        self.pauses: set[defer.Deferred[Any]] = set()
        self.error: BaseException | None = None

    def too_many(self) -> bool:
        """More lanes run than the limit allows: a lane that asks leaves once it has
        written what it holds."""
        return self.running > self.limit.limit

    def lanes_to_add(self) -> int:
        """Lanes to start now: as many as the limit allows beyond those running, while
        chunks are still to be read and nothing stopped the pass."""
        if self.read_all or self.error is not None:
            return 0
        return max(0, self.limit.limit - self.running)

    def stop(self, error: BaseException) -> None:
        """A lane gave up: the other lanes stop, those pausing before a retry at once."""
        if self.error is None:
            self.error = error
        for pause in list(self.pauses):
            pause.cancel()
