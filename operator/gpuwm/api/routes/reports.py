"""Period reports: GPU-hours, idle, energy, cost and peak allocation per row, as JSON, CSV or FOCUS."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpuwm.api.focus import FocusParty, focus_csv
from gpuwm.api.http import ERRORS, TimeParam, check_parameters
from gpuwm.api.params import BadParameter, parse_time
from gpuwm.api.report import DEFAULT_PERIOD_SECONDS, Report, ReportBy, ReportFormat, build_report, report_csv
from gpuwm.api.report_cost import PeriodPricing
from gpuwm.api.routes.context import CallerOf, Context

router = APIRouter()
#: the 200's two forms: the Report as JSON (the response model), or its rows as CSV with format=csv
_CSV: dict[int | str, dict[str, Any]] = {200: {"description": "The report: JSON, or CSV with format=csv or focus.",
              "content": {"text/csv": {"schema": {"type": "string"}}}}}


@router.get("/api/v1/report", response_model=Report, responses={**_CSV, **ERRORS}, tags=["reports"])
async def period_report(
    request: Request,
    context: Context,
    caller: CallerOf,
    start: TimeParam = None,
    end: TimeParam = None,
    by: Annotated[ReportBy | None, Query(description="Rows per project (default), namespace or workload.")] = None,
    format: Annotated[ReportFormat | None, Query(description="json (default), csv, or focus: the FinOps FOCUS "
                                                 "columns, a charge per run (by is workload), with pricing set.")] = None,
) -> Response:
    """Allocated, active, idle, unmonitored and wasted GPU-hours, energy, mean utilisation and peak
    allocation per row over start..end (default: the day up to the store's latest time, which it holds), from
    the engine's stored counters; the workloads of namespaces you may read. Periods add up; a row says where
    a figure was apportioned by time (`exact`, `apportionedGpuHours`). With pricing set: what each row cost
    (its runs' GPU-hours at their prices, plus energy), idle cost apart."""
    check_parameters(request, {"start", "end", "by", "format"}, multi=())
    settings = context.settings
    if format == "focus" and not settings.pricing.enabled:
        raise BadParameter("format", "focus lists charges: set `pricing` (a price per GPU-hour or per kWh) first")
    chosen_by: ReportBy = "workload" if format == "focus" else by or "project"
    given_start = parse_time("start", start) if start is not None else None
    given_end = parse_time("end", end) if end is not None else None
    if given_start is not None and given_end is not None:
        _check_period(given_start, given_end)
    user = await caller.authenticate()  # and admitted: from here on it reads the store
    store = context.store
    latest = await context.blocking(store.latest_time) if given_end is None else None
    end_s = given_end if given_end is not None else (latest if latest is not None else 0.0)
    start_s = given_start if given_start is not None else end_s - DEFAULT_PERIOD_SECONDS
    _check_period(start_s, end_s)
    periods = await context.blocking(store.period, start_s, end_s)
    present = {workload.namespace for workload in periods}
    readable = await caller.readable_namespaces(user, present)
    step = store.finest_step_seconds or settings.status_interval
    visible = [workload for workload in periods if workload.namespace in readable]
    pricing = None
    if settings.pricing.enabled:
        recorded = await context.blocking(store.gpu_hour_prices, [workload.uid for workload in visible], start_s, end_s)
        pricing = PeriodPricing.of(settings.pricing, recorded)
    report: Report = await context.blocking(
        build_report, store, visible, start_s, end_s, chosen_by, step, settings.idle_threshold_percent,
        None if readable == present else frozenset(readable), pricing,
    )
    if format == "focus":
        return Response(
            content=focus_csv(report, settings.pricing.energy_price_per_kwh, FocusParty.of_cluster(settings.cluster_id)),
            media_type="text/csv", headers={"Content-Disposition": 'attachment; filename="gpuwm-focus.csv"'},
        )
    if format == "csv":
        return Response(
            content=report_csv(report), media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="gpuwm-report-{chosen_by}.csv"'},
        )
    return Response(content=report.model_dump_json(by_alias=True), media_type="application/json")


def _check_period(start_s: float, end_s: float) -> None:
    """A period may be empty (end at start: a report of nothing), not reversed."""
    if end_s < start_s:
        raise BadParameter("end", f"is before start ({end_s} < {start_s})")
