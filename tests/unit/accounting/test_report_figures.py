"""The report's figures are what validation gives, and its window sums add up as plain nested sums do.

Each figure of varied traces is compared with the same figure validated again from its own dump
(JSON to the byte, value types, field order), and the named window sums (`_Sums`) with a plain
reference of nested lists, to the bit.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuwm.accounting import Engine
from gpuwm.accounting.engine import Weighted, _Sums
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


# no -0.0: every integral the engine keeps starts from +0.0, and adding -0.0 to +0.0 gives +0.0
_FLOATS = st.one_of(st.sampled_from([0.0, 1e-10, 1e-9, 2e-9, 0.1, 1 / 3, 1e12]),
                    st.floats(-1e6, 1e9, allow_nan=False, allow_infinity=False).filter(
                        lambda value: math.copysign(1.0, value) > 0 or value != 0.0))
_ROW = st.lists(_FLOATS, min_size=4, max_size=4)
_CURRENT = st.lists(_FLOATS, min_size=4, max_size=4)


def _bits(value: float | None) -> Any:
    return None if value is None else (math.copysign(1.0, value), value.hex())


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(_ROW, _ROW, _ROW, _ROW, _CURRENT), min_size=1, max_size=6))
def test_flat_sums_equal_the_nested_sums_to_the_bit(workloads: list[tuple[list[float], ...]]) -> None:
    every: list[_Sums] = []
    nested_total = _NestedSums()
    for minute, five, hour, life, current in workloads:
        flat = _Sums.of_workload(_Life(life), (minute, five, hour), Weighted(*current))  # type: ignore[arg-type]
        every.append(flat)
        nested = _NestedSums()
        nested.add((minute, five, hour), life)
        for index, value in enumerate(current):  # as the report adds each held device's latest sample
            (nested.current if index < 2 else nested.memory_current)[index % 2] += value
        nested_total.merge(nested)
        for left, right in ((flat, nested), (_Sums.total(every), nested_total)):
            utilization, memory = left.windows()
            want_utilization, want_memory = right.windows()
            for name in ("current", "avg1m", "avg5m", "avg1h", "lifetime"):
                assert _bits(utilization[name]) == _bits(want_utilization[name]), name
                assert _bits(memory[name]) == _bits(want_memory[name]), name


