"""The accounting engine's core (`EngineCore`): pod lifecycle events and GPU samples in, DESIGN §3 sums out.

Pure and deterministic: no clock, no I/O. Every input carries its own time. A pod holding devices
is a set of *stretches* (pod, device, units, start, end], made here from its events; how a sample's
interval is accounted to the stretches it overlaps is `gpuwm.accounting.intervals`.

Late and out-of-order input: every sample and pod event is placed at its own time, as
long as it is no older than `late_event_window_seconds` behind the newest input (the
engine's clock). Affected intervals are taken back out (applied with a negative sign)
and applied again, so the results do not depend on arrival order. A sample older than
the window is dropped and counted; a pod event older than the window takes effect at the
window's edge. A second sample of the same GPU with the same time replaces the first;
a second pod event of the same pod with the same time replaces the first.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from gpuwm.accounting.batch import BatchArrays, observe_appending_chunk
from gpuwm.accounting.intervals import IntervalAccounting
from gpuwm.accounting.state import (
    INFINITY,
    EngineConfig,
    Gpu,
    Pod,
    SampleBatch,
    SampleValues,
    Stretch,
    Workload,
    sample_values,
)
from gpuwm.accounting.windows import maintain_all
from gpuwm.model import GpuSample, NamespaceEvent, PodEvent, SampleEvent, WorkloadEvent

_MAINTENANCE_EVERY_SECONDS = 30.0
#: a batch this long takes the vectorised path where it can (numpy's fixed cost pays from about here)
_VECTORISED_FROM_ROWS = 64


def _python(column: Any) -> Any:
    """A numpy column as a list of Python numbers (what the row-by-row path adds up); a list as it is."""
    return column.tolist() if hasattr(column, "tolist") else column


class _Rows:
    """A batch's columns as Python values, for its rows taken one by one (`EngineCore._observe_row`).

    `uuids` are the physical devices' (a time-sliced replica's samples are its GPU's).
    """

    def __init__(self, batch: SampleBatch, physical: list[str]) -> None:
        self.uuids, self.nodes, self.parent_uuids, self.pod_sm = physical, batch.nodes, batch.parent_uuids, batch.pod_sm
        self.device_units = batch.device_units
        self.device: list[int] = _python(batch.device)
        self.t: list[float] = _python(batch.t)
        self.sm: list[float] = _python(batch.sm)
        self.memory: list[float] = _python(batch.memory)
        self.energy: list[float] = _python(batch.energy)
        self.merged: list[float] = [0.0] * len(self.t) if batch.merged is None else _python(batch.merged)

    def values(self, row: int) -> SampleValues:
        return (self.t[row], self.sm[row], self.memory[row], self.energy[row], self.pod_sm[row],
                self.device_units[self.device[row]], self.merged[row])


def place_in_timeline(timeline: list[tuple[float, Any]], t: float, event: Any) -> int:
    """Put `event` at `t` in a (t, event) timeline in time order; one at the same `t` is replaced. Its index."""
    index = bisect.bisect_left([entry[0] for entry in timeline], t)
    if index < len(timeline) and timeline[index][0] == t:
        timeline[index] = (t, event)
    else:
        timeline.insert(index, (t, event))
    return index


def merged_runs(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` (start, end) sorted and merged where they overlap or touch; empty ones left out."""
    spans.sort()
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def physical_uuid(uuid: str) -> str:
    """`GPU-x::2` (a time-sliced replica id) is GPU-x: samples are per physical device."""
    return uuid.split("::", 1)[0] if "::" in uuid else uuid


class EngineCore(IntervalAccounting):
    """Ingestion and maintenance over the accounting arithmetic (`IntervalAccounting`); `Engine` adds the reports."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config or EngineConfig())
        self.clock = -INFINITY
        self.workload_records: dict[str, Workload] = {}
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, NamespaceEvent] = {}
        self.late_samples_dropped = 0
        self._last_maintenance = -INFINITY
        #: bumped by each sample, batch of samples, pod or namespace event: any of them may change window
        #: segments, so a memo of figures (`Engine`'s latest report's sums) stands while this stays the same
        #: (a counter, not an override per input in Engine: one more call per sample cost more than this)
        self.inputs = 0

    # ------------------------------------------------------------------ input

    def observe(self, event: NamespaceEvent | PodEvent | WorkloadEvent | SampleEvent | GpuSample) -> None:
        if isinstance(event, PodEvent):
            self.observe_pod(event)
        elif isinstance(event, NamespaceEvent):
            self.observe_namespace(event)
        elif isinstance(event, WorkloadEvent):
            self.observe_workload(event)
        else:
            self.observe_sample(event)

    def observe_workload(self, event: WorkloadEvent) -> None:
        """The workload object's own state from `event.t` on: queued or not, GPUs requested, finished, deleted.

        A workload exists from its creation with or without pods. Its state is a
        timeline like a pod's: an event older than the late window takes effect at its edge, and
        a second event at the same time replaces the first. The figures it drives (phase,
        requested GPUs, queued and wait seconds) are read at report time from the timeline.
        """
        workload = self.workload_records.get(event.uid)
        if workload is None:
            workload = self.workload_records[event.uid] = Workload(event.uid, event)
            workload.labels_key = (-INFINITY, "")  # a pod's labels name the project before the object's
        if event.created is not None and (workload.created is None or event.created < workload.created):
            workload.created = event.created
        if event.t < workload.first_seen:
            workload.first_seen = event.t
        if not workload.pods:  # before any pod: the object's own labels name the project
            workload.labels = event.labels
        workload.revision += 1
        self._advance(event.t)
        place_in_timeline(workload.timeline, max(event.t, self.boundary), event)

    def observe_namespace(self, event: NamespaceEvent) -> None:
        self.inputs += 1
        known = self.namespaces.get(event.name)
        if known is None or event.t >= known.t:
            self.namespaces[event.name] = event
        self._advance(event.t)

    def _advance(self, t: float) -> None:
        if t > self.clock:
            self.clock = t
            if t - self._last_maintenance >= _MAINTENANCE_EVERY_SECONDS:
                self._last_maintenance = t
                self._maintain()

    @property
    def boundary(self) -> float:
        """Input older than this is no longer placed exactly (see the module docstring)."""
        return self.clock - self.config.late_event_window_seconds

    def observe_sample(self, sample: GpuSample) -> None:
        self.inputs += 1
        values = sample_values(sample)
        gpu = self._gpu(physical_uuid(sample.uuid), sample.node)
        if self._dropped(gpu, values[0]):
            return
        if self._place(gpu, values):
            gpu.latest = sample
        if sample.parent_uuid is not None and sample.energy_joules is None:  # no energy counter of its own
            self._register_mig_child(sample.parent_uuid, gpu.uuid)
        if values[0] > self.clock:
            self._advance(values[0])

    def _gpu(self, uuid: str, node: str) -> Gpu:
        """The record of device `uuid`, on `node` as its latest input says."""
        gpu = self.gpu_records.get(uuid)
        if gpu is None:
            gpu = self.gpu_records[uuid] = Gpu(uuid, node)
        else:
            gpu.node = node
        return gpu

    def _dropped(self, gpu: Gpu, t: float) -> bool:
        """Whether a sample of g at `t` comes after a later one and too late to be placed (then it is counted)."""
        if gpu.times and t <= gpu.times[-1] and t < self.boundary:
            self.late_samples_dropped += 1
            return True
        return False

    def _place(self, gpu: Gpu, values: SampleValues) -> bool:
        """A sample's point in g's history, its interval accounted; whether it is g's latest now."""
        times = gpu.times
        t = values[0]
        if times and t <= times[-1]:
            return self._insert_late_point(gpu, values)
        gpu.append(values)
        if gpu.stretches:
            self._apply_interval(gpu, len(times) - 1, -INFINITY, INFINITY, gpu.stretches, 1.0)
        if gpu.uuid in self.mig_children:
            self._apply_parent_energy(gpu, times[-2] if len(times) > 1 else t, t, self._child_stretches(gpu.uuid), 1.0)
        return True

    def _insert_late_point(self, gpu: Gpu, values: SampleValues) -> bool:
        """Place a sample at or before the GPU's last one; True when it replaced the last (it is the latest)."""
        times = gpu.times
        t = values[0]
        index = bisect.bisect_left(times, t)
        low = times[index - 1] if index > 0 else -INFINITY
        replacing = times[index] == t
        if replacing:  # the same GPU and time again: the new sample replaces the old
            high = times[index + 1] if index + 1 < len(times) else t
        else:
            high = times[index]
        stretches = list(gpu.stretches)
        children = self._child_stretches(gpu.uuid)
        self._apply_range(gpu, low, high, stretches, -1.0)
        self._apply_parent_energy(gpu, low, high, children, -1.0)
        self._settle_last_active(gpu, stretches, low, high)
        latest = False
        if replacing:
            gpu.replace(index, values)
            latest = index == len(times) - 1
        else:
            gpu.insert(index, values)
        self._apply_range(gpu, low, high, stretches, 1.0)
        self._apply_parent_energy(gpu, low, high, children, 1.0)
        return latest

    def observe_samples(self, batch: SampleBatch) -> None:
        """Each row of `batch` exactly as `observe_sample` takes it, in row order, without a GpuSample per row.

        The same figures to the bit: the same arithmetic in the same order (late and duplicate
        rows, MIG parent energy and children, the clock and its maintenance). The rows between
        two maintenance runs go in as one chunk, at once where each only extends its device's
        history (`gpuwm.accounting.batch`), else row by row. A device's `latest` is built
        (`batch.sample`) only for the row that ends up as its latest.
        """
        self.inputs += 1
        count = len(batch.t)
        physical = [physical_uuid(uuid) for uuid in batch.uuids]
        uids: dict[str, int] = {}
        entry_uids = [uids.setdefault(uuid, len(uids)) for uuid in physical]
        given_arrays = hasattr(batch.t, "tolist")  # numpy columns (the controller's); else lists
        arrays = BatchArrays(batch, entry_uids, list(uids)) if given_arrays or count >= _VECTORISED_FROM_ROWS else None
        as_rows: list[_Rows] = []  # the columns as Python values, made if a chunk goes row by row
        latest_rows: dict[str, tuple[Gpu, int]] = {}

        def chunk(start: int, end: int) -> None:
            if arrays is None or not observe_appending_chunk(self, batch, arrays, start, end, latest_rows):
                if not as_rows:
                    as_rows.append(_Rows(batch, physical))
                for row in range(start, end):
                    self._observe_row(as_rows[0], row, latest_rows)

        start = 0
        clock, last_maintenance = self.clock, self._last_maintenance
        rising: Iterable[tuple[int, float]] = enumerate(_python(batch.t)) if arrays is None else arrays.rising(clock)
        for row, t in rising:  # where `_advance` would maintain: a chunk ends after that row
            if t > clock:
                clock = t
                if t - last_maintenance >= _MAINTENANCE_EVERY_SECONDS:
                    last_maintenance = t
                    chunk(start, row + 1)
                    self._advance(t)
                    start = row + 1
        if start < count:
            chunk(start, count)
            self.clock = max(self.clock, clock)  # no maintenance due, or the loop would have cut there
        for gpu, row in latest_rows.values():
            gpu.latest = batch.sample(row)

    def _observe_row(self, rows: _Rows, row: int, latest_rows: dict[str, tuple[Gpu, int]]) -> None:
        """Row `row` of a batch as `observe_sample` takes a sample (its `latest` noted in `latest_rows`)."""
        entry = rows.device[row]
        gpu = self._gpu(rows.uuids[entry], rows.nodes[entry])
        if self._dropped(gpu, rows.t[row]):
            return
        if self._place(gpu, rows.values(row)):
            latest_rows[gpu.uuid] = (gpu, row)
        parent = rows.parent_uuids[entry]
        if parent is not None and rows.energy[row] != rows.energy[row]:  # NaN: no energy counter of its own
            self._register_mig_child(parent, gpu.uuid)
        if rows.t[row] > self.clock:
            self._advance(rows.t[row])

    def observe_pod(self, event: PodEvent) -> None:
        self.inputs += 1
        workload = self.workload_records.get(event.workload.uid)
        if workload is None:
            workload = self.workload_records[event.workload.uid] = Workload(event.workload.uid, event)
        elif event.workload.created is not None and (workload.created is None or event.workload.created < workload.created):
            workload.created = event.workload.created
        workload.revision += 1
        if f"{event.uid}@{workload.uid}" in self.pods:  # a late event of a pod that has left this workload
            self._advance(event.t)
            return
        pod = self.pods.get(event.uid)
        moved_in = -INFINITY
        if pod is not None and pod.workload is not workload:
            moved_in = max(event.t, self.boundary, pod.moved_in)
            self._rehome(pod, moved_in)
            pod = None
        if pod is None:
            pod = self.pods[event.uid] = Pod(event.uid, workload, event)
            pod.moved_in = moved_in
            workload.pods[event.uid] = pod
        if event.t < workload.first_seen:
            workload.first_seen = event.t
        self._advance(event.t)
        # a pod that moved here from another workload is this one's from the move on: an event dated
        # earlier (a device named late, from the pod's start) must not take back its old workload's time
        t = max(event.t, self.boundary, pod.moved_in)
        timeline = pod.timeline
        index = place_in_timeline(timeline, t, event)
        if index == len(timeline) - 1:
            # the event's own labels, not copies: events are frozen and nothing here changes the dicts
            pod.name, pod.namespace, pod.labels = event.name, event.namespace, event.labels
        if (event.t, event.uid) >= workload.labels_key:  # the newest pod event names the project
            workload.labels_key = (event.t, event.uid)
            workload.labels = event.labels
        self._reconcile_pod(pod, t)

    def _rehome(self, pod: Pod, t: float) -> None:
        """The pod now belongs to another workload (its owner changed): it leaves its old one at t.

        `kubectl delete job --cascade=orphan` has the garbage collector strip a pod's
        ownerReferences, so its next event names another workload (the pod itself, or a new
        owner that adopts it). Up to t the pod's time stays its old workload's; from t its old
        record ends (as a deleted pod ends, so a workload left with no running pod ends too) and
        the caller starts a new record under the new workload. The old record stays with its
        workload under the key `<pod uid>@<old workload uid>` until that workload is forgotten.
        """
        old = pod.workload
        old.revision += 1
        timeline = pod.timeline
        index = bisect.bisect_left([entry[0] for entry in timeline], t)
        before = timeline[index - 1][1] if index > 0 else timeline[0][1]
        del timeline[index:]
        timeline.append((t, before.model_copy(update={"t": t, "phase": "Deleted", "devices": []})))
        self._reconcile_pod(pod, t)
        del self.pods[pod.uid]
        self.pods[f"{pod.uid}@{old.uid}"] = pod

    # ------------------------------------------------------- pod -> stretches

    @staticmethod
    def _desired_stretches(pod: Pod) -> list[tuple[str, str | None, float, str | None, float, float]]:
        """(uuid, node, units, container, start, end) the pod's timeline implies, merged where unchanged."""
        desired: list[tuple[str, str | None, float, str | None, float, float]] = []
        open_by_key: dict[tuple[str, str | None, float, str | None], int] = {}
        timeline = pod.timeline
        for position, (t, event) in enumerate(timeline):
            end = timeline[position + 1][0] if position + 1 < len(timeline) else INFINITY
            running = event.phase == "Running" and event.node is not None
            current: dict[tuple[str, str | None, float, str | None], int] = {}
            if running:
                units_by_device: dict[tuple[str, str | None], float] = {}
                for device in event.devices:
                    device_key = (physical_uuid(device.uuid), device.container)
                    units_by_device[device_key] = units_by_device.get(device_key, 0.0) + device.units
                for (uuid, container), units in units_by_device.items():
                    key = (uuid, event.node, units, container)
                    previous = open_by_key.get(key)
                    if previous is not None and desired[previous][5] == t:
                        desired[previous] = (*desired[previous][:5], end)
                        current[key] = previous
                    else:
                        current[key] = len(desired)
                        desired.append((uuid, event.node, units, container, t, end))
            open_by_key = current
        return desired

    def _reconcile_pod(self, pod: Pod, low: float) -> None:
        """Make the pod's stretches match its timeline from `low` on, re-accounting what changed."""
        workload = pod.workload
        desired = [item for item in self._desired_stretches(pod) if item[5] > low]
        devices = {stretch.uuid for stretch in pod.stretches if stretch.end > low} | {item[0] for item in desired}
        for uuid in sorted(devices):
            gpu = self.gpu_records.get(uuid)
            if gpu is None:
                gpu = self.gpu_records[uuid] = Gpu(uuid, None)
            # every holder of g, not only this workload's: whether a workload holds g alone decides its
            # utilisation (DESIGN §3), so a stretch that comes or goes changes the others' figures too
            group = list(gpu.stretches)
            parent = self._energy_parent(gpu)
            self._apply_range(gpu, low, INFINITY, group, -1.0)
            if parent is not None:
                self._apply_parent_energy(parent, low, INFINITY, group, -1.0)
            self._settle_last_active(gpu, group, low)
            for stretch in [s for s in pod.stretches if s.uuid == uuid and s.end > low]:
                if stretch.start >= low:
                    self._drop_stretch(gpu, stretch)
                else:
                    stretch.end = low
            for item_uuid, node, units, container, start, end in desired:
                if item_uuid != uuid:
                    continue
                continued = None
                if start < low:
                    for stretch in pod.stretches:
                        if (
                            stretch.uuid == uuid
                            and stretch.end == low
                            and stretch.units == units
                            and stretch.container == container
                            and stretch.node == node
                        ):
                            continued = stretch
                            break
                if continued is not None:
                    continued.end = end
                else:
                    stretch = Stretch(workload, pod.uid, uuid, node, units, container, max(start, low), end)
                    pod.stretches.append(stretch)
                    workload.stretches.append(stretch)
                    gpu.stretches.append(stretch)
                    if workload.first_run_start is None or stretch.start < workload.first_run_start:
                        workload.first_run_start = stretch.start
            group = list(gpu.stretches)
            self._apply_range(gpu, low, INFINITY, group, 1.0)
            if parent is not None:
                self._apply_parent_energy(parent, low, INFINITY, group, 1.0)

    @staticmethod
    def _drop_stretch(gpu: Gpu, stretch: Stretch) -> None:
        gpu.stretches.remove(stretch)
        stretch.workload.stretches.remove(stretch)
        stretch.workload.pods[stretch.pod_uid].stretches.remove(stretch)

    # ------------------------------------------------------------ maintenance

    def _maintain(self) -> None:
        """Forget what no late input can change any more; bound memory."""
        boundary = self.boundary
        for gpu in self.gpu_records.values():
            keep_from = bisect.bisect_left(gpu.times, boundary) - 1
            if keep_from > 0:
                gpu.forget_before(keep_from)
            if gpu.stretches:
                for stretch in [s for s in gpu.stretches if s.end < boundary]:
                    self._retire(gpu, stretch)
        self._forget_gone_gpus()
        maintain_all([workload.windows for workload in self.workload_records.values()], self.clock)
        for pod in self.pods.values():
            timeline = pod.timeline
            if len(timeline) > 1 and timeline[1][0] < boundary:
                keep = bisect.bisect_left([entry[0] for entry in timeline], boundary) - 1
                if keep > 0:
                    del timeline[:keep]

    def _forget_gone_gpus(self) -> None:
        """Drop the GPUs silent for `gpu_gone_seconds` that nothing holds (see EngineConfig).

        A MIG parent stays while one of its instances does (their energy is its samples'); a
        forgotten instance leaves its parent's list. A GPU that reports again starts afresh:
        its first new sample begins its history, as after any gap longer than 3 intervals.
        """
        gone_before = self.clock - self.config.gpu_gone_seconds
        records = self.gpu_records
        gone = [
            uuid for uuid, gpu in records.items()
            if not gpu.stretches and (gpu.last_time is None or gpu.last_time < gone_before)
        ]
        forgotten = False
        for uuid in gone:
            if any(child in records and child not in gone for child in self.mig_children.get(uuid, ())):
                continue
            del records[uuid]
            forgotten = True
        if not forgotten:  # the usual case: no MIG list names a missing GPU, nothing to rebuild
            return
        for parent_uuid in list(self.mig_children):
            children = [child for child in self.mig_children[parent_uuid] if child in records]
            if children:
                self.mig_children[parent_uuid] = children
            else:
                del self.mig_children[parent_uuid]

    def _retire(self, gpu: Gpu, stretch: Stretch) -> None:
        """Fold a stretch that ended before the late window into its workload's totals."""
        workload = stretch.workload
        tail_start = stretch.start if gpu.last_time is None else max(stretch.start, gpu.last_time)
        if stretch.end > tail_start:  # never covered by a sample: unmonitored for good
            workload.unmonitored_gpu_seconds += stretch.units * (stretch.end - tail_start)
        workload.retired_last_active = max(workload.retired_last_active, stretch.last_active)
        workload.retired_runs = merged_runs([*workload.retired_runs, (stretch.start, stretch.end)])
        self._drop_stretch(gpu, stretch)

    def forget_workload(self, uid: str) -> None:
        """Drop a workload and its pods (after its retention), keeping GPU history."""
        workload = self.workload_records.pop(uid, None)
        if workload is None:
            return
        for stretch in list(workload.stretches):
            gpu = self.gpu_records.get(stretch.uuid)
            if gpu is not None and stretch in gpu.stretches:
                gpu.stretches.remove(stretch)
        for pod_uid, pod in workload.pods.items():
            for key in (pod_uid, f"{pod_uid}@{uid}"):  # a pod that moved on is kept under the second key
                if self.pods.get(key) is pod:
                    del self.pods[key]
