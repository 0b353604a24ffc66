"""The last host figures over the real Debian `prometheus`: the pods' disk read and write rates (the
agent's gpuwm_disk_*_bytes_per_second), ephemeral storage used and its limit (the controller's
gpuwm_pod_ephemeral_storage_limit_bytes), through the range API as the embedded store holding the same data
answers them; and the Run:ai names' host use, every running workload's latest figures in one query
(`PrometheusStore.latest_by_workload`), equal to the plain query per workload and to the embedded store; and
a failed run's failure reason (Baseten's error_message) from the controller's gpuwm_workload_failure_info."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model import PodStatsSample
from gpuwm.model.figures import GpuFigures, PodFigures, WorkloadFigures
from gpuwm.model.podstats import PodResources
from gpuwm.store import Store
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, Interval, series_of
from tests.unit.store.store_data import project, sample

pytestmark = REAL_PROMETHEUS

T0 = math.floor((time.time() - 2 * 3600) / 60) * 60
TIMES = [float(T0 + 15 * k) for k in range(12)]
#: train's worker-0 requests 2 cores and 8 GB and limits ephemeral storage to 50 GB; worker-1 sets nothing
SPECS = [PodResources(cpu_request_cores=2.0, memory_request_bytes=8e9, ephemeral_storage_limit_bytes=50e9),
         PodResources()]
METRICS = ("disk_read_bytes_per_second", "disk_write_bytes_per_second", "ephemeral_storage_used_bytes",
           "ephemeral_storage_limit_bytes")
#: tune's pod stops reporting host figures after this time (its kubelet figures go missing)
TUNE_STATS_UNTIL = TIMES[5]


def jobs(t: float) -> list[WorkloadFigures]:
    """`train` (two pods, gpu-0 and gpu-1) and `tune` (one pod, gpu-2)."""
    shapes = [("train", ["train-worker-0", "train-worker-1"]), ("tune", ["tune-0"])]
    found, index = [], 0
    for name, pods in shapes:
        gpus = []
        for pod in pods:
            gpus.append(GpuFigures(node="node-a", uuid=f"gpu-{index}", index=index, units=1.0, utilization_percent=50.0,
                                   pod=pod, pod_uid=f"uid-{pod}", namespace="team-a", workload=name,
                                   workload_uid=f"uid-{name}", last_sample_time=t))
            index += 1
        found.append(WorkloadFigures(
            uid=f"uid-{name}", namespace="team-a", name=name, kind="Job", api_version="batch/v1", project="alpha",
            phase="Running", allocated_gpus=float(len(pods)), created_time=TIMES[0], start_time=TIMES[0],
            nodes=["node-a"],
            pods=[PodFigures(name=pod, uid=f"uid-{pod}", node="node-a", phase="Running", allocated_gpus=1.0,
                             resources=SPECS[k] if name == "train" else None) for k, pod in enumerate(pods)],
            gpus=gpus,
        ))
    return found + failed_runs()


#: the failed runs' reasons: `old`'s Job condition, `crash`'s from its failed pod (the API's fallback)
REASONS = {"uid-old": "BackoffLimitExceeded: Job has reached the specified backoff limit",
           "uid-crash": "container c: OOMKilled, exit code 137"}


def failed_runs() -> list[WorkloadFigures]:
    """Two ended runs that hold nothing: `old` failed by its Job's condition, `crash` by its pod's reason."""
    common: dict[str, Any] = {"namespace": "team-a", "kind": "Job", "api_version": "batch/v1", "project": "alpha",
                              "phase": "Failed", "created_time": TIMES[0], "start_time": TIMES[0],
                              "end_time": TIMES[0] + 5}
    return [
        WorkloadFigures(uid="uid-old", name="old", failure_reason=REASONS["uid-old"], **common),
        WorkloadFigures(uid="uid-crash", name="crash", pods=[
            PodFigures(name="crash-0", uid="uid-crash-0", node="node-a", phase="Failed",
                       failure_reason=REASONS["uid-crash"])], **common),
    ]


def pod_stats(t: float) -> list[PodStatsSample]:
    train = [PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"train-worker-{k}",
                            pod_uid=f"uid-train-worker-{k}", cpu_usage_cores=1.0 + k, memory_used_bytes=2e9,
                            disk_read_bytes_per_second=1e6 * (k + 1), disk_write_bytes_per_second=3e5 + t - T0,
                            ephemeral_storage_used_bytes=10e9 + k * 1e9) for k in range(2)]
    tune = [PodStatsSample(t=t, node="node-a", namespace="team-a", pod="tune-0", pod_uid="uid-tune-0",
                           cpu_usage_cores=0.25 + (t - T0) / 1000, memory_used_bytes=1e9)]
    return train + (tune if t <= TUNE_STATS_UNTIL else [])


@pytest.fixture(scope="module")
def intervals() -> list[Interval]:
    return [Interval(t, [sample(t, f"gpu-{index}") for index in range(3)], jobs(t), [project("alpha", jobs(t))], 3,
                     pod_stats(t)) for t in TIMES]


@pytest.fixture(scope="module")
def evaluation_time() -> float:
    return TIMES[-1]


def approx(series: dict[tuple[str, str], list[float | None]]) -> dict[tuple[str, str], list[object]]:
    """The embedded store keeps values quantised (to about a thousandth): equal within that."""
    return {key: [None if v is None else pytest.approx(v, rel=2e-3) for v in points] for key, points in series.items()}


@pytest.mark.parametrize("url", ["/api/v1/workloads/uid-train/metrics", "/api/v1/projects/alpha/metrics"])
async def test_disk_rates_and_ephemeral_storage_from_prometheus_as_from_the_embedded_store(
    stores: tuple[EmbeddedStore, PrometheusStore], url: str
) -> None:
    embedded, prometheus = stores
    from_prometheus = await series_of(prometheus, url, METRICS, TIMES[1], TIMES[-2])
    assert from_prometheus == approx(await series_of(embedded, url, METRICS, TIMES[1], TIMES[-2]))
    assert set(from_prometheus[("disk_read_bytes_per_second", "")]) == {3e6}  # 1 + 2 MB/s
    assert set(from_prometheus[("ephemeral_storage_used_bytes", "")]) == {21e9}
    assert set(from_prometheus[("ephemeral_storage_limit_bytes", "")]) == {50e9}  # worker-1 has none
    writes = from_prometheus[("disk_write_bytes_per_second", "")]
    assert writes == [2 * (3e5 + t - T0) for t in TIMES[1:-1]]


async def test_by_pod_each_pods_own_disk_and_storage(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    embedded, prometheus = stores
    url = "/api/v1/workloads/uid-train/metrics"
    from_prometheus = await series_of(prometheus, url, METRICS, TIMES[1], TIMES[-2], by="pod")
    from_embedded = await series_of(embedded, url, METRICS, TIMES[1], TIMES[-2], by="pod")
    # the embedded store keeps a pod's series of a metric it has no point of (all null); Prometheus has none
    assert from_prometheus == approx(
        {key: points for key, points in from_embedded.items() if any(p is not None for p in points)}
    )
    assert set(from_prometheus[("disk_read_bytes_per_second", "train-worker-1")]) == {2e6}
    assert set(from_prometheus[("ephemeral_storage_limit_bytes", "train-worker-0")]) == {50e9}
    assert ("ephemeral_storage_limit_bytes", "train-worker-1") not in from_prometheus  # no limit: no series


@pytest.mark.parametrize("window_seconds", [60.0, 15.0 * (len(TIMES) - 1)])
def test_latest_by_workload_in_one_query_as_a_query_each(
    stores: tuple[EmbeddedStore, PrometheusStore], window_seconds: float
) -> None:
    embedded, prometheus = stores
    uids = ["uid-train", "uid-tune", "uid-none"]
    metrics = ("cpu_usage_cores", "memory_used_bytes", "ephemeral_storage_limit_bytes")
    end = TIMES[-1]
    one_query = prometheus.latest_by_workload(uids, metrics, end - window_seconds, end, 15.0)
    assert one_query == Store.latest_by_workload(prometheus, uids, metrics, end - window_seconds, end, 15.0)
    from_embedded = embedded.latest_by_workload(uids, metrics, end - window_seconds, end, 15.0)
    assert one_query == {uid: pytest.approx(values, rel=2e-3) for uid, values in from_embedded.items()}
    assert one_query["uid-train"] == {"cpu_usage_cores": 3.0, "memory_used_bytes": 4e9,
                                      "ephemeral_storage_limit_bytes": 50e9}
    if end - window_seconds > TUNE_STATS_UNTIL:  # tune's host figures stopped before the window
        assert "uid-tune" not in one_query
    else:
        assert one_query["uid-tune"] == {"cpu_usage_cores": pytest.approx(0.25 + (TUNE_STATS_UNTIL - T0) / 1000),
                                         "memory_used_bytes": 1e9}


async def runai_lines(store: Store) -> dict[str, float]:
    """The Run:ai host families of one scrape (pod UIDs blanked: the Prometheus store's pods have none)."""
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1",
                                     status_interval=15.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        text = (await http.get("/metrics")).text
    families = ("runai_job_", "runai_active_job_", "runai_cpu_limits", "runai_memory_limits", "runai_allocated_m")
    return {re.sub(r'pod_uuid="[^"]*"', 'pod_uuid=""', line.rsplit(" ", 1)[0]): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(families)}


async def test_runai_host_names_over_prometheus(stores: tuple[EmbeddedStore, PrometheusStore]) -> None:
    """Run:ai's CPU and memory use, requests and per-pod allocations on an API over Prometheus (`gpuwm api`):
    the pods' specs from the controller's gpuwm_pod_* series, as the embedded store answers them."""
    embedded, prometheus = stores
    values = await runai_lines(prometheus)
    assert values == {key: pytest.approx(value, rel=2e-3) for key, value in (await runai_lines(embedded)).items()}
    train = ('{clusterId="c-1",namespace="team-a",project="alpha",user="",workload_id="uid-train",'
             'workload_name="train",workload_type="training"}')
    job = '{clusterId="c-1",job_name="train",job_uuid="uid-train",namespace="team-a"}'
    pod = '{clusterId="c-1",node="node-a",pod_name="train-worker-0",pod_namespace="team-a",pod_uuid=""}'
    assert values == {
        f"runai_job_cpu_usage{train}": 3.0, f"runai_job_memory_used_bytes{train}": 4e9,
        f"runai_active_job_cpu_requested_cores{job}": 2.0, f"runai_active_job_memory_requested_bytes{job}": 8e9,
        f"runai_allocated_millicpus_per_pod{pod}": 2000.0, f"runai_allocated_memory_per_pod{pod}": 8e9,
    }  # tune's host figures stopped, no pod sets a CPU or memory limit


async def test_the_failure_reason_from_prometheus_as_from_the_embedded_store(
    stores: tuple[EmbeddedStore, PrometheusStore],
) -> None:
    for store in stores:
        app = create_app(store, Settings(auth="none"))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
            for uid in ("uid-old", "uid-crash", "uid-train"):
                body = (await http.get(f"/api/v1/workloads/{uid}")).json()
                assert body["failureReason"] == REASONS.get(uid), (type(store).__name__, uid, body)
            answer = (await http.get("/api/v1/workloads/uid-old/metrics?metric=gpu_allocated")).json()
            assert answer["workload"]["failureReason"] == REASONS["uid-old"]
