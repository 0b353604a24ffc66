"""A running GPU pod counts its requested units before any agent names its devices (DESIGN §3)."""

from __future__ import annotations

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.controller.watch.pods import TrackedPod, device_allocations, pod_event
from gpuwm.feed.decode import DeviceHolder
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import TraceWorkload


def _pod(units: dict[str, float], phase: str = "Running") -> TrackedPod:
    return TrackedPod(
        namespace="ml", name="train-0", uid="pod-1", phase=phase,  # type: ignore[arg-type]
        node="n1", labels={}, units_by_container=units,
        workload=TraceWorkload(api_version="batch/v1", kind="Job", name="train", uid="job-1", created=0.0),
        phase_since=10.0,
    )


def test_a_running_pod_no_agent_reports_holds_its_requested_units() -> None:
    devices = device_allocations(_pod({"main": 2.0, "side": 1 / 7}), [])
    assert [(device.uuid, device.units, device.container) for device in devices] == [
        ("unnamed/pod-1/main/0", 1.0, "main"), ("unnamed/pod-1/main/1", 1.0, "main"),
        ("unnamed/pod-1/side/0", pytest.approx(1 / 7), "side"),
    ]


def test_a_pending_pod_holds_nothing() -> None:
    assert device_allocations(_pod({"main": 1.0}, phase="Pending"), []) == []


def test_devices_an_agent_named_replace_the_stand_ins_of_their_container_only() -> None:
    holder = DeviceHolder(uuid="GPU-a", namespace="ml", pod="train-0", pod_uid="pod-1", container="main", units=None)
    devices = device_allocations(_pod({"main": 1.0, "side": 0.5}), [holder], {"pod-1"})
    assert [(device.uuid, device.units) for device in devices] == [("GPU-a", 1.0), ("unnamed/pod-1/side/0", 0.5)]


def test_the_engine_counts_the_units_as_allocated_and_unmonitored_then_the_named_device_takes_over() -> None:
    engine = Engine(EngineConfig())
    pod = _pod({"main": 1.0})
    engine.observe_pod(pod_event(pod, device_allocations(pod, []), 10.0))
    figures = engine.workloads(40.0)[0]
    assert figures.allocated_gpus == 1.0  # kubectl get gwm never shows a running GPU workload with 0 GPUs
    assert figures.allocated_gpu_seconds == pytest.approx(30.0)
    assert figures.unmonitored_gpu_seconds == pytest.approx(30.0)
    assert engine.cluster(40.0).gpus == 0  # a stand-in is no GPU of the cluster's
    # the agent names GPU-a; the pod's event is sent again from its start, and samples cover it
    holder = DeviceHolder(uuid="GPU-a", namespace="ml", pod="train-0", pod_uid="pod-1", container="main", units=None)
    engine.observe_pod(pod_event(pod, device_allocations(pod, [holder], {"pod-1"}), 10.0))
    for t in range(10, 41):
        engine.observe_sample(GpuSample(t=float(t), node="n1", uuid="GPU-a", sm_percent=50.0))
    figures = engine.workloads(40.0)[0]
    assert figures.allocated_gpus == 1.0
    assert figures.allocated_gpu_seconds == pytest.approx(30.0)  # counted once, not twice
    assert figures.active_gpu_seconds == pytest.approx(30.0)
    assert [gpu.uuid for gpu in figures.gpus] == ["GPU-a"]
