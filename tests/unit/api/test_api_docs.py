"""Every example request of docs/coming-from-*.md (issue 39 §7) is served: each `GET /…` in backticks is run
through the HTTP API against the store of test_api_runs (workload `train`, runs uid-train-first and
uid-train-second, pods worker-0 and worker-1)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.store.embedded import EmbeddedStore

from .test_api_runs import populate

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
