"""Turn one interval's samples and figures into one row of metric values per series, as one array.

No I/O: the embedded store writes what this returns. Each workload's *structure* (its series and
which of them each of its GPUs feeds) is found by one Python pass over its GPUs; `RowBuilder`
keeps it between intervals and redoes it only for a workload whose pods or GPUs changed, so a
steady interval reads just the figures. The parts, pairs and series rows are laid out as arrays
(layout.py), and each series' value is a numpy reduction over its pairs (aggregate.py, where the
rules are), in the same order as a part-by-part loop would add them.
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

Energy is the workload's or project's energyJoules, or the devices' counters (each physical GPU
once); idle seconds the workload's (the longest of its workloads for a project, node or cluster).
The engine's cumulative figures (`Source.FIGURES`: allocated, active, idle, unmonitored and utilized
GPU-seconds, energy) are the workload's, project's and cluster's own, as their figures say; other
series have none.
"""

# ruff: noqa: B023 - the label builders (lambdas in loops) are called at once by `get`, never later

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from gpuwm.model import (
    ClusterFigures,
    LatestSample,
    PodResources,
    PodStatsSample,
    ProjectFigures,
    WorkloadFigures,
)
from gpuwm.store.aggregate import POD_SUMMED, SAMPLE_FIELDS, FloatArray, as_array, pod_host_row
from gpuwm.store.figures import figure_values
from gpuwm.store.layout import (
    Entry,
    IntervalFigures,
    Layout,
    Others,
    PodMembers,
    Rows,
    SeriesKey,
    assemble,
)

__all__ = ["POD_SUMMED", "RowBuilder", "Rows", "SeriesKey", "pod_host_row"]

#: the series kinds of every device alike (utilisation not weighted by units held)
_PER_DEVICE_KINDS = frozenset({"node", "cluster"})
_WIDTH = len(SAMPLE_FIELDS)


def _index_label(index: int | None, sample: LatestSample | None) -> str:
    """The `gpu` label as the agent writes it: the NVML index on the node."""
    if index is None and sample is not None:
        index = sample.index
    return "" if index is None else str(index)


class _Fields:
    """Read some fields of many objects at once, a row of them per object."""

    def __init__(self, *names: str) -> None:
        self._read = attrgetter(*names)

    def read(self, items: Iterable[object]) -> list[Any]:
        return list(map(self._read, items))


_sample_fields = _Fields(*SAMPLE_FIELDS)
#: per GPU: what a workload's series and pairs depend on (4), then what is read each interval
_gpu_fields = _Fields("uuid", "pod_uid", "node", "pod", "units", "utilization_percent", "sm_percent", "device_units")
_pod_fields = _Fields("uid", "name")
_workload_fields = _Fields("uid", "namespace", "name", "project", "gpus", "pods", "idle_seconds", "energy_joules")


def _columns(rows: list[Any], width: int) -> tuple[tuple[Any, ...], ...]:
    """Rows of `width` fields as `width` columns (empty columns for no rows)."""
    return tuple(zip(*rows, strict=True)) if rows else ((),) * width


class _Columns(NamedTuple):
    """An interval's workloads, read field by field into columns (their GPUs' and pods' too)."""

    uids: tuple[str, ...]
    namespaces: tuple[str, ...]
    names: tuple[str, ...]
    projects: tuple[str, ...]
    gpu_lists: tuple[Any, ...]
    pod_lists: tuple[Any, ...]
    idle_seconds: tuple[float, ...]
    energy_joules: tuple[float | None, ...]
    gpus: tuple[tuple[Any, ...], ...]  # per `_gpu_fields` field, every GPU of the workloads in turn
    pods: tuple[tuple[Any, ...], ...]  # per `_pod_fields` field

    @classmethod
    def of(cls, workloads: Sequence[WorkloadFigures]) -> _Columns:
        uids, namespaces, names, projects, gpu_lists, pod_lists, idle_seconds, energy_joules = _columns(
            _workload_fields.read(workloads), 8)
        return cls(uids, namespaces, names, projects, gpu_lists, pod_lists, idle_seconds, energy_joules,
                   gpus=_columns(_gpu_fields.read(chain.from_iterable(gpu_lists)), 8),
                   pods=_columns(_pod_fields.read(chain.from_iterable(pod_lists)), 2))

    def structure(self) -> tuple[Any, ...]:
        """What every workload's series depend on: while it is the previous interval's, every entry stays."""
        return (self.uids, self.namespaces, self.names, self.projects, tuple(map(len, self.gpu_lists)),
                self.gpus[:4], tuple(map(len, self.pod_lists)), self.pods)

    def structures(self) -> Iterable[tuple[Any, ...]]:
        """Each workload's own structure (see `RowBuilder.build`), in order."""
        gpu_structures = list(zip(*self.gpus[:4], strict=True))
        pod_keys = list(zip(*self.pods, strict=True))
        gpu_at = pod_at = 0
        for position, (gpus, pods) in enumerate(zip(self.gpu_lists, self.pod_lists, strict=True)):
            gpu_end, pod_end = gpu_at + len(gpus), pod_at + len(pods)
            yield (self.uids[position], self.namespaces[position], self.names[position], self.projects[position],
                   tuple(pod_keys[pod_at:pod_end]), tuple(gpu_structures[gpu_at:gpu_end]))
            gpu_at, pod_at = gpu_end, pod_end


class _Holder(NamedTuple):
    """The series one pod's GPUs on one node feed besides their own gpu series."""

    pod: int
    workload: int
    workload_node: int
    project: int
    project_node: int
    node: int
    cluster: int


LabelledSlot = Callable[[str, str, Callable[[], dict[str, str]]], int]


def _latest_of(items: Iterable[Any], key: Callable[[Any], str]) -> dict[str, Any]:
    """The latest of `items` (by `t`) of each key, in the order the keys first come."""
    latest: dict[str, Any] = {}
    for each in items:
        name = key(each)
        if name not in latest or each.t >= latest[name].t:
            latest[name] = each
    return latest


class RowBuilder:
    """One interval's rows after another, keeping each workload's series and pairs between calls.

    A workload whose structure (namespace, name, project, pods, and each GPU's uuid, pod and node)
    is the one of the previous call reuses its entry; only the figures are read again. Series get
    a *slot* that lasts between calls (the table is rebuilt once it holds twice the series in use).
    The rows are those a new builder gives, the same bits: the same additions in the same order.
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
        self._entries: dict[str, Entry] = {}  # by workload uid
        self._in_order: list[Entry] = []  # the entries of the last call's workloads, in order ...
        self._structure: object = None  # ... and their structure (`_Columns.structure`)
        self._layout: Layout | None = None
        self._in_use = 0

    def _slot(self, kind: str, key: str) -> int:
        series = (kind, key)
        found = self._slots.get(series)
        if found is None:
            found = self._slots[series] = len(self._keys)
            self._keys.append(series)
            self._per_device.append(kind in _PER_DEVICE_KINDS)
        return found

    def _slot_getter(self, known: Container[SeriesKey], labels: dict[SeriesKey, dict[str, str]]) -> LabelledSlot:
        """`get(kind, key, make)`: the slot of series (kind, key), `make()` its labels, put in `labels` where
        `known` lacks them."""

        def get(kind: str, key: str, make: Callable[[], dict[str, str]]) -> int:
            found = self._slot(kind, key)
            if (kind, key) not in known and (kind, key) not in labels:
                labels[(kind, key)] = make()
            return found

        return get

    def _entry(
        self, workload: WorkloadFigures, structure: int, latest: dict[str, LatestSample], known: Container[SeriesKey],
    ) -> Entry:
        """The series and pairs of one workload, as the part-by-part loop finds them."""
        labels: dict[SeriesKey, dict[str, str]] = {}
        get = self._slot_getter(known, labels)
        uid = workload.uid
        base = {"namespace": workload.namespace, "workload": workload.name, "workload_uid": uid,
                "project": workload.project}
        own = (get("workload", uid, lambda: dict(base)), get("project", workload.project,
                                                             lambda: {"project": workload.project}))
        pair_slots: list[int] = []
        gpu_slots: list[int] = []
        node_slots: list[int] = []
        set_slots = [own[0]]
        raise_slots = [own[1]]
        pod_members: list[PodMembers] = []
        pod_names = {pod.uid: pod.name for pod in workload.pods}
        holders: dict[tuple[str, str], _Holder] = {}
        for gpu in workload.gpus:
            pod_uid, node = gpu.pod_uid or "", gpu.node
            pod_name = gpu.pod or pod_names.get(pod_uid, "")
            holder = holders.get((pod_uid, node))
            if holder is None:
                holder = holders[(pod_uid, node)] = _holder(get, base, own, pod_uid or f"{uid}/{pod_name}", pod_name,
                                                            node)
                set_slots += (holder.pod, holder.workload_node)
                raise_slots += (holder.project_node, holder.node, holder.cluster)
                pod_members.append(PodMembers(pod_uid, tuple(holder)))
            sample = latest.get(gpu.uuid)
            gpu_series = get("gpu", f"{gpu.uuid}|{pod_uid}", lambda: {
                **base, "node": node, "pod": pod_name, "gpu": _index_label(gpu.index, sample), "uuid": gpu.uuid,
                "model": gpu.model or (sample.model if sample is not None and sample.model else ""),
            })
            pair_slots += (gpu_series, holder.pod, holder.workload, holder.workload_node, holder.project,
                           holder.project_node)
            gpu_slots.append(gpu_series)
            node_slots.append(holder.node)
        return Entry(
            structure, own, tuple(pair_slots), tuple(gpu_slots), tuple(node_slots), tuple(gpu.uuid for gpu in workload.gpus),
            tuple(set_slots), tuple(raise_slots), tuple(pod_members), labels or None,
        )

    def build(
        self,
        samples: Sequence[LatestSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
        known: Container[SeriesKey] = frozenset(),
        workload_figures: FloatArray | None = None,
    ) -> Rows:
        """One row per series for this interval; labels are built only for series not in `known`.
        `workload_figures`: the workloads' `figure_values` where the caller has them already."""
        if len(self._keys) > 2 * self._in_use + self.SLACK:
            self.clear()  # slots of series gone long ago: start a fresh table
        latest: dict[str, LatestSample] = _latest_of(samples, attrgetter("uuid"))
        sample_list = list(latest.values())
        # per sample (column): its `SAMPLE_FIELDS`; a last column of NaN for "no sample" (row -1)
        figures = np.full((_WIDTH, len(sample_list) + 1), np.nan)
        figures[:, :-1] = as_array(_sample_fields.read(sample_list), _WIDTH).T
        stats_by_pod: dict[str, PodStatsSample] = _latest_of(pod_stats, attrgetter("pod_uid"))
        columns = _Columns.of(workloads)
        in_order = self._entries_of(workloads, columns, latest, known)
        labels = _pending_labels(in_order, known)
        get = self._slot_getter(known, labels)
        free_rows, others = self._others(projects, latest, sample_list, in_order, get)
        layout = self._layout
        if layout is None or layout.entries != in_order or layout.others != others:
            layout = self._layout = assemble(in_order, others, self._keys, bytes(self._per_device))
        self._in_use = layout.count
        interval = IntervalFigures(
            columns.gpus[4:], columns.idle_seconds, columns.energy_joules, [each.energy_joules for each in projects],
            free_rows, stats_by_pod, _resources_by_pod(columns.pod_lists) if stats_by_pod else {},
        )
        rows = layout.fill(latest, figures, interval, labels)
        if workload_figures is None:
            workload_figures = figure_values(workloads)
        layout.fill_figures(rows.values, workload_figures, figure_values(projects), figure_values([cluster]))
        return rows

    def _entries_of(self, workloads: Sequence[WorkloadFigures], columns: _Columns, latest: dict[str, LatestSample],
                    known: Container[SeriesKey]) -> list[Entry]:
        """Each workload's entry, in order: the one kept while its structure holds, else built again."""
        structure = columns.structure()
        if structure == self._structure:
            return self._in_order
        before = self._entries
        entries: dict[str, Entry] = {}
        in_order: list[Entry] = []
        for workload, own_structure in zip(workloads, columns.structures(), strict=True):
            entry = before.get(workload.uid)
            structure_hash = hash(own_structure)  # a 64-bit hash: an unseen change is a ~2^-61 chance
            if entry is None or entry.structure != structure_hash:
                entry = self._entry(workload, structure_hash, latest, known)
            entries[workload.uid] = entry
            in_order.append(entry)
        self._entries, self._in_order, self._structure = entries, in_order, structure
        return self._in_order

    def _others(self, projects: Sequence[ProjectFigures], latest: dict[str, LatestSample], samples: list[LatestSample],
                in_order: list[Entry], get: LabelledSlot) -> tuple[list[int], Others]:
        """The projects' slots, and the unallocated devices (their rows in `samples`, each device's latest, a gpu
        series each with no pod, and their node's series); the cluster's slot where there is any device."""
        project_slots = tuple(get("project", project.name, lambda: {"project": project.name}) for project in projects)
        layout = self._layout
        held_uuids: Mapping[str, object]
        if layout is not None and layout.entries == in_order:
            held_uuids = layout.first
        else:
            held_uuids = dict.fromkeys(uuid for entry in in_order for uuid in entry.uuids)
        free_rows = [row for row, uuid in enumerate(latest) if uuid not in held_uuids]
        free_gpus: list[int] = []
        free_nodes: list[int] = []
        for row in free_rows:
            free = samples[row]
            free_gpus.append(get("gpu", f"{free.uuid}|", lambda: {
                "node": free.node, "gpu": _index_label(None, free), "uuid": free.uuid, "pod": "", "model": free.model or "",
            }))
            free_nodes.append(get("node", free.node, lambda: {"node": free.node}))
        cluster = get("cluster", "", lambda: {}) if held_uuids or free_rows else -1
        return free_rows, Others(project_slots, tuple(free_gpus), tuple(free_nodes), cluster)


def _holder(get: LabelledSlot, base: dict[str, str], own: tuple[int, int], pod_key: str, pod_name: str,
            node: str) -> _Holder:
    """The series of one pod's GPUs on one node (besides each GPU's own)."""
    uid, project = base["workload_uid"], base["project"]
    return _Holder(
        pod=get("pod", pod_key, lambda: {**base, "pod": pod_name, "node": node}),
        workload=own[0],
        workload_node=get("workload_node", f"{uid}|{node}", lambda: {**base, "node": node}),
        project=own[1],
        project_node=get("project_node", f"{project}|{node}", lambda: {"project": project, "node": node}),
        node=get("node", node, lambda: {"node": node}),
        cluster=get("cluster", "", lambda: {}),
    )


def _pending_labels(entries: list[Entry], known: Container[SeriesKey]) -> dict[SeriesKey, dict[str, str]]:
    """The labels the entries hold of series `known` still lacks (what they hold of known ones goes)."""
    labels: dict[SeriesKey, dict[str, str]] = {}
    for entry in entries:
        if entry.labels is not None:
            pending = {key: value for key, value in entry.labels.items() if key not in known}
            for key, value in pending.items():
                labels.setdefault(key, value)
            entry.labels = pending or None
    return labels


def _resources_by_pod(pod_lists: Iterable[Any]) -> dict[str, PodResources]:
    """The requests and limits of each pod that has them."""
    return {pod.uid: pod.resources for pods in pod_lists for pod in pods if pod.resources is not None}
