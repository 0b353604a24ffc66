"""A period's figures from the embedded store: each workload's cumulative figures differenced at its edges.

C(x), a workload's cumulative figures before x, is its last point before x: the engine's own figures
as of the status interval stored there, exact in every tier (`Rollup.LAST`). A period [a, c) holds
C(c) - C(a), so periods add up (report[a,c) = report[a,b) + report[b,c)), a finished run's figures in
any period that holds its life are its last point's (its CR's), and an edge before the first data is
the same as one at it. The store keeps an interval at its time rounded down to the finest step, and an
edge is rounded down the same way: so an edge on a coarse tier's bucket boundary (midnight, the hour) is
one of its buckets' too. A period that reaches the latest data holds every interval recorded so far
(an open period: once more data comes, an interval at its end counts after it, as at any edge).

Where the finest tier no longer holds an edge, the coarse bucket it cuts is apportioned by time: C(x) =
C(bucket start) + fraction x (C(bucket end) - C(bucket start)), the fraction being the share of the units
the workload held at the bucket's intervals that came before x (holdings keep them at every interval; the
share of the bucket's time where they are not known), and the answer says how many GPU-seconds that moved
(`WorkloadPeriod.apportioned_gpu_seconds`). So does a workload's opening (what it had accrued
before the store first saw it, store/holdings.py): spread over its life before then instead of being read
as one interval's.

Units held, who held GPUs in the period and the peaks come from `holdings`, kept at the status interval
for as long as the coarsest tier: exact whatever the tier of the counters.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwm.store.base import PeriodSums, WorkloadGroup, WorkloadPeriod
from gpuwm.store.chunks import TierSpan, read_chunks
from gpuwm.store.codec import BLOCK, MISSING, decode_chunk, decode_chunks, decode_head
from gpuwm.store.figures import FIGURE_COLUMNS, FIGURE_NAMES, FIGURE_RESOLUTION
from gpuwm.store.holdings import (
    FIRST,
    LAST,
    Opening,
    Steps,
    first_rows,
    group_peak,
    openings_within,
    read_openings,
    read_steps,
    unit_weights,
)
from gpuwm.store.sql import batches, marks

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: points before an edge read at once: the last of them is the edge's value for every series recorded then
WINDOW_POINTS = 4
#: the figures part of a chunk (codec.PARTS)
_FIGURES_PART = 6
_ALLOCATED = FIGURE_NAMES.index("allocated_gpu_seconds")
_ZERO = np.zeros(len(FIGURE_NAMES), dtype=np.int64)


@dataclass(frozen=True)
class Edge:
    """Where a period's edge falls in the store: points of buckets before `whole_before` count whole, those
    of [whole_before, cut_end) by `fraction` (a coarse bucket the edge cuts: apportioned by time)."""

    #: the edge snapped to the finest step (what holdings are compared with)
    at: float
    whole_before: int
    cut_end: int
    fraction: float

    def share(self, t: int, fraction: float) -> float:
        """How much of a point at bucket `t` counts before the edge, the cut bucket's `fraction` of it."""
        if t < self.whole_before:
            return 1.0
        return fraction if t < self.cut_end else 0.0


EVERYTHING = Edge(math.inf, LAST, LAST, 0.0)


@dataclass(frozen=True)
class StoreClock:
    """What places an edge: the tiers' chunk spans, the latest and earliest recorded times, and how far each
    coarser tier is rolled up (its step -> the time its buckets are complete until)."""

    spans: Sequence[TierSpan]
    latest: float | None
    earliest: float | None
    rolled_up: Mapping[int, float | None]

    @property
    def finest_step(self) -> int:
        return self.spans[0].step

    def snapped(self, x: float) -> int:
        """The points before `x`, as a bound of buckets (those below it): x snapped down to the finest step;
        FIRST at or before the first data, LAST at or after the latest (everything recorded so far)."""
        if self.latest is None or x >= self.latest:
            return LAST
        if self.earliest is None or x <= self.earliest:
            return FIRST
        return self.finest_time(x)

    def finest_time(self, x: float) -> int:
        """x snapped down to the finest step."""
        return int(math.floor(x / self.finest_step) * self.finest_step)

    def place(self, x: float) -> tuple[Edge, TierSpan | None]:
        """The edge at `x` and the tier that answers it: the finest that still keeps what precedes it (the
        finest tier keeps every point from the next one's roll-up on; a coarser tier answers only where its
        bucket there is rolled up); the coarsest where none does."""
        snapped = self.snapped(x)
        if snapped == LAST:
            return EVERYTHING, self.spans[0]
        if snapped == FIRST:  # nothing stored before it; an opening may still be spread there
            return Edge(float(self.finest_time(x)) if math.isfinite(x) else x, FIRST, FIRST, 0.0), None
        assert self.latest is not None
        last = len(self.spans) - 1
        for index, span in enumerate(self.spans):
            start = snapped // span.step * span.step
            fraction = (snapped - start) / span.step
            cut_end = start + span.step if fraction else start
            # a series whose last point before the edge is further back is found exactly in the next tier
            before = self.spans[index + 1].step if index < last else WINDOW_POINTS * span.step
            kept = max(start - before, self.snapped_earliest) >= self.latest - span.tier.keep_seconds
            if index == 0:
                kept = kept or index == last or snapped - span.step >= self._rolled_up(self.spans[1].step)
            elif self._rolled_up(span.step) < cut_end:
                kept = False
            if kept or index == last:
                return Edge(float(snapped), start, cut_end, fraction), span
        raise AssertionError("unreachable: the coarsest tier answers")

    @property
    def snapped_earliest(self) -> int:
        """The first data's bucket: nothing before it was ever kept, so nothing before it was dropped."""
        return FIRST if self.earliest is None else self.finest_time(self.earliest)

    def _rolled_up(self, step: int) -> float:
        until = self.rolled_up.get(step)
        return -math.inf if until is None else until


@dataclass
class EdgeFigures:
    """Series' cumulative figures at an edge (store resolution): `low` before `whole_before`, `high` before
    `cut_end` (where the edge cuts a bucket), and the share of each series' cut bucket before the edge."""

    edge: Edge
    low: dict[int, IntArray]
    high: dict[int, IntArray]
    fractions: dict[int, float]

    def fraction(self, series_id: int) -> float:
        return self.fractions.get(series_id, self.edge.fraction) if self.edge.fraction else 0.0

    def value(self, series_id: int) -> FloatArray:
        low = self.low.get(series_id, _ZERO)
        return low + self.fraction(series_id) * self.cut(series_id)

    def cut(self, series_id: int) -> FloatArray:
        """The cut bucket's figures (0 where the edge cuts none)."""
        if not self.edge.fraction:
            return _ZERO.astype(np.float64)
        low = self.low.get(series_id, _ZERO)
        return (self.high.get(series_id, low) - low).astype(np.float64)


Points = dict[int, list[tuple[IntArray, IntArray]]]  # series -> [(times, figures [n, F])] as read


def _chunk_points(connection: sqlite3.Connection, span: TierSpan, ids: Sequence[int], low: int, high: int,
                  points: Points) -> None:
    """The figures of `span`'s chunks that may hold points in [low, high), into `points`."""
    read: list[tuple[int, int, int, bytes]] = []
    for batch in batches(ids):
        read += [(series_id, start, count, parts[0][1]) for series_id, start, count, parts in read_chunks(
            connection, span.step, batch, low - span.span_seconds, high, (_FIGURES_PART,)) if parts]
    decoded = _decode_all([(count, data) for _, _, count, data in read])
    for series_id, start, count, data in read:
        times = start + span.step * np.arange(count, dtype=np.int64)
        points.setdefault(series_id, []).append((times, decoded[(count, data)]))


def _decode_all(chunks: Sequence[tuple[int, bytes]]) -> dict[tuple[int, bytes], IntArray]:
    """Each distinct (points, figures payload) decoded to [points, FIGURE_NAMES], those of one length at once."""
    by_length: dict[int, list[bytes]] = {}
    for count, data in dict.fromkeys(chunks):
        by_length.setdefault(count, []).append(data)
    return {(count, data): values.T for count, payloads in by_length.items() for batch in batches(payloads)
            for data, values in zip(batch, decode_chunks(batch, count, _FIGURES_PART), strict=True)}


def _head_points(connection: sqlite3.Connection, ids: Sequence[int], low: int, high: int, points: Points) -> None:
    """The figures of the head rows in [low, high) of `ids`' blocks, into `points`."""
    by_block: dict[int, list[int]] = {}
    for series_id in ids:
        by_block.setdefault(series_id // BLOCK, []).append(series_id)
    blocks = list(by_block)
    for batch in batches(blocks):
        rows = connection.execute(
            f"SELECT block, t, data FROM head WHERE block IN ({marks(batch)}) AND t >= ? AND t < ?",
            (*batch, low, high),
        ).fetchall()
        for block, t, data in rows:
            row = decode_head(data)[:, FIGURE_COLUMNS]
            for series_id in by_block[block]:
                points.setdefault(series_id, []).append((np.array([t], dtype=np.int64), row[series_id % BLOCK][None]))


def _last_before(found: list[tuple[IntArray, IntArray]], bound: int, step: int) -> tuple[int, IntArray] | None:
    """(covered until, figures) of the last present point whose bucket ends by `bound` (the times of each part
    of `found` ascending: the last one before the bound, then back over missing points)."""
    best: tuple[int, IntArray] | None = None
    for times, values in found:
        index = int(np.searchsorted(times, bound - step, side="right")) - 1
        while index >= 0 and values[index, _ALLOCATED] == MISSING:
            index -= 1
        if index >= 0:
            end = int(times[index]) + step
            if best is None or end > best[0]:
                best = (end, values[index])
    return best


def _head_before(connection: sqlite3.Connection, ids: Sequence[int], bound: int, step: int) -> dict[int, tuple[int, IntArray]]:
    """Each series' newest head point before `bound`: (covered until, figures), walking each block's rows back."""
    found: dict[int, tuple[int, IntArray]] = {}
    by_block: dict[int, set[int]] = {}
    for series_id in ids:
        by_block.setdefault(series_id // BLOCK, set()).add(series_id)
    for block, wanted in by_block.items():
        for t, data in connection.execute("SELECT t, data FROM head WHERE block = ? AND t < ? ORDER BY t DESC",
                                          (block, bound)):
            rows = decode_head(data)[:, FIGURE_COLUMNS]
            for series_id in [each for each in wanted if rows[each % BLOCK][_ALLOCATED] != MISSING]:
                found[series_id] = (int(t) + step, rows[series_id % BLOCK])
                wanted.discard(series_id)
            if not wanted:
                break
    return found


@dataclass(frozen=True)
class _Chunk:
    """A chunk of a series' figures: its tier, start and points, and where it ends."""

    span: TierSpan
    start: int
    points: int

    @property
    def end(self) -> int:
        return self.start + self.points * self.span.step


def _newest_chunks(
    connection: sqlite3.Connection, spans: Sequence[TierSpan], ids: Sequence[int], bound: int,
) -> dict[int, list[_Chunk]]:
    """Per series, each tier's newest chunk of figures starting before `bound`, the newest first (a finer
    tier's first where two end together)."""
    newest: dict[int, list[_Chunk]] = {}
    for span in spans:  # finest first: the stable sort below keeps it first among equals
        for batch in batches(ids):
            for series_id, start, count in connection.execute(
                f"SELECT series_id, max(start), points FROM chunks WHERE tier = ? AND series_id IN ({marks(batch)}) "
                "AND start < ? AND figures_payload IS NOT NULL GROUP BY series_id", (span.step, *batch, bound),
            ):
                newest.setdefault(series_id, []).append(_Chunk(span, start, count))
    return {series_id: sorted(chunks, key=lambda chunk: -chunk.end) for series_id, chunks in newest.items()}


def _chunks_before(
    connection: sqlite3.Connection, spans: Sequence[TierSpan], ids: Sequence[int], bound: int,
) -> dict[int, tuple[int, IntArray]]:
    """Each series' newest point whose bucket ends by `bound`, from the newest of its tiers' chunks before it (one
    decoded where it has a point before the bound, as it has but for a series that began at the bound)."""
    found: dict[int, tuple[int, IntArray]] = {}
    for series_id, chunks in _newest_chunks(connection, spans, ids, bound).items():
        for chunk in chunks:
            (data,) = connection.execute(
                "SELECT p.data FROM chunks c JOIN payloads p ON p.id = c.figures_payload "
                "WHERE c.tier = ? AND c.series_id = ? AND c.start = ?", (chunk.span.step, series_id, chunk.start)).fetchone()
            times = chunk.start + chunk.span.step * np.arange(chunk.points, dtype=np.int64)
            figures = decode_chunk(data, chunk.points, part=_FIGURES_PART).T  # [points, FIGURE_NAMES]
            last = _last_before([(times, figures)], bound, chunk.span.step)
            if last is not None:
                found[series_id] = last
                break
    return found


def _last_anywhere(
    connection: sqlite3.Connection, spans: Sequence[TierSpan], ids: Sequence[int], bound: int,
) -> dict[int, IntArray]:
    """Series' last figures before `bound` wherever they are (the head, the tiers' newest chunks before it; the
    newest of those): for series with no point just before an edge (a workload no longer recorded then)."""
    best = _head_before(connection, ids, bound, spans[0].step)
    for series_id, last in _chunks_before(connection, spans, ids, bound).items():
        if series_id not in best or last[0] > best[series_id][0]:
            best[series_id] = last
    return {series_id: best[series_id][1] if series_id in best else _ZERO for series_id in ids}


def _values_before(
    connection: sqlite3.Connection, spans: Sequence[TierSpan], span: TierSpan, ids: Sequence[int],
    bounds: Sequence[int], first_seen: Mapping[int, int],
) -> list[dict[int, IntArray]]:
    """Per bound: each series' last figures before it in `span`'s tier (one read of the points before the
    highest bound), else wherever they are; none (zeros) where the store first saw it at the bound or after."""
    highest = max(bounds)
    low = min(bounds) - WINDOW_POINTS * span.step
    points: Points = {}
    _chunk_points(connection, span, ids, low, highest, points)
    if span is spans[0]:
        _head_points(connection, ids, low, highest, points)
    answers: list[dict[int, IntArray]] = []
    for bound in bounds:
        values: dict[int, IntArray] = {}
        missing: list[int] = []
        for series_id in ids:
            last = _last_before(points.get(series_id, []), bound, span.step)
            if last is not None:
                values[series_id] = last[1]
            elif first_seen.get(series_id, FIRST) < bound:
                missing.append(series_id)
        values.update(_last_anywhere(connection, spans, missing, bound) if missing else {})
        answers.append(values)
    return answers


def read_edge(
    connection: sqlite3.Connection, clock: StoreClock, x: float, ids: Sequence[int], first_seen: Mapping[int, int],
) -> EdgeFigures:
    """The cumulative figures of `ids` at the period edge `x` (`first_seen`: when the store first saw each)."""
    edge, span = clock.place(x)
    if span is None or not ids:
        return EdgeFigures(edge, {}, {}, {})
    if edge is EVERYTHING:
        assert clock.latest is not None
        bound = int(math.floor(clock.latest / span.step) * span.step) + span.step
        (everything,) = _values_before(connection, clock.spans, span, ids, [bound], first_seen)
        return EdgeFigures(edge, everything, {}, {})
    if not edge.fraction:
        (low,) = _values_before(connection, clock.spans, span, ids, [edge.whole_before], first_seen)
        return EdgeFigures(edge, low, {}, {})
    low, high = _values_before(connection, clock.spans, span, ids, [edge.whole_before, edge.cut_end], first_seen)
    fractions: dict[int, float] = {}
    for series_id, weights in unit_weights(connection, ids, edge.whole_before, edge.cut_end).items():
        total = sum(weight for _, weight in weights)
        if total > 0:
            fractions[series_id] = sum(weight for t, weight in weights if t < edge.at) / total
    return EdgeFigures(edge, low, high, fractions)


def _spread(opening: Opening, edge: Edge, finest_step: int) -> float:
    """The share of an opening before `edge` once spread over [since, the end of its first bucket)."""
    return min(1.0, max(0.0, (edge.at - opening.since) / (opening.spread_end(finest_step) - opening.since)))


def _opening_moved(opening: Opening, start: EdgeFigures, end: EdgeFigures, series_id: int, finest_step: int) -> float:
    """The share of an opening the period gains by spreading it, less the share its stored point (which
    carries it whole at its first bucket) gave the period."""
    stored = (end.edge.share(opening.t, end.fraction(series_id))
              - start.edge.share(opening.t, start.fraction(series_id)))
    return _spread(opening, end.edge, finest_step) - _spread(opening, start.edge, finest_step) - stored


def _apportioned(start: EdgeFigures, end: EdgeFigures, series_id: int) -> float:
    """Allocated GPU-seconds (store resolution) the period took from coarse buckets cut by its edges."""
    before_end = end.fraction(series_id) * end.cut(series_id)[_ALLOCATED]
    before_start = start.fraction(series_id) * start.cut(series_id)[_ALLOCATED]
    if start.edge.fraction and start.edge.whole_before == end.edge.whole_before:
        return float(abs(before_end - before_start))
    return float(start.cut(series_id)[_ALLOCATED] - before_start + before_end)


def _workload_labels(connection: sqlite3.Connection, ids: Sequence[int]) -> dict[int, dict[str, str]]:
    return {series_id: json.loads(text) for batch in batches(ids) for series_id, text in connection.execute(
        f"SELECT id, labels FROM series WHERE kind = 'workload' AND id IN ({marks(batch)})", batch)}


def _kinds(connection: sqlite3.Connection, uids: Sequence[str]) -> dict[str, str | None]:
    """Each workload's kind where its latest figures are still kept."""
    return {uid: kind or None for batch in batches(uids) for uid, kind in connection.execute(
        f"SELECT uid, json_extract(figures, '$.kind') FROM latest_workloads WHERE uid IN ({marks(batch)})",
        batch)}


def _sums(stored: FloatArray) -> PeriodSums:
    values = stored / FIGURE_RESOLUTION
    return PeriodSums(**{name: float(value) for name, value in zip(FIGURE_NAMES, values, strict=True)})


@dataclass
class _Candidates:
    """The workloads a period may hold: their units held (steps), labels and openings."""

    steps: dict[int, Steps]
    labels: dict[int, dict[str, str]]
    openings: dict[int, Opening]
    #: those whose opening is spread over part of the period: their units then stand for what they held
    spread: set[int]

    def peak(self, series_id: int) -> float:
        peak = self.steps[series_id].peak() if series_id in self.steps else 0.0
        if series_id in self.spread:
            peak = max(peak, self.openings[series_id].units)
        return peak


def _candidates(connection: sqlite3.Connection, clock: StoreClock, start: float, end: float) -> _Candidates:
    """Every workload with a holdings row in [start, end) or units held when it begins, or an opening spread
    over part of it; a series the store no longer has (forgotten) is none."""
    steps = read_steps(connection, clock.snapped(start), clock.snapped(end))
    spread = set(openings_within(connection, clock.finest_time(start), clock.finest_time(end), clock.finest_step))
    labels = _workload_labels(connection, sorted(set(steps) | spread))
    openings = read_openings(connection, sorted(labels))
    return _Candidates(steps, labels, openings, spread & set(labels))


def _figures_between(
    first: EdgeFigures, last: EdgeFigures, opening: Opening | None, series_id: int, finest_step: int,
) -> tuple[FloatArray, float]:
    """A workload's figures over the period (store resolution) and the allocated GPU-seconds apportioned."""
    stored = last.value(series_id) - first.value(series_id)
    apportioned = _apportioned(first, last, series_id)
    if opening is not None:
        moved = _opening_moved(opening, first, last, series_id, finest_step)
        stored = stored + moved * np.array(opening.figures, dtype=np.float64)
        apportioned += (_spread(opening, last.edge, finest_step)
                        - _spread(opening, first.edge, finest_step)) * opening.figures[_ALLOCATED]
    return stored, float(min(apportioned, max(0.0, stored[_ALLOCATED])))


def read_period(connection: sqlite3.Connection, clock: StoreClock, start: float, end: float) -> list[WorkloadPeriod]:
    """Every workload whose figures changed in [start, end), with its figures there."""
    candidates = _candidates(connection, clock, start, end)
    ids = sorted(candidates.labels)
    first_seen = first_rows(connection, ids)
    first = read_edge(connection, clock, start, ids, first_seen)
    last = read_edge(connection, clock, end, ids, first_seen)
    kinds = _kinds(connection, [candidates.labels[series_id].get("workload_uid", "") for series_id in ids])
    result: list[WorkloadPeriod] = []
    for series_id in ids:
        stored, apportioned = _figures_between(first, last, candidates.openings.get(series_id), series_id,
                                               clock.finest_step)
        if not np.any(np.abs(stored) > 1e-9):  # nothing of it changed in the period
            continue
        label = candidates.labels[series_id]
        uid = label.get("workload_uid", "")
        result.append(WorkloadPeriod(
            uid=uid, namespace=label.get("namespace", ""), name=label.get("workload", ""),
            project=label.get("project", ""), kind=kinds.get(uid), sums=_sums(stored),
            peak_allocated_gpus=candidates.peak(series_id),
            apportioned_gpu_seconds=apportioned / FIGURE_RESOLUTION[_ALLOCATED],
        ))
    return result


def read_group_peaks(
    connection: sqlite3.Connection, clock: StoreClock, start: float, end: float, groups: Mapping[str, WorkloadGroup],
) -> dict[str, float]:
    """Per group: the most units its workloads held together at one interval of [start, end) (where the period
    reaches back before the store saw some of them, their units when first seen stand for what they held then,
    all at once)."""
    candidates = _candidates(connection, clock, start, end)
    peaks: dict[str, float] = {}
    for key, group in groups.items():
        members = [series_id for series_id, label in candidates.labels.items()
                   if group.holds(label.get("namespace", ""), label.get("project", ""))]
        held = group_peak(candidates.steps[series_id] for series_id in members if series_id in candidates.steps)
        spread = sum(candidates.openings[series_id].units for series_id in members if series_id in candidates.spread)
        peaks[key] = max(held, round(spread, 9))
    return peaks
