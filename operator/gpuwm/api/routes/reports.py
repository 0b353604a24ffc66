"""Period reports: GPU-hours, idle, energy and peak allocation per row over a period, as JSON or CSV."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpuwm.api.http import ERRORS, TimeParam, check_parameters
from gpuwm.api.params import BadParameter, parse_time
from gpuwm.api.report import DEFAULT_PERIOD_SECONDS, Report, ReportBy, ReportFormat, build_report, report_csv
from gpuwm.api.routes.context import CallerOf, Context

router = APIRouter()
#: the 200's two forms: the Report as JSON (the response model), or its rows as CSV with format=csv
_CSV: dict[int | str, dict[str, Any]] = {200: {"description": "The report: JSON, or CSV with format=csv.",
              "content": {"text/csv": {"schema": {"type": "string"}}}}}


@router.get("/api/v1/report", response_model=Report, responses={**_CSV, **ERRORS}, tags=["reports"])
async def period_report(
    request: Request,
    context: Context,
    caller: CallerOf,
    start: TimeParam = None,
    end: TimeParam = None,
    by: Annotated[ReportBy | None, Query(description="Rows per project (default), namespace or workload.")] = None,
    format: Annotated[ReportFormat | None, Query(description="json (default) or csv.")] = None,
) -> Response:
    """Allocated, active, idle, unmonitored and wasted GPU-hours, energy, mean utilisation and peak
    allocation per row over start..end (default: the day up to the store's latest time, which it holds), from
    the engine's stored counters; the workloads of namespaces you may read. Periods add up; a row says where
    a figure was apportioned by time (`exact`, `apportionedGpuHours`)."""
    check_parameters(request, {"start", "end", "by", "format"}, multi=())
    chosen_by: ReportBy = by or "project"
    given_start = parse_time("start", start) if start is not None else None
    given_end = parse_time("end", end) if end is not None else None
    if given_start is not None and given_end is not None:
        _check_period(given_start, given_end)
    user = await caller.authenticate()  # and admitted: from here on it reads the store
    store, settings = context.store, context.settings
    latest = await context.blocking(store.latest_time) if given_end is None else None
    end_s = given_end if given_end is not None else (latest if latest is not None else 0.0)
    start_s = given_start if given_start is not None else end_s - DEFAULT_PERIOD_SECONDS
    _check_period(start_s, end_s)
    periods = await context.blocking(store.period, start_s, end_s)
    present = {workload.namespace for workload in periods}
    readable = await caller.readable_namespaces(user, present)
    step = store.finest_step_seconds or settings.status_interval
    report: Report = await context.blocking(
        build_report, store, [workload for workload in periods if workload.namespace in readable], start_s, end_s,
        chosen_by, step, settings.idle_threshold_percent, None if readable == present else frozenset(readable),
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
