"""What the GPUs cost: each workload's and project's GPU-seconds priced (`pricing` in the settings).

A GPU-hour's price is found for each device, by the labels of its node first, then by its GPU model,
then the default. A device's units take that share of it: a 1g slice of a 7-slice MIG GPU held for an
hour costs a seventh of its GPU's hour, a replica of a GPU time-sliced four ways a quarter. A workload's
price per GPU-hour is the units-weighted mean over the devices it holds now, or held when last seen
holding any (remembered by `CostMeter`); its cost is its GPU-seconds (DESIGN §3: units x seconds) at that
price, plus its energy at the kWh price. So cost is priced from the engine's exact sums, never from
sampled gauges: idle cost is the idle GPU-seconds priced, and a project's figures are its workloads' sums.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwm.config import PricingSettings
from gpuwm.model import GpuFigures, ProjectFigures, WorkloadFigures

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6

#: node name -> its labels, where known (the controller's watch of nodes; nothing in a replay)
NodeLabels = Callable[[str], Mapping[str, str] | None]


def _no_labels(_node: str) -> Mapping[str, str] | None:
    return None


def _label_matches(rule: str, labels: Mapping[str, str]) -> bool:
    key, separator, value = rule.partition("=")
    return labels.get(key.strip()) == value.strip() if separator else key.strip() in labels


class PriceBook:
    """The price of a GPU-hour of a device, from `pricing`; None where no rule prices it."""

    def __init__(self, pricing: PricingSettings, node_labels: NodeLabels = _no_labels) -> None:
        self.pricing = pricing
        self.node_labels = node_labels

    def gpu_hour(self, model: str | None, node: str | None) -> float | None:
        labels = self.node_labels(node) if node else None
        if labels:
            for rule in self.pricing.node_labels:
                if _label_matches(rule.label, labels):
                    return rule.price_per_gpu_hour
        if model:
            for price in self.pricing.gpu_models:
                if fnmatch.fnmatchcase(model.lower(), price.model.lower()):
                    return price.price_per_gpu_hour
        return self.pricing.default_price_per_gpu_hour

    def rate_of_devices(self, gpus: Iterable[GpuFigures]) -> float | None:
        """Units-weighted mean price per GPU-hour of the devices; None when one of them is unpriced or none is held."""
        units = weighted = 0.0
        for gpu in gpus:
            if gpu.units <= 0:
                continue
            price = self.gpu_hour(gpu.model, gpu.node)
            if price is None:
                return None
            units += gpu.units
            weighted += gpu.units * price
        return weighted / units if units > 0 else None


@dataclass(frozen=True)
class WorkloadCost:
    """A workload's cost figures; `None` where its GPU-hours are not priced."""

    price_per_gpu_hour: float | None
    cost_per_hour: float | None
    cost: float | None
    idle_cost: float | None
    energy_cost: float
    idle_cost_per_hour: float | None


@dataclass(frozen=True)
class ProjectCost:
    """A project's sums; each is None where none of its workloads is priced."""

    cost_per_hour: float | None
    cost: float | None
    idle_cost: float | None
    energy_cost: float
    idle_cost_per_hour: float | None


def _sum(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def gpu_seconds_cost(gpu_seconds: float, rate: float) -> float:
    """GPU-seconds (units x seconds) at `rate` per GPU-hour: a slice or replica pays its units' share."""
    return gpu_seconds / SECONDS_PER_HOUR * rate


def energy_cost(energy_joules: float, price_per_kwh: float) -> float:
    return energy_joules / JOULES_PER_KWH * price_per_kwh


def price_figures(figures: WorkloadFigures, rate: float | None, energy_price_per_kwh: float) -> WorkloadCost:
    """A workload's figures priced at `rate` per GPU-hour (pure: replay, the controller and, over a period's
    figures, the period report alike)."""
    energy = energy_cost(figures.energy_joules, energy_price_per_kwh)
    if rate is None:
        return WorkloadCost(price_per_gpu_hour=None, cost_per_hour=None, cost=None, idle_cost=None,
                            energy_cost=energy, idle_cost_per_hour=None)
    return WorkloadCost(
        price_per_gpu_hour=rate, cost_per_hour=figures.allocated_gpus * rate,
        cost=gpu_seconds_cost(figures.allocated_gpu_seconds, rate) + energy,
        idle_cost=gpu_seconds_cost(figures.idle_gpu_seconds, rate), energy_cost=energy,
        idle_cost_per_hour=figures.idle_gpus * rate,
    )


class CostMeter:
    """Prices workloads and projects; remembers each workload's rate from the devices it was last seen holding."""

    def __init__(self, pricing: PricingSettings, node_labels: NodeLabels = _no_labels) -> None:
        self.book = PriceBook(pricing, node_labels)
        self.rates: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.book.pricing.enabled

    @property
    def currency(self) -> str:
        return self.book.pricing.currency

    def rate(self, figures: WorkloadFigures) -> float | None:
        """Its price per GPU-hour: of the devices it holds now, else as last seen, else its model's or the default."""
        current = self.book.rate_of_devices(figures.gpus)
        if current is not None:
            self.rates[figures.uid] = current
            return current
        remembered = self.rates.get(figures.uid)
        if remembered is not None:
            return remembered
        node = figures.nodes[0] if len(figures.nodes) == 1 else None
        return self.book.gpu_hour(figures.gpu_model, node)

    def workload(self, figures: WorkloadFigures) -> WorkloadCost:
        return price_figures(figures, self.rate(figures), self.book.pricing.energy_price_per_kwh)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the rates of workloads not in `keep` (the engine forgot them)."""
        kept = set(keep)
        for uid in [uid for uid in self.rates if uid not in kept]:
            del self.rates[uid]

    def save(self) -> dict[str, Any]:
        return {"rates": dict(self.rates)}

    def restore(self, saved: Mapping[str, Any]) -> None:
        for uid, rate in (saved.get("rates") or {}).items():
            if isinstance(rate, int | float):
                self.rates[str(uid)] = float(rate)


def project_costs(projects: Iterable[ProjectFigures], workloads: Iterable[tuple[WorkloadFigures, WorkloadCost]]
                  ) -> dict[str, ProjectCost]:
    """Each project's sums over its workloads' costs (a project of unpriced workloads: None figures)."""
    members: dict[str, list[WorkloadCost]] = {}
    for figures, cost in workloads:
        members.setdefault(figures.project, []).append(cost)
    result: dict[str, ProjectCost] = {}
    for project in projects:
        costs = members.get(project.name, [])
        result[project.name] = ProjectCost(
            cost_per_hour=_sum(cost.cost_per_hour for cost in costs), cost=_sum(cost.cost for cost in costs),
            idle_cost=_sum(cost.idle_cost for cost in costs), energy_cost=sum(cost.energy_cost for cost in costs),
            idle_cost_per_hour=_sum(cost.idle_cost_per_hour for cost in costs),
        )
    return result
