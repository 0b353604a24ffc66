"""API authentication and authorisation.

`--auth=kubernetes`: the bearer token is checked by a TokenReview, access by a
SubjectAccessReview for `get gpuworkloadmetrics.gpuwm.io` in the namespace (cluster-wide
for the cluster and for listing everything). Results are cached briefly so a dashboard
refresh does not cost two API calls per request. `--auth=none` allows everything.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

log = logging.getLogger(__name__)

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESOURCE_GROUP = "gpuwm.io"
RESOURCE = "gpuworkloadmetrics"


class AuthError(Exception):
    """401 (no or bad token), 403 (not allowed) or 503 (the Kubernetes API could not be asked)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class User:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False)


class Authorizer(Protocol):
    async def authenticate(self, token: str | None) -> User:
        """The user behind a bearer token; AuthError(401) when there is none or it is not valid."""

    async def allowed(self, user: User, namespace: str | None) -> bool:
        """Whether `user` may read metrics in `namespace` (None: cluster-wide)."""


async def require(authorizer: Authorizer, token: str | None, namespaces: Sequence[str] | None) -> User:
    """Authenticate, then require access to every namespace listed (None: cluster-wide); AuthError otherwise."""
    user = await authorizer.authenticate(token)
    targets: list[str | None] = [None] if namespaces is None else list(dict.fromkeys(namespaces))
    if await authorizer.allowed(user, None):
        return user
    for namespace in targets:
        if namespace is None or not await authorizer.allowed(user, namespace):
            where = "cluster-wide" if namespace is None else f"in namespace {namespace!r}"
            raise AuthError(
                403,
                f"user {user.username!r} may not get {RESOURCE}.{RESOURCE_GROUP} {where}; "
                "grant it with a Role/ClusterRole and binding",
            )
    return user


class AllowAll:
    """`--auth=none`: everyone is `anonymous` and may read everything (local use only)."""

    async def authenticate(self, token: str | None) -> User:
        return User(username="anonymous")

    async def allowed(self, user: User, namespace: str | None) -> bool:
        return True


class KubernetesAuthorizer:
    """TokenReview + SubjectAccessReview against the Kubernetes API, with a short cache."""

    def __init__(
        self,
        api_url: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        verify_tls: bool = True,
        cache_seconds: float = 10.0,
        timeout_seconds: float = 5.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self._token_file = token_file
        self._cache_seconds = cache_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._ssl: ssl.SSLContext | bool = True
        if self.api_url.startswith("https://"):
            if not verify_tls:
                self._ssl = False
            else:
                context = ssl.create_default_context(cafile=ca_file)
                if client_cert is not None:
                    context.load_cert_chain(*client_cert)
                self._ssl = context
        self._users: dict[str, tuple[float, User | None]] = {}
        self._decisions: dict[tuple[str, tuple[str, ...], str | None], tuple[float, bool]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, cache_seconds: float = 10.0
    ) -> KubernetesAuthorizer:
        """In-cluster service account when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if host and kubeconfig is None and (_SERVICE_ACCOUNT / "token").exists():
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            return cls(
                f"https://{host}:{port}",
                token_file=str(_SERVICE_ACCOUNT / "token"),
                ca_file=str(_SERVICE_ACCOUNT / "ca.crt"),
                cache_seconds=cache_seconds,
            )
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        except Exception as error:
            raise AuthError(
                503,
                f"--auth=kubernetes needs in-cluster credentials or a kubeconfig ({error}); "
                "run in a pod, set KUBECONFIG, or use --auth=none for local use",
            ) from None
        keys = configuration.api_key or {}
        bearer = str(
            keys.get("BearerToken") or keys.get("authorization") or ""
        )  # the key name varies by version
        cert_file, key_file = configuration.cert_file, configuration.key_file
        cert = (str(cert_file), str(key_file)) if cert_file and key_file else None
        return cls(
            configuration.host,
            token=bearer.removeprefix("Bearer ").strip() or None,
            ca_file=configuration.ssl_ca_cert,
            client_cert=cert,
            verify_tls=bool(configuration.verify_ssl),
            cache_seconds=cache_seconds,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _own_token(self) -> str | None:
        if self._token_file:
            # re-read: projected service-account tokens rotate
            return Path(self._token_file).read_text().strip()
        return self._token

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        own = self._own_token()
        if own:
            headers["Authorization"] = f"Bearer {own}"
        try:
            async with self._session.post(
                self.api_url + path, json=body, headers=headers, ssl=self._ssl
            ) as response:
                if response.status >= 400:
                    text = (await response.text())[:200]
                    raise AuthError(
                        503,
                        f"the Kubernetes API refused {path} (HTTP {response.status}: {text}); "
                        "the gpuwm service account needs create on tokenreviews and subjectaccessreviews",
                    )
                payload: dict[str, Any] = await response.json()
                return payload
        except (aiohttp.ClientError, TimeoutError) as error:
            raise AuthError(
                503, f"cannot reach the Kubernetes API at {self.api_url} to check access: {error}"
            ) from None

    async def authenticate(self, token: str | None) -> User:
        if not token:
            raise AuthError(401, "missing bearer token: send 'Authorization: Bearer <kubernetes token>'")
        key = hashlib.sha256(token.encode()).hexdigest()  # never keep raw tokens as keys in memory dumps
        now = time.monotonic()
        cached = self._users.get(key)
        if cached is not None and cached[0] > now:
            user = cached[1]
        else:
            review = await self._post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            )
            status = review.get("status") or {}
            user = None
            if status.get("authenticated"):
                info = status.get("user") or {}
                user = User(
                    username=str(info.get("username", "")),
                    uid=str(info.get("uid", "")),
                    groups=tuple(info.get("groups") or ()),
                    extra={k: list(v) for k, v in (info.get("extra") or {}).items()},
                )
            self._users[key] = (now + self._cache_seconds, user)
            if len(self._users) > 10_000:
                self._users = {k: v for k, v in self._users.items() if v[0] > now}
        if user is None:
            raise AuthError(401, "the bearer token is not valid (TokenReview did not authenticate it)")
        return user

    async def allowed(self, user: User, namespace: str | None) -> bool:
        key = (user.username, user.groups, namespace)
        now = time.monotonic()
        cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        attributes: dict[str, Any] = {"verb": "get", "group": RESOURCE_GROUP, "resource": RESOURCE}
        if namespace is not None:
            attributes["namespace"] = namespace
        review = await self._post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.username,
                    "uid": user.uid,
                    "groups": list(user.groups),
                    "extra": user.extra,
                    "resourceAttributes": attributes,
                },
            },
        )
        decision = bool((review.get("status") or {}).get("allowed"))
        self._decisions[key] = (now + self._cache_seconds, decision)
        if len(self._decisions) > 50_000:
            self._decisions = {k: v for k, v in self._decisions.items() if v[0] > now}
        log.debug("access review", extra={"user": user.username, "namespace": namespace, "allowed": decision})
        return decision
