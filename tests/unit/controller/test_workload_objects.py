"""Workload objects -> the engine: what is sent, when, and what the figures and CRs then say."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.config import DEFAULT_RESOURCE_NAMES
from gpuwm.controller import handlers
from gpuwm.controller.status.build import build_workload_status, workload_labels
from gpuwm.controller.watch.workload_kinds import parse_workload_kinds
from gpuwm.controller.watch.workload_objects import WorkloadObjects
from gpuwm.model.figures import WorkloadFigures

CREATED = "2026-01-01T00:00:00Z"
T0 = 1767225600.0  # CREATED in epoch seconds


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def job(*, suspend: bool = False, gpus: int = 2, parallelism: int = 2, uid: str = "job-1",
        conditions: list[dict[str, str]] | None = None, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": uid, "creationTimestamp": CREATED,
                     "resourceVersion": "1", **metadata},
        "spec": {"suspend": suspend, "parallelism": parallelism, "template": {"spec": {"containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}},
        "status": {"conditions": conditions or []},
    }


def kueue_workload(*, admitted: bool, owner_uid: str = "job-1", uid: str = "kw-1") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Admitted", "status": "True" if admitted else "False"}]}
    if admitted:
        status["admission"] = {"clusterQueue": "gpus"}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "job-train-abc", "namespace": "ml", "uid": uid, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": owner_uid, "controller": True}]},
        "spec": {"queueName": "team-a"}, "status": status,
    }


@pytest.fixture
def setup() -> tuple[Engine, WorkloadObjects, Clock]:
    engine = Engine(EngineConfig())
    clock = Clock()
    return engine, WorkloadObjects(lambda: engine, clock, DEFAULT_RESOURCE_NAMES), clock


def figures_of(engine: Engine, now: float, uid: str = "job-1") -> WorkloadFigures:
    found = engine.workload(uid, now)
    assert found is not None
    return found


def test_a_suspended_job_is_queued_from_its_creation_then_pending_when_unsuspended(setup: Any) -> None:
    engine, objects, clock = setup
    clock.now = T0 + 5
    sent = objects.on_object(job(suspend=True))
    assert sent is not None and sent.suspended and sent.requested_gpus == 4 and sent.created == T0
    f = figures_of(engine, T0 + 30)
    assert (f.phase, f.requested_gpus, f.queued_seconds, f.allocated_gpus) == ("Queued", 4.0, 30.0, 0.0)
    clock.now = T0 + 40
    assert objects.on_object(job(suspend=False)) is not None
    f = figures_of(engine, T0 + 50)
    assert (f.phase, f.queued_seconds, f.wait_seconds) == ("Pending", 40.0, 50.0)
    # the CR a workload without pods gets
    body = build_workload_status(f, T0 + 50).model_dump(mode="json", by_alias=True)
    assert (body["phase"], body["requestedGpus"], body["queuedSeconds"], body["pods"]) == ("Pending", 4.0, 40.0, [])


def test_resyncs_and_changes_the_engine_does_not_read_send_nothing(setup: Any) -> None:
    _engine, objects, clock = setup
    assert objects.on_object(job(suspend=True)) is not None
    clock.now += 300
    assert objects.on_object(job(suspend=True, resourceVersion="7")) is None  # a resync or a status change
    assert objects.on_object(job(suspend=True, gpus=4)) is not None  # what it asks for changed


def test_non_gpu_and_owned_objects_are_not_workloads(setup: Any) -> None:
    engine, objects, _clock = setup
    assert objects.on_object(job(gpus=0)) is None
    owned = job(uid="job-2", ownerReferences=[
        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "cron-1", "controller": True}])
    assert objects.on_object(owned) is None
    assert engine.workloads(T0) == [] and objects.watched == 0


def test_a_workload_that_drops_its_gpu_request_stays_one_asking_for_none(setup: Any) -> None:
    engine, objects, _clock = setup
    objects.on_object(job())
    sent = objects.on_object(job(gpus=0))
    assert sent is not None and sent.requested_gpus == 0
    assert figures_of(engine, T0 + 1).requested_gpus == 0


def test_deletion_ends_a_queued_workload(setup: Any) -> None:
    engine, objects, clock = setup
    objects.on_object(job(suspend=True))
    clock.now = T0 + 60
    sent = objects.on_object(job(suspend=True), deleted=True)
    assert sent is not None and sent.deleted
    f = figures_of(engine, T0 + 100)
    assert (f.phase, f.end_time, f.queued_seconds) == ("Ended", T0 + 60, 60.0)
    assert objects.watched == 0


def test_a_finished_job_says_so(setup: Any) -> None:
    _engine, objects, _clock = setup
    objects.on_object(job())
    sent = objects.on_object(job(conditions=[{"type": "Complete", "status": "True"}]))
    assert sent is not None and sent.finished == "Succeeded"


def test_kueue_holds_a_job_back_until_admitted_and_names_its_queues(setup: Any) -> None:
    engine, objects, clock = setup
    # Kueue's Workload may be seen before its Job: its state waits for the owner
    assert objects.on_object(kueue_workload(admitted=False)) is None
    sent = objects.on_object(job(suspend=True))
    assert sent is not None and sent.suspended and (sent.local_queue, sent.cluster_queue) == ("team-a", None)
    clock.now = T0 + 20
    sent = objects.on_object(kueue_workload(admitted=True))  # admitted: the Job is still suspended until Kueue acts
    assert sent is not None and sent.suspended and sent.cluster_queue == "gpus"
    clock.now = T0 + 21
    sent = objects.on_object(job(suspend=False))
    assert sent is not None and not sent.suspended
    f = figures_of(engine, T0 + 30)
    assert (f.phase, f.queued_seconds, f.local_queue, f.cluster_queue) == ("Pending", 21.0, "team-a", "gpus")
    labels = workload_labels(f)
    assert labels["gpuwm.io/local-queue"] == "team-a" and labels["gpuwm.io/cluster-queue"] == "gpus"
    # preempted: Kueue takes the admission back and suspends the Job
    clock.now = T0 + 40
    sent = objects.on_object(kueue_workload(admitted=False))
    assert sent is not None and sent.suspended
    assert figures_of(engine, T0 + 50).phase == "Queued"
    # the Kueue Workload deleted (the job done, or taken off the queue): its queues stay the workload's
    clock.now = T0 + 60
    objects.on_object(job(suspend=False))
    sent = objects.on_object(kueue_workload(admitted=False), deleted=True)
    assert sent is None or not sent.suspended
    assert figures_of(engine, T0 + 70).local_queue == "team-a"


def test_a_kueue_workload_of_a_deployment_holds_it_back_without_a_suspend_field(setup: Any) -> None:
    engine, objects, _clock = setup
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "namespace": "ml", "uid": "dep-1", "creationTimestamp": CREATED,
                               "labels": {"kueue.x-k8s.io/queue-name": "team-b"}},
                  "spec": {"replicas": 2, "template": {"spec": {"containers": [
                      {"name": "m", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    sent = objects.on_object(deployment)
    assert sent is not None and not sent.suspended and sent.local_queue == "team-b"  # from the label
    sent = objects.on_object(kueue_workload(admitted=False, owner_uid="dep-1"))
    assert sent is not None and sent.suspended
    assert figures_of(engine, T0 + 1, "dep-1").phase == "Queued"


def test_absent_kinds_are_one_line_each_once(caplog: pytest.LogCaptureFixture) -> None:
    handlers.register_workload_kinds(parse_workload_kinds(["ray.io/RayJob", "kubeflow.org/v1/PyTorchJob"]))
    kopf_logger = logging.getLogger("kopf._core.reactor.observation")
    message = ("Unresolved resources cannot be served (try creating their CRDs): "
               "Selector(group='ray.io', kind='RayJob'), Selector(group='kubeflow.org', version='v1', kind='PyTorchJob')")
    with caplog.at_level(logging.INFO):
        kopf_logger.warning(message)
        kopf_logger.warning(message)  # again on the next CRD change: nothing new
        kopf_logger.warning("Unresolved resources cannot be served (try creating their CRDs): Selector(plural='nodez')")
    lines = [record.getMessage() for record in caplog.records]
    assert sum("ray.io/RayJob is not installed" in line for line in lines) == 1
    assert sum("kubeflow.org/v1/PyTorchJob is not installed" in line for line in lines) == 1
    assert not any("RayJob" in line and "Unresolved" in line for line in lines)
    assert any("nodez" in line for line in lines)  # not a workload kind: kopf's own warning stays


def test_a_failed_job_says_why(setup: Any) -> None:
    """The Failed condition's reason and message reach the workload's figures."""
    engine, objects, clock = setup
    objects.on_object(job())
    assert figures_of(engine, T0 + 1).failure_reason is None
    clock.now = T0 + 30
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
              "message": "Job has reached the specified backoff limit"}
    sent = objects.on_object(job(conditions=[failed]))
    assert sent is not None and sent.finished == "Failed"
    assert sent.message == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    assert figures_of(engine, T0 + 40).failure_reason == sent.message
    # a False Failed condition says nothing
    assert objects.on_object(job(uid="job-2", conditions=[{**failed, "status": "False"}])) is not None
    assert figures_of(engine, T0 + 40, uid="job-2").failure_reason is None
