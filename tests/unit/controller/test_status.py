"""Pure builders: figures -> CR status, conditions, write decisions, names, token bucket."""

from __future__ import annotations

import pytest

from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.build import (
    build_conditions,
    build_project_status,
    build_workload_status,
    dns_name,
    label_value,
    project_counters,
    project_signature,
    rfc3339,
    workload_counters,
    workload_cr_name,
    workload_signature,
    write_reason,
)
from gpuwm.model.figures import GpuFigures, PodFigures, ProjectFigures, Windows, WorkloadFigures

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def figures(**changes: object) -> WorkloadFigures:
    base = WorkloadFigures(
        uid="w1", namespace="ns", name="train", kind="Job", api_version="batch/v1", project="vision", phase="Running",
        allocated_gpus=2.0, allocated_gpu_seconds=100.0, active_gpu_seconds=70.0, idle_gpu_seconds=20.0,
        unmonitored_gpu_seconds=10.0, last_active_time=NOW - 30, idle_seconds=30.0, start_time=NOW - 50,
        utilization=Windows(current=55.556, avg1m=50.0, avg5m=40.0, avg1h=35.0, lifetime=30.0), sampling=True,
        pods=[PodFigures(name="train-1", uid="p2", phase="Running", allocated_gpus=1.0),
              PodFigures(name="train-0", uid="p1", node="n1", phase="Running", allocated_gpus=1.0)],
        gpus=[GpuFigures(node="n1", uuid="GPU-b", units=1.0, monitored=True),
              GpuFigures(node="n1", uuid="GPU-a", units=1.0, pod="train-0", monitored=True, utilization_percent=61.0)],
    )
    return base.model_copy(update=changes)


def test_rfc3339() -> None:
    assert rfc3339(NOW) == "2026-01-01T00:00:00Z"
    assert rfc3339(NOW + 0.6) == "2026-01-01T00:00:01Z"
    assert rfc3339(None) is None


def test_build_workload_status_fields() -> None:
    status = build_workload_status(figures(), NOW).model_dump(mode="json", by_alias=True)
    assert status["allocatedGpuSeconds"] == 100.0 and status["idleGpuSeconds"] == 20.0
    assert status["wastedGpuHours"] == pytest.approx(20 / 3600, abs=1e-4)
    assert status["lastActiveTime"] == "2025-12-31T23:59:30Z" and status["startTime"] == "2025-12-31T23:59:10Z"
    assert status["endTime"] is None and status["lastUpdateTime"] == "2026-01-01T00:00:00Z"
    assert [pod["name"] for pod in status["pods"]] == ["train-0", "train-1"]  # stable order, no churn
    assert [gpu["uuid"] for gpu in status["gpus"]] == ["GPU-a", "GPU-b"]
    assert status["gpus"][1]["pod"] == ""
    assert status["utilization"]["current"] == 55.56
    assert {c["type"] for c in status["conditions"]} == {"Sampling", "Idle", "Underutilized"}


def test_big_workload_lists_are_capped_and_counted() -> None:
    """A 1,000-node job: 1,000 pods and 8,000 devices would pass etcd's 1.5 MiB object limit."""
    import json

    many = figures(
        pods=[PodFigures(name=f"train-{i:04d}", uid=f"p{i}", node=f"n{i}", phase="Running", allocated_gpus=8.0)
              for i in range(1000)],
        gpus=[GpuFigures(node=f"n{i // 8:04d}", uuid=f"GPU-{i:05d}", units=1.0, pod=f"train-{i // 8:04d}", monitored=True)
              for i in range(8000)],
    )
    status = build_workload_status(many, NOW).model_dump(mode="json", by_alias=True)
    assert status["podCount"] == 1000 and len(status["pods"]) == 256 and status["pods"][0]["name"] == "train-0000"
    assert status["gpuCount"] == 8000 and len(status["gpus"]) == 256 and status["gpus"][-1]["uuid"] == "GPU-00255"
    assert len(json.dumps(status)) < 256 * 1024
    small = build_workload_status(figures(), NOW).model_dump(mode="json", by_alias=True)
    assert small["podCount"] == 2 and small["gpuCount"] == 2


def _conditions(f: WorkloadFigures, **kwargs: object) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in build_conditions(f, NOW, **kwargs)}  # type: ignore[arg-type]


def test_conditions() -> None:
    active = _conditions(figures(idle_seconds=0.0, utilization=Windows(avg1h=80.0)))
    assert active == {"Sampling": ("True", "DevicesSampled"), "Idle": ("False", "Active"),
                      "Underutilized": ("False", "UtilizationOk")}
    idle = _conditions(figures(idle_seconds=900.0, utilization=Windows(avg1h=5.0)), idle_condition_after_seconds=600,
                       observed_idle_seconds=600.0)
    assert idle["Idle"] == ("True", "IdleTooLong") and idle["Underutilized"] == ("True", "LowUtilization")
    unsampled = _conditions(figures(sampling=False, gpus=[GpuFigures(node="n", uuid="GPU-x", monitored=False)]))
    assert unsampled["Sampling"] == ("False", "SamplesMissing")
    assert unsampled["Idle"] == ("Unknown", "NotYetSampled")
    ended = _conditions(figures(phase="Succeeded", allocated_gpus=0.0, idle_seconds=900.0))
    assert ended["Idle"] == ("False", "NotRunning") and ended["Sampling"][0] == "Unknown"


def test_condition_transition_time_moves_only_on_change() -> None:
    first = build_conditions(figures(idle_seconds=0.0), NOW)
    same = build_conditions(figures(idle_seconds=5.0), NOW + 60, previous=first)
    assert [c.last_transition_time for c in same] == [c.last_transition_time for c in first]
    changed = build_conditions(figures(idle_seconds=900.0), NOW + 120, previous=same, idle_condition_after_seconds=600,
                               observed_idle_seconds=700.0)
    idle = next(c for c in changed if c.type == "Idle")
    assert idle.status == "True" and idle.last_transition_time == rfc3339(NOW + 120)


def test_project_status() -> None:
    project = ProjectFigures(name="vision", workloads=3, namespaces=["b", "a"], allocated_gpus=4.0,
                             idle_gpu_seconds=7200.0, utilization=Windows(avg5m=12.345))
    status = build_project_status(project, NOW).model_dump(mode="json", by_alias=True)
    assert status["namespaces"] == ["a", "b"] and status["wastedGpuHours"] == 2.0
    assert status["utilization"]["avg5m"] == 12.35


def _mark(f: WorkloadFigures, at: float) -> tuple[tuple[object, ...], tuple[float, ...], float]:
    return _signature(f), workload_counters(f), at


def _signature(f: WorkloadFigures) -> tuple[object, ...]:
    """As of NOW (the figures' own time), idle stretches watched throughout."""
    observed = f.idle_seconds if f.idle_seconds > 0 else None
    return workload_signature(f, NOW, idle_condition_after_seconds=600, observed_idle_seconds=observed)


def _reason(previous: tuple[tuple[object, ...], tuple[float, ...], float] | None, f: WorkloadFigures,
            now: float) -> str:
    return write_reason(previous, _signature(f), workload_counters(f), now=now, interval_seconds=15)


def test_write_reason() -> None:
    written = _mark(figures(), NOW)
    assert _reason(None, figures(), NOW) == "material"
    assert _reason(written, figures(), NOW + 1) == "none"  # the same figures: nothing to say
    assert _reason(written, figures(), NOW + 60) == "none"  # ... however long ago (a finished workload)
    moved = figures(allocated_gpu_seconds=102.0)  # counters moved: a refresh, once the interval has passed
    assert _reason(written, moved, NOW + 2) == "none"
    assert _reason(written, moved, NOW + 15) == "due"
    for changed in (figures(allocated_gpus=1.0), figures(phase="Succeeded"), figures(idle_seconds=10_000.0),
                    figures(sampling=False), figures(end_time=NOW)):
        assert _reason(written, changed, NOW + 1) == "material"


def test_project_signature_and_counters() -> None:
    project = ProjectFigures(name="p", workloads=1, allocated_gpus=1.0, allocated_gpu_seconds=5.0)
    assert project_signature(project) != project_signature(project.model_copy(update={"allocated_gpus": 2.0}))
    assert project_signature(project) == project_signature(project.model_copy(update={"allocated_gpu_seconds": 9.0}))
    assert project_counters(project) != project_counters(project.model_copy(update={"allocated_gpu_seconds": 9.0}))


def test_names() -> None:
    assert dns_name("vision") == "vision"
    assert dns_name("Team Vision/Research").startswith("team-vision-research-")
    assert dns_name("Team A") != dns_name("team-a")
    assert len(dns_name("x" * 300)) <= 253
    assert label_value("ok-value") == "ok-value"
    assert len(label_value("y" * 100)) <= 63 and label_value("a b") != "a b"
    assert workload_cr_name("train", "Job", clash=False) == "train"
    assert workload_cr_name("train", "PyTorchJob", clash=True) == "train-pytorchjob"


def test_token_bucket_limits_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(20.0, clock=lambda: now[0])
    taken = sum(bucket.try_acquire() for _ in range(100))
    assert taken == 20  # the burst
    now[0] = 0.5
    assert sum(bucket.try_acquire() for _ in range(100)) == 10
    assert bucket.seconds_until() == pytest.approx(0.05)
    now[0] = 100.0
    assert sum(bucket.try_acquire() for _ in range(100)) == 20  # never more than the burst saved up
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(0)


def test_counters_carry_every_utilization_window_in_field_order() -> None:
    windows = Windows(current=12.345, avg1m=None, avg5m=5.0, avg1h=0.004, lifetime=99.999)
    expected = tuple(-1.0 if value is None else round(value, 2) for value in windows.model_dump().values())
    assert workload_counters(figures(utilization=windows))[-len(Windows.model_fields):] == expected
    project = ProjectFigures(name="vision", utilization=windows)
    assert project_counters(project)[-len(Windows.model_fields):] == expected == (12.35, -1.0, 5.0, 0.0, 100.0)


def test_sampling_says_when_figures_came_from_the_device_not_its_processes() -> None:
    # DESIGN §3's attribution rule: a busy GPU whose processes the agent could not see counts as busy, and says so
    conditions = {c.type: c for c in build_conditions(figures(unattributed_gpu_seconds=12.0), NOW)}
    sampling = conditions["Sampling"]
    assert (sampling.status, sampling.reason) == ("True", "DeviceFiguresUsed")
    assert "hostPID" in sampling.message
    assert _conditions(figures())["Sampling"] == ("True", "DevicesSampled")
