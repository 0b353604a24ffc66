"""CPU of one status interval's store write (`EmbeddedStore.record`) at controller size, without HTTP.

1,000 nodes / 8,000 GPUs / 4,000 running workloads (two GPUs each, 40 namespaces, 10 projects),
as bench/controller.py runs them: the accounting engine is fed a sample per GPU every few
seconds, reports every interval, and the store records what it reported (each device's latest
sample, the workloads', projects' and cluster's figures). Only `record` is timed, in thread CPU
seconds (holds up on a loaded machine), with the controller's garbage-collector settings; the first
interval creates every series and is shown apart.
The compaction slice of a closed chunk span is included once the run crosses an hour
(`--start` puts the run just before one).

    .venv/bin/python bench/store_record.py [--intervals 12] [--pod-stats] [--latest-rows-per-interval N] [--profile tottime]
                                           [--traced-peak]

Also printed: the bytes each record hands to write() (the WAL and its checkpoints into the file).
`--traced-peak` prints, per interval, the most memory `record` had allocated at once above what was alive
when it began (Python's and numpy's allocations, by `tracemalloc`): what the store adds to the controller's
peak at the end of its cycle, where the report's figures are alive too. Its CPU figures are then
tracemalloc's, not the store's.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import random
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.config import Settings
from gpuwm.controller.state.gctuning import tune_garbage_collector
from gpuwm.model import GpuSample, PodEvent, PodStatsSample
from gpuwm.model.trace import NamespaceEvent
from gpuwm.store import rows as rows_module
from gpuwm.store.embedded import EmbeddedStore

NAMESPACES = 40


def setup(engine: Engine, nodes: int, gpus_per_node: int, per_workload: int) -> list[str]:
    """Namespaces and one pod per workload; returns each GPU's node (index = GPU number)."""
    for index in range(NAMESPACES):
        engine.observe(NamespaceEvent.model_validate({
            "t": 0.0, "event": "namespace", "name": f"team-{index:02d}",
            "labels": {"gpuwm.io/project": f"project-{index % 10}"},
        }))
    gpu_nodes = [f"node-{gpu // gpus_per_node:04d}" for gpu in range(nodes * gpus_per_node)]
    for index in range(len(gpu_nodes) // per_workload):
        first = index * per_workload
        engine.observe(PodEvent.model_validate({
            "t": 0.0, "event": "pod", "namespace": f"team-{index % NAMESPACES:02d}", "name": f"job-{index:05d}-0",
            "uid": f"pod-job-{index:05d}", "phase": "Running", "node": gpu_nodes[first], "labels": {},
            "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{index:05d}", "uid": f"uid-{index:05d}"},
            "devices": [{"uuid": f"GPU-{gpu}", "units": 1.0} for gpu in range(first, first + per_workload)],
        }))
    return gpu_nodes


def poll(rng: random.Random, t: float, gpu_nodes: list[str], gpus_per_node: int) -> list[GpuSample]:
    """One sample of every GPU at `t` (varied figures, so figures change each interval)."""
    samples = []
    for gpu, node in enumerate(gpu_nodes):
        sm = rng.choice((0.0, 0.0, 35.0, 80.0, 97.0))
        samples.append(GpuSample.model_validate({
            "t": t, "node": node, "uuid": f"GPU-{gpu}", "index": gpu % gpus_per_node, "model": "NVIDIA H100",
            "sm_percent": sm, "memory_used_bytes": 4.0e10 + rng.random() * 1e9, "memory_total_bytes": 8.0e10,
            "power_watts": 100.0 + 3 * sm, "power_limit_watts": 700.0, "energy_joules": 300.0 * t,
            "temperature_celsius": 40.0 + sm / 5, "sm_clock_mhz": 1980.0, "memory_clock_mhz": 2619.0,
            "pcie_rx_bytes_per_second": 1000.0, "pcie_tx_bytes_per_second": 2000.0,
        }))
    return samples


def pod_stats_at(rng: random.Random, t: float, workloads: int, gpu_nodes: list[str], per_workload: int) -> list[PodStatsSample]:
    return [
        PodStatsSample.model_validate({
            "t": t, "node": gpu_nodes[index * per_workload], "namespace": f"team-{index % NAMESPACES:02d}",
            "pod": f"job-{index:05d}-0", "pod_uid": f"pod-job-{index:05d}", "cpu_usage_cores": rng.random() * 8,
            "memory_used_bytes": 1e9 + rng.random() * 1e9, "network_rx_bytes_per_second": 1e6,
            "network_tx_bytes_per_second": 2e6, "ephemeral_storage_used_bytes": 5e8,
        })
        for index in range(workloads)
    ]


def fresh_build() -> Any:
    """A new row builder's `build` (the stateless `build_rows` in older code, which the bench also measures)."""
    builder = getattr(rows_module, "RowBuilder", None)
    return builder().build if builder is not None else rows_module.build_rows


def fill_head(store: EmbeddedStore, at: float, samples: list[GpuSample], workloads: list[Any],
              projects: list[Any], cluster: Any, stats: list[PodStatsSample]) -> None:
    """Head rows for every interval of the chunk span `at` is in, before `at` (the same figures each time)."""
    rows = fresh_build()(samples, workloads, projects, cluster, stats, known=store._series_ids)
    step = int(store.tiers[0].step_seconds)
    span = store.spans[0].span_seconds
    with store._write_lock:
        store._writer.execute("BEGIN IMMEDIATE")
        for bucket in range(int(at) // span * span, int(at) // step * step, step):
            store.write_points(float(bucket), rows)
        store._writer.execute("COMMIT")


def _bytes_written() -> int:
    """Bytes this process has handed to write() so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpus-per-workload", type=int, default=2)
    parser.add_argument("--intervals", type=int, default=12, help="recorded intervals (the first is shown apart)")
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between the engine's samples of a GPU")
    parser.add_argument("--start", type=float, default=1_800_000_000.0 - 15 * 6,
                        help="epoch seconds of the first interval (default: 6 intervals before an hour)")
    parser.add_argument("--pod-stats", action="store_true", help="a pod-stats sample per pod each interval")
    parser.add_argument("--fill-head", action="store_true",
                        help="the chunk span before the first interval filled with its rows first (so the compaction "
                             "slices after the hour compact full blocks, as a store running for hours does)")
    parser.add_argument("--latest-rows-per-interval", type=int, default=Settings().store_latest_rows_per_interval,
                        help="running workloads' latest rows rewritten per interval at most (the controller's "
                             "storeLatestRowsPerInterval; 0: every row, as before it)")
    parser.add_argument("--traced-peak", action="store_true",
                        help="record's peak of allocations above its start, by tracemalloc (slows the CPU figures)")
    parser.add_argument("--profile", choices=("cumulative", "tottime"), help="profile record() after the first")
    parser.add_argument("--profile-lines", type=int, default=40)
    args = parser.parse_args()

    rng = random.Random(7)
    engine = Engine(EngineConfig())
    gpu_nodes = setup(engine, args.nodes, args.gpus_per_node, args.gpus_per_workload)
    workload_count = len(gpu_nodes) // args.gpus_per_workload
    tune_garbage_collector()  # as the controller does at start
    profiler = cProfile.Profile() if args.profile else None
    first = 0.0
    steady: list[float] = []
    build: list[float] = []  # CPU of the rows alone
    plain: list[float] = []  # intervals without compaction ...
    compacting: list[float] = []  # ... and with a compaction slice
    compacted = 0
    written: list[int] = []  # bytes handed to write() by each record after the first (WAL, checkpoints)
    traced: list[float] = []  # MiB: record's peak of allocations above what was alive when it began
    with tempfile.TemporaryDirectory() as directory:
        store = EmbeddedStore(Path(directory) / "bench.db", latest_rows_per_interval=args.latest_rows_per_interval or None)
        # rows alone: a builder of its own fed the same intervals
        build_alone = fresh_build()
        t = args.start - args.interval
        for interval in range(args.intervals):
            end = args.start + interval * args.interval
            while t + args.poll <= end:
                t += args.poll
                for sample in poll(rng, t, gpu_nodes, args.gpus_per_node):
                    engine.observe_sample(sample)
            latest = sorted(poll(rng, end, gpu_nodes, args.gpus_per_node), key=lambda each: each.t)
            for sample in latest:
                engine.observe_sample(sample)
            t = end
            workloads, projects, cluster = engine.report(end)
            stats = pod_stats_at(rng, end, workload_count, gpu_nodes, args.gpus_per_workload) if args.pod_stats else []
            if interval == 0 and args.fill_head:
                fill_head(store, end, latest, workloads, projects, cluster, stats)
            gc.collect()
            started = time.thread_time()
            build_alone(latest, workloads, projects, cluster, stats, known=store._series_ids)
            if interval:
                build.append(time.thread_time() - started)
            if profiler is not None and interval:
                profiler.enable()
            if args.traced_peak:
                tracemalloc.start()
                alive_before = tracemalloc.get_traced_memory()[0]
            started, written_before = time.thread_time(), _bytes_written()
            store.record(end, latest, workloads, projects, cluster, stats)
            elapsed = time.thread_time() - started
            if args.traced_peak:
                traced.append((tracemalloc.get_traced_memory()[1] - alive_before) / 2**20)
                tracemalloc.stop()
            if interval:
                written.append(_bytes_written() - written_before)
            if profiler is not None and interval:
                profiler.disable()
            if interval:
                steady.append(elapsed)
                (compacting if store.compacted_blocks > compacted else plain).append(elapsed)
            else:
                first = elapsed
            compacted = store.compacted_blocks
            print(f"interval {interval}: record {elapsed * 1000:.0f} ms CPU, {written[-1] / 1e6 if interval else 0:.1f} MB written"
                  f"{'' if not interval else f' (building the rows alone {build[-1] * 1000:.0f} ms)'}"
                  f"; compacted blocks so far {store.compacted_blocks}"
                  f"{f'; traced peak {traced[-1]:.2f} MiB' if traced else ''}", flush=True)
        size = sum(path.stat().st_size for path in Path(directory).iterdir())
        store.close()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {args.nodes} nodes, {len(gpu_nodes)} GPUs, "
          f"{workload_count} workloads, pod stats {'on' if args.pod_stats else 'off'}")
    print(f"record CPU per interval: first (creates series) {first * 1000:.0f} ms; after it mean "
          f"{statistics.mean(steady) * 1000:.0f} ms, median {statistics.median(steady) * 1000:.0f} ms, "
          f"max {max(steady) * 1000:.0f} ms over {len(steady)}; rows alone mean {statistics.mean(build) * 1000:.0f} ms; "
          f"files {size / 1e6:.1f} MB")
    print(f"bytes written per interval (the WAL and its checkpoints into the file): mean "
          f"{statistics.mean(written) / 1e6:.1f} MB ({statistics.mean(written) / args.interval * 86400 / 1e9:.0f} GB a day); "
          f"latest rows per interval {args.latest_rows_per_interval or 'all'}")
    for label, figures in (("without compaction", plain), ("with a compaction slice", compacting)):
        if figures:
            print(f"  {label}: mean {statistics.mean(figures) * 1000:.0f} ms over {len(figures)}")
    if len(traced) > 1:
        print(f"record's traced peak above its start (MiB): first {traced[0]:.2f}; after it max {max(traced[1:]):.2f}, "
              f"median {statistics.median(traced[1:]):.2f} (CPU figures above are under tracemalloc)")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(args.profile).print_stats(args.profile_lines)


if __name__ == "__main__":
    main()
