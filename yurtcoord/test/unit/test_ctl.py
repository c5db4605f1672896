"""``yurtcoordctl``'s tables: the ``/pool`` and ``/status`` documents of an agent
formatted like kubectl's, whatever the values, and a document of the wrong shape
refused as a bad answer."""

from twisted.trial import unittest

from yurtcoord.agent import ctl
from yurtcoord.testing.agentdocuments import POOL, STATUS


class TableTests(unittest.TestCase):
    def test_members_are_aligned_like_kubectl(self):
        self.assertEqual(ctl.format_members(POOL), (
            "NODE               HEARTBEAT   LEASE-AGE   CLOUD-LEASE   POOL-LEASE   LEADER   "
            "ETCD-MEMBER             COORDINATOR-SERVER      UPLOAD\n"
            "edge-1             direct      1.2s        1.2s          0.7s         false    "
            "https://10.0.0.1:2379   https://10.0.0.1:6443   uploaded (12)\n"
            "edge-2             delegated   3.0s        3.0s          2.5s         true     "
            "https://10.0.0.2:2379   https://10.0.0.1:6443   <none>\n"
            "edge-long-name-3   stale       2m5s        2m5s          <none>       false    "
            "<none>                  <none>                  <none>\n"))

    def test_leader_and_changes(self):
        self.assertEqual(ctl.format_leader(POOL), (
            "LEADER   LEASE-HOLDER   LEASE-AGE   LEASE-DURATION   EXPIRED\n"
            "edge-2   edge-2         0.4s        15               false\n"
            "\n"
            "CHANGED                NEW-LEADER\n"
            "2026-12-01T20:00:00Z   edge-1\n"
            "2026-12-01T20:05:00Z   edge-2\n"))

    def test_cache(self):
        self.assertEqual(ctl.format_cache(POOL), (
            "SYNCED   INFORMER-SYNC-AGE   INFORMER-SYNC-HOLDER\n"
            "true     0.8s                edge-2\n"
            "\n"
            "RESOURCE                          OBJECTS\n"
            "endpoints                         3\n"
            "endpointslices.discovery.k8s.io   <none>\n"))

    def test_status(self):
        self.assertEqual(ctl.format_status(STATUS), (
            "NODE     POOL     ROLE       LEADER   HEALTHY   READY   SYNCED   UPLOADED   "
            "CLOUD   COORDINATOR   SINCE\n"
            "edge-1   pool-a   follower   <none>   true      false   true     false      "
            "1/2     true          2026-12-01T20:00:00Z\n"))

    def test_values_cannot_break_the_layout(self):
        text = ctl.table(["a", "b"], [["x\ny\tz", ""], [None, 2.50]])
        self.assertEqual(text, 'A        B\nx y z    ""\n<none>   2.5\n')

    def test_ages(self):
        self.assertEqual([ctl.age(v) for v in (0, 59.94, 60, 3599, 3600, 7322, None, "x", True)],
                         ["0.0s", "59.9s", "1m0s", "59m59s", "1h0m", "2h2m", "<none>",
                          "<none>", "<none>"])

    def test_no_members(self):
        self.assertEqual(ctl.format_members(dict(POOL, members=[])), "No members found.\n")

    def test_a_document_of_the_wrong_shape_is_a_bad_answer(self):
        for document, render in ((dict(POOL, members={"a": 1}), ctl.format_members),
                                 (dict(POOL, members=[1]), ctl.format_members),
                                 (dict(POOL, election=None), ctl.format_leader),
                                 (dict(POOL, cache={"resources": []}), ctl.format_cache)):
            with self.assertRaises(ctl.CtlError) as caught:
                render(document)
            self.assertIn("bad answer", str(caught.exception))
