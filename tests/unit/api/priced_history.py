"""A priced history in a real embedded store, as the controller writes it: the priced trace of
`gpuwm replay --pricing` (a whole H100 busy then idle, a 1g.10gb MIG slice of an A100, two quarters of a
time-sliced L4) through the engine, recorded every status interval with each workload's price per GPU-hour
from the same cost meter the controller's policy room uses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fastapi.testclient import TestClient

from gpuwm.accounting import CostMeter, Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.config import PricingSettings, Settings
from gpuwm.model import GpuSample
from gpuwm.model.trace import parse_trace_line
from gpuwm.store import GpuHourPrice
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.accounting.test_replay_priced import BUSY_UNTIL, END, PRICES, WATTS, priced_trace

STEP = 15.0
#: status intervals recorded after the pods ended (their figures frozen)
AFTER = 4
__all__ = ["BUSY_UNTIL", "END", "PRICES", "STEP", "WATTS", "PricedHistory", "priced_history"]


@dataclass
class PricedHistory:
    store: EmbeddedStore
    client: TestClient
    latest: float


def _record(store: EmbeddedStore, engine: Engine, meter: CostMeter, t: float, samples: list[GpuSample]) -> None:
    workloads, projects, cluster = engine.report(t)
    store.record(t, samples, workloads, projects, cluster)
    costs = {figures.uid: meter.workload(figures) for figures in workloads}
    store.record_prices(t, {uid: GpuHourPrice(cost.price_per_gpu_hour, meter.currency)
                            for uid, cost in costs.items() if cost.price_per_gpu_hour is not None})


def priced_history(path: Path, recorded: dict[str, object] | None = None, served: dict[str, object] | None = None,
                   ) -> Iterator[PricedHistory]:
    """The trace recorded into a store at `path`, every STEP seconds until AFTER intervals past its end, its
    workloads priced with `recorded`, and an API over it whose `pricing` is `served` (default: the trace's)."""
    settings = PricingSettings.model_validate(PRICES if recorded is None else recorded)
    events = sorted((parse_trace_line(json.dumps(line), number) for number, line in enumerate(priced_trace(), 1)),
                    key=lambda event: event.t)
    engine = Engine(EngineConfig(interval_seconds=1.0, idle_threshold_percent=1.0))
    meter = CostMeter(settings)
    store = EmbeddedStore(path)
    samples: list[GpuSample] = []
    t = STEP
    for event in events:
        while event.t > t:
            _record(store, engine, meter, t, samples)
            samples, t = [], t + STEP
        engine.observe(event)
        if isinstance(event, GpuSample):
            samples.append(event)
    for _ in range(AFTER + 1):
        _record(store, engine, meter, t, samples)
        samples, t = [], t + STEP
    client = TestClient(create_app(store, Settings(auth="none", status_interval=STEP,
                                                     pricing=PRICES if served is None else served)))
    try:
        yield PricedHistory(store, client, t - STEP)
    finally:
        store.close()
