"""Runs by ID and the range answer's real resolution (issue 39).

A workload's name can be reused: a Job deleted and created again under the same name is a new run
with a new UID. The name path (`/namespaces/{ns}/workloads/{name}`) and the CR always mean the
newest run; `/workloads/{uid}` reaches any run the store still keeps, and `?ended=true` on the list
names every one of them, page by page, so an earlier run stays reachable for its retention.

The range answer says which step its values really have: a step finer than the store keeps is
answered at the stored step, and a stretch only a coarser tier still covers says the tier's step
(its cells carry that tier's values, never null where a stored point covers them).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from gpuwm.api.http import (
    BOOL_PATTERN,
    ERRORS,
    NOT_FOUND,
    EndParam,
    MetricParam,
    NotFound,
    StartParam,
    StepParam,
    bearer_token,
    check_parameters,
    metrics_json,
)
from gpuwm.api.params import BadParameter, parse_bool
from gpuwm.api.ranks import rank_pods
from gpuwm.api.schemas import MetricsBody, PodIdentity, WorkloadIdentity
from gpuwm.model.figures import WorkloadFigures
from gpuwm.store.base import RangeQuery, Series, Store

T = TypeVar("T")

#: runs a page of `?ended=true` holds unless `limit` says otherwise, and the most it may hold
DEFAULT_PAGE_RUNS = 500
MAX_PAGE_RUNS = 5000
#: the parameters of a workload's range query: the common ones and `pod`
WORKLOAD_RANGE_PARAMETERS = {"metric", "start", "end", "step", "by", "pod", "leader"}

PodParam = Annotated[
    list[str],
    Query(
        description="Only this pod of the workload (by name), repeatable: one series per pod "
        "(with by=gpu, one per GPU of those pods). A name the workload never had is refused (400)."
    ),
]


WorkloadByParam = Annotated[
    str | None,
    Query(
        description="Breakdown: gpu, pod, node or rank (the pods' series in rank order: the leader role, then "
        "workers by index; every pod series carries its `rank`).",
        pattern=r"^(gpu|pod|node|rank)$",
    ),
]
LeaderParam = Annotated[
    str | None,
    Query(description="true: only the leader's series (rank 0: master, chief, launcher or head, else the lowest "
          "index).", pattern=BOOL_PATTERN),
]


class RangeAnswer(Protocol):
    """app.create_app's range_answer, as the routes here call it."""

    def __call__(
        self,
        request: Request,
        scope: Any,
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
    ) -> Awaitable[Response]: ...


def failure_reason(workload: WorkloadFigures) -> str | None:
    """Why the run failed: its object's Failed condition message (a Job's BackoffLimitExceeded names what no
    pod can), else the first failed pod's reason (its container's exit, an eviction); None where none is known."""
    if workload.failure_reason:
        return workload.failure_reason
    return next((pod.failure_reason for pod in workload.pods if pod.failure_reason), None)


def with_failure_reason(workload: WorkloadFigures) -> WorkloadFigures:
    """`workload` as the API answers it: its `failureReason` falls back to a failed pod's."""
    reason = failure_reason(workload)
    return workload if reason == workload.failure_reason else workload.model_copy(update={"failure_reason": reason})


def workload_identity(workload: WorkloadFigures) -> WorkloadIdentity:
    """What a workload's range answer says about the run: which one, its phase, life and pods (in rank order)."""
    ranks = {
        rank.pod: rank
        for rank in rank_pods(workload.name, [pod.name for pod in workload.pods],
                              {pod.name: pod.labels for pod in workload.pods})
    }
    return WorkloadIdentity(
        namespace=workload.namespace,
        name=workload.name,
        uid=workload.uid,
        kind=workload.kind,
        project=workload.project,
        phase=workload.phase,
        created_time=workload.created_time,
        start_time=workload.start_time,
        end_time=workload.end_time,
        failure_reason=failure_reason(workload),
        pods=[
            PodIdentity(name=pod.name, uid=pod.uid, node=pod.node, phase=pod.phase, rank=ranks[pod.name].rank,
                        role=ranks[pod.name].role or None)
            for pod in sorted(workload.pods, key=lambda pod: ranks[pod.name].rank)
        ],
    )


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


def workload_range_json(
    identity: WorkloadIdentity, by_rank: bool = False
) -> Callable[[RangeQuery, list[Series]], Response]:
    """The encoder of a workload's range answer: each pod series labelled with its pod's rank (by=rank: in
    rank order)."""
    ranks = {pod.name: pod.rank for pod in identity.pods if pod.rank is not None}

    def encode(query: RangeQuery, series: list[Series]) -> Response:
        for each in series:
            rank = ranks.get(each.labels.get("pod", ""))
            if rank is not None:
                each.labels["rank"] = str(rank)
        if by_rank:
            series = sorted(series, key=lambda each: ranks.get(each.labels.get("pod", ""), len(ranks)))
        return metrics_json(scope="workload", workload=identity, query=query, series=series)

    return encode


def workload_selection(
    identity: WorkloadIdentity, by: str | None, leader: str | None, pods: Sequence[str]
) -> tuple[str | None, tuple[str, ...], bool]:
    """(the store's breakdown, the pods asked for, whether in rank order) for `by`, `leader` and `pod`."""
    chosen = tuple(pods)
    if leader is not None and parse_bool("leader", leader):
        if chosen:
            raise BadParameter("leader", "selects the leader's pod; give either leader=true or pod=, not both")
        if not identity.pods:
            raise BadParameter("leader", f"workload {identity.name!r} has no pods to lead")
        chosen = (identity.pods[0].name,)
    if by == "rank":
        return "pod", chosen, True
    return by, chosen, False


# -- listing runs ------------------------------------------------------------------------------


def _run_key(workload: WorkloadFigures) -> tuple[str, str, float, str]:
    """Runs in a stable order: by namespace and name, then oldest first (a run's creation never changes)."""
    created = workload.created_time if workload.created_time is not None else workload.start_time
    return workload.namespace, workload.name, created if created is not None else 0.0, workload.uid


def encode_cursor(workload: WorkloadFigures) -> str:
    """The opaque `continue` token: the last run of a page, as its sort key."""
    return base64.urlsafe_b64encode(json.dumps(list(_run_key(workload))).encode()).decode().rstrip("=")


def decode_cursor(token: str) -> tuple[str, str, float, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        namespace, name, created, uid = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return str(namespace), str(name), float(created), str(uid)
    except (ValueError, TypeError, binascii.Error):
        raise BadParameter(
            "continue", f"{token[:40]!r} is not a token this API gave; pass the `continue` of the previous page"
        ) from None


def parse_limit(text: str | None, default: int | None) -> int | None:
    if text is None:
        return default
    try:
        limit = int(text.strip())
    except ValueError:
        raise BadParameter("limit", f"{text[:40]!r} is not a whole number") from None
    if not 1 <= limit <= MAX_PAGE_RUNS:
        raise BadParameter("limit", f"{limit} is outside 1 .. {MAX_PAGE_RUNS}")
    return limit


def page_of_runs(
    runs: Iterable[WorkloadFigures], limit: int | None, cursor: str | None
) -> tuple[list[WorkloadFigures], str | None]:
    """One page of `runs` in run order after `cursor`, and the token of the next page (None at the end)."""
    ordered = sorted(runs, key=_run_key)
    if cursor is not None:
        after = decode_cursor(cursor)
        ordered = [run for run in ordered if _run_key(run) > after]
    if limit is None or len(ordered) <= limit:
        return ordered, None
    page = ordered[:limit]
    return page, encode_cursor(page[-1])


# -- routes -------------------------------------------------------------------------------------


def add_run_routes(
    app: FastAPI,
    store: Store,
    blocking: Callable[..., Awaitable[Any]],
    guard: Callable[[Request, Sequence[str] | None], Awaitable[None]],
    authenticate: Callable[[str | None], Awaitable[object]],
    store_bounds: Callable[[], Awaitable[tuple[float, float]]],
    range_answer: RangeAnswer,
) -> None:
    """`GET /api/v1/workloads/{uid}` and `…/{uid}/metrics`: any run the store keeps, by its UID."""

    async def find_run(request: Request, uid: str) -> WorkloadFigures:
        found: WorkloadFigures | None = await blocking(store.workload_by_uid, uid)
        if found is None:
            await authenticate(bearer_token(request))  # an unauthenticated caller learns nothing
            raise NotFound(f"no workload run with UID {uid!r} (or it ended before the retention period)")
        await guard(request, [found.namespace])
        return found

    @app.get(
        "/api/v1/workloads/{uid}",
        response_model=WorkloadFigures,
        responses={**ERRORS, **NOT_FOUND},
        tags=["workloads"],
    )
    async def get_run(request: Request, uid: str) -> WorkloadFigures:
        """Current state of one run of a workload, by its UID: earlier runs of a reused name too, for as
        long as the store keeps them (`/namespaces/{ns}/workloads/{name}` is always the newest run)."""
        check_parameters(request, set())
        return with_failure_reason(await find_run(request, uid))

    @app.get(
        "/api/v1/workloads/{uid}/metrics",
        response_model=MetricsBody,
        responses={**ERRORS, **NOT_FOUND},
        tags=["metrics"],
    )
    async def run_metrics(
        request: Request,
        uid: str,
        metric: MetricParam = [],  # noqa: B006
        start: StartParam = None,
        end: EndParam = None,
        step: StepParam = None,
        by: WorkloadByParam = None,
        pod: PodParam = [],  # noqa: B006
        leader: LeaderParam = None,
    ) -> Response:
        """Time series of one run, by its UID; the default range is the run's whole life."""
        check_parameters(request, WORKLOAD_RANGE_PARAMETERS, multi=("metric", "pod"))
        workload = await find_run(request, uid)
        return await workload_range(request, workload, metric, start, end, step, by, pod, leader,
                                    store_bounds, range_answer)


async def workload_range(
    request: Request, workload: WorkloadFigures, metric: list[str], start: str | None, end: str | None,
    step: str | None, by: str | None, pod: list[str], leader: str | None,
    store_bounds: Callable[[], Awaitable[tuple[float, float]]], range_answer: RangeAnswer,
) -> Response:
    """One run's time series, as both workload paths answer them (by name: the newest run; by UID: any)."""
    identity = workload_identity(workload)
    breakdown, pods, by_rank = workload_selection(identity, by, leader, pod)
    earliest, latest = await store_bounds()
    return await range_answer(
        request, "workload", workload.uid, *life_of(workload, earliest, latest), metric, start, end, step,
        breakdown, workload_range_json(identity, by_rank), pods=pods, allowed=WORKLOAD_RANGE_PARAMETERS,
    )


def life_of(workload: WorkloadFigures, earliest: float, latest: float) -> tuple[float, float]:
    """A run's default range: its creation (or start) to its end, or to the latest data while it runs."""
    life_start = workload.created_time if workload.created_time is not None else workload.start_time
    life_end = workload.end_time if workload.end_time is not None else latest
    return (life_start if life_start is not None else earliest), life_end
