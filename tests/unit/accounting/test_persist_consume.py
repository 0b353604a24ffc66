"""`Engine.restore(state, consume=True)`, the controller's restart: the same engine as a plain restore, the
state's big lists emptied as they are read (so the restored engine reuses the loaded JSON's memory)."""

from __future__ import annotations

import json
from typing import Any

from gpuwm.accounting import Engine, EngineConfig

from .helpers import pod, sample


def _engine() -> Engine:
    engine = Engine(EngineConfig(interval_seconds=1.0))
    engine.observe(pod(0.0, "train-0", workload="train", devices=[("GPU-a", 1.0), ("GPU-b", 1.0)]))
    engine.observe(pod(0.0, "train-1", workload="train", node="n2", devices=[("GPU-c", 0.5)]))
    engine.observe(pod(5.0, "notebook", devices=[("GPU-d", 1.0)]))
    for t in range(1, 400):
        for index, uuid in enumerate(("GPU-a", "GPU-b", "GPU-c", "GPU-d")):
            engine.observe(sample(float(t), uuid, sm=float((t * 3 + index * 29) % 90), energy_joules=10.0 * t))
    engine.observe(pod(300.0, "notebook", phase="Succeeded"))
    return engine


def _saved(engine: Engine) -> dict[str, Any]:
    saved: dict[str, Any] = json.loads(json.dumps(engine.save()))
    return saved


def test_a_consumed_state_restores_the_same_engine_and_is_emptied() -> None:
    engine = _engine()
    plain = Engine.restore(_saved(engine), engine.config)
    state = _saved(engine)
    consumed = Engine.restore(state, engine.config, consume=True)
    assert _saved(consumed) == _saved(plain) == _saved(engine)
    for name in ("workloads", "pods", "stretches", "gpus"):
        assert state[name] and all(entry is None for entry in state[name]), name
    for t in range(400, 520):  # and they go on alike
        for target in (plain, consumed):
            for uuid in ("GPU-a", "GPU-b", "GPU-c", "GPU-d"):
                target.observe(sample(float(t), uuid, sm=float(t % 70), energy_joules=10.0 * t))
    assert [w.model_dump() for w in consumed.workloads(520.0)] == [w.model_dump() for w in plain.workloads(520.0)]


def test_a_plain_restore_leaves_the_state_as_it_was() -> None:
    state = _saved(_engine())
    before = json.dumps(state)
    Engine.restore(state, EngineConfig(interval_seconds=1.0))
    assert json.dumps(state) == before


def test_a_pod_named_by_two_workloads_is_restored_for_both_when_consumed() -> None:
    state = _saved(_engine())
    workloads = state["workloads"]
    shared = workloads[0]["pods"][0]
    workloads[1]["pods"].append(shared)  # a state where a pod moved between workloads
    plain = Engine.restore(json.loads(json.dumps(state)), EngineConfig(interval_seconds=1.0))
    consumed = Engine.restore(state, EngineConfig(interval_seconds=1.0), consume=True)
    for uid in plain.workload_records:
        assert list(consumed.workload_records[uid].pods) == list(plain.workload_records[uid].pods)
