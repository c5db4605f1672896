"""An etcd client whose requests never answer, for the pool store and the uploader on
a Clock: what they hold in flight stays there until the test cancels it, without an
etcd or a socket."""

from typing import Any

from twisted.internet import defer

from yurtcoord.etcd.errors import EtcdTimeout


class HangingClient:
    """Requests never answer; cancelling one fails it the way the etcd client does."""

    def _hang(self, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        return defer.Deferred(lambda d: d.errback(EtcdTimeout("request cancelled")))

    submit = get = range_page = status = _hang
