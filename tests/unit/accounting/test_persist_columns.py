"""Saved GPU history and window segments as base64 (state version 2): exact round trip."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.accounting.persist import STATE_VERSION, StateError
from gpuwm.model import GpuSample, ProcessSample

from .helpers import pod, sample

CONFIG = EngineConfig(interval_seconds=1.0, late_event_window_seconds=1000.0)


def _engine() -> Engine:
    engine = Engine(CONFIG)
    engine.observe(pod(0.0, "train", devices=[("GPU-a", 1.0), ("GPU-b", 0.5)]))
    for t in range(1, 8):
        engine.observe(sample(float(t), "GPU-a", sm=None if t == 3 else 10.0 * t, energy_joules=100.0 * t))
        engine.observe(sample(float(t), "GPU-b", sm=5.0, memory_used_bytes=None, device_units=1.0,
                              processes=[ProcessSample(pid=1, pod_uid="pod-train", sm_percent=4.0)] if t % 2 else None))
    engine.observe(GpuSample(t=2.5, node="n1", uuid="GPU-a", sm_percent=99.0, energy_joules=240.0))  # late: inserted
    for when, units in ((1.0, 0.5), (2.0, 0.25)):  # a device whose size changed: its units saved as a column
        engine.observe(GpuSample(t=when, node="n1", uuid="GPU-c", sm_percent=1.0, device_units=units))
    return engine


def _figures(engine: Engine, now: float) -> list[dict[str, Any]]:
    return [figures.model_dump() for figures in engine.workloads(now)]


def test_columns_round_trip_keeps_every_value_and_nan() -> None:
    engine = _engine()
    state = json.loads(json.dumps(engine.save()))
    assert state["version"] == STATE_VERSION == 2
    assert all(isinstance(gpu["history"]["t"], str) for gpu in state["gpus"])
    assert all(isinstance(workload["windows"], str) for workload in state["workloads"])
    units = {gpu["uuid"]: gpu["history"]["units"] for gpu in state["gpus"]}
    assert units["GPU-a"] == units["GPU-b"] == 1.0 and isinstance(units["GPU-c"], str)
    restored = Engine.restore(state, CONFIG)
    for uid, workload in engine.workload_records.items():
        assert restored.workload_records[uid].windows.to_list() == workload.windows.to_list() != []
    for uuid, gpu in engine.gpu_records.items():
        again = restored.gpu_records[uuid]
        for column in ("times", "sm", "memory", "energy", "device_units"):
            mine, theirs = getattr(gpu, column), getattr(again, column)
            assert [math.isnan(v) for v in mine] == [math.isnan(v) for v in theirs]
            assert [v for v in mine if v == v] == [v for v in theirs if v == v]
        assert again.pod_sm == gpu.pod_sm
    assert any(value is None for value in engine.gpu_records["GPU-b"].pod_sm)
    assert any(value for value in engine.gpu_records["GPU-b"].pod_sm)
    assert _figures(restored, 7.0) == _figures(engine, 7.0)
    for later in (restored, engine):
        later.observe(sample(8.0, "GPU-a", sm=50.0, energy_joules=900.0))
    assert _figures(restored, 8.0) == _figures(engine, 8.0)


@pytest.mark.parametrize("damage", ["short column", "not base64", "part of a segment", "no capacity", "unknown version"])
def test_damaged_history_is_a_state_error(damage: str) -> None:
    state = json.loads(json.dumps(_engine().save()))
    history = state["gpus"][0]["history"]
    if damage == "short column":
        history["sm"] = history["sm"][:-12]
    elif damage == "not base64":
        history["t"] = "!!"
    elif damage == "part of a segment":
        state["workloads"][0]["windows"] = base64.b64encode(struct.pack("<5d", 1, 2, 3, 4, 5)).decode()
    elif damage == "no capacity":
        state["workloads"][0]["windowsCapacity"] = 0
    else:
        state["version"] = 99
    with pytest.raises(StateError):
        Engine.restore(state, CONFIG)
