"""Reading the embedded store's tier tables: which tier answers which part of a range, and the grid.

A point at t is the mean (or, for counters, the max) of the stored rows in [t, t + step).
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from collections.abc import Sequence

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
from gpuwm.store.tiers import Tier

_COLUMNS = [f"m{index}" for index in range(len(METRICS))]

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


def read_range(
    connection: sqlite3.Connection,
    tiers: Sequence[Tier],
    latest: float | None,
    watermarks: dict[int, float | None],
    query: RangeQuery,
) -> list[Series]:
    """Series for `query` from the tier tables: one per metric and breakdown label set, points on its grid."""
    check_range(query)
    grid = query.grid()
    selected = select_series(connection, query)
    metric_columns = [METRIC_INDEX[name] for name in query.metrics]
    is_max = [METRICS[column].rollup is Rollup.MAX for column in metric_columns]
    step = query.step_seconds
    cells = len(grid)
    # per series, per metric: the value of each cell (None = no data) and, for means, how many rows made it
    values: dict[int, list[list[float | None]]] = {}
    weights: dict[int, list[list[int]]] = {}
    seen: set[int] = set()
    if selected:
        ids = [series_id for series_id, _ in selected]
        for series_id in ids:
            values[series_id] = [[None] * cells for _ in metric_columns]
            weights[series_id] = [[0] * cells for _ in metric_columns]
        grouped = ", ".join(
            f"{'max' if maximum else 'avg'}({_COLUMNS[column]}), count({_COLUMNS[column]})"
            for column, maximum in zip(metric_columns, is_max, strict=True)
        )
        plain = ", ".join(f"{_COLUMNS[column]}, 1" for column in metric_columns)
        id_list = ",".join("?" * len(ids))
        segments = plan_segments(tiers, latest, watermarks, query.start, query.start + cells * step, step)
        if len(ids) == 1 and len(segments) == 1 and step == segments[0][0].step_seconds:
            # the common case (one series, one tier, its own step): one row per cell, no merging
            tier, low, high = segments[0]
            columns = ", ".join(_COLUMNS[column] for column in metric_columns)
            rows = connection.execute(
                f"SELECT t, {columns} FROM {tier.table} WHERE series_id = ? AND t >= ? AND t < ?",
                (ids[0], low, high),
            ).fetchall()
            only = values[ids[0]]
            start = query.start
            cell_of = [int((row[0] - start) // step) for row in rows]
            for position in range(len(metric_columns)):
                target = only[position]
                index = position + 1
                for cell, row in zip(cell_of, rows, strict=True):
                    target[cell] = row[index]
            if rows:
                seen.add(ids[0])
            segments = []
        for tier, low, high in segments:
            if step == tier.step_seconds:
                # one stored row per cell at most: no GROUP BY (it doubles the cost of a 24 h read)
                sql = (
                    f"SELECT series_id, CAST((t - ?) / ? AS INTEGER), {plain} FROM {tier.table} "
                    f"WHERE series_id IN ({id_list}) AND t >= ? AND t < ?"
                )
            else:
                sql = (
                    f"SELECT series_id, CAST((t - ?) / ? AS INTEGER) AS cell, {grouped} "
                    f"FROM {tier.table} WHERE series_id IN ({id_list}) AND t >= ? AND t < ? "
                    "GROUP BY series_id, cell"
                )
            rows = connection.execute(sql, (query.start, step, *ids, low, high)).fetchall()
            for position, maximum in enumerate(is_max):
                value_index, count_index = 2 + 2 * position, 3 + 2 * position
                for row in rows:
                    value = row[value_index]
                    cell = row[1]
                    if value is None or not 0 <= cell < cells:
                        continue
                    series_id = row[0]
                    seen.add(series_id)
                    series_values = values[series_id][position]
                    previous = series_values[cell]
                    count = row[count_index]
                    if previous is None:
                        series_values[cell] = value
                        weights[series_id][position][cell] = count
                    elif maximum:  # a cell split between two tiers: combine
                        series_values[cell] = max(previous, value)
                    else:
                        weight = weights[series_id][position][cell]
                        series_values[cell] = (previous * weight + value * count) / (weight + count)
                        weights[series_id][position][cell] = weight + count
    result: list[Series] = []
    breakdown = query.by is not None and not (query.scope == "node" and query.by == "node")
    for series_id, labels in selected:
        if breakdown and series_id not in seen:
            continue
        for position, name in enumerate(query.metrics):
            result.append(
                Series(
                    metric=name,
                    labels=dict(labels),
                    points=list(zip(grid, values[series_id][position], strict=True)),
                )
            )
    if not selected and not breakdown:
        result = [Series(metric=name, labels={}, points=[(t, None) for t in grid]) for name in query.metrics]
    return result
