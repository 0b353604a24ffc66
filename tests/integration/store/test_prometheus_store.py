"""The Prometheus store against the real Debian `prometheus`, backfilled with the same data as an embedded store.

Both backends must answer the same API queries with the same numbers.
"""

from __future__ import annotations

import math
import time

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model import PodStatsSample
from gpuwm.model.figures import ClusterFigures
from gpuwm.store import RangeQuery, ReadOnlyStoreError, Series
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, Interval
from tests.unit.store.store_data import project, sample, workload

pytestmark = REAL_PROMETHEUS

T0 = math.floor((time.time() - 2 * 3600) / 15) * 15
TIMES = [float(T0 + 15 * k) for k in range(20)]


def _interval(k: int, t: float) -> tuple[list, list, list, list]:  # type: ignore[type-arg]
    u0 = float((k * 7) % 100)
    u1 = float((k * 13 + 20) % 100)
    train = workload(
        "train", [("gpu-0", 1.0, u0), ("gpu-1", 1.0, u1)], energy_joules=50.0 * k, created=T0 - 60
    ).model_copy(update={"requested_gpus": 2.0, "queued_seconds": 30.0})  # watched, queued 30 s before it ran
    notebook = workload(
        "notebook",
        [("gpu-7", 1.0, 0.0)],
        namespace="team-b",
        project="beta",
        node="node-b",
        idle_seconds=300.0 + 15 * k,
        created=T0 - 600,
    )
    samples = [
        sample(t, "gpu-0", sm=u0, used_gib=10 + k),
        sample(t, "gpu-1", sm=u1, used_gib=20),
        sample(t, "gpu-7", node="node-b", sm=0, used_gib=5),
        sample(t, "gpu-3", sm=0, used_gib=0),
    ]
    stats = [
        PodStatsSample(
            t=t,
            node="node-a",
            namespace="team-a",
            pod="train-0",
            pod_uid="pod-uid-train",
            cpu_usage_cores=2.0 + k / 10,
            memory_used_bytes=1e9,
        ),
        PodStatsSample(
            t=t,
            node="node-b",
            namespace="team-b",
            pod="notebook-0",
            pod_uid="pod-uid-notebook",
            cpu_usage_cores=0.1,
            memory_used_bytes=5e8,
        ),
    ]
    return (
        samples,
        [train, notebook],
        [project("alpha", [train], 50.0 * k), project("beta", [notebook]).model_copy(update={
            "requested_gpus": 4.0, "queued_workloads": 1, "longest_queued_seconds": 120.0})],
        stats,
    )


@pytest.fixture(scope="module")
def intervals() -> list[Interval]:
    recorded = []
    for k, t in enumerate(TIMES):
        samples, workloads, projects, stats = _interval(k, t)
        recorded.append(Interval(t, samples, workloads, projects, 4, stats))
    return recorded


def _points(series: list[Series]) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[float | None]]:
    keep = ("gpu", "uuid", "pod", "node")
    return {
        (s.metric, tuple(sorted((k, v) for k, v in s.labels.items() if k in keep))): [
            None if v is None else round(v, 6) for _, v in s.points
        ]
        for s in series
    }


METRICS = (
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_utilization_percent",
    "gpu_power_watts",
    "gpu_allocated",
    "gpu_energy_joules",
    "gpu_idle_seconds",
    "cpu_usage_cores",
    "memory_used_bytes",
)


@pytest.mark.parametrize(
    ("scope", "key", "by", "metrics"),
    [
        ("workload", "uid-train", None, METRICS),
        ("workload", "uid-notebook", None, METRICS),
        ("project", "alpha", None, METRICS),
        (
            "node",
            "node-a",
            None,
            ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_power_watts", "gpu_energy_joules"),
        ),
        ("cluster", "", None, ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_allocated")),
        (
            "workload",
            "uid-train",
            "gpu",
            ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_allocated"),
        ),
        ("workload", "uid-train", "pod", ("gpu_utilization_percent", "cpu_usage_cores")),
        ("cluster", "", "node", ("gpu_utilization_percent", "gpu_allocated")),
    ],
)
def test_same_answers_as_the_embedded_store(
    stores: tuple[EmbeddedStore, PrometheusStore],
    scope: str,
    key: str,
    by: str | None,
    metrics: tuple[str, ...],
) -> None:
    embedded, prometheus = stores
    query = RangeQuery(scope, key, metrics, TIMES[0], TIMES[-1], 15.0, by)  # type: ignore[arg-type]
    expected = _points(embedded.query_range(query))
    got = _points(prometheus.query_range(query))
    assert got == expected
    assert any(v is not None for values in got.values() for v in values)


def test_coarser_step_reads_values_at_the_grid(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    _, prometheus = stores
    (series,) = prometheus.query_range(
        RangeQuery("workload", "uid-train", ("gpu_allocated",), TIMES[0], TIMES[-1], 60.0)
    )
    assert [t for t, _ in series.points] == TIMES[::4]
    assert all(v == 2.0 for _, v in series.points)


def test_latest_state(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    embedded, live = stores
    # the latest data is two hours old, beyond Prometheus' lookback: read the state as of the data's time
    prometheus = PrometheusStore(live.url, evaluation_time=TIMES[-1])
    train = prometheus.workload("team-a", "train")
    assert train is not None
    assert (train.name, train.allocated_gpus, train.energy_joules, train.project) == (
        "train",
        2.0,
        950.0,
        "alpha",
    )
    expected = embedded.workload("team-a", "train")
    assert expected is not None and expected.energy_joules == train.energy_joules
    assert train.created_time == T0 - 60 and [p.name for p in train.pods] == ["train-0"]
    assert (train.requested_gpus, train.queued_seconds) == (2.0, 30.0)  # from the workload object, not its pods
    notebook = prometheus.workload("team-b", "notebook")
    assert notebook is not None and notebook.requested_gpus is None  # only its pods are known
    beta = prometheus.project("beta")
    assert beta is not None and (beta.requested_gpus, beta.queued_workloads, beta.longest_queued_seconds) == (
        4.0, 1, 120.0)
    assert prometheus.workload("team-a", "nope") is None
    assert sorted(w.name for w in prometheus.workloads()) == ["notebook", "train"]
    assert [(p.name, p.namespaces) for p in prometheus.projects()] == [
        ("alpha", ["team-a"]),
        ("beta", ["team-b"]),
    ]
    assert prometheus.nodes() == ["node-a", "node-b"]
    cluster = prometheus.cluster()
    assert cluster is not None and (cluster.gpus, cluster.allocated_gpus, cluster.workloads) == (4, 3.0, 2)


def test_record_is_refused(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    _, prometheus = stores
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        prometheus.record(0.0, [], [], [], ClusterFigures())


async def test_api_over_prometheus(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    _, prometheus = stores
    app = create_app(prometheus, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        response = await http.get(
            "/api/v1/cluster/metrics", params={"metric": "gpu_allocated", "start": TIMES[0], "end": TIMES[-1]}
        )
    assert response.status_code == 200, response.text
    assert [v for _, v in response.json()["series"][0]["points"]] == [3.0] * len(TIMES)
