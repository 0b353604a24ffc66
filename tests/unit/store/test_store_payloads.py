"""Chunk bytes stored once, part by part (schema 4): sharing, reads through it, retention, restart mid-round,
migration from schemas 2 and 3."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuwm.store import RangeQuery
from gpuwm.store.chunks import read_chunks
from gpuwm.store.codec import (
    BLOCK,
    METRIC_COUNT,
    MISSING,
    PARTS,
    SCHEMA4_METRIC_COUNT,
    WHOLE,
    decode_parts,
    encode_chunks,
    quantize,
)
from gpuwm.store.embedded import APPLICATION_ID, SCHEMA_VERSION, EmbeddedStore
from gpuwm.store.schema import (
    PART_COLUMNS,
    PART_ROWS,
    PIECE_CONDITION,
    create_schema,
    payload_hash,
    store_payloads,
)

from .old_schema import narrowed
from .store_data import cluster, project, sample, workload

#: 15 s points kept 4 minutes in 2-minute chunks; 1 min roll-ups kept 10 minutes in 4-minute chunks
SMALL_TIERS = ["15s:4m", "1m:10m"]
JOBS = 16  # one-pod, one-GPU workloads: with their pods, GPUs and node parts, more than one block of series
CHUNK_ROWS = (f"SELECT r.tier, r.series_id, r.start, r.points, r.part, p.data FROM ({PART_ROWS}) r "
              "JOIN payloads p ON p.id = r.payload")


def util(job: int, t: float) -> float:
    return float((t * 7 + 13 * job) % 100) + 0.25


def record_jobs(store: EmbeddedStore, times: list[float], running: range = range(JOBS)) -> None:
    for t in times:
        jobs = [
            workload(f"job{j}", [(f"gpu-{j:02d}", 1.0, util(j, t))], energy_joules=10.0 * t, idle_seconds=t)
            for j in running
        ]
        samples = [sample(t, f"gpu-{j:02d}", sm=util(j, t)) for j in running]
        store.record(t, samples, jobs, [project("alpha", jobs)], cluster(JOBS))


def chunk_rows(store: EmbeddedStore) -> list[tuple[int, int, int, int, int, bytes]]:
    return store._reader().execute(CHUNK_ROWS + " ORDER BY 1, 2, 3, 5").fetchall()


def chunk_values(store: EmbeddedStore) -> dict[tuple[int, int, int], list[list[int]]]:
    """Every chunk's points, decoded whatever its layout: (tier, series, start) -> [metrics][points]."""
    connection = store._reader()
    series_ids = [row[0] for row in connection.execute("SELECT id FROM series")]
    tiers = [row[0] for row in connection.execute("SELECT DISTINCT tier FROM chunks")]
    return {(tier, series_id, start): decode_parts(parts, points).tolist()
            for tier in tiers
            for series_id, start, points, parts in read_chunks(connection, tier, series_ids, -1, 2**40)}


def check_counts(store: EmbeddedStore) -> None:
    """Every payload is named by exactly `refs` chunk parts, every part's payload exists, no bytes twice."""
    connection = store._reader()
    counted = connection.execute(
        f"SELECT p.id, p.refs, count(r.payload) FROM payloads p LEFT JOIN ({PART_ROWS}) r ON r.payload = p.id "
        "GROUP BY p.id"
    ).fetchall()
    assert all(refs == named and named > 0 for _, refs, named in counted)
    dangling = connection.execute(f"SELECT count(*) FROM ({PART_ROWS}) WHERE payload NOT IN (SELECT id FROM payloads)")
    assert dangling.fetchone()[0] == 0
    distinct = connection.execute("SELECT count(DISTINCT data), count(*) FROM payloads").fetchone()
    assert distinct[0] == distinct[1]


def test_identical_chunks_share_their_bytes_and_read_back_exactly(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        times = [float(t) for t in range(0, 600, 15)]
        record_jobs(store, times)
        store.compact(everything=True)
        connection = store._reader()
        assert len(store._series_ids) > BLOCK  # the copies lie in two head blocks, compacted apart
        parts, named_bytes = connection.execute(f"SELECT count(*), sum(length(data)) FROM ({CHUNK_ROWS})").fetchone()
        payloads, stored_bytes = connection.execute("SELECT count(*), sum(length(data)) FROM payloads").fetchone()
        assert payloads < parts and stored_bytes < named_bytes
        assert connection.execute("SELECT count(*) FROM chunks WHERE payload IS NOT NULL").fetchone() == (0,)
        check_counts(store)
        for job in range(JOBS):
            by_kind = {kind: payloads for kind, *payloads in connection.execute(
                "SELECT s.kind, c.device_payload, c.energy_payload, c.units_payload, c.pod_payload FROM chunks c "
                "JOIN series s ON s.id = c.series_id WHERE s.workload_uid = ? AND c.tier = 15 "
                "AND c.start = (SELECT max(start) FROM chunks WHERE tier = 15)",
                (f"uid-job{job}",),
            )}
            # a one-pod workload's pod and workload_node series hold the same points: one payload per part
            assert by_kind["pod"] == by_kind["workload_node"] and by_kind["pod"][0] is not None
            # and its one GPU's device figures are the pod's and the workload's, though the whole
            # chunks differ (the GPU series has no idle seconds, the workload its own energy)
            assert by_kind["gpu"][0] == by_kind["pod"][0] == by_kind["workload"][0]
            assert by_kind["gpu"] != by_kind["pod"]
        # reads through a shared payload: every series its own exact values
        for job in (0, 5, JOBS - 1):
            for by in ("pod", "node", "gpu"):
                (series,) = store.query_range(  # the 15 s tier keeps the last 4 minutes
                    RangeQuery("workload", f"uid-job{job}", ("gpu_utilization_percent",), 360, 585, 15, by)
                )
                assert [v for _, v in series.points] == [util(job, t) for t in times[24:]]
            (coarse,) = store.query_range(
                RangeQuery("workload", f"uid-job{job}", ("gpu_utilization_percent",), 360, 540, 60, "pod")
            )
            means = [sum(util(job, m + k) for k in (0, 15, 30, 45)) / 4 for m in range(360, 600, 60)]
            assert [v for _, v in coarse.points] == pytest.approx(means, abs=0.05 + 1e-9)  # the roll-ups keep 0.1 % (codec.ROLLUP_QUANTUM)
    finally:
        store.close()


def test_retention_keeps_bytes_a_later_chunk_still_names(tmp_path: Path) -> None:
    """A constant series' chunks are the same bytes span after span: dropping the old ones keeps the bytes."""
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        node = store.register_series("node", "n0", {"node": "n0"})
        values = np.full((1, METRIC_COUNT, 16), 5.0)  # two 2-minute fine spans, every metric constant
        store.load_history([node], 0, values)
        connection = store._reader()
        fine = connection.execute("SELECT start, device_payload FROM chunks WHERE tier = 15 ORDER BY start").fetchall()
        assert [start for start, _ in fine] == [0, 120] and fine[0][1] == fine[1][1]
        assert connection.execute("SELECT refs FROM payloads WHERE id = ?", (fine[0][1],)).fetchone() == (2,)
        store._writer.execute("BEGIN")
        store._chunks.apply_retention(360.0)  # 15 s keeps 4 minutes: the chunk of [0, 120) goes
        store._writer.execute("COMMIT")
        assert connection.execute("SELECT start FROM chunks WHERE tier = 15").fetchall() == [(120,)]
        assert connection.execute("SELECT refs FROM payloads WHERE id = ?", (fine[0][1],)).fetchone() == (1,)
        (series,) = store.query_range(RangeQuery("node", "n0", ("gpu_power_watts",), 120, 225, 15))
        assert [v for _, v in series.points] == [5.0] * 8
        check_counts(store)
        store._writer.execute("BEGIN")
        store._chunks.apply_retention(480.0)  # and now the one of [120, 240): nobody names the bytes
        store._writer.execute("COMMIT")
        assert connection.execute("SELECT count(*) FROM payloads WHERE id = ?", (fine[0][1],)).fetchone() == (0,)
        check_counts(store)
    finally:
        store.close()


def test_a_restart_in_the_middle_of_a_compaction_round_gives_the_same_chunks(tmp_path: Path) -> None:
    times = [float(t) for t in range(0, 135, 15)]  # the 120 s interval closes the first span
    steady = EmbeddedStore(tmp_path / "a.db", tiers=SMALL_TIERS)
    restarted = EmbeddedStore(tmp_path / "b.db", tiers=SMALL_TIERS)
    try:
        record_jobs(steady, times)
        record_jobs(restarted, times)
        # one of the two blocks compacted by the 120 s interval; both keep their head rows until the round is over
        assert restarted.compacted_blocks == 1
        blocks_left = restarted._reader().execute("SELECT count(DISTINCT block) FROM head WHERE t < 120").fetchone()
        assert blocks_left == (2,)
        in_chunks = restarted._reader().execute("SELECT count(DISTINCT series_id / 64) FROM chunks WHERE tier = 15")
        assert in_chunks.fetchone() == (1,)
        restarted.close()
        restarted = EmbeddedStore(tmp_path / "b.db", tiers=SMALL_TIERS)
        later = [float(t) for t in range(135, 300, 15)]
        record_jobs(steady, later)
        record_jobs(restarted, later)
        steady.compact(everything=True)
        restarted.compact(everything=True)
        assert chunk_rows(restarted) == chunk_rows(steady)
        count = "SELECT count(*), sum(refs) FROM payloads"
        assert restarted._reader().execute(count).fetchone() == steady._reader().execute(count).fetchone()
        check_counts(restarted)
        (series,) = restarted.query_range(RangeQuery("workload", "uid-job7", ("gpu_utilization_percent",), 120, 285, 15))
        assert [v for _, v in series.points] == [util(7, t) for t in range(120, 300, 15)]
    finally:
        steady.close()
        restarted.close()


def test_a_hash_collision_gets_its_own_payload(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        connection = store._writer
        connection.execute("BEGIN")
        # other bytes under the hash of the new ones, as a (32-bit) collision leaves them
        planted = connection.execute(
            "INSERT INTO payloads (hash, refs, data) VALUES (?, 1, ?)", (payload_hash(b"new"), b"other")
        ).lastrowid
        ids = store_payloads(connection, [b"new", b"new"])
        again = store_payloads(connection, [b"new"])
        connection.execute("COMMIT")
        assert ids[0] == ids[1] == again[0] != planted
        assert connection.execute("SELECT data FROM payloads WHERE id = ?", (ids[0],)).fetchone() == (b"new",)
        assert connection.execute("SELECT data FROM payloads WHERE id = ?", (planted,)).fetchone() == (b"other",)
    finally:
        store.close()


def test_transient_and_lasting_bytes_are_never_shared(tmp_path: Path) -> None:
    """A piece's parts all get ids below zero, a whole chunk's above, even for the same bytes: the
    sign is what finds the pieces (PIECE_CONDITION reads the first part a chunk has)."""
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        connection = store._writer
        connection.execute("BEGIN")
        (lasting,) = store_payloads(connection, [b"same"])
        (transient,) = store_payloads(connection, [b"same"], transient=True)
        (again,) = store_payloads(connection, [b"same"])
        (transient_again,) = store_payloads(connection, [b"same"], transient=True)
        connection.execute("COMMIT")
        assert lasting == again > 0 and transient == transient_again < 0
    finally:
        store.close()


def _whole_chunks(path: Path) -> list[tuple[int, int, int, int, bytes]]:
    """Each chunk of a schema-4 file as one payload of every metric, as schemas 2 and 3 wrote them."""
    connection = sqlite3.connect(path)
    series_ids = [row[0] for row in connection.execute("SELECT id FROM series")]
    tiers = [row[0] for row in connection.execute("SELECT DISTINCT tier FROM chunks")]
    rows = [(tier, series_id, start, points,
             encode_chunks(decode_parts(parts, points)[None, :SCHEMA4_METRIC_COUNT], 9, WHOLE)[0])
            for tier in tiers for series_id, start, points, parts in read_chunks(connection, tier, series_ids, -1, 2**40)]
    connection.close()
    return rows


def _as_schema_2(path: Path) -> None:
    """Rewrite a file as the schema-2 layout (whole chunks' bytes inline), as an older gpuwm left it."""
    rows = _whole_chunks(path)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("BEGIN")
    connection.execute(
        "CREATE TABLE chunks2 (tier INTEGER NOT NULL, series_id INTEGER NOT NULL, start INTEGER NOT NULL, "
        "points INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE (tier, series_id, start))"
    )
    connection.executemany("INSERT INTO chunks2 VALUES (?, ?, ?, ?, ?)", rows)
    for name in ("chunks_ref", "chunks_unref", "chunks_reref"):
        connection.execute(f"DROP TRIGGER {name}")
    connection.execute("DROP TABLE chunks")
    connection.execute("DROP TABLE payloads")
    connection.execute("ALTER TABLE chunks2 RENAME TO chunks")
    connection.execute("CREATE INDEX chunks_by_start ON chunks (tier, start)")
    connection.execute("PRAGMA user_version = 2")
    connection.execute("COMMIT")
    connection.close()


def _as_schema_3(path: Path) -> None:
    """Rewrite a file as the schema-3 layout (one payload of every metric per chunk, counted by triggers)."""
    rows = _whole_chunks(path)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("BEGIN")
    for name in ("chunks_ref", "chunks_unref", "chunks_reref"):
        connection.execute(f"DROP TRIGGER {name}")
    connection.execute("DROP TABLE chunks")
    connection.execute("DELETE FROM payloads")
    connection.execute(
        "CREATE TABLE chunks (tier INTEGER NOT NULL, series_id INTEGER NOT NULL, start INTEGER NOT NULL, "
        "points INTEGER NOT NULL, payload INTEGER NOT NULL, PRIMARY KEY (tier, series_id, start)) WITHOUT ROWID"
    )
    connection.execute("CREATE INDEX chunks_pieces ON chunks (tier, start) WHERE payload < 0")
    connection.execute("CREATE TRIGGER chunks_ref AFTER INSERT ON chunks BEGIN "
                       "UPDATE payloads SET refs = refs + 1 WHERE id = new.payload; END")
    connection.execute("CREATE TRIGGER chunks_unref AFTER DELETE ON chunks BEGIN "
                       "UPDATE payloads SET refs = refs - 1 WHERE id = old.payload; END")
    ids = store_payloads(connection, [row[4] for row in rows])
    connection.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?)",
                           [(*row[:4], payload_id) for row, payload_id in zip(rows, ids, strict=True)])
    connection.execute("PRAGMA user_version = 3")
    connection.execute("COMMIT")
    connection.close()


@pytest.mark.parametrize("old_schema", [2, 3])
def test_an_older_file_is_migrated_in_place_and_keeps_every_point(tmp_path: Path, old_schema: int) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    times = [float(t) for t in range(0, 450, 15)]
    record_jobs(store, times)
    before_values = narrowed(chunk_values(store), 4)  # schemas 2 and 3 kept the first metrics only
    before = store.query_range(RangeQuery("cluster", "", ("gpu_utilization_percent",), 0, 435, 15, "pod"))
    store.close()
    (_as_schema_2 if old_schema == 2 else _as_schema_3)(path)
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone() == (old_schema,)
    assert connection.execute("SELECT count(*) FROM chunks").fetchone()[0] == len(before_values)
    connection.close()
    migrated = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        connection = migrated._reader()
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert connection.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        # every chunk names its whole bytes, as the old file did, and reads back the same points
        assert connection.execute("SELECT count(*) FROM chunks WHERE payload IS NULL").fetchone() == (0,)
        assert chunk_values(migrated) == before_values
        check_counts(migrated)
        assert connection.execute("SELECT count(*) FROM payloads").fetchone()[0] < len(before_values)
        after = migrated.query_range(RangeQuery("cluster", "", ("gpu_utilization_percent",), 0, 435, 15, "pod"))
        assert [(s.labels, s.points) for s in after] == [(s.labels, s.points) for s in before]
        # and it goes on: the head left by the old file is compacted into the new layout, and a whole
        # chunk written again (the open coarse span's) is split into parts, its whole bytes swept
        record_jobs(migrated, [450.0, 465.0, 480.0])
        migrated.compact(everything=True)
        check_counts(migrated)
        rewritten = connection.execute(
            "SELECT count(*) FROM chunks WHERE payload IS NULL AND device_payload IS NOT NULL AND tier = 60 AND start = 240"
        ).fetchone()[0]
        assert rewritten > 0
        assert connection.execute("SELECT count(*) FROM payloads WHERE refs <= 0").fetchone() == (0,)
        (series,) = migrated.query_range(RangeQuery("workload", "uid-job3", ("gpu_utilization_percent",), 240, 480, 15))
        assert [v for _, v in series.points] == [util(3, t) for t in range(240, 495, 15)]
    finally:
        migrated.close()


class _StaleVersion(sqlite3.Connection):
    """A connection whose first `PRAGMA user_version` answers 3: what a process read just before another
    process migrated the file."""

    lied = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "PRAGMA user_version" and not _StaleVersion.lied:
            _StaleVersion.lied = True
            return super().execute("SELECT 3")
        return super().execute(sql, *args)


def test_a_file_migrated_by_another_process_meanwhile_is_not_migrated_again(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    record_jobs(store, [float(t) for t in range(0, 300, 15)])
    store.compact(everything=True)
    before = chunk_values(store)
    store.close()
    _StaleVersion.lied = False
    connection = sqlite3.connect(path, isolation_level=None, factory=_StaleVersion)
    create_schema(connection, path)  # read 3, then (under the write lock) 4: nothing to migrate
    connection.close()
    assert _StaleVersion.lied
    again = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        assert chunk_values(again) == before
        assert again._reader().execute("SELECT count(*) FROM chunks WHERE device_payload IS NULL").fetchone() == (0,)
        check_counts(again)
    finally:
        again.close()


def test_parts_cover_every_metric_once_and_decode_alone() -> None:
    """Every metric is in exactly one part of the split; a chunk missing a part reads MISSING there."""
    from gpuwm.store.codec import SPLIT_PARTS, encode_parts

    members = np.concatenate([PARTS[part] for part in SPLIT_PARTS])
    assert sorted(members.tolist()) == list(range(METRIC_COUNT))
    assert np.array_equal(PARTS[WHOLE], np.arange(SCHEMA4_METRIC_COUNT))  # what schema 3 wrote
    rng = np.random.default_rng(3)
    values = quantize(rng.normal(50, 20, size=(2, 12, METRIC_COUNT))).transpose(0, 2, 1).copy()
    values[1][PARTS[4]] = MISSING  # the second series has no pod stats
    encoded = encode_parts(values)
    assert all(data is not None for data in encoded[0]) and encoded[1][SPLIT_PARTS.index(4)] is None
    for row, parts in zip(values, encoded, strict=True):
        present = [(part, data) for part, data in zip(SPLIT_PARTS, parts, strict=True) if data is not None]
        assert np.array_equal(decode_parts(present, 12), row)
        subset = np.array([13, 0, 6, 17], dtype=np.intp)  # any order, across parts
        assert np.array_equal(decode_parts(present, 12, subset), row[subset])
        whole = encode_chunks(row[None, :SCHEMA4_METRIC_COUNT], part=WHOLE)[0]  # schema 3's, without schema 5's metrics
        assert np.array_equal(decode_parts([(WHOLE, whole)], 12, subset), row[subset])
        later = decode_parts([(WHOLE, whole)], 12)[SCHEMA4_METRIC_COUNT:]
        assert (later == MISSING).all()


def test_payloads_of_quantized_values_are_deterministic() -> None:
    """The same points give the same bytes (what sharing relies on): encode twice, compare."""
    rng = np.random.default_rng(2)
    values = quantize(rng.normal(50, 20, size=(3, 8, METRIC_COUNT))).transpose(0, 2, 1)
    values = np.ascontiguousarray(np.concatenate([values, values[:1]]))
    encoded = encode_chunks(values)
    assert encoded[0] == encoded[3] and encoded == encode_chunks(values.copy())
    assert len(set(encoded)) == 3


def test_pieces_of_an_open_coarse_span_fill_pages_of_their_own_and_go_when_it_ends(tmp_path: Path) -> None:
    """Coarse pieces get payload ids below zero (apart from the chunks that stay); the merge drops them."""
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)  # fine spans 120 s, coarse spans 240 s
    try:
        record_jobs(store, [float(t) for t in range(0, 150, 15)])  # the first fine span compacted
        connection = store._reader()
        pieces = connection.execute(f"SELECT {', '.join(PART_COLUMNS.values())} FROM chunks "
                                    "WHERE tier = 60 AND points < 4").fetchall()
        assert pieces and all(payload is None or payload < 0 for row in pieces for payload in row)
        assert connection.execute(f"SELECT count(*) FROM chunks WHERE {PIECE_CONDITION} AND tier = 60").fetchone() == (
            len(pieces),)
        assert connection.execute(f"SELECT min(payload) FROM ({PART_ROWS}) WHERE tier = 15").fetchone()[0] > 0
        record_jobs(store, [float(t) for t in range(150, 270, 15)])  # the second fine span ends the coarse one
        assert connection.execute("SELECT count(*) FROM chunks WHERE tier = 60 AND points < 4").fetchone() == (0,)
        assert connection.execute("SELECT count(*) FROM payloads WHERE id < 0").fetchone() == (0,)
        check_counts(store)
        (series,) = store.query_range(RangeQuery("workload", "uid-job2", ("gpu_utilization_percent",), 0, 180, 60))
        means = [sum(util(2, m + k) for k in (0, 15, 30, 45)) / 4 for m in range(0, 240, 60)]
        assert [v for _, v in series.points] == pytest.approx(means, abs=0.05 + 1e-9)  # the roll-ups keep 0.1 % (codec.ROLLUP_QUANTUM)
    finally:
        store.close()


def test_a_series_that_stops_inside_a_coarse_span_gets_one_whole_chunk_when_the_span_ends(tmp_path: Path) -> None:
    """Its pieces are merged at the end of the round that closes the span, though it had no point then."""
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)  # fine spans 120 s, coarse spans 240 s
    try:
        record_jobs(store, [float(t) for t in range(0, 120, 15)])  # jobs 0-15 in the first fine span only
        record_jobs(store, [float(t) for t in range(120, 300, 15)], running=range(8))  # jobs 8-15 stopped
        connection = store._reader()
        stopped = connection.execute(
            "SELECT c.start, c.points, c.device_payload FROM chunks c JOIN series s ON s.id = c.series_id "
            "WHERE s.kind = 'workload' AND s.key = 'uid-job12' AND c.tier = 60"
        ).fetchall()
        assert len(stopped) == 1 and stopped[0][:2] == (0, 4) and stopped[0][2] > 0
        assert connection.execute(f"SELECT count(*) FROM chunks WHERE {PIECE_CONDITION} AND start < 240").fetchone() == (0,)
        check_counts(store)
        (series,) = store.query_range(RangeQuery("workload", "uid-job12", ("gpu_utilization_percent",), 0, 180, 60))
        means = [sum(util(12, m + k) for k in (0, 15, 30, 45)) / 4 for m in (0, 60)]
        assert [v for _, v in series.points] == pytest.approx([*means, None, None], abs=0.05 + 1e-9)  # the roll-ups keep 0.1 % (codec.ROLLUP_QUANTUM)
    finally:
        store.close()
