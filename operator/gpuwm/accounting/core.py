"""The accounting engine's core (`EngineCore`): pod lifecycle events and GPU samples in, DESIGN §3 sums out.

Pure and deterministic: no clock, no I/O. Every input carries its own time.

How time is cut (DESIGN §3): GPU g's sample at t_k covers (t_{k-1}, t_k]; the stretch
before g's first sample, and any interval longer than 3 x the poll interval, is
unmonitored. A sample that stands for a run of merged polls (`merged_seconds`, see
gpuwm.feed.merge) is judged by the gap before the run's first poll, t_k - merged - t_{k-1}. A pod holding devices is a set of *stretches* (pod, device, units,
start, end]. Accounting is the overlap of stretches with sample intervals.

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
from dataclasses import replace
from itertools import accumulate
from typing import Any

from gpuwm.accounting.batch import BatchArrays, observe_appending_chunk
from gpuwm.accounting.state import (
    INFINITY,
    NOTHING,
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
#: SampleBatch's per-row columns (numpy arrays from the controller, lists elsewhere)
_COLUMNS = ("device", "t", "sm", "memory", "energy", "merged")
#: a batch this long takes the vectorised path where it can (numpy's fixed cost pays from about here)
_VECTORISED_FROM_ROWS = 64


def _python(column: Any) -> Any:
    """A numpy column as a list of Python numbers (what the row-by-row path adds up); a list as it is."""
    return column.tolist() if hasattr(column, "tolist") else column


class _Zeros:
    """A batch's `merged` column when it has none: 0.0 for every row."""

    def __getitem__(self, row: int) -> float:
        return 0.0


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


class EngineCore:
    """Ingestion and the accounting arithmetic; `Engine` adds the reports."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.clock = -INFINITY
        self.gpu_records: dict[str, Gpu] = {}
        self.workload_records: dict[str, Workload] = {}
        self.pods: dict[str, Pod] = {}
        self.namespaces: dict[str, NamespaceEvent] = {}
        # MIG parent uuid -> instances whose samples carry no energy counter: the parent's
        # own samples' energy is split among the workloads on those instances
        self.mig_children: dict[str, list[str]] = {}
        self.late_samples_dropped = 0
        #: samples whose busy device the processes seen could not explain, so that some holder took the
        #: device's figure (DESIGN §3's attribution rule); counted once, when a sample is first accounted
        self.unattributed_samples = 0
        self._last_maintenance = -INFINITY
        #: bumped by each sample, batch of samples, pod or namespace event: any of them may change window
        #: segments, so a memo of figures (`Engine`'s latest report's sums) stands while this stays the same
        #: (a counter, not an override per input in Engine: one more call per sample cost more than this)
        self.inputs = 0
        #: an interval longer than this is unmonitored (DESIGN §3: 3 x the poll interval)
        self.gap_seconds = self.config.gap_seconds
        #: a holder at or above this utilisation is active (DESIGN §3, `idleThresholdPercent`)
        self.threshold_percent = self.config.idle_threshold_percent

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
        t = values[0]
        fields = sample.__dict__  # read as `sample_values` reads them (see there)
        uuid = fields["uuid"]
        if "::" in uuid:
            uuid = physical_uuid(uuid)
        gpu = self.gpu_records.get(uuid)
        if gpu is None:
            gpu = self.gpu_records[uuid] = Gpu(uuid, fields["node"])
        else:
            gpu.node = fields["node"]
        times = gpu.times
        if times and t <= times[-1]:
            if t < self.boundary:
                self.late_samples_dropped += 1
                return
            if self._insert_late_point(gpu, values):
                gpu.latest = sample
        else:
            gpu.append(values)
            gpu.latest = sample
            stretches = gpu.stretches
            if stretches:
                self._apply_appended(gpu, len(times) - 1, stretches, values)
            if uuid in self.mig_children:
                self._apply_parent_energy(gpu, times[-2] if len(times) > 1 else t, t, self._child_stretches(uuid), 1.0)
        parent_uuid = fields["parent_uuid"]
        if parent_uuid is not None and fields["energy_joules"] is None:
            self._register_mig_child(parent_uuid, uuid)
        if t > self.clock:
            self._advance(t)

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
        two maintenance runs go in as one chunk: each device's rows that simply extend its
        history are appended at once, and only what reads them (its holders' intervals, a MIG
        parent's energy) runs per row. A device's `latest` is built (`batch.sample`) only for the
        row that ends up as its latest.
        """
        self.inputs += 1
        count = len(batch.t)
        physical = [physical_uuid(uuid) for uuid in batch.uuids]
        uids: dict[str, int] = {}
        entry_uids = [uids.setdefault(uuid, len(uids)) for uuid in physical]
        given_arrays = hasattr(batch.t, "tolist")  # numpy columns (the controller's); else lists
        arrays = BatchArrays(batch, entry_uids, list(uids)) if given_arrays or count >= _VECTORISED_FROM_ROWS else None
        as_lists: list[SampleBatch] = [] if given_arrays else [batch]  # the row-by-row path reads Python floats
        latest_rows: dict[str, tuple[Gpu, int]] = {}
        row_uuids: list[str] = []

        def chunk(start: int, end: int) -> None:
            if arrays is None or not observe_appending_chunk(self, batch, arrays, start, end, latest_rows):
                if not as_lists:
                    as_lists.append(replace(batch, **{name: _python(getattr(batch, name)) for name in _COLUMNS}))
                if not row_uuids:
                    row_uuids.extend(physical[entry] for entry in as_lists[0].device)
                self._observe_chunk(as_lists[0], row_uuids, start, end, latest_rows)

        start = 0
        clock, last_maintenance = self.clock, self._last_maintenance
        rising: Iterable[tuple[int, float]] = enumerate(batch.t) if arrays is None else arrays.rising(clock)
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

    def _observe_chunk(
        self, batch: SampleBatch, row_uuids: list[str], start: int, end: int, latest_rows: dict[str, tuple[Gpu, int]]
    ) -> None:
        """Rows start..end-1 of `batch`, during which no maintenance falls due (see `observe_samples`)."""
        ts, device, parents, energies = batch.t, batch.device, batch.parent_uuids, batch.energy
        records, children = self.gpu_records, self.mig_children
        groups: dict[str, list[int]] = {}  # device -> its rows, devices in order of first appearance
        for row in range(start, end):
            rows = groups.get(row_uuids[row])
            if rows is None:
                groups[row_uuids[row]] = [row]
            else:
                rows.append(row)
        # a MIG instance registered now applies its parent's whole history, so the parent's rows go in
        # one by one (registered before them: they apply to it; after: they are in the history)
        registering: set[int] = set()
        slow: set[str] = set()
        for row in range(start, end):
            parent = parents[device[row]]
            if parent is not None and energies[row] != energies[row] and row_uuids[row] not in children.get(parent, ()):
                registering.add(row)
                slow.add(parent)
        positions: dict[int, int] = {}
        work: list[int] = []  # rows that need more than their append, in row order once sorted
        nodes, units = batch.nodes, batch.device_units
        sms, memories, pod_sms = batch.sm, batch.memory, batch.pod_sm
        merged = batch.merged if batch.merged is not None else _Zeros()
        for uuid, rows in groups.items():
            gpu = records.get(uuid)
            if gpu is None:
                gpu = records[uuid] = Gpu(uuid, nodes[device[rows[0]]])
            gpu.node = nodes[device[rows[-1]]]  # as each row sets it; nothing reads it in between
            times = gpu.times
            previous = times[-1] if times else -INFINITY
            appending = uuid not in slow
            if appending:
                for row in rows:
                    t = ts[row]
                    if t <= previous:
                        appending = False
                        break
                    previous = t
            if not appending:
                slow.add(uuid)
                work.extend(rows)
                continue
            base = len(times)
            times.extend([ts[row] for row in rows])
            gpu.sm.extend([sms[row] for row in rows])
            gpu.memory.extend([memories[row] for row in rows])
            gpu.energy.extend([energies[row] for row in rows])
            gpu.pod_sm.extend([pod_sms[row] for row in rows])
            gpu.device_units.extend([units[device[row]] for row in rows])
            gpu.merged.extend([merged[row] for row in rows])
            latest_rows[uuid] = (gpu, rows[-1])
            if gpu.stretches or uuid in children:
                for offset, row in enumerate(rows):
                    positions[row] = base + offset
                work.extend(rows)
            else:
                for row in rows:
                    if row in registering:
                        positions[row] = -1
                        work.append(row)
        if not work:
            return
        work.sort()
        clocks = list(accumulate(ts[start:end], max, initial=self.clock)) if slow else []
        for row in work:
            uuid = row_uuids[row]
            gpu = records[uuid]
            t = ts[row]
            if uuid in slow:
                self.clock = clocks[row - start]  # the clock as the rows before this one left it
                entry = device[row]
                values = (t, sms[row], memories[row], energies[row], pod_sms[row], units[entry], merged[row])
                times = gpu.times
                if times and t <= times[-1]:
                    if t < self.boundary:
                        self.late_samples_dropped += 1
                        continue
                    if self._insert_late_point(gpu, values):
                        latest_rows[uuid] = (gpu, row)
                else:
                    gpu.append(values)
                    latest_rows[uuid] = (gpu, row)
                    if gpu.stretches:
                        index = len(times) - 1
                        self._apply_appended(gpu, index, gpu.stretches, gpu.point(index))
                    if uuid in children:
                        self._apply_parent_energy(
                            gpu, times[-2] if len(times) > 1 else t, t, self._child_stretches(uuid), 1.0
                        )
                parent = parents[entry]
                if parent is not None and energies[row] != energies[row]:  # NaN: no energy counter of its own
                    self._register_mig_child(parent, uuid)
                continue
            index = positions[row]
            if index >= 0:
                if gpu.stretches:
                    self._apply_appended(gpu, index, gpu.stretches, gpu.point(index))
                if uuid in children:
                    low = gpu.times[index - 1] if index > 0 else t
                    self._apply_parent_energy(gpu, low, t, self._child_stretches(uuid), 1.0)
            if row in registering:
                parent = parents[device[row]]
                assert parent is not None
                self._register_mig_child(parent, uuid)

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

    # ------------------------------------------------------------ MIG energy

    def _register_mig_child(self, parent_uuid: str, child_uuid: str) -> None:
        children = self.mig_children.setdefault(parent_uuid, [])
        if child_uuid not in children:
            children.append(child_uuid)
            parent = self.gpu_records.get(parent_uuid)
            child = self.gpu_records.get(child_uuid)
            if parent is not None and child is not None and child.stretches:
                # intervals of the parent seen before we knew: account them now
                self._apply_parent_energy(parent, -INFINITY, INFINITY, list(child.stretches), 1.0)

    def _child_stretches(self, parent_uuid: str) -> list[Stretch]:
        stretches: list[Stretch] = []
        for child_uuid in self.mig_children.get(parent_uuid, ()):
            child = self.gpu_records.get(child_uuid)
            if child is not None:
                stretches.extend(child.stretches)
        return stretches

    def _energy_parent(self, gpu: Gpu) -> Gpu | None:
        """The MIG parent whose energy this instance's holders share, if its own samples carry none."""
        latest = gpu.latest
        if latest is None or latest.parent_uuid is None or gpu.uuid not in self.mig_children.get(latest.parent_uuid, ()):
            return None
        return self.gpu_records.get(latest.parent_uuid)

    def _apply_parent_energy(
        self, parent: Gpu, low: float, high: float, stretches: list[Stretch], sign: float
    ) -> None:
        """Energy of the parent's intervals in (low, high] to instance stretches, by units."""
        if not stretches:
            return
        times = parent.times
        energies = parent.energy
        index = max(1, bisect.bisect_right(times, low))
        while index < len(times):
            start = times[index - 1]
            if start >= high:
                break
            end = times[index]
            energy, previous = energies[index], energies[index - 1]
            if energy == energy and previous == previous:  # neither is NaN (not reported)
                rate = max(0.0, energy - previous) / (end - start)
                cut_start, cut_end = max(start, low), min(end, high)
                for stretch in stretches:
                    piece = min(cut_end, stretch.end) - max(cut_start, stretch.start)
                    if piece > 0:
                        stretch.workload.energy_joules += sign * rate * piece * stretch.units
            index += 1

    # ------------------------------------------------------------ arithmetic

    def _apply_range(self, gpu: Gpu, low: float, high: float, stretches: list[Stretch], sign: float) -> None:
        """Apply (sign=1) or take back (sign=-1) the intervals of `gpu` within (low, high]."""
        if not stretches:
            return
        times = gpu.times
        index = bisect.bisect_right(times, low)
        while index < len(times):
            start = times[index - 1] if index > 0 else -INFINITY
            if start >= high:
                break
            self._apply_interval(gpu, index, low, high, stretches, sign)
            index += 1

    def _monitored(self, gpu: Gpu, index: int) -> bool:
        """Whether g's sample `index` (>= 1) leaves its interval monitored: SM reported (not NaN), and at most
        the gap since the sample before; a sample of merged polls by the gap before its run's first poll,
        t - merged - previous t (`batch._apply_pieces` is the vectorised twin)."""
        sm, times = gpu.sm[index], gpu.times
        return sm == sm and times[index] - gpu.merged[index] - times[index - 1] <= self.gap_seconds

    @staticmethod
    def cuts(gpu: Gpu, start: float, end: float) -> list[float]:
        """Times strictly inside (start, end) where g's holders change: its stretches' starts and ends.

        Between two cuts every stretch of g either covers the whole piece or none of it, so a
        workload's share and whether it holds g alone are constant there (DESIGN §3 judges each
        stretch of time by who holds g in it). A piece taken back later is cut the same way.
        """
        stretches = gpu.stretches
        if len(stretches) < 2:
            return []
        cuts: set[float] = set()
        for stretch in stretches:
            if start < stretch.start < end:
                cuts.add(stretch.start)
            if start < stretch.end < end:
                cuts.add(stretch.end)
        return sorted(cuts)

    def attribution(self, gpu: Gpu, index: int, workload: Workload, start: float, end: float) -> tuple[float, bool]:
        """W's utilisation on g over (start, end] within interval `index`, and whether it was *unattributed*.

        DESIGN §3's attribution rule: activity is never lost to attribution. NVML's process list
        can be empty or unattributable while a GPU computes (an agent in another PID namespace,
        MIG instances whose processes are hidden, a lost cgroup mapping), so:
        - W holds g alone (no other workload's stretch covers the piece): g's device SM % over
          W's share of g (capped at 100), whatever the process list says;
        - g is shared: the SM % of W's pods' processes over W's share (capped at 100), unless
          there is no per-process data, or g is busy (SM >= threshold) while its holders'
          processes sum below the threshold: then every holder gets g's device SM %.
        W's share = W's units on g (its stretches covering the piece) / g's `device_units`.
        *Unattributed*: g was busy and its figure came from the device because the processes
        seen could not explain it (counted, and said on the workload's Sampling condition).
        (start, end] must lie between two of `_cuts`, so the holders are the same all along it.
        """
        sm = gpu.sm[index]
        if sm != sm:  # NaN: not reported (the interval is unmonitored; callers do not ask)
            return 0.0, False
        units = 0.0
        own: list[str] = []
        others: list[str] = []
        for stretch in gpu.stretches:
            if stretch.start < end and stretch.end > start:
                if stretch.workload is workload:
                    units += stretch.units
                    if stretch.pod_uid not in own:
                        own.append(stretch.pod_uid)
                elif stretch.pod_uid not in others:
                    others.append(stretch.pod_uid)
        if units <= 0:
            return 0.0, False
        share = units / gpu.device_units[index]
        pod_sm = gpu.pod_sm[index]
        threshold = self.threshold_percent
        busy = sm >= threshold
        if not others:
            explained = pod_sm is None or not busy or sum(pod_sm.get(uid, 0.0) for uid in own) >= threshold
            return min(100.0, sm / share), not explained
        if pod_sm is None:
            return sm, busy
        used = 0.0
        for uid in own:
            used += pod_sm.get(uid, 0.0)
        if busy and used + sum(pod_sm.get(uid, 0.0) for uid in others) < threshold:
            return sm, True
        return min(100.0, used / share), False

    def _account(
        self, stretch: Stretch, units: float, piece_start: float, piece_end: float, utilization: float,
        memory: float, sign: float,
    ) -> None:
        """Add (sign=1) or take back (sign=-1, `units` negative) one monitored piece of a stretch."""
        workload = stretch.workload
        unit_seconds = units * (piece_end - piece_start)
        if utilization >= self.threshold_percent:
            workload.active_gpu_seconds += unit_seconds
            if sign > 0 and piece_end > stretch.last_active:
                stretch.last_active = piece_end
        else:
            workload.idle_gpu_seconds += unit_seconds
        workload.life_units += unit_seconds
        workload.life_util += unit_seconds * utilization
        if memory != memory:  # NaN: memory not reported
            workload.windows.add(piece_start, piece_end, units, units * utilization, 0.0, 0.0)
        else:
            workload.life_mem_units += unit_seconds
            workload.life_mem += unit_seconds * memory
            workload.windows.add(piece_start, piece_end, units, units * utilization, units, units * memory)

    def _apply_interval(
        self, gpu: Gpu, index: int, low: float, high: float, stretches: list[Stretch], sign: float
    ) -> None:
        times = gpu.times
        end = times[index]
        energy: float | None = None
        if index == 0:
            start = -INFINITY
            monitored = False
        else:
            start = times[index - 1]
            monitored = self._monitored(gpu, index)
            joules, previous_joules = gpu.energy[index], gpu.energy[index - 1]
            if joules == joules and previous_joules == previous_joules:
                energy = max(0.0, joules - previous_joules) / (end - start)  # joules per second
        cut_start = start if start > low else low
        cut_end = end if end < high else high
        cuts = self.cuts(gpu, cut_start, cut_end) if monitored else []
        memory = gpu.memory[index]
        counted = False
        for stretch in stretches:
            piece_start = cut_start if cut_start > stretch.start else stretch.start
            piece_end = cut_end if cut_end < stretch.end else stretch.end
            if piece_end <= piece_start:
                continue
            workload = stretch.workload
            units = stretch.units * sign
            unit_seconds = units * (piece_end - piece_start)
            if energy is not None:
                workload.energy_joules += energy * unit_seconds
            if not monitored:
                workload.unmonitored_gpu_seconds += unit_seconds
                continue
            bounds = [piece_start, *(cut for cut in cuts if piece_start < cut < piece_end), piece_end]
            for position in range(len(bounds) - 1):
                sub_start, sub_end = bounds[position], bounds[position + 1]
                utilization, unattributed = self.attribution(gpu, index, workload, sub_start, sub_end)
                if unattributed:
                    workload.unattributed_gpu_seconds += units * (sub_end - sub_start)
                    counted = True
                self._account(stretch, units, sub_start, sub_end, utilization, memory, sign)
        if counted and sign > 0 and low == -INFINITY and high == INFINITY:  # a new point, not a re-accounting
            self.unattributed_samples += 1

    def _apply_appended(self, gpu: Gpu, index: int, stretches: list[Stretch], values: SampleValues) -> None:
        """`_apply_interval(gpu, index, -inf, inf, stretches, 1.0)`, the same arithmetic to the bit, for a new point.

        What `observe_sample` and `observe_samples` run per appended row: the whole interval, nothing
        taken back (x * 1.0 is x, and a cut at -inf/inf is the interval itself), the per-stretch work
        inlined. `values` is point `index` itself (`Gpu.point`), so the point is read from locals, not
        from the history's columns; `_monitored` and the check for `cuts` are inlined for it. An
        interval in which g's holders change goes through `_apply_interval` (it is cut there).
        """
        end, sm, memory, joules, pod_sm, device_units, merged = values
        energy = NOTHING
        holders = len(gpu.stretches)
        if index == 0:
            start = -INFINITY
            monitored = False
        else:
            start = gpu.times[index - 1]
            monitored = sm == sm and end - merged - start <= self.gap_seconds  # `_monitored`
            # `cuts` finds none where g has fewer than two stretches
            if monitored and holders > 1 and self.cuts(gpu, start, end):
                self._apply_interval(gpu, index, -INFINITY, INFINITY, stretches, 1.0)
                return
            previous_joules = gpu.energy[index - 1]
            if joules == joules and previous_joules == previous_joules:
                used = joules - previous_joules
                energy = (used if used > 0.0 else 0.0) / (end - start)  # max(0.0, used), without the call
        threshold = self.threshold_percent
        cached_key: tuple[Workload, float, float] | None = None
        utilization = 0.0
        unattributed = counted = False
        # the common case, a GPU with one stretch and no per-process data: `attribution`'s first branch
        # (its sole holder takes the device's SM % over its share), computed here as it computes it
        sole = None
        if monitored and holders == 1 and pod_sm is None:
            sole = gpu.stretches[0]
            utilization = sm / (sole.units / device_units)
            if not utilization < 100.0:  # min(100.0, utilization), without the call
                utilization = 100.0
        for stretch in stretches:
            stretch_start, stretch_end = stretch.start, stretch.end
            piece_start = start if start > stretch_start else stretch_start
            piece_end = end if end < stretch_end else stretch_end
            if piece_end <= piece_start:
                continue
            workload = stretch.workload
            units = stretch.units
            unit_seconds = units * (piece_end - piece_start)
            if energy == energy:
                workload.energy_joules += energy * unit_seconds
            if not monitored:
                workload.unmonitored_gpu_seconds += unit_seconds
                continue
            if stretch is not sole:  # (a sole holder's figure is never unattributed)
                key = (workload, piece_start, piece_end)
                if key != cached_key:
                    cached_key = key
                    utilization, unattributed = self.attribution(gpu, index, workload, piece_start, piece_end)
                if unattributed:
                    workload.unattributed_gpu_seconds += unit_seconds
                    counted = True
            if utilization >= threshold:
                workload.active_gpu_seconds += unit_seconds
                if piece_end > stretch.last_active:
                    stretch.last_active = piece_end
            else:
                workload.idle_gpu_seconds += unit_seconds
            workload.life_units += unit_seconds
            workload.life_util += unit_seconds * utilization
            if memory != memory:
                workload.windows.add(piece_start, piece_end, units, units * utilization, 0.0, 0.0)
            else:
                workload.life_mem_units += unit_seconds
                workload.life_mem += unit_seconds * memory
                workload.windows.add(piece_start, piece_end, units, units * utilization, units, units * memory)
        if counted:
            self.unattributed_samples += 1

    def _settle_last_active(self, gpu: Gpu, stretches: list[Stretch], low: float, high: float = INFINITY) -> None:
        """After taking back (low, high]: recompute last_active of stretches whose latest activity was in it."""
        for stretch in stretches:
            if stretch.last_active <= low or stretch.last_active > high:
                continue
            found = -INFINITY
            times = gpu.times
            index = bisect.bisect_left(times, min(low, stretch.end))
            index = min(index, len(times) - 1)
            while index >= 1:
                end = times[index]
                start = times[index - 1]
                if end <= stretch.start:
                    break
                if start < low and self._monitored(gpu, index):
                    piece_start, piece_end = max(start, stretch.start), min(end, low, stretch.end)
                    if piece_end > piece_start:
                        bounds = [piece_start, *self.cuts(gpu, piece_start, piece_end), piece_end]
                        for position in range(len(bounds) - 1, 0, -1):  # the latest active piece first
                            utilization = self.attribution(
                                gpu, index, stretch.workload, bounds[position - 1], bounds[position]
                            )[0]
                            if utilization >= self.threshold_percent:
                                found = bounds[position]
                                break
                        if found > -INFINITY:
                            break
                index -= 1
            if found == -INFINITY and gpu.pruned and times and times[0] > stretch.start:
                found = min(stretch.last_active, times[0])  # beyond the kept history: best known bound
            stretch.last_active = found

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
