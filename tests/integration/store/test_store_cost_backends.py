"""The period report's cost through the Prometheus store, against a real Prometheus and a real VictoriaMetrics,
equals the embedded store's for the same priced history: each run's price from the controller's
`gpuwm_workload_gpu_hourly_cost` (rendered by the real policy room's collector), its GPU-seconds from the
counters, over whole and split periods, and the FOCUS file's totals with them."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.controller.policy import PolicyCollector, PolicyRoom
from gpuwm.model import GpuSample, ProjectFigures, WorkloadFigures
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.openmetrics_backfill import OpenMetricsBackfill
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, backfill, running_prometheus
from tests.integration.store.victoria_fixture import import_openmetrics, running_victoria_metrics
from tests.unit.api.priced_history import END, PRICES, STEP, record_priced_trace

pytestmark = REAL_PROMETHEUS

#: before the machine's now (VictoriaMetrics refuses samples from the future), on the status interval
START = 1_790_000_100.0
COLUMNS = ("cost", "idleCost", "energyCost", "allocatedGpuHours", "unpricedGpuHours")
#: GPU-seconds to the millisecond in the embedded store, to the sample's float in Prometheus
MONEY = 5e-6


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TestClient]]:
    """An API priced like the controller over each backend holding the same priced history."""
    workdir = tmp_path_factory.mktemp("cost")
    embedded = EmbeddedStore(workdir / "gpuwm.db")
    scraped = OpenMetricsBackfill()

    def scrape(t: float, samples: list[GpuSample], workloads: list[WorkloadFigures],
               projects: list[ProjectFigures], room: PolicyRoom) -> None:
        latest = {sample.uuid: sample for sample in samples}  # what a scrape at t sees: each device's latest
        scraped.add(t, list(latest.values()), workloads, projects)
        scraped.add_collected(t, PolicyCollector(room))

    latest = record_priced_trace(embedded, PRICES, offset=START, sink=scrape)
    text = io.StringIO()
    scraped.write(text)
    (workdir / "data.om").write_text(text.getvalue())
    backfill(workdir / "data.om", workdir / "tsdb")
    settings = Settings(auth="none", status_interval=STEP, pricing=PRICES)
    try:
        with running_prometheus(workdir / "tsdb", workdir) as prometheus, running_victoria_metrics(workdir) as victoria:
            import_openmetrics(victoria, text.getvalue())
            stores = {"embedded": embedded, "prometheus": PrometheusStore(prometheus, evaluation_time=latest),
                      "victoria-metrics": PrometheusStore(victoria, evaluation_time=latest)}
            yield {name: TestClient(create_app(store, settings)) for name, store in stores.items()}
    finally:
        embedded.close()


def _report(client: TestClient, start: float, end: float, **extra: str) -> Any:
    answer = client.get("/api/v1/report", params={"start": start, "end": end, "by": "workload", **extra})
    assert answer.status_code == 200, answer.text
    return answer.json() if "format" not in extra else list(csv.DictReader(io.StringIO(answer.text)))


def _by_run(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["workloadUid"]: row for row in report["rows"]}


#: edges on the status interval, as in test_store_periods_backends: the embedded store snaps an edge to its
#: finest step, the Prometheus store reads to the millisecond, so between them an edge inside an interval
#: may fall on either side of it (each backend adds up on its own, below)
PERIODS = [(START - 3600, START + END + 3600), (START + 300, START + 900), (START + 450, START + 1200)]


@pytest.mark.parametrize(("start", "end"), PERIODS)
def test_every_backend_prices_a_period_alike(clients: dict[str, TestClient], start: float, end: float) -> None:
    expected = _by_run(_report(clients["embedded"], start, end))
    assert expected and all(row["cost"] > 0 for row in expected.values())
    for name, client in clients.items():
        report = _report(client, start, end)
        assert report["currency"] == "EUR", name
        found = _by_run(report)
        assert set(found) == set(expected), name
        for uid, row in found.items():
            assert row["pricePerGpuHour"] == pytest.approx(expected[uid]["pricePerGpuHour"]), (name, uid)
            for column in COLUMNS:
                assert row[column] == pytest.approx(expected[uid][column], abs=MONEY), (name, uid, column)


def test_cost_adds_up_on_every_backend_and_focus_says_the_same(clients: dict[str, TestClient]) -> None:
    cuts = [START, START + 307.5, START + 700, START + END + 60]
    for name, client in clients.items():
        whole = _report(client, cuts[0], cuts[-1])["total"]
        parts = [_report(client, low, high)["total"] for low, high in itertools.pairwise(cuts)]
        for column in ("cost", "idleCost", "energyCost"):
            assert whole[column] == pytest.approx(sum(part[column] for part in parts), abs=MONEY), (name, column)
        focus = _report(client, cuts[0], cuts[-1], format="focus")
        assert sum(float(line["BilledCost"]) for line in focus) == pytest.approx(whole["cost"], abs=MONEY), name
