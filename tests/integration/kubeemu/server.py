"""An aiohttp Kubernetes API emulator that keeps the semantics the controller relies on.

What it does like the real API server (and kmock 0.8 does not, DESIGN §7): resourceVersion,
uid, creationTimestamp and generation on every object; list + watch from a resourceVersion
without replaying older events (410 Gone when too old); label and field selectors; PUT with
optimistic concurrency (409); a status subresource that is the only way to change status
(and cannot change spec); merge, JSON and (approximate) server-side-apply patches, with
fieldManager recorded in managedFields; CRD schema validation (422) and pruning; discovery;
ObjectMeta and Event validation (validation.py); TokenReview against a static token file and
SubjectAccessReview evaluated with RBAC over the stored Roles and bindings (reviews.py);
namespaces that stay Terminating a while after DELETE (creates there: 403); pod specs
immutable but through `pods/NAME/binding`;
graceful deletion of scheduled pods (Terminating until a kubelet, emulated or not, confirms).
For fault tests it injects 429/5xx answers and drops watch streams.

Not emulated: strategic-merge list merging by key (treated as a merge patch), apply's field
ownership and conflicts, admission, authn/authz of ordinary requests, garbage collection.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from . import patches
from .errors import ApiError
from .eventsview import core_to_v1, v1_to_core
from .lifecycle import LifecycleRules
from .resources import BUILTIN, ResourceType, load_crd_files, types_from_crd
from .reviews import REVIEW_RESOURCES, Reviews
from .schema import validate
from .store import ObjectStore, Watcher
from .validation import check_field_selector, check_pod_spec_update, validate_event


def _converted(event: dict[str, Any], convert: Callable[[dict[str, Any]], dict[str, Any]] | None) -> dict[str, Any]:
    if convert is None or event.get("type") == "ERROR":
        return event
    return {**event, "object": convert(event["object"])}


def _reject_constant(name: str) -> Any:
    """Go's JSON decoder knows no NaN or Infinity: the real API server answers 400."""
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value ({name})")


@dataclass
class Fault:
    """Answer `status` to matching requests `count` times (HTTP method and a path substring)."""

    status: int
    count: int
    methods: frozenset[str] = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
    path_contains: str = ""
    retry_after: float | None = None
    watches: bool = False  # also fail watch requests


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    user_agent: str = ""
    status: int = 0


class KubernetesEmulator(LifecycleRules):
    def __init__(self, crd_directory: Path | None = None, namespace_termination_seconds: float = 1.0) -> None:
        self.store = ObjectStore()
        #: how long a deleted namespace stays Terminating (creates there: 403) before its content goes
        self.namespace_termination_seconds = namespace_termination_seconds
        #: a watch with allowWatchBookmarks gets a BOOKMARK after this long without events (the real server: ~60 s)
        self.bookmark_seconds = 60.0
        #: how soon the emulated kubelet confirms a graceful pod deletion; None: no kubelet, pods stay Terminating
        self.kubelet_delete_seconds: float | None = 0.2
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in BUILTIN:
            self.add_type(rtype)
        #: TokenReview (a static token file: `reviews.tokens`) and SubjectAccessReview (RBAC over the stored roles)
        self.reviews = Reviews(self.store, self.types)
        self.faults: list[Fault] = []
        self.requests: list[RequestRecord] = []
        self._watch_tasks: set[asyncio.Task[Any]] = set()
        self._watch_responses: set[web.StreamResponse] = set()
        if crd_directory is not None:
            for crd in load_crd_files(crd_directory):
                self.install_crd(crd)

    def add_type(self, rtype: ResourceType) -> None:
        self.types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def install_crd(self, crd: dict[str, Any]) -> None:
        """Serve a CRD's kinds and keep the CRD object itself (as the real server does)."""
        for rtype in types_from_crd(crd):
            self.add_type(rtype)
        crd_type = self.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        if ("", crd["metadata"]["name"]) not in self.store.bucket(crd_type):
            self.store.create(crd_type, None, copy.deepcopy(crd), "kubeemu")

    def drop_watches(self) -> int:
        """Close every open watch stream (what an API server restart or a load balancer does)."""
        count = len(self._watch_responses)
        for watcher in list(self.store.watchers):
            watcher.queue.put_nowait(None)
        return count

    def app(self) -> web.Application:
        application = web.Application(client_max_size=64 * 1024 * 1024)
        application.router.add_route("*", "/{tail:.*}", self.handle)
        return application

    # ------------------------------------------------------------------ dispatch

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = RequestRecord(request.method, request.path, dict(request.query), request.content_type,
                               request.headers.get("User-Agent", ""))
        self.requests.append(record)
        try:
            fault = self._fault(request)
            if fault is not None:
                headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
                raise ApiError(fault.status, "TooManyRequests" if fault.status == 429 else "InternalError",
                               f"injected fault: HTTP {fault.status}", fault.retry_after) from None
            response = await self._dispatch(request)
        except ApiError as error:
            headers = {"Retry-After": str(int(error.retry_after))} if error.retry_after is not None else {}
            response = web.json_response(error.status(), status=error.code, headers=headers)
        record.status = response.status
        return response

    def _fault(self, request: web.Request) -> Fault | None:
        is_watch = request.query.get("watch") in {"true", "1"}
        for fault in self.faults:
            if fault.count > 0 and request.method in fault.methods and fault.path_contains in request.path:
                if is_watch and not fault.watches:
                    continue
                fault.count -= 1
                return fault
        return None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [part for part in request.path.split("/") if part]
        if parts in (["api"], ["apis"]) or (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            return web.json_response(self._discovery(parts))
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-kubeemu"})
        if parts == ["healthz"] or parts == ["readyz"]:
            return web.Response(text="ok")
        if not parts or parts[0] not in {"api", "apis"}:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        group, version, rest = ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in {"status", "finalize"}:
            namespace, rest = rest[1], rest[2:]
        plural, name = rest[0], rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        rtype = self.types.get((group, version, plural))
        if rtype is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        if (rtype.group, rtype.plural) in REVIEW_RESOURCES:
            if request.method != "POST" or name is not None:
                raise ApiError(405, "MethodNotAllowed", f"{rtype.plural} can only be created")
            review = self.reviews.handle(rtype.kind, request.headers.get("Authorization"), await self._body(request))
            return web.json_response(review, status=201)
        if subresource == "binding" and (rtype.group, rtype.plural) == ("", "pods") and request.method == "POST":
            return web.json_response(self._bind(rtype, namespace, str(name), await self._body(request)), status=201)
        if subresource not in {None, "status"} or (subresource == "status" and not rtype.status_subresource):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        if rtype.namespaced and namespace is None and name is not None:
            raise ApiError(404, "NotFound", f"{rtype.plural} is namespaced: use /namespaces/NS/{rtype.plural}/{name}")
        method = request.method
        manager = request.query.get("fieldManager")
        if (rtype.group, rtype.plural) == ("events.k8s.io", "events"):
            return await self._events_v1(request, namespace, name)
        if name is None:
            if method == "GET":
                if request.query.get("watch") in {"true", "1"}:
                    return await self._watch(request, rtype, namespace)
                return web.json_response(self._list(request, rtype, namespace))
            if method == "POST":
                body = await self._body(request)
                self._check_identity(rtype, body)
                self._check_namespace(rtype, namespace, body)
                if rtype.plural == "events" and rtype.group in {"", "events.k8s.io"}:
                    validate_event(rtype.group, namespace, body)
                obj = self._prepare_create(rtype, body)
                return web.json_response(self.store.create(rtype, namespace, obj, manager), status=201)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
        if method == "GET":
            return web.json_response(self.store.get(rtype, namespace, name))
        if method == "DELETE":
            if rtype.plural == "namespaces" and not rtype.group:
                return web.json_response(self._terminate_namespace(rtype, name))
            if (rtype.group, rtype.plural) == ("", "pods"):
                return web.json_response(self._delete_pod(rtype, namespace, name, request.query.get("gracePeriodSeconds")))
            return web.json_response(self.store.delete(rtype, namespace, name))
        if method == "PUT":
            body = await self._body(request)
            self._check_identity(rtype, body, name)
            old = self.store.get(rtype, namespace, name)
            if not (body.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(422, "Invalid", f'{rtype.kind} "{name}" is invalid: metadata.resourceVersion: '
                                               "Invalid value: 0x0: must be specified for an update")
            if (rtype.group, rtype.plural) == ("", "pods") and subresource is None:
                check_pod_spec_update(old, body)
            new = self._validated(rtype, body)
            return web.json_response(self.store.replace(rtype, old, new, manager, subresource))
        if method == "PATCH":
            return web.json_response(await self._patch(request, rtype, namespace, name, subresource, manager))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

    # ------------------------------------------------------------------ verbs

    def _discovery(self, parts: list[str]) -> dict[str, Any]:
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            groups: dict[str, list[str]] = {}
            for group, version, _ in self.types:
                if group and version not in groups.setdefault(group, []):
                    groups[group].append(version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": group, "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                 "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]}}
                for group, versions in sorted(groups.items())]}
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        resources = [entry for (g, v, _), rtype in sorted(self.types.items()) if (g, v) == (group, version)
                     for entry in rtype.discovery()]
        if not resources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource (/{'/'.join(parts)})")
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    def _list(self, request: web.Request, rtype: ResourceType, namespace: str | None) -> dict[str, Any]:
        check_field_selector(rtype.group, rtype.plural, request.query.get("fieldSelector"))
        items = self.store.select(rtype, namespace, request.query.get("labelSelector"), request.query.get("fieldSelector"))
        metadata: dict[str, Any] = {"resourceVersion": str(self.store.resource_version)}
        limit = int(request.query.get("limit") or 0)
        start = int(request.query.get("continue") or 0)
        if limit:
            if start + limit < len(items):
                metadata["continue"] = str(start + limit)
            items = items[start:start + limit]
        return {"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version, "metadata": metadata, "items": items}

    async def _events_v1(self, request: web.Request, namespace: str | None, name: str | None) -> web.StreamResponse:
        """events.k8s.io/v1: validated as such, stored and read as core/v1 Events."""
        core = self.types[("", "v1", "events")]
        if request.method == "POST" and name is None:
            body = await self._body(request)
            self._check_identity(self.types[("events.k8s.io", "v1", "events")], body)
            self._check_namespace(core, namespace, body)
            validate_event("events.k8s.io", namespace, body)
            stored = self.store.create(core, namespace, v1_to_core(copy.deepcopy(body)), request.query.get("fieldManager"))
            return web.json_response(core_to_v1(stored), status=201)
        if request.method == "GET" and name is None:
            if request.query.get("watch") in {"true", "1"}:
                return await self._watch(request, core, namespace, convert=core_to_v1)
            listed = self._list(request, core, namespace)
            return web.json_response({**listed, "kind": "EventList", "apiVersion": "events.k8s.io/v1",
                                      "items": [core_to_v1(item) for item in listed["items"]]})
        if request.method == "GET":
            return web.json_response(core_to_v1(self.store.get(core, namespace, str(name))))
        if request.method == "DELETE" and name is not None:
            return web.json_response(core_to_v1(self.store.delete(core, namespace, name)))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} of events.k8s.io/v1 Events is not emulated")

    async def _watch(self, request: web.Request, rtype: ResourceType, namespace: str | None,
                     convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> web.StreamResponse:
        check_field_selector(rtype.group, rtype.plural, request.query.get("fieldSelector"))
        watcher = Watcher(rtype, namespace, request.query.get("labelSelector"), request.query.get("fieldSelector"))
        since = request.query.get("resourceVersion")
        if since in {None, "", "0"}:  # "any": the current state as ADDED events first, like the real server
            backlog = [{"type": "ADDED", "object": copy.deepcopy(obj)} for obj in self.store.select(
                rtype, namespace, watcher.label_selector, watcher.field_selector)]
        else:
            try:
                backlog = self.store.events_since(watcher, int(str(since)))
            except ApiError as error:
                backlog = [{"type": "ERROR", "object": error.status()}]
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.store.watchers.append(watcher)
        self._watch_responses.add(response)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        try:
            for queued in backlog:
                await response.write(json.dumps(_converted(queued, convert)).encode() + b"\n")
            if backlog and backlog[-1]["type"] == "ERROR":
                return response
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            bookmarks = request.query.get("allowWatchBookmarks") == "true" and self.bookmark_seconds > 0
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    event: dict[str, Any] | None = await asyncio.wait_for(
                        watcher.queue.get(), timeout=min(remaining, self.bookmark_seconds) if bookmarks else remaining)
                except TimeoutError:
                    if bookmarks and deadline - loop.time() > 0:  # a quiet stream: the real server bookmarks it
                        event = {"type": "BOOKMARK", "object": {"kind": rtype.kind, "apiVersion": rtype.api_version,
                                 "metadata": {"resourceVersion": str(self.store.resource_version)}}}
                        await response.write(json.dumps(event).encode() + b"\n")
                        continue
                    break
                if event is None:  # dropped by a fault test
                    break
                await response.write(json.dumps(_converted(event, convert)).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.remove(watcher)
            self._watch_responses.discard(response)
        return response

    async def _body(self, request: web.Request) -> Any:
        text = await request.text()
        try:
            if request.content_type == patches.APPLY:
                return yaml.safe_load(text)
            return json.loads(text, parse_constant=_reject_constant)
        except (ValueError, yaml.YAMLError) as error:
            raise ApiError(400, "BadRequest", f"the request body is not valid: {error}") from None

    def _check_identity(self, rtype: ResourceType, body: Any, name: str | None = None) -> None:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        if body.get("kind") not in {None, rtype.kind} or body.get("apiVersion") not in {None, rtype.api_version}:
            raise ApiError(400, "BadRequest", f"the body is a {body.get('apiVersion')}/{body.get('kind')}, "
                                              f"the URL names {rtype.api_version}/{rtype.kind}")
        if name is not None and (body.get("metadata") or {}).get("name") not in {None, name}:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")

    def _prepare_create(self, rtype: ResourceType, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        if rtype.status_subresource:  # status is ignored on create wherever it is a subresource
            obj.pop("status", None)
            if (rtype.group, rtype.plural) == ("", "pods"):
                obj["status"] = {"phase": "Pending"}
            if (rtype.group, rtype.plural) == ("", "namespaces"):
                obj["status"] = {"phase": "Active"}
        if (rtype.group, rtype.plural) == ("apiextensions.k8s.io", "customresourcedefinitions"):
            for served in types_from_crd(obj):
                self.add_type(served)
        return self._validated(rtype, obj)

    def _validated(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if rtype.schema is None:
            return obj
        content = {k: v for k, v in obj.items() if k not in {"apiVersion", "kind", "metadata"}}
        pruned, errors = validate(content, rtype.schema)
        if errors:
            name = (obj.get("metadata") or {}).get("name")
            raise ApiError(422, "Invalid", f'{rtype.kind}.{rtype.group} "{name}" is invalid: ' + ", ".join(errors))
        return {**{k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}, **pruned}

    async def _patch(self, request: web.Request, rtype: ResourceType, namespace: str | None, name: str,
                     subresource: str | None, manager: str | None) -> dict[str, Any]:
        content_type = request.content_type
        body = await self._body(request)
        if content_type == patches.APPLY:
            if not manager:
                raise ApiError(400, "BadRequest", "PATCH with apply-patch+yaml requires fieldManager")
            try:
                old = self.store.get(rtype, namespace, name)
            except ApiError:
                if subresource:
                    raise
                self._check_identity(rtype, body, name)
                self._check_namespace(rtype, namespace, body)
                obj = self._prepare_create(rtype, body)
                obj.setdefault("metadata", {})["name"] = name
                return self.store.create(rtype, namespace, obj, manager)
            self._check_identity(rtype, body, name)
            new = patches.merge_patch(old, body)
        elif content_type in {patches.MERGE, patches.STRATEGIC}:
            if content_type == patches.STRATEGIC and rtype.schema is not None:
                raise ApiError(415, "UnsupportedMediaType",
                               "strategic merge patch is not supported for custom resources; use merge-patch")
            old = self.store.get(rtype, namespace, name)
            new = patches.merge_patch(old, body)
        elif content_type == patches.JSON_PATCH:
            old = self.store.get(rtype, namespace, name)
            new = patches.json_patch(old, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
        if (rtype.group, rtype.plural) == ("", "pods") and subresource is None:
            check_pod_spec_update(old, new)
        return self.store.replace(rtype, old, self._validated(rtype, new), manager, subresource)
