"""The controller's `/metrics`: per-workload and per-project series from the latest figures.

A prometheus-client Collector that reads the store at scrape time (no state of its own).
`gpuwm_workload_pod_info` maps the agent's (namespace, pod) labels to workloads, which is
how PromQL over the agent's `gpuwm_gpu_*` series is grouped by workload and project.
`gpuwm_pod_*` carry the running GPU pods' spec requests and limits, which the Prometheus store joins the
same way for the range API's request, limit and percent-of figures. With `runai_compatible=True` the figures
are also exported under Run:ai's names (gpuwm.api.runai_metrics).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.api.runai_metrics import RunaiOptions, Series, families, runai_metrics
from gpuwm.api.runs import failure_reason
from gpuwm.model import CATALOGUE, ProjectFigures, Source, WorkloadFigures
from gpuwm.store import Store, utilized_gpu_seconds

WORKLOAD_LABELS = ["namespace", "workload", "workload_uid", "kind", "project"]


def _series(prefix: str, table: tuple[tuple[str, ...], ...]) -> tuple[Series[Any], ...]:
    """`table`'s (name, help[, dotted field]) as (`prefix` + name, help, the field's getter): the field is the
    name where the row gives none."""
    return tuple((prefix + name, help_text, attrgetter(path[0] if path else name)) for name, help_text, *path in table)


#: HELP of the utilisation-weighted counter, what a period's mean utilisation is made of
_UTILIZED_HELP = ("Active + idle GPU-seconds weighted by SM utilisation (x lifetime utilisation / 100): over a period, "
                  "its increase divided by the active + idle increase is the mean utilisation.")
# (name, help[, field of WorkloadFigures]); gauges
_WORKLOAD_GAUGES = _series("gpuwm_workload_", (
    ("allocated_gpus", "GPU units the workload holds now."),
    ("idle_gpus", "Units held now whose latest sample was inactive."),
    ("utilization_percent", "SM utilisation of its allocation in the latest samples.", "utilization.current"),
    ("utilization_avg1h_percent", "SM utilisation over the last hour.", "utilization.avg1h"),
    ("memory_utilization_percent", "GPU memory used, percent of its devices' total.", "memory_utilization.current"),
    ("idle_seconds", "Seconds since it was last active on any of its GPUs (0 while active)."),
    ("last_active_timestamp_seconds", "End of the latest interval in which it was active.", "last_active_time"),
    ("wait_seconds", "Creation to its first running GPU container, plus every wait to run again after a preemption."),
    ("queued_seconds",
     "Seconds held back (suspended, or not admitted by Kueue) since creation; counts on after a preemption."),
    ("requested_gpus",
     "GPU units its pod templates ask for (from the workload object; absent where only its pods are known)."),
    ("run_seconds", "Time with at least one running GPU container."),
    ("created_timestamp_seconds", "When the workload was created.", "created_time"),
    ("start_timestamp_seconds", "When its first GPU container started.", "start_time"),
    ("end_timestamp_seconds", "When its last GPU pod ended.", "end_time"),
))
_WORKLOAD_COUNTERS = (*_series("gpuwm_workload_", (
    ("allocated_gpu_seconds", "Units x seconds held by running GPU containers."),
    ("active_gpu_seconds", "Part of allocated GPU-seconds that was active."),
    ("idle_gpu_seconds", "Part of allocated GPU-seconds that was monitored and idle."),
    ("unmonitored_gpu_seconds", "Part of allocated GPU-seconds without samples."),
    ("energy_joules", "Energy of its devices, split by units."),
)), ("gpuwm_workload_utilized_gpu_seconds", _UTILIZED_HELP, utilized_gpu_seconds))
_PROJECT_GAUGES = _series("gpuwm_project_", (
    ("allocated_gpus", "GPU units the project's workloads hold now."),
    ("idle_gpus", "Units held now whose latest sample was inactive."),
    ("quota_gpus", "GPU quota from the namespace annotation gpuwm.io/gpu-quota.", "quota"),
    ("utilization_percent", "SM utilisation of the project's allocation, latest samples.", "utilization.current"),
    ("utilization_avg1h_percent", "SM utilisation over the last hour.", "utilization.avg1h"),
    ("memory_utilization_percent", "GPU memory used, percent.", "memory_utilization.current"),
    ("workloads", "Workloads of the project with figures."),
    ("running_workloads", "Workloads holding GPUs now."),
    ("requested_gpus", "GPU units its queued and pending workloads ask for: demand not met now."),
    ("queued_workloads", "Its workloads held back (Queued) now."),
    ("longest_queued_seconds", "Queued seconds of its longest-queued workload among those Queued now (0: none)."),
))
_PROJECT_COUNTERS = (*_series("gpuwm_project_", (
    ("allocated_gpu_seconds", "Sum of its workloads' allocated GPU-seconds."),
    ("active_gpu_seconds", "Sum of its workloads' active GPU-seconds."),
    ("idle_gpu_seconds", "Sum of its workloads' idle GPU-seconds."),
    ("unmonitored_gpu_seconds", "Sum of its workloads' unmonitored GPU-seconds."),
    ("energy_joules", "Sum of its workloads' energy."),
)), ("gpuwm_project_utilized_gpu_seconds", _UTILIZED_HELP, utilized_gpu_seconds))
#: HELP of `gpuwm_pod_<name>`, each running GPU pod's spec figure (the catalogue's pod-spec metrics, in its
#: order), labelled like the agent's pod series
_POD_SPEC_HELP = {
    "cpu_request_cores": "CPU the pod's containers request, cores.",
    "cpu_limit_cores": "CPU limit of the pod (absent: a container has none), cores.",
    "memory_request_bytes": "Memory the pod's containers request, bytes.",
    "memory_limit_bytes": "Memory limit of the pod (absent: a container has none).",
    "ephemeral_storage_limit_bytes": "Ephemeral-storage limit of the pod (absent: a container has none), bytes.",
}
_POD_SPEC = _series("gpuwm_pod_", tuple(
    (metric.name, _POD_SPEC_HELP[metric.name], str(metric.field)) for metric in CATALOGUE
    if metric.source is Source.POD_SPEC
))


def _workload_labels(workload: WorkloadFigures) -> list[str]:
    return [workload.namespace, workload.name, workload.uid, workload.kind, workload.project]


def _info(name: str, help_text: str, labels: list[str], rows: Iterable[list[str]]) -> Metric:
    """An info family: a sample of value 1 for each of `rows`' label values."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for label_values in rows:
        family.add_metric(label_values, 1.0)
    return family


class WorkloadMetricsCollector(Collector):
    """Renders the latest workload and project figures of `store` at each scrape."""

    def __init__(
        self,
        store: Store,
        runai_compatible: bool = False,
        cluster_id: str = "",
        user_label: str = "",
        status_interval_seconds: float = 15.0,
    ) -> None:
        self.store = store
        self.runai_compatible = runai_compatible
        self.runai = RunaiOptions(cluster_id, user_label, status_interval_seconds)

    def collect(self) -> Iterator[Metric]:
        workloads = self.store.workloads()
        projects = self.store.projects()
        yield from self._workload_metrics(workloads)
        yield from self._project_metrics(projects)
        if self.runai_compatible:
            yield from runai_metrics(self.store, self.runai, workloads, projects)

    def _workload_metrics(self, workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
        rows = [(_workload_labels(workload), workload) for workload in workloads]
        yield _info(
            "gpuwm_workload_info",
            "A workload (value 1): with GPU pods, or a watched object queued or pending; labels name it.",
            [*WORKLOAD_LABELS, "phase"], ([*labels, workload.phase] for labels, workload in rows),
        )
        yield _info(
            "gpuwm_workload_pod_info",
            "Maps a GPU pod to its workload (value 1), for joins with the agent's gpuwm_gpu_* series.",
            ["namespace", "pod", "workload", "workload_uid", "project", "node"],
            ([workload.namespace, pod.name, workload.name, workload.uid, workload.project, pod.node or ""]
             for _, workload in rows for pod in workload.pods),
        )
        yield _info(
            "gpuwm_workload_failure_info",
            "Why a failed workload failed (value 1; the API's failureReason): its object's Failed condition, else a "
            "failed pod's reason. Only runs that have one.",
            [*WORKLOAD_LABELS, "reason"],
            ([*labels, reason] for labels, workload in rows if (reason := failure_reason(workload))),
        )
        yield from _pod_resources([workload for _, workload in rows])
        yield from families(_WORKLOAD_GAUGES, rows, WORKLOAD_LABELS)
        yield from families(_WORKLOAD_COUNTERS, rows, WORKLOAD_LABELS, CounterMetricFamily)

    def _project_metrics(self, projects: Iterable[ProjectFigures]) -> Iterator[Metric]:
        rows = [([project.name], project) for project in projects]
        yield from families(_PROJECT_GAUGES, rows, ["project"])
        yield from families(_PROJECT_COUNTERS, rows, ["project"], CounterMetricFamily)


def _pod_resources(workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """The spec requests and limits of running workloads' running and pending pods, on (namespace, pod, node):
    the agent's pod series' labels, so PromQL divides one by the other pod by pod (an ended run's pods,
    whose names a new run may reuse, are left out)."""
    live = [
        ([workload.namespace, pod.name, pod.node or ""], pod.resources)
        for workload in workloads
        if workload.end_time is None
        for pod in workload.pods
        if pod.phase in ("Running", "Pending") and pod.resources is not None
    ]
    yield from families(_POD_SPEC, live, ["namespace", "pod", "node"])
