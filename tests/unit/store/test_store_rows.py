"""rows.py (numpy over (series, part) pairs) against the part-by-part reference it replaced: identical rows."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.sim.simulator import SimConfig, Simulator
from gpuwm.store.rows import RowBuilder

from .reference_rows import build_rows as reference_rows
from .store_data import cluster, project, sample, workload


def _compare(*args: object) -> None:
    new = RowBuilder().build(*args)  # type: ignore[arg-type]
    old = reference_rows(*args)  # type: ignore[arg-type]
    assert set(new.keys) == set(old)
    expected = np.array([old[key].values for key in new.keys], dtype=np.float64).reshape(new.values.shape)
    # bit for bit: the same additions in the same order
    assert np.array_equal(expected, new.values, equal_nan=True)
    assert new.labels == {key: old[key].labels for key in new.keys}


@pytest.mark.parametrize("seed", [1, 7])
def test_simulated_fleet_rows_are_identical(seed: int) -> None:
    """Whole, MIG and time-sliced GPUs, free devices, pod stats: every series, every metric."""
    config = SimConfig(seed=seed, nodes=24, gpus_per_node=8, interval_seconds=15.0, start_time=1_000_000.0)
    simulator = Simulator(config)
    engine = Engine(EngineConfig(interval_seconds=15.0, idle_threshold_percent=1.0))
    kinds: set[str] = set()
    for index in range(30):
        step = simulator.step()
        for event in step.events:
            engine.observe(event)
        for each in step.samples:
            engine.observe_sample(each)
        if index % 10 == 9:
            workloads, projects, figures = engine.report(step.t)
            assert workloads and step.pod_stats
            _compare(step.samples, workloads, projects, figures, step.pod_stats)
            kinds.update(kind for kind, _ in RowBuilder().build(step.samples, workloads, projects, figures).keys)
    assert kinds == {"gpu", "pod", "workload", "workload_node", "project", "project_node", "node", "cluster"}


def test_hand_made_edge_cases_are_identical() -> None:
    """A GPU without a sample, a shared GPU, an unallocated device, no pod stats, a project with no workload."""
    a = workload("a", [("gpu-0", 0.5, 40.0), ("gpu-9", 1.0, None)], namespace="ns", project="p")
    b = workload("b", [("gpu-0", 0.5, 80.0)], namespace="ns", project="p", idle_seconds=30.0)
    samples = [sample(10.0, "gpu-0", sm=60), sample(10.0, "gpu-1", sm=0, energy_joules=None), sample(5.0, "gpu-0")]
    _compare(samples, [a, b], [project("p", [a, b], 5.0), project("empty", [])], cluster(3))
    _compare([], [], [], cluster(0))
    # an interval in which no agent answered: devices known from the workloads, no sample at all
    _compare([], [a, b], [project("p", [a, b], 5.0)], cluster(3))


def test_known_series_get_no_labels() -> None:
    job = workload("train", [("gpu-0", 1.0, 50.0)])
    first = RowBuilder().build([sample(1.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1))
    again = RowBuilder().build([sample(2.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1), known=set(first.keys))
    assert again.keys == first.keys and again.labels == {}
    assert first.labels[("workload", "uid-train")]["workload"] == "train"
