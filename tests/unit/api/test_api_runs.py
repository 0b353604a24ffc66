"""Runs through the HTTP API on a real embedded store with small tiers: a run older than the finest
tier comes back whole (no nulls where a stored point covers the cell), a step finer than stored is
answered at the stored step, runs of a reused name are reached by UID and listed page by page, and a
range query selects one pod (task)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import GpuFigures, PodFigures, ProjectFigures, WorkloadFigures
from gpuwm.model.podstats import PodResources
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import cluster, project, sample

#: 15 s points kept 2 minutes, 1-minute roll-ups kept a day
TIERS = ["15s:2m", "1m:1d"]
#: the first run of `train` lives 0 .. 345 and fails; the second (same name, new UID) 360 .. 900
FIRST_TIMES = [float(t) for t in range(0, 360, 15)]
SECOND_TIMES = [float(t) for t in range(360, 915, 15)]


#: each pod's spec: 2 cores requested, 4 the limit; 4 GB of memory requested, 8 GB the limit; 20 GB of ephemeral
#: storage the limit
SPEC = PodResources(cpu_request_cores=2.0, cpu_limit_cores=4.0, memory_request_bytes=4e9, memory_limit_bytes=8e9,
                    ephemeral_storage_limit_bytes=20e9)


def util_of(run: str, pod: int, t: float) -> float:
    """A distinct utilisation per run, pod and time (whole numbers: means stay exact)."""
    return float((int(t) // 15 * 7 + pod * 20 + (0 if run == "first" else 50)) % 100)


def run_figures(run: str, t: float, ended: float | None = None) -> WorkloadFigures:
    """Job `train` of two pods (worker-0 on gpu-0, worker-1 on gpu-1); `run` names the run (its UIDs)."""
    uid = f"uid-train-{run}"
    pods = [f"{run}-worker-{index}" for index in range(2)]
    return WorkloadFigures(
        uid=uid,
        namespace="team-a",
        name="train",
        kind="Job",
        api_version="batch/v1",
        project="alpha",
        phase="Failed" if ended is not None else "Running",
        allocated_gpus=2.0,
        created_time=FIRST_TIMES[0] if run == "first" else SECOND_TIMES[0],
        start_time=FIRST_TIMES[0] if run == "first" else SECOND_TIMES[0],
        end_time=ended,
        nodes=["node-a"],
        pods=[
            PodFigures(name=f"worker-{index}", uid=pods[index], node="node-a",
                       phase="Failed" if ended is not None else "Running", allocated_gpus=1.0, resources=SPEC)
            for index in range(2)
        ],
        gpus=[
            GpuFigures(node="node-a", uuid=f"gpu-{index}", units=1.0, utilization_percent=util_of(run, index, t),
                       pod=f"worker-{index}", pod_uid=pods[index], namespace="team-a", workload="train",
                       workload_uid=uid)
            for index in range(2)
        ],
    )


def samples(run: str, t: float) -> list[GpuSample]:
    return [sample(t, f"gpu-{index}", sm=util_of(run, index, t)) for index in range(2)]


def pod_stats(run: str, t: float) -> list[PodStatsSample]:
    """Each pod's CPU, memory, network and ephemeral storage (the kubelet's stats summary) and disk reads and
    writes (cAdvisor)."""
    return [
        PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"worker-{index}", pod_uid=f"{run}-worker-{index}",
                       cpu_usage_cores=1.5 + index, memory_used_bytes=2e9, network_rx_bytes_per_second=1e6,
                       network_tx_bytes_per_second=2e6, ephemeral_storage_used_bytes=5e9,
                       disk_read_bytes_per_second=3e6 + index * 1e6, disk_write_bytes_per_second=4e5)
        for index in range(2)
    ]


#: the first run's Failed condition (reason: message), as the controller reads it off the Job
FAILURE_REASON = "BackoffLimitExceeded: Job has reached the specified backoff limit"


def alpha(job: WorkloadFigures) -> ProjectFigures:
    """Project alpha, its namespace's GPU quota 8 (the gpuwm.io/gpu-quota annotation)."""
    return project("alpha", [job]).model_copy(update={"quota": 8.0})


def populate(path: Path) -> EmbeddedStore:
    store = EmbeddedStore(path, tiers=TIERS)
    # an ended run holds no GPU any more (its figures stay, kept with the run's UID, with the Job's reason)
    ended = run_figures("first", FIRST_TIMES[-1], ended=FIRST_TIMES[-1]).model_copy(
        update={"gpus": [], "allocated_gpus": 0.0, "failure_reason": FAILURE_REASON}
    )
    for t in FIRST_TIMES:
        job = run_figures("first", t)
        store.record(t, samples("first", t), [job], [alpha(job)], cluster(2), pod_stats("first", t))
    for t in SECOND_TIMES:
        job = run_figures("second", t)
        store.record(
            t, samples("second", t), [ended, job], [alpha(job)], cluster(2), pod_stats("second", t)
        )
    store.compact(everything=True)
    return store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    opened = populate(tmp_path / "runs.db")
    yield opened
    opened.close()


@pytest.fixture
async def client(store: EmbeddedStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


def minute_mean(run: str, pod: int, minute: float) -> float:
    return sum(util_of(run, pod, minute + k) for k in (0, 15, 30, 45)) / 4


# -- 1. resolution that never hides data ------------------------------------------------------------------


async def test_whole_life_of_a_run_older_than_the_finest_tier_has_no_nulls(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/workloads/uid-train-first/metrics?metric=gpu_utilization_percent")
    assert response.status_code == 200, response.text
    body = response.json()
    # all of it is in the 1-minute tier: answered at its step, and the answer says so
    assert (body["start"], body["end"], body["step"], body["requestedStep"]) == (0.0, 345.0, 60.0, 15.0)
    assert body["resolution"] == [{"start": 0.0, "end": 360.0, "step": 60.0, "tier": "1m:1d"}]
    assert body["stepSeconds"] == 60.0
    (util,) = body["series"]
    assert [t for t, _ in util["points"]] == [0.0, 60.0, 120.0, 180.0, 240.0, 300.0]
    assert all(value is not None for _, value in util["points"])
    expected = [(minute_mean("first", 0, m) + minute_mean("first", 1, m)) / 2 for m in range(0, 360, 60)]
    assert [v for _, v in util["points"]] == pytest.approx(expected, abs=0.05)


async def test_a_range_across_the_tiers_fills_the_coarse_stretch_and_says_which_step_it_has(
    client: httpx.AsyncClient,
) -> None:
    body = (
        await client.get("/api/v1/cluster/metrics?metric=gpu_allocated&start=600&end=900&step=15s")
    ).json()
    assert body["step"] == 15.0 and body["requestedStep"] is None
    # the 15 s tier keeps 900 - 120 = 780 on; before that only the minutes
    assert body["resolution"] == [
        {"start": 600.0, "end": 780.0, "step": 60.0, "tier": "1m:1d"},
        {"start": 780.0, "end": 915.0, "step": 15.0, "tier": "15s:2m"},
    ]
    assert body["stepSeconds"] == 60.0  # the coarsest resolution of any of its values
    (allocated,) = body["series"]
    assert len(allocated["points"]) == 21
    assert [v for _, v in allocated["points"]] == [2.0] * 21  # every cell answered, none null


async def test_a_step_finer_than_stored_is_answered_at_the_stored_step(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_utilization_percent&start=780&end=900&step=5s"
    )
    body = response.json()
    assert (body["step"], body["requestedStep"]) == (15.0, 5.0)
    assert body["resolution"] == [{"start": 780.0, "end": 915.0, "step": 15.0, "tier": "15s:2m"}]
    (util,) = body["series"]
    assert [t for t, _ in util["points"]] == [float(t) for t in range(780, 915, 15)]
    assert [v for _, v in util["points"]] == [
        (util_of("second", 0, t) + util_of("second", 1, t)) / 2 for t in range(780, 915, 15)
    ]


# -- 2. runs by ID ------------------------------------------------------------------------------------------


async def test_a_reused_name_keeps_its_earlier_run_reachable_by_uid(client: httpx.AsyncClient) -> None:
    newest = (await client.get("/api/v1/namespaces/team-a/workloads/train")).json()
    assert newest["uid"] == "uid-train-second" and newest["phase"] == "Running"
    first = await client.get("/api/v1/workloads/uid-train-first")
    assert first.status_code == 200
    assert (first.json()["uid"], first.json()["phase"], first.json()["endTime"]) == ("uid-train-first", "Failed", 345.0)
    missing = await client.get("/api/v1/workloads/uid-nope")
    assert missing.status_code == 404 and "uid-nope" in missing.json()["message"]
    # the name path's metrics are the newest run's; the UID path's the earlier run's
    by_name = (await client.get("/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_allocated")).json()
    assert by_name["workload"]["uid"] == "uid-train-second" and by_name["start"] == 360.0
    by_uid = (await client.get("/api/v1/workloads/uid-train-first/metrics?metric=gpu_allocated")).json()
    assert by_uid["workload"]["uid"] == "uid-train-first"
    assert by_uid["workload"]["phase"] == "Failed" and by_uid["workload"]["endTime"] == 345.0
    assert [p["phase"] for p in by_uid["workload"]["pods"]] == ["Failed", "Failed"]
    assert [v for _, v in by_uid["series"][0]["points"]] == [2.0] * 6


async def test_the_list_names_every_run_with_ended_true_page_by_page(client: httpx.AsyncClient) -> None:
    plain = (await client.get("/api/v1/workloads")).json()
    assert [w["uid"] for w in plain["workloads"]] == ["uid-train-second"] and plain["continue"] is None
    every = (await client.get("/api/v1/workloads?ended=true")).json()
    assert [w["uid"] for w in every["workloads"]] == ["uid-train-first", "uid-train-second"]
    first_page = (await client.get("/api/v1/workloads?ended=true&limit=1")).json()
    assert [w["uid"] for w in first_page["workloads"]] == ["uid-train-first"]
    assert first_page["continue"]
    second_page = (
        await client.get("/api/v1/workloads", params={"ended": "true", "limit": "1", "continue": first_page["continue"]})
    ).json()
    assert [w["uid"] for w in second_page["workloads"]] == ["uid-train-second"] and second_page["continue"] is None
    running = (await client.get("/api/v1/workloads?ended=false")).json()
    assert [w["uid"] for w in running["workloads"]] == ["uid-train-second"]


@pytest.mark.parametrize(
    ("url", "parameter"),
    [
        ("/api/v1/workloads?ended=maybe", "ended"),
        ("/api/v1/workloads?ended=true&limit=0", "limit"),
        ("/api/v1/workloads?ended=true&limit=many", "limit"),
        ("/api/v1/workloads?ended=true&continue=not-a-token", "continue"),
        ("/api/v1/workloads/uid-train-first?pod=worker-0", "pod"),
        ("/api/v1/workloads/uid-train-first/metrics?pod=worker-9", "pod"),
        ("/api/v1/workloads/uid-train-first/metrics?pod=worker-0&by=node", "by"),
        ("/api/v1/cluster/metrics?pod=worker-0", "pod"),
    ],
)
async def test_bad_run_parameters_get_400_naming_them(client: httpx.AsyncClient, url: str, parameter: str) -> None:
    response = await client.get(url)
    assert response.status_code == 400, response.text
    assert response.json()["parameter"] == parameter


# -- 5. one pod or task -------------------------------------------------------------------------------------


async def test_pod_selects_one_task_of_the_run(client: httpx.AsyncClient) -> None:
    body = (
        await client.get(
            "/api/v1/namespaces/team-a/workloads/train/metrics?metric=gpu_utilization_percent&pod=worker-1"
            "&start=780&end=900"
        )
    ).json()
    (util,) = body["series"]
    assert util["labels"]["pod"] == "worker-1" and util["labels"]["workload_uid"] == "uid-train-second"
    assert [v for _, v in util["points"]] == [util_of("second", 1, t) for t in range(780, 915, 15)]
    both = (
        await client.get(
            "/api/v1/workloads/uid-train-first/metrics?metric=gpu_utilization_percent&pod=worker-1&pod=worker-0"
        )
    ).json()
    assert [s["labels"]["pod"] for s in both["series"]] == ["worker-1", "worker-0"]
    assert [v for _, v in both["series"][1]["points"]] == pytest.approx(
        [minute_mean("first", 0, m) for m in range(0, 360, 60)], abs=0.05
    )
    gpus = (
        await client.get("/api/v1/workloads/uid-train-first/metrics?metric=gpu_utilization_percent&pod=worker-0&by=gpu")
    ).json()
    assert [(s["labels"]["pod"], s["labels"]["uuid"]) for s in gpus["series"]] == [("worker-0", "gpu-0")]


# -- 6. Run:ai's per-GPU, per-node and per-pod names ------------------------------------------------------


async def test_runai_names_per_gpu_node_and_pod(store: EmbeddedStore) -> None:
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        text = (await http.get("/metrics")).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("runai_")}
    last = SECOND_TIMES[-1]
    u0, u1 = util_of("second", 0, last), util_of("second", 1, last)
    assert values['runai_requested_gpus_per_workload{clusterId="c-1",namespace="team-a",project="alpha",'
                  'workload_id="uid-train-second",workload_name="train",workload_type="training"}'] == 2.0
    # the ended first run holds nothing: only the second's devices and pods
    assert values['runai_allocated_gpu_count_per_node{clusterId="c-1",node="node-a"}'] == 2.0
    assert values['runai_gpu_utilization_per_node{clusterId="c-1",node="node-a"}'] == (u0 + u1) / 2
    assert values['runai_allocated_gpu_count_per_gpu{clusterId="c-1",gpu="gpu-1",node="node-a",uuid="gpu-1"}'] == 1.0
    assert values['runai_gpu_utilization_per_pod_per_gpu{clusterId="c-1",gpu="gpu-1",node="node-a",'
                  'pod_name="worker-1",pod_namespace="team-a",pod_uuid="second-worker-1"}'] == u1
    assert values['runai_allocated_gpu_count_per_pod{clusterId="c-1",node="node-a",pod_name="worker-0",'
                  'pod_namespace="team-a",pod_uuid="second-worker-0"}'] == 1.0
    assert not [key for key in values if "first-worker" in key]


async def test_runai_cpu_and_memory_allocated_per_pod_and_the_project_quota(store: EmbeddedStore) -> None:
    """runai_allocated_millicpus_per_pod and runai_allocated_memory_per_pod: the running pods' requests;
    runai_project_guaranteed_gpus: the project's quota."""
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        text = (await http.get("/metrics")).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(("runai_allocated_m", "runai_project_"))}
    pod = 'clusterId="c-1",node="node-a",pod_name="worker-{0}",pod_namespace="team-a",pod_uuid="second-worker-{0}"'
    assert values == {
        **{f"runai_allocated_millicpus_per_pod{{{pod.format(k)}}}": 2000.0 for k in range(2)},
        **{f"runai_allocated_memory_per_pod{{{pod.format(k)}}}": 4e9 for k in range(2)},
        'runai_project_guaranteed_gpus{clusterId="c-1",project="alpha"}': 8.0,
    }  # the ended first run's pods hold nothing


# -- 4. ranks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "pods", "ranked"),
    [
        # Kubeflow PyTorchJob: the master leads, workers by index (10 after 2, not after 1)
        ("bert", ["bert-worker-10", "bert-worker-2", "bert-master-0", "bert-worker-0"],
         [("bert-master-0", "master"), ("bert-worker-0", "worker"), ("bert-worker-2", "worker"),
          ("bert-worker-10", "worker")]),
        # an indexed Job: its completion index, the random suffix ignored
        ("sweep", ["sweep-2-x7k2p", "sweep-0-ab3cd", "sweep-1-zz9qq"],
         [("sweep-0-ab3cd", ""), ("sweep-1-zz9qq", ""), ("sweep-2-x7k2p", "")]),
        # JobSet: job index, then pod index
        ("js", ["js-workers-1-0-aaaaa", "js-workers-0-1-bbbbb", "js-workers-0-0-ccccc"],
         [("js-workers-0-0-ccccc", ""), ("js-workers-0-1-bbbbb", ""), ("js-workers-1-0-aaaaa", "")]),
        # Ray: the head leads
        ("ray", ["ray-gpu-group-worker-q8v2m", "ray-head-7xk9s"],
         [("ray-head-7xk9s", "head"), ("ray-gpu-group-worker-q8v2m", "worker")]),
        # MPI: the launcher leads; ps after the workers
        ("mpi", ["mpi-ps-0", "mpi-worker-0", "mpi-launcher-abcde"],
         [("mpi-launcher-abcde", "launcher"), ("mpi-worker-0", "worker"), ("mpi-ps-0", "ps")]),
    ],
)
def test_rank_pods(workload: str, pods: list[str], ranked: list[tuple[str, str]]) -> None:
    from gpuwm.api.ranks import rank_pods

    assert [(rank.pod, rank.role) for rank in rank_pods(workload, pods)] == ranked
    assert [rank.rank for rank in rank_pods(workload, pods)] == list(range(len(pods)))


async def test_by_rank_and_the_leader(client: httpx.AsyncClient) -> None:
    url = "/api/v1/workloads/uid-train-second/metrics?metric=gpu_utilization_percent&start=780&end=900"
    body = (await client.get(url + "&by=rank")).json()
    assert [(p["name"], p["rank"], p["role"]) for p in body["workload"]["pods"]] == [
        ("worker-0", 0, "worker"), ("worker-1", 1, "worker")
    ]
    assert [(s["labels"]["pod"], s["labels"]["rank"]) for s in body["series"]] == [("worker-0", "0"), ("worker-1", "1")]
    by_pod = (await client.get(url + "&by=pod")).json()
    assert {s["labels"]["pod"]: s["labels"]["rank"] for s in by_pod["series"]} == {"worker-0": "0", "worker-1": "1"}
    leader = (await client.get(url + "&leader=true")).json()
    (util,) = leader["series"]
    assert util["labels"]["pod"] == "worker-0"
    assert [v for _, v in util["points"]] == [util_of("second", 0, t) for t in range(780, 915, 15)]
    both = await client.get(url + "&leader=true&pod=worker-1")
    assert both.status_code == 400 and both.json()["parameter"] == "leader"
    on_project = await client.get("/api/v1/projects/alpha/metrics?by=rank")
    assert on_project.status_code == 400 and on_project.json()["parameter"] == "by"
