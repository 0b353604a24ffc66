"""The engine's intake of one pull at controller size: the vectorised path against the row-by-row one.

`Engine.observe_samples` takes a chunk of rows at once (`gpuwm.accounting.batch`) where each row only
extends its device's history, else row by row as `observe_sample` takes samples. Two engines with the same
pods (1,000 nodes x 8 GPUs, two GPUs a workload) are fed the same pulls, alternately, in one process: one
with the vectorised path, one without. Prints the CPU seconds a 15 s pull takes each way (the first two
pulls left out) and whether the two engines' reports are the same.

    .venv/bin/python bench/intake.py               # unmerged polls: 15 rows a device (snapshotMerge: 0)
    .venv/bin/python bench/intake.py --merged      # one merged row a device, as the controller asks by default
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import numpy

from gpuwm.accounting import Engine, EngineConfig, SampleBatch
from gpuwm.accounting import core as core_module
from gpuwm.model import GpuSample, PodEvent


def _engine(uuids: list[str], nodes: list[str]) -> Engine:
    engine = Engine(EngineConfig(interval_seconds=1.0))
    for index in range(len(uuids) // 2):
        engine.observe(PodEvent.model_validate({
            "t": 0.0, "event": "pod", "namespace": "ns", "name": f"p{index}", "uid": f"p{index}", "phase": "Running",
            "node": nodes[2 * index], "labels": {},
            "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": f"w{index}", "uid": f"w{index}"},
            "devices": [{"uuid": uuids[2 * index], "units": 1.0}, {"uuid": uuids[2 * index + 1], "units": 1.0}],
        }))
    return engine


def _pull(rng: numpy.random.Generator, uuids: list[str], nodes: list[str], start: float, merged: bool) -> SampleBatch:
    """One 15 s pull of every device: SM 60 +- 10 %, as numpy columns (what the controller's intake hands over)."""
    steps = [start + 15.0] if merged else [start + second for second in range(1, 16)]
    count = len(uuids)
    device = numpy.tile(numpy.arange(count), len(steps))
    t = numpy.repeat(numpy.array(steps, dtype=numpy.float64), count)
    sm = numpy.clip(numpy.rint(60.0 + rng.uniform(-10.0, 10.0, len(t))), 0.0, 100.0)

    def sample(row: int) -> GpuSample:
        return GpuSample(t=float(t[row]), node=nodes[device[row]], uuid=uuids[device[row]], sm_percent=float(sm[row]))

    return SampleBatch(
        uuids=uuids, nodes=nodes, parent_uuids=[None] * count, device_units=[1.0] * count, device=device, t=t, sm=sm,
        memory=numpy.full(len(t), 50.0), energy=t * 300.0, pod_sm=[None] * len(t), sample=sample,
        merged=numpy.full(len(t), 14.0) if merged else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pulls", type=int, default=8)
    parser.add_argument("--merged", action="store_true", help="one merged row a device and pull")
    arguments = parser.parse_args()
    uuids = [f"GPU-{node}-{gpu}" for node in range(arguments.nodes) for gpu in range(arguments.gpus_per_node)]
    nodes = [f"node-{node}" for node in range(arguments.nodes) for _ in range(arguments.gpus_per_node)]
    engines = {"vectorised": _engine(uuids, nodes), "row by row": _engine(uuids, nodes)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    vectorised: Any = core_module.BatchArrays
    rng = numpy.random.default_rng(7)
    for index in range(arguments.pulls):
        pull = _pull(rng, uuids, nodes, 15.0 * index, arguments.merged)
        for name in list(engines) if index % 2 else list(engines)[::-1]:
            core_module.BatchArrays = vectorised if name == "vectorised" else (lambda *_: None)  # type: ignore[misc,assignment]
            gc.collect()
            started = time.process_time()
            engines[name].observe_samples(pull)
            seconds[name].append(time.process_time() - started)
    core_module.BatchArrays = vectorised  # type: ignore[misc]
    rows = len(uuids) * (1 if arguments.merged else 15)
    print(f"{len(uuids)} GPUs, {rows} rows a pull ({'merged' if arguments.merged else 'unmerged 1 Hz'} polls)")
    for name, values in seconds.items():
        steady = values[2:]
        print(f"{name:>10}: CPU-s a pull min {min(steady):.3f}, median {sorted(steady)[len(steady) // 2]:.3f}, "
              f"max {max(steady):.3f}")
    now = 15.0 * arguments.pulls
    print("the same reports:", engines["vectorised"].report(now) == engines["row by row"].report(now))


if __name__ == "__main__":
    main()
