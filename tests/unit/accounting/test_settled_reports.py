"""Settled workloads (ended, folded, out of every window): figures computed once, until a pod event or project change."""

from __future__ import annotations

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.model import NamespaceEvent

from .helpers import pod, sample

CONFIG = EngineConfig(interval_seconds=10.0, late_event_window_seconds=60.0)


def _engine() -> Engine:
    engine = Engine(CONFIG)
    engine.observe(pod(0.0, "done", devices=[("GPU-a", 1.0)]))
    engine.observe(pod(0.0, "busy", devices=[("GPU-b", 1.0)]))
    for t in range(10, 4400, 10):
        engine.observe(sample(float(t), "GPU-a", sm=50.0 if t < 300 else 0.0))
        engine.observe(sample(float(t), "GPU-b", sm=80.0))
        if t == 600:
            engine.observe(pod(600.0, "done", "Succeeded", devices=[]))
    return engine


def test_a_settled_workload_is_reused_and_equals_a_fresh_computation() -> None:
    engine = _engine()
    done = engine.workload_records["wl-done"]
    busy = engine.workload_records["wl-busy"]
    assert engine._settled_key(busy) is None  # running: recomputed every report
    assert engine._settled_key(done) is not None
    first = engine.workload("wl-done", 4390.0)
    again = engine.workload("wl-done", 4900.0)
    assert first is not None and again is first
    fresh, _ = engine._compute_figures(done, 4900.0, None)
    assert fresh.model_dump() == first.model_dump()
    assert first.phase == "Succeeded" and first.allocated_gpu_seconds == 600.0
    assert (first.active_gpu_seconds, first.idle_gpu_seconds, first.unmonitored_gpu_seconds) == (280.0, 310.0, 10.0)
    assert [w.uid for w in engine.workloads(4900.0)] == ["wl-busy", "wl-done"]
    assert engine.workloads(4900.0)[1] is first


def test_a_pod_event_or_a_project_label_invalidates_the_settled_figures() -> None:
    engine = _engine()
    first = engine.workload("wl-done", 4390.0)
    assert first is not None and first.project == "ml"
    engine.observe(NamespaceEvent(t=4390.0, event="namespace", name="ml", labels={"gpuwm.io/project": "vision"}))
    relabelled = engine.workload("wl-done", 4390.0)
    assert relabelled is not None and relabelled is not first and relabelled.project == "vision"
    engine.observe(pod(4390.0, "done", "Deleted", devices=[]))
    deleted = engine.workload("wl-done", 4390.0)
    assert deleted is not None and deleted is not relabelled and deleted.pods[0].phase == "Deleted"
    engine.forget_workload("wl-done")
    assert engine.workload("wl-done", 4390.0) is None and "wl-done" not in engine._settled
