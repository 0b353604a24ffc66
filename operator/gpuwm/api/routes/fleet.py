"""The fleet: every GPU node and device now, and the series of a node, a device or the whole cluster;
all need cluster-wide access."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpuwm.api.fleet import (
    GPU_STATES,
    MAX_PAGE_ITEMS,
    GpuList,
    GpuState,
    NodeList,
    find_gpu,
    page_of_gpus,
    page_of_nodes,
)
from gpuwm.api.http import ERRORS, NOT_FOUND, ContinueParam, NotFound, check_parameters, metrics_json
from gpuwm.api.routes.context import CallerOf, Context
from gpuwm.api.routes.ranges import (
    SERIES_ROUTE,
    DeviceRange,
    RangeTarget,
    ScopeRange,
    answer_range,
    answer_scope,
)
from gpuwm.api.schemas import MetricsBody

router = APIRouter()


@router.get("/api/v1/nodes/{node}/metrics", **SERIES_ROUTE)
async def node_metrics(context: Context, caller: CallerOf, node: str, params: ScopeRange) -> Response:
    """Time series of every device on one node; needs cluster-wide access; default range: the last hour."""
    await caller.require(None)
    if node not in await context.blocking(context.store.nodes):
        raise NotFound(f"no GPU node {node!r} in the store")
    return await answer_scope(context, params, "node", node)


@router.get("/api/v1/cluster/metrics", response_model=MetricsBody, responses=ERRORS, tags=["metrics"])
async def cluster_metrics(context: Context, caller: CallerOf, params: ScopeRange) -> Response:
    """Time series of the whole cluster; needs cluster-wide access; default range: the last hour."""
    await caller.require(None)
    return await answer_scope(context, params, "cluster")


Limit = Annotated[
    int | None, Query(description=f"At most this many (1 .. {MAX_PAGE_ITEMS}); unset: all.", ge=1, le=MAX_PAGE_ITEMS)
]


@router.get("/api/v1/nodes", response_model=NodeList, responses=ERRORS, tags=["fleet"])
async def list_nodes(
    request: Request, context: Context, caller: CallerOf, limit: Limit = None, continue_: ContinueParam = None
) -> NodeList:
    """Every GPU node now: its devices per state, units held and free, models; needs cluster-wide access.
    Paged by name with `limit` and `continue`."""
    check_parameters(request, {"limit", "continue"}, multi=())
    await caller.require(None)
    return await context.blocking(page_of_nodes, context.store, context.settings.status_interval, limit, continue_)


@router.get("/api/v1/gpus", response_model=GpuList, responses=ERRORS, tags=["fleet"])
async def list_gpus(
    request: Request,
    context: Context,
    caller: CallerOf,
    node: Annotated[str | None, Query(description="Only this node's devices.")] = None,
    state: Annotated[GpuState | None, Query(description=f"Only devices in this state: {', '.join(GPU_STATES)}.")] = None,
    limit: Limit = None,
    continue_: ContinueParam = None,
) -> GpuList:
    """Every device now: model, units, MIG layout (`parentUuid`, `migProfile`, `migParent`), holders, state
    (active, idle-held, allocated-empty, free, unhealthy, unmonitored) and latest sample; cluster-wide access.
    Paged by node and index with `limit` and `continue`."""
    check_parameters(request, {"node", "state", "limit", "continue"}, multi=())
    await caller.require(None)
    return await context.blocking(
        page_of_gpus, context.store, context.settings.status_interval, node, state, limit, continue_
    )


@router.get("/api/v1/gpus/{uuid}/metrics", response_model=None, responses={**ERRORS, **NOT_FOUND}, tags=["metrics"])
async def gpu_metrics(context: Context, caller: CallerOf, uuid: str, params: DeviceRange) -> Response:
    """Time series of one device, one series per holder over the range (and the device as nobody held
    it, `pod` empty); default range: the last hour."""
    await caller.require(None)
    found = await context.blocking(find_gpu, context.store, context.settings.status_interval, uuid)
    if found is None:
        raise NotFound(f"no GPU {uuid!r} seen in the store's latest intervals (GET /api/v1/gpus lists them)")
    target = RangeTarget(
        "node", found.node, await context.last_hour(),
        lambda query, series: metrics_json(scope="gpu", node=found.node, query=query, series=series),
        "gpu", keep=lambda series: series.labels.get("uuid") == uuid,
    )
    return await answer_range(context, params, target)
