"""The policy room's cost: on the CR statuses it decorates and as Prometheus series, from the engine's figures."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.config import Settings
from gpuwm.controller.kube import KubeClient, TokenBucket
from gpuwm.controller.policy import PolicyCollector, PolicyRoom
from gpuwm.controller.status import Seen
from gpuwm.model import GpuSample, PodEvent
from gpuwm.store import GpuHourPrice

PRICING = {"currency": "EUR", "gpuModels": [{"model": "NVIDIA A100*", "pricePerGpuHour": 3.5}]}


def _room() -> PolicyRoom:
    settings = Settings(pricing=PRICING)
    return PolicyRoom(settings, KubeClient("https://127.0.0.1:9"), TokenBucket(10.0), lambda _uid: None, None)


def _engine() -> Engine:
    engine = Engine(EngineConfig(interval_seconds=1.0))
    engine.observe(PodEvent.model_validate({
        "t": 0.0, "event": "pod", "namespace": "ml", "name": "slice-0", "uid": "p1", "phase": "Running",
        "node": "n1", "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "slice", "uid": "w1"},
        "devices": [{"uuid": "MIG-1", "units": 3 / 7}]}))
    for t in range(-1, 3601):
        engine.observe(GpuSample(t=float(t), node="n1", uuid="MIG-1", model="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                                 device_units=3 / 7, parent_uuid="GPU-a", sm_percent=50.0 if t <= 1800 else 0.0))
    return engine


def test_costs_ride_on_the_status_and_the_metrics() -> None:
    room, engine = _room(), _engine()
    workloads, projects, _ = engine.report(3600.0)
    room.observe(workloads, projects, {w.uid: Seen(True, True, None) for w in workloads}, 3600.0)
    status: dict[str, object] = {"conditions": []}
    room.decorate_workload(workloads[0], status)
    assert status["currency"] == "EUR" and status["policyActions"] == [] and status["conditions"] == []
    assert math.isclose(float(status["cost"]), 3 / 7 * 3.5)  # type: ignore[arg-type]
    assert math.isclose(float(status["idleCost"]), 3 / 7 * 3.5 / 2)  # type: ignore[arg-type]
    assert math.isclose(float(status["costPerHour"]), 1.5)  # type: ignore[arg-type]
    project: dict[str, object] = {}
    room.decorate_project("ml", project)
    assert math.isclose(float(project["idleCostPerHour"]), 1.5)  # type: ignore[arg-type]  # idle now
    registry = CollectorRegistry()
    registry.register(PolicyCollector(room))
    text = generate_latest(registry).decode()
    assert 'gpuwm_workload_cost_total{currency="EUR",kind="Job",namespace="ml",project="ml",workload="slice",workload_uid="w1"} 1.5' in text
    assert 'gpuwm_project_idle_cost_total{currency="EUR",project="ml"} 0.75' in text
    assert room.prices() == {"w1": GpuHourPrice(3.5, "EUR")}  # what the store keeps for period reports
    assert 'gpuwm_workload_gpu_hourly_cost{currency="EUR",kind="Job",namespace="ml",project="ml",workload="slice",workload_uid="w1"} 3.5' in text


def test_without_prices_no_cost_is_written_or_exported() -> None:
    room = PolicyRoom(Settings(), KubeClient("https://127.0.0.1:9"), TokenBucket(10.0), lambda _uid: None, None)
    engine = _engine()
    workloads, projects, _ = engine.report(3600.0)
    room.observe(workloads, projects, {}, 3600.0)
    status: dict[str, object] = {}
    room.decorate_workload(workloads[0], status)
    assert "cost" not in status and room.prices() == {}
    registry = CollectorRegistry()
    registry.register(PolicyCollector(room))
    assert "gpuwm_workload_cost" not in generate_latest(registry).decode()
