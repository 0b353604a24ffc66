"""Attribution decisions: replica and MIG units, containers of processes, the cgroup fallback, states."""

from __future__ import annotations

import pytest

from gpuwm.agent.attribution import attribute, classify
from gpuwm.agent.cgroup import PodRef
from gpuwm.agent.nvml import RawProcess, Reading
from gpuwm.agent.podresources import Assignment
from gpuwm.model import GpuSample, ProcessSample

UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


def _sample(uuid: str, sm: float | None, processes: list[ProcessSample] | None, **extra: object) -> GpuSample:
    return GpuSample.model_validate(
        {"t": 100.0, "node": "n1", "uuid": uuid, "index": 0, "sm_percent": sm, "processes": processes, **extra}
    )


def _reading(uuid: str, sm: float | None, processes: list[RawProcess] | None, **extra: object) -> Reading:
    return Reading({"t": 100.0, "node": "n1", "uuid": uuid, "index": 0, "sm_percent": sm, **extra}, processes)


def _process(pid: int, sm: float | None = None, memory: float | None = None) -> RawProcess:
    return RawProcess(pid, memory, sm)


def _no_pods(pid: int) -> PodRef | None:
    return None


def test_time_sliced_replicas_share_a_gpu_by_replica_count() -> None:
    samples = [_reading("GPU-1", 60.0, [_process(10, sm=40.0), _process(20, sm=20.0)])]
    assignments = [
        Assignment("GPU-1::0", "GPU-1", 0, "nvidia.com/gpu", "ns", "a", "main"),
        Assignment("GPU-1::3", "GPU-1", 3, "nvidia.com/gpu", "ns", "b", "worker"),
    ]
    known = {("ns", "a"): UID_A, ("ns", "b"): UID_B}
    result = attribute(samples, assignments, {"GPU-1": 8}, 4, {10: PodRef(UID_A), 20: PodRef(UID_B)}.get, known, 1.0)
    assert [(d.pod, d.units, d.device_id, d.state) for d in result.devices] == [
        ("a", 0.125, "GPU-1::0", "active"), ("b", 0.125, "GPU-1::3", "active"),
    ]
    processes = result.samples[0].processes or []
    assert [(p.pid, p.pod_uid, p.container) for p in processes] == [(10, UID_A, "main"), (20, UID_B, "worker")]
    # without allocatable IDs from the kubelet the configured replica count applies
    fallback = attribute(samples, assignments, {}, 4, _no_pods, {}, 1.0)
    assert {d.units for d in fallback.devices} == {0.25}


def test_single_holder_learns_its_uid_from_process_cgroups() -> None:
    samples = [_reading("GPU-2", 0.0, [_process(5, memory=1e9)])]
    assignments = [Assignment("GPU-2", "GPU-2", None, "nvidia.com/gpu", "team", "trainer-0", "pytorch")]
    known: dict[tuple[str, str], str] = {}
    result = attribute(samples, assignments, {}, 4, {5: PodRef(UID_A, "c" * 64)}.get, known, 1.0)
    assert known == {("team", "trainer-0"): UID_A}
    (device,) = result.devices
    assert (device.pod_uid, device.container, device.state, device.units) == (UID_A, "pytorch", "idle-held", 1.0)
    assert (result.samples[0].processes or [])[0].container == "pytorch"


def test_index_device_ids_and_mig_resource_profile() -> None:
    samples = [
        _reading("GPU-9", 5.0, [], index=3),
        _reading("MIG-1", 0.0, [], index=3, parent_uuid="GPU-9", device_units=1 / 7),
    ]
    assignments = [
        Assignment("3", "3", None, "nvidia.com/gpu", "ns", "whole", "c"),
        Assignment("MIG-1", "MIG-1", None, "nvidia.com/mig-1g.10gb", "ns", "slice", "c"),
    ]
    result = attribute(samples, assignments, {}, 4, _no_pods, {}, 1.0)
    by_pod = {d.pod: d for d in result.devices}
    assert by_pod["whole"].uuid == "GPU-9" and by_pod["whole"].state == "active"
    assert by_pod["slice"].units == pytest.approx(1 / 7)
    assert by_pod["slice"].mig_profile == "1g.10gb"
    assert by_pod["slice"].state == "allocated-empty"


def test_cgroup_fallback_without_pod_resources() -> None:
    samples = [_reading("GPU-3", 80.0, [_process(1), _process(2), _process(3)])]
    known = {("ns", "p"): UID_A}
    result = attribute(samples, [], {}, 4, {1: PodRef(UID_A), 2: PodRef(UID_B)}.get, known, 1.0)
    assert [(d.pod_uid, d.pod, d.units, d.attributed_by) for d in result.devices] == [
        (UID_A, "p", 0.5, "cgroup"), (UID_B, None, 0.5, "cgroup"),
    ]
    assert [p.pod_uid for p in result.samples[0].processes or []] == [UID_A, UID_B, None]


@pytest.mark.parametrize(
    ("sm", "processes", "allocated", "healthy", "expected"),
    [
        (50.0, [ProcessSample(pid=1)], True, True, "active"),
        (0.5, [ProcessSample(pid=1)], True, True, "idle-held"),
        (0.0, [], True, True, "allocated-empty"),
        (0.0, [], False, True, "unallocated"),
        (None, None, True, False, "unknown"),
        (1.0, [ProcessSample(pid=1)], True, True, "active"),  # the threshold itself is active
    ],
)
def test_classify(
    sm: float | None, processes: list[ProcessSample] | None, allocated: bool, healthy: bool, expected: str
) -> None:
    sample = _sample("GPU-4", sm, processes, healthy=healthy)
    assert classify(sample, allocated, idle_threshold_percent=1.0) == expected
