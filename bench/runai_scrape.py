"""One `/metrics` scrape with `runaiCompatibleMetrics` at controller size, on a real embedded store.

    .venv/bin/python bench/runai_scrape.py [--workloads 4000] [--intervals 4] [--scrapes 5]

Records `--intervals` status intervals of `--workloads` running one-pod, one-GPU workloads (with their
pods' kubelet figures) and times GET /metrics through the HTTP app (ASGI, no socket), and the Run:ai
host-use families alone (runai_job_cpu_usage and runai_job_memory_used_bytes: the latest host figures of
every running workload), wall and CPU, median of `--scrapes`; each twice, on the same store: with the plain
`Store.latest_by_workload` (a range query per workload, the base class's way) and with the store's one read.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gpuwm.api.app import create_app  # noqa: E402
from gpuwm.api.runai_metrics import RunaiOptions, runai_metrics  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.model import GpuSample, PodStatsSample  # noqa: E402
from gpuwm.model.figures import ClusterFigures, GpuFigures, PodFigures, ProjectFigures, WorkloadFigures  # noqa: E402
from gpuwm.store.base import Store  # noqa: E402
from gpuwm.store.embedded import EmbeddedStore  # noqa: E402

GIB = 1024.0**3


def figures(index: int, t: float) -> tuple[WorkloadFigures, GpuSample, PodStatsSample]:
    node, gpu = f"node-{index // 8}", index % 8
    uuid, pod, namespace = f"GPU-{index:06d}", f"job-{index}-worker-0", f"team-{index % 40}"
    workload = WorkloadFigures(
        uid=f"uid-{index}", namespace=namespace, name=f"job-{index}", kind="PyTorchJob",
        api_version="kubeflow.org/v1", project=f"p{index % 4}", phase="Running", allocated_gpus=1.0,
        created_time=0.0, start_time=0.0, nodes=[node],
        pods=[PodFigures(name=pod, uid=f"pod-{index}", node=node, phase="Running", allocated_gpus=1.0)],
        gpus=[GpuFigures(node=node, uuid=uuid, index=gpu, units=1.0, utilization_percent=50.0, sm_percent=50.0,
                         pod=pod, pod_uid=f"pod-{index}", namespace=namespace, workload=f"job-{index}",
                         workload_uid=f"uid-{index}", memory_used_bytes=10 * GIB, memory_total_bytes=80 * GIB)],
    )
    sample = GpuSample(t=t, node=node, uuid=uuid, index=gpu, model="NVIDIA H100", sm_percent=50.0,
                       memory_used_bytes=10 * GIB, memory_total_bytes=80 * GIB, power_watts=300.0)
    stats = PodStatsSample(t=t, node=node, namespace=namespace, pod=pod, pod_uid=f"pod-{index}",
                           cpu_usage_cores=1.0 + index % 7, memory_used_bytes=1e9 + index)
    return workload, sample, stats


def build(path: Path, workloads: int, intervals: int) -> EmbeddedStore:
    store = EmbeddedStore(path)
    for k in range(intervals):
        t = 1_800_000_000.0 + 15.0 * k
        rows = [figures(index, t) for index in range(workloads)]
        running = [row[0] for row in rows]
        projects = [ProjectFigures(name=f"p{p}", workloads=workloads // 4) for p in range(4)]
        store.record(t, [row[1] for row in rows], running, projects,
                     ClusterFigures(gpus=workloads, workloads=workloads), [row[2] for row in rows])
    return store


def timed(call: object, scrapes: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(scrapes):
        wall, cpu = time.perf_counter(), time.process_time()
        call()  # type: ignore[operator]
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=4000)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        store = build(Path(workdir) / "bench.db", args.workloads, args.intervals)
        print(f"{args.workloads} running workloads, {args.intervals} intervals recorded in "
              f"{time.perf_counter() - started:.1f} s")
        options = RunaiOptions(cluster_id="c-1", status_interval_seconds=15.0)
        workloads, projects = store.workloads(), store.projects()

        def host_families() -> None:
            families = {family.name: family for family in runai_metrics(store, options, workloads, projects)}
            assert len(families["runai_job_cpu_usage"].samples) == args.workloads

        app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1",
                                         status_interval=15.0))

        async def scrape() -> None:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
                response = await http.get("/metrics")
                assert response.status_code == 200 and "runai_job_cpu_usage{" in response.text

        for way in ("plain (a query per workload)", "one read"):
            if way.startswith("plain"):
                store.latest_by_workload = functools.partial(Store.latest_by_workload, store)  # type: ignore[method-assign]
            else:
                del store.latest_by_workload
            wall, cpu = timed(host_families, args.scrapes)
            print(f"{way}: runai_metrics (every Run:ai family): {wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU")
            wall, cpu = timed(lambda: asyncio.run(scrape()), args.scrapes)
            print(f"{way}: GET /metrics: {wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU (threads included)")
        store.close()


if __name__ == "__main__":
    main()
