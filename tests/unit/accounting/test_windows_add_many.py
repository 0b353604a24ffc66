"""`WindowSums.add_many` equals `add` of each segment in order, to the bit (segments and sums)."""

from __future__ import annotations

import random

import pytest

from gpuwm.accounting.windows import WindowSums


@pytest.mark.parametrize("seed", range(30))
def test_add_many_equals_add_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    one_by_one, many = WindowSums(), WindowSums()
    t = 0.0
    for _ in range(rng.randint(0, 3)):  # some segments already there
        segment = (t, t + 1.0, 1.0, 50.0, 1.0, 20.0)
        one_by_one.add(*segment)
        many.add(*segment)
        t += 1.0
    segments = []
    for _ in range(rng.randint(0, 200)):
        step = rng.choice((0.0, 0.5, 1.0, 1.0, 1.0))  # 0: an empty piece, which add skips
        for _ in range(rng.choice((1, 1, 2, 3))):  # several devices over the same interval
            units = rng.choice((1.0, 0.5, 0.25))
            util = rng.choice((0.0, 50.0, 50.0, 100.0 / 3))
            memory = rng.choice((None, 20.0))
            segments.append((t, t + step, units, units * util, 0.0 if memory is None else units,
                             0.0 if memory is None else units * memory))
        t += step + rng.choice((0.0, 0.0, 2.0))
    for segment in segments:
        one_by_one.add(*segment)
    many.add_many(*(list(column) for column in zip(*segments, strict=True)) if segments else ([],) * 6)
    assert many.to_list() == one_by_one.to_list()
