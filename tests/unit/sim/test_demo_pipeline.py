"""The demo's pipeline (simulator -> engine -> embedded store -> API) reports the simulator's ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.sim.demo import SimulatedController
from gpuwm.sim.fleet import node_names
from gpuwm.sim.simulator import SimConfig, Simulator, default_faults
from gpuwm.sim.table import render, short_duration, truth_line, visible_workloads, workload_row
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.sim.test_simulator import assert_energy

START = 1_800_000_000.0  # epoch seconds, like a live system
DURATION = 1800.0
INTERVAL = 2.0


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Simulator, SimulatedController, EmbeddedStore]:
    outages, losses = default_faults(node_names(4), START, DURATION)
    simulator = Simulator(SimConfig(seed=9, nodes=4, gpus_per_node=2, interval_seconds=INTERVAL, start_time=START,
                                    outages=outages, gpu_losses=losses))
    engine = Engine(EngineConfig(interval_seconds=INTERVAL))
    store = EmbeddedStore(Path(tmp_path_factory.mktemp("demo")) / "gpuwm.db")
    controller = SimulatedController(simulator, engine, store, status_interval_seconds=10.0)
    while simulator.clock < START + DURATION:
        controller.advance(START + DURATION, max_steps=500)
    return simulator, controller, store


async def get(store: EmbeddedStore, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
    app = create_app(store, Settings(auth="none", api_listen="127.0.0.1:0"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        return await http.get(path, params=params)


async def test_api_reports_the_ground_truth(pipeline: tuple[Simulator, SimulatedController, EmbeddedStore]) -> None:
    simulator, controller, store = pipeline
    assert controller.records == DURATION / 10.0
    listed: list[dict[str, Any]] = (await get(store, "/api/v1/workloads")).json()["workloads"]
    truth = simulator.truth()
    assert {item["uid"] for item in listed} == set(truth)
    unmonitored = 0.0
    for item in listed:
        expected = truth[item["uid"]]
        assert item["allocatedGpuSeconds"] == pytest.approx(expected.allocated_gpu_seconds, rel=1e-9, abs=1e-6)
        assert item["activeGpuSeconds"] == pytest.approx(expected.active_gpu_seconds, rel=1e-9, abs=1e-6)
        assert item["idleGpuSeconds"] == pytest.approx(expected.idle_gpu_seconds, rel=1e-9, abs=1e-6)
        assert item["unmonitoredGpuSeconds"] == pytest.approx(expected.unmonitored_gpu_seconds, rel=1e-9, abs=1e-6)
        assert_energy(item["energyJoules"], expected)
        assert item["requestedGpus"] == expected.requested_gpus
        assert item["queuedSeconds"] == pytest.approx(expected.queued_seconds, abs=1e-6)
        assert item["waitSeconds"] == pytest.approx(expected.wait_seconds, abs=1e-6)
        unmonitored += item["unmonitoredGpuSeconds"]
    assert unmonitored > 0  # the outage and the lost GPU show as unmonitored, never as idle
    projects = {item["name"]: item for item in (await get(store, "/api/v1/projects")).json()["projects"]}
    for name, project in projects.items():
        members = [item for item in listed if item["project"] == name]
        assert project["allocatedGpuSeconds"] == pytest.approx(sum(m["allocatedGpuSeconds"] for m in members))


async def test_series_cover_the_run(pipeline: tuple[Simulator, SimulatedController, EmbeddedStore]) -> None:
    _, controller, store = pipeline
    busiest = max(controller.workloads, key=lambda w: w.active_gpu_seconds)
    response = await get(
        store, f"/api/v1/namespaces/{busiest.namespace}/workloads/{busiest.name}/metrics",
        {"metric": ["gpu_utilization_percent", "cpu_usage_cores"], "step": "60s"},
    )
    assert response.status_code == 200, response.text
    series = {entry["metric"]: entry for entry in response.json()["series"]}
    utilization = [value for _, value in series["gpu_utilization_percent"]["points"] if value is not None]
    assert utilization and max(utilization) > 5
    cpu = [value for _, value in series["cpu_usage_cores"]["points"] if value is not None]
    assert cpu and min(cpu) > 0


def test_terminal_table(pipeline: tuple[Simulator, SimulatedController, EmbeddedStore]) -> None:
    simulator, controller, _ = pipeline
    shown, hidden = visible_workloads(controller.workloads, 3)
    holding = [w for w in controller.workloads if w.allocated_gpus > 0]
    assert len(shown) == min(3, len(holding) + len([w for w in controller.workloads if w.phase in ("Queued", "Pending")]))
    assert all(w.allocated_gpus > 0 for w in shown[: len(holding)])
    assert hidden >= 0
    row = workload_row(shown[0], simulator.clock)
    assert row[0] == shown[0].namespace and row[1] == shown[0].name
    assert row[7] == f"{shown[0].idle_gpu_seconds / 3600:.2f}"
    assert render("header", controller.workloads, controller.cluster, simulator.clock, 10) is not None
    # an 80-column terminal: names may shrink, but every figure is printed whole
    console = Console(width=80, record=True, color_system=None)
    console.print(render("header", controller.workloads, controller.cluster, simulator.clock, 10))
    text = console.export_text()
    lines = text.splitlines()
    assert lines[1].split() == ["NAMESPACE", "NAME", "PROJECT", "GPUS", "UTIL", "MEM", "IDLE", "WASTED-GPU-H", "AGE"]
    shown = visible_workloads(controller.workloads, 10)[0]
    assert shown
    for figures, line in zip(shown, lines[2:], strict=False):
        assert line.split()[-6:] == list(workload_row(figures, simulator.clock)[3:]), line
    assert [short_duration(s) for s in (5, 125, 3 * 3600 + 300, 2 * 86400 + 3600)] == ["5s", "2m", "3h5m", "2d1h"]


def test_the_ground_truth_line(pipeline: tuple[Simulator, SimulatedController, EmbeddedStore]) -> None:
    """The demo keeps the truth of its latest recorded interval (/demo/truth) and prints how the figures compare."""
    simulator, controller, _ = pipeline
    truth = controller.truth
    assert truth is not None and truth["at"] == simulator.clock  # the run ends on a recorded interval
    assert {item["name"] for item in truth["workloads"]} == {figures.name for figures in controller.workloads}
    line = truth_line(truth, controller.workloads)
    allocated = sum(item["allocatedGpuSeconds"] for item in truth["workloads"]) / 3600
    assert line.startswith(f"ground truth: {allocated:.2f} GPU-h allocated in {len(truth['workloads'])} workloads")
    assert line.endswith("; largest gap 0.000 GPU-s (/demo/truth)")
    skewed = {**truth, "workloads": [{**truth["workloads"][0],
                                      "idleGpuSeconds": truth["workloads"][0]["idleGpuSeconds"] + 12.5},
                                     *truth["workloads"][1:]]}
    assert "largest gap 12.500 GPU-s" in truth_line(skewed, controller.workloads)
    assert truth_line(None, controller.workloads) == "ground truth: not yet"
    console = Console(width=200, record=True, color_system=None)
    console.print(render("header", controller.workloads, controller.cluster, simulator.clock, 10, line))
    assert console.export_text().splitlines()[-1] == line


def test_the_demo_runs_a_dry_run_policy_and_prices_idle_gpus(
        pipeline: tuple[Simulator, SimulatedController, EmbeddedStore]) -> None:
    """Half an hour of the simulated fleet: the default policy (warn after 10 idle minutes) would have warned
    someone, and the idle GPUs' cost is the idle GPU-seconds of each workload at its GPU model's price."""
    from gpuwm.sim.policies import DEMO_PRICING

    _simulator, controller, _store = pipeline
    policies = controller.policies
    assert policies.would["warn"] > 0
    prices = {rule.model.rstrip("*"): rule.price_per_gpu_hour for rule in DEMO_PRICING.gpu_models}
    expected_idle = 0.0
    for figures in controller.workloads:
        rate = policies.meter.rates.get(figures.uid)
        if rate is None:
            continue
        assert rate in prices.values()
        expected_idle += figures.idle_gpu_seconds / 3600.0 * rate
    assert policies.idle_cost == pytest.approx(expected_idle, rel=1e-9) and policies.idle_cost > 0
    assert 0 < policies.idle_cost < policies.cost
    line = policies.summary()
    assert "demo-idle-gpus (dry run)" in line and "USD" in line and "warn" in line
