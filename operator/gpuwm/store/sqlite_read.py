"""Reading the embedded store: which tier answers which part of a range, its chunks and head rows, the grid.

A point at t is the mean (or, for counters, the max) of the stored points in [t, t + step), or with
`aggregation` min or max their least or largest (a roll-up's gauges: the buckets' own min and max). Where the
only tier that still covers a stretch is coarser than the step (a run older than the finest tier's
keep), each stored point stands for its whole interval [p, p + tier step) and answers every cell it
overlaps, so the cells there are never null where a point covers them (`resolution` names the
stretches whose values really have the coarser step).
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from gpuwm.store.base import (
    MAX_SERIES_PER_QUERY,
    METRIC_INDEX,
    METRICS,
    QueryError,
    RangeQuery,
    Rollup,
    Series,
    Stretch,
    TimeAggregation,
    check_range,
)
from gpuwm.store.chunks import TierSpan, read_chunks
from gpuwm.store.codec import (
    BLOCK,
    COLUMN_METRIC,
    PARTS,
    WHOLE,
    decode_head,
    decode_parts,
    dequantize,
    maximum_column,
    minimum_column,
)
from gpuwm.store.sql import marks
from gpuwm.store.tiers import Tier

#: (scope, by) -> (series kind, label column that selects it; None = all of that kind)
_SELECTION: dict[tuple[str, str | None], tuple[str, str | None]] = {
    ("workload", None): ("workload", "workload_uid"),
    ("workload", "gpu"): ("gpu", "workload_uid"),
    ("workload", "pod"): ("pod", "workload_uid"),
    ("workload", "node"): ("workload_node", "workload_uid"),
    ("project", None): ("project", "project"),
    ("project", "node"): ("project_node", "project"),
    ("project", "pod"): ("pod", "project"),
    ("project", "gpu"): ("gpu", "project"),
    ("node", None): ("node", "node"),
    ("node", "node"): ("node", "node"),
    ("node", "gpu"): ("gpu", "node"),
    ("node", "pod"): ("pod", "node"),
    ("cluster", None): ("cluster", None),
    ("cluster", "node"): ("node", None),
    ("cluster", "gpu"): ("gpu", None),
    ("cluster", "pod"): ("pod", None),
}


def plan_segments(
    tiers: Sequence[Tier],
    latest: float | None,
    watermarks: dict[int, float | None],
    start: float,
    end: float,
    step: float,
) -> list[tuple[Tier, int, int]]:
    """Split [start, end) into pieces, each read from one tier: the coarsest whose step fits, where it has data."""
    if latest is None:
        return []
    available: list[tuple[Tier, float, float]] = []
    for index, tier in enumerate(tiers):
        low = latest - tier.keep_seconds
        high = math.inf if index == 0 else (watermarks.get(tier.step_seconds) or low)
        available.append((tier, low, high))
    cuts = sorted({start, end, *(v for _, low, high in available for v in (low, high) if start < v < end)})
    segments: list[tuple[Tier, int, int]] = []
    for low_cut, high_cut in itertools.pairwise(cuts):
        here = [tier for tier, low, high in available if low <= low_cut and high_cut <= high]
        if not here:
            # older than every tier keeps: the coarsest tier may still hold it until retention runs
            here = [tiers[-1]] if high_cut <= available[-1][2] else [tiers[0]]
        fitting = [tier for tier in here if tier.step_seconds <= step]
        chosen = fitting[-1] if fitting else here[0]
        lo, hi = math.ceil(low_cut), math.ceil(high_cut)
        if segments and segments[-1][0] == chosen and segments[-1][2] == lo:
            segments[-1] = (chosen, segments[-1][1], hi)
        elif hi > lo:
            segments.append((chosen, lo, hi))
    return segments


def plan_stretches(
    tiers: Sequence[Tier],
    latest: float | None,
    watermarks: dict[int, float | None],
    query: RangeQuery,
) -> list[Stretch]:
    """Which step the cells of `query`'s grid really have, stretch by stretch: the query's step where the
    tier read there is as fine as it, that tier's step where only a coarser one covers the stretch."""
    cells = len(query.grid())
    end = query.start + cells * query.step_seconds
    segments = plan_segments(tiers, latest, watermarks, query.start, end, query.step_seconds)
    stretches: list[Stretch] = []
    for tier, low, high in segments:
        step = float(max(query.step_seconds, tier.step_seconds))
        first, last = max(float(low), query.start), min(float(high), end)
        if last <= first:
            continue
        previous = stretches[-1] if stretches else None
        if previous is not None and (previous.step_seconds, previous.tier) == (step, tier.name) and previous.end >= first:
            stretches[-1] = Stretch(previous.start, last, step, tier.name)
        else:
            stretches.append(Stretch(first, last, step, tier.name))
    if not stretches:
        stretches = [Stretch(query.start, end, query.step_seconds)]
    # the pieces before the first and after the last segment read at the query's step
    if stretches[0].start > query.start:
        stretches.insert(0, Stretch(query.start, stretches[0].start, query.step_seconds))
    if stretches[-1].end < end:
        stretches.append(Stretch(stretches[-1].end, end, query.step_seconds))
    return stretches


def _spread(
    times: npt.NDArray[np.int64], tier_step: int, low: int, high: int, start: float, step: float, cells: int
) -> Iterator[tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """For points of a tier coarser than the grid: (which points, their cell, their weight) for each of the
    cells a point's interval [p, p + tier_step), cut to [low, high), overlaps; a point's weights sum to one
    (the share of its interval in each cell), so it weighs what a point of the grid's step weighs."""
    begin = np.maximum(times.astype(np.float64), float(low))
    finish = np.minimum(times.astype(np.float64) + tier_step, float(high))
    first = np.floor((begin - start) / step).astype(np.int64)
    widest = math.ceil(tier_step / step) + 1
    for offset in range(widest):
        cell = first + offset
        cell_start = start + cell * step
        overlap = np.minimum(finish, cell_start + step) - np.maximum(begin, cell_start)
        chosen = (overlap > 0) & (cell >= 0) & (cell < cells)
        if not chosen.any():
            if offset > 0 and not (overlap > 0).any():
                break
            continue
        yield chosen, cell[chosen], overlap[chosen] / tier_step


def select_series(connection: sqlite3.Connection, query: RangeQuery) -> list[tuple[int, dict[str, str]]]:
    selection = _SELECTION.get((query.scope, query.by))
    if selection is None:
        raise QueryError(
            "by", f"{query.by!r} is not a breakdown of {query.scope} metrics; use gpu, pod or node"
        )
    kind, column = selection
    if query.pods:
        kind = _pod_selection(query)
    if column is None:
        rows = connection.execute("SELECT id, labels FROM series WHERE kind = ?", (kind,)).fetchall()
    else:
        rows = connection.execute(
            f"SELECT id, labels FROM series WHERE kind = ? AND {column} = ?", (kind, query.key)
        ).fetchall()
    if query.pods:
        rows = _only_pods(query, rows)
    if len(rows) > MAX_SERIES_PER_QUERY:
        raise QueryError(
            "by",
            f"{len(rows)} series exceed the limit of {MAX_SERIES_PER_QUERY}; narrow the scope or drop by=",
        )
    return [(int(series_id), json.loads(labels)) for series_id, labels in rows]


def _pod_selection(query: RangeQuery) -> str:
    """The series kind that answers a `pod=` query: the pods' own series, or their GPUs' with by=gpu."""
    if query.scope != "workload":
        raise QueryError("pod", "selects pods of a workload; it applies to workload metrics only")
    if query.by not in (None, "pod", "gpu"):
        raise QueryError("by", f"{query.by!r} does not combine with pod=; use by=pod, by=gpu or leave by out")
    return "gpu" if query.by == "gpu" else "pod"


def _only_pods(query: RangeQuery, rows: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The rows of the pods asked for; a pod name the workload never had is refused, naming the ones it has."""
    named: dict[str, list[tuple[int, str]]] = {}
    for series_id, labels in rows:
        named.setdefault(str(json.loads(labels).get("pod", "")), []).append((series_id, labels))
    missing = [pod for pod in query.pods if pod not in named]
    if missing:
        known = ", ".join(sorted(name for name in named if name)) or "none recorded"
        raise QueryError("pod", f"no pod {missing[0]!r} in this workload's series; its pods: {known}")
    return [row for pod in query.pods for row in named[pod]]


def extreme_columns(metrics: npt.NDArray[np.intp], aggregation: TimeAggregation) -> npt.NDArray[np.intp] | None:
    """For `min` or `max`: per metric asked for, the roll-up column of its buckets' extreme (-1 where it keeps
    none, a counter's or peak's: its own column, a bucket's largest or last value, answers); None for `mean`."""
    if aggregation == "mean":
        return None
    column = minimum_column if aggregation == "min" else maximum_column
    return np.array([column(metric) if METRICS[metric].rollup_extremes else -1 for metric in metrics],
                    dtype=np.intp)


def _decoded(
    parts: list[tuple[int, bytes]], points: int, metrics: npt.NDArray[np.intp], extremes: npt.NDArray[np.intp] | None
) -> npt.NDArray[np.float64]:
    """A chunk's values of `metrics` [metrics, points]; with `extremes` (a roll-up's, `extreme_columns`), each
    gauge's bucket extreme in place of its mean, the mean where the chunk has none (written before schema 7:
    its min and max are taken to be its mean)."""
    gauges = np.flatnonzero(extremes >= 0) if extremes is not None else np.zeros(0, dtype=np.intp)
    columns = metrics if extremes is None else np.concatenate([metrics, extremes[gauges]])
    values = dequantize(decode_parts(parts, points, columns).T, COLUMN_METRIC[columns]).T
    if not len(gauges):
        return values
    means, found = values[: len(metrics)], values[len(metrics) :]
    means[gauges] = np.where(np.isnan(found), means[gauges], found)
    return means


def _contributions(
    connection: sqlite3.Connection,
    span: TierSpan,
    ids: list[int],
    metrics: npt.NDArray[np.intp],
    window: tuple[int, int],
    with_head: bool,
    extremes: npt.NDArray[np.intp] | None = None,
) -> Iterator[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """(series id, times, values [metrics, n]) of one tier in [low, high) (`window`): its chunks, then (finest
    tier) its head; with `extremes` (`extreme_columns`), a roll-up's gauges answer with their buckets' extremes.

    A closed span's head rows stay until its compaction round is over, beside the chunks of the blocks
    compacted so far: where a series' chunk covers a time, its head rows there are left out (counted
    twice, a cell across the span's end would weigh them double)."""
    low, high = window
    extremes = None if with_head else extremes  # the finest tier's points are their own min and max
    columns = metrics if extremes is None else np.concatenate([metrics, extremes[extremes >= 0]])
    # only the parts that hold a column asked for are read (and the whole chunks of schema 3)
    wanted = {part for part, members in PARTS.items() if part == WHOLE or np.isin(columns, members).any()}
    rows = read_chunks(connection, span.step, ids, low - span.span_seconds, high, wanted)
    decoded: dict[tuple[int, tuple[bytes, ...]], npt.NDArray[np.float64]] = {}  # bytes shared by series decoded once
    covered: dict[int, list[tuple[int, int]]] = {}  # series id -> [start, end) of its chunks (finest tier)
    for series_id, start, points, parts in rows:
        if with_head:
            covered.setdefault(series_id, []).append((start, start + points * span.step))
        times = start + span.step * np.arange(points, dtype=np.int64)
        key = (points, tuple(data for _, data in parts))
        values = decoded.get(key)
        if values is None:
            values = decoded[key] = _decoded(parts, points, metrics, extremes)
        yield series_id, times, values
    if with_head:
        yield from _head_contributions(connection, ids, metrics, window, covered)


def _head_contributions(
    connection: sqlite3.Connection,
    ids: list[int],
    metrics: npt.NDArray[np.intp],
    window: tuple[int, int],
    covered: dict[int, list[tuple[int, int]]],
) -> Iterator[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """(series id, times, values [metrics, n]) of the head rows in `window`, but where a chunk `covered` them."""
    by_block: dict[int, list[int]] = {}
    for series_id in ids:
        by_block.setdefault(series_id // BLOCK, []).append(series_id)
    head_rows = connection.execute(
        f"SELECT block, t, data FROM head WHERE block IN ({marks(by_block)}) AND t >= ? AND t < ? ORDER BY block, t",
        (*by_block, *window),
    ).fetchall()
    for block, members in itertools.groupby(head_rows, key=lambda row: int(row[0])):
        listed = list(members)
        times = np.array([row[1] for row in listed], dtype=np.int64)
        stacked = np.stack([decode_head(row[2]) for row in listed])  # [n, BLOCK, metrics]
        for series_id in by_block[block]:
            values = dequantize(stacked[:, series_id % BLOCK, metrics], metrics)
            spans = covered.get(series_id)
            if spans is None:
                yield series_id, times, values.T
                continue
            fresh = np.ones(len(times), dtype=np.bool_)
            for start, end in spans:
                fresh &= (times < start) | (times >= end)
            if fresh.any():
                yield series_id, times[fresh], values[fresh].T


class _Cells:
    """Each series' cells as its points fill them, per metric: the weight of the points in each cell, and
    their weighted sum (`mean`) or their least (`min`) or largest (`max`) value."""

    def __init__(self, combine: Sequence[str], cells: int) -> None:
        self.combine = list(combine)
        self.cells = cells
        self.weights: dict[int, npt.NDArray[np.float64]] = {}
        self.figures: dict[int, npt.NDArray[np.float64]] = {}

    def add(
        self,
        series_id: int,
        values: npt.NDArray[np.float64],
        pieces: Iterable[tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.float64]]],
    ) -> None:
        """Add `values` [metrics, n]: each of `pieces` (which points, their cell, their weight)."""
        if series_id not in self.weights:
            self.weights[series_id] = np.zeros((len(self.combine), self.cells))
            start = np.array([{"mean": 0.0, "min": np.inf, "max": -np.inf}[kind] for kind in self.combine])
            self.figures[series_id] = np.repeat(start[:, None], self.cells, axis=1)
        weights, figures = self.weights[series_id], self.figures[series_id]
        for chosen, cell, weight in pieces:
            part = values[:, chosen]
            present = ~np.isnan(part)
            for position, kind in enumerate(self.combine):
                mask = present[position]
                if not mask.any():
                    continue
                where, row = cell[mask], part[position][mask]
                weights[position] += np.bincount(where, weights=weight[mask], minlength=self.cells)
                if kind == "max":
                    np.maximum.at(figures[position], where, row)
                elif kind == "min":
                    np.minimum.at(figures[position], where, row)
                else:
                    figures[position] += np.bincount(where, weights=row * weight[mask], minlength=self.cells)

    def any(self, series_id: int) -> bool:
        weights = self.weights.get(series_id)
        return weights is not None and bool(weights.any())

    def points(self, series_id: int, position: int) -> list[float | None]:
        """The cells of one metric of one series: null where no point fell."""
        weights = self.weights.get(series_id)
        if weights is None or not weights[position].any():
            return [None] * self.cells
        column = self.figures[series_id][position]
        if self.combine[position] == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                column = column / weights[position]
        column = np.where(weights[position] > 0, column, np.nan)
        return [None if value != value else value for value in column.tolist()]


def _combine(metrics: npt.NDArray[np.intp], aggregation: TimeAggregation) -> list[str]:
    """How each metric's cells combine their points: `aggregation`, but a counter's or peak's (`Rollup.MAX`)
    largest value where a mean is asked for."""
    if aggregation != "mean":
        return [aggregation] * len(metrics)
    return ["max" if METRICS[metric].rollup is Rollup.MAX else "mean" for metric in metrics]


def _pieces(
    times: npt.NDArray[np.int64], tier_step: int, window: tuple[int, int], query: RangeQuery, cells: int, coarser: bool
) -> list[tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """(which points, their cell, their weight) of points of a tier of `tier_step` on `query`'s grid: a coarser
    tier's points answer every cell their interval overlaps (`_spread`), the others their own cell."""
    if coarser:
        return list(_spread(times, tier_step, *window, query.start, query.step_seconds, cells))
    cell = np.floor((times - query.start) / query.step_seconds).astype(np.int64)
    chosen = (cell >= 0) & (cell < cells)
    return [(chosen, cell[chosen], np.ones(int(chosen.sum())))] if chosen.any() else []


def read_range(
    connection: sqlite3.Connection,
    spans: Sequence[TierSpan],
    latest: float | None,
    watermarks: dict[int, float | None],
    query: RangeQuery,
    series: Sequence[tuple[int, dict[str, str]]] | None = None,
) -> list[Series]:
    """Series for `query` from head and chunks: one per metric and breakdown label set, points on its grid.

    A cell is the mean (counters: the max) of the stored points in [t, t + step), each stored
    point weighing one, whichever tier it comes from; with `query.aggregation` min or max, the least or
    largest of them (a roll-up's points: their buckets' min and max). `series` (id, labels): read these
    instead of the ones `query`'s scope and breakdown select (a caller that selects many at once, past the
    API's limit).
    """
    check_range(query)
    grid = query.grid()
    selected = select_series(connection, query) if series is None else list(series)
    metrics = np.array([METRIC_INDEX[name] for name in query.metrics], dtype=np.intp)
    cells = _Cells(_combine(metrics, query.aggregation), len(grid))
    if selected:
        _fill(connection, spans, latest, watermarks, query, [series_id for series_id, _ in selected], cells)
    result: list[Series] = []
    # a breakdown leaves out series without a point in the range; pods asked for by name stay, null
    breakdown = query.by is not None and not (query.scope == "node" and query.by == "node") and not query.pods
    for series_id, labels in selected:
        if breakdown and not cells.any(series_id):
            continue
        for position, name in enumerate(query.metrics):
            points = cells.points(series_id, position)
            result.append(Series(metric=name, labels=dict(labels), points=list(zip(grid, points, strict=True))))
    if not selected and not breakdown and not query.pods:
        result = [Series(metric=name, labels={}, points=[(t, None) for t in grid]) for name in query.metrics]
    return result


def _fill(
    connection: sqlite3.Connection,
    spans: Sequence[TierSpan],
    latest: float | None,
    watermarks: dict[int, float | None],
    query: RangeQuery,
    ids: list[int],
    cells: _Cells,
) -> None:
    """Add the stored points of `ids` in `query`'s range to `cells`, each stretch from the tier that answers it."""
    metrics = np.array([METRIC_INDEX[name] for name in query.metrics], dtype=np.intp)
    extremes = extreme_columns(metrics, query.aggregation)
    step = query.step_seconds
    tiers = [span.tier for span in spans]
    segments = plan_segments(tiers, latest, watermarks, query.start, query.start + cells.cells * step, step)
    for tier, low, high in segments:
        span = next(span for span in spans if span.tier == tier)
        with_head = tier == tiers[0]
        # a roll-up's points stand for whole buckets: spread over the cells they overlap where the grid is finer
        # than them or not on their boundaries (a point per cell would leave a cell with none)
        coarser = tier.step_seconds > step or (tier != tiers[0] and query.start % tier.step_seconds != 0)
        contributions = _contributions(connection, span, ids, metrics, (low, high), with_head, extremes)
        for series_id, times, values in contributions:
            # a coarse point stands for [t, t + its step): one that begins before the segment still covers it
            begins = times + tier.step_seconds > low if coarser else times >= low
            inside = begins & (times < high)
            if inside.any():
                pieces = _pieces(times[inside], tier.step_seconds, (low, high), query, cells.cells, coarser)
                cells.add(series_id, values[:, inside], pieces)
