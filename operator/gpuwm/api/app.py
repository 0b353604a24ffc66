"""The metrics API (DESIGN §5) as an ASGI app over a Store: served by the controller or by `gpuwm api`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gpuwm import __version__
from gpuwm.api.auth import AllowAll, AuthError, Authorizer, current_client, require, require_path
from gpuwm.api.docs import docs_page
from gpuwm.api.fleet import add_fleet_routes
from gpuwm.api.http import (
    BOOL_PATTERN,
    ERRORS,
    NOT_FOUND,
    RANGE_PARAMETERS,
    ByParam,
    EndParam,
    MetricParam,
    NotFound,
    StartParam,
    StepParam,
    TooBusy,
    bearer_token,
    check_parameters,
    error_response,
    is_idle,
    metrics_json,
)
from gpuwm.api.limits import QueryLimits
from gpuwm.api.params import (
    BadParameter,
    choose_range,
    parse_bool,
    parse_breakdown,
    parse_metrics,
    parse_step,
    parse_time,
)
from gpuwm.api.prom_metrics import WorkloadMetricsCollector
from gpuwm.api.queue import add_queue_routes
from gpuwm.api.report import add_report_routes
from gpuwm.api.runs import (
    DEFAULT_PAGE_RUNS,
    WORKLOAD_RANGE_PARAMETERS,
    LeaderParam,
    PodParam,
    WorkloadByParam,
    add_run_routes,
    at_stored_resolution,
    fit_resolution,
    page_of_runs,
    parse_limit,
    with_failure_reason,
    workload_range,
)
from gpuwm.api.schemas import (
    ErrorBody,
    Health,
    MetricsBody,
    ProjectList,
    WorkloadList,
)
from gpuwm.config import Settings
from gpuwm.model.figures import WorkloadFigures
from gpuwm.store.base import (
    DEFAULT_METRICS,
    QueryError,
    RangeQuery,
    Scope,
    Series,
    Store,
    StoreError,
)

log = logging.getLogger(__name__)
#: what a parameter refused by its declared pattern should look like, for the 400's message
_EXPECTED_FORMS = {
    "start": "RFC 3339 (2026-11-22T10:00:00Z), epoch seconds or epoch milliseconds",
    "end": "RFC 3339 (2026-11-22T10:00:00Z), epoch seconds or epoch milliseconds",
    "step": "a duration such as 5s, 1m or 30 (seconds)",
    "by": "one of gpu, pod, node",
    "idle": "true or false",
}
STATIC_DIR = Path(__file__).parent / "static"
T = TypeVar("T")


def create_app(
    store: Store, settings: Settings | None = None, authorizer: Authorizer | None = None,
    extra_collectors: Sequence[Collector] = (),
) -> FastAPI:
    """The API over `store`; `authorizer` defaults from settings.auth (kubernetes needs credentials at start).

    `extra_collectors`: more series for `/metrics` (the controller's own counters, when it serves the API).
    """
    settings = settings or Settings()
    if authorizer is None:
        if settings.auth == "none":
            authorizer = AllowAll()
        else:
            from gpuwm.api.auth import KubernetesAuthorizer

            authorizer = KubernetesAuthorizer.from_environment(
                audience=settings.api_token_audience,
                cache_entries=settings.api_auth_cache_entries,
                reviews_per_client_per_second=settings.api_auth_reviews_per_client_per_second,
            )
    if isinstance(authorizer, AllowAll):
        log.warning(
            "API AUTHENTICATION IS OFF (--auth=none): anyone who can reach %s reads every workload's metrics; "
            "use --auth=kubernetes outside local testing",
            settings.api_listen,
        )
    app = FastAPI(
        title="gpuwm metrics API",
        version=__version__,
        description="GPU allocation, utilisation, idle time and energy per workload, project, node and cluster.",
        docs_url=None,
        redoc_url=None,
    )
    registry = CollectorRegistry(auto_describe=True)
    registry.register(WorkloadMetricsCollector(
        store, runai_compatible=settings.runai_compatible_metrics, cluster_id=settings.cluster_id
    ))
    for collector in extra_collectors:
        registry.register(collector)
    app.state.store = store
    app.state.authorizer = authorizer

    # store reads share one limiter: at most `concurrent_reads` worker threads ever hold a store
    # connection, however many queries arrive together (the rest wait their turn)
    limiter = anyio.CapacityLimiter(store.concurrent_reads) if store.concurrent_reads else None

    async def blocking(function: Callable[..., T], *arguments: Any) -> T:
        return await anyio.to_thread.run_sync(function, *arguments, limiter=limiter)

    limits = QueryLimits(settings.api_max_points_per_response, settings.api_max_concurrent_queries)
    app.state.limits = limits

    @app.middleware("http")
    async def remember_client(request: Request, call_next: Callable[[Request], Any]) -> Response:
        """Review calls are rate-limited per client address (gpuwm.api.auth.current_client)."""
        current_client.set(request.client.host if request.client is not None else "")
        response: Response = await call_next(request)
        return response

    async def guard(request: Request, namespaces: Sequence[str] | None) -> None:
        await require(authorizer, bearer_token(request), namespaces)

    @app.exception_handler(BadParameter)
    async def bad_parameter(_request: Request, error: BadParameter) -> JSONResponse:
        return error_response(400, "bad_parameter", str(error), error.parameter)

    @app.exception_handler(QueryError)
    async def bad_query(_request: Request, error: QueryError) -> JSONResponse:
        return error_response(400, "bad_parameter", str(error), error.parameter)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        location = [str(part) for part in first.get("loc", ())]
        parameter = location[-1] if location else None
        expected = _EXPECTED_FORMS.get(parameter or "")
        if first.get("type") == "string_pattern_mismatch" and expected is not None:
            return error_response(
                400, "bad_parameter", f"{parameter}: {str(first.get('input'))[:80]!r} is not {expected}", parameter
            )
        return error_response(400, "bad_parameter", f"{parameter}: {first.get('msg', 'invalid')}", parameter)

    @app.exception_handler(AuthError)
    async def denied(_request: Request, error: AuthError) -> JSONResponse:
        kind = {401: "unauthorized", 403: "forbidden", 429: "too_many_requests"}.get(error.status, "unavailable")
        response = error_response(error.status, kind, error.message)
        if error.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="gpuwm"'
        if error.retry_after_seconds is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_seconds)))
        return response

    @app.exception_handler(TooBusy)
    async def too_busy(_request: Request, error: TooBusy) -> JSONResponse:
        response = error_response(429, "too_many_requests", error.message)
        response.headers["Retry-After"] = str(error.retry_after_seconds)
        return response

    @app.exception_handler(StoreError)
    async def store_failed(_request: Request, error: StoreError) -> JSONResponse:
        log.error("store query failed: %s", error)
        return error_response(503, "unavailable", str(error))

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, error: NotFound) -> JSONResponse:
        return error_response(404, "not_found", error.message)

    async def range_answer(
        request: Request,
        scope: Scope,
        key: str,
        default_start: float,
        default_end: float,
        metric: list[str],
        start: str | None,
        end: str | None,
        step: str | None,
        by: str | None,
        encode: Callable[[RangeQuery, list[Series]], Response],
        pods: Sequence[str] = (),
        allowed: set[str] | None = None,
    ) -> Response:
        """Parse, check the answer's size before reading (400 past the limit, 429 past the heavy queries
        at once), read and encode off the event loop (in the controller it is kopf's). The step is the
        stored resolution where the one asked for is finer (gpuwm.api.runs.fit_resolution)."""
        check_parameters(request, allowed or RANGE_PARAMETERS, multi=("metric", "pod"))
        names = parse_metrics(metric, DEFAULT_METRICS)
        start_s = parse_time("start", start) if start is not None else None
        end_s = parse_time("end", end) if end is not None else None
        step_s, requested_step = at_stored_resolution(store, parse_step(step) if step is not None else None)
        breakdown = parse_breakdown(by)
        first, last, step_seconds = choose_range(start_s, end_s, step_s, default_start, default_end)
        query = RangeQuery(
            scope, key, names, first, last, step_seconds, breakdown, tuple(pods), requested_step  # type: ignore[arg-type]
        )
        query = await blocking(fit_resolution, store, query)
        series_count = await blocking(store.series_count, query)
        with limits.admit(query, series_count):
            series = await blocking(store.query_range, query)
            if series_count is None:
                limits.check_answer(query, series)
            return await blocking(encode, query, series)

    async def store_bounds() -> tuple[float, float]:
        latest = await blocking(store.latest_time)
        earliest = await blocking(store.earliest_time)
        now = latest if latest is not None else time.time()
        # a store that cannot tell its oldest data (Prometheus) defaults ranges to the last hour
        return (earliest if earliest is not None else now - 3600.0), now

    @app.get("/api/v1/workloads", response_model=WorkloadList, responses=ERRORS, tags=["workloads"])
    async def list_workloads(
        request: Request,
        namespace: Annotated[str | None, Query(description="Only this namespace.")] = None,
        project: Annotated[str | None, Query(description="Only this project.")] = None,
        idle: Annotated[
            str | None,
            Query(description="true: only workloads holding GPUs and idle now; false: the others.", pattern=BOOL_PATTERN),
        ] = None,
        ended: Annotated[
            str | None,
            Query(
                description="true: every run kept, ended ones and earlier runs of a reused name included (each by "
                "its UID), paged (`limit`, default 500); false: only runs that have not ended. Unset: the newest "
                "run of each name.",
                pattern=BOOL_PATTERN,
            ),
        ] = None,
        limit: Annotated[str | None, Query(description="At most this many workloads (1 .. 5000).")] = None,
        continue_: Annotated[
            str | None, Query(alias="continue", description="The previous page's `continue`: the next page.")
        ] = None,
    ) -> WorkloadList:
        """Current state of every workload you may read.

        From the embedded store, running workloads' figures are refreshed in turns where more of them run
        than the controller's `storeLatestRowsPerInterval` (1,000): each at most ceil(running / that)
        status intervals old. New, changed-phase and finished workloads are there within one interval.
        """
        check_parameters(request, {"namespace", "project", "idle", "ended", "limit", "continue"}, multi=())
        idle_only = parse_bool("idle", idle) if idle is not None else None
        ended_runs = parse_bool("ended", ended) if ended is not None else None
        page_size = parse_limit(limit, DEFAULT_PAGE_RUNS if ended_runs else None)
        user = await authorizer.authenticate(bearer_token(request))
        if namespace is not None:
            await guard(request, [namespace])
        workloads = await blocking(store.runs if ended_runs else store.workloads)
        if ended_runs is False:
            workloads = [w for w in workloads if w.end_time is None]
        chosen = [
            w
            for w in workloads
            if (namespace is None or w.namespace == namespace)
            and (project is None or w.project == project)
            and (idle_only is None or is_idle(w) == idle_only)
        ]
        if namespace is None and not await authorizer.allowed(user, None):
            allowed = {ns for ns in {w.namespace for w in chosen} if await authorizer.allowed(user, ns)}
            chosen = [w for w in chosen if w.namespace in allowed]
        if page_size is None and continue_ is None:
            return WorkloadList(workloads=chosen)
        page, following = page_of_runs(chosen, page_size, continue_)
        return WorkloadList(workloads=page, continue_=following)

    async def find_workload(namespace: str, name: str) -> WorkloadFigures:
        found = await blocking(store.workload, namespace, name)
        if found is None:
            raise NotFound(
                f"no workload {name!r} in namespace {namespace!r} (or it ended before the retention period)"
            )
        return found

    @app.get(
        "/api/v1/namespaces/{namespace}/workloads/{name}",
        response_model=WorkloadFigures,
        responses={**ERRORS, **NOT_FOUND},
        tags=["workloads"],
    )
    async def get_workload(request: Request, namespace: str, name: str) -> WorkloadFigures:
        """Current state of one workload (a running one's as the workload list says: refreshed in turns
        beyond `storeLatestRowsPerInterval` running workloads)."""
        check_parameters(request, set())
        await guard(request, [namespace])
        return with_failure_reason(await find_workload(namespace, name))

    @app.get(
        "/api/v1/namespaces/{namespace}/workloads/{name}/metrics",
        response_model=MetricsBody,
        responses={**ERRORS, **NOT_FOUND},
        tags=["metrics"],
    )
    async def workload_metrics(
        request: Request,
        namespace: str,
        name: str,
        metric: MetricParam = [],  # noqa: B006
        start: StartParam = None,
        end: EndParam = None,
        step: StepParam = None,
        by: WorkloadByParam = None,
        pod: PodParam = [],  # noqa: B006
        leader: LeaderParam = None,
    ) -> Response:
        """Time series of the newest run of a workload (`/workloads/{uid}/metrics` for any run); the default
        range is the run's whole life."""
        check_parameters(request, WORKLOAD_RANGE_PARAMETERS, multi=("metric", "pod"))
        await guard(request, [namespace])
        workload = await find_workload(namespace, name)
        return await workload_range(request, workload, metric, start, end, step, by, pod, leader,
                                    store_bounds, range_answer)

    add_run_routes(app, store, blocking, guard, authorizer.authenticate, store_bounds, range_answer)

    @app.get("/api/v1/projects", response_model=ProjectList, responses=ERRORS, tags=["projects"])
    async def list_projects(request: Request) -> ProjectList:
        """Current state of every project you may read (all of its namespaces)."""
        check_parameters(request, set())
        user = await authorizer.authenticate(bearer_token(request))
        projects = await blocking(store.projects)
        if not await authorizer.allowed(user, None):
            kept = []
            for project in projects:
                if all([await authorizer.allowed(user, ns) for ns in project.namespaces]):
                    kept.append(project)
            projects = kept
        return ProjectList(projects=projects)

    @app.get(
        "/api/v1/projects/{project}/metrics",
        response_model=MetricsBody,
        responses={**ERRORS, **NOT_FOUND},
        tags=["metrics"],
    )
    async def project_metrics(
        request: Request,
        project: str,
        metric: MetricParam = [],  # noqa: B006
        start: StartParam = None,
        end: EndParam = None,
        step: StepParam = None,
        by: ByParam = None,
    ) -> Response:
        """Time series of one project (sums over its workloads); default range: the last hour."""
        check_parameters(request, RANGE_PARAMETERS)
        found = await blocking(store.project, project)
        if found is None:
            await authorizer.authenticate(bearer_token(request))
            raise NotFound(f"no project {project!r}")
        await guard(request, found.namespaces)
        _earliest, latest = await store_bounds()
        return await range_answer(
            request, "project", project, max(_earliest, latest - 3600), latest, metric, start, end, step, by,
            lambda query, series: metrics_json(scope="project", project=project, query=query, series=series),
        )

    @app.get(
        "/api/v1/nodes/{node}/metrics",
        response_model=MetricsBody,
        responses={**ERRORS, **NOT_FOUND},
        tags=["metrics"],
    )
    async def node_metrics(
        request: Request,
        node: str,
        metric: MetricParam = [],  # noqa: B006
        start: StartParam = None,
        end: EndParam = None,
        step: StepParam = None,
        by: ByParam = None,
    ) -> Response:
        """Time series of every device on one node; needs cluster-wide access; default range: the last hour."""
        check_parameters(request, RANGE_PARAMETERS)
        await guard(request, None)
        if node not in await blocking(store.nodes):
            raise NotFound(f"no GPU node {node!r} in the store")
        _earliest, latest = await store_bounds()
        return await range_answer(
            request, "node", node, max(_earliest, latest - 3600), latest, metric, start, end, step, by,
            lambda query, series: metrics_json(scope="node", node=node, query=query, series=series),
        )

    @app.get(
        "/api/v1/cluster/metrics", response_model=MetricsBody, responses=ERRORS, tags=["metrics"]
    )
    async def cluster_metrics(
        request: Request,
        metric: MetricParam = [],  # noqa: B006
        start: StartParam = None,
        end: EndParam = None,
        step: StepParam = None,
        by: ByParam = None,
    ) -> Response:
        """Time series of the whole cluster; needs cluster-wide access; default range: the last hour."""
        check_parameters(request, RANGE_PARAMETERS)
        await guard(request, None)
        _earliest, latest = await store_bounds()
        return await range_answer(
            request, "cluster", "", max(_earliest, latest - 3600), latest, metric, start, end, step, by,
            lambda query, series: metrics_json(scope="cluster", query=query, series=series),
        )

    add_fleet_routes(app, store, settings.status_interval, guard, blocking, limits)
    add_report_routes(app, store, settings.status_interval, settings.idle_threshold_percent, authorizer, blocking)
    add_queue_routes(app, store, authorizer, blocking)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={k: v for k, v in ERRORS.items() if k != 400},
        tags=["operations"],
    )
    async def prometheus_metrics(request: Request) -> Response:
        """Per-workload and per-project series in the Prometheus text format: every namespace's workloads, so
        it needs `get` on the non-resource URL /metrics (Prometheus' ClusterRole, as for kube-state-metrics)."""
        await require_path(authorizer, bearer_token(request), "/metrics")
        body = await blocking(generate_latest, registry)
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody}}, tags=["operations"])
    async def readyz() -> Health | JSONResponse:
        try:
            await blocking(store.latest_time)
        except Exception as error:
            return error_response(503, "unavailable", f"store not readable: {error}")
        return Health(status="ok")

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.openapi()))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse((STATIC_DIR / "index.html").read_text())

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
