"""What every route shares, handed to it through FastAPI's `Depends`: the store and the limiters of its
reads, the settings, the answer limits and the admission gate, the Prometheus registry, and the caller
(token and authoriser).

One `ApiContext` per app, built by `create_app` and kept in `app.state`; the routes never close over it,
so each route module is a plain `APIRouter` that any app can include. The dependencies are `async def`
although few await: FastAPI runs a plain `def` dependency on a worker thread, a thread hop per request
outside the store's limiter.

A query's caller takes a slot of the admission gate once its token is reviewed (gpuwm.api.admission) and
gives it back when the route returns, before the answer is sent: a client slow to read holds no slot.
The probes and `/metrics` read the store aside, on threads the queries never hold.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from gpuwm.api.admission import AdmissionGate, SlotPool, current_identity
from gpuwm.api.auth import RESOURCE, RESOURCE_GROUP, AuthError, Authorizer, User
from gpuwm.api.http import bearer_token
from gpuwm.api.limits import QueryLimits
from gpuwm.config import Settings
from gpuwm.model import WorkloadFigures
from gpuwm.store import Store

T = TypeVar("T")
#: a default range that is not a run's life: the last hour of the store's data
DEFAULT_RANGE_SECONDS = 3600.0


@dataclass
class ApiContext:
    store: Store
    settings: Settings
    authorizer: Authorizer
    limits: QueryLimits
    registry: CollectorRegistry
    #: at most `store.concurrent_reads` worker threads ever hold a store connection, however many queries
    #: arrive together (the rest wait their turn); None: the store takes any number
    limiter: anyio.CapacityLimiter | None
    #: every query's way in: bounded at once, per user, fair (gpuwm.api.admission)
    gate: AdmissionGate
    #: one thread each for /readyz and for /metrics, which the queries never hold
    readiness_limiter: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))
    scrape_limiter: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))

    async def blocking(self, function: Callable[..., T], *arguments: Any) -> T:
        """`function(*arguments)` on a worker thread: store reads and encoding stay off the event loop
        (in the controller it is kopf's)."""
        return await anyio.to_thread.run_sync(function, *arguments, limiter=self.limiter)

    async def aside(self, limiter: anyio.CapacityLimiter, function: Callable[..., T], *arguments: Any) -> T:
        """`function(*arguments)` on a thread of `limiter`'s own, not behind the queries' store reads."""
        return await anyio.to_thread.run_sync(function, *arguments, limiter=limiter)

    async def store_bounds(self) -> tuple[float, float]:
        """(the store's earliest time, its latest time); now where it has no data yet."""
        latest = await self.blocking(self.store.latest_time)
        earliest = await self.blocking(self.store.earliest_time)
        now = latest if latest is not None else time.time()
        # a store that cannot tell its oldest data (Prometheus) defaults ranges to the last hour
        return (earliest if earliest is not None else now - DEFAULT_RANGE_SECONDS), now

    async def last_hour(self) -> tuple[float, float]:
        """The default range of a project, node, cluster or GPU: the store's last hour (less if it holds less)."""
        earliest, latest = await self.store_bounds()
        return max(earliest, latest - DEFAULT_RANGE_SECONDS), latest


async def api_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.context
    return context


@dataclass
class Caller:
    """Who asks: the request's bearer token before the authoriser. Nothing is reviewed until a route asks,
    so a bad parameter is refused (400) before the token is looked at, as in every route. Once reviewed,
    the caller waits for a slot of `queries` (None: a caller that reads no query, /metrics')."""

    authorizer: Authorizer
    token: str | None
    queries: SlotPool | None = None
    #: the identity holding a slot of `queries` for this request
    admitted: str | None = field(default=None, init=False)

    async def authenticate(self) -> User:
        user = await self.authorizer.authenticate(self.token)
        if self.queries is not None and self.admitted is None:
            await self.queries.acquire(user.username)
            self.admitted = user.username
            current_identity.set(user.username)
        return user

    def leave(self) -> None:
        """Give the request's slot back (the route has returned)."""
        if self.queries is not None and self.admitted is not None:
            self.queries.release(self.admitted)
            self.admitted = None

    async def require(self, namespaces: Sequence[str] | None) -> User:
        """401/403 unless the caller may read every one of `namespaces` (None: cluster-wide), which the
        caller named (a 403 tells nothing the request did not)."""
        user = await self.authenticate()
        denied = await self._first_denied(user, namespaces)
        if denied is not False:
            where = "cluster-wide" if denied is None else f"in namespace {denied!r}"
            raise AuthError(
                403,
                f"user {user.username!r} may not get {RESOURCE}.{RESOURCE_GROUP} {where}; "
                "grant it with a Role/ClusterRole and binding",
            )
        return user

    async def may_read(self, user: User, namespaces: Sequence[str]) -> bool:
        """Whether `user` may read every one of `namespaces` (found by the API, not named by the caller:
        where not, the route answers as if there were nothing, so what exists where cannot be probed)."""
        return await self._first_denied(user, namespaces) is False

    async def _first_denied(self, user: User, namespaces: Sequence[str] | None) -> str | Literal[False] | None:
        """The first of `namespaces` `user` may not read (None: cluster-wide), or False where it may read all."""
        if await self.authorizer.allowed(user, None):
            return False
        if namespaces is None:
            return None
        for namespace in dict.fromkeys(namespaces):
            if not await self.authorizer.allowed(user, namespace):
                return namespace
        return False

    async def require_path(self, path: str) -> User:
        """401/403 unless the caller may `get` the non-resource URL `path`."""
        user = await self.authenticate()
        if not await self.authorizer.allowed_path(user, path):
            raise AuthError(
                403,
                f"user {user.username!r} may not get {path}; grant it with a ClusterRole rule "
                f"nonResourceURLs: [{path!r}], verbs: [get] (the chart's <release>-metrics-reader)",
            )
        return user

    async def readable(self, user: User, workloads: list[WorkloadFigures]) -> list[WorkloadFigures]:
        """Those of `workloads` in namespaces `user` may read (all of them with cluster-wide access)."""
        allowed = await self.readable_namespaces(user, {w.namespace for w in workloads})
        return [w for w in workloads if w.namespace in allowed]

    async def readable_namespaces(self, user: User, namespaces: set[str]) -> set[str]:
        """Those of `namespaces` `user` may read (all of them with cluster-wide access)."""
        if await self.authorizer.allowed(user, None):
            return namespaces
        return {namespace for namespace in namespaces if await self.authorizer.allowed(user, namespace)}


async def caller(request: Request, context: Annotated[ApiContext, Depends(api_context)]) -> AsyncIterator[Caller]:
    """A query's caller: its slot is given back when the route returns (scope "function"), before the answer
    is sent."""
    made = Caller(context.authorizer, bearer_token(request), context.gate.queries)
    try:
        yield made
    finally:
        made.leave()


async def scraper(request: Request, context: Annotated[ApiContext, Depends(api_context)]) -> Caller:
    """Prometheus' caller: authorised like any other, admitted by no gate (its reads are aside)."""
    return Caller(context.authorizer, bearer_token(request))


Context = Annotated[ApiContext, Depends(api_context)]
CallerOf = Annotated[Caller, Depends(caller, scope="function")]
ScraperOf = Annotated[Caller, Depends(scraper)]
