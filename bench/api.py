"""Metrics API latency at full size, embedded vs a real Prometheus, record() CPU, and the store's size.

    .venv/bin/python bench/api.py [--workloads 4000] [--gpus 8] [--hours 24] [--queries 200]
                                  [--prom-workloads 1000] [--prom-hours 24] [--skip-prometheus]
                                  [--writer-nodes 1000] [--size-nodes 50] [--size-hours 6]

Part 1 (full size): 4,000 workloads x 8 GPUs, 24 h of 15 s data in the embedded store: the
per-GPU series of every GPU, each workload's series and its project's (1,000 workloads a
project); utilisation, memory, power and GPUs held filled. Loaded through the store's bulk path
(`EmbeddedStore.load_history`), which writes the chunks and roll-ups that compaction writes,
byte for byte. Measures p50/p99 of a 24 h workload query at 15 s step and of a 24 h project
query, at the store and through the HTTP API (real uvicorn on loopback); prints the file size.

Writer: `record()` CPU per 15 s interval at `--writer-nodes` simulated nodes (gpuwm.sim and the
accounting engine make the inputs outside the clock; the controller's GC settings), through a
chunk span's end, so the compaction slices that follow it are measured too.

Size: `--size-nodes` simulated nodes for `--size-hours` through `record()` (the simulator's
noisy utilisation, power, PCIe and pod stats), everything compacted, then bytes on disk per GPU
for each tier, scaled to the default roll-ups (15 s for 2 days, 5 min for 30 days).

Part 2 (same data, both backends): `--prom-workloads` workloads x 8 GPUs in one project,
`--prom-hours` of 15 s data, written both into an embedded store (per-GPU, workload and project
series) and, as the agent's gpuwm_gpu_utilization_percent plus the controller's
gpuwm_workload_pod_info, into a real Prometheus (Debian package, backfilled with promtool).
The same two queries through both `Store` backends; prints the ratio. Asserts nothing.

Targets (issues 5 and 7): workload p99 <= 50 ms; project p99 <= 250 ms; no slower than
Prometheus; store <= 1 GiB per 1,000 GPUs per 30 days at the default roll-ups.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from gpuwm.api.app import create_app  # noqa: E402
from gpuwm.api.server import ApiServer  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.model.figures import ProjectFigures, WorkloadFigures  # noqa: E402
from gpuwm.store import RangeQuery, Store  # noqa: E402
from gpuwm.store.base import METRIC_INDEX  # noqa: E402
from gpuwm.store.embedded import EmbeddedStore  # noqa: E402
from gpuwm.store.tiers import parse_tiers  # noqa: E402

STEP = 15
UTIL = METRIC_INDEX["gpu_utilization_percent"]
ALLOCATED = METRIC_INDEX["gpu_allocated"]
MEMORY = METRIC_INDEX["gpu_memory_used_bytes"]
POWER = METRIC_INDEX["gpu_power_watts"]


def gpu_util(workload: int, gpu: int, tick: int) -> float:
    """Deterministic, varied utilisation: a per-workload phase and a per-GPU offset."""
    return float((workload * 37 + gpu * 11 + tick * (1 + workload % 5)) % 101)


BATCH = 64  # series per bulk write


def _columns(util: np.ndarray, gpus: float) -> np.ndarray:
    """[metrics, n] values of one series: utilisation, memory used, power, GPUs held; the rest missing."""
    values = np.full((len(METRIC_INDEX), len(util)), np.nan)
    values[UTIL] = util
    values[MEMORY] = gpus * 40e9
    values[POWER] = gpus * (100 + 5 * util)
    values[ALLOCATED] = gpus
    return values


def load_embedded(
    store: EmbeddedStore,
    workloads: int,
    gpus: int,
    ticks: int,
    t0: int,
    projects: int,
    gpu_series_workloads: int,
    with_pods: bool = False,
) -> None:
    """Bulk-load series through `load_history` (the chunks compaction would write), plus the latest figures."""
    per_project = math.ceil(workloads / projects)
    project_sums = np.zeros((projects, ticks))
    steps = np.arange(ticks)
    ids: list[int] = []
    batch: list[np.ndarray] = []
    started = time.monotonic()

    def add(series_id: int, values: np.ndarray) -> None:
        ids.append(series_id)
        batch.append(values)
        if len(ids) == BATCH:
            flush()

    def flush() -> None:
        if ids:
            store.load_history(ids, t0, np.stack(batch))
            ids.clear()
            batch.clear()

    for w in range(workloads):
        project = w // per_project
        base = {
            "namespace": f"ns-{w % 200}",
            "workload": f"job-{w}",
            "workload_uid": f"uid-{w}",
            "project": f"p{project}",
        }
        workload_id = store.register_series("workload", f"uid-{w}", base)
        pod_id = store.register_series(
            "pod", f"pod-uid-{w}", {**base, "pod": f"job-{w}-0", "node": f"node-{w}"}
        )
        per_gpu = (np.array([(w * 37 + g * 11) for g in range(gpus)])[:, None] + steps * (1 + w % 5)) % 101
        means = per_gpu.sum(axis=0) / gpus
        project_sums[project] += means
        add(workload_id, _columns(means, float(gpus)))
        if with_pods:
            add(pod_id, _columns(means, float(gpus)))
        if w < gpu_series_workloads:
            for g in range(gpus):
                gpu_id = store.register_series(
                    "gpu",
                    f"GPU-{w}-{g}|pod-uid-{w}",
                    {
                        **base,
                        "gpu": str(g),
                        "uuid": f"GPU-{w}-{g}",
                        "pod": f"job-{w}-0",
                        "node": f"node-{w}",
                        "model": "H100",
                    },
                )
                add(gpu_id, _columns(per_gpu[g].astype(np.float64), 1.0))
        if w % 500 == 499:
            print(f"  loaded {w + 1}/{workloads} workloads ({time.monotonic() - started:.0f} s)", flush=True)
    for project in range(projects):
        members = min(per_project, workloads - project * per_project)
        project_id = store.register_series("project", f"p{project}", {"project": f"p{project}"})
        add(project_id, _columns(project_sums[project] / members, float(members * gpus)))
    flush()
    # latest figures, as record() keeps them, so the HTTP API finds each workload and project
    latest = float(t0 + STEP * (ticks - 1))
    connection = store._writer
    connection.execute("BEGIN")
    connection.executemany(
        "INSERT OR REPLACE INTO latest_workloads VALUES (?, ?, ?, ?, ?, ?)",
        (
            (
                f"uid-{w}",
                f"ns-{w % 200}",
                f"job-{w}",
                f"p{w // per_project}",
                latest,
                WorkloadFigures(
                    uid=f"uid-{w}",
                    namespace=f"ns-{w % 200}",
                    name=f"job-{w}",
                    kind="Job",
                    api_version="batch/v1",
                    project=f"p{w // per_project}",
                    phase="Running",
                    allocated_gpus=float(gpus),
                    created_time=float(t0),
                    start_time=float(t0),
                ).model_dump_json(),
            )
            for w in range(workloads)
        ),
    )
    connection.executemany(
        "INSERT OR REPLACE INTO latest_projects VALUES (?, ?, ?)",
        (
            (
                f"p{p}",
                latest,
                ProjectFigures(name=f"p{p}", workloads=per_project, namespaces=[]).model_dump_json(),
            )
            for p in range(projects)
        ),
    )
    connection.execute("COMMIT")
    connection.execute("ANALYZE")


def file_bytes(path: Path) -> int:
    """The store's bytes on disk after a WAL checkpoint (the main file; the WAL is then empty)."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return p50 * 1000, p99 * 1000


def measure(run: Callable[[int], object], count: int, warmup: int = 5) -> tuple[float, float]:
    for index in range(warmup):
        run(index)
    timings = []
    for index in range(count):
        started = time.perf_counter()
        run(index)
        timings.append(time.perf_counter() - started)
    return percentiles(timings)


class BackgroundApi:
    """The real API app on uvicorn in a thread with its own loop (loopback only)."""

    def __init__(self, store: Store) -> None:
        self.app = create_app(store, Settings(auth="none"))
        self.loop = asyncio.new_event_loop()
        self.server = ApiServer(self.app, "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def part_one(args: argparse.Namespace, workdir: Path) -> None:
    ticks = int(args.hours * 3600 // STEP)
    t0 = 1_790_000_000 - (1_790_000_000 % 3600)
    gpu_series = min(args.gpu_series_workloads, args.workloads)
    print(
        f"part 1: {args.workloads} workloads x {args.gpus} GPUs, {args.hours} h of {STEP} s data ({ticks} points/series); "
        f"per-GPU series for {gpu_series} workloads ({gpu_series * args.gpus} series, "
        f"{gpu_series * args.gpus * ticks / 1e6:.0f} M points)"
    )
    reuse = args.reuse and (workdir / "full.db").exists()
    store = EmbeddedStore(workdir / "full.db")
    started = time.monotonic()
    if reuse:
        print("  reusing the database already in --workdir")
    else:
        load_embedded(store, args.workloads, args.gpus, ticks, t0, args.projects, gpu_series)
    chunks = store._writer.execute("SELECT count(*) FROM chunks").fetchone()[0]
    size = file_bytes(workdir / "full.db")
    points = (gpu_series * args.gpus + args.workloads + args.projects) * ticks
    print(
        f"  built in {time.monotonic() - started:.0f} s: {chunks / 1e6:.2f} M chunks, {points / 1e6:.0f} M points, "
        f"{size / 2**30:.2f} GiB on disk ({size / points:.2f} bytes per point, 4 of 19 metrics filled, "
        "the 5 min roll-up included)",
        flush=True,
    )
    end = t0 + STEP * (ticks - 1)
    rng = random.Random(5)
    picks = [rng.randrange(args.workloads) for _ in range(args.queries + 10)]
    metric = ("gpu_utilization_percent",)

    def workload_query(index: int) -> object:
        series = store.query_range(RangeQuery("workload", f"uid-{picks[index]}", metric, t0, end, STEP))
        assert len(series[0].points) == ticks and series[0].points[0][1] is not None
        return series

    def project_query(index: int) -> object:
        series = store.query_range(RangeQuery("project", f"p{index % args.projects}", metric, t0, end, STEP))
        assert series[0].points[-1][1] is not None
        return series

    w50, w99 = measure(workload_query, args.queries)
    p50, p99 = measure(project_query, args.queries)
    print(
        f"  store  workload {args.hours:g}h@15s: p50 {w50:6.1f} ms  p99 {w99:6.1f} ms   (target p99 <= 50 ms)"
    )
    print(
        f"  store  project  {args.hours:g}h@15s: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms   (target p99 <= 250 ms; "
        f"{math.ceil(args.workloads / args.projects)} workloads)"
    )
    api = BackgroundApi(store)
    try:
        with httpx.Client(base_url=api.url, timeout=60) as http:

            def http_workload(index: int) -> object:
                w = picks[index]
                response = http.get(
                    f"/api/v1/namespaces/ns-{w % 200}/workloads/job-{w}/metrics",
                    params={"metric": metric[0], "start": t0, "end": end, "step": "15s"},
                )
                response.raise_for_status()
                return response

            def http_project(index: int) -> object:
                response = http.get(
                    f"/api/v1/projects/p{index % args.projects}/metrics",
                    params={"metric": metric[0], "start": t0, "end": end, "step": "15s"},
                )
                response.raise_for_status()
                return response

            h50, h99 = measure(http_workload, args.queries)
            print(
                f"  HTTP   workload {args.hours:g}h@15s: p50 {h50:6.1f} ms  p99 {h99:6.1f} ms   (JSON, {ticks} points, uvicorn loopback)"
            )
            j50, j99 = measure(http_project, args.queries)
            print(f"  HTTP   project  {args.hours:g}h@15s: p50 {j50:6.1f} ms  p99 {j99:6.1f} ms")
    finally:
        api.close()
        store.close()


def write_openmetrics(path: Path, workloads: int, gpus: int, ticks: int, t0: int) -> int:
    """The agent's utilisation series and the controller's pod-info series, as Prometheus would have scraped them."""
    lines = 0
    with path.open("w") as handle:
        handle.write("# TYPE gpuwm_gpu_utilization_percent gauge\n")
        for w in range(workloads):
            for g in range(gpus):
                labels = (
                    f'{{container="main",gpu="{g}",mig_profile="",model="H100",namespace="ns-{w % 200}",'
                    f'node="node-{w}",pod="job-{w}-0",uuid="GPU-{w}-{g}"}}'
                )
                handle.writelines(
                    f"gpuwm_gpu_utilization_percent{labels} {gpu_util(w, g, k)} {t0 + STEP * k}\n"
                    for k in range(ticks)
                )
                lines += ticks
        handle.write("# TYPE gpuwm_workload_pod_info gauge\n")
        for w in range(workloads):
            labels = (
                f'{{namespace="ns-{w % 200}",node="node-{w}",pod="job-{w}-0",project="p0",workload="job-{w}",'
                f'workload_uid="uid-{w}"}}'
            )
            handle.writelines(f"gpuwm_workload_pod_info{labels} 1.0 {t0 + STEP * k}\n" for k in range(ticks))
            lines += ticks
        handle.write("# EOF\n")
    return lines


def _simulated_intervals(nodes: int, start: float, count: int, warmup: int) -> Iterator[tuple[Any, ...]]:
    """(t, samples, workloads, projects, cluster, pod stats) of `count` simulated 15 s intervals after `warmup`."""
    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.sim.simulator import SimConfig, Simulator

    simulator = Simulator(SimConfig(seed=1, nodes=nodes, gpus_per_node=8, interval_seconds=STEP, start_time=start))
    engine = Engine(EngineConfig(interval_seconds=STEP, idle_threshold_percent=1.0))
    for index in range(warmup + count):
        step = simulator.step()
        for event in step.events:
            engine.observe(event)
        for sample in step.samples:
            engine.observe_sample(sample)
        if index >= warmup:
            workloads, projects, cluster = engine.report(step.t)
            yield step.t, step.samples, workloads, projects, cluster, step.pod_stats


def writer_cost(args: argparse.Namespace, workdir: Path) -> None:
    """What the controller pays each status interval: record() of every series, with compaction slices."""
    from gpuwm.controller.gctuning import tune_garbage_collector

    tune_garbage_collector()
    span = 3600
    warmup = 20
    # the first chunk span ends after 10 measured intervals: the rest carry its compaction slices
    start = float(1_790_000_000 - 1_790_000_000 % span + span - (warmup + 10) * STEP)
    store = EmbeddedStore(workdir / "writer.db")
    plain: list[float] = []
    compacting: list[float] = []
    series = 0
    for t, samples, workloads, projects, cluster, stats in _simulated_intervals(
        args.writer_nodes, start, args.writer_intervals, warmup
    ):
        before = store.compacted_blocks
        began = time.process_time()
        store.record(t, samples, workloads, projects, cluster, stats)
        cpu = time.process_time() - began
        (compacting if store.compacted_blocks > before else plain).append(cpu)
        series = len(store._series_ids)
    store.close()
    print(
        f"writer: record() at {args.writer_nodes} nodes x 8 GPUs ({len(workloads)} workloads, {series} series), "
        f"CPU seconds per 15 s interval: plain mean {statistics.mean(plain[1:]):.3f} "
        f"(first {plain[0]:.3f}, max {max(plain[1:]):.3f}, {len(plain) - 1} intervals); "
        f"with a compaction slice mean {statistics.mean(compacting) if compacting else float('nan'):.3f} "
        f"(max {max(compacting) if compacting else float('nan'):.3f}, {len(compacting)} intervals)",
        flush=True,
    )


def _whole_coarse_bytes(store: EmbeddedStore, start: int, seconds: int) -> dict[int, int]:
    """Per coarse tier: the bytes this run's coarse points take when each series' points are one chunk
    (as in a full span; this run's are 12-point pieces until a span ends), by the store's encoder."""
    from gpuwm.store.chunks import _overlay
    from gpuwm.store.codec import METRIC_COUNT, MISSING, decode_chunk, encode_chunks

    result: dict[int, int] = {}
    for span in store.spans[1:]:
        points = seconds // span.step
        grids: dict[int, np.ndarray] = {}
        for series_id, row_start, row_points, data in store._writer.execute(
            "SELECT series_id, start, points, data FROM chunks WHERE tier = ?", (span.step,)
        ):
            grid = grids.get(series_id)
            if grid is None:
                grid = grids[series_id] = np.full((1, METRIC_COUNT, points), MISSING, dtype=np.int64)
            _overlay(grid, start, decode_chunk(data, row_points)[None], row_start, span.step)
        stacked = list(grids.values())
        total = 0
        for offset in range(0, len(stacked), 256):
            total += sum(len(data) for data in encode_chunks(np.concatenate(stacked[offset : offset + 256])))
        result[span.step] = total
    return result


def size_projection(args: argparse.Namespace, workdir: Path) -> None:
    """Bytes on disk per GPU for each tier after `--size-hours` of simulated data, scaled to the default roll-ups."""
    from gpuwm.controller.gctuning import tune_garbage_collector

    tune_garbage_collector()
    path = workdir / "size.db"
    rollups = list(args.size_rollups)
    store = EmbeddedStore(path, tiers=rollups)
    count = int(args.size_hours * 3600 // STEP)
    start = float(1_790_000_000 - 1_790_000_000 % 3600)
    gpus = 0
    for t, samples, workloads, projects, cluster, stats in _simulated_intervals(args.size_nodes, start, count, 0):
        store.record(t, samples, workloads, projects, cluster, stats)
        gpus = len({sample.parent_uuid or sample.uuid for sample in samples})
    def page_bytes() -> dict[str, int]:
        """Bytes of pages per table and index, as SQLite's dbstat counts them (free pages excluded)."""
        rows = store._writer.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        return {name: int(total) for name, total in rows}

    before = page_bytes()
    head_bytes = sum(v for k, v in before.items() if k == "head" or k.startswith("sqlite_autoindex_head"))
    store.compact(everything=True)
    pages = page_bytes()
    whole = _whole_coarse_bytes(store, int(start), count * STEP)
    tiers = store._writer.execute(
        "SELECT tier, count(*), sum(length(data)) FROM chunks GROUP BY tier ORDER BY tier"
    ).fetchall()
    series = len(store._series_ids)
    store.close()
    size = file_bytes(path)
    chunk_table = pages.get("chunks", 0)
    chunk_indexes = sum(v for k, v in pages.items() if k.startswith(("sqlite_autoindex_chunks", "chunks_by_")))
    fixed = sum(v for k, v in pages.items() if not k.startswith(("chunks", "sqlite_autoindex_chunks", "head")))
    fixed += sum(v for k, v in pages.items() if k == "head" or k.startswith("sqlite_autoindex_head"))
    payload = sum(row[2] for row in tiers)
    rows_total = sum(row[1] for row in tiers)
    seconds = count * STEP
    print(
        f"size: {args.size_nodes} nodes, {gpus} physical GPUs, {series} series, {args.size_hours:g} h simulated through "
        f"record(); compacted file {size / 2**20:.1f} MiB, of which chunk pages {chunk_table / 2**20:.1f} MiB, "
        f"chunk indexes {chunk_indexes / 2**20:.1f} MiB, series/latest/meta {fixed / 2**20:.1f} MiB; "
        f"head before the final compaction {head_bytes / 2**20:.1f} MiB"
    )
    keep = {tier.step_seconds: tier.keep_seconds for tier in parse_tiers(rollups)}
    steady = 0.0
    fine_ratio = 1.0
    for tier, chunks, blob_bytes in tiers:
        share = chunk_table * blob_bytes / payload + chunk_indexes * chunks / rows_total
        per_gpu_second = share / gpus / seconds
        line = (
            f"  tier {tier:>3} s: {chunks} chunks, {blob_bytes / 2**20:.2f} MiB compressed, {share / 2**20:.2f} MiB "
            f"of pages = {per_gpu_second * 86400 / 1024:.1f} KiB per GPU per day"
        )
        if tier == store.spans[0].step:
            fine_ratio = share / blob_bytes
        elif tier in whole:
            # at steady state this tier is whole chunks of 240 points (the last span's pieces are a small
            # part): each series' points of this run as one chunk by the store's encoder (fewer points a
            # chunk than at steady state, so an upper bound), with the fine tier's page overhead
            per_gpu_second = whole[tier] * fine_ratio / gpus / seconds
            line += (
                f"; as whole chunks {whole[tier] / 2**20:.2f} MiB compressed = "
                f"{per_gpu_second * 86400 / 1024:.1f} KiB per GPU per day (used below)"
            )
        steady += per_gpu_second * keep.get(tier, 0)
        print(line)
    # the head at steady state: at most about 1.25 chunk spans of intervals (one span, then its compaction)
    head_per_gpu = head_bytes / gpus / (seconds % 3600 or 3600) * 1.25 * 3600
    fixed_per_gpu = fixed / gpus
    total = steady + head_per_gpu + fixed_per_gpu
    print(
        f"  projection at {','.join(rollups)} per GPU: chunks {steady / 2**20:.3f} MiB + head {head_per_gpu / 2**20:.3f} MiB "
        f"+ series and latest figures {fixed_per_gpu / 2**20:.3f} MiB = {total / 2**20:.3f} MiB "
        f"= {total * 1000 / 2**30:.2f} GiB per 1,000 GPUs per 30 days (target <= 1)",
        flush=True,
    )


def part_two(args: argparse.Namespace, workdir: Path) -> None:
    from tests.integration.store.prometheus_fixture import PROMETHEUS, PROMTOOL, backfill, running_prometheus

    from gpuwm.store.prometheus import PrometheusStore

    if PROMETHEUS is None or PROMTOOL is None:
        print("part 2 skipped: prometheus/promtool not installed (apt-get install prometheus)")
        return
    ticks = int(args.prom_hours * 3600 // STEP)
    now = int(time.time())
    t0 = (now - STEP * ticks) // 3600 * 3600  # recent (inside Prometheus' retention), at a chunk span's start
    end = t0 + STEP * (ticks - 1)
    print(
        f"part 2: {args.prom_workloads} workloads x {args.gpus} GPUs in one project, {args.prom_hours} h of {STEP} s data, "
        "in both backends"
    )
    store = EmbeddedStore(workdir / "same.db")
    started = time.monotonic()
    load_embedded(store, args.prom_workloads, args.gpus, ticks, t0, 1, args.prom_workloads)
    print(f"  embedded built in {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    samples = write_openmetrics(workdir / "same.om", args.prom_workloads, args.gpus, ticks, t0)
    backfill(workdir / "same.om", workdir / "tsdb")
    (workdir / "same.om").unlink()
    print(f"  prometheus backfilled {samples / 1e6:.1f} M samples in {time.monotonic() - started:.0f} s")
    metric = ("gpu_utilization_percent",)
    rng = random.Random(7)
    picks = [rng.randrange(args.prom_workloads) for _ in range(args.queries + 10)]
    with running_prometheus(workdir / "tsdb", workdir) as base:
        prometheus = PrometheusStore(base, timeout_seconds=120)
        results: dict[str, dict[str, tuple[float, float]]] = {}
        for name, backend in (("embedded", store), ("prometheus", prometheus)):

            def workload_query(index: int, backend: Store = backend) -> object:
                series = backend.query_range(
                    RangeQuery("workload", f"uid-{picks[index]}", metric, t0, end, STEP)
                )
                assert series and series[0].points[len(series[0].points) // 2][1] is not None, "no data"
                return series

            def project_query(index: int, backend: Store = backend) -> object:
                series = backend.query_range(RangeQuery("project", "p0", metric, t0, end, STEP))
                assert series and series[0].points[len(series[0].points) // 2][1] is not None, "no data"
                return series

            project_count = max(10, args.queries // 10) if name == "prometheus" else args.queries
            results[name] = {
                "workload": measure(workload_query, args.queries),
                "project": measure(project_query, project_count, warmup=2),
            }
        # both must answer the same numbers
        a = store.query_range(RangeQuery("project", "p0", metric, t0, end, STEP))[0].points
        b = prometheus.query_range(RangeQuery("project", "p0", metric, t0, end, STEP))[0].points
        same = all(
            x[1] is not None and y[1] is not None and abs(x[1] - y[1]) < 1e-6
            for x, y in zip(a, b, strict=True)
        )
        print(f"  answers identical: {same}")
    store.close()
    for query in ("workload", "project"):
        e50, e99 = results["embedded"][query]
        p50, p99 = results["prometheus"][query]
        print(
            f"  {query:8s} {args.prom_hours} h@15s: embedded p50 {e50:7.1f} ms p99 {e99:7.1f} ms | "
            f"prometheus p50 {p50:7.1f} ms p99 {p99:7.1f} ms | prometheus/embedded p99 ratio {p99 / e99:5.1f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=4000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument(
        "--projects", type=int, default=4, help="workloads are split evenly (4 -> 1,000 each)"
    )
    parser.add_argument("--gpu-series-workloads", type=int, default=4000, help="workloads with per-GPU series")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--prom-workloads", type=int, default=1000)
    parser.add_argument("--prom-hours", type=float, default=24.0)
    parser.add_argument("--writer-nodes", type=int, default=1000)
    parser.add_argument("--writer-intervals", type=int, default=80)
    parser.add_argument("--size-nodes", type=int, default=50)
    parser.add_argument("--size-hours", type=float, default=6.0)
    parser.add_argument(
        "--size-rollups",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=list(Settings().store_rollups),
        help="roll-up tiers the size part projects for (default: the store's default, Settings.store_rollups)",
    )
    parser.add_argument("--skip-size", action="store_true")
    parser.add_argument("--skip-prometheus", action="store_true")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--skip-writer", action="store_true")
    parser.add_argument(
        "--reuse", action="store_true", help="reuse part 1's database from an earlier run in --workdir"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the databases go (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    directory = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwm-bench-api-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if not args.skip_full:
            part_one(args, directory)
        if not args.skip_writer:
            writer_cost(args, directory)
        if not args.skip_size:
            size_projection(args, directory)
        if not args.skip_prometheus:
            part_two(args, directory)
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
