"""The one path of every time-series answer: parameters → guard → query → render.

Each range route takes its parameters through one of the dependencies here (which also refuse unknown
and repeated parameters), checks the caller's access and finds what it is about, then hands a
`RangeTarget` to `answer_range` (a project, a node or the cluster through `answer_scope`): the values are
parsed, the answer's size is checked before the store is read (400 past the limit; a heavy one waits for
one of the few heavy slots), and the read and the encoding run off the event loop.

The answer says which step its values really have: a step finer than the store keeps is answered at the
stored step, and a stretch only a coarser tier still covers says the tier's step (its cells carry that
tier's values, never null where a stored point covers them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from fastapi import Depends, Request
from fastapi.responses import Response

from gpuwm.api.http import (
    ERRORS,
    NOT_FOUND,
    RANGE_PARAMETERS,
    WORKLOAD_RANGE_PARAMETERS,
    AggregationParam,
    ByParam,
    LeaderParam,
    MetricParam,
    PodParam,
    StepParam,
    TimeParam,
    WorkloadByParam,
    check_parameters,
    metrics_json,
)
from gpuwm.api.params import choose_range, parse_breakdown, parse_metrics, parse_step, parse_time
from gpuwm.api.routes.context import ApiContext
from gpuwm.api.schemas import MetricsBody
from gpuwm.store import (
    DEFAULT_METRICS,
    Breakdown,
    RangeQuery,
    Scope,
    Series,
    Store,
    TimeAggregation,
    check_aggregation,
)

#: how a route of one named thing's time series is declared: its body, its errors (404: no such thing), its tag
SERIES_ROUTE: dict[str, Any] = {"response_model": MetricsBody, "responses": {**ERRORS, **NOT_FOUND}, "tags": ["metrics"]}


@dataclass(frozen=True)
class RangeParams:
    """A range route's query parameters as given; parsed by answer_range once the caller may see the answer."""

    metric: list[str]
    start: str | None
    end: str | None
    step: str | None
    by: str | None = None
    pod: list[str] = field(default_factory=list)
    leader: str | None = None
    aggregation: str | None = None


async def range_window(
    metric: MetricParam = [],  # noqa: B006
    start: TimeParam = None,
    end: TimeParam = None,
    step: StepParam = None,
    aggregation: AggregationParam = None,
) -> RangeParams:
    """What every range route takes: the metrics, the range, the step and what each point holds of it."""
    return RangeParams(metric, start, end, step, aggregation=aggregation)


RangeWindow = Annotated[RangeParams, Depends(range_window)]


async def scope_range(request: Request, window: RangeWindow, by: ByParam = None) -> RangeParams:
    """A project's, node's or the cluster's series."""
    check_parameters(request, RANGE_PARAMETERS)
    return dataclasses.replace(window, by=by)


async def device_range(request: Request, window: RangeWindow) -> RangeParams:
    """One GPU's series (one per holder: no breakdown to choose)."""
    check_parameters(request, RANGE_PARAMETERS - {"by"})
    return window


async def workload_range(
    request: Request,
    window: RangeWindow,
    by: WorkloadByParam = None,
    pod: PodParam = [],  # noqa: B006
    leader: LeaderParam = None,
) -> RangeParams:
    """One run's series: by rank too, and of some of its pods."""
    check_parameters(request, WORKLOAD_RANGE_PARAMETERS, multi=("metric", "pod"))
    return dataclasses.replace(window, by=by, pod=pod, leader=leader)


ScopeRange = Annotated[RangeParams, Depends(scope_range)]
DeviceRange = Annotated[RangeParams, Depends(device_range)]
WorkloadRange = Annotated[RangeParams, Depends(workload_range)]


@dataclass(frozen=True)
class RangeTarget:
    """What a range answer is about: the store's scope and key, the default range, the breakdown and
    pods to read, and how the answer is encoded."""

    scope: Scope
    key: str
    default_range: tuple[float, float]
    encode: Callable[[RangeQuery, list[Series]], Response]
    breakdown: Breakdown | None = None
    pods: tuple[str, ...] = ()
    #: the read series to keep (one device of a node): its count is known only after the read
    keep: Callable[[Series], bool] | None = None


def at_stored_resolution(store: Store, step_seconds: float | None) -> tuple[float | None, float | None]:
    """(the step to answer at, the step asked for where they differ): a step finer than the store keeps
    points at is answered at the stored one, not with empty cells between its points."""
    finest = store.finest_step_seconds
    if step_seconds is None or finest is None or step_seconds >= finest:
        return step_seconds, None
    return finest, step_seconds


def fit_resolution(store: Store, query: RangeQuery) -> RangeQuery:
    """`query` with the step the stored points really have where the whole range is coarser than asked
    (a run older than the finest tier: its tier's step), and with the stretches that say so."""
    stretches = store.resolution(query)
    finest = min(stretch.step_seconds for stretch in stretches)
    if finest > query.step_seconds:
        requested = query.requested_step_seconds or query.step_seconds
        query = dataclasses.replace(query, step_seconds=finest, requested_step_seconds=requested)
        stretches = store.resolution(query)
    return dataclasses.replace(query, resolution=tuple(stretches))


async def answer_range(context: ApiContext, params: RangeParams, target: RangeTarget) -> Response:
    """Parse `params`, bound the answer, read it and encode it."""
    store, limits = context.store, context.limits
    names = parse_metrics(params.metric, DEFAULT_METRICS)
    aggregation = cast(TimeAggregation, params.aggregation or "mean")
    check_aggregation(aggregation, names)
    start_s = parse_time("start", params.start) if params.start is not None else None
    end_s = parse_time("end", params.end) if params.end is not None else None
    step_s, requested_step = at_stored_resolution(store, parse_step(params.step) if params.step is not None else None)
    first, last, step_seconds = choose_range(start_s, end_s, step_s, *target.default_range)
    query = RangeQuery(
        target.scope, target.key, names, first, last, step_seconds, target.breakdown, target.pods, requested_step,
        aggregation=aggregation,
    )
    query = await context.blocking(fit_resolution, store, query)
    series_count = None if target.keep is not None else await context.blocking(store.series_count, query)
    async with limits.admit(query, series_count):
        series = await context.blocking(store.query_range, query)
        if target.keep is not None:
            series = [each for each in series if target.keep(each)]
        if series_count is None:
            limits.check_answer(series)
        return await context.blocking(target.encode, query, series)


async def answer_scope(context: ApiContext, params: RangeParams, scope: Scope, key: str = "") -> Response:
    """The series of the project or node `key` names, or the cluster's; default range: the store's last hour."""
    target = RangeTarget(
        scope, key, await context.last_hour(),
        lambda query, series: metrics_json(
            scope=scope, query=query, series=series,
            project=key if scope == "project" else None, node=key if scope == "node" else None,
        ),
        parse_breakdown(params.by),
    )
    return await answer_range(context, params, target)
