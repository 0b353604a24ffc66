"""The controller's own counters on the API's /metrics: unattributed samples (DESIGN §3), late samples,
and the intake's refusals, served by the same app as the workload series."""

from __future__ import annotations

from pathlib import Path

import httpx

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.controller.pull.intake_metrics import EngineCollector, IntakeCollector
from gpuwm.model import GpuSample, PodEvent
from gpuwm.store.embedded import EmbeddedStore


def _busy_gpu_with_no_visible_process() -> Engine:
    engine = Engine(EngineConfig())
    engine.observe_pod(PodEvent.model_validate({
        "t": 0, "event": "pod", "namespace": "ml", "name": "train-0", "uid": "p1", "phase": "Running", "node": "n1",
        "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "w1"},
        "devices": [{"uuid": "GPU-a", "units": 1}],
    }))
    for t in range(0, 6):
        engine.observe_sample(GpuSample(t=float(t), node="n1", uuid="GPU-a", sm_percent=90.0, processes=[]))
    return engine


async def test_the_controller_counters_are_served_on_metrics(tmp_path: Path) -> None:
    engine = _busy_gpu_with_no_visible_process()
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    try:
        app = create_app(store, Settings(auth="none"),
                         extra_collectors=(EngineCollector(engine), IntakeCollector(lambda: None)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
            text = (await http.get("/metrics")).text
    finally:
        store.close()
    assert "gpuwm_controller_unattributed_samples_total 5.0" in text  # the samples at 1..5
    assert "gpuwm_controller_late_samples_dropped_total 0.0" in text
    assert 'gpuwm_controller_rejected_samples_total{reason="not-finite"} 0.0' in text
