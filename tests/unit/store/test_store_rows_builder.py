"""RowBuilder (structure kept between intervals) against the part-by-part reference, interval after interval.

Each interval's rows must be the reference's to the bit and the labels those of the series the
store does not know yet, whether a workload's entry was reused, rebuilt (pods or GPUs changed,
a workload gone or new) or the slot table started afresh; samples come in a different order
each interval (the order a device's latest sample has decides some additions' order).
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.sim.scenario import default_faults
from gpuwm.sim.simulator import SimConfig, Simulator
from gpuwm.store.rows import RowBuilder, Rows, SeriesKey, _pod_fields

from .reference_rows import build_rows as reference_rows
from .store_data import cluster, project, sample, workload


def _check(
    builder: RowBuilder,
    known: set[SeriesKey],
    samples: list[GpuSample],
    workloads: list[WorkloadFigures],
    projects: list[ProjectFigures],
    figures: ClusterFigures,
    pod_stats: list[PodStatsSample] | None = None,
) -> Rows:
    """Build with `builder`, compare with the reference, then 'write' the series (they become known)."""
    new = builder.build(samples, workloads, projects, figures, pod_stats or [], known=known)
    old = reference_rows(samples, workloads, projects, figures, pod_stats or [])
    assert len(new.keys) == len(set(new.keys))
    assert set(new.keys) == set(old)
    expected = np.array([old[key].values for key in new.keys], dtype=np.float64).reshape(new.values.shape)
    assert np.array_equal(expected, new.values, equal_nan=True)  # the same additions in the same order
    assert new.labels == {key: old[key].labels for key in new.keys if key not in known}
    known.update(new.keys)
    return new


@pytest.mark.parametrize(("seed", "slack"), [(3, RowBuilder.SLACK), (11, -1_000_000)])
def test_simulated_intervals_match_the_reference(seed: int, slack: int) -> None:
    """Workloads arrive and end, MIG and time-sliced GPUs, free devices, an agent outage, a lost GPU, pod stats."""
    start = 1_000_000.0
    steps = 80
    nodes = [f"sim-node-{index:03d}" for index in range(16)]
    outages, losses = default_faults(nodes, start, steps * 15.0)
    config = SimConfig(seed=seed, nodes=16, gpus_per_node=8, interval_seconds=15.0, start_time=start,
                       outages=outages, gpu_losses=losses)
    simulator = Simulator(config)
    engine = Engine(EngineConfig(interval_seconds=15.0, idle_threshold_percent=1.0))
    builder = RowBuilder()
    builder.SLACK = slack  # below zero: the slot table is rebuilt every interval
    known: set[SeriesKey] = set()
    shuffle = random.Random(seed)
    structures: list[frozenset[tuple[str, tuple[tuple[str, str | None], ...]]]] = []
    recent: dict[str, GpuSample] = {}
    for _ in range(steps):
        step = simulator.step()
        for event in step.events:
            engine.observe(event)
        for each in step.samples:
            engine.observe_sample(each)
            recent[each.uuid] = each
        workloads, projects, figures = engine.report(step.t)
        samples = [each for each in recent.values() if each.t > step.t - 45.0] + list(step.samples)
        shuffle.shuffle(samples)
        _check(builder, known, samples, workloads, projects, figures, list(step.pod_stats))
        structures.append(frozenset((w.uid, tuple((g.uuid, g.pod_uid) for g in w.gpus)) for w in workloads))
    changed = sum(1 for before, after in itertools.pairwise(structures) if before != after)
    assert changed >= 5, "the run should start and end workloads between intervals"


def test_changes_between_intervals_match_the_reference() -> None:
    """A shared GPU whose co-holder ends, a free device taken, a GPU moved between pods, a sample lost."""
    builder = RowBuilder()
    known: set[SeriesKey] = set()
    a = workload("a", [("gpu-0", 0.5, 40.0), ("gpu-9", 1.0, None)], namespace="ns", project="p")
    b = workload("b", [("gpu-0", 0.5, 80.0)], namespace="ns", project="p", idle_seconds=30.0)
    samples = [sample(10.0, "gpu-0", sm=60), sample(10.0, "gpu-1", sm=0, energy_joules=None), sample(5.0, "gpu-0")]
    _check(builder, known, samples, [a, b], [project("p", [a, b], 5.0), project("empty", [])], cluster(3))
    # the same structure, new figures: the entries are reused
    a2 = workload("a", [("gpu-0", 0.5, 45.0), ("gpu-9", 1.0, None)], namespace="ns", project="p", idle_seconds=15.0)
    b2 = workload("b", [("gpu-0", 0.5, None)], namespace="ns", project="p", idle_seconds=45.0, energy_joules=9.0)
    samples = [sample(25.0, "gpu-1", sm=5), sample(25.0, "gpu-0", sm=70)]
    _check(builder, known, samples, [b2, a2], [project("p", [a2, b2], 7.0)], cluster(3))
    # b ended; a takes the free gpu-1 too; gpu-9 reports now
    a3 = workload("a", [("gpu-0", 1.0, 45.0), ("gpu-9", 1.0, None), ("gpu-1", 1.0, 10.0)], namespace="ns", project="p")
    samples = [sample(40.0, "gpu-9", sm=99), sample(40.0, "gpu-0", sm=70), sample(40.0, "gpu-1", sm=3)]
    _check(builder, known, samples, [a3], [project("p", [a3], 7.0)], cluster(3))
    # a new workload with a project of its own on another node, a's samples missing
    c = workload("c", [("gpu-5", 1.0, 20.0)], namespace="other", project="q", node="node-b")
    samples = [sample(55.0, "gpu-5", node="node-b", sm=20)]
    _check(builder, known, samples, [a3, c], [project("p", [a3], 7.0), project("q", [c])], cluster(4))
    # nothing at all, then everything again
    _check(builder, known, [], [], [], cluster(0))
    _check(builder, known, samples, [a3, c], [project("p", [a3], 7.0), project("q", [c])], cluster(4))


def test_labels_wait_for_the_store() -> None:
    """Series the caller did not take in (not added to `known`) keep their labels in the next rows."""
    builder = RowBuilder()
    job = workload("train", [("gpu-0", 1.0, 50.0)])
    first = builder.build([sample(1.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1))
    again = builder.build([sample(2.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1))
    assert again.labels == first.labels and first.labels[("workload", "uid-train")]["workload"] == "train"
    known = set(first.keys)
    assert builder.build([sample(3.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1), known=known).labels == {}
    known.discard(("workload", "uid-train"))  # a rolled-back write: the store clears the builder
    builder.clear()
    rows = builder.build([sample(4.0, "gpu-0")], [job], [project("alpha", [job])], cluster(1), known=known)
    assert rows.labels == {("workload", "uid-train"): first.labels[("workload", "uid-train")]}


def test_fields_are_read_by_attribute_where_the_dict_lacks_them() -> None:
    """Fields are read as attributes: a model's, a slot's and a property's alike."""

    class Slotted:
        __slots__ = ("name", "uid")

        def __init__(self, uid: str, name: str) -> None:
            self.uid, self.name = uid, name

    class Computed:
        uid = "u-2"

        @property
        def name(self) -> str:
            return "computed"

    job = workload("train", [("gpu-0", 1.0, 50.0)])
    assert _pod_fields.read(job.pods) == [("pod-uid-train", "train-0")]
    assert _pod_fields.read([Slotted("u-1", "one"), Computed()]) == [("u-1", "one"), ("u-2", "computed")]
