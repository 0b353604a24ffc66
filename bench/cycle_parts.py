"""Two per-cycle parts of the controller's status cycle at 1,000 nodes, timed alone (thread CPU).

- The idleness judgements of every running workload: the idle watch, the Idle condition and the
  writer's signature, each judging the workload's samples itself (`helpers`), against the cycle's
  way, one `seen_now` per workload that the three read (`seen once`).
- `whole_device_nodes` over unshared nodes whose pods each hold whole GPUs (every node qualifies:
  the case where each device is looked at).

    .venv/bin/python bench/cycle_parts.py [--nodes 1000] [--rounds 9]

Figures go in bench/README.md; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from gpuwm.controller.status import IdleWatch, idle_condition, seen_now, workload_signature
from gpuwm.controller.watch import whole_device_nodes
from gpuwm.feed.decode import DeviceHolder
from gpuwm.model import GpuFigures, PodFigures, WorkloadFigures

NOW = 10_000.0
#: the controller's reporting slack at a 15 s interval: the engine's gap (3 polls) and an interval
SLACK_SECONDS = 18.0
IDLE_AFTER_SECONDS = 600.0
WORKLOADS_PER_NODE, GPUS_PER_WORKLOAD = 4, 2


def running_workloads(nodes: int) -> list[WorkloadFigures]:
    """`controller.py`'s cluster: 4 workloads a node, 2 GPUs each, half of them active, sampled a poll ago
    (the engine's `sampling` flag off, as a pull spread over the interval leaves most of them)."""
    workloads = []
    for n in range(nodes * WORKLOADS_PER_NODE):
        node, active = f"node-{n // WORKLOADS_PER_NODE:04d}", n % 2 == 0
        gpus = [GpuFigures(node=node, uuid=f"GPU-{n}-{g}", units=1.0, pod=f"pod-{n}", monitored=False,
                           last_sample_time=NOW - 3, active=active) for g in range(GPUS_PER_WORKLOAD)]
        workloads.append(WorkloadFigures(
            uid=f"uid-{n}", namespace="team", name=f"job-{n}", kind="Job", api_version="batch/v1", project="team",
            phase="Running", allocated_gpus=float(GPUS_PER_WORKLOAD), idle_seconds=0.0 if active else 120.0,
            sampling=False, nodes=[node], gpus=gpus,
            pods=[PodFigures(name=f"pod-{n}", uid=f"pod-uid-{n}", node=node, phase="Running",
                             allocated_gpus=float(GPUS_PER_WORKLOAD))],
        ))
    return workloads


def judged_by_each_helper(workloads: list[WorkloadFigures], watch: IdleWatch) -> None:
    for figures in workloads:
        observed = watch.observe(figures, NOW)
        idle = idle_condition(figures, observed, IDLE_AFTER_SECONDS, NOW, SLACK_SECONDS)
        hash(workload_signature(figures, NOW, idle_condition_after_seconds=IDLE_AFTER_SECONDS,
                                observed_idle_seconds=observed, reporting_slack_seconds=SLACK_SECONDS, idle=idle))


def judged_once(workloads: list[WorkloadFigures], watch: IdleWatch) -> None:
    seen = {figures.uid: seen_now(figures, NOW, SLACK_SECONDS) for figures in workloads}
    for figures in workloads:
        look = seen[figures.uid]
        observed = watch.observe(figures, NOW, seen=look)
        idle = idle_condition(figures, observed, IDLE_AFTER_SECONDS, NOW, SLACK_SECONDS, look)
        hash(workload_signature(figures, NOW, idle_condition_after_seconds=IDLE_AFTER_SECONDS,
                                observed_idle_seconds=observed, reporting_slack_seconds=SLACK_SECONDS, idle=idle,
                                seen=look))


class _Unshared:
    """A `SharingSource` that knows every node's GPUs are not shared (its replicas label says 1)."""

    def may_share(self, node: str) -> bool:
        return False


def whole_gpu_cluster(nodes: int) -> tuple[list[str], list[SimpleNamespace], dict[str, list[DeviceHolder]]]:
    """Node names, tracked pods (each asking for whole GPUs) and the agents' holders: one per device."""
    names = [f"node-{n:04d}" for n in range(nodes)]
    pods: list[SimpleNamespace] = []
    holders: dict[str, list[DeviceHolder]] = {}
    for n, node in enumerate(names):
        for p in range(WORKLOADS_PER_NODE):
            uid = f"pod-uid-{n}-{p}"
            pods.append(SimpleNamespace(uid=uid, node=node, phase="Running",
                                        units_by_container={"main": float(GPUS_PER_WORKLOAD)}))
            holders.setdefault(node, []).extend(
                DeviceHolder(uuid=f"GPU-{n}-{p}-{g}", device_id=f"GPU-{n}-{p}-{g}", node=node, pod_uid=uid,
                             namespace="team", pod=f"pod-{n}-{p}", container="main",
                             resource_name="nvidia.com/gpu", units=1.0)
                for g in range(GPUS_PER_WORKLOAD))
    return names, pods, holders


def thread_cpu_ms(work: Callable[[], object], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.thread_time()
        work()
        times.append((time.thread_time() - started) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes (4 running workloads of 2 GPUs on each)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds of each part, in turn")
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 1:
        parser.error(f"--nodes and --rounds are at least 1, got {args.nodes} and {args.rounds}")
    workloads = running_workloads(args.nodes)
    names, pods, holders = whole_gpu_cluster(args.nodes)
    whole = whole_device_nodes(names, _Unshared(), pods, holders)  # type: ignore[arg-type]
    print(f"{args.nodes} nodes: {len(workloads)} running workloads, {len(pods)} pods, "
          f"{sum(map(len, holders.values()))} holders; {len(whole)} nodes held whole")
    parts: dict[str, Callable[[], object]] = {
        "idleness, each helper judging": lambda: judged_by_each_helper(workloads, IdleWatch(SLACK_SECONDS)),
        "idleness, seen once a cycle": lambda: judged_once(workloads, IdleWatch(SLACK_SECONDS)),
        "whole_device_nodes": lambda: whole_device_nodes(names, _Unshared(), pods, holders),  # type: ignore[arg-type]
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(2):  # two passes in turn, so a drift of the machine falls on each part
        for name, work in parts.items():
            times[name] += thread_cpu_ms(work, args.rounds)
    for name, each in times.items():
        print(f"{name}: min {min(each):.1f} ms, median {statistics.median(each):.1f} ms a cycle (thread CPU)")


if __name__ == "__main__":
    main()
