"""Turn one interval's samples and figures into one row of metric values per series, as one array.

Pure functions, no I/O: the embedded store writes what this returns. One Python pass over the
workloads' GPUs lists the *parts* (a device as held by one holder, or by nobody) and which
series each part belongs to; the sums, means and maxima per series are then numpy reductions
over those (series, part) pairs, in the same order as a part-by-part loop would add them.
tests/unit/store/reference_rows.py keeps the part-by-part version the tests compare against.

Series kinds and what their key is:
  gpu            uuid|pod_uid   one device as held by one pod (pod_uid empty when unallocated)
  pod            pod_uid        one GPU pod of a workload
  workload       workload uid
  workload_node  uid|node       the workload's part on one node
  project        project name
  project_node   project|node
  node           node name      every device on the node
  cluster        ""             every device

Rules: utilisation is the mean weighted by units held (node and cluster: every device alike,
so an idle unallocated device pulls the fleet's figure down); bytes, watts and PCIe rates are
summed, a shared device counting by share; temperature is the hottest device; clocks are means;
memory utilisation is used / total; energy is the workload's or project's energyJoules, or the
devices' counters (each physical GPU once); idle seconds the workload's (the longest of its
workloads for a project, node or cluster); pod stats are summed over the series' pods.
"""

# ruff: noqa: B023 - the label builders (lambdas in loops) are called at once by _Series.get, never later

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.store.base import METRIC_INDEX, METRIC_NAMES

SeriesKey = tuple[str, str]  # (kind, key)
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_SHARED_COLUMNS = [
    METRIC_INDEX[name]
    for name in (
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_pcie_rx_bytes_per_second",
        "gpu_pcie_tx_bytes_per_second",
    )
]
#: per sample: the six shared figures, then temperature, SM clock, memory clock, SM %, energy
_sample_figures = attrgetter(
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_limit_watts",
    "pcie_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "temperature_celsius",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "sm_percent",
    "energy_joules",
)
_POD_STATS = (
    "cpu_usage_cores",
    "memory_used_bytes",
    "network_rx_bytes_per_second",
    "network_tx_bytes_per_second",
    "ephemeral_storage_used_bytes",
)
_pod_stat_figures = attrgetter(*_POD_STATS)
_PER_DEVICE_KINDS = frozenset({"node", "cluster"})


@dataclass
class Rows:
    """One interval: `values[i]` (NaN = no value) is series `keys[i]`'s row; `labels` only for keys not known."""

    keys: list[SeriesKey]
    values: FloatArray
    labels: dict[SeriesKey, dict[str, str]] = field(default_factory=dict)

    def items(self) -> list[tuple[SeriesKey, list[float | None]]]:
        """(key, values with None for missing): for tests and tools, not the write path."""
        return [
            (key, [None if value != value else value for value in row])
            for key, row in zip(self.keys, self.values.tolist(), strict=True)
        ]


class _Series:
    """The series seen so far in this interval, in first-seen order, with their scalar figures."""

    def __init__(self, known: Container[SeriesKey]) -> None:
        self.known = known
        self.index: dict[SeriesKey, int] = {}
        self.keys: list[SeriesKey] = []
        self.labels: dict[SeriesKey, dict[str, str]] = {}
        # only the series that have one (most do not): cheaper than a slot per series
        self.energy: dict[int, float | None] = {}
        self.idle: dict[int, float] = {}
        self.pods: dict[int, set[str]] = {}

    def get(self, kind: str, key: str, labels: Callable[[], dict[str, str]]) -> int:
        """The series' index; `labels` is called only for a series the store does not know yet."""
        found = self.index.get((kind, key))
        if found is None:
            found = self.index[(kind, key)] = len(self.keys)
            self.keys.append((kind, key))
            if (kind, key) not in self.known:
                self.labels[(kind, key)] = labels()
        return found

    def raise_idle(self, series: int, seconds: float) -> None:
        self.idle[series] = max(self.idle.get(series) or 0.0, seconds)


def _index_label(index: int | None, sample: GpuSample | None) -> str:
    """The `gpu` label as the agent writes it: the NVML index on the node."""
    if index is None and sample is not None:
        index = sample.index
    return "" if index is None else str(index)


def _as_array(rows: list[tuple[float | None, ...]], width: int) -> FloatArray:
    return np.array(rows, dtype=np.float64).reshape(len(rows), width)


def build_rows(
    samples: Sequence[GpuSample],
    workloads: Sequence[WorkloadFigures],
    projects: Sequence[ProjectFigures],
    cluster: ClusterFigures,
    pod_stats: Sequence[PodStatsSample] = (),
    known: Container[SeriesKey] = frozenset(),
) -> Rows:
    """One row per series for this interval; labels are built only for series not in `known`."""
    del cluster  # the cluster row is aggregated from the devices; its figures are kept as latest state
    latest: dict[str, GpuSample] = {}
    for each in samples:
        if each.uuid not in latest or each.t >= latest[each.uuid].t:
            latest[each.uuid] = each
    sample_row = {uuid: row for row, uuid in enumerate(latest)}
    sample_list = list(latest.values())
    figures = _as_array([_sample_figures(each) for each in sample_list], 11)
    stats_by_pod: dict[str, PodStatsSample] = {}
    for stat in pod_stats:
        if stat.pod_uid not in stats_by_pod or stat.t >= stats_by_pod[stat.pod_uid].t:
            stats_by_pod[stat.pod_uid] = stat

    series = _Series(known)
    get = series.get
    # parts: sample row (-1: none), units, share, utilisation (NaN: none)
    part_sample: list[int] = []
    part_units: list[float] = []
    part_share: list[float] = []
    part_util: list[float | None] = []
    pair_series: list[int] = []
    pair_part: list[int] = []
    gpu_idle: dict[int, float | None] = {}  # a gpu series' idle seconds: its first part's
    held_uuids: set[str] = set()
    device_part: dict[str, int] = {}  # uuid -> its whole-device part (node and cluster series)
    device_nodes: dict[str, str] = {}
    index = series.index
    energy_pairs: list[tuple[int, int]] = []  # (gpu, node or cluster series, part): device energy counters
    for workload in workloads:
        base = {
            "namespace": workload.namespace,
            "workload": workload.name,
            "workload_uid": workload.uid,
            "project": workload.project,
        }
        idle = workload.idle_seconds
        workload_series = get("workload", workload.uid, lambda: dict(base))
        series.energy[workload_series] = workload.energy_joules
        series.idle[workload_series] = idle
        project_name = workload.project
        project_series = get("project", project_name, lambda: {"project": project_name})
        series.raise_idle(project_series, idle)
        pod_names = {pod.uid: pod.name for pod in workload.pods}
        # the pod, node, project-node and cluster series of each (pod, node) of this workload, found once
        holders: dict[tuple[str, str], tuple[str, tuple[int, int, int, int, int]]] = {}
        for gpu in workload.gpus:
            held_uuids.add(gpu.uuid)
            sample = latest.get(gpu.uuid)
            pod_uid = gpu.pod_uid or ""
            node = gpu.node
            holder = holders.get((pod_uid, node))
            if holder is None:
                pod_name = gpu.pod or pod_names.get(pod_uid, "")
                pod_series = get("pod", pod_uid or f"{workload.uid}/{pod_name}", lambda: {**base, "pod": pod_name, "node": node})
                node_series = get("workload_node", f"{workload.uid}|{node}", lambda: {**base, "node": node})
                project_node = get("project_node", f"{project_name}|{node}", lambda: {"project": project_name, "node": node})
                node_total = get("node", node, lambda: {"node": node})
                cluster_series = get("cluster", "", lambda: {})
                series.idle[pod_series] = idle
                series.idle[node_series] = idle
                for member in (project_node, node_total, cluster_series):
                    series.raise_idle(member, idle)
                for member in (pod_series, workload_series, node_series, project_series, project_node, node_total):
                    series.pods.setdefault(member, set()).add(pod_uid)
                series.pods.setdefault(cluster_series, set()).add(pod_uid)
                holder = holders[(pod_uid, node)] = (
                    pod_name, (pod_series, workload_series, node_series, project_series, project_node)
                )
            device_units = sample.device_units if sample is not None else gpu.device_units
            part = len(part_units)
            part_sample.append(sample_row[gpu.uuid] if sample is not None else -1)
            part_units.append(gpu.units)
            part_share.append(min(1.0, gpu.units / device_units) if device_units > 0 else 1.0)
            part_util.append(
                gpu.utilization_percent
                if gpu.utilization_percent is not None
                else (sample.sm_percent if sample is not None else None)
            )
            gpu_key = f"{gpu.uuid}|{pod_uid}"
            gpu_series = index.get(("gpu", gpu_key))
            if gpu_series is None:
                gpu_series = get("gpu", gpu_key, lambda: {
                    **base,
                    "node": node,
                    "pod": gpu.pod or pod_names.get(pod_uid, ""),
                    "gpu": _index_label(gpu.index, sample),
                    "uuid": gpu.uuid,
                    "model": gpu.model or (sample.model if sample is not None and sample.model else ""),
                })
                gpu_idle[gpu_series] = idle
            pair_series.append(gpu_series)
            pair_series.extend(holder[1])
            pair_part.extend((part, part, part, part, part, part))
            energy_pairs.append((gpu_series, part))
            # node and cluster rows see every device once, held or not, whole (share 1)
            whole = device_part.get(gpu.uuid)
            if whole is None:
                device_part[gpu.uuid] = len(part_units)
                device_nodes[gpu.uuid] = node
                part_sample.append(part_sample[part])
                part_units.append(gpu.units)
                part_share.append(1.0)
                part_util.append(sample.sm_percent if sample is not None else gpu.sm_percent)
            else:
                part_units[whole] += gpu.units
    for project in projects:
        series.energy[get("project", project.name, lambda: {"project": project.name})] = project.energy_joules

    # unallocated devices: a gpu series each (no pod), and a whole-device part for node and cluster
    free_rows = [row for row, uuid in enumerate(latest) if uuid not in held_uuids]
    free_series: list[int] = []
    for row in free_rows:
        free = sample_list[row]
        free_key = ("gpu", f"{free.uuid}|")
        found = index.get(free_key)
        if found is None:
            found = get("gpu", free_key[1], lambda: {
                "node": free.node, "gpu": _index_label(None, free), "uuid": free.uuid, "pod": "",
                "model": free.model or "",
            })
        free_series.append(found)
    first_free = len(part_units)
    free_parts = np.arange(first_free, first_free + len(free_rows), dtype=np.int64)
    sample_of_part = np.concatenate((np.array(part_sample, dtype=np.int64), np.array(free_rows, dtype=np.int64)))
    parts = _Parts(
        sample=sample_of_part,
        units=np.concatenate((np.array(part_units, dtype=np.float64), np.zeros(len(free_rows)))),
        share=np.concatenate((np.array(part_share, dtype=np.float64), np.ones(len(free_rows)))),
        util=np.concatenate((np.array(part_util, dtype=np.float64), figures[free_rows, 9])),
    )
    # every device once, in the order first seen: the node and cluster series' parts
    device_parts = np.concatenate((np.array(list(device_part.values()), dtype=np.int64), free_parts))
    node_names = [device_nodes[uuid] for uuid in device_part] + [sample_list[row].node for row in free_rows]
    node_series_of: dict[str, int] = {}
    for node in dict.fromkeys(node_names):
        node_series_of[node] = get("node", node, lambda: {"node": node})
    device_nodes_series = np.array([node_series_of[node] for node in node_names], dtype=np.int64)
    cluster_series = get("cluster", "", lambda: {}) if len(device_parts) else -1
    pairs_s = np.concatenate((
        np.array(pair_series, dtype=np.int64),
        np.array(free_series, dtype=np.int64),
        device_nodes_series,
        np.full(len(device_parts), cluster_series, dtype=np.int64),
    ))
    pairs_p = np.concatenate((np.array(pair_part, dtype=np.int64), free_parts, device_parts, device_parts))
    values = _aggregate(series, figures, parts, pairs_s, pairs_p)

    # energy: the workload's and project's own; for gpu, node and cluster the devices' counters,
    # each physical GPU once (a MIG instance carries its parent's counter)
    count = len(series.keys)
    energy = np.full(count, np.nan)
    _assign(energy, series.energy)
    counter = figures[:, 10]
    physical_code: dict[str, int] = {}
    physical = np.array(
        [physical_code.setdefault(each.parent_uuid or each.uuid, len(physical_code)) for each in sample_list],
        dtype=np.int64,
    )
    gpu_pairs = np.concatenate((
        np.array([member for member, _ in energy_pairs], dtype=np.int64), np.array(free_series, dtype=np.int64)
    ))
    gpu_parts = np.concatenate((np.array([part for _, part in energy_pairs], dtype=np.int64), free_parts))
    gpu_rows = sample_of_part[gpu_parts]
    energy[gpu_pairs] = np.nan
    sampled = gpu_rows >= 0
    energy[gpu_pairs[sampled]] = counter[gpu_rows[sampled]]  # one device: its own counter
    device_rows = sample_of_part[device_parts]
    for owners in (device_nodes_series, np.full(len(device_parts), cluster_series, dtype=np.int64)):
        energy[owners] = np.nan
        usable = device_rows >= 0
        if counter.size:  # an interval with no sample at all has no counter to read
            usable &= ~np.isnan(counter[np.maximum(device_rows, 0)])
        _sum_once_per_physical(
            energy, owners[usable], physical[device_rows[usable]], counter[device_rows[usable]], len(physical_code)
        )
    values[:, METRIC_INDEX["gpu_energy_joules"]] = energy
    idle_seconds = np.full(count, np.nan)
    _assign(idle_seconds, series.idle)
    _assign(idle_seconds, gpu_idle)
    values[:, METRIC_INDEX["gpu_idle_seconds"]] = idle_seconds
    if stats_by_pod:
        _sum_pod_stats(series, stats_by_pod, values)
    return Rows(keys=series.keys, values=values, labels=series.labels)


def _assign(target: FloatArray, values: dict[int, float | None] | dict[int, float]) -> None:
    """target[i] = v for each i: v of `values` (None: NaN)."""
    if values:
        target[np.fromiter(values, dtype=np.int64, count=len(values))] = np.array(
            list(values.values()), dtype=np.float64
        )


@dataclass
class _Parts:
    """Per part: its sample's row (-1: none), units held, share of the device, utilisation (NaN: none)."""

    sample: IntArray
    units: FloatArray
    share: FloatArray
    util: FloatArray


def _sum_once_per_physical(
    target: FloatArray, holders: IntArray, physical: IntArray, counters: FloatArray, physical_count: int
) -> None:
    """target[s] = the sum over s's physical GPUs of their counter (the last one seen of each),
    added in the order the GPUs were first seen (as a dict of them would)."""
    if not len(holders):
        return
    keys = holders * physical_count + physical
    unique, first = np.unique(keys, return_index=True)
    _, last_reversed = np.unique(keys[::-1], return_index=True)
    last = len(keys) - 1 - last_reversed
    order = np.argsort(first, kind="stable")
    owners = unique[order] // physical_count
    sums = np.bincount(owners, weights=counters[last[order]], minlength=len(target))
    present = np.bincount(owners, minlength=len(target)) > 0
    target[present] = sums[present]


def _aggregate(series: _Series, figures: FloatArray, parts: _Parts, pairs_s: IntArray, pairs_p: IntArray) -> FloatArray:
    """The device figures of every series from its parts (energy, idle and pod stats are the caller's)."""
    count = len(series.keys)
    values = np.full((count, len(METRIC_NAMES)), np.nan)
    units = parts.units
    values[:, METRIC_INDEX["gpu_allocated"]] = np.bincount(pairs_s, weights=units[pairs_p], minlength=count)
    rows = parts.sample[pairs_p]
    sampled = rows >= 0
    # per pair, the part's figures (NaN where the part has no sample)
    pair_figures = np.full((len(pairs_p), figures.shape[1]), np.nan)
    if len(figures):
        pair_figures[sampled] = figures[rows[sampled]]
    per_device = np.array([kind in _PER_DEVICE_KINDS for kind, _ in series.keys], dtype=np.bool_)[pairs_s]
    pair_units = units[pairs_p]
    weight = np.where(per_device | (pair_units <= 0), 1.0, pair_units)
    util = parts.util[pairs_p]
    has = ~np.isnan(util)
    util_sum = np.bincount(pairs_s[has], weights=util[has] * weight[has], minlength=count)
    util_weight = np.bincount(pairs_s[has], weights=weight[has], minlength=count)
    with np.errstate(invalid="ignore", divide="ignore"):
        values[:, METRIC_INDEX["gpu_utilization_percent"]] = np.where(
            util_weight > 0, util_sum / util_weight, np.nan
        )
    share = parts.share[pairs_p]
    for position, column in enumerate(_SHARED_COLUMNS):
        shared = pair_figures[:, position] * share
        has = ~np.isnan(shared)
        total = np.bincount(pairs_s[has], weights=shared[has], minlength=count)
        seen = np.bincount(pairs_s[has], minlength=count) > 0
        values[:, column] = np.where(seen, total, np.nan)
    used = values[:, _SHARED_COLUMNS[0]]
    total = values[:, _SHARED_COLUMNS[1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.minimum(100.0, 100.0 * used / total)
    values[:, METRIC_INDEX["gpu_memory_utilization_percent"]] = np.where(
        ~np.isnan(used) & ~np.isnan(total) & (total != 0), ratio, np.nan
    )
    temperature = pair_figures[:, 6]
    has = ~np.isnan(temperature)
    hottest = np.full(count, -np.inf)
    np.maximum.at(hottest, pairs_s[has], temperature[has])
    values[:, METRIC_INDEX["gpu_temperature_celsius"]] = np.where(np.isinf(hottest), np.nan, hottest)
    for position, name in ((7, "gpu_sm_clock_mhz"), (8, "gpu_memory_clock_mhz")):
        clock = pair_figures[:, position]
        has = ~np.isnan(clock)
        clock_sum = np.bincount(pairs_s[has], weights=clock[has], minlength=count)
        clock_count = np.bincount(pairs_s[has], minlength=count)
        with np.errstate(invalid="ignore", divide="ignore"):
            values[:, METRIC_INDEX[name]] = np.where(clock_count > 0, clock_sum / clock_count, np.nan)
    return values


def _sum_pod_stats(series: _Series, stats_by_pod: dict[str, PodStatsSample], values: FloatArray) -> None:
    """Pod stats summed over each series' pods (not for gpu series); None where none of its pods has one."""
    pod_row = {uid: row for row, uid in enumerate(stats_by_pod)}
    stats = _as_array([_pod_stat_figures(stat) for stat in stats_by_pod.values()], len(_POD_STATS))
    member_series: list[int] = []
    member_rows: list[int] = []
    for index, pods in series.pods.items():
        if series.keys[index][0] == "gpu":
            continue
        for uid in pods:
            row = pod_row.get(uid)
            if row is not None:
                member_series.append(index)
                member_rows.append(row)
    if not member_series:
        return
    members = np.array(member_series, dtype=np.int64)
    picked = stats[np.array(member_rows, dtype=np.int64)]
    count = len(series.keys)
    for position, name in enumerate(_POD_STATS):
        column = picked[:, position]
        has = ~np.isnan(column)
        total = np.bincount(members[has], weights=column[has], minlength=count)
        seen = np.bincount(members[has], minlength=count) > 0
        values[:, METRIC_INDEX[name]] = np.where(seen, total, values[:, METRIC_INDEX[name]])
