"""The engine's internal records: GPU sample points, allocation stretches, pods and workloads.

Plain classes with __slots__: the engine absorbs hundreds of thousands of samples a
second, and pydantic validation per record would cost more than the accounting itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuwm.accounting.windows import WindowSums
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import PodEvent

INFINITY = math.inf


@dataclass(frozen=True)
class EngineConfig:
    """What the accounting depends on besides its input."""

    interval_seconds: float = 1.0
    idle_threshold_percent: float = 1.0
    project_label: str = "gpuwm.io/project"
    late_event_window_seconds: float = 120.0
    quota_annotation: str = "gpuwm.io/gpu-quota"

    @property
    def gap_seconds(self) -> float:
        """A sample interval longer than this is unmonitored (DESIGN §3: 3 x the poll interval)."""
        return 3.0 * self.interval_seconds


class Point:
    """GPU g's sample at `t`, reduced to what the accounting of (t_prev, t] needs."""

    __slots__ = ("device_units", "energy", "mem_percent", "pod_sm", "sm", "t")

    def __init__(
        self,
        t: float,
        sm: float | None,
        mem_percent: float | None,
        energy: float | None,
        pod_sm: dict[str, float] | None,
        device_units: float,
    ) -> None:
        self.t = t
        self.sm = sm
        self.mem_percent = mem_percent
        self.energy = energy
        self.pod_sm = pod_sm  # SM % per pod uid from per-process data; None when there is none
        self.device_units = device_units

    @classmethod
    def from_sample(cls, sample: GpuSample) -> Point:
        pod_sm: dict[str, float] | None = None
        processes = sample.processes
        if processes is not None:
            with_sm = [process for process in processes if process.sm_percent is not None]
            if with_sm or not processes:  # [] means "no processes": per-process data saying 0
                pod_sm = {}
                for process in with_sm:
                    if process.pod_uid is not None:
                        pod_sm[process.pod_uid] = pod_sm.get(process.pod_uid, 0.0) + (process.sm_percent or 0.0)
        used, total = sample.memory_used_bytes, sample.memory_total_bytes
        mem_percent = None if used is None or not total else min(100.0, 100.0 * used / total)
        sm = sample.sm_percent if sample.healthy else None
        return cls(sample.t, sm, mem_percent, sample.energy_joules, pod_sm, sample.device_units)

    def to_list(self) -> list[Any]:
        return [self.t, self.sm, self.mem_percent, self.energy, self.pod_sm, self.device_units]

    @classmethod
    def from_list(cls, values: list[Any]) -> Point:
        return cls(values[0], values[1], values[2], values[3], values[4], values[5])


class Stretch:
    """Pod `pod_uid` holding `units` of device `uuid` over (start, end]; end is inf while it runs."""

    __slots__ = ("container", "end", "last_active", "node", "pod_uid", "start", "units", "uuid", "workload")

    def __init__(
        self,
        workload: Workload,
        pod_uid: str,
        uuid: str,
        node: str | None,
        units: float,
        container: str | None,
        start: float,
        end: float = INFINITY,
    ) -> None:
        self.workload = workload
        self.pod_uid = pod_uid
        self.uuid = uuid
        self.node = node
        self.units = units
        self.container = container
        self.start = start
        self.end = end
        self.last_active = -INFINITY  # end of the latest active piece applied to this stretch


class Gpu:
    """One physical GPU or MIG instance: its recent sample points and the stretches on it."""

    __slots__ = ("latest", "node", "points", "pruned", "stretches", "times", "uuid")

    def __init__(self, uuid: str, node: str | None) -> None:
        self.uuid = uuid
        self.node = node
        self.times: list[float] = []
        self.points: list[Point] = []
        self.latest: GpuSample | None = None
        self.stretches: list[Stretch] = []
        self.pruned = False  # whether older points were forgotten (the first point is then not the first sample)

    @property
    def last_time(self) -> float | None:
        return self.times[-1] if self.times else None


class Pod:
    """A GPU pod: its state timeline (a later event replaces the state from its time on)."""

    __slots__ = ("labels", "name", "namespace", "stretches", "timeline", "uid", "workload")

    def __init__(self, uid: str, workload: Workload, event: PodEvent) -> None:
        self.uid = uid
        self.workload = workload
        self.name = event.name
        self.namespace = event.namespace
        self.labels: dict[str, str] = dict(event.labels)
        self.timeline: list[tuple[float, PodEvent]] = []
        self.stretches: list[Stretch] = []

    @property
    def current(self) -> PodEvent:
        return self.timeline[-1][1]


class Workload:
    """A workload's pods, stretches and the figures applied so far."""

    __slots__ = (
        "active_seconds",
        "api_version",
        "created",
        "energy_joules",
        "first_run_start",
        "first_seen",
        "idle_seconds",
        "kind",
        "labels",
        "labels_key",
        "life_mem",
        "life_mem_units",
        "life_units",
        "life_util",
        "name",
        "namespace",
        "pods",
        "retired_last_active",
        "retired_runs",
        "stretches",
        "uid",
        "unmonitored_seconds",
        "windows",
    )

    def __init__(self, uid: str, event: PodEvent) -> None:
        self.uid = uid
        self.namespace = event.namespace
        self.name = event.workload.name
        self.kind = event.workload.kind
        self.api_version = event.workload.api_version
        self.created = event.workload.created
        self.first_seen = event.t
        self.labels: dict[str, str] = dict(event.labels)  # of the newest pod event, for the project
        self.labels_key = (event.t, event.uid)  # which pod event `labels` came from
        self.pods: dict[str, Pod] = {}
        self.stretches: list[Stretch] = []
        self.active_seconds = 0.0  # unit-seconds, as are idle and unmonitored
        self.idle_seconds = 0.0
        self.unmonitored_seconds = 0.0
        self.energy_joules = 0.0
        self.life_units = 0.0  # monitored unit-seconds
        self.life_util = 0.0  # monitored unit-seconds x utilisation %
        self.life_mem_units = 0.0  # unit-seconds with memory known
        self.life_mem = 0.0  # those x memory %
        self.windows = WindowSums()
        self.first_run_start: float | None = None
        self.retired_runs: list[tuple[float, float]] = []  # merged runs of stretches no longer tracked
        self.retired_last_active = -INFINITY
