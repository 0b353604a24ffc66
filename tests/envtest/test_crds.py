"""The repository's CRDs on a real kube-apiserver: Established, the models' CRs accepted, bad ones refused."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwm.model.crd import (
    Condition,
    GpuStatus,
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    UtilizationWindows,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
    WorkloadRef,
)
from tests.envtest.conftest import established, make_namespace
from tests.envtest.controlplane import ControlPlane

pytestmark = pytest.mark.envtest

NS = "crd-check"
GWM = f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics"
GPM = "/apis/gpuwm.io/v1alpha1/gpuprojectmetrics"


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _workload_status() -> WorkloadMetricsStatus:
    return WorkloadMetricsStatus(
        phase="Running", allocated_gpus=1, gpu_model="NVIDIA H100 80GB HBM3", nodes=["node-a"],
        gpus=[GpuStatus(node="node-a", uuid="GPU-a0", index=0, pod="train-0", container="main", units=1,
                        utilization_percent=80.0, memory_used_bytes=2.0e9, memory_total_bytes=8.0e10)],
        gpu_count=1, utilization=UtilizationWindows(current=80.0, avg1m=79.5), idle_seconds=0,
        last_active_time="2026-11-27T10:00:00Z", allocated_gpu_seconds=120.0, active_gpu_seconds=110.0,
        idle_gpu_seconds=5.0, unmonitored_gpu_seconds=5.0, start_time="2026-11-27T09:58:00Z",
        conditions=[Condition(type="Sampling", status="True", reason="AgentsReporting",
                              last_transition_time="2026-11-27T09:58:01Z")],
        last_update_time="2026-11-27T10:00:00Z",
    )


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane, crds: list[str]) -> str:
    make_namespace(control_plane, NS)
    return NS


def test_crds_become_established(control_plane: ControlPlane, crds: list[str]) -> None:
    assert {"gpuworkloadmetrics.gpuwm.io", "gpuprojectmetrics.gpuwm.io"} <= set(crds)
    assert all(established(control_plane, name) for name in crds)
    # the short names and category the design names are served
    resources = control_plane.kubectl("api-resources", "--api-group=gpuwm.io", "-o", "wide").stdout
    assert "gwm" in resources and "gpm" in resources and "gpuwm" in resources


def test_a_cr_built_from_the_models_is_accepted(control_plane: ControlPlane, namespace: str) -> None:
    http = control_plane.admin()
    spec = WorkloadMetricsSpec(workload_ref=WorkloadRef(api_version="batch/v1", kind="Job", name="train",
                                                        uid="0b7e6a0e-0000-4000-8000-000000000001"), project="vision")
    status = _workload_status()
    created = http.create(GWM, {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
                                "metadata": {"name": "train"}, "spec": _dump(spec), "status": _dump(status)})
    assert created["spec"] == _dump(spec)
    assert not created.get("status"), "status is a subresource: a create must not set it"

    written = http.merge(f"{GWM}/train/status", {"status": _dump(status)})
    assert WorkloadMetricsStatus.model_validate(written["status"]) == status  # nothing pruned, nothing changed

    # the printer columns read the status fields that exist
    table = control_plane.kubectl("get", "gwm", "-n", namespace, "train", "--no-headers").stdout.split()
    # NAME, Project, Phase, then Requested (none asked: left empty) and GPUs
    assert table[:4] == ["train", "vision", "Running", "1"], table

    project = http.create(GPM, {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUProjectMetrics",
                                "metadata": {"name": "vision"}, "spec": _dump(ProjectMetricsSpec(project="vision"))})
    answer = http.merge(f"{GPM}/vision/status", {"status": _dump(ProjectMetricsStatus(
        workloads=1, running_workloads=1, namespaces=[namespace], allocated_gpus=1, idle_gpus=0,
        utilization=UtilizationWindows(current=80.0), allocated_gpu_seconds=120.0))})
    assert ProjectMetricsStatus.model_validate(answer["status"]).allocated_gpus == 1
    assert project["metadata"]["name"] == "vision"


@pytest.mark.parametrize(("what", "body_or_status", "named"), [
    ("a spec without its workloadRef", {"spec": {"project": "vision"}}, "workloadRef"),
    ("a workloadRef without a uid", {"spec": {"project": "p", "workloadRef": {"apiVersion": "v1", "kind": "Pod",
                                                                          "name": "x"}}}, "uid"),
    ("a phase outside the enum", {"status": {"phase": "Exploded"}}, "phase"),
    ("a date that is not RFC 3339", {"status": {"lastActiveTime": "yesterday"}}, "lastActiveTime"),
    ("a number given as text", {"status": {"allocatedGpus": "one"}}, "allocatedGpus"),
    ("a condition type outside the enum", {"status": {"conditions": [{"type": "Bored", "status": "True",
                                                                      "reason": "X"}]}}, "type"),
])
def test_a_bad_cr_is_refused(control_plane: ControlPlane, namespace: str, what: str,
                             body_or_status: dict[str, Any], named: str) -> None:
    http = control_plane.admin()
    name = "bad-" + named.lower()
    if "spec" in body_or_status:
        status, answer = http.request("POST", GWM, {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
                                                    "metadata": {"name": name}, **body_or_status})
    else:
        spec = {"project": "p", "workloadRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": "u"}}
        http.create(GWM, {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
                          "metadata": {"name": name}, "spec": spec})
        status, answer = http.request("PATCH", f"{GWM}/{name}/status", body_or_status, "application/merge-patch+json")
    assert status == 422, f"{what}: HTTP {status} {answer}"
    assert answer["reason"] == "Invalid" and named in answer["message"], answer["message"]
