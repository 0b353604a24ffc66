"""Runs of a workload: which run an answer is about, its pods in rank order, and pages of runs.

A workload's name can be reused: a Job deleted and created again under the same name is a new run
with a new UID. The name path (`/namespaces/{ns}/workloads/{name}`) and the CR always mean the
newest run; `/workloads/{uid}` reaches any run the store still keeps, and `?ended=true` on the list
names every one of them, page by page, so an earlier run stays reachable for its retention.
The routes are in gpuwm.api.routes.workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fastapi.responses import Response

from gpuwm.api.http import metrics_json
from gpuwm.api.params import BadParameter, decode_continue, encode_continue, parse_bool, parse_breakdown
from gpuwm.api.ranks import rank_pods
from gpuwm.api.schemas import PodIdentity, WorkloadIdentity
from gpuwm.model import WorkloadFigures
from gpuwm.store import Breakdown, RangeQuery, Series

#: runs a page of `?ended=true` holds unless `limit` says otherwise, and the most it may hold
DEFAULT_PAGE_RUNS = 500
MAX_PAGE_RUNS = 5000
#: the fields of a run's identity not copied from its figures as they are
_DERIVED = ("failure_reason", "pods")


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
        **{name: getattr(workload, name) for name in WorkloadIdentity.model_fields if name not in _DERIVED},
        failure_reason=failure_reason(workload),
        pods=[
            PodIdentity(name=pod.name, uid=pod.uid, node=pod.node, phase=pod.phase, rank=ranks[pod.name].rank,
                        role=ranks[pod.name].role or None)
            for pod in sorted(workload.pods, key=lambda pod: ranks[pod.name].rank)
        ],
    )


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
) -> tuple[Breakdown | None, tuple[str, ...], bool]:
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
    return parse_breakdown(by), chosen, False


# -- listing runs ------------------------------------------------------------------------------


def _run_key(workload: WorkloadFigures) -> tuple[str, str, float, str]:
    """Runs in a stable order: by namespace and name, then oldest first (a run's creation never changes)."""
    created = workload.created_time if workload.created_time is not None else workload.start_time
    return workload.namespace, workload.name, created if created is not None else 0.0, workload.uid


def _run_cursor(key: Any) -> tuple[str, str, float, str]:
    """A `continue` token's run: its sort key, as `_run_key` made it."""
    namespace, name, created, uid = key
    return str(namespace), str(name), float(created), str(uid)


def page_of_runs(
    runs: Iterable[WorkloadFigures], limit: int | None, cursor: str | None
) -> tuple[list[WorkloadFigures], str | None]:
    """One page of `runs` in run order after `cursor`, and the token of the next page (None at the end)."""
    ordered = sorted(runs, key=_run_key)
    if cursor is not None:
        after = decode_continue(cursor, _run_cursor)
        ordered = [run for run in ordered if _run_key(run) > after]
    if limit is None or len(ordered) <= limit:
        return ordered, None
    page = ordered[:limit]
    return page, encode_continue(_run_key(page[-1]))  # the opaque token: the last run of the page


def life_of(workload: WorkloadFigures, earliest: float, latest: float) -> tuple[float, float]:
    """A run's default range: its creation (or start) to its end, or to the latest data while it runs."""
    life_start = workload.created_time if workload.created_time is not None else workload.start_time
    life_end = workload.end_time if workload.end_time is not None else latest
    return (life_start if life_start is not None else earliest), life_end
