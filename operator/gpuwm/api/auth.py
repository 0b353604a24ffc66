"""API authentication and authorisation.

`--auth=kubernetes`: the bearer token is checked by a TokenReview for the API's audience
(`--api-token-audience`, `gpuwm`: a token issued for another service, or a pod's default
service-account token, is refused, so a token leaked from elsewhere cannot be replayed here),
access by a SubjectAccessReview for `get gpuworkloadmetrics.gpuwm.io` in the namespace
(cluster-wide for the cluster and for listing everything) and, for `/metrics`, `get` on that
non-resource URL (as kube-rbac-proxy and kube-state-metrics ask Prometheus for).

Results are cached briefly so a dashboard refresh does not cost two API calls per request; the
caches are bounded (least recently used go first), each client address may cause only so
many reviews a second and all clients together only so many TokenReviews, so a stream of made-up
tokens neither grows memory nor floods the Kubernetes API. The client is the connection's peer
unless a proxy the operator trusts names another (`apiTrustedProxies`): a forged X-Forwarded-For
does not make one client many. `--auth=none` allows everything.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import aiohttp

log = logging.getLogger(__name__)

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESOURCE_GROUP = "gpuwm.io"
RESOURCE = "gpuworkloadmetrics"
DEFAULT_AUDIENCE = "gpuwm"

#: the address of the client whose request is being answered (set by the app per request): review
#: calls are rate-limited per client
current_client: contextvars.ContextVar[str] = contextvars.ContextVar("gpuwm_api_client", default="")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class AuthError(Exception):
    """401 (no or bad token), 403 (not allowed), 429 (too many reviews from one client; `retry_after_seconds`)
    or 503 (the Kubernetes API could not be asked)."""

    def __init__(self, status: int, message: str, retry_after_seconds: float | None = None) -> None:
        self.status = status
        self.message = message
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class TtlLru(Generic[K, V]):
    """At most `entries` values, each for `ttl_seconds`; the least recently used goes first when full. Expired
    entries are dropped when met and when the cache is full, so neither many distinct keys nor a quiet period
    grows it past its size."""

    def __init__(self, entries: int, ttl_seconds: float) -> None:
        self.entries = max(1, entries)
        self.ttl_seconds = ttl_seconds
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()  # key -> (when it expires, its value)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, now: float) -> tuple[bool, V | None]:
        """(found, value): found is False for a missing or expired key."""
        item = self._items.get(key)
        if item is None:
            return False, None
        expires_at, value = item
        if expires_at <= now:
            del self._items[key]
            return False, None
        self._items.move_to_end(key)
        return True, value

    def put(self, key: K, value: V, now: float) -> None:
        self._items[key] = (now + self.ttl_seconds, value)
        self._items.move_to_end(key)
        while len(self._items) > self.entries:
            self._items.popitem(last=False)


class ClientRate:
    """A token bucket per client: `per_second` reviews, bursts of `burst_seconds` worth; clients bounded."""

    def __init__(self, per_second: float, burst_seconds: float = 5.0, clients: int = 10_000) -> None:
        self.per_second = per_second
        self.capacity = max(1.0, per_second * burst_seconds)
        self._buckets: TtlLru[str, tuple[float, float]] = TtlLru(clients, ttl_seconds=burst_seconds * 2 + 1)

    def take(self, client: str, now: float) -> float:
        """0 when `client` may cause one more review now (and it is counted), else the seconds to wait."""
        found, bucket = self._buckets.get(client, now)
        tokens, at = bucket if found and bucket is not None else (self.capacity, now)
        tokens = min(self.capacity, tokens + (now - at) * self.per_second)
        if tokens < 1.0:
            self._buckets.put(client, (tokens, now), now)
            return (1.0 - tokens) / self.per_second
        self._buckets.put(client, (tokens - 1.0, now), now)
        return 0.0


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

    async def allowed_path(self, user: User, path: str) -> bool:
        """Whether `user` may `get` the non-resource URL `path` (e.g. /metrics)."""


class AllowAll:
    """`--auth=none`: everyone is `anonymous` and may read everything (local use only)."""

    async def authenticate(self, token: str | None) -> User:
        return User(username="anonymous")

    async def allowed(self, user: User, namespace: str | None) -> bool:
        return True

    async def allowed_path(self, user: User, path: str) -> bool:
        return True


class KubernetesAuthorizer:
    """TokenReview (for `audience`) + SubjectAccessReview against the Kubernetes API, with bounded caches."""

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
        audience: str = DEFAULT_AUDIENCE,
        cache_entries: int = 10_000,
        reviews_per_client_per_second: float = 10.0,
        token_reviews_per_second: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        #: seconds for the caches' ages and the review rate (a test freezes it to count a burst exactly)
        self._clock = clock
        self.audience = audience
        self._token = token
        self._token_file = token_file
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
        self._users: TtlLru[str, User | None] = TtlLru(cache_entries, cache_seconds)
        self._decisions: TtlLru[tuple[str, tuple[str, ...], str, str | None], bool] = TtlLru(
            cache_entries, cache_seconds
        )
        self._rate = ClientRate(reviews_per_client_per_second)
        #: every client's TokenReviews together, one bucket: many clients with made-up tokens (or one that
        #: looks like many) cannot send the API server more than this
        self._token_reviews = ClientRate(token_reviews_per_second)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, **options: Any
    ) -> KubernetesAuthorizer:
        """In-cluster service account when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config);
        `options` go to the constructor (audience, cache_seconds, cache_entries, reviews_per_client_per_second)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if host and kubeconfig is None and (_SERVICE_ACCOUNT / "token").exists():
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            return cls(
                f"https://{host}:{port}",
                token_file=str(_SERVICE_ACCOUNT / "token"),
                ca_file=str(_SERVICE_ACCOUNT / "ca.crt"),
                    **options,
            )
        try:
            from kubernetes import client, config
        except ImportError:  # the image goes without it: in a pod the service account is read above
            raise AuthError(
                503,
                "--auth=kubernetes outside a pod reads the kubeconfig with the official Kubernetes client, which "
                "is not installed: pip install 'gpuwm[kubeconfig]', or run in a pod, or use --auth=none for local use",
            ) from None

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
        bearer = str(keys.get("BearerToken") or keys.get("authorization") or "")  # its key varies by version
        cert_file, key_file = configuration.cert_file, configuration.key_file
        cert = (str(cert_file), str(key_file)) if cert_file and key_file else None
        return cls(
            configuration.host,
            token=bearer.removeprefix("Bearer ").strip() or None,
            ca_file=configuration.ssl_ca_cert,
            client_cert=cert,
            verify_tls=bool(configuration.verify_ssl),
            **options,
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

    def _take_review(self, token_review: bool) -> None:
        """Count one review against the client's rate (and a TokenReview against every client's); 429 past it."""
        client = current_client.get()
        wait = self._rate.take(client, self._clock())
        if wait > 0:
            raise AuthError(
                429,
                f"too many new tokens or access checks from {client or 'this client'} "
                f"(more than {self._rate.per_second:g} reviews a second); retry in {wait:.1f}s, "
                "reuse one token instead of a new one per request",
                retry_after_seconds=wait,
            )
        wait = self._token_reviews.take("", self._clock()) if token_review else 0.0
        if wait > 0:
            raise AuthError(
                429,
                f"too many new tokens from all clients together (more than {self._token_reviews.per_second:g} "
                f"TokenReviews a second, apiTokenReviewsPerSecond); retry in {wait:.1f}s",
                retry_after_seconds=wait,
            )

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._take_review(token_review=path.endswith("/tokenreviews"))
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
        now = self._clock()
        found, user = self._users.get(key, now)
        if not found:
            review = await self._post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token, "audiences": [self.audience]},
                },
            )
            user = _reviewed_user(review.get("status") or {}, self.audience)
            self._users.put(key, user, now)
        if user is None:
            raise AuthError(
                401,
                f"the bearer token is not valid for audience {self.audience!r} (TokenReview did not authenticate "
                f"it); get one with: kubectl create token <service-account> --audience {self.audience}",
            )
        return user

    async def allowed(self, user: User, namespace: str | None) -> bool:
        attributes: dict[str, Any] = {"verb": "get", "group": RESOURCE_GROUP, "resource": RESOURCE}
        if namespace is not None:
            attributes["namespace"] = namespace
        return await self._review(user, "resource", namespace, {"resourceAttributes": attributes})

    async def allowed_path(self, user: User, path: str) -> bool:
        return await self._review(user, "path", path, {"nonResourceAttributes": {"verb": "get", "path": path}})

    async def _review(self, user: User, kind: str, target: str | None, attributes: dict[str, Any]) -> bool:
        key = (user.username, user.groups, kind, target)
        now = self._clock()
        found, cached = self._decisions.get(key, now)
        if found and cached is not None:
            return cached
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
                    **attributes,
                },
            },
        )
        decision = bool((review.get("status") or {}).get("allowed"))
        self._decisions.put(key, decision, now)
        log.debug("access review", extra={"user": user.username, kind: target, "allowed": decision})
        return decision


def _reviewed_user(status: dict[str, Any], audience: str) -> User | None:
    """The user a TokenReview's status authenticates for `audience`, or None: an authenticator that does not
    know audiences leaves ours out of `status.audiences`, and such an answer is not valid for this API."""
    if not status.get("authenticated") or audience not in (status.get("audiences") or []):
        return None
    info = status.get("user") or {}
    return User(
        username=str(info.get("username", "")),
        uid=str(info.get("uid", "")),
        groups=tuple(info.get("groups") or ()),
        extra={k: list(v) for k, v in (info.get("extra") or {}).items()},
    )
