"""Status cycles on the API emulator: a finished (settled) workload's CR is written once, then left alone.

Its figures are reused by the engine and not offered again until something about it changes
(a pod event); a queued CR renders from the engine when it is written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import DeviceAllocation, PodEvent, TraceWorkload
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[2] / "crds"
WORKLOADS = "/apis/gpuwm.io/v1alpha1/namespaces/ns/gpuworkloadmetrics"


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        KubeHttp(thread.url).create("/api/v1/namespaces", {"metadata": {"name": "ns"}})
        yield thread


def _pod(t: float, name: str, phase: str, gpu: str) -> PodEvent:
    workload = TraceWorkload(api_version="batch/v1", kind="Job", name=name, uid=f"uid-{name}", created=t - 5)
    return PodEvent(t=t, event="pod", namespace="ns", name=f"{name}-0", uid=f"pod-{name}", phase=phase, node="n1",
                    labels={}, workload=workload, devices=[DeviceAllocation(uuid=gpu, units=1.0)])


async def _drain(runtime: ControllerRuntime) -> int:
    written = 0
    while (desired := runtime.writer._next()) is not None:
        await runtime.writer.write(desired)
        written += 1
    return written


async def test_settled_workload_is_written_once_and_again_after_a_pod_event(emu: EmulatorThread, tmp_path: Path) -> None:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9", interval=10.0)
    client = KubeClient(emu.url)
    runtime = ControllerRuntime(settings, client)
    engine = runtime.engine
    now = time.time()
    engine.observe_pod(_pod(now - 7200, "done", "Running", "GPU-a"))
    for t in range(7200, 6000, -10):
        engine.observe_sample(GpuSample(t=now - t + 10, node="n1", uuid="GPU-a", sm_percent=40.0))
    engine.observe_pod(_pod(now - 6000, "done", "Succeeded", "GPU-a"))
    engine.observe_pod(_pod(now - 60, "busy", "Running", "GPU-b"))
    for t in range(60, 0, -10):
        engine.observe_sample(GpuSample(t=now - t + 10, node="n1", uuid="GPU-b", sm_percent=90.0))
    try:
        await runtime.cycle()
        assert await _drain(runtime) == 3  # both workloads and the project
        assert engine.settled_figures("uid-done") is not None and engine.settled_figures("uid-busy") is None
        await runtime.cycle()
        assert "uid-done" in runtime.offers.offered_settled
        queued = {desired.name for desired in (runtime.writer._material | runtime.writer._due).values()}
        assert "done" not in queued  # unchanged: not offered again
        await _drain(runtime)
        engine.observe_pod(_pod(time.time(), "done", "Deleted", "GPU-a"))  # news about it: offered again
        await runtime.cycle()
        assert "done" in {desired.name for desired in runtime.writer._material.values()}
        await _drain(runtime)
    finally:
        await runtime.puller.close()
        await client.close()
    assert runtime.writer.stats.failures == 0
    items = {item["metadata"]["name"]: item for item in KubeHttp(emu.url).get(WORKLOADS)["items"]}
    done = items["done"]["status"]
    assert done["phase"] == "Ended" and done["allocatedGpuSeconds"] == pytest.approx(1200.0)
    assert done["activeGpuSeconds"] == pytest.approx(1190.0) and done["unmonitoredGpuSeconds"] == pytest.approx(10.0)
    assert done["utilization"]["lifetime"] == pytest.approx(40.0)
    assert items["busy"]["status"]["phase"] == "Running" and items["busy"]["status"]["allocatedGpus"] == 1
