"""``python -m yurtcoord.sim.apiserver --port N [--tls-dir DIR]``: run the
test API server alone; prints its URL on a line once it listens.

With ``--tls-dir`` pointing at an empty directory, a CA, a server pair and a
client pair (``client.crt``/``client.key``) are created there;
``--kubeconfig PATH`` writes a kubeconfig that uses them. ``--request-log PATH``
appends every answer's record to PATH as a JSON line (see
``yurtcoord.sim.apiserver.requestlog``). ``--etcd URL[,URL...]`` keeps the objects
in etcd, under ``--etcd-prefix`` (``/registry``) in kube-apiserver's key layout, as
the coordinator apiserver of a pool does (``--etcd-cafile``, ``--etcd-certfile``,
``--etcd-keyfile`` for etcd's TLS).

``--authorize`` refuses what the pool's coordinator apiserver refuses (a
kube-apiserver with the Node authorizer, RBAC and NodeRestriction; see
``yurtcoord.sim.apiserver.authz``): users come from client certificates, so it needs
``--tls-dir``; a node writes only its own node lease and the named leases,
``--named-lease NAMESPACE/NAME`` (repeated) in place of the election and informer sync
leases of ``kube-system``.

``--no-full-collections`` holds the interpreter's automatic full garbage collections
off for the life of the process (young and middle ones go on): with a hundred thousand
objects and their watch history, each full collection stops this server for a second
or more, and watch streams with it, which a real API server does not do. Benchmarks
that seed such a store use it; cyclic garbage that outlives the young collections
stays until the process ends."""

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.authz import IAuthorizer

from twisted.internet import defer, task


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m yurtcoord.sim.apiserver")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--tls-dir", default=None)
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--kubeconfig", default=None,
                        help="write a kubeconfig for this server to this path")
    parser.add_argument("--request-log", default=None,
                        help="append a JSON line per answered request to this path")
    parser.add_argument("--etcd", default=None, metavar="URL[,URL...]",
                        help="keep the objects in etcd (kube-apiserver's key layout) "
                             "instead of in memory")
    parser.add_argument("--etcd-prefix", default="/registry",
                        help="the key prefix of the objects in etcd (default /registry)")
    parser.add_argument("--etcd-cafile", default=None)
    parser.add_argument("--etcd-certfile", default=None)
    parser.add_argument("--etcd-keyfile", default=None)
    parser.add_argument("--authorize", action="store_true",
                        help="authorize as a pool's coordinator apiserver (needs --tls-dir)")
    parser.add_argument("--named-lease", action="append", default=None,
                        metavar="NAMESPACE/NAME", type=_named_lease,
                        help="a lease every node may write by name (with --authorize; "
                             "default: the election and informer sync leases)")
    parser.add_argument("--no-full-collections", action="store_true",
                        help="no automatic full garbage collections (large stores)")
    parser.add_argument("--verbose", action="store_true",
                        help="log every request to stderr")
    options = parser.parse_args(argv)
    if options.authorize and not options.tls_dir:
        parser.error("--authorize needs --tls-dir: users come from client certificates")
    if options.named_lease and not options.authorize:
        parser.error("--named-lease is for --authorize")
    return options


def _named_lease(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` as the pair the authorizer takes."""
    namespace, slash, name = text.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise argparse.ArgumentTypeError(f"not NAMESPACE/NAME: {text!r}")
    return namespace, name


def authorizer_of(options: argparse.Namespace) -> "IAuthorizer | None":
    """The authorizer the options ask for (None without ``--authorize``)."""
    if not options.authorize:
        return None
    from yurtcoord.sim.apiserver.authz import DEFAULT_NAMED_LEASES, PoolCoordinatorAuthorizer
    return PoolCoordinatorAuthorizer(options.named_lease or DEFAULT_NAMED_LEASES)


def _garbage_collection(options: argparse.Namespace) -> None:
    """Hold full collections off for the process's life with ``--no-full-collections``
    (young and middle ones go on, so the garbage of each request is still freed)."""
    if options.no_full_collections:
        from yurtcoord.tx.heap import hold_collections
        hold_collections(main, middle=False)


def main(reactor: Any, argv: list[str]) -> defer.Deferred[Any]:
    from yurtcoord.sim.apiserver import KubeAPIServer

    options = _parse(argv)
    _garbage_collection(options)
    if options.verbose:
        from twisted.logger import globalLogBeginner, textFileLogObserver
        globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)])
    storage = None
    if options.etcd:
        from yurtcoord.sim.apiserver.etcdstorage import storage_for
        storage = storage_for(reactor, options.etcd, options.etcd_prefix,
                              ca_file=options.etcd_cafile, cert_file=options.etcd_certfile,
                              key_file=options.etcd_keyfile)
    server = KubeAPIServer(reactor, tls_dir=options.tls_dir, history=options.history,
                           request_log_path=options.request_log, storage=storage,
                           authorizer=authorizer_of(options))
    finished: defer.Deferred[None] = defer.Deferred()


    def started(url):
        if options.kubeconfig:
            from yurtcoord.sim.apiserver.clients import write_kubeconfig
            from yurtcoord.sim.pki import CertPair
            pair = None
            if options.tls_dir:
                pair = CertPair(os.path.join(options.tls_dir, "client.crt"),
                                os.path.join(options.tls_dir, "client.key"))
            write_kubeconfig(options.kubeconfig, url, client_pair=pair,
                             ca_file=os.path.join(options.tls_dir, "ca.crt")
                             if options.tls_dir else None)
        print(url, flush=True)
        reactor.addSystemEventTrigger("before", "shutdown", server.stop)
        return finished

    return server.start(options.port, options.interface).addCallback(started)


if __name__ == "__main__":
    task.react(main, (sys.argv[1:],))
