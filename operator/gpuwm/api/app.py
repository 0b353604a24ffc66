"""The metrics API (DESIGN §5) as an ASGI app over a Store: served by the controller or by `gpuwm api`.

`create_app` only assembles: the routes are plain `APIRouter`s by resource (gpuwm.api.routes), which take
what they share (store, settings, limits, caller) through `Depends` from the app's one `ApiContext`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from gpuwm import __version__
from gpuwm.api.admission import AdmissionGate
from gpuwm.api.auth import AllowAll, Authorizer, KubernetesAuthorizer
from gpuwm.api.http import ERROR_HANDLERS, remember_client
from gpuwm.api.limits import QueryLimits
from gpuwm.api.middleware import SecurityHeaders
from gpuwm.api.prom_metrics import WorkloadMetricsCollector
from gpuwm.api.routes import ROUTERS
from gpuwm.api.routes.context import ApiContext
from gpuwm.api.routes.operations import STATIC_DIR
from gpuwm.config import Settings
from gpuwm.store import Store

log = logging.getLogger(__name__)


def create_app(
    store: Store, settings: Settings | None = None, authorizer: Authorizer | None = None,
    extra_collectors: Sequence[Collector] = (),
) -> FastAPI:
    """The API over `store`; `authorizer` defaults from settings.auth (kubernetes needs credentials at start).

    `extra_collectors`: more series for `/metrics` (the controller's own counters, when it serves the API).
    """
    settings = settings or Settings()
    authorizer = authorizer or default_authorizer(settings)
    if isinstance(authorizer, AllowAll):
        log.warning(
            "API AUTHENTICATION IS OFF (--auth=none): anyone who can reach %s reads every workload's metrics; "
            "use --auth=kubernetes outside local testing",
            settings.api_listen,
        )
    registry = CollectorRegistry(auto_describe=True)
    registry.register(WorkloadMetricsCollector(
        store, runai_compatible=settings.runai_compatible_metrics, cluster_id=settings.cluster_id,
        user_label=settings.runai_user_label, status_interval_seconds=settings.status_interval,
    ))
    for collector in extra_collectors:
        registry.register(collector)
    app = FastAPI(
        title="gpuwm metrics API",
        version=__version__,
        description="GPU allocation, utilisation, idle time and energy per workload, project, node and cluster.",
        docs_url=None,
        redoc_url=None,
        exception_handlers=ERROR_HANDLERS,
    )
    gate = AdmissionGate.of(
        settings.api_max_concurrent_queries, settings.api_max_concurrent_queries_per_user,
        settings.api_query_queue_seconds,
    )
    app.state.context = ApiContext(
        store=store,
        settings=settings,
        authorizer=authorizer,
        limits=QueryLimits(settings.api_max_points_per_response, gate.heavy),
        registry=registry,
        limiter=anyio.CapacityLimiter(store.concurrent_reads) if store.concurrent_reads else None,
        gate=gate,
    )
    app.middleware("http")(remember_client)
    app.add_middleware(SecurityHeaders)
    if settings.api_trusted_proxies:
        # outermost: the client it names is the one remember_client sees
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.api_trusted_proxies))
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def default_authorizer(settings: Settings) -> Authorizer:
    """`--auth=none`: everyone may read; `--auth=kubernetes`: TokenReview and SubjectAccessReview."""
    if settings.auth == "none":
        return AllowAll()
    return KubernetesAuthorizer.from_environment(
        audience=settings.api_token_audience,
        cache_entries=settings.api_auth_cache_entries,
        reviews_per_client_per_second=settings.api_auth_reviews_per_client_per_second,
        token_reviews_per_second=settings.api_token_reviews_per_second,
    )
