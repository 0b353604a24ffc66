"""Turn one interval's samples and figures into one row of metric values per series, as one array.

No I/O: the embedded store writes what this returns. Each workload's *structure* (its series and
which of them each of its GPUs feeds) is found by one Python pass over its GPUs; `RowBuilder`
keeps it between intervals and redoes it only for a workload whose pods or GPUs changed, so a
steady interval reads just the figures. The *parts* (a device as held by one holder, or by
nobody) and the (series, part) pairs are arrays; the sums, means and maxima per series are
numpy reductions over the pairs, in the same order as a part-by-part loop would add them.
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
workloads for a project, node or cluster); pod stats are summed over the series' pods. The engine's
cumulative figures (`Source.FIGURES`: allocated, active, idle, unmonitored and utilized GPU-seconds,
energy) are the workload's, project's and cluster's own, as their figures say; other series have none.
"""

# ruff: noqa: B023 - the label builders (lambdas in loops) are called at once by `get`, never later

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwm.model import (
    Aggregation,
    ClusterFigures,
    GpuSample,
    PodResources,
    PodStatsSample,
    ProjectFigures,
    Source,
    WorkloadFigures,
)
from gpuwm.store.base import METRIC_INDEX, METRIC_NAMES, METRICS
from gpuwm.store.figures import FIGURE_COLUMNS, figure_values

SeriesKey = tuple[str, str]  # (kind, key)
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The catalogue's stored metrics by how a series' value is made of its parts (tests/unit/model/
# test_metric_catalogue.py checks every stored metric gets a value). Made apart, by name: utilisation
# (weighted by units held), energy (each physical GPU's counter once; the workload's own figure), idle
# seconds (the workloads' figures), GPU units held, and the ratios.
_OWN_RULE = frozenset({"gpu_utilization_percent", "gpu_energy_joules", "gpu_idle_seconds", "gpu_allocated"})
_DEVICE = [metric for metric in METRICS if metric.source is Source.GPU and metric.name not in _OWN_RULE]
#: device figures summed, a shared device counting by share (memory, power, PCIe)
_BY_SHARE = [metric for metric in _DEVICE if metric.aggregation is Aggregation.SUM]
#: device figures whose largest counts (temperature), and whose mean counts (clocks)
_DEVICE_MAX = [metric for metric in _DEVICE if metric.aggregation is Aggregation.MAX]
_DEVICE_MEAN = [metric for metric in _DEVICE if metric.aggregation is Aggregation.MEAN]
#: the device ratio (memory utilisation): (its column, the numerator's and denominator's columns)
_DEVICE_RATIOS = [
    (METRIC_INDEX[metric.name], *(METRIC_INDEX[part] for part in metric.ratio_of))
    for metric in _DEVICE if metric.ratio_of is not None
]
_SHARED_COLUMNS = [METRIC_INDEX[metric.name] for metric in _BY_SHARE]
#: per sample: the figures summed by share, the maxima, the means, then SM %, energy and device units
_SAMPLE_FIGURES_UNITS = (
    *(str(metric.field) for metric in (*_BY_SHARE, *_DEVICE_MAX, *_DEVICE_MEAN)),
    "sm_percent",
    "energy_joules",
    "device_units",
)
_MAX_AT = len(_BY_SHARE)  # the first maximum's position in a sample's figures
_MEAN_AT = _MAX_AT + len(_DEVICE_MAX)
_SM, _ENERGY, _UNITS = (_SAMPLE_FIGURES_UNITS.index(name) for name in ("sm_percent", "energy_joules", "device_units"))
_WIDTH = len(_SAMPLE_FIGURES_UNITS)
_POD_STATS = tuple(str(metric.field) for metric in METRICS if metric.source is Source.POD and metric.field)
#: (metric, `PodResources` field) from the pod spec (`PodFigures.resources`), summed as the stats are
_POD_RESOURCES = tuple((metric.name, str(metric.field)) for metric in METRICS if metric.source is Source.POD_SPEC)
#: the metrics summed over a series' pods, in the order of `pod_host_row`'s first values
POD_SUMMED: tuple[str, ...] = (*_POD_STATS, *(metric for metric, _ in _POD_RESOURCES))
#: (metric, numerator, denominator) of the pod ratios (CPU use as percent of the request, of the limit): over
#: the pods that have a denominator, so a pod without a limit adds neither its use nor a limit
#: (`pod_host_row`'s last values are the numerator where the pod has each denominator)
_POD_RATIOS = tuple(
    (metric.name, *metric.ratio_of) for metric in METRICS if metric.source is Source.POD and metric.ratio_of
)
_RATIO_PARTS = tuple((POD_SUMMED.index(numerator), POD_SUMMED.index(denominator)) for _, numerator, denominator in _POD_RATIOS)
#: the series kinds of every device alike (utilisation not weighted by units held)
_PER_DEVICE_KINDS = frozenset({"node", "cluster"})


def pod_host_row(stat: PodStatsSample, resources: PodResources | None) -> tuple[float | None, ...]:
    """One pod's host figures: `POD_SUMMED`, then each pod ratio's numerator where the pod has its denominator."""
    summed = (
        *[getattr(stat, name) for name in _POD_STATS],
        *[None if resources is None else getattr(resources, field) for _, field in _POD_RESOURCES],
    )
    return (*summed, *(summed[numerator] if summed[denominator] else None for numerator, denominator in _RATIO_PARTS))


@dataclass
class Rows:
    """One interval: `values[i]` (NaN = no value) is series `keys[i]`'s row; `labels` only for keys not known."""

    keys: list[SeriesKey]
    values: FloatArray
    labels: dict[SeriesKey, dict[str, str]] = field(default_factory=dict)


def _index_label(index: int | None, sample: GpuSample | None) -> str:
    """The `gpu` label as the agent writes it: the NVML index on the node."""
    if index is None and sample is not None:
        index = sample.index
    return "" if index is None else str(index)


def _as_array(rows: list[tuple[float | None, ...]], width: int) -> FloatArray:
    return np.array(rows, dtype=np.float64).reshape(len(rows), width)


class _Fields:
    """Read some fields of many models at once: from each one's `__dict__` (where pydantic keeps field
    values: a dict lookup, not an attribute lookup through the class), by attribute if one lacks them."""

    def __init__(self, *names: str) -> None:
        self._by_name = itemgetter(*names)
        self._by_attribute = attrgetter(*names)

    def read(self, models: Iterable[object]) -> list[Any]:
        models = models if isinstance(models, list) else list(models)
        try:
            return list(map(self._by_name, map(_dict_of, models)))
        except (KeyError, AttributeError):
            return list(map(self._by_attribute, models))


_dict_of = attrgetter("__dict__")
_sample_figures_units = _Fields(*_SAMPLE_FIGURES_UNITS)
#: per GPU: what a workload's series and pairs depend on (4), then what is read each interval
_gpu_fields = _Fields("uuid", "pod_uid", "node", "pod", "units", "utilization_percent", "sm_percent", "device_units")
_pod_fields = _Fields("uid", "name")
_workload_fields = _Fields("uid", "namespace", "name", "project", "gpus", "pods", "idle_seconds", "energy_joules")
_parent_of = _Fields("parent_uuid")
_is_none = partial(is_, None)


def _columns(rows: list[Any], width: int) -> tuple[tuple[Any, ...], ...]:
    """Rows of `width` fields as `width` columns (empty columns for no rows)."""
    return tuple(zip(*rows, strict=True)) if rows else ((),) * width


@dataclass(slots=True, eq=False)
class _Entry:
    """One workload's series and (series, GPU) pairs as slots: rebuilt only when its structure changes."""

    structure: int  # the hash of what it was built from (see `build`), not the tuples themselves
    own: tuple[int, int]  # its workload and project series
    pair_slots: Sequence[int]  # per GPU: its gpu, pod, workload, workload_node, project, project_node series
    gpu_slots: Sequence[int]
    node_slots: Sequence[int]  # per GPU: its node series
    uuids: Sequence[str]
    set_slots: Sequence[int]  # idle seconds set to the workload's: workload, pod and workload_node series
    raise_slots: Sequence[int]  # idle seconds raised to at least the workload's: project, project_node, node, cluster
    pod_members: Sequence[tuple[str, tuple[int, ...]]]  # (pod uid, its series) in the order pod sets are filled
    labels: dict[SeriesKey, dict[str, str]] | None  # of its series the store did not know when it was built


class RowBuilder:
    """`build_rows` interval after interval, keeping each workload's series and pairs between calls.

    A workload whose structure (namespace, name, project, pods, and each GPU's uuid, pod and node)
    is the one of the previous call reuses its entry; only the figures are read again. Series get
    a *slot* that lasts between calls (the table is rebuilt once it holds twice the series in use).
    The rows are those `build_rows` gives, the same bits: the same additions in the same order.
    Labels come for series not in `known` when a workload's entry is built or while they stay unknown;
    a caller that makes `known` forget series (a rolled-back write) calls `clear`.
    """

    #: slots kept beyond twice those in use before the table is rebuilt (series of ended workloads)
    SLACK = 4096

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every entry and slot (the next call builds everything)."""
        self._slots: dict[SeriesKey, int] = {}
        self._keys: list[SeriesKey] = []
        self._per_device = bytearray()  # per slot: a node or cluster series (utilisation not weighted)
        self._entries: dict[str, _Entry] = {}  # by workload uid
        self._in_order: list[_Entry] = []  # the entries of the last call's workloads, in order ...
        self._signature: object = None  # ... and their structure (see `build`)
        self._layout: _Layout | None = None
        self._in_use = 0

    def _slot(self, kind: str, key: str) -> int:
        series = (kind, key)
        found = self._slots.get(series)
        if found is None:
            found = self._slots[series] = len(self._keys)
            self._keys.append(series)
            self._per_device.append(kind in _PER_DEVICE_KINDS)
        return found

    def _slot_getter(
        self, known: Container[SeriesKey], labels: dict[SeriesKey, dict[str, str]]
    ) -> Callable[[str, str, Callable[[], dict[str, str]]], int]:
        """`get(kind, key, make)`: the slot of series (kind, key), `make()` its labels, put in `labels` where
        `known` lacks them."""

        def get(kind: str, key: str, make: Callable[[], dict[str, str]]) -> int:
            found = self._slot(kind, key)
            if (kind, key) not in known and (kind, key) not in labels:
                labels[(kind, key)] = make()
            return found

        return get

    def _entry(
        self, workload: WorkloadFigures, structure: int, latest: dict[str, GpuSample], known: Container[SeriesKey],
    ) -> _Entry:
        """The series and pairs of one workload, as the part-by-part loop finds them."""
        labels: dict[SeriesKey, dict[str, str]] = {}
        get = self._slot_getter(known, labels)
        uid = workload.uid
        base = {"namespace": workload.namespace, "workload": workload.name, "workload_uid": uid,
                "project": workload.project}
        project_name = workload.project
        workload_series = get("workload", uid, lambda: dict(base))
        project_series = get("project", project_name, lambda: {"project": project_name})
        pair_slots: list[int] = []
        gpu_slots: list[int] = []
        node_slots: list[int] = []
        uuids: list[str] = []
        set_slots = [workload_series]
        raise_slots = [project_series]
        pod_members: list[tuple[str, tuple[int, ...]]] = []
        pod_names = {pod.uid: pod.name for pod in workload.pods}
        holders: dict[tuple[str, str], tuple[int, int, int, int, int, int]] = {}
        for gpu in workload.gpus:
            pod_uid = gpu.pod_uid or ""
            node = gpu.node
            holder = holders.get((pod_uid, node))
            if holder is None:
                pod_name = gpu.pod or pod_names.get(pod_uid, "")
                pod_series = get("pod", pod_uid or f"{uid}/{pod_name}", lambda: {**base, "pod": pod_name, "node": node})
                node_series = get("workload_node", f"{uid}|{node}", lambda: {**base, "node": node})
                project_node = get("project_node", f"{project_name}|{node}", lambda: {"project": project_name, "node": node})
                node_total = get("node", node, lambda: {"node": node})
                cluster_series = get("cluster", "", lambda: {})
                set_slots += (pod_series, node_series)
                raise_slots += (project_node, node_total, cluster_series)
                pod_members.append((pod_uid, (pod_series, workload_series, node_series, project_series,
                                                    project_node, node_total, cluster_series)))
                holder = holders[(pod_uid, node)] = (
                    pod_series, workload_series, node_series, project_series, project_node, node_total
                )
            sample = latest.get(gpu.uuid)
            gpu_series = get("gpu", f"{gpu.uuid}|{pod_uid}", lambda: {
                **base,
                "node": node,
                "pod": gpu.pod or pod_names.get(pod_uid, ""),
                "gpu": _index_label(gpu.index, sample),
                "uuid": gpu.uuid,
                "model": gpu.model or (sample.model if sample is not None and sample.model else ""),
            })
            pair_slots += (gpu_series, *holder[:5])
            gpu_slots.append(gpu_series)
            node_slots.append(holder[5])
            uuids.append(gpu.uuid)
        # tuples: one allocation each instead of a list's two (every workload's entry stays in memory)
        return _Entry(
            structure, (workload_series, project_series), tuple(pair_slots), tuple(gpu_slots), tuple(node_slots),
            tuple(uuids), tuple(set_slots), tuple(raise_slots), tuple(pod_members), labels or None,
        )

    def build(
        self,
        samples: Sequence[GpuSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
        known: Container[SeriesKey] = frozenset(),
        workload_figures: FloatArray | None = None,
    ) -> Rows:
        """One row per series for this interval (see `build_rows`); `workload_figures`: the workloads'
        `figure_values` where the caller has them already."""
        if len(self._keys) > 2 * self._in_use + self.SLACK:
            self.clear()  # slots of series gone long ago: start a fresh table
        latest: dict[str, GpuSample] = {}
        for each in samples:
            if each.uuid not in latest or each.t >= latest[each.uuid].t:
                latest[each.uuid] = each
        sample_list = list(latest.values())
        # per sample (column): the 11 figures, then device units (rows); a last column of NaN for "no sample" (-1)
        figures = np.full((_WIDTH, len(sample_list) + 1), np.nan)
        figures[:, :-1] = _as_array(_sample_figures_units.read(sample_list), _WIDTH).T
        stats_by_pod: dict[str, PodStatsSample] = {}
        for stat in pod_stats:
            if stat.pod_uid not in stats_by_pod or stat.t >= stats_by_pod[stat.pod_uid].t:
                stats_by_pod[stat.pod_uid] = stat

        # each workload's entry (reused while its structure holds) and this interval's figures
        labels: dict[SeriesKey, dict[str, str]] = {}
        # whole columns at once, by C loops (a comprehension per GPU costs as much as reading its fields)
        uids, namespaces, names, project_names, gpu_lists, pod_lists, idle_of, energy_of = _columns(
            _workload_fields.read(workloads), 8
        )
        gpu_columns = _columns(_gpu_fields.read(list(chain.from_iterable(gpu_lists))), 8)
        pod_columns = _columns(_pod_fields.read(list(chain.from_iterable(pod_lists))), 2)
        # the structure of every workload at once: while it is the previous interval's, every entry is reused
        gpu_counts = tuple(map(len, gpu_lists))
        pod_counts = tuple(map(len, pod_lists))
        signature = (uids, namespaces, names, project_names, gpu_counts, gpu_columns[:4], pod_counts, pod_columns)
        if signature == self._signature:
            in_order = self._in_order
        else:
            before = self._entries
            entries: dict[str, _Entry] = {}
            in_order = []
            gpu_structures = list(zip(*gpu_columns[:4], strict=True))
            pod_keys = list(zip(*pod_columns, strict=True))
            gpu_at = pod_at = 0
            for position, workload in enumerate(workloads):
                gpu_end, pod_end = gpu_at + gpu_counts[position], pod_at + pod_counts[position]
                structure = (uids[position], namespaces[position], names[position], project_names[position],
                             tuple(pod_keys[pod_at:pod_end]), tuple(gpu_structures[gpu_at:gpu_end]))
                gpu_at, pod_at = gpu_end, pod_end
                entry = before.get(workload.uid)
                structure_hash = hash(structure)  # a 64-bit hash: an unseen change is a ~2^-61 chance
                if entry is None or entry.structure != structure_hash:
                    entry = self._entry(workload, structure_hash, latest, known)
                entries[workload.uid] = entry
                in_order.append(entry)
            self._entries = entries
            self._in_order = in_order
            self._signature = signature
            del gpu_structures, pod_keys
        # what only the structure needed goes before the values come (the signature kept is the last one's)
        gpu_values = gpu_columns[4:]
        del signature, uids, namespaces, names, project_names, gpu_lists, gpu_columns, pod_columns, gpu_counts, pod_counts
        for entry in in_order:
            if entry.labels is not None:
                pending = {key: value for key, value in entry.labels.items() if key not in known}
                for key, value in pending.items():
                    labels.setdefault(key, value)
                entry.labels = pending or None

        get = self._slot_getter(known, labels)
        project_slots = [get("project", project.name, lambda: {"project": project.name}) for project in projects]
        # unallocated devices: a gpu series each (no pod), and a whole-device part for node and cluster
        layout = self._layout
        held_uuids: Mapping[str, object]
        if layout is not None and layout.entries == in_order:
            held_uuids = layout.first
        else:
            held_uuids = dict.fromkeys(uuid for entry in in_order for uuid in entry.uuids)
        if len(latest) == len(held_uuids) and latest.keys() == held_uuids.keys():
            free_rows: list[int] = []
        else:
            free_rows = [row for row, uuid in enumerate(latest) if uuid not in held_uuids]
        free_series: list[int] = []
        free_nodes: list[int] = []
        for row in free_rows:
            free = sample_list[row]
            free_series.append(get("gpu", f"{free.uuid}|", lambda: {
                "node": free.node, "gpu": _index_label(None, free), "uuid": free.uuid, "pod": "",
                "model": free.model or "",
            }))
            free_nodes.append(get("node", free.node, lambda: {"node": free.node}))
        any_device = bool(held_uuids) or bool(free_rows)
        cluster_slot = get("cluster", "", lambda: {}) if any_device else -1
        extra = (tuple(project_slots), tuple(free_series), tuple(free_nodes), cluster_slot)
        if layout is None or layout.entries != in_order or layout.extra != extra:
            layout = self._layout = self._assemble(in_order, extra)
        self._in_use = layout.count
        resources_by_pod: dict[str, PodResources] = {}
        if stats_by_pod:
            for pods in pod_lists:
                for pod in pods:
                    if pod.resources is not None:
                        resources_by_pod[pod.uid] = pod.resources
        rows = layout.fill(
            latest, sample_list, figures, gpu_values, idle_of, energy_of, [each.energy_joules for each in projects],
            free_rows, stats_by_pod, labels, resources_by_pod,
        )
        if workload_figures is None:
            workload_figures = figure_values(workloads)
        layout.fill_figures(rows.values, workload_figures, figure_values(projects), figure_values([cluster]))
        return rows

    def _assemble(self, entries: list[_Entry], extra: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]) -> _Layout:
        """The parts, pairs and series of an interval's entries (reused while they and `extra` stay the same)."""
        project_slots, free_series, free_nodes, cluster_slot = extra
        own: list[int] = []
        pair_slots: list[int] = []
        gpu_slots: list[int] = []
        node_slots: list[int] = []
        uuids: list[str] = []
        gpu_workload: list[int] = []
        set_workload: dict[int, int] = {}  # idle set: the last workload's
        raise_slots: list[int] = []
        raise_workload: list[int] = []
        energy_workload: dict[int, int] = {}
        for position, entry in enumerate(entries):
            for slot in entry.set_slots:
                set_workload[slot] = position
            raise_slots += entry.raise_slots
            raise_workload += [position] * len(entry.raise_slots)
            energy_workload[entry.own[0]] = position
            own += entry.own
            pair_slots += entry.pair_slots
            gpu_slots += entry.gpu_slots
            node_slots += entry.node_slots
            uuids += entry.uuids
            gpu_workload += [position] * len(entry.uuids)
        energy_project = {slot: position for position, slot in enumerate(project_slots)}

        # held parts 0..G-1 (one per workload GPU), whole-device parts G..G+D-1, free devices after
        held = len(uuids)
        first: dict[str, int] = {}  # uuid -> its first GPU position: node and cluster see each device once
        for position, uuid in enumerate(uuids):
            first.setdefault(uuid, position)
        device_first = np.fromiter(first.values(), dtype=np.int64, count=len(first))
        devices = len(device_first)
        device_of_position = np.zeros(held, dtype=np.int64)
        device_of_position[device_first] = np.arange(devices)
        device_of_gpu = device_of_position[np.fromiter((first[uuid] for uuid in uuids), dtype=np.int64, count=held)]
        free_count = len(free_series)
        first_free = held + devices
        free_parts = np.arange(first_free, first_free + free_count, dtype=np.int64)
        device_parts = np.concatenate((np.arange(held, held + devices, dtype=np.int64), free_parts))
        all_devices = devices + free_count
        node_slot_array = np.array(node_slots, dtype=np.int64)
        device_node_slots = np.concatenate((node_slot_array[device_first], np.array(free_nodes, dtype=np.int64)))
        gpu_slot_array = np.array(gpu_slots, dtype=np.int64)
        free_slot_array = np.array(free_series, dtype=np.int64)
        slots_of_pairs = np.concatenate((
            np.array(pair_slots, dtype=np.int64),
            free_slot_array,
            device_node_slots,
            np.full(all_devices, cluster_slot, dtype=np.int64),
        ))
        pairs_p = np.concatenate((np.repeat(np.arange(held, dtype=np.int64), 6), free_parts, device_parts, device_parts))

        # the series of this interval, in slot order, and each slot's row
        raise_array = np.array(raise_slots, dtype=np.int64)
        present = np.unique(np.concatenate((
            slots_of_pairs, np.array(own, dtype=np.int64), raise_array, np.array(project_slots, dtype=np.int64)
        )))
        count = len(present)
        row_of = np.full(len(self._keys), -1, dtype=np.int64)
        row_of[present] = np.arange(count)
        keys = self._keys
        gpu_series_slots, first_holder = np.unique(gpu_slot_array, return_index=True)
        return _Layout(
            entries=entries,
            extra=extra,
            first=first,
            uuids=uuids,
            held=held,
            devices=devices,
            device_first=device_first,
            device_of_gpu=device_of_gpu,
            count=count,
            keys=[keys[slot] for slot in present.tolist()],
            row_of=row_of,
            per_device=np.frombuffer(bytes(self._per_device), dtype=np.uint8)[present].astype(np.bool_),
            pairs_s=row_of[slots_of_pairs],
            pairs_p=pairs_p,
            gpu_rows=row_of[np.concatenate((gpu_slot_array, free_slot_array))],
            gpu_parts=np.concatenate((np.arange(held, dtype=np.int64), free_parts)),
            device_parts=device_parts,
            device_rows=row_of[device_node_slots],
            cluster_rows=np.full(all_devices, row_of[cluster_slot] if all_devices else -1, dtype=np.int64),
            set_rows=row_of[np.fromiter(set_workload, dtype=np.int64, count=len(set_workload))],
            set_workload=np.fromiter(set_workload.values(), dtype=np.int64, count=len(set_workload)),
            raise_rows=row_of[raise_array],
            raise_workload=np.array(raise_workload, dtype=np.int64),
            gpu_idle_rows=row_of[gpu_series_slots],
            gpu_idle_workload=np.array(gpu_workload, dtype=np.int64)[first_holder],
            energy_rows=row_of[np.fromiter(energy_workload, dtype=np.int64, count=len(energy_workload))],
            energy_workload=np.fromiter(energy_workload.values(), dtype=np.int64, count=len(energy_workload)),
            energy_project_rows=row_of[np.fromiter(energy_project, dtype=np.int64, count=len(energy_project))],
            energy_project=np.fromiter(energy_project.values(), dtype=np.int64, count=len(energy_project)),
            cluster_row=int(row_of[cluster_slot]) if cluster_slot >= 0 else -1,
        )


@dataclass(eq=False)
class _Layout:
    """An interval's parts, (series, part) pairs and series rows, for given entries: only figures change."""

    entries: list[_Entry]
    extra: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]  # projects', free devices', cluster slots
    first: dict[str, int]  # held uuid -> its first GPU position
    uuids: list[str]  # per GPU
    held: int
    devices: int
    device_first: IntArray
    device_of_gpu: IntArray
    count: int
    keys: list[SeriesKey]
    row_of: IntArray  # slot -> row (-1: not in this interval)
    per_device: npt.NDArray[np.bool_]
    pairs_s: IntArray
    pairs_p: IntArray
    gpu_rows: IntArray  # the gpu series' rows, held GPUs then free devices ...
    gpu_parts: IntArray  # ... and their parts
    device_parts: IntArray  # every device once (held, then free) ...
    device_rows: IntArray  # ... its node series' row
    cluster_rows: IntArray
    set_rows: IntArray  # idle seconds: the workload's (the last one setting it) ...
    set_workload: IntArray
    raise_rows: IntArray  # ... the longest of its workloads' but at least 0 ...
    raise_workload: IntArray
    gpu_idle_rows: IntArray  # ... its first holder's
    gpu_idle_workload: IntArray
    energy_rows: IntArray
    energy_workload: IntArray
    energy_project_rows: IntArray
    energy_project: IntArray
    cluster_row: int  # -1: no cluster series (no device)
    members: tuple[IntArray, list[str]] | None = None  # (series row, pod uid) of each series' pods, when pod stats come
    sample_order: tuple[list[str], list[str | None]] | None = None  # the last samples' uuids and parents ...
    sample_rows: IntArray | None = None  # ... each GPU's sample row (-1: none) ...
    physical: IntArray | None = None  # ... each sample's physical GPU
    physical_count: int = 0

    def fill(
        self,
        latest: dict[str, GpuSample],
        sample_list: list[GpuSample],
        figures: FloatArray,  # [figure, sample] (see `build`)
        gpu_values: Sequence[Sequence[Any]],  # per GPU field: units, utilisation, SM %, device units
        idle_of: Sequence[float],
        energy_of: Sequence[float | None],
        project_energy: Sequence[float | None],
        free_rows: list[int],
        stats_by_pod: dict[str, PodStatsSample],
        labels: dict[SeriesKey, dict[str, str]],
        resources_by_pod: Mapping[str, PodResources] | None = None,
    ) -> Rows:
        """This interval's rows from its samples and figures."""
        held, devices = self.held, self.devices
        # each GPU's sample row and each sample's physical GPU: the last interval's while the samples'
        # devices come in the same order
        order = (list(latest), _parent_of.read(sample_list))
        if order == self.sample_order and self.sample_rows is not None and self.physical is not None:
            rows, physical, physical_count = self.sample_rows, self.physical, self.physical_count
        else:
            sample_row = {uuid: row for row, uuid in enumerate(latest)}
            rows = np.fromiter((sample_row.get(uuid, -1) for uuid in self.uuids), dtype=np.int64, count=held)
            physical_code: dict[str, int] = {}
            physical = np.array(
                [physical_code.setdefault(each.parent_uuid or each.uuid, len(physical_code)) for each in sample_list],
                dtype=np.int64,
            )
            physical_count = len(physical_code)
            self.sample_order, self.sample_rows, self.physical, self.physical_count = order, rows, physical, physical_count
        values_of_gpu = np.array(gpu_values, dtype=np.float64).reshape(4, held).T
        units = values_of_gpu[:, 0]
        sampled = rows >= 0
        device_units = np.where(sampled, figures[_UNITS][rows], values_of_gpu[:, 3])
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(device_units > 0, np.fmin(1.0, units / device_units), 1.0)
        no_util = np.fromiter(map(_is_none, gpu_values[1]), dtype=np.bool_, count=held)
        util = np.where(no_util, figures[_SM][rows], values_of_gpu[:, 1])
        device_first = self.device_first
        device_rows = rows[device_first]
        device_util = np.where(device_rows >= 0, figures[_SM][device_rows], values_of_gpu[device_first, 2])
        free_count = len(free_rows)
        free_row_array = np.array(free_rows, dtype=np.int64)
        sample_of_part = np.concatenate((rows, device_rows, free_row_array))
        parts = _Parts(
            sample=sample_of_part,
            units=np.concatenate((units, np.bincount(self.device_of_gpu, weights=units, minlength=devices),
                                  np.zeros(free_count))),
            share=np.concatenate((share, np.ones(devices + free_count))),
            util=np.concatenate((util, device_util, figures[_SM][free_row_array])),
        )
        del values_of_gpu, units, device_units, share, util, device_util  # in `parts` now: not alive beside the values
        count = self.count
        values = _aggregate(count, self.per_device, figures, parts, self.pairs_s, self.pairs_p)

        # energy: the workload's and project's own; for gpu, node and cluster the devices' counters,
        # each physical GPU once (a MIG instance carries its parent's counter)
        energy = np.full(count, np.nan)
        if len(self.energy_rows):
            energy[self.energy_rows] = np.array(energy_of, dtype=np.float64)[self.energy_workload]
        if len(self.energy_project_rows):
            energy[self.energy_project_rows] = np.array(project_energy, dtype=np.float64)[self.energy_project]
        counter = figures[_ENERGY][:-1]
        gpu_pairs = self.gpu_rows
        gpu_rows = sample_of_part[self.gpu_parts]
        energy[gpu_pairs] = np.nan
        has_sample = gpu_rows >= 0
        energy[gpu_pairs[has_sample]] = counter[gpu_rows[has_sample]]  # one device: its own counter
        device_sample_rows = sample_of_part[self.device_parts]
        for owners in (self.device_rows, self.cluster_rows):
            energy[owners] = np.nan
            usable = device_sample_rows >= 0
            if counter.size:  # an interval with no sample at all has no counter to read
                usable &= ~np.isnan(counter[np.maximum(device_sample_rows, 0)])
            _sum_once_per_physical(
                energy, owners[usable], physical[device_sample_rows[usable]], counter[device_sample_rows[usable]],
                physical_count,
            )
        values[:, METRIC_INDEX["gpu_energy_joules"]] = energy
        # idle seconds: the workload's (workload, pod, workload_node), the longest of the workloads'
        # but at least 0 (project, project_node, node, cluster), a gpu series' first holder's
        idle_seconds = np.full(count, np.nan)
        idle = np.array(idle_of, dtype=np.float64)
        if len(idle):
            idle_seconds[self.set_rows] = idle[self.set_workload]
            idle_seconds[self.raise_rows] = 0.0
            np.fmax.at(idle_seconds, self.raise_rows, idle[self.raise_workload])
            idle_seconds[self.gpu_idle_rows] = idle[self.gpu_idle_workload]
        values[:, METRIC_INDEX["gpu_idle_seconds"]] = idle_seconds
        # in `values` now: the pod stats' temporaries come without them
        del parts, sample_of_part, energy, idle_seconds, idle, device_sample_rows, gpu_rows, has_sample
        if stats_by_pod:
            if self.members is None:
                # each series' pods as a set filled in workload order (sums go in the set's order, as ever)
                pods: dict[int, set[str]] = {}
                for entry in self.entries:
                    for pod_uid, slots in entry.pod_members:
                        for slot in slots:
                            pods.setdefault(slot, set()).add(pod_uid)
                member_slots = [slot for slot, uids in pods.items() for _ in uids]
                self.members = (self.row_of[np.array(member_slots, dtype=np.int64)],
                                [uid for uids in pods.values() for uid in uids])
            _sum_pod_stats(*self.members, stats_by_pod, resources_by_pod or {}, values)
        return Rows(keys=self.keys, values=values, labels=labels)

    def fill_figures(
        self, values: FloatArray, workload_figures: FloatArray, project_figures: FloatArray, cluster_figures: FloatArray,
    ) -> None:
        """The engine's cumulative figures (`figure_values`) into the workload, project and cluster rows."""
        if len(self.energy_rows):
            values[np.ix_(self.energy_rows, FIGURE_COLUMNS)] = workload_figures[self.energy_workload]
        if len(self.energy_project_rows):
            values[np.ix_(self.energy_project_rows, FIGURE_COLUMNS)] = project_figures[self.energy_project]
        if self.cluster_row >= 0:
            values[self.cluster_row, FIGURE_COLUMNS] = cluster_figures[0]


def build_rows(
    samples: Sequence[GpuSample],
    workloads: Sequence[WorkloadFigures],
    projects: Sequence[ProjectFigures],
    cluster: ClusterFigures,
    pod_stats: Sequence[PodStatsSample] = (),
    known: Container[SeriesKey] = frozenset(),
) -> Rows:
    """One row per series for this interval; labels are built only for series not in `known`."""
    return RowBuilder().build(samples, workloads, projects, cluster, pod_stats, known)


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


def _aggregate(
    count: int, per_device_series: npt.NDArray[np.bool_], columns: FloatArray, parts: _Parts, pairs_s: IntArray,
    pairs_p: IntArray,
) -> FloatArray:
    """The device figures of every series from its parts (energy, idle and pod stats are the caller's).

    `columns[figure, row]`: the samples' figures, with a last column of NaN for parts without one.
    A NaN term is added as 0.0 (x + 0.0 is x: the sums are those of the non-NaN terms, same order).
    Each figure is made per part first and gathered into the pairs in one buffer used again and again:
    pair-long arrays are what made the store thread's peak beside the values (bench/README.md).
    """
    pair_count = np.bincount(pairs_s, minlength=count)  # terms per series, NaN or not
    terms = np.empty(len(pairs_p))  # the pairs' terms of one figure at a time

    def sums(part_terms: FloatArray | None = None) -> tuple[FloatArray, IntArray]:
        """Per series: the sum of its non-NaN terms and how many there are; the terms are `part_terms`
        gathered into the pairs, or `terms` as they stand (overwritten: NaN becomes 0.0)."""
        if part_terms is not None:
            np.take(part_terms, pairs_p, out=terms, mode="clip")
        missing = np.isnan(terms)
        terms[missing] = 0.0
        total: FloatArray = np.bincount(pairs_s, weights=terms, minlength=count).astype(np.float64, copy=False)
        return total, pair_count - np.bincount(pairs_s[missing], minlength=count)

    # units held and utilisation weighted by them first: their pair-long weights are gone before `values` comes
    np.take(parts.units, pairs_p, out=terms, mode="clip")
    allocated = np.bincount(pairs_s, weights=terms, minlength=count)
    weight = np.where(per_device_series[pairs_s] | (terms <= 0), 1.0, terms)
    np.take(parts.util, pairs_p, out=terms, mode="clip")
    np.multiply(terms, weight, out=terms)
    util_sum, _ = sums()
    weight[np.isnan(parts.util)[pairs_p]] = np.nan
    np.copyto(terms, weight)
    del weight
    utilization = _mean(util_sum, sums()[0])
    del util_sum
    values = np.full((count, len(METRIC_NAMES)), np.nan)
    values[:, METRIC_INDEX["gpu_allocated"]] = allocated
    values[:, METRIC_INDEX["gpu_utilization_percent"]] = utilization
    del allocated, utilization
    # each figure's count-long results go into `values` at once, none left alive for the next one
    sample = parts.sample  # -1 (no sample): the NaN column
    for position, column in enumerate(_SHARED_COLUMNS):
        values[:, column] = _where_seen(*sums(columns[position][sample] * parts.share))
    for column, numerator, denominator in _DEVICE_RATIOS:
        values[:, column] = _percent_of(values[:, numerator], values[:, denominator])
    for position, metric in enumerate(_DEVICE_MAX, start=_MAX_AT):
        np.take(columns[position][sample], pairs_p, out=terms, mode="clip")
        np.nan_to_num(terms, copy=False, nan=-np.inf, posinf=np.inf, neginf=-np.inf)
        values[:, METRIC_INDEX[metric.name]] = _largest(count, pairs_s, terms)
    for position, metric in enumerate(_DEVICE_MEAN, start=_MEAN_AT):
        values[:, METRIC_INDEX[metric.name]] = _mean(*sums(columns[position][sample]))
    return values


def _where_seen(total: FloatArray, seen: IntArray) -> FloatArray:
    """A series' sum where it has a term, NaN where it has none."""
    return np.where(seen > 0, total, np.nan)


def _mean(total: FloatArray, weight: FloatArray | IntArray) -> FloatArray:
    """total / weight where the weight is above 0, NaN elsewhere."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight > 0, total / weight, np.nan)


def _percent_of(used: FloatArray, total: FloatArray) -> FloatArray:
    """used as percent of total, at most 100, NaN where either is NaN or total is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.minimum(100.0, 100.0 * used / total)
    return np.where(~np.isnan(used) & ~np.isnan(total) & (total != 0), ratio, np.nan)


def _largest(count: int, pairs_s: IntArray, terms: FloatArray) -> FloatArray:
    """Per series the largest of its terms (-inf where NaN), NaN where it has none."""
    largest = np.full(count, -np.inf)
    np.maximum.at(largest, pairs_s, terms)
    return np.where(np.isinf(largest), np.nan, largest)


def _sum_pod_stats(
    member_series: IntArray, member_uids: list[str], stats_by_pod: dict[str, PodStatsSample],
    resources_by_pod: Mapping[str, PodResources], values: FloatArray,
) -> None:
    """Pod stats and spec figures summed over each series' pods (gpu series have none), None where
    none of its pods has one; CPU use as percent of the requests and limits of the pods that have them."""
    pod_row = {uid: row for row, uid in enumerate(stats_by_pod)}
    width = len(POD_SUMMED) + len(_POD_RATIOS)
    stats = _as_array([pod_host_row(stat, resources_by_pod.get(uid)) for uid, stat in stats_by_pod.items()], width)
    rows = np.fromiter(map(pod_row.get, member_uids, repeat(-1)), dtype=np.int64, count=len(member_uids))
    kept = rows >= 0
    if not kept.any():
        return
    members = member_series[kept]
    pod_rows = rows[kept]
    del rows, kept
    count = len(values)

    def total(position: int) -> FloatArray:
        """Per series the sum of its pods' figure `position`, NaN where none of them has it (one figure at a
        time: a series-long total of each, all alive at once, was the store's peak with pod stats)."""
        column = stats[:, position][pod_rows]
        has = ~np.isnan(column)
        members_having = members[has]
        summed = np.bincount(members_having, weights=column[has], minlength=count).astype(np.float64, copy=False)
        return _where_seen(summed, np.bincount(members_having, minlength=count))

    denominators = {denominator for _, denominator in _RATIO_PARTS}
    given_totals: dict[int, FloatArray] = {}
    for position, name in enumerate(POD_SUMMED):
        summed = total(position)
        column = METRIC_INDEX[name]
        values[:, column] = np.where(np.isnan(summed), values[:, column], summed)
        if position in denominators:
            given_totals[position] = summed
        del summed
    for offset, ((name, _, _), (_, denominator)) in enumerate(zip(_POD_RATIOS, _RATIO_PARTS, strict=True)):
        used, given = total(len(POD_SUMMED) + offset), given_totals[denominator]
        with np.errstate(invalid="ignore", divide="ignore"):
            values[:, METRIC_INDEX[name]] = np.where(given > 0, 100.0 * used / given, np.nan)
