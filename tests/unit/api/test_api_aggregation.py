"""`aggregation=mean|min|max` of a range query through the HTTP API, against a real embedded store whose roll-up
tier answers: each point's min and max are the least and largest of the 15 s samples of its minute, the mean is
today's answer, the answer names its aggregation, and a bad value, `min` of a counter or `min`/`max` of a gauge
that keeps no extremes is a 400 naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model.figures import ClusterFigures
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import project, sample, workload

TIMES = [float(t) for t in range(0, 600, 15)]
URL = "/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_utilization_percent&start=0&end=300&step=60"


def utilization(t: float) -> float:
    """A GPU busy in bursts: every minute's four samples differ."""
    return float((t * 7) % 100)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    # the finest tier keeps 4 minutes, so minutes 0-5 come from the 1-minute roll-ups only
    store = EmbeddedStore(tmp_path / "gpuwm.db", tiers=["15s:4m", "1m:1h"])
    for t in TIMES:
        train = workload("train", [("gpu-0", 1.0, utilization(t))])
        store.record(t, [sample(t, "gpu-0", sm=utilization(t))], [train], [project("alpha", [train])],
                     ClusterFigures(gpus=1, healthy_gpus=1, total_gpu_units=1.0, allocated_gpus=1.0, workloads=1))
    store.compact(everything=True)
    app = create_app(store, Settings(auth="none", cluster_id="c-1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http
    store.close()


async def test_min_and_max_are_each_minutes_least_and_largest_sample(client: httpx.AsyncClient) -> None:
    answers = {}
    for aggregation in ("min", "max", "mean"):
        response = await client.get(f"{URL}&aggregation={aggregation}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["aggregation"] == aggregation and [s["tier"] for s in body["resolution"]] == ["1m:1h"]
        answers[aggregation] = [value for _, value in body["series"][0]["points"]]
    default = (await client.get(URL)).json()
    assert default["aggregation"] == "mean" and [v for _, v in default["series"][0]["points"]] == answers["mean"]
    for minute, (least, largest, mean) in enumerate(zip(answers["min"], answers["max"], answers["mean"], strict=True)):
        samples = [utilization(60 * minute + 15 * k) for k in range(4)]
        assert least == pytest.approx(min(samples), abs=0.5)  # the extremes are kept to 1 %
        assert largest == pytest.approx(max(samples), abs=0.5)
        assert mean == pytest.approx(sum(samples) / 4, abs=0.05)  # the means to 0.1 %
        assert least < mean < largest


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("&aggregation=median", "one of mean, min, max"),
        ("&aggregation=min&aggregation=max", "more than once"),
        ("&metric=gpu_energy_joules&aggregation=min", "gpu_energy_joules"),
        # a gauge whose roll-ups keep its mean only: the answer lists those that keep min and max
        ("&metric=gpu_sm_clock_mhz&aggregation=max", "max is kept for gpu_utilization_percent"),
        ("&metric=gpu_sm_clock_mhz&aggregation=min", "gpu_sm_clock_mhz"),
    ],
)
async def test_a_bad_aggregation_is_a_400_naming_it(client: httpx.AsyncClient, query: str, words: str) -> None:
    response = await client.get(URL + query)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["parameter"] == "aggregation" and words in body["message"]


async def test_max_of_a_counter_is_its_answer_as_ever(client: httpx.AsyncClient) -> None:
    energy = URL.replace("gpu_utilization_percent", "gpu_energy_joules")
    plain = (await client.get(energy)).json()["series"][0]["points"]
    largest = (await client.get(energy + "&aggregation=max")).json()["series"][0]["points"]
    assert largest == plain and any(value is not None for _, value in plain)
