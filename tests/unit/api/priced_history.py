"""A priced history in a real embedded store, as the controller writes it: the priced trace of
`gpuwm replay --pricing` (a whole H100 busy then idle, a 1g.10gb MIG slice of an A100, two quarters of a
time-sliced L4) through the engine, recorded every status interval with each workload's price per GPU-hour
from the controller's own policy room (its cost meter), as the status cycle hands them to the store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.controller.kube import KubeClient, TokenBucket
from gpuwm.controller.policy import PolicyRoom
from gpuwm.model import GpuSample, ProjectFigures, WorkloadFigures
from gpuwm.model.trace import parse_trace_line
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.accounting.test_replay_priced import BUSY_UNTIL, END, PRICES, WATTS, priced_trace

STEP = 15.0
#: status intervals recorded after the pods ended (their figures frozen)
AFTER = 4
__all__ = ["BUSY_UNTIL", "END", "PRICES", "STEP", "WATTS", "PricedHistory", "priced_history", "record_priced_trace"]

#: what else sees each status interval (an OpenMetrics backfill): time, samples, figures, the room that priced them
Sink = Callable[[float, list[GpuSample], list[WorkloadFigures], list[ProjectFigures], PolicyRoom], None]


@dataclass
class PricedHistory:
    store: EmbeddedStore
    client: TestClient
    latest: float


def _shifted(offset: float) -> list[dict[str, Any]]:
    """The trace's lines with every time `offset` later (the energy counter's values stay)."""
    lines = []
    for line in priced_trace():
        shifted = {**line, "t": line["t"] + offset}
        if "workload" in line:
            shifted["workload"] = {**line["workload"], "created": line["workload"]["created"] + offset}
        lines.append(shifted)
    return lines


def record_priced_trace(store: EmbeddedStore, pricing: dict[str, object], offset: float = 0.0,
                        sink: Sink | None = None) -> float:
    """Record the trace (its times + `offset`) every STEP seconds until AFTER intervals past its end, priced by
    a policy room with `pricing`; the latest time recorded."""
    events = sorted((parse_trace_line(json.dumps(line), number) for number, line in enumerate(_shifted(offset), 1)),
                    key=lambda event: event.t)
    engine = Engine(EngineConfig(interval_seconds=1.0, idle_threshold_percent=1.0))
    room = PolicyRoom(Settings(pricing=pricing), KubeClient("https://127.0.0.1:9"), TokenBucket(10.0),
                      lambda _uid: None, None)
    samples: list[GpuSample] = []

    def record(t: float) -> None:
        workloads, projects, cluster = engine.report(t)
        room.observe(workloads, projects, {}, t)  # as the status cycle: priced before the store is written
        store.record(t, samples, workloads, projects, cluster)
        store.record_prices(t, room.prices())
        if sink is not None:
            sink(t, samples, workloads, projects, room)
        samples.clear()

    t = offset + STEP
    for event in events:
        while event.t > t:
            record(t)
            t += STEP
        engine.observe(event)
        if isinstance(event, GpuSample):
            samples.append(event)
    for _ in range(AFTER + 1):
        record(t)
        t += STEP
    return t - STEP


def priced_history(path: Path, recorded: dict[str, object] | None = None, served: dict[str, object] | None = None,
                   tiers: tuple[str, ...] = ("15s:2d", "5m:30d")) -> Iterator[PricedHistory]:
    """The trace recorded into a store at `path` (with roll-up `tiers`), its workloads priced with `recorded`, and
    an API over it whose `pricing` is `served` (default: the trace's)."""
    store = EmbeddedStore(path, tiers=tiers)
    latest = record_priced_trace(store, PRICES if recorded is None else recorded)
    client = TestClient(create_app(store, Settings(auth="none", status_interval=STEP,
                                                     pricing=PRICES if served is None else served)))
    try:
        yield PricedHistory(store, client, latest)
    finally:
        store.close()
