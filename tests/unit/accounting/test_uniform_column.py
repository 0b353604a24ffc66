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
