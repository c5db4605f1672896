"""A DNS that a test scripts: names resolve to what ``answers`` says now, to nothing
(the name does not resolve, as when the DNS server is out of reach), or not at all
until the test releases the lookups (a DNS server that does not answer); and a
receiver that records what a resolution told it."""

from collections.abc import Sequence
from typing import Literal, Optional

from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import (
    IAddress, IHostnameResolver, IHostResolution, IResolutionReceiver,
)
from zope.interface import implementer


@implementer(IHostResolution)
class FakeResolution:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@implementer(IHostnameResolver)
class FakeResolver:
    """Resolves a name to ``answers[name]`` (IP address strings) at the moment of the
    lookup, a name not in ``answers`` to no address, an IP literal to itself. With
    ``hang`` set, lookups get no answer until ``release()``; with ``error`` set, a
    lookup raises it. ``lookups`` lists every name asked, in order."""

    def __init__(self, answers: Optional[dict[str, Sequence[str]]] = None) -> None:
        self.answers: dict[str, Sequence[str]] = dict(answers or {})
        self.hang = False
        self.error: Optional[Exception] = None
        self.lookups: list[str] = []
        self._held: list[tuple[IResolutionReceiver, str, int, str]] = []

    def resolveHostName(self, resolutionReceiver: IResolutionReceiver, hostName: str,
                        portNumber: int = 0,
                        addressTypes: Optional[Sequence[type[IAddress]]] = None,
                        transportSemantics: str = "TCP") -> IHostResolution:
        self.lookups.append(hostName)
        if self.error is not None:
            raise self.error
        resolution = FakeResolution(hostName)
        resolutionReceiver.resolutionBegan(resolution)
        if self.hang:
            self._held.append((resolutionReceiver, hostName, portNumber, transportSemantics))
        else:
            self._answer(resolutionReceiver, hostName, portNumber, transportSemantics)
        return resolution

    def release(self) -> None:
        """Answer the held lookups with what ``answers`` says now."""
        held, self._held = self._held, []
        for receiver, name, port, transport in held:
            self._answer(receiver, name, port, transport)

    @property
    def held(self) -> int:
        return len(self._held)

    def _answer(self, receiver: IResolutionReceiver, name: str, port: int,
                transport: str) -> None:
        if isIPAddress(name) or isIPv6Address(name):
            hosts: Sequence[str] = [name]
        else:
            hosts = self.answers.get(name, ())
        kind: Literal["TCP", "UDP"] = "UDP" if transport == "UDP" else "TCP"
        for host in hosts:
            if isIPv6Address(host):
                receiver.addressResolved(IPv6Address(kind, host, port))
            else:
                receiver.addressResolved(IPv4Address(kind, host, port))
        receiver.resolutionComplete()


@implementer(IResolutionReceiver)
class RecordingReceiver:
    """What one resolution told its receiver: ``began``, ``addresses`` as
    ``(host, port)``, ``complete``."""

    def __init__(self) -> None:
        self.began = False
        self.addresses: list[tuple[str, int]] = []
        self.complete = False

    def resolutionBegan(self, resolutionInProgress: IHostResolution) -> None:
        self.began = True

    def addressResolved(self, address: IAddress) -> None:
        assert isinstance(address, (IPv4Address, IPv6Address))
        self.addresses.append((address.host, address.port))

    def resolutionComplete(self) -> None:
        self.complete = True
