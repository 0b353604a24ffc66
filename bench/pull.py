"""The controller's agent pull alone: every agent's `/v1/snapshot` through `AgentPuller`, no engine, no store.

What `bench/controller.py` reports as its `pull` phase, without the rest of the cycle around it:
the HTTP client, the snapshots' parsing and the columns read together. The agents are
controller.py's (a child process on loopback, the same simulated nodes); this process's event
loop thread is timed (`time.thread_time`), so the agents' CPU is not counted.

The VM's other vCPU serves the agents meanwhile, and a pull's CPU moves by +-30 % from one pull
to the next on a shared 2-vCPU VM: read the minimum and the median of many pulls, and compare
two versions one run after the other, more than once.

    .venv/bin/python bench/pull.py                        # 1,000 nodes, 16 pulls 5 s apart
    .venv/bin/python bench/pull.py --nodes 100 --pulls 4 --profile tottime
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import controller as controller_bench  # noqa: E402
from gpuwm.controller.command import event_loop_factory  # noqa: E402
from gpuwm.controller.pull.agents import AgentPuller  # noqa: E402
from gpuwm.controller.state.gctuning import collect_cycle_garbage, tune_garbage_collector  # noqa: E402
from gpuwm.feed import MergeRequest  # noqa: E402
from gpuwm.feed.decode import Snapshot  # noqa: E402


async def pull(args: argparse.Namespace, agents_url: str) -> None:
    puller = AgentPuller(timeout_seconds=10.0, merge=MergeRequest(args.merge, 1.0, 3.0 * args.interval))
    urls = {f"node-{i:04d}": f"{agents_url}/node-{i:04d}" for i in range(args.nodes)}
    rows: list[int] = []

    def take(snapshot: Snapshot) -> None:
        rows.append(0 if snapshot.columns is None else len(snapshot.columns))

    profiler = None
    spent: list[float] = []
    for number in range(1, args.pulls + 1):
        if args.profile and number == 2:
            import cProfile

            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
        started, cpu = time.perf_counter(), time.thread_time()
        result = await puller.pull_all(urls, on_snapshot=take)
        cpu = time.thread_time() - cpu
        print(f"pull {number}: {cpu:.3f} CPU-s, {time.perf_counter() - started:.2f} s wall, "
              f"{len(result.snapshots)} answered, {len(result.failed_nodes)} failed, {sum(rows)} rows", flush=True)
        rows.clear()
        if number > 1:  # the first reads each agent's whole buffer and opens the connections
            spent.append(cpu)
        collect_cycle_garbage()  # as the controller's cycle ends
        await asyncio.sleep(max(0.0, args.every - (time.perf_counter() - started)))
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats(args.profile).print_stats(40)
    if spent:
        print(f"summary: CPU per pull of {args.nodes} agents, pulls 2-{args.pulls}: min {min(spent):.3f} s, "
              f"median {statistics.median(spent):.3f} s, mean {statistics.mean(spent):.3f} s")
    await puller.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pulls", type=int, default=16)
    parser.add_argument("--every", type=float, default=5.0,
                        help="seconds between pulls' starts: from 4 polls on, an agent sends 3 merged rows per GPU, "
                             "as in a 15 s status interval")
    parser.add_argument("--interval", type=float, default=1.0, help="the agents' poll interval")
    parser.add_argument("--merge", type=float, default=15.0, help="the controller's snapshotMerge, seconds")
    parser.add_argument("--profile", choices=("cumulative", "tottime"),
                        help="cProfile the pulls from the second on (it inflates Python calls against C ones)")
    args = parser.parse_args()
    cluster_args = argparse.Namespace(nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpus_per_workload=2,
                                      interval=args.interval, jitter_percent=20.0, finished=0, existing_crs=False)
    with controller_bench.cluster_served(cluster_args) as (_, agents_url, _):
        tune_garbage_collector()
        gc.collect()
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(pull(args, agents_url))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GPUWM_LOG_LEVEL", "warning")
    sys.exit(main())
