"""The embedded store's chunk layer: chunk spans per tier, compaction of head rows into chunks, roll-ups.

A chunk holds one series' points of one tier for a fixed span (`Spans`), all metrics, compressed
(see codec.py). The finest tier's chunks are built from the head (one row per interval and
block of series) once their span is over; every coarser tier is rolled up from the fine chunk
at that moment (the fine span is a multiple of every coarser step, so its buckets are complete)
and overlaid onto the coarse chunk, which fills up over many fine spans. Every write here is an
overlay by time, so compacting the same interval twice, or a late interval after its chunk,
gives the same chunk. A chunk row names its encoded bytes in `payloads` (schema.py), one payload per
part of the metrics (codec.PARTS): chunks with the same bytes of a part share one copy.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpuwm.store.codec import (
    BLOCK,
    FINE_ZLIB_LEVEL,
    METRIC_COUNT,
    MISSING,
    ROLLUP_COLUMN_COUNT,
    ROLLUP_ZLIB_LEVEL,
    IntArray,
    decode_head,
    decode_parts,
    encode_parts,
    parts_of,
    roll_up,
)
from gpuwm.store.schema import PART_COLUMNS, PIECE_CONDITION, store_payloads, sweep_payloads
from gpuwm.store.sql import batches, marks
from gpuwm.store.tiers import Tier

#: points per chunk aimed at (15 s x 240 = 1 h; 5 min x 240 = 20 h)
POINTS_PER_CHUNK = 240


@dataclass(frozen=True)
class TierSpan:
    tier: Tier
    span_seconds: int

    @property
    def step(self) -> int:
        return self.tier.step_seconds

    @property
    def points(self) -> int:
        return self.span_seconds // self.tier.step_seconds


def chunk_spans(tiers: Sequence[Tier]) -> list[TierSpan]:
    """Chunk span per tier: the finest a multiple of the coarsest step, each coarser one a multiple of it;
    about POINTS_PER_CHUNK points each, at most half the tier's KEEP so that retention, dropping whole
    chunks, keeps little more than asked."""
    coarsest = tiers[-1].step_seconds
    fine = tiers[0]
    span0 = max(coarsest, (POINTS_PER_CHUNK * fine.step_seconds // coarsest) * coarsest)
    span0 = min(span0, max(coarsest, int(fine.keep_seconds / 2) // coarsest * coarsest))
    spans = [TierSpan(fine, span0)]
    for tier in tiers[1:]:
        span = max(span0, (POINTS_PER_CHUNK * tier.step_seconds // span0) * span0)
        span = min(span, max(span0, int(tier.keep_seconds / 2) // span0 * span0))
        spans.append(TierSpan(tier, span))
    return spans


def _overlay(
    base: IntArray, base_start: int, new: IntArray, new_start: int, step: int
) -> None:
    """Write the present points of `new` ([S, M, n] from `new_start`) into `base` ([S, M, N] from `base_start`)."""
    offset = (new_start - base_start) // step
    low, high = max(0, offset), min(base.shape[2], offset + new.shape[2])
    if high <= low:
        return
    source = new[:, :, low - offset : high - offset]
    target = base[:, :, low:high]
    np.copyto(target, source, where=source != MISSING)


ChunkRow = tuple[int, int, int, list[tuple[int, bytes]]]


def read_chunks(
    connection: sqlite3.Connection, tier: int, series_ids: Sequence[int], after: int, before: int,
    parts: Iterable[int] | None = None,
) -> list[ChunkRow]:
    """(series id, start, points, [(part, bytes), ...]) of the chunks of `tier` with after < start < before,
    with the bytes of the `parts` asked for (default: all) that each chunk has."""
    columns = [(part, column) for part, column in PART_COLUMNS.items() if parts is None or part in parts]
    joins = " ".join(f"LEFT JOIN payloads p{part} ON p{part}.id = c.{column}" for part, column in columns)
    rows = connection.execute(
        f"SELECT c.series_id, c.start, c.points, {', '.join(f'p{part}.data' for part, _ in columns)} FROM chunks c "
        f"{joins} WHERE c.tier = ? AND c.series_id IN ({marks(series_ids)}) AND c.start > ? AND c.start < ?",
        (tier, *series_ids, after, before),
    ).fetchall()
    return [
        (row[0], row[1], row[2], [(part, data) for (part, _), data in zip(columns, row[3:], strict=True)
                                  if data is not None])
        for row in rows
    ]


class ChunkWriter:
    """Writes chunks inside the caller's transaction (the store's writing connection)."""

    def __init__(self, connection: sqlite3.Connection, spans: Sequence[TierSpan]) -> None:
        self.connection = connection
        self.spans = list(spans)

    def _gather(
        self, span: TierSpan, series_ids: Sequence[int], start: int, points: int
    ) -> tuple[IntArray | None, bool]:
        """The stored chunks of `span`'s tier within [start, start + points * step) laid onto one grid
        [S, M, points] (None if there are none), and whether a whole-span chunk is among them."""
        rows = read_chunks(self.connection, span.step, series_ids, start - 1, start + points * span.step)
        if not rows:
            return None, False
        position = {series_id: index for index, series_id in enumerate(series_ids)}
        result = self._empty(span, len(series_ids), points)
        columns = np.arange(result.shape[1], dtype=np.intp)
        whole = False
        for series_id, row_start, row_points, parts in rows:
            whole = whole or row_points == span.points
            at = position[series_id]
            _overlay(result[at : at + 1], start, decode_parts(parts, row_points, columns)[None], row_start, span.step)
        return result, whole

    def _empty(self, span: TierSpan, series: int, points: int) -> IntArray:
        """[series, columns, points] of MISSING: the finest tier's columns are the metrics, a roll-up's
        the metrics and its gauges' extremes (`codec.ROLLUP_COLUMN_COUNT`)."""
        columns = METRIC_COUNT if span.step == self.spans[0].step else ROLLUP_COLUMN_COUNT
        return np.full((series, columns, points), MISSING, dtype=np.int64)

    def _store(self, span: TierSpan, start: int, series_ids: Sequence[int], values: IntArray) -> None:
        present = (values != MISSING).any(axis=(1, 2))
        chosen = [index for index in range(len(series_ids)) if present[index]]
        if not chosen:
            return
        points = values.shape[2]
        coarse = span.step != self.spans[0].step
        piece = coarse and points < span.points
        # a piece lives until its coarse span ends and the whole chunk (level 9) replaces it: a fast level for
        # bytes that are thrown away (bench/README.md, "The store's choices")
        level = ROLLUP_ZLIB_LEVEL if coarse and not piece else FINE_ZLIB_LEVEL
        encoded = encode_parts(values if len(chosen) == len(series_ids) else values[chosen], level)  # no copy: all
        ids = iter(store_payloads(
            self.connection, [data for parts in encoded for data in parts if data is not None], transient=piece))
        # every part is written (NULL where the chunk has none of its metrics), and the whole chunk of schema 3 goes
        columns = [PART_COLUMNS[part] for part in parts_of(values.shape[1])]
        self.connection.executemany(
            f"INSERT INTO chunks (tier, series_id, start, points, payload, {', '.join(columns)}) "
            f"VALUES (?, ?, ?, ?, NULL{', ?' * len(columns)}) "
            "ON CONFLICT (tier, series_id, start) DO UPDATE SET points = excluded.points, payload = NULL, "
            + ", ".join(f"{column} = excluded.{column}" for column in columns),
            [
                (span.step, series_ids[index], start, points, *(None if data is None else next(ids) for data in parts))
                for index, parts in zip(chosen, encoded, strict=True)
            ],
        )

    def _store_whole(self, span: TierSpan, start: int, series_ids: Sequence[int], values: IntArray) -> None:
        """The whole chunk of a coarse span from `start`, in place of its pieces (the chunks starting inside it)."""
        self.connection.execute(
            f"DELETE FROM chunks WHERE tier = ? AND start > ? AND start < ? AND series_id IN ({marks(series_ids)})",
            (span.step, start, start + span.span_seconds, *series_ids),
        )
        self._store(span, start, series_ids, values)

    def write_fine(self, series_ids: Sequence[int], start: int, values: IntArray, complete_until: float) -> None:
        """Overlay [S, M, n] points of the finest tier from `start` (a span start; n a whole number of
        spans), then roll the complete buckets up into every coarser tier.

        `complete_until`: coarse buckets ending after it are not rolled up yet (their fine points
        may still come). Compaction calls this one span at a time; a bulk load may pass many spans
        at once and gets the same chunks.

        A coarse chunk spans many fine spans: until its span is over, each fine span adds a small
        *piece* chunk (its few coarse points), and the fine span that ends the coarse span merges
        the pieces into the whole chunk, so each coarse point is compressed about twice, not once
        per fine span.
        """
        fine = self.spans[0]
        merged_spans: list[IntArray] = []
        for offset in range(0, values.shape[2], fine.points):
            span_start = start + offset * fine.step
            piece = values[:, :, offset : offset + fine.points]
            existing, _ = self._gather(fine, series_ids, span_start, fine.points)
            if existing is not None:
                _overlay(existing, span_start, piece, span_start, fine.step)
                piece = existing
            self._store(fine, span_start, series_ids, piece)
            merged_spans.append(piece)
        # one span (compaction's case): its points as they are, not a copy
        merged = merged_spans[0] if len(merged_spans) == 1 else np.concatenate(merged_spans, axis=2)
        end = start + merged.shape[2] * fine.step
        for span in self.spans[1:]:
            coarse = roll_up(merged, span.step // fine.step)
            buckets = start + span.step * np.arange(coarse.shape[2])
            coarse[:, :, buckets + span.step > complete_until] = MISSING
            if (coarse == MISSING).all():
                continue
            first = start // span.span_seconds * span.span_seconds
            for coarse_start in range(first, end, span.span_seconds):
                coarse_end = coarse_start + span.span_seconds
                target, whole = self._gather(span, series_ids, coarse_start, span.points)
                if whole or coarse_end <= end:
                    # the coarse span is over (or was merged before): one whole chunk, pieces dropped
                    if target is None:
                        target = self._empty(span, len(series_ids), span.points)
                    _overlay(target, coarse_start, coarse, start, span.step)
                    self._store_whole(span, coarse_start, series_ids, target)
                    continue
                piece_points = fine.span_seconds // span.step
                for piece_start in range(max(start, coarse_start), min(end, coarse_end), fine.span_seconds):
                    found, _ = self._gather(span, series_ids, piece_start, piece_points)
                    if found is None:
                        found = self._empty(span, len(series_ids), piece_points)
                    _overlay(found, piece_start, coarse, start, span.step)
                    self._store(span, piece_start, series_ids, found)
        sweep_payloads(self.connection)  # the bytes of replaced chunks and merged pieces no chunk names now

    def merge_ended_pieces(self, until: int) -> None:
        """Merge the pieces of coarse spans that ended by `until` into whole chunks: those of series with
        no point in the fine span that ended the coarse span (a workload that ended before), which
        `write_fine` never saw then. Pieces have payload ids below zero (`chunks_pieces` finds them)."""
        for span in self.spans[1:]:
            cut = until // span.span_seconds * span.span_seconds
            rows = self.connection.execute(
                f"SELECT DISTINCT series_id, start FROM chunks WHERE {PIECE_CONDITION} AND tier = ? AND start < ?",
                (span.step, cut),
            ).fetchall()
            by_span: dict[int, set[int]] = {}
            for series_id, start in rows:
                by_span.setdefault(start // span.span_seconds * span.span_seconds, set()).add(series_id)
            for coarse_start, members in sorted(by_span.items()):
                for series_ids in batches(sorted(members), BLOCK):
                    target, _ = self._gather(span, series_ids, coarse_start, span.points)
                    if target is not None:
                        self._store_whole(span, coarse_start, series_ids, target)
        sweep_payloads(self.connection)

    def compact_block(self, block: int, until: int) -> None:
        """Copy the head rows of `block` before `until` into chunks.

        The rows stay in the head until the round is over (`EmbeddedStore._drop_head_before`): readers
        take a series' chunk over its head rows where both cover a time (`sqlite_read`)."""
        rows = self.connection.execute(
            "SELECT t, data FROM head WHERE block = ? AND t < ? ORDER BY t", (block, until)
        ).fetchall()
        if not rows:
            return
        fine = self.spans[0]
        series_ids = list(range(block * BLOCK, (block + 1) * BLOCK))
        by_chunk: dict[int, list[tuple[int, bytes]]] = {}
        for t, data in rows:
            by_chunk.setdefault(int(t) // fine.span_seconds * fine.span_seconds, []).append((int(t), data))
        del rows  # each span's head rows (an hour's: 240 a block) go once decoded
        for start in sorted(by_chunk):
            values = np.full((BLOCK, METRIC_COUNT, fine.points), MISSING, dtype=np.int64)
            for t, data in by_chunk.pop(start):
                values[:, :, (t - start) // fine.step] = decode_head(data)
            present = (values != MISSING).any(axis=(1, 2))
            chosen = [index for index in range(BLOCK) if present[index]]
            if chosen:  # every series (the usual case): the block's points as they are, not a copy
                self.write_fine([series_ids[index] for index in chosen], start,
                                values if len(chosen) == BLOCK else values[chosen], until)

    def apply_retention(self, latest: float) -> None:
        """Drop the chunks each tier no longer keeps (whole chunks only), series by series through the
        primary key (tier, series_id, start)."""
        series_ids = [series_id for (series_id,) in self.connection.execute("SELECT id FROM series ORDER BY id")]
        for span in self.spans:
            cut = int(latest - span.tier.keep_seconds)
            for batch in batches(series_ids):
                self.connection.execute(
                    f"DELETE FROM chunks WHERE tier = ? AND series_id IN ({marks(batch)}) "
                    "AND start < ? AND start + points * ? <= ?",
                    (span.step, *batch, cut, span.step, cut),
                )
        sweep_payloads(self.connection)  # bytes another chunk still names stay
