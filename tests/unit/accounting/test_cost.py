"""The price book and cost meter: node labels before models before the default, rates remembered after the end."""

from __future__ import annotations

import math

from gpuwm.accounting import CostMeter, PriceBook, price_figures
from gpuwm.config import PricingSettings
from gpuwm.model import GpuFigures, WorkloadFigures

PRICING = PricingSettings.model_validate({
    "defaultPricePerGpuHour": 1.0,
    "gpuModels": [{"model": "NVIDIA A100*", "pricePerGpuHour": 3.0}],
    "nodeLabels": [{"label": "cloud.google.com/gke-spot=true", "pricePerGpuHour": 0.9},
                   {"label": "reserved", "pricePerGpuHour": 2.0}],
})
LABELS = {"spot-1": {"cloud.google.com/gke-spot": "true"}, "res-1": {"reserved": "yes"}, "plain": {"zone": "a"}}


def test_node_labels_then_models_then_the_default() -> None:
    book = PriceBook(PRICING, LABELS.get)
    assert book.gpu_hour("NVIDIA A100-SXM4-80GB", "spot-1") == 0.9
    assert book.gpu_hour("NVIDIA A100-SXM4-80GB", "res-1") == 2.0  # a KEY rule: any value
    assert book.gpu_hour("NVIDIA A100-SXM4-80GB", "plain") == 3.0
    assert book.gpu_hour("NVIDIA T4", "plain") == 1.0
    assert PriceBook(PricingSettings(), LABELS.get).gpu_hour("NVIDIA T4", "plain") is None
    assert not PricingSettings().enabled and PRICING.enabled


def _figures(gpus: list[GpuFigures], **fields: float) -> WorkloadFigures:
    return WorkloadFigures(uid="w", namespace="ml", name="w", kind="Job", api_version="batch/v1", project="ml",
                           phase="Running" if gpus else "Succeeded", gpus=gpus, **fields)


def test_a_workload_is_priced_by_the_units_of_each_device() -> None:
    meter = CostMeter(PRICING, LABELS.get)
    gpus = [GpuFigures(node="spot-1", uuid="g1", model="NVIDIA A100-SXM4-80GB", units=1.0),
            GpuFigures(node="plain", uuid="g2", model="NVIDIA A100-SXM4-80GB MIG 3g.40gb", units=3 / 7)]
    running = _figures(gpus, allocated_gpus=1 + 3 / 7, allocated_gpu_seconds=7200.0, idle_gpu_seconds=3600.0,
                       idle_gpus=1.0)
    cost = meter.workload(running)
    rate = (1.0 * 0.9 + 3 / 7 * 3.0) / (1 + 3 / 7)
    assert cost.price_per_gpu_hour is not None and math.isclose(cost.price_per_gpu_hour, rate)
    assert cost.cost_per_hour is not None and math.isclose(cost.cost_per_hour, 0.9 + 3 / 7 * 3.0)
    assert cost.cost is not None and math.isclose(cost.cost, 2 * rate)
    # ended: no device now, the rate it was last seen with
    ended = meter.workload(_figures([], allocated_gpu_seconds=7200.0, idle_gpu_seconds=3600.0))
    assert ended.cost is not None and math.isclose(ended.cost, 2 * rate) and ended.cost_per_hour == 0
    restored = CostMeter(PRICING, LABELS.get)
    restored.restore(meter.save())
    assert restored.rates == meter.rates


def test_energy_is_priced_apart_and_unpriced_time_stays_unknown() -> None:
    figures = _figures([GpuFigures(node="plain", uuid="g", model="x", units=1.0)], allocated_gpu_seconds=3600.0,
                       energy_joules=7.2e6)
    cost = price_figures(figures, None, 0.5)
    assert cost.cost is None and cost.idle_cost is None and math.isclose(cost.energy_cost, 1.0)
    priced = price_figures(figures, 2.0, 0.5)
    assert priced.cost is not None and math.isclose(priced.cost, 3.0)
