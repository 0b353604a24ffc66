"""The real controller pulling the real `gpuwm agent` (fake NVML, kubelet pod-resources over gRPC).

Pods of the agent tests' scenario are created in the API emulator with their owners: a Job's
pod, a bare notebook pod, a Deployment's two time-sliced replicas (via a ReplicaSet), and a
MIG pod. The CRs must show the units the agent attributed: 1, 1, 2 x 1/4, 3/7.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent.conftest import (  # noqa: F401 - fixtures used by name
    fake_nvml_lib,
    fake_proc,
    pod_resources,
    scenario,
    start_agent,
)
from tests.integration.agent.helpers import UID_INFER_A, UID_INFER_B, UID_MIG, UID_NOTEBOOK, UID_TRAIN
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator
from tests.integration.test_controller import CRDS, Controller, rfc3339, wait_until

pytestmark = pytest.mark.integration

GWM = "/apis/gpuwm.io/v1alpha1/namespaces/{ns}/gpuworkloadmetrics/{name}"


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    emulator = KubernetesEmulator(CRDS)
    emulator.store.keep_client_uids = True  # the fake cgroups name these pod UIDs
    with EmulatorThread(emulator) as thread:
        yield thread


def _owner(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
             "uid": obj["metadata"]["uid"], "controller": True}]


def _pod(http: KubeHttp, namespace: str, name: str, uid: str, container: str, resource: str,
         owners: list[dict[str, Any]], started: float) -> None:
    http.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": name, "uid": uid, "ownerReferences": owners},
        "spec": {"nodeName": "node-1", "containers": [{"name": container, "resources": {"limits": {resource: "1"}}}]},
    })
    http.ok("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {
        "phase": "Running", "startTime": rfc3339(started),
        "containerStatuses": [{"name": container, "state": {"running": {"startedAt": rfc3339(started)}}}],
    }}, "application/merge-patch+json")


@pytest.mark.parametrize("status_interval", [1.0, 4.0])  # 4 s: 8 polls a pull, runs of them merged
def test_controller_with_the_real_agent(
    emulator: EmulatorThread, start_agent: Any, fake_nvml_lib: Path, scenario: Path, fake_proc: Path,  # noqa: F811
    pod_resources: Any, tmp_path: Path, status_interval: float,  # noqa: F811
) -> None:
    http = KubeHttp(emulator.url)
    for namespace in ("team-a", "team-b", "serving", "team-c"):
        http.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    started = time.time()
    job = http.create("/apis/batch/v1/namespaces/team-a/jobs", {"metadata": {"name": "train"}, "spec": {}})
    deployment = http.create("/apis/apps/v1/namespaces/serving/deployments", {"metadata": {"name": "infer"}, "spec": {}})
    replicaset = http.create("/apis/apps/v1/namespaces/serving/replicasets",
                             {"metadata": {"name": "infer-7f9", "ownerReferences": _owner(deployment)}, "spec": {}})
    mig_job = http.create("/apis/batch/v1/namespaces/team-c/jobs", {"metadata": {"name": "mig"}, "spec": {}})
    _pod(http, "team-a", "train-0", UID_TRAIN, "main", "nvidia.com/gpu", _owner(job), started)
    _pod(http, "team-b", "notebook", UID_NOTEBOOK, "jupyter", "nvidia.com/gpu", [], started)
    _pod(http, "serving", "infer-a", UID_INFER_A, "server", "nvidia.com/gpu.shared", _owner(replicaset), started)
    _pod(http, "serving", "infer-b", UID_INFER_B, "server", "nvidia.com/gpu.shared", _owner(replicaset), started)
    _pod(http, "team-c", "mig-job", UID_MIG, "worker", "nvidia.com/mig-3g.40gb", _owner(mig_job), started)

    # the driver's buffers read every second, not every 5 s: the controller's 1 s and 4 s status intervals see
    # every poll by their next cycle
    agent = start_agent(fake_nvml_lib, scenario, "--interval", "0.5", "--nvml-buffer-read-seconds", "1",
                        "--proc-root", str(fake_proc), "--pod-resources-socket", str(pod_resources.socket_path))
    agent_listening = time.time()
    log = tmp_path / "controller.log"
    controller = Controller(emulator.write_kubeconfig(tmp_path / "kubeconfig"), f"static:node-1={agent.url}",
                            tmp_path / "gpuwm.db", log, status_interval=status_interval, interval=0.5)
    controller.start()

    def cr(namespace: str, name: str) -> dict[str, Any] | None:
        status, body = http.request("GET", GWM.format(ns=namespace, name=name))
        return body if status == 200 else None

    try:
        def sampled(namespace: str, name: str) -> Any:
            def check() -> Any:
                found = cr(namespace, name)
                sampling = found and next(
                    (c for c in found["status"].get("conditions", []) if c["type"] == "Sampling"), None)
                return found if sampling and sampling["status"] == "True" else None
            return wait_until(f"{namespace}/{name} sampled", check, log=log, timeout=40)

        train = sampled("team-a", "train")
        assert train["spec"]["workloadRef"]["kind"] == "Job" and train["status"]["allocatedGpus"] == 1
        assert [(g["uuid"], g["pod"]) for g in train["status"]["gpus"]] == [("GPU-1111", "train-0")]
        assert train["status"]["gpuModel"] == "NVIDIA H100 80GB HBM3"
        # its sole holder takes the device's SM % (DESIGN §3's sole-holder rule), not its process's 45 %: the
        # fake's 0/100 pattern (a sample every 1/6 s) reads 33 or 67 % over a 0.5 s poll, 50 % over a run
        assert 30.0 <= train["status"]["utilization"]["current"] <= 70.0

        notebook = sampled("team-b", "notebook")
        assert notebook["spec"]["workloadRef"]["kind"] == "Pod" and notebook["status"]["allocatedGpus"] == 1

        infer = sampled("serving", "infer")
        assert infer["spec"]["workloadRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "infer",
                                                "uid": deployment["metadata"]["uid"]}
        assert infer["status"]["allocatedGpus"] == pytest.approx(0.5)  # two time-sliced replicas of 1/4
        assert {g["uuid"] for g in infer["status"]["gpus"]} == {"GPU-3333"}

        mig = sampled("team-c", "mig")
        assert mig["status"]["allocatedGpus"] == pytest.approx(3 / 7, abs=1e-3)
        assert [g["migProfile"] for g in mig["status"]["gpus"]] == ["3g.40gb"]

        wanted = 2 if status_interval < 2 else 12  # with merged runs: several pulls' worth
        later = wait_until("GPU-seconds accrue", lambda: (found := cr("team-a", "train")) and
                           found["status"]["activeGpuSeconds"] >= wanted and found, log=log)
        split = sum(later["status"][k] for k in ("activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds"))
        assert split == pytest.approx(later["status"]["allocatedGpuSeconds"], abs=0.01)
        # unmonitored: the time before the agent's first poll, nothing of the runs. The pods start before the agent
        # does (its start takes longer on a loaded machine); the pod's start is whole seconds, the first poll is
        # within one agent interval (0.5 s) of it listening
        before_first_poll = agent_listening - started + 1.0 + 0.5
        assert later["status"]["unmonitoredGpuSeconds"] < before_first_poll + 1.0
    finally:
        controller.stop()
