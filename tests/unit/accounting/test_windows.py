"""WindowSums: one-pass windows equal the window integrals; folding keeps totals."""

from __future__ import annotations

import random

import pytest

from gpuwm.accounting.windows import WindowSums


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
    sums.maintain(now)
    assert len(sums) < count
    after = sums.window(now - 3600.0, now)
    assert after == pytest.approx(before, rel=1e-9)
    assert sums.window(now - 60.0, now) == pytest.approx(recent_before, rel=1e-9)  # the last 70 s stay exact


@pytest.mark.parametrize("seed", range(3))
def test_numpy_and_loop_windows_agree(seed: int) -> None:
    sums = _random_sums(seed)
    now = 1800.0  # some segments end after now: they are clipped
    by_numpy = sums._windows_numpy(now)
    for got, seconds in zip(by_numpy, (60.0, 300.0, 3600.0), strict=True):
        assert got == pytest.approx(list(sums.window(now - seconds, now)), rel=1e-9, abs=1e-6)


def test_the_cli_does_not_load_numpy_until_a_report_needs_it() -> None:
    """`gpuwm agent` loads every verb's module through the CLI; numpy would cost it ~16 MiB RSS."""
    import subprocess
    import sys

    code = "import sys; from gpuwm.cli import build_parser; build_parser(); print('numpy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
