"""UniformColumn behaves as the list it stands for, whatever the operations (random sequences)."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

from gpuwm.accounting.state import Gpu, UniformColumn


def _random_ops(column: UniformColumn[Any], reference: list[Any], values: list[Any], seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        op = rng.randrange(7)
        # mostly the common value, so the column goes uniform, turns full, and collapses again
        value = values[0] if rng.random() < 0.8 else rng.choice(values)
        if op == 0:
            column.append(value)
            reference.append(value)
        elif op == 1:
            chunk = [values[0] if rng.random() < 0.9 else rng.choice(values) for _ in range(rng.randrange(5))]
            column.extend(chunk)
            reference.extend(chunk)
        elif op == 2:
            index = rng.randrange(len(reference) + 1)
            column.insert(index, value)
            reference.insert(index, value)
        elif op == 3 and reference:
            index = rng.randrange(-len(reference), len(reference))
            column[index] = value
            reference[index] = value
        elif op == 4 and reference:
            cut = rng.randrange(len(reference) + 1)
            del column[:cut]
            del reference[:cut]
        elif op == 5 and reference:
            index = rng.randrange(-len(reference), len(reference))
            assert column[index] == reference[index]
        else:
            assert column.count(value) == reference.count(value)
        assert len(column) == len(reference)
        assert list(column) == reference


@pytest.mark.parametrize("seed", range(30))
def test_float_column_matches_a_list(seed: int) -> None:
    column: UniformColumn[float] = UniformColumn(1.0, lambda values: array("d", values), adopt=True)
    reference: list[float] = []
    _random_ops(column, reference, [3 / 7, 1.0, 0.25], seed)
    assert column == reference


@pytest.mark.parametrize("seed", range(30))
def test_optional_dict_column_matches_a_list(seed: int) -> None:
    column: UniformColumn[dict[str, float] | None] = UniformColumn(None, list, adopt=False)
    reference: list[dict[str, float] | None] = []
    _random_ops(column, reference, [None, {"pod-a": 40.0}, {"pod-b": 5.0, "pod-a": 1.0}], seed)
    assert column == reference


def test_index_out_of_range_is_an_index_error() -> None:
    column: UniformColumn[float] = UniformColumn(1.0, lambda values: array("d", values), adopt=True)
    column.extend([0.5, 0.5])
    with pytest.raises(IndexError):
        column[2]
    with pytest.raises(IndexError):
        column[-3] = 0.5


def test_a_gpu_history_of_repeats_holds_no_per_sample_column() -> None:
    gpu = Gpu("GPU-a", "node-a")
    for t in range(100):
        gpu.append((float(t), 50.0, 10.0, float(t), None, 3 / 7, 0.0))
    assert gpu.device_units.uniform and gpu.pod_sm.uniform and gpu.merged.uniform
    assert gpu.device_units[42] == 3 / 7 and gpu.pod_sm[42] is None
    gpu.append((100.0, 50.0, 10.0, 100.0, {"pod-a": 30.0}, 3 / 7, 0.0))
    assert not gpu.pod_sm.uniform and gpu.pod_sm[-1] == {"pod-a": 30.0}
    gpu.forget_before(len(gpu.times))  # the per-process sample aged out
    assert gpu.pod_sm.uniform and len(gpu.pod_sm) == 0


@pytest.mark.parametrize("seed", range(20))
def test_gpu_append_keeps_each_column_as_the_list_of_its_values(seed: int) -> None:
    """`Gpu.append` counts a repeated value in place (its fast path) and hands any other to the column: the
    columns still read as the lists of the values appended, each point as `Gpu.point` returns it."""
    rng = random.Random(seed)
    gpu = Gpu("GPU-a", "node-a")
    pod_sms: list[Any] = [None, {"pod-a": 40.0}, {}]
    units, merged = [3 / 7, 1.0, 0.25], [0.0, 2.0]
    points = []
    for t in range(300):
        point = (
            float(t), 50.0, 10.0, float(t),
            rng.choice(pod_sms) if rng.random() < 0.1 else None,
            rng.choice(units) if rng.random() < 0.1 else units[0],
            rng.choice(merged) if rng.random() < 0.1 else 0.0,
        )
        gpu.append(point)
        points.append(point)
        if rng.random() < 0.05:  # old points age out, and the columns may turn uniform again
            cut = rng.randrange(len(points) + 1)
            gpu.forget_before(cut)
            del points[:cut]
        assert list(gpu.pod_sm) == [point[4] for point in points]
        assert list(gpu.device_units) == [point[5] for point in points]
        assert list(gpu.merged) == [point[6] for point in points]
    assert [gpu.point(index) for index in range(len(points))] == points
