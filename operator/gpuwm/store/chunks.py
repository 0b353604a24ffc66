"""The embedded store's chunk layer: chunk spans per tier, compaction of head rows into chunks, roll-ups.

A chunk holds one series' points of one tier for a fixed span (`Spans`), all metrics, compressed
(see codec.py). The finest tier's chunks are built from the head (one row per interval and
block of series) once their span is over; every coarser tier is rolled up from the fine chunk
at that moment (the fine span is a multiple of every coarser step, so its buckets are complete)
and overlaid onto the coarse chunk, which fills up over many fine spans. Every write here is an
overlay by time, so compacting the same interval twice, or a late interval after its chunk,
gives the same chunk.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpuwm.store.codec import (
    BLOCK,
    METRIC_COUNT,
    MISSING,
    IntArray,
    decode_chunk,
    decode_head,
    encode_chunks,
    roll_up,
)
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
    """Chunk span per tier: the finest a multiple of the coarsest step, each coarser one a multiple of it.

    About POINTS_PER_CHUNK points each, but at most half the tier's KEEP so retention can drop
    whole chunks without keeping much more than asked.
    """
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


class ChunkWriter:
    """Writes chunks inside the caller's transaction (the store's writing connection)."""

    def __init__(self, connection: sqlite3.Connection, spans: Sequence[TierSpan]) -> None:
        self.connection = connection
        self.spans = list(spans)

    def _existing(self, span: TierSpan, start: int, series_ids: Sequence[int]) -> IntArray | None:
        """The chunks already stored at (tier, start) for `series_ids`, as [S, M, points], or None if none."""
        placeholders = ",".join("?" * len(series_ids))
        rows = self.connection.execute(
            f"SELECT series_id, start, points, data FROM chunks WHERE tier = ? AND start = ? "
            f"AND series_id IN ({placeholders})",
            (span.step, start, *series_ids),
        ).fetchall()
        if not rows:
            return None
        position = {series_id: index for index, series_id in enumerate(series_ids)}
        result = np.full((len(series_ids), METRIC_COUNT, span.points), MISSING, dtype=np.int64)
        for series_id, row_start, points, data in rows:
            decoded = decode_chunk(data, points)
            _overlay(result[position[series_id] : position[series_id] + 1], start, decoded[None], row_start, span.step)
        return result

    def _store(self, span: TierSpan, start: int, series_ids: Sequence[int], values: IntArray) -> None:
        present = (values != MISSING).any(axis=(1, 2))
        chosen = [index for index in range(len(series_ids)) if present[index]]
        if not chosen:
            return
        encoded = encode_chunks(values[chosen])
        self.connection.executemany(
            "INSERT OR REPLACE INTO chunks (tier, series_id, start, points, data) VALUES (?, ?, ?, ?, ?)",
            [
                (span.step, series_ids[index], start, span.points, data)
                for index, data in zip(chosen, encoded, strict=True)
            ],
        )

    def write_fine(self, series_ids: Sequence[int], start: int, values: IntArray, complete_until: float) -> None:
        """Overlay [S, M, points] of the finest tier's chunk at `start`, then roll the complete buckets up.

        `complete_until`: coarse buckets ending after it are not rolled up yet (their fine points
        may still come).
        """
        fine = self.spans[0]
        existing = self._existing(fine, start, series_ids)
        if existing is not None:
            _overlay(existing, start, values, start, fine.step)
            values = existing
        self._store(fine, start, series_ids, values)
        for span in self.spans[1:]:
            factor = span.step // fine.step
            coarse = roll_up(values, factor)
            buckets = start + span.step * np.arange(coarse.shape[2])
            coarse[:, :, buckets + span.step > complete_until] = MISSING
            if (coarse == MISSING).all():
                continue
            coarse_start = start // span.span_seconds * span.span_seconds
            merged = self._existing(span, coarse_start, series_ids)
            if merged is None:
                merged = np.full((len(series_ids), METRIC_COUNT, span.points), MISSING, dtype=np.int64)
            _overlay(merged, coarse_start, coarse, start, span.step)
            self._store(span, coarse_start, series_ids, merged)

    def compact_block(self, block: int, until: int) -> int:
        """Move the head rows of `block` before `until` into chunks; returns how many head rows moved."""
        rows = self.connection.execute(
            "SELECT t, data FROM head WHERE block = ? AND t < ? ORDER BY t", (block, until)
        ).fetchall()
        if not rows:
            return 0
        fine = self.spans[0]
        series_ids = list(range(block * BLOCK, (block + 1) * BLOCK))
        by_chunk: dict[int, list[tuple[int, bytes]]] = {}
        for t, data in rows:
            by_chunk.setdefault(int(t) // fine.span_seconds * fine.span_seconds, []).append((int(t), data))
        for start, members in sorted(by_chunk.items()):
            values = np.full((BLOCK, METRIC_COUNT, fine.points), MISSING, dtype=np.int64)
            for t, data in members:
                values[:, :, (t - start) // fine.step] = decode_head(data)
            present = (values != MISSING).any(axis=(1, 2))
            chosen = [index for index in range(BLOCK) if present[index]]
            if chosen:
                self.write_fine([series_ids[index] for index in chosen], start, values[chosen], until)
        self.connection.execute("DELETE FROM head WHERE block = ? AND t < ?", (block, until))
        return len(rows)

    def apply_retention(self, latest: float) -> None:
        """Drop the chunks each tier no longer keeps (whole chunks only)."""
        for span in self.spans:
            cut = int(latest - span.tier.keep_seconds)
            self.connection.execute(
                "DELETE FROM chunks WHERE tier = ? AND start < ? AND start + points * ? <= ?",
                (span.step, cut, span.step, cut),
            )


def head_blocks(series_ids: Iterable[int]) -> set[int]:
    return {series_id // BLOCK for series_id in series_ids}
