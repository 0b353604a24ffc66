"""Each watched kind's reading: requested GPU units, held back, finished; one object per kind of the
default list, with the arithmetic in the test's name or comment."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuwm.config import DEFAULT_RESOURCE_NAMES, DEFAULT_WORKLOAD_KINDS, Settings
from gpuwm.controller.rbac import workload_kind_rules
from gpuwm.controller.watch.workload_kinds import (
    READERS,
    WorkloadKind,
    asks_for_gpus,
    is_top_level,
    kueue_state,
    parse_workload_kind,
    parse_workload_kinds,
    plural_of,
    reader_of,
    requested_gpus,
)


def pod(gpus: Any = 1, resource: str = "nvidia.com/gpu", *, requests_only: bool = False) -> dict[str, Any]:
    """A pod template with one container asking for `gpus` of `resource` (and a CPU request that is no GPU)."""
    resources = {"requests" if requests_only else "limits": {resource: gpus, "cpu": "4"}}
    return {"spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]}}


def cpu_pod() -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "1"}}}]}}


def obj(kind: str, spec: dict[str, Any], status: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "w", "namespace": "ml", "uid": "u-1", **metadata}, "spec": spec,
            "status": status or {}}


def conditions(**types: str) -> dict[str, Any]:
    return {"conditions": [{"type": name, "status": status} for name, status in types.items()]}


def job_spec(parallelism: int | None = None, gpus: Any = 1, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": pod(gpus), **extra}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    return spec


def kubeflow(kind: str, key: str) -> dict[str, Any]:
    return obj(kind, {key: {"Master": {"replicas": 1, "template": pod(2)},
                            "Worker": {"replicas": 3, "template": pod(2)}},
                      "runPolicy": {"suspend": True}}, conditions(Created="True", Succeeded="True"))


# kind -> (object, requested GPU units, held back, finished)
CASES: dict[str, tuple[dict[str, Any], float, bool, str | None]] = {
    # parallelism 4 x 2 GPUs
    "Job": (obj("Job", job_spec(4, 2, suspend=True), conditions(Complete="True")), 8.0, True, "Succeeded"),
    # the job template's parallelism (default 1) x 1 GPU
    "CronJob": (obj("CronJob", {"suspend": True, "jobTemplate": {"spec": job_spec()}}), 1.0, True, None),
    # 2 replicas x parallelism 2 x 1 GPU + 1 replica (default) x 1 x 4 GPUs
    "JobSet": (obj("JobSet", {"suspend": False, "replicatedJobs": [
        {"name": "workers", "replicas": 2, "template": {"spec": job_spec(2)}},
        {"name": "driver", "template": {"spec": job_spec(None, 4)}},
    ]}, conditions(Completed="True")), 8.0, False, "Succeeded"),
    # master 1 x 2 + workers 3 x 2
    "PyTorchJob": (kubeflow("PyTorchJob", "pytorchReplicaSpecs"), 8.0, True, "Succeeded"),
    "TFJob": (kubeflow("TFJob", "tfReplicaSpecs"), 8.0, True, "Succeeded"),
    "MPIJob": (kubeflow("MPIJob", "mpiReplicaSpecs"), 8.0, True, "Succeeded"),
    "XGBoostJob": (kubeflow("XGBoostJob", "xgbReplicaSpecs"), 8.0, True, "Succeeded"),
    "PaddleJob": (kubeflow("PaddleJob", "paddleReplicaSpecs"), 8.0, True, "Succeeded"),
    # 4 nodes x 8 GPUs per node
    "TrainJob": (obj("TrainJob", {"suspend": True, "trainer": {
        "numNodes": 4, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}}}, conditions(Failed="True")),
        32.0, True, "Failed"),
    # head 1 x 0 + workers 2 x 1 GPU (numOfHosts 1) + 1 x numOfHosts 2 x 4 GPUs
    "RayJob": (obj("RayJob", {"suspend": True, "rayClusterSpec": {
        "headGroupSpec": {"template": cpu_pod()},
        "workerGroupSpecs": [{"groupName": "a", "replicas": 2, "template": pod(1)},
                             {"groupName": "b", "replicas": 1, "numOfHosts": 2, "template": pod(4)}]}},
        {"jobStatus": "SUCCEEDED"}), 10.0, True, "Succeeded"),
    # head 1 GPU + workers minReplicas 3 (replicas unset) x 1 GPU
    "RayCluster": (obj("RayCluster", {"headGroupSpec": {"template": pod(1)},
                                      "workerGroupSpecs": [{"minReplicas": 3, "template": pod(1)}]}), 4.0, False, None),
    # 3 replicas x 1 MIG 3g.40gb (3/7)
    "Deployment": (obj("Deployment", {"replicas": 3, "template": pod(1, "nvidia.com/mig-3g.40gb")}), 9 / 7, False, None),
    # 2 replicas x 2 shared GPUs at the default 4 replicas per GPU (1/4 each)
    "StatefulSet": (obj("StatefulSet", {"replicas": 2, "template": pod(2, "nvidia.com/gpu.shared")}), 1.0, False, None),
    # 2 groups x (leader 1 GPU + 3 workers x 8 GPUs)
    "LeaderWorkerSet": (obj("LeaderWorkerSet", {"replicas": 2, "leaderWorkerTemplate": {
        "size": 4, "leaderTemplate": pod(1), "workerTemplate": pod(8)}}), 50.0, False, None),
    # minReplicas 2 x the model's 1 GPU
    "InferenceService": (obj("InferenceService", {"predictor": {"minReplicas": 2, "model": {
        "modelFormat": {"name": "pytorch"}, "resources": {"limits": {"nvidia.com/gpu": "1"}}}}}), 2.0, False, None),
}


def test_every_default_kind_has_a_reader_and_a_case() -> None:
    kinds = {parse_workload_kind(text).kind for text in DEFAULT_WORKLOAD_KINDS} - {"Workload"}  # Kueue: below
    assert kinds == set(READERS) == set(CASES)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_reads_requested_gpus_suspension_and_finish(kind: str) -> None:
    body, requested, held_back, finished = CASES[kind]
    assert requested_gpus(body, kind, DEFAULT_RESOURCE_NAMES) == pytest.approx(requested)
    assert asks_for_gpus(body, kind, DEFAULT_RESOURCE_NAMES)
    reader = reader_of(kind)
    assert reader.suspended(body) is held_back
    assert reader.finished(body) == finished


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_without_gpu_requests_is_not_a_gpu_workload(kind: str) -> None:
    body = CASES[kind][0]
    other = json.loads(json.dumps(body).replace("nvidia.com/", "example.com/"))  # asking for another resource
    assert requested_gpus(other, kind, DEFAULT_RESOURCE_NAMES) == 0
    assert not asks_for_gpus(other, kind, DEFAULT_RESOURCE_NAMES)


def test_defaults_and_edges_of_the_counts() -> None:
    assert requested_gpus(obj("Job", {"template": pod(2)}), "Job", DEFAULT_RESOURCE_NAMES) == 2  # parallelism 1
    # at most `completions` pods at once
    assert requested_gpus(obj("Job", job_spec(8, 1, completions=3)), "Job", DEFAULT_RESOURCE_NAMES) == 3
    # a Deployment scaled to zero asks for nothing now, and is still a GPU workload
    scaled = obj("Deployment", {"replicas": 0, "template": pod(1)})
    assert requested_gpus(scaled, "Deployment", DEFAULT_RESOURCE_NAMES) == 0
    assert asks_for_gpus(scaled, "Deployment", DEFAULT_RESOURCE_NAMES)
    # requests alone count as limits do; a GPU in a restartable init (sidecar) container counts
    assert requested_gpus(obj("Job", {"template": pod(1, requests_only=True)}), "Job", DEFAULT_RESOURCE_NAMES) == 1
    sidecar = {"spec": {"containers": [{"name": "m"}], "initContainers": [
        {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    assert requested_gpus(obj("Job", {"template": sidecar}), "Job", DEFAULT_RESOURCE_NAMES) == 1
    # LWS without a leader template: every pod of a group is a worker
    lws = obj("LeaderWorkerSet", {"leaderWorkerTemplate": {"size": 3, "workerTemplate": pod(2)}})
    assert requested_gpus(lws, "LeaderWorkerSet", DEFAULT_RESOURCE_NAMES) == 6
    # a kind gpuwm has no reader for: spec.replicas x spec.template, spec.suspend
    custom = obj("Notebook", {"replicas": 2, "suspend": True, "template": pod(1)})
    assert requested_gpus(custom, "Notebook", DEFAULT_RESOURCE_NAMES) == 2 and reader_of("Notebook").suspended(custom)
    # the configured names decide what a GPU is
    assert requested_gpus(obj("Job", {"template": pod(1, "amd.com/gpu")}), "Job", ["amd.com/gpu"]) == 1


def test_a_malformed_quantity_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'lots'"):
        requested_gpus(obj("Job", {"template": pod("lots")}), "Job", DEFAULT_RESOURCE_NAMES)
    assert asks_for_gpus(obj("Job", {"template": pod("lots")}), "Job", DEFAULT_RESOURCE_NAMES)


def test_finished_and_held_back_read_only_true_conditions() -> None:
    job = obj("Job", job_spec(), conditions(Complete="False", Failed="False"))
    assert reader_of("Job").finished(job) is None and not reader_of("Job").suspended(job)
    assert reader_of("Job").finished(obj("Job", job_spec(), conditions(Failed="True"))) == "Failed"
    assert reader_of("RayJob").finished(obj("RayJob", {}, {"jobStatus": "RUNNING"})) is None
    assert reader_of("RayJob").finished(obj("RayJob", {}, {"jobStatus": "STOPPED"})) == "Failed"
    assert not reader_of("PyTorchJob").suspended(obj("PyTorchJob", {"runPolicy": {"suspend": False}}))


def test_only_objects_without_a_controller_owner_are_top_level() -> None:
    assert is_top_level(obj("Job", job_spec()))
    owned = obj("Job", job_spec(), ownerReferences=[
        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "c-1", "controller": True}])
    assert not is_top_level(owned)


def test_a_kueue_workload_is_its_owners_queue_state() -> None:
    owner = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "w", "uid": "pt-1", "controller": True}]
    pending = obj("Workload", {"queueName": "team-a"}, conditions(QuotaReserved="False"), ownerReferences=owner)
    state = kueue_state(pending)
    assert state is not None and (state.owner_uid, state.admitted, state.local_queue, state.cluster_queue) == (
        "pt-1", False, "team-a", None)
    admitted = obj("Workload", {"queueName": "team-a"},
                   {"admission": {"clusterQueue": "gpus"}, **conditions(QuotaReserved="True", Admitted="True")},
                   ownerReferences=owner)
    state = kueue_state(admitted)
    assert state is not None and (state.admitted, state.cluster_queue) == (True, "gpus")
    # preempted: the Admitted condition says so even while an admission is still written
    evicted = obj("Workload", {"queueName": "team-a"},
                  {"admission": {"clusterQueue": "gpus"}, **conditions(Admitted="False", Evicted="True")},
                  ownerReferences=owner)
    assert kueue_state(evicted) is not None and not kueue_state(evicted).admitted  # type: ignore[union-attr]
    # older Kueue without conditions: status.admission alone
    assert kueue_state(obj("Workload", {}, {"admission": {"clusterQueue": "q"}}, ownerReferences=owner)).admitted  # type: ignore[union-attr]
    assert kueue_state(obj("Workload", {"queueName": "q"})) is None  # no owner: nothing to say it of


@pytest.mark.parametrize(("text", "expected"), [
    ("batch/v1/Job", WorkloadKind("batch", "v1", "Job")),
    ("kubeflow.org/PyTorchJob", WorkloadKind("kubeflow.org", None, "PyTorchJob")),
    ("jobset.x-k8s.io/v1alpha2/JobSet", WorkloadKind("jobset.x-k8s.io", "v1alpha2", "JobSet")),
    ("v1/Pod", WorkloadKind("", "v1", "Pod")),
])
def test_kind_spellings(text: str, expected: WorkloadKind) -> None:
    assert parse_workload_kind(text) == expected


@pytest.mark.parametrize("text", ["Job", "batch/v1/job", "batch//Job", "a/b/c/Job", "batch/version1/Job"])
def test_bad_kind_spellings_are_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="GROUP/VERSION/Kind"):
        parse_workload_kind(text)
    with pytest.raises(ValueError, match=r"workload_kinds\n.*GROUP/VERSION/Kind"):
        Settings(workload_kinds=text)


def test_every_default_kind_parses_and_gets_read_only_rbac() -> None:
    kinds = parse_workload_kinds([*DEFAULT_WORKLOAD_KINDS, "batch/v1/Job"])
    assert len(kinds) == len(DEFAULT_WORKLOAD_KINDS)  # each once
    rules = {(rule["apiGroups"][0], rule["resources"][0]): rule["verbs"] for rule in workload_kind_rules()}
    assert rules[("kubeflow.org", "pytorchjobs")] == ["get", "list", "watch"]
    assert rules[("kueue.x-k8s.io", "workloads")] == ["get", "list", "watch"]
    assert ("serving.kserve.io", "inferenceservices") in rules and ("batch", "cronjobs") in rules
    assert [plural_of(kind) for kind in ("Policy", "Gateway", "Ingress", "Box")] == [
        "policies", "gateways", "ingresses", "boxes"]
