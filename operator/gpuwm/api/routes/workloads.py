"""Workloads: the list, one workload by name (its newest run) or by UID (any run kept), their time series,
and the queue of those waiting for GPUs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from gpuwm.api.auth import User
from gpuwm.api.http import (
    BOOL_PATTERN,
    ERRORS,
    NOT_FOUND,
    ContinueParam,
    NotFound,
    check_parameters,
    is_idle,
)
from gpuwm.api.params import parse_bool
from gpuwm.api.queue import WAITING_PHASES, QueueView, queue_view
from gpuwm.api.routes.context import ApiContext, Caller, CallerOf, Context
from gpuwm.api.routes.ranges import SERIES_ROUTE, RangeParams, RangeTarget, WorkloadRange, answer_range
from gpuwm.api.runs import (
    DEFAULT_PAGE_RUNS,
    MAX_PAGE_RUNS,
    life_of,
    page_of_runs,
    with_failure_reason,
    workload_identity,
    workload_range_json,
    workload_selection,
)
from gpuwm.api.schemas import WorkloadList
from gpuwm.model import WorkloadFigures

router = APIRouter()
#: how a route of one workload's current state is declared
_ONE_WORKLOAD: dict[str, Any] = {"response_model": WorkloadFigures, "responses": {**ERRORS, **NOT_FOUND},
                                 "tags": ["workloads"]}


class Selection(BaseModel):
    """Which workloads a list is of (query parameters): one namespace's, one project's, both, or all."""

    namespace: str | None = Field(default=None, description="Only this namespace.")
    project: str | None = Field(default=None, description="Only this project.")

    async def admit(self, caller: Caller) -> User:
        """The caller, refused (403) a namespace it named and may not read."""
        return await (caller.require([self.namespace]) if self.namespace is not None else caller.authenticate())

    async def readable(self, caller: Caller, user: User, workloads: list[WorkloadFigures]) -> list[WorkloadFigures]:
        """Those of `workloads` in the namespace and project where given, and in namespaces `user` may read (a
        namespace given is one `admit` already required)."""
        chosen = [
            w for w in workloads
            if (self.namespace is None or w.namespace == self.namespace)
            and (self.project is None or w.project == self.project)
        ]
        return chosen if self.namespace is not None else await caller.readable(user, chosen)


@router.get("/api/v1/workloads", response_model=WorkloadList, responses=ERRORS, tags=["workloads"])
async def list_workloads(
    request: Request,
    context: Context,
    caller: CallerOf,
    selection: Annotated[Selection, Query()],
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
    limit: Annotated[
        int | None, Query(description=f"At most this many workloads (1 .. {MAX_PAGE_RUNS}).", ge=1, le=MAX_PAGE_RUNS)
    ] = None,
    continue_: ContinueParam = None,
) -> WorkloadList:
    """Current state of every workload you may read.

    From the embedded store, running workloads' figures are refreshed in turns where more of them run
    than the controller's `storeLatestRowsPerInterval` (1,000): each at most ceil(running / that)
    status intervals old. New, changed-phase and finished workloads are there within one interval.
    """
    check_parameters(request, {"namespace", "project", "idle", "ended", "limit", "continue"}, multi=())
    idle_only = parse_bool("idle", idle) if idle is not None else None
    ended_runs = parse_bool("ended", ended) if ended is not None else None
    page_size = limit if limit is not None else (DEFAULT_PAGE_RUNS if ended_runs else None)
    user = await selection.admit(caller)
    workloads = await context.blocking(context.store.runs if ended_runs else context.store.workloads)
    if ended_runs is False:
        workloads = [w for w in workloads if w.end_time is None]
    if idle_only is not None:
        workloads = [w for w in workloads if is_idle(w) == idle_only]
    chosen = await selection.readable(caller, user, workloads)
    if page_size is None and continue_ is None:
        return WorkloadList(workloads=chosen)
    page, following = page_of_runs(chosen, page_size, continue_)
    return WorkloadList(workloads=page, continue_=following)


async def find_workload(context: ApiContext, namespace: str, name: str) -> WorkloadFigures:
    found = await context.blocking(context.store.workload, namespace, name)
    if found is None:
        raise NotFound(f"no workload {name!r} in namespace {namespace!r} (or it ended before the retention period)")
    return found


async def find_run(context: ApiContext, caller: CallerOf, uid: str) -> WorkloadFigures:
    """The run with `uid` where the caller may read its namespace: an unknown UID and one in a namespace the
    caller may not read get the same 404, so neither UIDs nor their namespaces can be probed."""
    user = await caller.authenticate()
    found = await context.blocking(context.store.workload_by_uid, uid)
    if found is None or not await caller.may_read(user, [found.namespace]):
        raise NotFound(
            f"no workload run with UID {uid!r} in a namespace you may read (or it ended before the retention period)"
        )
    return found


async def answer_workload_range(context: ApiContext, params: RangeParams, workload: WorkloadFigures) -> Response:
    """One run's time series, as both workload paths answer them; the default range is the run's life."""
    identity = workload_identity(workload)
    breakdown, pods, by_rank = workload_selection(identity, params.by, params.leader, params.pod)
    earliest, latest = await context.store_bounds()
    target = RangeTarget(
        "workload", workload.uid, life_of(workload, earliest, latest), workload_range_json(identity, by_rank),
        breakdown, pods,
    )
    return await answer_range(context, params, target)


@router.get("/api/v1/namespaces/{namespace}/workloads/{name}", **_ONE_WORKLOAD)
async def get_workload(
    request: Request, context: Context, caller: CallerOf, namespace: str, name: str
) -> WorkloadFigures:
    """Current state of one workload (a running one's as the workload list says: refreshed in turns
    beyond `storeLatestRowsPerInterval` running workloads)."""
    check_parameters(request, set())
    await caller.require([namespace])
    return with_failure_reason(await find_workload(context, namespace, name))


@router.get("/api/v1/namespaces/{namespace}/workloads/{name}/metrics", **SERIES_ROUTE)
async def workload_metrics(
    context: Context, caller: CallerOf, namespace: str, name: str, params: WorkloadRange
) -> Response:
    """Time series of the newest run of a workload (`/workloads/{uid}/metrics` for any run); the default
    range is the run's whole life."""
    await caller.require([namespace])
    return await answer_workload_range(context, params, await find_workload(context, namespace, name))


@router.get("/api/v1/workloads/{uid}", **_ONE_WORKLOAD)
async def get_run(request: Request, context: Context, caller: CallerOf, uid: str) -> WorkloadFigures:
    """Current state of one run of a workload, by its UID: earlier runs of a reused name too, for as
    long as the store keeps them (`/namespaces/{ns}/workloads/{name}` is always the newest run)."""
    check_parameters(request, set())
    return with_failure_reason(await find_run(context, caller, uid))


@router.get("/api/v1/workloads/{uid}/metrics", **SERIES_ROUTE)
async def run_metrics(context: Context, caller: CallerOf, uid: str, params: WorkloadRange) -> Response:
    """Time series of one run, by its UID; the default range is the run's whole life."""
    return await answer_workload_range(context, params, await find_run(context, caller, uid))


#: its own router only so the OpenAPI document keeps listing it after the report
queue_router = APIRouter()


@queue_router.get("/api/v1/queue", response_model=QueueView, responses=ERRORS, tags=["workloads"])
async def queue(
    request: Request, context: Context, caller: CallerOf, selection: Annotated[Selection, Query()]
) -> QueueView:
    """Queued and pending workloads you may read, longest wait first.

    Queued: held back (`spec.suspend`, `runPolicy.suspend`, a Kueue Workload not admitted); Pending:
    admitted or never suspended, no GPU container running yet. Each carries requestedGpus,
    queuedSeconds, waitSeconds (both count on after a preemption) and its Kueue queues.
    """
    check_parameters(request, {"namespace", "project"}, multi=())
    user = await selection.admit(caller)
    workloads = await context.blocking(context.store.workloads)
    return queue_view(await selection.readable(caller, user, [w for w in workloads if w.phase in WAITING_PHASES]))


