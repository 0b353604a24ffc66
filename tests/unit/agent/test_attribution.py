"""Attribution decisions: replica and MIG units, containers of processes, the cgroup fallback, states, and
DESIGN §3's attribution rule (activity is never lost to attribution) worked through each branch."""

from __future__ import annotations

import pytest

from gpuwm.agent.attribution import HolderShare, attribute, classify, utilization_by_holder
from gpuwm.agent.cgroup import PodRef
from gpuwm.agent.podresources import Assignment
from gpuwm.agent.readings import RawProcess, Reading
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
        (80.0, [], False, True, "active"),  # busy with no process and no holder known: active, not unallocated
        (80.0, None, True, True, "active"),
        (None, None, True, False, "unknown"),
        (1.0, [ProcessSample(pid=1)], True, True, "active"),  # the threshold itself is active
    ],
)
def test_classify(
    sm: float | None, processes: list[ProcessSample] | None, allocated: bool, healthy: bool, expected: str
) -> None:
    sample = _sample("GPU-4", sm, processes, healthy=healthy)
    assert classify(sample, allocated, idle_threshold_percent=1.0) == expected


# --- the attribution rule, branch by branch: (device SM %, holders, processes) -> each holder's SM % ----------

A = HolderShare(1.0, UID_A)
HALF_A, HALF_B = HolderShare(0.5, UID_A), HolderShare(0.5, UID_B)


@pytest.mark.parametrize(
    ("device_sm", "holders", "processes", "figures", "fell_short"),
    [
        # one holder: all the device's activity is its own, whatever the list says
        (80.0, [A], [], [80.0], True),  # empty list (another PID namespace): busy, and counted
        (80.0, [A], None, [80.0], True),  # no list at all
        (80.0, [A], [(None, 80.0)], [80.0], True),  # its process has no pod (cgroup unreadable)
        (80.0, [A], [(UID_A, 75.0)], [80.0], False),  # its process explains it: the device figure still
        (20.0, [HolderShare(0.25, UID_A)], [], [80.0], True),  # one replica of four held: 20 % of the GPU is 80 %
        (80.0, [HolderShare(0.5, UID_A)], [(UID_A, 80.0)], [100.0], False),  # ÷ share, capped at 100
        (0.0, [A], [], [0.0], False),  # an empty list on an idle device: 0 %
        # shared: the processes split it
        (40.0, [HALF_A, HALF_B], [(UID_A, 40.0)], [80.0, 0.0], False),
        (60.0, [HALF_A, HALF_B], [(UID_A, 40.0), (UID_B, 20.0), (UID_B, 5.0)], [80.0, 50.0], False),
        (90.0, [HALF_A, HALF_B], [(UID_A, 90.0), (UID_B, 30.0)], [100.0, 60.0], False),  # capped at 100
        # shared, but the holders' processes cannot explain a busy device: each holder gets the device SM %
        (80.0, [HALF_A, HALF_B], [], [80.0, 80.0], True),  # empty list
        (80.0, [HALF_A, HALF_B], [(None, 80.0)], [80.0, 80.0], True),  # a process with no pod
        (80.0, [HALF_A, HALF_B], [(UID_A, None)], [80.0, 80.0], True),  # no SM figure
        (80.0, [HALF_A, HALF_B], [("cccccccc-0000-0000-0000-000000000003", 80.0)], [80.0, 80.0], True),  # not a holder
        (1.0, [HALF_A, HALF_B], [(UID_A, 0.5)], [1.0, 1.0], True),  # SM sum below the threshold, device at it
        (80.0, [HALF_A, HolderShare(0.5, None)], [], [80.0, 80.0], True),  # a holder whose UID is unknown
        (80.0, [HALF_A, HALF_B], None, [80.0, 80.0], True),  # no per-process data at all
        # shared and idle: no processes still says 0 %; no per-process data gives the device's figure
        (0.0, [HALF_A, HALF_B], [], [0.0, 0.0], False),
        (0.5, [HALF_A, HALF_B], [], [0.0, 0.0], False),
        (0.5, [HALF_A, HALF_B], None, [0.5, 0.5], False),
        # no figure from the device: nothing to say
        (None, [HALF_A, HALF_B], [(UID_A, 40.0)], [None, None], False),
        # busy and nobody known to hold it: nothing explains it
        (80.0, [], [], [], True),
        (0.0, [], [], [], False),
    ],
)
def test_utilization_by_holder(
    device_sm: float | None, holders: list[HolderShare], processes: list[tuple[str | None, float | None]] | None,
    figures: list[float | None], fell_short: bool,
) -> None:
    found, short = utilization_by_holder(device_sm, holders, processes, 1.0)
    assert found == pytest.approx(figures)
    assert short is fell_short


def test_a_busy_gpu_held_whole_with_no_visible_process_is_active() -> None:
    """The issue's case: a Job's pod holds GPU-7, SM 80 %, and NVML lists no process (agent without hostPID)."""
    assignments = [Assignment("GPU-7", "GPU-7", None, "nvidia.com/gpu", "ml", "job-0", "main")]
    result = attribute([_reading("GPU-7", 80.0, [])], assignments, {}, 4, _no_pods, {}, 1.0)
    (device,) = result.devices
    assert (device.pod, device.state) == ("job-0", "active")
    assert result.unexplained == {"GPU-7"}
    assert result.samples[0].processes == []  # the list as NVML gave it: the engine applies the rule itself
    idle = attribute([_reading("GPU-7", 0.0, [])], assignments, {}, 4, _no_pods, {}, 1.0)
    assert [d.state for d in idle.devices] == ["allocated-empty"] and idle.unexplained == frozenset()


def test_a_busy_gpu_nobody_is_known_to_hold_is_active_with_no_holder() -> None:
    result = attribute([_reading("GPU-8", 95.0, [])], [], {}, 4, _no_pods, {}, 1.0)
    (device,) = result.devices
    assert (device.pod, device.pod_uid, device.state) == (None, None, "active")
    assert result.unexplained == {"GPU-8"}
    quiet = attribute([_reading("GPU-8", 0.0, [])], [], {}, 4, _no_pods, {}, 1.0)
    assert [d.state for d in quiet.devices] == ["unallocated"] and quiet.unexplained == frozenset()


def test_a_shared_gpu_splits_by_processes_and_falls_back_to_the_device() -> None:
    assignments = [
        Assignment("GPU-1::0", "GPU-1", 0, "nvidia.com/gpu.shared", "ns", "a", "main"),
        Assignment("GPU-1::1", "GPU-1", 1, "nvidia.com/gpu.shared", "ns", "b", "main"),
    ]
    known = {("ns", "a"): UID_A, ("ns", "b"): UID_B}
    pods = {10: PodRef(UID_A), 20: PodRef(UID_B)}.get
    split = attribute([_reading("GPU-1", 40.0, [_process(10, sm=40.0), _process(20, sm=0.0, memory=1e9)])],
                      assignments, {"GPU-1": 2}, 4, pods, known, 1.0)
    assert [(d.pod, d.state) for d in split.devices] == [("a", "active"), ("b", "idle-held")]
    assert split.unexplained == frozenset()
    one_busy = attribute([_reading("GPU-1", 40.0, [_process(10, sm=40.0)])], assignments, {"GPU-1": 2}, 4, pods, known,
                         1.0)
    assert [(d.pod, d.state) for d in one_busy.devices] == [("a", "active"), ("b", "allocated-empty")]
    hidden = attribute([_reading("GPU-1", 40.0, [])], assignments, {"GPU-1": 2}, 4, pods, known, 1.0)
    assert [(d.pod, d.state) for d in hidden.devices] == [("a", "active"), ("b", "active")]
    assert hidden.unexplained == {"GPU-1"}
    idle = attribute([_reading("GPU-1", 0.0, [])], assignments, {"GPU-1": 2}, 4, pods, known, 1.0)
    assert [d.state for d in idle.devices] == ["allocated-empty", "allocated-empty"]


def test_two_assignments_of_one_pod_are_one_holder() -> None:
    """A pod with two replicas of a GPU is its only holder: the device's activity is all its own."""
    assignments = [
        Assignment("GPU-1::0", "GPU-1", 0, "nvidia.com/gpu.shared", "ns", "a", "main"),
        Assignment("GPU-1::1", "GPU-1", 1, "nvidia.com/gpu.shared", "ns", "a", "side"),
    ]
    result = attribute([_reading("GPU-1", 30.0, [])], assignments, {"GPU-1": 4}, 4, _no_pods, {}, 1.0)
    assert [(d.device_id, d.state) for d in result.devices] == [("GPU-1::0", "active"), ("GPU-1::1", "active")]


def test_unhealthy_device_is_unknown_and_not_counted() -> None:
    assignments = [Assignment("GPU-5", "GPU-5", None, "nvidia.com/gpu", "ns", "p", "c")]
    result = attribute([_reading("GPU-5", None, None, healthy=False, error="GPU is lost")], assignments, {}, 4,
                       _no_pods, {}, 1.0)
    assert [(d.pod, d.state, d.healthy, d.error) for d in result.devices] == [("p", "unknown", False, "GPU is lost")]
    assert result.unexplained == frozenset()


def test_holders_of_a_device_nvml_does_not_list_are_listed_unhealthy() -> None:
    """A GPU lost before the agent opened it has no reading under its UUID: its holders stay listed, unmonitored."""
    assignments = [
        Assignment("GPU-gone", "GPU-gone", None, "nvidia.com/gpu", "ml", "job-0", "main"),
        Assignment("MIG-gone", "MIG-gone", None, "nvidia.com/mig-3g.40gb", "ml", "slice-0", "main"),
        Assignment("GPU-gone2::1", "GPU-gone2", 1, "nvidia.com/gpu.shared", "ml", "shared-0", "main"),
    ]
    result = attribute([_reading("GPU-ok", 0.0, [])], assignments, {}, 4, _no_pods, {}, 1.0)
    gone = {d.uuid: d for d in result.devices if d.uuid != "GPU-ok"}
    assert {uuid: (d.pod, d.units, d.state, d.healthy) for uuid, d in gone.items()} == {
        "GPU-gone": ("job-0", 1.0, "unknown", False),
        "MIG-gone": ("slice-0", pytest.approx(3 / 7), "unknown", False),
        "GPU-gone2": ("shared-0", 0.25, "unknown", False),
    }
    assert gone["MIG-gone"].mig_profile == "3g.40gb"
    assert all("NVML lists no device" in (d.error or "") for d in gone.values())
    assert [s.uuid for s in result.samples] == ["GPU-ok"]  # no sample is made up for them
