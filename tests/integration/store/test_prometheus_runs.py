"""A reused name's runs over the real Debian `prometheus`: by UID and `pod=` through the HTTP API,
with the same answers as the embedded store holding the same data."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model.figures import WorkloadFigures
from gpuwm.store import Store
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, Interval
from tests.unit.api.test_api_runs import run_figures, samples
from tests.unit.store.store_data import project

pytestmark = REAL_PROMETHEUS

T0 = math.floor((time.time() - 2 * 3600) / 60) * 60
FIRST = [float(T0 + 15 * k) for k in range(8)]
SECOND = [float(T0 + 15 * k) for k in range(8, 20)]


def _run(run: str, t: float, times: list[float], ended: float | None = None) -> WorkloadFigures:
    figures = run_figures(run, t - T0, ended=None if ended is None else ended - T0)
    return figures.model_copy(update={
        "created_time": times[0], "start_time": times[0], "end_time": ended,
        "gpus": [g.model_copy(update={"last_sample_time": t}) for g in figures.gpus] if ended is None else [],
        "allocated_gpus": 2.0 if ended is None else 0.0,
    })


@pytest.fixture(scope="module")
def intervals() -> list[Interval]:
    ended = _run("first", FIRST[-1], FIRST, ended=FIRST[-1])
    recorded = []
    for times, run in ((FIRST, "first"), (SECOND, "second")):
        for t in times:
            job = _run(run, t, times)
            shown = [job] if run == "first" else [ended, job]
            gpu_samples = [each.model_copy(update={"t": t}) for each in samples(run, t - T0)]
            recorded.append(Interval(t, gpu_samples, shown, [project("alpha", [job])], 2))
    return recorded


@pytest.fixture(scope="module")
def evaluation_time() -> float:
    return SECOND[-1]


async def _client(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


@pytest.mark.parametrize("backend", ["embedded", "prometheus"])
async def test_runs_by_uid_and_one_pod(stores: tuple[EmbeddedStore, PrometheusStore], backend: str) -> None:
    store: Store = stores[0] if backend == "embedded" else stores[1]
    async for http in _client(store):
        newest = (await http.get("/api/v1/namespaces/team-a/workloads/train")).json()
        assert newest["uid"] == "uid-train-second"
        first = await http.get("/api/v1/workloads/uid-train-first")
        assert first.status_code == 200, first.text
        assert first.json()["endTime"] == FIRST[-1]
        params: dict[str, str | float] = {
            "metric": "gpu_utilization_percent", "pod": "worker-1", "start": SECOND[0], "end": SECOND[-1]
        }
        one = await http.get("/api/v1/workloads/uid-train-second/metrics", params=params)
        assert one.status_code == 200, one.text
        (util,) = one.json()["series"]
        assert util["labels"]["pod"] == "worker-1"
        assert [v for _, v in util["points"]] == [samples("second", t - T0)[1].sm_percent for t in SECOND]
        unknown = await http.get("/api/v1/workloads/uid-train-second/metrics", params={**params, "pod": "worker-9"})
        assert unknown.status_code == 400 and unknown.json()["parameter"] == "pod"
