"""`Engine.observe_samples` (a snapshot as columns) equals `observe_sample` per sample, to the bit.

The per-sample path is the reference of the vectorised one (`gpuwm.accounting.batch`): one property
test over random traces with whole GPUs, MIG instances (the parent's energy shared among them),
time-sliced GPUs with per-process data, gaps, late and duplicate samples, samples older than the late
window and lost GPUs; pod events between the batches. Both ways must give identical reports (every
figure, compared with ==) and identical engine state.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.accounting.batch import observe_appending_chunk
from gpuwm.model import GpuSample, PodEvent
from tests.unit.accounting.helpers import batch_of_samples, pod
from tests.unit.accounting.test_properties import PROPERTY_SETTINGS

WHOLE = ["GPU-a", "GPU-b"]
SHARED = "GPU-s"  # time-sliced: replicas held by several pods, per-process SM
PARENT, CHILDREN = "GPU-m", ["MIG-1", "MIG-2"]


def _sample(rng: random.Random, t: float, uuid: str, energy: dict[str, float], pods: int) -> GpuSample:
    values: dict[str, Any] = {"t": t, "node": "n1" if uuid != "GPU-b" else rng.choice(["n1", "n2"]), "uuid": uuid}
    lost = rng.random() < 0.08
    values["sm_percent"] = None if lost else rng.choice([0.0, 0.5, 5.0, 40.0, 100.0])
    if lost:
        values["healthy"] = False
        values["error"] = "GPU is lost"
    if rng.random() < 0.8:
        values["memory_used_bytes"] = rng.choice([0.0, 10.0, 60.0, 150.0])
        values["memory_total_bytes"] = rng.choice([0.0, 100.0, 100.0])
    if uuid in CHILDREN:
        values["parent_uuid"] = PARENT
        values["device_units"] = 3 / 7 if uuid == "MIG-1" else 1 / 7
        if rng.random() < 0.1:  # mostly none: a MIG instance carries no counter of its own
            values["energy_joules"] = rng.uniform(0, 1e4)
    elif rng.random() < 0.9:
        energy[uuid] = energy.get(uuid, 0.0) + rng.choice([0.0, 55.5, 300.25])
        values["energy_joules"] = energy[uuid]
    if rng.random() < 0.25:  # a run of merged polls (gpuwm.feed.merge): the gap rule reads before its first
        values["merged_seconds"] = rng.choice([0.5, 2.0, 3.0, 12.0])
    if uuid == SHARED or (uuid in WHOLE and rng.random() < 0.2):
        kind = rng.random()
        if kind < 0.1:
            values["processes"] = []
        elif kind < 0.2:
            values["processes"] = [{"pid": 7, "pod_uid": "pod-p0"}]  # no per-process SM: none
        else:
            values["processes"] = [
                {"pid": 10 + index, "pod_uid": rng.choice([f"pod-p{index % pods}", None]),
                 "sm_percent": rng.choice([None, 0.0, 3.0, 30.0])}
                for index in range(rng.randint(1, 3))
            ]
    return GpuSample.model_validate(values)


def _trace(seed: int, late: bool = True) -> list[list[PodEvent] | list[GpuSample]]:
    """Batches of samples (one agent snapshot each) with pod events in between, in arrival order.

    Without `late`, each device's samples only extend its history: the vectorised path's case.
    """
    rng = random.Random(seed)
    pods = rng.randint(1, 5)
    mig = late or seed % 2 == 1  # a MIG parent's rows go row by row: leave it out of half the clean traces
    devices = [*WHOLE, SHARED, *([PARENT, *CHILDREN] if mig else [])]
    holdable = [(uuid, 1.0) for uuid in WHOLE] + [(SHARED, 0.25), (SHARED, 0.5)]
    holdable += [("MIG-1", 3 / 7), ("MIG-2", 1 / 7)] if mig else []
    energy: dict[str, float] = {}
    pod_times = {
        f"p{index}": sorted(rng.sample(range(0, 400), rng.randint(1, 4))) for index in range(pods)
    }
    pod_devices = {name: rng.choice(holdable) for name in pod_times}
    workloads = {name: rng.choice(["w0", "w1", name]) for name in pod_times}
    step = rng.choice([1.0, 1.0, 2.0, 0.5])
    span = rng.choice([15.0, 15.0, 60.0, 200.0])  # a snapshot's span; 200 s: a backlog beyond the late window
    batches: list[list[PodEvent] | list[GpuSample]] = []
    now = 0.0
    while now < 450.0:
        events = [
            pod(float(t), name, rng.choice(["Running", "Running", "Pending", "Succeeded", "Deleted"]),
                workload=workloads[name], devices=[pod_devices[name]], created=0.0)
            for name, times in pod_times.items() for t in times if now <= t < now + span
        ]
        if events:
            batches.append(events)
        samples: list[GpuSample] = []
        t = now
        while t < now + span:
            t += step
            for uuid in devices:
                if rng.random() < 0.1:
                    continue  # a hole; several in a row make a gap
                sample_t = t
                if late and rng.random() < 0.05:
                    sample_t = t - rng.choice([step, 3.0, 30.0, 150.0])  # late (or too late), maybe a duplicate time
                samples.append(_sample(rng, sample_t, uuid, energy, pods))
        if rng.random() < 0.5 or not late:
            samples.sort(key=lambda sample: sample.t)  # what the puller hands over; unsorted also works
        batches.append(samples)
        now += span
    return batches


def _run(batches: list[list[PodEvent] | list[GpuSample]], columns: bool, arrays: bool = False) -> Engine:
    """Fed one by one, or as batches (`arrays`: their columns as numpy arrays, as the controller gives them)."""
    engine = Engine(EngineConfig(interval_seconds=1.0, late_event_window_seconds=120.0))
    for batch in batches:
        if batch and isinstance(batch[0], GpuSample) and columns:
            given = batch_of_samples([item for item in batch if isinstance(item, GpuSample)])
            if arrays:
                names = ("t", "sm", "memory", "energy", *(("merged",) if given.merged is not None else ()))
                as_arrays: dict[str, Any] = {name: numpy.array(getattr(given, name)) for name in names}
                given = replace(given, device=numpy.array(given.device, dtype=numpy.int64), **as_arrays)
            engine.observe_samples(given)
        else:
            for item in batch:
                engine.observe(item)
    return engine


def _state(engine: Engine) -> dict[str, Any]:
    return {
        "clock": engine.clock,
        "dropped": engine.late_samples_dropped,
        "mig_children": engine.mig_children,
        "gpus": {uuid: (gpu.node, gpu.columns(), gpu.latest, gpu.pruned) for uuid, gpu in engine.gpu_records.items()},
        "gpu_order": list(engine.gpu_records),
        "windows": {uid: workload.windows.to_list() for uid, workload in engine.workload_records.items()},
    }


@PROPERTY_SETTINGS
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_columns_equal_samples_one_by_one(seed: int, late: bool) -> None:
    batches = _trace(seed, late)
    one_by_one, columns = _run(batches, columns=False), _run(batches, columns=True, arrays=seed % 2 == 1)
    for now in (300.0, 460.0):
        workloads, projects, cluster = one_by_one.report(now)
        assert columns.report(now) == (workloads, projects, cluster)  # pydantic ==: every field, floats exactly
    assert columns.gpus(460.0) == one_by_one.gpus(460.0)
    assert _state(columns) == _state(one_by_one)
    numbers = [columns.clock, *(getattr(workload, name) for workload in columns.workload_records.values()
                                for name in ("active_gpu_seconds", "idle_gpu_seconds", "energy_joules", "life_util"))]
    assert all(type(value) is float for value in numbers)  # no numpy scalar leaks into the state


def test_the_vectorised_path_takes_most_chunks_of_traces_without_late_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[bool] = []

    def spy(*args: Any) -> bool:
        taken.append(observe_appending_chunk(*args))
        return taken[-1]

    monkeypatch.setattr("gpuwm.accounting.core.observe_appending_chunk", spy)
    for seed in range(20):
        _run(_trace(seed, late=False), columns=True)
    assert sum(taken) > len(taken) / 3, (sum(taken), len(taken))  # half the traces have a MIG parent


def test_the_traces_cover_what_they_claim() -> None:
    """The cases the equivalence must hold for do occur: late, dropped, duplicate, lost, MIG, per-process."""
    seen = {"dropped": 0, "mig": 0, "per_process": 0, "lost": 0, "duplicates": 0}
    for seed in range(60):
        engine = _run(_trace(seed), columns=False)
        seen["dropped"] += engine.late_samples_dropped
        seen["mig"] += bool(engine.mig_children.get(PARENT))
        for batch in _trace(seed):
            samples = [item for item in batch if isinstance(item, GpuSample)]
            seen["per_process"] += sum(sample.processes is not None for sample in samples)
            seen["lost"] += sum(sample.sm_percent is None for sample in samples)
            keys = [(sample.uuid, sample.t) for sample in samples]
            seen["duplicates"] += len(keys) - len(set(keys))
    assert all(count > 0 for count in seen.values()), seen


def test_a_piece_with_the_interval_of_the_merged_segment_before_it() -> None:
    """GPU a's pieces (0,1], (1,2], (2,3] merge into one segment (0,3]; GPU b's single piece (0,3] then has its
    interval, and `add` sums into it: the batch must too (b's rows come after a's, as from another agent)."""
    events: list[list[PodEvent] | list[GpuSample]] = [[pod(0.0, "job", devices=[("GPU-a", 1.0), ("GPU-b", 1.0)])]]
    rows = [GpuSample(t=float(t), node="n1", uuid="GPU-a", sm_percent=50.0) for t in range(0, 4)]
    rows += [GpuSample(t=float(t), node="n2", uuid="GPU-b", sm_percent=50.0) for t in (0, 3)]
    events.append(rows)
    one_by_one, columns = _run(events, columns=False), _run(events, columns=True, arrays=True)  # arrays: vectorised
    assert len(one_by_one.workload_records["wl-job"].windows) == 1  # b's piece went into a's merged segment
    assert _state(columns) == _state(one_by_one)
    assert columns.report(10.0) == one_by_one.report(10.0)


def test_a_piece_with_the_interval_of_a_segment_continued_from_the_last_batch() -> None:
    """The segment (0,2] from an earlier batch goes on to (0,3] with a's piece (2,3]; b's piece (0,3] sums into it."""
    events: list[list[PodEvent] | list[GpuSample]] = [[pod(0.0, "job", devices=[("GPU-a", 1.0), ("GPU-b", 1.0)])]]
    events.append([GpuSample(t=float(t), node="n1", uuid="GPU-a", sm_percent=50.0) for t in range(0, 3)]
                  + [GpuSample(t=0.0, node="n2", uuid="GPU-b", sm_percent=50.0)])
    events.append([GpuSample(t=3.0, node="n1", uuid="GPU-a", sm_percent=50.0),
                   GpuSample(t=3.0, node="n2", uuid="GPU-b", sm_percent=50.0)])
    one_by_one, columns = _run(events, columns=False), _run(events, columns=True, arrays=True)
    assert one_by_one.workload_records["wl-job"].windows.to_list()[:3] == [0.0, 3.0, 2.0]
    assert _state(columns) == _state(one_by_one)
