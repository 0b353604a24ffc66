"""A small asyncio Kubernetes API client for the controller's own calls.

kopf does the watching; this client does the rest (owner `get`s, CR create/patch/delete,
Events, agent discovery) on the same event loop, with the credentials kopf logged in with,
so nothing blocks the loop and there is one notion of "the cluster". Every call, status writes
included, goes through one `aiohttp.ClientSession` (kopf's own HTTP library) holding the
credentials and the TLS context. 429 and 5xx answers and dropped connections are retried with
exponential backoff (honouring Retry-After).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from gpuwm import __version__

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "gpuwm"
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
#: the query of every create and patch
FIELD_MANAGER_PARAMS: Mapping[str, str] = {"fieldManager": FIELD_MANAGER}
USER_AGENT = f"gpuwm-controller/{__version__}"

#: plural names of the owner kinds the chart grants `get` on; other kinds go through discovery
KNOWN_PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "ReplicationController"): "replicationcontrollers",
    ("batch/v1", "Job"): "jobs",
    ("batch/v1", "CronJob"): "cronjobs",
    ("apps/v1", "ReplicaSet"): "replicasets",
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "DaemonSet"): "daemonsets",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobsets",
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjobs",
    ("kubeflow.org/v1", "TFJob"): "tfjobs",
    ("kubeflow.org/v1", "MPIJob"): "mpijobs",
    ("kubeflow.org/v2beta1", "MPIJob"): "mpijobs",
    ("kubeflow.org/v1", "Notebook"): "notebooks",
    ("ray.io/v1", "RayJob"): "rayjobs",
    ("ray.io/v1", "RayCluster"): "rayclusters",
    ("ray.io/v1", "RayService"): "rayservices",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
}


class KubeApiError(Exception):
    """A Kubernetes API answer that is not a success and not worth retrying (or retries ran out)."""

    def __init__(self, status: int, method: str, path: str, message: str, reason: str = "") -> None:
        self.status = status
        self.method = method
        self.path = path
        self.message = message
        self.reason = reason  # the metav1.Status reason: NotFound, Forbidden, AlreadyExists, Conflict...
        super().__init__(f"{method} {path}: HTTP {status}: {message}")

    @property
    def namespace_gone(self) -> bool:
        """A create refused because its namespace is being terminated (403) or does not exist (404).

        The real API server answers `namespaces "X" not found` for a missing namespace, and
        `unable to create new content in namespace X because it is being terminated` (403) while
        the namespace controller empties it; neither will succeed on retry until it exists again.
        """
        return (self.status == 403 and "being terminated" in self.message) or (
            self.status == 404 and self.message.startswith('namespaces "')
        )


def _group_path(api_version: str) -> str:
    """`/api/v1` for the core group, `/apis/GROUP/VERSION` for the others."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def resource_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None
) -> str:
    """`/apis/batch/v1/namespaces/ns/jobs/name/status` and friends."""
    parts = (_group_path(api_version), namespace and f"namespaces/{namespace}", plural, name, subresource)
    return "/".join(part for part in parts if part)


def _file_of(path: Any, data: str | bytes | None, suffix: str, written: list[str]) -> Any:
    """`path` when set, else a private (0600) temporary file holding `data` (its path also appended to `written`:
    the caller removes it), else None."""
    if path or not data:
        return path or None
    raw = data.encode() if isinstance(data, str) else data
    try:  # kubeconfigs carry base64; kopf passes it decoded or not depending on the source
        decoded = base64.b64decode(raw, validate=True)
        if decoded.startswith(b"-----"):
            raw = decoded
    except ValueError:
        pass
    handle = tempfile.NamedTemporaryFile(prefix="gpuwm-", suffix=suffix, delete=False)  # noqa: SIM115
    written.append(handle.name)
    with handle:
        handle.write(raw)
    return handle.name


class KubeClient:
    """Async JSON calls against one API server; construct with `from_connection_info` or directly."""

    def __init__(
        self,
        server: str,
        *,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        request_timeout_seconds: float = 30.0,
        retry_backoffs_seconds: Sequence[float] = (0.25, 0.5, 1, 2, 4, 8),
        max_connections: int = 32,
        relogin: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        # a User-Agent of its own: the API server's audit log and priority-and-fairness rules can name it
        self._headers = {"User-Agent": USER_AGENT, **dict(headers or {})}
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_seconds)
        self._backoffs = tuple(retry_backoffs_seconds)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._relogin = relogin
        self._plurals: dict[tuple[str, str], str] = dict(KNOWN_PLURALS)
        self._served: dict[str, set[str]] = {}
        self._warned_kinds: set[tuple[str, str]] = set()
        self.requests = 0
        self.retries = 0
        #: which cluster this is (server and kube-system UID), set at start; saved with the engine state
        self.cluster_identity: str | None = None

    @staticmethod
    def auth_headers(info: Any) -> dict[str, str]:
        """The Authorization header for kopf's `ConnectionInfo` (token or basic auth; none for client certs)."""
        headers: dict[str, str] = {}
        if info.scheme and info.token:
            headers["Authorization"] = f"{info.scheme} {info.token}"
        elif info.token:
            headers["Authorization"] = f"Bearer {info.token}"
        elif info.username and info.password:
            basic = base64.b64encode(f"{info.username}:{info.password}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        return headers

    @classmethod
    def from_connection_info(cls, info: Any, **kwargs: Any) -> KubeClient:
        """Build from kopf's `ConnectionInfo` (whatever login handler produced it)."""
        headers = cls.auth_headers(info)
        context: ssl.SSLContext | bool | None = None
        if str(info.server).startswith("https"):
            if info.insecure:
                context = False
            else:
                # the kubeconfig's inline CA, certificate and key go through files (ssl reads only files) that
                # are removed once read: a client key must not outlive the context in /tmp
                written: list[str] = []
                try:
                    ca_path = _file_of(info.ca_path, info.ca_data, ".crt", written)
                    context = ssl.create_default_context(cafile=str(ca_path) if ca_path else None)
                    cert_path = _file_of(info.certificate_path, info.certificate_data, ".crt", written)
                    key_path = _file_of(info.private_key_path, info.private_key_data, ".key", written)
                    if cert_path:
                        context.load_cert_chain(str(cert_path), str(key_path) if key_path else None)
                finally:
                    for path in written:
                        with contextlib.suppress(OSError):
                            os.unlink(path)
        return cls(str(info.server), headers=headers, ssl_context=context, **kwargs)

    async def _session_(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl if self._ssl is not None else True)
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout, connector=connector,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        nan_as_null: bool = False,
    ) -> dict[str, Any] | None:
        """One call with retries; None on 404 for GET/DELETE; KubeApiError for other failures.

        The API server's JSON has no NaN/Infinity: a body holding one fails here, naming the
        call, not with a 400 later; `nan_as_null` sends them as null instead (a figure that is
        not a number is unknown), which is also the cheap path (orjson) for status writes.
        """
        if body is None:
            data: str | bytes | None = None
        elif nan_as_null:
            data = orjson.dumps(body)  # orjson writes NaN and the infinities as null
        else:
            data = json.dumps(body, allow_nan=False)
        attempt = 0
        relogged = False
        while True:
            self.requests += 1
            delay: float | None = None
            try:
                status, retry_after, raw = await self._send(method, path, params, data, content_type)
                if status < 300:
                    return _decode(raw)
                text = raw.decode("utf-8", errors="replace")
                if status == 404 and method in {"GET", "DELETE"}:
                    return None
                if status == 401 and self._relogin is not None and not relogged:
                    # service-account tokens rotate: log in again once, then retry at once
                    relogged = True
                    self._headers = {"User-Agent": USER_AGENT, **dict(await asyncio.to_thread(self._relogin))}
                    await self.close()
                    continue
                if status not in RETRIED_STATUSES or attempt >= len(self._backoffs):
                    raise KubeApiError(status, method, path, *_message_and_reason(text))
                delay = _retry_after(retry_after, self._backoffs[attempt])
            except (TimeoutError, aiohttp.ClientConnectionError) as error:
                if attempt >= len(self._backoffs):
                    raise KubeApiError(0, method, path, f"connection failed: {error!r}") from error
                delay = self._backoffs[attempt]
            attempt += 1
            self.retries += 1
            logger.debug("retrying %s %s in %.2fs (attempt %d)", method, path, delay, attempt)
            await asyncio.sleep(delay)

    async def _send(
        self, method: str, path: str, params: Mapping[str, str] | None, data: str | bytes | None, content_type: str,
    ) -> tuple[int, str | None, bytes]:
        """(status, Retry-After header, body) of one call."""
        session = await self._session_()
        async with session.request(
            method, self.server + path, params=params, data=data,
            headers={"Content-Type": content_type} if data is not None else None,
        ) as response:
            return response.status, response.headers.get("Retry-After"), await response.read()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        return await self.request("POST", path, params=FIELD_MANAGER_PARAMS, body=body)

    async def merge_patch(self, path: str, body: Mapping[str, Any], *, nan_as_null: bool = False) -> dict[str, Any] | None:
        return await self.request("PATCH", path, params=FIELD_MANAGER_PARAMS, body=body,
                                  content_type=MERGE_PATCH, nan_as_null=nan_as_null)

    async def delete(self, path: str) -> dict[str, Any] | None:
        return await self.request("DELETE", path)

    async def list_items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """All items of a collection, following `continue` tokens in pages of 500."""
        items: list[dict[str, Any]] = []
        query = dict(params or {})
        query.setdefault("limit", "500")
        while True:
            page = await self.get(path, query) or {}
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    async def plural(self, api_version: str, kind: str) -> str | None:
        """The resource name of a kind, from the known table or the discovery API (cached)."""
        key = (api_version, kind)
        if key in self._plurals:
            return self._plurals[key]
        document = await self.get(_group_path(api_version)) or {}
        for resource in document.get("resources") or []:
            if "/" not in str(resource.get("name", "")):
                self._plurals.setdefault((api_version, str(resource.get("kind"))), str(resource["name"]))
        return self._plurals.get(key)

    async def served(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `api_version` (discovery, cached per group version)."""
        if api_version not in self._served:
            document = await self.get(_group_path(api_version)) or {}
            self._served[api_version] = {str(resource.get("name")) for resource in document.get("resources") or []}
        return plural in self._served[api_version]

    async def get_object(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist, its kind is not served, or RBAC forbids reading it.

        The last two are told once per kind in a warning (a CRD not installed, a kind the chart
        does not grant): the owner walk stops there and the reference itself is the workload.
        """
        plural = await self.plural(api_version, kind)
        if plural is None:
            self._warn_kind(api_version, kind, "is not served by the API server (is its CRD installed?)")
            return None
        try:
            found = await self.get(resource_path(api_version, plural, namespace, name))
        except KubeApiError as error:
            if error.status == 403:
                # RBAC stops the walk here: the caller treats the reference as the workload
                self._warn_kind(api_version, kind, f"cannot be read ({error.message}); grant `get` on {plural} "
                                "(chart value controller.extraOwnerRules)")
                return None
            raise
        if found is None and not await self.served(api_version, plural):
            self._warn_kind(api_version, kind, "is not served by the API server (is its CRD installed?)")
        return found

    def _warn_kind(self, api_version: str, kind: str, problem: str) -> None:
        if (api_version, kind) in self._warned_kinds:
            return
        self._warned_kinds.add((api_version, kind))
        logger.warning("owner kind %s %s %s; pods it owns are accounted to the %s named in their ownerReferences",
                       api_version, kind, problem, kind, extra={"kind": kind, "apiVersion": api_version})


def _decode(raw: bytes) -> dict[str, Any] | None:
    """An answer's JSON, parsed by orjson (faster than `json` on CR-sized answers); None when empty."""
    if not raw.strip():
        return None
    payload: dict[str, Any] = orjson.loads(raw)
    return payload


def _message_and_reason(text: str) -> tuple[str, str]:
    """The message and reason of a metav1.Status body (the raw text when it is not one)."""
    try:
        status = json.loads(text)
        return str(status.get("message") or text)[:500], str(status.get("reason") or "")
    except (ValueError, AttributeError):
        return text[:500], ""


def _retry_after(header: str | None, default: float) -> float:
    if header is None:
        return default
    try:
        return min(30.0, max(0.0, float(header)))
    except ValueError:
        return default
