"""What the controller writes for awkward workloads passes the API server's rules (emulated strictly).

Names up to 253 characters, a name shared by two kinds, project names that are label values
but not DNS names, Events on long-named workloads: each request goes through the emulator's
ObjectMeta, Event and CRD schema validation, which answer 422/400 as kube-apiserver does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.status.events import idle_event_body
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import DeviceAllocation, PodEvent, TraceWorkload
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[2] / "crds"
LONG = "w" * 253


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        KubeHttp(thread.url).create("/api/v1/namespaces", {"metadata": {"name": "ns"}})
        yield thread


async def test_awkward_names_and_labels_are_accepted(emu: EmulatorThread, tmp_path: Path) -> None:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9")
    client = KubeClient(emu.url)
    runtime = ControllerRuntime(settings, client)
    project = "Research.Team_1"  # a valid label value, not a DNS name
    now = time.time()
    for index, kind in enumerate(["PyTorchJob", "Job"]):  # one name, two kinds
        workload = TraceWorkload(api_version="batch/v1" if kind == "Job" else "kubeflow.org/v1", kind=kind, name=LONG,
                                 uid=f"uid-{index}", created=now - 20)
        runtime.engine.observe_pod(PodEvent(
            t=now - 10, event="pod", namespace="ns", name=f"p{index}", uid=f"pod-{index}", phase="Running",
            node="n1", labels={"gpuwm.io/project": project}, workload=workload,
            devices=[DeviceAllocation(uuid=f"GPU-{index}", units=1.0)]))
        for second in range(10):
            runtime.engine.observe_sample(GpuSample(t=now - 9 + second, node="n1", uuid=f"GPU-{index}",
                                                    sm_percent=55.5, model="NVIDIA H100"))
    try:
        await runtime.cycle()  # offers every CR (the one agent does not answer)
        while (desired := runtime.writer._next()) is not None:
            await runtime.writer.write(desired)
        figures = runtime.engine.workloads(time.time())[0]
        # an Event on the long-named workload: generateName is cut to what the server keeps
        created = await client.create("/api/v1/namespaces/ns/events",
                                      idle_event_body(figures, "1 GPU(s) idle for 700s", time.time()))
    finally:
        await runtime.puller.close()
        await client.close()
    assert runtime.writer.stats.failures == 0
    assert created is not None and len(created["metadata"]["name"]) <= 63
    http = KubeHttp(emu.url)
    listed = http.get("/apis/gpuwm.io/v1alpha1/namespaces/ns/gpuworkloadmetrics")["items"]
    names = {item["metadata"]["name"] for item in listed}
    assert len(names) == 2 and LONG in names
    clash = (names - {LONG}).pop()
    assert len(clash) <= 253 and clash.startswith("w" * 200)  # <name>-<kind>, cut and hashed to fit
    for item in listed:
        labels = item["metadata"]["labels"]
        assert all(len(value) <= 63 for value in labels.values())
        assert item["status"]["observedGeneration"] == item["metadata"]["generation"] == 1
        assert item["status"]["utilization"]["avg1m"] == pytest.approx(55.5)
        assert item["spec"]["workloadRef"]["name"] == LONG
    projects = http.get("/apis/gpuwm.io/v1alpha1/gpuprojectmetrics")["items"]
    assert [p["spec"]["project"] for p in projects] == [project]
    assert projects[0]["metadata"]["name"].startswith("research.team-1")
