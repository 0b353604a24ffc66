"""The accounting engine (`Engine`): its input and arithmetic (`gpuwm.accounting.core`), and the figures at time
`now` it reports per workload, project, GPU and cluster (DESIGN §3)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from functools import reduce
from operator import add
from typing import Any, NamedTuple

from gpuwm.accounting.core import EngineCore, merged_runs
from gpuwm.accounting.lifecycle import (
    WAITING_PHASES,
    idle_seconds,
    object_state,
    phase_and_end,
    pods_at,
    wait_and_queued,
)
from gpuwm.accounting.persist import restore_state, save_state
from gpuwm.accounting.state import INFINITY, EngineConfig, Gpu, Stretch, Workload
from gpuwm.accounting.windows import windows_of
from gpuwm.model import (
    ENDED_POD_PHASES,
    ClusterFigures,
    GpuFigures,
    LatestSample,
    ProjectFigures,
    WorkloadFigures,
    gpu_quota,
)

#: a workload's 1m, 5m and 1h window integrals (`WindowSums.windows(now)`): per window units, units x util,
#: memory units, memory units x memory %
RecentWindows = tuple[list[float], list[float], list[float]]


def _gpu_order(item: dict[str, Any]) -> tuple[str, str, str, str]:
    return item["node"], item["uuid"], item["pod"] or "", item["container"] or ""


def _device_fields(latest: LatestSample) -> dict[str, Any]:
    """What a device's latest sample says about the device itself, as GpuFigures' fields."""
    return {
        "index": latest.index, "model": latest.model, "mig_profile": latest.mig_profile,
        "parent_uuid": latest.parent_uuid, "device_units": latest.device_units, "sm_percent": latest.sm_percent,
        "memory_used_bytes": latest.memory_used_bytes, "memory_total_bytes": latest.memory_total_bytes,
        "power_watts": latest.power_watts, "healthy": latest.healthy, "error": latest.error,
    }


#: GpuFigures' device fields where the device has sent no sample yet
_NO_DEVICE_FIELDS: dict[str, Any] = {
    "index": None, "model": None, "mig_profile": None, "parent_uuid": None, "device_units": 1.0, "sm_percent": None,
    "memory_used_bytes": None, "memory_total_bytes": None, "power_watts": None, "healthy": True, "error": None,
}


class Weighted(NamedTuple):
    """Allocation weights and weighted percents, whose ratios are allocation-weighted means.

    Over a window: monitored unit-seconds and their integral of utilisation %, unit-seconds with
    memory known and their integral of memory %. Now: units held, and units x percent.
    """

    units: float = 0.0
    utilization: float = 0.0
    memory_units: float = 0.0
    memory: float = 0.0

    def means(self) -> tuple[float | None, float | None]:
        """(utilisation %, memory %); None where nothing was weighed."""
        # 1e-9: what is left of a window after taking back late input is rounding, not time
        return (self.utilization / self.units if self.units > 1e-9 else None,
                self.memory / self.memory_units if self.memory_units > 1e-9 else None)


class _Sums(NamedTuple):
    """One or more workloads' weights per window: added up across a project or the cluster, then divided."""

    current: Weighted
    minute: Weighted
    five_minutes: Weighted
    hour: Weighted
    lifetime: Weighted

    @classmethod
    def of_workload(cls, workload: Workload, windows: RecentWindows, current: Weighted) -> _Sums:
        minute, five, hour = windows
        lifetime = Weighted(workload.life_units, workload.life_util, workload.life_mem_units, workload.life_mem)
        return cls(current, Weighted(*minute), Weighted(*five), Weighted(*hour), lifetime)

    @classmethod
    def total(cls, many: Iterable[_Sums]) -> _Sums:
        """Each window's weights added up over `many`, in their order, from 0.0."""
        windows = list(zip(*many, strict=True))  # per window, every member's weights
        if not windows:
            return _NO_SUMS
        return cls(*(Weighted(*(reduce(add, column, 0.0) for column in zip(*window, strict=True)))
                     for window in windows))

    def windows(self) -> tuple[dict[str, float | None], dict[str, float | None]]:
        """The utilisation and the memory means of each window, as Windows' fields."""
        means = [weighted.means() for weighted in self]
        utilization, memory = ({"current": means[0][kind], "avg1m": means[1][kind], "avg5m": means[2][kind],
                                "avg1h": means[3][kind], "lifetime": means[4][kind]} for kind in (0, 1))
        return utilization, memory


_NO_SUMS = _Sums(Weighted(), Weighted(), Weighted(), Weighted(), Weighted())


def _totals(members: list[WorkloadFigures], sums: _Sums) -> dict[str, Any]:
    """The last fields of ProjectFigures and of ClusterFigures: sums over `members`, means of `sums`."""
    utilization, memory = sums.windows()
    return {
        "allocated_gpu_seconds": sum(figures.allocated_gpu_seconds for figures in members),
        "active_gpu_seconds": sum(figures.active_gpu_seconds for figures in members),
        "idle_gpu_seconds": sum(figures.idle_gpu_seconds for figures in members),
        "unmonitored_gpu_seconds": sum(figures.unmonitored_gpu_seconds for figures in members),
        "energy_joules": sum(figures.energy_joules for figures in members),
        "utilization": utilization,
        "memory_utilization": memory,
    }


class _Holdings(NamedTuple):
    """What a workload's allocation stretches say at `now`: the devices it holds and their latest samples."""

    allocated_gpus: float
    idle_gpus: float
    unmonitored_gpu_seconds: float
    last_active: float
    active_now: bool
    sampling: bool
    current: Weighted
    gpus: list[dict[str, Any]]  # GpuFigures' fields, validated with the workload's
    nodes: set[str]
    models: set[str]


class _ReportWindows:
    """Each workload's `windows.windows(now)` of one report, kept until the next report or input (the
    report's own lists, not copies: packing them costs more than keeping them).
    `inputs`: the engine's input count at the report (see `EngineCore.inputs`)."""

    __slots__ = ("_row_of", "_windows", "inputs", "now")

    def __init__(
        self, now: float, inputs: int, uids: list[str], windows: list[RecentWindows]
    ) -> None:
        self.now = now
        self.inputs = inputs
        self._row_of = dict(zip(uids, range(len(uids)), strict=True))
        self._windows = windows

    def get(self, uid: str) -> RecentWindows | None:
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
        """The figures a report reuses for a settled workload (the same object each time, so a caller may
        skip what it did with them last time), else None."""
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

    def _holder_fields(
        self, gpu: Gpu, stretch: Stretch, utilization: float | None, monitored: bool
    ) -> dict[str, Any]:
        """A device as held by one stretch, as GpuFigures' fields: the device's, its holder and the holder's
        utilisation."""
        workload = stretch.workload
        pod = workload.pods.get(stretch.pod_uid)
        latest = gpu.latest
        device = _NO_DEVICE_FIELDS if latest is None else _device_fields(latest)
        node = stretch.node or (gpu.node or "" if latest is None else latest.node)
        return dict(
            node=node, uuid=gpu.uuid, **device, namespace=workload.namespace, workload=workload.name,
            workload_uid=workload.uid, pod=pod.name if pod else stretch.pod_uid, pod_uid=stretch.pod_uid,
            container=stretch.container, units=stretch.units, utilization_percent=utilization,
            last_sample_time=gpu.last_time, monitored=monitored,
            active=None if utilization is None else utilization >= self.threshold_percent,
        )

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
        self, workload: Workload, now: float, windows: RecentWindows | None = None
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
        self, workload: Workload, now: float, windows: RecentWindows | None
    ) -> tuple[WorkloadFigures, _Sums]:
        holdings = self._holdings(workload, now)
        sums = _Sums.of_workload(workload, workload.windows.windows(now) if windows is None else windows,
                                 holdings.current)
        running = holdings.allocated_gpus > 0
        runs = self._runs(workload, now)
        pods = pods_at(workload, now)
        state = object_state(workload, now)
        phase, end_time = phase_and_end(workload, pods, state, running, now)
        created, wait_seconds, queued_seconds = wait_and_queued(workload, runs, end_time, now)
        utilization, memory = sums.windows()
        # one validation builds the workload's devices and windows with it, from their fields
        figures = WorkloadFigures.model_validate(dict(
            uid=workload.uid, namespace=workload.namespace, name=workload.name, kind=workload.kind,
            api_version=workload.api_version, project=self.project_of(workload), phase=phase,
            allocated_gpus=holdings.allocated_gpus,
            allocated_gpu_seconds=workload.active_gpu_seconds + workload.idle_gpu_seconds
            + holdings.unmonitored_gpu_seconds,
            active_gpu_seconds=workload.active_gpu_seconds, idle_gpu_seconds=workload.idle_gpu_seconds,
            unmonitored_gpu_seconds=holdings.unmonitored_gpu_seconds, idle_gpus=holdings.idle_gpus,
            unattributed_gpu_seconds=workload.unattributed_gpu_seconds,
            last_active_time=holdings.last_active if holdings.last_active > -INFINITY else None,
            idle_seconds=idle_seconds(runs, holdings.last_active, running, holdings.active_now, now),
            wait_seconds=wait_seconds, run_seconds=sum(end - start for start, end in runs),
            energy_joules=workload.energy_joules, utilization=utilization, memory_utilization=memory,
            requested_gpus=None if state is None else state.requested_gpus, queued_seconds=queued_seconds,
            local_queue=None if state is None else state.local_queue,
            cluster_queue=None if state is None else state.cluster_queue,
            failure_reason=None if state is None else state.message,
            created_time=created, start_time=workload.first_run_start, end_time=end_time,
            sampling=running and holdings.sampling, gpu_model=min(holdings.models) if holdings.models else None,
            nodes=sorted(holdings.nodes), pods=pods.figures, gpus=sorted(holdings.gpus, key=_gpu_order),
        ))
        return figures, sums

    def _holdings(self, workload: Workload, now: float) -> _Holdings:
        """The devices the workload's stretches hold at `now`, its unmonitored tails, and its latest activity."""
        allocated_gpus = idle_gpus = 0.0
        unmonitored = workload.unmonitored_gpu_seconds
        last_active = workload.retired_last_active
        active_now, sampling = False, True
        units = utilization_weight = memory_units = memory_weight = 0.0
        gpus: list[dict[str, Any]] = []
        nodes: set[str] = set()
        models: set[str] = set()
        for stretch in workload.stretches:
            gpu = self.gpu_records.get(stretch.uuid)
            last_active = max(last_active, stretch.last_active)
            if gpu is None:
                continue
            # allocated time after g's latest sample is unmonitored until a sample covers it
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
                units += stretch.units
                utilization_weight += stretch.units * utilization
                if utilization >= self.threshold_percent:
                    active_now = active_now or monitored
                else:
                    idle_gpus += stretch.units
            if memory is not None:
                memory_units += stretch.units
                memory_weight += stretch.units * memory
            if gpu.latest is not None and gpu.latest.model:
                models.add(gpu.latest.model)
            gpus.append(self._holder_fields(gpu, stretch, utilization, monitored))
        current = Weighted(units, utilization_weight, memory_units, memory_weight)
        return _Holdings(allocated_gpus, idle_gpus, unmonitored, last_active, active_now, sampling, current, gpus,
                         nodes, models)

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
            projects.append(ProjectFigures(
                name=name,
                workloads=len(members),
                running_workloads=sum(1 for figures in members if figures.allocated_gpus > 0),
                namespaces=namespaces,
                allocated_gpus=sum(figures.allocated_gpus for figures in members),
                idle_gpus=sum(figures.idle_gpus for figures in members),
                quota=quota,
                requested_gpus=sum(figures.requested_gpus or 0.0 for figures in members
                                   if figures.phase in WAITING_PHASES),
                queued_workloads=sum(1 for figures in members if figures.phase == "Queued"),
                longest_queued_seconds=max((figures.queued_seconds for figures in members
                                            if figures.phase == "Queued"), default=0.0),
                **_totals(members, _Sums.total(member_sums)),
            ))
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
        return ClusterFigures(
            gpus=len(samples),
            healthy_gpus=sum(1 for sample in samples if sample.healthy),
            total_gpu_units=total_units,
            allocated_gpus=sum(w.allocated_gpus for w in workloads),
            idle_gpus=sum(w.idle_gpus for w in workloads),
            workloads=len(workloads),
            running_workloads=sum(1 for w in workloads if w.allocated_gpus > 0),
            **_totals(workloads, sums),
        )

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
                monitored = at - latest.t <= self.gap_seconds and latest.sm_percent is not None
                result.append(GpuFigures(node=latest.node, uuid=gpu.uuid, **_device_fields(latest),
                                         last_sample_time=gpu.last_time, utilization_percent=latest.sm_percent,
                                         monitored=monitored))
            for stretch in holders:
                utilization, _memory, monitored = self._stretch_current(gpu, stretch, at)
                result.append(GpuFigures.model_validate(self._holder_fields(gpu, stretch, utilization, monitored)))
        return result

