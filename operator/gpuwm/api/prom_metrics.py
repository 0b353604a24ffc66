"""The controller's `/metrics`: per-workload and per-project series from the latest figures.

A prometheus-client Collector that reads the store at scrape time (no state of its own).
`gpuwm_workload_pod_info` maps the agent's (namespace, pod) labels to workloads, which is
how PromQL over the agent's `gpuwm_gpu_*` series is grouped by workload and project.
With `runai_compatible=True` the same figures are also exported under Run:ai's names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.model.figures import GpuFigures, ProjectFigures, WorkloadFigures
from gpuwm.store.base import Store

WORKLOAD_LABELS = ["namespace", "workload", "workload_uid", "kind", "project"]
#: Run:ai's per-workload labels, then gpuwm's own two (project, namespace) for joins
RUNAI_WORKLOAD_LABELS = ["clusterId", "workload_id", "workload_name", "workload_type", "user", "project", "namespace"]

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


def _workload_labels(workload: WorkloadFigures) -> list[str]:
    return [workload.namespace, workload.name, workload.uid, workload.kind, workload.project]


class WorkloadMetricsCollector(Collector):
    """Renders the latest workload and project figures of `store` at each scrape."""

    def __init__(self, store: Store, runai_compatible: bool = False, cluster_id: str = "") -> None:
        self.store = store
        self.runai_compatible = runai_compatible
        self.cluster_id = cluster_id

    def collect(self) -> Iterator[Metric]:
        workloads = self.store.workloads()
        projects = self.store.projects()
        yield from self._workload_metrics(workloads)
        yield from self._project_metrics(projects)
        if self.runai_compatible:
            yield from self._runai_metrics(workloads, projects)

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
        yield info
        yield pods
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

    def _runai_metrics(
        self, workloads: list[WorkloadFigures], projects: list[ProjectFigures]
    ) -> Iterator[Metric]:
        """Run:ai's published per-workload and per-project names and labels (cluster 2.17+ docs).

        Dashboards and idle-timeout rules written against Run:ai select on these names and on
        `clusterId`, `workload_id`, `workload_name`, `workload_type` and `project`; extra labels
        (`namespace`) do not break their selectors.
        """
        cluster_id = self.cluster_id

        def labels(workload: WorkloadFigures) -> list[str]:
            return [
                cluster_id,
                workload.uid,
                workload.name,
                runai_workload_type(workload.kind),
                "",
                workload.project,
                workload.namespace,
            ]

        per_workload: tuple[tuple[str, str, Callable[[WorkloadFigures], float | None]], ...] = (
            (
                "runai_allocated_gpu_count_per_workload",
                "Number of allocated GPUs per workload.",
                lambda w: w.allocated_gpus,
            ),
            (
                "runai_gpu_utilization_per_workload",
                "Average GPU utilization per workload, percent.",
                lambda w: w.utilization.current,
            ),
            (
                "runai_gpu_idle_seconds_per_workload",
                "Seconds passed since the workload utilized any of its allocated GPUs.",
                lambda w: w.idle_seconds,
            ),
            (
                "runai_last_gpu_utilization_time_per_workload",
                "Last time (Unix timestamp) the workload utilized any of its allocated GPUs.",
                lambda w: w.last_active_time,
            ),
            (
                "runai_gpu_memory_used_mebibytes_per_workload",
                "Used GPU memory per workload, MiB (shared devices split by units held).",
                _memory_used_mebibytes,
            ),
            (
                "runai_wait_time_seconds_per_workload",
                "Seconds from creation to the first running GPU container.",
                lambda w: w.wait_seconds,
            ),
            (
                "runai_run_time_seconds_per_workload",
                "Seconds with at least one running GPU container.",
                lambda w: w.run_seconds,
            ),
        )
        for name, help_text, value_of in per_workload:
            gauge = GaugeMetricFamily(name, help_text, labels=RUNAI_WORKLOAD_LABELS)
            for workload in workloads:
                value = value_of(workload)
                if value is not None:
                    gauge.add_metric(labels(workload), value)
            yield gauge
        requested = GaugeMetricFamily(
            "runai_requested_gpus_per_workload",
            "GPU units the workload's pods request (held from the moment they run).",
            labels=["clusterId", "workload_type", "workload_id", "workload_name", "project", "namespace"],
        )
        for workload in workloads:
            if workload.end_time is None:
                requested.add_metric(
                    [cluster_id, runai_workload_type(workload.kind), workload.uid, workload.name, workload.project,
                     workload.namespace],
                    workload.allocated_gpus,
                )
        yield requested
        yield from _runai_host_metrics(cluster_id, workloads)
        yield from _runai_device_metrics(cluster_id, workloads)
        per_project: tuple[tuple[str, str, Callable[[ProjectFigures], float | None]], ...] = (
            (
                "runai_allocated_gpu_count_per_project",
                "Number of allocated GPUs per project.",
                lambda p: p.allocated_gpus,
            ),
            (
                "runai_gpu_utilization_per_project",
                "Average GPU utilization per project, percent.",
                lambda p: p.utilization.current,
            ),
        )
        for name, help_text, project_value in per_project:
            gauge = GaugeMetricFamily(name, help_text, labels=["clusterId", "project"])
            for project in projects:
                value = project_value(project)
                if value is not None:
                    gauge.add_metric([cluster_id, project.name], value)
            yield gauge


#: Run:ai's workload_type values: training, interactive or inference
_TRAINING_KINDS = frozenset(
    {"Job", "CronJob", "JobSet", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob", "RayJob"}
)
_INFERENCE_KINDS = frozenset(
    {"Deployment", "StatefulSet", "LeaderWorkerSet", "InferenceService", "RayService", "ReplicaSet"}
)


def runai_workload_type(kind: str) -> str:
    """Map a top-level kind onto Run:ai's three workload types; anything else (bare pods, notebooks) is interactive."""
    if kind in _TRAINING_KINDS:
        return "training"
    if kind in _INFERENCE_KINDS:
        return "inference"
    return "interactive"


def _memory_used_mebibytes(workload: WorkloadFigures) -> float | None:
    """Memory of the devices it holds, each weighted by the share it holds (as the store's per-unit rule)."""
    total = 0.0
    seen = False
    for gpu in workload.gpus:
        if gpu.memory_used_bytes is None or gpu.units <= 0:
            continue
        share = min(1.0, gpu.units / gpu.device_units) if gpu.device_units > 0 else 1.0
        total += gpu.memory_used_bytes * share
        seen = True
    return total / 2**20 if seen else None


def _pods_resources(workload: WorkloadFigures, field: str, limit: bool) -> float | None:
    """The sum of `field` over the workload's running and pending pods' spec resources; None where no pod
    sets it, and for a limit also where one pod has none (that pod, and so the workload, is unlimited)."""
    values = [
        getattr(pod.resources, field) if pod.resources is not None else None
        for pod in workload.pods
        if pod.phase in ("Running", "Pending")
    ]
    given = [value for value in values if value is not None]
    if not given or (limit and len(given) < len(values)):
        return None
    return float(sum(given))


def _runai_host_metrics(cluster_id: str, workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """Run:ai's CPU and memory requests and limits per active workload (labels job_name, job_uuid), from
    the pods' specs the figures carry: what Run:ai's allocation dashboards select on."""
    names = (
        ("runai_active_job_cpu_requested_cores", "Workload's requested CPU cores.", "cpu_request_cores", False),
        ("runai_active_job_memory_requested_bytes", "Workload's requested CPU memory, bytes.", "memory_request_bytes",
         False),
        ("runai_cpu_limits_per_active_workload", "Workload's CPU limit, cores.", "cpu_limit_cores", True),
        ("runai_memory_limits_per_active_workload", "Workload's CPU memory limit, bytes.", "memory_limit_bytes", True),
    )
    active = [workload for workload in workloads if workload.end_time is None]
    for name, help_text, field, limit in names:
        gauge = GaugeMetricFamily(name, help_text, labels=["clusterId", "job_name", "job_uuid", "namespace"])
        for workload in active:
            value = _pods_resources(workload, field, limit)
            if value is not None:
                gauge.add_metric([cluster_id, workload.name, workload.uid, workload.namespace], value)
        yield gauge


def _runai_device_metrics(cluster_id: str, workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """Run:ai's per-GPU, per-node and per-pod names, from the devices the workloads hold (as of their latest
    figures; a GPU no workload holds is not in them: the agent's gpuwm_gpu_* series cover every device)."""
    devices: dict[tuple[str, str], GpuFigures] = {}  # (node, uuid): one device once, however many holders
    per_pod: list[tuple[WorkloadFigures, GpuFigures]] = []
    for workload in workloads:
        if workload.end_time is not None:
            continue
        for gpu in workload.gpus:
            devices.setdefault((gpu.node, gpu.uuid), gpu)
            per_pod.append((workload, gpu))

    def gpu_label(gpu: GpuFigures) -> str:
        return str(gpu.index) if gpu.index is not None else gpu.uuid

    per_gpu: dict[str, tuple[str, Callable[[GpuFigures], float | None]]] = {
        "runai_gpu_utilization_per_gpu": ("GPU utilization per GPU, percent (the device's SM %).",
                                          lambda g: g.sm_percent if g.sm_percent is not None else g.utilization_percent),
        "runai_gpu_memory_used_mebibytes_per_gpu": ("Used GPU memory per GPU, MiB.", lambda g: _mib(g.memory_used_bytes)),
        "runai_gpu_memory_total_mebibytes_per_gpu": ("Total GPU memory per GPU, MiB.", lambda g: _mib(g.memory_total_bytes)),
        "runai_allocated_gpu_count_per_gpu": ("Whether a pod holds the GPU (0/1).", lambda g: 1.0),
    }
    node_sums: dict[str, dict[str, list[float]]] = {}
    for name, (help_text, value_of) in per_gpu.items():
        gauge = GaugeMetricFamily(name, help_text, labels=["clusterId", "gpu", "node", "uuid"])
        for (node, uuid), gpu in sorted(devices.items()):
            value = value_of(gpu)
            if value is not None:
                gauge.add_metric([cluster_id, gpu_label(gpu), node, uuid], value)
                node_sums.setdefault(name, {}).setdefault(node, []).append(value)
        yield gauge
    per_node = {
        "runai_gpu_utilization_per_node": ("runai_gpu_utilization_per_gpu", "GPU utilization per node, percent (mean).", True),
        "runai_gpu_memory_used_mebibytes_per_node": ("runai_gpu_memory_used_mebibytes_per_gpu", "Used GPU memory per node, MiB.", False),
        "runai_gpu_memory_total_mebibytes_per_node": ("runai_gpu_memory_total_mebibytes_per_gpu", "Total GPU memory per node, MiB.", False),
        "runai_allocated_gpu_count_per_node": ("runai_allocated_gpu_count_per_gpu", "GPUs held per node.", False),
    }
    for name, (source, help_text, mean) in per_node.items():
        gauge = GaugeMetricFamily(name, help_text, labels=["clusterId", "node"])
        for node, values in sorted(node_sums.get(source, {}).items()):
            gauge.add_metric([cluster_id, node], sum(values) / len(values) if mean else sum(values))
        yield gauge
    pod_labels = ["clusterId", "pod_name", "pod_uuid", "pod_namespace", "node", "gpu"]
    utilization = GaugeMetricFamily(
        "runai_gpu_utilization_per_pod_per_gpu", "GPU utilization per pod per GPU, percent (the pod's share).",
        labels=pod_labels,
    )
    memory = GaugeMetricFamily(
        "runai_gpu_memory_used_mebibytes_per_pod_per_gpu", "Used GPU memory per pod per GPU, MiB.", labels=pod_labels
    )
    held: dict[tuple[str, str, str, str], float] = {}
    for workload, gpu in per_pod:
        labels = [cluster_id, gpu.pod or "", gpu.pod_uid or "", workload.namespace, gpu.node, gpu_label(gpu)]
        if gpu.utilization_percent is not None:
            utilization.add_metric(labels, gpu.utilization_percent)
        used = _mib(gpu.memory_used_bytes)
        if used is not None:
            memory.add_metric(labels, used)
        key = (gpu.pod or "", gpu.pod_uid or "", workload.namespace, gpu.node)
        held[key] = held.get(key, 0.0) + gpu.units
    yield utilization
    yield memory
    count = GaugeMetricFamily(
        "runai_allocated_gpu_count_per_pod", "GPU units held per pod.", labels=pod_labels[:-1]
    )
    for (pod, pod_uid, namespace, node), units in sorted(held.items()):
        count.add_metric([cluster_id, pod, pod_uid, namespace, node], units)
    yield count


def _mib(value: float | None) -> float | None:
    return value / 2**20 if value is not None else None
