"""Ranks and labels through the HTTP API on a real embedded store: a pod's rank comes from the
operators' labels in its figures (the names here would rank the pods the other way round), and the
range answer's `workload` says why a failed run failed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.ranks import rank_pods
from gpuwm.config import Settings
from gpuwm.model.figures import GpuFigures, PodFigures, WorkloadFigures
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import cluster, project, sample

TIMES = [float(t) for t in range(0, 300, 15)]
KF_TYPE = "training.kubeflow.org/replica-type"
KF_INDEX = "training.kubeflow.org/replica-index"
#: PyTorchJob `pt`: its pods' names say worker-0, -1, -2, its labels say worker-2 is the master and
#: worker-1 the first worker (a renamed template); each pod holds gpu-<n> at 10, 20, 30 %
PT_PODS = {
    "pt-worker-0": {KF_TYPE: "Worker", KF_INDEX: "1"},
    "pt-worker-1": {KF_TYPE: "Worker", KF_INDEX: "0"},
    "pt-worker-2": {KF_TYPE: "Master", KF_INDEX: "0"},
}


def pt_figures(failed: bool = False) -> WorkloadFigures:
    names = list(PT_PODS)
    return WorkloadFigures(
        uid="uid-pt", namespace="team-a", name="pt", kind="PyTorchJob", api_version="kubeflow.org/v1",
        project="alpha", phase="Failed" if failed else "Running", allocated_gpus=3.0, created_time=0.0,
        start_time=0.0, end_time=TIMES[-1] if failed else None, nodes=["node-a"],
        pods=[
            PodFigures(name=name, uid=f"uid-{name}", node="node-a", phase="Running", allocated_gpus=1.0,
                       labels={"gpuwm.io/project": "alpha", **labels})
            for name, labels in PT_PODS.items()
        ],
        gpus=[
            GpuFigures(node="node-a", uuid=f"gpu-{index}", units=1.0, utilization_percent=10.0 * (index + 1),
                       pod=name, pod_uid=f"uid-{name}", namespace="team-a", workload="pt", workload_uid="uid-pt")
            for index, name in enumerate(names)
        ],
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    opened = EmbeddedStore(tmp_path / "ranks.db", tiers=["15s:1d"])
    for t in TIMES:
        job = pt_figures()
        samples = [sample(t, f"gpu-{index}", sm=10.0 * (index + 1)) for index in range(3)]
        opened.record(t, samples, [job], [project("alpha", [job])], cluster(3))
    yield opened
    opened.close()


@pytest.fixture
async def client(store: EmbeddedStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


async def test_ranks_come_from_the_pods_labels_not_their_names(client: httpx.AsyncClient) -> None:
    url = "/api/v1/workloads/uid-pt/metrics?metric=gpu_utilization_percent&start=150&end=285"
    body = (await client.get(url + "&by=rank")).json()
    assert [(p["name"], p["rank"], p["role"]) for p in body["workload"]["pods"]] == [
        ("pt-worker-2", 0, "master"), ("pt-worker-1", 1, "worker"), ("pt-worker-0", 2, "worker")
    ]
    assert [(s["labels"]["pod"], s["labels"]["rank"]) for s in body["series"]] == [
        ("pt-worker-2", "0"), ("pt-worker-1", "1"), ("pt-worker-0", "2")
    ]
    # each series is its own pod's (worker-2 holds gpu-2 at 30 %)
    assert [{v for _, v in s["points"]} for s in body["series"]] == [{30.0}, {20.0}, {10.0}]
    by_pod = (await client.get(url + "&by=pod")).json()
    assert {s["labels"]["pod"]: s["labels"]["rank"] for s in by_pod["series"]} == {
        "pt-worker-2": "0", "pt-worker-1": "1", "pt-worker-0": "2"
    }
    (leader,) = (await client.get(url + "&leader=true")).json()["series"]
    assert leader["labels"]["pod"] == "pt-worker-2" and {v for _, v in leader["points"]} == {30.0}
    by_name = (await client.get("/api/v1/namespaces/team-a/workloads/pt/metrics?metric=gpu_utilization_percent"
                                "&start=150&end=285&leader=true")).json()
    assert [s["labels"]["pod"] for s in by_name["series"]] == ["pt-worker-2"]


JOB_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
RAY = "ray.io/node-type"


@pytest.mark.parametrize(
    ("pods", "ranked"),
    [
        # an indexed Job whose pods' generated names sort the other way
        ({"sweep-9-aaaaa": {JOB_INDEX: "0"}, "sweep-1-bbbbb": {JOB_INDEX: "2"}, "sweep-5-ccccc": {JOB_INDEX: "1"}},
         [("sweep-9-aaaaa", ""), ("sweep-5-ccccc", ""), ("sweep-1-bbbbb", "")]),
        # JobSet: replicated job, then job index, then the pod's completion index (10 after 2)
        ({"js-a": {JOBSET_JOB: "workers", JOBSET_INDEX: "10", JOB_INDEX: "0"},
          "js-b": {JOBSET_JOB: "workers", JOBSET_INDEX: "2", JOB_INDEX: "1"},
          "js-c": {JOBSET_JOB: "workers", JOBSET_INDEX: "2", JOB_INDEX: "0"}},
         [("js-c", ""), ("js-b", ""), ("js-a", "")]),
        # Ray: the head leads whatever it is called
        ({"ray-a-worker-x": {RAY: "worker"}, "ray-b-worker-y": {RAY: "head"}},
         [("ray-b-worker-y", "head"), ("ray-a-worker-x", "worker")]),
        # a pod without rank labels falls back to its name (worker-0 after a labelled master, before worker 1)
        ({"mx-worker-1": {KF_TYPE: "Worker", KF_INDEX: "1"}, "mx-boss": {KF_TYPE: "Chief", KF_INDEX: "0"},
          "mx-worker-0": None},
         [("mx-boss", "chief"), ("mx-worker-0", "worker"), ("mx-worker-1", "worker")]),
    ],
)
def test_rank_labels(pods: dict[str, dict[str, str] | None], ranked: list[tuple[str, str]]) -> None:
    found = rank_pods(next(iter(pods)).split("-")[0], list(pods), pods)
    assert [(rank.pod, rank.role) for rank in found] == ranked
    assert [rank.rank for rank in found] == list(range(len(pods)))


# -- the failure reason -------------------------------------------------------------------------------------


def failed_run(uid: str, job_message: str | None, pod_reason: str | None) -> WorkloadFigures:
    """A failed one-pod Job `name=uid` that ended at 100; its pod failed with `pod_reason`."""
    return WorkloadFigures(
        uid=uid, namespace="team-a", name=uid, kind="Job", api_version="batch/v1", project="alpha",
        phase="Failed", created_time=0.0, start_time=0.0, end_time=100.0, failure_reason=job_message,
        pods=[
            PodFigures(name=f"{uid}-0-abcde", uid=f"pod-{uid}", node="node-a", phase="Succeeded"),
            PodFigures(name=f"{uid}-1-abcde", uid=f"pod2-{uid}", node="node-a", phase="Failed",
                       failure_reason=pod_reason),
        ],
    )


async def test_the_failure_reason_of_a_run(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "failed.db", tiers=["15s:1d"])
    runs = [
        failed_run("both", "BackoffLimitExceeded: Job has reached the specified backoff limit",
                   "container main: OOMKilled, exit code 137"),
        failed_run("pod-only", None, "container main: Error, exit code 1, CUDA error: out of memory"),
        failed_run("neither", None, None),
    ]
    store.record(100.0, [sample(100.0, "gpu-0")], runs, [project("alpha", runs)], cluster(1))
    app = create_app(store, Settings(auth="none"))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
            expected = {
                "both": "BackoffLimitExceeded: Job has reached the specified backoff limit",
                "pod-only": "container main: Error, exit code 1, CUDA error: out of memory",
                "neither": None,
            }
            for uid, reason in expected.items():
                run = (await http.get(f"/api/v1/workloads/{uid}")).json()
                assert run["failureReason"] == reason, uid
                by_name = (await http.get(f"/api/v1/namespaces/team-a/workloads/{uid}")).json()
                assert by_name["failureReason"] == reason, uid
                answer = (await http.get(f"/api/v1/workloads/{uid}/metrics?metric=gpu_allocated")).json()
                assert (answer["workload"]["phase"], answer["workload"]["failureReason"]) == ("Failed", reason)
            # the pod's own reason stays on the pod
            run = (await http.get("/api/v1/workloads/both")).json()
            assert [pod["failureReason"] for pod in run["pods"]] == [None, "container main: OOMKilled, exit code 137"]
    finally:
        store.close()


# -- Run:ai's CPU and memory requests and limits per workload ------------------------------------------------


async def test_runai_cpu_and_memory_requests_and_limits(tmp_path: Path) -> None:
    from gpuwm.model.podstats import PodResources

    def job(name: str, resources: list[PodResources | None]) -> WorkloadFigures:
        return WorkloadFigures(
            uid=f"uid-{name}", namespace="team-a", name=name, kind="Job", api_version="batch/v1", project="alpha",
            phase="Running", created_time=0.0, start_time=0.0,
            pods=[PodFigures(name=f"{name}-{index}", uid=f"pod-{name}-{index}", phase="Running", resources=each)
                  for index, each in enumerate(resources)],
        )

    both = PodResources(cpu_request_cores=2.0, cpu_limit_cores=4.0, memory_request_bytes=8e9, memory_limit_bytes=16e9)
    runs = [
        job("limited", [both, both.model_copy(update={"cpu_request_cores": 1.5})]),
        # one pod has no CPU limit: the workload is unlimited (no limit series), its requests still sum
        job("partly", [both, PodResources(cpu_request_cores=1.0, memory_limit_bytes=1e9)]),
        job("bare", [None]),
    ]
    store = EmbeddedStore(tmp_path / "runai.db", tiers=["15s:1d"])
    store.record(100.0, [sample(100.0, "gpu-0")], runs, [project("alpha", runs)], cluster(1))
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1"))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
            text = (await http.get("/metrics")).text
    finally:
        store.close()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("runai_") and "job_uuid" in line}

    def of(name: str, workload: str) -> float | None:
        return values.get(f'{name}{{clusterId="c-1",job_name="{workload}",job_uuid="uid-{workload}",namespace="team-a"}}')

    assert [of("runai_active_job_cpu_requested_cores", w) for w in ("limited", "partly", "bare")] == [3.5, 3.0, None]
    assert [of("runai_active_job_memory_requested_bytes", w) for w in ("limited", "partly", "bare")] == [
        16e9, 8e9, None
    ]
    assert [of("runai_cpu_limits_per_active_workload", w) for w in ("limited", "partly", "bare")] == [8.0, None, None]
    assert [of("runai_memory_limits_per_active_workload", w) for w in ("limited", "partly", "bare")] == [
        32e9, 17e9, None
    ]
