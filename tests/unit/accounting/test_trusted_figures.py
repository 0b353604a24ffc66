"""Figures built without validation (`trusted`) and the flat window sums equal the validated, nested originals.

The report builds its figures from the engine's numbers with `gpuwm.model.figures.trusted`
and sums windows in one flat list: here each figure of varied traces is compared with the
same figure validated by pydantic (JSON to the byte, value types, field order), and the flat
sums with the nested sums they replaced, to the bit.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.accounting.engine import _Sums
from gpuwm.model.figures import GpuFigures, PodFigures, Windows, WorkloadFigures, trusted, trusted_complete
from gpuwm.model.jsonfast import model_json
from tests.unit.accounting.test_properties import HORIZON, PROPERTY_SETTINGS, Event, traces


def _assert_as_validated(model: BaseModel) -> None:
    """`model` is what validating its own values gives: same JSON, same field order, same value types."""
    validated = type(model).model_validate(model.model_dump())
    assert list(model.__dict__) == list(type(model).model_fields)
    assert model.model_dump_json() == validated.model_dump_json()
    assert model_json(model) == model.model_dump_json().encode()  # what the store writes
    assert model == validated
    assert model.model_fields_set <= set(type(model).model_fields)
    for name, value in model.__dict__.items():
        other = validated.__dict__[name]
        assert type(value) is type(other), (type(model).__name__, name, value, other)
        if isinstance(value, BaseModel):
            _assert_as_validated(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, BaseModel):
                    _assert_as_validated(item)


def _all_figures(engine: Engine, now: float) -> list[BaseModel]:
    workloads, projects, cluster = engine.report(now)
    singles = [engine.workload(figures.uid, now) for figures in workloads]
    return [*workloads, *projects, cluster, *engine.gpus(now), *(f for f in singles if f is not None)]


@PROPERTY_SETTINGS
@given(traces())
def test_report_figures_equal_their_validated_selves(events: list[Event]) -> None:
    engine = Engine()
    for event in events:
        engine.observe(event)
    for now in (HORIZON / 2, HORIZON + 5.0, HORIZON + 5000.0):
        for figures in _all_figures(engine, now):
            _assert_as_validated(figures)


def test_trusted_fills_defaults_in_field_order_and_keeps_the_given_fields_set() -> None:
    pod = trusted(PodFigures, {"phase": "Running", "uid": "u", "name": "p"})
    assert pod == PodFigures(name="p", uid="u", phase="Running")
    assert list(pod.__dict__) == list(PodFigures.model_fields)
    assert pod.model_fields_set == {"name", "uid", "phase"}
    gpu = trusted(GpuFigures, {"node": "n", "uuid": "GPU-1", "units": 0.5})
    assert gpu.model_dump_json() == GpuFigures(node="n", uuid="GPU-1", units=0.5).model_dump_json()
    assert gpu.model_copy(update={"units": 1.0}).units == 1.0


def test_a_trusted_workload_dumps_as_a_validated_one() -> None:
    values: dict[str, Any] = {
        "uid": "u", "namespace": "ns", "name": "w", "kind": "Job", "api_version": "batch/v1", "project": "p",
        "phase": "Running", "allocated_gpus": 2.0, "utilization": trusted(Windows, {"current": 5.0}),
        "memory_utilization": Windows(), "nodes": ["n1"], "pods": [], "gpus": [], "last_active_time": 3.0,
    }
    assert trusted(WorkloadFigures, values).model_dump_json(by_alias=True) == \
        WorkloadFigures(**values).model_dump_json(by_alias=True)


class _NestedSums:
    """The window sums as the report kept them before (a dict of 4-lists per window, two 2-lists)."""

    def __init__(self) -> None:
        self.memory: dict[str, list[float]] = {name: [0.0, 0.0, 0.0, 0.0] for name in ("avg1m", "avg5m", "avg1h", "lifetime")}
        self.current = [0.0, 0.0]
        self.memory_current = [0.0, 0.0]

    def add(self, windows: tuple[list[float], ...], lifetime: list[float]) -> None:
        for name, values in zip(("avg1m", "avg5m", "avg1h"), windows, strict=True):
            for index in range(4):
                self.memory[name][index] += values[index]
        for index in range(4):
            self.memory["lifetime"][index] += lifetime[index]

    def merge(self, other: _NestedSums) -> None:
        for name, totals in other.memory.items():
            for index in range(4):
                self.memory[name][index] += totals[index]
        for index in range(2):
            self.current[index] += other.current[index]
            self.memory_current[index] += other.memory_current[index]

    def windows(self) -> tuple[dict[str, float | None], dict[str, float | None]]:
        def mean(weighted: float, weight: float) -> float | None:
            return weighted / weight if weight > 1e-9 else None
        utilization = {name: mean(util, units) for name, (units, util, _mu, _m) in self.memory.items()}
        memory = {name: mean(mem, mem_units) for name, (_u, _ut, mem_units, mem) in self.memory.items()}
        utilization["current"] = mean(self.current[1], self.current[0])
        memory["current"] = mean(self.memory_current[1], self.memory_current[0])
        return utilization, memory


class _Life:
    def __init__(self, values: list[float]) -> None:
        self.life_units, self.life_util, self.life_mem_units, self.life_mem = values


_FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1e-10, 1e-9, 2e-9, 0.1, 1 / 3, 1e12]),
                    st.floats(-1e6, 1e9, allow_nan=False, allow_infinity=False))
_ROW = st.lists(_FLOATS, min_size=4, max_size=4)
_CURRENT = st.lists(_FLOATS, min_size=4, max_size=4)


def _bits(value: float | None) -> Any:
    return None if value is None else (math.copysign(1.0, value), value.hex())


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(_ROW, _ROW, _ROW, _ROW, _CURRENT), min_size=1, max_size=6))
def test_flat_sums_equal_the_nested_sums_to_the_bit(workloads: list[tuple[list[float], ...]]) -> None:
    flat_total, nested_total = _Sums(), _NestedSums()
    for minute, five, hour, life, current in workloads:
        flat = _Sums.of_workload(_Life(life), (minute, five, hour))  # type: ignore[arg-type]
        nested = _NestedSums()
        nested.add((minute, five, hour), life)
        for index, value in enumerate(current):  # as the report adds each held device's latest sample
            flat.values[16 + index] += value
            (nested.current if index < 2 else nested.memory_current)[index % 2] += value
        for left, right in ((flat, nested), (flat_total, nested_total)):
            if left is flat_total:
                flat_total.merge(flat)
                nested_total.merge(nested)
            utilization, memory = left.windows()
            want_utilization, want_memory = right.windows()
            for name in ("current", "avg1m", "avg5m", "avg1h", "lifetime"):
                assert _bits(getattr(utilization, name)) == _bits(want_utilization[name]), name
                assert _bits(getattr(memory, name)) == _bits(want_memory[name]), name



def test_complete_figures_share_one_fields_set_that_never_changes() -> None:
    values = {"current": 1.0, "avg1m": None, "avg5m": None, "avg1h": None, "lifetime": None}
    first, second = trusted_complete(Windows, dict(values)), trusted_complete(Windows, dict(values))
    assert first.model_fields_set is second.model_fields_set
    assert first.model_fields_set == set(Windows.model_fields)
    first.current = 5.0  # pydantic adds the name to the fields set: it is there already
    copied = first.model_copy(update={"avg1m": 2.0})
    assert second.current == 1.0 and copied.avg1m == 2.0 and first.avg1m is None
    assert first.model_fields_set == set(Windows.model_fields)
    assert copied.model_fields_set is not first.model_fields_set


@PROPERTY_SETTINGS
@given(st.lists(st.lists(_FLOATS, min_size=20, max_size=20), max_size=8))
def test_total_equals_merging_one_by_one_to_the_bit(many: list[list[float]]) -> None:
    merged = _Sums()
    for values in many:
        merged.merge(_Sums(list(values)))
    total = _Sums.total(_Sums(list(values)) for values in many)
    assert [_bits(value) for value in total.values] == [_bits(value) for value in merged.values]


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="key-sharing dicts are CPython's")
def test_the_reports_big_models_hold_dicts_of_shared_keys_in_field_order() -> None:
    """GpuFigures, WorkloadFigures and the agents' latest GpuSamples: every field in field order, a third the size."""
    from gpuwm.model.figures import shared_keys_fields

    from .helpers import pod, sample

    fields = shared_keys_fields(GpuFigures)
    assert list(fields) == list(GpuFigures.model_fields) and set(fields.values()) == {None}
    engine = Engine(EngineConfig(interval_seconds=10.0))
    engine.observe(pod(0.0, "train", devices=[("GPU-a", 1.0), ("GPU-b", 1.0)]))
    for t in (10.0, 20.0):
        engine.observe(sample(t, "GPU-a", sm=50.0))
        engine.observe(sample(t, "GPU-b", sm=0.0))
    (figures,) = engine.report(25.0)[0]
    for model, cls in ((figures, WorkloadFigures), (figures.gpus[0], GpuFigures)):
        assert list(model.__dict__) == list(cls.model_fields)
        if len(cls.model_fields) <= 30:  # CPython shares the keys of dicts of at most 30 (WorkloadFigures has more)
            assert sys.getsizeof(model.__dict__) < sys.getsizeof(dict(model.__dict__)) / 2
        else:  # no bigger than a plain dict of its fields (one grown key by key was twice that)
            assert sys.getsizeof(model.__dict__) <= sys.getsizeof(dict(model.__dict__))
        assert model == cls.model_validate(model.model_dump())  # what validation gives
