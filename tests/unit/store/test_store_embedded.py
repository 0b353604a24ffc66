"""The embedded SQLite store: round trips, roll-ups and retention with exact values, refusal of foreign files."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.store import QueryError, RangeQuery, StoreError, open_store
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.tiers import parse_tiers

from .store_data import GIB, cluster, project, sample, workload


def _record_two_gpu_job(store: EmbeddedStore, times: list[float]) -> None:
    """Job `train` on gpu-0 and gpu-1; utilisation at time t is (t % 100) and 2 * that, capped."""
    for t in times:
        u0 = t % 100
        u1 = min(100.0, 2 * u0)
        job = workload("train", [("gpu-0", 1.0, u0), ("gpu-1", 1.0, u1)], energy_joules=t, idle_seconds=0.0)
        store.record(
            t,
            [
                sample(t, "gpu-0", sm=u0, used_gib=10),
                sample(t, "gpu-1", sm=u1, used_gib=30),
                sample(t, "gpu-2", sm=0),
            ],
            [job],
            [project("alpha", [job], energy_joules=t)],
            cluster(3),
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    opened = EmbeddedStore(tmp_path / "gpuwm.db", tiers=["15s:2d", "5m:30d"])
    yield opened
    opened.close()


def test_workload_series_round_trip_at_base_step(store: EmbeddedStore) -> None:
    _record_two_gpu_job(store, [1005.0, 1020.0, 1035.0])
    series = store.query_range(
        RangeQuery(
            "workload", "uid-train", ("gpu_utilization_percent", "gpu_memory_used_bytes"), 1005, 1050, 15
        )
    )
    util, memory = series
    assert util.metric == "gpu_utilization_percent"
    assert util.labels["workload"] == "train" and util.labels["namespace"] == "team-a"
    # stored at 15 s buckets 1005 -> 1005 (=67*15), 1020, 1035; unit-weighted mean of the two GPUs
    assert util.points == [(1005, 7.5), (1020, 30.0), (1035, 52.5), (1050, None)]
    assert memory.points[0] == (1005, 40 * GIB)
    assert memory.points[3] == (1050, None)


def test_breakdown_by_gpu_pod_and_node(store: EmbeddedStore) -> None:
    _record_two_gpu_job(store, [1005.0, 1020.0])
    by_gpu = store.query_range(
        RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 1005, 1020, 15, "gpu")
    )
    assert {s.labels["uuid"]: [v for _, v in s.points] for s in by_gpu} == {
        "gpu-0": [5.0, 20.0],
        "gpu-1": [10.0, 40.0],
    }
    assert all(s.labels["pod"] == "train-0" for s in by_gpu)
    by_pod = store.query_range(RangeQuery("workload", "uid-train", ("gpu_allocated",), 1005, 1020, 15, "pod"))
    assert [(s.labels["pod"], [v for _, v in s.points]) for s in by_pod] == [("train-0", [2.0, 2.0])]
    by_node = store.query_range(
        RangeQuery("cluster", "", ("gpu_allocated", "gpu_utilization_percent"), 1005, 1005, 15, "node")
    )
    assert [(s.metric, s.labels, s.points) for s in by_node] == [
        ("gpu_allocated", {"node": "node-a"}, [(1005, 2.0)]),
        # node rows weight every device equally, the unallocated gpu-2 (0 %) included
        ("gpu_utilization_percent", {"node": "node-a"}, [(1005, 5.0)]),
    ]


def test_coarser_step_averages_gauges_and_takes_max_of_counters(store: EmbeddedStore) -> None:
    _record_two_gpu_job(store, [1005.0, 1020.0, 1035.0, 1050.0])
    util, energy = store.query_range(
        RangeQuery("workload", "uid-train", ("gpu_utilization_percent", "gpu_energy_joules"), 1005, 1035, 30)
    )
    assert util.points == [(1005, (7.5 + 30.0) / 2), (1035, (52.5 + 75.0) / 2)]
    assert energy.points == [(1005, 1020.0), (1035, 1050.0)]


def test_project_node_and_cluster_scopes(store: EmbeddedStore) -> None:
    _record_two_gpu_job(store, [1005.0])
    (project_util,) = store.query_range(
        RangeQuery("project", "alpha", ("gpu_utilization_percent",), 1005, 1005, 15)
    )
    assert project_util.points == [(1005, 7.5)]
    (node_memory,) = store.query_range(
        RangeQuery("node", "node-a", ("gpu_memory_used_bytes",), 1005, 1005, 15)
    )
    assert node_memory.points == [(1005, 50 * GIB)]  # 10 + 30 + the unallocated gpu-2's 10
    (cluster_alloc,) = store.query_range(RangeQuery("cluster", "", ("gpu_allocated",), 1005, 1005, 15))
    assert cluster_alloc.points == [(1005, 2.0)]


def test_time_sliced_shares_split_bytes_and_watts(store: EmbeddedStore) -> None:
    a = workload("a", [("gpu-0", 0.5, 40.0)], namespace="ns", project="p")
    b = workload("b", [("gpu-0", 0.5, 80.0)], namespace="ns", project="p")
    store.record(
        1500.0, [sample(1500.0, "gpu-0", sm=60, used_gib=20)], [a, b], [project("p", [a, b])], cluster(1)
    )
    metrics = ("gpu_memory_used_bytes", "gpu_power_watts", "gpu_utilization_percent", "gpu_allocated")
    a_series = store.query_range(RangeQuery("workload", "uid-a", metrics, 1500, 1500, 15))
    assert [s.points[0][1] for s in a_series] == [10 * GIB, 80.0, 40.0, 0.5]
    p_series = store.query_range(RangeQuery("project", "p", metrics, 1500, 1500, 15))
    assert [s.points[0][1] for s in p_series] == [20 * GIB, 160.0, 60.0, 1.0]


def test_latest_state_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "gpuwm.db"
    store = EmbeddedStore(path)
    _record_two_gpu_job(store, [1005.0, 1020.0])
    store.close()
    reopened = EmbeddedStore(path)
    try:
        job = reopened.workload("team-a", "train")
        assert (
            job is not None
            and job.energy_joules == 1020.0
            and [g.uuid for g in job.gpus] == ["gpu-0", "gpu-1"]
        )
        assert reopened.workload("team-a", "nope") is None
        assert [p.name for p in reopened.projects()] == ["alpha"]
        cluster_now = reopened.cluster()
        assert cluster_now is not None and cluster_now.gpus == 3
        assert reopened.nodes() == ["node-a"]
        assert (reopened.earliest_time(), reopened.latest_time()) == (1005.0, 1020.0)
        # writing goes on after a restart, into the same series
        _record_two_gpu_job(reopened, [1035.0])
        (util,) = reopened.query_range(
            RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 1005, 1035, 15)
        )
        assert [v for _, v in util.points] == [7.5, 30.0, 52.5]
    finally:
        reopened.close()


def test_rollups_within_resolution_and_retention_exact(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "r.db", tiers=["15s:2m", "60s:1d"])
    try:
        times = [float(t) for t in range(0, 615, 15)]  # 0 .. 600
        _record_two_gpu_job(store, times)
        # the 15 s tier keeps only t >= 600 - 120; older minutes exist only as 60 s means
        (util,) = store.query_range(
            RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 600, 60)
        )

        def util_at(t: float) -> float:
            u0 = t % 100
            return (u0 + min(100.0, 2 * u0)) / 2

        expected = [(m, sum(util_at(m + k) for k in (0, 15, 30, 45)) / 4) for m in range(0, 600, 60)]
        expected.append((600, util_at(600)))  # the newest minute is not complete: read from the 15 s tier
        assert [t for t, _ in util.points] == [t for t, _ in expected]
        # the roll-ups keep 0.1 % (codec.ROLLUP_QUANTUM); the newest minute is the exact 15 s point
        assert [v for _, v in util.points] == pytest.approx([v for _, v in expected], abs=0.05 + 1e-9)
        # at a 15 s step, the old part only has one point per minute (the roll-up): it answers each of the
        # minute's four cells (a cell a stored point covers is never null), and the
        # resolution says those cells have a 60 s step; the new part has every 15 s point
        query = RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 600, 15)
        (fine,) = store.query_range(query)
        assert all(v is not None for _, v in fine.points)
        minutes = dict(util.points)
        assert [v for t, v in fine.points if t < 480] == pytest.approx(
            [minutes[t // 60 * 60] for t, _ in fine.points if t < 480], abs=1e-9
        )
        assert [v for t, v in fine.points if t >= 480] == pytest.approx(
            [util_at(t) for t, _ in fine.points if t >= 480], abs=1e-9
        )
        assert [(s.start, s.end, s.step_seconds) for s in store.resolution(query)] == [
            (0, 480, 60), (480, 615, 15)
        ]
        # retention dropped the 15 s chunks before 480 whole; the head holds only the open span
        connection = store._reader()
        fine_chunks = connection.execute("SELECT count(*) FROM chunks WHERE tier = 15 AND start < 480").fetchone()[0]
        head_rows = connection.execute("SELECT count(*) FROM head WHERE t < 600").fetchone()[0]
        assert (fine_chunks, head_rows) == (0, 0)
    finally:
        store.close()


def test_missing_points_are_none_and_unknown_workload_is_all_none(store: EmbeddedStore) -> None:
    _record_two_gpu_job(store, [1005.0, 1035.0])
    (util,) = store.query_range(
        RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 1005, 1035, 15)
    )
    assert util.points == [(1005, 7.5), (1020, None), (1035, 52.5)]
    (other,) = store.query_range(
        RangeQuery("workload", "uid-other", ("gpu_utilization_percent",), 1005, 1035, 15)
    )
    assert other.points == [(1005, None), (1020, None), (1035, None)]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        (RangeQuery("workload", "x", ("gpu_utilization_percent",), 0, 200_000, 15), "step"),
        (RangeQuery("workload", "x", ("gpu_utilization_percent",), 10, 5, 15), "end"),
        (RangeQuery("workload", "x", ("gpu_bogus",), 0, 10, 15), "metric"),
        (RangeQuery("workload", "x", ("gpu_utilization_percent",), 0, 10, 0), "step"),
    ],
)
def test_bad_queries_name_the_parameter(store: EmbeddedStore, query: RangeQuery, parameter: str) -> None:
    with pytest.raises(QueryError) as caught:
        store.query_range(query)
    assert caught.value.parameter == parameter


def test_text_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("my precious notes\n" * 20)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a SQLite database"):
        open_store(str(path))
    assert path.read_bytes() == before


def test_foreign_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE accounts (id INTEGER, balance REAL)")
    connection.commit()
    connection.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another application"):
        EmbeddedStore(path)
    assert path.read_bytes() == before
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1234")
    connection.commit()
    connection.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another application"):
        EmbeddedStore(path)
    assert path.read_bytes() == before


def test_corrupt_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpuwm.db"
    EmbeddedStore(path).close()
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # keep the header, wreck the pages
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        EmbeddedStore(path)
    assert path.read_bytes() == bytes(data)


@pytest.mark.parametrize(
    "spec", [["15s"], ["15s:5s"], ["15s:2d", "10s:30d"], ["15s:2d", "20s:30d"], ["15s:2d", "1m:1d"]]
)
def test_bad_rollup_tiers_are_refused(spec: list[str]) -> None:
    with pytest.raises(ValueError, match="--store-rollups"):
        parse_tiers(spec)


def test_prometheus_urls_and_schemes() -> None:
    with pytest.raises(StoreError, match="unsupported scheme"):
        open_store("ftp://example/x")


def test_pod_stats_are_summed_per_pod_workload_and_node(store: EmbeddedStore) -> None:
    from gpuwm.model import PodStatsSample

    job = workload("train", [("gpu-0", 1.0, 50.0)])
    other = workload("other", [("gpu-1", 1.0, 50.0)], node="node-a")
    stats = [
        PodStatsSample(
            t=1005.0,
            node="node-a",
            namespace="team-a",
            pod="train-0",
            pod_uid="pod-uid-train",
            cpu_usage_cores=1.5,
            memory_used_bytes=2e9,
        ),
        PodStatsSample(
            t=1005.0,
            node="node-a",
            namespace="team-a",
            pod="other-0",
            pod_uid="pod-uid-other",
            cpu_usage_cores=0.5,
            network_rx_bytes_per_second=1e6,
        ),
    ]
    store.record(
        1005.0,
        [sample(1005.0, "gpu-0"), sample(1005.0, "gpu-1")],
        [job, other],
        [project("alpha", [job, other])],
        cluster(2),
        stats,
    )
    metrics = ("cpu_usage_cores", "memory_used_bytes", "network_rx_bytes_per_second")
    train = store.query_range(RangeQuery("workload", "uid-train", metrics, 1005, 1005, 15))
    assert [s.points[0][1] for s in train] == [1.5, 2e9, None]
    node = store.query_range(RangeQuery("node", "node-a", metrics, 1005, 1005, 15))
    assert [s.points[0][1] for s in node] == [2.0, 2e9, 1e6]
    (alpha_cpu,) = store.query_range(RangeQuery("project", "alpha", ("cpu_usage_cores",), 1005, 1005, 15))
    assert alpha_cpu.points == [(1005, 2.0)]


def test_connections_of_ended_reading_threads_are_closed(store: EmbeddedStore) -> None:
    """The API reads from worker threads that come and go; their connections do not pile up.

    Each burst of concurrent queries after the pool's threads retired used to open a connection
    per thread (each with its page cache and file descriptor) that stayed open until the store closed.
    """
    import threading

    _record_two_gpu_job(store, [1000.0])
    opened: list[sqlite3.Connection] = []

    def read() -> None:
        opened.append(store._reader())
        store.latest_time()

    for _burst in range(3):
        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert store.latest_time() == 1000.0  # a new reader (this thread's) sweeps the ended threads' ones
    assert len(store._readers) == 1
    assert len(opened) == 12
    for connection in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            connection.execute("SELECT 1")
