"""Run:ai's published metric names (cluster 2.17+ docs) from gpuwm's figures, for `runaiCompatibleMetrics`.

Dashboards and idle-timeout rules written against Run:ai select on these names and on `clusterId`,
`workload_id`, `workload_name`, `workload_type`, `user` and `project`; extra labels (`namespace`) do not break
their selectors. Everything comes from the store at scrape time: the latest workload and project figures,
the fleet's devices (free ones included) and the workloads' latest host figures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwm.api.fleet import RECENT_INTERVALS, GpuView, read_fleet
from gpuwm.model.figures import GpuFigures, ProjectFigures, WorkloadFigures
from gpuwm.store import Store, StoreError

log = logging.getLogger(__name__)

#: Run:ai's per-workload labels, then gpuwm's own two (project, namespace) for joins
RUNAI_WORKLOAD_LABELS = ["clusterId", "workload_id", "workload_name", "workload_type", "user", "project", "namespace"]
#: the host figures read per workload for runai_job_cpu_usage and runai_job_memory_used_bytes
_HOST_USAGE = ("cpu_usage_cores", "memory_used_bytes")


@dataclass(frozen=True)
class RunaiOptions:
    """What the Run:ai names need beyond the figures: `user_label` is the pod label whose value is `user`
    (empty: `user` stays empty); `status_interval_seconds` is how far apart the store's latest points are."""

    cluster_id: str = ""
    user_label: str = ""
    status_interval_seconds: float = 15.0


def runai_user(workload: WorkloadFigures, user_label: str) -> str:
    """The value of `user_label` on the workload's first pod that has it (its pods share it where a
    launcher such as Run:ai's sets it), else empty."""
    if not user_label:
        return ""
    for pod in workload.pods:
        value = (pod.labels or {}).get(user_label)
        if value:
            return value
    return ""


def runai_metrics(
    store: Store, options: RunaiOptions, workloads: list[WorkloadFigures], projects: list[ProjectFigures]
) -> Iterator[Metric]:
    """Every Run:ai family: per workload, requests and limits, each pod's CPU and memory, host use, devices (per
    GPU, node and pod), per project."""
    cluster_id = options.cluster_id
    users = {workload.uid: runai_user(workload, options.user_label) for workload in workloads}

    def labels(workload: WorkloadFigures) -> list[str]:
        return [
            cluster_id,
            workload.uid,
            workload.name,
            runai_workload_type(workload.kind),
            users[workload.uid],
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
    yield from _runai_pod_allocations(cluster_id, workloads)
    yield from _runai_host_usage(store, options, workloads, labels)
    yield from _runai_device_metrics(cluster_id, workloads, _free_devices(store, options, workloads))
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
        (
            "runai_project_guaranteed_gpus",
            "Guaranteed GPU quota per project (the gpuwm.io/gpu-quota namespace annotation); none without one.",
            lambda p: p.quota,
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


def _runai_pod_allocations(cluster_id: str, workloads: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """runai_allocated_millicpus_per_pod and runai_allocated_memory_per_pod: the CPU and memory a running
    workload's running GPU pods request (what the scheduler set aside for them), where their specs are known."""
    labels = ["clusterId", "pod_name", "pod_uuid", "pod_namespace", "node"]
    millicpus = GaugeMetricFamily(
        "runai_allocated_millicpus_per_pod", "CPU the pod requests, millicores.", labels=labels
    )
    memory = GaugeMetricFamily("runai_allocated_memory_per_pod", "Memory the pod requests, bytes.", labels=labels)
    for workload in workloads:
        if workload.end_time is not None:
            continue
        for pod in workload.pods:
            if pod.phase != "Running" or pod.resources is None:
                continue
            names = [cluster_id, pod.name, pod.uid, workload.namespace, pod.node or ""]
            if pod.resources.cpu_request_cores is not None:
                millicpus.add_metric(names, round(pod.resources.cpu_request_cores * 1000))
            if pod.resources.memory_request_bytes is not None:
                memory.add_metric(names, pod.resources.memory_request_bytes)
    yield millicpus
    yield memory


def _runai_host_usage(
    store: Store, options: RunaiOptions, workloads: Iterable[WorkloadFigures],
    labels: Callable[[WorkloadFigures], list[str]],
) -> Iterator[Metric]:
    """runai_job_cpu_usage (cores) and runai_job_memory_used_bytes of each running workload: its latest
    point of the store's cpu_usage_cores and memory_used_bytes (its pods' kubelet figures, summed) within
    the last few status intervals; none where its pods have no host figures there. One store read for all
    of them (`Store.latest_by_workload`): a scrape reads every running workload's."""
    cpu = GaugeMetricFamily("runai_job_cpu_usage", "Workload's CPU usage, cores.", labels=RUNAI_WORKLOAD_LABELS)
    memory = GaugeMetricFamily(
        "runai_job_memory_used_bytes", "Workload's used CPU memory (working set), bytes.", labels=RUNAI_WORKLOAD_LABELS
    )
    running = [workload for workload in workloads if workload.end_time is None]
    at = store.latest_time()
    if at is not None and running:
        step = max(options.status_interval_seconds, 1.0)
        try:
            latest = store.latest_by_workload(
                [workload.uid for workload in running], _HOST_USAGE, at - RECENT_INTERVALS * step, at, step
            )
        except (StoreError, ValueError) as error:  # a store that cannot answer: the other families still go
            log.warning("Run:ai-compatible metrics: no host figures of the running workloads: %s", error)
            latest = {}
        for workload in running:
            values = latest.get(workload.uid, {})
            for family, metric in ((cpu, "cpu_usage_cores"), (memory, "memory_used_bytes")):
                value = values.get(metric)
                if value is not None:
                    family.add_metric(labels(workload), value)
    yield cpu
    yield memory


def _free_devices(store: Store, options: RunaiOptions, workloads: Iterable[WorkloadFigures]) -> list[GpuView]:
    """The fleet's devices no running workload holds (MIG parents left out: their instances are the GPUs)."""
    held = {gpu.uuid for workload in workloads if workload.end_time is None for gpu in workload.gpus}
    try:
        _, views, _ = read_fleet(store, options.status_interval_seconds)
    except (StoreError, ValueError) as error:  # QueryError is a ValueError (too many devices for one query)
        log.warning("Run:ai-compatible metrics: free GPUs left out: %s", error)
        return []
    return [view for view in views if not view.holders and not view.mig_parent and view.uuid not in held]


def _runai_device_metrics(
    cluster_id: str, workloads: Iterable[WorkloadFigures], free: Sequence[GpuView] = ()
) -> Iterator[Metric]:
    """Run:ai's per-GPU, per-node and per-pod names: the devices the workloads hold (as of their latest
    figures) and the `free` ones, which Run:ai lists too (allocated 0, their utilisation and memory; per-GPU
    series carry no workload labels, so a free GPU differs only in its values)."""
    devices: dict[tuple[str, str], GpuFigures] = {}  # (node, uuid): one device once, however many holders
    per_pod: list[tuple[WorkloadFigures, GpuFigures]] = []
    for workload in workloads:
        if workload.end_time is not None:
            continue
        for gpu in workload.gpus:
            devices.setdefault((gpu.node, gpu.uuid), gpu)
            per_pod.append((workload, gpu))
    holding = set(devices)
    for view in free:
        devices.setdefault((view.node, view.uuid), GpuFigures(
            node=view.node, uuid=view.uuid, index=view.index, sm_percent=view.utilization_percent,
            memory_used_bytes=view.memory_used_bytes, memory_total_bytes=view.memory_total_bytes,
        ))

    def gpu_label(gpu: GpuFigures) -> str:
        return str(gpu.index) if gpu.index is not None else gpu.uuid

    per_gpu: dict[str, tuple[str, Callable[[GpuFigures], float | None]]] = {
        "runai_gpu_utilization_per_gpu": ("GPU utilization per GPU, percent (the device's SM %).",
                                          lambda g: g.sm_percent if g.sm_percent is not None else g.utilization_percent),
        "runai_gpu_memory_used_mebibytes_per_gpu": ("Used GPU memory per GPU, MiB.", lambda g: _mib(g.memory_used_bytes)),
        "runai_gpu_memory_total_mebibytes_per_gpu": ("Total GPU memory per GPU, MiB.", lambda g: _mib(g.memory_total_bytes)),
        "runai_allocated_gpu_count_per_gpu": ("Whether a pod holds the GPU (0/1).", lambda g: 1.0 if (g.node, g.uuid) in holding else 0.0),
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

