"""Reading the embedded store: which tier answers which part of a range, its chunks and head rows, the grid.

A point at t is the mean (or, for counters, the max) of the stored points in [t, t + step).
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from collections.abc import Iterator, Sequence

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
    check_range,
)
from gpuwm.store.chunks import TierSpan, read_chunks
from gpuwm.store.codec import BLOCK, PARTS, WHOLE, decode_head, decode_parts, dequantize
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


def select_series(connection: sqlite3.Connection, query: RangeQuery) -> list[tuple[int, dict[str, str]]]:
    selection = _SELECTION.get((query.scope, query.by))
    if selection is None:
        raise QueryError(
            "by", f"{query.by!r} is not a breakdown of {query.scope} metrics; use gpu, pod or node"
        )
    kind, column = selection
    if column is None:
        rows = connection.execute("SELECT id, labels FROM series WHERE kind = ?", (kind,)).fetchall()
    else:
        rows = connection.execute(
            f"SELECT id, labels FROM series WHERE kind = ? AND {column} = ?", (kind, query.key)
        ).fetchall()
    if len(rows) > MAX_SERIES_PER_QUERY:
        raise QueryError(
            "by",
            f"{len(rows)} series exceed the limit of {MAX_SERIES_PER_QUERY}; narrow the scope or drop by=",
        )
    return [(int(series_id), json.loads(labels)) for series_id, labels in rows]


def _contributions(
    connection: sqlite3.Connection,
    span: TierSpan,
    ids: list[int],
    metrics: npt.NDArray[np.intp],
    low: int,
    high: int,
    with_head: bool,
) -> Iterator[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """(series id, times, values [metrics, n]) of one tier in [low, high): its chunks, then (finest tier) its head.

    A closed span's head rows stay until its compaction round is over, beside the chunks of the blocks
    compacted so far: where a series' chunk covers a time, its head rows there are left out (counted
    twice, a cell across the span's end would weigh them double)."""
    # only the parts that hold a metric asked for are read (and the whole chunks of schema 3)
    wanted = {part for part, members in PARTS.items() if part == WHOLE or np.isin(metrics, members).any()}
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
            values = decoded[key] = dequantize(decode_parts(parts, points, metrics).T, metrics).T
        yield series_id, times, values
    if not with_head:
        return
    by_block: dict[int, list[int]] = {}
    for series_id in ids:
        by_block.setdefault(series_id // BLOCK, []).append(series_id)
    block_list = ",".join("?" * len(by_block))
    head_rows = connection.execute(
        f"SELECT block, t, data FROM head WHERE block IN ({block_list}) AND t >= ? AND t < ? ORDER BY block, t",
        (*by_block, low, high),
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


def read_range(
    connection: sqlite3.Connection,
    spans: Sequence[TierSpan],
    latest: float | None,
    watermarks: dict[int, float | None],
    query: RangeQuery,
) -> list[Series]:
    """Series for `query` from head and chunks: one per metric and breakdown label set, points on its grid.

    A cell is the mean (counters: the max) of the stored points in [t, t + step), each stored
    point weighing one, whichever tier it comes from.
    """
    check_range(query)
    grid = query.grid()
    selected = select_series(connection, query)
    metrics = np.array([METRIC_INDEX[name] for name in query.metrics], dtype=np.intp)
    is_max = np.array([METRICS[column].rollup is Rollup.MAX for column in metrics], dtype=np.bool_)
    step = query.step_seconds
    cells = len(grid)
    sums: dict[int, npt.NDArray[np.float64]] = {}
    counts: dict[int, npt.NDArray[np.float64]] = {}
    maxima: dict[int, npt.NDArray[np.float64]] = {}
    if selected:
        ids = [series_id for series_id, _ in selected]
        tiers = [span.tier for span in spans]
        segments = plan_segments(tiers, latest, watermarks, query.start, query.start + cells * step, step)
        for tier, low, high in segments:
            span = next(span for span in spans if span.tier == tier)
            with_head = tier == tiers[0]
            for series_id, times, values in _contributions(connection, span, ids, metrics, low, high, with_head):
                inside = (times >= low) & (times < high)
                cell = np.floor((times - query.start) / step).astype(np.int64)
                inside &= (cell >= 0) & (cell < cells)
                if not inside.any():
                    continue
                cell = cell[inside]
                values = values[:, inside]
                present = ~np.isnan(values)
                if series_id not in sums:
                    sums[series_id] = np.zeros((len(metrics), cells))
                    counts[series_id] = np.zeros((len(metrics), cells))
                    maxima[series_id] = np.full((len(metrics), cells), -np.inf)
                for position in range(len(metrics)):
                    mask = present[position]
                    if not mask.any():
                        continue
                    where = cell[mask]
                    row = values[position][mask]
                    counts[series_id][position] += np.bincount(where, minlength=cells)
                    if is_max[position]:
                        np.maximum.at(maxima[series_id][position], where, row)
                    else:
                        sums[series_id][position] += np.bincount(where, weights=row, minlength=cells)
    result: list[Series] = []
    breakdown = query.by is not None and not (query.scope == "node" and query.by == "node")
    empty: list[float | None] = [None] * cells
    for series_id, labels in selected:
        count = counts.get(series_id)
        if breakdown and (count is None or not count.any()):
            continue
        for position, name in enumerate(query.metrics):
            if count is None or not count[position].any():
                points = empty
            else:
                with np.errstate(invalid="ignore", divide="ignore"):
                    column = (
                        maxima[series_id][position] if is_max[position] else sums[series_id][position] / count[position]
                    )
                column = np.where(count[position] > 0, column, np.nan)
                points = [None if value != value else value for value in column.tolist()]
            result.append(Series(metric=name, labels=dict(labels), points=list(zip(grid, points, strict=True))))
    if not selected and not breakdown:
        result = [Series(metric=name, labels={}, points=[(t, None) for t in grid]) for name in query.metrics]
    return result
