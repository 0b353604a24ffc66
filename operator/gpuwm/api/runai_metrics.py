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
from functools import partial
from operator import attrgetter, methodcaller
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwm.api.fleet import RECENT_INTERVALS, FleetReader, GpuView
from gpuwm.model import RUNAI_NAMES, GpuFigures, PodResources, ProjectFigures, WorkloadFigures
from gpuwm.store import Store, StoreError

log = logging.getLogger(__name__)

#: Run:ai's per-workload labels, then gpuwm's own two (project, namespace) for joins
RUNAI_WORKLOAD_LABELS = ["clusterId", "workload_id", "workload_name", "workload_type", "user", "project", "namespace"]

T = TypeVar("T")
#: one family of a table: (name, help, the value of an item; None: no sample for that item)
Series = tuple[str, str, Callable[[T], float | None]]


def families(
    series: Iterable[Series[T]], rows: Sequence[tuple[list[str], T]], labels: list[str],
    kind: type[GaugeMetricFamily | CounterMetricFamily] = GaugeMetricFamily,
) -> Iterator[Metric]:
    """A family of `kind` per (name, help, value) of `series`, labelled `labels`, with a sample for each
    (label values, item) of `rows` whose value is not None, in the rows' order: the one emit loop of the
    controller's tables, gpuwm's (gpuwm.api.prom_metrics) and Run:ai's."""
    for name, help_text, value_of in series:
        family = kind(name, help_text, labels=labels)
        for label_values, item in rows:
            value = value_of(item)
            if value is not None:
                family.add_metric(label_values, value)
        yield family


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
    return next((pod.labels[user_label] for pod in workload.pods if pod.labels and pod.labels.get(user_label)), "")


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
    used = [gpu.memory_used_bytes * (min(1.0, gpu.units / gpu.device_units) if gpu.device_units > 0 else 1.0)
            for gpu in workload.gpus if gpu.memory_used_bytes is not None and gpu.units > 0]
    return _mib(sum(used)) if used else None


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


def _mib(value: float | None) -> float | None:
    return value / 2**20 if value is not None else None


#: (name, help, value of a workload) of Run:ai's per-workload series
_PER_WORKLOAD: tuple[Series[WorkloadFigures], ...] = (
    ("runai_allocated_gpu_count_per_workload", "Number of allocated GPUs per workload.", attrgetter("allocated_gpus")),
    ("runai_gpu_utilization_per_workload", "Average GPU utilization per workload, percent.",
     attrgetter("utilization.current")),
    ("runai_gpu_idle_seconds_per_workload", "Seconds passed since the workload utilized any of its allocated GPUs.",
     attrgetter("idle_seconds")),
    ("runai_last_gpu_utilization_time_per_workload",
     "Last time (Unix timestamp) the workload utilized any of its allocated GPUs.", attrgetter("last_active_time")),
    ("runai_gpu_memory_used_mebibytes_per_workload",
     "Used GPU memory per workload, MiB (shared devices split by units held).", _memory_used_mebibytes),
    ("runai_wait_time_seconds_per_workload", "Seconds from creation to the first running GPU container.",
     attrgetter("wait_seconds")),
    ("runai_run_time_seconds_per_workload", "Seconds with at least one running GPU container.",
     attrgetter("run_seconds")),
)
_PER_PROJECT: tuple[Series[ProjectFigures], ...] = (
    ("runai_allocated_gpu_count_per_project", "Number of allocated GPUs per project.", attrgetter("allocated_gpus")),
    ("runai_gpu_utilization_per_project", "Average GPU utilization per project, percent.",
     attrgetter("utilization.current")),
    ("runai_project_guaranteed_gpus",
     "Guaranteed GPU quota per project (the gpuwm.io/gpu-quota namespace annotation); none without one.",
     attrgetter("quota")),
)
#: Run:ai's requests and limits per active workload: the catalogue's pod-spec metrics under their Run:ai names
_POD_SPEC: tuple[Series[WorkloadFigures], ...] = tuple(
    (RUNAI_NAMES[field], help_text, partial(_pods_resources, field=field, limit="_limit_" in field))
    for field, help_text in (
        ("cpu_request_cores", "Workload's requested CPU cores."),
        ("memory_request_bytes", "Workload's requested CPU memory, bytes."),
        ("cpu_limit_cores", "Workload's CPU limit, cores."),
        ("memory_limit_bytes", "Workload's CPU memory limit, bytes."),
    )
)
#: the host figures read per running workload (the catalogue's pod metrics, under their Run:ai names): help
_HOST_USAGE = {
    "cpu_usage_cores": "Workload's CPU usage, cores.",
    "memory_used_bytes": "Workload's used CPU memory (working set), bytes.",
}
_POD_ALLOCATIONS: tuple[Series[PodResources], ...] = (
    ("runai_allocated_millicpus_per_pod", "CPU the pod requests, millicores.",
     lambda r: None if r.cpu_request_cores is None else round(r.cpu_request_cores * 1000)),
    ("runai_allocated_memory_per_pod", "Memory the pod requests, bytes.", attrgetter("memory_request_bytes")),
)


def runai_metrics(
    store: Store, options: RunaiOptions, workloads: list[WorkloadFigures], projects: list[ProjectFigures]
) -> Iterator[Metric]:
    """Every Run:ai family: per workload, requests and limits, each pod's CPU and memory, host use, devices (per
    GPU, node and pod), per project."""
    cluster_id = options.cluster_id
    rows = [
        ([cluster_id, workload.uid, workload.name, runai_workload_type(workload.kind),
          runai_user(workload, options.user_label), workload.project, workload.namespace], workload)
        for workload in workloads
    ]
    active = [workload for workload in workloads if workload.end_time is None]
    yield from families(_PER_WORKLOAD, rows, RUNAI_WORKLOAD_LABELS)
    yield from families(
        [("runai_requested_gpus_per_workload", "GPU units the workload's pods request (held from the moment they run).",
          attrgetter("allocated_gpus"))],
        [([cluster_id, runai_workload_type(workload.kind), workload.uid, workload.name, workload.project,
           workload.namespace], workload) for workload in active],
        ["clusterId", "workload_type", "workload_id", "workload_name", "project", "namespace"],
    )
    # Run:ai's requests and limits from the pods' specs the figures carry: what its allocation dashboards select on
    yield from families(_POD_SPEC, [([cluster_id, workload.name, workload.uid, workload.namespace], workload)
                                    for workload in active], ["clusterId", "job_name", "job_uuid", "namespace"])
    yield from _runai_pod_allocations(cluster_id, active)
    yield from _runai_host_usage(store, options, [(labels, workload) for labels, workload in rows
                                                  if workload.end_time is None])
    yield from _runai_device_metrics(cluster_id, active, _free_devices(store, options, workloads))
    yield from families(_PER_PROJECT, [([cluster_id, project.name], project) for project in projects],
                        ["clusterId", "project"])


def _runai_pod_allocations(cluster_id: str, active: Iterable[WorkloadFigures]) -> Iterator[Metric]:
    """runai_allocated_millicpus_per_pod and runai_allocated_memory_per_pod: the CPU and memory a running
    workload's running GPU pods request (what the scheduler set aside for them), where their specs are known."""
    rows = [
        ([cluster_id, pod.name, pod.uid, workload.namespace, pod.node or ""], pod.resources)
        for workload in active
        for pod in workload.pods
        if pod.phase == "Running" and pod.resources is not None
    ]
    yield from families(_POD_ALLOCATIONS, rows, ["clusterId", "pod_name", "pod_uuid", "pod_namespace", "node"])


def _runai_host_usage(
    store: Store, options: RunaiOptions, running: Sequence[tuple[list[str], WorkloadFigures]]
) -> Iterator[Metric]:
    """runai_job_cpu_usage (cores) and runai_job_memory_used_bytes of each running workload: its latest
    point of the store's cpu_usage_cores and memory_used_bytes (its pods' kubelet figures, summed) within
    the last few status intervals; none where its pods have no host figures there. One store read for all
    of them (`Store.latest_by_workload`): a scrape reads every running workload's."""
    latest: dict[str, dict[str, float]] = {}
    at = store.latest_time()
    if at is not None and running:
        step = max(options.status_interval_seconds, 1.0)
        try:
            latest = store.latest_by_workload(
                [workload.uid for _, workload in running], tuple(_HOST_USAGE), at - RECENT_INTERVALS * step, at, step
            )
        except (StoreError, ValueError) as error:  # a store that cannot answer: the other families still go
            log.warning("Run:ai-compatible metrics: no host figures of the running workloads: %s", error)
    yield from families(
        [(RUNAI_NAMES[metric], help_text, methodcaller("get", metric)) for metric, help_text in _HOST_USAGE.items()],
        [(labels, latest.get(workload.uid, {})) for labels, workload in running], RUNAI_WORKLOAD_LABELS,
    )


def _free_devices(store: Store, options: RunaiOptions, workloads: Iterable[WorkloadFigures]) -> list[GpuView]:
    """The fleet's devices no running workload holds (MIG parents left out: their instances are the GPUs)."""
    held = {gpu.uuid for workload in workloads if workload.end_time is None for gpu in workload.gpus}
    try:
        views = list(FleetReader(store, options.status_interval_seconds).devices())
    except (StoreError, ValueError) as error:  # QueryError is a ValueError (too many devices for one query)
        log.warning("Run:ai-compatible metrics: free GPUs left out: %s", error)
        return []
    return [view for view in views if not view.holders and not view.mig_parent and view.uuid not in held]


def _runai_device_metrics(
    cluster_id: str, active: Iterable[WorkloadFigures], free: Sequence[GpuView] = ()
) -> Iterator[Metric]:
    """Run:ai's per-GPU, per-node and per-pod names: the devices the workloads hold (as of their latest
    figures) and the `free` ones, which Run:ai lists too (allocated 0, their utilisation and memory; per-GPU
    series carry no workload labels, so a free GPU differs only in its values)."""
    devices: dict[tuple[str, str], GpuFigures] = {}  # (node, uuid): one device once, however many holders
    per_pod: list[tuple[WorkloadFigures, GpuFigures]] = []
    for workload in active:
        for gpu in workload.gpus:
            devices.setdefault((gpu.node, gpu.uuid), gpu)
            per_pod.append((workload, gpu))
    for view in free:
        devices.setdefault((view.node, view.uuid), GpuFigures(
            node=view.node, uuid=view.uuid, index=view.index, sm_percent=view.utilization_percent,
            memory_used_bytes=view.memory_used_bytes, memory_total_bytes=view.memory_total_bytes,
        ))
    yield from _runai_gpu_and_node_metrics(cluster_id, devices, held={(gpu.node, gpu.uuid) for _, gpu in per_pod})
    yield from _runai_pod_gpu_metrics(cluster_id, per_pod)


def _gpu_label(gpu: GpuFigures) -> str:
    return str(gpu.index) if gpu.index is not None else gpu.uuid


#: Run:ai's per-node name -> (the per-GPU name it sums, its help, whether it is their mean instead)
_PER_NODE = {
    "runai_gpu_utilization_per_node": ("runai_gpu_utilization_per_gpu", "GPU utilization per node, percent (mean).", True),
    "runai_gpu_memory_used_mebibytes_per_node": ("runai_gpu_memory_used_mebibytes_per_gpu", "Used GPU memory per node, MiB.", False),
    "runai_gpu_memory_total_mebibytes_per_node": ("runai_gpu_memory_total_mebibytes_per_gpu", "Total GPU memory per node, MiB.", False),
    "runai_allocated_gpu_count_per_node": ("runai_allocated_gpu_count_per_gpu", "GPUs held per node.", False),
}


def _runai_gpu_and_node_metrics(cluster_id: str, devices: dict[tuple[str, str], GpuFigures],
                                held: set[tuple[str, str]]) -> Iterator[Metric]:
    """The per-GPU series of `devices` ((node, uuid) -> figures; `held`: those a pod holds), and their per-node sums."""
    per_gpu: tuple[Series[GpuFigures], ...] = (
        ("runai_gpu_utilization_per_gpu", "GPU utilization per GPU, percent (the device's SM %).",
         lambda g: g.sm_percent if g.sm_percent is not None else g.utilization_percent),
        ("runai_gpu_memory_used_mebibytes_per_gpu", "Used GPU memory per GPU, MiB.", lambda g: _mib(g.memory_used_bytes)),
        ("runai_gpu_memory_total_mebibytes_per_gpu", "Total GPU memory per GPU, MiB.", lambda g: _mib(g.memory_total_bytes)),
        ("runai_allocated_gpu_count_per_gpu", "Whether a pod holds the GPU (0/1).",
         lambda g: 1.0 if (g.node, g.uuid) in held else 0.0),
    )
    node_sums: dict[str, dict[str, list[float]]] = {}
    gpu_rows = [([cluster_id, _gpu_label(gpu), node, uuid], gpu) for (node, uuid), gpu in sorted(devices.items())]
    for gauge in families(per_gpu, gpu_rows, ["clusterId", "gpu", "node", "uuid"]):
        for point in gauge.samples:
            node_sums.setdefault(gauge.name, {}).setdefault(point.labels["node"], []).append(point.value)
        yield gauge
    for name, (source, help_text, mean) in _PER_NODE.items():
        gauge = GaugeMetricFamily(name, help_text, labels=["clusterId", "node"])
        for node, values in sorted(node_sums.get(source, {}).items()):
            gauge.add_metric([cluster_id, node], sum(values) / len(values) if mean else sum(values))
        yield gauge


def _runai_pod_gpu_metrics(cluster_id: str, per_pod: list[tuple[WorkloadFigures, GpuFigures]]) -> Iterator[Metric]:
    """The per-pod-per-GPU series of the devices each workload's pods hold, and each pod's GPU units."""
    pod_labels = ["clusterId", "pod_name", "pod_uuid", "pod_namespace", "node", "gpu"]
    yield from families(
        (("runai_gpu_utilization_per_pod_per_gpu", "GPU utilization per pod per GPU, percent (the pod's share).",
          attrgetter("utilization_percent")),
         ("runai_gpu_memory_used_mebibytes_per_pod_per_gpu", "Used GPU memory per pod per GPU, MiB.",
          lambda g: _mib(g.memory_used_bytes))),
        [([cluster_id, gpu.pod or "", gpu.pod_uid or "", workload.namespace, gpu.node, _gpu_label(gpu)], gpu)
         for workload, gpu in per_pod],
        pod_labels,
    )
    units_by_pod: dict[tuple[str, str, str, str], float] = {}
    for workload, gpu in per_pod:
        key = (gpu.pod or "", gpu.pod_uid or "", workload.namespace, gpu.node)
        units_by_pod[key] = units_by_pod.get(key, 0.0) + gpu.units
    count = GaugeMetricFamily("runai_allocated_gpu_count_per_pod", "GPU units held per pod.", labels=pod_labels[:-1])
    for (pod, pod_uid, namespace, node), units in sorted(units_by_pod.items()):
        count.add_metric([cluster_id, pod, pod_uid, namespace, node], units)
    yield count
