"""`windows_of`: many workloads' windows in one pass, equal to the bit to each one's own loop."""

from __future__ import annotations

import random

from gpuwm.accounting.windows import WindowSums, windows_of


def _sums(rng: random.Random, segments: int) -> WindowSums:
    sums = WindowSums()
    t = rng.uniform(0.0, 500.0)
    for _ in range(segments):
        step = rng.choice((0.5, 1.0, 3.0, 15.0))
        units = rng.choice((1.0, 0.25, -0.5))  # a negative rate: a late event took time back
        sums.add(t, t + step, units, units * rng.uniform(0, 100), units, units * rng.uniform(0, 100))
        t += rng.choice((0.0, 0.0, 2.0)) + step
    return sums


def _plain_loop(sums: WindowSums, now: float) -> tuple[list[float], list[float], list[float]]:
    """The per-workload loop `windows` runs below its numpy threshold, for any size."""
    data = sums.to_list()
    result = ([0.0] * 4, [0.0] * 4, [0.0] * 4)
    for offset in range(0, len(data), 6):
        start, end = data[offset], min(data[offset + 1], now)
        for totals, seconds in zip(result, (60.0, 300.0, 3600.0), strict=True):
            low = now - seconds
            if end <= low or start >= now:
                continue
            overlap = end - (start if start > low else low)
            for index in range(4):
                totals[index] += data[offset + 2 + index] * overlap
    return result


def test_batch_equals_each_workloads_own_loop_exactly() -> None:
    rng = random.Random(7)
    many = [_sums(rng, rng.choice((0, 1, 5, 23, 24, 80, 400))) for _ in range(60)]
    now = 900.0
    batch = windows_of(many, now)
    assert len(batch) == len(many)
    for sums, got in zip(many, batch, strict=True):
        assert got == _plain_loop(sums, now)
        assert sums.windows(now) == got  # small ones by the loop, large ones by windows_of: the same bits
    assert batch[[len(s) for s in many].index(0)] == ([0.0] * 4, [0.0] * 4, [0.0] * 4)


def test_nothing_to_sum_gives_zeros() -> None:
    assert windows_of([WindowSums(), WindowSums()], 10.0) == [([0.0] * 4, [0.0] * 4, [0.0] * 4)] * 2
    assert windows_of([], 10.0) == []


def test_segments_before_a_window_leave_its_sums_at_plus_zero() -> None:
    """Segments that end before the 1m/5m windows (negative rates among them: rate x 0 would be -0.0) are left out
    of those windows' sums, which stay +0.0 as the plain loop leaves them; the hour still counts them."""
    import math

    old = WindowSums()
    for step in range(30):
        t = 100.0 + 10.0 * step
        old.add(t, t + 10.0, -0.5, -20.0, -0.5, -10.0)
    now = 1000.0  # every segment ended 600 s before: inside the hour only
    [(minute, five, hour)] = windows_of([old], now)
    assert (minute, five, hour) == _plain_loop(old, now)
    assert all(value == 0.0 and math.copysign(1.0, value) == 1.0 for value in minute + five)
    assert hour[0] == -0.5 * 300.0
