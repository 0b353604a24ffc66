"""What operators and their tools read: Prometheus' `/metrics`, the probes, the docs page and the dashboard."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuwm.api.docs import docs_page
from gpuwm.api.http import ERRORS, error_response
from gpuwm.api.routes.context import Context, ScraperOf
from gpuwm.api.schemas import ErrorBody, Health

STATIC_DIR = Path(__file__).parent.parent / "static"

router = APIRouter()


@router.get(
    "/metrics",
    response_class=Response,
    responses={k: v for k, v in ERRORS.items() if k != 400},
    tags=["operations"],
)
async def prometheus_metrics(context: Context, caller: ScraperOf) -> Response:
    """Per-workload and per-project series in the Prometheus text format: every namespace's workloads, so
    it needs `get` on the non-resource URL /metrics (Prometheus' ClusterRole, as for kube-state-metrics).
    Read on a thread of its own: a scrape never waits behind queries."""
    await caller.require_path("/metrics")
    body = await context.aside(context.scrape_limiter, generate_latest, context.registry)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_model=Health, tags=["operations"])
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody}}, tags=["operations"])
async def readyz(context: Context) -> Health | JSONResponse:
    """Ready when the store answers; read on a thread of its own, so however many queries run, the kubelet's
    probe is answered in its time."""
    try:
        await context.aside(context.readiness_limiter, context.store.latest_time)
    except Exception as error:
        return error_response(503, "unavailable", f"store not readable: {error}")
    return Health(status="ok")


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    return HTMLResponse(docs_page(request.app.openapi()))


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse((STATIC_DIR / "index.html").read_text())
