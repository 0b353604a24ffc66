"""HTTP plumbing of the metrics API: documented error bodies, parameter checks, time-series encoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import orjson
from fastapi import Query, Request
from fastapi.responses import JSONResponse, Response

from gpuwm.api.params import BadParameter
from gpuwm.api.schemas import ErrorBody, WorkloadIdentity
from gpuwm.model.figures import WorkloadFigures
from gpuwm.store.base import DEFAULT_METRICS, METRIC_NAMES, RangeQuery, Series

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A bad parameter, named in the body."},
    401: {"model": ErrorBody, "description": "No or invalid bearer token."},
    403: {"model": ErrorBody, "description": "Not allowed to get gpuworkloadmetrics there."},
    429: {
        "model": ErrorBody,
        "description": "Too many heavy queries at once, or too many new tokens from one client; "
        "retry after the Retry-After header's seconds.",
    },
    503: {"model": ErrorBody, "description": "The Kubernetes API could not be asked."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "No such object."}}
RANGE_PARAMETERS = {"metric", "start", "end", "step", "by"}

MetricParam = Annotated[
    list[str],
    Query(
        description=f"Metric name, repeatable or comma-separated; default {', '.join(DEFAULT_METRICS)}. "
        f"Known: {', '.join(METRIC_NAMES)}."
    ),
]
#: what parse_time reads: epoch seconds or milliseconds, or RFC 3339 with a zone (declared so a fuzzer
#: or client generator sends what can be valid; a value that matches may still be out of range: 400)
TIME_PATTERN = (
    r"^\s*([0-9]+(\.[0-9]+)?|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2}))\s*$"
)
#: what parse_step reads: 5s, 1m30s, 250ms or a bare number of seconds
STEP_PATTERN = r"^\s*(([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+|[0-9]+(\.[0-9]+)?)\s*$"
BOOL_PATTERN = r"^\s*(?i:true|false|1|0|yes|no)\s*$"
StartParam = Annotated[
    str | None, Query(description="RFC 3339, epoch seconds or epoch milliseconds.", pattern=TIME_PATTERN)
]
EndParam = Annotated[
    str | None, Query(description="RFC 3339, epoch seconds or epoch milliseconds.", pattern=TIME_PATTERN)
]
StepParam = Annotated[
    str | None,
    Query(
        description="5s, 1m or seconds, from 1 ms; default 15s (coarser if the default range needs it).",
        pattern=STEP_PATTERN,
    ),
]
ByParam = Annotated[str | None, Query(description="Breakdown: gpu, pod or node.", pattern=r"^(gpu|pod|node)$")]


class TooBusy(Exception):
    """429: the API is answering as many heavy queries as it may at once."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        self.message = message
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class NotFound(Exception):
    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def error_response(status: int, error: str, message: str, parameter: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content=ErrorBody(error=error, message=message, parameter=parameter).model_dump()
    )


def check_parameters(request: Request, allowed: set[str], multi: Sequence[str] = ("metric",)) -> None:
    """Refuse unknown and repeated parameters: a typo must not silently give a different answer."""
    for name in request.query_params:
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadParameter(name, f"unknown parameter; this endpoint takes: {known}")
        if name not in multi and len(request.query_params.getlist(name)) > 1:
            raise BadParameter(name, "given more than once")


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def metrics_json(
    scope: str,
    series: list[Series],
    start: float | None = None,
    end: float | None = None,
    step: float | None = None,
    workload: WorkloadIdentity | None = None,
    project: str | None = None,
    node: str | None = None,
    query: RangeQuery | None = None,
) -> Response:
    """A MetricsBody as JSON, encoded by orjson without per-point validation (24 h at 15 s is 5,760 points).

    With `query`, its start, end and step, the step asked for and the resolution of each stretch."""
    if query is not None:
        start, end, step = query.start, query.end, query.step_seconds
    body = {
        "scope": scope,
        "workload": workload.model_dump(by_alias=True) if workload is not None else None,
        "project": project,
        "node": node,
        "start": start,
        "end": end,
        "step": step,
        "requestedStep": query.requested_step_seconds if query is not None else None,
        "resolution": [
            {"start": stretch.start, "end": stretch.end, "step": stretch.step_seconds}
            for stretch in (query.resolution if query is not None else ())
        ],
        "series": [{"metric": s.metric, "labels": s.labels, "points": s.points} for s in series],
    }
    return Response(content=orjson.dumps(body), media_type="application/json")


def is_idle(workload: WorkloadFigures) -> bool:
    """Holds GPUs now and has been idle for a while (its idleSeconds is growing)."""
    return workload.allocated_gpus > 0 and workload.idle_seconds > 0 and workload.end_time is None
