"""The status cycle keeps each priced workload's price per GPU-hour in the store, beside its figures: what a
period report prices the period's GPU-seconds at."""

from __future__ import annotations

import time
from pathlib import Path

from gpuwm.config import Settings
from gpuwm.controller.kube import KubeClient, TokenBucket
from gpuwm.controller.policy import PolicyRoom
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import DeviceAllocation, PodEvent, TraceWorkload
from gpuwm.store import GpuHourPrice
from gpuwm.store.embedded import EmbeddedStore

PRICING = {"currency": "EUR", "gpuModels": [{"model": "NVIDIA L4", "pricePerGpuHour": 0.8}]}


async def test_a_cycle_records_the_rooms_prices(tmp_path: Path) -> None:
    settings = Settings(agents="static:n1=http://127.0.0.1:9", interval=10.0, pricing=PRICING)
    client = KubeClient("http://127.0.0.1:9")
    runtime = ControllerRuntime(settings, client)
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    runtime.store = store
    runtime.policies = PolicyRoom(settings, client, TokenBucket(10.0), lambda _uid: None, None)
    now = time.time()
    workload = TraceWorkload(api_version="batch/v1", kind="Job", name="infer", uid="uid-infer", created=now - 120)
    runtime.engine.observe_pod(PodEvent(
        t=now - 100, event="pod", namespace="ns", name="infer-0", uid="pod-infer", phase="Running", node="n1",
        labels={}, workload=workload, devices=[DeviceAllocation(uuid="GPU-l4", units=0.25)]))
    for t in range(90, 0, -10):
        runtime.engine.observe_sample(GpuSample(t=now - t, node="n1", uuid="GPU-l4", model="NVIDIA L4",
                                                sm_percent=70.0))
    try:
        await runtime.cycle()
        assert store.gpu_hour_prices(["uid-infer"], 0.0, now + 3600) == {"uid-infer": GpuHourPrice(0.8, "EUR")}
    finally:
        await runtime.puller.close()
        await client.close()
        store.close()
