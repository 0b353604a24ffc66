"""The embedded store's compaction: closed chunk spans' head rows moved into chunks, a slice per interval.

A round starts once the finest tier's chunk span (1 h at 15 s) is over. Its head blocks are compacted
a few per `record` call, spread over `_COMPACTION_SHARE` of the next span, so that no interval pays
for a whole span; then the head rows before the span's end are deleted a slice at a time; then the
store finishes the round (roll-ups' watermarks, retention, series left without a point). The head
rows stay until every block of the round is in chunks: readers see each point once, from the head or
from its chunk.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Collection, Sequence

import numpy as np

from gpuwm.store.chunks import ChunkWriter, TierSpan
from gpuwm.store.codec import IntArray
from gpuwm.store.sql import batches, marks

#: compaction of a closed span is spread over this share of the next span's intervals: the same CPU an hour
#: as over half of it, half of it in any one interval; the rest of the span is the margin for a round that
#: falls behind (missed intervals, a restart)
_COMPACTION_SHARE = 0.875
#: intervals of head rows deleted a slice once a round's blocks are all compacted (`Compaction.slice`)
_HEAD_DROP_INTERVALS = 30


class Compaction:
    """Which head blocks the current round still has to compact, how many an interval, and how far it got.

    `target`: the round's end (the start of the open span); every head row before it goes into chunks.
    The caller owns the set of blocks with head rows (the write path adds to it) and hands it in.
    """

    def __init__(self, connection: sqlite3.Connection, spans: Sequence[TierSpan], chunks: ChunkWriter,
                 compacted_until: int) -> None:
        self._connection = connection
        self._fine = spans[0]
        self._chunks = chunks
        self.target = compacted_until
        self._pending: list[int] = []  # blocks still to compact below `target`
        self._budget = 1  # blocks compacted per slice in this round
        self._dropped_until = 0  # the round below this is over: its head rows deleted, the caller's finish done
        self.compacted_blocks = 0  # head blocks compacted since opened (benchmarks, logs)

    def restart(self, compacted_until: int) -> None:
        """After a rollback: a rolled-back slice took its blocks off the round's list, their rows still in the
        head, so the round starts again from the file (the next slice lists what is left below the target)."""
        self.target = compacted_until
        self._pending = []
        self._dropped_until = 0

    def slice(self, at: float, head_blocks: Collection[int]) -> int | None:
        """Compact a few blocks of the closed spans as of the interval at `at`; once they are all compacted, a
        slice of the round's head rows goes. The round's end once none of its head rows is left (the caller
        then finishes the round and calls `finished`), else None."""
        fine = self._fine
        bucket = int(math.floor(at / fine.step) * fine.step)
        target = bucket // fine.span_seconds * fine.span_seconds
        if target > self.target:
            self.target = target
            self._pending = [
                block
                for (block,) in self._connection.execute(
                    "SELECT DISTINCT block FROM head WHERE t < ? ORDER BY block DESC", (target,)
                )
            ]
            rounds = max(1, int(fine.points * _COMPACTION_SHARE))
            self._budget = max(1, math.ceil(len(self._pending) / rounds))
        for _ in range(min(self._budget, len(self._pending))):
            self.compact_block(self._pending.pop(), self.target)
        if self._pending or self._dropped_until >= self.target:
            return None
        return self.target if self._drop_head_slice(self.target, head_blocks) else None

    def finished(self, until: int) -> None:
        """The caller finished the round that ends at `until`."""
        self._dropped_until = until

    def compact_now(self, head_blocks: Collection[int], until: int, round_end: int) -> None:
        """Compact every block's head rows before `until` now (the caller then finishes the round), and let the
        round in progress end at `round_end` at the earliest."""
        for block in sorted(head_blocks):
            self.compact_block(block, until)
        self._pending = []
        self.target = max(self.target, round_end)

    def compact_block(self, block: int, until: int) -> None:
        self._chunks.compact_block(block, until)
        self.compacted_blocks += 1

    def _drop_head_slice(self, until: int, head_blocks: Collection[int]) -> bool:
        """A slice of deleting the head rows before `until`, once every block of the round is compacted: the
        oldest `_HEAD_DROP_INTERVALS` intervals' rows; True once none is left before `until`.

        A span of head rows deleted in one go would make one long interval: a slice at a time, after the
        round's blocks, the round still ends within the span."""
        oldest = _least_in_head(self._connection, head_blocks, "SELECT min(t) FROM head WHERE block = ?")
        if oldest is None or oldest >= until:
            return True
        cut = min(until, oldest + _HEAD_DROP_INTERVALS * int(self._fine.step))
        drop_head_before(self._connection, head_blocks, cut)
        return cut >= until


def drop_head_before(connection: sqlite3.Connection, head_blocks: Collection[int], until: int) -> None:
    """Delete the head rows before `until`, every block's compacted by now, as one range of rowids.

    Deleting each block's rows as it is compacted would dirty a page for every interval of the
    block's hour (a page holds several blocks' rows of one interval), every page once per block with the
    WAL's checkpoint. Rows are appended in time order, so those before `until` are the rowids below the
    first row at or after it: deleted together, each page is written once.
    """
    first_after = _least_in_head(connection, head_blocks, "SELECT min(rowid) FROM head WHERE block = ? AND t >= ?",
                                 until)
    if first_after is None:  # nothing at or after `until`: every row before it goes
        connection.execute("DELETE FROM head WHERE t < ?", (until,))
        return
    connection.execute("DELETE FROM head WHERE rowid < ? AND t < ?", (first_after, until))
    # a row of an older interval written again after newer ones (a second write into it, a clock set
    # back) sits above `first_after`: found through the (block, t) index, so the round still ends
    late = [(rowid,) for block in head_blocks for (rowid,) in connection.execute(
        "SELECT rowid FROM head WHERE block = ? AND t < ?", (block, until))]
    if late:
        connection.executemany("DELETE FROM head WHERE rowid = ?", late)


def _least_in_head(connection: sqlite3.Connection, head_blocks: Collection[int], query: str,
                   *arguments: int) -> int | None:
    """The least answer of `query` (a min() over one block's head rows) over every block with head rows."""
    answers = (connection.execute(query, (block, *arguments)).fetchone()[0] for block in head_blocks)
    return min((int(answer) for answer in answers if answer is not None), default=None)


def blocks_in_head(connection: sqlite3.Connection) -> set[int]:
    """The blocks with head rows, as the file says (after a rollback, what this process thought may be off)."""
    return {block for (block,) in connection.execute("SELECT DISTINCT block FROM head")}


def series_without_points(connection: sqlite3.Connection, spans: Sequence[TierSpan], written: IdMarks,
                          limit: int) -> list[tuple[int, str, str]]:
    """At most `limit` series (id, kind, key) with no chunk in any tier and none of the `written` ones (those
    that may hold head points)."""
    without_chunks = " AND ".join(
        "NOT EXISTS (SELECT 1 FROM chunks c WHERE c.tier = ? AND c.series_id = s.id)" for _ in spans
    )
    return [
        (series_id, kind, key)
        for series_id, kind, key in connection.execute(
            f"SELECT id, kind, key FROM series s WHERE {without_chunks}", [span.step for span in spans]
        )
        if not written.marked(series_id)
    ][:limit]


def delete_series(connection: sqlite3.Connection, series_ids: Sequence[int]) -> None:
    """Delete the series rows of `series_ids`, a bounded statement at a time."""
    for batch in batches(series_ids):
        connection.execute(f"DELETE FROM series WHERE id IN ({marks(batch)})", batch)


class IdMarks:
    """Which series ids were marked: a flag per id up to the highest marked (ids are given out in order).

    A byte per id, where a set of the ids would hold a boxed integer and a hash slot per id.
    """

    __slots__ = ("_flags",)

    def __init__(self, ids: IntArray | None = None) -> None:
        self._flags = np.zeros(0, dtype=np.bool_)
        if ids is not None:
            self.mark(ids)

    def mark(self, ids: IntArray) -> None:
        if not len(ids):
            return
        highest = int(ids.max())
        if highest >= len(self._flags):
            grown = np.zeros(max(highest + 1, 2 * len(self._flags)), dtype=np.bool_)
            grown[: len(self._flags)] = self._flags
            self._flags = grown
        self._flags[ids] = True

    def marked(self, series_id: int) -> bool:
        return 0 <= series_id < len(self._flags) and bool(self._flags[series_id])
