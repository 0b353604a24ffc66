"""Fleet views and period reports on a simulated fleet: the report against the engine's own figures
for the same period, the GPUs' states against the engine's, and `gpuwm report` against a served API."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.api.fleet import UNNAMED_DEVICE_PREFIX, build_fleet, build_nodes, holder_state
from gpuwm.api.server import ApiServer
from gpuwm.cli import main
from gpuwm.config import ConfigError, Settings
from gpuwm.controller.watch.pods import UNNAMED_DEVICE_PREFIX as CONTROLLER_PREFIX
from gpuwm.model.figures import GpuFigures, WorkloadFigures
from gpuwm.sim.demo import SimulatedController
from gpuwm.sim.fleet import node_names
from gpuwm.sim.simulator import SimConfig, Simulator, default_faults
from gpuwm.store.embedded import EmbeddedStore

START = 1_800_000_000.0
STATUS_INTERVAL = 15.0


@dataclass
class Run:
    store: EmbeddedStore
    engine: Engine
    first: float  # the period's start: a recorded status interval
    last: float
    before: dict[str, WorkloadFigures]  # the engine's figures at `first`
    after: dict[str, WorkloadFigures]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """3 nodes (whole, MIG and time-sliced GPUs) for 40 simulated minutes with an agent outage and a lost GPU."""
    outages, losses = default_faults(node_names(3), START, 1800)
    simulator = Simulator(SimConfig(seed=3, nodes=3, gpus_per_node=2, interval_seconds=1.0, start_time=START,
                                    idle_threshold_percent=1.0, outages=outages, gpu_losses=losses))
    engine = Engine(EngineConfig(interval_seconds=1.0, idle_threshold_percent=1.0))
    store = EmbeddedStore(tmp_path_factory.mktemp("fleet") / "gpuwm.db")
    controller = SimulatedController(simulator, engine, store, STATUS_INTERVAL)
    controller.advance(START + 600, 10**9)
    first, before = controller.next_record - STATUS_INTERVAL, {w.uid: w for w in controller.workloads}
    controller.advance(START + 2400, 10**9)
    last, after = controller.next_record - STATUS_INTERVAL, {w.uid: w for w in controller.workloads}
    yield Run(store, engine, first, last, before, after)
    store.close()


@pytest.fixture(scope="module")
def client(run: Run) -> TestClient:
    return TestClient(create_app(run.store, Settings(auth="none", status_interval=STATUS_INTERVAL)))


def test_report_per_workload_is_the_engines_figures_over_the_period(run: Run, client: TestClient) -> None:
    # the intervals recorded after `first` up to the latest: the engine's figures then minus its figures at `first`
    answer = client.get("/api/v1/report", params={"start": run.first + STATUS_INTERVAL, "end": run.last, "by": "workload"})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["stepSeconds"] == STATUS_INTERVAL and report["by"] == "workload" and report["exact"] is True
    held = {uid: w for uid, w in run.after.items()
            if w.allocated_gpu_seconds - (run.before[uid].allocated_gpu_seconds if uid in run.before else 0) > 0}
    assert len(report["rows"]) == len(held) >= 5
    for row in report["rows"]:
        now = held[row["workloadUid"]]
        then = run.before.get(now.uid)
        assert (row["namespace"], row["workload"], row["kind"]) == (now.namespace, now.name, now.kind)

        def delta(field: str, now: WorkloadFigures = now, then: WorkloadFigures | None = then) -> float:
            return float(getattr(now, field) - (getattr(then, field) if then is not None else 0.0))

        for column, field in (("allocated", "allocated_gpu_seconds"), ("active", "active_gpu_seconds"),
                              ("idle", "idle_gpu_seconds"), ("unmonitored", "unmonitored_gpu_seconds")):
            assert row[f"{column}GpuHours"] * 3600 == pytest.approx(delta(field), abs=1e-3), (row["workload"], column)
        assert row["energyJoules"] == pytest.approx(delta("energy_joules"), abs=1e-3)
        assert row["wastedGpuHours"] == row["idleGpuHours"] and row["exact"] is True
    engine_total = sum(now.allocated_gpu_seconds - (run.before[uid].allocated_gpu_seconds if uid in run.before else 0)
                       for uid, now in held.items())
    assert report["total"]["allocatedGpuHours"] * 3600 == pytest.approx(engine_total, abs=1e-2)


def test_report_per_project_sums_its_workloads_and_csv_says_the_same(run: Run, client: TestClient) -> None:
    period = {"start": run.first, "end": run.last}
    per_workload = client.get("/api/v1/report", params={**period, "by": "workload"}).json()
    per_project = client.get("/api/v1/report", params=period).json()
    assert per_project["by"] == "project"
    for row in per_project["rows"]:
        mine = [r for r in per_workload["rows"] if r["project"] == row["project"]]
        assert row["workloads"] == len(mine)
        assert row["allocatedGpuHours"] == pytest.approx(sum(r["allocatedGpuHours"] for r in mine))
        assert row["energyJoules"] == pytest.approx(sum(r["energyJoules"] for r in mine))
        assert row["peakAllocatedGpus"] <= sum(r["peakAllocatedGpus"] for r in mine) + 1e-6
    text = client.get("/api/v1/report", params={**period, "format": "csv"})
    assert text.headers["content-type"].startswith("text/csv")
    assert "attachment" in text.headers["content-disposition"]
    lines = list(csv.DictReader(io.StringIO(text.text)))
    assert [line["project"] for line in lines] == [r["project"] for r in per_project["rows"]] + ["total"]
    assert float(lines[-1]["allocatedGpuHours"]) == pytest.approx(per_project["total"]["allocatedGpuHours"], abs=1e-6)


@pytest.mark.parametrize(("parameters", "named"), [
    ({"by": "team"}, "by"), ({"format": "xlsx"}, "format"), ({"start": "2030-01-02T00:00:00Z",
                                                              "end": "2030-01-01T00:00:00Z"}, "end"),
    ({"start": "yesterday"}, "start"), ({"step": "1m"}, "step"),
])
def test_report_refuses_bad_parameters_by_name(client: TestClient, parameters: dict[str, str], named: str) -> None:
    answer = client.get("/api/v1/report", params=parameters)
    assert answer.status_code == 400 and answer.json()["parameter"] == named, answer.text


def test_a_period_from_before_the_first_data_is_the_one_from_it(run: Run, client: TestClient) -> None:
    earliest = run.store.earliest_time()
    assert earliest is not None
    reports = [client.get("/api/v1/report", params={"start": start, "by": "workload"}).json()
               for start in (0, earliest - 3600, earliest)]
    assert reports[0]["rows"] == reports[1]["rows"] == reports[2]["rows"]
    # a finished run's row over all time is its CR's figures
    for row in reports[0]["rows"]:
        figures = run.after[row["workloadUid"]]
        assert row["allocatedGpuHours"] * 3600 == pytest.approx(figures.allocated_gpu_seconds, abs=1e-3)


def test_gpus_have_the_engines_states(run: Run, client: TestClient) -> None:
    fleet = client.get("/api/v1/gpus").json()
    assert fleet["at"] == run.last
    by_uuid = {gpu["uuid"]: gpu for gpu in fleet["gpus"]}
    engine_gpus = run.engine.gpus(run.last)
    assert set(by_uuid) == {gpu.uuid for gpu in engine_gpus}
    for gpu in engine_gpus:
        view = by_uuid[gpu.uuid]
        assert view["node"] == gpu.node and view["model"] == gpu.model
        if gpu.workload is not None:
            assert gpu.workload in [holder["workload"] for holder in view["holders"]]
            assert view["state"] in {holder_state(g) for g in engine_gpus if g.uuid == gpu.uuid}
        elif not view["migParent"]:
            assert view["state"] == ("free" if gpu.monitored else "unmonitored")
    states = {gpu["state"] for gpu in fleet["gpus"]}
    assert {"active", "free", "unhealthy"} <= states  # the lost GPU is still held, and unhealthy
    assert any(gpu["migParent"] for gpu in fleet["gpus"]) and any(gpu["migProfile"] for gpu in fleet["gpus"])
    only_free = client.get("/api/v1/gpus", params={"state": "free"}).json()["gpus"]
    assert only_free and all(gpu["state"] == "free" for gpu in only_free)
    assert client.get("/api/v1/gpus", params={"state": "busy"}).json()["parameter"] == "state"


def test_nodes_count_capacity_without_mig_parents(run: Run, client: TestClient) -> None:
    nodes = client.get("/api/v1/nodes").json()["nodes"]
    assert [node["name"] for node in nodes] == node_names(3)
    gpus = client.get("/api/v1/gpus").json()["gpus"]
    for node in nodes:
        capacity = [g for g in gpus if g["node"] == node["name"] and not g["migParent"]]
        assert node["gpus"] == len(capacity) == sum(node["states"].values())
        assert node["allocatedUnits"] == pytest.approx(sum(g["allocatedUnits"] for g in capacity), abs=1e-5)
        assert node["allocatedUnits"] <= node["totalUnits"] + 1e-6 or any(g["deviceUnits"] == 0 for g in capacity)


def test_one_gpus_history_and_an_unknown_one(run: Run, client: TestClient) -> None:
    gpu = next(g for g in client.get("/api/v1/gpus").json()["gpus"] if g["state"] == "active")
    answer = client.get(f"/api/v1/gpus/{gpu['uuid']}/metrics", params={"metric": "gpu_utilization_percent"}).json()
    assert answer["scope"] == "gpu" and answer["node"] == gpu["node"]
    assert answer["series"] and all(s["labels"]["uuid"] == gpu["uuid"] for s in answer["series"])
    assert any(v is not None and v > 0 for s in answer["series"] for _t, v in s["points"])
    missing = client.get("/api/v1/gpus/GPU-nope/metrics")
    assert missing.status_code == 404 and "GPU-nope" in missing.json()["message"]


def test_a_gpus_history_goes_the_range_path_of_the_others(run: Run, client: TestClient) -> None:
    """A step finer than the store keeps is answered at the stored step, saying so, as for a node; the same
    limits refuse an answer too large, naming the step."""
    gpu = next(g for g in client.get("/api/v1/gpus").json()["gpus"] if g["state"] == "active")
    fine = {"metric": "gpu_utilization_percent", "step": "1ms"}
    answer = client.get(f"/api/v1/gpus/{gpu['uuid']}/metrics", params=fine).json()
    node = client.get(f"/api/v1/nodes/{gpu['node']}/metrics", params=fine).json()
    assert answer["requestedStep"] == 0.001 and answer["step"] == node["step"] > 0.001
    assert answer["resolution"] == node["resolution"] and answer["resolution"]
    huge = client.get(f"/api/v1/gpus/{gpu['uuid']}/metrics", params={"start": "0", "step": "1s"})
    assert huge.status_code == 400 and huge.json()["parameter"] == "step"


def _gpu(uuid: str, node: str = "n1", **fields: object) -> GpuFigures:
    return GpuFigures(node=node, uuid=uuid, **fields)


def test_stand_in_devices_are_not_gpus_of_the_fleet() -> None:
    assert UNNAMED_DEVICE_PREFIX == CONTROLLER_PREFIX
    holder = WorkloadFigures(
        uid="w1", namespace="ns", name="job", kind="Job", api_version="batch/v1", project="p", phase="Running",
        allocated_gpus=3.0,
        gpus=[_gpu("GPU-a", workload="job", units=1.0, monitored=True, active=False, memory_used_bytes=0.0),
              _gpu("GPU-b", workload="job", units=1.0, monitored=True, active=False, memory_used_bytes=5e9),
              _gpu(f"{UNNAMED_DEVICE_PREFIX}pod/c/0", workload="job", units=1.0)],
    )
    ended = holder.model_copy(update={"uid": "w2", "name": "old", "end_time": 1.0, "gpus": [_gpu("GPU-old", units=1.0)]})
    gpus, unnamed = build_fleet([holder, ended], [])
    assert [(g.uuid, g.state) for g in gpus] == [("GPU-a", "allocated-empty"), ("GPU-b", "idle-held")]
    assert unnamed == {"n1": 1.0}
    (node,) = build_nodes(gpus, unnamed)
    assert (node.gpus, node.allocated_units, node.unnamed_units) == (2, 2.0, 1.0)
    assert node.states == {"allocated-empty": 1, "idle-held": 1}


async def test_gpuwm_report_prints_the_apis_report(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    server = ApiServer(create_app(run.store, Settings(auth="none")), "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        period = ["--start", str(run.first), "--end", str(run.last)]
        assert await asyncio.to_thread(main, ["report", "--server", url, *period]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:3] == ["project", "alloc", "GPU-h"]
        assert table[-2].startswith("total")
        assert await asyncio.to_thread(main, ["report", "--server", url, "--format", "csv", "--by", "namespace",
                                              *period]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("project,namespace,workload") and lines[-1].startswith("total,")
        assert await asyncio.to_thread(main, ["report", "--server", url, "--end", "soon"]) == 2
        assert "HTTP 400" in capsys.readouterr().err
    finally:
        await server.stop()
    with pytest.raises(ConfigError, match="--server"):
        from gpuwm.api.report_command import report_url
        report_url("localhost:8080", None, None, "project", "json")


def test_report_help_says_defaults_and_choices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{project,namespace,workload}" in text and "(default project)" in text and "(default table)" in text


def test_a_gpu_nobody_holds_is_free_whatever_the_intervals_offset(tmp_path: Path) -> None:
    """Intervals recorded off the store's 15 s step (a controller started at any second) keep their point in the
    cell before the latest: a sampled device nobody holds is still free, on both views, and the node counts it."""
    from tests.unit.store.store_data import cluster, project, sample, workload

    store = EmbeddedStore(tmp_path / "s.db")
    try:
        for index in range(8):
            t = START + 7 + STATUS_INTERVAL * index
            job = workload("held", [("gpu-0", 1.0, 50.0)])
            job.gpus[0] = job.gpus[0].model_copy(update={"monitored": True, "active": True, "last_sample_time": t})
            store.record(t, [sample(t, "gpu-0"), sample(t, "gpu-1", sm=0.0), sample(t, "gpu-2", sm=0.0)], [job],
                         [project("alpha", [job])], cluster(3))
        client = TestClient(create_app(store, Settings(auth="none", status_interval=STATUS_INTERVAL)))
        states = {gpu["uuid"]: gpu["state"] for gpu in client.get("/api/v1/gpus").json()["gpus"]}
        assert states == {"gpu-0": "active", "gpu-1": "free", "gpu-2": "free"}
        (node,) = client.get("/api/v1/nodes").json()["nodes"]
        assert node["states"] == {"active": 1, "free": 2}
    finally:
        store.close()
