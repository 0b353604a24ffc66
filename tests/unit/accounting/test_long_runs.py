"""Hours-long input: memory is bounded (history forgotten, windows folded) and figures stay right."""

from __future__ import annotations

import json

import pytest

from gpuwm.accounting import Engine, EngineConfig
from tests.unit.accounting.helpers import figures, pod, sample


def _busy(t: int) -> float:
    return 50.0 if (t // 10) % 2 == 0 else 0.0  # 10 s at 50 %, 10 s idle


def _run_two_hours() -> Engine:
    e = Engine(EngineConfig())
    e.observe(pod(0, "train"))
    for t in range(0, 7201):
        e.observe(sample(t, sm=_busy(t), energy_joules=100.0 * t))
    return e


def test_two_hours_at_one_hertz_keeps_figures_exact_and_memory_bounded() -> None:
    e = _run_two_hours()
    f = figures(e, "train", 7200)
    assert f.allocated_gpu_seconds == pytest.approx(7200)
    assert f.unmonitored_gpu_seconds == pytest.approx(0)
    # sample t describes (t-1, t]: busy samples are t with (t // 10) even -> half of all intervals
    assert f.active_gpu_seconds == pytest.approx(sum(1 for t in range(1, 7201) if _busy(t) > 0))
    assert f.energy_joules == pytest.approx(720_000)
    exact_1h = sum(_busy(t) for t in range(3601, 7201)) / 3600
    exact_5m = sum(_busy(t) for t in range(6901, 7201)) / 300
    exact_1m = sum(_busy(t) for t in range(7141, 7201)) / 60
    assert f.utilization.avg1h == pytest.approx(exact_1h, rel=1e-6)
    assert f.utilization.avg5m == pytest.approx(exact_5m, rel=1e-6)
    assert f.utilization.avg1m == pytest.approx(exact_1m, rel=1e-6)
    gpu = e.gpu_records["GPU-a"]
    assert len(gpu.times) <= 200  # only the late window (120 s) of history is kept
    workload = e.workload_records["wl-train"]
    assert len(workload.windows) < 600  # 720 distinct segments an hour would be kept without folding


def test_sample_older_than_the_late_window_is_dropped_and_counted() -> None:
    e = _run_two_hours()
    before = figures(e, "train", 7200)
    e.observe(sample(7000, sm=100))  # 200 s late, the window is 120 s
    assert e.late_samples_dropped == 1
    after = figures(e, "train", 7200)
    assert after.active_gpu_seconds == before.active_gpu_seconds


def test_late_sample_within_the_window_is_placed_exactly() -> None:
    e = Engine(EngineConfig())
    e.observe(pod(0, "train"))
    for t in range(0, 101):
        if t != 50:
            e.observe(sample(t, sm=0.0))
    # (49, 51] was one 2 s idle interval; the late sample at 50 says (49, 50] was busy
    e.observe(sample(50, sm=80.0))
    f = figures(e, "train", 100)
    assert f.active_gpu_seconds == pytest.approx(1)
    assert f.idle_gpu_seconds == pytest.approx(99)
    assert f.last_active_time == 50


def test_pod_event_older_than_the_window_takes_effect_at_its_edge() -> None:
    e = Engine(EngineConfig())
    e.observe(pod(0, "train"))
    for t in range(0, 301):
        e.observe(sample(t, sm=50.0))
    e.observe(pod(100, "train", phase="Succeeded"))  # 200 s late: placed at 300 - 120 = 180
    f = figures(e, "train", 300)
    assert f.allocated_gpu_seconds == pytest.approx(180)
    assert f.end_time == 180


def test_restore_after_hours_continues_identically() -> None:
    e = _run_two_hours()
    restored = Engine.restore(json.loads(json.dumps(e.save())), e.config)
    for t in range(7201, 7400):
        e.observe(sample(t, sm=_busy(t), energy_joules=100.0 * t))
        restored.observe(sample(t, sm=_busy(t), energy_joules=100.0 * t))
    assert [w.model_dump() for w in restored.workloads(7400)] == [w.model_dump() for w in e.workloads(7400)]


def test_forget_workload_after_retention() -> None:
    e = Engine(EngineConfig())
    e.observe(pod(0, "a"))
    e.observe(pod(10, "a", phase="Succeeded"))
    assert [w.name for w in e.workloads(20)] == ["a"]
    e.forget_workload("wl-a")
    assert e.workloads(20) == []
    assert e.workload("wl-a", 20) is None
