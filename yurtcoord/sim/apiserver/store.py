"""The object store behind the test API server: one global resourceVersion,
a bounded history of changes for watch replay, and live watch delivery.

Writes made directly through this store (from tests) and writes made over HTTP
follow the same rules and produce the same watch events.
"""

import bisect
import copy
import datetime
import itertools
import random
import re
import uuid
from collections import OrderedDict, deque
from operator import attrgetter
from typing import Any, Callable

from twisted.internet.interfaces import IReactorTime

from twisted.logger import Logger

from yurtcoord.sim.apiserver import status
from yurtcoord.kube.gvr import GroupVersionResource
from yurtcoord.sim.apiserver.catalog import Catalog, ResourceType
from yurtcoord.sim.apiserver.selectors import ObjectFilter
from yurtcoord.sim.apiserver.watchers import WatchEvent, Watcher, encode_object

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Sorted snapshots kept for the pages of lists.
_SNAPSHOTS = 8


# A list of objects. (Inside ObjectStore, ``list`` names its method.)
Objects = list[dict[str, Any]]


def _copy(obj):
    return copy.deepcopy(obj)


def _timestamp(seconds):
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


_VOLATILE_METADATA = ("resourceVersion", "managedFields")


def _same_but_volatile(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two objects are equal apart from the metadata fields the server
    manages (a no-op update); compared in place, since a copy of each object on every
    update is most of what a write costs the server."""
    if one.keys() != other.keys():
        return False
    for field, value in one.items():
        if field != "metadata":
            if value != other[field]:
                return False
            continue
        mine, theirs = value or {}, other[field] or {}
        if ({k: v for k, v in mine.items() if k not in _VOLATILE_METADATA}
                != {k: v for k, v in theirs.items() if k not in _VOLATILE_METADATA}):
            return False
    return True


def served_type(catalog: Catalog, gvr: GroupVersionResource) -> ResourceType:
    """The served type of ``gvr``, or the 404 a client gets for a type not served."""
    try:
        return catalog.type_of(gvr)
    except KeyError:
        raise status.error(404, f"the server could not find the requested resource ({gvr})")


def namespace_of(resource_type: ResourceType, metadata: dict[str, Any],
                 namespace: str | None) -> str:
    """The namespace an object of this type lives in: none for cluster-scoped types,
    else ``namespace``, the object's own, or ``default``."""
    if not resource_type.gvr.namespaced:
        return ""
    return namespace or metadata.get("namespace") or "default"


def decorate(resource_type: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with kind and apiVersion of its type, placed first."""
    rest = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return {"kind": resource_type.kind, "apiVersion": resource_type.api_version, **rest}


def validate_name(resource_type: ResourceType, name: Any, namespace: str) -> None:
    """422 Invalid for a missing name or one (or a namespace) that is no DNS subdomain."""
    if not name:
        raise status.invalid(resource_type, name, "metadata.name",
                             "Required value: name or generateName is required")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise status.invalid(
            resource_type, name, "metadata.name",
            f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
            "lower case alphanumeric characters, '-' or '.', and must start and end "
            "with an alphanumeric character")
    if namespace and not _DNS_SUBDOMAIN.match(namespace):
        raise status.invalid(resource_type, name, "metadata.namespace",
                             f'Invalid value: "{namespace}"')


def check_object(resource_type: ResourceType, obj: Any) -> dict[str, Any]:
    """The metadata of a written object, after what kube-apiserver's decoder refuses
    (400) before validation runs."""
    if not isinstance(obj, dict):
        raise status.bad_request(f"the body of a {resource_type.kind} must be a JSON object")
    metadata = obj.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise status.bad_request("metadata must be a JSON object")
    for field in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        value = metadata.get(field)
        if value is not None and not isinstance(value, str):
            raise status.bad_request(
                f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                f"ObjectMeta.metadata.{field} of type string")
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is not None and (not isinstance(value, dict) or not all(
                isinstance(v, str) for v in value.values())):
            raise status.bad_request(
                f"json: cannot unmarshal metadata.{field}: expected a map of strings")
    return metadata


def incoming(catalog: Catalog, gvr: GroupVersionResource, obj: dict[str, Any],
             namespace: str | None) -> tuple[ResourceType, dict[str, Any], dict[str, Any], str]:
    """A written object checked against its type and copied, with its metadata
    dict (made if absent) and its namespace: what create and update start from."""
    resource_type = served_type(catalog, gvr)
    check_object(resource_type, obj)
    obj = _copy(obj)
    metadata = obj.get("metadata") or {}
    obj["metadata"] = metadata
    return resource_type, obj, metadata, namespace_of(resource_type, metadata, namespace)


def generated_name(prefix: str, rng: random.Random) -> str:
    """``generateName`` plus five random characters, as kube-apiserver makes them."""
    return prefix + "".join(rng.choice(_GENERATE_ALPHABET) for _ in range(5))


def new_object(resource_type: ResourceType, obj: dict[str, Any], ns: str, name: str,
               now: float) -> dict[str, Any]:
    """A created object with the metadata the server sets (uid, creation time,
    generation), decorated with its kind; its resourceVersion is the caller's."""
    metadata = obj["metadata"]
    metadata["name"] = name
    if ns:
        metadata["namespace"] = ns
    else:
        metadata.pop("namespace", None)
    metadata["uid"] = str(uuid.uuid4())
    metadata.pop("resourceVersion", None)
    metadata["creationTimestamp"] = _timestamp(now)
    metadata["generation"] = 1
    for server_managed in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        metadata.pop(server_managed, None)
    return decorate(resource_type, obj)


def replacement(resource_type: ResourceType, current: dict[str, Any], obj: dict[str, Any],
                ns: str, subresource: str | None) -> dict[str, Any] | None:
    """What a PUT of ``obj`` over ``current`` stores, or None when nothing changes.

    A resourceVersion in ``obj`` must be the current one (else 409 Conflict); none
    means unconditional. For types with a status subresource, a main update keeps the
    stored status and a ``subresource="status"`` update changes only the status. The
    result carries the current resourceVersion; the caller sets the new one."""
    name = obj["metadata"]["name"]
    wanted_rv = obj["metadata"].get("resourceVersion")
    if wanted_rv not in (None, "") and str(wanted_rv) != current["metadata"]["resourceVersion"]:
        raise status.conflict(resource_type, name)
    has_status = "status" in resource_type.subresources
    if subresource == "status":
        new = _copy(current)
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
    elif subresource:
        raise status.error(404, f"the server could not find the requested resource "
                                f"({resource_type.gvr.resource}/{subresource})")
    else:
        new = obj
        if has_status:
            if "status" in current:
                new["status"] = _copy(current["status"])
            else:
                new.pop("status", None)
    new_meta = new["metadata"]
    old_meta = current["metadata"]
    for preserved in ("uid", "creationTimestamp", "generation", "name"):
        if preserved in old_meta:
            new_meta[preserved] = old_meta[preserved]
    if ns:
        new_meta["namespace"] = ns
    else:
        new_meta.pop("namespace", None)
    new_meta.pop("deletionTimestamp", None)
    if "deletionTimestamp" in old_meta:
        new_meta["deletionTimestamp"] = old_meta["deletionTimestamp"]
    new = decorate(resource_type, new)
    new_meta = new["metadata"]
    new_meta["resourceVersion"] = old_meta["resourceVersion"]
    if _same_but_volatile(new, current):
        return None
    spec_changed = ({k: v for k, v in new.items() if k not in ("metadata", "status")}
                    != {k: v for k, v in current.items() if k not in ("metadata", "status")})
    if spec_changed and isinstance(old_meta.get("generation"), int):
        new_meta["generation"] = old_meta["generation"] + 1
    return new


def check_preconditions(resource_type: ResourceType, name: str, current: dict[str, Any],
                        preconditions: dict[str, Any] | None) -> None:
    """409 Conflict when a delete's uid or resourceVersion precondition does not hold."""
    preconditions = preconditions or {}
    meta = current["metadata"]
    if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
        raise status.conflict(
            resource_type, name,
            f"Precondition failed: UID in precondition: {preconditions['uid']}, "
            f"UID in object meta: {meta.get('uid')}")
    wanted_rv = preconditions.get("resourceVersion")
    if wanted_rv and str(wanted_rv) != meta["resourceVersion"]:
        raise status.conflict(
            resource_type, name,
            f"Precondition failed: ResourceVersion in precondition: {wanted_rv}, "
            f"ResourceVersion in object meta: {meta['resourceVersion']}")


def position(obj: dict[str, Any]) -> str:
    """The object's place in a list of its type: its key below the resource's
    prefix, ``namespace/name`` (``name`` for cluster-scoped objects); lists are in
    this order, the order of the keys in etcd."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


class ObjectStore:
    """Objects of every served type, keyed by (type, namespace, name).

    ``clock`` provides ``seconds()`` for creation timestamps. ``history`` bounds
    how many past events a watch can replay; older resourceVersions get 410.
    """

    log = Logger()

    def __init__(self, catalog: Catalog, clock: IReactorTime, history: int = 1000,
                 seed: int | None = None) -> None:
        self.catalog = catalog
        self._clock = clock
        self._objects: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque()
        self._history_limit = max(0, int(history))
        # The retained events by their object's identity, for ``encoded``: an entry
        # holds its event, and so the object, until the event leaves the history.
        self._retained: dict[int, WatchEvent] = {}
        self._oldest_watchable = 0
        self._watchers: set[Watcher] = set()
        self._random = random.Random(seed)
        # Sorted lists of the objects of one type at one revision, for the pages of a
        # list: the stored dicts are never changed in place (a write stores a new
        # one), so the pages share them and only each page is copied.
        self._snapshots: OrderedDict[tuple[Any, ...], tuple[list[str], Objects]] = (
            OrderedDict())

    # -- bookkeeping -----------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion (an int; the wire form is its string)."""
        return self._rv

    @property
    def oldest_watchable(self) -> int:
        """The oldest resourceVersion a watch may start from without a 410."""
        return self._oldest_watchable

    def compact(self) -> None:
        """Forget all history: watches from any older resourceVersion get 410."""
        self._history.clear()
        self._retained.clear()
        self._oldest_watchable = self._rv
        self.log.info("store compacted at rv={rv}", rv=self._rv)

    def _type(self, gvr):
        return served_type(self.catalog, gvr)

    @staticmethod
    def _type_key(resource_type):
        gvr = resource_type.gvr
        return (gvr.group, gvr.version, gvr.resource)

    def encoded(self, obj: dict[str, Any]) -> str | None:
        """The JSON of ``obj`` when it is the object of an event the store retains
        (encoded once, when the change was recorded), else None: a watch stream
        writes it instead of encoding the object again."""
        event = self._retained.get(id(obj))
        return event.encoded if event is not None and event.object is obj else None

    def _record(self, event_type, key, obj, old=None):
        # ``old`` is the stored object being replaced: stored objects are never
        # changed in place, so the event keeps it as it is. Nor is an event's own
        # copy, which is what lets the event keep its JSON.
        event_object = _copy(obj)
        event = WatchEvent(event_type, self._rv, key, event_object, old,
                           encode_object(event_object) if self._history_limit else None)
        if self._history_limit:
            self._history.append(event)
            self._retained[id(event_object)] = event
            while len(self._history) > self._history_limit:
                dropped = self._history.popleft()
                del self._retained[id(dropped.object)]
                self._oldest_watchable = dropped.resource_version
        else:
            self._oldest_watchable = self._rv
        for watcher in list(self._watchers):
            watcher.offer(event)

    # -- reads -----------------------------------------------------------------

    def get(self, gvr: GroupVersionResource, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the object, or None."""
        resource_type = self._type(gvr)
        ns = namespace_of(resource_type, {}, namespace)
        obj = self._objects.get((self._type_key(resource_type), ns, name))
        return _copy(obj) if obj is not None else None

    def list(self, gvr: GroupVersionResource, namespace: str | None = None,
             label_selector: str = "", field_selector: str = "") -> Objects:
        """Copies of the matching objects, sorted by namespace and name."""
        return self.list_with_version(gvr, namespace, label_selector, field_selector)[0]

    def list_with_version(self, gvr: GroupVersionResource, namespace: str | None = None,
                          label_selector: str = "", field_selector: str = "",
                          ) -> tuple[Objects, int]:
        resource_type = self._type(gvr)
        if not resource_type.gvr.namespaced:
            namespace = None
        object_filter = ObjectFilter(namespace, label_selector, field_selector)
        type_key = self._type_key(resource_type)
        items = [
            _copy(obj) for key, obj in sorted(self._objects.items())
            if key[0] == type_key and object_filter.matches(obj)
        ]
        return items, self._rv

    def list_page(self, gvr: GroupVersionResource, namespace: str | None,
                  revision: int | None, after: str | None,
                  limit: int | None) -> tuple[Objects, int, int]:
        """``(objects, revision, remaining)``: copies of at most ``limit`` objects of
        ``gvr`` (in ``namespace``) positioned after ``after``, now or at ``revision``,
        and how many come after them."""
        resource_type = self._type(gvr)
        if not resource_type.gvr.namespaced:
            namespace = None
        at = self._rv if revision is None else revision
        self._check_revision(at)
        cache_key = (self._type_key(resource_type), namespace, at)
        snapshot = self._snapshots.pop(cache_key, None)
        if snapshot is None:
            objects = (self._objects_at(resource_type, namespace, at) if at != self._rv else
                       self._objects_at(resource_type, namespace, None))
            keyed = sorted(((position(obj), obj) for obj in objects), key=lambda p: p[0])
            snapshot = ([p for p, _ in keyed], [obj for _, obj in keyed])
        self._snapshots[cache_key] = snapshot
        while len(self._snapshots) > _SNAPSHOTS:
            self._snapshots.popitem(last=False)
        positions, objects = snapshot
        start = bisect.bisect_right(positions, after) if after is not None else 0
        end = min(len(objects), start + limit) if limit else len(objects)
        return [_copy(obj) for obj in objects[start:end]], at, len(objects) - end

    def _check_revision(self, revision: int) -> None:
        if revision > self._rv:
            raise status.error(504, f"Too large resource version: {revision}, "
                                    f"current: {self._rv}")
        if revision < self._oldest_watchable:
            raise status.expired(revision, self._oldest_watchable)

    def _objects_at(self, resource_type: ResourceType, namespace: str | None,
                    revision: int | None) -> Objects:
        """The stored objects (not copies) of a type, now (``revision`` None) or at
        ``revision`` by undoing the retained history after it."""
        type_key = self._type_key(resource_type)
        objects = {key: obj for key, obj in self._objects.items() if key[0] == type_key}
        if revision is not None:
            for event in reversed(self._history):
                if event.resource_version <= revision:
                    break
                if event.key[0] != type_key:
                    continue
                if event.type == "ADDED":
                    objects.pop(event.key, None)
                elif event.old is not None:
                    objects[event.key] = event.old
        object_filter = ObjectFilter(namespace if resource_type.gvr.namespaced else None)
        return [obj for obj in objects.values() if object_filter.matches(obj)]

    def list_at(self, gvr: GroupVersionResource, namespace: str | None,
                revision: int) -> Objects:
        """The objects of ``gvr`` (in ``namespace``) as they were at ``revision``,
        rebuilt by undoing the retained history after it: 410 when that history is
        no longer retained, 504 for a revision the store has not reached."""
        self._check_revision(revision)
        objects = self._objects_at(self._type(gvr), namespace, revision)
        objects.sort(key=lambda obj: (obj["metadata"].get("namespace", ""),
                                      obj["metadata"]["name"]))
        return [_copy(obj) for obj in objects]

    # -- writes ----------------------------------------------------------------

    def create(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None) -> dict[str, Any]:
        """Store a new object; the namespace comes from ``namespace`` or the
        object's metadata (``default`` if neither names one)."""
        resource_type, obj, metadata, ns = incoming(self.catalog, gvr, obj, namespace)
        name = metadata.get("name")
        if not name and metadata.get("generateName"):
            for _ in range(100):
                name = generated_name(metadata["generateName"], self._random)
                if (self._type_key(resource_type), ns, name) not in self._objects:
                    break
        validate_name(resource_type, name, ns)
        assert isinstance(name, str)
        key = (self._type_key(resource_type), ns, name)
        if key in self._objects:
            raise status.already_exists(resource_type, str(name))
        obj = new_object(resource_type, obj, ns, name, self._clock.seconds())
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self.log.debug("created {kind} {namespace}/{name} rv={rv}", kind=resource_type.kind,
                       namespace=ns, name=name, rv=self._rv)
        self._record("ADDED", key, obj)
        return _copy(obj)

    def update(self, gvr: GroupVersionResource, obj: dict[str, Any],
               namespace: str | None = None, subresource: str | None = None,
               ) -> dict[str, Any]:
        """Replace an object, PUT-style: a resourceVersion in the object must be
        the current one (else 409 Conflict); none means unconditional. For types
        with a status subresource, a main update keeps the stored status and a
        ``subresource="status"`` update changes only the status."""
        resource_type, obj, metadata, ns = incoming(self.catalog, gvr, obj, namespace)
        name = metadata.get("name")
        if not name:
            raise status.invalid(resource_type, name, "metadata.name", "Required value: name is required")
        key = (self._type_key(resource_type), ns, name)
        current = self._objects.get(key)
        if current is None:
            raise status.not_found(resource_type, name)
        new = replacement(resource_type, current, obj, ns, subresource)
        if new is None:
            return _copy(current)
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = new
        self.log.debug("updated {kind} {namespace}/{name} rv={rv}", kind=resource_type.kind,
                       namespace=ns, name=name, rv=self._rv)
        self._record("MODIFIED", key, new, current)
        return _copy(new)

    def update_status(self, gvr: GroupVersionResource, obj: dict[str, Any],
                      namespace: str | None = None) -> dict[str, Any]:
        return self.update(gvr, obj, namespace, subresource="status")

    def delete(self, gvr: GroupVersionResource, name: str, namespace: str | None = None,
               preconditions: dict[str, Any] | None = None) -> dict[str, Any]:
        """Remove an object and return it as last seen, carrying the
        resourceVersion of the deletion (as the DELETED watch event does)."""
        resource_type = self._type(gvr)
        ns = namespace_of(resource_type, {}, namespace)
        key = (self._type_key(resource_type), ns, name)
        current = self._objects.get(key)
        if current is None:
            raise status.not_found(resource_type, name)
        check_preconditions(resource_type, name, current, preconditions)
        del self._objects[key]
        self._rv += 1
        deleted = _copy(current)
        deleted["metadata"]["resourceVersion"] = str(self._rv)
        self.log.debug("deleted {kind} {namespace}/{name} rv={rv}", kind=resource_type.kind,
                       namespace=ns, name=name, rv=self._rv)
        # The object before deletion goes along, so that list_at can undo it.
        self._record("DELETED", key, deleted, current)
        return deleted

    # -- watch -----------------------------------------------------------------

    def watch(self, gvr: GroupVersionResource, object_filter: ObjectFilter, since: int | None,
              callback: Callable[[str, dict[str, Any]], object],
              lazy: bool = False) -> Watcher:
        """Register ``callback(event_type, obj)`` for changes matching the filter.

        ``since`` None (or 0) first delivers ADDED for every matching object;
        an int replays the retained events after it, or raises a 410 error
        when it is older than the retained history. The replay is delivered within
        this call, or with ``lazy`` left to ``Watcher.replay``.
        """
        resource_type = self._type(gvr)
        type_key = self._type_key(resource_type)
        watcher = Watcher(self._watchers.discard, type_key, object_filter, callback)
        if not since:
            for key, obj in sorted(self._objects.items()):
                if key[0] == type_key and object_filter.matches(obj):
                    callback("ADDED", _copy(obj))
        else:
            if since < self._oldest_watchable:
                raise status.expired(since, self._oldest_watchable)
            history = self._history
            # The history is in resourceVersion order: the replay starts after ``since``.
            start = bisect.bisect_right(history, since, key=attrgetter("resource_version"))
            watcher.hold(itertools.islice(history, start, None), since)
            if not lazy:
                watcher.replay(len(history))
        self._watchers.add(watcher)
        return watcher

    def watcher_count(self) -> int:

        return len(self._watchers)
