"""Workloads seen through their own objects: queued and pending before any pod, requested GPUs,
queued and wait seconds, preemption. Worked examples, each with its arithmetic."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwm.accounting import Engine
from gpuwm.model import PodEvent, WorkloadEvent
from gpuwm.model.figures import WorkloadFigures
from tests.unit.accounting.helpers import engine, pod, samples


def job(t: float, *, suspended: bool = False, requested: float = 2.0, **fields: Any) -> WorkloadEvent:
    return WorkloadEvent.model_validate({
        "t": t, "event": "workload", "namespace": "ml", "name": "train", "uid": "wl-train", "kind": "Job",
        "apiVersion": "batch/v1", "created": 0.0, "suspended": suspended, "requested_gpus": requested,
        "local_queue": "team-a", "cluster_queue": "gpus", **fields,
    })


def at(e: Engine, now: float) -> WorkloadFigures:
    figures = e.workload("wl-train", now)
    assert figures is not None
    return figures


def two_gpu_pod(t: float, phase: str = "Running", name: str = "train-0") -> PodEvent:
    return pod(t, name, phase, workload="train", devices=[("GPU-a", 1.0), ("GPU-b", 1.0)])


def test_a_suspended_job_is_queued_with_its_requested_gpus_then_pending_then_running() -> None:
    e = engine()
    e.observe(job(0, suspended=True))
    f = at(e, 20)
    assert (f.phase, f.requested_gpus, f.allocated_gpus) == ("Queued", 2.0, 0.0)
    assert f.queued_seconds == 20 and f.wait_seconds == 20  # created at 0, held back since
    assert (f.local_queue, f.cluster_queue) == ("team-a", "gpus")
    e.observe(job(30, suspended=False))  # admitted
    f = at(e, 35)
    assert f.phase == "Pending" and f.queued_seconds == 30 and f.wait_seconds == 35
    e.observe(two_gpu_pod(40))
    for s in [*samples(40, 60, "GPU-a", sm=50), *samples(40, 60, "GPU-b", sm=50)]:
        e.observe(s)
    f = at(e, 60)
    assert f.phase == "Running" and f.allocated_gpus == 2.0
    assert f.queued_seconds == 30 and f.wait_seconds == 40  # creation -> first running GPU container


def test_a_finished_job_ends_with_its_pods() -> None:
    e = engine()
    e.observe(job(0))
    e.observe(two_gpu_pod(10))
    e.observe(two_gpu_pod(50, "Succeeded"))
    e.observe(job(51, finished="Succeeded"))
    f = at(e, 100)
    assert f.phase == "Succeeded" and f.end_time == 50 and f.wait_seconds == 10 and f.queued_seconds == 0


def test_a_preempted_workload_queues_again_and_both_counts_go_on() -> None:
    e = engine()
    e.observe(job(0))
    e.observe(two_gpu_pod(10))
    e.observe(job(50, suspended=True))  # Kueue preempts it: suspended, its pods deleted at 52
    e.observe(two_gpu_pod(52, "Deleted"))
    f = at(e, 70)
    assert f.phase == "Queued" and f.end_time is None
    assert f.queued_seconds == 20  # (50, 70]
    assert f.wait_seconds == 10 + 18  # creation -> 10, then from its run's end at 52 to now
    e.observe(job(80, suspended=False))
    e.observe(two_gpu_pod(90, name="train-1"))
    f = at(e, 100)
    assert f.phase == "Running" and f.queued_seconds == 30  # (50, 80]
    assert f.wait_seconds == 10 + 38  # 52 -> 90


def test_a_workload_never_admitted_is_unmet_demand_of_its_project() -> None:
    e = engine()
    e.observe(job(0, suspended=True, requested=4.0))
    e.observe(pod(0, "other-0", workload="other"))  # a running workload of the same project
    project = next(p for p in e.projects(500) if p.name == "ml")
    assert project.requested_gpus == 4.0 and project.queued_workloads == 1
    assert project.longest_queued_seconds == 500
    assert project.allocated_gpus == 1.0


def test_a_queued_workload_deleted_ends_then() -> None:
    e = engine()
    e.observe(job(0, suspended=True))
    e.observe(job(60, suspended=True, deleted=True))
    f = at(e, 100)
    assert f.phase == "Ended" and f.end_time == 60 and f.queued_seconds == 60


def test_a_workload_without_pods_survives_save_and_restore() -> None:
    e = engine()
    e.observe(job(0, suspended=True))
    e.observe(job(30))
    restored = Engine.restore(e.save(), e.config)
    assert at(restored, 45) == at(e, 45)
    assert at(restored, 45).phase == "Pending"


def test_pods_only_workloads_keep_their_figures() -> None:
    e = engine()
    e.observe(pod(0, "solo"))
    f = e.workloads(10)[0]
    assert f.requested_gpus is None and f.queued_seconds == 0 and f.phase == "Running"


@pytest.mark.parametrize("typo", ["requestedGpus", "suspend"])
def test_a_workload_line_with_an_unknown_field_is_refused(typo: str) -> None:
    from gpuwm.model.trace import TraceLineError, parse_trace_line

    line = ('{"t": 0, "event": "workload", "namespace": "ml", "name": "j", "uid": "u", "kind": "Job", '
            f'"apiVersion": "batch/v1", "{typo}": 1}}')
    with pytest.raises(TraceLineError, match=typo):
        parse_trace_line(line, 3)


def test_wait_is_never_shorter_than_the_time_held_back() -> None:
    # admitted at 30.4, its container's start written in whole seconds (30): it waited 30.4 s, not 30
    e = engine()
    e.observe(job(0, suspended=True))
    e.observe(job(30.4))
    e.observe(two_gpu_pod(30))
    f = at(e, 40)
    assert f.queued_seconds == pytest.approx(30.4) and f.wait_seconds == pytest.approx(30.4)
