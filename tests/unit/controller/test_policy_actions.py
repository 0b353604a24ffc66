"""What each idle-policy step sends for each kind (pure builders), and the IdlePolicy condition."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwm.accounting import Step
from gpuwm.controller.policy.actions import (
    NotApplicable,
    delete_change,
    kueue_change,
    scale_change,
    suspend_change,
)
from gpuwm.controller.policy.report import action_record, idle_policy_condition
from gpuwm.model import ActionType

PATH = "/apis/x/v1/namespaces/ml/things/nb"


def step(kind: str, action: ActionType = "scaleToZero", via_kueue: bool = False) -> Step:
    return Step(policy="p", uid="u", namespace="ml", name="nb", kind=kind, api_version="x/v1", index=1,
                action=action, due_at=0.0, dry_run=False, via_kueue=via_kueue, webhook_secret=None,
                idle_seconds=600.0)


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "LeaderWorkerSet"])
def test_scale_subresource_where_the_kind_has_one(kind: str) -> None:
    change = scale_change(step(kind), PATH, {"spec": {"replicas": 3}}, 0.0)
    assert change is not None and change.path == PATH + "/scale" and change.body == {"spec": {"replicas": 0}}
    assert scale_change(step(kind), PATH, {"spec": {"replicas": 0}}, 0.0) is None  # at rest already


def test_a_notebook_is_stopped_by_its_annotation() -> None:
    change = scale_change(step("Notebook"), PATH, {"metadata": {}}, 1_800_000_000.0)
    assert change is not None and change.path == PATH
    assert change.body == {"metadata": {"annotations": {"kubeflow-resource-stopped": "2027-01-15T08:00:00Z"}}}
    stopped = {"metadata": {"annotations": {"kubeflow-resource-stopped": "2027-01-01T00:00:00Z"}}}
    assert scale_change(step("Notebook"), PATH, stopped, 0.0) is None


def test_a_rayclusters_worker_groups_go_to_zero_whole() -> None:
    cluster: dict[str, Any] = {"metadata": {"resourceVersion": "42"}, "spec": {"workerGroupSpecs": [
        {"groupName": "gpu", "replicas": 4, "minReplicas": 1, "maxReplicas": 8, "template": {"spec": {}}},
        {"groupName": "cpu", "replicas": 2, "template": {"spec": {}}}]}}
    change = scale_change(step("RayCluster"), PATH, cluster, 0.0)
    assert change is not None and change.body is not None
    groups = change.body["spec"]["workerGroupSpecs"]
    assert [(g["groupName"], g["replicas"], g["minReplicas"], g.get("maxReplicas")) for g in groups] == [
        ("gpu", 0, 0, 8), ("cpu", 0, 0, None)]
    assert change.body["metadata"] == {"resourceVersion": "42"}  # refused if the cluster changed meanwhile
    with pytest.raises(NotApplicable):
        scale_change(step("RayCluster"), PATH, {"spec": {}}, 0.0)


def test_an_inference_service_scales_to_zero_only_where_its_mode_allows() -> None:
    change = scale_change(step("InferenceService"), PATH, {"spec": {"predictor": {"minReplicas": 1}}}, 0.0)
    assert change is not None and change.body == {"spec": {"predictor": {"minReplicas": 0}}}
    raw = {"metadata": {"annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}}}
    with pytest.raises(NotApplicable, match="RawDeployment"):
        scale_change(step("InferenceService"), PATH, raw, 0.0)
    with pytest.raises(NotApplicable):
        scale_change(step("Job"), PATH, {}, 0.0)


@pytest.mark.parametrize(("kind", "body"), [
    ("Job", {"spec": {"suspend": True}}), ("JobSet", {"spec": {"suspend": True}}),
    ("RayJob", {"spec": {"suspend": True}}), ("TrainJob", {"spec": {"suspend": True}}),
    ("PyTorchJob", {"spec": {"runPolicy": {"suspend": True}}}), ("MPIJob", {"spec": {"runPolicy": {"suspend": True}}}),
])
def test_suspend_through_the_kinds_own_field(kind: str, body: dict[str, Any]) -> None:
    change = suspend_change(step(kind, "suspend"), PATH, {"spec": {}})
    assert change is not None and change.body == body and change.path == PATH
    assert suspend_change(step(kind, "suspend"), PATH, body) is None
    with pytest.raises(NotApplicable):
        suspend_change(step("Deployment", "suspend"), PATH, {})


def test_kueue_is_asked_to_deactivate_never_the_jobs_suspend() -> None:
    workload = {"metadata": {"name": "job-train-1"}, "spec": {"active": True}}
    change = kueue_change(step("Job", "suspend", via_kueue=True), "/kueue/path", workload)
    assert change is not None and change.path == "/kueue/path" and change.body == {"spec": {"active": False}}
    assert kueue_change(step("Job", "suspend", True), "/kueue/path", {"spec": {"active": False}}) is None


def test_delete_lets_the_garbage_collector_take_the_dependents() -> None:
    change = delete_change(step("Job", "delete"), PATH)
    assert change.method == "DELETE" and change.body is not None and change.body["propagationPolicy"] == "Background"


def test_the_idle_policy_condition_follows_the_episode() -> None:
    assert idle_policy_condition([], True, None) is None  # never acted on: no condition at all
    records = [action_record(100.0, "p", "scaleToZero", "Succeeded", "scaled Deployment nb to 0 replicas"),
               action_record(50.0, "p", "warn", "Succeeded", "warned")]
    held = idle_policy_condition(records, True, None)
    assert held is not None and held["status"] == "True" and held["reason"] == "ScaledToZero"
    released = idle_policy_condition(records, False, 200.0)
    assert released is not None and released["status"] == "False" and released["reason"] == "NotIdle"
    failed = [action_record(100.0, "p", "suspend", "Failed", "forbidden")]
    assert idle_policy_condition(failed, True, None) is None
