"""The embedded store: one SQLite file (WAL) the controller writes each status interval.

Layout (why): each interval is one transaction that appends a *head* row per block
of 64 series (all metrics of those series, compressed; codec.py), so the write is a few
hundred small rows however many series there are, and the interval is durable when `record`
returns. Once a chunk span (1 h at 15 s) is over, compaction moves the head rows into
*chunks*: one row per (tier, series, span) with every metric's points delta-coded and
compressed, a few blocks per `record` call so no interval pays for all of it (compaction.py);
coarser tiers are rolled up from the fine chunks then (chunks.py). A chunk's metrics are kept in parts
(codec.PARTS), and identical bytes of a part keep one copy (schema.py `payloads`). A 24 h query of one series reads about
24 chunks plus the head of the current hour. Workload, project, node and cluster series are
aggregated when written, so a project query over 1,000 workloads reads one series. Values are
kept at a fixed per-metric resolution (codec.RESOLUTION; roll-ups at codec.ROLLUP_QUANTUM).
The file carries an application_id and a schema version, so a foreign, newer or much older file
is refused and never written to; an older file is migrated in place when opened (schema.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import cast

import numpy as np

from gpuwm.model import ClusterFigures, LatestSample, PodStatsSample, ProjectFigures, WorkloadFigures
from gpuwm.store.base import (
    GpuHourPrice,
    RangeQuery,
    Series,
    Store,
    StoreError,
    Stretch,
    WorkloadGroup,
    WorkloadPeriod,
    latest_value,
)
from gpuwm.store.chunks import ChunkWriter, chunk_spans
from gpuwm.store.codec import (
    BLOCK,
    METRIC_COUNT,
    MISSING,
    FloatArray,
    IntArray,
    decode_head,
    encode_head,
    quantize,
)
from gpuwm.store.compaction import (
    Compaction,
    IdMarks,
    blocks_in_head,
    delete_series,
    drop_head_before,
    series_without_points,
)
from gpuwm.store.connections import Readers, open_writer
from gpuwm.store.figures import figure_values, stored_values
from gpuwm.store.holdings import HoldingsWriter
from gpuwm.store.latest import LatestWriter, read_one, read_projects, read_runs, read_workloads
from gpuwm.store.periods import StoreClock, read_group_peaks, read_period
from gpuwm.store.prices import PriceWriter, read_prices
from gpuwm.store.rows import RowBuilder, Rows, SeriesKey
from gpuwm.store.schema import APPLICATION_ID as APPLICATION_ID  # re-exported: the file's identity
from gpuwm.store.schema import SCHEMA_VERSION as SCHEMA_VERSION
from gpuwm.store.schema import check_file
from gpuwm.store.sql import marks
from gpuwm.store.sqlite_read import plan_stretches, read_range, select_series
from gpuwm.store.tiers import Tier, parse_tiers

#: head blocks filled, quantized and encoded at a time when an interval goes into the head (`write_head`):
#: 2,048 series slots, so that an interval's block grid and its quantized copy are never alive whole
_BLOCKS_AT_ONCE = 32
#: series rows deleted per compaction round at most: a store with many series left without a point
#: is cleaned over several hourly rounds, not in one long transaction
FORGET_SERIES_PER_ROUND = 50_000


class EmbeddedStore(Store):
    """SQLite store: per-series points in head rows and compressed chunks, roll-ups, retention, latest figures."""

    concurrent_reads = 4

    def __init__(
        self,
        path: str | Path,
        tiers: Sequence[str] = ("15s:2d", "5m:30d"),
        retention_seconds: float = 7 * 86400.0,
        latest_rows_per_interval: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.tiers: list[Tier] = parse_tiers(list(tiers))
        self.spans = chunk_spans(self.tiers)
        self.finest_step_seconds = float(self.tiers[0].step_seconds)
        self.retention_seconds = retention_seconds
        self._write_lock = threading.Lock()
        self._series_ids: dict[tuple[str, str], int] = {}
        # whether the map's keys were read from the file: the row builder's equal tuples replace them once it
        # holds its own (see `_adopt_keys`)
        self._keys_from_file = False
        self._rows = RowBuilder()  # each workload's series and pairs, kept between intervals
        # the ids of the series of the last rows (the same list while no workload changed), and their blocks
        self._ids_of: tuple[object, IntArray] = (None, np.zeros(0, dtype=np.int64))
        self._blocks_of: tuple[object, tuple[IntArray, IntArray, IntArray]] = (
            None, (self._ids_of[1], self._ids_of[1], self._ids_of[1])
        )
        self._head_blocks: set[int] = set()  # blocks with head rows
        # series that may hold points in the head, not yet in chunks: those written since the last
        # compaction round (and, when opened, every series of a block with head rows)
        self._written = IdMarks()
        self.forgotten_series = 0  # series rows deleted since opened (their points all past retention)
        self._latest_bucket: int | None = None
        check_file(self.path)
        try:
            self._writer = open_writer(self.path)
            self._read_series()
            self._latest = LatestWriter(self._writer, latest_rows_per_interval)
        except sqlite3.DatabaseError as error:
            raise StoreError(
                f"store {self.path} is corrupt or unreadable ({error}); refusing to overwrite it. "
                "Move it away or point --store at a new path."
            ) from None
        self._chunks = ChunkWriter(self._writer, self.spans)
        self._holdings = HoldingsWriter(self._writer)
        self._prices = PriceWriter(self._writer)
        self._compaction = Compaction(self._writer, self.spans, self._chunks,
                                      int(self._get_meta("compacted_until") or 0))
        self._readers = Readers(self.path)

    # -- connections -------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        return self._readers.connection()

    def close(self) -> None:
        self._readers.close()
        self._writer.close()

    # -- writing -----------------------------------------------------------------------------

    def record(
        self,
        at: float,
        samples: Sequence[LatestSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
        *,
        compact: bool = True,
    ) -> None:
        """Write one interval in one transaction: head rows, changed latest figures, a slice of compaction.

        `compact=False` leaves the slice to `compact_slice`, which the caller runs once it has let go of
        the interval's figures (the controller: a slice's arrays then do not add to the figures' memory).
        """
        figures = figure_values(workloads)
        rows = self._rows.build(samples, workloads, projects, cluster, pod_stats, known=self._series_ids,
                                workload_figures=figures)
        with self._transaction():
            self.write_points(at, rows)
            self._write_holdings(at, workloads, stored_values(figures))
            self._latest.record(at, workloads, projects, cluster)
            self._set_meta("latest_time", at)
            if self._get_meta("earliest_time") is None:
                self._set_meta("earliest_time", at)
            if compact:
                self._compact_slice(at)

    def _write_holdings(self, at: float, workloads: Sequence[WorkloadFigures], stored: IntArray) -> None:
        """The interval's `holdings` rows (every workload has its series by now; `stored`: their cumulative
        figures as kept). A workload new to the store brings an opening where it began more than an interval
        before the previous one (the store's first: more than two finest steps before this one)."""
        step = self.tiers[0].step_seconds
        previous = self._get_meta("latest_time")
        opening_before = at - 2 * step if previous is None else previous - max(at - previous, step)
        ids = self._series_ids
        self._holdings.record(int(math.floor(at / step) * step),
                              [(ids[("workload", workload.uid)], workload) for workload in workloads], stored,
                              opening_before)

    def record_prices(self, at: float, prices: Mapping[str, GpuHourPrice]) -> None:
        """Each run's price per GPU-hour as of `at`, where it changed (store/prices.py)."""
        changed = self._prices.changes(prices)
        if changed:  # most intervals: no transaction at all
            with self._transaction():
                self._prices.write(at, changed)

    def compact_slice(self, at: float) -> None:
        """The compaction slice of the interval recorded at `at` with `record(..., compact=False)`, in a
        transaction of its own (what `record` does last by default)."""
        with self._transaction():
            self._compact_slice(at)

    @contextlib.contextmanager
    def _transaction(self, *, forget: bool = True) -> Iterator[None]:
        """One write transaction under the write lock; a failure rolls it back, and (`forget`) what this
        process remembers of the file is read again from it (`_forget_uncommitted`)."""
        with self._write_lock:
            connection = self._writer
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                if forget:
                    self._forget_uncommitted()
                raise

    def _forget_uncommitted(self) -> None:
        """After a rollback: what this process remembers of the file is read again from it."""
        self._latest.forget_uncommitted()
        self._holdings.reload()
        self._prices.reload()
        self._read_series()
        self._drop_row_layouts()
        self._compaction.restart(int(self._get_meta("compacted_until") or 0))

    def _read_series(self) -> None:
        """The series ids and the blocks with head rows, as the file says (when opened, and after a rollback:
        series inserted by the rolled-back transaction are gone, their ids may be given again, and a
        rolled-back round may have reset which series the head holds: every head block's are counted in)."""
        self._series_ids.clear()
        for kind, key, series_id in self._writer.execute("SELECT kind, key, id FROM series"):
            self._series_ids[(kind, key)] = series_id
        self._keys_from_file = bool(self._series_ids)
        self._next_series_id = self._first_free_id()
        self._head_blocks = blocks_in_head(self._writer)
        self._written.mark(self._ids_in_head(self._head_blocks))

    def _first_free_id(self) -> int:
        """Above every id given out, deleted ones included: a deleted id is never given again (head
        blocks are ids // BLOCK, and a reader may still hold the old id)."""
        (newest,) = self._writer.execute("SELECT max(id) FROM series").fetchone()
        return max(int(newest or 0), int(self._get_meta("series_id_high") or 0)) + 1

    @staticmethod
    def _ids_in_head(blocks: Iterable[int]) -> IntArray:
        """Every series id of `blocks` (those with head rows: a superset of the series with points there)."""
        starts = np.array(sorted(blocks), dtype=np.int64) * BLOCK
        return (starts[:, None] + np.arange(BLOCK, dtype=np.int64)).ravel()

    def write_points(self, at: float, rows: Rows) -> None:
        """Append one interval of rows to the head (inside the caller's transaction)."""
        if not rows.keys:
            return
        if rows.keys is self._ids_of[0]:  # the row builder's series of the last interval: their ids again
            ids = self._ids_of[1]
        else:
            found = self._series_ids.get
            ids_found = [found(key) for key in rows.keys]
            if self._keys_from_file:
                self._adopt_keys(rows.keys, ids_found)
            if None in ids_found:  # new series: inserted with their labels
                labels = rows.labels
                for position, key in enumerate(rows.keys):
                    if ids_found[position] is None:
                        ids_found[position] = self._series_id(key[0], key[1], labels.get(key), key)
            ids = np.array(ids_found, dtype=np.int64)
            self._ids_of = (rows.keys, ids)
            self._written.mark(ids)
        step = self.tiers[0].step_seconds
        self.write_head(int(math.floor(at / step) * step), ids, rows.values)

    def write_head(self, bucket: int, ids: IntArray, values: IntArray | FloatArray) -> None:
        """Head rows of one interval: `values[i]` is series `ids[i]`'s row at `bucket`, quantized already
        (integers) or as floats. The blocks are filled, quantized and encoded `_BLOCKS_AT_ONCE` at a time,
        so that neither a whole interval's block grid nor its quantized copy is alive beside the floats
        (they were the store thread's peak at 1,000 nodes: bench/README.md)."""
        if ids is self._blocks_of[0]:
            blocks, inverse, by_block = self._blocks_of[1]
        else:
            blocks, inverse = np.unique(ids // BLOCK, return_inverse=True)
            by_block = np.argsort(inverse, kind="stable")  # the rows block by block, each block's in order
            self._blocks_of = (ids, (blocks, inverse, by_block))
        block_list = [int(block) for block in blocks]
        # where each group of blocks' rows start in `by_block`
        starts = np.searchsorted(inverse[by_block], np.arange(0, len(block_list) + _BLOCKS_AT_ONCE, _BLOCKS_AT_ONCE))
        # None: a store just opened, whose file may hold this interval already
        again = self._latest_bucket is None or bucket <= self._latest_bucket
        for group, low in enumerate(range(0, len(block_list), _BLOCKS_AT_ONCE)):
            group_blocks = block_list[low:low + _BLOCKS_AT_ONCE]
            rows = by_block[starts[group]:starts[group + 1]]
            grid = np.full((len(group_blocks), BLOCK, METRIC_COUNT), MISSING, dtype=np.int64)
            given = values[rows]
            grid[inverse[rows] - low, ids[rows] % BLOCK] = (
                quantize(cast(FloatArray, given)) if given.dtype.kind == "f" else given
            )
            del given
            if again:
                # a second write into an interval: series written before and absent now keep their row
                for block, data in self._writer.execute(
                    f"SELECT block, data FROM head WHERE t = ? AND block IN ({marks(group_blocks)})",
                    (bucket, *group_blocks),
                ).fetchall():
                    index = group_blocks.index(block)
                    fresh = (grid[index] != MISSING).any(axis=1)
                    grid[index][~fresh] = decode_head(data)[~fresh]
            self._writer.executemany(
                "INSERT OR REPLACE INTO head (block, t, data) VALUES (?, ?, ?)",
                [(block, bucket, encode_head(grid[index])) for index, block in enumerate(group_blocks)],
            )
        self._head_blocks.update(block_list)
        self._latest_bucket = bucket if self._latest_bucket is None else max(self._latest_bucket, bucket)

    def _adopt_keys(self, keys: Sequence[SeriesKey], ids: Sequence[int | None]) -> None:
        """Key the map by the row builder's tuples for the series it holds, once after the map was read from the file.

        A dict keeps the key it was first given: the tuples and strings read from SQLite would stay beside the
        row builder's equal ones for every series after each restart.
        """
        series_ids = self._series_ids
        for key, series_id in zip(keys, ids, strict=True):
            if series_id is not None:
                del series_ids[key]
                series_ids[key] = series_id
        self._keys_from_file = False

    def _series_id(self, kind: str, key: str, labels: dict[str, str] | None, series: SeriesKey | None = None) -> int:
        """The id of series (kind, key), inserted if new; `series`: that pair as the caller holds it, kept as the
        key (the row builder's tuple: one tuple per series for both, not two)."""
        found = self._series_ids.get((kind, key))
        if found is None:
            labels = labels or {}
            found = self._next_series_id
            self._writer.execute(
                "INSERT INTO series (id, kind, key, workload_uid, project, node, labels) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    found,
                    kind,
                    key,
                    labels.get("workload_uid"),
                    labels.get("project"),
                    labels.get("node"),
                    json.dumps(labels, sort_keys=True),
                ),
            )
            self._next_series_id = found + 1
            self._series_ids[series if series is not None else (kind, key)] = found
        return found

    def _get_meta(self, key: str, connection: sqlite3.Connection | None = None) -> float | None:
        row = (connection or self._writer).execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return float(row[0]) if row else None

    def _set_meta(self, key: str, value: float) -> None:
        self._writer.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, repr(value)))

    # -- compaction ----------------------------------------------------------------------------

    def _compact_slice(self, at: float) -> None:
        """A slice of the compaction round (store/compaction.py); the round finished once its head rows are gone."""
        until = self._compaction.slice(at, self._head_blocks)
        if until is not None:
            self._finish_round(until, at)
            self._compaction.finished(until)

    @property
    def compacted_blocks(self) -> int:
        """Head blocks compacted since opened (benchmarks, logs)."""
        return self._compaction.compacted_blocks

    def _finish_round(self, until: int, at: float) -> None:
        drop_head_before(self._writer, self._head_blocks, until)
        self._head_blocks = blocks_in_head(self._writer)
        if not self._advance_compacted(until):
            return
        self._chunks.merge_ended_pieces(until)
        self._chunks.apply_retention(at)
        self._holdings.apply_retention(int(at - self.tiers[-1].keep_seconds))
        self._forget_empty_series()
        self._latest.apply_retention(at - self.retention_seconds)

    def _advance_compacted(self, until: int) -> bool:
        """Move the compaction watermark and each roll-up's up to `until`; False where they were there already."""
        done = self._get_meta("compacted_until")
        if done is not None and done >= until:
            return False
        self._set_meta("compacted_until", float(until))
        for span in self.spans[1:]:
            self._set_meta(f"rollup_until:{span.step}", float(until // span.step * span.step))
        return True

    def _forget_empty_series(self) -> None:
        """Delete the series rows left without a point: no chunk in any tier, nothing in the head.

        Workloads and pods come and go, and each leaves a few series behind; without this the
        series table (and this process's map of it, read whole at start) grows for as long as the
        store lives, past every tier's retention. Called at the end of a compaction round, when
        the head holds only what was written since the round before (`_written`). The
        highest id given out is kept in `meta` (`_first_free_id`): a deleted id is never given again.
        """
        written, self._written = self._written, IdMarks(self._ids_of[1])
        empty = series_without_points(self._writer, self.spans, written, FORGET_SERIES_PER_ROUND)
        if not empty:
            return
        self._set_meta("series_id_high", float(self._next_series_id - 1))
        delete_series(self._writer, [series_id for series_id, _, _ in empty])
        self._holdings.forget([series_id for series_id, _, _ in empty])
        self._prices.forget([key for _, kind, key in empty if kind == "workload"])
        for _, kind, key in empty:
            self._series_ids.pop((kind, key), None)
        self._drop_row_layouts()
        self.forgotten_series += len(empty)

    def _drop_row_layouts(self) -> None:
        """Forget the row builder's kept series layouts and their ids, after the series table changed under them.

        Its entries carry labels only for series that were unknown when they were built, and the
        ids of the last interval's series may name rows that are gone: both are built again.
        """
        self._rows.clear()
        self._ids_of = (None, self._ids_of[1])

    def compact(self, everything: bool = False) -> None:
        """Compact every closed span now; `everything` also the open one (benchmarks, tests, shutdown tools).

        A partly compacted span is completed by later compaction (chunks are overlaid, never replaced).
        """
        with self._transaction(forget=False):
            latest = self._get_meta("latest_time")
            if latest is None:
                return
            fine = self.spans[0]
            bucket = int(math.floor(latest / fine.step) * fine.step)
            until = bucket + fine.step if everything else bucket // fine.span_seconds * fine.span_seconds
            self._compaction.compact_now(self._head_blocks, until, bucket // fine.span_seconds * fine.span_seconds)
            self._finish_round(until, latest)

    def register_series(self, kind: str, key: str, labels: dict[str, str]) -> int:
        """The id of a series (created if new); for bulk loads with `load_history`."""
        with self._write_lock:
            return self._series_id(kind, key, labels)

    def load_history(self, series_ids: Sequence[int], start: int, values: FloatArray) -> None:
        """Bulk path (benchmarks, imports): [S, metrics, n] points (NaN = missing) of the finest tier from
        `start`, written straight into chunks and roll-ups exactly as compaction writes them.

        `start` must be the start of a chunk span. The head and the latest figures are not touched.
        """
        fine = self.spans[0]
        if start % fine.span_seconds:
            raise ValueError(f"load_history: start {start} is not a multiple of the chunk span ({fine.span_seconds} s)")
        points = values.shape[2]
        padded = -(-points // fine.points) * fine.points
        quantized = np.full((len(series_ids), METRIC_COUNT, padded), MISSING, dtype=np.int64)
        quantized[:, :, :points] = quantize(values.transpose(0, 2, 1)).transpose(0, 2, 1)
        end = start + points * fine.step
        with self._transaction(forget=False):
            self._chunks.write_fine(list(series_ids), start, quantized, end)
            self._chunks.merge_ended_pieces(end)
            latest = self._get_meta("latest_time")
            if latest is None or end - fine.step > latest:
                self._set_meta("latest_time", float(end - fine.step))
            earliest = self._get_meta("earliest_time")
            if earliest is None or start < earliest:
                self._set_meta("earliest_time", float(start))
            self._advance_compacted(end)

    def forget_workload(self, uid: str) -> None:
        """Drop a workload's latest figures (its points age out with the tiers)."""
        with self._write_lock:
            self._latest.forget_workload(uid)

    # -- reading: latest state ---------------------------------------------------------------

    def workloads(self) -> list[WorkloadFigures]:
        return read_workloads(self._reader())

    def workload(self, namespace: str, name: str) -> WorkloadFigures | None:
        return read_one(
            self._reader(), WorkloadFigures,
            "SELECT figures FROM latest_workloads WHERE namespace = ? AND name = ? ORDER BY at DESC LIMIT 1",
            namespace, name,
        )

    def workload_by_uid(self, uid: str) -> WorkloadFigures | None:
        return read_one(self._reader(), WorkloadFigures, "SELECT figures FROM latest_workloads WHERE uid = ?", uid)

    def runs(self) -> list[WorkloadFigures]:
        return read_runs(self._reader())

    def projects(self) -> list[ProjectFigures]:
        return read_projects(self._reader())

    def project(self, name: str) -> ProjectFigures | None:
        return read_one(self._reader(), ProjectFigures, "SELECT figures FROM latest_projects WHERE name = ?", name)

    def cluster(self) -> ClusterFigures | None:
        return read_one(self._reader(), ClusterFigures, "SELECT figures FROM latest_cluster WHERE id = 1")

    def nodes(self) -> list[str]:
        rows = self._reader().execute("SELECT DISTINCT node FROM series WHERE kind = 'node' ORDER BY node")
        return [node for (node,) in rows]

    def latest_time(self) -> float | None:
        return self._get_meta("latest_time", self._reader())

    def earliest_time(self) -> float | None:
        earliest = self._get_meta("earliest_time", self._reader())
        latest = self.latest_time()
        if earliest is None or latest is None:
            return earliest
        return max(earliest, latest - self.tiers[-1].keep_seconds)

    # -- reading: time series ----------------------------------------------------------------

    def series_count(self, query: RangeQuery) -> int | None:
        if query.by is None:
            return len(query.metrics)
        return len(query.metrics) * len(select_series(self._reader(), query))

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[tuple[sqlite3.Connection, float | None, dict[int, float | None]]]:
        """One read transaction, with the latest time and each tier's roll-up watermark: the watermarks, chunks
        and head rows of one snapshot, so an interval compacted meanwhile is read once, from the head or from
        its chunk."""
        connection = self._reader()
        connection.execute("BEGIN")
        try:
            yield connection, self._get_meta("latest_time", connection), {
                tier.step_seconds: self._get_meta(f"rollup_until:{tier.step_seconds}", connection)
                for tier in self.tiers
            }
        finally:
            connection.execute("COMMIT")

    def resolution(self, query: RangeQuery) -> list[Stretch]:
        with self._snapshot() as (_, latest, watermarks):
            return plan_stretches(self.tiers, latest, watermarks, query)

    def query_range(self, query: RangeQuery) -> list[Series]:
        with self._snapshot() as (connection, latest, watermarks):
            return read_range(connection, self.spans, latest, watermarks, query)

    # -- reading: periods ---------------------------------------------------------------------

    def period(self, start: float, end: float) -> list[WorkloadPeriod]:
        with self._snapshot() as (connection, latest, watermarks):
            clock = StoreClock(self.spans, latest, self._get_meta("earliest_time", connection), watermarks)
            return read_period(connection, clock, start, end)

    def gpu_hour_prices(self, uids: Sequence[str], start: float, end: float) -> dict[str, GpuHourPrice]:
        return read_prices(self._reader(), uids, end)

    def peak_allocated(self, start: float, end: float, groups: Mapping[str, WorkloadGroup]) -> dict[str, float]:
        with self._snapshot() as (connection, latest, watermarks):
            clock = StoreClock(self.spans, latest, self._get_meta("earliest_time", connection), watermarks)
            return read_group_peaks(connection, clock, start, end, groups)

    def latest_by_workload(
        self, uids: Sequence[str], metrics: tuple[str, ...], start: float, end: float, step_seconds: float
    ) -> dict[str, dict[str, float]]:
        """One read of the workloads' own series (kind `workload`, key its UID), not a range query each."""
        wanted = set(uids)
        query = RangeQuery("cluster", "", metrics, start, end, step_seconds)
        with self._snapshot() as (connection, latest_time, watermarks):
            # the answer needs only each series' workload (its key): no labels parsed
            selected = [
                (int(series_id), {"workload_uid": key})
                for series_id, key in connection.execute("SELECT id, key FROM series WHERE kind = 'workload'")
                if key in wanted
            ]
            if not selected:
                return {}
            found = read_range(connection, self.spans, latest_time, watermarks, query, selected)
        latest: dict[str, dict[str, float]] = {}
        for series in found:
            value = latest_value(series.points)
            if value is not None:
                latest.setdefault(series.labels["workload_uid"], {})[series.metric] = value
        return latest
