"""An embedded store with days of history for many workloads, loaded through the store's bulk path
(`load_history`: the chunks and roll-ups compaction writes) and closed by one `record`, so the API finds
every workload's latest figures: what makes an all-time report take seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpuwm.model import ClusterFigures, WorkloadFigures
from gpuwm.store import METRIC_INDEX
from gpuwm.store.embedded import EmbeddedStore

STEP_SECONDS = 15
#: a chunk span's start (load_history starts there)
START = 1_790_000_000 - 1_790_000_000 % 86400


def _values(ticks: int, utilization: np.ndarray, units: float) -> np.ndarray:
    """[metrics, ticks]: utilisation, units held, energy counting up; the other metrics missing."""
    values = np.full((len(METRIC_INDEX), ticks), np.nan)
    values[METRIC_INDEX["gpu_utilization_percent"]] = utilization
    values[METRIC_INDEX["gpu_allocated"]] = units
    values[METRIC_INDEX["gpu_energy_joules"]] = np.cumsum(np.full(ticks, 300.0 * STEP_SECONDS * units))
    return values


def _figures(index: int, gpus: int) -> WorkloadFigures:
    return WorkloadFigures(
        uid=f"uid-{index}", namespace=f"ns-{index % 10}", name=f"job-{index}", kind="Job", api_version="batch/v1",
        project=f"p{index % 4}", phase="Running", allocated_gpus=float(gpus), created_time=float(START),
        start_time=float(START),
    )


def build_history_store(path: Path, workloads: int, gpus: int, days: float) -> tuple[float, float]:
    """`workloads` jobs of `gpus` GPUs each, running for `days`; returns the store's (earliest, latest) time."""
    store = EmbeddedStore(path)
    ticks = int(days * 86400 / STEP_SECONDS)
    steps = np.arange(ticks)
    try:
        for index in range(workloads):
            labels = {"namespace": f"ns-{index % 10}", "workload": f"job-{index}", "workload_uid": f"uid-{index}",
                      "project": f"p{index % 4}"}
            ids = [store.register_series("workload", f"uid-{index}", labels)]
            rows = [_values(ticks, (steps * (1 + index % 5) + index) % 101.0, float(gpus))]
            for gpu in range(gpus):
                ids.append(store.register_series("gpu", f"GPU-{index}-{gpu}|pod-uid-{index}", {
                    **labels, "gpu": str(gpu), "uuid": f"GPU-{index}-{gpu}", "pod": f"job-{index}-0",
                    "node": f"node-{index % 8}"}))
                rows.append(_values(ticks, (steps * (gpu + 1) + 7 * index) % 101.0, 1.0))
            store.load_history(ids, START, np.stack(rows))
        latest = float(START + STEP_SECONDS * ticks)
        figures = [_figures(index, gpus) for index in range(workloads)]
        store.record(latest, [], figures, [], ClusterFigures(workloads=workloads))
    finally:
        store.close()
    return float(START), latest
