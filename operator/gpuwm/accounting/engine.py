"""The accounting engine (`Engine`): its input and arithmetic (`gpuwm.accounting.core`), and the figures at time
`now` it reports per workload, project, GPU and cluster (DESIGN §3)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from functools import reduce
from operator import add
from typing import Any

from gpuwm.accounting.core import EngineCore, merged_runs
from gpuwm.accounting.persist import restore_state, save_state
from gpuwm.accounting.state import INFINITY, EngineConfig, Gpu, Pod, Stretch, Workload
from gpuwm.accounting.windows import windows_of
from gpuwm.model import (
    ENDED_POD_PHASES,
    ClusterFigures,
    GpuFigures,
    GpuSample,
    PodFigures,
    ProjectFigures,
    Windows,
    WorkloadEvent,
    WorkloadFigures,
    gpu_quota,
    shared_keys_fields,
    trusted_complete,
)

#: the report's two biggest models' fields, for dicts of shared keys (see `shared_keys_fields`)
_GPU_FIELDS = shared_keys_fields(GpuFigures)
_WORKLOAD_FIELDS = shared_keys_fields(WorkloadFigures)


def _optional_float(value: float | None) -> float | None:
    """As validation of a `float | None` field leaves it (an int becomes a float)."""
    return None if value is None else float(value)


def _gpu_order(item: GpuFigures) -> tuple[str, str, str, str]:
    return item.node, item.uuid, item.pod or "", item.container or ""


def _copy_latest(fields: dict[str, Any], latest: GpuSample) -> None:
    """What a device's latest sample says about it, into GpuFigures' `fields` (in field order, after `node`)."""
    fields["index"] = latest.index
    fields["model"] = latest.model
    fields["mig_profile"] = latest.mig_profile
    fields["parent_uuid"] = latest.parent_uuid
    fields["device_units"] = latest.device_units
    fields["sm_percent"] = latest.sm_percent
    fields["memory_used_bytes"] = latest.memory_used_bytes
    fields["memory_total_bytes"] = latest.memory_total_bytes
    fields["power_watts"] = latest.power_watts
    fields["healthy"] = latest.healthy
    fields["error"] = latest.error


#: the phases of a workload that has not got its GPUs: its requested units are unmet demand
_WAITING_PHASES = frozenset({"Queued", "Pending"})


def _object_state(workload: Workload, now: float) -> WorkloadEvent | None:
    """The workload object's state at `now` (its latest event at or before it); None when only pods name it."""
    timeline = workload.timeline
    if not timeline:
        return None
    index = bisect.bisect_right([entry[0] for entry in timeline], now) - 1
    return timeline[max(index, 0)][1]


def _object_phase(workload: Workload, state: WorkloadEvent, now: float) -> tuple[str, float | None]:
    """(phase, end time) from the object's own state when no GPU container runs: deleted (Ended), finished,
    suspended (Queued), else Pending (admitted or never suspended, no GPU container running yet)."""
    if state.deleted or state.finished is not None:
        # when it ended: the first event of the run of ended states that `state` belongs to
        end = now
        for t, event in reversed(workload.timeline):
            if t > now:
                continue
            if not (event.deleted or event.finished is not None):
                break
            end = t
        return ("Ended" if state.deleted and state.finished is None else state.finished or "Ended"), end
    return ("Queued" if state.suspended else "Pending"), None


def _queued_and_requeued(
    workload: Workload, created: float, runs: list[tuple[float, float]], now: float, end_time: float | None,
) -> tuple[float, float]:
    """(queuedSeconds, the wait added by queueing again after a run) from the object's timeline.

    queuedSeconds: every second from creation to now (or the end) the object was held back; its
    first event's state holds from its creation (a workload is seen suspended from the start).
    A workload suspended again after it ran (preempted) waits again: from its suspension, or from
    the end of the run it was suspended in, to its next run, or to now (issue 35: both count on).
    """
    stop = now if end_time is None else min(now, end_time)
    timeline = [(t, event) for t, event in workload.timeline if t <= stop]
    if not timeline:
        return 0.0, 0.0
    queued = 0.0
    start = min(created, timeline[0][0])
    for position, (t, event) in enumerate(timeline):
        begin = start if position == 0 else t
        until = timeline[position + 1][0] if position + 1 < len(timeline) else stop
        if event.suspended and until > begin:
            queued += until - begin
    requeued = 0.0
    first_run = runs[0][0] if runs else None
    suspended_before = timeline[0][1].suspended
    for t, event in timeline[1:]:
        if event.suspended and not suspended_before and first_run is not None and t > first_run:
            from_time = t
            for run_start, run_end in runs:
                if run_start <= t < run_end:
                    from_time = run_end
            following = [run_start for run_start, _run_end in runs if run_start >= from_time]
            until_run = following[0] if following else stop
            requeued += max(0.0, min(until_run, stop) - from_time)
        suspended_before = event.suspended
    return queued, requeued


def _pod_order(pod: Pod) -> tuple[str, str]:
    return pod.name, pod.uid


def _totals(members: list[WorkloadFigures], sums: _Sums) -> dict[str, Any]:
    """The last fields of ProjectFigures and of ClusterFigures, in field order: sums over `members`, means of `sums`."""
    utilization, memory = sums.windows()
    return {
        "allocated_gpu_seconds": float(sum(figures.allocated_gpu_seconds for figures in members)),
        "active_gpu_seconds": float(sum(figures.active_gpu_seconds for figures in members)),
        "idle_gpu_seconds": float(sum(figures.idle_gpu_seconds for figures in members)),
        "unmonitored_gpu_seconds": float(sum(figures.unmonitored_gpu_seconds for figures in members)),
        "energy_joules": float(sum(figures.energy_joules for figures in members)),
        "utilization": utilization,
        "memory_utilization": memory,
    }


class _Sums:
    """Window integrals of one or more workloads, turned into allocation-weighted means.

    One flat list (a report merges thousands: one comprehension per merge, not nested loops):
    per window avg1m, avg5m, avg1h, lifetime (in that order) units, util, mem_units, mem at
    4 * window + column; then at 16 the latest samples' (units, units x util) and at 18
    (units, units x memory %).
    """

    __slots__ = ("values",)

    def __init__(self, values: list[float] | None = None) -> None:
        self.values = [0.0] * 20 if values is None else values

    @classmethod
    def of_workload(cls, workload: Workload, windows: tuple[list[float], list[float], list[float]]) -> _Sums:
        """One workload's sums (`windows`: its `windows.windows(now)`); 0.0 + x, as adding to fresh sums gives."""
        minute, five, hour = windows
        return cls([
            0.0 + minute[0], 0.0 + minute[1], 0.0 + minute[2], 0.0 + minute[3],
            0.0 + five[0], 0.0 + five[1], 0.0 + five[2], 0.0 + five[3],
            0.0 + hour[0], 0.0 + hour[1], 0.0 + hour[2], 0.0 + hour[3],
            0.0 + workload.life_units, 0.0 + workload.life_util, 0.0 + workload.life_mem_units,
            0.0 + workload.life_mem, 0.0, 0.0, 0.0, 0.0,
        ])

    def merge(self, other: _Sums) -> None:
        self.values = [mine + theirs for mine, theirs in zip(self.values, other.values, strict=True)]

    @classmethod
    def total(cls, many: Iterable[_Sums]) -> _Sums:
        """Fresh sums with each of `many` merged in turn: per element 0.0 + a + b + ... in that order, as `merge` adds."""
        columns = zip(*(sums.values for sums in many), strict=True)
        return cls([reduce(add, column, 0.0) for column in columns] or None)

    def windows(self) -> tuple[Windows, Windows]:
        # 1e-9: what is left of a window after taking back late input is rounding, not time
        v = self.values
        return trusted_complete(Windows, {
            "current": v[17] / v[16] if v[16] > 1e-9 else None,
            "avg1m": v[1] / v[0] if v[0] > 1e-9 else None,
            "avg5m": v[5] / v[4] if v[4] > 1e-9 else None,
            "avg1h": v[9] / v[8] if v[8] > 1e-9 else None,
            "lifetime": v[13] / v[12] if v[12] > 1e-9 else None,
        }), trusted_complete(Windows, {
            "current": v[19] / v[18] if v[18] > 1e-9 else None,
            "avg1m": v[3] / v[2] if v[2] > 1e-9 else None,
            "avg5m": v[7] / v[6] if v[6] > 1e-9 else None,
            "avg1h": v[11] / v[10] if v[10] > 1e-9 else None,
            "lifetime": v[15] / v[14] if v[14] > 1e-9 else None,
        })


class _ReportWindows:
    """Each workload's `windows.windows(now)` of one report, kept until the next report or input (the
    report's own lists, not copies: packing them costs more than keeping them).
    `inputs`: the engine's input count at the report (see `EngineCore.inputs`)."""

    __slots__ = ("_row_of", "_windows", "inputs", "now")

    def __init__(
        self, now: float, inputs: int, uids: list[str], windows: list[tuple[list[float], list[float], list[float]]]
    ) -> None:
        self.now = now
        self.inputs = inputs
        self._row_of = dict(zip(uids, range(len(uids)), strict=True))
        self._windows = windows

    def get(self, uid: str) -> tuple[list[float], list[float], list[float]] | None:
        row = self._row_of.get(uid)
        return None if row is None else self._windows[row]


class Engine(EngineCore):
    """The accounting engine with its reports. See `gpuwm.accounting.core` for the rules."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config)
        # uid -> ((revision, project), figures, sums) of settled workloads (see `_settled_key`)
        self._settled: dict[str, tuple[tuple[int, str], WorkloadFigures, _Sums]] = {}
        #: the latest report's window sums, for `workload(uid, now)` at that report's `now` until the next input
        self._report_windows: _ReportWindows | None = None
        #: the workloads in report order (namespace, name, uid), kept while no workload comes or goes: one that
        #: comes adds to their number, one that goes (`forget_workload`) drops the list
        self._ordered: list[Workload] | None = None

    def forget_workload(self, uid: str) -> None:  # the others' segments stay as they were: their sums still hold
        self._ordered = None
        self._settled.pop(uid, None)
        super().forget_workload(uid)

    def settled_figures(self, uid: str) -> WorkloadFigures | None:
        """The figures a report reuses for a settled workload (the same object each time), else None.

        Lets a caller skip what it did with them last time: nothing in them has changed.
        """
        cached = self._settled.get(uid)
        return None if cached is None else cached[1]

    def save(self, lazy: bool = False, raw: bool = False) -> dict[str, Any]:
        """The whole state as JSON-able data (see `gpuwm.accounting.persist`); `lazy`: built as it is read;
        `raw`: its big float columns as `RawDoubles` (see `gpuwm.accounting.rawcolumns`)."""
        return save_state(self, lazy, raw)

    @classmethod
    def restore(cls, state: dict[str, Any], config: EngineConfig | None = None, consume: bool = False) -> Engine:
        """An engine that continues exactly where the saved one stopped (`consume`: see `restore_state`)."""
        engine = cls(config)
        restore_state(engine, state, consume)
        return engine

    # ------------------------------------------------------------- helpers

    def project_of(self, workload: Workload) -> str:
        label = self.config.project_label
        project = workload.labels.get(label)
        if project:
            return project
        namespace = self.namespaces.get(workload.namespace)
        if namespace is not None and namespace.labels.get(label):
            return namespace.labels[label]
        return workload.namespace

    def _latest_index(self, gpu: Gpu, stretch: Stretch, now: float) -> int | None:
        """Index of g's latest point that describes time the stretch held g, up to `now`."""
        times = gpu.times
        if not times:
            return None
        index = len(times) - 1
        if times[index] > now:
            index = max(0, bisect.bisect_right(times, now) - 1)
            if times[index] > now:
                return None
        if index == 0 or times[index] <= stretch.start or times[index - 1] >= stretch.end:
            return None
        return index

    def _stretch_current(self, gpu: Gpu, stretch: Stretch, now: float) -> tuple[float | None, float | None, bool]:
        """(utilisation, memory %, monitored) of the stretch's holder in g's latest sample."""
        index = self._latest_index(gpu, stretch, now)
        if index is None:
            return None, None, False
        sm, memory_value, t = gpu.sm[index], gpu.memory[index], gpu.times[index]
        memory = memory_value if memory_value == memory_value else None  # NaN: not reported
        if sm != sm:
            return None, memory, False
        start = max(gpu.times[index - 1], stretch.start)
        end = min(t, stretch.end)
        cuts = self.cuts(gpu, start, end)
        if cuts:  # the holders changed within the interval: as they were at its end
            start = cuts[-1]
        utilization = self.attribution(gpu, index, stretch.workload, start, end)[0]
        monitored = now - t <= self.gap_seconds
        return utilization, memory, monitored

    @staticmethod
    def _runs(workload: Workload, now: float) -> list[tuple[float, float]]:
        """Merged (start, end) stretches of any GPU container of the workload, clipped to now."""
        spans = list(workload.retired_runs)
        spans.extend((stretch.start, min(stretch.end, now)) for stretch in workload.stretches if stretch.start < now)
        return merged_runs(spans)

    def _holder_figures(self, gpu: Gpu, stretch: Stretch, utilization: float | None, monitored: bool) -> GpuFigures:
        """A device as held by one stretch: the device's figures with its holder and the holder's utilisation.

        Built in field order without validation (see `trusted`): a report builds one per held device.
        """
        workload = stretch.workload
        pod = workload.pods.get(stretch.pod_uid)
        latest = gpu.latest
        # every field in field order, None until set (see shared_keys_fields); setting a key keeps its place
        fields = _GPU_FIELDS.copy()
        fields["uuid"] = gpu.uuid
        if latest is None:
            fields["node"] = stretch.node or gpu.node or ""
            fields["device_units"] = 1.0
            fields["healthy"] = True
        else:
            fields["node"] = stretch.node or latest.node
            _copy_latest(fields, latest)
        fields["namespace"] = workload.namespace
        fields["workload"] = workload.name
        fields["workload_uid"] = workload.uid
        fields["pod"] = pod.name if pod else stretch.pod_uid
        fields["pod_uid"] = stretch.pod_uid
        fields["container"] = stretch.container
        fields["units"] = float(stretch.units)
        fields["utilization_percent"] = utilization
        fields["last_sample_time"] = gpu.last_time
        fields["monitored"] = monitored
        fields["active"] = None if utilization is None else utilization >= self.threshold_percent
        return trusted_complete(GpuFigures, fields)

    # ------------------------------------------------------------- reports

    def _settled_key(self, workload: Workload) -> tuple[int, str] | None:
        """What a settled workload's figures still depend on; None while it is not settled.

        Settled: every pod ended, no allocation stretch left (all folded into the totals) and
        nothing in the 1h window. Its figures no longer depend on `now` or on samples; only a
        pod event (`revision`) or its namespace's project label can change them. Finished
        workloads stay for the retention (7 days by default), so most of a large cluster's
        workloads are settled: their figures are computed once, not every status interval.
        """
        if workload.stretches or len(workload.windows) or not workload.pods:
            return None
        if workload.timeline:  # an object that may queue again: its queued and wait seconds go on
            state = workload.timeline[-1][1]
            if not (state.deleted or state.finished is not None):
                return None
        for pod in workload.pods.values():
            if pod.current.phase not in ENDED_POD_PHASES:
                return None
        return workload.revision, self.project_of(workload)

    def _workload_figures(
        self, workload: Workload, now: float, windows: tuple[list[float], list[float], list[float]] | None = None
    ) -> tuple[WorkloadFigures, _Sums]:
        """`windows`: the workload's `windows.windows(now)` when the caller computed many at once (`windows_of`)."""
        key = self._settled_key(workload)
        if key is None:
            self._settled.pop(workload.uid, None)
            return self._compute_figures(workload, now, windows)
        cached = self._settled.get(workload.uid)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        figures, sums = self._compute_figures(workload, now, windows)
        self._settled[workload.uid] = (key, figures, sums)
        return figures, sums

    def _compute_figures(
        self, workload: Workload, now: float, windows: tuple[list[float], list[float], list[float]] | None
    ) -> tuple[WorkloadFigures, _Sums]:
        sums = _Sums.of_workload(workload, workload.windows.windows(now) if windows is None else windows)
        values = sums.values
        unmonitored = workload.unmonitored_gpu_seconds
        allocated_gpus = 0.0
        idle_gpus = 0.0
        active_now = False
        sampling = True
        last_active = workload.retired_last_active
        gpus: list[GpuFigures] = []
        nodes: set[str] = set()
        models: set[str] = set()
        gpu_records = self.gpu_records
        threshold = self.threshold_percent
        for stretch in workload.stretches:
            gpu = gpu_records.get(stretch.uuid)
            if stretch.last_active > last_active:
                last_active = stretch.last_active
            if gpu is None:
                continue
            last_time = gpu.last_time
            tail_start = stretch.start if last_time is None else max(stretch.start, last_time)
            tail_end = min(stretch.end, now)
            if tail_end > tail_start:
                unmonitored += stretch.units * (tail_end - tail_start)
            if not (stretch.start <= now < stretch.end):
                continue
            allocated_gpus += stretch.units
            if stretch.node:
                nodes.add(stretch.node)
            utilization, memory, monitored = self._stretch_current(gpu, stretch, now)
            sampling = sampling and monitored
            if utilization is not None:
                values[16] += stretch.units
                values[17] += stretch.units * utilization
                if utilization >= threshold:
                    active_now = active_now or monitored
                else:
                    idle_gpus += stretch.units
            if memory is not None:
                values[18] += stretch.units
                values[19] += stretch.units * memory
            latest = gpu.latest
            if latest is not None and latest.model:
                models.add(latest.model)
            gpus.append(self._holder_figures(gpu, stretch, utilization, monitored))
        running = allocated_gpus > 0
        runs = self._runs(workload, now)
        run_seconds = sum(end - start for start, end in runs)
        last_active_time = last_active if last_active > -INFINITY else None

        pods: list[PodFigures] = []
        ended = bool(workload.pods)
        end_time: float | None = None
        end_phase = "Ended"
        any_running = False
        ordered_pods = list(workload.pods.values())
        if len(ordered_pods) > 1:
            ordered_pods.sort(key=_pod_order)
        for pod in ordered_pods:
            current = pod.current
            any_running = any_running or current.phase == "Running"
            pod_units = 0.0
            for pod_stretch in pod.stretches:
                if pod_stretch.start <= now < pod_stretch.end:
                    pod_units += pod_stretch.units
            pods.append(trusted_complete(PodFigures, {"name": pod.name, "uid": pod.uid, "node": current.node,
                                             "phase": current.phase, "allocated_gpus": pod_units,
                                             "labels": current.labels, "resources": current.resources,
                                             "failure_reason": current.failure_reason}))
            if current.phase in ENDED_POD_PHASES:
                terminal_time = pod.timeline[-1][0]
                if end_time is None or terminal_time >= end_time:
                    end_time = terminal_time
                    end_phase = current.phase if current.phase != "Deleted" else "Ended"
            else:
                ended = False
        if not ended:
            end_time = None
        state = _object_state(workload, now)
        if running:
            phase = "Running"
        elif state is not None and not (ended and end_phase != "Ended"):
            # the object's own state, where its pods do not say they finished (a preempted workload's
            # deleted pods do not end it: it queues again)
            phase, object_end = _object_phase(workload, state, now)
            if object_end is not None:
                end_time = object_end
            elif phase in _WAITING_PHASES:
                end_time = None
        elif ended:
            phase = end_phase
        elif any_running:
            phase = "Running"
        else:
            phase = "Pending"

        if running:
            current_start = runs[-1][0] if runs else now
            idle_seconds = 0.0 if active_now else max(0.0, now - max(last_active, current_start))
        elif runs:
            run_start, run_end = runs[-1]
            idle_seconds = max(0.0, run_end - max(last_active, run_start))
        else:
            idle_seconds = 0.0

        created = workload.created if workload.created is not None else workload.first_seen
        if workload.first_run_start is not None:
            wait_seconds = max(0.0, workload.first_run_start - created)
        else:
            wait_seconds = max(0.0, (end_time if end_time is not None else now) - created)
        queued_seconds = 0.0
        if workload.timeline:
            queued_seconds, requeued_wait = _queued_and_requeued(workload, created, runs, now, end_time)
            # a workload waits at least as long as it was held back: a container start the kubelet writes in
            # whole seconds can read up to a second before the admission the controller saw
            wait_seconds = max(wait_seconds + requeued_wait, queued_seconds)

        utilization_windows, memory_windows = sums.windows()
        # the engine's own numbers, every field in field order: no validation (see `trusted`), float()
        # where an int could come in; a dict of shared keys (see shared_keys_fields)
        fields = _WORKLOAD_FIELDS.copy()
        fields["uid"] = workload.uid
        fields["namespace"] = workload.namespace
        fields["name"] = workload.name
        fields["kind"] = workload.kind
        fields["api_version"] = workload.api_version
        fields["project"] = self.project_of(workload)
        fields["phase"] = phase
        fields["allocated_gpus"] = float(allocated_gpus)
        fields["allocated_gpu_seconds"] = float(workload.active_gpu_seconds + workload.idle_gpu_seconds + unmonitored)
        fields["active_gpu_seconds"] = float(workload.active_gpu_seconds)
        fields["idle_gpu_seconds"] = float(workload.idle_gpu_seconds)
        fields["unmonitored_gpu_seconds"] = float(unmonitored)
        fields["idle_gpus"] = float(idle_gpus)
        fields["unattributed_gpu_seconds"] = float(workload.unattributed_gpu_seconds)
        fields["last_active_time"] = _optional_float(last_active_time)
        fields["idle_seconds"] = float(idle_seconds)
        fields["wait_seconds"] = float(wait_seconds)
        fields["run_seconds"] = float(run_seconds)
        fields["energy_joules"] = float(workload.energy_joules)
        fields["utilization"] = utilization_windows
        fields["memory_utilization"] = memory_windows
        fields["requested_gpus"] = None if state is None else float(state.requested_gpus)
        fields["queued_seconds"] = float(queued_seconds)
        fields["local_queue"] = None if state is None else state.local_queue
        fields["cluster_queue"] = None if state is None else state.cluster_queue
        fields["failure_reason"] = None if state is None else state.message
        fields["created_time"] = _optional_float(created)
        fields["start_time"] = _optional_float(workload.first_run_start)
        fields["end_time"] = _optional_float(end_time)
        fields["sampling"] = running and sampling
        fields["gpu_model"] = min(models) if models else None
        fields["nodes"] = sorted(nodes)
        fields["pods"] = pods
        fields["gpus"] = sorted(gpus, key=_gpu_order)
        return trusted_complete(WorkloadFigures, fields), sums

    def workloads(self, now: float | None = None) -> list[WorkloadFigures]:
        at = self.clock if now is None else now
        return [row[1] for row in self._rows(at)]

    def workload(self, uid: str, now: float | None = None) -> WorkloadFigures | None:
        """One workload's figures; at the latest report's `now` with no input since, from that report's window sums
        (the status writer renders CRs at their report's time: no second pass over their hour of segments)."""
        workload = self.workload_records.get(uid)
        if workload is None:
            return None
        at = self.clock if now is None else now
        memo = self._report_windows
        windows = memo.get(uid) if memo is not None and memo.now == at and memo.inputs == self.inputs else None
        return self._workload_figures(workload, at, windows)[0]

    def _sorted_workloads(self) -> list[Workload]:
        """In report order; the same list while no workload comes or goes (not sorted again each report)."""
        ordered = self._ordered
        if ordered is None or len(ordered) != len(self.workload_records):
            ordered = self._ordered = sorted(self.workload_records.values(), key=lambda w: (w.namespace, w.name, w.uid))
        return ordered

    def _rows(self, now: float) -> list[tuple[Workload, WorkloadFigures, _Sums]]:
        """Every workload's figures and window sums, the windows of all computed in one pass."""
        ordered = self._sorted_workloads()
        self._report_windows = None  # the last report's sums go before this one's are made, not after
        windows = windows_of([workload.windows for workload in ordered], now)
        self._report_windows = _ReportWindows(now, self.inputs, [workload.uid for workload in ordered], windows)
        return [(workload, *self._workload_figures(workload, now, window))
                for workload, window in zip(ordered, windows, strict=True)]

    def projects(self, now: float | None = None) -> list[ProjectFigures]:
        at = self.clock if now is None else now
        return self._projects(self._rows(at))

    def _projects(self, rows: Iterable[tuple[Workload, WorkloadFigures, _Sums]]) -> list[ProjectFigures]:
        grouped: dict[str, tuple[list[WorkloadFigures], list[_Sums]]] = {}
        for _workload, figures, sums in rows:
            entry = grouped.setdefault(figures.project, ([], []))
            entry[0].append(figures)
            entry[1].append(sums)
        projects = []
        for name in sorted(grouped):
            members, member_sums = grouped[name]
            namespaces = sorted({figures.namespace for figures in members})
            quota = self._quota(namespaces)
            projects.append(trusted_complete(ProjectFigures, {
                "name": name,
                "workloads": len(members),
                "running_workloads": sum(1 for figures in members if figures.allocated_gpus > 0),
                "namespaces": namespaces,
                "allocated_gpus": float(sum(figures.allocated_gpus for figures in members)),
                "idle_gpus": float(sum(figures.idle_gpus for figures in members)),
                "quota": _optional_float(quota),
                "requested_gpus": float(sum(figures.requested_gpus or 0.0 for figures in members
                                            if figures.phase in _WAITING_PHASES)),
                "queued_workloads": sum(1 for figures in members if figures.phase == "Queued"),
                "longest_queued_seconds": float(max((figures.queued_seconds for figures in members
                                                     if figures.phase == "Queued"), default=0.0)),
                **_totals(members, _Sums.total(member_sums)),
            }))
        return projects

    def _quota(self, namespaces: list[str]) -> float | None:
        total: float | None = None
        for name in namespaces:
            namespace = self.namespaces.get(name)
            if namespace is None:
                continue
            raw = namespace.annotations.get(self.config.quota_annotation)
            if raw is None:
                continue
            try:
                value = gpu_quota(raw)
            except ValueError:
                continue  # a malformed annotation (or NaN, infinity) is not a quota; the controller warns about it
            total = value if total is None else total + value
        return total

    def report(self, now: float | None = None) -> tuple[list[WorkloadFigures], list[ProjectFigures], ClusterFigures]:
        """Workloads, projects and cluster in one pass (what the controller writes each interval)."""
        at = self.clock if now is None else now
        rows = self._rows(at)
        workloads = [row[1] for row in rows]
        projects = self._projects(rows)
        cluster_sums = _Sums.total(row[2] for row in rows)
        return workloads, projects, self._cluster(workloads, cluster_sums)

    def cluster(self, now: float | None = None) -> ClusterFigures:
        return self.report(now)[2]

    def _cluster(self, workloads: list[WorkloadFigures], sums: _Sums) -> ClusterFigures:
        samples = [gpu.latest for gpu in self.gpu_records.values() if gpu.latest is not None]
        mig_parents = {sample.parent_uuid for sample in samples if sample.parent_uuid}
        # a MIG parent's own samples are not capacity: its instances are
        total_units = sum(sample.device_units for sample in samples if sample.uuid not in mig_parents)
        return trusted_complete(ClusterFigures, {
            "gpus": len(samples),
            "healthy_gpus": sum(1 for sample in samples if sample.healthy),
            "total_gpu_units": float(total_units),
            "allocated_gpus": float(sum(w.allocated_gpus for w in workloads)),
            "idle_gpus": float(sum(w.idle_gpus for w in workloads)),
            "workloads": len(workloads),
            "running_workloads": sum(1 for w in workloads if w.allocated_gpus > 0),
            **_totals(workloads, sums),
        })

    def gpus(self, now: float | None = None) -> list[GpuFigures]:
        """Every device by its latest sample, once per holder (a shared GPU has several)."""
        at = self.clock if now is None else now
        result: list[GpuFigures] = []
        for uuid in sorted(self.gpu_records):
            gpu = self.gpu_records[uuid]
            latest = gpu.latest
            if latest is None:
                continue
            holders = [s for s in gpu.stretches if s.start <= at < s.end]
            if not holders:
                fields: dict[str, Any] = {"node": latest.node, "uuid": gpu.uuid, "last_sample_time": gpu.last_time}
                _copy_latest(fields, latest)
                monitored = at - latest.t <= self.gap_seconds and latest.sm_percent is not None
                result.append(GpuFigures(utilization_percent=latest.sm_percent, monitored=monitored, **fields))
            for stretch in holders:
                utilization, _memory, monitored = self._stretch_current(gpu, stretch, at)
                result.append(self._holder_figures(gpu, stretch, utilization, monitored))
        return result

