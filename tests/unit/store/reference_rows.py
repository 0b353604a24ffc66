"""The embedded store's row building before it was vectorised (one Python object per part): the test oracle for rows.py.

Pure functions, no I/O: the embedded store writes what this returns, and tests check the
aggregation rules (unit-weighted utilisation, share-weighted bytes and watts, ...) directly.

Series kinds and what their key is:
  gpu            uuid|pod_uid   one device as held by one pod (pod_uid empty when unallocated)
  pod            pod_uid        one GPU pod of a workload
  workload       workload uid
  workload_node  uid|node       the workload's part on one node
  project        project name
  project_node   project|node
  node           node name      every device on the node
  cluster        ""             every device
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gpuwm.model import GpuSample, PodResources, PodStatsSample, Source
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.store.base import METRIC_INDEX, METRIC_NAMES, METRICS, utilized_gpu_seconds
from gpuwm.store.rows import POD_SUMMED, pod_host_row

SeriesKey = tuple[str, str]  # (kind, key)
Values = list[float | None]


@dataclass
class SeriesRow:
    labels: dict[str, str]
    values: Values


_SHARED = (
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_limit_watts",
    "pcie_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
)
_SHARED_COLUMNS = (
    METRIC_INDEX["gpu_memory_used_bytes"],
    METRIC_INDEX["gpu_memory_total_bytes"],
    METRIC_INDEX["gpu_power_watts"],
    METRIC_INDEX["gpu_power_limit_watts"],
    METRIC_INDEX["gpu_pcie_rx_bytes_per_second"],
    METRIC_INDEX["gpu_pcie_tx_bytes_per_second"],
)


_shared_of = attrgetter(*_SHARED)


@dataclass(slots=True)
class _Part:
    """A device as seen by one holder (or by nobody): the unit of every aggregation.

    Its figures are read from the sample once (`shared` already multiplied by the share), since
    each part is summed into up to eight series.
    """

    sample: GpuSample | None
    node: str
    uuid: str
    units: float  # units held (0 when unallocated)
    share: float  # fraction of the device's extensive figures (bytes, watts) that belong to this part
    utilization_percent: float | None
    idle_seconds: float | None = None
    shared: tuple[float | None, ...] = ()
    temperature_celsius: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        sample = self.sample
        if sample is None:
            self.shared = (None,) * len(_SHARED)
            return
        share = self.share
        self.shared = tuple(None if value is None else value * share for value in _shared_of(sample))
        self.temperature_celsius = sample.temperature_celsius
        self.sm_clock_mhz = sample.sm_clock_mhz
        self.memory_clock_mhz = sample.memory_clock_mhz


@dataclass
class _Group:
    labels: dict[str, str]
    parts: list[_Part] = field(default_factory=list)
    pods: set[str] = field(default_factory=set)
    energy_joules: float | None = None
    idle_seconds: float | None = None
    figures: WorkloadFigures | ProjectFigures | ClusterFigures | None = None  # whose cumulative figures it keeps


def _aggregate(parts: Sequence[_Part], per_device: bool = False) -> Values:
    """Metric values over a set of device parts (pod-stats and energy columns are filled by the caller).

    Utilisation is weighted by units held; `per_device` (node, cluster) weights every device alike,
    so an unallocated device at 0 % pulls the fleet's figure down, as it should.
    """
    values: Values = [None] * len(METRIC_NAMES)
    util_sum = util_weight = allocated = 0.0
    shared = [0.0] * len(_SHARED)
    seen = [False] * len(_SHARED)
    temperature: float | None = None
    sm_sum = memory_clock_sum = 0.0
    sm_count = memory_clock_count = 0
    for part in parts:
        allocated += part.units
        utilization = part.utilization_percent
        if utilization is not None:
            weight = 1.0 if per_device or part.units <= 0 else part.units
            util_sum += utilization * weight
            util_weight += weight
        for index, value in enumerate(part.shared):
            if value is not None:
                shared[index] += value
                seen[index] = True
        if part.temperature_celsius is not None and (
            temperature is None or part.temperature_celsius > temperature
        ):
            temperature = part.temperature_celsius
        if part.sm_clock_mhz is not None:
            sm_sum += part.sm_clock_mhz
            sm_count += 1
        if part.memory_clock_mhz is not None:
            memory_clock_sum += part.memory_clock_mhz
            memory_clock_count += 1
    values[METRIC_INDEX["gpu_allocated"]] = allocated
    if not parts:
        return values
    values[METRIC_INDEX["gpu_utilization_percent"]] = util_sum / util_weight if util_weight > 0 else None
    for index, column in enumerate(_SHARED_COLUMNS):
        values[column] = shared[index] if seen[index] else None
    used, total = values[_SHARED_COLUMNS[0]], values[_SHARED_COLUMNS[1]]
    if used is not None and total:
        values[METRIC_INDEX["gpu_memory_utilization_percent"]] = min(100.0, 100.0 * used / total)
    values[METRIC_INDEX["gpu_temperature_celsius"]] = temperature
    values[METRIC_INDEX["gpu_sm_clock_mhz"]] = sm_sum / sm_count if sm_count else None
    values[METRIC_INDEX["gpu_memory_clock_mhz"]] = (
        memory_clock_sum / memory_clock_count if memory_clock_count else None
    )
    return values


def _device_energy(parts: Sequence[_Part]) -> float | None:
    """Sum of the devices' energy counters, each physical GPU once (MIG instances carry their parent's)."""
    by_physical: dict[str, float] = {}
    for part in parts:
        sample = part.sample
        if sample is None or sample.energy_joules is None:
            continue
        by_physical[sample.parent_uuid or sample.uuid] = sample.energy_joules
    return sum(by_physical.values()) if by_physical else None


def _fill_pod_stats(values: Values, stats: Sequence[PodStatsSample], resources: dict[str, PodResources]) -> None:
    """Summed pod by pod; CPU percent over the pods with a request / limit."""
    per_pod = [pod_host_row(sample, resources.get(sample.pod_uid)) for sample in stats]
    for position, name in enumerate(POD_SUMMED):
        present = [value for row in per_pod if (value := row[position]) is not None]
        values[METRIC_INDEX[name]] = sum(present) if present else None
    for offset, (name, denominator) in enumerate(
        (("cpu_usage_percent_of_request", "cpu_request_cores"), ("cpu_usage_percent_of_limit", "cpu_limit_cores"))
    ):
        used = [value for row in per_pod if (value := row[len(POD_SUMMED) + offset]) is not None]
        given = values[METRIC_INDEX[denominator]]
        values[METRIC_INDEX[name]] = 100.0 * sum(used) / given if used and given else None


def _index_label(index: int | None, sample: GpuSample | None) -> str:
    """The `gpu` label as the agent writes it: the NVML index on the node."""
    if index is None and sample is not None:
        index = sample.index
    return "" if index is None else str(index)


#: series kinds that often share one set of parts (and are aggregated per unit held, not per device)
_SAME_PARTS_KINDS = frozenset({"pod", "workload", "workload_node"})


def build_rows(
    samples: Sequence[GpuSample],
    workloads: Sequence[WorkloadFigures],
    projects: Sequence[ProjectFigures],
    cluster: ClusterFigures,
    pod_stats: Sequence[PodStatsSample] = (),
) -> dict[SeriesKey, SeriesRow]:
    """One row per series for this interval."""
    latest: dict[str, GpuSample] = {}
    for each in samples:
        if each.uuid not in latest or each.t >= latest[each.uuid].t:
            latest[each.uuid] = each
    stats_by_pod: dict[str, PodStatsSample] = {}
    for stat in pod_stats:
        if stat.pod_uid not in stats_by_pod or stat.t >= stats_by_pod[stat.pod_uid].t:
            stats_by_pod[stat.pod_uid] = stat
    resources = {pod.uid: pod.resources for w in workloads for pod in w.pods if pod.resources is not None}

    groups: dict[SeriesKey, _Group] = {}

    def new_group(kind: str, key: str, labels: dict[str, str]) -> _Group:
        found = groups[(kind, key)] = _Group(labels=labels)
        return found

    # `groups.get(...) or new_group(...)`: the labels are built only for a new series (a _Group is truthy)
    held_uuids: set[str] = set()
    for workload in workloads:
        base = {
            "namespace": workload.namespace,
            "workload": workload.name,
            "workload_uid": workload.uid,
            "project": workload.project,
        }
        workload_group = groups.get(("workload", workload.uid)) or new_group("workload", workload.uid, dict(base))
        workload_group.energy_joules = workload.energy_joules
        workload_group.figures = workload
        workload_group.idle_seconds = workload.idle_seconds
        project_name = workload.project
        project_group = groups.get(("project", project_name)) or new_group(
            "project", project_name, {"project": project_name}
        )
        project_group.idle_seconds = max(project_group.idle_seconds or 0.0, workload.idle_seconds)
        pod_names = {pod.uid: pod.name for pod in workload.pods}
        for gpu in workload.gpus:
            held_uuids.add(gpu.uuid)
            sample: GpuSample | None = latest.get(gpu.uuid)
            device_units = sample.device_units if sample is not None else gpu.device_units
            share = min(1.0, gpu.units / device_units) if device_units > 0 else 1.0
            part = _Part(
                sample=sample,
                node=gpu.node,
                uuid=gpu.uuid,
                units=gpu.units,
                share=share,
                utilization_percent=gpu.utilization_percent
                if gpu.utilization_percent is not None
                else (sample.sm_percent if sample is not None else None),
                idle_seconds=workload.idle_seconds,
            )
            pod_uid = gpu.pod_uid or ""
            pod_name = gpu.pod or pod_names.get(pod_uid, "")
            node = gpu.node
            gpu_key = f"{gpu.uuid}|{pod_uid}"
            gpu_group = groups.get(("gpu", gpu_key)) or new_group("gpu", gpu_key, {
                **base,
                "node": node,
                "pod": pod_name,
                "gpu": _index_label(gpu.index, sample),
                "uuid": gpu.uuid,
                "model": gpu.model or (sample.model if sample is not None and sample.model else ""),
            })
            gpu_group.parts.append(part)
            pod_key = pod_uid or f"{workload.uid}/{pod_name}"
            pod_group = groups.get(("pod", pod_key)) or new_group(
                "pod", pod_key, {**base, "pod": pod_name, "node": node}
            )
            pod_group.parts.append(part)
            pod_group.pods.add(pod_uid)
            pod_group.idle_seconds = workload.idle_seconds
            workload_group.parts.append(part)
            workload_group.pods.add(pod_uid)
            node_key = f"{workload.uid}|{node}"
            node_group = groups.get(("workload_node", node_key)) or new_group(
                "workload_node", node_key, {**base, "node": node}
            )
            node_group.parts.append(part)
            node_group.pods.add(pod_uid)
            node_group.idle_seconds = workload.idle_seconds
            project_group.parts.append(part)
            project_group.pods.add(pod_uid)
            project_node_key = f"{project_name}|{node}"
            project_node = groups.get(("project_node", project_node_key)) or new_group(
                "project_node", project_node_key, {"project": project_name, "node": node}
            )
            project_node.parts.append(part)
            project_node.pods.add(pod_uid)
            project_node.idle_seconds = max(project_node.idle_seconds or 0.0, workload.idle_seconds)
            node_total = groups.get(("node", node)) or new_group("node", node, {"node": node})
            node_total.idle_seconds = max(node_total.idle_seconds or 0.0, workload.idle_seconds)
            node_total.pods.add(pod_uid)
            cluster_group = groups.get(("cluster", "")) or new_group("cluster", "", {})
            cluster_group.idle_seconds = max(cluster_group.idle_seconds or 0.0, workload.idle_seconds)
            cluster_group.pods.add(pod_uid)
    for project in projects:
        project_group = groups.get(("project", project.name)) or new_group(
            "project", project.name, {"project": project.name}
        )
        project_group.energy_joules = project.energy_joules
        project_group.figures = project

    # node and cluster rows see every device once, held or not, whole (share 1)
    device_parts: dict[str, _Part] = {}
    for workload in workloads:
        for gpu in workload.gpus:
            known = device_parts.get(gpu.uuid)
            if known is None:
                device_sample = latest.get(gpu.uuid)
                device_parts[gpu.uuid] = _Part(
                    sample=device_sample,
                    node=gpu.node,
                    uuid=gpu.uuid,
                    units=gpu.units,
                    share=1.0,
                    utilization_percent=device_sample.sm_percent
                    if device_sample is not None
                    else gpu.sm_percent,
                )
            else:
                known.units += gpu.units
    for uuid, free in latest.items():
        if uuid not in held_uuids:
            device_parts[uuid] = _Part(
                sample=free,
                node=free.node,
                uuid=uuid,
                units=0.0,
                share=1.0,
                utilization_percent=free.sm_percent,
            )
            free_labels = {
                "node": free.node,
                "gpu": _index_label(None, free),
                "uuid": uuid,
                "pod": "",
                "model": free.model or "",
            }
            (groups.get(("gpu", f"{uuid}|")) or new_group("gpu", f"{uuid}|", free_labels)).parts.append(
                device_parts[uuid]
            )
    for part in device_parts.values():
        (groups.get(("node", part.node)) or new_group("node", part.node, {"node": part.node})).parts.append(part)
        (groups.get(("cluster", "")) or new_group("cluster", "", {})).parts.append(part)

    if ("cluster", "") in groups:
        groups[("cluster", "")].figures = cluster
    rows: dict[SeriesKey, SeriesRow] = {}
    energy_column = METRIC_INDEX["gpu_energy_joules"]
    idle_column = METRIC_INDEX["gpu_idle_seconds"]
    # a one-pod workload on one node has the same parts in its pod, workload and workload_node
    # series: aggregate each distinct set of parts once
    aggregated: dict[tuple[int, ...], Values] = {}
    for (kind, key), found in groups.items():
        if kind in _SAME_PARTS_KINDS:
            identity = tuple(map(id, found.parts))
            known_values = aggregated.get(identity)
            if known_values is None:
                known_values = aggregated[identity] = _aggregate(found.parts)
            values = list(known_values)
        else:
            values = _aggregate(found.parts, per_device=kind in ("node", "cluster"))
        if kind in ("workload", "project"):
            values[energy_column] = found.energy_joules
        elif kind in ("gpu", "node", "cluster"):
            values[energy_column] = _device_energy(found.parts)
        if kind == "gpu":
            values[idle_column] = found.parts[0].idle_seconds if found.parts else None
        else:
            values[idle_column] = found.idle_seconds
        if found.figures is not None:
            for metric in METRICS:
                if metric.source is Source.FIGURES:
                    figure = getattr(found.figures, metric.field) if metric.field else utilized_gpu_seconds(found.figures)
                    values[METRIC_INDEX[metric.name]] = figure
        if kind != "gpu" and found.pods and stats_by_pod:
            _fill_pod_stats(values, [stats_by_pod[uid] for uid in found.pods if uid in stats_by_pod], resources)
        rows[(kind, key)] = SeriesRow(labels=found.labels, values=values)
    return rows
