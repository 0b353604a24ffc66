"""Period reports (`GET /api/v1/report`): GPU-hours, idle, energy and peak allocation per project,
namespace or workload over start..end, from the engine's stored counters, as JSON or CSV.

Chargeback and capacity reviews ask "what did each project hold and waste last month". Every additive
column is a difference of the engine's own cumulative figures between the period's edges, summed over a
row's workloads (`Store.period`; where an edge falls and why periods add up: store/periods.py). Where an
edge cut a bucket only a coarse tier still holds, the row says so: `exact` false and `apportionedGpuHours`.
Peaks are the most units held at one status interval (`Store.peak_allocated`), the same whatever the
period's length. Wasted GPU-hours are the idle ones (held, monitored, unused), as in the CRs' "Wasted
GPU-h" column. With `pricing` set, each row also says what it cost: its runs' GPU-seconds of the period at
their prices, plus energy (api/report_cost.py), and the cost of GPUs held and not used (`idleCost`) apart.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.api.report_cost import PeriodPricing, cost_columns
from gpuwm.store import PeriodSums, Store, WorkloadGroup, WorkloadPeriod

ReportBy = Literal["project", "namespace", "workload"]
ReportFormat = Literal["json", "csv", "focus"]
DEFAULT_PERIOD_SECONDS = 86400.0
CSV_COLUMNS = (
    "project", "namespace", "workload", "workloadUid", "kind", "workloads", "allocatedGpuHours", "activeGpuHours",
    "idleGpuHours", "unmonitoredGpuHours", "wastedGpuHours", "energyJoules", "meanUtilizationPercent",
    "peakAllocatedGpus", "exact", "apportionedGpuHours", "cost", "idleCost", "energyCost", "currency",
    "unpricedGpuHours", "apportionedCost", "pricePerGpuHour",
)
#: the key of the total row's group in `Store.peak_allocated`
_TOTAL = "total"


class ReportRow(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)

    project: str | None = None
    namespace: str | None = None
    workload: str | None = None
    workload_uid: str | None = Field(default=None, description="The run (by=workload): a reused name's runs are rows "
                                     "of their own.")
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
    peak_allocated_gpus: float = Field(default=0.0, description="Most units held at once (at one status interval).")
    exact: bool = Field(default=True, description="Every figure is the engine's, at the status interval's resolution.")
    apportioned_gpu_hours: float = Field(
        default=0.0, description="Allocated GPU-hours apportioned by time: a period edge in a stretch only a coarse "
        "tier still holds, or what a workload accrued before the store first saw it.")
    cost: float | None = Field(default=None, description="GPU-hours of its priced runs at their price per GPU-hour, "
                               "plus energy at the kWh price; None without pricing.")
    idle_cost: float | None = Field(default=None, description="Idle GPU-hours at their runs' prices: GPUs held and "
                                    "not used, reported apart (a part of cost).")
    energy_cost: float | None = Field(default=None, description="Energy at the kWh price (a part of cost).")
    currency: str | None = None
    unpriced_gpu_hours: float | None = Field(default=None, description="Allocated GPU-hours of runs with no price "
                                             "(no pricing rule matched their GPUs): in no cost.")
    apportioned_cost: float | None = Field(default=None, description="The part of cost on apportioned GPU-hours "
                                           "(exact false).")
    price_per_gpu_hour: float | None = Field(default=None, description="A workload row's price of a whole "
                                             "GPU-hour (a slice or replica pays its units' share).")


class Report(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)

    start: float
    end: float
    step_seconds: float = Field(description="The resolution of exact figures: a status interval counts in the "
                                "period holding its time, snapped down to this step.")
    by: str
    idle_threshold_percent: float
    exact: bool = Field(description="Every row is exact (see ReportRow.exact).")
    currency: str | None = Field(default=None, description="The cost columns' currency; None without pricing.")
    rows: list[ReportRow]
    total: ReportRow


class _RowKey(NamedTuple):
    """What a report row is of: a project, a namespace or one workload's run (None: not this row's)."""

    project: str | None
    namespace: str | None
    workload: str | None = None
    workload_uid: str | None = None
    kind: str | None = None


def _row_key(workload: WorkloadPeriod, by: ReportBy) -> _RowKey:
    """The row `workload` is summed into."""
    if by == "workload":
        return _RowKey(workload.project, workload.namespace, workload.name, workload.uid, workload.kind)
    if by == "namespace":
        return _RowKey(None, workload.namespace)
    return _RowKey(workload.project, None)


def _row(members: Sequence[WorkloadPeriod], peak: float, **keys: str | None) -> ReportRow:
    sums = PeriodSums()
    apportioned = 0.0
    for member in members:
        sums = sums.plus(member.sums)
        apportioned += member.apportioned_gpu_seconds
    monitored = sums.active_gpu_seconds + sums.idle_gpu_seconds
    return ReportRow(
        **keys, workloads=sum(1 for member in members if member.sums.allocated_gpu_seconds > 0),
        allocated_gpu_hours=sums.allocated_gpu_seconds / 3600.0, active_gpu_hours=sums.active_gpu_seconds / 3600.0,
        idle_gpu_hours=sums.idle_gpu_seconds / 3600.0, unmonitored_gpu_hours=sums.unmonitored_gpu_seconds / 3600.0,
        wasted_gpu_hours=sums.idle_gpu_seconds / 3600.0, energy_joules=sums.energy_joules,
        mean_utilization_percent=100.0 * sums.utilized_gpu_seconds / monitored if monitored > 0 else None,
        peak_allocated_gpus=round(peak, 6), exact=apportioned <= 0.0, apportioned_gpu_hours=apportioned / 3600.0,
    )


def _peak_group(key: _RowKey, namespaces: frozenset[str] | None) -> WorkloadGroup:
    """The workloads of a project or namespace row, as labels: those of its project (in the namespaces the
    reader may see, None: all) or of its namespace."""
    if key.namespace is not None:
        return WorkloadGroup(namespaces=frozenset({key.namespace}))
    return WorkloadGroup(project=key.project, namespaces=namespaces)


def build_report(
    store: Store, workloads: Sequence[WorkloadPeriod], start: float, end: float, by: ReportBy,
    step_seconds: float, threshold: float, namespaces: frozenset[str] | None = None,
    pricing: PeriodPricing | None = None,
) -> Report:
    """Sum `workloads` (the store's period figures a caller may read: those of `namespaces`, None where it may
    read all of them) per row (blocking: run off the loop); priced with `pricing` where given."""
    groups: dict[_RowKey, list[WorkloadPeriod]] = {}
    for workload in workloads:
        groups.setdefault(_row_key(workload, by), []).append(workload)
    ordered = sorted(groups.items(), key=lambda item: tuple(part or "" for part in item[0]))
    # a workload row's peak is its own; a group's is its workloads' together, at one status interval
    wanted = {_TOTAL: WorkloadGroup(namespaces=namespaces)}
    if by != "workload":
        wanted.update((str(index), _peak_group(key, namespaces)) for index, (key, _) in enumerate(ordered))
    peaks = store.peak_allocated(start, end, wanted) if workloads else {}
    rows = []
    for index, (key, group) in enumerate(ordered):
        peak = group[0].peak_allocated_gpus if by == "workload" else peaks.get(str(index), 0.0)
        row = _row(group, peak, **key._asdict())
        rows.append(_priced(row, group, pricing, by == "workload"))
    total = _priced(_row(workloads, peaks.get(_TOTAL, 0.0)), workloads, pricing, False)
    return Report(start=start, end=end, step_seconds=step_seconds, by=by, idle_threshold_percent=threshold,
                  exact=total.exact, rows=rows, total=total, currency=pricing.currency if pricing else None)


def _priced(row: ReportRow, members: Sequence[WorkloadPeriod], pricing: PeriodPricing | None, one_run: bool
            ) -> ReportRow:
    return row if pricing is None else row.model_copy(update=cost_columns(members, pricing, one_run))


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
            elif isinstance(value, bool):
                line.append("true" if value else "false")
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
