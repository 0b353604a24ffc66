"""Every example request of docs/coming-from-*.md is served: each `GET /…` in backticks is run
through the HTTP API against the store of test_api_runs (workload `train`, runs uid-train-first and
uid-train-second, pods worker-0 and worker-1)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.store.embedded import EmbeddedStore

from .test_api_runs import FAILURE_REASON, populate

DOCS = Path(__file__).resolve().parents[3] / "docs"
PAGES = sorted(DOCS.glob("coming-from-*.md"))
#: the example column's requests: real paths (a template such as /workloads/{uid} names the form, not an example)
EXAMPLES = [
    (page.name, request)
    for page in PAGES
    for request in re.findall(r"`GET (/[^`\s]*)`", page.read_text())
    if "{" not in request and request.startswith(("/api/v1/", "/metrics"))
]


def test_a_page_per_seed_product_each_with_examples() -> None:
    names = {page.name for page in PAGES}
    assert names == {f"coming-from-{seed}.md" for seed in ("lyceum", "baseten", "runai", "pai", "modelarts")}
    assert {page for page, _ in EXAMPLES} == names


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedStore:
    return populate(tmp_path_factory.mktemp("docs") / "runs.db")


@pytest.fixture
async def client(store: EmbeddedStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


@pytest.mark.parametrize(("page", "request_path"), EXAMPLES)
async def test_example_request_is_served(client: httpx.AsyncClient, page: str, request_path: str) -> None:
    response = await client.get(request_path)
    assert response.status_code == 200, f"{page}: GET {request_path}: {response.text[:300]}"
    if request_path.startswith("/metrics"):
        assert "runai_gpu_utilization_per_gpu" in response.text
        return
    body = response.json()
    if "/metrics" in request_path:
        assert body["series"], f"{page}: GET {request_path} answered no series"
        assert any(value is not None for series in body["series"] for _, value in series["points"]), (
            f"{page}: GET {request_path} answered only nulls"
        )


def _value(body: dict[str, Any], metric: str, pod: str | None = None) -> float:
    """The one value every non-null point of one metric's series (of one pod) in a range answer has (within the
    stored chunks' quantisation)."""
    series = [s for s in body["series"] if s["metric"] == metric and (pod is None or s["labels"].get("pod") == pod)]
    values = [value for s in series for _, value in s["points"] if value is not None]
    assert values, (metric, pod)
    assert values == pytest.approx([values[-1]] * len(values), rel=1e-3), (metric, pod, values)
    return float(values[-1])


async def test_the_rows_issue_39_left_answer_their_figures(client: httpx.AsyncClient) -> None:
    """Baseten's error_message, ephemeral_storage.utilization and instance type, PAI's disk rates: the example
    requests of their rows answer the fixture's figures, not only some series."""
    run = "/api/v1/workloads/uid-train"
    failed = (await client.get(f"{run}-first")).json()
    assert failed["failureReason"] == FAILURE_REASON
    in_range = (await client.get(f"{run}-first/metrics?metric=gpu_allocated")).json()
    assert in_range["workload"]["failureReason"] == FAILURE_REASON
    assert (await client.get(f"{run}-second")).json()["failureReason"] is None
    storage = (
        await client.get(f"{run}-second/metrics?metric=ephemeral_storage_used_bytes,ephemeral_storage_limit_bytes"
                         "&leader=true")
    ).json()
    assert _value(storage, "ephemeral_storage_used_bytes") == pytest.approx(5e9, rel=1e-3)
    assert _value(storage, "ephemeral_storage_limit_bytes") == pytest.approx(20e9, rel=1e-3)  # the leader's: 25 % used
    disk = (
        await client.get(f"{run}-second/metrics?metric=disk_read_bytes_per_second,disk_write_bytes_per_second&by=pod")
    ).json()
    assert _value(disk, "disk_read_bytes_per_second", "worker-0") == pytest.approx(3e6, rel=1e-3)
    assert _value(disk, "disk_read_bytes_per_second", "worker-1") == pytest.approx(4e6, rel=1e-3)
    assert _value(disk, "disk_write_bytes_per_second", "worker-1") == pytest.approx(4e5, rel=1e-3)
    instance = (
        await client.get(f"{run}-second/metrics?metric=cpu_limit_cores,memory_limit_bytes,gpu_memory_total_bytes"
                         "&leader=true")
    ).json()
    assert _value(instance, "cpu_limit_cores") == pytest.approx(4.0, rel=1e-3)
    assert _value(instance, "memory_limit_bytes") == pytest.approx(8e9, rel=1e-3)
    assert _value(instance, "gpu_memory_total_bytes") == pytest.approx(80 * 1024.0**3, rel=1e-3)
    assert (await client.get(f"{run}-second")).json()["allocatedGpus"] == 2.0
