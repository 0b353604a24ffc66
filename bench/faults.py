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
  (the Kubernetes API server's 5xx/429 on status writes are tests/integration/test_controller.py's)
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
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _simcluster import SimulatedAgents, SimulatedController, lost_gpu_seconds
from gpuwm.accounting import Engine
from gpuwm.config import parse_duration_seconds
from gpuwm.controller import persistence
from gpuwm.controller.agents import AgentPuller
from gpuwm.sim.fleet import node_names
from gpuwm.sim.simulator import AgentOutage, GpuLoss, SimConfig

Hook = Callable[[SimulatedController, int], Awaitable[SimulatedController]]


def save_state(controller: SimulatedController, path: Path) -> None:
    """What the controller persists: the engine and its position in every agent's feed, in the controller's
    own state file (`gpuwm.controller.persistence`: sections of JSON lines and raw columns, written atomically)."""
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


async def run_scenario(name: str, config: SimConfig, duration: float, status_interval: float,
                       hook: Hook | None = None) -> dict[str, Any]:
    agents = SimulatedAgents(config)
    end = config.start_time + duration
    with tempfile.TemporaryDirectory(prefix="gpuwm-faults-") as directory:
        controller = SimulatedController(agents, config, Path(directory) / "gpuwm.db", status_interval)
        state_path = Path(directory) / "state.json"
        started = time.perf_counter()
        try:
            index = 0
            while controller.clock < end:
                await controller.cycle(end)
                if hook is not None:
                    controller = await hook(controller, index)
                save_state(controller, state_path)
                index += 1
            truth = agents.truth()
        finally:
            await controller.close()
            agents.close()
    reported = controller.engine.workloads(controller.clock)
    lost = lost_gpu_seconds(controller, truth)
    truth_idle = sum(w["idleGpuSeconds"] for w in truth["workloads"])
    gpus = config.nodes * config.gpus_per_node
    return {
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
    print(f"{arguments.nodes} nodes x {arguments.gpus_per_node} GPUs, {arguments.duration} simulated, samples every "
          f"{arguments.interval:g}s, status every {arguments.status_interval:g}s", flush=True)
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS), flush=True)
    for name, config, hook in scenarios:
        print_row(asyncio.run(run_scenario(name, config, duration, arguments.status_interval, hook)))


if __name__ == "__main__":
    main()
