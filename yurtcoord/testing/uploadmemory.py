"""One local cache upload in a process of its own, reporting the memory it took.

    python -m yurtcoord.testing.uploadmemory ETCD_URL CACHE_DIR KEY_CACHE_DIR

Uploads ``kubelet/pods/v1`` and ``kubelet/nodes/v1`` of CACHE_DIR into the etcd at
ETCD_URL (storage prefix ``/registry``) and prints one JSON line: ``rss_before_kib``,
``peak_kib``, ``growth_kib`` (peak minus the resident size before the upload),
``counts`` (UploadCounts) and ``skipped`` (``yurtcoord_skipped_objects_total`` by
reason).  The peak is the process's ``VmHWM``, reset before the upload where the
kernel allows it (``/proc/self/clear_refs``), so what the test process or the imports
did before never blurs the figure; without the reset the figure can only be larger.
"""

import json
import sys
from typing import Any, Generator

from twisted.internet import defer, task

from yurtcoord.agent.config import UploadResource
from yurtcoord.etcd.client import EtcdClient, EtcdConfig
from yurtcoord.pool.localcache import LocalCacheReader
from yurtcoord.agent.metrics import Metrics
from yurtcoord.testing.memory import reset_peak, status_kib
from yurtcoord.pool.keycache import ComponentKeyCache
from yurtcoord.pool.store import PoolStore
from yurtcoord.pool.uploader import SKIP_REASONS, LocalCacheUploader

UPLOAD_RESOURCES = (UploadResource("kubelet", "pods", "v1"),
                    UploadResource("kubelet", "nodes", "v1"))


@defer.inlineCallbacks
def upload(reactor: Any, etcd_url: str, cache_dir: str,
           key_cache_dir: str) -> Generator[defer.Deferred[Any], Any, None]:
    client = EtcdClient(reactor, EtcdConfig(etcd_url, timeout=10.0))
    store = PoolStore(reactor, client, "/registry",
                      ComponentKeyCache.in_directory(key_cache_dir).load())
    metrics = Metrics("memory-probe")
    # Built as the agent builds it: the reader's defaults are the product's bounds.
    uploader = LocalCacheUploader(store, LocalCacheReader(cache_dir), UPLOAD_RESOURCES,
                                  metrics=metrics)
    rss_before = status_kib("VmRSS")
    was_reset = reset_peak()
    try:
        counts = yield uploader.upload()
    finally:
        store.close()
        yield client.close()
    peak = status_kib("VmHWM")
    skipped = {reason: metrics.registry.get_sample_value(
        "yurtcoord_skipped_objects_total", {"reason": reason}) for reason in SKIP_REASONS}
    print(json.dumps({"rss_before_kib": rss_before, "peak_kib": peak,
                      "growth_kib": peak - rss_before, "peak_reset": was_reset,
                      "counts": counts._asdict(), "skipped": skipped}), flush=True)


def main(argv: list[str] | None = None) -> None:

    etcd_url, cache_dir, key_cache_dir = (argv if argv is not None else sys.argv[1:])
    task.react(upload, (etcd_url, cache_dir, key_cache_dir))


if __name__ == "__main__":
    main()
