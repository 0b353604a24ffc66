"""The period report's cost: a priced history through the embedded store equals a hand computation (whole GPU,
MIG slice, time-sliced shares, energy), adds up over split periods, and says what it could not price."""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.api.report_cost import PeriodPricing, run_cost
from gpuwm.store import PeriodSums, WorkloadPeriod
from tests.unit.api.priced_history import BUSY_UNTIL, END, STEP, WATTS, PricedHistory, priced_history

H100, A100, L4 = 4.0, 2.8, 0.8  # the trace's prices per GPU-hour (EUR)
KWH = 0.25
#: the store keeps GPU-seconds to the millisecond: a period's, two edges apart, to 2 ms: 2.2e-6 EUR of an H100
MONEY = 5e-6
UNITS = {"whole": 1.0, "slice": 1 / 7, "share-a": 0.25, "share-b": 0.25}
PRICE = {"whole": H100, "slice": A100, "share-a": L4, "share-b": L4}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PricedHistory]:
    yield from priced_history(tmp_path_factory.mktemp("priced") / "gpuwm.db")


def _report(history: PricedHistory, start: float, end: float, by: str = "workload") -> dict[str, Any]:
    answer = history.client.get("/api/v1/report", params={"start": start, "end": end, "by": by})
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = answer.json()
    return report


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["workload"]: row for row in report["rows"]}


def test_a_runs_life_costs_its_gpu_hours_at_its_price_plus_energy(history: PricedHistory) -> None:
    report = _report(history, 0, history.latest + 60)
    assert report["currency"] == "EUR" and report["exact"] is True
    rows = _rows(report)
    hours, energy_cost = END / 3600, WATTS * END / 3.6e6 * KWH
    for name, units in UNITS.items():
        row, price = rows[name], PRICE[name]
        energy = energy_cost if name == "whole" else 0.0
        idle_hours = (END - BUSY_UNTIL) / 3600 if name == "whole" else hours
        assert row["pricePerGpuHour"] == pytest.approx(price), name
        assert row["cost"] == pytest.approx(units * hours * price + energy, abs=MONEY), name
        assert row["idleCost"] == pytest.approx(units * idle_hours * price, abs=MONEY), name
        assert row["energyCost"] == pytest.approx(energy, abs=MONEY), name
        assert (row["currency"], row["unpricedGpuHours"], row["apportionedCost"]) == ("EUR", 0.0, 0.0)
    project = _report(history, 0, history.latest + 60, by="project")["rows"][0]
    # the project's GPUs held and not used, apart: the H100's idle part, the slice and the L4 shares all along
    held_unused = 1.0 * (END - BUSY_UNTIL) / 3600 * H100 + (1 / 7) * hours * A100 + 0.5 * hours * L4
    assert project["idleCost"] == pytest.approx(held_unused, abs=MONEY)
    assert project["cost"] == pytest.approx(sum(row["cost"] for row in rows.values()), abs=MONEY)
    assert project["pricePerGpuHour"] is None  # a row of several runs names no one price


def test_a_middle_period_costs_what_was_held_in_it(history: PricedHistory) -> None:
    # the status intervals recorded at 300 .. 885: the figures accrued in (285, 885]
    rows = _rows(_report(history, 300, 900))
    seconds = 600.0
    for name, units in UNITS.items():
        energy = WATTS * seconds / 3.6e6 * KWH if name == "whole" else 0.0
        assert rows[name]["cost"] == pytest.approx(units * seconds / 3600 * PRICE[name] + energy, abs=MONEY), name
    # the H100 was busy up to BUSY_UNTIL, idle after it
    assert rows["whole"]["idleCost"] == pytest.approx((885 - BUSY_UNTIL) / 3600 * H100, abs=MONEY)


@pytest.mark.parametrize("cuts", [(0, 307.5, 700, 1e10), (100, 450, 451, 1200, 1230), (0, 15, 60, 1199.9, 2000)])
def test_cost_adds_up_over_split_periods(history: PricedHistory, cuts: tuple[float, ...]) -> None:
    whole = _report(history, cuts[0], cuts[-1])
    parts = [_report(history, low, high) for low, high in itertools.pairwise(cuts)]
    for column in ("cost", "idleCost", "energyCost", "allocatedGpuHours"):
        assert whole["total"][column] == pytest.approx(sum(part["total"][column] for part in parts), abs=1e-9), column
        for name, row in _rows(whole).items():
            split = sum(_rows(part)[name][column] for part in parts if name in _rows(part))
            assert row[column] == pytest.approx(split, abs=1e-9), (name, column)


def test_the_csv_carries_the_cost_columns(history: PricedHistory) -> None:
    answer = history.client.get("/api/v1/report", params={"start": 0, "end": history.latest + 1, "format": "csv"})
    lines = list(csv.DictReader(io.StringIO(answer.text)))
    total = _report(history, 0, history.latest + 1, by="project")["total"]
    assert lines[-1]["project"] == "total" and lines[-1]["currency"] == "EUR"
    for column in ("cost", "idleCost", "energyCost", "unpricedGpuHours"):
        assert float(lines[-1][column]) == pytest.approx(total[column], abs=1e-6), column


def test_what_has_no_price_is_said_apart(tmp_path: Path) -> None:
    # only the H100 is priced: the other runs' GPU-hours are unpriced, in no cost
    only_h100 = {"currency": "EUR", "energyPricePerKwh": KWH, "gpuModels": [{"model": "NVIDIA H100*",
                                                                             "pricePerGpuHour": H100}]}
    for history in priced_history(tmp_path / "gpuwm.db", recorded=only_h100, served=only_h100):
        report = _report(history, 0, history.latest + 1, by="project")
        (row,) = report["rows"]
        hours = END / 3600
        assert row["unpricedGpuHours"] == pytest.approx((1 / 7 + 0.5) * hours, abs=MONEY)
        assert row["cost"] == pytest.approx(hours * H100 + WATTS * END / 3.6e6 * KWH, abs=MONEY)
        assert _rows(_report(history, 0, history.latest + 1))["slice"]["pricePerGpuHour"] is None


def test_prices_in_another_currency_or_no_pricing_cost_nothing(tmp_path: Path) -> None:
    dollars = {"currency": "USD", "defaultPricePerGpuHour": 1.0}
    for history in priced_history(tmp_path / "usd.db", served=dollars):  # recorded in EUR, served in USD
        (row,) = _report(history, 0, history.latest + 1, by="project")["rows"]
        assert row["currency"] == "USD" and row["cost"] == 0.0
        assert row["unpricedGpuHours"] == pytest.approx(row["allocatedGpuHours"])
    for history in priced_history(tmp_path / "off.db", served={}):
        report = _report(history, 0, history.latest + 1, by="project")
        assert report["currency"] is None and report["total"]["cost"] is None
        assert report["total"]["allocatedGpuHours"] > 0


def test_a_period_edge_only_a_coarse_tier_holds_says_its_cost_is_not_exact(tmp_path: Path) -> None:
    # 15 s points kept 4 minutes, then 1 min roll-ups: an edge at 330 s cuts the 1 min bucket [300, 360)
    for history in priced_history(tmp_path / "gpuwm.db", tiers=("15s:4m", "1m:30m")):
        rows = _rows(_report(history, 330, history.latest + 1))
        for name, units in UNITS.items():  # the intervals recorded from 330 on: what accrued after 315
            row = rows[name]
            assert row["exact"] is False and row["apportionedGpuHours"] > 0, name
            assert row["apportionedCost"] == pytest.approx(row["apportionedGpuHours"] * PRICE[name], abs=MONEY), name
            assert row["cost"] == pytest.approx(row["allocatedGpuHours"] * PRICE[name] + row["energyCost"],
                                                abs=MONEY), name
            assert row["allocatedGpuHours"] == pytest.approx(units * (END - 315) / 3600, rel=0.05), name


def test_apportioned_gpu_hours_are_priced_apart() -> None:
    run = WorkloadPeriod(uid="u", namespace="ml", name="train", project="ml", kind="Job",
                         sums=PeriodSums(allocated_gpu_seconds=7200.0, idle_gpu_seconds=3600.0, energy_joules=3.6e6),
                         peak_allocated_gpus=1.0, apportioned_gpu_seconds=1800.0)
    cost = run_cost(run, PeriodPricing(currency="EUR", energy_price_per_kwh=0.5, gpu_hour_prices={"u": 2.0}))
    assert (cost.gpu_cost, cost.idle_cost, cost.energy_cost, cost.apportioned_cost) == (4.0, 2.0, 0.5, 1.0)
    assert math.isclose(cost.cost, 4.5)
    unpriced = run_cost(run, PeriodPricing(currency="EUR", energy_price_per_kwh=0.5, gpu_hour_prices={}))
    assert (unpriced.cost, unpriced.unpriced_gpu_seconds) == (0.5, 7200.0)


def test_the_history_is_recorded_every_status_interval(history: PricedHistory) -> None:
    assert history.latest == pytest.approx(END + 4 * STEP)


def test_the_terminal_table_shows_cost_where_priced(history: PricedHistory) -> None:
    from gpuwm.api.report_command import render_table

    report = _report(history, 0, history.latest + 1, by="project")
    lines = render_table(report).splitlines()
    assert lines[0].endswith("cost  idle cost")
    total = lines[-2].split()
    assert total[0] == "total" and float(total[-2]) == pytest.approx(report["total"]["cost"], abs=0.005)
    assert "cost in EUR" in lines[-1]
    unpriced = render_table({**report, "currency": None})
    assert "cost" not in unpriced.splitlines()[0]
