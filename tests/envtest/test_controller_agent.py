"""The real controller and the real agent (fake NVML, pod-resources over gRPC) on a real kube-apiserver.

A Job's pod, made by the real Job controller and bound to a fake Node, holds the node's one GPU. The
GPUWorkloadMetrics and GPUProjectMetrics must appear with the figures the agent measured, busy then
idle; a SIGKILL of the controller and its restart lose nothing and count nothing twice; and a busy GPU
whose process list is empty reads busy (DESIGN §3's sole-holder rule).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane
from tests.envtest.gpunode import (
    GpuNode,
    busy,
    busy_without_processes,
    create_job,
    epoch,
    idle,
    job_pod,
    run_pod,
)
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

STATUS_INTERVAL = 1.0


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))


class Scene:
    """A namespace of project `project`, a Job's pod holding the GPU of `node`, the pod Running."""

    def __init__(self, plane: ControlPlane, node: GpuNode, namespace: str, project: str) -> None:
        self.plane = plane
        self.node = node
        self.namespace = namespace
        self.project = project
        self.http = plane.admin()
        self.started = 0.0
        self.job: dict[str, Any] = {}
        self.pod: dict[str, Any] = {}

    def setup(self, scenario: str) -> None:
        make_namespace(self.plane, self.namespace, {"gpuwm.io/project": self.project})
        self.node.create()
        self.node.set(scenario)
        self.job = create_job(self.plane, self.namespace, "train", self.node.name)
        self.pod = job_pod(self.plane, self.namespace, "train")
        self.node.hold(self.pod)
        self.node.start()
        self.started = float(int(time.time()))  # the kubelet writes whole seconds
        run_pod(self.plane, self.pod, self.started)

    def cr(self) -> dict[str, Any] | None:
        status, body = self.http.request(
            "GET", f"/apis/gpuwm.io/v1alpha1/namespaces/{self.namespace}/gpuworkloadmetrics/train")
        return body if status == 200 else None

    def project_cr(self) -> dict[str, Any] | None:
        status, body = self.http.request("GET", f"/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/{self.project}")
        return body if status == 200 else None


@pytest.fixture
def scene(request: pytest.FixtureRequest, control_plane: ControlPlane, crds: list[str], nvml_lib: Path,
          tmp_path: Path) -> Iterator[Scene]:
    short = request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    node = GpuNode(control_plane, f"gpu-{short}", tmp_path, nvml_lib)
    yield Scene(control_plane, node, f"ns-{short}", f"proj-{short}")
    node.stop()


def _controller(scene: Scene, tmp_path: Path) -> Controller:
    log = tmp_path / "controller.log"
    kubeconfig = scene.plane.write_kubeconfig(tmp_path / "kubeconfig")
    return Controller(kubeconfig, scene.node.agents_flag(), tmp_path / "gpuwm.db", log,
                      status_interval=STATUS_INTERVAL, interval=0.5)


def _split(status: dict[str, Any]) -> float:
    return float(sum(status[k] for k in ("activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds")))


def test_busy_then_idle_and_a_restart_lose_nothing(scene: Scene, tmp_path: Path) -> None:
    scene.setup(busy(80.0))
    controller = _controller(scene, tmp_path)
    log = controller.log
    controller.start()
    try:
        train = wait_until("train busy", lambda: (cr := scene.cr()) and
                           cr["status"].get("activeGpuSeconds", 0) >= 2 and cr, log=log, timeout=60)
        assert train["spec"]["workloadRef"] == {"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                                "uid": scene.job["metadata"]["uid"]}
        assert train["spec"]["project"] == scene.project
        status = train["status"]
        assert status["phase"] == "Running" and status["allocatedGpus"] == 1
        assert [(p["name"], p["uid"]) for p in status["pods"]] == [(scene.pod["metadata"]["name"],
                                                                    scene.pod["metadata"]["uid"])]
        assert [(g["uuid"], g["node"]) for g in status["gpus"]] == [("GPU-e0e0", scene.node.name)]
        assert status["gpuModel"] == "NVIDIA H100 80GB HBM3"
        assert status["utilization"]["current"] == pytest.approx(80.0)
        assert status["idleGpuSeconds"] == 0

        project = wait_until("project CR", lambda: (p := scene.project_cr()) and
                             p.get("status", {}).get("allocatedGpus") == 1 and p, log=log)
        assert project["spec"]["project"] == scene.project
        assert project["status"]["workloads"] == 1 and project["status"]["namespaces"] == [scene.namespace]
        assert project["status"]["utilization"]["current"] == pytest.approx(80.0)

        # idle: the process holds its memory and computes nothing
        scene.node.set(idle())
        idled = wait_until("train idle", lambda: (cr := scene.cr()) and cr["status"].get("idleGpuSeconds", 0) >= 3
                           and any(c["type"] == "Idle" and c["status"] == "True" for c in cr["status"]["conditions"])
                           and cr, log=log, timeout=60)
        assert idled["status"]["utilization"]["current"] == 0.0
        wait_until("project idle GPUs", lambda: (p := scene.project_cr()) and p["status"].get("idleGpus") == 1,
                   log=log)

        # SIGKILL mid-run and restart: the totals carry on, nothing lost across the downtime, nothing doubled
        before = scene.cr()
        assert before is not None
        controller.kill()
        time.sleep(2.0)
        controller.start()
        before_update = epoch(before["status"]["lastUpdateTime"])
        after = wait_until("status after restart", lambda: (cr := scene.cr()) and
                           epoch(cr["status"]["lastUpdateTime"]) >= before_update + 3 and cr, log=log, timeout=60)
        elapsed = epoch(after["status"]["lastUpdateTime"]) - before_update
        gained = after["status"]["allocatedGpuSeconds"] - before["status"]["allocatedGpuSeconds"]
        assert gained == pytest.approx(elapsed, abs=STATUS_INTERVAL + 1.0)  # 1 GPU: one GPU-second a second
        held = after["status"]["allocatedGpuSeconds"]
        assert held == pytest.approx(epoch(after["status"]["lastUpdateTime"]) - scene.started,
                                     abs=STATUS_INTERVAL + 1.5)
        assert _split(after["status"]) == pytest.approx(held, abs=0.01)
        assert after["status"]["activeGpuSeconds"] == pytest.approx(before["status"]["activeGpuSeconds"], abs=0.01)
        assert after["status"]["idleGpuSeconds"] > before["status"]["idleGpuSeconds"]
        assert after["status"]["startTime"] == before["status"]["startTime"]
        assert "Traceback" not in log.read_text()
    finally:
        controller.stop()


def test_a_busy_gpu_without_visible_processes_reads_busy(scene: Scene, tmp_path: Path) -> None:
    """One holder, NVML lists no process while the device computes at 80 %: all of it is the Job's."""
    scene.setup(busy_without_processes(80.0))
    controller = _controller(scene, tmp_path)
    controller.start()
    try:
        first = wait_until("train sampled", lambda: (cr := scene.cr()) and cr["status"].get("allocatedGpuSeconds", 0)
                           >= 3 and cr, log=controller.log, timeout=60)
        later = wait_until("more sampled time", lambda: (cr := scene.cr()) and
                           cr["status"]["allocatedGpuSeconds"] >= first["status"]["allocatedGpuSeconds"] + 3 and cr,
                           log=controller.log, timeout=60)
    finally:
        controller.stop()
    status = later["status"]
    assert status["utilization"]["current"] == pytest.approx(80.0), status
    assert status["activeGpuSeconds"] >= first["status"]["activeGpuSeconds"] + 2, status
    assert status["idleGpuSeconds"] == 0, status
    assert not any(c["type"] == "Idle" and c["status"] == "True" for c in status["conditions"])


def test_a_gpu_lost_at_start_keeps_its_pod_allocated_and_unmonitored(scene: Scene, tmp_path: Path) -> None:
    """NVML cannot open the pod's GPU from the agent's start (GPU_IS_LOST): the Job still holds 1 GPU, its time
    is unmonitored, never idle (DESIGN §3: allocation counts from the pod)."""
    scene.setup(busy_without_processes(80.0).replace("mem_util=30", "mem_util=30 open_error=15"))
    controller = _controller(scene, tmp_path)
    controller.start()
    try:
        first = wait_until("train allocated", lambda: (cr := scene.cr()) and cr["status"].get("allocatedGpus") == 1
                           and cr["status"].get("allocatedGpuSeconds", 0) >= 2 and cr, log=controller.log, timeout=60)
        later = wait_until("more unmonitored time", lambda: (cr := scene.cr()) and
                           cr["status"]["unmonitoredGpuSeconds"] >= first["status"]["unmonitoredGpuSeconds"] + 3
                           and cr, log=controller.log, timeout=60)
    finally:
        controller.stop()
    status = later["status"]
    assert status["allocatedGpus"] == 1 and status["phase"] == "Running", status
    assert status["activeGpuSeconds"] == 0 and status["idleGpuSeconds"] == 0, status
    assert _split(status) == pytest.approx(status["allocatedGpuSeconds"], abs=0.01)
    assert not any(c["type"] == "Idle" and c["status"] == "True" for c in status["conditions"]), status["conditions"]
