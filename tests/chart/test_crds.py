"""The chart's CRDs are the top-level crds/, and the CRs the controller writes pass them."""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuwm.model.crd import (
    Condition,
    GpuStatus,
    PodStatus,
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    UtilizationWindows,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
    WorkloadRef,
)
from tests.chart.conftest import ROOT, Installed


def _sync_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_crds", ROOT / "scripts" / "sync-crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_crds_are_the_top_level_crds() -> None:
    sync = _sync_module()
    if not list((ROOT / "crds").glob(sync.PATTERN)):
        pytest.skip("crds/ has no gpuwm.io CRDs yet")
    problems = sync.differences()
    assert not problems, "chart CRDs out of step; run `python scripts/sync-crds.py`:\n" + "\n".join(problems)


def test_sync_check_finds_and_fixes_a_difference(tmp_path: Path) -> None:
    sync = _sync_module()
    source, target = tmp_path / "crds", tmp_path / "chart-crds"
    source.mkdir()
    (source / "gpuwm.io_things.yaml").write_text("kind: CustomResourceDefinition\n")
    (target).mkdir()
    (target / "gpuwm.io_things.yaml").write_text("kind: Old\n")
    (target / "gpuwm.io_gone.yaml").write_text("kind: Gone\n")
    (target / "kopf.dev_peerings.yaml").write_text("kept\n")
    assert len(sync.differences(source, target)) == 2
    sync.sync(source, target)
    assert sync.differences(source, target) == []
    assert (target / "kopf.dev_peerings.yaml").read_text() == "kept\n"
    assert not (target / "gpuwm.io_gone.yaml").exists()


def _request(server_url: str, method: str, path: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    request = urllib.request.Request(
        server_url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def workload_cr() -> dict[str, Any]:
    """A GPUWorkloadMetrics with every status field filled in, from the models the CRDs come from."""
    spec = WorkloadMetricsSpec(
        workload_ref=WorkloadRef(api_version="batch/v1", kind="Job", name="train", uid="0b1c"), project="vision"
    )
    windows = UtilizationWindows(current=40.0, avg1m=41.0, avg5m=39.5, avg1h=None, lifetime=38.0)
    status = WorkloadMetricsStatus(
        phase="Running", allocated_gpus=1.5, gpu_model="NVIDIA H100 80GB HBM3", nodes=["gpu-1"],
        pods=[PodStatus(name="train-0", uid="p1", node="gpu-1", phase="Running", allocated_gpus=1.5)],
        gpus=[GpuStatus(node="gpu-1", uuid="GPU-a", index=0, pod="train-0", container="main", units=1.0,
                        utilization_percent=40.0, memory_used_bytes=1e9, memory_total_bytes=8e10, power_watts=300.0)],
        utilization=windows, memory_utilization=windows, idle_seconds=0.0, last_active_time="2026-01-01T00:00:00Z",
        allocated_gpu_seconds=90.0, active_gpu_seconds=60.0, idle_gpu_seconds=20.0, unmonitored_gpu_seconds=10.0,
        energy_joules=1234.5, wait_seconds=3.0, run_seconds=60.0, start_time="2026-01-01T00:00:00Z",
        conditions=[Condition(type="Sampling", status="True", reason="AgentsReporting")],
        observed_generation=1, last_update_time="2026-01-01T00:01:00Z",
    )
    return {
        "apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": spec.model_dump(by_alias=True, mode="json"),
        "status": status.model_dump(by_alias=True, mode="json"),
    }


@pytest.fixture
def installed(install: Callable[..., Installed]) -> Installed:
    if not list((ROOT / "crds").glob("gpuwm.io_*.yaml")):
        pytest.skip("crds/ has no gpuwm.io CRDs yet")
    result = install()
    assert result.ok, result.error
    return result


def test_controller_crs_pass_the_installed_crds(installed: Installed) -> None:
    url = installed.server.url
    code, answer = _request(url, "POST", "/apis/gpuwm.io/v1alpha1/namespaces/team-a/gpuworkloadmetrics", workload_cr())
    assert code == 201, answer
    project = {
        "apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUProjectMetrics", "metadata": {"name": "vision"},
        "spec": ProjectMetricsSpec(project="vision").model_dump(by_alias=True, mode="json"),
        "status": ProjectMetricsStatus(workloads=1, allocated_gpus=1.5, quota=4.0).model_dump(by_alias=True, mode="json"),
    }
    code, answer = _request(url, "POST", "/apis/gpuwm.io/v1alpha1/gpuprojectmetrics", project)
    assert code == 201, answer


def test_status_patch_goes_through_the_status_subresource_only(installed: Installed) -> None:
    url = installed.server.url
    base = "/apis/gpuwm.io/v1alpha1/namespaces/team-a/gpuworkloadmetrics/train"
    assert _request(url, "POST", base.rsplit("/", 1)[0], workload_cr())[0] == 201
    patch = {"spec": {"project": "hijacked"}, "status": {"idleSeconds": 42.0}}
    code, answer = _request(url, "PATCH", base + "/status", patch, "application/merge-patch+json")
    assert code == 200, answer
    assert answer["status"]["idleSeconds"] == 42.0
    assert answer["spec"]["project"] == "vision"


@pytest.mark.parametrize(
    ("path", "bad", "named"),
    [
        (("status", "allocatedGpus"), "many", "allocatedGpus"),
        (("status", "phase"), "Exploded", "phase"),
        (("status", "conditions"), [{"type": "Sampling"}], "status"),
        (("spec", "workloadRef"), {"kind": "Job"}, "workloadRef"),
        (("status", "surprise"), 1, "surprise"),
    ],
)
def test_crd_rejects_a_bad_cr_naming_the_field(
    installed: Installed, path: tuple[str, str], bad: Any, named: str
) -> None:
    cr = workload_cr()
    cr[path[0]][path[1]] = bad
    code, answer = _request(installed.server.url, "POST", "/apis/gpuwm.io/v1alpha1/namespaces/team-a/gpuworkloadmetrics", cr)
    assert code == 422, answer
    assert named in answer["message"], answer["message"]


def test_stale_chart_crd_is_caught(tmp_path: Path) -> None:
    """The in-step check fails when a chart CRD is edited by hand."""
    sync = _sync_module()
    if not list((ROOT / "crds").glob(sync.PATTERN)):
        pytest.skip("crds/ has no gpuwm.io CRDs yet")
    chart_crds = tmp_path / "chart-crds"
    shutil.copytree(ROOT / "charts" / "gpuwm" / "crds", chart_crds)
    edited = next(chart_crds.glob(sync.PATTERN))
    edited.write_text(edited.read_text() + "# hand edit\n")
    assert [line for line in sync.differences(ROOT / "crds", chart_crds) if edited.name in line]
