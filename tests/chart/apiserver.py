"""A small Kubernetes API server that Helm's own library can install the chart into.

Helm has no offline "template" entry point in helm-sdkpy, and no real API server can be run
here, so the chart tests install it for real into this one: discovery, create/get/list/
update/patch/delete, CRDs that become served resources, and *server-side validation* of every
object: built-in kinds against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
unknown fields are rejected), custom resources against their CRD's openAPIV3Schema, and
metadata names and labels against the API server's rules. An invalid object gets HTTP 422
with a message naming the object and the field, as a real API server answers.

What it does not do: admission (Pod Security, quotas), defaulting, garbage collection,
watches, authentication; the e2e tier (kind) covers those.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
from aiohttp import web
from jsonschema import Draft7Validator

from tests.chart.validation import Invalid, structural_to_jsonschema, validate_metadata

log = logging.getLogger(__name__)

KUBERNETES_VERSION = "1.33.0"


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives and what it validates against."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    schema: dict[str, Any] | None = None  # openAPIV3Schema for custom resources; None: built-in

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


_BUILTIN: list[tuple[str, str, str, str, bool]] = [
    ("", "v1", "namespaces", "Namespace", False),
    ("", "v1", "nodes", "Node", False),
    ("", "v1", "pods", "Pod", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "events", "Event", True),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("apps", "v1", "statefulsets", "StatefulSet", True),
    ("apps", "v1", "replicasets", "ReplicaSet", True),
    ("batch", "v1", "jobs", "Job", True),
    ("batch", "v1", "cronjobs", "CronJob", True),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False),
    ("events.k8s.io", "v1", "events", "Event", True),
    ("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
]

@dataclass
class Store:
    """Objects by (apiVersion, plural, namespace, name); served types grow as CRDs arrive."""

    types: dict[tuple[str, str], ResourceType] = field(default_factory=dict)
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    resource_version: int = 1
    requests: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for group, version, plural, kind, namespaced in _BUILTIN:
            self.add_type(ResourceType(group, version, plural, kind, namespaced))

    def add_type(self, resource: ResourceType) -> None:
        self.types[(resource.api_version, resource.plural)] = resource

    def objects_of(self, kind: str) -> Iterator[dict[str, Any]]:
        yield from (obj for obj in self.objects.values() if obj.get("kind") == kind)

    def validate(self, resource: ResourceType, obj: dict[str, Any]) -> None:
        if obj.get("kind") != resource.kind or obj.get("apiVersion") != resource.api_version:
            raise Invalid(
                f"{obj.get('apiVersion')}/{obj.get('kind')} sent to the {resource.api_version} {resource.plural} endpoint"
            )
        validate_metadata(obj, resource.kind)
        name = obj["metadata"].get("name")
        if resource.schema is None:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(part) for part in error.path)
                raise Invalid(f"{resource.kind} {name!r}: {path}: {error.message}") from None
            return
        schema = structural_to_jsonschema(resource.schema, strict=True)
        body = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")}
        schema.setdefault("properties", {})
        for key in ("apiVersion", "kind", "metadata"):
            schema["properties"].pop(key, None)
        errors = sorted(Draft7Validator(schema).iter_errors(body), key=lambda error: list(error.path))
        if errors:
            first = errors[0]
            path = ".".join(str(part) for part in first.path)
            raise Invalid(f"{resource.kind} {name!r}: {path}: {first.message}")

    def served_crd(self, crd: dict[str, Any]) -> None:
        """Serve the resources of a CRD, with each served version's schema."""
        spec = crd["spec"]
        for version in spec.get("versions", []):
            if not version.get("served"):
                continue
            schema = (version.get("schema") or {}).get("openAPIV3Schema") or {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
            self.add_type(
                ResourceType(
                    spec["group"],
                    version["name"],
                    spec["names"]["plural"],
                    spec["names"]["kind"],
                    spec["scope"] == "Namespaced",
                    schema,
                )
            )
        crd["status"] = {
            "acceptedNames": spec["names"],
            "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": ""},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": ""},
            ],
        }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code}
    return web.json_response(body, status=code)


def _matches(obj: dict[str, Any], selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif labels.get(term) is None:
            return False
    return True


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


class ApiServer:
    """Serves a Store over HTTP on 127.0.0.1 from a background thread."""

    def __init__(self) -> None:
        self.store = Store()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="apiserver", daemon=True)

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, namespace: str = "default") -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                "users": [{"name": "test", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "test", "namespace": namespace}}],
                "current-context": "emulator",
            }
        )

    # discovery ---------------------------------------------------------------------------
    def _discovery(self, path: str) -> dict[str, Any] | None:
        store = self.store
        if path == "/version":
            major, minor, _ = KUBERNETES_VERSION.split(".")
            return {"major": major, "minor": minor, "gitVersion": f"v{KUBERNETES_VERSION}", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        group_versions: dict[str, list[str]] = {}
        for resource in store.types.values():
            if resource.group:
                versions = group_versions.setdefault(resource.group, [])
                if resource.version not in versions:
                    versions.append(resource.version)
        if path == "/apis":
            groups = [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
                }
                for group, versions in sorted(group_versions.items())
            ]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        match = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if match:
            group_version = match.group(1) or f"{match.group(2)}/{match.group(3)}"
            resources = []
            for resource in store.types.values():
                if resource.api_version != group_version:
                    continue
                verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
                resources.append(
                    {"name": resource.plural, "singularName": resource.kind.lower(), "namespaced": resource.namespaced,
                     "kind": resource.kind, "verbs": verbs}
                )
                resources.append(
                    {"name": f"{resource.plural}/status", "singularName": "", "namespaced": resource.namespaced,
                     "kind": resource.kind, "verbs": ["get", "patch", "update"]}
                )
            if not resources:
                return None
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}
        return None

    # REST --------------------------------------------------------------------------------
    _PATH = re.compile(
        r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
        r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
    )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.store.requests.append((request.method, path))
        if request.method in ("POST", "PUT", "PATCH") and "protobuf" in request.headers.get("Content-Type", ""):
            # client-go falls back to JSON on 415, as against an API server that serves only JSON.
            return _status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
        if request.method == "GET":
            discovery = self._discovery(path)
            if discovery is not None:
                return web.json_response(discovery)
        match = self._PATH.match(path)
        if not match:
            return _status(404, "NotFound", f"the server could not find the requested resource {path}")
        parts = match.groupdict()
        api_version = parts["core"] or f"{parts['group']}/{parts['version']}"
        namespace, plural, name = parts["namespace"], parts["plural"], parts["name"]
        resource = self.store.types.get((api_version, plural))
        if resource is None:
            return _status(404, "NotFound", f"the server could not find the requested resource {path}")
        if not resource.namespaced:
            namespace = None
        try:
            return await self._rest(request, resource, namespace or "", name, parts["sub"] is not None)
        except Invalid as error:
            log.info("rejected %s %s: %s", request.method, path, error)
            return _status(422, "Invalid", str(error))

    async def _rest(
        self, request: web.Request, resource: ResourceType, namespace: str, name: str | None, status_only: bool
    ) -> web.StreamResponse:
        store = self.store
        key_base = (resource.api_version, resource.plural, namespace)
        if request.method == "GET" and name is None:
            if request.query.get("watch") in ("1", "true"):
                return _status(405, "MethodNotAllowed", "watch is not supported by this test API server")
            selector = request.query.get("labelSelector", "")
            items = [
                obj for (v, p, ns, _), obj in sorted(store.objects.items())
                if (v, p) == key_base[:2] and (not namespace or ns == namespace) and _matches(obj, selector)
            ]
            return web.json_response(
                {"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
                 "metadata": {"resourceVersion": str(store.resource_version)}, "items": items}
            )
        if request.method == "POST" and name is None:
            obj = await request.json()
            obj.setdefault("metadata", {})
            if namespace and resource.namespaced:
                given = obj["metadata"].get("namespace")
                if given and given != namespace:
                    raise Invalid(f"the namespace of the object ({given}) does not match the namespace on the request ({namespace})")
                obj["metadata"]["namespace"] = namespace
            if not obj["metadata"].get("name") and obj["metadata"].get("generateName"):
                obj["metadata"]["name"] = obj["metadata"]["generateName"] + uuid.uuid4().hex[:5]
            store.validate(resource, obj)
            key = (*key_base, obj["metadata"]["name"])
            if key in store.objects:
                return _status(409, "AlreadyExists", f'{resource.plural} "{obj["metadata"]["name"]}" already exists')
            if request.query.get("dryRun") != "All":
                self._stamp(obj, new=True)
                if resource.kind == "CustomResourceDefinition":
                    store.served_crd(obj)
                store.objects[key] = obj
            return web.json_response(obj, status=201)
        assert name is not None
        key = (*key_base, name)
        current = store.objects.get(key)
        if request.method == "GET":
            if current is None:
                return _status(404, "NotFound", f'{resource.plural} "{name}" not found')
            return web.json_response(current)
        if request.method == "DELETE":
            if current is None:
                return _status(404, "NotFound", f'{resource.plural} "{name}" not found')
            del store.objects[key]
            return web.json_response(current)
        if request.method in ("PUT", "PATCH"):
            body = await request.json() if request.method == "PUT" else await self._patched(request, current)
            if current is None and request.method == "PUT":
                return _status(404, "NotFound", f'{resource.plural} "{name}" not found')
            if current is not None and status_only:
                # Through /status only status changes, as on a real API server.
                body = {**copy.deepcopy(current), "status": body.get("status")}
            body.setdefault("metadata", {})["name"] = name
            if namespace:
                body["metadata"]["namespace"] = namespace
            store.validate(resource, body)
            if current is not None:
                for kept in ("uid", "creationTimestamp"):
                    body["metadata"][kept] = current["metadata"].get(kept)
            self._stamp(body, new=current is None)
            store.objects[key] = body
            return web.json_response(body, status=200 if current is not None else 201)
        return _status(405, "MethodNotAllowed", f"{request.method} is not supported here")

    async def _patched(self, request: web.Request, current: dict[str, Any] | None) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "")
        raw = await request.read()
        if "json-patch" in content_type:
            raise Invalid("JSON patch (RFC 6902) is not supported by this test API server; use a merge patch")
        if "apply-patch" in content_type:
            import yaml  # the apply body may be YAML

            patch = yaml.safe_load(raw)
        else:
            patch = json.loads(raw)
        if current is None and "apply-patch" not in content_type:
            raise Invalid("the object to patch does not exist")
        return dict(_merge_patch(copy.deepcopy(current or {}), patch))

    def _stamp(self, obj: dict[str, Any], new: bool) -> None:
        self.store.resource_version += 1
        metadata = obj["metadata"]
        metadata["resourceVersion"] = str(self.store.resource_version)
        if new:
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            metadata.setdefault("generation", 1)
