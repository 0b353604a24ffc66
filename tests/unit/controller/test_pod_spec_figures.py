"""What the controller reads of the Pod object: requests and limits, the failure reason and the rank labels the
controller keeps, carried by the pod's engine event into the workload's pod figures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuwm.accounting import Engine
from gpuwm.config import DEFAULT_RESOURCE_NAMES
from gpuwm.controller.watch.pods import MalformedPodError, parse_quantity, pod_event, track_pod
from gpuwm.model import PodResources
from gpuwm.model.trace import DeviceAllocation, TraceWorkload

JOB = TraceWorkload(api_version="kubeflow.org/v1", kind="PyTorchJob", name="train", uid="j1", created=0.0)


def _pod(containers: list[dict[str, Any]], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-worker-1", "namespace": "team-a", "uid": "p1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"gpuwm.io/project": "alpha", "training.kubeflow.org/replica-type": "worker",
                                "training.kubeflow.org/replica-index": "1", "app": "noise"}},
        "spec": {"nodeName": "node-a", "containers": containers},
        "status": status or {"phase": "Running"},
    }


def _container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}


@pytest.mark.parametrize(("text", "value"), [("500m", 0.5), ("2", 2.0), ("1.5Gi", 1.5 * 2**30), ("1e3", 1000.0),
                                             ("128M", 128e6), ("64Ki", 65536.0)])
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == value


def test_requests_and_limits_summed_over_containers() -> None:
    pod = track_pod(_pod([
        _container({"cpu": "500m", "memory": "1Gi"}, {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}),
        _container(None, {"cpu": "3", "memory": "2Gi", "ephemeral-storage": "10Gi"}),  # requests default to limits
    ]), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, labels_kept=("gpuwm.io/project",))
    assert pod.resources == PodResources(
        cpu_request_cores=3.5, cpu_limit_cores=4.0, memory_request_bytes=3 * 2**30, memory_limit_bytes=4 * 2**30,
        ephemeral_storage_request_bytes=10 * 2**30, ephemeral_storage_limit_bytes=None,  # one container unlimited
    )
    # the project label as asked, and the rank labels whatever labels_kept says; no others
    assert pod.labels == {"gpuwm.io/project": "alpha", "training.kubeflow.org/replica-type": "worker",
                          "training.kubeflow.org/replica-index": "1"}


def test_a_bad_quantity_is_named() -> None:
    with pytest.raises(MalformedPodError, match=r"pod team-a/train-worker-1: .*'lots'"):
        track_pod(_pod([_container({"cpu": "lots"}, {"nvidia.com/gpu": "1"})]), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)


def test_failure_reason_and_the_engine_carries_it_with_resources_and_labels() -> None:
    failed = {"phase": "Failed", "containerStatuses": [
        {"name": "c", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "out of memory"}}}]}
    running = track_pod(_pod([_container({"cpu": "1"}, {"nvidia.com/gpu": "1"})]), JOB, DEFAULT_RESOURCE_NAMES,
                        deleted=False)
    assert running.failure_reason is None
    pod = track_pod(_pod([_container({"cpu": "1"}, {"nvidia.com/gpu": "1"})], failed), JOB, DEFAULT_RESOURCE_NAMES,
                    deleted=False)
    assert pod.failure_reason == "container c: OOMKilled, exit code 137, out of memory"
    evicted = track_pod(_pod([_container(None, {"nvidia.com/gpu": "1"})],
                             {"phase": "Failed", "reason": "Evicted", "message": "low on ephemeral storage"}),
                        JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    assert evicted.failure_reason == "Evicted: low on ephemeral storage"
    engine = Engine()
    engine.observe_pod(pod_event(running, [DeviceAllocation(uuid="GPU-1", units=1.0)], 10.0))
    engine.observe_pod(pod_event(pod, [], 20.0))
    (figures,) = engine.workloads(30.0)
    (pod_figures,) = figures.pods
    assert pod_figures.failure_reason == "container c: OOMKilled, exit code 137, out of memory"
    assert pod_figures.resources == PodResources(cpu_request_cores=1.0)
    assert pod_figures.labels is not None and pod_figures.labels["training.kubeflow.org/replica-index"] == "1"


def test_a_gpu_pod_with_cpu_and_memory_requests_reaches_the_engine_through_the_runtime(tmp_path: Path) -> None:
    """The runtime's record of what the engine was told carries the pod's requests as JSON: a GPU pod that asks
    for CPU and memory (most do) is sent once, and sent again only when something it says changes."""
    from gpuwm.config import Settings
    from gpuwm.controller.kube.client import KubeClient
    from gpuwm.controller.runtime import ControllerRuntime
    from gpuwm.controller.watch.units import NodeSharing

    now = 1767225700.0
    runtime = ControllerRuntime(Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9"),
                                KubeClient("http://127.0.0.1:9"), clock=lambda: now)

    async def no_sharing(node: str) -> NodeSharing:
        return NodeSharing(default_shared_replicas=1)

    runtime.sharing.of_node = no_sharing  # type: ignore[method-assign]
    body = _pod([_container(requests={"cpu": "4", "memory": "16Gi"}, limits={"nvidia.com/gpu": "1", "memory": "16Gi"})],
                {"phase": "Running", "startTime": "2026-01-01T00:00:40Z"})
    asyncio.run(runtime.on_pod(body, "ADDED"))
    [workload] = runtime.engine.workloads(now)
    assert workload.allocated_gpus == 1.0
    assert workload.pods[0].resources == PodResources(cpu_request_cores=4.0, memory_request_bytes=16 * 2**30,
                                                     memory_limit_bytes=16 * 2**30)
    sent = runtime.state.sent["p1"]
    asyncio.run(runtime.on_pod(body, "MODIFIED"))  # a resync: nothing new
    assert runtime.state.sent["p1"] is sent
    more = _pod([_container(requests={"cpu": "8", "memory": "16Gi"}, limits={"nvidia.com/gpu": "1", "memory": "16Gi"})],
                {"phase": "Running", "startTime": "2026-01-01T00:00:40Z"})
    asyncio.run(runtime.on_pod(more, "MODIFIED"))
    assert runtime.state.sent["p1"] != sent
    assert runtime.engine.workloads(now)[0].pods[0].resources.cpu_request_cores == 8.0  # type: ignore[union-attr]
