"""The gauges the pool's alerts (deploy/prometheus/) read: node heartbeat ages in the
cloud, the kubelet, the pool cache, the upload and the pool etcd members, as one
agent's ``/metrics`` text shows them."""

import unittest

from prometheus_client.parser import text_string_to_metric_families

from yurtcoord.agent.metrics import CLOUD_HEARTBEAT_FORGET_SECONDS, Metrics


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Kubelet:
    alive = True

    def is_alive(self) -> bool:
        return self.alive


def samples(metrics: Metrics, name: str) -> dict:
    """``{frozenset of label items: value}`` of sample ``name`` in the rendered page."""
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[frozenset(sample.labels.items())] = sample.value
    return found


class CloudHeartbeatAgeTests(unittest.TestCase):

    def setUp(self) -> None:
        self.clock = _Clock()
        self.metrics = Metrics("edge-1", "pool-a", clock=self.clock)

    def ages(self) -> dict:
        return {dict(labels)["node"]: value for labels, value in
                samples(self.metrics, "yurtcoord_node_cloud_heartbeat_age_seconds").items()}

    def test_no_node_before_a_write(self) -> None:
        self.assertEqual(self.ages(), {})

    def test_age_counts_from_the_last_write_of_each_node(self) -> None:
        self.metrics.note_cloud_heartbeat("edge-1")
        self.clock.now += 4
        self.metrics.note_cloud_heartbeat("edge-2")
        self.clock.now += 3
        self.assertEqual(self.ages(), {"edge-1": 7.0, "edge-2": 3.0})
        self.metrics.note_cloud_heartbeat("edge-1")
        self.assertEqual(self.ages(), {"edge-1": 0.0, "edge-2": 3.0})

    def test_a_node_not_written_for_an_hour_is_dropped(self) -> None:
        self.metrics.note_cloud_heartbeat("gone")
        self.clock.now += CLOUD_HEARTBEAT_FORGET_SECONDS
        self.assertEqual(self.ages(), {"gone": CLOUD_HEARTBEAT_FORGET_SECONDS})
        self.clock.now += 1
        self.assertEqual(self.ages(), {})


class StatusGaugeTests(unittest.TestCase):

    def setUp(self) -> None:
        self.metrics = Metrics("edge-1", "pool-a")

    def test_kubelet_is_alive_unless_a_checker_says_otherwise(self) -> None:
        self.assertEqual(samples(self.metrics, "yurtcoord_kubelet_healthy_status"),
                         {frozenset(): 1.0})
        kubelet = _Kubelet()
        self.metrics.follow_kubelet(kubelet)  # type: ignore[arg-type]
        kubelet.alive = False
        self.assertEqual(samples(self.metrics, "yurtcoord_kubelet_healthy_status"),
                         {frozenset(): 0.0})

    def test_etcd_members_follow_the_health_read_at_each_scrape(self) -> None:
        health = {"https://a:2379": True, "https://user:secret@b:2379": False}
        self.metrics.follow_etcd_members(lambda: health)
        self.assertEqual(
            samples(self.metrics, "yurtcoord_pool_etcd_member_healthy_status"),
            {frozenset({("member", "https://a:2379")}): 1.0,
             frozenset({("member", "https://***@b:2379")}): 0.0})
        del health["https://a:2379"]
        self.assertEqual(
            list(samples(self.metrics, "yurtcoord_pool_etcd_member_healthy_status").values()),
            [0.0])

    def test_pool_cache_and_upload_start_at_zero(self) -> None:
        self.assertEqual(samples(self.metrics, "yurtcoord_pool_cache_synced_status"),
                         {frozenset(): 0.0})
        self.assertEqual(samples(self.metrics, "yurtcoord_local_cache_uploaded_status"),
                         {frozenset(): 0.0})
