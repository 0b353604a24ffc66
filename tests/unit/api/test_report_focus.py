"""`format=focus`: the period's charges as FinOps FOCUS columns, a GPU Time charge per priced run and a GPU
Energy charge where energy is priced, whose totals are the report's, over any period and its parts."""

from __future__ import annotations

import asyncio
import csv
import io
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.api.app import create_app
from gpuwm.api.focus import EXTRA_COLUMNS, FOCUS_COLUMNS, FocusParty, focus_csv
from gpuwm.api.report import Report, ReportRow
from gpuwm.api.server import ApiServer
from gpuwm.cli import main
from gpuwm.config import Settings
from tests.unit.api.priced_history import PRICES, PricedHistory, priced_history

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
MONEY = 1e-6


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PricedHistory]:
    yield from priced_history(tmp_path_factory.mktemp("focus") / "gpuwm.db")


def _focus(history: PricedHistory, start: float, end: float) -> list[dict[str, str]]:
    answer = history.client.get("/api/v1/report", params={"start": start, "end": end, "format": "focus"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv") and "gpuwm-focus.csv" in answer.headers[
        "content-disposition"]
    header = answer.text.splitlines()[0].split(",")
    assert tuple(header) == FOCUS_COLUMNS + EXTRA_COLUMNS  # FOCUS's columns first, the custom ones after
    return list(csv.DictReader(io.StringIO(answer.text)))


def _total(history: PricedHistory, start: float, end: float) -> dict[str, Any]:
    answer = history.client.get("/api/v1/report", params={"start": start, "end": end})
    total: dict[str, Any] = answer.json()["total"]
    return total


def _sum(lines: list[dict[str, str]], column: str, meter: str | None = None) -> float:
    return sum(float(line[column] or 0) for line in lines if meter is None or line["SkuMeter"] == meter)


def test_the_focus_files_totals_are_the_reports(history: PricedHistory) -> None:
    end = history.latest + 1
    lines, total = _focus(history, 0, end), _total(history, 0, end)
    gpu = [line for line in lines if line["SkuMeter"] == "GPU Time"]
    assert {line["ResourceName"] for line in gpu} == {"ml/whole", "ml/slice", "ml/share-a", "ml/share-b"}
    assert _sum(lines, "BilledCost") == pytest.approx(total["cost"], abs=MONEY)
    assert _sum(lines, "EffectiveCost") == pytest.approx(total["cost"], abs=MONEY)
    assert _sum(lines, "x_IdleCost") == pytest.approx(total["idleCost"], abs=MONEY)
    assert _sum(lines, "BilledCost", "GPU Energy") == pytest.approx(total["energyCost"], abs=MONEY)
    assert _sum(gpu, "ConsumedQuantity") == pytest.approx(total["allocatedGpuHours"], abs=MONEY)
    assert _sum(gpu, "x_ActiveGpuHours") == pytest.approx(total["activeGpuHours"], abs=MONEY)
    (energy,) = [line for line in lines if line["SkuMeter"] == "GPU Energy"]  # only the whole H100 has energy
    assert (energy["ResourceName"], energy["PricingUnit"], energy["ListUnitPrice"]) == ("ml/whole", "kWh",
                                                                                         "0.250000000")
    for line in lines:
        assert line["BillingCurrency"] == "EUR" and line["ChargeCategory"] == "Usage" and line["ChargeClass"] == ""
        assert float(line["ListUnitPrice"]) * float(line["PricingQuantity"]) == pytest.approx(
            float(line["ListCost"]), abs=1e-8)
        assert line["BilledCost"] == line["ListCost"] == line["ContractedCost"] == line["EffectiveCost"]
        assert all(ISO_UTC.match(line[column]) for column in ("ChargePeriodStart", "ChargePeriodEnd",
                                                                "BillingPeriodStart", "BillingPeriodEnd"))
        assert line["SubAccountId"] == "vision" and line["ResourceId"].startswith("wl-")
        assert json.loads(line["Tags"])["gpuwm.io/project"] == "vision"


@pytest.mark.parametrize("cuts", [(0, 300, 900, 1e10), (15, 451.5, 1200)])
def test_the_focus_files_of_a_periods_parts_add_up_to_its_own(history: PricedHistory,
                                                               cuts: tuple[float, ...]) -> None:
    whole = _focus(history, cuts[0], cuts[-1])
    parts = [_focus(history, low, high) for low, high in itertools.pairwise(cuts)]
    for column in ("BilledCost", "x_IdleCost", "ConsumedQuantity"):
        assert _sum(whole, column) == pytest.approx(sum(_sum(part, column) for part in parts), abs=MONEY), column


def test_a_run_with_no_price_has_no_gpu_time_charge(tmp_path: Path) -> None:
    only_h100 = {**PRICES, "gpuModels": [{"model": "NVIDIA H100*", "pricePerGpuHour": 4.0}]}
    for history in priced_history(tmp_path / "gpuwm.db", recorded=only_h100, served=only_h100):
        lines = _focus(history, 0, history.latest + 1)
        total = _total(history, 0, history.latest + 1)
        assert [(line["ResourceName"], line["SkuMeter"]) for line in lines] == [("ml/whole", "GPU Time"),
                                                                               ("ml/whole", "GPU Energy")]
        assert _sum(lines, "BilledCost") == pytest.approx(total["cost"], abs=MONEY)
        assert _sum(lines, "ConsumedQuantity", "GPU Time") == pytest.approx(
            total["allocatedGpuHours"] - total["unpricedGpuHours"], abs=MONEY)


def test_focus_needs_pricing(tmp_path: Path) -> None:
    for history in priced_history(tmp_path / "gpuwm.db", served={}):
        answer = history.client.get("/api/v1/report", params={"format": "focus"})
        assert answer.status_code == 400 and answer.json()["parameter"] == "format"
        assert "pricing" in answer.json()["message"]


def test_focus_cells_are_neutralised_and_numbers_kept() -> None:
    row = ReportRow(project="@team", namespace="=cmd|' /C calc'!A0", workload="-train", workload_uid="+uid",
                    kind="Job", workloads=1, allocated_gpu_hours=2.0, unmonitored_gpu_hours=-0.5, energy_joules=0.0,
                    cost=8.0, idle_cost=0.0, energy_cost=0.0, currency="EUR", price_per_gpu_hour=4.0)
    report = Report(start=0.0, end=3600.0, step_seconds=15.0, by="workload", idle_threshold_percent=1.0, exact=True,
                    rows=[row], total=row, currency="EUR")
    (line,) = csv.DictReader(io.StringIO(focus_csv(report, 0.0, FocusParty.of_cluster(""))))
    assert (line["ResourceName"], line["x_Namespace"], line["x_Project"], line["ResourceId"]) == (
        "'=cmd|' /C calc'!A0/-train", "'=cmd|' /C calc'!A0", "'@team", "'+uid")
    assert line["SubAccountId"] == "'@team" and line["ProviderName"] == "Kubernetes"
    assert line["x_UnmonitoredGpuHours"] == "-0.500000000" and line["BilledCost"] == "8.000000000"
    assert json.loads(line["Tags"])["gpuwm.io/namespace"] == "=cmd|' /C calc'!A0"  # JSON text, starting with {


async def test_gpuwm_report_writes_the_focus_file(history: PricedHistory, capsys: pytest.CaptureFixture[str]) -> None:
    server = ApiServer(create_app(history.store, Settings(auth="none", pricing=PRICES, cluster_id="gpu-east")),
                       "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        period = ["--start", "0", "--end", str(history.latest + 1)]
        assert await asyncio.to_thread(main, ["report", "--server", url, "--format", "focus", *period]) == 0
        out = capsys.readouterr().out
        lines = list(csv.DictReader(io.StringIO(out)))
        assert lines and {line["BillingAccountId"] for line in lines} == {"gpu-east"}
        assert _sum(lines, "BilledCost") == pytest.approx(_total(history, 0, history.latest + 1)["cost"], abs=MONEY)
    finally:
        await server.stop()
