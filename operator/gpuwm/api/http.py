"""HTTP plumbing of the metrics API: documented error bodies and their handlers, the query parameters'
declared forms, parameter checks, time-series encoding."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any

import orjson
from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import StringConstraints

from gpuwm.api.auth import AuthError, current_client
from gpuwm.api.params import (
    STEP_PATTERN,
    TIME_PATTERN,
    BadParameter,
    parse_bool,
    parse_metrics,
    parse_step,
    parse_time,
)
from gpuwm.api.schemas import ErrorBody, WorkloadIdentity
from gpuwm.model import WorkloadFigures
from gpuwm.store import (
    DEFAULT_METRICS,
    EXTREMES_METRIC_NAMES,
    METRIC_NAMES,
    TIME_AGGREGATIONS,
    QueryError,
    RangeQuery,
    Series,
    StoreError,
)

log = logging.getLogger(__name__)

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A bad parameter, named in the body."},
    401: {"model": ErrorBody, "description": "No or invalid bearer token."},
    403: {"model": ErrorBody, "description": "Not allowed to get gpuworkloadmetrics there."},
    429: {
        "model": ErrorBody,
        "description": "The query got no turn within apiQueryQueueSeconds (or its user has too many waiting), "
        "or too many new tokens: retry after the Retry-After header's seconds.",
    },
    503: {"model": ErrorBody, "description": "The Kubernetes API could not be asked."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "No such object."}}
RANGE_PARAMETERS = {"metric", "start", "end", "step", "by", "aggregation"}
#: the parameters of a workload's range query: the common ones, `pod` and `leader`
WORKLOAD_RANGE_PARAMETERS = {*RANGE_PARAMETERS, "pod", "leader"}

# -- the declared forms: each pattern is what its parser reads, so a value that matches is one the parser
# takes (times and steps: gpuwm.api.params, beside their parsers); what no pattern can state, a rule across
# parameters (end before start, the answer's size) or what the server gave (a `continue` token), is a 400
# naming the parameter

_METRIC_NAME = f"(gpuwm_)?({'|'.join(METRIC_NAMES)})"
#: one or more metric names, comma-separated (spaces around the commas allowed), `gpuwm_` prefix optional
METRIC_PATTERN = rf"^ *{_METRIC_NAME} *(, *{_METRIC_NAME} *)*$"
BOOL_PATTERN = r"^\s*(?i:true|false|1|0|yes|no)\s*$"
BY_PATTERN = r"^(gpu|pod|node)$"
AGGREGATION_PATTERN = rf"^({'|'.join(TIME_AGGREGATIONS)})$"
WORKLOAD_BY_PATTERN = r"^(gpu|pod|node|rank)$"
#: the alphabet of the `continue` tokens the API gives (URL-safe base64 without padding)
CONTINUE_PATTERN = r"^[A-Za-z0-9_-]{1,4096}$"
#: how a refusal by each pattern describes what it wanted
PATTERN_FORMS = {
    METRIC_PATTERN: f"a metric name (comma-separated names allowed); known: {', '.join(METRIC_NAMES)}",
    TIME_PATTERN: "RFC 3339 (2026-11-22T10:00:00Z), epoch seconds or epoch milliseconds",
    STEP_PATTERN: "a duration such as 5s, 1m or 30 (seconds), not zero",
    BOOL_PATTERN: "true or false",
    BY_PATTERN: "one of gpu, pod, node",
    AGGREGATION_PATTERN: f"one of {', '.join(TIME_AGGREGATIONS)}",
    WORKLOAD_BY_PATTERN: "one of gpu, pod, node, rank",
    CONTINUE_PATTERN: "a `continue` token this API gave (pass the previous page's)",
}

MetricParam = Annotated[
    list[Annotated[str, StringConstraints(pattern=METRIC_PATTERN)]],
    Query(
        description=f"Metric name, repeatable or comma-separated; default {', '.join(DEFAULT_METRICS)}. "
        f"Known: {', '.join(METRIC_NAMES)}."
    ),
]
#: `start` and `end`
TimeParam = Annotated[
    str | None, Query(description="RFC 3339, epoch seconds or epoch milliseconds.", pattern=TIME_PATTERN)
]
StepParam = Annotated[
    str | None,
    Query(
        description="5s, 1m or seconds, from 1 ms; default 15s (coarser if the default range needs it).",
        pattern=STEP_PATTERN,
    ),
]
ByParam = Annotated[str | None, Query(description="Breakdown: gpu, pod or node.", pattern=BY_PATTERN)]
AggregationParam = Annotated[
    str | None,
    Query(
        description="What each point holds of the values in [t, t + step): mean (the default), min or max. Min "
        f"and max are kept for {', '.join(EXTREMES_METRIC_NAMES)} only (where a coarser roll-up tier answers, its "
        "buckets' own min and max); of another gauge, whose roll-ups keep the mean only, they are refused (400). "
        "A counter's, a peak's or an engine figure's points are its largest (latest) value with mean and max "
        "alike; min of one is refused (400).",
        pattern=AGGREGATION_PATTERN,
    ),
]
WorkloadByParam = Annotated[
    str | None,
    Query(
        description="Breakdown: gpu, pod, node or rank (the pods' series in rank order: the leader role, then "
        "workers by index; every pod series carries its `rank`).",
        pattern=WORKLOAD_BY_PATTERN,
    ),
]
PodParam = Annotated[
    list[str],
    Query(
        description="Only this pod of the workload (by name), repeatable: one series per pod "
        "(with by=gpu, one per GPU of those pods). A name the workload never had is refused (400)."
    ),
]
#: a list's next page (`continue` is a Python keyword, hence the alias)
ContinueParam = Annotated[
    str | None,
    Query(alias="continue", description="The previous page's `continue`: the next page.", pattern=CONTINUE_PATTERN),
]
LeaderParam = Annotated[
    str | None,
    Query(description="true: only the leader's series (rank 0: master, chief, launcher or head, else the lowest "
          "index).", pattern=BOOL_PATTERN),
]


class TooBusy(Exception):
    """429: the API is answering as many heavy queries as it may at once."""

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        self.message = message
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


class NotFound(Exception):
    """404, with the message as its body's."""


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
    query: RangeQuery,
    workload: WorkloadIdentity | None = None,
    project: str | None = None,
    node: str | None = None,
) -> Response:
    """A MetricsBody as JSON, encoded by orjson without per-point validation (24 h at 15 s is 5,760 points):
    the query's start, end and step, the step asked for and the resolution of each stretch."""
    body = {
        "scope": scope,
        "workload": workload.model_dump(by_alias=True) if workload is not None else None,
        "project": project,
        "node": node,
        "start": query.start,
        "end": query.end,
        "step": query.step_seconds,
        "stepSeconds": max((stretch.step_seconds for stretch in query.resolution), default=query.step_seconds),
        "requestedStep": query.requested_step_seconds,
        "aggregation": query.aggregation,
        "resolution": [
            {"start": stretch.start, "end": stretch.end, "step": stretch.step_seconds, "tier": stretch.tier}
            for stretch in query.resolution
        ],
        "series": [{"metric": s.metric, "labels": s.labels, "points": s.points} for s in series],
    }
    return Response(content=orjson.dumps(body), media_type="application/json")


def is_idle(workload: WorkloadFigures) -> bool:
    """Holds GPUs now and has been idle for a while (its idleSeconds is growing)."""
    return workload.allocated_gpus > 0 and workload.idle_seconds > 0 and workload.end_time is None


# -- error handlers: every refusal as an ErrorBody ---------------------------------------------------


#: the parser behind each pattern: a value the pattern refuses gets the parser's own words where it has some
_PARSERS: dict[str, Callable[[str, str], object]] = {
    METRIC_PATTERN: lambda _name, value: parse_metrics([value], ()),
    TIME_PATTERN: parse_time,
    STEP_PATTERN: lambda _name, value: parse_step(value),
    BOOL_PATTERN: parse_bool,
}


def _refusal(parameter: str, error: dict[str, Any]) -> str:
    """What a declared form refused, in the words the parsers use for the same mistakes."""
    kind, context, value = error.get("type"), error.get("ctx") or {}, str(error.get("input"))
    given = value[:80]
    if kind == "string_pattern_mismatch" and context.get("pattern") in PATTERN_FORMS:
        parser = _PARSERS.get(context["pattern"])
        if parser is not None and len(value) <= 80:
            try:
                parser(parameter, value)
            except BadParameter as refused:
                return refused.message
        return f"{given!r} is not {PATTERN_FORMS[context['pattern']]}"
    if kind in ("literal_error", "enum"):
        choices = str(context.get("expected", "")).replace("'", "").replace(" or ", ", ")
        return f"{given!r} is not one of {choices}"
    if kind == "int_parsing":
        return f"{given!r} is not a whole number"
    if kind == "greater_than_equal":
        return f"{given} is below {context.get('ge')}"
    if kind == "less_than_equal":
        return f"{given} is above {context.get('le')}"
    return str(error.get("msg", "invalid"))


async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    location = [str(part) for part in first.get("loc", ())]
    # ("query", name) or ("query", name, item) for one value of a repeated parameter
    parameter = location[1] if len(location) > 1 else (location[-1] if location else "")
    return error_response(400, "bad_parameter", f"{parameter}: {_refusal(parameter, first)}", parameter)


async def _bad_parameter(_request: Request, error: BadParameter | QueryError) -> JSONResponse:
    return error_response(400, "bad_parameter", str(error), error.parameter)


async def _denied(_request: Request, error: AuthError) -> JSONResponse:
    kind = {401: "unauthorized", 403: "forbidden", 429: "too_many_requests"}.get(error.status, "unavailable")
    response = error_response(error.status, kind, error.message)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="gpuwm"'
    if error.retry_after_seconds is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_seconds)))
    return response


async def _too_busy(_request: Request, error: TooBusy) -> JSONResponse:
    response = error_response(429, "too_many_requests", error.message)
    response.headers["Retry-After"] = str(error.retry_after_seconds)
    return response


async def _store_failed(_request: Request, error: StoreError) -> JSONResponse:
    log.error("store query failed: %s", error)
    return error_response(503, "unavailable", str(error))


async def _not_found(_request: Request, error: NotFound) -> JSONResponse:
    return error_response(404, "not_found", str(error))


#: FastAPI(exception_handlers=...): each exception the routes raise, as the status and body it means
ERROR_HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    BadParameter: _bad_parameter,
    QueryError: _bad_parameter,
    RequestValidationError: _invalid,
    AuthError: _denied,
    TooBusy: _too_busy,
    StoreError: _store_failed,
    NotFound: _not_found,
}


async def remember_client(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Review calls are rate-limited per client address (gpuwm.api.auth.current_client)."""
    current_client.set(request.client.host if request.client is not None else "")
    return await call_next(request)
