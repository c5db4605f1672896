"""A Kubernetes API server for tests (Twisted web).

Generic namespaced and cluster resources with one global resourceVersion,
watches with replay, bookmarks and 410 on expired versions, Status errors,
label and field selectors, pagination, discovery, optional TLS that requires
a client certificate, and fault knobs::

    server = KubeAPIServer(reactor, tls_dir=None, history=1000)
    url = yield server.start()              # "http://127.0.0.1:N"
    server.store.create(LEASES, lease)      # emits watch events like HTTP writes
    server.faults.fail_next(2, code=503)    # also: down/up, latency, garbage_next,
                                            # hang_next, drop_connections,
                                            # cut_watches, stall_watches, end_watches
    yield server.stop()

Which types are served is ``server.catalog``: ``remove(gvr)`` one (its
discovery then 404s, like a cloud that dropped an API version) or ``add`` a
``ResourceType`` (e.g. a custom resource), also while running.

The objects live behind ``server.storage`` (an ``IObjectStorage``, every call
answering with a Deferred): in memory by default (``server.store`` is that
ObjectStore, for synchronous test writes), or in etcd in kube-apiserver's key
layout, as a pool's coordinator apiserver keeps them::

    storage = etcdstorage.storage_for(reactor, "http://127.0.0.1:2379", "/registry")
    server = KubeAPIServer(reactor, storage=storage)
    yield server.storage.create(LEASES, lease)

With ``authorizer=PoolCoordinatorAuthorizer()`` (``authz``) the server authorizes as
a pool's coordinator apiserver (Node authorizer, RBAC, NodeRestriction): the user is
the TLS client certificate's common name, a node writes only its own node lease and
the named election and informer sync leases, and anything else is answered 403 with
kube-apiserver's Status before any object is read; ``request_log`` names each
request's user::

    server = KubeAPIServer(reactor, tls_dir=ca.directory,
                           authorizer=PoolCoordinatorAuthorizer())

The pieces: ``catalog`` (served types, discovery), ``storage`` (the storage
contract, the in-memory storage), ``store`` (objects, history, watchers in
memory), ``etcdstorage`` (objects in etcd), ``pages`` (LIST pages), ``resource``
(HTTP routing and verbs), ``watch`` (one streaming response), ``faults``
(knobs), ``authz`` (who may do what), ``server`` (sockets and TLS).
"""

from yurtcoord.sim.apiserver.authz import IAuthorizer, PoolCoordinatorAuthorizer
from yurtcoord.sim.apiserver.catalog import DEFAULT_TYPES, Catalog, ResourceType
from yurtcoord.sim.apiserver.server import KubeAPIServer
from yurtcoord.sim.apiserver.store import ObjectStore

__all__ = ["DEFAULT_TYPES", "Catalog", "IAuthorizer", "KubeAPIServer", "ObjectStore",
           "PoolCoordinatorAuthorizer", "ResourceType"]
