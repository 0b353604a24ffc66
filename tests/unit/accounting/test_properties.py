"""Property-based tests of the engine's invariants (hypothesis)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.model import GpuSample, PodEvent
from tests.unit.accounting.helpers import pod, sample

GPUS = ["GPU-a", "GPU-b", "GPU-c"]
PHASES = ["Pending", "Running", "Running", "Running", "Succeeded", "Failed", "Deleted"]
UNITS = [1.0, 0.5, 0.25, 1 / 7]
HORIZON = 40
PROPERTY_SETTINGS = settings(max_examples=int(__import__("os").environ.get("GPUWM_PROPERTY_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

Event = PodEvent | GpuSample


@st.composite
def traces(draw: st.DrawFn) -> list[Event]:
    """A random trace on a 1 s grid: a few pods changing phase, GPUs sampled with holes and gaps."""
    events: list[Event] = []
    pod_count = draw(st.integers(1, 4))
    for index in range(pod_count):
        name = f"p{index}"
        workload = draw(st.sampled_from(["w0", "w1", name]))
        device = draw(st.sampled_from(GPUS))
        units = draw(st.sampled_from(UNITS))
        times = sorted(draw(st.sets(st.integers(0, HORIZON), min_size=1, max_size=4)))
        for t in times:
            events.append(
                pod(
                    float(t) + draw(st.sampled_from([0.0, 0.0, 0.5])),  # holders also change inside an interval
                    name,
                    draw(st.sampled_from(PHASES)),
                    workload=workload,
                    devices=[(device, units)],
                    created=draw(st.sampled_from([None, -5.0, 0.0])),
                )
            )
    for uuid in GPUS:
        times = sorted(draw(st.sets(st.integers(0, HORIZON), max_size=HORIZON)))
        # per-process data: none, a holder's process, an empty list, a process of no pod, one with no SM figure
        with_processes = draw(st.sampled_from(["none", "holder", "empty", "no-pod", "no-sm"]))
        energy = 0.0
        for t in times:
            sm = draw(st.sampled_from([0.0, 0.5, 5.0, 40.0, 100.0, None]))
            energy += draw(st.sampled_from([0.0, 50.0, 300.0]))
            fields: dict[str, Any] = {"energy_joules": energy}
            if with_processes == "holder" and sm is not None:
                fields["processes"] = [
                    {"pid": 1, "pod_uid": f"pod-p{draw(st.integers(0, pod_count - 1))}", "sm_percent": sm}
                ]
            elif with_processes == "empty" and sm is not None:
                fields["processes"] = []
            elif with_processes == "no-pod" and sm is not None:
                fields["processes"] = [{"pid": 1, "sm_percent": sm}]
            elif with_processes == "no-sm" and sm is not None:
                fields["processes"] = [{"pid": 1, "pod_uid": f"pod-p{draw(st.integers(0, pod_count - 1))}"}]
            if sm is None:
                fields["healthy"] = False
            events.append(sample(float(t), uuid, sm, **fields))
    return events


def run(events: list[Event], now: float = HORIZON + 5, config: EngineConfig | None = None) -> Engine:
    engine = Engine(config or EngineConfig())
    for event in events:
        engine.observe(event)
    return engine


def snapshot(engine: Engine, now: float) -> list[dict[str, Any]]:
    return [figures.model_dump() for figures in engine.workloads(now)]


def assert_same(left: Any, right: Any, path: str = "") -> None:
    if isinstance(left, dict):
        assert left.keys() == right.keys(), path
        for key in left:
            assert_same(left[key], right[key], f"{path}.{key}")
    elif isinstance(left, list):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(left, float) and isinstance(right, float):
        assert left == pytest.approx(right, rel=1e-9, abs=1e-9), path
    else:
        assert left == right, path


def in_time_order(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda event: event.t)


def expected_allocation(events: list[Event], now: float) -> dict[str, float]:
    """Units x running seconds per workload, straight from the pod events (independent of the engine)."""
    by_pod: dict[str, list[PodEvent]] = {}
    for event in in_time_order(events):
        if isinstance(event, PodEvent):
            timeline = by_pod.setdefault(event.uid, [])
            if timeline and timeline[-1].t == event.t:
                timeline[-1] = event
            else:
                timeline.append(event)
    totals: dict[str, float] = {}
    for timeline in by_pod.values():
        for position, event in enumerate(timeline):
            end = timeline[position + 1].t if position + 1 < len(timeline) else now
            if event.phase == "Running":
                seconds = max(0.0, min(end, now) - event.t)
                units = sum(device.units for device in event.devices)
                totals[event.workload.name] = totals.get(event.workload.name, 0.0) + units * seconds
            totals.setdefault(event.workload.name, 0.0)
    return totals


@PROPERTY_SETTINGS
@given(traces())
def test_allocated_equals_units_times_running_time_and_splits_exactly(events: list[Event]) -> None:
    now = HORIZON + 5.0
    engine = run(in_time_order(events))
    expected = expected_allocation(events, now)
    for figures in engine.workloads(now):
        assert figures.allocated_gpu_seconds == pytest.approx(expected[figures.name], abs=1e-6)
        parts = figures.active_gpu_seconds + figures.idle_gpu_seconds + figures.unmonitored_gpu_seconds
        assert parts == pytest.approx(figures.allocated_gpu_seconds, abs=1e-6)
        assert figures.active_gpu_seconds >= -1e-9
        assert figures.idle_gpu_seconds >= -1e-9
        assert figures.unmonitored_gpu_seconds >= -1e-9
        for window in ("avg1m", "avg5m", "avg1h", "lifetime"):
            value = getattr(figures.utilization, window)
            assert value is None or -1e-6 <= value <= 100 + 1e-6


@PROPERTY_SETTINGS
@given(st.integers(1, 8), st.integers(5, 200), st.sampled_from([0.0, 3.0, 60.0]))
def test_shares_on_one_physical_gpu_add_up_to_its_time(replicas: int, seconds: int, sm: float) -> None:
    engine = Engine()
    for index in range(replicas):
        engine.observe(pod(0.0, f"p{index}", devices=[(f"GPU-a::{index}", 1 / replicas)]))
    for t in range(0, seconds + 1):
        engine.observe(sample(float(t), "GPU-a", sm, energy_joules=10.0 * t))
    workloads = engine.workloads(float(seconds))
    assert sum(f.allocated_gpu_seconds for f in workloads) == pytest.approx(seconds)
    assert sum(f.energy_joules for f in workloads) == pytest.approx(10.0 * seconds)
    assert engine.cluster(float(seconds)).allocated_gpus == pytest.approx(1.0)


@PROPERTY_SETTINGS
@given(st.integers(1, 30), st.integers(1, 30), st.floats(0.0, 5.0))
def test_idle_seconds_zero_after_activity_then_grows_one_for_one(
    active: int, idle: int, later: float
) -> None:
    engine = Engine()
    engine.observe(pod(0.0, "a"))
    for t in range(0, active + 1):
        engine.observe(sample(float(t), sm=50.0))
    assert engine.workloads(float(active))[0].idle_seconds == 0
    for t in range(active + 1, active + idle + 1):
        engine.observe(sample(float(t), sm=0.0))
    now = float(active + idle)
    assert engine.workloads(now)[0].idle_seconds == pytest.approx(idle)
    assert engine.workloads(now + later)[0].idle_seconds == pytest.approx(idle + later)


@PROPERTY_SETTINGS
@given(traces(), st.floats(0.0, 1.0))
def test_restore_of_save_gives_identical_results(events: list[Event], split: float) -> None:
    ordered = in_time_order(events)
    cut = int(len(ordered) * split)
    original = run(ordered[:cut])
    restored = Engine.restore(json.loads(json.dumps(original.save())), original.config)
    for event in ordered[cut:]:
        original.observe(event)
        restored.observe(event)
    now = HORIZON + 5.0
    assert snapshot(restored, now) == snapshot(original, now)
    assert [p.model_dump() for p in restored.projects(now)] == [
        p.model_dump() for p in original.projects(now)
    ]


def _one_per_key(events: list[Event]) -> list[Event]:
    """Keep one sample per (GPU, time) and one pod event per (pod, time): ties are order-defined by design."""
    seen: set[tuple[str, float]] = set()
    kept: list[Event] = []
    for event in events:
        key = (event.uid if isinstance(event, PodEvent) else event.uuid, event.t)
        if key in seen:
            continue
        seen.add(key)
        kept.append(event)
    return kept


@PROPERTY_SETTINGS
@given(traces(), st.randoms(use_true_random=False))
def test_event_order_within_one_timestamp_does_not_change_results(
    events: list[Event], rng: random.Random
) -> None:
    events = _one_per_key(events)
    ordered = in_time_order(events)
    by_time: dict[float, list[Event]] = {}
    for event in ordered:
        by_time.setdefault(event.t, []).append(event)
    shuffled: list[Event] = []
    for t in sorted(by_time):
        group = list(by_time[t])
        rng.shuffle(group)
        shuffled.extend(group)
    now = HORIZON + 5.0
    assert_same(snapshot(run(shuffled), now), snapshot(run(ordered), now))


@PROPERTY_SETTINGS
@given(traces(), st.randoms(use_true_random=False))
def test_late_and_out_of_order_input_within_the_window_gives_the_same_results(
    events: list[Event], rng: random.Random
) -> None:
    events = _one_per_key(events)
    ordered = in_time_order(events)
    shuffled = list(ordered)
    rng.shuffle(shuffled)  # every event of a 40 s trace is within the 120 s late window
    now = HORIZON + 5.0
    assert_same(snapshot(run(shuffled), now), snapshot(run(ordered), now))


@PROPERTY_SETTINGS
@given(traces())
def test_a_sole_holding_workload_figures_do_not_depend_on_the_process_list(events: list[Event]) -> None:
    # DESIGN §3's attribution rule: with one workload holding each GPU, what NVML lists as processes (nothing,
    # processes of no pod, processes without SM) changes nothing but the count of unattributed GPU-seconds
    one_workload = [
        event.model_copy(update={"workload": event.workload.model_copy(update={"uid": "wl-w0", "name": "w0"})})
        if isinstance(event, PodEvent) else event
        for event in events
    ]
    blind = [event.model_copy(update={"processes": None}) if isinstance(event, GpuSample) else event
             for event in one_workload]
    with_lists, without = snapshot(run(one_workload), HORIZON + 5), snapshot(run(blind), HORIZON + 5)
    for figures in (*with_lists, *without):
        figures.pop("unattributed_gpu_seconds")
    assert_same(with_lists, without)
