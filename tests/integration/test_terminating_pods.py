"""A pod that stays Terminating past its deletionTimestamp stops holding GPUs there.

The API server sets deletionTimestamp to the delete request's time plus the grace period, and
the kubelet has killed the containers by then. The object can linger (finalizers, a lost node,
an API server with no kubelets): the controller must not bill it until the object goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.feed.decode import DeviceHolder
from gpuwm.model.sample import GpuSample
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[2] / "crds"
START = 1_800_000_000.0


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        KubeHttp(thread.url).create("/api/v1/namespaces", {"metadata": {"name": "ns"}})
        yield thread


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(deletion_time: float | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "lone", "namespace": "ns", "uid": "pod-lone", "creationTimestamp": _stamp(START)}
    if deletion_time is not None:
        metadata["deletionTimestamp"] = _stamp(deletion_time)
        metadata["deletionGracePeriodSeconds"] = 30
    return {
        "metadata": metadata,
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": _stamp(START),
                   "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": _stamp(START)}}}]},
    }


async def test_terminating_pod_ends_at_its_deletion_timestamp(emu: EmulatorThread, tmp_path: Path) -> None:
    now = [START + 100.0]
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9", interval=10.0)
    client = KubeClient(emu.url)
    runtime = ControllerRuntime(settings, client, clock=lambda: now[0])
    runtime.state.holders_by_pod = {"pod-lone": [DeviceHolder(uuid="GPU-a", node="n1", pod_uid="pod-lone", namespace="ns",
                                                               pod="lone", container="main")]}
    engine = runtime.engine
    try:
        await runtime.on_pod(_pod(None), "ADDED")

        def samples_until(end: float) -> None:  # what the agents deliver by then
            t = engine.clock if engine.clock > START else START
            while t + 10 <= end:
                t += 10
                engine.observe_sample(GpuSample(t=t, node="n1", uuid="GPU-a", sm_percent=50.0))

        samples_until(START + 120.0)
        # deleted at START+120 with a 30 s grace period: the API server stamps START+150
        now[0] = START + 120.0
        await runtime.on_pod(_pod(START + 150.0), "MODIFIED")
        before = engine.workload("pod-lone", now[0])
        assert before is not None and before.allocated_gpus == 1.0  # within its grace period it still holds the GPU
        # the object is never removed (no kubelet confirms); the cycle ends it at the timestamp
        now[0] = START + 200.0
        samples_until(now[0])
        await runtime.cycle()
        now[0] = START + 400.0
        samples_until(now[0])
        await runtime.cycle()
        figures = engine.workload("pod-lone", now[0])
        assert figures is not None
        assert figures.allocated_gpus == 0.0 and figures.phase == "Ended"
        assert figures.end_time == pytest.approx(START + 150.0)
        assert figures.allocated_gpu_seconds == pytest.approx(150.0)  # START .. START+150, not ..+400
        # the DELETED event when the object finally goes changes nothing
        await runtime.on_pod(_pod(START + 150.0), "DELETED")
        after = engine.workload("pod-lone", now[0])
        assert after is not None and after.allocated_gpu_seconds == pytest.approx(150.0)
    finally:
        await runtime.puller.close()
        await client.close()
