"""Period reports (`GET /api/v1/report`): GPU-hours, idle, energy and peak allocation per project,
namespace or workload over start..end, from the stored series, as JSON or CSV.

Chargeback and capacity reviews ask "what did each project hold and waste last month"; the CR status
and the workload list carry lifetime totals, so a period needs the series. Each stored point stands for
one step of time ending at it: the units held then count as allocated GPU-seconds for the step, split by
that device's utilisation point into active (>= idleThresholdPercent), idle (below) and unmonitored (no
point). With the status interval as the step (periods up to `MAX_STEPS` intervals) that is the engine's
own split at the status interval's resolution; longer periods use a coarser step, a whole multiple of it.
Energy is the difference of the cumulative energyJoules series between the period's ends; wasted
GPU-hours are the idle ones (held, monitored, unused), as in the CRs' "Wasted GPU-h" column.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model import WorkloadFigures
from gpuwm.store import RangeQuery, Series, Store

ReportBy = Literal["project", "namespace", "workload"]
ReportFormat = Literal["json", "csv"]
#: at most this many steps per series; a longer period takes a coarser step (a multiple of the status interval)
MAX_STEPS = 10_000
DEFAULT_PERIOD_SECONDS = 86400.0
CSV_COLUMNS = (
    "project", "namespace", "workload", "kind", "workloads", "allocatedGpuHours", "activeGpuHours",
    "idleGpuHours", "unmonitoredGpuHours", "wastedGpuHours", "energyJoules", "meanUtilizationPercent",
    "peakAllocatedGpus",
)


class ReportRow(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)

    project: str | None = None
    namespace: str | None = None
    workload: str | None = None
    kind: str | None = None
    workloads: int = Field(default=0, description="Workloads that held GPUs in the period.")
    allocated_gpu_hours: float = 0.0
    active_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    unmonitored_gpu_hours: float = 0.0
    wasted_gpu_hours: float = Field(default=0.0, description="Idle GPU-hours: held and monitored below the threshold.")
    energy_joules: float = 0.0
    mean_utilization_percent: float | None = Field(
        default=None, description="Allocation-weighted mean over the monitored time; None where none was."
    )
    peak_allocated_gpus: float = Field(default=0.0, description="Most units held at once (at one stored point).")


class Report(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)

    start: float
    end: float
    step_seconds: float = Field(description="Time each stored point stands for in this report.")
    by: str
    idle_threshold_percent: float
    rows: list[ReportRow]
    total: ReportRow


@dataclass
class _Sums:
    allocated: float = 0.0
    active: float = 0.0
    idle: float = 0.0
    unmonitored: float = 0.0
    weighted_utilization: float = 0.0
    energy: float = 0.0
    workloads: int = 0
    allocation: list[float] = field(default_factory=list)  # units held at each point of the period, for the peak

    def add(self, other: _Sums) -> None:
        self.allocated += other.allocated
        self.active += other.active
        self.idle += other.idle
        self.unmonitored += other.unmonitored
        self.weighted_utilization += other.weighted_utilization
        self.energy += other.energy
        self.workloads += other.workloads
        for index, units in enumerate(other.allocation):
            self.allocation[index] += units

    def row(self, **keys: str | None) -> ReportRow:
        monitored = self.active + self.idle
        return ReportRow(
            **keys, workloads=self.workloads,
            allocated_gpu_hours=self.allocated / 3600.0, active_gpu_hours=self.active / 3600.0,
            idle_gpu_hours=self.idle / 3600.0, unmonitored_gpu_hours=self.unmonitored / 3600.0,
            wasted_gpu_hours=self.idle / 3600.0, energy_joules=self.energy,
            mean_utilization_percent=self.weighted_utilization / monitored if monitored > 0 else None,
            peak_allocated_gpus=round(max(self.allocation, default=0.0), 6),
        )


def report_step(start: float, end: float, status_interval_seconds: float) -> float:
    """The status interval, or the smallest multiple of it that keeps the period within MAX_STEPS points."""
    interval = max(status_interval_seconds, 1.0)
    return interval * max(1, math.ceil((end - start) / interval / MAX_STEPS))


def split_devices(
    devices: Sequence[Series], points: int, step: float, threshold: float
) -> _Sums:
    """Allocated, active, idle and unmonitored GPU-seconds of one workload from its per-device series."""
    sums = _Sums(allocation=[0.0] * points)
    by_device: dict[tuple[str, str], dict[str, Series]] = {}
    for series in devices:
        key = (series.labels.get("uuid", ""), series.labels.get("pod", ""))
        by_device.setdefault(key, {})[series.metric] = series
    for metrics in by_device.values():
        allocated = metrics.get("gpu_allocated")
        if allocated is None:
            continue
        utilization = metrics.get("gpu_utilization_percent")
        for index, (_t, units) in enumerate(allocated.points[:points]):
            if not units:
                continue
            seconds = units * step
            sums.allocated += seconds
            sums.allocation[index] += units
            value = utilization.points[index][1] if utilization is not None and index < len(utilization.points) else None
            if value is None:
                sums.unmonitored += seconds
            elif value >= threshold:
                sums.active += seconds
                sums.weighted_utilization += seconds * value
            else:
                sums.idle += seconds
                sums.weighted_utilization += seconds * value
    return sums


def energy_between(points: list[tuple[float, float | None]]) -> float:
    """Δ of a cumulative series: its last value minus its value at the first point (0 before it existed)."""
    values = [value for _t, value in points[1:] if value is not None]
    if not values:
        return 0.0
    before = points[0][1] if points and points[0][1] is not None else 0.0
    return max(0.0, values[-1] - before)


def overlaps(workload: WorkloadFigures, start: float, end: float) -> bool:
    began = workload.start_time if workload.start_time is not None else workload.created_time
    if began is not None and began > end:
        return False
    return workload.end_time is None or workload.end_time >= start


def build_report(
    store: Store, workloads: Iterable[WorkloadFigures], start: float, end: float, by: ReportBy,
    status_interval_seconds: float, threshold: float,
) -> Report:
    """Read each workload's series over the period and sum them per row (blocking: run off the loop)."""
    step = report_step(start, end, status_interval_seconds)
    points = int((end - start) // step)
    groups: dict[tuple[str | None, ...], _Sums] = {}
    total = _Sums(allocation=[0.0] * points)
    for workload in workloads:
        if points <= 0 or not overlaps(workload, start, end):
            continue
        # the point at t stands for the step ending at t: the first one inside the period ends at start + step
        first, last = start + step, start + step * points
        devices = store.query_range(RangeQuery(
            "workload", workload.uid, ("gpu_allocated", "gpu_utilization_percent"), first, last, step, "gpu"))
        sums = split_devices(devices, points, step, threshold)
        if sums.allocated <= 0:
            continue
        energy = store.query_range(RangeQuery("workload", workload.uid, ("gpu_energy_joules",), start, last, step))
        sums.energy = energy_between(energy[0].points) if energy else 0.0
        sums.workloads = 1
        if by == "workload":
            key: tuple[str | None, ...] = (workload.project, workload.namespace, workload.name, workload.kind)
        elif by == "namespace":
            key = (None, workload.namespace, None, None)
        else:
            key = (workload.project, None, None, None)
        groups.setdefault(key, _Sums(allocation=[0.0] * points)).add(sums)
        total.add(sums)
    rows = [
        sums.row(project=key[0], namespace=key[1], workload=key[2], kind=key[3])
        for key, sums in sorted(groups.items(), key=lambda item: tuple(part or "" for part in item[0]))
    ]
    return Report(start=start, end=end, step_seconds=step, by=by, idle_threshold_percent=threshold, rows=rows,
                  total=total.row())


def report_csv(report: Report) -> str:
    """One line per row and a last `total` line; hours and percent with 6 decimals, joules with 3."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in [*report.rows, report.total.model_copy(update={"project": "total"})]:
        data = row.model_dump(by_alias=True)
        line = []
        for column in CSV_COLUMNS:
            value = data[column]
            if value is None:
                line.append("")
            elif isinstance(value, float):
                line.append(f"{value:.3f}" if column == "energyJoules" else f"{value:.6f}")
            elif isinstance(value, str):
                line.append(csv_text_cell(value))
            else:
                line.append(str(value))
        writer.writerow(line)
    return out.getvalue()


#: what a spreadsheet reads as the start of a formula (or strips before one): =, +, -, @, tab and CR
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text_cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that would start a formula gets a leading `'`
    (OWASP's advice against CSV injection; the csv writer quotes it where needed). Numbers are
    written as numbers: a negative one is no formula."""
    return "'" + text if text.startswith(_FORMULA_STARTS) else text
