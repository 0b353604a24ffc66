"""An interval's series, parts and (series, part) pairs as arrays, and the rows they make of its figures.

`RowBuilder` (rows.py) keeps each workload's series as an `Entry` of slots. `assemble` lays the
entries of an interval out: every held GPU is a part, every device is a part once more as a whole
(node and cluster series see each device once), and every unallocated device a part of its own. The
`Layout` stays while the entries do, so a steady interval only reads its figures into it (`fill`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gpuwm.model import LatestSample, PodResources, PodStatsSample
from gpuwm.store.aggregate import (
    ENERGY,
    SM,
    UNITS,
    FloatArray,
    IntArray,
    Pairs,
    Parts,
    aggregate,
    sum_once_per_physical,
    sum_pod_stats,
)
from gpuwm.store.base import METRIC_INDEX
from gpuwm.store.figures import FIGURE_COLUMNS

SeriesKey = tuple[str, str]  # (kind, key)


@dataclass
class Rows:
    """One interval: `values[i]` (NaN = no value) is series `keys[i]`'s row; `labels` only for keys not known."""

    keys: list[SeriesKey]
    values: FloatArray
    labels: dict[SeriesKey, dict[str, str]] = field(default_factory=dict)


class PodMembers(NamedTuple):
    """A pod's uid, and the series its stats count in (pod, workload, workload_node, project, project_node,
    node, cluster), in the order pod sets are filled."""

    pod_uid: str
    slots: tuple[int, ...]


@dataclass(slots=True, eq=False)
class Entry:
    """One workload's series and (series, GPU) pairs as slots: rebuilt only when its structure changes."""

    structure: int  # the hash of what it was built from (see `RowBuilder.build`), not the tuples themselves
    own: tuple[int, int]  # its workload and project series
    pair_slots: Sequence[int]  # per GPU: its gpu, pod, workload, workload_node, project, project_node series
    gpu_slots: Sequence[int]
    node_slots: Sequence[int]  # per GPU: its node series
    uuids: Sequence[str]
    set_slots: Sequence[int]  # idle seconds set to the workload's: workload, pod and workload_node series
    raise_slots: Sequence[int]  # idle seconds raised to at least the workload's: project, project_node, node, cluster
    pod_members: Sequence[PodMembers]
    labels: dict[SeriesKey, dict[str, str]] | None  # of its series the store did not know when it was built


class Others(NamedTuple):
    """The slots of an interval's series that no workload's entry holds."""

    projects: tuple[int, ...]
    free_gpus: tuple[int, ...]  # each unallocated device's gpu series ...
    free_nodes: tuple[int, ...]  # ... and its node's
    cluster: int  # -1: no device at all


class IntervalFigures(NamedTuple):
    """What `Layout.fill` reads of an interval besides its samples' figures."""

    gpu_values: Sequence[Sequence[Any]]  # per GPU field: units, utilisation, SM %, device units
    idle_seconds: Sequence[float]  # per workload
    energy_joules: Sequence[float | None]  # per workload
    project_energy_joules: Sequence[float | None]
    free_rows: list[int]  # the samples of unallocated devices
    stats_by_pod: dict[str, PodStatsSample]
    resources_by_pod: Mapping[str, PodResources]


class IdleRows(NamedTuple):
    """Which workload's idle seconds each series takes, by rule (positions in the interval's workloads)."""

    set_rows: IntArray  # the workload's (the last one setting it): workload, pod and workload_node series ...
    set_workload: IntArray
    raise_rows: IntArray  # ... the longest of its workloads' but at least 0: project, project_node, node, cluster ...
    raise_workload: IntArray
    gpu_rows: IntArray  # ... its first holder's: gpu series
    gpu_workload: IntArray


class OwnRows(NamedTuple):
    """The series whose energy and cumulative figures are a workload's, a project's or the cluster's own."""

    workload_rows: IntArray
    workload: IntArray  # each one's workload, by position
    project_rows: IntArray
    project: IntArray
    cluster_row: int  # -1: no cluster series (no device)


class _SampleOrder(NamedTuple):
    """Each GPU's sample row (-1: none) and each sample's physical GPU, for samples of devices in this order."""

    uuids: list[str]
    parents: list[str | None]
    rows: IntArray
    physical: IntArray
    physical_count: int


class _Members(NamedTuple):
    """The pods of each series, as (series row, pod uid) pairs, when pod stats come."""

    series_rows: IntArray
    pod_uids: list[str]


_parents = attrgetter("parent_uuid")


@dataclass(eq=False)
class Layout:
    """An interval's parts, (series, part) pairs and series rows, for given entries: only figures change."""

    entries: list[Entry]
    others: Others
    first: dict[str, int]  # held uuid -> its first GPU position
    uuids: list[str]  # per GPU
    held: int
    devices: int
    device_first: IntArray
    device_of_gpu: IntArray
    keys: list[SeriesKey]
    row_of: IntArray  # slot -> row (-1: not in this interval)
    per_device: npt.NDArray[np.bool_]
    pairs: Pairs
    gpu_rows: IntArray  # the gpu series' rows, held GPUs then free devices ...
    gpu_parts: IntArray  # ... and their parts
    device_parts: IntArray  # every device once (held, then free) ...
    device_rows: IntArray  # ... its node series' row
    cluster_rows: IntArray
    idle: IdleRows
    own: OwnRows
    members: _Members | None = None
    sample_order: _SampleOrder | None = None

    @property
    def count(self) -> int:
        """The interval's series."""
        return self.pairs.count

    def fill(self, latest: dict[str, LatestSample], figures: FloatArray, interval: IntervalFigures,
             labels: dict[SeriesKey, dict[str, str]]) -> Rows:
        """This interval's rows from its samples (`latest`, by device; `figures`: theirs, see `RowBuilder.build`)
        and its workloads' and projects' figures."""
        order = self._sample_order(latest)
        parts = self._parts(order.rows, figures, interval.gpu_values, interval.free_rows)
        values = aggregate(self.per_device, figures, parts, self.pairs)
        values[:, METRIC_INDEX["gpu_energy_joules"]] = self._energy(parts.sample, figures[ENERGY][:-1], order, interval)
        values[:, METRIC_INDEX["gpu_idle_seconds"]] = self._idle_seconds(interval.idle_seconds)
        if interval.stats_by_pod:
            members = self._members()
            sum_pod_stats(members.series_rows, members.pod_uids, interval.stats_by_pod, interval.resources_by_pod,
                          values)
        return Rows(keys=self.keys, values=values, labels=labels)

    def _sample_order(self, latest: dict[str, LatestSample]) -> _SampleOrder:
        """Each GPU's sample row and each sample's physical GPU: the last interval's while the samples'
        devices come in the same order."""
        uuids, parents = list(latest), list(map(_parents, latest.values()))
        known = self.sample_order
        if known is not None and known.uuids == uuids and known.parents == parents:
            return known
        sample_row = {uuid: row for row, uuid in enumerate(uuids)}
        rows = np.fromiter((sample_row.get(uuid, -1) for uuid in self.uuids), dtype=np.int64, count=self.held)
        physical_code: dict[str, int] = {}
        physical = np.array([physical_code.setdefault(parent or uuid, len(physical_code))
                             for uuid, parent in zip(uuids, parents, strict=True)], dtype=np.int64)
        self.sample_order = _SampleOrder(uuids, parents, rows, physical, len(physical_code))
        return self.sample_order

    def _parts(self, rows: IntArray, figures: FloatArray, gpu_values: Sequence[Sequence[Any]],
               free_rows: list[int]) -> Parts:
        """The held GPUs', the whole devices' and the free devices' parts."""
        held, devices = self.held, self.devices
        values_of_gpu = np.array(gpu_values, dtype=np.float64).reshape(4, held).T
        units = values_of_gpu[:, 0]
        device_units = np.where(rows >= 0, figures[UNITS][rows], values_of_gpu[:, 3])
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(device_units > 0, np.fmin(1.0, units / device_units), 1.0)
        # a holder's own utilisation where the engine has one, else its device's SM %
        no_util = np.fromiter((value is None for value in gpu_values[1]), dtype=np.bool_, count=held)
        util = np.where(no_util, figures[SM][rows], values_of_gpu[:, 1])
        device_rows = rows[self.device_first]
        device_util = np.where(device_rows >= 0, figures[SM][device_rows], values_of_gpu[self.device_first, 2])
        free_row_array = np.array(free_rows, dtype=np.int64)
        free_count = len(free_rows)
        return Parts(
            sample=np.concatenate((rows, device_rows, free_row_array)),
            units=np.concatenate((units, np.bincount(self.device_of_gpu, weights=units, minlength=devices),
                                  np.zeros(free_count))),
            share=np.concatenate((share, np.ones(devices + free_count))),
            util=np.concatenate((util, device_util, figures[SM][free_row_array])),
        )

    def _energy(self, sample_of_part: IntArray, counter: FloatArray, order: _SampleOrder,
                interval: IntervalFigures) -> FloatArray:
        """Energy: the workload's and project's own; for gpu, node and cluster the devices' counters,
        each physical GPU once (a MIG instance carries its parent's counter)."""
        energy = np.full(self.count, np.nan)
        own = self.own
        if len(own.workload_rows):
            energy[own.workload_rows] = np.array(interval.energy_joules, dtype=np.float64)[own.workload]
        if len(own.project_rows):
            energy[own.project_rows] = np.array(interval.project_energy_joules, dtype=np.float64)[own.project]
        gpu_rows = sample_of_part[self.gpu_parts]
        energy[self.gpu_rows] = np.nan
        has_sample = gpu_rows >= 0
        energy[self.gpu_rows[has_sample]] = counter[gpu_rows[has_sample]]  # one device: its own counter
        device_sample_rows = sample_of_part[self.device_parts]
        for owners in (self.device_rows, self.cluster_rows):
            energy[owners] = np.nan
            usable = device_sample_rows >= 0
            if counter.size:  # an interval with no sample at all has no counter to read
                usable &= ~np.isnan(counter[np.maximum(device_sample_rows, 0)])
            sum_once_per_physical(energy, owners[usable], order.physical[device_sample_rows[usable]],
                                  counter[device_sample_rows[usable]], order.physical_count)
        return energy

    def _idle_seconds(self, idle_of: Sequence[float]) -> FloatArray:
        """The workload's (workload, pod, workload_node), the longest of the workloads' but at least 0
        (project, project_node, node, cluster), a gpu series' first holder's."""
        idle_seconds = np.full(self.count, np.nan)
        idle = np.array(idle_of, dtype=np.float64)
        rule = self.idle
        if len(idle):
            idle_seconds[rule.set_rows] = idle[rule.set_workload]
            idle_seconds[rule.raise_rows] = 0.0
            np.fmax.at(idle_seconds, rule.raise_rows, idle[rule.raise_workload])
            idle_seconds[rule.gpu_rows] = idle[rule.gpu_workload]
        return idle_seconds

    def _members(self) -> _Members:
        """Each series' pods as a set filled in workload order (sums go in the set's order, as ever)."""
        if self.members is None:
            pods: dict[int, set[str]] = {}
            for entry in self.entries:
                for pod_uid, slots in entry.pod_members:
                    for slot in slots:
                        pods.setdefault(slot, set()).add(pod_uid)
            member_slots = [slot for slot, uids in pods.items() for _ in uids]
            self.members = _Members(self.row_of[np.array(member_slots, dtype=np.int64)],
                                    [uid for uids in pods.values() for uid in uids])
        return self.members

    def fill_figures(
        self, values: FloatArray, workload_figures: FloatArray, project_figures: FloatArray, cluster_figures: FloatArray,
    ) -> None:
        """The engine's cumulative figures (`figure_values`) into the workload, project and cluster rows."""
        own = self.own
        if len(own.workload_rows):
            values[np.ix_(own.workload_rows, FIGURE_COLUMNS)] = workload_figures[own.workload]
        if len(own.project_rows):
            values[np.ix_(own.project_rows, FIGURE_COLUMNS)] = project_figures[own.project]
        if own.cluster_row >= 0:
            values[own.cluster_row, FIGURE_COLUMNS] = cluster_figures[0]


@dataclass
class _EntrySlots:
    """The slots of an interval's entries, one list each in entry order; workloads by their position."""

    own: list[int] = field(default_factory=list)
    pair_slots: list[int] = field(default_factory=list)
    gpu_slots: list[int] = field(default_factory=list)
    node_slots: list[int] = field(default_factory=list)
    uuids: list[str] = field(default_factory=list)
    gpu_workload: list[int] = field(default_factory=list)
    set_workload: dict[int, int] = field(default_factory=dict)  # idle set: the last workload's
    raise_slots: list[int] = field(default_factory=list)
    raise_workload: list[int] = field(default_factory=list)
    energy_workload: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: list[Entry]) -> _EntrySlots:
        slots = cls()
        for position, entry in enumerate(entries):
            for slot in entry.set_slots:
                slots.set_workload[slot] = position
            slots.raise_slots += entry.raise_slots
            slots.raise_workload += [position] * len(entry.raise_slots)
            slots.energy_workload[entry.own[0]] = position
            slots.own += entry.own
            slots.pair_slots += entry.pair_slots
            slots.gpu_slots += entry.gpu_slots
            slots.node_slots += entry.node_slots
            slots.uuids += entry.uuids
            slots.gpu_workload += [position] * len(entry.uuids)
        return slots


def _ints(values: Sequence[int]) -> IntArray:
    return np.array(values, dtype=np.int64)


def _positions(mapping: dict[int, int]) -> tuple[IntArray, IntArray]:
    """A slot -> position map as its slots and its positions."""
    return (np.fromiter(mapping, dtype=np.int64, count=len(mapping)),
            np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping)))


def _devices(uuids: list[str]) -> tuple[dict[str, int], IntArray, IntArray]:
    """Each device's first GPU position, those positions in order, and each GPU's device."""
    first: dict[str, int] = {}  # uuid -> its first GPU position: node and cluster see each device once
    for position, uuid in enumerate(uuids):
        first.setdefault(uuid, position)
    device_first = np.fromiter(first.values(), dtype=np.int64, count=len(first))
    device_of_position = np.zeros(len(uuids), dtype=np.int64)
    device_of_position[device_first] = np.arange(len(device_first))
    device_of_gpu = device_of_position[np.fromiter((first[uuid] for uuid in uuids), dtype=np.int64, count=len(uuids))]
    return first, device_first, device_of_gpu


def assemble(entries: list[Entry], others: Others, keys: list[SeriesKey], per_device: bytes) -> Layout:
    """The parts, pairs and series of an interval's entries (reused while they and `others` stay the same).

    `keys` and `per_device`: every slot's series, and whether it sees every device alike (node, cluster).
    """
    slots = _EntrySlots.of(entries)
    first, device_first, device_of_gpu = _devices(slots.uuids)
    # held parts 0..G-1 (one per workload GPU), whole-device parts G..G+D-1, free devices after
    held, devices = len(slots.uuids), len(device_first)
    free_parts = np.arange(held + devices, held + devices + len(others.free_gpus), dtype=np.int64)
    device_parts = np.concatenate((np.arange(held, held + devices, dtype=np.int64), free_parts))
    device_node_slots = np.concatenate((_ints(slots.node_slots)[device_first], _ints(others.free_nodes)))
    slots_of_pairs = np.concatenate((_ints(slots.pair_slots), _ints(others.free_gpus), device_node_slots,
                                     np.full(len(device_parts), others.cluster, dtype=np.int64)))
    parts_of_pairs = np.concatenate((np.repeat(np.arange(held, dtype=np.int64), 6), free_parts, device_parts,
                                     device_parts))
    # the series of this interval, in slot order, and each slot's row
    present = np.unique(np.concatenate((slots_of_pairs, _ints(slots.own), _ints(slots.raise_slots),
                                        _ints(others.projects))))
    row_of = np.full(len(keys), -1, dtype=np.int64)
    row_of[present] = np.arange(len(present))
    gpu_series_slots, first_holder = np.unique(_ints(slots.gpu_slots), return_index=True)
    set_slots, set_workload = _positions(slots.set_workload)
    energy_slots, energy_workload = _positions(slots.energy_workload)
    project_slots, project_positions = _positions({slot: position for position, slot in enumerate(others.projects)})
    return Layout(
        entries=entries, others=others, first=first, uuids=slots.uuids, held=held, devices=devices,
        device_first=device_first, device_of_gpu=device_of_gpu, keys=[keys[slot] for slot in present.tolist()],
        row_of=row_of, per_device=np.frombuffer(per_device, dtype=np.uint8)[present].astype(np.bool_),
        pairs=Pairs(series=row_of[slots_of_pairs], parts=parts_of_pairs, count=len(present)),
        gpu_rows=row_of[np.concatenate((_ints(slots.gpu_slots), _ints(others.free_gpus)))],
        gpu_parts=np.concatenate((np.arange(held, dtype=np.int64), free_parts)),
        device_parts=device_parts, device_rows=row_of[device_node_slots],
        cluster_rows=np.full(len(device_parts), row_of[others.cluster] if len(device_parts) else -1, dtype=np.int64),
        idle=IdleRows(row_of[set_slots], set_workload, row_of[_ints(slots.raise_slots)], _ints(slots.raise_workload),
                      row_of[gpu_series_slots], _ints(slots.gpu_workload)[first_holder]),
        own=OwnRows(row_of[energy_slots], energy_workload, row_of[project_slots], project_positions,
                    int(row_of[others.cluster]) if others.cluster >= 0 else -1),
    )
