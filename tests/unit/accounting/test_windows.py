"""WindowSums: one-pass windows equal the window integrals; folding keeps totals."""

from __future__ import annotations

import random

import pytest

from gpuwm.accounting.windows import WindowSums, maintain_all, windows_of


def _random_sums(seed: int) -> WindowSums:
    rng = random.Random(seed)
    sums = WindowSums()
    t = 0.0
    for _ in range(2000):
        step = rng.choice((0.5, 1.0, 1.0, 2.0, 7.0))
        units = rng.choice((1.0, 0.5, -0.5))
        sums.add(t, t + step, units, units * rng.uniform(0, 100), units, units * rng.uniform(0, 100))
        t += step
    return sums


@pytest.mark.parametrize("seed", range(5))
def test_one_pass_windows_equal_window_integrals(seed: int) -> None:
    sums = _random_sums(seed)
    now = 2500.0
    minute, five, hour = sums.windows(now)
    for got, seconds in ((minute, 60.0), (five, 300.0), (hour, 3600.0)):
        assert got == pytest.approx(list(sums.window(now - seconds, now)), rel=1e-9, abs=1e-6)


def test_folding_keeps_the_hour_total_and_bounds_segments() -> None:
    sums = _random_sums(11)
    now = 2500.0
    before = sums.window(now - 3600.0, now)
    recent_before = sums.window(now - 60.0, now)
    count = len(sums)
    maintain_all([sums], now)
    assert len(sums) < count
    after = sums.window(now - 3600.0, now)
    assert after == pytest.approx(before, rel=1e-9)
    assert sums.window(now - 60.0, now) == pytest.approx(recent_before, rel=1e-9)  # the last 70 s stay exact


@pytest.mark.parametrize("seed", range(3))
def test_numpy_and_loop_windows_agree(seed: int) -> None:
    sums = _random_sums(seed)
    now = 1800.0  # some segments end after now: they are clipped
    by_numpy = windows_of([sums], now)[0]
    for got, seconds in zip(by_numpy, (60.0, 300.0, 3600.0), strict=True):
        assert got == pytest.approx(list(sums.window(now - seconds, now)), rel=1e-9, abs=1e-6)


def test_the_cli_does_not_load_numpy_until_a_report_needs_it() -> None:
    """`gpuwm agent` loads every verb's module through the CLI; numpy would cost it ~16 MiB RSS."""
    import subprocess
    import sys

    code = "import sys; from gpuwm.cli import build_parser; build_parser(); print('numpy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _reference_fold(data: list[float], now: float) -> list[float]:
    """The piece-by-piece fold (as before the numpy one): each segment's part of each bucket, in order."""
    buckets: dict[tuple[float, float], list[float]] = {}
    exact: list[float] = []
    for offset in range(0, len(data), 6):
        start, end = data[offset], data[offset + 1]
        if end > now - 70.0:
            exact.extend(data[offset : offset + 6])
            continue
        size = 5.0 if end > now - 330.0 else 60.0
        cursor = start
        while cursor < end:
            bucket_start = (cursor // size) * size
            bucket_end = bucket_start + size
            piece_end = min(end, bucket_end)
            fraction = (piece_end - cursor) / size
            totals = buckets.setdefault((bucket_start, bucket_end), [0.0, 0.0, 0.0, 0.0])
            for index in range(4):
                totals[index] += data[offset + 2 + index] * fraction
            cursor = piece_end
    folded: list[float] = []
    for (bucket_start, bucket_end), totals in sorted(buckets.items()):
        folded.extend((bucket_start, bucket_end, *totals))
    return folded + exact


@pytest.mark.parametrize("seed", range(8))
def test_fold_equals_the_piece_by_piece_fold_to_the_bit(seed: int) -> None:
    """Epoch-sized times with fractions, segments from 0.2 s to 11 minutes, some ending on a bucket
    bound, negative (taken back) rates, and late segments out of time order."""
    import struct

    from gpuwm.accounting.windows import _fold_all

    rng = random.Random(seed)
    data: list[float] = []
    t = 1_763_900_000.0 + rng.random()
    for _ in range(rng.randrange(50, 700)):
        step = rng.choice((0.2, 1.0, 1.0, 1.0, 3.7, 15.0, 60.0, 660.0))
        if rng.random() < 0.1:  # end on a 5 s or 60 s bound
            step = max(0.5, (t + step) // 5.0 * 5.0 + 5.0 - t)
        units = rng.choice((1.0, 2.0, 0.25, -1.0))
        data.extend((t, t + step, units, units * rng.uniform(0, 100), units, units * rng.uniform(0, 100)))
        if rng.random() < 0.05:  # a late correction for an earlier interval
            back = t - rng.uniform(0, 900)
            data.extend((back, back + 1.0, -units, -units * 50.0, -units, -units * 25.0))
        t += step
    now = t + rng.uniform(0, 120)
    sums = WindowSums.from_list(list(data))
    _fold_all([sums], now)
    expected = _reference_fold(data, now)
    assert len(sums._data) == len(expected)
    assert struct.pack(f"{len(expected)}d", *sums._data) == struct.pack(f"{len(expected)}d", *expected)


def test_maintain_drops_segments_past_the_hour_once_eight_lead() -> None:
    """The hour ends at 15 s. Segments past it are dropped together once the 8th from the front is
    one of them (the rest keep their order); a list that has wholly passed it is emptied (a settled
    workload has no segments)."""
    expired = [value for k in range(7) for value in (k * 1.0, k + 1.0, 1, 1, 1, 1)]
    alive = [5.0, 20.0, 3, 3, 3, 3, 4000.0, 4001.0, 4, 4, 4, 4]
    sums = WindowSums.from_list(expired[:12] + alive + expired[12:])
    maintain_all([sums], 3615.0)  # the 8th segment (5 expired after the 2 alive) has passed: all expired ones go
    assert sums.to_list() == alive
    few = WindowSums.from_list(expired[:6] + alive + [5000.0, 5001.0, 2, 2, 2, 2] * 6)
    maintain_all([few], 3615.0)  # one segment past the hour: kept until more have passed (it adds nothing to a window)
    assert len(few) == 9
    assert few.windows(3615.0) == WindowSums.from_list(alive + [5000.0, 5001.0, 2, 2, 2, 2] * 6).windows(3615.0)
    gone = WindowSums.from_list(expired[:18])
    maintain_all([gone], 3615.0)
    assert len(gone) == 0


def test_maintain_all_folds_each_due_one_as_alone_and_leaves_the_rest() -> None:
    """Numpy passes over many workloads, more due than one pass takes: each folded one equals its own
    piece-by-piece fold in its own place; one under its capacity is left as it was; an empty one stays empty."""
    import struct

    from gpuwm.accounting.windows import _WORKLOADS_PER_FOLD

    rng = random.Random(3)
    now = 1_763_903_000.0
    datas = []
    for count in (400, 30, 0, 900, 257, *[rng.randrange(257, 400) for _ in range(2 * _WORKLOADS_PER_FOLD)]):
        data: list[float] = []
        t = now - 2000.0 + rng.random()
        for _ in range(count):
            step = rng.choice((0.5, 1.0, 1.0, 2.0, 15.0))
            data.extend((t, t + step, 1.0, rng.uniform(0, 100), 1.0, rng.uniform(0, 100)))
            t += step
        datas.append(data)
    many = [WindowSums.from_list(list(data)) for data in datas]
    for sums in many:
        sums._capacity = 256
    maintain_all(many, now)
    for sums, data in zip(many, datas, strict=True):
        expected = _reference_fold(data, now) if len(data) // 6 > 256 else data
        assert struct.pack(f"{len(sums._data)}d", *sums._data) == struct.pack(f"{len(expected)}d", *expected)
