"""A pod whose owner changes (`kubectl delete job --cascade=orphan`) moves to its new workload from that time."""

from __future__ import annotations

import pytest

from gpuwm.accounting import Engine
from tests.unit.accounting.helpers import engine, pod, samples


def _moved() -> Engine:
    e = engine()
    e.observe(pod(0, "train-0", workload="job-a"))
    for s in samples(0, 10, sm=50):
        e.observe(s)
    # the garbage collector strips the ownerReferences: the pod's next event resolves to the pod itself
    e.observe(pod(10, "train-0", workload="train-0", kind="Pod"))
    for s in samples(11, 20, sm=50):
        e.observe(s)
    return e



def test_the_pod_time_before_the_change_stays_with_the_old_workload_and_after_goes_to_the_new() -> None:
    e = _moved()
    old, new = (e.workload(uid, 20) for uid in ("wl-job-a", "wl-train-0"))
    assert old is not None and new is not None
    assert old.allocated_gpu_seconds == pytest.approx(10) and old.active_gpu_seconds == pytest.approx(10)
    assert old.phase == "Ended" and old.end_time == 10 and old.allocated_gpus == 0
    assert new.phase == "Running" and new.allocated_gpus == 1
    assert new.allocated_gpu_seconds == pytest.approx(10) and new.active_gpu_seconds == pytest.approx(10)
    assert [p.uid for p in new.pods] == ["pod-train-0"] and [p.uid for p in old.pods] == ["pod-train-0"]
    # the project counts every GPU-second once
    assert sum(p.allocated_gpu_seconds for p in e.projects(20)) == pytest.approx(20)
    assert sum(p.allocated_gpus for p in e.projects(20)) == pytest.approx(1)


def test_a_late_event_of_the_old_owner_does_not_move_the_pod_back() -> None:
    e = _moved()
    e.observe(pod(9.5, "train-0", workload="job-a"))
    new = e.workload("wl-train-0", 20)
    assert new is not None and new.allocated_gpus == 1 and new.phase == "Running"


def test_the_moved_pod_survives_a_save_and_restore_and_forgetting_the_old_workload() -> None:
    e = _moved()
    restored = Engine.restore(e.save(), e.config)
    for uid in ("wl-job-a", "wl-train-0"):
        assert restored.workload(uid, 20) == e.workload(uid, 20)
    restored.forget_workload("wl-job-a")
    new = restored.workload("wl-train-0", 20)
    assert new is not None and new.allocated_gpus == 1 and [p.uid for p in new.pods] == ["pod-train-0"]
    restored.observe(pod(21, "train-0", "Succeeded", workload="train-0", kind="Pod"))
    ended = restored.workload("wl-train-0", 21)
    assert ended is not None and ended.phase == "Succeeded"


def test_an_event_of_the_moved_pod_dated_before_the_move_does_not_take_back_the_old_workloads_time() -> None:
    # after the move at 10, the agent names another device from the pod's start (0): the new record stays from 10
    e = _moved()
    e.observe(pod(0, "train-0", workload="train-0", kind="Pod", devices=[("GPU-b", 1.0)]))
    old, new = e.workload("wl-job-a", 20), e.workload("wl-train-0", 20)
    assert old is not None and new is not None
    assert old.allocated_gpu_seconds == pytest.approx(10)
    assert new.allocated_gpu_seconds == pytest.approx(10)  # not 20: one GPU for 20 s is 20 GPU-seconds in all
    restored = Engine.restore(e.save(), e.config)
    restored.observe(pod(0, "train-0", workload="train-0", kind="Pod", devices=[("GPU-a", 1.0)]))
    again = restored.workload("wl-train-0", 20)
    assert again is not None and again.allocated_gpu_seconds == pytest.approx(10)  # the move's time is kept
