"""Metrics API latency at full size, embedded vs a real Prometheus, record() CPU, and the store's size.

    .venv/bin/python bench/api.py [--workloads 4000] [--gpus 8] [--hours 24] [--queries 200]
                                  [--prom-workloads N] [--prom-hours H] [--prom-project-queries 5]
                                  [--skip-prometheus] [--writer-nodes 1000] [--size-nodes 50] [--size-hours 6]
                                  [--workdir DIR [--reuse]]

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
noisy utilisation, power, PCIe and pod stats), retention off, everything compacted, then bytes
on disk per GPU for each tier from the chunk spans that ended inside the run (whole chunks as
the store wrote them, shared bytes once), projected to `--size-rollups` and each `--size-also`.
A tier is at steady state when the run holds a few of its spans (5 min: 20 h, 1 h: 10 days).

Part 2 (same data, both backends): part 1's data (by default; `--prom-workloads/--prom-hours` for
a smaller set) in the embedded store (part 1's database when the shapes match, else its own) and,
as the agent's gpuwm_gpu_utilization_percent of every GPU plus the controller's
gpuwm_workload_pod_info of every workload, in a real Prometheus (Debian package), loaded through
its remote-write receiver (bench/_remote_write.py: protobuf written with numpy, snappy, in time
order); waits until Prometheus answers for every sample and has finished compacting. The same
two queries through both `Store` backends in the same run (`--prom-project-queries` timed
project queries on Prometheus, after one warm-up); prints p50/p99, the ratios, Prometheus' RSS,
and whether both answer the same numbers (20 workloads and the project). Asserts nothing.
With `--workdir` and `--reuse`, a rerun reuses both databases.

Targets (bench/README.md's table): workload p99 <= 50 ms; project p99 <= 250 ms; no slower than
Prometheus; store <= 1 GiB per 1,000 GPUs per 30 days at the default roll-ups.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import math
import random
import shutil
import sqlite3
import statistics
import subprocess
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
from bench._remote_write import (  # noqa: E402
    SeriesBlock,
    encode_labels,
    instant_value,
    process_memory,
    remote_write,
    wait_settled,
)

from gpuwm.api.app import create_app  # noqa: E402
from gpuwm.api.server import ApiServer  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.model.figures import ProjectFigures, WorkloadFigures  # noqa: E402
from gpuwm.store import RangeQuery, Series, Store  # noqa: E402
from gpuwm.store.base import METRIC_INDEX  # noqa: E402
from gpuwm.store.embedded import EmbeddedStore  # noqa: E402
from gpuwm.store.schema import PART_ROWS  # noqa: E402
from gpuwm.store.tiers import parse_tiers  # noqa: E402

STEP = 15
T0 = 1_790_000_000 - (1_790_000_000 % 3600)  # parts 1 and 2: the same data, at a chunk span's start
UTIL = METRIC_INDEX["gpu_utilization_percent"]
ALLOCATED = METRIC_INDEX["gpu_allocated"]
MEMORY = METRIC_INDEX["gpu_memory_used_bytes"]
POWER = METRIC_INDEX["gpu_power_watts"]


def gpu_util(workloads: np.ndarray, gpus: np.ndarray, ticks: np.ndarray) -> np.ndarray:
    """[series, ticks] utilisation of GPU `gpus[i]` of workload `workloads[i]`: deterministic and varied
    (a per-workload phase and a per-GPU offset); both backends are loaded from this one function."""
    phase = (workloads * 37 + gpus * 11)[:, None]
    values: np.ndarray = ((phase + ticks[None, :] * (1 + workloads % 5)[:, None]) % 101).astype(np.float64)
    return values


def namespace_of(workload: int) -> str:
    """20 workloads a namespace, so a project of 1,000 owns 50 namespaces and shares none: the project
    comes from a namespace label by default (DESIGN: pod label, else namespace label, else name). The
    Prometheus store narrows a project query to its namespaces; were every project spread over every
    namespace (this bench's layout before), Prometheus would read 4x the GPU series it needs."""
    return f"ns-{workload // 20}"


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
            "namespace": namespace_of(w),
            "workload": f"job-{w}",
            "workload_uid": f"uid-{w}",
            "project": f"p{project}",
        }
        workload_id = store.register_series("workload", f"uid-{w}", base)
        pod_id = store.register_series(
            "pod", f"pod-uid-{w}", {**base, "pod": f"job-{w}-0", "node": f"node-{w}"}
        )
        per_gpu = gpu_util(np.full(gpus, w), np.arange(gpus), steps)
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
                add(gpu_id, _columns(per_gpu[g], 1.0))
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
                namespace_of(w),
                f"job-{w}",
                f"p{w // per_project}",
                latest,
                WorkloadFigures(
                    uid=f"uid-{w}",
                    namespace=namespace_of(w),
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


def _shape(workloads: int, gpus: int, ticks: int, projects: int, gpu_series: int) -> dict[str, int]:
    """What a bench database holds (T0 is fixed): part 2 reuses part 1's database when these match."""
    return {"workloads": workloads, "gpus": gpus, "ticks": ticks, "projects": projects, "gpu_series": gpu_series,
            "t0": T0}


def _marker(database: Path) -> Path:
    return database.with_name(database.name + ".shape.json")


def _built_with(database: Path, shape: dict[str, int]) -> bool:
    marker = _marker(database)
    return database.exists() and marker.exists() and json.loads(marker.read_text()) == shape


def _remove_database(database: Path) -> None:
    """An earlier run's database and its marker (load_history writes into an empty store only)."""
    for path in [*database.parent.glob(database.name + "*")]:
        path.unlink()


def part_one(args: argparse.Namespace, workdir: Path) -> None:
    ticks = int(args.hours * 3600 // STEP)
    t0 = T0
    gpu_series = min(args.gpu_series_workloads, args.workloads)
    print(
        f"part 1: {args.workloads} workloads x {args.gpus} GPUs, {args.hours} h of {STEP} s data ({ticks} points/series); "
        f"per-GPU series for {gpu_series} workloads ({gpu_series * args.gpus} series, "
        f"{gpu_series * args.gpus * ticks / 1e6:.0f} M points)"
    )
    shape = _shape(args.workloads, args.gpus, ticks, args.projects, gpu_series)
    reuse = args.reuse and _built_with(workdir / "full.db", shape)
    if not reuse:
        _remove_database(workdir / "full.db")
    store = EmbeddedStore(workdir / "full.db")
    started = time.monotonic()
    if reuse:
        print("  reusing the database already in --workdir")
    else:
        load_embedded(store, args.workloads, args.gpus, ticks, t0, args.projects, gpu_series)
        _marker(workdir / "full.db").write_text(json.dumps(shape))
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
                    f"/api/v1/namespaces/{namespace_of(w)}/workloads/job-{w}/metrics",
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


def _ones(count: int) -> Callable[[np.ndarray], np.ndarray]:
    """Values of `count` info series (always 1) at the given ticks."""
    return lambda ticks: np.ones((count, len(ticks)))


def prometheus_blocks(workloads: int, gpus: int, projects: int, series_per_request: int = 1000) -> list[SeriesBlock]:
    """Part 1's data as Prometheus would have scraped it, labelled as the Prometheus store's PromQL reads it
    (gpuwm.store.promql): the agent's gpuwm_gpu_utilization_percent of every GPU and the controller's
    gpuwm_workload_pod_info of every workload, about `series_per_request` series per block."""
    per_project = math.ceil(workloads / projects)
    blocks: list[SeriesBlock] = []
    per_block = max(1, series_per_request // gpus)
    for first in range(0, workloads, per_block):
        members = np.repeat(np.arange(first, min(workloads, first + per_block)), gpus)
        devices = np.tile(np.arange(gpus), len(members) // gpus)
        labels = [
            encode_labels(
                {
                    "__name__": "gpuwm_gpu_utilization_percent",
                    "container": "main",
                    "gpu": str(g),
                    "model": "H100",
                    "namespace": namespace_of(w),
                    "node": f"node-{w}",
                    "pod": f"job-{w}-0",
                    "uuid": f"GPU-{w}-{g}",
                }
            )
            for w, g in zip(members.tolist(), devices.tolist(), strict=True)
        ]
        blocks.append(SeriesBlock(labels, functools.partial(gpu_util, members, devices)))
    for first in range(0, workloads, series_per_request):
        members_list = range(first, min(workloads, first + series_per_request))
        labels = [
            encode_labels(
                {
                    "__name__": "gpuwm_workload_pod_info",
                    "namespace": namespace_of(w),
                    "node": f"node-{w}",
                    "pod": f"job-{w}-0",
                    "project": f"p{w // per_project}",
                    "workload": f"job-{w}",
                    "workload_uid": f"uid-{w}",
                }
            )
            for w in members_list
        ]
        blocks.append(SeriesBlock(labels, _ones(len(labels))))
    return blocks


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
    from gpuwm.controller.state.gctuning import tune_garbage_collector

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


def _complete_span_bytes(store: EmbeddedStore, start: int, end: int) -> dict[int, tuple[int, int, int, int]]:
    """Per tier: (chunks, bytes as named by the chunks, bytes stored once, seconds) of the chunk spans that
    lie wholly inside [start, end), the last KEEP of them: whole chunks as the store wrote them when
    their span ended, each distinct payload counted once (the last coarse span, still in pieces, and the
    edges are left out). The last KEEP, as a store holds them: finished workloads' series are written
    for the engine's 7-day retention, so a tier's first days hold fewer series than its later ones."""
    result: dict[int, tuple[int, int, int, int]] = {}
    for span in store.spans:
        last = end // span.span_seconds * span.span_seconds
        kept = -(-int(span.tier.keep_seconds) // span.span_seconds) * span.span_seconds
        first = max(-(-start // span.span_seconds) * span.span_seconds, last - kept)
        if last <= first:
            continue
        # a chunk names one payload per part it has (schema 4; a schema-3 chunk its whole bytes)
        named_parts = f"SELECT payload FROM ({PART_ROWS}) WHERE tier = ? AND start >= ? AND start < ?"
        where = (span.step, first, last)
        (chunks,) = store._writer.execute(
            "SELECT count(*) FROM chunks WHERE tier = ? AND start >= ? AND start < ?", (span.step, first, last)
        ).fetchone()
        named, stored = store._writer.execute(
            f"SELECT coalesce(sum(length(p.data)), 0), "
            f"coalesce((SELECT sum(length(data)) FROM payloads WHERE id IN (SELECT payload FROM ({named_parts}))), 0) "
            f"FROM ({named_parts}) n JOIN payloads p ON p.id = n.payload",
            where * 2,
        ).fetchone()
        result[span.step] = (int(chunks), int(named), int(stored), last - first)
    return result


def _project(
    rollups: list[str],
    measured: dict[int, tuple[int, int, int, int]],
    gpus: int,
    payload_page_ratio: float,
    index_bytes_per_chunk: float,
    head_per_gpu: float,
    fixed_per_gpu: float,
) -> str:
    """One projection line: each tier's bytes per GPU-second (pages: payload bytes x the payloads table's
    page overhead, plus each chunk's index rows) times its KEEP, plus the head and the fixed tables."""
    parts = []
    steady = 0.0
    for tier in parse_tiers(rollups):
        if tier.step_seconds not in measured:
            return f"  projection at {','.join(rollups)}: tier {tier.step_seconds} s not measured in this run"
        chunks, _, stored, seconds = measured[tier.step_seconds]
        per_gpu_second = (stored * payload_page_ratio + chunks * index_bytes_per_chunk) / gpus / seconds
        steady += per_gpu_second * tier.keep_seconds
        parts.append(f"{tier.step_seconds} s {per_gpu_second * tier.keep_seconds / 2**20:.3f}")
    total = steady + head_per_gpu + fixed_per_gpu
    return (
        f"  projection at {','.join(rollups)} per GPU: chunks {steady / 2**20:.3f} MiB ({' + '.join(parts)}) "
        f"+ head {head_per_gpu / 2**20:.3f} MiB + series and latest figures {fixed_per_gpu / 2**20:.3f} MiB "
        f"= {total / 2**20:.3f} MiB = {total * 1000 / 2**30:.2f} GiB per 1,000 GPUs per 30 days (target <= 1)"
    )


def size_projection(args: argparse.Namespace, workdir: Path) -> None:
    """Bytes on disk per GPU for each tier from `--size-hours` of simulated data, projected to roll-ups.

    Nothing is dropped during the run (retention off), so every chunk span that ends inside it is
    measured as the store wrote it; the run starts on a span of the coarsest tier, so a run of one
    such span (5 min: 20 h; 1 h: 10 days) measures every tier at steady state.
    """
    from gpuwm.controller.state.gctuning import tune_garbage_collector

    tune_garbage_collector()
    path = workdir / "size.db"
    rollups = list(args.size_rollups)
    store = EmbeddedStore(path, tiers=rollups)
    store._chunks.apply_retention = lambda latest: None  # type: ignore[method-assign]  # measure every span
    count = int(args.size_hours * 3600 // STEP)
    # aligned to the coarsest tier's chunk span, so a run of n such spans holds n whole ones
    coarsest_span = store.spans[-1].span_seconds
    start = 1_790_000_000 - 1_790_000_000 % coarsest_span
    gpus = 0
    began = time.monotonic()

    def page_bytes() -> dict[str, int]:
        """Bytes of pages per table and index, as SQLite's dbstat counts them (free pages excluded)."""
        rows = store._writer.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        return {name: int(total) for name, total in rows}

    half: dict[str, int] = {}
    for index, (t, samples, workloads, projects, cluster, stats) in enumerate(
        _simulated_intervals(args.size_nodes, start, count, 0)
    ):
        store.record(t, samples, workloads, projects, cluster, stats)
        gpus = len({sample.parent_uuid or sample.uuid for sample in samples})
        if index == count // 2:
            half = page_bytes()  # how fast the series and latest-figures tables grow: second half of the run
    before = page_bytes()
    head_bytes = sum(v for k, v in before.items() if k == "head" or k.startswith("sqlite_autoindex_head"))
    store.compact(everything=True)
    pages = page_bytes()
    seconds = count * STEP
    measured = _complete_span_bytes(store, start, start + seconds)
    chunk_rows, payload_rows, payload_bytes = store._writer.execute(
        "SELECT (SELECT count(*) FROM chunks), count(*), coalesce(sum(length(data)), 0) FROM payloads"
    ).fetchone()
    series = len(store._series_ids)
    store.close()
    size = file_bytes(path)
    payload_pages = pages.get("payloads", 0)
    index_pages = sum(pages.get(name, 0) for name in ("chunks", "payloads_by_hash", "payloads_unreferenced"))

    def series_and_latest(measured_pages: dict[str, int]) -> tuple[int, int]:
        series = sum(v for k, v in measured_pages.items() if k.startswith(("series", "sqlite_autoindex_series")))
        latest = sum(v for k, v in measured_pages.items() if k.startswith("latest"))
        return series, latest

    series_pages, latest_pages = series_and_latest(pages)
    half_series, half_latest = series_and_latest(half)
    chunk_names = ("chunks", "payloads", "head", "sqlite_autoindex_chunks", "sqlite_autoindex_head", "series")
    other_pages = sum(v for k, v in pages.items() if not k.startswith((*chunk_names, "latest", "sqlite_autoindex_series")))
    print(
        f"size: {args.size_nodes} nodes, {gpus} physical GPUs, {series} series, {args.size_hours:g} h simulated through "
        f"record() in {time.monotonic() - began:.0f} s (retention off); compacted file {size / 2**20:.1f} MiB: "
        f"payload pages {payload_pages / 2**20:.1f} MiB ({payload_rows} payloads, {payload_bytes / 2**20:.1f} MiB), "
        f"chunk rows and indexes {index_pages / 2**20:.1f} MiB ({chunk_rows} chunks), "
        f"series {series_pages / 2**20:.1f} MiB ({half_series / 2**20:.1f} half-way), latest figures "
        f"{latest_pages / 2**20:.1f} MiB ({half_latest / 2**20:.1f} half-way), meta {other_pages / 2**20:.1f} MiB; "
        f"head before the final compaction {head_bytes / 2**20:.1f} MiB"
    )
    payload_page_ratio = payload_pages / max(1, payload_bytes)
    index_bytes_per_chunk = index_pages / max(1, chunk_rows)
    for tier, (chunks, named, stored, covered) in sorted(measured.items()):
        per_gpu_day = (stored * payload_page_ratio + chunks * index_bytes_per_chunk) / gpus / covered * 86400
        print(
            f"  tier {tier:>4} s: {covered / 3600:g} h of whole spans, {chunks} chunks, {named / 2**20:.2f} MiB "
            f"named, {stored / 2**20:.2f} MiB stored once ({100 * (1 - stored / max(1, named)):.0f} % shared) "
            f"= {per_gpu_day / 1024:.1f} KiB of pages per GPU per day"
        )
    # the head at steady state: at most about 1.25 chunk spans of intervals (one span, then its compaction)
    head_per_gpu = head_bytes / gpus / (seconds % 3600 or 3600) * 1.25 * 3600
    # series rows stay (at least as long as their chunks: 30 days) and finished workloads' latest figures
    # 7 days: both grow on from the end of a shorter run at the rate of its second half
    second_half = seconds - (count // 2 + 1) * STEP
    series_30d = series_pages + max(0, series_pages - half_series) / second_half * max(0, 30 * 86400 - seconds)
    latest_7d = latest_pages + max(0, latest_pages - half_latest) / second_half * max(0, 7 * 86400 - seconds)
    fixed_per_gpu = (series_30d + latest_7d + other_pages) / gpus
    print(
        f"  series tables after 30 days {series_30d / gpus / 1024:.1f} KiB per GPU, latest figures after 7 days "
        f"{latest_7d / gpus / 1024:.1f} KiB per GPU (extrapolated from the second half of the run)"
    )
    print(
        f"  page overhead: payloads {payload_page_ratio:.3f} x their bytes, {index_bytes_per_chunk:.1f} bytes of "
        f"chunk rows and indexes per chunk"
    )
    for projected in [rollups, *args.size_also]:
        print(
            _project(
                projected, measured, gpus, payload_page_ratio, index_bytes_per_chunk, head_per_gpu, fixed_per_gpu
            ),
            flush=True,
        )


def _difference(a: list[Series], b: list[Series]) -> float:
    """Largest absolute difference between two single-series answers (inf where grids or gaps differ)."""
    if len(a) != 1 or len(b) != 1 or len(a[0].points) != len(b[0].points):
        return math.inf
    worst = 0.0
    for (ta, va), (tb, vb) in zip(a[0].points, b[0].points, strict=True):
        if ta != tb or (va is None) != (vb is None):
            return math.inf
        if va is not None and vb is not None:
            worst = max(worst, abs(va - vb))
    return worst


def _prometheus_loaded(base: str, workloads: int, gpus: int, ticks: int, end: int) -> None:
    """Count what Prometheus answers for: every series and sample written must be queryable."""
    window = f"{ticks * STEP}s"
    for metric, series in (("gpuwm_gpu_utilization_percent", workloads * gpus), ("gpuwm_workload_pod_info", workloads)):
        started = time.monotonic()
        found = instant_value(base, f"count({metric})", end) or 0.0
        points = instant_value(base, f"sum(count_over_time({metric}[{window}]))", end) or 0.0
        print(
            f"  prometheus holds {found:.0f} {metric} series, {points / 1e6:.2f} M samples "
            f"(expected {series}, {series * ticks / 1e6:.2f} M; counted in {time.monotonic() - started:.0f} s)",
            flush=True,
        )
        if found != series or points != series * ticks:
            raise RuntimeError(
                f"Prometheus holds {found:.0f} series / {points:.0f} samples of {metric}, expected {series} / "
                f"{series * ticks}: the load was incomplete (see prometheus.log in --workdir)"
            )


def part_two(args: argparse.Namespace, workdir: Path) -> None:
    """Both backends over the same data, the same two queries, in one run; Prometheus loaded by remote write."""
    from tests.integration.store.prometheus_fixture import PROMETHEUS, running_prometheus

    from gpuwm.store.prometheus import PrometheusStore

    if PROMETHEUS is None:
        print("part 2 skipped: prometheus not installed (apt-get install prometheus)")
        return
    if importlib.util.find_spec("cramjam") is None:
        print("part 2 skipped: cramjam (snappy) not installed (pip install -e .[bench])")
        return
    workloads = args.prom_workloads or args.workloads
    hours = args.prom_hours or args.hours
    projects = args.prom_projects or (args.projects if workloads == args.workloads else 1)
    ticks = int(hours * 3600 // STEP)
    end = T0 + STEP * (ticks - 1)
    per_project = math.ceil(workloads / projects)
    print(
        f"part 2: {workloads} workloads x {args.gpus} GPUs in {projects} project(s) of {per_project}, {hours:g} h of "
        f"{STEP} s data ({ticks} points/series), in both backends"
    )
    shape = _shape(workloads, args.gpus, ticks, projects, workloads)
    database = workdir / "full.db"
    if _built_with(database, shape):
        print("  embedded: part 1's database (the same data)")
    else:
        database = workdir / "same.db"
        if args.reuse and _built_with(database, shape):
            print("  embedded: reusing same.db from an earlier run")
        else:
            _remove_database(database)
            started = time.monotonic()
            building = EmbeddedStore(database)
            try:
                load_embedded(building, workloads, args.gpus, ticks, T0, projects, workloads)
            finally:
                building.close()
            _marker(database).write_text(json.dumps(shape))
            print(f"  embedded built in {time.monotonic() - started:.0f} s")
    store = EmbeddedStore(database)
    tsdb = workdir / "prom-tsdb"
    loaded = tsdb.with_name("prom-tsdb.shape.json")
    reuse = args.reuse and loaded.exists() and json.loads(loaded.read_text()) == shape
    if not reuse:
        shutil.rmtree(tsdb, ignore_errors=True)
        loaded.unlink(missing_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    with running_prometheus(
        tsdb, workdir, remote_write=True, query_timeout="3h", max_samples=4_000_000_000, processes=processes
    ) as base:
        pid = processes[0].pid
        if reuse:
            print("  prometheus: reusing the TSDB loaded by an earlier run")
        else:
            blocks = prometheus_blocks(workloads, args.gpus, projects)
            done = remote_write(f"{base}/api/v1/write", blocks, ticks, T0, STEP, in_flight=args.prom_in_flight)
            resident, peak = process_memory(pid)
            print(
                f"  prometheus loaded by remote write: {done.samples / 1e6:.1f} M samples in {done.requests} requests, "
                f"{done.seconds:.0f} s ({done.samples / done.seconds / 1e6:.2f} M samples/s; protobuf "
                f"{done.raw_bytes / 2**30:.2f} GiB, snappy {done.compressed_bytes / 2**30:.2f} GiB); "
                f"RSS {resident / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB",
                flush=True,
            )
        _prometheus_loaded(base, workloads, args.gpus, ticks, end)
        started = time.monotonic()
        metrics = wait_settled(base)
        loaded.write_text(json.dumps(shape))
        resident, peak = process_memory(pid)
        print(
            f"  prometheus at rest after {time.monotonic() - started:.0f} s: {metrics.get('prometheus_tsdb_blocks_loaded', 0):.0f} "
            f"blocks + head of {metrics.get('prometheus_tsdb_head_series', 0):.0f} series, "
            f"{metrics.get('prometheus_tsdb_compactions_total', 0):.0f} compactions; RSS {resident / 2**30:.2f} GiB",
            flush=True,
        )
        prometheus = PrometheusStore(base, timeout_seconds=3 * 3600)
        metric = ("gpu_utilization_percent",)
        rng = random.Random(7)
        picks = [rng.randrange(workloads) for _ in range(args.queries + 10)]

        def workload(backend: Store, index: int) -> list[Series]:
            series = backend.query_range(RangeQuery("workload", f"uid-{picks[index]}", metric, T0, end, STEP))
            assert series and series[0].points[len(series[0].points) // 2][1] is not None, "no data"
            return series

        def project(backend: Store) -> list[Series]:
            series = backend.query_range(RangeQuery("project", "p0", metric, T0, end, STEP))
            assert series and series[0].points[len(series[0].points) // 2][1] is not None, "no data"
            return series

        figures = {
            "embedded": (
                measure(lambda index: workload(store, index), args.queries),
                measure(lambda index: project(store), args.queries),
            )
        }
        print(f"  embedded measured ({args.queries} workload and {args.queries} project queries)", flush=True)
        prometheus_workload = measure(lambda index: workload(prometheus, index), args.queries)
        print(f"  prometheus: {args.queries} workload queries measured", flush=True)
        started = time.monotonic()
        prometheus_answer = project(prometheus)  # the warm-up, kept for the identity check
        print(f"  prometheus: first project query {time.monotonic() - started:.1f} s", flush=True)
        figures["prometheus"] = (
            prometheus_workload,
            measure(lambda index: project(prometheus), args.prom_project_queries, warmup=0),
        )
        resident, peak = process_memory(pid)
        checked = min(args.queries, 20)
        workload_differences = [_difference(workload(store, i), workload(prometheus, i)) for i in range(checked)]
        project_difference = _difference(project(store), prometheus_answer)
    store.close()
    same = sum(1 for difference in workload_differences if difference < 1e-6)
    print(
        f"  answers identical (within 1e-6): workload {same}/{checked} (largest difference "
        f"{max(workload_differences):.2g}); project p0 {project_difference < 1e-6} (largest difference "
        f"{project_difference:.2g})"
    )
    print(f"  prometheus RSS after the queries {resident / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB")
    counts = {"workload": (args.queries, args.queries), "project": (args.queries, args.prom_project_queries)}
    for number, query in enumerate(("workload", "project")):
        e50, e99 = figures["embedded"][number]
        p50, p99 = figures["prometheus"][number]
        print(
            f"  {query:8s} {hours:g} h@15s: embedded p50 {e50:8.1f} ms p99 {e99:8.1f} ms ({counts[query][0]} queries) | "
            f"prometheus p50 {p50:9.1f} ms p99 {p99:9.1f} ms ({counts[query][1]} queries) | "
            f"prometheus/embedded p50 {p50 / e50:7.1f}x p99 {p99 / e99:7.1f}x"
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
    parser.add_argument(
        "--prom-workloads", type=int, default=None, help="part 2's workloads (default: --workloads, part 1's data)"
    )
    parser.add_argument("--prom-hours", type=float, default=None, help="part 2's hours (default: --hours)")
    parser.add_argument(
        "--prom-projects",
        type=int,
        default=None,
        help="part 2's projects (default: --projects when part 2 has part 1's workloads, else 1)",
    )
    parser.add_argument(
        "--prom-project-queries", type=int, default=5, help="timed project queries on Prometheus (each takes minutes)"
    )
    parser.add_argument("--prom-in-flight", type=int, default=4, help="remote-write requests in flight")
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
    parser.add_argument(
        "--size-also",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        action="append",
        default=[],
        help="more roll-ups to project from the same run (their steps must be among --size-rollups')",
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
