"""One real etcd per kind for a whole test run, instead of a new etcd per test.

Starting etcd costs a test about as much as the test itself; most tests only need an
etcd that holds nothing when they begin. ``use_shared_etcd(case, binary)`` hands a test
the one etcd of its kind, where the kind is the binary, TLS or not, and the extra etcd
flags (an etcd started with small request limits is a different etcd from a plain one):

- It is started at first use, synchronously (``EtcdProcess.start`` runs etcd with
  ``subprocess.Popen``, outside the reactor), and kept for the rest of the process;
  ``yurtcoord.sim.etcd`` stops every live ``EtcdProcess`` at interpreter exit, which
  removes its directory, the CA of a TLS etcd included.
- Nothing of it stays in the reactor between tests: each test makes its clients and
  closes them in its own cleanups, as with an etcd of its own.
- After each test a cleanup deletes every key (``etcdctl del "" --from-key``), so the
  next test again starts from an empty etcd. It runs after the test's other cleanups
  (it is registered first), so after its clients are closed and a frozen etcd is thawed.
- A test may kill and restart it (``kill()`` then ``restart()`` keep its data dir and
  ports). One that leaves it dead is not wiped; the next test gets a new etcd.

What the test may not rely on is where etcd's revision counter starts, since earlier
tests advanced it; a test about absolute revisions, about how etcd starts, or about an
etcd it reconfigures keeps an ``EtcdProcess`` of its own.
"""

import os
import tempfile
from typing import Sequence

from twisted.trial import unittest

from yurtcoord.sim.etcd import EtcdBinary, EtcdProcess
from yurtcoord.sim.pki import TestCA

_Kind = tuple[str, bool, tuple[str, ...]]

_shared: dict[_Kind, EtcdProcess] = {}


def shared_etcd(binary: EtcdBinary, tls: bool = False,
                extra_args: Sequence[str] = ()) -> EtcdProcess:
    """The running etcd of this kind, started now when there is none or the last one
    was left dead. With ``tls`` it requires client certificates of its own CA
    (``etcd.tls_ca``; ``etcd.client_cert`` is one it accepts)."""
    kind = (os.path.realpath(binary.etcd), tls, tuple(extra_args))
    etcd = _shared.get(kind)
    if etcd is not None and etcd.is_running():
        return etcd
    if etcd is not None:
        del _shared[kind]
        etcd.stop()
    base_dir = tempfile.mkdtemp(prefix="yurtcoord-shared-etcd-")
    ca = TestCA(os.path.join(base_dir, "ca")) if tls else None
    etcd = EtcdProcess(binary, tls_ca=ca, extra_args=list(extra_args), base_dir=base_dir)
    try:
        etcd.start()
    except BaseException:
        etcd.stop()
        raise
    _shared[kind] = etcd
    return etcd


def wipe(etcd: EtcdProcess) -> None:
    """Delete every key of ``etcd`` when it is running (a dead one is replaced at the
    next ``shared_etcd``). An etcd that refuses the delete is stopped, so that no test
    gets it with the keys of another."""
    if not etcd.is_running():
        return
    try:
        etcd.etcdctl("del", "", "--from-key")
    except BaseException:
        etcd.stop()
        raise


def use_shared_etcd(case: unittest.SynchronousTestCase, binary: EtcdBinary,
                    tls: bool = False, extra_args: Sequence[str] = ()) -> EtcdProcess:
    """``shared_etcd(...)`` for the test ``case``, wiped once the test is over.

    Call it in ``setUp`` before adding other cleanups, so that the wipe comes last."""
    etcd = shared_etcd(binary, tls=tls, extra_args=extra_args)
    case.addCleanup(wipe, etcd)
    return etcd
