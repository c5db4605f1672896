"""The integration tier: tests against real servers over real sockets.

A real etcd (shared per version and flags, ``yurtcoord.testing.sharedetcd``), the
Kubernetes API test server, agents built in the test's own process, the ``kubectl``
and official ``kubernetes`` clients, one-shot child processes such as the standalone
API test server or ``yurtcoordctl``. Loose time bounds, polls with a deadline
(docs/testing.md).
"""
