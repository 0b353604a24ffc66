"""Period figures from Prometheus (or VictoriaMetrics, Thanos, Mimir): the controller's counters differenced
at the period's edges, as the embedded store differences its own.

The controller exports each workload's cumulative figures as `gpuwm_workload_<figure>_total` counters
(api/prom_metrics.py). C(x), a workload's counter before x, is its last sample before x; a period [a, c)
holds C(c) - C(a): so periods add up, and a finished run's figures in any period that holds its life are
its last sample's (its CR's). A series exported no more at c (a run forgotten after its retention) keeps
its last sample's value; one with no sample before a starts from 0. A period reaching the server's now
holds every sample so far.

Reading that from a long range whole would load every sample of it at once, past the server's sample
limit at a large fleet; the period is read on a grid of `GRID_SECONDS` instead, each point the last
sample (or, for units held, the largest) in the grid step before it: no query loads more than one step of
samples. Peaks are the most units held at one scrape: a workload's from its `gpuwm_workload_allocated_gpus`,
a group's from the sum of its members' at each scrape (a subquery at the scrape interval).

A run's price per GPU-hour is the controller's `gpuwm_workload_gpu_hourly_cost` (exported every scrape while
pricing is on, by run and currency), read on the same grid: its last sample in the period.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwm.store.base import GpuHourPrice, PeriodSums, WorkloadGroup, WorkloadPeriod
from gpuwm.store.figures import FIGURE_NAMES
from gpuwm.store.promql import quote

#: a grid step: the samples one query point reads
GRID_SECONDS = 6 * 3600
#: how far back a period is read: a start before it counts from there (beyond any usual retention)
HISTORY_SECONDS = 400 * 86400.0
#: each window ends just before its point (`offset 1ms`): a sample at a period's edge counts in the period
#: that starts there
_BEFORE = "offset 1ms"
_LABELS = "namespace, workload, workload_uid, kind, project"
#: the controller's price of a run's GPU-hour (controller/policy/metrics.py)
PRICE_SERIES = "gpuwm_workload_gpu_hourly_cost"

Instant = Callable[[str, float], list[dict[str, Any]]]
Ranged = Callable[[str, float, float, float], list[dict[str, Any]]]


@dataclass(frozen=True)
class PromPeriodReader:
    """Reads a period with the store's queries: `instant(query, at)`, `ranged(query, start, end, step)`."""

    instant: Instant
    ranged: Ranged
    #: the scrape interval: a group's units are summed at each one
    scrape_seconds: float
    #: the server's now: edges after it are read at it
    now: float


@dataclass
class _Counter:
    """One workload's counter at a period's grid: its labels, and (time, value) where it had samples."""

    labels: dict[str, str]
    values: dict[float, float] = field(default_factory=dict)


def _grid(start: float, end: float) -> list[float]:
    """The period's query points: its start, the multiples of GRID_SECONDS inside it, its end. The regular ones
    go in one range query (on the step's multiples, as a server that caches range answers keeps them); the
    first and last are asked alone, to the millisecond."""
    first = math.floor(start / GRID_SECONDS) * GRID_SECONDS + GRID_SECONDS
    return [start, *(float(t) for t in range(int(first), math.ceil(end), GRID_SECONDS) if start < t < end), end]


def _answers(reader: PromPeriodReader, query: Callable[[str], str], points: Sequence[float]) -> list[
        tuple[dict[str, str], list[tuple[float, str]]]]:
    """(labels, [(time, value)]) of `query(window)` at each point after the first, `window` the time since the
    point before (the regular points in one range query, the first and last alone)."""
    answers: list[tuple[dict[str, str], list[tuple[float, str]]]] = []
    regular = points[1:-1]
    if len(regular) > 1:
        for item in reader.ranged(query(f"{GRID_SECONDS}s"), regular[1], regular[-1], GRID_SECONDS):
            answers.append((item["metric"], [(float(t), text) for t, text in item["values"]]))
    for at, before in ([(regular[0], points[0])] if regular else []) + [(points[-1], points[-2])]:
        window = f"{max(1, round((at - before) * 1000))}ms"
        answers += [(item["metric"], [(at, item["value"][1])]) for item in reader.instant(query(window), at)]
    return answers


def _read_counters(reader: PromPeriodReader, name: str, points: Sequence[float]) -> dict[str, _Counter]:
    """A counter at the period's start and at each of its points: its last sample before each (the grid's
    step back), by workload UID."""
    def query(_window: str) -> str:
        return f"max by ({_LABELS}) (last_over_time(gpuwm_workload_{name}_total[{GRID_SECONDS}s] {_BEFORE}))"

    found: dict[str, _Counter] = {}
    answers = _answers(reader, query, points)
    answers += [(item["metric"], [(points[0], item["value"][1])]) for item in reader.instant(query(""), points[0])]
    for metric, values in answers:
        series = found.setdefault(metric.get("workload_uid", ""), _Counter(labels=dict(metric)))
        for t, text in values:
            value = float(text)
            if math.isfinite(value):
                series.values[t] = value
    return found


def _edges(reader: PromPeriodReader, start: float, end: float) -> tuple[float, float] | None:
    """The period as read, to the millisecond: not before HISTORY_SECONDS back; an edge at or after the server's
    now holds everything (a millisecond after it); None where empty."""
    end = round(reader.now + 0.001 if end >= reader.now else end, 3)
    start = round(max(reader.now + 0.001 if start >= reader.now else start, end - HISTORY_SECONDS), 3)
    return (start, end) if end > start else None


def _difference(counter: _Counter, start: float) -> float:
    """C(end) - C(start): the last value read (at the end, or the last before the series went) less the value
    before `start` (0 where it had none)."""
    values = counter.values
    return values[max(values)] - values.get(start, 0.0)


def read_period(reader: PromPeriodReader, start: float, end: float) -> list[WorkloadPeriod]:
    """Every workload whose counters changed in [start, end), with their differences and its peak."""
    edges = _edges(reader, start, end)
    if edges is None:
        return []
    points = _grid(*edges)
    sums: dict[str, dict[str, float]] = {}
    labels: dict[str, dict[str, str]] = {}
    for name in FIGURE_NAMES:
        for uid, counter in _read_counters(reader, name, points).items():
            sums.setdefault(uid, {})[name] = _difference(counter, edges[0])
            labels.setdefault(uid, counter.labels)
    peaks = _largest(reader, lambda window: "max by (workload_uid) "
                     f"(max_over_time(gpuwm_workload_allocated_gpus[{window}] {_BEFORE}))", points, "workload_uid")
    result = []
    for uid, figures in sorted(sums.items()):
        if not any(abs(value) > 1e-9 for value in figures.values()):
            continue
        label = labels[uid]
        result.append(WorkloadPeriod(
            uid=uid, namespace=label.get("namespace", ""), name=label.get("workload", ""),
            project=label.get("project", ""), kind=label.get("kind") or None,
            sums=PeriodSums(**{name: figures.get(name, 0.0) for name in FIGURE_NAMES}),
            peak_allocated_gpus=peaks.get(uid, 0.0),
        ))
    return result


def _largest(reader: PromPeriodReader, query: Callable[[str], str], points: Sequence[float], by: str) -> dict[str, float]:
    """The largest value of `query(window)` over the period's steps (each window the step before a point),
    per label `by`."""
    largest: dict[str, float] = {}
    for metric, values in _answers(reader, query, points):
        key = metric.get(by, "")
        for _, text in values:
            value = float(text)
            if math.isfinite(value):
                largest[key] = max(largest.get(key, 0.0), value)
    return largest


def _selector(group: WorkloadGroup) -> str:
    """The label matchers of a group's workloads' series."""
    matchers = []
    if group.project is not None:
        matchers.append(f"project={quote(group.project)}")
    if group.namespaces is not None:
        matchers.append(f"namespace=~{quote('|'.join(re.escape(name) for name in sorted(group.namespaces)))}")
    return "{" + ", ".join(matchers) + "}"


def read_group_peaks(
    reader: PromPeriodReader, start: float, end: float, groups: Mapping[str, WorkloadGroup],
) -> dict[str, float]:
    """Per group: the most units its workloads held together at one scrape of [start, end)."""
    edges = _edges(reader, start, end)
    peaks = {key: 0.0 for key in groups}
    if edges is None:
        return peaks
    points = _grid(*edges)
    step = f"{max(1, round(reader.scrape_seconds))}s"
    for key, group in groups.items():
        if group.namespaces is None or group.namespaces:
            total = f"sum(gpuwm_workload_allocated_gpus{_selector(group)})"

            def query(window: str, total: str = total) -> str:
                return f"max_over_time({total}[{window}:{step}] {_BEFORE})"

            peaks[key] = round(max(_largest(reader, query, points, "").values(), default=0.0), 9)
    return peaks


def read_prices(reader: PromPeriodReader, uids: Sequence[str], start: float, end: float) -> dict[str, GpuHourPrice]:
    """Each of `uids`' price per GPU-hour as its series' last sample in [start, end) says (with its currency);
    a run with no sample there (pricing was off) is left out."""
    edges = _edges(reader, start, end)
    if edges is None:
        return {}
    wanted = set(uids)
    latest: dict[str, tuple[float, GpuHourPrice]] = {}
    for metric, values in _answers(
        reader, lambda window: f"max by (workload_uid, currency) (last_over_time({PRICE_SERIES}[{window}] {_BEFORE}))",
        _grid(*edges),
    ):
        uid = metric.get("workload_uid", "")
        for t, text in values:
            value = float(text)
            if uid in wanted and math.isfinite(value) and (uid not in latest or t >= latest[uid][0]):
                latest[uid] = (t, GpuHourPrice(value, metric.get("currency", "")))
    return {uid: price for uid, (_, price) in latest.items()}
