"""Every endpoint of the metrics API, and every bad parameter, against a real embedded store (auth off)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.params import parse_time
from gpuwm.config import Settings
from gpuwm.store import RangeQuery, Series
from gpuwm.store.embedded import EmbeddedStore

from .api_data import GIB


@pytest.fixture
async def client(store: EmbeddedStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


async def test_list_workloads_and_filters(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/workloads")).json()
    assert sorted(w["name"] for w in body["workloads"]) == ["notebook", "train"]
    train = next(w for w in body["workloads"] if w["name"] == "train")
    assert train["allocatedGpus"] == 2.0 and train["project"] == "alpha" and train["energyJoules"] == 400.0
    assert [
        w["name"] for w in (await client.get("/api/v1/workloads?namespace=team-b")).json()["workloads"]
    ] == ["notebook"]
    assert [w["name"] for w in (await client.get("/api/v1/workloads?project=alpha")).json()["workloads"]] == [
        "train"
    ]
    assert [w["name"] for w in (await client.get("/api/v1/workloads?idle=true")).json()["workloads"]] == [
        "notebook"
    ]
    assert [w["name"] for w in (await client.get("/api/v1/workloads?idle=false")).json()["workloads"]] == [
        "train"
    ]


async def test_get_workload_and_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/namespaces/team-b/workloads/notebook")
    assert response.status_code == 200
    assert response.json()["idleSeconds"] == 645.0
    missing = await client.get("/api/v1/namespaces/team-b/workloads/nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found" and "nope" in missing.json()["message"]


async def test_workload_metrics_default_range_is_its_life(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/namespaces/team-a/workloads/train/metrics")).json()
    assert body["workload"] == {
        "namespace": "team-a",
        "name": "train",
        "uid": "uid-train",
        "kind": "Job",
        "project": "alpha",
        "phase": "Running",
        "createdTime": 900.0,
        "startTime": 910.0,
        "endTime": None,
        "failureReason": None,
        "pods": [{"name": "train-0", "uid": "pod-uid-train", "node": "node-a", "phase": "Running", "rank": 0, "role": None}],
    }
    assert (body["start"], body["end"], body["step"]) == (900.0, 1050.0, 15.0)
    util = next(s for s in body["series"] if s["metric"] == "gpu_utilization_percent")
    # created at 900, first data at 1005 (bucket 1005 = 67 * 15): missing points are null
    assert util["points"][0] == [900.0, None]
    assert util["points"][7:] == [[1005.0, 50.0], [1020.0, 50.0], [1035.0, 50.0], [1050.0, 50.0]]
    assert [s["metric"] for s in body["series"]] == [
        "gpu_utilization_percent",
        "gpu_memory_used_bytes",
        "gpu_power_watts",
        "gpu_allocated",
    ]


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("1005", "1035"),
        ("1970-01-01T00:16:45Z", "1970-01-01T00:17:15+00:00"),
        ("1970-01-01T00:16:45.000Z", "1035"),
    ],
)
async def test_time_formats(client: httpx.AsyncClient, start: str, end: str) -> None:
    response = await client.get(
        "/api/v1/namespaces/team-a/workloads/train/metrics",
        params={"metric": "gpu_memory_used_bytes", "start": start, "end": end, "step": "15s"},
    )
    assert response.status_code == 200, response.text
    (series,) = response.json()["series"]
    assert series["points"] == [[1005.0, 30 * GIB], [1020.0, 30 * GIB], [1035.0, 30 * GIB]]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1763769600", 1763769600.0),
        ("1763769600000", 1763769600.0),  # epoch millis
        ("1763769600.5", 1763769600.5),
        ("2025-11-22T00:00:00Z", 1763769600.0),
        ("2025-11-22T01:00:00+01:00", 1763769600.0),
        ("2025-11-22t00:00:00.250z", 1763769600.25),
    ],
)
def test_parse_time_formats(text: str, seconds: float) -> None:
    assert parse_time("start", text) == seconds


async def test_step_breakdowns_and_repeated_metrics(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_utilization_percent&metric=gpu_allocated"
        "&start=1005&end=1050&step=30&by=gpu"
    )
    body = response.json()
    assert body["step"] == 30.0
    got = {(s["metric"], s["labels"]["uuid"]): s["points"] for s in body["series"]}
    assert got[("gpu_utilization_percent", "gpu-0")] == [[1005.0, 40.0], [1035.0, 40.0]]
    assert got[("gpu_utilization_percent", "gpu-1")] == [[1005.0, 60.0], [1035.0, 60.0]]
    assert got[("gpu_allocated", "gpu-1")] == [[1005.0, 1.0], [1035.0, 1.0]]
    by_node = (
        await client.get("/api/v1/cluster/metrics?metric=gpu_allocated&start=1050&end=1050&by=node")
    ).json()
    assert {s["labels"]["node"]: s["points"][0][1] for s in by_node["series"]} == {
        "node-a": 2.0,
        "node-b": 1.0,
    }
    by_pod = (
        await client.get(
            "/api/v1/namespaces/team-a/workloads/train/metrics?by=pod&metric=gpu_allocated&start=1050&end=1050"
        )
    ).json()
    assert [(s["labels"]["pod"], s["points"]) for s in by_pod["series"]] == [("train-0", [[1050.0, 2.0]])]
    one_minute = (
        await client.get(
            "/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_allocated&start=960&end=1080&step=1m"
        )
    ).json()
    assert one_minute["series"][0]["points"] == [[960.0, 2.0], [1020.0, 2.0], [1080.0, None]]


async def test_project_node_cluster_metrics(client: httpx.AsyncClient) -> None:
    project = (
        await client.get("/api/v1/projects/beta/metrics?metric=gpu_idle_seconds&start=1005&end=1050")
    ).json()
    assert project["project"] == "beta"
    assert [v for _, v in project["series"][0]["points"]] == [600.0, 615.0, 630.0, 645.0]
    node = (
        await client.get("/api/v1/nodes/node-b/metrics?metric=gpu_memory_used_bytes&start=1050&end=1050")
    ).json()
    assert node["node"] == "node-b" and node["series"][0]["points"] == [[1050.0, 5 * GIB]]
    cluster = (
        await client.get("/api/v1/cluster/metrics?metric=gpu_utilization_percent&start=1050&end=1050")
    ).json()
    assert cluster["series"][0]["points"] == [[1050.0, pytest.approx(100 / 3)]]
    default = (await client.get("/api/v1/cluster/metrics?metric=gpu_allocated")).json()
    assert (
        default["end"] == 1050.0
        and default["start"] == 1005.0
        and default["series"][0]["points"][-1] == [1050.0, 3.0]
    )
    assert (await client.get("/api/v1/projects/nope/metrics")).status_code == 404
    assert (await client.get("/api/v1/nodes/nope/metrics")).status_code == 404


async def test_projects_list(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/projects")).json()
    assert [(p["name"], p["allocatedGpus"], p["idleGpus"]) for p in body["projects"]] == [
        ("alpha", 2.0, 0.0),
        ("beta", 1.0, 1.0),
    ]


BAD = "/api/v1/namespaces/team-a/workloads/train/metrics"


@pytest.mark.parametrize(
    ("url", "parameter"),
    [
        (BAD + "?start=yesterday", "start"),
        (BAD + "?end=2026-13-45T00:00:00Z", "end"),
        (BAD + "?start=-5", "start"),
        (BAD + "?start=2026-11-22", "start"),
        (BAD + "?start=1050&end=1000", "end"),
        (BAD + "?step=0", "step"),
        (BAD + "?step=-15s", "step"),
        (BAD + "?step=fast", "step"),
        (BAD + "?start=0&end=1000000&step=15", "step"),
        (BAD + "?metric=gpu_bogus", "metric"),
        (BAD + "?metric=", "metric"),
        (BAD + "?by=rack", "by"),
        (BAD + "?by=gpu&by=pod", "by"),
        (BAD + "?stepp=15", "stepp"),
        ("/api/v1/projects/alpha/metrics?step=nan", "step"),
        ("/api/v1/nodes/node-a/metrics?start=inf", "start"),
        ("/api/v1/cluster/metrics?start=1e20", "start"),
        ("/api/v1/cluster/metrics?by=namespace", "by"),
        ("/api/v1/workloads?idle=maybe", "idle"),
        ("/api/v1/workloads?top=5", "top"),
    ],
)
async def test_bad_parameters_get_400_naming_them(
    client: httpx.AsyncClient, url: str, parameter: str
) -> None:
    response = await client.get(url)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "bad_parameter" and body["parameter"] == parameter
    assert parameter in body["message"]


async def test_prometheus_metrics_and_runai_names(client: httpx.AsyncClient) -> None:
    text = (await client.get("/metrics")).text
    assert (
        'gpuwm_workload_allocated_gpus{kind="Job",namespace="team-a",project="alpha",workload="train",workload_uid="uid-train"} 2.0'
        in text
    )
    assert (
        'gpuwm_workload_idle_gpu_seconds_total{kind="Job",namespace="team-b",project="beta",workload="notebook",workload_uid="uid-notebook"} 10800.0'
        in text
    )
    assert 'gpuwm_project_idle_gpus{project="beta"} 1.0' in text
    assert (
        'gpuwm_workload_pod_info{namespace="team-b",node="node-b",pod="notebook-0",project="beta",workload="notebook",workload_uid="uid-notebook"} 1.0'
        in text
    )
    assert (
        'runai_gpu_idle_seconds_per_workload{clusterId="c-1",namespace="team-b",project="beta",user="",'
        'workload_id="uid-notebook",workload_name="notebook",workload_type="training"} 645.0'
        in text
    )
    assert 'runai_allocated_gpu_count_per_project{clusterId="c-1",project="alpha"} 2.0' in text
    # only names Run:ai publishes (its metrics reference, cluster 2.17+): nothing invented under runai_
    published = {
        "runai_allocated_gpu_count_per_workload",
        "runai_gpu_utilization_per_workload",
        "runai_gpu_idle_seconds_per_workload",
        "runai_last_gpu_utilization_time_per_workload",
        "runai_gpu_memory_used_mebibytes_per_workload",
        "runai_wait_time_seconds_per_workload",
        "runai_run_time_seconds_per_workload",
        "runai_allocated_gpu_count_per_project",
        "runai_gpu_utilization_per_project",
        "runai_requested_gpus_per_workload",
        "runai_gpu_utilization_per_gpu",
        "runai_gpu_memory_used_mebibytes_per_gpu",
        "runai_gpu_memory_total_mebibytes_per_gpu",
        "runai_allocated_gpu_count_per_gpu",
        "runai_gpu_utilization_per_node",
        "runai_gpu_memory_used_mebibytes_per_node",
        "runai_gpu_memory_total_mebibytes_per_node",
        "runai_allocated_gpu_count_per_node",
        "runai_gpu_utilization_per_pod_per_gpu",
        "runai_gpu_memory_used_mebibytes_per_pod_per_gpu",
        "runai_allocated_gpu_count_per_pod",
    }
    emitted = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("runai_")}
    assert emitted and emitted <= published, emitted - published


async def test_runai_names_are_off_by_default(store: EmbeddedStore) -> None:
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        text = (await http.get("/metrics")).text
    assert "gpuwm_workload_allocated_gpus" in text and "runai_" not in text


async def test_openapi_docs_dashboard_health(client: httpx.AsyncClient) -> None:
    openapi = (await client.get("/openapi.json")).json()
    assert openapi["openapi"].startswith("3.")
    for path in (
        "/api/v1/workloads",
        "/api/v1/namespaces/{namespace}/workloads/{name}/metrics",
        "/api/v1/projects/{project}/metrics",
        "/api/v1/nodes/{node}/metrics",
        "/api/v1/cluster/metrics",
    ):
        assert path in openapi["paths"]
    docs = (await client.get("/docs")).text
    assert "/api/v1/cluster/metrics" in docs and "cdn" not in docs.lower()
    page = (await client.get("/")).text
    assert '<script src="/static/dashboard.js">' in page and "http" not in page.replace('href="#/"', "")
    script = await client.get("/static/dashboard.js")
    assert script.status_code == 200 and "drawChart" in script.text
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ok"}


def test_auth_none_logs_a_loud_warning(store: EmbeddedStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="gpuwm.api.app"):
        create_app(store, Settings(auth="none"))
    assert any("AUTHENTICATION IS OFF" in record.getMessage() for record in caplog.records)


def test_runai_workload_type_and_memory_by_share() -> None:
    from gpuwm.api.runai_metrics import _memory_used_mebibytes, runai_workload_type
    from gpuwm.model.figures import GpuFigures, WorkloadFigures

    assert [runai_workload_type(kind) for kind in ("PyTorchJob", "Job", "Deployment", "Pod", "Notebook")] == [
        "training",
        "training",
        "inference",
        "interactive",
        "interactive",
    ]
    whole = GpuFigures(node="n", uuid="GPU-a", units=1.0, device_units=1.0, memory_used_bytes=4 * 2**30)
    # a time-sliced quarter of a device using 8 GiB in all: a quarter of it is this workload's
    quarter = GpuFigures(node="n", uuid="GPU-b", units=0.25, device_units=1.0, memory_used_bytes=8 * 2**30)
    unsampled = GpuFigures(node="n", uuid="GPU-c", units=1.0, device_units=1.0)
    workload = WorkloadFigures(
        uid="u", namespace="ns", name="w", kind="Job", api_version="batch/v1", project="p", phase="Running",
        gpus=[whole, quarter, unsampled],
    )
    assert _memory_used_mebibytes(workload) == 4 * 1024 + 2 * 1024
    assert _memory_used_mebibytes(workload.model_copy(update={"gpus": [unsampled]})) is None


async def test_concurrent_queries_share_a_few_store_connections(store: EmbeddedStore) -> None:
    """40 queries at once run at most `concurrent_reads` store reads together, on as many connections."""
    import asyncio
    import threading
    import time

    running = 0
    most = 0
    lock = threading.Lock()
    query_range = store.query_range

    def slow_query(query: RangeQuery) -> list[Series]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)  # long enough that unlimited readers would overlap
        try:
            return query_range(query)
        finally:
            with lock:
                running -= 1

    store.query_range = slow_query  # type: ignore[method-assign]  # counts the reads running at once
    # the admission gate lets all 40 in: what bounds the reads here is the store's own limiter
    app = create_app(store, Settings(auth="none", api_max_concurrent_queries=40, api_max_concurrent_queries_per_user=40))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        responses = await asyncio.gather(*(
            http.get("/api/v1/cluster/metrics", params={"metric": "gpu_allocated"})
            for _ in range(40)
        ))
    assert [response.status_code for response in responses] == [200] * 40
    assert store.concurrent_reads == 4
    assert 1 < most <= store.concurrent_reads
    assert len(store._readers) <= store.concurrent_reads + 1  # +1: the fixture's own reads on the test's thread
