"""Fault benchmark: what each failure costs, in GPU-seconds against the simulator's ground truth.

Same harness as bench/scale.py (agents of a simulated cluster on loopback in a child process;
the controller's real AgentPuller, engine, status builder and embedded store here). Scenarios:

- baseline: no faults
- agent gone: one node's agent stops for 5 minutes (no samples): must be unmonitored, never idle
- GPU lost: one GPU falls off the bus (healthy=false, no utilisation): likewise
- agent SIGKILL: a tenth of the agents restart (new agent id, sequence from 0) with the
  samples they had not served yet lost: at most one status interval becomes unmonitored
- agent 5xx/429 bursts: a third of the agents answer 503, then another third 429, for a few
  intervals; their samples wait in the agents' buffers and must arrive late, not be lost
- API server 5xx/429 bursts: the figures also go to GPUWorkloadMetrics through the controller's
  real status path (its offers, `StatusWriter`, `KubeClient`) against the Kubernetes API emulator,
  which answers 503, then 429 with Retry-After, to some writes; the row's figures are what the CRs
  say at the end (read back from the API), not the engine's
- controller restart: the controller is dropped mid-interval (after pulling, before saving)
  and a new one starts from the state file saved each interval (engine state and agent
  positions, written and read by the controller's own `persistence`), as after a SIGKILL; it
  must re-read what it had not saved

Prints, per scenario: allocated GPU-seconds (truth vs reported), lost = truth - reported,
lost_monitored = monitored (active + idle) time the pipeline turned into unmonitored,
idle and unmonitored (truth vs reported), late samples dropped. Target: lost <= one status
interval's GPU-seconds; unmonitored time never counted as idle.

    .venv/bin/python bench/faults.py [--nodes 50] [--duration 20m]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _simcluster import ROOT, SimulatedAgents, SimulatedController, lost_gpu_seconds
from gpuwm.accounting import Engine
from gpuwm.config import Settings, parse_duration_seconds
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.pull.agents import AgentPuller
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.state import persistence
from gpuwm.controller.status.writer import API_VERSION, WORKLOAD_PLURAL
from gpuwm.sim.fleet import node_names
from gpuwm.sim.simulator import AgentOutage, GpuLoss, SimConfig

Hook = Callable[[SimulatedController, int], Awaitable[SimulatedController]]
sys.path.insert(0, str(ROOT))  # the integration tests' Kubernetes API emulator (`StatusWrites`)


def save_state(controller: SimulatedController, path: Path) -> None:
    """What the controller persists: the engine and its position in every agent's feed, in the controller's
    own state file (`gpuwm.controller.state.persistence`: sections of JSON lines and raw columns, written atomically)."""
    persistence.save_state(path, {"engine": controller.engine.save(lazy=True, raw=True),
                                  "agents": controller.puller.positions(), "saved_at": controller.clock})


def restore_state(controller: SimulatedController, path: Path) -> None:
    """As a restarted `gpuwm controller` reads it (`recovery.restore`): loaded, then consumed entry by entry."""
    state = persistence.load_state(path)
    if state is None:
        raise RuntimeError(f"the controller's state file {path} could not be read back")
    controller.engine = Engine.restore(state["engine"], controller.engine.config, consume=True)
    controller.puller = AgentPuller(timeout_seconds=30.0, merge=controller.merge_request())
    controller.puller.restore_positions(state["agents"])


class StatusWrites:
    """The controller's status path to a Kubernetes API: `ControllerRuntime`'s offers, its `StatusWriter` and
    `KubeClient` (retries and backoff as in `gpuwm controller`), against the API emulator of the integration
    tests, in a thread. Faults are the emulator's: the next `count` writes answered `status`."""

    #: not what this measures: fast enough that the writer keeps up with the simulated clock
    WRITES_PER_SECOND = 2000.0

    def __init__(self, directory: Path, faults: Callable[[StatusWrites, int], None]) -> None:
        from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator

        self.emulator = KubernetesEmulator(ROOT / "crds")
        self.thread = EmulatorThread(self.emulator)
        self.url = self.thread.start()
        self.http = KubeHttp(self.url)
        self.clock = 0.0
        self.faults = faults
        settings = Settings(store=str(directory / "writes.db"), status_writes_per_second=self.WRITES_PER_SECOND)
        self.runtime = ControllerRuntime(settings, KubeClient(self.url), clock=lambda: self.clock)
        self.namespaces: set[str] = set()
        self._writer: asyncio.Task[None] | None = None

    def inject(self, status: int, count: int, retry_after: float | None = None) -> None:
        from tests.integration.kubeemu import Fault

        self.emulator.faults.append(Fault(status=status, count=count, methods=frozenset({"POST", "PATCH"}),
                                          path_contains="/apis/gpuwm.io/", retry_after=retry_after))

    async def cycle(self, controller: SimulatedController, index: int) -> None:
        """This cycle's faults, then its offers; the writer starts on them while the agents simulate the next."""
        self.faults(self, index)
        self.offer(controller)
        await asyncio.sleep(0)

    def offer(self, controller: SimulatedController) -> None:
        """What `ControllerRuntime.cycle` offers after its report, at the simulated clock."""
        if self._writer is None:
            self._writer = asyncio.create_task(self.runtime.writer.run())
        self.clock = now = controller.clock
        self.runtime.state.engine = controller.engine  # a restored engine, too
        workloads, projects, _ = controller.engine.report(now)
        for namespace in {figures.namespace for figures in workloads} - self.namespaces:
            self.http.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
            self.namespaces.add(namespace)
        runtime = self.runtime
        runtime.offers.offer_workloads(runtime.state, workloads, now, slack_seconds=runtime.reporting_slack_seconds)
        runtime.offers.offer_projects(runtime.state, projects, now)

    async def drain(self, controller: SimulatedController, timeout_seconds: float = 120.0) -> None:
        """Until every offer is written (or given up after the client's retries) and no write is in flight;
        then the offers once more, as the next interval would make them (a write given up at the last
        interval is tried again), and the same wait."""
        deadline = time.monotonic() + timeout_seconds
        for again in (True, False):
            while (self.runtime.writer.pending or self.runtime.writer.writing) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if again:
                self.offer(controller)
                await asyncio.sleep(0)

    def figures(self) -> dict[str, dict[str, Any]]:
        """Each GPUWorkloadMetrics' status, by its workload's namespace/name, as read from the API."""
        items = self.http.get(f"/apis/{API_VERSION}/{WORKLOAD_PLURAL}")["items"]
        return {f"{item['metadata']['namespace']}/{item['spec']['workloadRef']['name']}": item.get("status") or {}
                for item in items}

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self.runtime.client.close()
        self.thread.stop()


def lost_in_crs(statuses: dict[str, dict[str, Any]], truth: dict[str, Any]) -> dict[str, float]:
    """As `lost_gpu_seconds`, from what the CRs say (their figures are rounded to 0.001): per kind of
    GPU-seconds (allocated, active, idle, unmonitored) truth - reported, and `reported_KIND` the CRs' sum."""
    kinds = ("allocated", "active", "idle", "unmonitored")
    totals = dict.fromkeys((*kinds, *(f"reported_{kind}" for kind in kinds)), 0.0)
    for expected in truth["workloads"]:
        status = statuses.get(f"{expected['namespace']}/{expected['name']}", {})
        for kind in kinds:
            got = float(status.get(f"{kind}GpuSeconds") or 0.0)
            totals[kind] += expected[f"{kind}GpuSeconds"] - got
            totals[f"reported_{kind}"] += got
    return totals


async def run_scenario(name: str, config: SimConfig, duration: float, status_interval: float,
                       hook: Hook | None = None, api_faults: Callable[[StatusWrites, int], None] | None = None,
                       ) -> dict[str, Any]:
    """`api_faults`: the figures go to CRs through the controller's status path too (`StatusWrites`), with the
    faults it injects at each cycle; the row is then what the CRs say."""
    agents = SimulatedAgents(config)
    end = config.start_time + duration
    with tempfile.TemporaryDirectory(prefix="gpuwm-faults-") as directory:
        controller = SimulatedController(agents, config, Path(directory) / "gpuwm.db", status_interval)
        writes = StatusWrites(Path(directory), api_faults) if api_faults is not None else None
        state_path = Path(directory) / "state.json"
        started = time.perf_counter()
        try:
            index = 0
            while controller.clock < end:
                await controller.cycle(end)
                if hook is not None:
                    controller = await hook(controller, index)
                if writes is not None:
                    await writes.cycle(controller, index)
                save_state(controller, state_path)
                index += 1
            truth = agents.truth()
            statuses = None
            if writes is not None:
                await writes.drain(controller)
                statuses = writes.figures()
        finally:
            await controller.close()
            agents.close()
            if writes is not None:
                await writes.close()
    reported = controller.engine.workloads(controller.clock)
    lost = lost_gpu_seconds(controller, truth)
    truth_idle = sum(w["idleGpuSeconds"] for w in truth["workloads"])
    gpus = config.nodes * config.gpus_per_node
    row = {
        "scenario": name,
        "truth_allocated_gpu_s": lost["truth_allocated"],
        "reported_allocated_gpu_s": sum(w.allocated_gpu_seconds for w in reported),
        "lost_gpu_s": lost["allocated"],
        "lost_active_gpu_s": lost["active"],
        "lost_monitored_gpu_s": lost["active"] + lost["idle"],
        "truth_idle_gpu_s": truth_idle,
        "reported_idle_gpu_s": sum(w.idle_gpu_seconds for w in reported),
        "truth_unmonitored_gpu_s": lost["truth_unmonitored"],
        "reported_unmonitored_gpu_s": sum(w.unmonitored_gpu_seconds for w in reported),
        "late_samples_dropped": float(controller.engine.late_samples_dropped),
        "one_interval_gpu_s": gpus * status_interval,
        "wall_s": time.perf_counter() - started,
    }
    if writes is not None and statuses is not None:
        in_crs = lost_in_crs(statuses, truth)
        row.update({
            "reported_allocated_gpu_s": in_crs["reported_allocated"], "lost_gpu_s": in_crs["allocated"],
            "lost_active_gpu_s": in_crs["active"], "lost_monitored_gpu_s": in_crs["active"] + in_crs["idle"],
            "reported_idle_gpu_s": in_crs["reported_idle"], "reported_unmonitored_gpu_s": in_crs["reported_unmonitored"],
        })
        stats = writes.runtime.writer.stats
        print(f"  {name}: {stats.writes} status writes, {stats.failures} given up after the client's retries "
              f"(offered again the next interval), {writes.runtime.client.retries} retried requests; "
              f"{len(statuses)} GPUWorkloadMetrics read back", file=sys.stderr, flush=True)
    return row


def bursts(agents_nodes: list[str]) -> Hook:
    """503 from a third of the agents for 3 intervals, then 429 from another third for 2."""
    first, second = agents_nodes[0::3], agents_nodes[1::3]

    async def hook(controller: SimulatedController, index: int) -> SimulatedController:
        if index == 4:
            controller.agents.fail(dict.fromkeys(first, 503))
        elif index == 7:
            controller.agents.fail(dict.fromkeys(second, 429))
        elif index == 9:
            controller.agents.fail({})
        return controller

    return hook


def api_bursts(writes: StatusWrites, index: int) -> None:
    """The API server answers 503 to the next 10 status writes (creates and patches) at cycle 4, then 429
    with Retry-After: 0.5 to the next 10 at cycle 7: the client retries with backoff, a write that runs out
    of retries is offered again the next interval."""
    if index == 4:
        writes.inject(503, 10)
    elif index == 7:
        writes.inject(429, 10, retry_after=0.5)


def kill_agents_at(cycle: int, nodes: list[str]) -> Hook:
    """SIGKILL the agents on `nodes` just before the controller pulls them: the worst case, a whole
    status interval of their samples is lost."""

    async def hook(controller: SimulatedController, index: int) -> SimulatedController:
        if index == cycle:
            controller.agents.kill_agents(nodes)
        return controller

    return hook


def restart_at(cycle: int, state_path_of: Callable[[SimulatedController], Path]) -> Hook:
    async def hook(controller: SimulatedController, index: int) -> SimulatedController:
        if index != cycle:
            return controller
        # the pull of this interval happened, its state was not saved: a new controller starts from the file
        await controller.puller.close()
        restore_state(controller, state_path_of(controller))
        for event in controller.agents.relist():  # kopf lists every pod again on start
            controller.engine.observe(event)
        return controller

    return hook


COLUMNS = ("scenario", "truth_allocated_gpu_s", "reported_allocated_gpu_s", "lost_gpu_s", "lost_active_gpu_s",
           "lost_monitored_gpu_s",
           "truth_idle_gpu_s", "reported_idle_gpu_s", "truth_unmonitored_gpu_s", "reported_unmonitored_gpu_s",
           "late_samples_dropped", "one_interval_gpu_s")


def print_row(row: dict[str, Any]) -> None:
    cells = [row[name] if isinstance(row[name], str) else f"{row[name]:.1f}" for name in COLUMNS]
    print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--duration", default="20m")
    parser.add_argument("--interval", type=float, default=2.0, help="the agents' poll interval, seconds")
    parser.add_argument("--status-interval", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=3)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the puller warns once per failing agent; the table says it all
    duration = parse_duration_seconds(arguments.duration)
    start = float(int(time.time() - duration))
    names = node_names(arguments.nodes)
    base = SimConfig(seed=arguments.seed, nodes=arguments.nodes, gpus_per_node=arguments.gpus_per_node,
                     interval_seconds=arguments.interval, start_time=start)
    outage = AgentOutage(node=names[0], start=start + duration / 3, end=start + duration / 3 + 300.0)
    loss = GpuLoss(node=names[1 % len(names)], gpu_index=0, at=start + duration / 2)

    def state_file(controller: SimulatedController) -> Path:
        return controller.store_path.parent / "state.json"

    scenarios: list[tuple[str, SimConfig, Hook | None]] = [
        ("baseline", base, None),
        ("agent gone 5 min", base.model_copy(update={"outages": (outage,)}), None),
        ("GPU lost", base.model_copy(update={"gpu_losses": (loss,)}), None),
        ("agent SIGKILL (a tenth of the nodes)", base, kill_agents_at(5, names[::10])),
        ("agent 503/429 bursts", base, bursts(names)),
        ("controller restart mid-interval", base, restart_at(6, state_file)),
    ]
    with_api: list[tuple[str, SimConfig, Callable[[StatusWrites, int], None]]] = [
        ("API server 503/429 bursts (figures read from the CRs)", base, api_bursts),
    ]
    print(f"{arguments.nodes} nodes x {arguments.gpus_per_node} GPUs, {arguments.duration} simulated, samples every "
          f"{arguments.interval:g}s, status every {arguments.status_interval:g}s", flush=True)
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS), flush=True)
    for name, config, hook in scenarios:
        print_row(asyncio.run(run_scenario(name, config, duration, arguments.status_interval, hook)))
    for name, config, faults in with_api:
        print_row(asyncio.run(run_scenario(name, config, duration, arguments.status_interval, api_faults=faults)))


if __name__ == "__main__":
    main()
