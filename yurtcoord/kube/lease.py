"""Helpers for ``coordination.k8s.io/v1`` Lease objects kept as plain dicts.

Kubernetes writes Lease times as ``MicroTime``: ``2006-01-02T15:04:05.000000Z`` in
UTC. Times here are POSIX seconds (floats), the unit of ``reactor.seconds()``.
"""

import copy
import datetime
import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Generator, Optional

from twisted.internet import defer

from yurtcoord.kube.errors import Forbidden, NotFound
from yurtcoord.kube.gvr import NODES

MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})"
    r"(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))$"
)


def format_micro_time(seconds: float) -> str:
    """``seconds`` (POSIX) as a Kubernetes MicroTime string, microsecond precision."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime(MICRO_TIME_FORMAT)


# How much a write moves a lease's renewTime past the one it holds, at least:
# MicroTime's resolution, the smallest step the node lifecycle controller sees.
RENEW_TIME_STEP = datetime.timedelta(microseconds=1)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _micro_moment(value: object) -> Optional[datetime.datetime]:
    """A MicroTime (or RFC 3339) string as an exact UTC datetime, to the microsecond;
    None when absent or malformed. POSIX seconds in a float lose the microsecond of
    times far from now, and a renewTime 1 µs past another must be later once written."""
    if not isinstance(value, str) or not value:
        return None
    try:
        seconds = parse_micro_time(value)
    except ValueError:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        return _EPOCH + datetime.timedelta(microseconds=round(seconds * 1e6))
    return moment.astimezone(datetime.timezone.utc)


def stamped_renew_time(now: float, current_renew_time: object = None) -> str:
    """The renewTime a write of a node lease in the cloud carries: the writer's
    ``now`` (POSIX seconds), or 1 µs past ``current_renew_time`` (the lease's
    ``spec.renewTime`` as read) when that is not earlier. The node lifecycle
    controller counts a heartbeat only when the cloud's renewTime increases; one left
    ahead of this writer's clock (by a leader or node whose clock was ahead) must not
    swallow the heartbeats written after it (docs/design.md, "Clocks"). The one
    implementation, for the node's own writes and the leader's delegation alike."""
    stamp = round(now * 1e6)
    current = _exact_micros(current_renew_time)
    if current is not None and current >= stamp:
        # Past the last MicroTime there is nothing later, and only a time this writer
        # can vouch for lets the lease increase again afterwards.
        if current < _LAST_MICROS:
            stamp = current + 1
    return _format_micros(stamp)


# The last MicroTime there is, in POSIX microseconds.
_LAST_MICROS = (datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
                - _EPOCH) // RENEW_TIME_STEP
# The minutes of the times stamped and read lately, as POSIX microseconds and as the
# text of a MicroTime up to its seconds ("2006-01-02T15:04:"): the pool leader stamps
# and reads a thousand renewTimes a second, nearly all of them of the same few minutes,
# and a datetime made, formatted or parsed for each cost more than its write's JSON.
_MINUTE_TEXTS: dict[int, str] = {}
_MINUTE_MICROS: dict[str, int] = {}
_MICROS_PER_MINUTE = 60_000_000


def _format_micros(micros: int) -> str:
    """POSIX microseconds as a MicroTime string, as ``strftime(MICRO_TIME_FORMAT)`` of
    that moment writes it."""
    minute, rest = divmod(micros, _MICROS_PER_MINUTE)
    text = _MINUTE_TEXTS.get(minute)
    if text is None:
        if len(_MINUTE_TEXTS) >= _MINUTES_KEPT:
            _MINUTE_TEXTS.clear()
        moment = _EPOCH + datetime.timedelta(microseconds=minute * _MICROS_PER_MINUTE)
        text = _MINUTE_TEXTS[minute] = moment.strftime("%Y-%m-%dT%H:%M:")
    second, fraction = divmod(rest, 1_000_000)
    return f"{text}{second:02d}.{fraction:06d}Z"


def _exact_micros(value: object) -> Optional[int]:
    """A MicroTime (or RFC 3339) string as exact POSIX microseconds; None when absent
    or malformed. A canonical MicroTime of a minute seen lately is read without a
    datetime; any other goes through ``_micro_moment``."""
    if (type(value) is str and len(value) == _CANONICAL_LENGTH and value[26] == "Z"
            and value[19] == "." and value[16] == ":"):
        minute = _MINUTE_MICROS.get(value[:17])
        second, fraction = value[17:19], value[20:26]
        if (minute is not None and second.isascii() and second.isdigit() and second < "60"
                and fraction.isascii() and fraction.isdigit()):
            return minute + int(second) * 1_000_000 + int(fraction)
        moment = _micro_moment(value)
        if moment is None:
            return None
        micros = (moment - _EPOCH) // RENEW_TIME_STEP
        if len(_MINUTE_MICROS) >= _MINUTES_KEPT:
            _MINUTE_MICROS.clear()
        _MINUTE_MICROS[value[:17]] = micros - micros % _MICROS_PER_MINUTE
        return micros
    moment = _micro_moment(value)
    return None if moment is None else (moment - _EPOCH) // RENEW_TIME_STEP


# POSIX seconds of the minutes of canonical MicroTimes parsed lately
# ("2006-01-02T15:04" -> seconds): the pool leader parses a thousand renewTimes a
# second, nearly all of them of the same few minutes.
_MINUTES: dict[str, float] = {}
_MINUTES_KEPT = 256
# The length of a canonical MicroTime, and where its separators are.
_CANONICAL_LENGTH = 27


def parse_micro_time(text: object) -> float:
    """POSIX seconds of a MicroTime or RFC 3339 time (any fraction length, ``Z`` or
    an offset), as Kubernetes and Go clients write them. ValueError if malformed."""
    if (type(text) is str and len(text) == _CANONICAL_LENGTH and text[26] == "Z"
            and text[19] == "." and text[16] == ":"):
        minute = _MINUTES.get(text[:16])
        if minute is not None:
            second, fraction = text[17:19], text[20:26]
            if (second.isascii() and second.isdigit() and second < "60"
                    and fraction.isascii() and fraction.isdigit()):
                return minute + int(second) + int(fraction) / 1e6
        value = _parse_rfc3339(text)
        if len(_MINUTES) >= _MINUTES_KEPT:
            _MINUTES.clear()
        _MINUTES[text[:16]] = _parse_rfc3339(text[:16] + ":00Z")
        return value
    return _parse_rfc3339(text)


def _parse_rfc3339(text: object) -> float:
    if not isinstance(text, str):
        raise ValueError(f"not a time string: {text!r}")
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    offset = datetime.timedelta(0)
    if not zulu:
        offset = datetime.timedelta(hours=int(off_h), minutes=int(off_m))
        if sign == "-":
            offset = -offset
    moment = datetime.datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second),
        tzinfo=datetime.timezone(offset),
    )
    whole = moment.timestamp()
    if fraction:
        # Keep only microseconds: that is all MicroTime carries.
        whole += int(fraction[:6].ljust(6, "0")) / 1e6
    return whole


def _optional_time(value: object) -> Optional[float]:
    if value in (None, ""):
        return None
    return parse_micro_time(value)


def _optional_int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class LeaseRecord:
    """The election-relevant part of a Lease spec.

    Two records are equal when a Lease has not changed in a way that matters for the
    election; an elector uses that to tell when it last saw the holder renew.
    Times are POSIX seconds or None.
    """

    holder_identity: str = ""
    lease_duration_seconds: Optional[int] = None
    acquire_time: Optional[float] = None
    renew_time: Optional[float] = None
    lease_transitions: int = 0

    @classmethod
    def from_lease(cls, lease: Optional[Mapping[str, Any]]) -> "LeaseRecord":
        """The record of a Lease dict. Malformed times read as None rather than
        failing: a peer's bad timestamp must not stop an election (expiry is judged
        on the local clock anyway)."""
        spec = (lease or {}).get("spec") or {}
        return cls(
            holder_identity=spec.get("holderIdentity") or "",
            lease_duration_seconds=_optional_int(spec.get("leaseDurationSeconds")),
            acquire_time=_lenient_time(spec.get("acquireTime")),
            renew_time=_lenient_time(spec.get("renewTime")),
            lease_transitions=_optional_int(spec.get("leaseTransitions")) or 0,
        )

    def to_spec(self) -> dict[str, Any]:
        """The record as a Lease ``spec`` dict (absent fields left out)."""
        spec: dict[str, Any] = {"holderIdentity": self.holder_identity}
        if self.lease_duration_seconds is not None:
            spec["leaseDurationSeconds"] = self.lease_duration_seconds
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        spec["leaseTransitions"] = self.lease_transitions
        return spec


def _lenient_time(value: object) -> Optional[float]:
    try:
        return _optional_time(value)
    except ValueError:
        return None


def build_lease(name: str, namespace: str, record: LeaseRecord,
                labels: Optional[Mapping[str, str]] = None,
                annotations: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """A new Lease dict carrying ``record`` (a LeaseRecord)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": record.to_spec(),
    }


def with_record(lease: dict[str, Any], record: LeaseRecord) -> dict[str, Any]:
    """A copy of ``lease`` (metadata, resourceVersion included) whose election fields
    are replaced by ``record``; other spec fields are kept."""
    updated = copy.deepcopy(lease)
    spec = updated.setdefault("spec", {})
    for key in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime",
                "leaseTransitions"):
        spec.pop(key, None)
    spec.update(record.to_spec())
    return updated


def holder_identity(lease: Optional[Mapping[str, Any]]) -> str:
    """The holder of a Lease dict, ``""`` when free."""
    return LeaseRecord.from_lease(lease).holder_identity


def lease_duration_seconds(lease: Optional[Mapping[str, Any]]) -> Optional[int]:
    """``spec.leaseDurationSeconds`` or None."""
    return LeaseRecord.from_lease(lease).lease_duration_seconds


def renew_time(lease: Optional[Mapping[str, Any]]) -> Optional[float]:
    """``spec.renewTime`` as POSIX seconds, or None."""
    return LeaseRecord.from_lease(lease).renew_time


def lease_transitions(lease: Optional[Mapping[str, Any]]) -> int:
    """``spec.leaseTransitions``, 0 when absent."""
    return LeaseRecord.from_lease(lease).lease_transitions


def resource_version(obj: Optional[Mapping[str, Any]]) -> Optional[str]:
    """``metadata.resourceVersion`` of any object dict, or None."""
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def resource_version_number(obj: Optional[dict]) -> Optional[int]:
    """``metadata.resourceVersion`` of any object dict as a number, or None when it is
    absent or not a decimal number (as the pool store orders versions)."""
    rv = resource_version(obj)
    if isinstance(rv, str) and rv.isdigit():
        return int(rv)
    return None


def owner_reference_to_node(node: Optional[dict]) -> Optional[dict]:
    """The ownerReference the kubelet puts on its node lease, naming ``node`` (apiVersion
    v1, kind Node, name, uid), so the lease goes when the Node goes; None for a Node
    without a name or uid."""
    metadata = (node or {}).get("metadata") or {}
    if not metadata.get("name") or not metadata.get("uid"):
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": metadata["name"],
            "uid": metadata["uid"]}


@defer.inlineCallbacks
def node_owner_reference(client: Any, node_name: str,
                         ) -> Generator[defer.Deferred[Any], Any, Optional[dict]]:

    """``owner_reference_to_node`` of Node ``node_name`` as ``client``'s server holds
    it. Fires with None when that server has no such Node, may not show it, or shows
    it without a uid: the lease is then written without an owner. Other errors fail
    the Deferred."""
    try:
        node = yield client.get(NODES, node_name)
    except (NotFound, Forbidden):
        return None
    return owner_reference_to_node(node)
