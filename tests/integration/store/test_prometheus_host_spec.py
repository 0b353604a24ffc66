"""Pods' host figures over the real Debian `prometheus`: the range API's CPU and memory requests and limits, and CPU
use as percent of request and of limit, answered from the controller's gpuwm_pod_* series joined with the
agent's pod stats, the same as the embedded store holding the same data (by workload, by pod, by project)."""

from __future__ import annotations

import math
import time

import pytest

from gpuwm.model import PodStatsSample
from gpuwm.model.figures import GpuFigures, PodFigures, WorkloadFigures
from gpuwm.model.podstats import PodResources
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, Interval, series_of
from tests.unit.store.store_data import project, sample

pytestmark = REAL_PROMETHEUS

T0 = math.floor((time.time() - 2 * 3600) / 60) * 60
TIMES = [float(T0 + 15 * k) for k in range(12)]
#: worker-0 requests 2 cores, limit 4; worker-1 requests 1 core and has no CPU limit; both limit memory
SPECS = [
    PodResources(cpu_request_cores=2.0, cpu_limit_cores=4.0, memory_request_bytes=8e9, memory_limit_bytes=16e9),
    PodResources(cpu_request_cores=1.0, memory_request_bytes=4e9, memory_limit_bytes=6e9),
]
CPU_USED = [1.0, 0.5]
METRICS = ("cpu_request_cores", "cpu_limit_cores", "memory_request_bytes", "memory_limit_bytes",
           "cpu_usage_percent_of_request", "cpu_usage_percent_of_limit")


def job(t: float) -> WorkloadFigures:
    pods = [f"worker-{index}" for index in range(2)]
    return WorkloadFigures(
        uid="uid-train", namespace="team-a", name="train", kind="Job", api_version="batch/v1", project="alpha",
        phase="Running", allocated_gpus=2.0, created_time=TIMES[0], start_time=TIMES[0], nodes=["node-a"],
        pods=[PodFigures(name=pod, uid=f"uid-{pod}", node="node-a", phase="Running", allocated_gpus=1.0,
                         resources=SPECS[index]) for index, pod in enumerate(pods)],
        gpus=[GpuFigures(node="node-a", uuid=f"gpu-{index}", index=index, units=1.0, utilization_percent=50.0,
                         pod=pod, pod_uid=f"uid-{pod}", namespace="team-a", workload="train",
                         workload_uid="uid-train", last_sample_time=t) for index, pod in enumerate(pods)],
    )


def pod_stats(t: float) -> list[PodStatsSample]:
    return [PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"worker-{index}", pod_uid=f"uid-worker-{index}",
                           cpu_usage_cores=CPU_USED[index], memory_used_bytes=1e9) for index in range(2)]


@pytest.fixture(scope="module")
def intervals() -> list[Interval]:
    return [Interval(t, [sample(t, f"gpu-{index}") for index in range(2)], [job(t)], [project("alpha", [job(t)])], 2,
                     pod_stats(t)) for t in TIMES]


@pytest.fixture(scope="module")
def evaluation_time() -> float:
    return TIMES[-1]


@pytest.mark.parametrize("url", ["/api/v1/workloads/uid-train/metrics", "/api/v1/projects/alpha/metrics"])
async def test_requests_limits_and_percents_from_prometheus_as_from_the_embedded_store(
    stores: tuple[EmbeddedStore, PrometheusStore], url: str
) -> None:
    embedded, prometheus = stores
    from_prometheus = await series_of(prometheus, url, METRICS, TIMES[1], TIMES[-2])
    assert from_prometheus == await series_of(embedded, url, METRICS, TIMES[1], TIMES[-2])
    expected = {
        "cpu_request_cores": 3.0,
        "cpu_limit_cores": 4.0,  # worker-1 has none: the sum over the pods that have one
        "memory_request_bytes": 12e9,
        "memory_limit_bytes": 22e9,
        "cpu_usage_percent_of_request": 100 * 1.5 / 3.0,
        "cpu_usage_percent_of_limit": 100 * 1.0 / 4.0,  # worker-0's use of its own limit only
    }
    for metric, value in expected.items():
        points = from_prometheus[(metric, "")]
        assert points and all(point == pytest.approx(value) for point in points), (metric, points)


async def test_by_pod_each_pods_own_figures(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    embedded, prometheus = stores
    url = "/api/v1/workloads/uid-train/metrics"
    from_prometheus = await series_of(prometheus, url, METRICS, TIMES[1], TIMES[-2], by="pod")
    from_embedded = await series_of(embedded, url, METRICS, TIMES[1], TIMES[-2], by="pod")
    # the embedded store keeps a pod's series of a metric it has no point of (all null); Prometheus has none
    assert from_prometheus == {key: points for key, points in from_embedded.items() if any(p is not None for p in points)}
    assert set(from_prometheus[("cpu_usage_percent_of_request", "worker-1")]) == {50.0}
    assert ("cpu_usage_percent_of_limit", "worker-1") not in from_prometheus  # no limit: no series
    assert set(from_prometheus[("cpu_usage_percent_of_limit", "worker-0")]) == {25.0}
