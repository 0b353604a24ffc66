"""The embedded store's head + chunk layout: round trips across compaction, durability, retention, versions."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from gpuwm.store import RangeQuery, StoreError
from gpuwm.store.codec import (
    METRIC_COUNT,
    MISSING,
    RESOLUTION,
    decode_chunk,
    dequantize,
    encode_chunks,
    quantize,
)
from gpuwm.store.embedded import APPLICATION_ID, EmbeddedStore

from .store_data import cluster, project, sample, workload

ROOT = Path(__file__).resolve().parents[3]
#: 15 s points kept 4 minutes in 2-minute chunks; 1 min roll-ups kept 10 minutes in 4-minute chunks
SMALL_TIERS = ["15s:4m", "1m:10m"]


def util_at(t: float) -> float:
    return float((t * 7) % 100) + 0.25


def record(store: EmbeddedStore, times: list[float], cpu_missing: frozenset[float] | set[float] = frozenset()) -> None:
    from gpuwm.model import PodStatsSample

    for t in times:
        job = workload("train", [("gpu-0", 1.0, util_at(t))], energy_joules=10.0 * t, idle_seconds=t)
        stats = [
            PodStatsSample(
                t=t,
                node="node-a",
                namespace="team-a",
                pod="train-0",
                pod_uid="pod-uid-train",
                cpu_usage_cores=None if t in cpu_missing else 1.5,
            )
        ]
        store.record(t, [sample(t, "gpu-0", sm=util_at(t))], [job], [project("alpha", [job])], cluster(1), stats)


def points(store: EmbeddedStore, metric: str, start: float, end: float, step: float = 15) -> list[float | None]:
    (series,) = store.query_range(RangeQuery("workload", "uid-train", (metric,), start, end, step))
    return [value for _, value in series.points]


def layout(store: EmbeddedStore) -> tuple[int, int]:
    connection = store._reader()
    chunks = connection.execute("SELECT count(*) FROM chunks WHERE tier = 15").fetchone()[0]
    head = connection.execute("SELECT count(*) FROM head").fetchone()[0]
    return int(chunks), int(head)


def test_chunk_spans_follow_the_tiers(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        assert [(span.step, span.span_seconds, span.points) for span in store.spans] == [(15, 120, 8), (60, 240, 4)]
    finally:
        store.close()
    default = EmbeddedStore(tmp_path / "d.db")
    try:
        assert [(span.step, span.span_seconds) for span in default.spans] == [(15, 3600), (300, 72000)]
    finally:
        default.close()


def test_query_across_head_and_chunks_with_a_gap_and_missing_values(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        # a missing interval on a chunk edge (240) and one inside a chunk (135); cpu missing at 165 and 360
        times = [float(t) for t in range(0, 420, 15) if t not in (135, 240)]
        record(store, times, cpu_missing={165.0, 360.0})
        chunks, head = layout(store)
        assert chunks > 0 and head > 0  # closed spans compacted, the open one still in the head
        expected = [None if t in (135, 240) else util_at(t) for t in range(0, 420, 15)]
        assert points(store, "gpu_utilization_percent", 180, 405) == expected[12:]
        cpu = points(store, "cpu_usage_cores", 180, 405)
        assert cpu == [None if t in (240, 360) else 1.5 for t in range(180, 420, 15)]
        energy = points(store, "gpu_energy_joules", 180, 405)
        assert energy == [None if t == 240 else 10.0 * t for t in range(180, 420, 15)]
        before = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 180, 405, 15))
        store.compact(everything=True)
        assert layout(store)[1] == 0
        after = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 180, 405, 15))
        assert [s.points for s in after] == [s.points for s in before]
        # writing goes on into the span compacted early: the chunk is completed, not replaced
        record(store, [420.0, 435.0, 450.0])
        store.compact(everything=True)
        assert points(store, "gpu_utilization_percent", 360, 450) == [util_at(t) for t in range(360, 465, 15)]
    finally:
        store.close()


def test_a_store_closed_before_compaction_reopens_with_every_interval(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path)  # default 1 h spans: nothing is compacted in these 10 minutes
    times = [float(3600 * 10 + 15 * k) for k in range(40)]
    record(store, times)
    assert layout(store) == (0, 40)
    store.close()
    reopened = EmbeddedStore(path)
    try:
        assert points(reopened, "gpu_utilization_percent", times[0], times[-1]) == [util_at(t) for t in times]
        # the next span's first interval compacts the old head (one block here: at once); its rows are deleted
        # 30 intervals a slice once the block is in chunks (`_drop_head_slice`): the second interval's slice ends it
        record(reopened, [3600.0 * 11])
        chunks, head = layout(reopened)
        assert chunks >= 1 and head == 1 + 10
        assert points(reopened, "gpu_utilization_percent", times[0], times[-1]) == [util_at(t) for t in times]
        record(reopened, [3600.0 * 11 + 15])
        chunks, head = layout(reopened)
        assert chunks >= 1 and head == 2
        assert points(reopened, "gpu_utilization_percent", times[0], times[-1]) == [util_at(t) for t in times]
        assert points(reopened, "gpu_utilization_percent", 39600, 39600) == [util_at(39600)]
    finally:
        reopened.close()


def test_a_killed_writer_loses_no_recorded_interval(tmp_path: Path) -> None:
    """SIGKILL right after record() returns: the interval is in the file (WAL) and reads back."""
    path = tmp_path / "s.db"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.test_store_chunks import record
store = EmbeddedStore({str(path)!r}, tiers={SMALL_TIERS!r})
record(store, [float(t) for t in range(0, 300, 15)])
os.kill(os.getpid(), signal.SIGKILL)
"""
    completed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert completed.returncode == -9, completed.stderr.decode()
    assert os.path.exists(str(path) + "-wal")
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        assert points(store, "gpu_utilization_percent", 120, 285) == [util_at(t) for t in range(120, 300, 15)]
        assert store.latest_time() == 285.0
    finally:
        store.close()


def test_retention_drops_whole_chunks_and_rollups_within_resolution(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        times = [float(t) for t in range(0, 1215, 15)]  # 0 .. 1200
        record(store, times)
        connection = store._reader()
        fine = connection.execute("SELECT min(start) FROM chunks WHERE tier = 15").fetchone()[0]
        coarse = connection.execute("SELECT min(start), max(start + points * 60) FROM chunks WHERE tier = 60").fetchone()
        # 15 s kept 4 min after 1200 (whole 2-min chunks ending after 960); 1 min kept 10 min (4-min chunks)
        assert fine == 960
        assert coarse[0] == 480 and coarse[1] == 1200
        # each minute of the 1 min tier is the mean of its four 15 s points; counters take the max
        (util, energy) = store.query_range(
            RangeQuery("workload", "uid-train", ("gpu_utilization_percent", "gpu_energy_joules"), 600, 900, 60)
        )
        means = [sum(util_at(m + k) for k in (0, 15, 30, 45)) / 4 for m in range(600, 960, 60)]
        # within the roll-ups' declared resolution (codec.ROLLUP_QUANTUM): 0.1 %, 100 J
        assert [v for _, v in util.points] == pytest.approx(means, abs=0.05 + 1e-9)
        assert [v for _, v in energy.points] == pytest.approx([10.0 * (m + 45) for m in range(600, 960, 60)], abs=50)
    finally:
        store.close()


def test_bulk_load_writes_the_chunks_compaction_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    count, ticks = 5, 44  # five series, 44 intervals of 15 s: five and a half fine spans, two whole coarse spans
    values = rng.integers(0, 10_000, size=(count, METRIC_COUNT, ticks)).astype(np.float64) / 100
    values[1, 3, 5:9] = np.nan
    values[2] = np.nan
    values[3, :, 12] = np.nan
    compacted = EmbeddedStore(tmp_path / "a.db", tiers=SMALL_TIERS)
    bulk = EmbeddedStore(tmp_path / "b.db", tiers=SMALL_TIERS)
    try:
        ids = [compacted.register_series("node", f"n{i}", {"node": f"n{i}"}) for i in range(count)]
        assert [bulk.register_series("node", f"n{i}", {"node": f"n{i}"}) for i in range(count)] == ids
        connection = compacted._writer
        for k in range(ticks):
            connection.execute("BEGIN")
            compacted.write_head(15 * k, np.array(ids, dtype=np.int64), quantize(values[:, :, k]))
            compacted._set_meta("latest_time", 15.0 * k)
            connection.execute("COMMIT")
        compacted.compact(everything=True)
        bulk.load_history(ids, 0, values)
        bulk._writer.execute("BEGIN")
        bulk._chunks.apply_retention(15.0 * (ticks - 1))  # what compaction's round did in the other store
        bulk._writer.execute("COMMIT")
        query = (
            "SELECT tier, series_id, start, points, data FROM chunks JOIN payloads ON payloads.id = chunks.payload "
            "ORDER BY tier, series_id, start"
        )
        assert compacted._reader().execute(query).fetchall() == bulk._reader().execute(query).fetchall()
        got = bulk.query_range(RangeQuery("node", "n1", ("gpu_memory_utilization_percent",), 0, 15.0 * (ticks - 1), 15))
        assert [v for _, v in got[0].points][-8:] == [None if np.isnan(v) else v for v in values[1, 3]][-8:]
    finally:
        compacted.close()
        bulk.close()


def test_codec_round_trip_keeps_values_and_gaps() -> None:
    rng = np.random.default_rng(11)
    values = rng.normal(0, 1e6, size=(6, METRIC_COUNT, 240)).round(3)
    values[0] = 42.0  # constant
    values[1, :, ::7] = np.nan  # scattered gaps
    values[2] = np.nan  # nothing at all
    values[3, 6] = np.cumsum(np.abs(rng.normal(300, 50, 240)))  # a counter
    values[4, :, :100] = np.nan  # starts late
    values[5, 12] = 1 / 7  # GPU units of a MIG slice: kept to 1e-6
    quantized = quantize(values.transpose(0, 2, 1)).transpose(0, 2, 1)
    for index, data in enumerate(encode_chunks(np.ascontiguousarray(quantized))):
        decoded = decode_chunk(data, 240)
        assert np.array_equal(decoded, quantized[index])
        subset = np.array([6, 12], dtype=np.intp)
        assert np.array_equal(decode_chunk(data, 240, subset), quantized[index][subset])
    back = dequantize(quantized.transpose(0, 2, 1)).transpose(0, 2, 1)
    assert np.array_equal(np.isnan(back), np.isnan(values))
    # each metric within half its resolution (0.5 byte, 0.5 mW, 0.5e-6 % ...)
    error = np.nanmax(np.abs(back - values), axis=(0, 2))
    assert (error <= 0.5 / RESOLUTION + 1e-9).all()
    assert back[5, 12, 0] == pytest.approx(1 / 7, abs=5e-7)
    assert (quantized == MISSING).sum() == np.isnan(values).sum()


def test_short_decimals_read_back_as_the_same_float() -> None:
    values = np.array([[2.1, 12.345, 37.5, 1e9 + 0.5, 0.001, 99.99]])
    columns = np.array([14, 4, 0, 1, 18, 3])  # cores, watts, percent, bytes, bytes, percent
    row = np.full((1, METRIC_COUNT), np.nan)
    row[0, columns] = values[0]
    back = dequantize(quantize(row))
    assert back[0, 14] == 2.1 and back[0, 4] == 12.345 and back[0, 0] == 37.5 and back[0, 3] == 99.99
    assert back[0, 1] == 1e9  # bytes are kept to 1 byte


def test_schema_1_store_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    connection.execute("PRAGMA user_version = 1")
    connection.execute("CREATE TABLE points_15 (series_id INTEGER, t INTEGER, m0 REAL, PRIMARY KEY (series_id, t))")
    connection.execute("INSERT INTO points_15 VALUES (1, 1005, 50.0)")
    connection.commit()
    connection.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="schema version 1") as caught:
        EmbeddedStore(path)
    assert "point --store at a new path" in str(caught.value)
    assert path.read_bytes() == before


def test_reads_during_compaction_see_every_interval_once(tmp_path: Path) -> None:
    """A reader thread queries while record() compacts: each answer has every interval recorded so far."""
    import threading

    store = EmbeddedStore(tmp_path / "s.db", tiers=["15s:1h", "1m:1d"])  # 30-minute spans, nothing dropped
    record(store, [float(t) for t in range(0, 1800, 15)])
    failures: list[str] = []
    done = threading.Event()

    def read() -> None:
        reads = 0
        while not done.is_set() or reads == 0:
            (series,) = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 1785, 15))
            values = [value for _, value in series.points]
            if values != [util_at(t) for t in range(0, 1800, 15)]:
                failures.append(f"read {reads}: {sum(v is None for v in values)} missing")
            reads += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        record(store, [float(t) for t in range(1800, 2100, 15)])  # the first span is compacted meanwhile
    finally:
        done.set()
        reader.join(60)
    try:
        assert layout(store)[0] >= 1
        assert failures == []
    finally:
        store.close()


def test_head_block_round_trip() -> None:
    from gpuwm.store.codec import BLOCK, decode_head, encode_head

    rng = np.random.default_rng(5)
    block = rng.integers(-(2**40), 2**40, size=(BLOCK, METRIC_COUNT), dtype=np.int64)
    block[::3, 4] = MISSING
    block[7] = MISSING
    block[9, 1] = 2**58  # the largest value a metric may hold
    assert np.array_equal(decode_head(encode_head(block)), block)
    small = np.full((BLOCK, METRIC_COUNT), MISSING, dtype=np.int64)
    small[0, 0] = 0
    assert np.array_equal(decode_head(encode_head(small)), small)


def test_a_series_that_starts_inside_the_chunk_is_divided_by_its_gcd() -> None:
    """A roll-up that starts late (its first points missing, filled with 0) is stored in its own steps.

    Judged on its first 16 differences alone, such a row (all 0 there) would keep divisor 1: 0.1 % steps
    written in units of 1e-6 %, three bytes a point where one does.
    """
    rng = np.random.default_rng(5)
    steps = rng.integers(0, 1000, size=240).astype(np.int64) * 100_000  # 0.1 % steps, in 1e-6 %
    late = np.full((1, METRIC_COUNT, 240), MISSING, dtype=np.int64)
    late[0, 0, 100:] = steps[100:]
    early = np.full((1, METRIC_COUNT, 240), MISSING, dtype=np.int64)
    early[0, 0, :140] = steps[100:]
    late_data, early_data = encode_chunks(late)[0], encode_chunks(early)[0]
    assert np.array_equal(decode_chunk(late_data, 240), late[0])
    assert np.array_equal(decode_chunk(early_data, 240), early[0])
    # the divisor written for the late row is the gcd of its differences, not 1
    raw = zlib.decompress(late_data)
    divisors = np.frombuffer(raw, dtype="<i8", count=METRIC_COUNT, offset=(METRIC_COUNT * 240 + 7) // 8)
    assert divisors[0] == 100_000
    # so it costs about what the same points cost at the chunk's start
    assert len(late_data) <= len(early_data) + 16


def test_blocks_encode_and_roll_up_series_by_series_in_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction encodes and rolls a block up `ENCODE_SERIES_PER_PASS` series at a time (its temporaries
    were ~11 MiB at once): the same bytes and roll-ups as one pass over the whole block."""
    from gpuwm.store import codec

    rng = np.random.default_rng(5)
    values = rng.normal(0, 1e6, size=(64, METRIC_COUNT, 240)).round(3)
    values[:, :, ::9] = np.nan  # gaps
    values[3] = np.nan  # a series with no point: no chunk for it
    values[7, 6] = np.cumsum(np.abs(rng.normal(300, 50, 240)))  # a counter (second differences, a max roll-up)
    values[20:40, 2:5] = np.nan  # some series without some parts
    quantized = np.ascontiguousarray(quantize(values.transpose(0, 2, 1)).transpose(0, 2, 1))
    in_passes = codec.encode_parts(quantized), codec.roll_up(quantized, 20)
    assert codec.ENCODE_SERIES_PER_PASS < 64
    monkeypatch.setattr(codec, "ENCODE_SERIES_PER_PASS", 1_000)
    whole = codec.encode_parts(quantized), codec.roll_up(quantized, 20)
    assert in_passes[0] == whole[0]
    assert in_passes[0][3] == [None] * len(in_passes[0][3])
    assert np.array_equal(in_passes[1], whole[1])
