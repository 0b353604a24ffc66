"""Metrics API latency: the embedded store at full size, and embedded vs a real Prometheus on the same data.

    .venv/bin/python bench/api.py [--workloads 4000] [--gpus 8] [--hours 24] [--queries 200]
                                  [--prom-workloads 1000] [--prom-hours 2] [--skip-prometheus]

Part 1 (full size): 4,000 workloads x 8 GPUs, 24 h of 15 s data in the embedded store: the
workload, pod and project series of every workload (what a workload or project query reads),
plus per-GPU series for `--gpu-series-workloads` of them. All 4,000 x 8 per-GPU series would be
184 M rows (~25 GB), which this 2-core machine cannot write in the ~10 minutes allowed; the
per-GPU rows sit in the same table, clustered by series, so they do not change the cost of
the two benchmarked queries beyond one more B-tree level. Measures p50/p99 of a 24 h workload
query at 15 s step and of a 24 h project query (a project of 1,000 workloads), at the store
and through the HTTP API (real uvicorn on loopback).

Part 2 (same data, both backends): `--prom-workloads` workloads x 8 GPUs in one project,
`--prom-hours` of 15 s data, written both into an embedded store (per-GPU, workload and project
rows) and, as the agent's gpuwm_gpu_utilization_percent plus the controller's
gpuwm_workload_pod_info, into a real Prometheus (Debian package, backfilled with promtool).
The same two queries through both `Store` backends; prints the ratio. Asserts nothing.

Targets (issue 5): workload p99 <= 50 ms; project p99 <= 250 ms; no slower than Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gpuwm.api.app import create_app  # noqa: E402
from gpuwm.api.server import ApiServer  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.model.figures import ProjectFigures, WorkloadFigures  # noqa: E402
from gpuwm.store import RangeQuery, Store  # noqa: E402
from gpuwm.store.base import METRIC_INDEX  # noqa: E402
from gpuwm.store.embedded import EmbeddedStore  # noqa: E402

STEP = 15
UTIL = METRIC_INDEX["gpu_utilization_percent"]
ALLOCATED = METRIC_INDEX["gpu_allocated"]
MEMORY = METRIC_INDEX["gpu_memory_used_bytes"]
POWER = METRIC_INDEX["gpu_power_watts"]


def gpu_util(workload: int, gpu: int, tick: int) -> float:
    """Deterministic, varied utilisation: a per-workload phase and a per-GPU offset."""
    return float((workload * 37 + gpu * 11 + tick * (1 + workload % 5)) % 101)


def _row(series_id: int, t: int, util: float, gpus: float) -> tuple[int, int, float, float, float, float]:
    """(series_id, t, utilisation, memory used, power, allocated): the columns the bench fills."""
    return (series_id, t, util, gpus * 40e9, gpus * (100 + 5 * util), gpus)


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
    """Bulk-load rows series by series (append order of the clustered key); the store's own tables and ids."""
    connection = store._writer
    table = store.tiers[0].table
    connection.execute(f"DROP INDEX IF EXISTS {table}_by_time")  # rebuilt once at the end, not per row
    columns = ", ".join(f"m{index}" for index in (UTIL, MEMORY, POWER, ALLOCATED))
    insert = f"INSERT INTO {table} (series_id, t, {columns}) VALUES (?, ?, ?, ?, ?, ?)"
    connection.execute("PRAGMA synchronous = OFF")
    per_project = math.ceil(workloads / projects)
    project_sums = [[0.0] * ticks for _ in range(projects)]
    started = time.monotonic()
    connection.execute("BEGIN")
    for w in range(workloads):
        project = w // per_project
        base = {
            "namespace": f"ns-{w % 200}",
            "workload": f"job-{w}",
            "workload_uid": f"uid-{w}",
            "project": f"p{project}",
        }
        workload_id = store._series_id("workload", f"uid-{w}", base)
        pod_id = store._series_id("pod", f"pod-uid-{w}", {**base, "pod": f"job-{w}-0", "node": f"node-{w}"})
        # the mean over a workload's GPUs depends only on (w * 37 + k * c) % 101: a table instead of 8 calls a point
        by_base = [sum((base + 11 * g) % 101 for g in range(gpus)) / gpus for base in range(101)]
        slope = 1 + w % 5
        means = [by_base[(w * 37 + k * slope) % 101] for k in range(ticks)]
        sums = project_sums[project]
        for k in range(ticks):
            sums[k] += means[k]
        connection.executemany(
            insert, (_row(workload_id, t0 + STEP * k, means[k], gpus) for k in range(ticks))
        )
        if with_pods:
            connection.executemany(
                insert, (_row(pod_id, t0 + STEP * k, means[k], gpus) for k in range(ticks))
            )
        if w < gpu_series_workloads:
            for g in range(gpus):
                gpu_id = store._series_id(
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
                connection.executemany(
                    insert, (_row(gpu_id, t0 + STEP * k, gpu_util(w, g, k), 1.0) for k in range(ticks))
                )
        if w % 500 == 499:
            connection.execute("COMMIT")
            print(f"  loaded {w + 1}/{workloads} workloads ({time.monotonic() - started:.0f} s)", flush=True)
            connection.execute("BEGIN")
    for project in range(projects):
        members = min(per_project, workloads - project * per_project)
        project_id = store._series_id("project", f"p{project}", {"project": f"p{project}"})
        sums = project_sums[project]
        connection.executemany(
            insert,
            (_row(project_id, t0 + STEP * k, sums[k] / members, float(members * gpus)) for k in range(ticks)),
        )
    # latest figures, as record() keeps them, so the HTTP API finds each workload and project
    latest = float(t0 + STEP * (ticks - 1))
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
    store._set_meta("latest_time", latest)
    store._set_meta("earliest_time", float(t0))
    connection.execute("COMMIT")
    connection.execute(f"CREATE INDEX IF NOT EXISTS {table}_by_time ON {table} (t)")
    connection.execute("ANALYZE")
    connection.execute("PRAGMA synchronous = NORMAL")


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
    t0 = 1_790_000_000 - (1_790_000_000 % STEP)
    print(
        f"part 1: {args.workloads} workloads x {args.gpus} GPUs, {args.hours} h of {STEP} s data ({ticks} points/series)"
    )
    print(
        f"  per-GPU series for {args.gpu_series_workloads} workloads ({args.gpu_series_workloads * args.gpus} series); "
        f"the full {args.workloads * args.gpus} would be {args.workloads * args.gpus * ticks / 1e6:.0f} M rows"
    )
    reuse = args.reuse and (workdir / "full.db").exists()
    store = EmbeddedStore(workdir / "full.db")
    started = time.monotonic()
    if reuse:
        print("  reusing the database already in --workdir")
    else:
        load_embedded(store, args.workloads, args.gpus, ticks, t0, args.projects, args.gpu_series_workloads)
    rows = store._writer.execute(f"SELECT count(*) FROM {store.tiers[0].table}").fetchone()[0]
    size_gib = sum(p.stat().st_size for p in workdir.glob("full.db*")) / 2**30
    print(
        f"  built in {time.monotonic() - started:.0f} s: {rows / 1e6:.1f} M rows, {size_gib:.2f} GiB on disk"
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


def writer_cost(args: argparse.Namespace, workdir: Path) -> None:
    """What the controller pays each status interval: record() of every workload's figures and samples."""
    from gpuwm.model import GpuSample
    from gpuwm.model.figures import ClusterFigures, GpuFigures, PodFigures

    per_project = math.ceil(args.workloads / args.projects)
    workloads: list[WorkloadFigures] = []
    samples: list[GpuSample] = []
    for w in range(args.workloads):
        node = f"node-{w}"
        gpus = [
            GpuFigures(
                node=node,
                uuid=f"GPU-{w}-{g}",
                index=g,
                units=1.0,
                utilization_percent=gpu_util(w, g, 0),
                pod=f"job-{w}-0",
                pod_uid=f"pod-uid-{w}",
                namespace=f"ns-{w % 200}",
            )
            for g in range(args.gpus)
        ]
        workloads.append(
            WorkloadFigures(
                uid=f"uid-{w}",
                namespace=f"ns-{w % 200}",
                name=f"job-{w}",
                kind="Job",
                api_version="batch/v1",
                project=f"p{w // per_project}",
                phase="Running",
                allocated_gpus=float(args.gpus),
                gpus=gpus,
                pods=[PodFigures(name=f"job-{w}-0", uid=f"pod-uid-{w}", node=node, phase="Running")],
                nodes=[node],
            )
        )
        samples.extend(
            GpuSample(
                t=0.0,
                node=node,
                uuid=f"GPU-{w}-{g}",
                index=g,
                sm_percent=gpu_util(w, g, 0),
                memory_used_bytes=40e9,
                memory_total_bytes=80e9,
                power_watts=300.0,
                energy_joules=1e6,
                temperature_celsius=50.0,
            )
            for g in range(args.gpus)
        )
    projects = [ProjectFigures(name=f"p{p}") for p in range(args.projects)]
    store = EmbeddedStore(workdir / "writer.db")
    timings = []
    for k in range(4):
        started = time.perf_counter()
        store.record(1_790_000_000.0 + STEP * k, samples, workloads, projects, ClusterFigures())
        timings.append(time.perf_counter() - started)
    store.close()
    print(
        f"writer: record() of {args.workloads} workloads x {args.gpus} GPUs: "
        f"{', '.join(f'{t:.2f}' for t in timings)} s per interval (status interval 15 s)"
    )


def part_two(args: argparse.Namespace, workdir: Path) -> None:
    from tests.integration.store.prometheus_fixture import PROMETHEUS, PROMTOOL, backfill, running_prometheus

    from gpuwm.store.prometheus import PrometheusStore

    if PROMETHEUS is None or PROMTOOL is None:
        print("part 2 skipped: prometheus/promtool not installed (apt-get install prometheus)")
        return
    ticks = int(args.prom_hours * 3600 // STEP)
    now = int(time.time())
    t0 = now - now % STEP - STEP * ticks  # recent: inside Prometheus' retention
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
    parser.add_argument("--gpu-series-workloads", type=int, default=50)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--prom-workloads", type=int, default=1000)
    parser.add_argument("--prom-hours", type=float, default=2.0)
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
        if not args.skip_prometheus:
            part_two(args, directory)
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
