"""The HTTP face of the test API server: routes Kubernetes API paths to the
store, speaks Status errors, streams watches and applies the fault knobs."""

import json
from urllib.parse import parse_qsl, unquote

import yaml
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from yurtcoord.kube.errors import Conflict, KubeError, NotFound
from yurtcoord.sim.apiserver import status, table
from yurtcoord.sim.apiserver.authz import UNAUTHORIZED, Refusal
from yurtcoord.sim.apiserver.faults import GARBAGE
from yurtcoord.sim.apiserver.pages import ListPages
from yurtcoord.sim.apiserver.patch import PatchError, json_patch, merge_patch
from yurtcoord.sim.apiserver.requestlog import attributes_of
from yurtcoord.sim.apiserver.selectors import ObjectFilter, SelectorError
from yurtcoord.sim.apiserver.storage import IObjectStorage
from yurtcoord.sim.apiserver.watch import WatchStream

VERSION_INFO = {
    "major": "1",
    "minor": "28",
    "gitVersion": "v1.28.0",
    "gitCommit": "855e7c48de7388eb330da0f8d9d2394ee818fb8d",
    "gitTreeState": "clean",
    "buildDate": "2023-08-15T10:20:15Z",
    "goVersion": "go1.20.7",
    "compiler": "gc",
    "platform": "linux/amd64",
}

OPENAPI_V2_PROTOBUF = b"application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
_TRUE = ("1", "true", "True", "TRUE", "yes")
_MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
_JSON_PATCH = "application/json-patch+json"
# Times a PATCH is applied again when the object changed under it: as many as
# concurrent writers can win before it (kube-apiserver retries without bound).
_PATCH_ATTEMPTS = 64


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class _Route:
    """A parsed resource path."""

    def __init__(self, resource_type, namespace, name, subresource, legacy_watch):
        self.type = resource_type
        self.namespace = namespace
        self.name = name
        self.subresource = subresource
        self.legacy_watch = legacy_watch


class KubeAPIResource(Resource):
    """Leaf resource answering every path of the API."""

    isLeaf = True
    log = Logger()

    def __init__(self, server):
        super().__init__()
        self._server = server

    @property
    def _store(self) -> IObjectStorage:
        return self._server.storage

    # -- entry ---------------------------------------------------------------

    def render(self, request: Request) -> bytes | int:

        self._server._note_request(request)
        uri = request.uri.decode("utf-8", "replace")
        fault = self._server.faults.take(request.method.decode(),
                                         request.path.decode("utf-8", "replace"),
                                         uri.partition("?")[2])
        latency = self._server.faults.latency
        if latency and latency > 0:
            self._server._delay(latency, self._answer, request, fault)
        else:
            self._answer(request, fault)
        return NOT_DONE_YET

    def _answer(self, request, fault):
        if request._disconnected or request.finished:
            return
        if fault is not None:
            kind, code = fault
            if kind == "hang":
                return
            if kind == "fail":
                failure = status.failure(code, f"injected failure ({code})")
                if code == 429:
                    # kube-apiserver's max-in-flight rejection looks like this.
                    failure["details"] = {"retryAfterSeconds": 1}
                    request.setHeader(b"retry-after", b"1")
                self._write_status(request, failure)
            else:
                request.setResponseCode(200)
                request.setHeader(b"content-type", b"application/json")
                self._finish(request, GARBAGE)
            return
        refusal = self._refusal(request)
        if refusal is not None:
            self._write_status(request, refusal.status())
            return
        defer.maybeDeferred(self._dispatch, request).addErrback(self._failed, request)

    def _refusal(self, request: Request) -> Refusal | None:
        """Why the server's authorizer refuses ``request`` (None: it may be served, or
        the server has no authorizer); decided before any object is read."""
        authorizer = self._server.authorizer
        if authorizer is None:
            return None
        user = self._server.user_of(request)
        if user is None:
            return UNAUTHORIZED
        attributes = attributes_of(request.method.decode(),
                                   request.path.decode("utf-8", "replace"),
                                   request.uri.partition(b"?")[2].decode("utf-8", "replace"))
        body_name = self._body_name(request) if attributes.verb == "create" else ""
        refusal = authorizer.authorize(user, attributes, body_name)
        if refusal is not None:
            self.log.info("apiserver refused {user}: {message}", user=user.name,
                          message=refusal.message)
        return refusal

    def _failed(self, failure: Failure, request: Request) -> None:
        if isinstance(failure.value, KubeError):
            self._write_status(request, status.status_of(failure.value))
            return
        self.log.failure("unexpected error answering {method} {path}", failure,
                         method=request.method, path=request.path)
        self._write_status(request, status.failure(500, "internal error in test server"))

    # -- output --------------------------------------------------------------

    @staticmethod
    def _finish(request, body):
        if request._disconnected or request.finished:
            return
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()

    def _write_json(self, request, code, obj):
        self._server._note_answer_body(request, obj)
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"application/json")
        self._finish(request, _dumps(obj))

    def _write_status(self, request, status_dict):
        self._write_json(request, status_dict.get("code") or 500, status_dict)

    def _write_text(self, request, text):
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        self._finish(request, text.encode())

    # -- routing -------------------------------------------------------------

    def _dispatch(self, request):
        raw_path = request.path.decode("utf-8", "replace")
        segments = [unquote(s) for s in raw_path.split("/") if s]
        query = dict(parse_qsl(request.uri.decode("utf-8", "replace").partition("?")[2],
                               keep_blank_values=True))
        catalog = self._server.catalog
        method = request.method.decode()
        if not segments:
            return self._write_json(request, 200, {"paths": [
                "/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]})
        head = segments[0]
        if head in ("healthz", "readyz", "livez"):
            return self._write_text(request, "ok")
        if head == "version" and len(segments) == 1:
            return self._write_json(request, 200, VERSION_INFO)
        if segments == ["openapi", "v2"] and method == "GET":
            return self._openapi_v2(request)
        if head == "api":
            if len(segments) == 1:
                return self._write_json(request, 200, catalog.api_versions(self._server.address))
            return self._group_version(request, method, "", segments[1], segments[2:], query)
        if head == "apis":
            if len(segments) == 1:
                return self._write_json(request, 200, catalog.api_group_list())
            if len(segments) == 2:
                group = catalog.api_group(segments[1])
                if group is None:
                    raise self._no_such_path()
                return self._write_json(request, 200, group)
            return self._group_version(request, method, segments[1], segments[2],
                                       segments[3:], query)
        raise self._no_such_path()

    def _openapi_v2(self, request):
        """An OpenAPI v2 document without schemas: kubectl's client-side
        validation loads it (as protobuf; an empty message is a valid empty
        Document) and then leaves validation to the server. /openapi/v3 is 404."""
        accept = (request.getHeader(b"accept") or b"").decode()
        if "protobuf" in accept:
            request.setResponseCode(200)
            request.setHeader(b"content-type", OPENAPI_V2_PROTOBUF)
            return self._finish(request, b"")
        return self._write_json(request, 200, {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
            "paths": {},
            "definitions": {},
        })

    @staticmethod
    def _no_such_path():
        return status.error(404, "the server could not find the requested resource")

    def _group_version(self, request, method, group, version, rest, query):
        catalog = self._server.catalog
        if not rest:
            listing = catalog.resource_list(group, version)
            if listing is None:
                raise self._no_such_path()
            return self._write_json(request, 200, listing)
        route = self._route(group, version, rest)
        handler = {
            "GET": self._get,
            "POST": self._post,
            "PUT": self._put,
            "PATCH": self._patch,
            "DELETE": self._delete,
        }.get(method)
        if handler is None:
            raise status.error(405, f"method {method} is not supported")
        return handler(request, route, query)

    def _route(self, group, version, rest):
        catalog = self._server.catalog
        legacy_watch = False
        if rest[0] == "watch":
            legacy_watch = True
            rest = rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = catalog.find(group, version, rest[2])
            if candidate is not None and candidate.gvr.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise self._no_such_path()
        resource_type = catalog.find(group, version, rest[0])
        if resource_type is None:
            raise self._no_such_path()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if resource_type.gvr.namespaced and name is not None and namespace is None:
            raise self._no_such_path()
        if subresource is not None and subresource not in resource_type.subresources:
            raise self._no_such_path()
        if legacy_watch and subresource is not None:
            raise self._no_such_path()
        return _Route(resource_type, namespace, name, subresource, legacy_watch)

    # -- request bodies ------------------------------------------------------

    @staticmethod
    def _body(request, allow_empty=False):
        raw = request.content.read() if request.content is not None else b""
        if not raw.strip():
            if allow_empty:
                return None
            raise status.bad_request("the request body is empty; expected a JSON object")
        content_type = (request.getHeader(b"content-type") or b"").decode().lower()
        try:
            if "yaml" in content_type:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise status.bad_request(
                f"couldn't get version/kind; json parse error: {error}".replace("\n", " "))

    @classmethod
    def _body_name(cls, request: Request) -> str:
        """The name the body of a create gives its object (``metadata.name``; ``""``
        for none, a ``generateName`` only, or an unreadable body), leaving the body to
        be read again."""
        try:
            body = cls._body(request, allow_empty=True)
        except KubeError:
            body = None
        finally:
            if request.content is not None:
                request.content.seek(0)
        metadata = body.get("metadata") if isinstance(body, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        return name if isinstance(name, str) else ""

    @staticmethod
    def _check_kind(resource_type, body):
        if not isinstance(body, dict):
            raise status.bad_request(
                f"the body must be a JSON object of kind {resource_type.kind}")
        kind = body.get("kind")
        if kind not in (None, "", resource_type.kind):
            raise status.bad_request(
                f"the kind in the request body ({kind}) does not match the kind of the "
                f"resource ({resource_type.kind})")
        api_version = body.get("apiVersion")
        if api_version not in (None, "", resource_type.api_version):
            raise status.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({resource_type.api_version})")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise status.bad_request("metadata must be a JSON object")

    @staticmethod
    def _check_namespace(route, body):
        if not route.type.gvr.namespaced:
            return
        metadata = body.get("metadata")
        if metadata is None:
            body["metadata"] = metadata = {}
        given = metadata.get("namespace")
        if given and route.namespace and given != route.namespace:
            raise status.bad_request(
                "the namespace of the provided object does not match the namespace sent "
                "on the request")
        if route.namespace:
            metadata["namespace"] = route.namespace

    @staticmethod
    def _check_name(route, body):
        name = (body.get("metadata") or {}).get("name")
        if name != route.name:
            raise status.bad_request(
                f"the name of the object ({name or ''}) does not match the name on the "
                f"URL ({route.name})")

    # -- verbs ---------------------------------------------------------------

    def _filter(self, route, query):
        field_selector = query.get("fieldSelector", "")
        if route.name is not None:
            by_name = f"metadata.name={route.name}"
            field_selector = f"{field_selector},{by_name}" if field_selector else by_name
        namespace = route.namespace if route.type.gvr.namespaced else None
        try:
            return ObjectFilter(namespace, query.get("labelSelector", ""), field_selector)
        except SelectorError as error:
            raise status.bad_request(f"unable to parse requirement: {error}")

    @defer.inlineCallbacks
    def _get(self, request, route, query):
        watching = route.legacy_watch or query.get("watch") in _TRUE
        if watching:
            return self._watch(request, route, query)
        encoder = table.encoder_for(request, route.type)
        if route.name is not None:
            obj = yield self._store.get(route.type.gvr, route.name, route.namespace)
            if obj is None:
                raise status.not_found(route.type, route.name)
            return self._write_json(request, 200, encoder.one(obj) if encoder else obj)
        object_filter = self._filter(route, query)
        limit = ListPages.parse_limit(query.get("limit"))
        namespace = route.namespace if route.type.gvr.namespaced else None
        page = yield self._server.list_pages.page(
            route.type.gvr, namespace, object_filter, limit, query.get("continue") or None,
            self._exact_revision(query))
        items, rv, token = page.items, page.revision, page.token
        if encoder:
            return self._write_json(request, 200, encoder.many(items, rv, token))
        metadata = {"resourceVersion": str(rv)}
        if token:
            metadata["continue"] = token
            metadata["remainingItemCount"] = page.remaining
        return self._write_json(request, 200, {
            "kind": route.type.list_kind,
            "apiVersion": route.type.api_version,
            "metadata": metadata,
            "items": items,
        })

    @staticmethod
    def _exact_revision(query):
        """The revision a LIST asks for with ``resourceVersionMatch=Exact``, else None
        (any other resourceVersion is served the current state, which is never older)."""
        match = query.get("resourceVersionMatch", "")
        if match in ("", "NotOlderThan"):
            return None
        if match != "Exact":
            raise status.bad_request(f"invalid resourceVersionMatch {match!r}")
        raw = query.get("resourceVersion", "")
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise status.bad_request(
                f"resourceVersionMatch=Exact needs a resourceVersion above 0, not {raw!r}")
        return int(raw)

    def _watch(self, request, route, query):
        object_filter = self._filter(route, query)
        raw_rv = query.get("resourceVersion", "")
        try:
            since = int(raw_rv) if raw_rv not in ("", "0") else None
            timeout = int(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        except ValueError:
            raise status.bad_request(
                f"invalid resourceVersion or timeoutSeconds: {raw_rv!r}, "
                f"{query.get('timeoutSeconds')!r}")
        if since is not None and since < 0:
            raise status.bad_request(f"invalid resourceVersion {raw_rv!r}")
        encoder = table.encoder_for(request, route.type)
        stream = WatchStream(
            request, self._server.reactor, self._store, route.type, object_filter, since,
            bookmarks=query.get("allowWatchBookmarks") in _TRUE,
            bookmark_interval=self._server.bookmark_interval,
            timeout=timeout,
            encoder=encoder.one if encoder else None,
            on_close=self._server._watch_closed,
        )
        self._server._watch_opened(stream)
        stream.start()

    def _post(self, request, route, query):
        if route.name is not None:
            raise status.error(405, "POST is only allowed on a collection")
        body = self._body(request)
        self._check_kind(route.type, body)
        self._check_namespace(route, body)
        if route.type.gvr.namespaced and route.namespace is None:
            raise self._no_such_path()
        d = self._store.create(route.type.gvr, body, route.namespace)
        return d.addCallback(lambda created: self._write_json(request, 201, created))

    def _put(self, request, route, query):
        if route.name is None:
            raise status.error(405, "PUT needs an object name in the path")
        body = self._body(request)
        self._check_kind(route.type, body)
        self._check_namespace(route, body)
        self._check_name(route, body)
        d = self._store.update(route.type.gvr, body, route.namespace, route.subresource)
        return d.addCallback(lambda updated: self._write_json(request, 200, updated))

    @defer.inlineCallbacks
    def _patch(self, request, route, query):
        if route.name is None:
            raise status.error(405, "PATCH needs an object name in the path")
        content_type = (request.getHeader(b"content-type") or b"").decode().split(";")[0].strip()
        patch_body = self._body(request)
        for attempt in range(_PATCH_ATTEMPTS):
            current = yield self._store.get(route.type.gvr, route.name, route.namespace)
            if current is None:
                raise status.not_found(route.type, route.name)
            patched, wanted_rv = self._patched(route, content_type, patch_body, current)
            # Applied to the version read: a write in between is a conflict, and the
            # patch is applied again to the newer version (unless the client named one).
            patched["metadata"]["resourceVersion"] = (
                wanted_rv or current["metadata"]["resourceVersion"])
            try:
                updated = yield self._store.update(route.type.gvr, patched, route.namespace,
                                                   route.subresource)
            except Conflict:
                if wanted_rv or attempt == _PATCH_ATTEMPTS - 1:
                    raise
                continue
            return self._write_json(request, 200, updated)

    def _patched(self, route, content_type, patch_body, current):
        """The object ``patch_body`` makes of ``current``, and the resourceVersion the
        patch itself names (None when it names none)."""
        try:
            if content_type in _MERGE_TYPES:
                if not isinstance(patch_body, dict):
                    raise status.bad_request("a merge patch must be a JSON object")
                patched = merge_patch(current, patch_body)
                patch_meta = patch_body.get("metadata")
                wanted_rv = patch_meta.get("resourceVersion") if isinstance(patch_meta, dict) else None
            elif content_type == _JSON_PATCH:
                if not isinstance(patch_body, list):
                    raise status.bad_request("a JSON patch must be a list of operations")
                patched = json_patch(current, patch_body)
                wanted_rv = None
            else:
                raise status.error(415, f"the body of the request was in an unknown format - "
                                        f"accepted media types include: {_JSON_PATCH}, "
                                        f"{', '.join(_MERGE_TYPES)}")
        except PatchError as error:
            raise status.invalid(route.type, route.name, "patch", str(error))
        if not isinstance(patched, dict):
            raise status.bad_request("the patch does not produce an object")
        self._check_kind(route.type, patched)
        self._check_name(route, patched)
        if not isinstance(patched.get("metadata"), dict):
            patched["metadata"] = {}
        return patched, wanted_rv

    @defer.inlineCallbacks
    def _delete(self, request, route, query):
        options = self._body(request, allow_empty=True) or {}
        if not isinstance(options, dict):
            raise status.bad_request("DeleteOptions must be a JSON object")
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, dict):
            raise status.bad_request("DeleteOptions.preconditions must be a JSON object")
        if route.subresource is not None:
            raise status.error(405, "DELETE is not allowed on a subresource")
        gvr = route.type.gvr
        if route.name is None:
            object_filter = self._filter(route, query)
            items, _ = yield self._store.list(gvr, object_filter.namespace)
            for item in items:
                if object_filter.matches(item):
                    meta = item["metadata"]
                    try:
                        yield self._store.delete(gvr, meta["name"], meta.get("namespace"))
                    except NotFound:
                        pass  # deleted by someone else meanwhile
            return self._write_json(request, 200, status.success(
                group=gvr.group, kind=gvr.resource))
        deleted = yield self._store.delete(gvr, route.name, route.namespace, preconditions)
        self._write_json(request, 200, status.success(
            name=route.name, group=gvr.group, kind=gvr.resource,
            uid=deleted["metadata"]["uid"]))
