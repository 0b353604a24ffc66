"""Workloads seen through their own objects on the API's surfaces: the queue view, the workload
list's new fields and the Prometheus series, from an engine fed WorkloadEvents into a real embedded store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.api.auth import AllowAll, User
from gpuwm.config import Settings
from gpuwm.model import NamespaceEvent, PodEvent, WorkloadEvent
from gpuwm.store.embedded import EmbeddedStore

NOW = 1000.0


def job(t: float, name: str, namespace: str, *, created: float, suspended: bool, requested: float,
        **fields: Any) -> WorkloadEvent:
    return WorkloadEvent.model_validate({
        "t": t, "event": "workload", "namespace": namespace, "name": name, "uid": f"uid-{name}", "kind": "Job",
        "apiVersion": "batch/v1", "created": created, "suspended": suspended, "requested_gpus": requested,
        "local_queue": f"{namespace}-q", "cluster_queue": "gpus", **fields,
    })


def running_pod(t: float, name: str, namespace: str, created: float, phase: str = "Running") -> PodEvent:
    return PodEvent.model_validate({
        "t": t, "event": "pod", "namespace": namespace, "name": f"{name}-0", "uid": f"pod-{name}",
        "phase": phase, "node": "n1",
        "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"uid-{name}", "created": created},
        "devices": [{"uuid": f"GPU-{name}", "units": 1.0}] if phase == "Running" else [],
    })


def figures_store(path: Path) -> EmbeddedStore:
    """At NOW: in team-a, `backlog` Queued since 100 (4 GPUs), `admitted` Pending since its admission at 700
    (2 GPUs, created 400), `train` Running; in team-b (project beta), `preempted`: ran 200..600, Queued since
    (1 GPU); `done` finished."""
    engine = Engine(EngineConfig(interval_seconds=10.0, late_event_window_seconds=0.0))
    for namespace, project in (("team-a", "alpha"), ("team-b", "beta")):
        engine.observe(NamespaceEvent.model_validate({
            "t": 0.0, "event": "namespace", "name": namespace, "labels": {"gpuwm.io/project": project}}))
    events: list[WorkloadEvent | PodEvent] = [
        job(100, "backlog", "team-a", created=100, suspended=True, requested=4),
        job(200, "preempted", "team-b", created=150, suspended=False, requested=1),
        running_pod(200, "preempted", "team-b", 150),
        job(300, "train", "team-a", created=300, suspended=False, requested=1),
        running_pod(300, "train", "team-a", 300),
        job(400, "admitted", "team-a", created=400, suspended=True, requested=2),
        job(500, "done", "team-b", created=500, suspended=False, requested=1),
        running_pod(500, "done", "team-b", 500),
        job(600, "preempted", "team-b", created=150, suspended=True, requested=1),
        running_pod(600, "preempted", "team-b", 150, "Deleted"),
        running_pod(650, "done", "team-b", 500, "Succeeded"),
        job(651, "done", "team-b", created=500, suspended=False, requested=1, finished="Succeeded"),
        job(700, "admitted", "team-a", created=400, suspended=False, requested=2),
    ]
    for event in sorted(events, key=lambda e: e.t):
        engine.observe(event)
    workloads, projects, cluster = engine.report(NOW)
    store = EmbeddedStore(path)
    store.record(NOW, [], workloads, projects, cluster)
    return store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    opened = figures_store(tmp_path / "gpuwm.db")
    yield opened
    opened.close()


@pytest.fixture
async def client(store: EmbeddedStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http


async def test_the_queue_lists_queued_and_pending_workloads_longest_wait_first(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/queue")).json()
    rows = [(w["name"], w["phase"], w["waitSeconds"], w["queuedSeconds"], w["requestedGpus"]) for w in body["workloads"]]
    assert rows == [
        ("backlog", "Queued", 900.0, 900.0, 4.0),  # created 100, held back since: 1000 - 100
        ("admitted", "Pending", 600.0, 300.0, 2.0),  # created 400, admitted 700, no GPU container yet
        ("preempted", "Queued", 450.0, 400.0, 1.0),  # 150 -> 200, then from its run's end at 600: 50 + 400
    ]
    assert (body["queued"], body["pending"], body["requestedGpus"], body["longestWaitSeconds"]) == (2, 1, 7.0, 900.0)
    backlog = body["workloads"][0]
    assert (backlog["localQueue"], backlog["clusterQueue"], backlog["project"]) == ("team-a-q", "gpus", "alpha")


@pytest.mark.parametrize(
    ("query", "names"),
    [("namespace=team-b", ["preempted"]), ("project=alpha", ["backlog", "admitted"]),
     ("namespace=team-a&project=beta", []), ("namespace=nowhere", [])],
)
async def test_the_queue_filters(client: httpx.AsyncClient, query: str, names: list[str]) -> None:
    body = (await client.get(f"/api/v1/queue?{query}")).json()
    assert [w["name"] for w in body["workloads"]] == names
    assert body["queued"] + body["pending"] == len(names)


async def test_the_queue_refuses_an_unknown_parameter(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/queue?phase=Queued")
    assert response.status_code == 400 and response.json()["parameter"] == "phase"


class TeamAOnly(AllowAll):
    """A caller who may read team-a alone."""

    async def allowed(self, user: User, namespace: str | None) -> bool:
        return namespace == "team-a"


async def test_the_queue_shows_only_the_namespaces_the_caller_may_read(store: EmbeddedStore) -> None:
    app = create_app(store, Settings(auth="none"), authorizer=TeamAOnly())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        assert [w["name"] for w in (await http.get("/api/v1/queue")).json()["workloads"]] == ["backlog", "admitted"]
        denied = await http.get("/api/v1/queue?namespace=team-b")
        assert denied.status_code == 403 and "team-b" in denied.json()["message"]
        listed = (await http.get("/api/v1/workloads")).json()["workloads"]
        assert {w["namespace"] for w in listed} == {"team-a"}  # as the workload list


async def test_workload_list_and_detail_carry_the_object_figures(client: httpx.AsyncClient) -> None:
    listed = {w["name"]: w for w in (await client.get("/api/v1/workloads")).json()["workloads"]}
    assert {name: w["phase"] for name, w in listed.items()} == {
        "backlog": "Queued", "admitted": "Pending", "preempted": "Queued", "train": "Running", "done": "Succeeded"}
    assert listed["train"]["requestedGpus"] == 1.0 and listed["train"]["queuedSeconds"] == 0.0
    assert listed["train"]["waitSeconds"] == 0.0
    detail = (await client.get("/api/v1/namespaces/team-b/workloads/preempted")).json()
    assert (detail["queuedSeconds"], detail["waitSeconds"], detail["localQueue"]) == (400.0, 450.0, "team-b-q")
    projects = {p["name"]: p for p in (await client.get("/api/v1/projects")).json()["projects"]}
    assert (projects["alpha"]["requestedGpus"], projects["alpha"]["queuedWorkloads"]) == (6.0, 1)
    assert projects["alpha"]["longestQueuedSeconds"] == 900.0
    assert (projects["beta"]["requestedGpus"], projects["beta"]["longestQueuedSeconds"]) == (1.0, 400.0)


async def test_prometheus_series_of_queued_workloads_and_projects(client: httpx.AsyncClient) -> None:
    text = (await client.get("/metrics")).text
    labels = 'kind="Job",namespace="team-a",project="alpha",workload="backlog",workload_uid="uid-backlog"'
    assert f"gpuwm_workload_queued_seconds{{{labels}}} 900.0" in text
    assert f"gpuwm_workload_requested_gpus{{{labels}}} 4.0" in text
    assert f"gpuwm_workload_wait_seconds{{{labels}}} 900.0" in text
    assert ('gpuwm_workload_info{kind="Job",namespace="team-a",phase="Queued",project="alpha",workload="backlog",'
            'workload_uid="uid-backlog"} 1.0') in text
    preempted = 'kind="Job",namespace="team-b",project="beta",workload="preempted",workload_uid="uid-preempted"'
    assert f"gpuwm_workload_queued_seconds{{{preempted}}} 400.0" in text
    assert 'gpuwm_project_requested_gpus{project="alpha"} 6.0' in text
    assert 'gpuwm_project_queued_workloads{project="alpha"} 1.0' in text
    assert 'gpuwm_project_longest_queued_seconds{project="alpha"} 900.0' in text
    assert 'gpuwm_project_queued_workloads{project="beta"} 1.0' in text
    assert 'gpuwm_project_longest_queued_seconds{project="beta"} 400.0' in text
