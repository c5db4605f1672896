"""The contracts of the health checkers.

The hub elector reads ``healthy`` of the cloud and coordinator checkers; the
status pages read each server's health (``servers()``) of both; the clients of the
coordinator apiservers ask the coordinator checker where to send each request; the
coordinator's lease prober also follows the cloud's health (``decided`` and
``add_listener``) to mark its lease delegated; delegation asks the cloud checker
for a healthy server. The real checkers in ``yurtcoord.heartbeat.probes`` and the
unit tests' fake provide these interfaces and are checked with ``verifyObject``,
so consumers call the members directly.
"""

from typing import Any, Callable, Optional

from twisted.internet import defer
from zope.interface import Attribute, Interface

from yurtcoord.tx.guardedloop import ILoopErrors


class IHealthChecker(Interface):
    """A server (or a set of them) probed on a cadence."""

    healthy = Attribute("True while the last probes succeeded often enough.")

    def start() -> None:
        """Start probing."""

    def restart() -> None:
        """Probe now (right after the probe in flight, if any)."""

    def stop() -> defer.Deferred[Any]:
        """Stop probing; the Deferred fires once no probe is left running."""


class ICloudHealthChecker(IHealthChecker):
    """The cloud's health, over every cloud server."""

    decided = Attribute(
        "False until the cloud's health is known: no server was found healthy yet and "
        "some server has not answered its first probe.")

    def add_listener(callback: Callable[[bool], object]) -> None:
        """Call ``callback(healthy)`` when the health becomes known and on every flip."""

    def servers() -> dict[str, bool]:
        """``{url: healthy}`` of every cloud server."""

    def pick_healthy_server() -> Optional[str]:
        """A healthy server URL, rotating among the healthy ones; None when none is."""


class ICoordinatorHealthChecker(IHealthChecker):
    """The coordinator's health, over every coordinator apiserver."""

    def servers() -> dict[str, bool]:
        """``{url: healthy}`` of every coordinator apiserver."""

    def unhealthy_reasons() -> dict[str, str]:
        """``{url: why its last probe failed}`` of every coordinator apiserver that is
        not healthy."""

    def pick_server() -> str:
        """The coordinator apiserver the next request goes to: the one the node lease
        is written through while it is healthy, else another healthy one, else the
        one the node lease is written through."""

    def suspect(server: str) -> None:
        """A request to ``server`` got no answer: probe it now, and send requests
        elsewhere until that probe has ended."""


class IKubeletLiveness(Interface):
    """Whether the node's kubelet lives: every probe asks it first (a node whose
    kubelet is dead must not be kept alive), and the status pages name it as the
    cause while it is dead."""

    def is_alive() -> bool:
        """True while the kubelet answered within its grace period."""

    def dead_for() -> Optional[float]:
        """Seconds since the kubelet's last healthy answer (or, before its first, since
        the checks started) while it counts as dead; None while it is alive."""

    def add_listener(callback: Callable[[bool], object]) -> None:
        """``callback(alive)`` when the kubelet turns dead and when it is back."""


class IServerHealthMetrics(ILoopErrors):
    """Where the health checkers report each server's health as they decide it (the
    agent's ``Metrics``): the cloud servers' and the coordinator apiservers', and the
    unexpected errors of their loops."""

    def set_server_healthy(server: str, healthy: bool) -> None:
        """The cloud server ``server`` is now healthy or not."""

    def set_coordinator_server_healthy(server: str, healthy: bool) -> None:
        """The coordinator apiserver ``server`` is now healthy or not."""


class IKubeletAnswer(Interface):
    """What the kubelet check reads of the answer to its healthz request (a treq
    response): the status code, and the body read to its end."""

    code = Attribute("The HTTP status code.")

    def content() -> defer.Deferred[bytes]:
        """The whole body."""
