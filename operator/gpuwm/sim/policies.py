"""The demo's idle policy (a dry run) and prices: what the policy would do to the simulated fleet, and what
its idle GPUs cost.

The same evaluator and cost meter as the controller's (`gpuwm.accounting`), fed the simulated engine's
figures each status interval. The prices are the demo's own (list prices of the simulated GPU models, for
illustration); `gpuwm demo --pricing FILE --policy FILE` replaces them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpuwm.accounting import CostMeter, Policy, PolicyEvaluator, Subject
from gpuwm.config import PricingSettings
from gpuwm.model import WorkloadFigures
from gpuwm.store import GpuHourPrice

DEMO_PRICING = PricingSettings.model_validate({
    "currency": "USD", "energyPricePerKwh": 0.15,
    "gpuModels": [{"model": "NVIDIA H100*", "pricePerGpuHour": 4.0},
                  {"model": "NVIDIA A100*", "pricePerGpuHour": 2.5},
                  {"model": "NVIDIA L4*", "pricePerGpuHour": 0.8}],
})


def demo_policy() -> Policy:
    """Warn after 10 idle minutes; 20 minutes later scale notebooks and services to zero or suspend jobs."""
    return Policy.parse("demo-idle-gpus", None, {
        "idleFor": "10m", "dryRun": True,
        "actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "20m"}, {"type": "suspend", "after": "20m"}],
    })


@dataclass
class DemoPolicies:
    """The dry-run policies' steps so far and the fleet's cost, each status interval."""

    policies: list[Policy]
    meter: CostMeter
    evaluator: PolicyEvaluator = field(default_factory=PolicyEvaluator)
    would: Counter[str] = field(default_factory=Counter)  # action -> steps a dry run passed
    cost: float = 0.0
    idle_cost: float = 0.0
    idle_cost_per_hour: float = 0.0
    #: each priced workload's price per GPU-hour this interval, for the store (as the controller keeps them)
    prices: dict[str, GpuHourPrice] = field(default_factory=dict)

    @classmethod
    def with_defaults(cls, policies: list[Policy] | None = None, pricing: PricingSettings | None = None
                      ) -> DemoPolicies:
        return cls(policies=policies if policies is not None else [demo_policy()],
                   meter=CostMeter(pricing if pricing is not None else DEMO_PRICING))

    def observe(self, workloads: list[WorkloadFigures], now: float) -> None:
        subjects = [Subject(figures=figures, reporting=figures.sampling) for figures in workloads]
        steps, _ = self.evaluator.evaluate(self.policies, subjects, now)
        for step in steps:
            self.would[step.action] += 1
            # a demo never acts: every step counts as a dry run's, so the chain goes on as it would
            self.evaluator.record(step, "DryRun", now)
        costs = [self.meter.workload(figures) for figures in workloads]
        self.prices = {figures.uid: GpuHourPrice(cost.price_per_gpu_hour, self.meter.currency)
                       for figures, cost in zip(workloads, costs, strict=True) if cost.price_per_gpu_hour is not None}
        self.cost = sum(cost.cost or 0.0 for cost in costs)
        self.idle_cost = sum(cost.idle_cost or 0.0 for cost in costs)
        self.idle_cost_per_hour = sum(cost.idle_cost_per_hour or 0.0 for cost in costs)
        self.meter.forget(figures.uid for figures in workloads)

    def summary(self) -> str:
        """One line for the terminal: what the dry run would have done, and the money idle GPUs cost."""
        currency = self.meter.currency
        names = ", ".join(policy.key for policy in self.policies) or "none"
        done = ", ".join(f"{action} {count}" for action, count in sorted(self.would.items())) or "nothing yet"
        share = 100.0 * self.idle_cost / self.cost if self.cost > 0 else 0.0
        return (f"policy {names} (dry run) would have done: {done} | idle GPUs cost {self.idle_cost:,.2f} {currency} "
                f"({share:.0f}% of {self.cost:,.2f}), {self.idle_cost_per_hour:,.2f} {currency}/h now")
