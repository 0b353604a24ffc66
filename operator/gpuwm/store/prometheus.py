"""The Prometheus store: read-only, each API query translated into PromQL.

Series it reads (Prometheus, Thanos, Mimir or VictoriaMetrics behind the same PromQL):
  agent       gpuwm_gpu_<metric>{node, gpu, uuid, model, mig_profile, namespace, pod, container},
              gpuwm_gpu_energy_joules_total, gpuwm_gpu_allocated, gpuwm_<pod metric>{node, namespace, pod}
  controller  gpuwm_workload_info, gpuwm_workload_pod_info{namespace, pod, workload, workload_uid, project, node},
              gpuwm_workload_failure_info{..., reason},
              gpuwm_workload_*, gpuwm_project_*, gpuwm_pod_<spec figure>{namespace, pod, node}
              (see gpuwm.api.prom_metrics)
Workload and project scopes join the agent's series on (namespace, pod) with
gpuwm_workload_pod_info. A point at t is PromQL's value at t (the latest sample within
the lookback), not the mean over [t, t+step) that the embedded store returns.
`record` is refused: Prometheus is written by scraping, not by gpuwm. Queries go by POST, so a long one
(a workload's pods, a group's workloads) has no URL length to stay under. Periods come from the controller's
counters (store/prometheus_periods.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from gpuwm.model import (
    STORED,
    ClusterFigures,
    PodFigures,
    PodResources,
    ProjectFigures,
    Source,
    Windows,
    WorkloadFigures,
)
from gpuwm.store.base import (
    MAX_SERIES_PER_QUERY,
    GpuHourPrice,
    QueryError,
    RangeQuery,
    ReadOnlyStoreError,
    Series,
    Store,
    StoreError,
    WorkloadGroup,
    WorkloadPeriod,
    check_range,
)
from gpuwm.store.prometheus_periods import PromPeriodReader, read_group_peaks, read_period, read_prices
from gpuwm.store.promql import _POD_SERIES, KEY_LABEL, promql, quote, scope_labels

#: the controller's gpuwm_workload_<gauge> series a workload's figures are read from
_WORKLOAD_GAUGES = (
    "allocated_gpus",
    "idle_gpus",
    "utilization_percent",
    "utilization_avg1h_percent",
    "memory_utilization_percent",
    "idle_seconds",
    "last_active_timestamp_seconds",
    "wait_seconds",
    "run_seconds",
    "allocated_gpu_seconds_total",
    "active_gpu_seconds_total",
    "idle_gpu_seconds_total",
    "unmonitored_gpu_seconds_total",
    "energy_joules_total",
    "created_timestamp_seconds",
    "start_timestamp_seconds",
    "end_timestamp_seconds",
    "queued_seconds",
    "requested_gpus",
)
#: the PodResources fields the controller exports as gpuwm_pod_<field>
_SPEC_FIELDS = tuple(str(metric.field) for metric in STORED if metric.source is Source.POD_SPEC)


def latest_by_workload_promql(series: str, window_seconds: int) -> str:
    """Every workload's latest value of a per-pod series (the agent's kubelet figures, the controller's pod
    specs) in the last `window_seconds`, summed over its pods (label workload_uid): one query for all of them.
    A pod whose (namespace, name) two runs share in the window (a StatefulSet recreated) counts for one of
    them, so the join stays one-to-one."""
    used = f"sum by (namespace, pod) (last_over_time({series}[{window_seconds}s]))"
    info = (
        "topk by (namespace, pod) (1, max by (namespace, pod, workload_uid) "
        f"(last_over_time(gpuwm_workload_pod_info[{window_seconds}s])))"
    )
    return f"sum by (workload_uid) ({used} * on (namespace, pod) group_left (workload_uid) {info})"


def _finite(item: dict[str, Any]) -> float | None:
    """An instant query item's value, None where it is NaN or infinite (no figure)."""
    value = float(item["value"][1])
    return value if math.isfinite(value) else None


def _cumulative_figures(value: Callable[..., float | None]) -> dict[str, Any]:
    """GPU-second counters, energy and utilisation, as the controller exports them for a workload or a project."""
    return {
        "allocated_gpu_seconds": value("allocated_gpu_seconds_total") or 0.0,
        "active_gpu_seconds": value("active_gpu_seconds_total") or 0.0,
        "idle_gpu_seconds": value("idle_gpu_seconds_total") or 0.0,
        "unmonitored_gpu_seconds": value("unmonitored_gpu_seconds_total") or 0.0,
        "energy_joules": value("energy_joules_total") or 0.0,
        "utilization": Windows(
            current=value("utilization_percent", None), avg1h=value("utilization_avg1h_percent", None)
        ),
        "memory_utilization": Windows(current=value("memory_utilization_percent", None)),
    }


def _workload_figures(
    labels: Mapping[str, str], gauges: Mapping[str, Mapping[str, float]], pods: Mapping[str, list[PodFigures]],
    reasons: Mapping[str, str | None],
) -> WorkloadFigures:
    """One workload's figures: its gpuwm_workload_info `labels`, and its gauges, pods and failure reason by UID."""
    uid = labels.get("workload_uid", "")

    def value(name: str, default: float | None = 0.0) -> float | None:
        return gauges[name].get(uid, default)

    return WorkloadFigures(
        uid=uid,
        namespace=labels.get("namespace", ""),
        name=labels.get("workload", ""),
        kind=labels.get("kind", ""),
        api_version="",
        project=labels.get("project", ""),
        phase=labels.get("phase", ""),
        allocated_gpus=value("allocated_gpus") or 0.0,
        idle_gpus=value("idle_gpus") or 0.0,
        idle_seconds=value("idle_seconds") or 0.0,
        last_active_time=value("last_active_timestamp_seconds", None),
        wait_seconds=value("wait_seconds") or 0.0,
        run_seconds=value("run_seconds") or 0.0,
        queued_seconds=value("queued_seconds") or 0.0,
        requested_gpus=value("requested_gpus", None),  # absent: its object is not watched
        **_cumulative_figures(value),
        created_time=value("created_timestamp_seconds", None),
        start_time=value("start_timestamp_seconds", None),
        end_time=value("end_timestamp_seconds", None),
        pods=pods.get(uid, []),
        nodes=sorted({pod.node for pod in pods.get(uid, []) if pod.node}),
        failure_reason=reasons.get(uid),
    )


class PrometheusStore(Store):
    """Read-only store over a Prometheus-compatible HTTP API."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float = 30.0,
        headers: dict[str, str] | None = None,
        evaluation_time: float | None = None,
        scrape_interval_seconds: float = 15.0,
    ) -> None:
        """`evaluation_time`: read the latest state as of this epoch time instead of now (replays, tests);
        `scrape_interval_seconds`: how often the controller is scraped (a group's units are summed at each)."""
        self.url = url.rstrip("/")
        self.evaluation_time = evaluation_time
        self.scrape_interval_seconds = scrape_interval_seconds
        self._timeout = timeout_seconds
        self._client = PrometheusConnect(url=self.url, headers=headers, timeout=math.ceil(timeout_seconds),
                                         method="POST")

    def record(self, *_arguments: object, **_keywords: object) -> None:
        """Refused whatever the figures: Prometheus is written by scraping."""
        raise ReadOnlyStoreError(
            f"store {self.url} is Prometheus, which is read-only for gpuwm (it scrapes /metrics); "
            "use a file path for --store on the controller to keep history itself"
        )

    # -- HTTP ---------------------------------------------------------------------------------

    def _instant(self, query: str, at: float | None = None) -> list[dict[str, Any]]:
        """`query` at `at` (default: the evaluation time, or Prometheus' now)."""
        at = self.evaluation_time if at is None else at
        return self._ask(query, self._client.custom_query, params={"time": repr(at)} if at is not None else None)

    def _range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        # nocache: VictoriaMetrics otherwise moves a long answer's points onto multiples of the step
        return self._ask(
            query, self._client.custom_query_range, start_time=datetime.fromtimestamp(start, UTC),
            end_time=datetime.fromtimestamp(end, UTC), step=repr(step), params={"nocache": "1"},
        )

    def _ask(self, query: str, call: Callable[..., Any], **arguments: Any) -> list[dict[str, Any]]:
        try:
            result: list[dict[str, Any]] = call(query, **arguments)
        except (PrometheusApiClientException, OSError, ValueError, OverflowError) as error:
            raise StoreError(f"Prometheus at {self.url} failed the query {query!r}: {error}") from None
        return result

    def _values(self, query: str, key_label: str) -> dict[str, float]:
        return {item["metric"].get(key_label, ""): value
                for item in self._instant(query) if (value := _finite(item)) is not None}

    # -- latest state -------------------------------------------------------------------------

    def workloads(self) -> list[WorkloadFigures]:
        return self._workloads("")

    def _workloads(self, selector: str) -> list[WorkloadFigures]:
        """The workloads `selector` picks of gpuwm_workload_info, each with its gauges, pods and failure reason."""
        infos = self._instant(
            f"max by (namespace, workload, workload_uid, kind, project, phase) (gpuwm_workload_info{selector})"
        )
        if not infos:
            return []
        gauges = {
            name: self._values(f"max by (workload_uid) (gpuwm_workload_{name}{selector})", "workload_uid")
            for name in _WORKLOAD_GAUGES
        }
        reasons = {
            item["metric"].get("workload_uid", ""): item["metric"].get("reason") or None
            for item in self._instant(f"max by (workload_uid, reason) (gpuwm_workload_failure_info{selector})")
        }
        pods = self._workload_pods(selector)
        return sorted((_workload_figures(item["metric"], gauges, pods, reasons) for item in infos),
                      key=lambda w: (w.namespace, w.name))

    def _workload_pods(self, selector: str) -> dict[str, list[PodFigures]]:
        """Each workload's running pods by its UID, from gpuwm_workload_pod_info, with their spec resources."""
        specs = self._pod_specs()
        pods: dict[str, list[PodFigures]] = {}
        for item in self._instant(
            f"max by (namespace, workload_uid, pod, node) (gpuwm_workload_pod_info{selector})"
        ):
            labels = item["metric"]
            pods.setdefault(labels.get("workload_uid", ""), []).append(
                PodFigures(
                    name=labels.get("pod", ""), uid="", node=labels.get("node") or None, phase="Running",
                    resources=specs.get((labels.get("namespace", ""), labels.get("pod", ""))),
                )
            )
        return pods

    def _pod_specs(self) -> dict[tuple[str, str], PodResources]:
        """The running GPU pods' spec requests and limits by (namespace, pod), from the controller's gpuwm_pod_*
        series (only what a pod sets has a series), so the figures' pods carry them as the embedded store's do."""
        fields: dict[tuple[str, str], dict[str, float]] = {}
        for field in _SPEC_FIELDS:
            for item in self._instant(f"max by (namespace, pod) (gpuwm_pod_{field})"):
                if (value := _finite(item)) is not None:
                    key = (item["metric"].get("namespace", ""), item["metric"].get("pod", ""))
                    fields.setdefault(key, {})[field] = value
        return {key: PodResources(**values) for key, values in fields.items()}

    def workload(self, namespace: str, name: str) -> WorkloadFigures | None:
        found = self._workloads(f"{{namespace={quote(namespace)}, workload={quote(name)}}}")
        # a reused name's runs: the newest (the latest created) is the name's
        found.sort(key=lambda w: w.created_time if w.created_time is not None else -math.inf)
        return found[-1] if found else None

    def workload_by_uid(self, uid: str) -> WorkloadFigures | None:
        found = self._workloads(f"{{workload_uid={quote(uid)}}}")
        return found[0] if found else None

    def projects(self) -> list[ProjectFigures]:
        return self._projects("")

    def _projects(self, selector: str) -> list[ProjectFigures]:
        gauges = {
            name: self._values(f"max by (project) (gpuwm_project_{name}{selector})", "project")
            for name in (
                "allocated_gpus",
                "idle_gpus",
                "quota_gpus",
                "utilization_percent",
                "utilization_avg1h_percent",
                "memory_utilization_percent",
                "workloads",
                "running_workloads",
                "allocated_gpu_seconds_total",
                "active_gpu_seconds_total",
                "idle_gpu_seconds_total",
                "unmonitored_gpu_seconds_total",
                "energy_joules_total",
                "requested_gpus",
                "queued_workloads",
                "longest_queued_seconds",
            )
        }
        namespaces: dict[str, set[str]] = {}
        for item in self._instant(f"max by (project, namespace) (gpuwm_workload_info{selector})"):
            namespaces.setdefault(item["metric"].get("project", ""), set()).add(
                item["metric"].get("namespace", "")
            )
        result = []
        for name in sorted(set(gauges["allocated_gpus"]) | set(namespaces)):

            def value(metric: str, default: float | None = 0.0, name: str = name) -> float | None:
                return gauges[metric].get(name, default)

            result.append(
                ProjectFigures(
                    name=name,
                    workloads=int(value("workloads") or 0),
                    running_workloads=int(value("running_workloads") or 0),
                    namespaces=sorted(namespaces.get(name, set())),
                    allocated_gpus=value("allocated_gpus") or 0.0,
                    idle_gpus=value("idle_gpus") or 0.0,
                    quota=value("quota_gpus", None),
                    requested_gpus=value("requested_gpus") or 0.0,
                    queued_workloads=int(value("queued_workloads") or 0),
                    longest_queued_seconds=value("longest_queued_seconds") or 0.0,
                    **_cumulative_figures(value),
                )
            )
        return result

    def project(self, name: str) -> ProjectFigures | None:
        found = self._projects(f"{{project={quote(name)}}}")
        return found[0] if found else None

    def cluster(self) -> ClusterFigures | None:
        gpus = self._values("count(max by (uuid) (gpuwm_gpu_healthy))", "")
        if not gpus:
            return None
        healthy = self._values("sum(max by (uuid) (gpuwm_gpu_healthy))", "")
        allocated = self._values("sum(gpuwm_gpu_allocated)", "")
        workloads = self._values("count(max by (workload_uid) (gpuwm_workload_info))", "")
        idle = self._values("sum(gpuwm_project_idle_gpus)", "")
        return ClusterFigures(
            gpus=int(gpus.get("", 0)),
            healthy_gpus=int(healthy.get("", 0)),
            total_gpu_units=gpus.get("", 0.0),
            allocated_gpus=allocated.get("", 0.0),
            idle_gpus=idle.get("", 0.0),
            workloads=int(workloads.get("", 0)),
        )

    def nodes(self) -> list[str]:
        return sorted(self._values("count by (node) (gpuwm_gpu_healthy)", "node"))

    def latest_time(self) -> float | None:
        return self.evaluation_time if self.evaluation_time is not None else time.time()

    def earliest_time(self) -> float | None:
        return None

    # -- periods ------------------------------------------------------------------------------

    def _period_reader(self) -> PromPeriodReader:
        now = self.latest_time()
        assert now is not None
        return PromPeriodReader(instant=self._instant, ranged=self._range, scrape_seconds=self.scrape_interval_seconds,
                                now=now)

    def period(self, start: float, end: float) -> list[WorkloadPeriod]:
        return read_period(self._period_reader(), start, end)

    def peak_allocated(self, start: float, end: float, groups: Mapping[str, WorkloadGroup]) -> dict[str, float]:
        return read_group_peaks(self._period_reader(), start, end, groups)

    def gpu_hour_prices(self, uids: Sequence[str], start: float, end: float) -> dict[str, GpuHourPrice]:
        return read_prices(self._period_reader(), uids, start, end) if uids else {}

    # -- time series --------------------------------------------------------------------------

    def latest_by_workload(
        self, uids: Sequence[str], metrics: tuple[str, ...], start: float, end: float, step_seconds: float
    ) -> dict[str, dict[str, float]]:
        """The per-pod metrics in one instant query each for every workload (not a range query per workload:
        one HTTP request per running workload and scrape otherwise); the others as the plain version."""
        wanted = set(uids)
        window = max(math.ceil(end - start), 1)
        found: dict[str, dict[str, float]] = {}
        for metric in metrics:
            if metric not in _POD_SERIES:
                continue
            for item in self._instant(latest_by_workload_promql(_POD_SERIES[metric], window), end):
                uid = item["metric"].get("workload_uid", "")
                if uid in wanted and (value := _finite(item)) is not None:
                    found.setdefault(uid, {})[metric] = value
        rest = tuple(metric for metric in metrics if metric not in _POD_SERIES)
        if rest:
            for uid, values in super().latest_by_workload(uids, rest, start, end, step_seconds).items():
                found.setdefault(uid, {}).update(values)
        return found

    def _narrowing(self, query: RangeQuery, end: float) -> str | None:
        """Label matchers for the pods (workload) or namespaces (project) seen in the range; None if none.

        With `query.pods`, only those pods: one the workload did not have in the range is refused."""
        if query.pods and query.scope != "workload":
            raise QueryError("pod", "selects pods of a workload; it applies to workload metrics only")
        if query.scope not in ("workload", "project"):
            return ""
        window = math.ceil(end - query.start) + 300
        selector = f"{KEY_LABEL[query.scope]}={quote(query.key)}"
        found = self._instant(
            f"group by (namespace, pod) (last_over_time(gpuwm_workload_pod_info{{{selector}}}[{window}s]))", end
        )
        if not found:
            return None
        namespaces = sorted({item["metric"].get("namespace", "") for item in found})
        pods = sorted({item["metric"].get("pod", "") for item in found})
        if query.pods:
            missing = [pod for pod in query.pods if pod not in pods]
            if missing:
                raise QueryError("pod", f"no pod {missing[0]!r} in this workload's series; its pods: {', '.join(pods)}")
            pods = sorted(set(query.pods))
        return (f"namespace=~{quote('|'.join(re.escape(n) for n in namespaces))}, "
                f"pod=~{quote('|'.join(re.escape(p) for p in pods))}")

    def query_range(self, query: RangeQuery) -> list[Series]:
        check_range(query)
        if query.aggregation != "mean":
            # a point here is PromQL's value at t, not a mean over the step: a min or max over the step would
            # need a subquery at the scrape interval, which this backend does not know
            raise QueryError(
                "aggregation",
                f"{query.aggregation} is answered by the embedded store only; the Prometheus backend answers each "
                "point with the value at its time (leave aggregation out or use mean)",
            )
        if query.pods:  # the pods' own series (by=gpu: their GPUs'), as the embedded store answers
            if query.by not in (None, "pod", "gpu"):
                raise QueryError("by", f"{query.by!r} does not combine with pod=; use by=pod, by=gpu or leave by out")
            query = dataclasses.replace(query, by=query.by or "pod")
        if query.scope == "node" and query.by == "node":
            # by=node of one node is its own series; the query without its breakdown, pods or steps asked for
            query = RangeQuery(query.scope, query.key, query.metrics, query.start, query.end, query.step_seconds)
        grid = query.grid()
        end = grid[-1]
        narrow = self._narrowing(query, end)
        if narrow is None:  # no pods of this workload/project in the range: nothing to read
            return [
                Series(metric, scope_labels(query.scope, query.key), [(t, None) for t in grid])
                for metric in query.metrics
                if query.by is None
            ]
        result: list[Series] = []
        for metric in query.metrics:
            expression = promql(metric, query.scope, query.key, query.by, narrow)
            answer = [] if expression is None else self._range(expression, query.start, end, query.step_seconds)
            if not answer and query.by is None:
                result.append(Series(metric, scope_labels(query.scope, query.key), [(t, None) for t in grid]))
            for item in answer:
                by_time: dict[int, float] = {}
                for t, text in item["values"]:
                    value = float(text)
                    if math.isfinite(value):
                        by_time[round((float(t) - query.start) / query.step_seconds)] = value
                labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
                if query.by is None:
                    labels = scope_labels(query.scope, query.key)
                points = [(t, by_time.get(index)) for index, t in enumerate(grid)]
                result.append(Series(metric=metric, labels=labels, points=points))
        if query.pods:  # in the order asked for; each pod named has its series, null where it has no point
            result = _pod_series(query, grid, result)
        if len(result) > MAX_SERIES_PER_QUERY:
            raise QueryError("by", f"{len(result)} series; narrow the scope or drop by=")
        return result


def _pod_series(query: RangeQuery, grid: list[float], result: list[Series]) -> list[Series]:
    """The series of `query.pods` in the order asked for: a pod without a point in the range gets a null
    series of each metric (by=pod), as the embedded store keeps a pod asked for by name."""
    ordered: list[Series] = []
    for pod in query.pods:
        for metric in query.metrics:
            found = [s for s in result if s.metric == metric and s.labels.get("pod") == pod]
            if not found and query.by == "pod":
                found = [Series(metric, {"workload_uid": query.key, "pod": pod}, [(t, None) for t in grid])]
            ordered += found
    return ordered
