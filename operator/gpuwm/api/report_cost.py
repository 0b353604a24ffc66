"""What a period report's rows cost: each run's exact GPU-seconds of the period at its price per GPU-hour.

The GPU-seconds are the period's own (`Store.period`: differences of the engine's counters, never averaged
gauges); a run's price is the one the controller gave it (`Store.gpu_hour_prices`: the units-weighted mean
price of the devices it held, by node label, GPU model or the default, as `gpuwm.accounting.CostMeter`
prices the CRs). GPU-seconds are units x seconds, so a MIG slice or a time-sliced replica pays its units'
share of its GPU's price. Energy is priced by the kWh (`pricing.energyPricePerKwh`).

A row's cost is linear in its runs' sums: while a run's price holds, periods add up in money as in
GPU-hours (report[a,c) = report[a,b) + report[b,c)), and a finished run's cost over a period that holds its
life is its CR's. A run with no price (no rule matches its devices, or it ran before pricing was on)
adds its GPU-hours to `unpricedGpuHours` instead of a cost; its energy is still priced. Where a row's
GPU-hours were apportioned by time (`exact` false), `apportionedCost` is the part of its cost that rests on
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwm.accounting import energy_cost, gpu_seconds_cost
from gpuwm.config import PricingSettings
from gpuwm.store import Additive, GpuHourPrice, WorkloadPeriod

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class PeriodPricing:
    """How a report prices its runs: their prices per GPU-hour (uid -> price, in `currency`) and the kWh's."""

    currency: str
    energy_price_per_kwh: float
    gpu_hour_prices: Mapping[str, float]

    @classmethod
    def of(cls, pricing: PricingSettings, recorded: Mapping[str, GpuHourPrice]) -> PeriodPricing:
        """The settings' currency and kWh price, and the prices recorded in that currency (one recorded in
        another, before the currency was changed, prices nothing: it is not this report's money)."""
        return cls(currency=pricing.currency, energy_price_per_kwh=pricing.energy_price_per_kwh,
                   gpu_hour_prices={uid: price.price_per_gpu_hour for uid, price in recorded.items()
                                    if price.currency == pricing.currency})


@dataclass(frozen=True)
class PeriodCost(Additive):
    """One run's (or a row's summed) cost over a period; every field adds up over runs and periods."""

    gpu_cost: float = 0.0
    idle_cost: float = 0.0
    energy_cost: float = 0.0
    #: the part of `gpu_cost` on GPU-seconds apportioned by time
    apportioned_cost: float = 0.0
    unpriced_gpu_seconds: float = 0.0

    @property
    def cost(self) -> float:
        return self.gpu_cost + self.energy_cost


def run_cost(run: WorkloadPeriod, pricing: PeriodPricing) -> PeriodCost:
    """A run's period figures at its price (its GPU-hours unpriced where it has none)."""
    energy = energy_cost(run.sums.energy_joules, pricing.energy_price_per_kwh)
    rate = pricing.gpu_hour_prices.get(run.uid)
    if rate is None:
        return PeriodCost(energy_cost=energy, unpriced_gpu_seconds=run.sums.allocated_gpu_seconds)
    return PeriodCost(
        gpu_cost=gpu_seconds_cost(run.sums.allocated_gpu_seconds, rate),
        idle_cost=gpu_seconds_cost(run.sums.idle_gpu_seconds, rate), energy_cost=energy,
        apportioned_cost=gpu_seconds_cost(run.apportioned_gpu_seconds, rate),
    )


def cost_columns(members: Iterable[WorkloadPeriod], pricing: PeriodPricing, one_run: bool) -> dict[str, Any]:
    """A report row's cost columns (ReportRow's field names) over its runs; `one_run`: a by=workload row,
    which also names its run's price per GPU-hour."""
    runs = list(members)
    total = PeriodCost()
    for run in runs:
        total = total.plus(run_cost(run, pricing))
    columns: dict[str, Any] = {
        "cost": total.cost, "idle_cost": total.idle_cost, "energy_cost": total.energy_cost,
        "currency": pricing.currency, "unpriced_gpu_hours": total.unpriced_gpu_seconds / SECONDS_PER_HOUR,
        "apportioned_cost": total.apportioned_cost,
    }
    if one_run and len(runs) == 1:
        columns["price_per_gpu_hour"] = pricing.gpu_hour_prices.get(runs[0].uid)
    return columns
