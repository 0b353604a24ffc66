"""Scale benchmark: a simulated GPU cluster through the controller's pull -> engine -> status -> store path.

The agents of every simulated node serve `/v1/snapshot` over loopback from a child process
(see _simcluster.py); this process runs the controller's real `AgentPuller`, the accounting
engine, the status builder (writes go to an in-process recorder) and the embedded store.
Simulated time runs as fast as the machine allows. Prints, per cluster size: controller
CPU per status interval, RSS, status changes per second, lag from the end of an interval
to its figures being stored (p50/p99), store size on disk and its growth rate, and the
GPU-seconds the pipeline lost against the simulator's ground truth.

    .venv/bin/python bench/scale.py                       # 1,000 x 8 GPUs for 10 simulated minutes, then growth
    .venv/bin/python bench/scale.py --duration 1h --growth ''   # the simulated hour (about 25 min on 2 cores)
    .venv/bin/python bench/scale.py --nodes 0 --growth 100,1000,5000 --growth-duration 5m

Targets (the controller): <= 1.5 CPU-seconds per 15 s interval at 1,000 nodes, <= 320 MiB RSS,
lag p99 <= 2 intervals; store growth <= 1 GiB per 1,000 GPUs per 30 days at the default roll-ups.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
from pathlib import Path

from _interpreter import interpreter_description
from _simcluster import SimulatedAgents, SimulatedController, lost_gpu_seconds, rss_mib
from gpuwm.config import parse_duration_seconds
from gpuwm.sim.simulator import SimConfig

GIB = 1024.0**3


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


async def measure(nodes: int, gpus_per_node: int, duration: float, interval: float, status_interval: float,
                  seed: int) -> dict[str, float]:
    config = SimConfig(seed=seed, nodes=nodes, gpus_per_node=gpus_per_node, interval_seconds=interval,
                       start_time=float(int(time.time() - duration)))
    agents = SimulatedAgents(config)
    with tempfile.TemporaryDirectory(prefix="gpuwm-scale-") as directory:
        controller = SimulatedController(agents, config, Path(directory) / "gpuwm.db", status_interval)
        started = time.perf_counter()
        try:
            while controller.clock < config.start_time + duration:
                await controller.cycle(config.start_time + duration)
            # the controller's memory, before this bench's own checks (the truth report, the store read back)
            rss, peak_rss = rss_mib(), rss_mib("VmHWM")
            truth = agents.truth()
            store_bytes = controller.store_bytes()
        finally:
            await controller.close()
            agents.close()
        projection = controller.store_projection(duration)
        wall = time.perf_counter() - started
    cycles = controller.cycles
    cpu = [cycle.cpu_seconds for cycle in cycles]
    lag = [cycle.lag_seconds for cycle in cycles]
    lost = lost_gpu_seconds(controller, truth)
    gpus = nodes * gpus_per_node
    # steady-state size at the default roll-ups, per 1,000 GPUs (see store_projection)
    per_1000 = projection["steady_bytes"] / (gpus / 1000.0)
    return {
        "nodes": nodes, "gpus": gpus, "simulated_s": duration, "wall_s": wall, "cycles": len(cycles),
        "samples_per_cycle": statistics.mean(cycle.samples for cycle in cycles),
        "cpu_per_cycle_s": statistics.mean(cpu), "cpu_per_cycle_p99_s": percentile(cpu, 0.99),
        "store_cpu_per_cycle_s": statistics.mean(cycle.store_cpu_seconds for cycle in cycles),
        "status_cpu_per_cycle_s": statistics.mean(cycle.status_cpu_seconds for cycle in cycles),
        "peak_rss_mib": peak_rss,
        "rss_mib": rss,
        "status_changes_per_s": sum(cycle.status_changes for cycle in cycles) / duration,
        "status_kib_per_cycle": statistics.mean(cycle.status_bytes for cycle in cycles) / 1024,
        "lag_p50_s": percentile(lag, 0.5), "lag_p99_s": percentile(lag, 0.99),
        "store_mib": store_bytes / 2**20, "bytes_per_row": projection["bytes_per_row"],
        "series": projection["series"], "store_gib_per_1000_gpus_30d": per_1000 / GIB,
        "lost_allocated_gpu_s": lost["allocated"], "lost_active_gpu_s": lost["active"],
        "truth_allocated_gpu_s": lost["truth_allocated"], "missing_workloads": lost["missing_workloads"],
        "store_failures": float(controller.store_failures),
    }


COLUMNS = (
    ("nodes", "{:.0f}"), ("gpus", "{:.0f}"), ("simulated_s", "{:.0f}"), ("wall_s", "{:.0f}"),
    ("samples_per_cycle", "{:.0f}"), ("cpu_per_cycle_s", "{:.2f}"), ("cpu_per_cycle_p99_s", "{:.2f}"),
    ("store_cpu_per_cycle_s", "{:.2f}"), ("status_cpu_per_cycle_s", "{:.2f}"), ("rss_mib", "{:.0f}"), ("peak_rss_mib", "{:.0f}"), ("status_changes_per_s", "{:.1f}"), ("lag_p50_s", "{:.2f}"), ("lag_p99_s", "{:.2f}"),
    ("store_mib", "{:.1f}"), ("series", "{:.0f}"), ("bytes_per_row", "{:.0f}"),
    ("store_gib_per_1000_gpus_30d", "{:.2f}"), ("lost_allocated_gpu_s", "{:.3f}"),
    ("lost_active_gpu_s", "{:.3f}"), ("truth_allocated_gpu_s", "{:.0f}"), ("store_failures", "{:.0f}"),
)


def print_table(rows: list[dict[str, float]]) -> None:
    print("| " + " | ".join(name for name, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(fmt.format(row[name]) for name, fmt in COLUMNS) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--duration", default="10m", help="simulated time of the main run (1h: about 25 min on 2 cores)")
    parser.add_argument("--interval", type=float, default=15.0,
                        help="seconds between simulated samples (agents poll at 1 s; fewer samples keep the run short)")
    parser.add_argument("--status-interval", type=float, default=15.0)
    parser.add_argument("--growth", default="100,1000,5000", help="node counts for the growth table ('' skips)")
    parser.add_argument("--growth-duration", default="1m", help="simulated time of each growth run")
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {__import__('os').cpu_count()} CPUs, "
          f"{platform.platform()}; interpreter {interpreter_description()}", flush=True)
    rows = []
    if arguments.nodes > 0:
        print(f"main run: {arguments.nodes} nodes x {arguments.gpus_per_node} GPUs, {arguments.duration} simulated, "
              f"samples every {arguments.interval:g}s, status every {arguments.status_interval:g}s", flush=True)
        rows.append(asyncio.run(measure(arguments.nodes, arguments.gpus_per_node,
                                        parse_duration_seconds(arguments.duration), arguments.interval,
                                        arguments.status_interval, arguments.seed)))
        print_table(rows)
    growth = [int(part) for part in arguments.growth.split(",") if part.strip()]
    if growth:
        print(f"\ngrowth: {arguments.growth_duration} simulated each", flush=True)
        growth_rows = []
        for nodes in growth:
            growth_rows.append(asyncio.run(measure(nodes, arguments.gpus_per_node,
                                                   parse_duration_seconds(arguments.growth_duration),
                                                   arguments.interval, arguments.status_interval, arguments.seed)))
            print(f"  {nodes} nodes done in {growth_rows[-1]['wall_s']:.0f}s", flush=True)
        print_table(growth_rows)


if __name__ == "__main__":
    main()
