"""How many GPU samples a second the accounting engine absorbs on one core.

8,000 GPUs held by 4,000 workloads (two GPUs each), sampled once a second; each second's
samples are built before its clock starts, so this measures the engine alone (what the
controller's pull loop feeds it), including its periodic maintenance. Target: >= 100,000 samples/s (a 1,000-node cluster at 1 Hz is 8,000).

    python bench/engine.py [--gpus 8000] [--workloads 4000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import time

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.model import GpuSample, PodEvent


def build_pods(gpus: int, workloads: int) -> list[PodEvent]:
    pods = []
    per_workload = max(1, gpus // workloads)
    for index in range(workloads):
        devices = [{"uuid": f"GPU-{index * per_workload + k}", "units": 1.0} for k in range(per_workload)]
        pods.append(
            PodEvent.model_validate(
                {
                    "t": 0.0,
                    "event": "pod",
                    "namespace": f"ns-{index % 50}",
                    "name": f"w{index}-0",
                    "uid": f"pod-{index}",
                    "phase": "Running",
                    "node": f"node-{index * per_workload // 8}",
                    "labels": {},
                    "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": f"w{index}", "uid": f"wl-{index}"},
                    "devices": devices,
                }
            )
        )
    return pods


def build_second(rng: random.Random, t: int, gpus: int, workloads: int, processes: bool) -> list[GpuSample]:
    """One poll of every GPU at time t."""
    per_workload = max(1, gpus // workloads)
    samples = []
    for gpu in range(gpus):
        sm = rng.choice((0.0, 0.0, 35.0, 80.0, 97.0))
        fields = {
            "t": float(t),
            "node": f"node-{gpu // 8}",
            "uuid": f"GPU-{gpu}",
            "sm_percent": sm,
            "memory_used_bytes": 4.0e10,
            "memory_total_bytes": 8.0e10,
            "power_watts": 300.0,
            "energy_joules": 300.0 * t,
        }
        if processes:
            fields["processes"] = [{"pid": 100 + gpu, "pod_uid": f"pod-{gpu // per_workload}", "sm_percent": sm}]
        samples.append(GpuSample.model_validate(fields))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8000)
    parser.add_argument("--workloads", type=int, default=4000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--processes", action="store_true", help="samples carry per-process utilisation")
    arguments = parser.parse_args()
    rng = random.Random(7)
    engine = Engine(EngineConfig())
    for event in build_pods(arguments.gpus, arguments.workloads):
        engine.observe(event)
    elapsed_cpu = elapsed = 0.0
    count = 0
    for t in range(1, arguments.seconds + 1):
        samples = build_second(rng, t, arguments.gpus, arguments.workloads, arguments.processes)
        gc.collect()
        started_cpu = time.process_time()
        started = time.perf_counter()
        for item in samples:  # includes the engine's periodic maintenance (every 30 s of input)
            engine.observe_sample(item)
        elapsed_cpu += time.process_time() - started_cpu
        elapsed += time.perf_counter() - started
        count += len(samples)
    samples_seen = count
    report_started = time.process_time()
    workloads, projects, _cluster = engine.report()
    report_cpu = time.process_time() - report_started
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    samples = range(samples_seen)
    print(f"machine: {os.cpu_count()} cores; engine on one core (single thread)")
    print(f"gpus={arguments.gpus} workloads={arguments.workloads} seconds={arguments.seconds} "
          f"processes={arguments.processes} samples={len(samples)}")
    print(f"ingest: {len(samples) / elapsed_cpu:,.0f} samples/s CPU ({len(samples) / elapsed:,.0f} wall), "
          f"{elapsed_cpu * 1e6 / len(samples):.2f} us/sample")
    print(f"report of {len(workloads)} workloads and {len(projects)} projects: {report_cpu * 1000:.0f} ms CPU")
    print(f"max RSS (engine plus one second of samples being built): {rss_mib:.0f} MiB")


if __name__ == "__main__":
    main()
