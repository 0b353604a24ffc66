"""The roll-ups' declared resolution: each coarse value within half its quantum of the exact mean (or
max, and a gauge's min and max), values already on the grid kept, and a file whose roll-ups were written at
the finer resolution of before (and without the gauges' extremes) reads back unchanged and goes on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpuwm.store.chunks as chunks_module
from gpuwm.store import RangeQuery
from gpuwm.store.base import METRICS, Rollup
from gpuwm.store.codec import (
    COLUMN_DIGITS,
    COLUMN_QUANTUM,
    EXTREMES,
    METRIC_COUNT,
    MISSING,
    ROLLUP_COLUMN_COUNT,
    ROLLUP_DIGITS,
    ROLLUP_PARTS,
    ROLLUP_QUANTUM,
    IntArray,
    decode_parts,
    encode_parts,
    quantize,
    roll_up,
    round_to_rollup,
)
from gpuwm.store.embedded import EmbeddedStore

from .test_store_chunks import SMALL_TIERS, record, util_at

_MAX = np.array([metric.rollup is Rollup.MAX for metric in METRICS], dtype=np.bool_)
_LAST = np.array([metric.rollup is Rollup.LAST for metric in METRICS], dtype=np.bool_)
#: the roll-up quanta of the store before (schema 3 as first written): 1/64 %, 1 KiB, 1/8 W, 1 J, ...
_OLD_QUANTUM = np.array(
    [
        {
            "percent": 15_625,
            "bytes": 1_024,
            "watts": 125,
            "joules": 1_000,
            "celsius": 125,
            "MHz": 1_000,
            "bytes/s": 1_024,
            "GPU units": 15_625,
            "seconds": 1_000,
            "cores": 1,
            "GPU-seconds": 1,
        }[metric.unit]
        for metric in METRICS
    ],
    dtype=np.int64,
)


def _old_roll_up(values: IntArray, factor: int, rollups: np.ndarray = _MAX) -> IntArray:
    """The roll-up as the store wrote it before the declared resolution (a copy, the reference)."""
    shape = values.shape
    grouped = values.reshape(*shape[:-1], shape[-1] // factor, factor)
    present = grouped != MISSING
    count = present.sum(axis=-1)
    total = np.where(present, grouped, 0).astype(np.float64).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.rint(total / count)
    mean[count == 0] = 0
    result = mean.astype(np.int64)
    maximum = np.where(present, grouped, MISSING).max(axis=-1)
    result[..., rollups, :] = maximum[..., rollups, :]
    quantum = _OLD_QUANTUM.reshape((1,) * (result.ndim - 2) + (-1, 1))
    result = (np.rint(result / quantum) * quantum).astype(np.int64)
    result[count == 0] = MISSING
    # no gauge extremes: the columns schema 7 added, missing
    wider = np.full((*shape[:-2], ROLLUP_COLUMN_COUNT, result.shape[-1]), MISSING, dtype=np.int64)
    wider[..., :METRIC_COUNT, :] = result
    return wider


def _random_fine(seed: int, series: int = 6, points: int = 240) -> IntArray:
    """Quantized fine points of every metric at realistic magnitudes, with gaps and whole missing buckets."""
    rng = np.random.default_rng(seed)
    scale = {
        "percent": 100.0,
        "bytes": 8e10,
        "watts": 700.0,
        "celsius": 90.0,
        "MHz": 2000.0,
        "bytes/s": 3e10,
        "GPU units": 8.0,
        "cores": 64.0,
    }
    floats = np.empty((series, points, len(METRICS)))
    for index, metric in enumerate(METRICS):
        if metric.rollup in (Rollup.MAX, Rollup.LAST):
            steps = rng.uniform(0, 700 * 15 if metric.unit == "joules" else 15, size=(series, points))
            floats[:, :, index] = rng.uniform(0, 1e9, size=(series, 1)) + np.cumsum(steps, axis=1)
        else:
            top = scale[metric.unit] * 10.0 ** rng.integers(-6, 1, size=(series, 1))  # small and large series
            floats[:, :, index] = np.round(rng.uniform(0, 1, size=(series, points)) * top, 3)
    floats[rng.uniform(size=floats.shape) < 0.2] = np.nan
    floats[0, 40:80, :] = np.nan  # whole coarse buckets missing
    return quantize(floats).transpose(0, 2, 1).copy()


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("factor", [4, 20, 240])
def test_roll_up_is_within_half_a_quantum_of_the_exact_mean(seed: int, factor: int) -> None:
    values = _random_fine(seed)
    rolled = roll_up(values, factor)[:, :METRIC_COUNT]
    grouped = values.reshape(*values.shape[:2], -1, factor)
    present = grouped != MISSING
    count = present.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.where(present, grouped, 0).astype(np.float64).sum(axis=-1) / count
    exact[:, _MAX, :] = np.where(present, grouped, MISSING).max(axis=-1)[:, _MAX, :]
    assert ((rolled == MISSING) == (count == 0)).all()
    # the engine's figures keep each bucket's last present value, exactly (whatever the unit's quantum)
    last_index = factor - 1 - np.argmax(present[..., ::-1], axis=-1)
    last = np.take_along_axis(grouped, last_index[..., None], axis=-1)[..., 0]
    assert (rolled[:, _LAST][count[:, _LAST] > 0] == last[:, _LAST][count[:, _LAST] > 0]).all()
    kept = (count > 0) & ~_LAST[None, :, None]
    # the quantum, worked out independently: the absolute one, or 10^(digits of the value - declared digits)
    quantum = np.broadcast_to(ROLLUP_QUANTUM[None, :, None], exact.shape).astype(np.float64)
    for index in np.flatnonzero(ROLLUP_DIGITS):
        magnitude = np.abs(np.nan_to_num(exact[:, index, :]))
        digits = np.floor(np.log10(np.maximum(magnitude, 1.0))) + 1
        relative = 10.0 ** np.maximum(digits - ROLLUP_DIGITS[index], 0)
        quantum[:, index, :] = np.maximum(quantum[:, index, :], relative)
        # a rate keeps its declared significant digits: within 0.05 % of itself (or 1 byte/s)
        error = np.abs(rolled[:, index, :] - exact[:, index, :])[kept[:, index, :]]
        assert (error <= np.maximum(0.5, 0.5 * 10.0 ** -(ROLLUP_DIGITS[index] - 1) * magnitude[kept[:, index, :]])).all()
    error = np.abs(rolled - exact)
    assert (error[kept] <= quantum[kept] / 2 + 1e-6 * np.abs(exact[kept])).all()
    assert (rolled[kept] % quantum[kept].astype(np.int64) == 0).all()


def test_the_engines_figures_keep_the_last_value_even_where_it_fell() -> None:
    column = int(np.flatnonzero(_LAST)[0])
    values = np.full((1, len(METRICS), 8), MISSING, dtype=np.int64)
    values[0, column] = [5, 9, 7, MISSING, MISSING, MISSING, 3, MISSING]  # a counter the engine took back
    rolled = roll_up(values, 4)
    assert rolled[0, column].tolist() == [7, 3]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("factor", [4, 20])
def test_a_gauges_extremes_are_its_buckets_least_and_largest_points(seed: int, factor: int) -> None:
    values = _random_fine(seed)
    rolled = roll_up(values, factor)
    assert rolled.shape[1] == ROLLUP_COLUMN_COUNT == METRIC_COUNT + 2 * len(EXTREMES)
    grouped = values[:, EXTREMES].reshape(values.shape[0], len(EXTREMES), -1, factor)
    present = grouped != MISSING
    exact_min = np.where(present, grouped, np.iinfo(np.int64).max).min(axis=-1).astype(np.float64)
    exact_max = np.where(present, grouped, MISSING).max(axis=-1).astype(np.float64)
    minimum, maximum = rolled[:, METRIC_COUNT : METRIC_COUNT + len(EXTREMES)], rolled[:, METRIC_COUNT + len(EXTREMES) :]
    some = present.any(axis=-1)
    assert ((minimum == MISSING) == ~some).all() and ((maximum == MISSING) == ~some).all()
    # each within half its quantum of the brute-force extreme, and on the metric's grid like the mean
    for offset, rolled_extreme, exact in ((METRIC_COUNT, minimum, exact_min),
                                          (METRIC_COUNT + len(EXTREMES), maximum, exact_max)):
        extremes = slice(offset, offset + len(EXTREMES))
        quantum = COLUMN_QUANTUM[extremes][None, :, None].astype(np.float64)
        absolute = np.broadcast_to(COLUMN_DIGITS[extremes][None, :, None] == 0, some.shape) & some
        assert (np.abs(rolled_extreme - exact) <= np.broadcast_to(quantum, exact.shape) / 2)[absolute].all()
        # rounded once, as the mean is: the brute-force extreme rounded in its own column
        columns = np.zeros((exact.shape[0], ROLLUP_COLUMN_COUNT, exact.shape[2]))
        columns[:, offset : offset + len(EXTREMES)] = np.where(some, exact, 0.0)
        rounded = round_to_rollup(columns)[:, offset : offset + len(EXTREMES)]
        assert (rolled_extreme == rounded)[some].all()
    # the mean between them, each rounded to its own quantum (the absolute ones: a rate's depends on the value)
    mean = rolled[:, EXTREMES]
    slack = (COLUMN_QUANTUM[METRIC_COUNT : METRIC_COUNT + len(EXTREMES)] + ROLLUP_QUANTUM[EXTREMES])[None, :, None] / 2
    assert ((minimum - slack <= mean) & (mean <= maximum + slack))[absolute].all()


@pytest.mark.parametrize("seed", range(4))
def test_values_on_the_grid_stay_and_round_trip_through_a_chunk(seed: int) -> None:
    rolled = roll_up(_random_fine(seed), 20)
    present = rolled != MISSING
    again = round_to_rollup(np.where(present, rolled, 0).astype(np.float64)).astype(np.int64)
    last = np.zeros(ROLLUP_COLUMN_COUNT, dtype=np.bool_)
    last[:METRIC_COUNT] = _LAST
    on_grid = present & ~last[None, :, None]  # the engine's figures are kept as they are, off any grid
    assert (again[on_grid] == rolled[on_grid]).all()
    every = np.arange(ROLLUP_COLUMN_COUNT)
    for row, parts in zip(rolled, encode_parts(rolled, level=9), strict=True):
        named = [(part, data) for part, data in zip(ROLLUP_PARTS, parts, strict=True) if data is not None]
        assert (decode_parts(named, rolled.shape[2], every) == row).all()


def test_a_file_with_finer_rollups_reads_back_unchanged_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    with monkeypatch.context() as patched:
        patched.setattr(chunks_module, "roll_up", _old_roll_up)  # the store as it wrote roll-ups before
        store = EmbeddedStore(path, tiers=SMALL_TIERS)
        try:
            record(store, [float(t) for t in range(0, 480, 15)])  # two whole 4-minute coarse chunks
            store.compact(everything=True)  # every minute to 480 rolled up the old way
            (before,) = store.query_range(
                RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 420, 60)
            )
        finally:
            store.close()
    means = [sum(util_at(m + k) for k in (0, 15, 30, 45)) / 4 for m in range(0, 480, 60)]
    old = [v for _, v in before.points]
    assert old == pytest.approx(means, abs=1 / 128)
    assert any(round(v * 10) != v * 10 for v in old if v is not None)  # finer than 0.1 %: the old grid
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        (reread,) = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 420, 60))
        assert reread.points == before.points
        # buckets written without extremes: their mean is their min and max
        for aggregation in ("min", "max"):
            (extreme,) = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 420,
                                                      60, aggregation=aggregation))
            assert extreme.points == before.points
        record(store, [float(t) for t in range(480, 735, 15)])
        store.compact()
        (after,) = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 660, 60))
        # the old chunks' points are kept as written; the new ones are at the declared 0.1 %
        assert after.points[:8] == before.points
        newer = [sum(util_at(m + k) for k in (0, 15, 30, 45)) / 4 for m in range(480, 720, 60)]
        assert [v for _, v in after.points[8:]] == pytest.approx(newer, abs=0.05 + 1e-9)
        assert all(abs(v * 10 - round(v * 10)) < 1e-9 for _, v in after.points[8:] if v is not None)
    finally:
        store.close()
