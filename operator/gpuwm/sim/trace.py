"""A simulated run as a replay trace (what `gpuwm replay` reads) and its ground truth as JSON.

Lines are compact JSON with fields in model order, so the same seed writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TextIO

from gpuwm.sim.simulator import Simulator, Step


def step_lines(step: Step) -> Iterator[str]:
    """The trace lines of one step: its samples (they cover the interval ending at t), then its events."""
    for sample in step.samples:
        yield json.dumps({"event": "sample", **sample.model_dump(exclude_none=True)}, separators=(",", ":"))
    for event in step.events:
        yield json.dumps(event.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":"))


def write_trace(simulator: Simulator, until: float, out: TextIO) -> int:
    """Run `simulator` up to `until` and write every step to `out`; returns the number of lines."""
    lines = 0
    for step in simulator.run(until):
        for line in step_lines(step):
            out.write(line + "\n")
            lines += 1
    return lines


def truth_report(simulator: Simulator) -> dict[str, Any]:
    """The generated figures per workload, keyed like `gpuwm replay`'s output (namespace, name, kind)."""
    workloads = []
    for uid, figures in sorted(simulator.truth().items()):
        workload = simulator.workloads[uid]
        workloads.append({
            "namespace": workload.namespace,
            "name": workload.name,
            "kind": workload.owner_kind,
            "simulatedKind": workload.kind,
            "allocatedGpuSeconds": figures.allocated_gpu_seconds,
            "activeGpuSeconds": figures.active_gpu_seconds,
            "idleGpuSeconds": figures.idle_gpu_seconds,
            "unmonitoredGpuSeconds": figures.unmonitored_gpu_seconds,
            "energyJoules": figures.energy_joules,
            "lifetimeUtilization": figures.lifetime_utilization_percent,
            "requestedGpus": figures.requested_gpus,
            "queuedSeconds": figures.queued_seconds,
            "waitSeconds": figures.wait_seconds,
        })
    return {"at": simulator.clock, "seed": simulator.config.seed, "workloads": workloads}
