"""Turn one interval's samples and figures into one row of metric values per series.

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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.store.base import METRIC_INDEX, METRIC_NAMES

SeriesKey = tuple[str, str]  # (kind, key)
Values = list[float | None]


@dataclass
class SeriesRow:
    labels: dict[str, str]
    values: Values


@dataclass
class _Part:
    """A device as seen by one holder (or by nobody): the unit of every aggregation."""

    sample: GpuSample | None
    node: str
    uuid: str
    units: float  # units held (0 when unallocated)
    share: float  # fraction of the device's extensive figures (bytes, watts) that belong to this part
    utilization_percent: float | None
    idle_seconds: float | None = None


@dataclass
class _Group:
    labels: dict[str, str]
    parts: list[_Part] = field(default_factory=list)
    pods: set[str] = field(default_factory=set)
    energy_joules: float | None = None
    idle_seconds: float | None = None


def _weighted_mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    total, weight = 0.0, 0.0
    for value, value_weight in pairs:
        if value is not None and value_weight > 0:
            total += value * value_weight
            weight += value_weight
    return total / weight if weight > 0 else None


def _shared_sum(parts: Sequence[_Part], attribute: str) -> float | None:
    values = [(getattr(part.sample, attribute), part.share) for part in parts if part.sample is not None]
    present = [value * share for value, share in values if value is not None]
    return sum(present) if present else None


def _aggregate(parts: Sequence[_Part], per_device: bool = False) -> Values:
    """Metric values over a set of device parts (pod-stats and energy columns are filled by the caller).

    Utilisation is weighted by units held; `per_device` (node, cluster) weights every device alike,
    so an unallocated device at 0 % pulls the fleet's figure down, as it should.
    """
    values: Values = [None] * len(METRIC_NAMES)
    values[METRIC_INDEX["gpu_allocated"]] = 0.0
    if not parts:
        return values
    held = any(part.units > 0 for part in parts) and not per_device
    values[METRIC_INDEX["gpu_utilization_percent"]] = _weighted_mean(
        (part.utilization_percent, part.units if held else 1.0) for part in parts
    )
    used = _shared_sum(parts, "memory_used_bytes")
    total = _shared_sum(parts, "memory_total_bytes")
    values[METRIC_INDEX["gpu_memory_used_bytes"]] = used
    values[METRIC_INDEX["gpu_memory_total_bytes"]] = total
    if used is not None and total:
        values[METRIC_INDEX["gpu_memory_utilization_percent"]] = min(100.0, 100.0 * used / total)
    values[METRIC_INDEX["gpu_power_watts"]] = _shared_sum(parts, "power_watts")
    values[METRIC_INDEX["gpu_power_limit_watts"]] = _shared_sum(parts, "power_limit_watts")
    temperatures = [
        part.sample.temperature_celsius
        for part in parts
        if part.sample is not None and part.sample.temperature_celsius is not None
    ]
    values[METRIC_INDEX["gpu_temperature_celsius"]] = max(temperatures) if temperatures else None
    for name in ("gpu_sm_clock_mhz", "gpu_memory_clock_mhz"):
        attribute = name.removeprefix("gpu_")
        values[METRIC_INDEX[name]] = _weighted_mean(
            (getattr(part.sample, attribute), 1.0) for part in parts if part.sample is not None
        )
    values[METRIC_INDEX["gpu_pcie_rx_bytes_per_second"]] = _shared_sum(parts, "pcie_rx_bytes_per_second")
    values[METRIC_INDEX["gpu_pcie_tx_bytes_per_second"]] = _shared_sum(parts, "pcie_tx_bytes_per_second")
    values[METRIC_INDEX["gpu_allocated"]] = sum(part.units for part in parts)
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


_POD_STATS = (
    "cpu_usage_cores",
    "memory_used_bytes",
    "network_rx_bytes_per_second",
    "network_tx_bytes_per_second",
    "ephemeral_storage_used_bytes",
)


def _fill_pod_stats(values: Values, stats: Sequence[PodStatsSample]) -> None:
    for name in _POD_STATS:
        present = [getattr(sample, name) for sample in stats if getattr(sample, name) is not None]
        values[METRIC_INDEX[name]] = sum(present) if present else None


def _index_label(index: int | None, sample: GpuSample | None) -> str:
    """The `gpu` label as the agent writes it: the NVML index on the node."""
    if index is None and sample is not None:
        index = sample.index
    return "" if index is None else str(index)


def build_rows(
    samples: Sequence[GpuSample],
    workloads: Sequence[WorkloadFigures],
    projects: Sequence[ProjectFigures],
    cluster: ClusterFigures,
    pod_stats: Sequence[PodStatsSample] = (),
) -> dict[SeriesKey, SeriesRow]:
    """One row per series for this interval."""
    del cluster  # the cluster row is aggregated from the devices; its figures are kept as latest state
    latest: dict[str, GpuSample] = {}
    for each in samples:
        if each.uuid not in latest or each.t >= latest[each.uuid].t:
            latest[each.uuid] = each
    stats_by_pod: dict[str, PodStatsSample] = {}
    for stat in pod_stats:
        if stat.pod_uid not in stats_by_pod or stat.t >= stats_by_pod[stat.pod_uid].t:
            stats_by_pod[stat.pod_uid] = stat

    groups: dict[SeriesKey, _Group] = {}

    def group(kind: str, key: str, labels: dict[str, str]) -> _Group:
        found = groups.get((kind, key))
        if found is None:
            found = groups[(kind, key)] = _Group(labels=labels)
        return found

    held_uuids: set[str] = set()
    for workload in workloads:
        base = {
            "namespace": workload.namespace,
            "workload": workload.name,
            "workload_uid": workload.uid,
            "project": workload.project,
        }
        group("workload", workload.uid, dict(base)).energy_joules = workload.energy_joules
        group("workload", workload.uid, base).idle_seconds = workload.idle_seconds
        project_group = group("project", workload.project, {"project": workload.project})
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
            gpu_labels = {
                **base,
                "node": gpu.node,
                "pod": pod_name,
                "gpu": _index_label(gpu.index, sample),
                "uuid": gpu.uuid,
                "model": gpu.model or (sample.model if sample is not None and sample.model else ""),
            }
            group("gpu", f"{gpu.uuid}|{pod_uid}", gpu_labels).parts.append(part)
            pod_group = group(
                "pod", pod_uid or f"{workload.uid}/{pod_name}", {**base, "pod": pod_name, "node": gpu.node}
            )
            pod_group.parts.append(part)
            pod_group.pods.add(pod_uid)
            pod_group.idle_seconds = workload.idle_seconds
            workload_group = group("workload", workload.uid, base)
            workload_group.parts.append(part)
            workload_group.pods.add(pod_uid)
            node_group = group("workload_node", f"{workload.uid}|{gpu.node}", {**base, "node": gpu.node})
            node_group.parts.append(part)
            node_group.pods.add(pod_uid)
            node_group.idle_seconds = workload.idle_seconds
            project_group.parts.append(part)
            project_group.pods.add(pod_uid)
            project_node = group(
                "project_node",
                f"{workload.project}|{gpu.node}",
                {"project": workload.project, "node": gpu.node},
            )
            project_node.parts.append(part)
            project_node.pods.add(pod_uid)
            project_node.idle_seconds = max(project_node.idle_seconds or 0.0, workload.idle_seconds)
            node_total = group("node", gpu.node, {"node": gpu.node})
            node_total.idle_seconds = max(node_total.idle_seconds or 0.0, workload.idle_seconds)
            node_total.pods.add(pod_uid)
            cluster_group = group("cluster", "", {})
            cluster_group.idle_seconds = max(cluster_group.idle_seconds or 0.0, workload.idle_seconds)
            cluster_group.pods.add(pod_uid)
    for project in projects:
        project_group = group("project", project.name, {"project": project.name})
        project_group.energy_joules = project.energy_joules

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
            group("gpu", f"{uuid}|", free_labels).parts.append(device_parts[uuid])
    for part in device_parts.values():
        group("node", part.node, {"node": part.node}).parts.append(part)
        group("cluster", "", {}).parts.append(part)

    rows: dict[SeriesKey, SeriesRow] = {}
    energy_column = METRIC_INDEX["gpu_energy_joules"]
    idle_column = METRIC_INDEX["gpu_idle_seconds"]
    for (kind, key), found in groups.items():
        values = _aggregate(found.parts, per_device=kind in ("node", "cluster"))
        if kind in ("workload", "project"):
            values[energy_column] = found.energy_joules
        elif kind in ("gpu", "node", "cluster"):
            values[energy_column] = _device_energy(found.parts)
        if kind == "gpu":
            values[idle_column] = found.parts[0].idle_seconds if found.parts else None
        else:
            values[idle_column] = found.idle_seconds
        if kind != "gpu" and found.pods:
            _fill_pod_stats(values, [stats_by_pod[uid] for uid in found.pods if uid in stats_by_pod])
        rows[(kind, key)] = SeriesRow(labels=found.labels, values=values)
    return rows
