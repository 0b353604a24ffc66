"""Owner resolution: the top-level workload of a pod, through ownerReferences, with a cache."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from gpuwm.controller.watch.owners import OwnerResolver, controller_reference

NS = "ns"


def obj(api_version: str, kind: str, name: str, uid: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid, "creationTimestamp": "2026-01-01T00:00:10Z"}
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                        "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


class FakeApi:
    def __init__(self, *objects: dict[str, Any], forbidden: AbstractSet[str] = frozenset(),
                 failing: AbstractSet[str] = frozenset()) -> None:
        self.objects = {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o for o in objects}
        self.forbidden = forbidden
        self.failing = set(failing)
        self.calls: list[tuple[str, str]] = []

    async def fetch(self, api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append((kind, name))
        if kind in self.failing:
            raise ConnectionError("API unreachable")
        if kind in self.forbidden:
            return None  # the client answers None for 403 and 404
        return self.objects.get((api_version, kind, name))


async def test_deployment_through_replicaset() -> None:
    deployment = obj("apps/v1", "Deployment", "web", "d1")
    replicaset = obj("apps/v1", "ReplicaSet", "web-5d4", "r1", deployment)
    pod = obj("v1", "Pod", "web-5d4-x", "p1", replicaset)
    api = FakeApi(deployment, replicaset)
    workload = await OwnerResolver(api.fetch).resolve(pod)
    assert (workload.kind, workload.name, workload.uid, workload.api_version) == ("Deployment", "web", "d1", "apps/v1")
    assert workload.created == pytest.approx(1767225610.0)


@pytest.mark.parametrize(
    ("chain", "expected"),
    [
        ([("batch/v1", "CronJob", "nightly"), ("batch/v1", "Job", "nightly-123")], "CronJob"),
        ([("jobset.x-k8s.io/v1alpha2", "JobSet", "js"), ("batch/v1", "Job", "js-workers-0")], "JobSet"),
        ([("kubeflow.org/v1", "PyTorchJob", "pt")], "PyTorchJob"),
        ([("kubeflow.org/v1", "TFJob", "tf")], "TFJob"),
        ([("kubeflow.org/v2beta1", "MPIJob", "mpi")], "MPIJob"),
        ([("ray.io/v1", "RayJob", "rj"), ("ray.io/v1", "RayCluster", "rj-raycluster")], "RayJob"),
        ([("apps/v1", "StatefulSet", "db")], "StatefulSet"),
        ([("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws"), ("apps/v1", "StatefulSet", "lws-0")],
         "LeaderWorkerSet"),
        ([("example.com/v1", "AnyCrd", "custom")], "AnyCrd"),
    ],
)
async def test_known_and_unknown_owner_chains(chain: list[tuple[str, str, str]], expected: str) -> None:
    objects: list[dict[str, Any]] = []
    owner = None
    for index, (api_version, kind, name) in enumerate(chain):
        owner = obj(api_version, kind, name, f"u{index}", owner)
        objects.append(owner)
    workload = await OwnerResolver(FakeApi(*objects).fetch).resolve(obj("v1", "Pod", "p", "p1", owner))
    assert workload.kind == expected and workload.uid == "u0"


async def test_bare_pod_is_its_own_workload() -> None:
    workload = await OwnerResolver(FakeApi().fetch).resolve(obj("v1", "Pod", "lonely", "p1"))
    assert (workload.kind, workload.name, workload.uid, workload.api_version) == ("Pod", "lonely", "p1", "v1")


async def test_rbac_stops_the_walk_at_the_last_reference() -> None:
    cronjob = obj("batch/v1", "CronJob", "nightly", "c1")
    job = obj("batch/v1", "Job", "nightly-1", "j1", cronjob)
    api = FakeApi(cronjob, job, forbidden={"Job"})
    workload = await OwnerResolver(api.fetch).resolve(obj("v1", "Pod", "p", "p1", job))
    assert (workload.kind, workload.name, workload.uid) == ("Job", "nightly-1", "j1")
    assert workload.created is None  # known only from the reference


async def test_cache_spares_repeat_walks_but_not_after_errors() -> None:
    job = obj("batch/v1", "Job", "train", "j1")
    api = FakeApi(job)
    resolver = OwnerResolver(api.fetch)
    for index in range(5):
        assert (await resolver.resolve(obj("v1", "Pod", f"p{index}", f"p{index}", job))).uid == "j1"
    assert api.calls == [("Job", "train")]
    flaky = FakeApi(job, failing={"Job"})
    resolver = OwnerResolver(flaky.fetch)
    assert (await resolver.resolve(obj("v1", "Pod", "p", "p1", job))).name == "train"  # the reference, for now
    flaky.failing.clear()
    await resolver.resolve(obj("v1", "Pod", "p", "p1", job))
    assert len(flaky.calls) == 2  # walked again once the API answered


async def test_replaced_owner_with_other_uid_stops_the_walk() -> None:
    old_job = obj("batch/v1", "Job", "train", "old")
    new_job = obj("batch/v1", "Job", "train", "new")
    workload = await OwnerResolver(FakeApi(new_job).fetch).resolve(obj("v1", "Pod", "p", "p1", old_job))
    assert workload.uid == "old"


def test_controller_reference_prefers_controller_and_skips_incomplete() -> None:
    metadata = {"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "1"},
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "2", "controller": True},
    ]}
    assert controller_reference(metadata)["kind"] == "Job"  # type: ignore[index]
    assert controller_reference({"ownerReferences": [{"kind": "Job"}]}) is None
    assert controller_reference({}) is None
