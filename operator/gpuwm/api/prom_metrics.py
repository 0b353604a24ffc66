"""The controller's `/metrics`: per-workload and per-project series from the latest figures.

A prometheus-client Collector that reads the store at scrape time (no state of its own).
`gpuwm_workload_pod_info` maps the agent's (namespace, pod) labels to workloads, which is
how PromQL over the agent's `gpuwm_gpu_*` series is grouped by workload and project.
`gpuwm_pod_*` carry the running GPU pods' spec requests and limits, which the Prometheus store joins the
same way for the range API's request, limit and percent-of figures. With `runai_compatible=True` the figures
are also exported under Run:ai's names (gpuwm.api.runai_metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.api.runai_metrics import RunaiOptions, runai_metrics
from gpuwm.api.runs import failure_reason
from gpuwm.model.figures import ProjectFigures, WorkloadFigures
from gpuwm.store import Store

WORKLOAD_LABELS = ["namespace", "workload", "workload_uid", "kind", "project"]

# (name, help, value of a workload); gauges
_WORKLOAD_GAUGES: tuple[tuple[str, str, Callable[[WorkloadFigures], float | None]], ...] = (
    ("allocated_gpus", "GPU units the workload holds now.", lambda w: w.allocated_gpus),
    ("idle_gpus", "Units held now whose latest sample was inactive.", lambda w: w.idle_gpus),
    (
        "utilization_percent",
        "SM utilisation of its allocation in the latest samples.",
        lambda w: w.utilization.current,
    ),
    ("utilization_avg1h_percent", "SM utilisation over the last hour.", lambda w: w.utilization.avg1h),
    (
        "memory_utilization_percent",
        "GPU memory used, percent of its devices' total.",
        lambda w: w.memory_utilization.current,
    ),
    (
        "idle_seconds",
        "Seconds since it was last active on any of its GPUs (0 while active).",
        lambda w: w.idle_seconds,
    ),
    (
        "last_active_timestamp_seconds",
        "End of the latest interval in which it was active.",
        lambda w: w.last_active_time,
    ),
    (
        "wait_seconds",
        "Creation to its first running GPU container, plus every wait to run again after a preemption.",
        lambda w: w.wait_seconds,
    ),
    (
        "queued_seconds",
        "Seconds held back (suspended, or not admitted by Kueue) since creation; counts on after a preemption.",
        lambda w: w.queued_seconds,
    ),
    (
        "requested_gpus",
        "GPU units its pod templates ask for (from the workload object; absent where only its pods are known).",
        lambda w: w.requested_gpus,
    ),
    ("run_seconds", "Time with at least one running GPU container.", lambda w: w.run_seconds),
    ("created_timestamp_seconds", "When the workload was created.", lambda w: w.created_time),
    ("start_timestamp_seconds", "When its first GPU container started.", lambda w: w.start_time),
    ("end_timestamp_seconds", "When its last GPU pod ended.", lambda w: w.end_time),
)
_WORKLOAD_COUNTERS: tuple[tuple[str, str, Callable[[WorkloadFigures], float]], ...] = (
    (
        "allocated_gpu_seconds",
        "Units x seconds held by running GPU containers.",
        lambda w: w.allocated_gpu_seconds,
    ),
    ("active_gpu_seconds", "Part of allocated GPU-seconds that was active.", lambda w: w.active_gpu_seconds),
    (
        "idle_gpu_seconds",
        "Part of allocated GPU-seconds that was monitored and idle.",
        lambda w: w.idle_gpu_seconds,
    ),
    (
        "unmonitored_gpu_seconds",
        "Part of allocated GPU-seconds without samples.",
        lambda w: w.unmonitored_gpu_seconds,
    ),
    ("energy_joules", "Energy of its devices, split by units.", lambda w: w.energy_joules),
)
_PROJECT_GAUGES: tuple[tuple[str, str, Callable[[ProjectFigures], float | None]], ...] = (
    ("allocated_gpus", "GPU units the project's workloads hold now.", lambda p: p.allocated_gpus),
    ("idle_gpus", "Units held now whose latest sample was inactive.", lambda p: p.idle_gpus),
    ("quota_gpus", "GPU quota from the namespace annotation gpuwm.io/gpu-quota.", lambda p: p.quota),
    (
        "utilization_percent",
        "SM utilisation of the project's allocation, latest samples.",
        lambda p: p.utilization.current,
    ),
    ("utilization_avg1h_percent", "SM utilisation over the last hour.", lambda p: p.utilization.avg1h),
    ("memory_utilization_percent", "GPU memory used, percent.", lambda p: p.memory_utilization.current),
    ("workloads", "Workloads of the project with figures.", lambda p: p.workloads),
    ("running_workloads", "Workloads holding GPUs now.", lambda p: p.running_workloads),
    (
        "requested_gpus",
        "GPU units its queued and pending workloads ask for: demand not met now.",
        lambda p: p.requested_gpus,
    ),
    ("queued_workloads", "Its workloads held back (Queued) now.", lambda p: p.queued_workloads),
    (
        "longest_queued_seconds",
        "Queued seconds of its longest-queued workload among those Queued now (0: none).",
        lambda p: p.longest_queued_seconds,
    ),
)
_PROJECT_COUNTERS: tuple[tuple[str, str, Callable[[ProjectFigures], float]], ...] = (
    (
        "allocated_gpu_seconds",
        "Sum of its workloads' allocated GPU-seconds.",
        lambda p: p.allocated_gpu_seconds,
    ),
    ("active_gpu_seconds", "Sum of its workloads' active GPU-seconds.", lambda p: p.active_gpu_seconds),
    ("idle_gpu_seconds", "Sum of its workloads' idle GPU-seconds.", lambda p: p.idle_gpu_seconds),
    (
        "unmonitored_gpu_seconds",
        "Sum of its workloads' unmonitored GPU-seconds.",
        lambda p: p.unmonitored_gpu_seconds,
    ),
    ("energy_joules", "Sum of its workloads' energy.", lambda p: p.energy_joules),
)


#: (series name, PodResources field, help): each running GPU pod's spec, labelled like the agent's pod series
POD_RESOURCES: tuple[tuple[str, str, str], ...] = (
    ("gpuwm_pod_cpu_request_cores", "cpu_request_cores", "CPU the pod's containers request, cores."),
    ("gpuwm_pod_cpu_limit_cores", "cpu_limit_cores", "CPU limit of the pod (absent: a container has none), cores."),
    ("gpuwm_pod_memory_request_bytes", "memory_request_bytes", "Memory the pod's containers request, bytes."),
    ("gpuwm_pod_memory_limit_bytes", "memory_limit_bytes", "Memory limit of the pod (absent: a container has none)."),
    (
        "gpuwm_pod_ephemeral_storage_limit_bytes", "ephemeral_storage_limit_bytes",
        "Ephemeral-storage limit of the pod (absent: a container has none), bytes.",
    ),
)


def _workload_labels(workload: WorkloadFigures) -> list[str]:
    return [workload.namespace, workload.name, workload.uid, workload.kind, workload.project]


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
        workloads = list(workloads)
        info = GaugeMetricFamily(
            "gpuwm_workload_info",
            "A workload (value 1): with GPU pods, or a watched object queued or pending; labels name it.",
            labels=[*WORKLOAD_LABELS, "phase"],
        )
        pods = GaugeMetricFamily(
            "gpuwm_workload_pod_info",
            "Maps a GPU pod to its workload (value 1), for joins with the agent's gpuwm_gpu_* series.",
            labels=["namespace", "pod", "workload", "workload_uid", "project", "node"],
        )
        for workload in workloads:
            info.add_metric([*_workload_labels(workload), workload.phase], 1.0)
            for pod in workload.pods:
                pods.add_metric(
                    [
                        workload.namespace,
                        pod.name,
                        workload.name,
                        workload.uid,
                        workload.project,
                        pod.node or "",
                    ],
                    1.0,
                )
        failures = GaugeMetricFamily(
            "gpuwm_workload_failure_info",
            "Why a failed workload failed (value 1; the API's failureReason): its object's Failed condition, else a "
            "failed pod's reason. Only runs that have one.",
            labels=[*WORKLOAD_LABELS, "reason"],
        )
        for workload in workloads:
            reason = failure_reason(workload)
            if reason:
                failures.add_metric([*_workload_labels(workload), reason], 1.0)
        yield info
        yield pods
        yield failures
        yield from _pod_resources(workloads)
        for name, help_text, value_of in _WORKLOAD_GAUGES:
            gauge = GaugeMetricFamily(f"gpuwm_workload_{name}", help_text, labels=WORKLOAD_LABELS)
            for workload in workloads:
                value = value_of(workload)
                if value is not None:
                    gauge.add_metric(_workload_labels(workload), value)
            yield gauge
        for name, help_text, total_of in _WORKLOAD_COUNTERS:
            counter = CounterMetricFamily(f"gpuwm_workload_{name}", help_text, labels=WORKLOAD_LABELS)
            for workload in workloads:
                counter.add_metric(_workload_labels(workload), total_of(workload))
            yield counter

    def _project_metrics(self, projects: Iterable[ProjectFigures]) -> Iterator[Metric]:
        projects = list(projects)
        for name, help_text, value_of in _PROJECT_GAUGES:
            gauge = GaugeMetricFamily(f"gpuwm_project_{name}", help_text, labels=["project"])
            for project in projects:
                value = value_of(project)
                if value is not None:
                    gauge.add_metric([project.name], value)
            yield gauge
        for name, help_text, total_of in _PROJECT_COUNTERS:
            counter = CounterMetricFamily(f"gpuwm_project_{name}", help_text, labels=["project"])
            for project in projects:
                counter.add_metric([project.name], total_of(project))
            yield counter


def _pod_resources(workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """The spec requests and limits of running workloads' running and pending pods, on (namespace, pod, node):
    the agent's pod series' labels, so PromQL divides one by the other pod by pod (an ended run's pods,
    whose names a new run may reuse, are left out)."""
    live = [
        (workload.namespace, pod)
        for workload in workloads
        if workload.end_time is None
        for pod in workload.pods
        if pod.phase in ("Running", "Pending") and pod.resources is not None
    ]
    for name, field, help_text in POD_RESOURCES:
        gauge = GaugeMetricFamily(name, help_text, labels=["namespace", "pod", "node"])
        for namespace, pod in live:
            value = getattr(pod.resources, field)
            if value is not None:
                gauge.add_metric([namespace, pod.name, pod.node or ""], value)
        yield gauge
