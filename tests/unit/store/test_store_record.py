"""EmbeddedStore.record's write path against the one it replaced: the same file contents, interval after interval.

The old path (kept here) built the rows afresh each interval and dumped every figures object to
JSON to see whether it changed; the new one keeps each workload's structure (RowBuilder) and
skips the JSON of the very object written last time. Both write the same simulated intervals
(workloads arriving and ending, settled ones handed back as the same object, an agent outage,
a lost GPU, pod stats); every series' head points, its labels and every latest-figures row must
be the same. A rolled-back interval leaves the store consistent.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.model import LatestSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.sim.scenario import default_faults
from gpuwm.sim.simulator import SimConfig, Simulator
from gpuwm.store.codec import MISSING, decode_head, quantize
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.rows import RowBuilder

from .pagecache import page_cache_mib
from .store_data import cluster, project, sample, workload


class _OldPathStore(EmbeddedStore):
    """The write path before RowBuilder and the identity check (series in first-seen order, every JSON dumped).

    It keeps its own hashes of the latest rows' JSON (never forgotten, every row dumped each interval),
    apart from the store's `LatestWriter`, so that the comparison does not lean on the code it checks.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._old_json: dict[str, int] = {}

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
        rows = RowBuilder().build(samples, workloads, projects, cluster, pod_stats, known=self._series_ids)
        connection = self._writer
        connection.execute("BEGIN IMMEDIATE")
        step = self.tiers[0].step_seconds
        ids = np.array([self._series_id(kind, key, rows.labels.get((kind, key))) for kind, key in rows.keys])
        self.write_head(int(math.floor(at / step) * step), ids, quantize(rows.values))
        self._written.mark(ids)  # what write_points notes: these series hold head points
        for table, entries in (
            ("latest_workloads", [(w.uid, (w.uid, w.namespace, w.name, w.project, at), w) for w in workloads]),
            ("latest_projects", [(p.name, (p.name, at), p) for p in projects]),
            ("latest_cluster", [("1", (1, at), cluster)]),
        ):
            changed = []
            for key, columns, figures in entries:
                dumped = figures.model_dump_json()
                if self._old_json.get(f"{table}:{key}") != hash(dumped.encode()):
                    self._old_json[f"{table}:{key}"] = hash(dumped.encode())
                    changed.append((*columns, dumped))
            if changed:
                placeholders = ", ".join("?" * len(changed[0]))
                connection.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({placeholders})", changed)
        self._set_meta("latest_time", at)
        if self._get_meta("earliest_time") is None:
            self._set_meta("earliest_time", at)
        if compact:
            self._compact_slice(at)
        connection.execute("COMMIT")


def _contents(path: Path) -> tuple[dict[tuple[str, str, int], list[int]], dict[tuple[str, str], object], list[tuple[object, ...]]]:
    """Head points by (kind, key, t), labels by series, and every latest-figures row of a store file."""
    connection = sqlite3.connect(path)
    try:
        series = {row[0]: row[1:] for row in connection.execute("SELECT id, kind, key, labels FROM series")}
        points: dict[tuple[str, str, int], list[int]] = {}
        for block, t, data in connection.execute("SELECT block, t, data FROM head"):
            grid = decode_head(data)
            for offset in range(len(grid)):
                found = series.get(block * len(grid) + offset)
                if found is not None and (grid[offset] != MISSING).any():
                    points[(str(found[0]), str(found[1]), int(t))] = grid[offset].tolist()
        labels = {(str(kind), str(key)): json.loads(str(text)) for kind, key, text in series.values()}
        latest = [
            (table, *row)
            for table in ("latest_workloads", "latest_projects", "latest_cluster")
            for row in connection.execute(f"SELECT * FROM {table} ORDER BY 1")
        ]
        return points, labels, latest
    finally:
        connection.close()


def test_simulated_run_writes_what_the_old_path_wrote(tmp_path: Path) -> None:
    start = 1_000_800.0  # on the hour: the 15 minutes stay in the head
    steps = 60
    nodes = [f"sim-node-{index:03d}" for index in range(12)]
    outages, losses = default_faults(nodes, start, steps * 15.0)
    simulator = Simulator(SimConfig(seed=5, nodes=12, gpus_per_node=8, interval_seconds=15.0, start_time=start,
                                    outages=outages, gpu_losses=losses))
    engine = Engine(EngineConfig(interval_seconds=15.0, idle_threshold_percent=1.0))
    new = EmbeddedStore(tmp_path / "new.db")
    old = _OldPathStore(tmp_path / "old.db")
    reported: tuple[list[WorkloadFigures], list[ProjectFigures], ClusterFigures] | None = None
    try:
        for index in range(steps):
            step = simulator.step()
            for event in step.events:
                engine.observe(event)
            for each in step.samples:
                engine.observe_sample(each)
            if reported is None or index % 3:
                reported = engine.report(step.t)
            # every third interval the same objects again, as the engine hands back settled workloads'
            workloads, projects, figures = reported
            for store in (new, old):
                store.record(step.t, step.samples, workloads, projects, figures, step.pod_stats)
        # ended workloads' figures are kept to be recognised when they come again
        assert any(key.startswith("latest_workloads:") for key in new._latest.objects)
        # each series' (kind, key) is one tuple, the row builder's, kept as the key of its id too
        builders = {key: key for key in new._rows._keys}
        assert new._series_ids and all(builders[key] is key for key in new._series_ids)
    finally:
        new.close()
        old.close()
    new_points, new_labels, new_latest = _contents(tmp_path / "new.db")
    old_points, old_labels, old_latest = _contents(tmp_path / "old.db")
    assert new_points == old_points and len(new_points) > 1000
    assert new_labels == old_labels
    assert new_latest == old_latest


def test_rolled_back_interval_leaves_a_consistent_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Series created by a failed interval are gone with it; the next interval creates them again, labelled."""
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    first = workload("a", [("gpu-0", 1.0, 40.0)])
    store.record(1000.0, [sample(1000.0, "gpu-0")], [first], [project("alpha", [first])], cluster(1))
    second = workload("b", [("gpu-1", 1.0, 60.0)], project="beta")

    def fail(at: float) -> None:
        raise RuntimeError("disk full")

    with monkeypatch.context() as patched:
        patched.setattr(store, "_compact_slice", fail)
        with pytest.raises(RuntimeError):
            store.record(1015.0, [sample(1015.0, "gpu-0"), sample(1015.0, "gpu-1")], [first, second],
                         [project("alpha", [first]), project("beta", [second])], cluster(2))
    store.record(1030.0, [sample(1030.0, "gpu-0"), sample(1030.0, "gpu-1")], [first, second],
                 [project("alpha", [first]), project("beta", [second])], cluster(2))
    try:
        assert store.workload("team-a", "b") is not None
        rows = store._writer.execute("SELECT kind, key, labels FROM series WHERE key LIKE '%uid-b%'").fetchall()
        assert {kind for kind, _, _ in rows} == {"workload", "workload_node", "pod", "gpu"}
        assert all(json.loads(labels).get("workload") == "b" for _, _, labels in rows)
        ids = {series_id for (series_id,) in store._writer.execute("SELECT id FROM series")}
        assert set(store._series_ids.values()) == ids
    finally:
        store.close()


def test_reopened_store_keys_its_series_by_the_row_builders_tuples(tmp_path: Path) -> None:
    """After a restart the series map read from the file is re-keyed by the row builder's tuples, once: the same
    ids, no second copy of each (kind, key), and series not written since keep theirs."""
    first = workload("a", [("gpu-0", 1.0, 40.0)])
    second = workload("b", [("gpu-1", 1.0, 60.0)], project="beta")
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    try:
        store.record(1000.0, [sample(1000.0, "gpu-0"), sample(1000.0, "gpu-1")], [first, second],
                     [project("alpha", [first]), project("beta", [second])], cluster(2))
        before = dict(store._series_ids)
    finally:
        store.close()
    reopened = EmbeddedStore(tmp_path / "gpuwm.db")
    try:
        assert reopened._series_ids == before
        from_file = {key: key for key in reopened._series_ids}
        reopened.record(1015.0, [sample(1015.0, "gpu-0")], [first], [project("alpha", [first])], cluster(1))
        assert reopened._series_ids == before  # nothing new, nothing lost: b's series keep their ids
        builders = {key: key for key in reopened._rows._keys}
        held = [key for key in reopened._series_ids if key in builders]
        assert held and len(held) < len(before)
        assert all(builders[key] is key for key in held)  # a's series: the row builder's tuples
        assert all(from_file[key] is key for key in reopened._series_ids if key not in builders)  # b's: as read
        points = reopened._writer.execute("SELECT count(*) FROM head WHERE t = 1005").fetchone()[0]
        assert points > 0  # the interval was written under the ids found
    finally:
        reopened.close()


def test_latest_json_cache_forgets_workloads_no_longer_reported(tmp_path: Path) -> None:
    """The cache of written JSON holds what the last interval reported, not every workload ever seen.

    The row of a workload the controller forgot stays readable (the store's own retention drops it);
    if it is reported again, it is written again.
    """
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    first = workload("a", [("gpu-0", 1.0, 40.0)])
    ended = workload("b", [("gpu-1", 1.0, 0.0)], phase="Succeeded", end_time=990.0)
    try:
        store.record(1000.0, [sample(1000.0, "gpu-0")], [first, ended], [project("alpha", [first, ended])], cluster(2))
        assert {"latest_workloads:uid-a", "latest_workloads:uid-b"} <= set(store._latest.digests)
        store.record(1015.0, [sample(1015.0, "gpu-0")], [first], [project("alpha", [first])], cluster(2))
        assert "latest_workloads:uid-a" in store._latest.digests
        assert "latest_workloads:uid-b" not in store._latest.digests
        assert store.workload("team-a", "b") is not None  # its row is still there
        again = workload("b", [("gpu-1", 1.0, 0.0)], phase="Succeeded", end_time=990.0, energy_joules=5.0)
        store.record(1030.0, [sample(1030.0, "gpu-0")], [first, again], [project("alpha", [first, again])], cluster(2))
        found = store.workload("team-a", "b")
        assert found is not None and found.energy_joules == 5.0
        assert "latest_workloads:uid-b" in store._latest.digests
    finally:
        store.close()


def _page_cache_mib(connection: sqlite3.Connection) -> float:
    found = page_cache_mib(connection)
    if found is None:
        pytest.skip("sqlite3_db_status is not reachable from this Python's _sqlite3 module")
    return found


@pytest.mark.parametrize("reopened", [False, True])
def test_writer_page_cache_stays_within_its_size(tmp_path: Path, reopened: bool) -> None:
    """The writer's page cache (controller RSS) is capped at WRITER_CACHE_KIB, for a new file too.

    A new file's `page_size` pragma used to come after the cache size was set, which left the cap
    unenforced: the cache kept every page written.
    """
    from gpuwm.store.connections import WRITER_CACHE_KIB

    path = tmp_path / "gpuwm.db"
    if reopened:
        EmbeddedStore(path).close()
    store = EmbeddedStore(path)
    try:
        writer = store._writer
        writer.execute("CREATE TABLE scratch (id INTEGER PRIMARY KEY, payload BLOB)")
        rng = np.random.default_rng(1)
        for batch in range(40):  # ~2.5x the cache, in transactions as the store writes
            writer.execute("BEGIN IMMEDIATE")
            writer.executemany("INSERT INTO scratch VALUES (?, ?)",
                               ((batch * 1000 + row, rng.bytes(1000)) for row in range(1000)))
            writer.execute("COMMIT")
        assert path.stat().st_size + (tmp_path / "gpuwm.db-wal").stat().st_size > 2 * WRITER_CACHE_KIB * 1024
        cache_mib = _page_cache_mib(writer)
        assert cache_mib <= 1.2 * WRITER_CACHE_KIB / 1024, f"writer page cache {cache_mib:.1f} MiB"
    finally:
        store.close()


def test_latest_figures_of_more_workloads_than_one_write_holds_are_all_kept(tmp_path: Path) -> None:
    """The latest-figures rows go in bounded batches (`_ROWS_PER_WRITE`): every one still lands, once."""
    from gpuwm.store.latest import _ROWS_PER_WRITE

    count = 2 * _ROWS_PER_WRITE + 7
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    try:
        for interval, utilization in enumerate((40.0, 70.0)):
            workloads = [workload(f"w{index:04d}", [(f"GPU-{index}", 1.0, utilization)], node=f"node-{index % 9}")
                         for index in range(count)]
            samples = [sample(1000.0 + 15 * interval, f"GPU-{index}", node=f"node-{index % 9}")
                       for index in range(count)]
            store.record(1000.0 + 15 * interval, samples, workloads, [project("alpha", workloads)], cluster(count))
        stored = store.workloads()
        assert len(stored) == count
        assert {figures.name for figures in stored} == {f"w{index:04d}" for index in range(count)}
        assert {figures.gpus[0].utilization_percent for figures in stored} == {70.0}
    finally:
        store.close()


def test_float_rows_go_into_the_head_as_their_quantized_values_across_slices(tmp_path: Path) -> None:
    """write_head fills, quantizes and encodes a group of blocks at a time: the blocks hold what one quantize
    of all the rows gives, every row at its series' place."""
    from gpuwm.store import embedded
    from gpuwm.store.codec import BLOCK, METRIC_COUNT

    rng = np.random.default_rng(7)
    count = 3 * embedded._BLOCKS_AT_ONCE * BLOCK + 11  # more than two groups of blocks, the last one short
    ids = rng.permutation(np.arange(1, 2 * count, dtype=np.int64))[:count]  # scattered over blocks, unordered
    values = rng.normal(50.0, 40.0, size=(count, METRIC_COUNT)) * rng.choice([1e-3, 1.0, 1e9], size=(count, 1))
    values[rng.random(values.shape) < 0.1] = np.nan
    values[0, 0] = np.inf
    heads = []
    for name, given in (("floats", values), ("ints", quantize(values))):
        store = EmbeddedStore(tmp_path / f"{name}.db")
        try:
            store.write_head(1500, ids, given)
            heads.append(store._writer.execute("SELECT block, t, data FROM head ORDER BY block").fetchall())
        finally:
            store.close()
    assert len(heads[0]) > 1
    assert [(block, t) for block, t, _ in heads[0]] == [(block, t) for block, t, _ in heads[1]]
    for (_, _, floats), (_, _, ints) in zip(heads[0], heads[1], strict=True):
        np.testing.assert_array_equal(decode_head(floats), decode_head(ints))
    stored = {block: decode_head(data) for block, _, data in heads[0]}  # every row read back at its series' place
    read_back = np.array([stored[int(each) // BLOCK][int(each) % BLOCK] for each in ids])
    np.testing.assert_array_equal(read_back, quantize(values))


def test_a_second_write_into_an_interval_keeps_the_rows_of_series_absent_from_it_in_every_group(tmp_path: Path) -> None:
    """Series written into an interval before and absent from a second write into it keep their rows, in each
    group of blocks write_head fills; the series written again take their new rows."""
    from gpuwm.store import embedded
    from gpuwm.store.codec import BLOCK, METRIC_COUNT

    rng = np.random.default_rng(11)
    count = 2 * embedded._BLOCKS_AT_ONCE * BLOCK + 5  # three groups of blocks
    ids = np.arange(1, count + 1, dtype=np.int64)
    first = rng.normal(50.0, 10.0, size=(count, METRIC_COUNT))
    again = rng.permutation(count)[: count // 3]  # a third of the series, scattered over every group
    second = rng.normal(500.0, 10.0, size=(len(again), METRIC_COUNT))
    store = EmbeddedStore(tmp_path / "again.db")
    try:
        store.write_head(1500, ids, first)
        store.write_head(1500, ids[again], second)
        stored = {block: decode_head(data) for block, data in
                  store._writer.execute("SELECT block, data FROM head WHERE t = 1500").fetchall()}
    finally:
        store.close()
    expected = quantize(first)
    expected[again] = quantize(second)
    read_back = np.array([stored[int(each) // BLOCK][int(each) % BLOCK] for each in ids])
    np.testing.assert_array_equal(read_back, expected)
