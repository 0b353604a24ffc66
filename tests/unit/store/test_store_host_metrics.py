"""Pods' host figures: their requests, limits, use of them and disk rates in the embedded store, and a
schema-4 file (without them) migrated in place."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpuwm.model import PodResources, PodStatsSample
from gpuwm.model.figures import WorkloadFigures
from gpuwm.store import RangeQuery
from gpuwm.store.base import METRIC_NAMES
from gpuwm.store.embedded import SCHEMA_VERSION, EmbeddedStore

from .old_schema import narrowed, rewrite_as_schema
from .store_data import cluster, project, sample, workload
from .test_store_payloads import SMALL_TIERS, check_counts, chunk_values, record_jobs

HOST = ("cpu_usage_cores", "cpu_request_cores", "cpu_limit_cores", "cpu_usage_percent_of_request",
        "cpu_usage_percent_of_limit", "memory_used_bytes", "memory_request_bytes", "memory_limit_bytes",
        "disk_read_bytes_per_second", "disk_write_bytes_per_second", "ephemeral_storage_used_bytes",
        "ephemeral_storage_limit_bytes")


def _with_resources(figures: WorkloadFigures, resources: PodResources | None) -> WorkloadFigures:
    return figures.model_copy(update={"pods": [pod.model_copy(update={"resources": resources}) for pod in figures.pods]})


def _stat(t: float, name: str, cores: float) -> PodStatsSample:
    return PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"{name}-0", pod_uid=f"pod-uid-{name}",
                          cpu_usage_cores=cores, memory_used_bytes=2e9, ephemeral_storage_used_bytes=1e9,
                          disk_read_bytes_per_second=1000.0, disk_write_bytes_per_second=250.0)


def _record(store: EmbeddedStore, times: list[float]) -> None:
    limited = PodResources(cpu_request_cores=2.0, cpu_limit_cores=4.0, memory_request_bytes=4e9,
                           memory_limit_bytes=8e9, ephemeral_storage_limit_bytes=1e10)
    for t in times:
        jobs = [_with_resources(workload("a", [("gpu-a", 1.0, 50.0)]), limited),
                _with_resources(workload("b", [("gpu-b", 1.0, 50.0)]), None)]
        store.record(t, [sample(t, "gpu-a", sm=50.0), sample(t, "gpu-b", sm=50.0)], jobs, [project("alpha", jobs)],
                     cluster(2), [_stat(t, "a", 3.0), _stat(t, "b", 1.0)])


def _values(store: EmbeddedStore, scope: str, key: str) -> dict[str, float | None]:
    series = store.query_range(RangeQuery(scope, key, HOST, 30, 30, 15))  # type: ignore[arg-type]
    return {each.metric: each.points[0][1] for each in series}


def test_requests_limits_and_their_use_per_pod_workload_and_project(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        _record(store, [0.0, 15.0, 30.0])
        limited = _values(store, "workload", "uid-a")
        assert limited == {
            "cpu_usage_cores": 3.0, "cpu_request_cores": 2.0, "cpu_limit_cores": 4.0,
            "cpu_usage_percent_of_request": 150.0, "cpu_usage_percent_of_limit": 75.0,
            "memory_used_bytes": 2e9, "memory_request_bytes": 4e9, "memory_limit_bytes": 8e9,
            "disk_read_bytes_per_second": 1000.0, "disk_write_bytes_per_second": 250.0,
            "ephemeral_storage_used_bytes": 1e9, "ephemeral_storage_limit_bytes": 1e10,
        }
        unlimited = _values(store, "workload", "uid-b")
        assert unlimited["cpu_usage_cores"] == 1.0 and unlimited["disk_read_bytes_per_second"] == 1000.0
        assert unlimited["cpu_limit_cores"] is None and unlimited["cpu_usage_percent_of_limit"] is None
        # the project's percent is over the pods with a limit: b's core counts in its use, not in the percent
        alpha = _values(store, "project", "alpha")
        assert alpha["cpu_usage_cores"] == 4.0 and alpha["cpu_limit_cores"] == 4.0
        assert alpha["cpu_usage_percent_of_limit"] == 75.0 and alpha["disk_write_bytes_per_second"] == 500.0
        # after compaction into chunks (the fifth part) the same figures read back
        store.compact(everything=True)
        assert _values(store, "workload", "uid-a") == limited
    finally:
        store.close()


def test_a_schema_4_file_is_migrated_in_place_and_takes_the_new_metrics(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    record_jobs(store, [float(t) for t in range(0, 450, 15)])  # chunks and a head left uncompacted
    before_values = chunk_values(store)
    query = RangeQuery("cluster", "", ("gpu_utilization_percent",), 0, 435, 15, "pod")
    before = store.query_range(query)
    store.close()
    rewrite_as_schema(path, 4)
    connection = sqlite3.connect(path)
    assert connection.execute("SELECT count(*) FROM head").fetchone()[0] > 0  # narrow head rows to read back
    connection.close()
    migrated = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        connection = migrated._reader()
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
        stored = json.loads(connection.execute("SELECT value FROM meta WHERE key = 'metrics'").fetchone()[0])
        assert stored == list(METRIC_NAMES)
        assert chunk_values(migrated) == narrowed(before_values, 4)
        after = migrated.query_range(query)
        assert [(s.labels, s.points) for s in after] == [(s.labels, s.points) for s in before]
        check_counts(migrated)
        _record(migrated, [450.0, 465.0, 480.0])
        migrated.compact(everything=True)
        check_counts(migrated)
        (series,) = migrated.query_range(RangeQuery("workload", "uid-a", ("cpu_usage_percent_of_limit",), 450, 480, 15))
        assert [v for _, v in series.points] == [75.0, 75.0, 75.0]
    finally:
        migrated.close()
