"""`record(..., compact=False)` then `compact_slice`: the controller's order, which compacts once the
interval's figures are freed. The file ends up the same as with the slice inside `record`, and a
failed slice leaves its blocks for the next one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.model import PodStatsSample
from gpuwm.store import RangeQuery, compaction
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.schema import PART_COLUMNS

from .store_data import cluster, project, sample, workload

HOUR = 3600.0
START = 1_790_000_000 - 1_790_000_000 % 3600 - 300.0  # five minutes before an hour: the run crosses it


def _interval(store: EmbeddedStore, t: float, *, compact: bool) -> None:
    jobs = [workload(f"job-{k}", [(f"gpu-{k}", 1.0, float((t * (k + 3)) % 100))], energy_joules=t + k,
                     idle_seconds=t % 97) for k in range(70)]  # 70 workloads: over one block of series
    samples = [sample(t, f"gpu-{k}", sm=float((t * (k + 3)) % 100)) for k in range(70)]
    stats = [PodStatsSample(t=t, node="node-a", namespace="team-a", pod="job-0-0", pod_uid="pod-uid-job-0",
                            cpu_usage_cores=1.5)]
    store.record(t, samples, jobs, [project("alpha", jobs)], cluster(70), stats, compact=compact)


def _contents(store: EmbeddedStore) -> tuple[object, ...]:
    connection = store._writer
    return (
        connection.execute(f"SELECT tier, series_id, start, points, {', '.join(PART_COLUMNS.values())} FROM chunks "
                           "ORDER BY tier, series_id, start").fetchall(),
        connection.execute("SELECT id, hash, refs, data FROM payloads ORDER BY id").fetchall(),
        connection.execute("SELECT block, t, data FROM head ORDER BY block, t").fetchall(),
        connection.execute("SELECT key, value FROM meta ORDER BY key").fetchall(),
    )


def test_a_slice_apart_writes_what_the_slice_in_record_writes(tmp_path: Path) -> None:
    inline, apart = EmbeddedStore(tmp_path / "inline.db"), EmbeddedStore(tmp_path / "apart.db")
    try:
        for step in range(40):  # 10 minutes: the hour that closes is compacted slice by slice after it
            t = START + 15 * step
            _interval(inline, t, compact=True)
            _interval(apart, t, compact=False)
            if step == 25:  # the hour closed a few intervals ago: nothing compacted without the slices
                assert apart.compacted_blocks == 0 and inline.compacted_blocks > 0
                for done in range(20, 26):  # the slices the controller would have run (one per interval)
                    apart.compact_slice(START + 15 * done)
            elif step > 25:
                apart.compact_slice(t)
        assert inline.compacted_blocks == apart.compacted_blocks > 0
        assert _contents(apart) == _contents(inline)
    finally:
        inline.close()
        apart.close()


def test_a_failed_slice_leaves_its_blocks_to_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference, store = EmbeddedStore(tmp_path / "reference.db"), EmbeddedStore(tmp_path / "store.db")
    try:
        for step in range(21):  # into the next hour (it starts at step 20)
            _interval(reference, START + 15 * step, compact=False)
            _interval(store, START + 15 * step, compact=False)
        calls = 0
        real_compact_block = store._chunks.compact_block

        def fail_second(block: int, until: int) -> None:  # the first block goes into the file, then it fails
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError("disk full")
            return real_compact_block(block, until)

        with monkeypatch.context() as patched:
            patched.setattr(store._chunks, "compact_block", fail_second)
            patched.setattr(compaction, "_COMPACTION_SHARE", 0.0)  # every block in one slice: it fails inside
            with pytest.raises(OSError):
                store.compact_slice(START + 15 * 21)
        assert calls == 2
        # the rolled-back slice's blocks are still in the head; the next slices list them again
        reference.compact_slice(START + 15 * 20)  # the slice of step 20, which the store's failed slice was
        for step in range(21, 200):
            t = START + 15 * step
            _interval(reference, t, compact=False)
            _interval(store, t, compact=False)
            reference.compact_slice(t)
            store.compact_slice(t)
        until = int(START // HOUR * HOUR + HOUR)
        left = store._writer.execute("SELECT count(*) FROM head WHERE t < ?", (until,)).fetchone()[0]
        assert left == 0
        assert _contents(store) == _contents(reference)
    finally:
        reference.close()
        store.close()


@pytest.mark.parametrize("share", [compaction._COMPACTION_SHARE, 0.1])
def test_a_round_is_spread_over_its_share_of_the_next_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: float
) -> None:
    """A closed span's blocks go a few per slice, evenly over `share` of the next span's intervals: at most
    ceil(blocks / rounds) a slice (half the CPU a slice of what half a span took), done within the share."""
    monkeypatch.setattr(compaction, "_COMPACTION_SHARE", share)
    store = EmbeddedStore(tmp_path / "spread.db", tiers=("15s:20m", "1m:1d"))  # 10-minute spans of 40 points
    try:
        span = store.spans[0].span_seconds
        assert store.spans[0].points == 40
        first = START - START % span + span  # a span boundary
        for step in range(-40, 0):  # a whole span of head rows, then the next span's intervals compact it
            _interval(store, first + 15 * step, compact=False)
        blocks = len(store._head_blocks)
        assert blocks >= 4
        rounds = max(1, int(40 * share))
        per_slice: list[int] = []
        for step in range(40):
            _interval(store, first + 15 * step, compact=False)
            before = store.compacted_blocks
            store.compact_slice(first + 15 * step)
            per_slice.append(store.compacted_blocks - before)
        assert sum(per_slice) == blocks
        assert max(per_slice) == -(-blocks // rounds)
        assert max(step for step, done in enumerate(per_slice) if done) < rounds
    finally:
        store.close()


def _answers(store: EmbeddedStore, start: float) -> list[list[tuple[float, float | None]]]:
    """Node, workload and GPU series over the closed span's end, in 60 s cells that straddle it (a point counted
    twice there would weigh double in its cell's mean)."""
    queries = [RangeQuery("node", "node-a", ("gpu_utilization_percent", "gpu_power_watts"), start, start + 600, 60),
               RangeQuery("workload", "uid-job-5", ("gpu_utilization_percent", "gpu_energy_joules"), start, start + 600, 60),
               RangeQuery("cluster", "", ("gpu_utilization_percent",), start, start + 600, 60, by="node")]
    return [series.points for query in queries for series in store.query_range(query)]


def test_a_round_keeps_the_head_rows_until_its_end_and_readers_count_each_point_once(tmp_path: Path) -> None:
    """Blocks compacted early in a round keep their head rows (deleted together at the round's end, a range of
    rowids, not a page for each interval of each block): queries read each point once all along."""
    store = EmbeddedStore(tmp_path / "rounds.db", tiers=("15s:20m", "1m:1d"))  # 10-minute spans of 40 points
    at_once = EmbeddedStore(tmp_path / "at-once.db", tiers=("15s:20m", "1m:1d"))  # the same, compacted in one go
    try:
        span = store.spans[0].span_seconds
        boundary = START - START % span + span
        for step in range(-40, 1):  # a closed span, and the next one's first interval (no slices yet)
            _interval(store, boundary + 15 * step, compact=False)
            _interval(at_once, boundary + 15 * step, compact=False)
        asked_from = boundary - 330.0  # cells [boundary - 30, boundary + 30) straddle the span's end
        expected = _answers(store, asked_from)  # the head alone
        store.compact_slice(boundary)  # the round's first slice: one block in chunks, its rows still in the head
        assert 0 < store.compacted_blocks < len(store._head_blocks)
        with_chunks = store._reader().execute("SELECT DISTINCT series_id / 64 FROM chunks WHERE tier = 15").fetchall()
        left = store._reader().execute("SELECT count(DISTINCT block) FROM head WHERE t < ?", (boundary,)).fetchone()
        assert len(with_chunks) == 1 and left == (len(store._head_blocks),)
        assert _answers(store, asked_from) == expected
        step = 1
        while store._reader().execute("SELECT 1 FROM head WHERE t < ? LIMIT 1", (boundary,)).fetchone() is not None:
            assert step < 40, "the round did not end within the span"
            t = boundary + 15 * step
            _interval(store, t, compact=False)
            _interval(at_once, t, compact=False)
            store.compact_slice(t)
            step += 1
        assert store._get_meta("compacted_until") == boundary
        assert store._reader().execute("SELECT min(t) FROM head").fetchone() == (boundary,)  # the open span's stay
        at_once.compact()
        assert _answers(store, asked_from) == _answers(at_once, asked_from)
    finally:
        store.close()
        at_once.close()


def test_a_row_written_late_into_an_older_interval_does_not_hold_the_round_up(tmp_path: Path) -> None:
    """A second write into an older interval, after newer ones (a clock set back), gives its rows rowids above
    the newer rows': the deletion by rowid range misses them, and the (block, t) index finds them."""
    store = EmbeddedStore(tmp_path / "late.db", tiers=("15s:20m", "1m:1d"))
    try:
        span = store.spans[0].span_seconds
        boundary = START - START % span + span
        for step in range(-40, 1):
            _interval(store, boundary + 15 * step, compact=False)
        _interval(store, boundary - 15 * 39, compact=False)  # the span's second interval again, written last
        late = store._reader().execute("SELECT max(rowid) FROM head WHERE t = ?", (boundary - 15 * 39,)).fetchone()
        newest = store._reader().execute("SELECT min(rowid) FROM head WHERE t = ?", (boundary,)).fetchone()
        assert late[0] > newest[0]
        for step in range(1, 40):
            t = boundary + 15 * step
            _interval(store, t, compact=False)
            store.compact_slice(t)
            if store._get_meta("compacted_until") == boundary:
                break
        assert store._get_meta("compacted_until") == boundary
        assert store._reader().execute("SELECT count(*) FROM head WHERE t < ?", (boundary,)).fetchone() == (0,)
    finally:
        store.close()
