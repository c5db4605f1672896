"""Pool cache synced detection, on leaders and followers alike.

The leader renews Lease ``kube-system/leader-informer-sync`` on the coordinator
apiserver while the pool-scoped resources in the pool store are current. This detector
watches that lease and judges it on its own clock (docs/design.md, "Clocks"): the
leader's renewTime is never compared with the local clock, whose difference from the
leader's may be minutes. An add or update whose renewTime differs from the last one seen
is a renewal, seen now; the pool cache is synced while the last renewal was seen less
than ``stale_timeout`` ago (one ``callLater``, reset on every renewal), so a leader that
died stops counting within ``stale_timeout`` whatever its clock said. An update that
leaves renewTime as it was (a relist, a write of other fields) is no renewal and extends
nothing; a delete means not synced at once. The lease seen for the first time counts as
renewed at that moment, as client-go counts a lease it sees first; what was seen is kept
across ``stop``/``start``, so the same renewTime seen again after a restart is no
renewal.
"""

from typing import Any, Callable

from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from yurtcoord.kube import gvr as gvrs
from yurtcoord.kube.informer import Informer
from yurtcoord.kube.renewals import RenewalsSeen
from yurtcoord.names import INFORMER_SYNC_LEASE_NAME, INFORMER_SYNC_LEASE_NAMESPACE
from yurtcoord.pool.interfaces import IRoleComponent
from yurtcoord.pool.sync import is_informer_sync_lease

# The key of the one lease this detector follows in its ``RenewalsSeen``.
_LEASE = (INFORMER_SYNC_LEASE_NAMESPACE, INFORMER_SYNC_LEASE_NAME)


@implementer(IRoleComponent)
class PoolCacheSyncedDetector:
    """Reports ``on_synced_change(bool)`` whenever the pool cache's synced state changes.

    :param coordinator_client: ``KubeClient`` of the coordinator apiserver.
    :param stale_timeout: seconds, on the local clock, without a renewal seen before
        not synced.
    :param informer_factory: ``(reactor, client, gvr, namespace=, field_selector=)`` →
        an informer; the real ``Informer`` by default.
    """

    log = Logger()

    def __init__(self, reactor: Any, coordinator_client: Any, stale_timeout: float,
                 on_synced_change: Callable[[bool], object],
                 informer_factory: Callable[..., Any] = Informer) -> None:
        self.reactor = reactor
        self.coordinator = coordinator_client
        self.stale_timeout = float(stale_timeout)
        self._on_synced_change = on_synced_change
        self._informer_factory = informer_factory
        self.synced = False
        self.renewals_seen = 0
        # The informer sync lease's renewTime last seen and when it was seen to change.
        self._renewals = RenewalsSeen(reactor)
        self._informer: Any = None
        self._stale_call: Any = None

    @property
    def running(self) -> bool:
        return self._informer is not None

    def start(self, store: object = None) -> defer.Deferred[None]:
        """Watch the informer sync lease; ``store`` is unused (the lease is not in it)."""
        if self._informer is not None:
            return defer.succeed(None)
        self._informer = self._informer_factory(
            self.reactor, self.coordinator, gvrs.LEASES,
            namespace=INFORMER_SYNC_LEASE_NAMESPACE,
            field_selector=f"metadata.name={INFORMER_SYNC_LEASE_NAME}")
        self._informer.add_handler(
            on_add=self._seen,
            on_update=lambda _old, new: self._seen(new),
            on_delete=self._deleted,
            filter=is_informer_sync_lease)
        self._informer.start()
        return defer.succeed(None)

    def stop(self) -> defer.Deferred[Any]:

        """Stop watching and the stale timer; no report is made after this call."""
        informer, self._informer = self._informer, None
        self._cancel_stale()
        self.synced = False
        if informer is None:
            return defer.succeed(None)
        return informer.stop()

    # -- lease events ----------------------------------------------------------------

    def _seen(self, lease: dict) -> None:
        if self._informer is None:
            return
        before = self._renewals.changed_at(_LEASE)
        changed_at = self._renewals.observe(_LEASE, lease)
        if changed_at is None:
            self.log.debug("informer sync lease seen without a renewTime")
            return
        left = changed_at + self.stale_timeout - self.reactor.seconds()
        if changed_at == before:
            if left <= 0:
                self.log.debug("informer sync lease seen with a renewTime unchanged for "
                               "{age:.1f}s: no renewal", age=self.stale_timeout - left)
                return
        else:
            self.renewals_seen += 1
        if self._stale_call is not None and self._stale_call.active():
            self._stale_call.reset(left)
        else:
            self._stale_call = self.reactor.callLater(left, self._went_stale)
        self._set(True, "informer sync lease renewed")

    def _deleted(self, _lease: dict) -> None:
        if self._informer is None:
            return
        self._renewals.forget(_LEASE)
        self._cancel_stale()
        self._set(False, "informer sync lease deleted")

    def _went_stale(self):
        self._stale_call = None
        if self._informer is None:
            return
        self._set(False, f"no renewal of the informer sync lease seen for "
                         f"{self.stale_timeout:g}s")

    def _cancel_stale(self):
        call, self._stale_call = self._stale_call, None
        if call is not None and call.active():
            call.cancel()

    def _set(self, synced, reason):
        if synced == self.synced:
            return
        self.synced = synced
        self.log.info("pool cache synced={synced}: {reason}", synced=synced, reason=reason)
        self._on_synced_change(synced)
